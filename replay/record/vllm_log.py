"""Parser for vLLM server logs of every version from 0.6 to 0.33, V0 and V1.

It turns a log into facts: startup memory accounting, KV capacity, CUDA-graph cost, periodic
stats (KV usage, running, waiting), requests, preemptions, CUDA OOM messages of all torch
generations, vLLM's own memory errors, engine death and restarts. Real-world mess is expected:
process prefixes, ANSI colours, container timestamps, kubectl prefixes, Docker json-file lines, vLLM's
own JSON records, CRI node logs, journald/syslog prefixes, docker compose's service column, Slurm's
task label, a shipper's own time and tags, thousands separators, glued and wrapped lines,
tracebacks. Lines repeated identically by several ranks are one fact per rank; an identical line
repeated within a rank (overlapping pastes) is one fact.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from replay.engine import catalogue
from replay.record.engine_config import from_log_message
from replay.units import gpu_index, parse_size_bytes
from replay.versioning import version_key

# a colour code, or one pasted in caret notation ('^[[0;36m': `cat -v`, a CI system's raw log view)
ESC_OPEN = r"(?:\x1b|\^\[|#033)\["  # (and as rsyslog escapes the byte: '#033[0;36m', octal)
ANSI = re.compile(ESC_OPEN + r"[0-9;]*[A-Za-z]")
# a colour code whose ESC a paste dropped ('[0;36m(APIServer pid=7)[0;0m INFO …', as GitHub shows a
# coloured terminal's text): taken out of a line that opens with one (vLLM colours its head alone)
BARE_SGR = r"\[[0-9;]*m"
BARE_SGR_HEAD = re.compile("^" + BARE_SGR)
_BARE_SGR = re.compile(BARE_SGR)
# the pieces of what log shippers put in front of a line (the vectorised lane builds its envelope from them)
ISO_TIME = r"(?P<dt>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(?P<frac>\d+))?(?P<zone>Z|[+-]\d\d:?\d\d)?"
KUBECTL_PREFIX = r"\[(?:pod/)?[\w.-]+(?:/[\w.-]+)?\]\s+"
CRI_FLAG = r"(?:stdout|stderr) [FP] "
# a container runtime's time, or a CI system's in brackets ('[2026-01-28T23:59:42Z] ', Buildkite's)
ISO_OPEN, ISO_CLOSE = r"\[?", r"\]?"
CONTAINER_TS = re.compile(r"^" + ISO_OPEN + "(" + ISO_TIME + ")" + ISO_CLOSE + r"\s+")
# Python logging's asctime ('2025-08-11 16:12:02,123 '): no zone, a space after it (a shipper's naive time,
# Grafana's, is followed by a tab, and its lines after the first are a message's continuation)
NAIVE_TIME = re.compile(r"^\d{4}-(?P<md>\d\d-\d\d)[ T](?P<hms>\d\d:\d\d:\d\d)(?:[.,]\d+)? (?=\S)")
KUBECTL = re.compile("^" + KUBECTL_PREFIX)
# `docker compose logs`' service column ('vllm-1  | ', 'vllm_1  | ', 'triton_server_vllm-1  | ')
COMPOSE_PREFIX = r"[A-Za-z0-9][A-Za-z0-9_.-]* +\| ?"
COMPOSE = re.compile("^" + COMPOSE_PREFIX)
# `srun --label` (Slurm) puts the task's number in front of every line it relays ('0: ')
SLURM_LABEL = r"\d{1,5}: "
SLURM = re.compile("^" + SLURM_LABEL)
# what follows a container or syslog time: a CRI node log's stream and partial flag ('stderr F '), or
# journald/syslog's host and process ('gpu-1 python3[1234]: ')
AFTER_TS_BODY = r"(?:" + CRI_FLAG + r"|[\w.-]+ [\w.@/()-]+(?:\[\d+\])?: )"
AFTER_TS = re.compile("^" + AFTER_TS_BODY)
SYSLOG_BSD_PREFIX = r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)? [\w.-]+ [\w.@/()-]+(?:\[\d+\])?: "
SYSLOG_BSD = re.compile("^" + SYSLOG_BSD_PREFIX)
# the keys a log shipper's JSON record gives the line under (Docker's json-file and Fluent Bit: log; Loki
# and logcli: line; Vector, Filebeat and Elastic: message; `journalctl -o json`: MESSAGE; Google Cloud
# Logging: textPayload), and its ISO time under
SHIPPED_TEXT = ("log", "line", "message", "MESSAGE", "textPayload")
SHIPPED_TIME = ("time", "timestamp", "@timestamp")
REALTIME_US = re.compile(r"^[0-9]{1,17}$")  # journald's time: µs since 1970, as a string of digits
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def realtime_iso(us: Any) -> str | None:
    """journald's __REALTIME_TIMESTAMP (µs since 1970, a string of at most 17 digits: before the
    year 5140) as an ISO UTC time; None for anything else."""
    if not isinstance(us, str) or not REALTIME_US.match(us):
        return None
    return (EPOCH + timedelta(microseconds=int(us))).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

# vLLM's own JSON logging (OTelJSONFormatter: timestamp, severity_text, body, logger, exception)
OTEL_JSON = re.compile(r'^\{\s*"timestamp"\s*:')
OTEL_LEVELS = {"WARN": "WARNING", "FATAL": "CRITICAL", "DEBUG": "DEBUG", "INFO": "INFO", "ERROR": "ERROR"}
# a process prefix: vLLM's own ('APIServer pid=1', 'VllmWorker rank=0 pid=2'), Ray's ('RayWorkerWrapper
# pid=3, ip=10.0.0.2') and Ray Serve's, whose actor names hold colons ('ServeReplica:default:VLLMDeployment')
PROC_BODY = r"[A-Za-z_][\w:.-]*(?: [\w=.:,-]+)*? pid=\d+(?:, ip=[\d.]+)?"
PROC = re.compile(r"^(?:\((?P<proc>" + PROC_BODY + r")\)|\[(?P<bproc>" + PROC_BODY + r")\])\s*")  # ('[Worker_TP3 pid=540]' in some builds)
# Ray's own processes, whose lines the driver (vLLM's front end under Ray) relays: '(raylet) …',
# '(raylet, ip=10.0.0.2) …', '(gcs_server) …'; each line of theirs opens a message of its own
RAY_COMPONENT = re.compile(r"^\((?P<proc>(?:raylet|gcs_server|autoscaler|monitor|dashboard)(?:, ip=[\d.]+)?)\)(?P<bproc>)\s*")
LEVEL_TS = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)?\s+"
    r"(?:\[(?P<file1>[\w./-]+\.py):(?P<line1>\d+)\]|(?P<file2>[\w./-]+\.py):(?P<line2>\d+)\])?\s?"
)
UVICORN = re.compile(r'^(?:INFO|WARNING|ERROR):\s+[\d.:]+ - "(?P<method>\w+) (?P<path>\S+) HTTP/[\d.]+" (?P<code>\d+)')
# Ray prints a message once, then folds the same message from other processes (numbers masked) into
# one line that ends so (the first such line also explains itself)
RAY_REPEATED = re.compile(r"\s*\[repeated (\d+)x across cluster\](?: \(Ray deduplicates logs by default\..*)?$")
RAY_FOLD_MARK = "x across cluster]"  # (a literal every such line holds: the cheap test before the pattern)
# a log shipper's own time and tags in front of a line vLLM wrote ('2026-06-09 14:01:52.982 [Error]
# (Process) (EngineCore pid=1) ERROR 06-09 14:01:52 [core.py:1136] …', or of a traceback line vLLM did
# not prefix): the time, its tags ('[Error] ', '(Process) ', '- '), and where vLLM's own head with its
# call site (so distinctive that what stands before it is taken for the shipper's) follows within 80
# characters, the text up to it. The time is exact where it has a zone, else it gives only the year.
# Google Cloud Logging's Logs Explorer puts the entry's severity first ('INFO 2025-11-19T20:16:36.0966Z
# [resource.labels.containerName: vllm] (EngineCore_DP0 pid=270) ERROR 11-19 12:16:36 …'), Grafana's
# logs download as text its time in ms and a tab ('1763583396096\t2025-11-19T20:16:36.096Z\t…'; older
# Grafana wrote only its local time, '2025-11-19 20:16:36.096\t…').
CLOUD_SEVERITIES = ("DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY")
SHIPPER_TIME = r"(?P<sdate>\d{4}-\d\d-\d\d)[T ](?P<stime>\d\d:\d\d:\d\d)(?:[.,](?P<sfrac>\d+))?(?P<szone>Z|[+-]\d\d:?\d\d)?"
VLLM_HEAD = (r"(?:\(" + PROC_BODY + r"\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+"
             r"\[?[\w./-]+\.py:\d+\]|(?:INFO|WARNING|ERROR):\s+[\d.:]+ - \")")
# what a paste or a search puts in front of a line: a Markdown or e-mail quote ('> ', nested), a `cat -n`
# or `nl` line number and its tab, grep's file name and line number (-H, -n: ':' after a match, '-' after
# a context line) where vLLM's head or a container's time follows
QUOTE = re.compile(r"^(?:>[ \t]?)+")
_AHEAD = r"(?=" + VLLM_HEAD + r"|\d{4}-\d\d-\d\dT\d\d:)"
NUMBERED = re.compile(r"^ *\d+\t|^(?:[\w./-]+[:-])?\d+[:-]" + _AHEAD + r"|^[\w./-]+\.(?:log|txt|out|err):" + _AHEAD)
SHIPPER_TAG = r"(?:\[[^\]]{1,40}\]|\((?![^)]*pid=)[^)]{1,40}\)|[-|:])"
TAGS_BEFORE_HEAD = re.compile(r"^(?:" + SHIPPER_TAG + r"\s+)+(?=" + VLLM_HEAD + ")")  # (after a container time)
SHIPPED = re.compile("^(?:(?:" + "|".join(CLOUD_SEVERITIES) + r") |\d{13}\t)?" + SHIPPER_TIME + r"\s+(?:"
                     + SHIPPER_TAG + r"\s+)*(?:(?!" + VLLM_HEAD + r").{0,80}?\s(?=" + VLLM_HEAD + "))?")
# `stern` (and kubetail) put the pod and container in front of each line ('vllm-0-7d9f8c6b5-x2k4p vllm
# (APIServer pid=1) INFO …', with --timestamps an ISO time after them): two lowercase DNS names, taken
# off only where vLLM's own head or a container time follows
STERN = re.compile(r"^[a-z0-9][a-z0-9.-]{0,252} [a-z0-9][a-z0-9-]{0,62} (?=(?:" + ISO_TIME + r")\s|" + VLLM_HEAD + ")")
# a message's level and logged time, wherever it stands in a line
LEVEL_TIME = r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"
GLUE = re.compile(r"(?<=\S)(?=(?:" + ESC_OPEN + r"[0-9;]*m)?(?:(?:\(" + PROC_BODY + r"\)|\[" + PROC_BODY + r"\])\s*(?:" + ESC_OPEN
                  + r"[0-9;]*m)?\s*)?"
                  + LEVEL_TIME + ")")
NUMBER = r"[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?"  # ('1,234.5' as vLLM formats it)
_NUM = "(" + NUMBER + ")"


def _f(s: str) -> float:
    return float(s.replace(",", ""))


def _size(s: str) -> int | None:
    return parse_size_bytes(s)


# --- startup accounting ---------------------------------------------------------------------
R_BLOCKS = re.compile(r"# (?:GPU|CUDA|cuda|\w+) blocks: " + _NUM + r"(?:, # CPU blocks: " + _NUM + ")?")
R_PROFILE_V0_064 = re.compile(
    r"Memory profiling results: (?:duration=[\d.]+ seconds, )?total_gpu_memory=" + _NUM + r"GiB,? initial_memory_usage=" + _NUM
    + r"GiB,? peak_torch_memory=" + _NUM + r"GiB,? memory_usage_post_profile=" + _NUM + r"Gi[bB],? non_torch_memory="
    + _NUM + r"GiB,? kv_cache_size=" + _NUM + r"GiB,? gpu_memory_utilization=" + _NUM)
R_BUDGET = re.compile(r"total_gpu_memory \(" + _NUM + r"GiB\) x gpu_memory_utilization \(" + _NUM + r"\) = " + _NUM + "GiB")
# V1 0.9-0.28 at DEBUG (gpu_worker.py): its budget, then the parts of it that are not KV cache (KV cache =
# requested memory - non-KV memory, which is weights + torch peak increase + non-torch increase)
R_REQUESTED = re.compile(r"Initial free memory: " + _NUM + r" ?GiB; Requested memory: " + _NUM + r" \(util\), " + _NUM + " ?GiB")
R_V1_PROFILE = re.compile(r"Total non KV cache memory: " + _NUM + r" ?GiB; torch peak memory increase: " + _NUM
                          + r" ?GiB; non-torch forward increase memory: " + _NUM + r" ?GiB; weights memory: " + _NUM + " ?GiB")
R_PARTS = re.compile(
    r"model weights take " + _NUM + r"GiB; non_torch_memory takes " + _NUM
    + r"GiB; PyTorch activation peak memory takes " + _NUM + r"GiB; the rest of the memory reserved for KV Cache is " + _NUM + "GiB")
R_WEIGHTS = re.compile(r"(?:Loading model weights took|Model loading took) " + _NUM + r" (GiB|GB)")
R_AVAIL_KV = re.compile(r"Available KV cache memory: " + _NUM + r" ?GiB")
R_KV_TOKENS = re.compile(r"(GPU|CPU|[\w +]+?) KV cache size: " + _NUM + " tokens")
R_MAXCONC = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + "x")
R_GRAPH = re.compile(r"Graph capturing finished in " + _NUM + r" secs?(?:, took " + _NUM + r" GiB)?")
R_GRAPH_EST = re.compile(r"Estimated CUDA graph memory: " + _NUM + " GiB")
R_CPU_KV_SET = re.compile(r"Explicitly set \(?" + _NUM + r"(?:/[\d.]+)?\)? GiB for KV cache")
# V1's start-up guard (0.10+): the GPU had less free memory than the budget asked for ('device cuda:0' from 0.11)
R_FREE_SHORT = re.compile(r"Free memory on device(?: [\w:]+)? \(" + _NUM + "/" + _NUM + r" GiB\) on startup is less than desired GPU "
                          r"memory utilization \(" + _NUM + ", " + _NUM + r" GiB\)")
R_FREE_MEM = re.compile(r"Free memory on device(?: [\w:]+)? \(" + _NUM + "/" + _NUM + r" GiB\) on startup\.(?: Desired GPU memory utilization is \("
                        + _NUM + ", " + _NUM + r" GiB\))?")  # (with --kv-cache-memory, no desired utilization)
# the rest of that line (0.10.2+; INFO from 0.29): what the engine measured at start-up, in two wordings
# (vLLM-Ascend, the NPU plugin, words it 'Actual usage: X GiB for weights, …, W GiB for NPU graph memory')
R_ACTUAL = re.compile(r"Actual usage(?: is|:) " + _NUM + r" GiB for (weights?|consumed memory \(weights \+ non-torch\)), "
                      + _NUM + r" GiB for peak activation, (?:" + _NUM + r" GiB for non-torch memory, )?(?:and )?" + _NUM
                      + " GiB for (?:CUDAGraph|NPU graph) memory")
R_SUGGEST = re.compile(r"--kv-cache-memory=(\d+)`? \([\d.]+ GiB\) to fit into requested memory, or `?--kv-cache-memory=(\d+)")
R_KV_IN_USE = re.compile(r"Current (?:kv|KV) cache memory(?: in use is|:) " + _NUM + " GiB")
# (the pool measured can come out below 0: '-0.19 GiB (actual), 2.43 GiB (estimated)', DGX Spark, 2026)
R_GRAPH_POOL = re.compile(r"CUDA graph pool memory: (-?(?:" + _NUM[1:-1] + r")) GiB \(actual\), " + _NUM + r" GiB \(estimated\)")
R_NUM_BLOCKS = re.compile(r"num_gpu_blocks is: " + _NUM)
R_KV_BYTES = re.compile(r"reserved " + _NUM + r" GiB memory for KV Cache as specified by kv_cache_memory_bytes")
R_MAXLEN_ERR = re.compile(r"max seq len \(" + _NUM + r"\) is larger than the maximum number of tokens that can be stored in KV cache \(" + _NUM + r"\)")
R_NO_CACHE = re.compile(r"No available memory for the cache blocks")
# sleep mode (RLHF, model swapping) measures the device after releasing its pools: what it freed, and what
# every process still holds on the GPU (total less free), which a model started beside it cannot have
R_SLEEP = re.compile(r"Sleep mode freed " + _NUM + r" GiB memory, " + _NUM + r" GiB memory is still in use")
# What V1 dumps when its engine fails (dump_input.py, 0.9 on): the scheduler's state and the batch it was
# running; the batch lists requests as 'num_scheduled_tokens={id: n, …}' and new ones as NewRequestData(…)
R_DUMP_STATS = re.compile(r"Dumping scheduler stats: SchedulerStats\(")
R_DUMP_BATCH = re.compile(r"Dumping scheduler output for model execution: SchedulerOutput\(")
R_DUMP_FIELD = {k: re.compile(rf"\b{k}=([0-9.eE+-]+)") for k in (
    "num_running_reqs", "num_waiting_reqs", "kv_cache_usage", "total_num_scheduled_tokens")}
R_DUMP_SCHEDULED = re.compile(r"\bnum_scheduled_tokens=\{([^{}]*)\}")
R_DUMP_PROMPT_LEN = re.compile(r"\bprompt_token_ids_len=(\d+)")
# V1's figures when one request of max_model_len does not fit (0.8 on; the estimate from 0.9; spelt
# "models's" until 0.11, "model's" after)
R_KV_NEEDED = re.compile(r"max seq len \(" + _NUM + r"\), \(" + _NUM + r" GiB KV cache is needed, which is larger than the "
                         r"available KV cache memory \(" + _NUM + r" GiB\)(?:\. Based on the available memory, the estimated "
                         r"maximum model length is " + _NUM + ")?")
# the check after profiling that free memory did not grow (0.6.4 on): another process on the GPU released
# memory while vLLM measured, so what it measured is not what it has
R_PROFILE_ERR = re.compile(r"Error in memory profiling\. Initial free memory " + _NUM + r" GiB, current free memory "
                           + _NUM + " GiB")
R_INSUFF_KV = re.compile(r"(?:To serve at least one request with the models's max seq len|is larger than the available KV cache memory|KV cache is needed, which is larger than the available KV cache memory)")

# --- runtime ----------------------------------------------------------------------------------
# The periodic stats line, with named groups: read here a line at a time, and as columns by the fast
# lane (``fastlog``), which takes the same patterns (polars' regex reads the same syntax). The numbers
# of the groups are those of their order.
STATS_V0 = (r"Running: (?P<running>\d+) reqs, Swapped: (?P<swapped>\d+) reqs, Pending: (?P<waiting>\d+) reqs, "
            r"GPU KV cache usage: (?P<kv>" + NUMBER + r")%, CPU KV cache usage: (?P<cpu_kv>" + NUMBER + ")%")
STATS_V1 = (r"Running: (?P<running>\d+) reqs, Waiting: (?P<waiting>\d+) reqs(?:, Preemptions: (?P<pre>\d+))?.*?"
            r"(?:GPU|CPU|XPU|\w+) KV cache usage: (?P<kv>" + NUMBER + ")%")
THROUGHPUT = (r"Avg prompt throughput: (?P<ptps>" + NUMBER + r") tokens/s, Avg generation throughput: (?P<gtps>"
              + NUMBER + ")")
# the caches' hit rates a stats line states: prefix caching's (V0: 'GPU: x%, CPU: y%'), and from 0.11 the
# multimodal processor cache's (V1 computes both over its recent requests, not since the start)
PREFIX_HIT = r"Prefix cache hit rate: (?:GPU: )?(?P<prefix>" + NUMBER + ")%"
MM_HIT = r"MM cache hit rate: (?P<mm>" + NUMBER + ")%"
R_STATS_V0 = re.compile(STATS_V0)
R_STATS_V1 = re.compile(STATS_V1)
# which engine a V1 stats line speaks for, with data parallelism ('Engine 001:', '2 Engines Aggregated:')
R_DP = re.compile(r"^(Engine \d+|\d+ Engines Aggregated):")
R_THROUGHPUT = re.compile(THROUGHPUT)
R_PREFIX_HIT = re.compile(PREFIX_HIT)
R_MM_HIT = re.compile(MM_HIT)
R_PREEMPT = re.compile(r"Sequence group (\S+) is preempted by PreemptionMode\.(\w+).*?total_num_cumulative_preemption=(\d+)")
R_ADDED = re.compile(r"Added request (\S+?)\.?$")
R_RECEIVED = re.compile(r"Received request (\S+?):")
R_FINISHED = re.compile(r"Finished request (\S+?)\.?$")
R_ABORTED = re.compile(r"Aborted request(?:\(s\))? (.+?)\.?$")
R_DETAILS = re.compile(r"Request (\S+?) details: ")
R_PROMPT = re.compile(r"""prompt: ('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|None)""")
R_TOKEN_IDS = re.compile(r"prompt_token_ids: \[([\d,\s]*)(\]|\.\.\.)")
R_PARAM = {k: re.compile(rf"\b{k}=(\d+|None)") for k in ("n", "best_of", "max_tokens", "logprobs", "prompt_logprobs", "min_tokens")}
# one image in a prompt as the chat template wrote it (each model family's placeholder, as vLLM's own
# tokenizer tests list them; a run of them is one image, whether or not the processor expanded it):
# Qwen2-VL / Qwen2.5-VL / Qwen3-VL, LLaVA and InternVL, Llama 3.2 Vision, Phi-3-vision
R_IMAGE = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>|(?:<image>)+|(?:<\|image\|>)+|<\|?image_\d+\|?>")
# one token id repeated four times or more in a logged id list: where vLLM logs the processed prompt (V1
# does), each image's placeholder is such a run of the model's image token, one per image token
R_ID_RUN = re.compile(r"(?<!\d)(\d+)(?:, \1(?!\d)){3,}")


def image_tokens(ids: str, images: int) -> int | None:
    """The tokens a logged prompt's ``images`` took, from its complete id list (``"4, 94, 6, 8, 8, …"``):
    the runs of one repeated id that are as many as the images (that id the image token; of several
    such ids, the one of the most tokens). None where no id repeats in exactly that many runs: the ids
    were logged before the images were expanded (V0), or two images' runs touch."""
    if images <= 0:
        return None
    runs: dict[str, list[int]] = {}
    for m in R_ID_RUN.finditer(ids):
        runs.setdefault(m.group(1), []).append((len(m.group(0)) + 2) // (len(m.group(1)) + 2))
    totals = [sum(n) for n in runs.values() if len(n) == images]
    return max(totals) if totals else None

# --- OOM --------------------------------------------------------------------------------------
R_OOM_MODERN = re.compile(
    r"Tried to allocate (?P<tried>[\d.]+ \w+)\. GPU (?P<gpu>\d+) has a total capac(?:i)?t?y of (?P<total>[\d.]+ \w+) of which (?P<free>[\d.]+ \w+) is free\."
    r"(?P<procs>(?: Process \d+ has [\d.]+ \w+ memory in use\.)*)"
    r"(?: Including non-PyTorch memory, this process has (?P<this>[\d.]+ \w+) memory in use\.)?"
    r"(?:(?P<procs2>(?: Process \d+ has [\d.]+ \w+ memory in use\.)*))?"
    r"(?: (?P<allowed>[\d.]+ \w+) allowed;)? Of the allocated memory (?P<alloc>[\d.]+ \w+) is allocated by PyTorch, "
    r"(?:with (?P<private>[\d.]+ \w+) allocated in private pools \(e\.g\., CUDA Graphs\), )?and (?P<resv>[\d.]+ \w+) is reserved by PyTorch but unallocated")
R_OOM_OLD = re.compile(
    r"Tried to allocate (?P<tried>[\d.]+ \w+) \(GPU (?P<gpu>\d+); (?P<total>[\d.]+ \w+) total capacity; (?P<alloc>[\d.]+ \w+) already allocated; "
    r"(?P<free>[\d.]+ \w+) free; (?:(?P<allowed>[\d.]+ \w+) allowed; )?(?P<resv_total>[\d.]+ \w+) reserved in total by PyTorch\)")
# (V1's model runner, when a CUDA OOM interrupts its start-up warm-up of the sampler or the pooler: 'RuntimeError:
# CUDA out of memory occurred when warming up sampler with 256 dummy requests. Please try lowering `max_num_seqs`
# …'; raised 'from' torch's own OOM, which the traceback states first)
R_WARMUP = re.compile(r"CUDA out of memory occurred when warming up (sampler|pooler)(?: \(task=['\"]?([\w-]+)['\"]?\))? "
                      r"with ([\d,]+) dummy requests")
R_OOM_ANY = re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|out of memory", re.I)
# an OOM without torch's accounting (CUDA; HIP on ROCm; XPU): still an OOM, its numbers unknown
# (torch's driver-API calls, which expandable segments allocate through: 'CUDA driver error: out of memory';
# old torch's 'cuda runtime error (2) : out of memory'; NCCL's, at communicator set-up: "Cuda failure 'out of memory'")
R_OOM_BARE = re.compile(r"(?:CUDA|HIP|XPU) out of memory|(?:CUDA|HIP) (?:driver )?error: out of memory|hipErrorOutOfMemory"
                        r"|cuda runtime error \(2\) : out of memory|Cuda failure (?:\d+ )?'out of memory'")
# a CUDA library that could not allocate its workspace (cuBLAS at its first call in a process is the
# usual one): device memory ran out, with no figures
R_LIB_ALLOC = re.compile(r"\b(?:CUBLAS|CUDNN|CUSPARSE|CUSOLVER|CUFFT|CURAND)_STATUS_ALLOC_FAILED\b")
# a CUDA error that is not an OOM ('RuntimeError: CUDA error: an illegal memory access was encountered',
# torch 2.8 on 'torch.AcceleratorError: …'): it ends the engine as an OOM does, and more memory does not help
R_CUDA_ERROR = re.compile(r"(?:CUDA|HIP) error: (an illegal memory access was encountered|unspecified launch failure|"
                          r"device-side assert triggered|misaligned address|an illegal instruction was encountered|"
                          r"uncorrectable ECC error encountered|the launch timed out and was terminated|"
                          r"operation not permitted when stream is capturing|unknown error)")
# torch's NCCL watchdog ending a tensor-parallel engine: a collective no peer completed ('[Rank 0] Watchdog
# caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, …) ran for 600059 milliseconds …')
R_NCCL_TIMEOUT = re.compile(r"(?:\[Rank (\d+)\] )?Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), "
                            r"OpType=(\w+).*?\) ran for (\d+) milliseconds")
R_PROC_HAS = re.compile(r"Process (\d+) has ([\d.]+ \w+) memory in use")
# (V1's multiproc executor when a worker dies, an OOM-killed one say: 'Worker proc VllmWorker-2 died
# unexpectedly, shutting down executor.'; and its front end when an engine core dies while starting: 'Engine
# core initialization failed. See root cause above.'; not the source line that raises it, which a traceback quotes)
R_DEATH = re.compile(r"(EngineDeadError|Engine background task failed|Engine core proc \S+ died unexpectedly|"
                     r"Worker proc \S+ died unexpectedly|Engine core initialization failed(?=\. See root cause)|EngineCore failed to start(?=\.)|"
                     r"Got fatal signal from worker processes|EngineCore encountered a fatal error|"
                     r"RuntimeError: Engine process failed to start|MQLLMEngine terminated|Engine loop has died)")
# the engine's own statement of its config ('Initializing an LLM engine (v0.6.6) with config: model=…', V1's
# 'Initializing a V1 LLM engine (v0.8.1) with config: …'; not V1's dump of it when it fails)
R_CONFIG = re.compile(r"Initializing an? (?:V\d )?LLM engine \(v[^)]*\) with config: ")
# an orderly stop: the server told to stop (SIGTERM, Ctrl-C) says so before its engine goes ('[shutdown] EngineCore:
# trigger received signal=SIGTERM' 0.2x on; 'Shutting down FastAPI HTTP server.' 0.6 on; uvicorn's 'Shutting down'):
# an engine death after it is the stop's, not a crash; one after a death is that crash's own shutting down ('[shutdown]
# Executor: waiting for worker exit' follows a worker's death)
R_STOP = re.compile(r"(received signal=SIG(?:TERM|INT)|\[shutdown\] API server: shutdown triggered|Shutting down FastAPI "
                    r"HTTP server|Gracefully stopping http server|Received SIGTERM|^Shutting down$)")
R_START = re.compile(r"(vLLM API server version|vLLM server version|Initializing an? (?:V\d )?LLM engine|Initializing a V1 LLM engine|non-default args:)")
# (four numbers: 0.10.1.1; a nightly's or candidate's whole name: 0.8.5.dev169+gce17db808.d20250423, 0.11.1rc2)
_VERSION = r"(\d+\.\d+\.\d+(?:\.\d+)?(?:\.post\d+)?(?:\.?(?:rc|dev)\d+)*(?:\+[\w.]*\w)?)"
R_VERSION = [
    re.compile(r"vLLM (?:API )?server version " + _VERSION),
    re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v" + _VERSION),
    # the banner (0.11 on) ends in ' █  version 0.32.0' (other software's 'NCCL version 2.21.5' is not vLLM's)
    re.compile(r"[▄▀█]\s+version " + _VERSION + r"\s*$"),
    # (V1's dump when its engine fails: 'Dumping input data for V1 LLM engine (v0.11.0) with config: …')
    re.compile(r"Dumping input data for V1 LLM engine \(v" + _VERSION),
]

# (pattern, lo, hi) fingerprints the version catalogue cannot hold: the line's shape, process names,
# call sites of messages it does not harvest. The messages vLLM's sources log, and the call sites they
# log them from, are the catalogue's (``catalogue.ReleaseClues``), read from the released packages.
FINGERPRINTS: list[tuple[re.Pattern[str], str, str]] = [
    # the call site's form: 'file.py:N] ' to 0.7.3, '[file.py:N] ' from 0.8.0 (``observe`` tags the line with
    # its process and call site as written)
    (re.compile(r"^\([^)]*\) [\w./-]+\.py:\d+\] "), "0.6.0", "0.7.3"),
    (re.compile(r"^\([^)]*\) \[[\w./-]+\.py:\d+\] "), "0.8.0", "99.0.0"),
    (re.compile(r"\[worker\.py:267\]"), "0.8.0", "0.8.2"),
    (re.compile(r"scheduler\.py:1558"), "0.7.0", "0.7.2"),
    (re.compile(r"GPU KV cache size: [\d,]+ tokens$"), "0.8.0", "0.25.0"),
    (re.compile(r"\[kv_cache_utils\.py:86[48]\]"), "0.10.2", "0.10.2"),
    (re.compile(r"default since v0\.21\.0"), "0.21.0", "99.0.0"),
    (re.compile(r"\(EngineCore_DP\d+ pid="), "0.10.2", "99.0.0"),
    (re.compile(r"\(EngineCore_\d+ pid="), "0.8.0", "0.10.1"),
    (re.compile(r"\(APIServer pid="), "0.10.1", "99.0.0"),
    (re.compile(r"Engine \d{3}: Avg prompt"), "0.8.3", "99.0.0"),
]

V1_MARKERS = re.compile(r"V1 LLM engine|Engine \d{3}:|EngineCore|GPU KV cache size|KV cache size: [\d,]+ tokens|Waiting: \d+ reqs|Available KV cache memory|gpu_model_runner|VllmWorker rank")
V0_MARKERS = re.compile(r"V0 LLM engine|MQLLMEngine terminated|MQEngineDeadError|Pending: \d+ reqs|Swapped: \d+ reqs|# GPU blocks: \d+, # CPU blocks|# cuda blocks|VllmWorkerProcess|async_llm_engine\.py|Memory profiling (?:takes|results)|is preempted by PreemptionMode")


@dataclass
class LogFact:
    """One fact from a log: kind, payload, where it came from (line), when (if stated), which rank."""

    kind: str
    data: dict[str, Any]
    line: int
    rank: str
    ts: str | None  # 'MM-DD HH:MM:SS' as logged, or an ISO container timestamp
    text: str
    key_ts: str | None = None  # the time in the repeat key (the logged time first)
    logged_ts: bool = False  # whether the line itself carried a time


@dataclass
class LogParse:
    facts: list[LogFact] = field(default_factory=list)
    quarantine: list[tuple[int, str, str]] = field(default_factory=list)
    lines_read: int = 0
    lines_parsed: int = 0
    continuation_lines: int = 0
    duplicates: int = 0
    ray_folded: int = 0  # lines Ray folded into '[repeated Nx across cluster]' summaries
    version: str | None = None
    version_range: tuple[str, str] | None = None
    version_conflict: tuple[str, str] | None = None  # (from, up to) where the formats' ranges do not meet
    engine: str | None = None
    container_year: int | None = None
    # (line, time as a fact would take it) of the first and the last line that states a time, of each
    # stretch of the log its parsers read: the file's time span, facts or not at its ends
    timed_ends: list[tuple[int, str]] = field(default_factory=list)
    # (seconds the envelopes' times span, seconds vLLM's own span) in the log's first lines, where the
    # times in front of its lines are when it was copied out, not when they were written (``envelope_dump``)
    envelope_dump: tuple[float, float] | None = None


@dataclass
class _Line:
    no: int
    text: str
    rank: str
    ts: str | None
    iso: str | None
    prefixed: bool
    fileline: str = ""
    repeated: int = 0  # lines Ray folded into this one ('[repeated Nx across cluster]')
    year: int | None = None  # the year of a shipper's time without a zone (``iso`` has those with one)
    counted: bool = False  # whether its physical line is counted by this part (a line's first part counts it)
    width: int = 0  # characters in its physical line (a terminal wraps long lines at its width)


# Python logging's asctime: its default ('2025-03-01 10:00:00,123') or vLLM's date format ('03-01 10:00:00')
ASCTIME = re.compile(r"^(?:(?P<year>\d{4})-)?(?P<md>\d\d-\d\d)[ T](?P<hms>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?$")


def _one_line(body: str, exception: Any) -> str:
    """A JSON log record's message and exception as one line: their lines joined as a message's
    continuation lines are."""
    return " ".join(p.strip() for p in (body + "\n" + str(exception or "")).splitlines() if p.strip())


def _pylogging(obj: dict[str, Any]) -> tuple[str, int | None] | None:
    """A record of Python logging's JSON formatters (vLLM's built-in 'json' formatter, 0.32 on, or a
    pythonjsonlogger config: asctime, levelname, message, and the process where given) as the line
    vLLM's text formatter would have written ('(EngineCore_DP0 pid=7) INFO 03-01 10:00:00 message'),
    and the year of its time where it has one. Its time is local, as vLLM's own times are."""
    m = ASCTIME.match(str(obj.get("asctime", "")).strip())
    if m is None or not isinstance(obj.get("message"), str):
        return None
    level = OTEL_LEVELS.get(str(obj.get("levelname", "")).upper(), "INFO")
    proc = obj.get("vllm_process_name") or obj.get("processName")
    pid = obj.get("process")
    head = f"({proc} pid={pid}) " if isinstance(proc, str) and proc and proc != "MainProcess" and isinstance(pid, int) else ""
    frac = f".{m['frac']}" if m["frac"] else ""
    text = _one_line(obj["message"], obj.get("exc_info"))
    return f"{head}{level} {m['md']} {m['hms']}{frac} {text}", int(m["year"]) if m["year"] else None


def _shipped(raw: str) -> tuple[str, str | None, int | None] | None:
    """A log shipper's JSON record (Docker's json-file line '{"log": "...\\n", "stream": ..., "time":
    ...}', logcli's '{"labels": ..., "line": ..., "timestamp": ...}', a journald record): its text
    and its time (ISO, or journald's µs since 1970); or a record of Python logging's JSON formatters
    as its line and the year of its time (``_pylogging``)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if "asctime" in obj and "levelname" in obj:
        rec = _pylogging(obj)
        if rec is not None:
            return rec[0], None, rec[1]
    text = next((obj[k] for k in SHIPPED_TEXT if isinstance(obj.get(k), str)), None)
    if text is None:
        return None
    t = next((obj[k] for k in SHIPPED_TIME if isinstance(obj.get(k), str)), None)
    if t is None:
        t = realtime_iso(obj.get("__REALTIME_TIMESTAMP"))
    return text.rstrip("\n"), t if isinstance(t, str) and CONTAINER_TS.match(t + " ") else None, None


def _otel(raw: str) -> tuple[str, str] | None:
    """A record of vLLM's JSON logging as the line its text formatter would have written ('LEVEL
    MM-DD HH:MM:SS body', the body's and exception's lines joined as a message's continuation lines
    are), and its exact UTC time."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("body"), str) or not isinstance(obj.get("timestamp"), str):
        return None
    t = obj["timestamp"]
    if not CONTAINER_TS.match(t + " "):
        return None
    level = OTEL_LEVELS.get(str(obj.get("severity_text", "")).upper(), "INFO")
    text = _one_line(obj["body"], obj.get("exception"))
    return f"{level} {t[5:10]} {t[11:19]} {text}", t


# how vLLM's own line opens without a process prefix ('INFO 05-19 …'): no envelope below opens so
_BARE_HEAD = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d ")
# a level and time anywhere: a line holds a second, glued message only where one follows its own
_LEVEL_TIME = re.compile(LEVEL_TIME)


def _glued(s: str) -> bool:
    """Whether GLUE may cut ``s``: every cut is before a level and time, so a line with one, at its own
    head, has none (GLUE's search at every place of a line cost a fifth of the line-by-line parse)."""
    found = _LEVEL_TIME.finditer(s)
    first = next(found, None)
    if first is None:
        return False
    return next(found, None) is not None or GLUE.search(s, 0, first.end()) is not None


# a log pasted indented (a Markdown code block, a quote in a ticket or a postmortem): the indent before
# vLLM's own head (a process prefix, a level and time, uvicorn's access line), never before a traceback's
# lines, which stay the message's continuation
INDENT = re.compile(r"[ \t]+(?=\(" + PROC_BODY + r"\)|" + _BARE_HEAD.pattern + r"|(?:INFO|WARNING|ERROR):\s+[\d.:]+ - \")")


# what a copy from a web page or a chat puts in a line: no-break spaces for its spaces (vLLM writes none in
# a line's head: a line with one there has them all turned back), a zero-width space or a byte-order mark
# in front of it (where files or pastes were joined)
NBSP = "\u00a0"
WEB_HEAD = 60  # characters: a line's head (process, level, time, call site) lies within them
INVISIBLE = ("\u200b", "\ufeff")
# and a copy from a terminal's log viewer (k9s, a TUI) that drew a frame around the log: each line between
# box-drawing borders, '│ INFO 03-21 20:15:44 [monitor.py:33] … │', padded to the frame's width
BOX = "\u2502"
BOX_OPEN = re.compile(BOX + " ?")
BOX_CLOSE = re.compile(r"[ \t]*" + BOX + r"[ \t]*$")


def unweb(raw: str) -> str:
    """A line without what a copy from a web page or a framed log viewer put in it (``NBSP``,
    ``INVISIBLE``, ``BOX``)."""
    if raw.startswith(INVISIBLE):
        raw = raw.lstrip("".join(INVISIBLE))
    if raw.startswith(BOX):
        raw = BOX_CLOSE.sub("", raw[BOX_OPEN.match(raw).end():].rstrip("\n"))  # type: ignore[union-attr]
    if NBSP in raw[:WEB_HEAD]:
        raw = raw.replace(NBSP, " ")
    return raw


def _strip(raw: str) -> tuple[str, str | None, int | None]:
    """A line without what log shippers put around vLLM's own text (Docker's JSON, vLLM's own JSON
    records, stern's pod and container, Slurm's task label, docker compose's service column, kubectl's
    prefix, container and syslog times, CRI stream flags, journald's host and process, a shipper's
    time and tags) and colour codes, with the shipper's ISO time where it gave one with a zone, and the
    year of a shipper's time that has none. vLLM's own line as it wrote it (most lines) is known by
    how it opens, without trying every envelope; an indent before it is taken off (``INDENT``)."""
    raw = unweb(raw)
    if (raw[:1] == "(" or _BARE_HEAD.match(raw)) and "\x1b" not in raw and "^[" not in raw and "\r" not in raw and (
            "#033[" not in raw):
        return raw.rstrip("\n"), None, None
    return _envelopes(raw)


def _strip_envelopes(raw: str) -> tuple[str, str | None, int | None]:
    """What ``_strip`` gives, trying every envelope (the cheap tests of ``_strip`` must agree with it)."""
    return _envelopes(unweb(raw))


def _envelopes(raw: str) -> tuple[str, str | None, int | None]:
    """``_strip_envelopes`` of a line ``unweb`` has already been through."""
    iso, year0 = None, None
    if raw[:1] == ">":
        raw = raw[QUOTE.match(raw).end():]  # type: ignore[union-attr]  # (a '>' opens QUOTE's match)
    if raw[:1] in " \t" or raw[:1].isdigit() or raw[:1].isalpha():
        m = NUMBERED.match(raw)
        if m:
            raw = raw[m.end():]
    if raw[:1] in " \t":
        m = INDENT.match(raw)
        if m:
            raw = raw[m.end():]
    if raw.startswith("{"):  # (vLLM's own JSON records name none of the shippers' keys: read below)
        doc = _shipped(raw)
        if doc is not None:
            raw, iso, year0 = doc
    if OTEL_JSON.match(raw):
        rec = _otel(raw)
        if rec is not None:
            raw, iso = rec
    s = ANSI.sub("", raw).replace("\r", "").rstrip("\n")
    if s[:1] == "[" and BARE_SGR_HEAD.match(s):  # (after the codes with their ESC: '\x1b[0m' holds one)
        s = _BARE_SGR.sub("", s)
    m = STERN.match(s) if s[:1].islower() or s[:1].isdigit() else None
    if m:
        s = s[m.end():]
    m = SLURM.match(s)
    if m:
        s = s[m.end():]
    m = SYSLOG_BSD.match(s)
    if m:  # (its time has neither year nor zone: vLLM's own time, which follows, is used)
        s = s[m.end():]
    for _ in range(2):
        m = COMPOSE.match(s)
        if m:
            s = s[m.end():]
        m = KUBECTL.match(s)
        if m:
            s = s[m.end():]
        m = CONTAINER_TS.match(s)
        if m:
            iso = m.group(1)
            s = s[m.end():]
            m = AFTER_TS.match(s)
            if m:
                s = s[m.end():]
    year = year0
    if iso and s[:1] in "[(-|:":
        m = TAGS_BEFORE_HEAD.match(s)
        if m:
            s = s[m.end():]
    elif s[:4].isdigit() or s.startswith(CLOUD_SEVERITIES) and s[s.find(" ") + 1:][:4].isdigit():
        m = SHIPPED.match(s)
        if m:
            s = s[m.end():]
            if m["szone"]:
                iso = f"{m['sdate']}T{m['stime']}{'.' + m['sfrac'] if m['sfrac'] else ''}{m['szone']}"
            else:
                year = int(m["sdate"][:4])
    return s, iso, year


def split_line(no: int, raw: str) -> list[_Line]:
    """One physical line -> its logical lines (glued lines split, prefixes and colours stripped)."""
    out: list[_Line] = []
    s0, iso, year = _strip(raw)
    ray = RAY_REPEATED.search(s0) if RAY_FOLD_MARK in s0 else None
    if ray:
        s0 = s0[:ray.start()]
    parts = GLUE.split(s0) if len(s0) > 60 and _glued(s0) else [s0]
    for part in parts:
        s, iso2, year2 = _strip(part)
        rank = "main"
        m = PROC.match(s) or RAY_COMPONENT.match(s)
        if m:
            rank = m.group("proc") or m.group("bproc")
            s = s[m.end():]
            inner = PROC.match(s)  # (a line another process relayed: '(EngineCore pid=1) (RayWorkerWrapper
            if inner:  # pid=2, ip=…) INFO …' is the Ray worker's, which wrote it)
                rank = inner.group("proc") or inner.group("bproc")
                s = s[inner.end():]
        ts = None
        prefixed = False
        fileline = ""
        m2 = LEVEL_TS.match(s)
        if m2:
            ts = f"{m2.group('md')} {m2.group('hms')}"
            if m2.group("file1") or m2.group("file2"):
                fileline = (f"[{m2.group('file1')}:{m2.group('line1')}] " if m2.group("file1")  # (as written: the
                            else f"{m2.group('file2')}:{m2.group('line2')}] ")  # brackets tell versions apart)
            s = s[m2.end():]
            prefixed = True
        elif UVICORN.match(s):
            prefixed = True
        if ts is None and not (iso2 or iso):
            # a time without a zone in front and no head of vLLM's own after it: the logging format of a
            # framework that runs vLLM inside it ('2025-08-11 16:12:02 gpu_worker.py:104 INFO:vllm… p:… t:…:
            # …', an RL trainer): that time is the line's, local as vLLM's own are
            mn = NAIVE_TIME.match(raw)
            if mn:
                ts, prefixed = f"{mn.group('md')} {mn.group('hms')}", True
        if prefixed and s[-1:] in (" ", "\t"):  # (a paste padded to a width: 'Added request x.      ' is that request)
            s = s.rstrip(" \t")
        out.append(_Line(no, s, rank, ts, iso2 or iso, prefixed or bool(m), fileline, year=year2 or year, width=len(raw)))
    if ray:
        out[-1].repeated = int(ray.group(1))
    return out


def split_logical(lines: Iterable[str]) -> Iterator[_Line]:
    """Physical lines -> logical lines (glued lines split, prefixes and colours stripped)."""
    for no, raw in enumerate(lines, start=1):
        yield from split_line(no, raw)


# Ray's memory monitor, when the node's host memory passes its threshold (a vLLM worker actor is the usual one
# it kills): 'Memory on the node (IP: 10.0.0.1, ID: …) where the task (actor ID: …, name=RayWorkerVllm.__init__,
# pid=308, memory used=11.15GB) was running was 12.49GB / 13.15GB (0.950003), which exceeds the memory usage
# threshold of 0.95. Ray killed this worker …'; and the raylet's summary: '1 Workers (tasks / actors) killed due
# to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: …, IP: 10.95.143.76)'
# (the task's part, and the node's IP and ID, are left out by some versions; 'task', 'actor' or 'lease' ID)
R_RAY_OOM = re.compile(r"Memory on the node (?:\(IP: (?P<ip>[\w.:-]+)(?:, ID: \w+)?\) )?(?:where the (?:task|lease) "
                       r"(?:\((?:(?:task|actor|lease) ID: \w+, )?name=(?P<name>[^,]+), pid=(?P<pid>\d+), memory used="
                       r"(?P<used>[\d.]+ ?[KMGT]i?B)\) )?was running )?was (?P<node_used>[\d.]+ ?[KMGT]i?B) / "
                       r"(?P<node_total>[\d.]+ ?[KMGT]i?B) \((?P<frac>[\d.]+)\),\s+which exceeds the memory usage threshold of "
                       r"(?P<threshold>\d+(?:\.\d+)?)")
R_RAY_OOM_SUMMARY = re.compile(r"(?P<n>\d+) Workers \(tasks / actors\) killed due to memory pressure \(OOM\)"
                               r"(?:.*?at node \(ID: \w+, IP: (?P<ip>[\w.:-]+)\))?")
RAY_OOM_MEANING = ("Ray's memory monitor killed the worker because the node's host memory (its RAM) passed Ray's "
                   "threshold: not the GPU's memory; a CUDA OOM never shows up here")


def _ray_oom(text: str) -> dict[str, Any] | None:
    """What Ray's memory monitor says of a worker it killed for the node's host memory (``R_RAY_OOM``)."""
    m = R_RAY_OOM.search(text)
    if m:
        # (Ray's 'GB' is kept as written: whether it counts 10^9 or 2^30 bytes is not stated; the fraction is)
        return {"killer": "ray", "node_ip": m["ip"], "process": m["name"], "pid": int(m["pid"]) if m["pid"] else None,
                "used": m["used"], "node_used": m["node_used"], "node_total": m["node_total"],
                "node_used_fraction": float(m["frac"]), "threshold": float(m["threshold"]),
                "text": text.strip()[:300], "meaning": RAY_OOM_MEANING}
    m = R_RAY_OOM_SUMMARY.search(text)
    if m and int(m["n"]) > 0:
        return {"killer": "ray", "node_ip": m["ip"], "workers_killed": int(m["n"]), "text": text.strip()[:300],
                "meaning": RAY_OOM_MEANING}
    return None


_NO_FIGURES = dict.fromkeys(("tried_to_allocate_bytes", "gpu_total_bytes", "free_bytes", "process_in_use_bytes",
                              "allocated_by_pytorch_bytes", "reserved_unallocated_bytes"))


def _warmup(m: re.Match[str]) -> dict[str, Any]:
    """What vLLM's start-up warm-up OOM says (``R_WARMUP``): what it warmed up, and with how many dummy
    requests (``max_num_seqs``, what vLLM advises lowering)."""
    return {"warmup": m.group(1), "warmup_task": m.group(2), "dummy_requests": int(m.group(3).replace(",", ""))}


# torch's OOM messages with every white space out: a message re-wrapped by hand at word boundaries, each
# break taken for a terminal's cut inside a word ('… and 1.00 GiB' then 'is reserved …'), or a space lost in a
# paste, still reads (no figure of them is ambiguous without spaces: each number is followed by its unit)
R_PROC_HAS_SQUASHED = re.compile(R_PROC_HAS.pattern.replace(" ", ""))
R_OOM_MODERN_SQUASHED = re.compile(R_OOM_MODERN.pattern.replace(" ", ""))
R_OOM_OLD_SQUASHED = re.compile(R_OOM_OLD.pattern.replace(" ", ""))


def _oom(text: str) -> dict[str, Any] | None:
    o = _oom_of(text, R_OOM_MODERN, R_OOM_OLD, R_PROC_HAS)
    if o is None and "allocate" in text:
        o = _oom_of(re.sub(r"\s+", "", text), R_OOM_MODERN_SQUASHED, R_OOM_OLD_SQUASHED, R_PROC_HAS_SQUASHED)
    return o


def _oom_of(text: str, modern: re.Pattern[str], old: re.Pattern[str], proc_has: re.Pattern[str]) -> dict[str, Any] | None:
    m = modern.search(text)
    if m:
        procs = [{"pid": int(p), "used_bytes": _size(s)} for p, s in proc_has.findall(m.group(0))]
        return {
            "generation": "torch>=2.2" if "capacity" in text else "torch-2.1",
            "gpu": gpu_index(m.group("gpu")),
            "tried_to_allocate_bytes": _size(m.group("tried")),
            "gpu_total_bytes": _size(m.group("total")),
            "free_bytes": _size(m.group("free")),
            "process_in_use_bytes": _size(m.group("this")) if m.group("this") else None,
            "allocated_by_pytorch_bytes": _size(m.group("alloc")),
            "private_pools_bytes": _size(m.group("private")) if m.group("private") else None,
            "reserved_unallocated_bytes": _size(m.group("resv")),
            "other_processes": procs,
        }
    m = old.search(text)
    if m:
        alloc = _size(m.group("alloc"))
        resv = _size(m.group("resv_total"))
        return {
            "generation": "torch<=2.0",
            "gpu": gpu_index(m.group("gpu")),
            "tried_to_allocate_bytes": _size(m.group("tried")),
            "gpu_total_bytes": _size(m.group("total")),
            "free_bytes": _size(m.group("free")),
            "process_in_use_bytes": None,
            "allocated_by_pytorch_bytes": alloc,
            "private_pools_bytes": None,
            "reserved_unallocated_bytes": (resv - alloc) if resv is not None and alloc is not None else None,
            "reserved_total_bytes": resv,
            "other_processes": [],
        }
    return None


def request_details(text: str) -> dict[str, Any]:
    """What a 'Received request' / 'Request … details' line says about the request's memory shape:
    sampling parameters, prompt length in tokens, the prompt as logged (``prompt``; the recorder
    keeps only its length and hash unless --keep-prompts), the images its placeholders hold (``mm_items``)
    and the tokens they took where the ids show them (``image_tokens``)."""
    out: dict[str, Any] = {}
    params = text[text.rfind("params: "):] if "params: " in text else text  # after the prompt
    for k, rx in R_PARAM.items():
        m = rx.search(params)
        if m:
            out[k] = None if m.group(1) == "None" else int(m.group(1))
    m = R_TOKEN_IDS.search(text)
    ids = None
    if m:
        ids = m.group(1).strip()
        out["input_tokens"] = (ids.count(",") + 1 if ids else 0) if m.group(2) == "]" else None
        out["input_tokens_truncated"] = m.group(2) != "]"
        ids = ids if m.group(2) == "]" else None
    m = R_PROMPT.search(text)
    if m and m.group(1) != "None":
        out["prompt"] = m.group(1)
        out["mm_items"] = len(R_IMAGE.findall(m.group(1))) or None  # (images its placeholders say; None: none seen)
        if out["mm_items"] and ids is not None:
            out["image_tokens"] = image_tokens(ids, out["mm_items"])
    return out


def extract(text: str) -> list[tuple[str, dict[str, Any]]]:
    """All facts in one logical message."""
    out: list[tuple[str, dict[str, Any]]] = []
    m: re.Match[str] | None
    if "KV cache usage" in text and "reqs" in text:
        m = R_STATS_V0.search(text)
        if m:
            out.append(("stats", {"engine": "v0", "running": int(m.group(1)), "swapped": int(m.group(2)),
                                  "waiting": int(m.group(3)), "kv_usage_pct": _f(m.group(4)),
                                  "cpu_kv_usage_pct": _f(m.group(5))}))
        else:
            m = R_STATS_V1.search(text)
            if m:
                dp = R_DP.match(text)
                out.append(("stats", {"engine": "v1", "running": int(m.group(1)), "waiting": int(m.group(2)),
                                      "preemptions": int(m.group(3)) if m.group(3) else None,
                                      "kv_usage_pct": _f(m.group(4)), "dp": dp.group(1) if dp else None}))
        if out:
            t = R_THROUGHPUT.search(text)
            if t:
                out[-1][1].update(prompt_tps=_f(t.group(1)), gen_tps=_f(t.group(2)))
            for key, rx in (("prefix_cache_hit_pct", R_PREFIX_HIT), ("mm_cache_hit_pct", R_MM_HIT)):
                h = rx.search(text)
                if h:
                    out[-1][1][key] = _f(h.group(1))
            return out
    if "blocks:" in text:
        m = R_BLOCKS.search(text)
        if m:
            out.append(("kv_blocks", {"gpu_blocks": int(_f(m.group(1))),
                                      "cpu_blocks": int(_f(m.group(2))) if m.group(2) else None}))
    if "Memory profiling results" in text:
        m = R_PROFILE_V0_064.search(text)
        if m:
            v = [_f(m.group(i)) for i in range(1, 8)]
            out.append(("memory_profile", {"total_gpu_gib": v[0], "initial_gib": v[1], "peak_torch_gib": v[2],
                                           "post_profile_gib": v[3], "non_torch_gib": v[4], "kv_cache_gib": v[5],
                                           "gpu_memory_utilization": v[6]}))
    if "gpu_memory_utilization (" in text:
        m = R_BUDGET.search(text)
        if m:
            out.append(("memory_budget", {"total_gpu_gib": _f(m.group(1)), "gpu_memory_utilization": _f(m.group(2)),
                                          "budget_gib": _f(m.group(3))}))
    if "Requested memory:" in text:
        m = R_REQUESTED.search(text)
        if m:
            out.append(("memory_budget", {"initial_free_gib": _f(m.group(1)), "gpu_memory_utilization": _f(m.group(2)),
                                          "budget_gib": _f(m.group(3))}))
    if "non KV cache memory" in text:
        m = R_V1_PROFILE.search(text)
        if m:
            out.append(("memory_profile", {"non_kv_gib": _f(m.group(1)), "activation_peak_gib": _f(m.group(2)),
                                           "non_torch_gib": _f(m.group(3)), "weights_gib": _f(m.group(4))}))
    if "model weights take" in text:
        m = R_PARTS.search(text)
        if m:
            out.append(("memory_profile", {"weights_gib": _f(m.group(1)), "non_torch_gib": _f(m.group(2)),
                                           "activation_peak_gib": _f(m.group(3)), "kv_cache_gib": _f(m.group(4))}))
    if "took" in text:
        m = R_WEIGHTS.search(text)
        if m:
            # (vLLM divides by 2**30 in every version; 'GB' up to 0.8 is a misnomer for GiB)
            out.append(("weights", {"weights_gib": _f(m.group(1)), "unit_logged": m.group(2)}))
        m = R_GRAPH.search(text)
        if m:
            out.append(("cuda_graph", {"secs": _f(m.group(1)), "cuda_graph_gib": _f(m.group(2)) if m.group(2) else None}))
    if "KV cache" in text or "KV Cache" in text:  # (kv_cache_memory_bytes's line says 'KV Cache')
        for rx, kind, key in ((R_AVAIL_KV, "kv_memory", "kv_cache_gib"), (R_CPU_KV_SET, "kv_memory", "kv_cache_gib"),
                              (R_KV_BYTES, "kv_memory", "kv_cache_gib")):
            m = rx.search(text)
            if m:
                out.append((kind, {key: _f(m.group(1))}))
        # (looked for only where its words are: its lazy device name ran from every word of a line, 120 µs
        # on a preemption warning, which names the KV cache twice)
        m = R_KV_TOKENS.search(text) if "KV cache size: " in text else None
        if m:
            out.append(("kv_tokens", {"device": m.group(1).strip(), "kv_cache_tokens": int(_f(m.group(2)))}))
        m = R_MAXLEN_ERR.search(text)
        if m:
            out.append(("vllm_memory_error", {"error": "max_model_len exceeds KV capacity",
                                              "max_model_len": int(_f(m.group(1))), "kv_tokens": int(_f(m.group(2)))}))
    if "Maximum concurrency" in text:
        m = R_MAXCONC.search(text)
        if m:
            out.append(("max_concurrency", {"tokens_per_request": int(_f(m.group(1))), "concurrency_x": _f(m.group(2))}))
    if "CUDA graph memory profiling" in text:  # (0.18-0.19 opt-in, on by default from 0.20: vLLM says which)
        on = "memory profiling is enabled" in text
        if on or "memory profiling is disabled" in text or "will be enabled by default" in text:
            out.append(("cudagraph_profiling", {"enabled": on}))
    if "Estimated CUDA graph memory" in text:
        m = R_GRAPH_EST.search(text)
        if m:
            out.append(("cuda_graph_estimate", {"cuda_graph_gib": _f(m.group(1))}))
    if "Free memory on device" in text:
        m = R_FREE_MEM.search(text)
        if m:
            data: dict[str, Any] = {"free_gib": _f(m.group(1)), "total_gib": _f(m.group(2)),
                                    "gpu_memory_utilization": _f(m.group(3)) if m.group(3) else None,
                                    "budget_gib": _f(m.group(4)) if m.group(4) else None}
            a = R_ACTUAL.search(text)
            if a:  # (0.29+ logs weights and non-torch memory as one sum: each alone is unknown there)
                both = a.group(2).startswith("consumed")
                data.update(weights_gib=None if both else _f(a.group(1)), consumed_gib=_f(a.group(1)) if both else None,
                            activation_peak_gib=_f(a.group(3)), non_torch_gib=_f(a.group(4)) if a.group(4) else None,
                            cuda_graph_gib=_f(a.group(5)))
            k = R_KV_IN_USE.search(text)
            if k:
                data["kv_cache_gib"] = _f(k.group(1))
            g = R_SUGGEST.search(text)
            if g:  # vLLM's own advice: the KV budget that fits the requested utilization, and the one that fills the GPU
                data.update(kv_cache_memory_fit_bytes=int(g.group(1)), kv_cache_memory_full_bytes=int(g.group(2)))
            out.append(("startup_free", data))
    if "CUDA graph pool memory" in text:
        m = R_GRAPH_POOL.search(text)
        if m:
            out.append(("cuda_graph", {"secs": None, "cuda_graph_gib": _f(m.group(1)), "estimated_gib": _f(m.group(2))}))
    if "num_gpu_blocks is" in text:
        m = R_NUM_BLOCKS.search(text)
        if m:
            out.append(("kv_blocks", {"gpu_blocks": int(_f(m.group(1))), "cpu_blocks": None}))
    if "on startup is less than" in text:
        m = R_FREE_SHORT.search(text)
        if m:
            out.append(("vllm_memory_error", {"error": text.strip()[:300], "free_gib": _f(m.group(1)),
                                              "total_gib": _f(m.group(2)), "gpu_memory_utilization": _f(m.group(3)),
                                              "budget_gib": _f(m.group(4))}))
    if "Error in memory profiling" in text:
        m = R_PROFILE_ERR.search(text)
        if m:
            out.append(("vllm_memory_error", {"error": text.strip()[:300], "initial_free_gib": _f(m.group(1)),
                                              "current_free_gib": _f(m.group(2))}))
    if R_NO_CACHE.search(text) or R_INSUFF_KV.search(text):
        m = R_KV_NEEDED.search(text)
        out.append(("vllm_memory_error", {"error": text.strip()[:300], **({
            "max_model_len": int(_f(m.group(1))), "kv_needed_gib": _f(m.group(2)), "kv_available_gib": _f(m.group(3)),
            "estimated_max_model_len": int(_f(m.group(4))) if m.group(4) else None} if m else {})}))
    if "preempted" in text:
        m = R_PREEMPT.search(text)
        if m:
            out.append(("preemption", {"seq_group": m.group(1), "mode": m.group(2), "cumulative": int(m.group(3))}))
    if "equest" in text:
        m = R_RECEIVED.search(text) or R_DETAILS.search(text)
        if m and m.start() < 40:  # the request line itself: its prompt text must not trigger other facts
            return [("request_received", {"request_id": m.group(1), **request_details(text[m.end():])})]
        for rx, kind in ((R_ADDED, "request_added"), (R_FINISHED, "request_finished"), (R_ABORTED, "request_aborted")):
            m = rx.search(text)
            if m:
                out.append((kind, {"request_id": m.group(1)}))
                break
    if "memory usage threshold" in text or "killed due to memory pressure" in text:
        ray = _ray_oom(text)
        if ray:  # (Ray's own 'OutOfMemoryError' is the node's RAM: no CUDA OOM is read from it)
            return [*out, ("host_oom_killed", ray)]
    if "memory" in text.lower() and R_OOM_ANY.search(text) or "_ALLOC_FAILED" in text and R_LIB_ALLOC.search(text):
        o = _oom(text)
        w = R_WARMUP.search(text) if o is None and "warming up" in text else None
        if o:
            out.append(("oom", o))
        elif w:
            out.append(("oom", {"generation": "vllm-warmup", "message": text.strip()[:300], **_NO_FIGURES,
                                **_warmup(w)}))
        elif (R_OOM_BARE.search(text) or R_LIB_ALLOC.search(text)) and not text.lstrip().startswith(("File ", "raise ")):
            out.append(("oom", {"generation": "unparsed", "message": text.strip()[:300], **_NO_FIGURES}))
    if "error: " in text and ("CUDA error" in text or "HIP error" in text):
        m = R_CUDA_ERROR.search(text)
        if m and not text.lstrip().startswith(("File ", "raise ")):
            out.append(("cuda_error", {"error": m.group(1), "message": text.strip()[:300]}))
    # (each rank says it twice: the second time after 'watchdog thread terminated with exception: ')
    if "Watchdog caught collective" in text and not -1 < text.find("terminated with exception") < text.find("Watchdog caught"):
        m = R_NCCL_TIMEOUT.search(text)
        if m:
            out.append(("collective_timeout", {"nccl_rank": int(m.group(1)) if m.group(1) else None,
                                               "seq": int(m.group(2)), "op": m.group(3), "ran_ms": int(m.group(4))}))
    if "Dumping " in text:
        out += _dump(text)
    if "Sleep mode freed" in text:
        m = R_SLEEP.search(text)
        if m:
            out.append(("sleep_mode", {"freed_gib": _f(m.group(1)), "still_in_use_gib": _f(m.group(2))}))
    m = R_DEATH.search(text)
    if m:
        out.append(("engine_death", {"message": m.group(1)}))
    if "args: Namespace(" in text or "non-default args: " in text or "with config: " in text and R_CONFIG.search(text):
        settings = _config_settings(text)
        if settings:  # (the recorder adds where: it knows the file)
            out.append(("engine_config", {"settings": [{"name": name, "value": copy.deepcopy(value), "scope": scope,
                                                        "form": form} for name, value, scope, form in settings]}))
    m = R_START.search(text)
    if m:
        out.append(("engine_start", {"marker": m.group(1)}))
    m = R_STOP.search(text)
    if m:
        out.append(("engine_stop", {"marker": m.group(1)}))
    return out


@functools.lru_cache(maxsize=64)
def _config_settings(text: str) -> tuple[tuple[str, Any, str, str], ...]:
    """The settings a configuration message states (name, value, scope, form), read once a text: an
    engine that restarts states the same ones again (a day's log of restarts: 0.6 s a GiB read over)."""
    return tuple((s.name, s.value, s.scope, s.form) for s in from_log_message(text, ""))


def _dump(text: str) -> list[tuple[str, dict[str, Any]]]:
    """What V1 said of its scheduler when the engine failed: how many requests ran and waited and how
    full it believed its KV cache (``scheduler_at_crash``), and the batch it was executing: tokens,
    requests, new requests and the longest new prompt, with the ids (``batch_at_crash``). No prompt
    or token id is kept."""
    def field(k: str, of: str) -> float | None:
        m = R_DUMP_FIELD[k].search(of)
        try:
            return float(m.group(1)) if m else None
        except ValueError:
            return None
    m = R_DUMP_STATS.search(text)
    if m:
        body = text[m.end():]
        running, waiting, kv = (field(k, body) for k in ("num_running_reqs", "num_waiting_reqs", "kv_cache_usage"))
        return [("scheduler_at_crash", {"running": None if running is None else int(running),
                                        "waiting": None if waiting is None else int(waiting),
                                        "kv_usage_pct": None if kv is None else round(kv * 100, 4)})]
    m = R_DUMP_BATCH.search(text)
    if m:
        body = text[m.end():]
        ids: list[str] = []
        per: list[int] = []
        sched = R_DUMP_SCHEDULED.search(body)
        for item in (sched.group(1).split(", ") if sched and sched.group(1).strip() else []):
            rid, _, n = item.rpartition(": ")
            if rid and n.strip().isdigit():
                ids.append(rid.strip().strip("'\""))  # (older builds print the dict with quoted ids)
                per.append(int(n))
        total = field("total_num_scheduled_tokens", body)
        prompts = [int(x) for x in R_DUMP_PROMPT_LEN.findall(body)]
        return [("batch_at_crash", {"scheduled_tokens": int(total) if total is not None else (sum(per) if per else None),
                                    "requests": len(ids) if sched else None,
                                    "new_requests": body.count("NewRequestData("),
                                    "largest_request_tokens": max(per) if per else None,
                                    "longest_new_prompt_tokens": max(prompts) if prompts else None,
                                    "request_ids": ids[:50]})]
    return []


WRAP_MIN_WIDTH = 70  # narrower lines were not wrapped by a terminal


def _cut_mid_word(before: str, after: str, width: int) -> bool:
    """Whether a line of ``width`` characters ending in ``before`` and the line ``after`` it are one
    line that a terminal or a copy-paste cut at its width, inside a word or number ('… KV cach' then
    'e is needed'): they are joined without the space that joins other continuation lines."""
    if width < WRAP_MIN_WIDTH or not after[:1].isascii():
        return False
    if before[-1:].isspace():  # (cut after a space: it is still there)
        return True
    in_number = before[-1:] in (".", ",") and before[-2:-1].isdigit() and after[:1].isdigit()  # ('4.' then '26 GiB')
    return in_number or (before[-1:].isalnum() and (after[:1].islower() or after[:1].isdigit()))


class LogParser:
    """The line-by-line parser, fed one physical line at a time (``feed``), so that a caller that
    handles some lines itself (the vectorised fast lane) can interleave: ``barrier`` closes the open
    message where such a line stood, and ``observe`` lets that line count for version inference."""

    def __init__(self, *, defer_repeats: bool = False) -> None:
        # defer_repeats: leave stats and request repeats to the caller, who sees all facts at once
        self.defer_repeats = defer_repeats
        self.logged_first = False  # (see ``_when``)
        self.res = LogParse()
        self._seen: set[tuple[str, str | None, str]] = set()
        self._open: _Line | None = None
        # the open message's continuation lines: line number, whether it was counted there, text, what
        # joins it to the text before it, and the width of its physical line
        self._cont: list[tuple[int, bool, str, str, int]] = []
        self._lo, self._hi = "0.0.0", "99.0.0"
        self._clues = catalogue.load().clues()
        self._v1 = self._v0 = 0
        self._counted: deque[int] = deque(maxlen=4)  # physical lines lately counted (glued parts share one)
        # each rank's CUDA OOMs since the engine last started, by their figures: vLLM states one OOM more
        # than once (V0's engine logs it, then the API server quotes it in MQEngineDeadError)
        self._ooms: dict[tuple[str, tuple[Any, ...]], LogFact] = {}
        self._last_timed: tuple[int, str] | None = None
        self._stopping = False  # told to stop since the engine last started
        self._crashed = False  # a death, OOM or CUDA error since the engine last started

    def _first(self, no: int) -> bool:
        """Whether physical line ``no`` is not yet counted as parsed: the counts are of the file's lines,
        so a line that held two glued messages counts once."""
        if no in self._counted:
            return False
        self._counted.append(no)
        return True

    def _flush(self) -> None:
        msg, res = self._open, self.res
        if msg is None:
            return
        text = msg.text + "".join(sep + t for _, _, t, sep, _ in self._cont) if self._cont else msg.text
        facts = extract(text)
        if not msg.prefixed and not facts:  # (its line counts as quarantined, though a message glued after
            # this text on it is still read: each line is counted once, by its first part)
            res.quarantine.append((msg.no, "not a vLLM log line and no known fact", msg.text))
            for no, counted, t, _, _ in self._cont:  # (its continuations are not vLLM's either)
                res.continuation_lines -= counted
                res.quarantine.append((no, f"not a vLLM log line and no known fact (follows line {msg.no})", t))
        elif msg.counted:
            res.lines_parsed += 1
        for kind, data in facts:
            if msg.repeated:  # (the folded lines' own numbers are lost: Ray masked them)
                data["repeated"] = msg.repeated
            key = (msg.rank, msg.ts or msg.iso, kind + ":" + text)
            deferred = self.defer_repeats and (kind == "stats" or kind.startswith("request_"))
            if not deferred:
                if key in self._seen and kind != "stats" or (kind == "stats" and key in self._seen and msg.ts):
                    res.duplicates += 1
                    continue
                self._seen.add(key)
            if kind == "engine_start":
                self._ooms.clear()
                self._stopping = self._crashed = False
            elif kind == "engine_stop":
                if self._stopping or self._crashed:  # (one stop, however many lines say so; none after a crash)
                    continue
                self._stopping = True
            elif kind == "engine_death" and self._stopping:
                kind = "engine_shutdown"  # (the engine going as the server was told to stop: no crash)
            elif kind == "oom" and self._restated(msg, data):
                continue
            if kind in ("engine_death", "oom", "cuda_error"):
                self._crashed = True
            res.facts.append(LogFact(kind, data, msg.no, msg.rank, self._when(msg), text[:2000],
                                     msg.ts or msg.iso, msg.ts is not None))
            if kind == "oom" and data.get("free_bytes") is not None:
                self._ooms[(msg.rank, _oom_figures(data))] = res.facts[-1]
        self._open, self._cont = None, []

    def _restated(self, msg: _Line, data: dict[str, Any]) -> bool:
        """Whether this OOM is one the same rank stated already (every figure alike, within
        OOM_RESTATED_S of it, the engine not started again since): it is then one OOM, and the first
        statement's fact lists this line under ``restated_lines``."""
        if data.get("warmup"):  # (vLLM's statement of the torch OOM it was raised from: that one's phase)
            first = max((f for (rank, _), f in self._ooms.items() if rank == msg.rank), key=lambda f: f.line, default=None)
            if first is None or first.data.get("warmup"):
                return False
            a, b = _seconds(first.ts), _seconds(self._when(msg))
            if a is not None and b is not None and not 0 <= b - a <= OOM_RESTATED_S:
                return False
            first.data.update({k: data[k] for k in ("warmup", "warmup_task", "dummy_requests")})
            first.data.setdefault("restated_lines", []).append(msg.no)
            return True
        if data.get("free_bytes") is None:
            return False
        first = self._ooms.get((msg.rank, _oom_figures(data)))
        if first is None:
            return False
        a, b = _seconds(first.ts), _seconds(self._when(msg))
        if a is None or b is None or not 0 <= b - a <= OOM_RESTATED_S:
            return False
        first.data.setdefault("restated_lines", []).append(msg.no)
        return True

    def head(self, lines: list[str]) -> None:
        """Read the log's first lines (``dump_head``) for how its times are to be taken, before any line."""
        self.res.envelope_dump = envelope_dump(lines)
        self.logged_first = self.res.envelope_dump is not None

    def _when(self, ln: _Line) -> str | None:
        """A line's time as its facts take it: the envelope's exact one, unless the envelopes were put on
        when the log was copied out (``logged_first``: vLLM's own then, and none where it states none)."""
        return ln.ts if self.logged_first else (ln.iso or ln.ts)

    def barrier(self) -> None:
        self._flush()

    def observe(self, ln: _Line, weight: int = 1) -> None:
        """What a line says about the log as a whole: year, version, version range, engine."""
        res = self.res
        if res.container_year is None and (ln.iso or ln.year):
            res.container_year = int(ln.iso[:4]) if ln.iso else ln.year
        for rx in R_VERSION:
            if res.version is None and (ln.prefixed or "version" in ln.text):
                mv = rx.search(ln.text)
                if mv:
                    res.version = mv.group(1)
        full = ln.text
        tagged = f"({ln.rank}) {ln.fileline}{full}"
        for fp, a, b in FINGERPRINTS:
            if fp.search(tagged):
                self._lo = max(self._lo, a, key=version_key)
                self._hi = min(self._hi, b, key=version_key)
        self._clues.see(tagged)
        said = f"{ln.fileline}{full}"  # (the call site is a marker too: 'gpu_model_runner.py:848] ' is V1's)
        if V1_MARKERS.search(said) or ln.rank.startswith(("EngineCore", "VllmWorker rank", "Worker", "APIServer")):
            self._v1 += weight
        if V0_MARKERS.search(said) or ln.rank.startswith("VllmWorkerProcess"):
            self._v0 += weight

    def feed(self, no: int, raw: str) -> None:
        for ln in split_line(no, raw):
            self._line(ln)

    def _line(self, ln: _Line) -> None:
        res = self.res
        res.lines_read = max(res.lines_read, ln.no)
        t = self._when(ln)
        if t:
            if self._last_timed is None:
                res.timed_ends.append((ln.no, t))
            self._last_timed = (ln.no, t)
        res.ray_folded += ln.repeated
        if not ln.text.strip() and not ln.prefixed:  # a blank line (a prefixed empty message is a message)
            if self._open is None:
                res.lines_parsed += self._first(ln.no)
            else:  # (inside a message: a traceback's or a wrapped message's blank line)
                res.continuation_lines += self._first(ln.no)
            return
        self.observe(ln)
        if ln.prefixed:
            self._flush()
            ln.counted = self._first(ln.no)
            self._open = ln
            return
        # un-prefixed: a continuation of the open message (wrapped line, traceback) unless it
        # stands on its own as a fact.
        alone = extract(ln.text)
        msg = self._open
        if msg is not None and (not alone or msg.prefixed and not extract(msg.text) and not ln.text.lstrip().startswith(
                ("torch.", "RuntimeError", "ValueError"))) and len(self._cont) < 200:
            counted = self._first(ln.no)
            before, width = (self._cont[-1][2], self._cont[-1][4]) if self._cont else (msg.text, msg.width)
            self._cont.append((ln.no, counted, ln.text.strip(), "" if _cut_mid_word(before, ln.text, width) else " ", ln.width))
            res.continuation_lines += counted
            return
        self._flush()
        ln.counted = self._first(ln.no)
        self._open = ln

    def finish(self) -> LogParse:
        self._flush()
        res = self.res
        if self._last_timed is not None:
            res.timed_ends.append(self._last_timed)
        said = self._clues.releases()
        if said == []:  # (messages of releases that never coexisted: no range, and the recorder says so)
            res.version_conflict = self._clues.conflict
        elif (self._lo, self._hi) != ("0.0.0", "99.0.0") or said:
            lo = max([self._lo, *(said or [])[:1]], key=version_key)
            hi = min([self._hi, *(said or [self._clues.newest])[-1:]], key=version_key)
            if version_key(lo) <= version_key(hi):
                res.version_range = (lo, hi)
            else:  # (formats of versions that never coexisted: no range, and the recorder says so)
                res.version_conflict = (lo, hi)
        if self._v1 or self._v0:
            res.engine = "v1" if self._v1 >= self._v0 else "v0"
        return res


OOM_RESTATED_S = 60  # how long after an OOM the same figures, from the same rank, are that OOM stated again
_OOM_FIGURES = ("gpu", "tried_to_allocate_bytes", "gpu_total_bytes", "free_bytes", "process_in_use_bytes",
                "allocated_by_pytorch_bytes", "private_pools_bytes", "reserved_unallocated_bytes")


def _oom_figures(data: dict[str, Any]) -> tuple[Any, ...]:
    return (*(data.get(k) for k in _OOM_FIGURES), tuple((p["pid"], p["used_bytes"]) for p in data.get("other_processes", [])))


def _seconds(ts: str | None) -> float | None:
    """A fact's time in seconds, to tell how far apart two facts of one log are: an ISO container time
    exactly, a logged 'MM-DD HH:MM:SS' within a year of its own (a leap one: its year is not known yet);
    None without one."""
    us = fact_time_us(ts, 2000)
    return None if us is None else us / 1e6


def physical_lines(text: str) -> list[str]:
    """A log's lines as editors and ``file:line`` references count them: split on LF only (a bare CR,
    as progress bars write, stays inside its line; ``str.splitlines`` would split there)."""
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def parse_log(lines: Iterable[str]) -> LogParse:
    """Parse a whole log given as physical lines (no line ending needed)."""
    lines = lines if isinstance(lines, list) else list(lines)
    p = LogParser()
    p.head(dump_head(lines))
    for no, raw in enumerate(lines, start=1):
        p.feed(no, raw)
    return p.finish()


_ISO = re.compile("^" + ISO_TIME + "$")


DUMP_SPREAD_S = 60  # how much longer vLLM's own times may run than the envelopes' before the envelopes are
# a copy's, not the lines' (a container runtime's time is the line's to within a second or two)
HALF_YEAR_US = 183 * 86_400 * 1_000_000
DUMP_HEAD_LINES = 5000  # the first lines that tell (a start-up: its model load alone runs minutes), within
DUMP_HEAD_CHARS = 1 << 20  # the file's first MiCharacters


def dump_head(lines: Iterable[str]) -> list[str]:
    """A log's first lines, as many as tell whether its envelopes' times are a copy's (``envelope_dump``)."""
    out: list[str] = []
    n = 0
    for ln in lines:
        n += len(ln) + 1
        if n > DUMP_HEAD_CHARS or len(out) >= DUMP_HEAD_LINES:
            break
        out.append(ln)
    return out


def envelope_dump(lines: Iterable[str]) -> tuple[float, float] | None:
    """Whether the ISO times in front of a log's lines are when it was copied out rather than when its
    lines were written: a CI job that prints a log file at its end (GitHub Actions stamps each line it
    prints), a shipper that stamps a batch at once. Their times then span far less than vLLM's own
    times on the same lines (minutes of start-up copied in a tenth of a second). (span of the
    envelopes' times, span of vLLM's own) in seconds, or None where the envelopes keep time with vLLM's."""
    iso_us: list[int] = []
    own_us: list[int] = []
    for no, raw in enumerate(lines, start=1):
        for ln in split_line(no, raw):
            if ln.iso and ln.ts:
                t = fact_time_us(ln.iso, 1970)
                own = fact_time_us(ln.ts, int(ln.iso[:4])) if t is not None else None
                if t is not None and own is not None and abs(own - t) > HALF_YEAR_US:  # (the year turned between)
                    own = fact_time_us(ln.ts, int(ln.iso[:4]) + (1 if t > own else -1))
                if t is not None and own is not None:
                    iso_us.append(t)
                    own_us.append(own)
    if len(iso_us) < 3:
        return None
    env_s, own_s = (max(iso_us) - min(iso_us)) / 1e6, (max(own_us) - min(own_us)) / 1e6
    return (env_s, own_s) if own_s - env_s > DUMP_SPREAD_S and env_s < own_s / 2 else None


def fact_time_us(ts: str | None, year: int, tz_offset_s: int = 0) -> int | None:
    """Epoch µs for a fact's timestamp: ISO container timestamps are exact; 'MM-DD HH:MM:SS' needs a year."""
    if ts is None:
        return None
    try:
        if "T" in ts:  # any number of fraction digits (Docker writes 9, some shippers 3), Z, +hh:mm or +hhmm
            m = _ISO.match(ts)
            if m is None:
                return None
            d = datetime.fromisoformat(m["dt"]).replace(tzinfo=timezone.utc)
            us = int((m["frac"] or "0")[:6].ljust(6, "0"))
            zone = m["zone"] or "Z"
            off_s = 0 if zone == "Z" else (-1 if zone[0] == "-" else 1) * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)
            return int(d.timestamp()) * 1_000_000 + us - off_s * 1_000_000
        d = datetime.strptime(f"{year}-{ts}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
        return int(d.timestamp() * 1_000_000) - tz_offset_s * 1_000_000
    except ValueError:
        return None
