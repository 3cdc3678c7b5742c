from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.errors import ReplayError
from replay.trace.format import TraceHeader, iter_requests, read_header, write_trace
from replay.trace.synth import SynthSpec, synth


def test_newer_schema_refused(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"kind": "header", "schema": "replay-trace/9", "source": {}, "time": {}}) + "\n")
    with pytest.raises(ReplayError, match="newer replay"):
        read_header(p)


def test_bad_request_line_names_file_and_line(tmp_path: Path) -> None:
    h = TraceHeader(source={}, time={})
    p = tmp_path / "t.jsonl"
    write_trace(p, h, [{"id": "a", "t_us": 0, "input_tokens": 3}])
    with p.open("a") as fh:
        fh.write('{"id": "b", "t_us": -5, "input_tokens": 3}\n')
    with pytest.raises(ReplayError, match=r"t\.jsonl:3: t_us must be a non-negative integer"):
        list(iter_requests(p))


def test_synth_is_deterministic_and_respects_context(tmp_path: Path) -> None:
    a = list(synth(SynthSpec(requests=300, seed=7, context_len=2048, prompt_logprobs_share=0.2, multimodal_share=0.1))[1])
    b = list(synth(SynthSpec(requests=300, seed=7, context_len=2048, prompt_logprobs_share=0.2, multimodal_share=0.1))[1])
    c = list(synth(SynthSpec(requests=300, seed=8, context_len=2048))[1])
    assert a == b and a != c
    assert all(r["input_tokens"] + r["output_tokens"] <= 2048 for r in a)
    share = sum(1 for r in a if r["sampling"].get("prompt_logprobs")) / len(a)
    assert 0.1 < share < 0.3
    assert [r["t_us"] for r in a] == sorted(r["t_us"] for r in a)


def test_synth_streams_its_requests_into_the_trace(tmp_path: Path) -> None:
    """`replay synth --requests 10000000` neither holds its requests (drawn one at a time as they are
    written: a million held took 0.9 GB) nor leaves a half-written trace when it is interrupted; the
    progress bar is told how far it is."""
    h, drawn = synth(SynthSpec(requests=10**9, seed=3))
    first = list(itertools.islice(drawn, 3))  # (a billion requests: only drawn as asked for)
    assert [r["id"] for r in first] == ["s0", "s1", "s2"] and h.import_counts["rows_emitted"] == 10**9
    p = tmp_path / "t.jsonl"
    seen: list[int] = []
    n, last_t = write_trace(p, *synth(SynthSpec(requests=10_000, seed=3)), progress=seen.append)
    rows = list(iter_requests(p))
    assert n == len(rows) == 10_000 and last_t == rows[-1]["t_us"] and rows[:3] == first
    assert seen == sorted(seen) and seen[0] == 4096 and seen[-1] == 10_000
    before = p.read_bytes()

    def interrupted() -> Iterator[dict[str, Any]]:
        yield from itertools.islice(synth(SynthSpec(requests=10_000, seed=4))[1], 5000)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_trace(p, h, interrupted())
    assert p.read_bytes() == before and not list(tmp_path.glob("*.part"))  # the last trace, as it was


@pytest.mark.parametrize("args,named", [
    (["--multimodal", "2"], "--multimodal"), (["--prompt-logprobs-share", "-0.1"], "--prompt-logprobs-share"),
    (["--rate", "nan"], "--rate"), (["--rate", "1e-300"], "--rate"), (["--context-len", "0"], "--context-len"),
    (["--input-median", "0"], "--input-median"), (["--output-median", "-5"], "--output-median"),
    (["--arrival", "uniform"], "--arrival"), (["--requests", "0"], "--requests"),
])
def test_synth_refuses_a_spec_that_cannot_make_a_trace(args: list[str], named: str, tmp_path: Path) -> None:
    """By name, before writing: a share outside 0-1 was taken as always or never, a median of 0 or
    a rate of NaN ended in an internal error, a context of 0 tokens gave prompts of -16 tokens, a rate
    so slow that the times overflow wrote them anyway."""
    from typer.testing import CliRunner

    from replay.cli import app
    res = CliRunner().invoke(app, ["synth", "--requests", "50", *args, "-o", str(tmp_path / "s.jsonl")])
    assert isinstance(res.exception, ReplayError) and res.exception.exit_code == 2, res.output
    assert str(res.exception).startswith(named + ":") and not (tmp_path / "s.jsonl").exists()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200), st.floats(1e-3, 1e4), st.sampled_from(["poisson", "bursty"]), st.integers(17, 1 << 17),
       st.integers(1, 1 << 17), st.integers(1, 1 << 15), st.floats(0, 1), st.floats(0, 1), st.integers(0, 2**32))
def test_every_spec_the_check_passes_gives_requests_a_server_can_take(
        n: int, rate: float, arrival: str, ctx: int, in_med: int, out_med: int, mm: float, lp: float, seed: int) -> None:
    """Whatever the spec that passes the check: prompts of at least 1 token, at least 1 output token,
    both within the context, arrival times in order and within 64 bits."""
    spec = SynthSpec(n, rate, arrival, ctx, in_med, out_med, mm, lp, 20, seed)
    spec.check()
    reqs = list(synth(spec)[1])
    assert len(reqs) == n
    assert all(r["input_tokens"] >= 1 and r["output_tokens"] >= 1 and r["input_tokens"] + r["output_tokens"] <= ctx
               for r in reqs)
    ts = [r["t_us"] for r in reqs]
    assert ts == sorted(ts) and ts[-1] < 2**63
