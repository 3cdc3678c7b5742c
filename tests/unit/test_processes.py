"""Work in processes of their own (``replay.processes``): results and progress come back, an error
comes back whole, and no worker outlives the block or the process that started it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from replay import processes
from replay.errors import EXIT_IO, ReplayError

ROOT = Path(__file__).parents[2]


def square(x: int) -> tuple[int, int]:
    """(x², the worker's pid), reporting x as progress."""
    processes.report(x)
    return x * x, os.getpid()


def refuse(path: str) -> None:
    raise ReplayError(f"{path}: cannot be read", EXIT_IO)


def sleep_long(pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(120)


def report_forever(pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    while True:
        processes.report(1)


def _gone(pid: int, within_s: float = 10) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_results_in_order_progress_passed_back_and_the_workers_ended() -> None:
    got: list[int] = []
    with processes.workers(2, got.append) as w:
        pending = [w.submit(square, x) for x in range(1, 7)]
        results = [p.get() for p in pending]
    assert [r for r, _ in results] == [1, 4, 9, 16, 25, 36]
    pids = {pid for _, pid in results}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2  # (in the workers, not here)
    assert sum(got) == 21 and all(n > 0 for n in got)  # (every report passed on before the block was left)
    assert all(_gone(pid) for pid in pids)


def test_a_workers_error_comes_back_whole() -> None:
    with processes.workers(1) as w, pytest.raises(ReplayError) as e:
        w.submit(refuse, "a.log").get()
    assert e.value.message == "a.log: cannot be read" and e.value.exit_code == EXIT_IO


def test_leaving_the_block_by_an_error_ends_a_worker_at_once(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt), processes.workers(1) as w:
        w.submit(sleep_long, str(pid_file))
        while not pid_file.exists() or not pid_file.read_text():
            time.sleep(0.02)
        raise KeyboardInterrupt
    assert time.monotonic() - t < 30
    assert _gone(int(pid_file.read_text()))


def test_a_worker_ended_as_it_reports_leaves_nothing_to_wait_on(tmp_path: Path) -> None:
    """A worker ended in the middle of passing its progress on (it does so without end here) holds no
    lock or half a message that the caller then waits on: the block is left at once, every time."""
    for k in range(5):
        pid_file = tmp_path / f"pid{k}"
        t = time.monotonic()
        with pytest.raises(KeyboardInterrupt), processes.workers(1, lambda n: None) as w:
            w.submit(report_forever, str(pid_file))
            while not pid_file.exists() or not pid_file.read_text():
                time.sleep(0.01)
            time.sleep(0.2)
            raise KeyboardInterrupt
        assert time.monotonic() - t < 30
        assert _gone(int(pid_file.read_text()))


def test_the_calls_no_worker_has_begun_are_told_and_waited_on() -> None:
    """GIVEN three calls handed to one worker THEN the two after the first wait for it (``waiting``), by
    their order of handing on; ``wait_for_one`` returns as each ends, or when its time is up."""
    with processes.workers(1) as w:
        calls = [w.submit(time.sleep, s) for s in (0.3, 0.3, 0.3)]
        assert w.waiting() == [1, 2]
        t = time.monotonic()
        w.wait_for_one(0.01)  # (the worker is still starting: nothing ends so soon)
        assert time.monotonic() - t < 5 and w.waiting() == [1, 2]
        seen = []
        while w.waiting():
            w.wait_for_one(5)
            seen.append(w.waiting())
        assert seen[-1] == [] and [2] in seen
        for c in calls:
            c.get()
        assert w.waiting() == []


def test_nothing_is_started_where_nothing_is_handed_on() -> None:
    before = set(psutil.Process().children())
    with processes.workers(2):
        assert set(psutil.Process().children()) == before


CALLER = """
import sys, time
from replay import processes
from tests.unit.test_processes import sleep_long
with processes.workers(1) as w:
    w.submit(sleep_long, sys.argv[1])
    time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent's death signal is Linux's")
@pytest.mark.parametrize("how", ["SIGKILL", "Ctrl-C"])
def test_a_worker_ignores_ctrl_c_and_dies_with_its_caller(how: str, tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group: the worker leaves it to its caller (no traceback of its
    own), and a caller killed outright (no cleanup of its own) takes its worker with it."""
    pid_file = tmp_path / "pid"
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(pid_file)], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        end = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < end:
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        if how == "Ctrl-C":
            os.killpg(caller.pid, signal.SIGINT)  # (as a terminal sends it: to every process of the group)
            _, err = caller.communicate(timeout=60)
            assert caller.returncode != 0 and err.count("Traceback") == 1 and "KeyboardInterrupt" in err
        else:
            caller.send_signal(signal.SIGKILL)
            caller.wait(timeout=60)
        assert _gone(worker)
    finally:
        if caller.poll() is None:
            caller.kill()


PATIENT_CALLER = """
import sys, time
from replay import processes
from tests.unit.test_processes import sleep_long
with processes.workers(1) as w:
    w.submit(sleep_long, sys.argv[1])
    try:
        time.sleep(120)
    except KeyboardInterrupt:
        time.sleep(1)  # (what the worker prints of its own has time to come before it is ended)
        raise
"""


def _catches_ctrl_c(pid: int) -> bool:
    """The process has a handler of its own for SIGINT (its status's caught signals)."""
    caught = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & 1 << (signal.SIGINT - 1))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent's death signal is Linux's")
def test_a_ctrl_c_while_a_worker_starts_is_left_to_its_caller(tmp_path: Path) -> None:
    """GIVEN a worker process just started (its interpreter still starting, importing, unpickling its
    call) WHEN Ctrl-C reaches the whole process group, as a terminal sends it THEN only the caller
    takes it: the worker prints nothing and ends with it. Before, the worker's interpreter raised
    KeyboardInterrupt wherever it stood and printed its own traceback (or 'Fatal Python error')."""
    pid_file = tmp_path / "pid"
    caller = subprocess.Popen([sys.executable, "-c", PATIENT_CALLER, str(pid_file)], cwd=ROOT, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        starting: list[psutil.Process] = []
        end = time.monotonic() + 60
        while not starting and time.monotonic() < end:  # (its interpreter catches Ctrl-C: it is up, still starting)
            with contextlib.suppress(psutil.Error, OSError):
                starting = [c for c in psutil.Process(caller.pid).children() if "spawn_main" in " ".join(c.cmdline())
                            and _catches_ctrl_c(c.pid)]
            time.sleep(0 if starting else 0.002)
        assert starting and not pid_file.exists(), "the worker had started: the test shows nothing"
        os.killpg(caller.pid, signal.SIGINT)
        _, err = caller.communicate(timeout=60)
        assert caller.returncode != 0 and err.count("Traceback") == 1 and "Fatal Python error" not in err, err[-3000:]
        assert "test_processes.py" not in err and "spawn_main" not in err, err[-3000:]
        assert _gone(starting[0].pid)
    finally:
        if caller.poll() is None:
            caller.kill()


def sigint_action_after_polars() -> int | None:
    """In a worker: the kernel's action for SIGINT once polars is imported (1: ignored)."""
    import ctypes

    import polars  # noqa: F401  (its import puts a SIGINT hook of its own)

    class _SigAction(ctypes.Structure):  # (glibc's struct sigaction on Linux)
        _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                    ("restorer", ctypes.c_void_p)]
    act = _SigAction()
    assert ctypes.CDLL("libc.so.6").sigaction(signal.SIGINT, None, ctypes.byref(act)) == 0
    return act.handler


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's sigaction")
def test_a_worker_still_ignores_ctrl_c_once_it_imported_polars() -> None:
    """GIVEN a worker (Ctrl-C ignored) WHEN its call imports polars, which puts a SIGINT hook of its own
    first THEN Ctrl-C is still ignored there: polars' hook would abort its work with a KeyboardInterrupt
    raised from Rust (printed by a panic where it lands in a callback of polars' own)."""
    with processes.workers(1) as w:
        assert w.submit(sigint_action_after_polars).get() == 1  # (SIG_IGN)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # (as the kernel's OOM killer ends a process)


def test_a_worker_killed_in_its_call_is_an_error_not_a_wait_forever() -> None:
    t = time.monotonic()
    with processes.workers(1) as w, pytest.raises(processes.WorkerDied):
        w.submit(die).get()
    assert time.monotonic() - t < 30
