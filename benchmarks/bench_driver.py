"""Driver fidelity against a local stub OpenAI server (replay.drive.stub, its own process).

For each rate (default 500 and 2000 req/s, evenly spaced, open loop) prints, from one run, for the
replay driver and for a naive driver that does one ``asyncio.sleep`` per request (the way most
benchmark scripts schedule; once with the same raw client as replay, once with httpx):
p50/p99/max |send - scheduled| at dispatch, p99 as seen by the server
(arrival time on the shared monotonic clock), the achieved send rate, and whether it fell behind
(median lateness of the last tenth vs the first). Targets: p99 < 2 ms at 500 req/s; 2000 req/s
sustained. Usage: python benchmarks/bench_driver.py [--rates 500 2000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from replay.drive.driver import Driver
from replay.drive.http import RawHttpClient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_up(url: str) -> None:
    for _ in range(200):
        try:
            if httpx.get(url + "/health", timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise SystemExit("stub server did not start")


def _items(rate: float, seconds: float) -> list[tuple[int, str, dict[str, Any]]]:
    n = int(rate * seconds)
    step = 1_000_000 / rate
    return [(int(i * step), f"r{i}", {"prompt": [1, 2, 3], "max_tokens": 2}) for i in range(n)]


async def _naive(url: str, items: list[tuple[int, str, dict[str, Any]]], t0: float, client_kind: str) -> dict[str, int]:
    """One task per request, each sleeping until its time: the common benchmark-script schedule."""
    sent: dict[str, int] = {}
    if client_kind == "httpx":
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=512)
        hx = httpx.AsyncClient(base_url=url, timeout=60, limits=limits)

        async def post(body: dict[str, Any]) -> None:
            async with hx.stream("POST", "/v1/completions", json={**body, "model": "stub", "stream": True}) as r:
                async for _ in r.aiter_lines():
                    pass
    else:
        raw = RawHttpClient(url, 60)

        async def post(body: dict[str, Any]) -> None:
            await raw.post("/v1/completions", json.dumps({**body, "model": "stub", "stream": True}).encode(), lambda _: None)

    async def one(sched: int, rid: str, body: dict[str, Any]) -> None:
        await asyncio.sleep(max(0.0, t0 + sched / 1e6 - time.perf_counter()))
        sent[rid] = int((time.perf_counter() - t0) * 1e6)
        await post(body)

    await asyncio.gather(*(one(*it) for it in items))
    if client_kind == "httpx":
        await hx.aclose()
    else:
        await raw.aclose()
    return sent


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _report(name: str, rate: float, items: list[tuple[int, str, dict[str, Any]]], sent: dict[str, int],
            arrivals_us: list[int], t0: float) -> None:
    sched = {rid: s for s, rid, _ in items}
    late = [abs(sent[r] - sched[r]) / 1000 for r in sched if r in sent]
    order = [sent[r] - sched[r] for _, r, _ in items if r in sent]
    tenth = max(1, len(order) // 10)
    first, last = statistics.median(order[:tenth]) / 1000, statistics.median(order[-tenth:]) / 1000
    t0_mono_us = int(t0 * 1e6)
    span = (max(sent.values()) - min(sent.values())) / 1e6 if sent else float("nan")
    # server view: k-th arrival vs k-th scheduled time (arrivals are not labelled with ids)
    srv = [abs(a - t0_mono_us - s) / 1000 for a, (s, _, _) in zip(sorted(arrivals_us), items)]
    print(f"  {name:<11} sent {len(sent)}/{len(items)}  |lateness| p50 {_pct(late, .5):.2f} ms  p99 {_pct(late, .99):.2f} ms  "
          f"max {max(late):.1f} ms  server-side p99 {_pct(srv, .99):.2f} ms  rate {len(sent) / span:.0f}/s "
          f"(target {rate:.0f})  median lateness first/last tenth {first:.2f}/{last:.2f} ms"
          f"{'  FELL BEHIND' if last > first + 5 else ''}")


def run_one(kind: str, rate: float, seconds: float, workdir: Path) -> None:
    port = _free_port()
    arrivals = workdir / f"arrivals-{kind}-{rate:.0f}.txt"
    stub = subprocess.Popen([sys.executable, "-m", "replay.drive.stub", "--port", str(port), "--arrivals", str(arrivals)],
                            stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_up(url)
        items = _items(rate, seconds)
        t0 = time.perf_counter() + 0.2
        if kind == "replay":
            d = Driver(url, "stub")
            outcomes = asyncio.run(d.run(items, t0=t0))
            sent = {rid: oc.sent_us for rid, oc in outcomes.items() if oc.sent_us is not None}
            bad = sum(oc.status != "ok" for oc in outcomes.values())
            if bad:
                print(f"  ({bad} requests not ok)")
        else:
            sent = asyncio.run(_naive(url, items, t0, kind.split("-", 1)[1]))
    finally:
        stub.terminate()
        stub.wait(10)
    got = [int(x) for x in arrivals.read_text().split()] if arrivals.exists() else []
    _report(kind, rate, items, sent, got, t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", type=float, nargs="*", default=[500, 2000])
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        for rate in a.rates:
            print(f"open loop at {rate:.0f} req/s for {a.seconds:.0f} s against the stub server:")
            for kind in ("replay", "naive-raw", "naive-httpx"):
                run_one(kind, rate, a.seconds, Path(td))


if __name__ == "__main__":
    main()
