"""Downtime: from each crash (CUDA OOM, engine death, OOMKilled, a SIGKILL) to the engine's next start; and what
vLLM said of its scheduler when its engine failed.

The impact section of a postmortem needs the outage in numbers. The event lane has what it takes:
deaths from the vLLM log and Kubernetes, starts from the engine's own startup lines. A crash with no
later start in the evidence is an outage that lasted at least to the end of the evidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DOWN_KINDS = ("oom", "engine_death", "emulated_oom", "host_oom_killed", "container_killed")
UP_KINDS = ("engine_start",)


@dataclass
class Outage:
    down_us: int
    up_us: int | None  # None: not back within the evidence
    cause: str
    source: str | None
    lower_bound: bool  # True when up_us is unknown and the length counts to the end of the evidence

    def seconds(self, end_us: int) -> float:
        return ((self.up_us if self.up_us is not None else end_us) - self.down_us) / 1e6


def outages(events: list[dict[str, Any]]) -> list[Outage]:
    """Outages in time order; several death lines before one restart are one outage."""
    timed = sorted((e for e in events if e.get("t_us") is not None), key=lambda e: e["t_us"])
    out: list[Outage] = []
    open_: Outage | None = None
    for e in timed:
        k = e.get("kind")
        if k in DOWN_KINDS and open_ is None:
            open_ = Outage(int(e["t_us"]), None, str(k), e.get("source"), True)
        elif k in UP_KINDS and open_ is not None and e["t_us"] > open_.down_us:
            open_.up_us, open_.lower_bound = int(e["t_us"]), False
            out.append(open_)
            open_ = None
    if open_ is not None:
        out.append(open_)
    return out


START_MARKERS_S = 120  # one engine start logs several markers within seconds ('vLLM API server version',
# 'non-default args', 'Initializing a V1 LLM engine'): those this close, with no crash between, are one
STOP_KINDS = ("engine_shutdown",)  # an orderly stop (the replay's own, at its end): what follows is a restart


@dataclass
class Start:
    """One start of the engine: the first of its markers, and the markers that belong to it. A restart is
    a start after a crash (``DOWN_KINDS``) or a stop (``STOP_KINDS``) in the evidence; a start the
    evidence shows nothing before is a start, whatever ran before the evidence begins."""

    t_us: int
    restart: bool
    after: str | None  # the crash or stop it follows ('engine_death', 'engine_shutdown'), for a restart
    markers: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return "restart" if self.restart else "start"


def starts(events: list[dict[str, Any]]) -> list[Start]:
    """The engine's timed starts, in time order: its start markers, those of one start as one (within
    START_MARKERS_S of the one before, no crash or stop between), each named a start or a restart."""
    timed = sorted((e for e in events if e.get("t_us") is not None
                    and e.get("kind") in (*UP_KINDS, *DOWN_KINDS, *STOP_KINDS)), key=lambda e: e["t_us"])
    out: list[Start] = []
    last_start, ended_by = None, None
    for e in timed:
        if e.get("kind") not in UP_KINDS:
            ended_by = str(e.get("kind"))
            continue
        if last_start is None or ended_by is not None or e["t_us"] - last_start > START_MARKERS_S * 1_000_000:
            out.append(Start(int(e["t_us"]), ended_by is not None, ended_by, [e]))
        else:
            out[-1].markers.append(e)
        last_start, ended_by = e["t_us"], None
    return out


def engine_starts(events: list[dict[str, Any]]) -> int:
    """How many times the engine started: its start markers, those of one start counted once (each
    excerpt holds some of them: a start pasted from its 'vLLM API server version' line alone had
    counted none). A marker without a time counts only where it opens an engine ('Initializing …')."""
    return len(starts(events)) + sum(1 for e in events if e.get("t_us") is None and e.get("kind") in UP_KINDS
                                     and str(e.get("marker", "")).startswith("Initializing"))


def crash_line(events: list[dict[str, Any]]) -> str | None:
    """What vLLM reported of its scheduler and batch when its engine last failed (V1's dump), in one
    line; None where the evidence holds no such dump."""
    def last(kind: str) -> dict[str, Any] | None:
        return next((e for e in reversed(events) if e.get("kind") == kind), None)
    batch, sched = last("batch_at_crash"), last("scheduler_at_crash")
    parts = []
    if batch is not None:
        parts.append(f"a batch of {batch.get('scheduled_tokens')} tokens from {batch.get('requests')} requests "
                     f"({batch.get('source')})")
    if sched is not None:
        kv = sched.get("kv_usage_pct")
        parts.append(f"{sched.get('running')} running, {sched.get('waiting')} waiting, KV cache "
                     f"{'?' if kv is None else f'{kv:.1f}'}% full ({sched.get('source')})")
    return "; ".join(parts) if parts else None
