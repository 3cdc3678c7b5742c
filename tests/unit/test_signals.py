"""Ctrl-C and SIGTERM are raised where the program stands, never inside polars (replay/signals.py)."""
from __future__ import annotations

import heapq
import inspect
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import polars as pl
import pytest

from replay import cli, signals
from replay.errors import Terminated
from replay.sortmerge import sink_frames

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("received", "_put_off"):
        monkeypatch.setattr(signals, name, [])
    monkeypatch.setattr(signals, "_raised", set())


def _interrupt_in_polars(callback: FrameType, sig: int = signal.SIGINT) -> None:
    """What a signal that lands in the polars code that runs ``callback`` does (the signal module calls
    the handler so, with the frame it landed in)."""
    frame = callback.f_back
    assert frame is not None and "/polars/" in frame.f_code.co_filename, "not polars' code: the test shows nothing"
    signals._on_signal(sig, frame)


def test_a_signal_in_polars_code_is_raised_at_the_callers_next_line() -> None:
    """GIVEN Ctrl-C landing in polars' Python code, called back from Rust WHEN the handler runs THEN
    polars finishes, untouched, and KeyboardInterrupt is raised at the next line of the code that called
    it; no trace function is left set. Before, polars took the interrupt for the callback's error."""
    seen: list[int] = []
    after: list[int] = []

    def callback(x: int) -> int:
        if not seen:
            _interrupt_in_polars(sys._getframe())
        seen.append(x)
        return x

    with pytest.raises(KeyboardInterrupt):
        out = pl.Series([1, 2, 3]).map_elements(callback, return_dtype=pl.Int64)
        after.append(out.len())
    assert seen == [1, 2, 3] and after == [] and sys.gettrace() is None
    assert signals.received == [signal.SIGINT] and signals.stopped() == 130


def test_a_signal_put_off_goes_to_the_frame_below_when_the_caller_returns_first() -> None:
    """GIVEN the caller of polars returns on the line that called it WHEN a signal was put off in it
    THEN the frame below raises it at its next line."""
    after: list[int] = []

    def callback(x: int) -> int:
        _interrupt_in_polars(sys._getframe())
        return x

    def caller() -> pl.Series:
        return pl.Series([1, 2]).map_elements(callback, return_dtype=pl.Int64)

    with pytest.raises(KeyboardInterrupt):
        out = caller()
        after.append(out.len())
    assert after == [] and sys.gettrace() is None


def test_a_signal_put_off_in_a_generator_that_yields_first_is_raised_below_once() -> None:
    """GIVEN a generator that yields what polars returned on the same line WHEN a signal was put off in
    it THEN its consumer raises it at its next line, and the generator, resumed, raises nothing more."""
    after: list[pl.Series | int] = []

    def callback(x: int) -> int:
        _interrupt_in_polars(sys._getframe())
        return x

    def frames() -> Iterator[pl.Series | int]:
        yield pl.Series([1]).map_elements(callback, return_dtype=pl.Int64)
        yield 2

    it = frames()
    with pytest.raises(KeyboardInterrupt):
        first = next(it)
        after.append(first)
    assert after == [] and next(it) == 2 and sys.gettrace() is None


def test_a_second_signal_outside_polars_raises_the_one_put_off_at_once() -> None:
    """GIVEN a signal put off in polars' code, its wait somehow never reached (a trace function unset by
    another) WHEN Ctrl-C comes again where the program's own code runs THEN it is raised there at once:
    a signal put off never leaves the program deaf to the next."""
    def callback(x: int) -> int:
        _interrupt_in_polars(sys._getframe())
        return x

    pl.Series([1]).map_elements(callback, return_dtype=pl.Int64); sys.settrace(None)  # noqa: E702
    assert signals._put_off == [signal.SIGINT]
    with pytest.raises(KeyboardInterrupt):
        signals._on_signal(signal.SIGINT, sys._getframe())
    assert signals._put_off == [] and sys.gettrace() is None


