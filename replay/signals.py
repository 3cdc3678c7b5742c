"""How Ctrl-C and SIGTERM reach the program: as KeyboardInterrupt (SIGTERM as its subclass
``Terminated``), raised where the program stands, so that what it was writing is cleaned up, but never
inside polars' own Python code. polars calls it back from Rust (a dtype's conversion, a category's
lookup) and turns an exception raised there into a ``TypeError`` or a Rust panic, printed with its
traceback; the interrupt is then lost and the command ends as if on a bug. A signal that lands in
polars' code, or in library code it calls (the standard library's ``inspect.isclass`` in a dtype's
constructor, say), is raised at the next line of the program's code below it, once polars returned to it."""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import signal
import site
import sys
import sysconfig
import threading
from collections.abc import Callable, Sequence
from functools import cache
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, NoReturn

from replay.errors import EXIT_TERMINATED, Terminated

_NATIVE = ("polars",)  # (packages whose Python code a native library calls back into)

received: list[int] = []  # every signal that came, in order (whatever error the command ended on, it was stopped)
_raised: set[int] = set()
_put_off: list[int] = []  # (the signal waiting for polars to return, if any)


def install() -> None:
    """SIGINT and SIGTERM raise as described above (the main thread only: the others get none).

    polars, as it is imported, puts a SIGINT hook of its own before Python's: while it computes, Ctrl-C
    makes it raise KeyboardInterrupt from Rust, in whichever thread looks first, a callback of its own to
    Python among them (where Rust panics on it). The handlers are set again once polars is imported, which
    takes that hook out: Ctrl-C is this module's alone."""
    _library_roots()  # (found now, not in the handler)
    _now_and_after_native_imports(_set)


def ignore() -> None:
    """Ctrl-C ignored in this process (a worker's: its caller decides), polars' hook taken out as above."""
    _now_and_after_native_imports(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))


def _now_and_after_native_imports(set_handlers: Callable[[], object]) -> None:
    """``set_handlers`` now, and again once each native library not yet imported is (its hook taken out)."""
    set_handlers()
    for name in _NATIVE:
        if name not in sys.modules:
            sys.meta_path.insert(0, _AfterImport(name, set_handlers))


def _set() -> None:
    if threading.current_thread() is threading.main_thread():  # (the only thread that may set them)
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, _on_signal)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then`` once the module ``name`` is imported (found by the finders after this one), once."""

    def __init__(self, name: str, then: Callable[[], object]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            run, then = spec.loader.exec_module, self.then

            def exec_module(module: ModuleType) -> None:
                run(module)
                then()
            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def stopped() -> int | None:
    """The exit status for the signal that stopped the command (130 Ctrl-C, 143 SIGTERM); None if none came."""
    if signal.SIGTERM in received:
        return EXIT_TERMINATED
    return 130 if received else None


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGTERM and signum in _raised:
        return  # (a second SIGTERM while the first is cleaned up: the cleanup goes on)
    received.append(signum)
    caller = _native_caller(frame)
    if _put_off:  # (one is waiting already: it is raised, as SIGTERM if either was; at once, outside polars)
        _put_off[0] = signal.SIGTERM if signal.SIGTERM in (signum, _put_off[0]) else signum
        if caller is not None:
            return
        sys.settrace(None)
        _raise(_put_off.pop())
    if caller is None or sys.gettrace() is not None:  # (a debugger's trace function is left alone)
        _raise(signum)
    _put_off.append(signum)
    _wait_in(caller)
    sys.settrace(_no_trace)  # (frames are traced only while a trace function is set; new ones are not)


def _native_caller(frame: FrameType | None) -> FrameType | None:
    """Where the signal landed is a native library's Python code (a callback it runs, or the wrapper
    around it), or library code that it called: the program's first frame below them (library code
    between the two, which called polars, runs to its end), or where the program has no frame below, the
    first frame below the native library's outermost one. None if it landed in the program's own code,
    or in library code the program called: there it is raised (the program's own callbacks, a Python
    source polars reads, take it as any error: it ends the call)."""
    below, native = frame, None
    while below is not None:
        if _is_native(below):
            native = below
        elif not _is_library(below):
            break
        below = below.f_back
    if native is None:
        return None
    return below if below is not None else _outside_native(native)


def _outside_native(frame: FrameType | None) -> FrameType | None:
    while frame is not None and _is_native(frame):
        frame = frame.f_back
    return frame


@cache
def _library_roots() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Where library code lies (the standard library, installed packages: the environment's, the system's
    and the user's) and the program's own package (each as given and with its links resolved)."""
    paths = [Path(p) for k, p in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib")]
    paths += [Path(p) for p in (*site.getsitepackages(), site.getusersitepackages())]
    own = Path(__file__).parent
    return (tuple({f"{p}/" for p in paths} | {f"{p.resolve()}/" for p in paths}),
            tuple({f"{own}/", f"{own.resolve()}/"}))


def _is_library(frame: FrameType) -> bool:
    """The frame runs library code, not the program's (whose package may be installed among them)."""
    name = frame.f_code.co_filename
    roots, own = _library_roots()
    return (name.startswith(roots) or name.startswith("<frozen ")) and not name.startswith(own)


def _is_native(frame: FrameType) -> bool:
    roots = tuple(f"{m.__path__[0]}/" for name in _NATIVE if (m := sys.modules.get(name)) is not None)
    return frame.f_code.co_filename.startswith(roots)


def _no_trace(_frame: FrameType, _event: str, _arg: Any) -> None:
    return None


def _wait_in(frame: FrameType) -> None:
    frame.f_trace = _in_caller
    frame.f_trace_lines = True


def _in_caller(frame: FrameType, event: str, _arg: Any) -> Any:
    """The caller's next line, or an exception polars raised into it, raises the signal put off; if it
    returns (or yields) first, the first frame below it outside polars waits instead."""
    if not _put_off:  # (raised already, from a frame below)
        return None
    if event == "return":
        if (below := _outside_native(frame.f_back)) is not None:
            _wait_in(below)
        return None
    if event not in ("line", "exception"):
        return _in_caller
    sys.settrace(None)
    frame.f_trace = None
    _raise(_put_off.pop())


def _raise(signum: int) -> NoReturn:
    _raised.add(signum)
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
