"""``replay synth``: deterministic synthetic workloads in ``replay-trace/1``.

Arrival process (Poisson or bursty on/off), lognormal length distributions capped by the context
length, a share of multimodal requests and of requests with ``prompt_logprobs`` (which vLLM does
not budget). The same ``--seed`` always gives the same file.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from replay.errors import refuse_options
from replay.trace.format import TraceHeader


@dataclass
class SynthSpec:
    requests: int = 1000
    rate: float = 5.0  # mean requests/s
    arrival: str = "poisson"  # poisson | bursty
    context_len: int = 8192
    input_median: int = 1024
    output_median: int = 128
    multimodal_share: float = 0.0
    prompt_logprobs_share: float = 0.0
    prompt_logprobs: int = 20
    seed: int = 0

    def check(self) -> None:
        """Refuse, by the option's name, a spec that cannot make a trace: a median of 0 tokens (a
        lognormal needs its log), a context of 16 tokens or fewer (16 are kept for the output, so
        prompts had negative lengths), a share outside 0-1 (taken as always or never), a rate of no
        number, or so slow that the arrival times overflow the trace's 64-bit microseconds."""
        def share(x: float) -> bool:
            return 0.0 <= x <= 1.0  # (NaN fails)
        refuse_options([
            ("--requests", self.requests >= 1, "at least 1", self.requests),
            ("--rate", 0 < self.rate < math.inf, "a finite number of requests per second above 0", self.rate),
            ("--arrival", self.arrival in ("poisson", "bursty"), "poisson or bursty", self.arrival),
            ("--context-len", self.context_len > CONTEXT_RESERVE, f"more than {CONTEXT_RESERVE} tokens (kept for the output)",
             self.context_len),
            ("--input-median", self.input_median >= 1, "at least 1 token", self.input_median),
            ("--output-median", self.output_median >= 1, "at least 1 token", self.output_median),
            ("--multimodal", share(self.multimodal_share), "a share from 0 to 1", self.multimodal_share),
            ("--prompt-logprobs-share", share(self.prompt_logprobs_share), "a share from 0 to 1", self.prompt_logprobs_share),
        ])
        span_s = self.requests / self.rate * 4  # (a bursty lull runs at a quarter of the rate)
        refuse_options([("--rate", span_s <= MAX_SPAN_S, f"a rate at which {self.requests} requests fit in the trace's "
                         f"64-bit microseconds (this one spreads them over some {span_s / 4 / 86400 / 365:.3g} years)",
                         self.rate)])


CONTEXT_RESERVE = 16  # tokens of the context a prompt leaves for its output
MAX_SPAN_S = 2**62 / 1e6  # arrival times are µs in 64 bits


def synth(spec: SynthSpec) -> tuple[TraceHeader, Iterator[dict[str, Any]]]:
    """The trace's header and its requests, drawn one at a time as they are written (a million
    requests held as objects took 0.9 GB)."""
    spec.check()
    header = TraceHeader(
        source={"format": "synth", "generator": "replay synth", "seed": spec.seed, "spec": spec.__dict__},
        time={"src_unit": "us", "src_origin": "synthetic", "tz_assumed": None, "clock": "synthetic",
              "quantum_ms": None, "sorted": True},
        import_counts={"rows_read": spec.requests, "rows_emitted": spec.requests, "quarantined": 0},
    )
    return header, _requests(spec)


def _requests(spec: SynthSpec) -> Iterator[dict[str, Any]]:
    rng = random.Random(spec.seed)
    t = 0.0
    burst_on = True
    for i in range(spec.requests):
        if spec.arrival == "bursty":
            if rng.random() < 0.05:
                burst_on = not burst_on
            rate = spec.rate * (4.0 if burst_on else 0.25)
        else:
            rate = spec.rate
        t += rng.expovariate(rate)
        n_in = min(spec.context_len - CONTEXT_RESERVE, max(1, int(rng.lognormvariate(math.log(spec.input_median), 0.8))))
        n_out = min(spec.context_len - n_in, max(1, int(rng.lognormvariate(math.log(spec.output_median), 0.7))))
        sampling: dict[str, Any] = {"temperature": 0.0}
        if rng.random() < spec.prompt_logprobs_share:
            sampling["prompt_logprobs"] = spec.prompt_logprobs
        mm = [{"type": "image", "count": 1, "width": 1024, "height": 768}] if rng.random() < spec.multimodal_share else None
        yield {"id": f"s{i}", "t_us": int(t * 1_000_000), "input_tokens": n_in, "output_tokens": n_out,
               "output_kind": "observed", "max_tokens": n_out, "prefix_blocks": None, "session_id": None,
               "sampling": sampling, "mm": mm, "status": "ok", "extra": {}}