def test_an_error_polars_raises_after_the_signal_becomes_the_interrupt() -> None:
    """GIVEN a callback that fails after the signal came WHEN polars raises its error into the caller
    THEN the caller gets KeyboardInterrupt, not polars' error."""
    def callback(x: int) -> int:
        _interrupt_in_polars(sys._getframe())
        raise ValueError("the callback's own failure")

    with pytest.raises(KeyboardInterrupt):
        pl.Series([1]).map_elements(callback, return_dtype=pl.Int64)
    assert sys.gettrace() is None


def test_sigterm_put_off_with_a_ctrl_c_is_raised_as_sigterm() -> None:
    """GIVEN Ctrl-C then SIGTERM while polars' code runs WHEN polars returns THEN Terminated is raised
    (exit 143) and both are on record."""
    def callback(x: int) -> int:
        if x == 1:
            _interrupt_in_polars(sys._getframe())
            _interrupt_in_polars(sys._getframe(), signal.SIGTERM)
        return x

    with pytest.raises(Terminated):
        pl.Series([1, 2]).map_elements(callback, return_dtype=pl.Int64)
        pytest.fail("the line after polars' call ran")
    assert signals.received == [signal.SIGINT, signal.SIGTERM] and signals.stopped() == 143


def test_a_signal_in_library_code_polars_calls_is_put_off_as_in_polars_own() -> None:
    """GIVEN Ctrl-C landing in the standard library's code that polars' Python code calls while Rust
    calls it back (``inspect.isclass`` in ``Enum``'s constructor, as polars gives a frame's schema)
    WHEN the handler runs THEN polars finishes and KeyboardInterrupt is raised at the next line of the
    code that called it. Before, it was raised in ``isclass``, and polars' Rust panicked on it and
    printed the traceback: a record stopped by Ctrl-C said so on stderr."""
    df = pl.DataFrame({"k": pl.Series(["a"], dtype=pl.Enum(["a", "b"]))})
    landed: list[str] = []
    after: list[object] = []

    def land(frame: FrameType, event: str, _arg: object) -> None:  # (a signal that lands as isclass starts)
        back = frame.f_back
        if event == "call" and frame.f_code is inspect.isclass.__code__ and back is not None \
                and back.f_code.co_filename.endswith("/polars/datatypes/classes.py"):
            sys.setprofile(None)
            landed.append(back.f_code.co_name)
            signals._on_signal(signal.SIGINT, frame)

    sys.setprofile(land)
    try:
        with pytest.raises(KeyboardInterrupt):
            schema = df.schema
            after.append(schema)
    finally:
        sys.setprofile(None)
    assert landed == ["__init__"] and after == [] and sys.gettrace() is None


def test_a_signal_in_library_code_the_program_called_is_raised_there_at_once() -> None:
    """GIVEN Ctrl-C landing in the standard library's code that the program called itself (no polars
    between: ``heapq.nsmallest``, as it starts) WHEN the handler runs THEN it is raised there at once:
    the call does not run on (its key is never called)."""
    keyed: list[int] = []

    def land(frame: FrameType, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code is heapq.nsmallest.__code__:
            sys.setprofile(None)
            signals._on_signal(signal.SIGINT, frame)

    sys.setprofile(land)
    try:
        with pytest.raises(KeyboardInterrupt):
            heapq.nsmallest(2, [3, 1, 2], key=lambda x: keyed.append(x) or x)
    finally:
        sys.setprofile(None)
    assert keyed == [] and signals.received == [signal.SIGINT] and sys.gettrace() is None


def test_ctrl_c_while_polars_computes_is_left_to_this_handler_not_polars_own_hook() -> None:
    """GIVEN the handlers installed, then polars imported (which puts a SIGINT hook of its own first) WHEN
    Ctrl-C comes while polars computes THEN polars finishes and KeyboardInterrupt is raised once, at the
    program's next line. Before, polars' hook made it abort and raise KeyboardInterrupt from Rust, in
    whatever thread looked first (a Python callback of its own, where Rust panicked on it: a CI failure of
    test_faults), and this handler raised a second one after."""
    script = textwrap.dedent("""
        import os, signal, threading, time
        from replay import signals
        signals.install()
        import polars as pl
        lf = pl.LazyFrame({"a": pl.int_range(0, 20_000_000, eager=True)}).with_columns(b=pl.col("a").hash()).sort("b")
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            df = lf.collect()
            print("not interrupted")
        except KeyboardInterrupt:
            print("computed" if "df" in dir() else "aborted")
    """)
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "computed\n", ""), r.stderr[-2000:]


