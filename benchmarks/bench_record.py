"""Log ingestion speed vs `grep -c 'KV cache usage'` on the same file, and peak RSS.

Builds a vLLM log of --gib GiB from real line shapes (stats, request, startup, OOM lines) and prints
the ratio recorder-time / grep-time from one run, and the recorder's peak anonymous RSS (sampled;
the page cache of the log is not the recorder's memory). Usage: python benchmarks/bench_record.py [--gib 1.0]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINES = [
    "(APIServer pid=3646) INFO 05-19 10:13:{s:02d} [loggers.py:271] Engine 000: Avg prompt throughput: 12068.8 tokens/s, Avg generation throughput: 734.9 tokens/s, Running: 18 reqs, Waiting: 33 reqs, GPU KV cache usage: 87.7%, Prefix cache hit rate: 0.0%\n",
    "(APIServer pid=3646) INFO 05-19 10:13:{s:02d} [async_llm.py:587] Added request cmpl-b57e07640a1646f08fbf1844f1d76ee5-0.\n",
    'INFO:     127.0.0.1:59542 - "POST /v1/completions HTTP/1.1" 200 OK\n',
    "(EngineCore_DP0 pid=1133552) INFO 05-19 10:13:{s:02d} [gpu_worker.py:298] Available KV cache memory: 6.51 GiB\n",
    "ERROR 05-19 10:13:{s:02d} [core.py:330] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 7.75 GiB of which 1.17 GiB is free. Including non-PyTorch memory, this process has 5.02 GiB memory in use. Of the allocated memory 4.81 GiB is allocated by PyTorch, and 18.97 MiB is reserved by PyTorch but unallocated.\n",
]


_CHILD = """
import sys, threading, time
from pathlib import Path
peak = [0]
def watch():
    while True:
        with open('/proc/self/status') as fh:
            peak[0] = max([peak[0]] + [int(x.split()[1]) for x in fh if x.startswith('RssAnon')])
        time.sleep(0.005)
threading.Thread(target=watch, daemon=True).start()
from replay.record.recorder import record, RecordOptions
t = time.perf_counter()
record([Path(sys.argv[1])], Path(sys.argv[2]), RecordOptions(year=2026))
print(time.perf_counter() - t, peak[0])
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        log = Path(td) / "big.log"
        target = int(a.gib * 2**30)
        block = "".join(LINES[i % 4 if i % 1000 else 4].format(s=i % 60) for i in range(2000))
        with log.open("w") as fh:
            written = 0
            while written < target:
                fh.write(block)
                written += len(block)
        t = time.perf_counter()
        g = subprocess.run(["grep", "-c", "KV cache usage", str(log)], capture_output=True, text=True)
        grep_s = time.perf_counter() - t
        r = subprocess.run([sys.executable, "-c", _CHILD, str(log), str(Path(td) / "b")], capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-2000:])
            sys.exit(1)
        secs, rss = r.stdout.split()
        print(f"log {written / 2**30:.2f} GiB, {g.stdout.strip()} stats lines: grep {grep_s:.2f} s, recorder {float(secs):.2f} s, "
              f"ratio x{float(secs) / grep_s:.1f} (target <= 10), peak anon RSS {int(rss) / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
