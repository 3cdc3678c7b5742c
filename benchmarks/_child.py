"""Run a snippet in a child process and report its wall time and peak anonymous RSS.

The RSS is sampled from /proc every 5 ms: ``ru_maxrss`` would include the parent's peak (it survives
exec) and ``VmHWM`` the page cache of memory-mapped inputs, neither of which is the tool's memory.
"""

from __future__ import annotations

import subprocess
import sys

_PRELUDE = """
import sys, threading, time
from pathlib import Path
peak = [0]
def watch():
    while True:
        with open('/proc/self/status') as fh:
            peak[0] = max([peak[0]] + [int(x.split()[1]) for x in fh if x.startswith('RssAnon')])
        time.sleep(0.005)
threading.Thread(target=watch, daemon=True).start()
"""


def run_measured(setup: str, call: str, *args: str) -> tuple[float, int]:
    """``setup`` (imports) then ``call`` timed in a fresh interpreter; returns (seconds, peak anon bytes)."""
    code = _PRELUDE + setup + "\nt = time.perf_counter()\n" + call + "\nprint(time.perf_counter() - t, peak[0])\n"
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    secs, kib = r.stdout.split()[-2:]
    return float(secs), int(kib) * 1024
