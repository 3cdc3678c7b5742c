"""Exporters from ``replay-trace/1`` to other tools' formats (simple projections, no loss of order)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from replay.errors import ReplayError
from replay.trace.format import iter_requests, read_header
from replay.trace.prompts import synth_prompt_text

EXPORT_FORMATS = {
    "vllm-bench": "vLLM `bench serve --dataset-name custom` JSONL (prompt, output_tokens)",
    "aiperf-mooncake": "AIPerf mooncake_trace JSONL (timestamp ms, input_length or text_input, output_length, hash_ids)",
}


def _output_length(r: dict[str, Any]) -> int | None:
    """The output length to ask for: the trace's (a failed request's 0 cannot be asked for), else its
    max_tokens; None (the key left out, so that the tool applies its own default) when unknown, which a
    0 would have turned into requests with no output."""
    n = r.get("output_tokens")
    if isinstance(n, int) and n > 0:
        return n
    m = r.get("max_tokens")
    return m if isinstance(m, int) and m > 0 else None


def export_notes(fmt: str, src: Path) -> list[str]:
    """What the user must tell the other tool for the export to mean what the trace means."""
    bs = read_header(src).prefix.get("block_size")
    if fmt == "aiperf-mooncake" and isinstance(bs, int) and bs != 512:
        return [f"hash_ids are blocks of {bs} tokens: run aiperf with --isl-block-size {bs} (its default is 512)"]
    return []


def export_trace(fmt: str, src: Path, out: Path, seed: int = 0) -> int:
    if fmt not in EXPORT_FORMATS:
        raise ReplayError(f"unknown export format {fmt!r}; choose one of: {', '.join(EXPORT_FORMATS)}", 2)
    n = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for r in iter_requests(src):
            out_n = _output_length(r)
            n_in, ids = r.get("input_tokens"), r.get("prompt_token_ids")
            n_in = len(ids) if n_in is None and isinstance(ids, list) else n_in  # (token ids are as long as they are)
            if fmt == "vllm-bench":
                prompt = r.get("prompt") or synth_prompt_text(int(n_in or 1), seed, str(r["id"]))
                rec = {"prompt": prompt, **({"output_tokens": out_n} if out_n is not None else {})}
            else:  # (a prompt known only as text, from vllm-bench or ShareGPT: AIPerf's text_input, which it
                # tokenises itself; a null input_length it refuses. A valid trace has a prompt where it has
                # neither length nor ids.)
                rec = {"timestamp": r["t_us"] // 1000,
                       **({"input_length": n_in} if n_in is not None else {"text_input": r.get("prompt")}),
                       **({"output_length": out_n} if out_n is not None else {})}
                if r.get("prefix_blocks"):
                    rec["hash_ids"] = r["prefix_blocks"]
            fh.write(json.dumps(rec) + "\n")
            n += 1
    return n
