"""Faults injected into the writing and reading of bundles and reports: Ctrl-C and SIGTERM at each
phase of ``replay record`` over an existing bundle, a full disk (a small tmpfs, where the tests run as
root), bundles cut short, damaged or of the wrong types, output folders that hold the user's files,
prompts in the quarantine, and text from the evidence that a terminal would obey.

Each fault leaves the previous output as it was or the new one complete, nothing of the tool's own
behind (OUT.partial-PID, .spill, NAME.PID.part), and the exit code the README promises: 130 at
Ctrl-C, 143 at SIGTERM, 74 for a full disk, 3 for a bundle that cannot be read, 2 for an output the
tool refuses."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from replay.bundle import BundleMeta, BundleWriter, bundle_written, check_out, read_bundle
from replay.errors import ReplayError
from replay.record.recorder import RecordOptions, record
from replay.text import console, printable
from tests.conftest import DATA, ROOT, metrics_server

SMALL_LOG = DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log"
GiB = 1 << 30

# real line shapes of a V1 server at INFO with request logging: a request added, its access line, its
# finish, and a stats line every 500 requests
_ADDED = "(APIServer pid=3646) INFO {t} [async_llm.py:587] Added request cmpl-{i:032x}-0.\n"
_FINISHED = "(APIServer pid=3646) INFO {t} [async_llm.py:587] Finished request cmpl-{i:032x}-0.\n"
_ACCESS = 'INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" 200 OK\n'
_STATS = ("(APIServer pid=3646) INFO {t} [loggers.py:271] Engine 000: Avg prompt throughput: 12068.8 tokens/s, "
          "Avg generation throughput: 734.9 tokens/s, Running: {r} reqs, Waiting: {w} reqs, GPU KV cache usage: "
          "{kv}%, Prefix cache hit rate: 0.0%\n")


def _big_log(path: Path, mib: int) -> int:
    """A vLLM log of ``mib`` MiB (50 requests a second); returns its stats lines."""
    n = i = stats = 0
    with path.open("w") as fh:
        while n < mib << 20:
            sec = i // 50
            t = f"05-{1 + sec // 86400 % 28:02d} {sec // 3600 % 24:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
            s = _ADDED.format(t=t, i=i) + _ACCESS.format(port=40000 + i % 20000) + _FINISHED.format(t=t, i=i)
            if i % 500 == 0:
                s += _STATS.format(t=t, r=18 + i % 7, w=i % 40, kv=f"{i % 1000 / 10:.1f}")
                stats += 1
            fh.write(s)
            n += len(s)
            i += 1
    return stats


@pytest.fixture(scope="module")
def big_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """40 MiB of log: about 1.5 s of recording here, its spill, write and merge phases each long
    enough to be hit."""
    p = tmp_path_factory.mktemp("log") / "vllm.log"
    return p, _big_log(p, 40)


@pytest.fixture(scope="module")
def old_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete bundle of another log, with a file of the user's in it (NOTES.txt)."""
    p = tmp_path_factory.mktemp("old") / "old.bundle"
    record([SMALL_LOG], p, RecordOptions(year=2025))
    (p / "NOTES.txt").write_text("the user's own notes\n")
    return p


def _digest(folder: Path) -> dict[str, str]:
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file()}


def _strays(where: Path) -> list[str]:
    """What the tool keeps only while it writes, left behind."""
    return sorted(str(p.relative_to(where)) for p in where.rglob("*")
                  if ".partial-" in p.name or p.name == ".spill" or p.name.endswith(".part") or p.name.endswith(".tmp"))


