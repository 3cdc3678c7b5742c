"""Regenerate the bundled example incident traces (deterministic; run: python traces/make_example.py).

The incident: steady chat traffic, then a stretch of long prompts asking for prompt_logprobs,
which vLLM does not budget (vLLM issues #5907, #8184). On the CPU engine with the tiny model at
vocabulary 131072 this drives resident memory far above what vLLM sized at startup.
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent


def make(name: str, duration_s: float, gap_s: float, spikes: list[tuple[float, int]], seed: int) -> None:
    rng = random.Random(seed)
    reqs = []
    t = 0.0
    i = 0
    while t < duration_s:
        reqs.append({"id": f"chat-{i}", "t_us": int(t * 1e6), "input_tokens": rng.randint(200, 600),
                     "output_tokens": rng.randint(16, 32), "output_kind": "observed", "max_tokens": 64,
                     "sampling": {"temperature": 0.0}, "status": "ok"})
        t += gap_s
        i += 1
    for j, (at, n_in) in enumerate(spikes):
        reqs.append({"id": f"logprobs-{j}", "t_us": int(at * 1e6), "input_tokens": n_in, "output_tokens": 4,
                     "output_kind": "observed", "max_tokens": 4,
                     "sampling": {"temperature": 0.0, "prompt_logprobs": 20}, "status": "ok",
                     "extra": {"client": "eval-batch"}})
    reqs.sort(key=lambda r: (r["t_us"], r["id"]))
    header = {"kind": "header", "schema": "replay-trace/1",
              "source": {"format": "example", "generator": "traces/make_example.py", "seed": seed,
                         "description": "chat traffic plus a stretch of long prompt_logprobs requests"},
              "time": {"src_unit": "us", "src_origin": "synthetic", "tz_assumed": None, "clock": "synthetic",
                       "quantum_ms": None, "sorted": True},
              "tokens": {"tokenizer": "replay tiny-llama"}, "prefix": {"block_size": None},
              "import": {"rows_read": len(reqs), "rows_emitted": len(reqs), "quarantined": 0},
              "production": {"gpu_name": "NVIDIA H100 80GB HBM3", "gpu_total_bytes": 85520809984,
                             "note": "the production GPU of the incident; the CPU replay reproduces the signature"}}
    with (HERE / name).open("w") as fh:
        fh.write(json.dumps(header) + "\n")
        for r in reqs:
            fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    make("example_incident.jsonl", 30.0, 0.75, [(12.0, 4000), (13.0, 4000), (15.0, 6000)], seed=1)
    make("example_incident_short.jsonl", 10.0, 0.8, [(3.0, 2500), (4.0, 2500)], seed=2)
