"""The vLLM OpenAI-compatible server as a child process group that is always cleaned up.

Started with an argv list (never a shell) in its own session, its stdout/stderr go to a log file
that the recorder's parser reads; ``stop()`` terminates the whole process group (engine-core and
worker children included) and escalates to SIGKILL, so no orphan is ever left behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import psutil

from replay.engine.envs import EnvSpec
from replay.errors import EXIT_ENGINE, ReplayError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EngineServer:
    def __init__(self, spec: EnvSpec, model: Path | str, engine_argv: list[str], log_path: Path,
                 *, env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.spec = spec
        self.model = str(model)
        self.port = port or free_port()
        self.log_path = log_path
        self.argv = [str(spec.python), "-m", "vllm.entrypoints.openai.api_server",
                     "--model", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                     *engine_argv]
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
                    **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self.started_at: float | None = None
        self.ready_at: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 300.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.started_at = time.time()
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as c:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    tail = self.log_tail(15)
                    self.stop()
                    raise ReplayError(f"vLLM server exited during startup (exit {self.proc.returncode}); "
                                      f"log {self.log_path}:\n{tail}", EXIT_ENGINE)
                try:
                    if c.get(f"{self.url}/health").status_code == 200:
                        self.ready_at = time.time()
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        self.stop()
        raise ReplayError(f"vLLM server not healthy after {timeout_s:.0f} s; log {self.log_path}:\n"
                          f"{self.log_tail(15)}", EXIT_ENGINE)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def pids(self) -> list[int]:
        if not self.alive() or self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root.pid] + [c.pid for c in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss_bytes(self) -> int | None:
        """Resident memory of the whole engine process tree (API server, engine core, workers)."""
        total = 0
        found = False
        for pid in self.pids():
            try:
                total += psutil.Process(pid).memory_info().rss
                found = True
            except psutil.NoSuchProcess:
                continue
        return total if found else None

    def cpu_seconds(self) -> float:
        total = 0.0
        for pid in self.pids():
            try:
                t = psutil.Process(pid).cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                continue
        return total

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # children that outlived the leader
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> EngineServer:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
