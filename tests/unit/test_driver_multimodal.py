"""A multimodal trace's plan: the server's limit_mm_per_prompt from the trace, production's own limit
winning, and none for a model that takes no images. Nothing is installed or started (plan only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from replay.drive.runner import RunOptions, plan

HEADER = {"kind": "header", "schema": "replay-trace/1", "source": {"format": "synth"}, "time": {"src_unit": "us"}}


def _trace(path: Path, engine_args: dict[str, Any] | None = None) -> Path:
    reqs = [{"id": "a", "t_us": 0, "input_tokens": 8, "output_tokens": 2, "mm": [{"type": "image", "count": 3}]},
            {"id": "b", "t_us": 5, "input_tokens": 8, "output_tokens": 2,
             "mm": [{"type": "image", "count": 1, "width": 64, "height": 64}, {"type": "audio", "count": 4}]},
            {"id": "c", "t_us": 9, "input_tokens": 8, "output_tokens": 2}]
    head = {**HEADER, "engine_args": engine_args} if engine_args else HEADER
    path.write_text("\n".join(json.dumps(x) for x in [head, *reqs]) + "\n")
    return path


@pytest.fixture(autouse=True)
def _cpu_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("REPLAY_DEVICE", "cpu")


def test_vision_env_serves_the_trace_its_most_images(tmp_path: Path) -> None:
    p = plan(_trace(tmp_path / "t.jsonl"), RunOptions(vllm="0.32+vision", install=False))
    assert p.spec.variant == "vision" and "tiny-qwen2-vl" in p.model
    assert p.engine_args["limit_mm_per_prompt"] == {"image": 3}


def test_productions_own_limit_wins(tmp_path: Path) -> None:
    t = _trace(tmp_path / "t.jsonl", engine_args={"limit_mm_per_prompt": {"image": 1}})
    assert plan(t, RunOptions(vllm="0.32+vision", install=False)).engine_args["limit_mm_per_prompt"] == {"image": 1}


def test_a_text_model_gets_no_limit(tmp_path: Path) -> None:
    p = plan(_trace(tmp_path / "t.jsonl"), RunOptions(vllm="0.32", install=False))
    assert "limit_mm_per_prompt" not in p.engine_args and "tiny-llama" in p.model


def test_a_text_env_names_the_vision_env_for_a_trace_with_images(tmp_path: Path) -> None:
    # GIVEN a trace of which two requests carry images, planned on the text env and on the vision env
    text = plan(_trace(tmp_path / "t.jsonl"), RunOptions(vllm="0.32", install=False))
    vision = plan(_trace(tmp_path / "v.jsonl"), RunOptions(vllm="0.32+vision", install=False))
    # THEN the text env's plan says what the image requests will meet, and the env that takes them
    said = [n for n in text.notes if "carry images" in n]
    assert said == ["2 of the trace's requests carry images, and the served model takes none: the server will refuse "
                    "each (reported with its error); replay on --vllm 0.32+vision (the CPU engine with torchvision "
                    "and a tiny Qwen2-VL) to send them"]
    assert not any("carry images" in n for n in vision.notes)
    # and each names the tiny model it serves
    assert any("tiny local Llama" in n for n in text.notes)
    assert any("tiny local Qwen2-VL" in n for n in vision.notes) and not any("Llama" in n for n in vision.notes)
