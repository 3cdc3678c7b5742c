"""The bundle's event vocabulary: every kind of event ``events.jsonl`` holds, who states it, and the
fields of the kinds the analysis reads. An event in the bundle is one flat object: ``t_us`` (µs since
the bundle's t0, or null where the evidence gives no time), ``kind``, ``source`` ('file:line', a file
name, or 'replay'/'live') and ``rank`` (the process that logged it, or null), then its kind's own
fields. The layout of the whole bundle is in docs/bundle-format.md."""

from __future__ import annotations

from typing import Any, Literal, TypedDict, get_args

LogEventKind = Literal[
    # vLLM's log: start-up accounting
    "kv_blocks", "kv_memory", "kv_tokens", "memory_profile", "memory_budget", "weights", "cuda_graph", "cuda_graph_estimate",
    "cudagraph_profiling", "startup_free", "max_concurrency", "sleep_mode",
    # vLLM's log: at run time and when it fails
    "preemption", "oom", "vllm_memory_error", "cuda_error", "collective_timeout", "host_oom_killed", "engine_death",
    "engine_shutdown", "engine_start", "engine_stop", "batch_at_crash", "scheduler_at_crash",
]
EvidenceEventKind = Literal[
    "kv_config",  # a scrape's vllm:cache_config_info (its labels)
    "host_oom_killed", "container_killed", "container_terminated", "restart_count", "k8s_event", "k8s_pod_status",
    "gpu_xid",  # the kernel log
]
ReplayEventKind = Literal[
    "engine_ready", "emulated_oom", "interrupted",  # a replay run's, and ``record --live``'s
    "warmup",  # a replay run's requests before its trace
    "torch_oom", "probe_error",  # the in-engine probe's
]
EventKind = LogEventKind | EvidenceEventKind | ReplayEventKind
EVENT_KINDS: frozenset[str] = frozenset(get_args(LogEventKind) + get_args(EvidenceEventKind) + get_args(ReplayEventKind))

# Facts of a log that are no events in a recorded bundle: its stats lines become samples, its request
# lines requests, and its engine configuration bundle.json's engine arguments. (A replay's server log
# is written fact by fact, ``recorder.write_log_facts``: there they are events.)
NOT_EVENTS = ("stats", "request_received", "request_added", "request_finished", "request_aborted", "engine_config")


class ParsedEvent(TypedDict):
    """An event as an evidence parser states it: at absolute UTC epoch µs, on a line of its file."""

    t: int | None
    kind: EventKind
    line: int | None
    data: dict[str, Any]


class GatheredEvent(TypedDict):
    """An event as the recorder holds it until the bundle's t0 is known: epoch µs, clock corrected."""

    t: int | None
    kind: str  # (an EventKind; a bundle given as evidence may hold kinds of other versions)
    data: dict[str, Any]
    source: str
    rank: str | None


# --- the fields of the kinds the analysis reads (as written into the bundle, beside t_us, kind,
# source and rank; a field the evidence does not state is null or absent) ---------------------------
class OomEvent(TypedDict, total=False):
    """A CUDA out-of-memory error as PyTorch (or vLLM while warming up) states it."""

    generation: str  # which wording: 'unparsed' where none of its figures could be read
    gpu: int | None
    gpu_total_bytes: int | None
    tried_to_allocate_bytes: int | None
    free_bytes: int | None
    process_in_use_bytes: int | None
    allocated_by_pytorch_bytes: int | None
    reserved_unallocated_bytes: int | None
    other_processes: list[dict[str, Any]]
    warmup: bool
    message: str
    restated_at: list[str]  # where its rank stated the same OOM again ('file:line')


class HostOomKilledEvent(TypedDict, total=False):
    """A process killed for host memory: the kernel's OOM killer, Ray's memory monitor, or a
    container Kubernetes says was OOMKilled."""

    killer: str  # 'ray' for Ray's memory monitor
    node_ip: str
    workers_killed: int
    pid: int | None
    process: str | None
    container: str | None
    anon_rss_bytes: int | None
    text: str
    meaning: str


class ContainerKilledEvent(TypedDict, total=False):
    """A container killed for another reason than host memory: a failed probe, an eviction, SIGKILL."""

    container: str | None
    reason: str | None  # the Kubernetes event's reason ('Killing', 'Evicted'), where an event states it
    probe: str  # 'liveness' or 'startup'
    evicted: str  # the resource the node ran low on
    meaning: str


class EngineDeathEvent(TypedDict, total=False):
    message: str


class CudaErrorEvent(TypedDict, total=False):
    error: str
    message: str


class CollectiveTimeoutEvent(TypedDict, total=False):
    nccl_rank: int | None
    seq: int
    op: str
    ran_ms: int


class GpuXidEvent(TypedDict, total=False):
    xid: int
    pci: str
    pid: int | None
    process: str | None
    message: str
    meaning: str


class VllmMemoryErrorEvent(TypedDict, total=False):
    """vLLM refusing to start for memory: no room for the KV cache, or a failed profiling check."""

    error: str
    free_gib: float
    initial_free_gib: float
    current_free_gib: float
    max_model_len: int
    kv_needed_gib: float
    kv_available_gib: float
    estimated_max_model_len: int | None


class StartupFreeEvent(TypedDict, total=False):
    """V1's start-up summary of device memory ('Free memory on device …'), GiB as it logs them."""

    weights_gib: float | None
    consumed_gib: float | None
    non_torch_gib: float | None
    activation_peak_gib: float
    cuda_graph_gib: float
    kv_cache_gib: float
    kv_cache_memory_fit_bytes: int
    kv_cache_memory_full_bytes: int


class EmulatedOomEvent(TypedDict, total=False):
    """A replay's capacity guard: the engine's memory passed the emulated capacity (not a device OOM)."""

    label: str
    rss_bytes: int | None
    capacity_bytes: int | None
    log_tail: str  # the server log's last lines
