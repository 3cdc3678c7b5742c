"""Exporters from ``replay-trace/1`` to other tools' formats (simple projections, no loss of order).

Each format is written the way its own reader takes it, so that the peer replays the trace as it is:
vLLM's ``bench serve --dataset-name timed_trace`` sends each request at its ``timestamp`` (seconds)
and builds its prompt from ``hash_ids``, one id per 16-token chunk, stopping where the ids end (no ids,
an empty prompt, refused by the server); AIPerf's ``mooncake_trace`` takes ``timestamp`` in
milliseconds and ``hash_ids`` of 512-token blocks, the last one partial. Where the trace has no
prefix blocks, each request gets fresh ids (no two requests share a block: the trace says nothing of
sharing), and the export's notes say so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

from replay.atomic import written_in_place
from replay.errors import ReplayError
from replay.trace.format import iter_requests, read_header
from replay.trace.prompts import synth_prompt_text

ExportFormat = Literal["vllm-bench", "vllm-timed-trace", "aiperf-mooncake"]

EXPORT_FORMATS: dict[ExportFormat, str] = {
    "vllm-bench": "vLLM `bench serve --dataset-name custom` JSONL (prompt, output_tokens; no arrival times)",
    "vllm-timed-trace": "vLLM `bench serve --dataset-name timed_trace` JSONL (timestamp s, input_length, "
                        "output_length, hash_ids of 16-token chunks)",
    "aiperf-mooncake": "AIPerf mooncake_trace JSONL (timestamp ms, input_length or text_input, output_length, "
                       "hash_ids of 512-token blocks)",
}
VLLM_CHUNK_TOKENS = 16  # vLLM bench's --timed-trace-chunk-hash-size default
AIPERF_BLOCK_TOKENS = 512  # AIPerf's mooncake_trace block size (--isl-block-size default)
VLLM_BENCH_OUTPUT_TOKENS = 256  # vLLM bench's --custom-output-len default: what a timed_trace row lacking one gets


@dataclass
class ExportResult:
    requests: int
    notes: list[str] = field(default_factory=list)


@dataclass
class _Counts:
    synthesised: int = 0  # requests whose hash ids are all fresh (the trace has no blocks for them)
    extended: int = 0  # requests whose prefix blocks were followed by fresh ids to cover the prompt
    output_defaulted: int = 0
    skipped_text: int = 0  # a prompt known only as text: timed_trace takes lengths
    skipped_empty: int = 0  # a prompt of 0 tokens, which the server refuses


class _FreshIds:
    """Block ids above every id the trace holds, each handed out once."""

    def __init__(self, src: Path) -> None:
        self.next = 1 + max((max(r["prefix_blocks"]) for r in iter_requests(src) if r.get("prefix_blocks")), default=-1)

    def take(self, n: int) -> list[int]:
        ids = list(range(self.next, self.next + n))
        self.next += n
        return ids


def _output_length(r: dict[str, Any]) -> int | None:
    """The output length to ask for: the trace's (a failed request's 0 cannot be asked for), else its
    max_tokens; None (the key left out, so that the tool applies its own default) when unknown, which a
    0 would have turned into requests with no output."""
    n = r.get("output_tokens")
    if isinstance(n, int) and n > 0:
        return n
    m = r.get("max_tokens")
    return m if isinstance(m, int) and m > 0 else None


def _input_length(r: dict[str, Any]) -> int | None:
    n_in, ids = r.get("input_tokens"), r.get("prompt_token_ids")
    return len(ids) if n_in is None and isinstance(ids, list) else n_in  # (token ids are as long as they are)


def _hash_ids(r: dict[str, Any], n_in: int, block_tokens: int, whole: bool, fresh: _FreshIds,
              c: _Counts) -> list[int]:
    """One id per block of the prompt: the trace's prefix blocks, then (``whole``: the reader builds the
    prompt from the ids alone) fresh ids for the rest; fresh ids throughout where the trace has none."""
    need = -(-n_in // block_tokens)
    own = list(r.get("prefix_blocks") or [])[:need]
    if not own:
        c.synthesised += 1
        return fresh.take(need)
    if whole and len(own) < need:
        c.extended += 1
        return own + fresh.take(need - len(own))
    return own


def _vllm_bench(r: dict[str, Any], seed: int) -> dict[str, Any]:
    out_n = _output_length(r)
    prompt = r.get("prompt") or synth_prompt_text(int(_input_length(r) or 1), seed, str(r["id"]))
    return {"prompt": prompt, **({"output_tokens": out_n} if out_n is not None else {})}


def _timed_trace(r: dict[str, Any], block_tokens: int, fresh: _FreshIds, c: _Counts) -> dict[str, Any] | None:
    n_in = _input_length(r)
    if n_in is None:
        c.skipped_text += 1
        return None
    if n_in == 0:
        c.skipped_empty += 1
        return None
    out_n = _output_length(r)
    if out_n is None:
        c.output_defaulted += 1
    return {"timestamp": round(r["t_us"] / 1e6, 6), "input_length": n_in,
            "output_length": out_n if out_n is not None else VLLM_BENCH_OUTPUT_TOKENS,
            "hash_ids": _hash_ids(r, n_in, block_tokens, True, fresh, c)}


def _mooncake(r: dict[str, Any], block_tokens: int, fresh: _FreshIds, c: _Counts) -> dict[str, Any]:
    # (a prompt known only as text, from vllm-bench or ShareGPT: AIPerf's text_input, which it tokenises
    # itself; a null input_length it refuses. A valid trace has a prompt where it has neither length nor ids.)
    n_in, out_n = _input_length(r), _output_length(r)
    rec: dict[str, Any] = {"timestamp": r["t_us"] // 1000,
                           **({"input_length": n_in} if n_in is not None else {"text_input": r.get("prompt")}),
                           **({"output_length": out_n} if out_n is not None else {})}
    if n_in:
        rec["hash_ids"] = _hash_ids(r, n_in, block_tokens, False, fresh, c)
    elif r.get("prefix_blocks"):
        rec["hash_ids"] = r["prefix_blocks"]
    return rec


def _rows(fmt: ExportFormat, src: Path, block_tokens: int, seed: int, c: _Counts) -> Iterator[dict[str, Any]]:
    fresh = _FreshIds(src) if fmt != "vllm-bench" else None
    for r in iter_requests(src):
        if fresh is None:
            yield _vllm_bench(r, seed)
        elif fmt == "vllm-timed-trace":
            if (row := _timed_trace(r, block_tokens, fresh, c)) is not None:
                yield row
        else:
            yield _mooncake(r, block_tokens, fresh, c)


def _notes(fmt: ExportFormat, out: Path, n: int, block_tokens: int, own_blocks: bool, c: _Counts) -> list[str]:
    """What the user must know, and tell the other tool, for the export to mean what the trace means."""
    if fmt == "vllm-bench":
        return [f"replay with: vllm bench serve --backend vllm --dataset-name custom --dataset-path {out} "
                f"--num-prompts {n} --custom-output-len -1 --ignore-eos --skip-chat-template --disable-shuffle "
                "(the custom dataset has no arrival times: vLLM bench sends at its --request-rate; "
                "--format vllm-timed-trace keeps the trace's timing)"]
    counted = [
        (c.synthesised, f"hash_ids synthesised for {c.synthesised} of {n} requests (the trace has no prefix blocks "
                        f"for them): one fresh id per {block_tokens}-token block, no prefix shared between requests"),
        (c.extended, f"{c.extended} requests' prefix blocks are followed by fresh ids to cover the whole prompt "
                     "(vLLM builds the prompt from the ids alone)"),
        (c.output_defaulted, f"{c.output_defaulted} requests have no known output length: they ask for "
                             f"{VLLM_BENCH_OUTPUT_TOKENS} tokens (vLLM bench's default; timed_trace needs one)"),
        (c.skipped_text, f"{c.skipped_text} requests left out: their prompt is known only as text, timed_trace "
                         "takes lengths (--format vllm-bench carries the text, without times)"),
        (c.skipped_empty, f"{c.skipped_empty} requests left out: a prompt of 0 tokens, which the server refuses"),
    ]
    notes = [text for k, text in counted if k]
    if fmt == "vllm-timed-trace":
        chunk = f" --timed-trace-chunk-hash-size {block_tokens}" if block_tokens != VLLM_CHUNK_TOKENS else ""
        notes.append(f"replay with: vllm bench serve --backend vllm --dataset-name timed_trace --dataset-path {out} "
                     f"--num-prompts {n}{chunk} (timestamps in seconds from the trace's t0)")
    else:
        if own_blocks and block_tokens != AIPERF_BLOCK_TOKENS:
            notes.append(f"hash_ids are blocks of {block_tokens} tokens: run aiperf with --isl-block-size "
                         f"{block_tokens} (its default is {AIPERF_BLOCK_TOKENS})")
        notes.append(f"replay with: aiperf profile --input-file {out} --custom-dataset-type mooncake_trace "
                     "--fixed-schedule --extra-inputs ignore_eos:true (each output as long as the trace's); "
                     "vLLM bench reads it too, with --dataset-name timed_trace "
                     f"--timed-trace-sec-multiplier 0.001 --timed-trace-chunk-hash-size {block_tokens}")
    return notes


def export_trace(fmt: str, src: Path, out: Path, seed: int = 0) -> ExportResult:
    """Write ``src`` as ``fmt`` to ``out``; the result's notes say what was made up and how to replay it."""
    if fmt not in get_args(ExportFormat):
        raise ReplayError(f"unknown export format {fmt!r}; choose one of: {', '.join(EXPORT_FORMATS)}", 2)
    f = cast(ExportFormat, fmt)
    bs = read_header(src).prefix.get("block_size")
    own_blocks = isinstance(bs, int) and bs > 0
    block_tokens: int = bs if isinstance(bs, int) and own_blocks else (
        VLLM_CHUNK_TOKENS if f == "vllm-timed-trace" else AIPERF_BLOCK_TOKENS)
    c = _Counts()
    n = 0
    with written_in_place(out) as part, part.open("w", encoding="utf-8") as fh:
        for row in _rows(f, src, block_tokens, seed, c):
            fh.write(json.dumps(row) + "\n")
            n += 1
    return ExportResult(n, _notes(f, out, n, block_tokens, own_blocks, c))
