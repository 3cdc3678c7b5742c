"""The matrix's live table on the driver's terminal: each run's state, attempt, node, time and result."""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

_STYLE = {"queued": "dim", "running": "cyan", "retrying": "yellow", "completed": "green", "failed": "red",
          "interrupted": "yellow", "skipped": "dim green"}


class LiveTable:
    """Rows updated from any thread (a backend's progress callback); drawn a few times a second while
    the console is a terminal, and once at the end where it is not."""

    def __init__(self, console: Console, title: str = "matrix") -> None:
        self.console = console
        self.title = title
        self.rows: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._live: Live | None = None

    def add(self, run_id: str, version: str, settings: dict[str, str], state: str = "queued", result: str = "") -> None:
        with self._lock:
            self.rows[run_id] = {"version": version, "settings": ", ".join(f"{k}={v}" for k, v in settings.items()),
                                 "state": state, "attempt": 0, "node": "", "t0": None, "t1": None, "result": result}

    def update(self, run_id: str, info: dict[str, Any]) -> None:
        with self._lock:
            row = self.rows.setdefault(run_id, {"version": "", "settings": "", "state": "queued", "attempt": 0,
                                                "node": "", "t0": None, "t1": None, "result": ""})
            state = str(info.get("state") or row["state"])
            if state == "done":
                state = str(info.get("status") or "completed")
                row["t1"] = time.monotonic()
                row["result"] = (str(info.get("outcome") or "") if state == "completed"
                                 else str(info.get("error") or info.get("outcome") or ""))
            elif state == "running":
                if row["t0"] is None:
                    row["t0"] = time.monotonic()
            elif state == "retrying":
                row["result"] = f"attempt {info.get('attempt')} failed: {info.get('error') or ''}"
            row["state"] = state
            for k in ("attempt", "node"):
                if info.get(k):
                    row[k] = info[k]
        if self._live is not None:
            self._live.refresh()

    def table(self) -> Table:
        t = Table(title=self.title, title_justify="left", expand=False)
        for col in ("run", "vLLM", "settings", "state", "try", "node", "time", "result"):
            t.add_column(col, overflow="fold")
        with self._lock:
            rows = list(self.rows.items())
        now = time.monotonic()
        for rid, r in rows:
            took = "" if r["t0"] is None else f"{(r['t1'] or now) - r['t0']:.0f} s"
            st = r["state"]
            t.add_row(escape(rid), escape(r["version"]), escape(r["settings"]), f"[{_STYLE.get(st, '')}]{st}[/]",
                      str(r["attempt"] or ""), escape(str(r["node"])), took, escape(str(r["result"])[:120]))
        return t

    def __enter__(self) -> LiveTable:
        if self.console.is_terminal:
            self._live = Live(get_renderable=self.table, console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(et, ev, tb)
            self._live = None
        else:
            self.console.print(self.table())
