"""Attribution: which traffic drove the gap, and what kind of OOM the messages describe.

Requests sent around the onset, and those known to be still in flight at it (sent earlier, finished
after it: a long prefill, such as one with prompt_logprobs, raises memory while it runs, seconds
after it was sent), are compared with the rest of the traffic, feature by feature (input length,
max_tokens, prompt_logprobs, logprobs, n/best_of, image tokens, prefix sharing); each feature is
scored by how over-represented it is near the onset, weighted by how much memory it is known to
cost outside vLLM's budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import polars as pl

IMAGE_TOKENS_PER_ITEM = 256  # an image whose tokens are unknown: 448 x 448 on Qwen2-VL's grid (the driver's default)
FEATURES: dict[str, pl.Expr] = {
    "prompt_logprobs": (pl.col("prompt_logprobs").fill_null(0) > 0).cast(pl.Float64) * pl.col("input_tokens").fill_null(0),
    "input_length": pl.col("input_tokens").fill_null(0).cast(pl.Float64),
    "max_tokens": pl.col("max_tokens").fill_null(0).cast(pl.Float64),
    "logprobs": (pl.col("logprobs").fill_null(0) > 0).cast(pl.Float64),
    "n_best_of": (pl.col("n").fill_null(1) - 1 + pl.col("best_of").fill_null(1) - 1).clip(0).cast(pl.Float64),
    # (image tokens, not items: one 1792 x 1792 image costs the encoder 64 times a 224 x 224 one)
    "multimodal": pl.coalesce("image_tokens", pl.col("mm_items") * IMAGE_TOKENS_PER_ITEM).fill_null(0).cast(pl.Float64),
    "prefix_sharing": pl.col("prefix_blocks").fill_null(0).cast(pl.Float64),
}
WHY = {
    "prompt_logprobs": "prompt_logprobs materialise prompt_len x vocab logits that vLLM does not budget (vLLM #5907, #8184)",
    "input_length": "long prompts raise activation memory beyond the profiled peak",
    "max_tokens": "large max_tokens reserve KV blocks as sequences grow",
    "logprobs": "sampled logprobs add per-token buffers",
    "n_best_of": "n/best_of fork sequences and multiply KV and sampler memory",
    "multimodal": "image tokens add vision-encoder activations and encoder-cache entries outside the KV pool",
    "prefix_sharing": "prefix sharing changes which KV blocks stay pinned",
}


@dataclass
class Attribution:
    feature: str
    score: float
    near_mean: float
    rest_mean: float
    near_ids: list[str]
    why: str


def attribute(requests: pl.DataFrame | pl.LazyFrame, onset_us: int | None, *, before_us: int = 3_000_000,
              after_us: int = 1_000_000) -> list[Attribution]:
    if onset_us is None:
        return []
    t = pl.coalesce(pl.col("sent_us"), pl.col("arrival_us"))
    # (a query, not copies: a day of log holds millions of requests, and only those near the onset
    # are kept as rows; the rest are only averaged)
    # (in flight only where its finish is known: a log without finish lines would make every earlier
    # request look in flight)
    in_flight = (t < onset_us - before_us) & (pl.col("finish_us") > onset_us).fill_null(False)
    lf = requests.lazy()
    if "image_tokens" not in lf.collect_schema().names():  # (a bundle written before image tokens were kept)
        lf = lf.with_columns(image_tokens=pl.lit(None, dtype=pl.Int64))
    is_near = ((t >= onset_us - before_us) & (t <= onset_us + after_us)) | in_flight
    features = {f"f_{k}": v for k, v in FEATURES.items()}
    # (two streaming queries, each filtering the file's own columns: a filter on a column the query made
    # held every request's features at once, 250 MB for 2.7M requests; unknown nearness is in neither)
    near = lf.filter(is_near).select("id", **features).collect(engine="streaming")
    rest = lf.filter(~is_near).select(pl.len().alias("n"), *(v.mean().alias(k) for k, v in features.items())
                                      ).collect(engine="streaming")
    if near.height == 0:
        return []
    out = []
    for k in FEATURES:
        nm = float(near[f"f_{k}"].mean() or 0.0)  # type: ignore[arg-type]
        rm = float(rest[f"f_{k}"][0] or 0.0) if rest["n"][0] else 0.0
        if nm <= 0:
            continue
        score = math.log((nm + 1.0) / (rm + 1.0))
        if score <= 0.05:
            continue
        ids = near.filter(pl.col(f"f_{k}") > (rm if rm > 0 else 0))["id"].to_list()
        out.append(Attribution(k, round(score, 3), nm, rm, ids, WHY[k]))
    return sorted(out, key=lambda a: a.score, reverse=True)


def _itself_listed(oom: dict[str, Any]) -> dict[str, Any] | None:
    """The process torch lists as 'Process N has X memory in use' that is the one that ran out, where torch
    did not recognise itself (its PID inside a container is not the driver's PID for it, so torch names
    no 'this process' line and lists every process on the device). It is known by the sum: the listed
    processes and PyTorch's own memory together exceed what the device had in use, so one of the listed
    is this process; it is the least one that holds PyTorch's memory. None where the figures do not show it."""
    total, free = oom.get("gpu_total_bytes"), oom.get("free_bytes")
    alloc, resv = oom.get("allocated_by_pytorch_bytes"), oom.get("reserved_unallocated_bytes")
    listed = [p for p in oom.get("other_processes") or [] if p.get("used_bytes") is not None]
    if total is None or free is None or alloc is None or not listed:
        return None
    torch_held = alloc + (resv or 0)
    used = total - free
    if sum(p["used_bytes"] for p in listed) + torch_held <= used + max(0.02 * total, 2**28):
        return None  # (every listed process fits beside this one's PyTorch memory)
    holds = [p for p in listed if p["used_bytes"] >= torch_held]
    return min(holds, key=lambda p: p["used_bytes"]) if holds else None


