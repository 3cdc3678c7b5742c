"""Exporters from ``replay-trace/1`` to other tools' formats (simple projections, no loss of order)."""

from __future__ import annotations

import json
from pathlib import Path

from replay.errors import ReplayError
from replay.trace.format import iter_requests
from replay.trace.prompts import synth_prompt_text

EXPORT_FORMATS = {
    "vllm-bench": "vLLM `bench serve --dataset-name custom` JSONL (prompt, output_tokens)",
    "aiperf-mooncake": "AIPerf mooncake_trace JSONL (timestamp ms, input_length, output_length, hash_ids)",
}


def export_trace(fmt: str, src: Path, out: Path, seed: int = 0) -> int:
    if fmt not in EXPORT_FORMATS:
        raise ReplayError(f"unknown export format {fmt!r}; choose one of: {', '.join(EXPORT_FORMATS)}", 2)
    n = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for r in iter_requests(src):
            if fmt == "vllm-bench":
                prompt = r.get("prompt") or synth_prompt_text(int(r.get("input_tokens") or 1), seed, str(r["id"]))
                rec = {"prompt": prompt, "output_tokens": r.get("output_tokens") or r.get("max_tokens")}
            else:
                rec = {"timestamp": r["t_us"] // 1000, "input_length": r.get("input_tokens"),
                       "output_length": r.get("output_tokens") or r.get("max_tokens") or 0}
                if r.get("prefix_blocks"):
                    rec["hash_ids"] = r["prefix_blocks"]
            fh.write(json.dumps(rec) + "\n")
            n += 1
    return n
