"""The exports as their readers take them: the rules of vLLM 0.32's ``TimedTrace`` (bench serve's
timed_trace: seconds, a prompt built from the hash ids alone, 16 tokens each) and AIPerf 0.13's
``MooncakeTrace`` (milliseconds, 512-token blocks, the last one partial, prefix-only allowed). Their
real clients are run on these files in tests/integration/test_export_peers.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replay.errors import ReplayError
from replay.trace.exporters import export_trace
from replay.trace.format import TraceHeader, iter_requests, write_trace
from replay.trace.importers import import_trace
from replay.trace.synth import SynthSpec, synth
from tests.conftest import DATA, ROOT, shared


def _rows(p: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in p.read_text().splitlines()]


def _trace(tmp_path: Path, reqs: list[dict[str, Any]], block_size: int | None = None) -> Path:
    p = tmp_path / "t.jsonl"
    write_trace(p, TraceHeader(source={}, time={}, prefix={"block_size": block_size}), reqs)
    return p


def _vllm_prompt_len(row: dict[str, Any], chunk: int = 16) -> int:
    """How long a prompt vLLM 0.32's TimedTrace._expand_prompt builds: one chunk per id, the last cut
    to what is left of input_length, stopping where the ids end."""
    left, n = row["input_length"], 0
    for _ in row.get("hash_ids", []):
        take = chunk if left >= chunk else left
        n, left = n + take, left - take
        if left <= 0:
            break
    return n


def test_export_aiperf_and_vllm_bench(tmp_path: Path) -> None:
    p = _trace(tmp_path, [{"id": "a", "t_us": 1500, "input_tokens": 5, "output_tokens": 2, "prefix_blocks": [1, 2]},
                          {"id": "b", "t_us": 2_000_000, "input_tokens": 7, "output_tokens": 3}], block_size=4)
    assert export_trace("aiperf-mooncake", p, tmp_path / "m.jsonl").requests == 2
    # the trace's own blocks as they are; a fresh id above every id of the trace where it has none
    assert _rows(tmp_path / "m.jsonl") == [{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [1, 2]},
                                           {"timestamp": 2000, "input_length": 7, "output_length": 3, "hash_ids": [3, 4]}]
    r = export_trace("vllm-bench", p, tmp_path / "v.jsonl")
    v = _rows(tmp_path / "v.jsonl")
    assert len(v[1]["prompt"].split()) == 7 and v[1]["output_tokens"] == 3
    assert len(r.notes) == 1 and "--dataset-name custom" in r.notes[0] and "--custom-output-len -1" in r.notes[0]
    assert "(the custom dataset has no arrival times: vLLM bench sends at its --request-rate" in r.notes[0]


def test_a_synthetic_trace_goes_to_vllm_timed_trace_with_its_times_and_a_whole_prompt(tmp_path: Path) -> None:
    """GIVEN `replay synth`'s 20 requests (no prefix blocks, as the trace that vLLM's bench answered with
    400 for every request: it builds each prompt from hash_ids) WHEN exported for timed_trace THEN each
    row's ids give vLLM a prompt of exactly its input length, at its time in seconds, no id shared."""
    h, reqs = synth(SynthSpec(requests=20, seed=0, context_len=512, input_median=64, output_median=4))
    src = tmp_path / "s.jsonl"
    write_trace(src, h, reqs)
    r = export_trace("vllm-timed-trace", src, tmp_path / "v.jsonl")
    rows, trace = _rows(tmp_path / "v.jsonl"), list(iter_requests(src))
    assert r.requests == len(rows) == 20
    assert [x["timestamp"] for x in rows] == [t["t_us"] / 1e6 for t in trace]
    assert [_vllm_prompt_len(x) for x in rows] == [x["input_length"] for x in rows] == [t["input_tokens"] for t in trace]
    assert [x["output_length"] for x in rows] == [t["output_tokens"] for t in trace]
    ids = [i for x in rows for i in x["hash_ids"]]
    assert len(ids) == len(set(ids)) == sum(-(-x["input_length"] // 16) for x in rows)
    assert r.notes[0] == ("hash_ids synthesised for 20 of 20 requests (the trace has no prefix blocks for them): "
                          "one fresh id per 16-token block, no prefix shared between requests")
    assert "--dataset-name timed_trace" in r.notes[-1] and "--num-prompts 20" in r.notes[-1]
    # the same trace for AIPerf: a block per 512 tokens (these prompts are shorter: one each)
    m = export_trace("aiperf-mooncake", src, tmp_path / "m.jsonl")
    assert [x["hash_ids"] for x in _rows(tmp_path / "m.jsonl")] == [[i] for i in range(20)]
    assert [x["timestamp"] for x in _rows(tmp_path / "m.jsonl")] == [t["t_us"] // 1000 for t in trace]
    assert "one fresh id per 512-token block" in m.notes[0]


def test_prefix_blocks_are_kept_and_covered_to_the_prompts_end_for_vllm(tmp_path: Path) -> None:
    """GIVEN real Mooncake rows (512-token blocks, the cached prefix shared between requests) WHEN
    exported THEN shared ids stay shared; vLLM is told the block size; a prompt longer than its blocks
    (a prefix-only row) gets fresh ids for the rest, which AIPerf pads itself."""
    t = tmp_path / "t.jsonl"
    import_trace("mooncake", shared("traces/mooncake/arxiv_mooncake_trace_first20.jsonl"), t)
    trace = list(iter_requests(t))
    r = export_trace("vllm-timed-trace", t, tmp_path / "v.jsonl")
    rows = _rows(tmp_path / "v.jsonl")
    assert [_vllm_prompt_len(x, 512) for x in rows] == [x["input_tokens"] for x in trace]
    assert [x["hash_ids"][:len(x0["prefix_blocks"])] for x, x0 in zip(rows, trace, strict=True)] == \
        [x0["prefix_blocks"] for x0 in trace]
    assert "--timed-trace-chunk-hash-size 512" in r.notes[-1] and not any("synthesised" in n for n in r.notes)
    short = _trace(tmp_path, [{"id": "a", "t_us": 0, "input_tokens": 40, "output_tokens": 1, "prefix_blocks": [7]}], 16)
    r = export_trace("vllm-timed-trace", short, tmp_path / "s.jsonl")
    assert _rows(tmp_path / "s.jsonl")[0]["hash_ids"] == [7, 8, 9]
    assert r.notes[0] == ("1 requests' prefix blocks are followed by fresh ids to cover the whole prompt "
                          "(vLLM builds the prompt from the ids alone)")
    export_trace("aiperf-mooncake", short, tmp_path / "a.jsonl")
    assert _rows(tmp_path / "a.jsonl")[0]["hash_ids"] == [7]


def test_export_leaves_out_an_unknown_output_and_names_the_block_size(tmp_path: Path) -> None:
    # GIVEN a real content-hash trace of a batch job: 16-token blocks, output length unknown
    t = tmp_path / "t.jsonl"
    import_trace("servegen-offline", DATA / "servegen_offline_trace_c_head6.jsonl", t)
    r = export_trace("aiperf-mooncake", t, tmp_path / "m.jsonl")
    rows = _rows(tmp_path / "m.jsonl")
    # THEN no output length is made up for AIPerf (a 0 asked for no output at all), and the user is told the block size
    assert rows and all("output_length" not in x and x["hash_ids"] for x in rows)
    assert r.notes[0] == "hash_ids are blocks of 16 tokens: run aiperf with --isl-block-size 16 (its default is 512)"
    export_trace("vllm-bench", t, tmp_path / "v.jsonl")
    assert all("output_tokens" not in x for x in _rows(tmp_path / "v.jsonl"))
    # timed_trace refuses a row without one: vLLM bench's own default, said so
    r = export_trace("vllm-timed-trace", t, tmp_path / "tt.jsonl")
    assert {x["output_length"] for x in _rows(tmp_path / "tt.jsonl")} == {256}
    assert f"{len(rows)} requests have no known output length: they ask for 256 tokens" in r.notes[0]
    # a failed request's 0 falls back to its max_tokens, else is left out
    p = _trace(tmp_path, [{"id": "a", "t_us": 0, "input_tokens": 5, "output_tokens": 0, "max_tokens": 64},
                          {"id": "b", "t_us": 1, "input_tokens": 5, "output_tokens": 0}])
    r = export_trace("aiperf-mooncake", p, tmp_path / "f.out")
    assert [x.get("output_length") for x in _rows(tmp_path / "f.out")] == [64, None]
    assert not any("isl-block-size" in n for n in r.notes)


def test_export_gives_aiperf_a_text_prompt_as_text_input(tmp_path: Path) -> None:
    """GIVEN ShareGPT conversations imported (prompts as text, lengths in tokens unknown) WHEN exported
    for AIPerf THEN each prompt is its text_input (which AIPerf tokenises), not a null input_length it
    refuses; a prompt of token ids is as long as its ids. timed_trace, which takes lengths only, leaves
    them out and says how many."""
    t = tmp_path / "t.jsonl"
    import_trace("sharegpt", DATA / "sharegpt_v3_layout.json", t)
    export_trace("aiperf-mooncake", t, tmp_path / "m.jsonl")
    prompts = [r["prompt"] for r in iter_requests(t)]
    assert _rows(tmp_path / "m.jsonl") == [{"timestamp": 0, "text_input": p} for p in prompts] and len(prompts) == 5
    r = export_trace("vllm-timed-trace", t, tmp_path / "tt.jsonl")
    assert r.requests == 0 and (tmp_path / "tt.jsonl").read_text() == ""
    assert r.notes[0].startswith("5 requests left out: their prompt is known only as text")
    p = _trace(tmp_path, [{"id": "q7", "t_us": 0, "input_tokens": None, "prompt_token_ids": [5, 6, 7]}])
    export_trace("aiperf-mooncake", p, tmp_path / "x.jsonl")
    assert _rows(tmp_path / "x.jsonl") == [{"timestamp": 0, "input_length": 3, "hash_ids": [0]}]
    export_trace("vllm-bench", p, tmp_path / "y.jsonl")
    assert len(_rows(tmp_path / "y.jsonl")[0]["prompt"].split()) == 3  # (not a prompt of one)


def test_unknown_format_is_refused_by_name(tmp_path: Path) -> None:
    p = _trace(tmp_path, [{"id": "a", "t_us": 0, "input_tokens": 5}])
    with pytest.raises(ReplayError, match="unknown export format 'mooncake'; choose one of: vllm-bench, vllm-timed-trace"):
        export_trace("mooncake", p, tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


def test_cli_export_prints_its_notes(tmp_path: Path) -> None:
    p = _trace(tmp_path, [{"id": "a", "t_us": 250_000, "input_tokens": 20, "output_tokens": 2}])
    r = subprocess.run([sys.executable, "-m", "replay", "export", str(p), "--format", "vllm-timed-trace", "-o",
                        str(tmp_path / "v.jsonl")], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stderr and ": 1 requests" in r.stderr
    assert "note: hash_ids synthesised for 1 of 1 requests" in r.stderr
    assert _rows(tmp_path / "v.jsonl") == [{"timestamp": 0.25, "input_length": 20, "output_length": 2, "hash_ids": [0, 1]}]