def classify_oom(oom: dict[str, Any], kv_usage_ratio: float | None = None) -> list[tuple[str, str, str]]:
    """(cause, confidence, reasoning) from one parsed CUDA OOM message, most likely first."""
    out: list[tuple[str, str, str]] = []
    total = oom.get("gpu_total_bytes") or 0
    tried = oom.get("tried_to_allocate_bytes") or 0
    resv = oom.get("reserved_unallocated_bytes")
    alloc = oom.get("allocated_by_pytorch_bytes")
    this = oom.get("process_in_use_bytes")
    listed = list(oom.get("other_processes") or [])
    itself = _itself_listed(oom) if this is None else None
    if itself is not None:  # (torch did not know its own process by the PID the driver gave it)
        this = itself.get("used_bytes")
        listed.remove(itself)
    others = sum(p.get("used_bytes") or 0 for p in listed)
    free = oom.get("free_bytes")
    room = None if free is None else free + (resv or 0)  # (what the allocator had, had it been in one piece)
    if total and tried > total:
        out.append(("allocation larger than the GPU", "high",
                    f"one allocation of {tried / 2**30:.2f} GiB is more than the GPU's whole {total / 2**30:.2f} GiB: no "
                    "gpu_memory_utilization, allocator setting or co-tenant made it fail; the shape of what was run "
                    "(a prompt, an image or a batch whose tensor is this size) did; cap it (max_model_len, "
                    "max_num_batched_tokens, the media's size)"))
    elif room is not None and total and tried > room and room > 0.2 * total:
        out.append(("one oversized allocation", "high",
                    f"{room / 2**30:.2f} GiB ({room / total:.0%} of the GPU) was free or reserved but unused, and one "
                    f"allocation asked for {tried / 2**30:.2f} GiB: not a slow growth to the limit but a single tensor "
                    "sized by what was run (a long prompt's activations or logits, a large image, a big batch)"))
    if resv is not None and tried and tried <= total and (resv >= tried or (total and resv > 0.05 * total)):
        out.append(("fragmentation", "high" if resv >= tried else "medium",
                    f"{resv / 2**30:.2f} GiB reserved by PyTorch but unallocated vs {tried / 2**30:.2f} GiB requested: "
                    "free blocks exist but are split; try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    if total and others > 0.05 * total:
        out.append(("co-tenant process", "high", f"other processes hold {others / 2**30:.2f} GiB on the device"))
    if this is not None and alloc is not None and resv is not None and this - alloc - resv > 1.5 * 2**30:
        out.append(("non-torch growth", "medium",
                    f"this process uses {(this - alloc - resv) / 2**30:.2f} GiB outside PyTorch's allocator "
                    "(CUDA context, NCCL, cuBLAS workspaces, graphs)"))
    if not out:
        kv = f" with KV usage at {kv_usage_ratio * 100:.0f}%" if kv_usage_ratio is not None else ""
        out.append(("budget too high / activation spike beyond the profile", "medium",
                    f"PyTorch holds nearly all memory{kv} and a {tried / 2**30:.2f} GiB allocation did not fit: "
                    "the profiled budget left too little headroom for this traffic"))
    if itself is not None and this is not None:
        cause, conf, why = out[0]
        out[0] = (cause, conf, f"{why} (the process that ran out is the one torch lists as process {itself.get('pid')}, "
                               f"{this / 2**30:.2f} GiB, by a PID from outside its container: the device's memory in use "
                               "cannot hold both it and PyTorch's own; "
                               + ("no other process is on the device" if not listed else
                                  f"{len(listed)} other process(es) listed beside it") + ")")
    return out