def test_signals_that_land_anywhere_in_polars_all_come_out_as_keyboard_interrupt() -> None:
    """GIVEN 3,000 timer signals landing at random points of polars frame building (a real kernel timer:
    the program does not choose where) WHEN each is handled THEN every one comes out as KeyboardInterrupt
    and nothing is printed. With Python's own handler about 6 % came out as polars' PanicException or
    TypeError, each printed with a traceback or a Rust panic."""
    script = textwrap.dedent("""
        import signal, sys
        import polars as pl
        from replay import signals
        signal.signal(signal.SIGALRM, signals._on_signal if sys.argv[1] == "replay" else signal.default_int_handler)
        schema = {"a": pl.Int64, "b": pl.Utf8, "d": pl.Datetime("us", "UTC"), "e": pl.Categorical}
        ends = {}
        for trial in range(3000):
            try:
                signal.setitimer(signal.ITIMER_REAL, 0.0003 + (trial % 11) * 0.00007)
                while True:
                    pl.DataFrame({k: [] for k in schema}, schema=schema).schema
                    pl.Series("x", [1], dtype=pl.Int64)
            except BaseException as e:
                ends[type(e).__name__] = ends.get(type(e).__name__, 0) + 1
            signals._raised.clear()
        print(ends)
    """)
    ends = {}
    for handler in ("python", "replay"):
        r = subprocess.run([sys.executable, "-c", script, handler], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        ends[handler] = (eval(r.stdout), r.stderr)
    assert ends["replay"] == ({"KeyboardInterrupt": 3000}, ""), ends["replay"][1][-2000:]
    lost = 3000 - ends["python"][0].get("KeyboardInterrupt", 0)
    assert lost > 0 and ends["python"][1] != "", "Python's handler loses none here: the test shows nothing"


def test_a_signal_in_the_programs_own_source_read_by_polars_ends_the_read_at_once(tmp_path: Path) -> None:
    """GIVEN Ctrl-C landing in a Python source of frames that polars sinks to Parquet (the program's own
    code, not polars') WHEN the handler runs THEN it is raised there and polars passes it on: the sink
    ends with KeyboardInterrupt, the source not read to its end (a long merge is not waited out)."""
    read: list[int] = []

    def frames() -> Iterator[pl.DataFrame]:
        for i in range(100):
            read.append(i)
            if i == 2:
                signals._on_signal(signal.SIGINT, sys._getframe())
            yield pl.DataFrame({"a": [i]})

    with pytest.raises(KeyboardInterrupt):
        sink_frames(frames(), {"a": pl.Int64}, tmp_path / "out.parquet")
    assert read == [0, 1, 2] and sys.gettrace() is None


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_a_command_that_ends_on_a_librarys_error_after_a_signal_says_interrupted(
        sig: signal.Signals, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN a signal came and a library (not polars) turned it into an error of its own WHEN the command
    ends on that error THEN it says 'interrupted' and exits 130 or 143, not 70 with 'internal error'."""
    def command() -> None:
        signals.received.append(sig)
        raise TypeError("'<unprintable str object>' is not a Polars data type")

    monkeypatch.setattr(cli, "app", command)
    monkeypatch.setattr(signals, "install", lambda: None)
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == code
    err = capsys.readouterr().err
    assert "interrupted" in err and "internal error" not in err
