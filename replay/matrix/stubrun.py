"""The runner seam against the stub OpenAI server (``replay.drive.stub``) instead of a vLLM engine: the
trace's requests are sent at their times by the real driver and written into a replay bundle as
``replay run`` writes them, in a fraction of a second per run. It measures the matrix's machinery
(scheduling, bundles, manifest, verdicts, report) and stands in for the engine in tests; its bundles
say so (``extra.engine_stub``), and hold no memory series (the stub uses none worth measuring).

``oom_versions``: the versions whose run ends as an emulated OOM (the capacity guard) after its last
request, exit 10, as a real run that reproduces an incident ends.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from replay.bundle import BundleMeta, BundleWriter, bundle_written
from replay.drive.driver import Driver, request_body
from replay.drive.runner import RunOptions, RunResult, trace_link, user_engine_args
from replay.drive.stub import StubServer
from replay.errors import EXIT_OOM_REPRODUCED, ReplayError
from replay.trace.format import read_trace
from replay.trace.prompts import synth_prompt_ids


@dataclass(frozen=True)
class StubRun:
    oom_versions: tuple[str, ...] = ()

    def __call__(self, trace_path: Path, opts: RunOptions, console: Console | None = None) -> RunResult:
        with bundle_written(opts.out) as into:
            res = self._run(trace_path, opts, into)
        res.bundle = opts.out
        return res

    def _run(self, trace_path: Path, opts: RunOptions, out: Path) -> RunResult:
        opts.check()
        header, reqs = read_trace(trace_path)
        if opts.window:
            a, b = opts.window
            reqs = [dict(r, t_us=r["t_us"] - a) for r in reqs if a <= r["t_us"] < b]
        if not reqs:
            raise ReplayError(f"{trace_path}: no requests to replay (check --window)", 2)
        items = sorted(((int(r["t_us"]), str(r["id"]), request_body(
            r, synth_prompt_ids(min(int(r.get("input_tokens") or 1), 64), opts.seed, str(r["id"])),
            output_policy=opts.output_policy)) for r in reqs), key=lambda x: x[0])
        t_wall0 = time.time()
        meta = BundleMeta(kind="replay", vllm_version=opts.vllm, engine=None, engine_args=user_engine_args(opts),
                          model="stub", gpus=[],
                          inputs=[{"path": str(trace_path), "kind": "trace", "requests": len(reqs)}],
                          extra={"device": "stub", "engine_stub": True, "trace": trace_link(header),
                                 "speed": opts.speed, "seed": opts.seed, "window_us": opts.window,
                                 "production": header.production or {},
                                 "notes": ["the stub OpenAI server stood in for the engine (replay.drive.stub): "
                                           "no memory was measured"]})
        meta.t0_utc = datetime.fromtimestamp(t_wall0, tz=timezone.utc).isoformat().replace("+00:00", "Z")
        writer = BundleWriter(out, meta)
        writer.event({"t_us": 0, "kind": "engine_ready", "source": "replay", "device": "stub"})

        async def go() -> Driver:
            server = await asyncio.start_server(StubServer().handle, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            driver = Driver(f"http://127.0.0.1:{port}", "stub", speed=opts.speed, concurrency=opts.concurrency)
            async with server:
                await driver.run(items)
            return driver

        offset_us = int((time.time() - t_wall0) * 1e6)
        driver = asyncio.run(go())
        for sched, rid, body in items:
            oc = driver.outcomes.get(rid)
            writer.request({
                "id": rid, "arrival_us": offset_us + int(sched / opts.speed),
                "sent_us": offset_us + oc.sent_us if oc and oc.sent_us is not None else None,
                "first_token_us": offset_us + oc.first_token_us if oc and oc.first_token_us is not None else None,
                "finish_us": offset_us + oc.finish_us if oc and oc.finish_us is not None else None,
                "input_tokens": len(body["prompt"]) if isinstance(body["prompt"], list) else None,
                "output_tokens": oc.output_tokens if oc else None, "max_tokens": body.get("max_tokens"),
                "status": oc.status if oc else "aborted", "error": oc.error if oc else "not sent", "source": "replay"})
        end_us = int((time.time() - t_wall0) * 1e6)
        oom = opts.vllm in self.oom_versions
        if oom:
            writer.event({"t_us": end_us, "kind": "emulated_oom", "source": "replay",
                          "label": "EMULATED OOM (stub engine), not a real device OOM"})
        outcome = "capacity_guard" if oom else "completed"
        statuses = [o.status for o in driver.outcomes.values()]
        meta.extra["outcome"] = outcome
        writer.close()
        return RunResult(out, EXIT_OOM_REPRODUCED if oom else 0, outcome, driver.stats.sent, statuses.count("ok"),
                         statuses.count("error"), len(items) - len(statuses), None, None, 0.0, 0.0, 0.0, None)


stub_run = StubRun()
