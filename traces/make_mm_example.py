"""Regenerate the bundled multimodal example incident (deterministic; run: .venv/bin/python traces/make_mm_example.py).

The incident: an image-chat client of Alibaba's Model Studio, its arrivals, prompt text lengths and
output lengths drawn from its real characterisation (ServeGen's data/multimodal/mm-image chunk 0,
bundled in tests/data/servegen), one image a request at two resolutions: its usual 448 x 448 photos
(256 image tokens), then a stretch of 1792 x 1792 scans (4,096 each). ServeGen records image tokens,
not sizes (some 1,200 a request for this client: kept in each request's extra); the two sizes are
the incident's. vLLM sizes its KV pool, not the vision encoder's activations nor the encoder cache; on
the CPU engine with the tiny Qwen2-VL (``--vllm 0.32+vision``) the scans drive resident memory past
what vLLM accounted for.
"""

from __future__ import annotations

import json
from pathlib import Path

from replay.trace.servegen import ServeGenSpec, synth_servegen

HERE = Path(__file__).parent
CLIENT = HERE.parent / "tests" / "data" / "servegen" / "multimodal-mm-image" / "chunk-0-trace.csv"
LOW_RES = (448, 448)  # 256 image tokens on Qwen2-VL's grid
HIGH_RES = (1792, 1792)  # 4,096
HIGH_S = (8.0, 13.5)  # the stretch of high-resolution uploads, seconds of the trace
MAX_TOKENS = 8  # (outputs cut short: the incident is in the prefill, and the CPU engine decodes slowly)


def make(name: str, duration_s: float, seed: int) -> None:
    header, reqs = synth_servegen(ServeGenSpec([CLIENT], duration_s=600.0, seed=seed))
    out = []
    for r in reqs:
        t_s = r["t_us"] / 1e6
        if t_s >= duration_s:
            break
        n_out = min(MAX_TOKENS, int(r["output_tokens"] or MAX_TOKENS))
        r.update(output_tokens=n_out, max_tokens=n_out)
        r.pop("src_ts", None)
        scan = HIGH_S[0] <= t_s < HIGH_S[1]  # an upload of a scan, else the client's usual photo
        w, h = HIGH_RES if scan else LOW_RES
        drawn = sum(int(m.get("tokens") or 0) for m in r.get("mm") or [])  # (ServeGen's own, kept in extra)
        r.update(id=f"scan-{r['id']}" if scan else f"photo-{r['id']}", input_tokens=int(r["extra"]["text_tokens"]),
                 mm=[{"type": "image", "count": 1, "width": w, "height": h}])
        r["extra"] = {**r["extra"], "client": "scan-upload" if scan else "photo-chat", "servegen_image_tokens": drawn}
        out.append(r)
    head = header.to_json()
    head["source"] = {**head["source"], "generator": "traces/make_mm_example.py",
                      "description": f"a ServeGen image-chat client's {LOW_RES[0]}x{LOW_RES[1]} photos; from {HIGH_S[0]:g} s "
                                     f"to {HIGH_S[1]:g} s its images are {HIGH_RES[0]}x{HIGH_RES[1]} scans"}
    head["source"]["clients"] = [{**c, "trace": str(CLIENT.relative_to(HERE.parent)),
                                  "dataset": str(CLIENT.with_name("chunk-0-dataset.json").relative_to(HERE.parent))}
                                 for c in head["source"].get("clients", [])]
    head["import"] = {"rows_read": len(out), "rows_emitted": len(out), "quarantined": 0}
    head["engine_args"] = {"limit_mm_per_prompt": {"image": 1}}
    head["production"] = {"model": "Qwen/Qwen2-VL-7B-Instruct", "gpu_name": "NVIDIA H100 80GB HBM3",
                          "gpu_total_bytes": 85520809984,
                          "note": "the production GPU of the incident; the CPU replay reproduces the signature"}
    with (HERE / name).open("w") as fh:
        fh.write(json.dumps(head) + "\n")
        for r in out:
            fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    make("example_mm_incident.jsonl", 30.0, seed=1)
