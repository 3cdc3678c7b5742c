"""The CUDA build of vLLM 0.6.3, installed on a CPU-only host (REPLAY_DEVICE=cuda) from its
release-day lock, passes ``replay versions check``: its own config loader, tokenizer, API server
parser and model class load the tiny model its own transformers built.

uv's download cache (UV_CACHE_DIR, default ~/.cache/uv) is reused: the first run downloads about
3 GB, later ones build the env from the cache in seconds. The engine cache is a fresh one under
the session's temporary folder unless REPLAY_SLOW_HOME names one to keep between runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
VERSION = "0.6.3"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keep = os.environ.get("REPLAY_SLOW_HOME")
    return Path(keep) if keep else tmp_path_factory.mktemp("replay-home")


def _replay(home: Path, *args: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REPLAY_HOME": str(home), "REPLAY_DEVICE": "cuda", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "replay", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_versions_check_063_cuda_build_on_cpu(home: Path) -> None:
    p = _replay(home, "versions", "check", VERSION, "--set", "max_model_len=2048", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout)
    assert res["ok"] and res["dist"] == "vllm" and res["device"] == "cuda"
    stages = {s["stage"]: s for s in res["stages"]}
    for name in ("import", "config", "tokenizer", "parser", "model_class", "args"):
        assert stages[name]["ok"] is True, stages[name]
    assert "transformers 4.45.2" in stages["import"]["detail"]
    assert res["model"].endswith("-tf4.45")
    env = home / "envs" / f"vllm-{VERSION}"
    lock = (env / "replay-lock.txt").read_text()
    assert "as of its release day 2024-10-14" in lock
    assert "\ntransformers==4.45.2\n" in lock and "\ntorch==2.4.0\n" in lock
    cfg = json.loads((Path(res["model"]) / "tokenizer_config.json").read_text())
    assert cfg.get("tokenizer_class") == "PreTrainedTokenizerFast"  # what transformers 4.45 writes and reads


def test_versions_check_names_a_bad_argument_in_one_line(home: Path) -> None:
    p = _replay(home, "versions", "check", VERSION, "--set", "max_model_lenn=2048")
    assert p.returncode == 1, p.stderr[-3000:]
    last = [ln for ln in p.stderr.splitlines() if ln.strip()][-1]
    assert "args: unrecognized arguments: --max-model-lenn" in last and "nearest: --max-model-len" in last


def test_doctor_shows_the_lock(home: Path) -> None:
    p = _replay(home, "versions", "doctor", "--no-start")
    assert p.returncode == 0, p.stderr[-3000:]
    assert "as of 2024-10-14" in p.stdout
    assert f"lock vllm-{VERSION}: {home / 'envs' / f'vllm-{VERSION}' / 'replay-lock.txt'}" in p.stdout


def test_versions_check_v1_release_cuda_build_on_cpu(home: Path) -> None:
    """A V1 release, 0.10.2, as of its own release day: transformers 4.56, torch 2.8, its own tiny model;
    its engine config is checked on a stand-in CUDA platform with no device behind it (said)."""
    p = _replay(home, "versions", "check", "0.10.2", "--set", "max_model_len=2048", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout)
    stages = {s["stage"]: s for s in res["stages"]}
    for name in ("import", "tokenizer", "parser", "model_class", "args"):
        assert stages[name]["ok"] is True, stages[name]
    assert "transformers 4.56" in stages["import"]["detail"] and res["model"].endswith("-tf4.56")
    lock = (home / "envs" / "vllm-0.10.2" / "replay-lock.txt").read_text()
    assert "\ntorch==2.8.0\n" in lock and "\ntransformers==4.56.1\n" in lock


def test_argument_list_of_a_v1_cuda_build_on_cpu(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """0.10.2's API server --help stops at 'Failed to infer device type' on a host without a GPU; its
    own parser, built on the device-less CUDA stand-in, gives the argument list that `run` validates
    engine arguments against."""
    from replay.engine import envs
    from replay.engine.args import known_args, to_argv
    from replay.errors import ReplayError
    monkeypatch.setenv("REPLAY_HOME", str(home))
    monkeypatch.setenv("REPLAY_DEVICE", "cuda")
    spec = envs.resolve("0.10.2", "cuda")
    if not envs.is_installed(spec):
        envs.install(spec, log=lambda m: None)
    (spec.path / "replay-args.json").unlink(missing_ok=True)
    opts = known_args(spec)
    assert {"max-model-len", "gpu-memory-utilization", "max-num-seqs", "no-enable-prefix-caching"} <= set(opts)
    assert json.loads((spec.path / "replay-args.json").read_text()) == opts  # cached in the env
    assert to_argv({"max_model_len": 2048}, opts, spec.version) == ["--max-model-len", "2048"]
    with pytest.raises(ReplayError, match="nearest real argument: --max-model-len"):
        to_argv({"max_model_lenn": 2048}, opts, spec.version)
