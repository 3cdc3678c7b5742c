"""One exception type that the CLI turns into a clear message and an exit code, never a traceback."""

from __future__ import annotations

from collections.abc import Iterable

EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_ENGINE = 4
EXIT_IO = 74  # a file or folder could not be read or written (sysexits' EX_IOERR)
EXIT_OOM_REPRODUCED = 10
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # (128 + SIGTERM, as a shell reports a process the signal ended)
EXIT_CHECK_FAILED = 1


class ReplayError(Exception):
    """An error the user can act on: the message names the file/line or the setting at fault."""

    def __init__(self, message: str, exit_code: int = EXIT_INPUT) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type[ReplayError], tuple[str, int]]:  # (raised in a worker process, whole here)
        return type(self), (self.message, self.exit_code)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, systemd, Kubernetes), raised where the program is so that it stops as at
    Ctrl-C: what it was writing is cleaned up and the last complete output is left as it was."""


def where(path: object, line: int | None = None) -> str:
    """``file:line`` as used in every message and in the bundle's evidence references."""
    return f"{path}:{line}" if line is not None else str(path)


def refuse_options(checks: Iterable[tuple[str, bool, str, object]]) -> None:
    """One usage error naming every option whose check failed, as 'NAME: expected WHY, got VALUE'
    (checks are (name, passed, why, value)); nothing where all passed."""
    def shown(v: object) -> str:
        return f"{v:g}" if isinstance(v, float) else str(v)
    bad = [f"{name}: expected {why}, got {shown(v)}" for name, ok, why, v in checks if not ok]
    if bad:
        raise ReplayError("; ".join(bad), EXIT_USAGE)
