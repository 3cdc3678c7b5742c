"""Analysis of one bundle: memory model, divergence, attribution, OOM classification -> findings.

Findings are data (title, detail, confidence, evidence with times, values and source file:line),
never bare verdicts. A bundle where actual memory stays with vLLM's accounting yields none.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from replay.analysis.attribution import Attribution, attribute, classify_oom
from replay.analysis.divergence import Divergence, detect
from replay.analysis.memory import (
    Accounting,
    accounting,
    actual_frame,
    gap_frame,
    kv_in_use,
    kv_usage_at,
    layers_frame,
    machines_frame,
    unchosen,
)
from replay.analysis.multimodal import image_growth
from replay.analysis.outages import DOWN_KINDS, Outage
from replay.analysis.replicas import (
    SeriesTie,
    export_ties,
    gpu_tie_sentence,
    gpu_ties,
    replica_engine_starts,
    replica_names,
    replica_of,
    replica_outages,
    replica_series,
    replicas,
    series_replicas,
    tie_sentence,
)
from replay.bundle import Bundle
from replay.units import GiB, MiB

# the crashes that are an OOM or may be one (an engine death follows one, or has a cause the evidence may
# not show); a container killed with SIGKILL is a crash of a cause unstated, not one of these
OOM_KINDS = tuple(k for k in DOWN_KINDS if k != "container_killed")
# the events that state an out-of-memory (torch's or vLLM's OOM line, the replay's capacity guard or the
# probe's OOM snapshot, a host OOM kill): an engine death alone is a crash of a cause unstated, not an OOM
OOM_STATED = ("oom", "emulated_oom", "host_oom_killed", "torch_oom")
# what states why an engine died, where the evidence holds it near the death
CAUSE_KINDS = (*OOM_STATED, "cuda_error", "collective_timeout", "gpu_xid", "vllm_memory_error", "container_killed")
CAUSE_BEFORE_S, CAUSE_AFTER_S = 300, 60  # how far from a death a cause is taken as its own


@dataclass
class Finding:
    id: str
    title: str
    detail: str
    confidence: str  # high | medium | low
    evidence: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Unjudged:
    """What this evidence cannot judge, why, and what evidence would settle it: absence of evidence is
    not evidence of absence, and the report says so rather than a finding of nothing."""

    id: str
    what: str
    why: str
    settle: str
    evidence: list[dict[str, Any]] = field(default_factory=list)


# what settles whether actual memory left vLLM's accounting: a series of the device's memory
MEMORY_SERIES = ("a series of the GPU's memory over the incident: nvidia-smi "
                 "(`nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv -l 1`), DCGM "
                 "(dcgm-exporter's DCGM_FI_DEV_FB_USED, from Prometheus), or NVML (`replay record --live URL --nvml`); "
                 "on a CPU host, the engine's resident memory")


@dataclass
class Analysis:
    bundle: Bundle
    acc: Accounting
    actual_source: str | None
    gap: pl.DataFrame
    kv: pl.DataFrame
    div: Divergence
    attributions: list[Attribution]
    ooms: list[dict[str, Any]]
    findings: list[Finding]
    layers: pl.DataFrame = field(default_factory=pl.DataFrame)  # measured actual layers (memory.layers_frame)
    outages: list[Outage] = field(default_factory=list)
    machines: pl.DataFrame = field(default_factory=pl.DataFrame)  # device memory of several machines, none
    # chosen (memory.machines_frame), and how many such series there were
    machines_total: int = 0
    unjudged: list[Unjudged] = field(default_factory=list)  # what the evidence cannot judge (``unjudged``)
    series_ties: list[SeriesTie] = field(default_factory=list)  # each export series' replica (of a fleet's bundle)

    @functools.cached_property
    def end_us(self) -> int:
        """The last time the evidence knows of (its last event or sample): asked once an outage, a query
        of every sample each time, so kept once known (a fleet's day: 19 ms a time)."""
        ts = [e["t_us"] for e in self.bundle.events if e.get("t_us") is not None]
        last = self.bundle.scan_samples().select(pl.col("t_us").max()).collect().item()
        if last is not None:
            ts.append(int(last))
        return max(ts) if ts else 0

    @property
    def oom_us(self) -> int | None:
        """The first out-of-memory the evidence states (``OOM_STATED``); an engine death alone is none."""
        ts = [e["t_us"] for e in self.bundle.events if e.get("kind") in OOM_STATED and e.get("t_us") is not None]
        return min(ts) if ts else None

    @property
    def memory_judged(self) -> bool:
        """Whether the evidence could show a divergence: actual memory measured, and vLLM's accounting known."""
        return self.actual_source is not None and self.acc.accounted_bytes is not None

    @property
    def first_crash(self) -> dict[str, Any] | None:
        """The first timed event that took the engine down (``outages.DOWN_KINDS``: the OOMs, and a SIGKILL)."""
        return min((e for e in self.bundle.events if e.get("kind") in DOWN_KINDS and e.get("t_us") is not None),
                   key=lambda e: e["t_us"], default=None)

    def summary(self) -> dict[str, Any]:
        g = self.gap
        peak = float(g["actual_bytes"].max()) if g.height else None  # type: ignore[arg-type]

        def s(us: int | None) -> float | None:
            return None if us is None else round(us / 1e6, 3)

        def gb(x: float | None) -> float | None:
            return None if x is None else round(x / GiB, 3)
        return {
            "kind": self.bundle.meta.kind, "actual_source": self.actual_source,
            "accounted_basis": self.acc.basis, "accounted_estimated": self.acc.estimated,
            "accounted_gib": gb(self.acc.accounted_bytes), "budget_gib": gb(self.acc.budget_bytes),
            "total_gib": gb(self.acc.total_bytes), "kv_pool_gib": gb(self.acc.kv_pool_bytes),
            "parts_gib": {k: gb(v) for k, v in self.acc.parts.items()},
            "peak_actual_gib": gb(peak), "machine_series": self.machines_total,  # (device memory of several
            # machines or MIG instances, none chosen: why the peak is unknown; what they are, how to choose)
            **dict(zip(("machine_kind", "machine_choice"),
                       unchosen(list(self.machines["series"].unique(maintain_order=True)) if self.machines_total else []),
                       strict=True)),
            "max_gap_gib": gb(self.div.max_gap_bytes),
            "baseline_gap_gib": gb(self.div.baseline_bytes), "threshold_gib": gb(self.div.threshold_bytes),
            "onset_s": s(self.div.onset_us), "first_crossing_s": s(self.div.first_crossing_us),
            "oom_s": s(self.oom_us), "crash": crash_summary(self.first_crash, self.bundle.events),
            "onset_to_oom_s": s(self.oom_us - self.div.onset_us) if self.oom_us is not None and self.div.onset_us is not None else None,
            "episodes_s": [[s(a), s(b)] for a, b in self.div.episodes],
            "attribution": [{"feature": a.feature, "score": a.score, "near_mean": a.near_mean,
                             "rest_mean": a.rest_mean, "requests": a.near_ids[:20], "why": a.why}
                            for a in self.attributions],
            "findings": [f.__dict__ for f in self.findings],
            "unjudged": [u.__dict__ for u in self.unjudged],
            "engine_starts": replica_engine_starts(self.bundle),
            "downtime_s": round(sum(o.seconds(self.end_us) for o in self.outages), 3) if self.outages else None,
            "outages": [{"down_s": s(o.down_us), "up_s": s(o.up_us), "cause": o.cause, "source": o.source,
                         "seconds": round(o.seconds(self.end_us), 3), "at_least": o.lower_bound} for o in self.outages],
        }


_CRASH_WHAT = {"oom": "a CUDA OOM", "engine_death": "the engine died", "emulated_oom": "an emulated OOM (capacity guard)",
               "host_oom_killed": "the container was killed for host memory", "container_killed": "the container was killed (SIGKILL)"}


def cause_of(death: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The event that states why the engine went down at ``death``: ``death`` itself where it states it (an
    OOM, a kill), else an event of ``CAUSE_KINDS`` from CAUSE_BEFORE_S before it to CAUSE_AFTER_S after
    it (the OOM's traceback is logged before the death's line); None: a crash of a cause unstated."""
    if death.get("kind") != "engine_death":
        return death
    t = death.get("t_us")
    near = [e for e in events if e.get("kind") in CAUSE_KINDS and e.get("t_us") is not None and t is not None
            and -CAUSE_BEFORE_S * 1_000_000 <= e["t_us"] - t <= CAUSE_AFTER_S * 1_000_000]
    return min(near, key=lambda e: abs(e["t_us"] - t), default=None)


def crash_summary(e: dict[str, Any] | None, events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first crash in words: when, what, where it is stated, and its cause where the evidence states one."""
    if e is None:
        return None
    cause = cause_of(e, events)
    return {"s": None if e.get("t_us") is None else round(e["t_us"] / 1e6, 3), "t_us": e.get("t_us"),
            "kind": e.get("kind"), "what": _CRASH_WHAT.get(str(e.get("kind")), str(e.get("kind"))),
            "source": e.get("source"), "cause_stated": cause is not None,
            "cause": None if cause is None else str(cause.get("kind")),
            "oom": cause is not None and cause.get("kind") in OOM_STATED}


def unjudged(a: Analysis) -> list[Unjudged]:
    """What the evidence cannot judge: whether actual memory left vLLM's accounting (no memory measured, or
    no accounting to hold it against), and why an engine died where nothing near its death says why."""
    out: list[Unjudged] = []
    ev = a.bundle.events
    if a.actual_source is None and not a.machines_total:  # (several machines, none chosen: a finding says how)
        out.append(Unjudged(
            "memory:unmeasured", "whether actual memory left vLLM's accounting, and how high it went",
            "the evidence holds no measurement of actual memory (no nvidia-smi, DCGM, NVML or process series): "
            "nothing shows that memory stayed within vLLM's accounting, nor that it did not", MEMORY_SERIES))
    elif a.actual_source is not None and a.acc.accounted_bytes is None:
        out.append(Unjudged(
            "memory:unaccounted", "the gap between actual memory and vLLM's accounting, and where it began",
            f"actual memory is measured ({a.actual_source}), but not what vLLM accounted for: its start-up lines "
            "are not in the evidence", "the engine's log from its start (its memory profiling and KV cache lines: "
            "'Memory profiling takes …', 'Available KV cache memory …', 'GPU KV cache size …'), or the "
            "gpu_memory_utilization it ran with and the GPU's total memory"))
    deaths = [e for e in ev if e.get("kind") == "engine_death" and cause_of(e, ev) is None]
    if deaths:
        first = deaths[0]
        more = f", and {len(deaths) - 1} more death(s) alike" if len(deaths) > 1 else ""
        out.append(Unjudged(
            "crash:unstated", f"why the engine died ({first.get('source')}{more})",
            f"the evidence holds no OOM line, GPU error or kill within {CAUSE_BEFORE_S} s before it: a crash of a cause "
            "unstated, not an OOM" + ("; and no memory was measured to show how full the device was" if a.actual_source is None else ""),
            "the log's lines before the death, whole: torch's 'CUDA out of memory. Tried to allocate …' (an OOM, with "
            "its figures) or the traceback that ends in it; " + MEMORY_SERIES + " at that time; the node's kernel log "
            "(`dmesg -T`: an Xid, or the host's OOM killer); the pod's events and status (OOMKilled, a failed probe)",
            [{"t_us": e.get("t_us"), "source": e.get("source")} for e in deaths[:EVIDENCE_KEPT]]))
    return out


def _warmup_oom(e: dict[str, Any], max_num_seqs: Any) -> Finding:
    """An OOM in vLLM's start-up warm-up of its sampler (or pooler): the engine never served. The warm-up
    runs one step of ``max_num_seqs`` dummy requests after the KV cache is sized, so what was left beside
    the KV budget did not hold a full batch's logits (vocabulary x requests)."""
    what = str(e.get("warmup") or "sampler") + (f" ({e['warmup_task']})" if e.get("warmup_task") else "")
    n = e.get("dummy_requests")
    seqs = f"max_num_seqs {max_num_seqs}" if max_num_seqs is not None else "max_num_seqs"
    return Finding(
        "oom:warmup", f"CUDA OOM at start-up, warming up the {what}",
        f"vLLM ran out of memory warming up its {what} with {n if n is not None else 'its'} dummy requests, before "
        f"serving any: it warms up a full batch ({seqs}) after sizing the KV cache, and what was left beside that "
        "budget did not hold the batch's logits; lower max_num_seqs (the dummy requests) or gpu_memory_utilization "
        "(the KV budget), as vLLM advises", "high",
        [{"t_us": e.get("t_us"), "source": e.get("source"),
          **({"restated_at": e["restated_at"]} if e.get("restated_at") else {})}])


def _ray_oom(e: dict[str, Any]) -> Finding:
    """Ray's memory monitor killed a worker (a vLLM worker actor, under Ray's executor) for the node's RAM."""
    node = (f"the node's host memory was at {e['node_used']} of {e['node_total']} ({e['node_used_fraction']:.1%}), past "
            f"Ray's threshold of {e['threshold']:g}" if e.get("node_total") else "the node's host memory passed Ray's threshold")
    who = (f"; it killed {e['process']}" + (f" (pid {e['pid']}, {e['used']})" if e.get("pid") else "") if e.get("process")
           else f"; it killed {e['workers_killed']} worker(s)" if e.get("workers_killed") else "")
    return Finding(
        "oom:host:ray", "Host memory OOM: Ray's memory monitor killed a worker (not a CUDA OOM)",
        f"{node}{who}" + (f" on {e['node_ip']}" if e.get("node_ip") else "") + ": what vLLM holds in host memory (its CPU "
        "swap space for preempted requests, cpu_offload_gb, a CPU KV cache, weights loaded through RAM) or another "
        "process on the node; lower swap_space or cpu_offload_gb, give the node more memory, or raise "
        "RAY_memory_usage_threshold; more GPU memory does not prevent it", "high",
        [{"t_us": e.get("t_us"), "source": e.get("source")}])


def _said_kill(e: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The kill that says why the kubelet killed ``e``'s container (a Killing event's probe, an Evicted
    event's resource): ``e`` itself, or, for an exit 137 of unstated cause, a kill of the same container."""
    if e.get("kind") != "container_killed":
        return None
    same = [] if e.get("container") is None else [  # (two kills of unnamed containers are not one container's)
        x for x in events if x.get("kind") == "container_killed" and x.get("container") == e.get("container")]
    return next((x for x in (e, *same) if x.get("probe") or x.get("evicted")), None)


def kill_cause(e: dict[str, Any], events: list[dict[str, Any]]) -> tuple[str, str] | None:
    """What the kubelet says it killed a container for, where it says so (``_said_kill``): ('probe',
    'liveness' or 'startup'), or ('evicted', the node's resource it ran low on)."""
    x = _said_kill(e, events)
    return None if x is None else ("probe", str(x["probe"])) if x.get("probe") else ("evicted", str(x["evicted"]))


def _first_replica(b: Bundle) -> list[Finding]:
    """Which of several replicas (the bundle's vLLM logs) crashed first, and when the others followed."""
    r = replicas(b)
    said = r.sentence()
    if said is None or r.first is None:
        return []
    return [Finding("fleet:first_crash", f"Replica {r.first.replica} crashed first", said, "high",
                    [{"t_us": c.t_us, "what": c.replica, "source": c.source} for c in r.crashes])]


def _ties_of_exports(b: Bundle) -> list[SeriesTie]:
    """Which replica each metrics export's vLLM series is (an instance's), tied by the KV usage its log states."""
    names = replica_names(b.meta.inputs)
    return export_ties(b.scan_samples(), replica_series(b, names)) if len(names) >= 2 else []


def _export_tie_findings(ties: list[SeriesTie]) -> list[Finding]:
    """The finding of a fleet's export series tied to their replicas (``_ties_of_exports``); none without them."""
    if not ties:
        return []
    tied = sum(1 for t in ties if t.replica is not None)
    return [Finding("fleet:export_series", f"{tied} of {len(ties)} exported vLLM series tied to their replicas",
                    tie_sentence(ties), "high" if tied == len(ties) else "medium" if tied else "low",
                    [{"what": t.source, "replica": t.replica, "points": t.points} for t in ties])]


def _gpu_ties(b: Bundle) -> list[Finding]:
    """Which GPUs served which replica, tied by their memory taken at the replica's starts and given back at
    its crashes and stops (nothing in the evidence names a replica's GPUs), and which GPUs tie to none."""
    names = replica_names(b.meta.inputs)
    if len(names) < 2:
        return []
    ties = gpu_ties(b.scan_samples(), b.events, names)
    if not ties:
        return []
    tied = [t for t in ties if t.replica is not None]
    conf = "low" if not tied else "high" if len(tied) == len(ties) and all(t.confidence == "high" for t in tied) else "medium"
    return [Finding("fleet:gpu_replica", f"{len(tied)} of {len(ties)} GPUs tied to the replicas they served",
                    gpu_tie_sentence(ties), conf,
                    [{"what": t.series, "replica": t.replica, "confidence": t.confidence,
                      **({"t_us": t.moments[0].step_us, "source": t.moments[0].source} if t.replica and t.moments else {})}
                     for t in ties])]


def _kills(events: list[dict[str, Any]]) -> list[Finding]:
    """Containers killed with SIGKILL (exit 137) that Kubernetes did not call OOMKilled: of a cause
    unstated, unless the kubelet says it killed that container for a failed probe, or evicted its pod
    for the node's disk (or another resource that is not memory); then that is the cause, and a probe's
    failures say what the check saw ('connection refused': nothing listened yet)."""
    killed = [e for e in events if e.get("kind") == "container_killed"]
    failures = [e for e in events if e.get("kind") == "k8s_event" and e.get("reason") == "Unhealthy"
                and str(e.get("message") or "").startswith(("Liveness probe failed", "Startup probe failed"))]
    out = []
    for e in killed:
        ev = [{"t_us": e.get("t_us"), "source": e.get("source")}]
        x = _said_kill(e, killed)
        if x is None:  # (a crash, of a cause unstated: not an OOM)
            out.append(Finding("killed:sigkill", f"Container killed with SIGKILL (exit 137, reason {e.get('reason')})",
                               "not named OOMKilled: a host OOM kill outside the container's cgroup, or a kill after the "
                               "grace period (a failed liveness probe, an eviction, a delete); the node's kernel log "
                               "tells which", "medium", ev))
        elif x.get("evicted"):  # (the kubelet's eviction for the node's disk, inodes or pids)
            res = str(x["evicted"])
            out.append(Finding(
                f"killed:evicted:{res}", f"Pod evicted by the kubelet: the node ran low on {res} (not an OOM)",
                f"{x.get('text') or x.get('message') or 'evicted'}".strip().rstrip(".") + (
                    ": model weights downloaded into the container's own disk (the Hugging Face cache), logs and compile "
                    "caches count against the node's ephemeral storage; give the model a volume of its own (a PVC, or an "
                    "emptyDir with a sizeLimit and an ephemeral-storage request)" if res == "ephemeral-storage" else
                    ": the node ran short of something that is not memory; more GPU memory does not prevent it"),
                "high", ev))
        else:
            probe = str(x["probe"])
            said = next((str(f["message"]) for f in failures if str(f["message"]).lower().startswith(probe)), None)
            out.append(Finding(
                f"killed:{probe}_probe", f"Container killed by the kubelet: its {probe} probe failed (not an OOM)",
                f"the kubelet killed container {e.get('container')} with SIGKILL after its {probe} probe failed"
                + (f" ('{said[:200]}')" if said else "") + ": the engine did not answer its health check in time, still "
                "loading weights, compiling or capturing CUDA graphs at start-up, or stalled; more memory does not prevent "
                "it: give the engine time to start (a startupProbe, or a longer initialDelaySeconds or failureThreshold)",
                "high", ev))
    return out


def _image_growth(b: Bundle, gap: pl.DataFrame) -> list[Finding]:
    """Actual memory that rose image by image and stayed (vLLM's multimodal processor cache): a growth spread
    over the run, which the traffic near the onset does not show."""
    if gap.height == 0:
        return []
    g = image_growth(b.scan_requests(), gap.group_by("t_us").agg(pl.col("actual_bytes").sum()))
    if g is None or not g.follows_images:
        return []
    text = "no text-only requests" if math.isnan(g.step_r_text) else f"r = {g.step_r_text:.2f}"
    return [Finding(
        "multimodal:image_growth", "Actual memory grew image by image and stayed",
        f"{g.grew_bytes / GiB:.2f} GiB over {g.images} images, {g.bytes_per_image / MiB:.1f} MiB an image (R² {g.r2:.2f} "
        f"against the images sent so far); each 10 s step rose with the images sent in it (r = {g.step_r:.2f}), not "
        f"with the text-only requests ({text}). vLLM's multimodal processor cache keeps each distinct image's "
        "processed tensors, up to mm_processor_cache_gb (4 GiB by default), outside the KV budget: a replay with "
        "--set mm_processor_cache_gb=0 tells it apart", "medium",
        [{"what": "images sent", "value": g.images}, {"what": "bytes an image", "value_bytes": g.bytes_per_image}])]


def _vllm_memory_errors(events: list[dict[str, Any]]) -> list[Finding]:
    """vLLM's own memory errors (it refused to start, or to size its KV cache), each kind once."""
    out: dict[str, Finding] = {}
    for e in events:
        if e.get("kind") != "vllm_memory_error":
            continue
        ev = [{"t_us": e.get("t_us"), "source": e.get("source")}]
        if e.get("free_gib") is not None and e.get("total_gib") is not None and e.get("budget_gib") is not None:
            held = e["total_gib"] - e["free_gib"]
            fits = e["free_gib"] / e["total_gib"]
            out.setdefault("startup:gpu_in_use", Finding(
                "startup:gpu_in_use", "vLLM could not start: the GPU was already in use",
                f"{e['free_gib']:.2f} of {e['total_gib']:.2f} GiB free at start-up, less than the "
                f"{e['budget_gib']:.2f} GiB asked for (gpu_memory_utilization {e.get('gpu_memory_utilization')}): "
                f"{held:.2f} GiB was held by something else (another engine, an orphaned EngineCore of an earlier "
                f"start, another container; `nvidia-smi --query-compute-apps=pid,used_memory --format=csv` names "
                f"it); at most gpu_memory_utilization {fits:.2f} fits beside it", "high", ev))
        elif e.get("initial_free_gib") is not None:
            grew = e["current_free_gib"] - e["initial_free_gib"]
            out.setdefault("startup:profiling", Finding(
                "startup:profiling", "vLLM could not start: free GPU memory changed while it profiled",
                f"free memory was {e['initial_free_gib']:.2f} GiB before the profiling run and "
                f"{e['current_free_gib']:.2f} GiB after it ({grew:+.2f} GiB): another process on the GPU released "
                "memory while vLLM measured, so its KV budget would have been sized on memory it does not have; "
                "run vLLM alone on the GPU (or start it after the other process settles)", "high", ev))
        elif e.get("kv_needed_gib") is not None:  # V1 states what one request needs and what there is
            fits = e.get("estimated_max_model_len")
            out.setdefault("startup:max_model_len", Finding(
                "startup:max_model_len", "vLLM could not start: max_model_len exceeds what the KV cache holds",
                f"one request of max_model_len {e['max_model_len']} needs {e['kv_needed_gib']:.2f} GiB of KV cache; "
                f"{e['kv_available_gib']:.2f} GiB was left for it after weights, activations and CUDA graphs"
                + (f"; the longest that fits is {fits} tokens" if fits is not None else "")
                + f"; lower --max-model-len{f' to {fits}' if fits is not None else ''}, or raise gpu_memory_utilization",
                "high", ev))
        elif e.get("max_model_len") is not None:
            out.setdefault("startup:max_model_len", Finding(
                "startup:max_model_len", "vLLM could not start: max_model_len exceeds what the KV cache holds",
                f"max_model_len {e['max_model_len']} needs more KV cache than the budget holds "
                f"({e.get('kv_tokens')} tokens); lower --max-model-len or raise the KV budget", "high", ev))
        else:
            out.setdefault("startup:kv_cache", Finding(
                "startup:kv_cache", "vLLM's own memory error", str(e.get("error") or "")[:300], "high", ev))
    return list(out.values())


def _machines_unchosen(machines: pl.DataFrame, total: int) -> list[Finding]:
    """Device memory held only as series of several machines or hosts ('dcgm[Hostname=node-2] GPU 0',
    'nvidia-smi[node2.csv] GPU 0'), or of the MIG instances of a GPU ('dcgm[GPU_I_ID=3] GPU 0';
    ``machines_frame``'s): none is the bundle's, so no actual memory is known until one is chosen."""
    shown = list(dict.fromkeys(machines["series"]))
    what, option = unchosen(shown)
    mig = what == "MIG instances"
    return [Finding("evidence:mig" if mig else "evidence:machines", f"Device memory of several {'MIG instances' if mig else 'machines'}, none chosen",
                    f"the bundle holds device memory only as {total} series of {what if mig else 'separate machines or hosts'} "
                    f"({', '.join(shown[:4])}{', …' if total > 4 else ''}); record again with {option}"
                    + ("" if mig else ", or with that machine's GPU file first"), "high",
                    [{"source": t} for t in shown[:10]])]


def _shared_gpus(gpus: list[dict[str, Any]]) -> list[Finding]:
    """The bundle's GPUs that DCGM attributed to several pods at once (MPS, time-slicing): the device
    memory the evidence shows is every tenant's together, and what another tenant takes is memory vLLM's
    budget, fixed at its start, did not plan for."""
    out = []
    for g in gpus:
        pods = [str(x) for x in g.get("shared_by") or []]
        if len(pods) > 1:
            out.append(Finding(f"gpu:shared{g.get('index')}", f"GPU {g.get('index')} was shared by {len(pods)} pods",
                               f"DCGM attributed GPU {g.get('index')} to {len(pods)} pods at the same time ({', '.join(pods[:4])}"
                               f"{', …' if len(pods) > 4 else ''}): the device memory it reports is every tenant's together, "
                               "and what another tenant takes is memory that vLLM's budget, fixed at its start, did not plan for",
                               "medium", [{"source": "bundle.json gpus", "what": p} for p in pods[:10]]))
    return out


EVIDENCE_KEPT = 5  # of a finding made many times over, the first occurrences kept as its evidence (and the last)


def merge_alike(findings: list[Finding]) -> list[Finding]:
    """Findings that say the same thing (the OOMs of a crash loop, each like the one before) as one, in
    the place of the first, saying how many times and when the first and last were; its evidence is
    the first EVIDENCE_KEPT occurrences' and the last's (a restart loop made hundreds of equal lines)."""
    groups: dict[tuple[str, str, str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.id, f.title, f.detail, f.confidence), []).append(f)
    out = []
    for alike in groups.values():
        first = alike[0]
        if len(alike) == 1:
            out.append(first)
            continue
        evidence = [e for f in alike for e in f.evidence]
        ts = [e["t_us"] for e in evidence if e.get("t_us") is not None]
        when = f"; the first at {min(ts) / 1e6:.1f} s, the last at {max(ts) / 1e6:.1f} s" if ts else ""
        kept = evidence if len(evidence) <= EVIDENCE_KEPT + 1 else [
            *evidence[:EVIDENCE_KEPT], {"what": f"{len(evidence) - EVIDENCE_KEPT - 1} more alike"}, evidence[-1]]
        out.append(Finding(first.id, first.title, f"{first.detail} ({len(alike)} times{when})", first.confidence, kept))
    return out


def _kv_at_oom(b: Bundle, kv: pl.DataFrame) -> Callable[[dict[str, Any]], float | None]:
    """The KV usage when an OOM struck: the latest sample at or before it, of its own replica's series
    where the bundle has one (a fleet's: another replica's usage says nothing of this one's OOM), else
    of any series; an OOM without a time takes the last sample."""
    names = replica_names(b.meta.inputs)
    own = series_replicas(kv["source"].unique().to_list(), names)
    at = kv_usage_at(kv)

    def of(e: dict[str, Any]) -> float | None:
        rep = replica_of(e.get("source"), names)
        sources = [s for s, r in own.items() if r == rep] if rep is not None else []
        return at(e.get("t_us"), sources or None)
    return of


def analyze_bundle(b: Bundle) -> Analysis:
    """What the bundle shows. Its samples are queried (``Bundle.scan_samples``), never all held."""
    acc = accounting(b)
    samples = b.scan_samples()
    actual, src = actual_frame(samples)
    gap = gap_frame(actual, acc)
    div = detect(gap) if acc.accounted_bytes is not None else Divergence(None, None, None, None, None, None, [])
    attrs = attribute(b.scan_requests(), div.onset_us)
    ooms = [e for e in b.events if e.get("kind") in OOM_KINDS]
    kv = kv_in_use(samples, acc)
    findings: list[Finding] = []
    if div.onset_us is not None:
        gmax = div.max_gap_bytes or 0.0
        findings.append(Finding(
            "divergence", "Actual memory diverged from vLLM's accounting",
            f"gap grew from a baseline of {(div.baseline_bytes or 0) / GiB:.2f} GiB to {gmax / GiB:.2f} GiB; "
            f"onset at {div.onset_us / 1e6:.2f} s (threshold {(div.threshold_bytes or 0) / GiB:.2f} GiB, first "
            f"crossed at {(div.first_crossing_us or 0) / 1e6:.2f} s)",
            "high" if gmax - (div.baseline_bytes or 0) > 4 * (div.threshold_bytes or 1) else "medium",
            [{"t_us": div.onset_us, "what": "onset", "source": src},
             {"t_us": div.max_gap_us, "what": "max gap", "value_bytes": gmax, "source": src}]))
        if attrs:
            a = attrs[0]
            conf = "high" if len(attrs) == 1 or a.score > 1.5 * attrs[1].score else "medium"
            findings.append(Finding(
                f"cause:{a.feature}", f"Traffic at the onset: {a.feature.replace('_', ' ')}",
                f"{a.why}; near the onset mean {a.near_mean:.1f} vs {a.rest_mean:.1f} in the rest of the traffic "
                f"(requests {', '.join(a.near_ids[:5])})", conf,
                [{"request": i, "source": "requests.parquet"} for i in a.near_ids[:10]]))
        if acc.total_bytes and acc.accounted_bytes:
            peak = float(gap["actual_bytes"].max() or 0)  # type: ignore[arg-type]
            over = peak - acc.accounted_bytes
            util = b.meta.engine_args.get("gpu_memory_utilization")
            if util and over > 0:
                safe = max(0.0, float(util) - over / acc.total_bytes)
                findings.append(Finding(
                    "headroom", "A lower gpu_memory_utilization would have left the gap as headroom",
                    f"peak actual exceeded accounted by {over / GiB:.2f} GiB; gpu_memory_utilization {safe:.2f} "
                    f"(instead of {util}) leaves that much free", "medium",
                    [{"value_bytes": over, "what": "peak over accounted"}]))
    kv_at = _kv_at_oom(b, kv)
    for e in ooms:
        if e.get("kind") == "oom" and e.get("warmup"):
            findings.append(_warmup_oom(e, b.meta.engine_args.get("max_num_seqs")))
        if e.get("kind") == "oom" and e.get("tried_to_allocate_bytes") is not None:
            for cause, conf, why in classify_oom(e, kv_at(e))[:2]:
                findings.append(Finding(f"oom:{cause}", f"CUDA OOM: {cause}", why, conf,
                                        [{"t_us": e.get("t_us"), "source": e.get("source"),
                                          **({"restated_at": e["restated_at"]} if e.get("restated_at") else {})}]))
        elif e.get("kind") == "host_oom_killed" and e.get("killer") == "ray":
            findings.append(_ray_oom(e))
        elif e.get("kind") == "host_oom_killed":
            findings.append(Finding("oom:host", "Host/cgroup OOM (OOMKilled, exit 137)",
                                    "the container was killed for host memory, not a CUDA OOM", "high",
                                    [{"t_us": e.get("t_us"), "source": e.get("source")}]))
        elif e.get("kind") == "emulated_oom":
            findings.append(Finding("oom:emulated", "EMULATED OOM: actual memory crossed the production capacity",
                                    str(e.get("label")), "high", [{"t_us": e.get("t_us"), "source": "replay"}]))
    findings += _kills(b.events)
    findings += _first_replica(b)
    ties = _ties_of_exports(b)
    findings += _export_tie_findings(ties)
    findings += _gpu_ties(b)
    findings += _image_growth(b, gap)
    findings += _vllm_memory_errors(b.events)
    machines, machines_total = (machines_frame(samples) if src is None else (pl.DataFrame(), 0))
    if machines_total:
        findings += _machines_unchosen(machines, machines_total)
    cuda: dict[str, Finding] = {}
    for e in b.events:  # GPU errors from the kernel log, or CUDA's, end engines without any CUDA OOM
        if e.get("kind") == "cuda_error":
            cuda.setdefault(str(e.get("error")), Finding(
                f"gpu:cuda_error:{str(e.get('error')).replace(' ', '_')}", f"CUDA error, not an OOM: {e.get('error')}",
                "the engine failed on a CUDA error that is not out-of-memory: more memory or a smaller KV budget does "
                "not prevent it; an Xid in the node's kernel log (dmesg) at the same time says whether the GPU or "
                "the driver reported it, and CUDA_LAUNCH_BLOCKING=1 names the kernel", "high",
                [{"t_us": e.get("t_us"), "source": e.get("source")}]))
        if e.get("kind") == "collective_timeout":
            ranks = sorted({int(x["nccl_rank"]) for x in b.events if x.get("kind") == "collective_timeout"
                            and x.get("nccl_rank") is not None})
            cuda.setdefault("nccl", Finding(
                "gpu:nccl_timeout", f"NCCL collective timed out, not an OOM: {e.get('op')}",
                f"{e.get('op')} #{e.get('seq')} ran {int(e.get('ran_ms') or 0) / 1000:.0f} s without completing on "
                f"rank(s) {', '.join(map(str, ranks)) or '?'} and torch's watchdog took the process down: a peer stopped "
                "answering (a hung or crashed worker, a GPU fault, an NVLink or network failure); the ranks that "
                "do not time out are the ones to look at; more memory does not prevent it", "high",
                [{"t_us": e.get("t_us"), "source": e.get("source")}]))
        if e.get("kind") == "gpu_xid":
            findings.append(Finding(f"gpu:xid{e.get('xid')}", f"GPU error Xid {e.get('xid')}: {e.get('meaning')}",
                                    f"NVIDIA driver error on PCI {e.get('pci')}: {e.get('message') or ''}".strip(),
                                    "high", [{"t_us": e.get("t_us"), "source": e.get("source")}]))
    findings += cuda.values()
    findings += _shared_gpus(b.meta.gpus)
    out = Analysis(b, acc, src, gap, kv, div, attrs, ooms, merge_alike(findings), layers_frame(samples), replica_outages(b),
                   machines=machines, machines_total=machines_total, series_ties=ties)
    out.unjudged = unjudged(out)
    return out
