"""``replay versions check``: does a vLLM version's own code load our model and arguments?

On any host, without a device: the env's python runs ``scripts/check_engine.py``, which loads
that version's config loader, tokenizer, API server argument parser and model class on the tiny
model and puts the engine arguments through the version's own parser and ``AsyncEngineArgs``
(see the script for the stages). On a host with a GPU the server is also started once and
its ``/health`` awaited. The result names the first failure in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from replay.engine.envs import EnvSpec, replay_home
from replay.errors import ReplayError


@dataclass
class Stage:
    name: str
    ok: bool | None  # None: not checked here (it needs a device this host lacks)
    seconds: float
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.name, "ok": self.ok, "s": self.seconds, "detail": self.detail}


@dataclass
class CheckResult:
    spec: EnvSpec
    model: Path
    argv: list[str]
    stages: list[Stage] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.stages) and all(s.ok is not False for s in self.stages)

    @property
    def failure(self) -> str | None:
        """The first failure in one line, or None."""
        for s in self.stages:
            if s.ok is False:
                return f"vLLM {self.spec.version} ({self.spec.dist}): {s.name}: {s.detail}"
        if not self.stages:
            return f"vLLM {self.spec.version} ({self.spec.dist}): the check reported nothing"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"env": self.spec.name, "version": self.spec.version, "dist": self.spec.dist,
                "device": self.spec.device, "model": str(self.model), "engine_argv": self.argv,
                "ok": self.ok, "failure": self.failure, "seconds": round(self.seconds, 2),
                "stages": [s.to_json() for s in self.stages]}


def check(spec: EnvSpec, model: Path, argv: list[str], *, start: bool = False,
          timeout_s: float = 600.0, env: dict[str, str] | None = None) -> CheckResult:
    """Run the in-env checks (and, with ``start``, start the server once)."""
    res = CheckResult(spec, model, list(argv))
    t0 = time.monotonic()
    script = resources.files("replay.engine.scripts") / "check_engine.py"
    with tempfile.TemporaryDirectory(prefix="replay-check-") as tmp:
        out = Path(tmp) / "stages.jsonl"
        log = Path(tmp) / "check.log"
        run_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
                   **({"VLLM_CPU_KVCACHE_SPACE": "1"} if spec.device == "cpu" else {}), **(env or {})}
        cmd = [str(spec.python), str(script), str(model), "--dist", spec.dist, "--out", str(out),
               "--argv", json.dumps(argv)]
        try:
            with log.open("wb") as fh:
                p = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=run_env,
                                   timeout=timeout_s, check=False, cwd=tmp)
            rc: int | None = p.returncode
        except subprocess.TimeoutExpired:
            rc = None
        if out.exists():
            for line in out.read_text().splitlines():
                d = json.loads(line)
                res.stages.append(Stage(d["stage"], d["ok"], float(d["s"]), str(d["detail"])))
        if rc is None:
            res.stages.append(Stage("timeout", False, timeout_s, f"the check ran past {timeout_s:.0f} s"))
        elif rc != 0 and res.ok:  # died without saying why (a crash in a native library)
            tail = " ".join(log.read_text(errors="replace").split()[-40:])
            res.stages.append(Stage("crash", False, 0.0, f"exit {rc}: {tail}"[:400]))
    if start and res.ok:
        res.stages.append(_start(spec, model, argv))
    res.seconds = time.monotonic() - t0
    return res


def _start(spec: EnvSpec, model: Path, argv: list[str]) -> Stage:
    from replay.engine.server import EngineServer
    t0 = time.monotonic()
    log = replay_home() / "check" / f"{spec.name}.log"
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"} if spec.device == "cpu" else {}
    try:
        s = EngineServer(spec, model, argv, log, env=env)
        s.start()
        s.stop()
    except ReplayError as e:
        return Stage("server", False, round(time.monotonic() - t0, 2),
                     " ".join(e.message.split())[:400])
    return Stage("server", True, round(time.monotonic() - t0, 2), f"started, /health ok; log {log}")


def raise_on_failure(res: CheckResult, exit_code: int) -> None:
    msg = res.failure
    if msg is not None:
        raise ReplayError(msg, exit_code)