def _replay(*args: str) -> subprocess.Popen[str]:
    """``python -m replay ARGS`` as a user starts it (Ctrl-C raises KeyboardInterrupt in it, whatever
    the test runner's own signal settings), stderr not a terminal."""
    return subprocess.Popen([sys.executable, "-m", "replay", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    p = _replay(*args)
    out, err = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _one_line(stderr: str) -> str:
    """The error a command printed: one line, no blank line before it, no traceback."""
    assert "Traceback" not in stderr
    lines = stderr.split("\n")
    assert lines[-1] == "" and len(lines) == 2, repr(stderr)
    return lines[0]


# (where the signal goes: once this is there, beside or in the folder the bundle is written in)
_PHASES = {
    "spill": "{name}.partial-*/.spill",  # reading the log: its request facts spilled
    "writer": "{name}.partial-*/bundle.json",  # the bundle's files being written
    "merge": "{name}.partial-*/requests.part*",  # the request rows joined and written as they come
    "swapped": None,  # the partial folder gone again: the bundle swapped in, the command printing its table
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_at_any_phase_of_record_leaves_the_last_bundle_or_the_new_one_whole(
        sig: signal.Signals, big_log: tuple[Path, int], old_bundle: Path, tmp_path: Path) -> None:
    """GIVEN a complete bundle at OUT, with a file of the user's in it WHEN `replay record BIG.log -o OUT`
    gets Ctrl-C or SIGTERM while it spills the log, writes the bundle, merges its parts, or after it
    swapped the new bundle in (and at a sweep of delays after the first) THEN OUT is the old bundle
    file for file with exit 130 (SIGINT) or 143 (SIGTERM), or the complete new one with the user's file
    kept; never a mix, and no partial folder, spill or part file is left. Before, SIGINT 2 s in left a
    new bundle.json over the old parts that inspect, analyze and report took for valid, and SIGTERM
    left .spill behind."""
    log, stats = big_log
    old = _digest(old_bundle)
    new_counts: tuple[int, int] | None = None
    outcomes: dict[str, list[str]] = {}
    triggers = [(phase, 0.0) for phase in _PHASES] + [("spill", d) for d in (0.15, 0.3, 0.45, 0.6)]
    for k, (phase, delay) in enumerate(triggers):
        work = tmp_path / str(k)
        work.mkdir()
        out = work / "incident.bundle"
        shutil.copytree(old_bundle, out)
        p = _replay("record", str(log), "--year", "2025", "-o", str(out))
        pattern = _PHASES[phase]
        seen = False
        while p.poll() is None:
            if pattern is not None:
                hit = bool(list(work.glob(pattern.format(name=out.name))))
            else:
                partial = bool(list(work.glob(f"{out.name}.partial-*")))
                seen = seen or partial
                hit = seen and not partial
            if hit:
                time.sleep(delay)
                p.send_signal(sig)
                break
            time.sleep(0.002)
        _, err = p.communicate(timeout=120)
        assert _strays(work) == [], (phase, delay)
        now = _digest(out)
        if now == old:
            assert p.returncode == (130 if sig == signal.SIGINT else 143), (phase, delay, err[-500:])
            assert "Traceback" not in err
            outcomes.setdefault(phase, []).append("old")
        else:
            b = read_bundle(out)  # (complete: a bundle that is not is refused here)
            assert b.complete is True and (out / "NOTES.txt").read_text() == "the user's own notes\n"
            assert set(now) - {"NOTES.txt"} == {"bundle.json", "events.jsonl", "quarantine.jsonl", "requests.parquet",
                                                 "samples.parquet"}
            counts = (b.samples.filter(b.samples["source"] == "vllm-log").height, b.requests.height)
            assert counts[0] >= stats and counts[1] > (stats - 1) * 500 and counts == (new_counts or counts)
            new_counts = counts
            assert p.returncode in (0, 130, 143, -signal.SIGINT, -signal.SIGTERM), (phase, err[-500:])
            outcomes.setdefault(phase, []).append("new")
    # a signal as the log is spilled, or as the bundle's files are written, ends with the old bundle; one
    # after the swap, with the new one; those between (the sweep) may end with either, as timing has it
    assert outcomes["spill"][0] == outcomes["writer"][0] == outcomes["merge"][0] == "old", outcomes
    assert outcomes["swapped"] == ["new"], outcomes


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A file system of ``size`` mounted at ``where`` (root only)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a full disk is a tmpfs mounted by the test: needs root")
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` but for about ``leave`` bytes."""
    st = os.statvfs(disk)
    room = st.f_bavail * st.f_frsize - leave
    with (disk / "filler").open("wb") as fh:
        while room > 0:
            try:
                fh.write(b"\0" * min(room, 1 << 20))
                fh.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
            room -= 1 << 20


def test_a_full_disk_while_the_log_is_read_or_the_bundle_written_leaves_the_last_bundle(
        big_log: tuple[Path, int], old_bundle: Path, tmp_path: Path) -> None:
    """GIVEN a bundle on a nearly full disk WHEN recorded again over it, the disk filling while the
    log's facts are spilled (a 40 MiB log, 64 KiB free) or while the bundle is written (an nvidia-smi
    log read in memory, half the room its bundle needs) THEN exit 74, one line naming OUT as given and
    the full disk, the old bundle as it was (the user's file in it too), nothing else left on the disk.
    Before, the half-written bundle read as valid, or the error was an internal one (70)."""
    smi = tmp_path / "smi.csv"
    rows = ["timestamp, index, memory.used [MiB], memory.total [MiB]"]
    rows += [f"2025/05/01 {s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{s * 7 % 1000:03d}, {g}, {1000 + s * g % 70000} MiB, "
             "81559 MiB" for s in range(20000) for g in range(8)]
    smi.write_text("\n".join(rows) + "\n")
    record([smi], tmp_path / "measure", RecordOptions())
    need = sum(f.stat().st_size for f in (tmp_path / "measure").iterdir())
    assert need > 200_000
    for evidence, leave in ((big_log[0], 64 << 10), (smi, need // 2)):
        with _tmpfs(tmp_path / "disk", "16m") as disk:
            shutil.copytree(old_bundle, disk / "b")
            old = _digest(disk / "b")
            _fill(disk, leave)
            r = _run("record", str(evidence), "--year", "2025", "-o", str(disk / "b"))
            assert r.returncode == 74, (evidence.name, r.stderr[-800:])
            assert _one_line(r.stderr) == (f"error: {disk / 'b'}: no space left on the device while the bundle was "
                                           "written; the bundle there is as it was")
            assert _digest(disk / "b") == old and sorted(os.listdir(disk)) == ["b", "filler"]


def test_reports_on_a_full_disk_keep_the_last_one_and_say_so(old_bundle: Path, tmp_path: Path) -> None:
    """GIVEN a report and a postmortem written before WHEN written again onto a full disk THEN exit 74
    naming the file, the old ones as they were, no part file. Before, the HTML was cut short over the
    last report."""
    with _tmpfs(tmp_path / "disk", "8m") as disk:
        (disk / "r.html").write_text("the last report\n")
        (disk / "p.md").write_text("the last postmortem\n")
        _fill(disk, 0)
        for cmd, path in (("report", disk / "r.html"), ("postmortem", disk / "p.md")):
            before = path.read_bytes()
            r = _run(cmd, str(old_bundle), "-o", str(path))
            assert r.returncode == 74, (cmd, r.stderr[-800:])
            assert _one_line(r.stderr) == f"error: {path}: no space left on the device"
            assert path.read_bytes() == before
        assert sorted(os.listdir(disk)) == ["filler", "p.md", "r.html"]


def test_a_bundle_whose_writing_did_not_finish_is_refused_in_one_line(tmp_path: Path) -> None:
    """GIVEN a bundle whose writer flushed it and never closed it (killed) THEN inspect, analyze and
    report refuse it in one line, exit 3, naming it as a recording that did not finish, and write no
    report; a live recording in that state is read, with a note saying it did not finish; a bundle
    written before bundles were marked complete is read as it was."""
    meta = BundleMeta(kind="production", t0_utc="2025-05-01T10:00:00Z")
    w = BundleWriter(tmp_path / "cut", meta)
    w.sample(1_000_000, 0, "nvml", "device_used_bytes", 10 * GiB)
    w.flush()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    obj = json.loads((tmp_path / "cut" / "bundle.json").read_text())
    assert obj["complete"] is False and obj["writing"]["pid"] == os.getpid()
    obj["writing"]["pid"] = int(dead.stdout)  # (its writer is gone)
    (tmp_path / "cut" / "bundle.json").write_text(json.dumps(obj))
    for cmd in (["inspect"], ["analyze"], ["report", "-o", str(tmp_path / "r.html")]):
        r = _run(cmd[0], str(tmp_path / "cut"), *cmd[1:])
        assert r.returncode == 3, (cmd, r.stderr)
        assert _one_line(r.stderr).startswith(f"error: {tmp_path / 'cut'}: incomplete (a recording that did not finish")
    assert not (tmp_path / "r.html").exists()
    with pytest.raises(ReplayError, match="incomplete: still being written by process"):
        read_bundle(_unclosed(tmp_path / "running", BundleMeta(kind="replay")))

    live = _unclosed(tmp_path / "live", BundleMeta(kind="production", t0_utc="2025-05-01T10:00:00Z",
                                                    extra={"live_url": "http://vllm:8000"}))
    obj = json.loads((live / "bundle.json").read_text())
    obj["writing"]["pid"] = int(dead.stdout)
    (live / "bundle.json").write_text(json.dumps(obj))
    b = read_bundle(live)
    assert b.complete is False and b.samples.height == 1
    assert b.meta.notes[0].startswith("incomplete: a live recording that did not finish")

    legacy = tmp_path / "legacy"  # (no "complete": its writer predates the mark)
    shutil.copytree(_closed(tmp_path / "c"), legacy)
    obj = json.loads((legacy / "bundle.json").read_text())
    del obj["complete"]
    (legacy / "bundle.json").write_text(json.dumps(obj))
    (legacy / "samples.parquet").unlink()
    b = read_bundle(legacy)
    assert b.complete is None and b.samples.height == 0
    assert any(n.startswith("samples.parquet is missing") for n in b.meta.notes)


def _unclosed(path: Path, meta: BundleMeta) -> Path:
    w = BundleWriter(path, meta)
    w.sample(1_000_000, 0, "nvml", "device_used_bytes", 10 * GiB)
    w.flush()
    return path


def _closed(path: Path) -> Path:
    w = BundleWriter(path, BundleMeta(kind="production", t0_utc="2025-05-01T10:00:00Z",
                                      gpus=[{"index": 0, "total_bytes": 80 * GiB}]))
    w.sample(1_000_000, 0, "nvml", "device_used_bytes", 10 * GiB)
    w.event({"t_us": 2_000_000, "kind": "oom", "source": "v.log:7"})
    w.close()
    return path


@pytest.mark.parametrize(("change", "message"), [
    ({"gpus": "abc"}, "gpus is text (\"abc\"); expected a list"),
    ({"gpus": [{"index": 0, "total_bytes": "1e400"}]}, "gpus[0].total_bytes is text (\"1e400\"); expected a whole number of bytes"),
    ({"gpus": [{"index": 0, "total_bytes": 1.5}]}, "gpus[0].total_bytes is a number (1.5); expected a whole number of bytes"),
    ({"notes": 5}, "notes is a number (5); expected a list"),
    ({"notes": ["fine", 7]}, "notes[1] is a number (7); expected text"),
    ({"engine_args": {"gpu_memory_utilization": "abc"}}, "engine_args.gpu_memory_utilization is text (\"abc\"); expected a number"),
    ({"extra": {"speed": 0}}, "extra.speed is a number (0); expected a number above 0"),
    ({"keep_prompts": "no"}, "keep_prompts is text (\"no\"); expected true or false"),
])
def test_bundle_json_fields_of_the_wrong_type_are_named(change: dict[str, object], message: str, tmp_path: Path) -> None:
    """GIVEN a bundle whose bundle.json was edited into the wrong types THEN reading it refuses it,
    naming the field and what it holds (each was an internal error, exit 70, deep in the analysis)."""
    b = _closed(tmp_path / "b")
    obj = json.loads((b / "bundle.json").read_text())
    (b / "bundle.json").write_text(json.dumps(obj | change))
    with pytest.raises(ReplayError) as e:
        read_bundle(b)
    assert e.value.message.startswith(f"{b / 'bundle.json'}: {message}"), e.value.message
    assert e.value.exit_code == 3


def test_huge_numbers_missing_files_and_bad_event_lines_are_never_silent(tmp_path: Path) -> None:
    """GIVEN a bundle.json with a number past any float (1e400: infinite as JSON is read) or past 64
    bits THEN exit 3 naming the field, in one line; a complete bundle missing samples.parquet is
    refused; event lines that are no events are left out with a note saying which (and why)."""
    b = _closed(tmp_path / "b")
    text = (b / "bundle.json").read_text()
    for huge, shown in (("1e400", "gpus[0].total_bytes"), ("1" + "0" * 30, "gpus[0].total_bytes")):
        (b / "bundle.json").write_text(text.replace(f'"total_bytes": {80 * GiB}', f'"total_bytes": {huge}'))
        r = _run("inspect", str(b))
        assert r.returncode == 3, r.stderr
        assert _one_line(r.stderr).startswith(f"error: {b / 'bundle.json'}: {shown} is a number no reader can use")
    (b / "bundle.json").write_text(text)

    c = tmp_path / "c"
    shutil.copytree(b, c)
    (c / "samples.parquet").unlink()
    with pytest.raises(ReplayError, match=r"samples\.parquet missing from a complete bundle"):
        read_bundle(c)

    ev = (b / "events.jsonl").read_text()
    (b / "events.jsonl").write_text(ev + '{"kind": "oom", "t_us": "soon"}\n{"t_us": 5}\n' + ev)
    got = read_bundle(b)
    assert len(got.events) == 2
    assert any("2 line(s) are not events (a time that is not a whole number of µs: line 2; no kind: line 3)" in n
               for n in got.meta.notes), got.meta.notes


def test_an_output_folder_of_the_users_is_refused_and_nothing_of_it_removed(old_bundle: Path, tmp_path: Path) -> None:
    """GIVEN the evidence folder itself as -o (its events.jsonl is the user's), or '.' in a folder of
    other files THEN record refuses it (exit 2) and every file is as it was; a library caller that
    forces it writes the bundle among the user's files and keeps them, but never over a file of a
    bundle's name; replacing a bundle keeps the user's files in it."""
    ev = tmp_path / "ev"
    ev.mkdir()
    shutil.copy(SMALL_LOG, ev / "vllm.log")
    (ev / "events.jsonl").write_text('{"the user": "evidence"}\n')
    before = _digest(ev)
    r = _run("record", str(ev / "vllm.log"), str(ev / "events.jsonl"), "-o", str(ev))
    assert r.returncode == 2 and _digest(ev) == before
    assert "events.jsonl, which a bundle's own files would replace" in _one_line(r.stderr)
    with pytest.raises(ReplayError, match="events.jsonl, which a bundle's own files would replace"):
        check_out(ev, force=True)

    here = tmp_path / "here"
    here.mkdir()
    shutil.copy(SMALL_LOG, here / "vllm.log")
    (here / "requests.part-2.csv").write_text("id\n1\n")
    before = _digest(here)
    p = subprocess.run([sys.executable, "-m", "replay", "record", "vllm.log", "--year", "2025", "-o", "."],
                       cwd=here, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2 and _digest(here) == before and "add --force" in _one_line(p.stderr)

    with pytest.raises(ReplayError):
        check_out(here)
    check_out(here, force=True)
    record([here / "vllm.log"], here, RecordOptions(year=2025))  # (the library has no policy: the CLI's --force)
    assert {k: v for k, v in _digest(here).items() if k in before} == before
    assert read_bundle(here).complete is True and not _strays(tmp_path)

    b = tmp_path / "b"
    shutil.copytree(old_bundle, b)
    record([here / "vllm.log"], b, RecordOptions(year=2025))
    assert (b / "NOTES.txt").read_text() == "the user's own notes\n" and read_bundle(b).complete is True
    assert not _strays(tmp_path)


def test_a_failed_write_removes_only_its_own_folder(old_bundle: Path, tmp_path: Path) -> None:
    """GIVEN an error while a bundle is written over an earlier one (the writer never closed)
    THEN the earlier bundle is as it was and the folder written in is gone."""
    b = tmp_path / "b"
    shutil.copytree(old_bundle, b)
    before = _digest(b)
    with pytest.raises(ValueError), bundle_written(b) as into:
        BundleWriter(into, BundleMeta(kind="production")).sample(1, 0, "nvml", "device_used_bytes", 1.0)
        raise ValueError("a parser's bug")
    with pytest.raises(RuntimeError, match="not closed"), bundle_written(b) as into:
        BundleWriter(into, BundleMeta(kind="production")).flush()
    assert _digest(b) == before and sorted(os.listdir(tmp_path)) == ["b"]

    # a writer killed outright (SIGKILL) left its folder: the next writer of b removes it, but a live
    # recording's (its user's data) and a folder holding anything a writer does not make
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    killed, live, odd = (tmp_path / f"b.partial-{pid}", tmp_path / f"b.partial-{pid}-2", tmp_path / f"b.partial-{pid}-3")
    _unclosed(killed, BundleMeta(kind="production"))
    (killed / ".spill").mkdir()
    _unclosed(live, BundleMeta(kind="production", extra={"live_url": "http://vllm:8000"}))
    _unclosed(odd, BundleMeta(kind="production"))
    (odd / "mine.txt").write_text("x")
    with bundle_written(b) as into:
        BundleWriter(into, BundleMeta(kind="production")).close()
    assert sorted(os.listdir(tmp_path)) == ["b", live.name, odd.name]


def test_quarantine_keeps_no_text_unless_asked(tmp_path: Path) -> None:
    """GIVEN a file of no known kind holding prompts, and a request line over the longest a line may be
    THEN by default the quarantine keeps each line's number, reason, length and sha256 and none of its
    text (it was the whole file, 3.3 MB for 20,000 lines, and the long line's first KiB, prompt and
    all); with keep_quarantine_text (or keep_prompts) the text is kept as before."""
    prompt = "Summarise the patient's record: allergies to penicillin"
    other = tmp_path / "chat.txt"
    lines = [f"user {i}: {prompt} #{i}" for i in range(2000)]
    other.write_text("\n".join(lines) + "\n")
    record([other], tmp_path / "b", RecordOptions())
    text = (tmp_path / "b" / "quarantine.jsonl").read_text()
    q = [json.loads(x) for x in text.splitlines()]
    assert "penicillin" not in text and len(q) == 2000
    assert q[5] == {"file": str(other), "line": 6, "reason": "unrecognised file kind", "chars": len(lines[5]),
                    "sha256": hashlib.sha256(lines[5].encode()).hexdigest()}
    for opts in (RecordOptions(keep_quarantine_text=True), RecordOptions(keep_prompts=True)):
        record([other], tmp_path / "k", opts)
        assert json.loads((tmp_path / "k" / "quarantine.jsonl").read_text().splitlines()[5])["raw"] == lines[5]


def test_printed_evidence_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """GIVEN notes holding a terminal's escape sequences (a colour, OSC 8 links, a title change), a
    carriage return, a bidi override and a file name that is not UTF-8 THEN what is printed shows each
    as an escape, and lines are not wrapped off a terminal."""
    assert printable("a\x1b[31mred\x1b]8;;http://x\x07link\r\u202egnp.exe") == \
        "a\\x1b[31mred\\x1b]8;;http://x\\x07link\\x0d\\u202egnp.exe"
    assert printable(os.fsdecode(b"ev/\xff\xfe.log")) == "ev/\\xff\\xfe.log"
    assert printable("line\n\ttab é 日本") == "line\n\ttab é 日本"
    buf = io.StringIO()
    c = console(file=buf, width=80)
    c.print("note: " + "x" * 100 + " \x1b]0;pwned\x07", markup=False)
    assert buf.getvalue() == "note: " + "x" * 100 + " \\x1b]0;pwned\\x07\n"
    assert isinstance(c, Console)

    b = _closed(tmp_path / "b")
    obj = json.loads((b / "bundle.json").read_text())
    obj["notes"] = ['dcgm[Hostname="\x1b]0;owned\x07\x1b[2J"]: a label']
    (b / "bundle.json").write_text(json.dumps(obj))
    r = _run("inspect", str(b))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout + r.stderr and 'note: dcgm[Hostname="\\x1b]0;owned\\x07\\x1b[2J"]: a label' in r.stdout


def test_an_error_is_one_line_off_a_terminal(tmp_path: Path) -> None:
    """GIVEN stderr that is no terminal (CI, a pipe) THEN an error of more than 80 characters is one
    line, with no blank line before it (the progress bar left one, and the console wrapped at 80)."""
    missing = tmp_path / ("a-rather-long-folder-name-" * 4) / "vllm.log"
    r = _run("record", str(missing), "-o", str(tmp_path / "b"))
    assert r.returncode == 3
    assert _one_line(r.stderr) == f"error: {missing}: no such file"
    assert not (tmp_path / "b").exists() and not _strays(tmp_path)


@pytest.fixture()
def metrics_url() -> Iterator[str]:
    """A /metrics endpoint answering a real vLLM exposition excerpt."""
    with metrics_server((DATA / "vllm_v0_metrics_excerpt.prom").read_bytes()) as url:
        yield url


def test_a_live_recording_over_a_bundle_replaces_it_only_when_it_stops(
        metrics_url: str, old_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN an earlier bundle at OUT WHEN recorded live over it THEN the recording is written beside it
    (named as it starts) and, stopped, replaces it complete, keeping the user's file; to a new path it
    is written in place, readable while it records (with a note that it is not finished)."""
    from replay.record.live import record_live
    b = tmp_path / "live.bundle"
    shutil.copytree(old_bundle, b)
    said = io.StringIO()
    record_live(metrics_url, b, interval_s=0.05, duration_s=0.3, console=Console(file=said, width=300))
    assert f"recording into {tmp_path}/live.bundle.partial-{os.getpid()}; it replaces {b} when" in said.getvalue()
    got = read_bundle(b)
    assert got.complete is True and got.meta.extra["live_url"] == metrics_url and got.samples.height > 0
    assert (b / "NOTES.txt").exists() and sorted(os.listdir(tmp_path)) == ["live.bundle"]

    new = tmp_path / "new.bundle"
    seen: list[str] = []
    real_flush = BundleWriter.flush

    def flush(self: BundleWriter) -> None:  # (another reader, while the recording runs)
        real_flush(self)
        if self.path == new and (new / "samples.part00000.parquet").exists() and not seen:
            seen.extend(read_bundle(new).meta.notes[:1])

    monkeypatch.setattr(BundleWriter, "flush", flush)
    record_live(metrics_url, new, interval_s=0.02, duration_s=0.5, console=Console(file=io.StringIO()))
    assert seen and seen[0].startswith(f"incomplete: a live recording still being written by process {os.getpid()}")
    assert read_bundle(new).complete is True and "incomplete" not in " ".join(read_bundle(new).meta.notes)


APART = """
import sys
from replay.record import recorder
recorder.APART_MIN_BYTES = 1 << 20  # (these logs are read in worker processes, as a fleet's are,
recorder._cores = lambda: 2  # whatever cores the machine has)
sys.argv[0] = "replay"
from replay.cli import main
main()
"""


def _workers(pid: int, found: set[int]) -> set[int]:
    """``found`` and the multiprocessing workers (not its helper) now among the children of ``pid`` (a
    child just forked has its parent's command line until it starts its own: it is looked at again)."""
    with contextlib.suppress(psutil.Error):
        for c in psutil.Process(pid).children():
            if c.pid not in found:
                with contextlib.suppress(psutil.Error):
                    if "spawn_main" in " ".join(c.cmdline()):
                        found.add(c.pid)
    return found


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_logs_are_read_in_workers_ends_them_and_leaves_the_last_bundle(
        sig: signal.Signals, big_log: tuple[Path, int], old_bundle: Path, tmp_path: Path) -> None:
    """GIVEN two logs read in worker processes WHEN `replay record` gets Ctrl-C or SIGTERM as they are read
    THEN it exits 130 or 143 with the old bundle as it was, nothing of its own left, and no worker alive."""
    log, _ = big_log
    other = tmp_path / "other.log"
    _big_log(other, 12)
    old = _digest(old_bundle)
    for k, delay in enumerate((0.0, 0.4)):
        work = tmp_path / str(k)
        work.mkdir()
        out = work / "incident.bundle"
        shutil.copytree(old_bundle, out)
        p = subprocess.Popen([sys.executable, "-c", APART, "record", str(log), str(other), "--year", "2025", "-o", str(out)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        workers: set[int] = set()
        try:
            while p.poll() is None and len(_workers(p.pid, workers)) < 2:  # (both logs handed on)
                time.sleep(0.01)
            while p.poll() is None and not list(work.glob(f"{out.name}.partial-*/.spill/*/*")):
                time.sleep(0.002)
            time.sleep(delay)
            p.send_signal(sig)
            _, err = p.communicate(timeout=120)
        finally:  # (a record that hangs is a failure, not a process left behind)
            if p.poll() is None:
                for w in workers:
                    with contextlib.suppress(psutil.Error):
                        psutil.Process(w).kill()
                p.kill()
                p.communicate()
        assert len(workers) == 2, err[-500:]
        assert p.returncode == (130 if sig == signal.SIGINT else 143), (delay, err[-500:])
        assert "Traceback" not in err
        assert _digest(out) == old and _strays(work) == []
        for w in workers:  # (gone: a worker still alive 10 s on raises psutil.TimeoutExpired)
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(w).wait(timeout=10)
