"""The production vLLM engine configuration, read from every form it is stated in.

A server's arguments are stated by its log (0.6-0.8's ``args: Namespace(...)``, later servers'
``non-default args: {...}``, the engine's ``Initializing ... LLM engine (vX) with config: ...``), by
its ``/metrics`` (``vllm:cache_config_info``'s labels), and by the launch configuration a team keeps:
a ``vllm serve`` or ``python -m vllm.entrypoints...`` command (a script, a paste), ``docker run``, a
compose service, a Kubernetes manifest or ``kubectl describe pod``. Each statement is an ``ArgSetting``
under vLLM's own argument name, typed, with the ``file:line`` that stated it; ``EngineConfig`` holds
them and tells where two statements disagree. Pure Python: vLLM is not imported.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from replay.errors import EXIT_IO, ReplayError

if TYPE_CHECKING:
    from yaml import Node

Scope = Literal["engine", "server"]
Form = Literal["namespace", "non_default_args", "engine_config", "cache_config_info", "command_line",
               "compose", "kubernetes", "env"]
Kind = Literal["command", "compose", "kubernetes"]

# Arguments only the API server takes (the engine never sees them).
SERVER_ARGS = frozenset({
    "host", "port", "uds", "uvicorn_log_level", "disable_uvicorn_access_log", "allow_credentials",
    "allowed_origins", "allowed_methods", "allowed_headers", "api_key", "lora_modules", "prompt_adapters",
    "chat_template", "chat_template_content_format", "trust_request_chat_template", "default_chat_template_kwargs",
    "response_role", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "enable_ssl_refresh", "ssl_cert_reqs",
    "ssl_ciphers", "root_path", "middleware", "return_tokens_as_token_ids", "disable_frontend_multiprocessing",
    "enable_request_id_headers", "enable_auto_tool_choice", "exclude_tools_when_tool_choice_none",
    "tool_call_parser", "tool_parser_plugin", "tool_server", "served_model_name", "disable_log_requests",
    "enable_log_requests", "enable_log_outputs", "max_log_len", "disable_fastapi_docs",
    "enable_prompt_tokens_details", "enable_server_load_tracking", "enable_force_include_usage",
    "enable_tokenizer_info_endpoint", "reasoning_parser", "enable_reasoning", "log_config_file",
    "api_server_count", "config", "h11_max_incomplete_event_size", "h11_max_header_count", "log_error_stack",
    "enable_log_deltas", "tokens_only", "enable_offline_docs",
})
# Every argument a Namespace of 0.6-0.8 lists, and later ones: a flag cut by a terminal is joined
# only where the two halves make one of these names.
ENGINE_ARGS = frozenset({
    "model", "task", "runner", "convert", "tokenizer", "hf_config_path", "skip_tokenizer_init", "revision",
    "code_revision", "tokenizer_revision", "tokenizer_mode", "trust_remote_code", "allowed_local_media_path",
    "download_dir", "load_format", "config_format", "dtype", "kv_cache_dtype", "quantization_param_path",
    "max_model_len", "guided_decoding_backend", "logits_processor_pattern", "model_impl",
    "distributed_executor_backend", "worker_use_ray", "pipeline_parallel_size", "tensor_parallel_size",
    "data_parallel_size", "decode_context_parallel_size", "enable_expert_parallel", "max_parallel_loading_workers",
    "ray_workers_use_nsight", "block_size", "enable_prefix_caching", "disable_sliding_window",
    "use_v2_block_manager", "num_lookahead_slots", "seed", "swap_space", "cpu_offload_gb",
    "gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks_override", "max_num_batched_tokens",
    "max_num_partial_prefills", "max_long_partial_prefills", "long_prefill_token_threshold", "max_num_seqs",
    "max_logprobs", "disable_log_stats", "quantization", "rope_scaling", "rope_theta", "hf_overrides",
    "enforce_eager", "max_seq_len_to_capture", "disable_custom_all_reduce", "tokenizer_pool_size",
    "tokenizer_pool_type", "tokenizer_pool_extra_config", "limit_mm_per_prompt", "mm_processor_kwargs",
    "disable_mm_preprocessor_cache", "enable_lora", "enable_lora_bias", "max_loras", "max_lora_rank",
    "lora_extra_vocab_size", "lora_dtype", "long_lora_scaling_factors", "max_cpu_loras", "fully_sharded_loras",
    "enable_prompt_adapter", "max_prompt_adapters", "max_prompt_adapter_token", "device", "num_scheduler_steps",
    "use_tqdm_on_load", "multi_step_stream_outputs", "scheduler_delay_factor", "enable_chunked_prefill",
    "speculative_model", "speculative_config", "num_speculative_tokens", "model_loader_extra_config",
    "ignore_patterns", "preemption_mode", "qlora_adapter_name_or_path", "show_hidden_metrics_for_version",
    "otlp_traces_endpoint", "collect_detailed_traces", "disable_async_output_proc", "scheduling_policy",
    "scheduler_cls", "override_neuron_config", "override_pooler_config", "compilation_config",
    "kv_transfer_config", "kv_events_config", "worker_cls", "worker_extension_cls", "generation_config",
    "override_generation_config", "enable_sleep_mode", "calculate_kv_scales", "additional_config",
    "async_scheduling", "cuda_graph_sizes", "max_cudagraph_capture_size", "enable_eplb",
    "disable_hybrid_kv_cache_manager", "attention_backend", "mm_encoder_tp_mode", "structured_outputs_config",
    "prefix_caching_hash_algo", "kv_sharing_fast_prefill", "enable_dbo", "headless", "data_parallel_rank",
    "data_parallel_start_rank", "data_parallel_address", "data_parallel_rpc_port", "data_parallel_backend",
    "kv_offloading_size", "kv_offloading_backend",
})
# Flags that take no value (store_true, or a boolean the command may spell 'true'/'false')
BOOL_FLAGS = frozenset({
    "allow_credentials", "disable_uvicorn_access_log", "enable_ssl_refresh", "return_tokens_as_token_ids",
    "disable_frontend_multiprocessing", "enable_request_id_headers", "enable_auto_tool_choice",
    "skip_tokenizer_init", "trust_remote_code", "worker_use_ray", "enable_expert_parallel",
    "ray_workers_use_nsight", "enable_prefix_caching", "disable_sliding_window", "use_v2_block_manager",
    "disable_log_stats", "enforce_eager", "disable_custom_all_reduce", "disable_mm_preprocessor_cache",
    "enable_lora", "enable_lora_bias", "fully_sharded_loras", "enable_prompt_adapter", "use_tqdm_on_load",
    "multi_step_stream_outputs", "enable_chunked_prefill", "disable_async_output_proc", "enable_sleep_mode",
    "calculate_kv_scales", "enable_reasoning", "disable_log_requests", "enable_log_requests",
    "enable_log_outputs", "disable_fastapi_docs", "enable_prompt_tokens_details", "enable_server_load_tracking",
    "enable_force_include_usage", "async_scheduling", "enable_eplb", "disable_hybrid_kv_cache_manager",
    "kv_sharing_fast_prefill", "enable_dbo", "headless",
})
BOOL_PREFIXES = ("enable_", "disable_", "use_", "skip_", "trust_", "enforce_", "allow_", "fully_", "calculate_")
# Flags that take one value or more (nargs '+', or repeated): their value is a list, as vLLM parses it
LIST_FLAGS = frozenset({"served_model_name", "lora_modules", "prompt_adapters", "cuda_graph_sizes", "api_key",
                        "middleware", "ignore_patterns"})
SHORT_FLAGS = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size",
               "dcp": "decode_context_parallel_size", "q": "quantization", "O": "compilation_config"}
# (the CLI's plumbing in a Namespace: no setting of the server's)
NAMESPACE_PLUMBING = frozenset({"subparser", "dispatch_function"})
# The engine's config line names some settings otherwise than the argument that sets them.
CONFIG_NAMES = {"max_seq_len": "max_model_len", "chunked_prefill_enabled": "enable_chunked_prefill"}
CACHE_LABELS = {"cache_dtype": "kv_cache_dtype"}
# Human-readable integers vLLM takes for these ('10K' = 10,240; '25.6k' = 25,600)
READABLE_INTS = frozenset({"max_model_len", "max_num_batched_tokens"})
# Arguments whose value is text however it reads ('--revision 1234', '--served-model-name 7')
TEXT_ARGS = frozenset({"model", "tokenizer", "revision", "code_revision", "tokenizer_revision", "served_model_name",
                       "download_dir", "quantization", "dtype", "kv_cache_dtype", "load_format", "host", "api_key",
                       "chat_template", "root_path", "tool_call_parser", "reasoning_parser", "hf_config_path",
                       "lora_modules", "uds", "config"})
_READABLE = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG])$")
# Preference between forms where two state one argument: what was asked (a command, a manifest, the
# server's parsed arguments), then a metric's labels, then the engine's resolved config line.
_RANK: dict[str, int] = {"cache_config_info": 1, "engine_config": 2}
# Environment variables kept: those that bear on memory, devices and the engine; never a token or key
_ENV_KEEP = re.compile(r"^(?:VLLM_|CUDA_|PYTORCH_|TORCH|NCCL_|NVIDIA_|HIP_|ROCR_|HSA_|OMP_|MKL_|RAY_|GLOO_|UCX_|"
                       r"NIXL|LMCACHE_|HF_HUB_|TRANSFORMERS_|TOKENIZERS_|LD_PRELOAD$|MALLOC_)")
_ENV_SECRET = re.compile(r"TOKEN|KEY|SECRET|PASSW", re.I)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ash"})
WRAPPERS = frozenset({"sudo", "nohup", "exec", "env", "time", "nice", "command", "stdbuf", "numactl", "taskset"})
# what a logical line says to start the server (a prompt or a wrapper may stand in front of it)
_LAUNCH = re.compile(r"(?:^|[\s;&|(`'\"])(?:\S*/)?(?:vllm\s+serve\b|python[0-9.]*\s+(?:-\w+\s+)*-m\s+vllm\.entrypoints\.|"
                     r"(?:docker|podman|nerdctl)\s+run\b)")
_LOG_LINE = re.compile(r"\b(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d|\((?:APIServer|EngineCore\w*) pid=|"
                       r"Warning: |warnings\.warn\(")
_DOCKER_VALUE_OPTS = frozenset({
    "-e", "--env", "-v", "--volume", "-p", "--publish", "--name", "--gpus", "--runtime", "--ipc", "--shm-size",
    "--network", "--net", "--restart", "-w", "--workdir", "--entrypoint", "--device", "--cap-add", "--cap-drop",
    "--security-opt", "--group-add", "--env-file", "--mount", "-u", "--user", "--ulimit", "-m", "--memory",
    "--cpus", "--cpuset-cpus", "--cpuset-mems", "-l", "--label", "-h", "--hostname", "--add-host", "--platform",
    "--pull", "--log-driver", "--log-opt", "--health-cmd", "--pid", "--tmpfs", "--memory-swap", "--dns",
    "--expose", "--cidfile", "--stop-signal", "--stop-timeout", "--userns", "--uts", "--label-file",
})


@dataclass(frozen=True)
class ArgSetting:
    """One statement of one argument: vLLM's snake_case name, its typed value, where it was stated
    ('file:line'), in which form, and whether the engine or only the API server takes it."""

    name: str
    value: Any
    source: str
    form: Form
    scope: Scope


@dataclass
class EngineConfig:
    """Every statement of a server's arguments found in the evidence, and its environment
    (variable -> (value, 'file:line'))."""

    settings: list[ArgSetting] = field(default_factory=list)
    env: dict[str, tuple[str, str]] = field(default_factory=dict)

    def _chosen(self, scope: Scope) -> dict[str, Any]:
        best: dict[str, tuple[bool, int, int, Any]] = {}
        for i, s in enumerate(self.settings):
            if s.scope != scope:
                continue
            key = (s.value is None, _RANK.get(s.form, 0), i)
            if s.name not in best or key < best[s.name][:3]:
                best[s.name] = (*key, s.value)
        return {name: v for name, (*_, v) in best.items()}

    def engine_args(self) -> dict[str, Any]:
        """Engine argument -> value: what a command, manifest or the server's parsed arguments stated
        first, else a metric's label, else the engine's own config line; unset (None) only where no
        statement gives a value."""
        return self._chosen("engine")

    def server_args(self) -> dict[str, Any]:
        """The API server's own arguments, chosen as ``engine_args`` chooses."""
        return self._chosen("server")

    def sources(self) -> dict[str, list[str]]:
        """Argument -> every 'file:line' that states it, in order."""
        out: dict[str, list[str]] = {}
        for s in self.settings:
            seen = out.setdefault(s.name, [])
            if s.source not in seen:
                seen.append(s.source)
        return out

    def disagreements(self) -> list[str]:
        """One note per argument stated with two values or more ('max_model_len: 8192 at a.log:3 but
        4096 at deploy.yaml:20'). Unset (None) is no value; the engine's config line resolving an
        'auto' is no disagreement."""
        by_name: dict[str, list[ArgSetting]] = {}
        for s in self.settings:
            by_name.setdefault(s.name, []).append(s)
        notes = []
        for name, stated in by_name.items():
            resolved = any(s.form == "engine_config" for s in stated)
            values: list[tuple[Any, str]] = []
            for s in stated:
                if s.value is None:
                    continue
                if s.form != "engine_config" and s.value == "auto" and resolved:
                    continue  # (the engine resolving what was left to it)
                if not any(_same(s.value, v) for v, _ in values):
                    values.append((s.value, s.source))
            if len(values) > 1:
                (v0, s0), rest = values[0], values[1:]
                notes.append(f"{name}: {_shown(v0)} at {s0} but " + ", ".join(f"{_shown(v)} at {src}" for v, src in rest))
        return notes


def merge(configs: Iterable[EngineConfig]) -> EngineConfig:
    """One config of several, statements in order; an environment variable keeps its first value."""
    out = EngineConfig()
    for c in configs:
        out.settings.extend(c.settings)
        for k, v in c.env.items():
            out.env.setdefault(k, v)
    return out


# --- values -----------------------------------------------------------------------------------------

def _same(a: Any, b: Any) -> bool:
    a, b = _one(a), _one(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return bool(a == b)


def _one(v: Any) -> Any:
    return v[0] if isinstance(v, list) and len(v) == 1 else v


def _shown(v: Any) -> str:
    return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else str(v)


def jsonable(v: Any) -> Any:
    """A value as JSON can hold it: sets and tuples as lists, dict keys as text, other objects by repr."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else repr(v)
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted((jsonable(x) for x in v), key=repr)
    return repr(v)


_ENUM_REPR = re.compile(r"<(\w+(?:\.\w+)+): ('(?:[^'\\]|\\.)*'|-?\d+)>")


def _literal(text: str) -> tuple[bool, Any]:
    """(parsed, value) of a Python literal or JSON; an enum's repr ('<ConfigFormat.AUTO: 'auto'>')
    stands for its value, inside containers too."""
    text = text.strip()
    for attempt in (text, _ENUM_REPR.sub(lambda m: m.group(2), text)):
        try:
            return True, jsonable(ast.literal_eval(attempt))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
        try:
            return True, jsonable(json.loads(attempt))
        except ValueError:
            pass
    return False, None


def _typed(text: str, name: str = "") -> Any:
    """A value as a command or a label states it (text) -> int, float, bool, None, dict or list."""
    s = text.strip()
    if name in TEXT_ARGS:
        return s
    if re.fullmatch(r"[+-]?\d+", s):
        return int(s)
    if re.fullmatch(r"[+-]?(?:\d+\.\d*|\.\d+|\d+(?:\.\d*)?[eE][+-]?\d+)", s):
        return float(s)
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if s == "None":
        return None
    m = _READABLE.match(s)
    if m and name in READABLE_INTS:
        unit = m.group(2)
        scale = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[unit]
        return int(float(m.group(1)) * scale)
    if s[:1] in "{[":
        ok, v = _literal(s)
        if ok:
            return v
    return s


def _scope(name: str) -> Scope:
    return "server" if name in SERVER_ARGS else "engine"


def _setting(name: str, value: Any, source: str, form: Form) -> ArgSetting:
    return ArgSetting(name, jsonable(value), source, form, _scope(name))


# --- log messages -----------------------------------------------------------------------------------

_OPENERS = {"(": ")", "[": "]", "{": "}", "<": ">"}
_KEY = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)=(?!=)")
R_NAMESPACE = re.compile(r"\bargs: Namespace\(")
R_NON_DEFAULT = re.compile(r"\bnon-default args: ")
R_ENGINE_CONFIG = re.compile(r"Initializing an? (?:V\d )?LLM engine \(v[^)]*\) with config: ")
R_BACKEND = re.compile(r"\bUsing (?:AttentionBackendEnum\.)?([A-Z][A-Z0-9_]+|Flash Attention|XFormers|FlashInfer|"
                       r"Torch SDPA|ROCmFlashAttention|Triton MLA|FlashMLA) (?:attention )?backend\b")
BACKEND_NAMES = {"Flash Attention": "FLASH_ATTN", "XFormers": "XFORMERS", "FlashInfer": "FLASHINFER",
                 "Torch SDPA": "TORCH_SDPA", "ROCmFlashAttention": "ROCM_FLASH", "Triton MLA": "TRITON_MLA",
                 "FlashMLA": "FLASHMLA"}


def _scan(text: str, start: int = 0, stop_at_close: bool = False) -> tuple[list[tuple[int, int]], bool]:
    """Top-level pieces of a comma-separated repr from ``start``: their (start, end) offsets, and
    whether the text ended cut (a bracket or quote left open, or no closing ')' where one is due). Quotes open a string only
    where a value starts (after '=', ':', ',', a bracket or the start), so an apostrophe in an unquoted
    word does not; '<' opens only an object's repr ('<class ...>', '<ConfigFormat.AUTO: ...>')."""
    pieces: list[tuple[int, int]] = []
    stack: list[str] = []
    quote = ""
    i, begin, n = start, start, len(text)
    prev = ""  # last non-space character outside strings
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
                prev = c
            i += 1
            continue
        if c in "'\"" and (prev == "" or prev in "=:,([{<"):
            quote = c
        elif c in _OPENERS and (c != "<" or text[i + 1:i + 2].isalpha()):
            stack.append(_OPENERS[c])
        elif stack and c == stack[-1]:
            stack.pop()
        elif not stack and c == ")" and stop_at_close:
            pieces.append((begin, i))
            return pieces, False
        elif not stack and c == ",":
            pieces.append((begin, i))
            begin = i + 1
        if not c.isspace():
            prev = c
        i += 1
    pieces.append((begin, n))
    return pieces, bool(stack or quote) or stop_at_close


def _kwargs(text: str, start: int, stop_at_close: bool) -> list[tuple[str, str]]:
    """'key=value, key=value' from ``start`` -> [(key, value text)]. A value's commas are inside its
    quotes or brackets; a piece the text's end cut off is dropped, and so is a piece with no 'key='."""
    pieces, cut = _scan(text, start, stop_at_close)
    if cut:
        pieces = pieces[:-1]  # (the last piece is where the text was cut: not whole)
    out: list[tuple[str, str]] = []
    for a, b in pieces:
        m = _KEY.match(text, a, b)
        if m:
            out.append((m.group(1), text[m.end():b]))
    return out


def _repr_value(text: str) -> Any:
    ok, v = _literal(text)
    if ok:
        return v
    s = text.strip()
    m = _ENUM_REPR.fullmatch(s)
    return _literal(m.group(2))[1] if m else s


def _config_value(name: str, text: str) -> Any:
    """A value of the engine's config line, which prints most values bare ('tokenizer_mode=auto',
    'dtype=torch.bfloat16', 'load_format=LoadFormat.AUTO', 'device_config=cuda')."""
    s = text.strip()
    if s in ("None", "True", "False") or s[:1] in "'\"{[" or re.fullmatch(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", s):
        ok, v = _literal(s)
        if ok:
            return v
    if name == "dtype" and s.startswith("torch."):
        return s[len("torch."):]
    m = re.fullmatch(r"[A-Z]\w*\.([A-Z][A-Z0-9_]*)", s)  # ('LoadFormat.AUTO': the enum's value is its name, lower case)
    if m:
        return m.group(1).lower()
    return _repr_value(s)


def from_log_message(text: str, source: str) -> list[ArgSetting]:
    """The arguments one logical vLLM log message states: a Namespace (every argument, defaults
    included), the non-default arguments, the engine's config line, or the attention backend it
    chose (as ``attention_backend``). A message cut short keeps what it stated whole."""
    out: list[ArgSetting] = []
    m = R_NAMESPACE.search(text)
    if m:
        for key, val in _kwargs(text, m.end(), stop_at_close=True):
            if key not in NAMESPACE_PLUMBING:
                out.append(_setting("model" if key == "model_tag" else key, _repr_value(val), source, "namespace"))
        return _first_of_each(out)
    m = R_NON_DEFAULT.search(text)
    if m:
        body = text[m.end():].strip()
        ok, d = _literal(body)
        items: list[tuple[str, Any]] = []
        if ok and isinstance(d, dict):
            items = list(d.items())
        elif body.startswith("{"):
            for a, b in _scan(body, 1)[0]:
                key, sep, val = body[a:b].partition(":")
                ok_k, k = _literal(key)
                if sep and ok_k and isinstance(k, str):
                    items.append((k, _repr_value(val.rstrip().removesuffix("}"))))
        for key, val in items:
            out.append(_setting("model" if key == "model_tag" else key, val, source, "non_default_args"))
        return _first_of_each(out)
    m = R_ENGINE_CONFIG.search(text)
    if m:
        for key, val in _kwargs(text.rstrip().rstrip(","), m.end(), stop_at_close=False):
            name = CONFIG_NAMES.get(key, key)
            out.append(_setting(name, _config_value(name, val), source, "engine_config"))
        return _first_of_each(out)
    m = R_BACKEND.search(text)
    if m:
        out.append(_setting("attention_backend", BACKEND_NAMES.get(m.group(1), m.group(1)), source, "engine_config"))
    return out


def _first_of_each(settings: list[ArgSetting]) -> list[ArgSetting]:
    """(a Namespace states the model twice, as 'model_tag' and 'model')"""
    seen: set[str] = set()
    out = []
    for s in settings:
        if s.name not in seen:
            seen.add(s.name)
            out.append(s)
    return out


def from_cache_config_info(labels: dict[str, str], source: str) -> list[ArgSetting]:
    """The settings ``vllm:cache_config_info``'s labels state (every CacheConfig field, as text),
    typed; ``cache_dtype`` is the ``kv_cache_dtype`` argument, ``num_gpu_blocks`` a stated fact."""
    out = []
    for key, text in labels.items():
        if key.startswith("_") or key in ("engine", "__name__"):
            continue
        name = CACHE_LABELS.get(key, key)
        out.append(_setting(name, _typed(text, name), source, "cache_config_info"))
    return out


# --- shell commands ---------------------------------------------------------------------------------

@dataclass
class _Word:
    """A shell word and the line it starts on."""

    text: str
    line: int
    op: bool = False  # a shell operator (';', '&&', '|', '>', ...), not a word


def _joined_lines(text: str, first_line: int) -> tuple[str, list[int]]:
    """The text with lines a terminal or a paste cut inside a flag joined again ('--sw' then 'ap-space
    8': one flag), and each character's line number."""
    lines = text.split("\n")
    chars: list[str] = []
    where: list[int] = []
    for i, ln in enumerate(lines):
        chars.extend(ln)
        where.extend([first_line + i] * len(ln))
        if i + 1 < len(lines):
            join = _cut_flag(ln, lines[i + 1])
            if join is None:
                chars.append("\n")
                where.append(first_line + i)
            elif join:
                chars.append(join)
                where.append(first_line + i)
    return "".join(chars), where


def _cut_flag(line: str, after: str) -> str | None:
    """How a line and the next are one line that a terminal cut: '' (inside a flag's name), ' ' (at a
    space, the next line a flag), or None (two lines)."""
    if len(line) < 60 or not after or _LOG_LINE.search(after) or line.rstrip().endswith("\\"):
        return None
    if line[-1:].isspace():
        return " " if after.startswith("--") else None
    head = line.rsplit(None, 1)[-1] if line.split() else ""
    tail = after.split(None, 1)[0]
    if not head.startswith("--") or not (tail[:1].isalnum() or tail[:1] == "-"):
        return None
    whole = (head + tail).split("=", 1)[0][2:].replace("-", "_")
    part = head.split("=", 1)[0][2:].replace("-", "_")
    return "" if whole in ENGINE_ARGS | SERVER_ARGS and part not in ENGINE_ARGS | SERVER_ARGS else None


def _words(text: str, where: list[int], newline_ends: bool = True) -> Iterator[_Word]:
    """Shell words of a text (quotes, escapes, backslash-newline continuations, comments), each with the
    line it starts on; a newline (where ``newline_ends``) and ';', '&', '|', '<', '>' are operators."""
    i, n = 0, len(text)
    buf: list[str] = []
    start = -1
    started = False

    def flush() -> Iterator[_Word]:
        nonlocal buf, started, start
        if started:
            yield _Word("".join(buf), where[start] if start < len(where) else (where[-1] if where else 1))
        buf, started, start = [], False, -1

    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                i += 2
                continue
            if not started:
                start, started = i, True
            buf.append(text[i + 1])
            i += 2
            continue
        if c in "'\"":
            if not started:
                start, started = i, True
            j = i + 1
            while j < n and text[j] != c:
                if c == '"' and text[j] == "\\" and j + 1 < n:
                    nxt = text[j + 1]
                    if nxt == "\n":
                        j += 2
                        continue
                    buf.append(nxt if nxt in '"\\$`' else "\\" + nxt)
                    j += 2
                    continue
                buf.append(text[j])
                j += 1
            i = j + 1
            continue
        if c == "#" and not started:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "\n" or c in ";&|<>":
            if c in "<>" and started and "".join(buf).isdigit():  # ('2>&1': the descriptor is the operator's)
                buf, started = [], False
            yield from flush()
            if c == "\n" and not newline_ends:
                i += 1
                continue
            j = i + 1
            while j < n and text[j] in "&|>" and c != "\n":
                j += 1
            yield _Word(text[i:j], where[i] if i < len(where) else 1, op=True)
            i = j
            continue
        if c.isspace():
            yield from flush()
            i += 1
            continue
        if not started:
            start, started = i, True
        buf.append(c)
        i += 1
    yield from flush()


def _statements(words: Iterable[_Word]) -> Iterator[list[_Word]]:
    """Words grouped into simple commands; a redirection's target is left out."""
    cur: list[_Word] = []
    redirect = False
    for w in words:
        if w.op:
            if w.text[:1] in "<>":
                redirect = True
                continue
            if cur:
                yield cur
            cur, redirect = [], False
            continue
        if redirect:
            redirect = False
            continue
        cur.append(w)
    if cur:
        yield cur


def _is_launcher(words: list[_Word], i: int) -> int:
    """How many words from ``i`` start vLLM's server (0 where they do not)."""
    w = words[i].text
    base = w.rsplit("/", 1)[-1]
    if base == "vllm" and i + 1 < len(words) and words[i + 1].text == "serve":
        return 2
    if re.fullmatch(r"python[0-9.]*", base):
        j = i + 1
        while j < len(words) and words[j].text.startswith("-") and words[j].text != "-m":
            j += 1
        if j + 1 < len(words) and words[j].text == "-m" and words[j + 1].text.startswith("vllm.entrypoints."):
            k = j + 2
            if words[j + 1].text.endswith(".cli.main") and k < len(words) and words[k].text == "serve":
                k += 1
            return k - i
    return 0


def _env_word(w: _Word, file: str, env: dict[str, tuple[str, str]]) -> bool:
    """Keep a 'NAME=value' word's variable where it bears on memory, devices or the engine (never a
    token's or a key's); whether the word is an assignment at all."""
    name, eq, value = w.text.partition("=")
    if not eq or not _ENV_NAME.match(name):
        return False
    if _ENV_KEEP.match(name) and not _ENV_SECRET.search(name):
        env.setdefault(name, (value, f"{file}:{w.line}"))
    return True


def _launch(words: list[_Word], file: str, env: dict[str, tuple[str, str]], form: Form) -> list[ArgSetting] | None:
    """The settings of one simple command that starts vLLM (None where it does not): inline variables
    before it are environment, a docker run's -e too, the rest vLLM's arguments."""
    inline: list[_Word] = []
    for i, w in enumerate(words):
        n = _is_launcher(words, i)
        if n:
            for x in inline:
                _env_word(x, file, env)
            return _argv(words[i + n:], file, form, positional_model=True)
        base = w.text.rsplit("/", 1)[-1]
        if base in ("docker", "podman", "nerdctl") and i + 1 < len(words) and words[i + 1].text == "run":
            got = _docker(words[i + 2:], file, env, form)
            if got is not None:
                return got
        if "=" in w.text and _ENV_NAME.match(w.text.split("=", 1)[0]):
            inline.append(w)
        elif base in WRAPPERS or w.text.startswith("-"):
            continue
        else:
            inline = []
    return None


def _docker(words: list[_Word], file: str, env: dict[str, tuple[str, str]], form: Form) -> list[ArgSetting] | None:
    """``docker run``'s options, then the image, then what its entrypoint is given: vLLM's arguments
    where the image is vLLM's (or the command after it starts vLLM)."""
    mine: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(words):
        w = words[i].text
        if not w.startswith("-"):
            break
        opt, eq, val = w.partition("=")
        if not eq and opt in _DOCKER_VALUE_OPTS:
            val = words[i + 1].text if i + 1 < len(words) else ""
            i += 1
        if opt in ("-e", "--env"):
            _env_word(_Word(val, words[i].line), file, mine)
        elif opt == "--gpus":
            g = val.strip("'\"")
            devices = g.split("=", 1)[1] if g.startswith("device=") else g
            mine.setdefault("NVIDIA_VISIBLE_DEVICES", (devices, f"{file}:{words[i].line}"))
        i += 1
    if i >= len(words):
        return None
    image, rest = words[i].text, words[i + 1:]
    n = _is_launcher(rest, 0) if rest else 0
    if "vllm" not in image.lower() and not n:
        return None
    for k, v in mine.items():
        env.setdefault(k, v)
    return _argv(rest[n:], file, form, positional_model=True)


def _argv(words: list[_Word], file: str, form: Form, positional_model: bool) -> list[ArgSetting]:
    """vLLM's arguments: '--flag value', '--flag=value', a bare boolean flag, '--no-flag', the short
    flags (-tp 2, -tp=2, -O3), a list flag's values, and the model as the first positional word."""
    out: list[ArgSetting] = []
    i = 0
    while i < len(words):
        w, line = words[i].text, words[i].line
        src = f"{file}:{line}"
        i += 1
        if w == "--":
            continue
        if not w.startswith("-") or w == "-" or re.fullmatch(r"-\d[\d.]*", w):
            if positional_model and not any(s.name == "model" for s in out):
                out.append(_setting("model", w, src, form))
            continue
        flag, eq, val = w.partition("=")
        if flag.startswith("--"):
            name = flag[2:].replace("-", "_")
        else:
            short = flag[1:]
            m = re.fullmatch(r"O(\d)", short)
            if m:
                out.append(_setting("compilation_config", int(m.group(1)), src, form))
                continue
            if short not in SHORT_FLAGS:
                continue
            name = SHORT_FLAGS[short]
        if not name:
            continue
        negated = name.startswith("no_") and name[3:] in BOOL_FLAGS | ENGINE_ARGS | SERVER_ARGS
        if negated:
            out.append(_setting(name[3:], False, src, form))
            continue
        nxt = words[i].text if i < len(words) else None
        boolean = name in BOOL_FLAGS or (name not in ENGINE_ARGS | SERVER_ARGS and name.startswith(BOOL_PREFIXES))
        if eq:
            value: Any = _typed(val, name)
        elif boolean:
            if nxt is not None and nxt.lower() in ("true", "false"):
                value = nxt.lower() == "true"
                i += 1
            else:
                value = True
        elif name in LIST_FLAGS:
            vals = []
            while i < len(words) and not words[i].text.startswith("-"):
                vals.append(words[i].text)
                i += 1
            value = vals
        elif nxt is None or (nxt.startswith("-") and not re.fullmatch(r"-\d[\d.eE+-]*", nxt)):
            value = True  # (a flag this parser does not know, given no value)
        else:
            value = _typed(nxt, name)
            i += 1
        if name in LIST_FLAGS and not isinstance(value, list):
            value = [value]
        out.append(_setting(name, value, src, form))
    return out


def _first_vllm_line(text: str) -> int:
    """The first line that names vLLM (where a refusal points), else 1."""
    return next((k for k, ln in enumerate(text.split("\n"), 1) if "vllm" in ln.lower()), 1)


def _command_settings(text: str, file: str, env: dict[str, tuple[str, str]], form: Form,
                      where: list[int] | None = None, newline_ends: bool = True) -> list[ArgSetting] | None:
    """The settings of the first command in a shell text that starts vLLM; 'export' lines before it
    are environment. Log lines pasted with it are passed over."""
    if where is None:
        text, where = _joined_lines(text.replace("\r\n", "\n"), 1)
    for stmt in _statements(_words(text, where, newline_ends)):
        if _LOG_LINE.search(" ".join(w.text for w in stmt)):
            continue
        if stmt[0].text == "export":
            for w in stmt[1:]:
                _env_word(w, file, env)
            continue
        got = _launch(stmt, file, env, form)
        if got is not None:
            return got
    return None


def from_command(text: str, file: str) -> EngineConfig:
    """A command that started the server, as a team keeps or pastes it: ``vllm serve MODEL ...``,
    ``python -m vllm.entrypoints.openai.api_server ...``, ``docker run ... vllm/vllm-openai ...``, in
    a script or wrapped over lines with '\\' or by a terminal. Raises ReplayError where it holds none."""
    env: dict[str, tuple[str, str]] = {}
    # (a log line pasted with the command is no part of it, and a log's own text starts nothing)
    kept = "\n".join("" if _LOG_LINE.search(ln) else ln for ln in text.replace("\r\n", "\n").split("\n"))
    settings = _command_settings(kept, file, env, "command_line")
    if settings is None:
        raise ReplayError(f"{file}:{_first_vllm_line(text)}: no command that starts vLLM (vllm serve, "
                          "python -m vllm.entrypoints…, docker run … vllm/vllm-openai) was found")
    return EngineConfig(settings, env)


# --- YAML: compose and Kubernetes -------------------------------------------------------------------

Part = tuple[str, int, "Node | None"]  # (a word of an exec-form command, its line, the scalar it is)


def _yaml_nodes(text: str, file: str) -> list[Node]:
    import yaml  # (lazily: the log parser imports this module)

    try:
        return [d for d in yaml.compose_all(text, Loader=yaml.SafeLoader) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise ReplayError(f"{file}:{line}: not readable as YAML: {getattr(e, 'problem', None) or e}") from None


def _get(node: Node | None, key: str) -> Node | None:
    from yaml import MappingNode

    if isinstance(node, MappingNode):
        for k, v in node.value:
            if getattr(k, "value", None) == key:
                return v
    return None


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _parts(node: Node | None) -> list[Part]:
    """A sequence of scalars, or one scalar, as exec-form words."""
    from yaml import ScalarNode, SequenceNode

    if isinstance(node, ScalarNode):
        return [(str(node.value), _line(node), node)]
    if isinstance(node, SequenceNode):
        return [(str(x.value), _line(x), x) for x in node.value if isinstance(x, ScalarNode)]
    return []


def _scalar_text(part: Part, source_text: str) -> tuple[str, list[int], bool]:
    """A scalar's text as the source states it, each character's line, and whether its newlines are
    the shell's (a literal block, or a value holding newlines) rather than folded spaces. A block or
    plain scalar is read from the source itself (its words keep their own lines); a quoted one from
    its value, at its first line."""
    text, line, node = part
    style = getattr(node, "style", "'") if node is not None else "'"
    if node is not None and style in (">", "|", None, ""):
        raw = source_text[node.start_mark.index:node.end_mark.index]
        first = line
        if style in (">", "|"):
            _, _, raw = raw.partition("\n")
            first += 1
        where, at = [], first
        for ch in raw:
            where.append(at)
            at += ch == "\n"
        return raw, where, style == "|"
    return text, [line] * len(text), True


def _exec_settings(parts: list[Part], file: str, source_text: str, env: dict[str, tuple[str, str]],
                   form: Form, entrypoint_is_vllm: bool) -> list[ArgSetting] | None:
    """An exec-form command (compose's list, a container's command + args), each element one word: a
    shell's '-c' script, a launcher and its arguments, or (the image's entrypoint being vLLM's) vLLM's
    own arguments. An element holding a whole command line (a mistake vLLM's users make) is split."""
    if not parts:
        return None
    first = parts[0][0].strip()
    if first.rsplit("/", 1)[-1] in SHELLS and len(parts) >= 2 and re.fullmatch(r"-\w*c\w*", parts[1][0]):
        if len(parts) < 3:
            return None
        text, where, newline_ends = _scalar_text(parts[2], source_text)
        return _command_settings(text, file, env, form, where=where, newline_ends=newline_ends)
    if len(parts) == 1 and " " in first:
        text, where, _ = _scalar_text(parts[0], source_text)
        words = [w for w in _words(text, where, newline_ends=False) if not w.op]
        got = _launch(words, file, env, form)
        return got if got is not None or not entrypoint_is_vllm else _argv(words, file, form, positional_model=True)
    words = [_Word(t, line) for t, line, _ in parts]
    got = _launch(words, file, env, form)
    if got is not None or not entrypoint_is_vllm:
        return got
    return _argv(words, file, form, positional_model=True)


def _env_of(node: Node | None, file: str, env: dict[str, tuple[str, str]]) -> None:
    """An environment as compose (a map, or 'K=V' items) or Kubernetes (name/value items) states it;
    a value from a secret or a field ('valueFrom') is not stated."""
    from yaml import MappingNode, ScalarNode, SequenceNode

    if isinstance(node, MappingNode):
        for k, v in node.value:
            if isinstance(k, ScalarNode) and isinstance(v, ScalarNode):
                _env_word(_Word(f"{k.value}={v.value}", _line(k)), file, env)
    elif isinstance(node, SequenceNode):
        for item in node.value:
            if isinstance(item, ScalarNode):
                _env_word(_Word(str(item.value), _line(item)), file, env)
            elif isinstance(item, MappingNode):
                name, value = _get(item, "name"), _get(item, "value")
                if isinstance(name, ScalarNode) and isinstance(value, ScalarNode):
                    _env_word(_Word(f"{name.value}={value.value}", _line(name)), file, env)


def _mentions_vllm(*nodes: Node | None) -> bool:
    return any("vllm" in t.lower() for n in nodes for t, _, _ in _parts(n))


def _compose_parts(node: Node | None, source_text: str) -> list[Part]:
    """Compose's command or entrypoint as words: a list's items, or a string split as a shell would."""
    from yaml import ScalarNode

    if isinstance(node, ScalarNode):
        text, where, _ = _scalar_text((str(node.value), _line(node), node), source_text)
        return [(w.text, w.line, None) for w in _words(text, where, newline_ends=False) if not w.op]
    return _parts(node)


def from_compose(text: str, file: str) -> EngineConfig:
    """The vLLM service of a docker-compose file (or a service pasted alone): its image's arguments
    from ``command`` (a list, or a string split as a shell splits it), ``entrypoint`` where given,
    and its ``environment`` (a map or 'K=V' items)."""
    from yaml import MappingNode

    text = text.replace("\r\n", "\n")
    for doc in _yaml_nodes(text, file):
        services = _get(doc, "services") or doc
        if not isinstance(services, MappingNode):
            continue
        for _, svc in services.value:
            image, command, entrypoint = _get(svc, "image"), _get(svc, "command"), _get(svc, "entrypoint")
            if not _mentions_vllm(image, command, entrypoint):
                continue
            env: dict[str, tuple[str, str]] = {}
            parts = _compose_parts(entrypoint, text) + _compose_parts(command, text)
            settings = _exec_settings(parts, file, text, env, "compose", entrypoint_is_vllm=entrypoint is None)
            if not settings:
                raise ReplayError(f"{file}:{_line(svc)}: the vLLM service states no command (its arguments "
                                  "to vLLM are not in the file)")
            _env_of(_get(svc, "environment"), file, env)
            return EngineConfig(settings, env)
    raise ReplayError(f"{file}:{_first_vllm_line(text)}: no compose service runs a vLLM image or command")


def _containers(node: Node) -> Iterator[Node]:
    """Every container of a manifest, however deep its pod template (Pod, Deployment, StatefulSet,
    Job, CronJob, LeaderWorkerSet, a List of them, an operator's resource)."""
    from yaml import MappingNode, SequenceNode

    if isinstance(node, MappingNode):
        for k, v in node.value:
            if getattr(k, "value", None) in ("containers", "initContainers") and isinstance(v, SequenceNode):
                yield from (c for c in v.value if isinstance(c, MappingNode) and _get(c, "image") is not None)
            else:
                yield from _containers(v)
    elif isinstance(node, SequenceNode):
        for v in node.value:
            yield from _containers(v)


def from_kubernetes(text: str, file: str) -> EngineConfig:
    """The vLLM container of a Kubernetes manifest (``kubectl get -o yaml`` or ``-o json``, or the file
    applied) or of ``kubectl describe pod``: its command and args, and its env's stated values."""
    text = text.replace("\r\n", "\n")
    if _DESCRIBE.search(text):
        return _from_describe(text, file)
    for doc in _yaml_nodes(text, file):
        for c in _containers(doc):
            image, command, args = _get(c, "image"), _get(c, "command"), _get(c, "args")
            if not _mentions_vllm(image, command, args):
                continue
            env: dict[str, tuple[str, str]] = {}
            settings = _exec_settings(_parts(command) + _parts(args), file, text, env, "kubernetes",
                                      entrypoint_is_vllm=command is None)
            if not settings:
                raise ReplayError(f"{file}:{_line(c)}: the vLLM container states no command or args (its "
                                  "arguments to vLLM are not in the file)")
            _env_of(_get(c, "env"), file, env)
            return EngineConfig(settings, env)
    raise ReplayError(f"{file}:{_first_vllm_line(text)}: no container runs a vLLM image or command")


_DESCRIBE = re.compile(r"^[│|]?\s*(?:Containers:|Container ID:)", re.M)
_FRAME = re.compile(r"^\s*│ ?(.*?)\s*│?\s*$")
_FIELD = re.compile(r"(Image|Command|Args|Environment):\s*(.*)$")


def _from_describe(text: str, file: str) -> EngineConfig:
    """``kubectl describe pod``'s container blocks (each 'Command:' and 'Args:' item on a line of its
    own, 'Environment:' as 'NAME: value'), also as k9s frames them ('│ ... │')."""
    lines = [_FRAME.sub(r"\1", ln) if ln.lstrip().startswith("│") else ln.rstrip() for ln in text.split("\n")]
    blocks: list[dict[str, Any]] = []
    cur: dict[str, Any] | None = None
    field_name, field_indent = "", 0
    for no, ln in enumerate(lines, 1):
        indent = len(ln) - len(ln.lstrip())
        body = ln.strip()
        if field_name and body and indent > field_indent and cur is not None:
            cur[field_name].append((body, no))
            continue
        field_name = ""
        m = _FIELD.match(body)
        opens = body.startswith("Container ID:") or (m is not None and m.group(1) == "Image" and cur is not None
                                                     and "Image" in cur)
        if opens or (m is not None and cur is None):
            cur = {"line": no, "Command": [], "Args": [], "Environment": []}
            blocks.append(cur)
        if m is None or cur is None:
            continue
        key, rest = m.group(1), m.group(2).strip()
        if key == "Image":
            cur["Image"] = rest
        elif rest and rest != "<none>":
            cur[key].append((rest, no))
        else:
            field_name, field_indent = key, indent
    for b in blocks:
        argv = b["Command"] + b["Args"]
        if "vllm" not in str(b.get("Image", "")).lower() and not any("vllm" in t.lower() for t, _ in argv):
            continue
        if not argv:
            raise ReplayError(f"{file}:{b['line']}: the vLLM container's command and args are not in the file "
                              f"(image {b.get('Image', '?')})")
        env: dict[str, tuple[str, str]] = {}
        for item, no in b["Environment"]:
            name, _, value = item.partition(":")
            value = value.strip()
            if not value.startswith("<set to"):
                _env_word(_Word(f"{name.strip()}={value}", no), file, env)
        parts: list[Part] = [(t, no, None) for t, no in argv]
        settings = _exec_settings(parts, file, text, env, "kubernetes", entrypoint_is_vllm=not b["Command"])
        if not settings:
            raise ReplayError(f"{file}:{b['line']}: the vLLM container's command does not start vLLM")
        return EngineConfig(settings, env)
    raise ReplayError(f"{file}:{_first_vllm_line(text)}: no container of the description runs vLLM")


# --- telling a file ---------------------------------------------------------------------------------

_K8S = re.compile(r"^\s*\"?apiVersion\"?\s*:", re.M)
_K8S_KIND = re.compile(r"^\s*\"?kind\"?\s*:\s*\"?(?:Pod|Deployment|StatefulSet|DaemonSet|ReplicaSet|Job|CronJob|List|"
                       r"LeaderWorkerSet|InferenceService|ServingRuntime|RayService)\b", re.M)
_COMPOSE_IMAGE = re.compile(r"^\s+image:\s*[\"']?\S*vllm", re.M | re.I)
_LOG_HEADS = re.compile(r"args: Namespace\(|non-default args: |LLM engine \(v|^(?:\S+ )?(?:INFO|WARNING|ERROR|DEBUG) "
                        r"\d\d-\d\d \d\d:\d\d:\d\d", re.M)


def sniff(head: str) -> Kind | None:
    """Which launch configuration a file holds, from its first few KB: a Kubernetes manifest or
    description with a vLLM container, a compose file with a vLLM image, or a shell text that starts
    vLLM. A vLLM log (it may quote its command) is none of them."""
    if _LOG_HEADS.search(head):
        return None
    low = head.lower()
    if "vllm" not in low:
        return None
    if _K8S.search(head) and _K8S_KIND.search(head):
        return "kubernetes"
    if _DESCRIBE.search(head) and re.search(r"^\s*[│|]?\s*Image:\s+\S*vllm", head, re.M | re.I):
        return "kubernetes"
    if _COMPOSE_IMAGE.search(head) and re.search(r"^\s*(?:services:|command:|entrypoint:)", head, re.M):
        return "compose"
    for ln in re.sub(r"\\\r?\n", " ", head).split("\n"):
        m = _LAUNCH.search(ln)
        if m and not ln.lstrip().startswith("#") and ("run" not in m.group(0) or "vllm" in ln[m.end():].lower()):
            return "command"
    return None


SNIFF_BYTES = 16 << 10


def settings_of(stated: list[dict[str, Any]], source: str) -> list[ArgSetting]:
    """A log fact's settings (``extract``'s ``engine_config``: name, value, scope, form) at ``source``."""
    return [ArgSetting(str(d["name"]), d.get("value"), source, d.get("form", "engine_config"), d.get("scope", "engine"))
            for d in stated if isinstance(d, dict) and d.get("name")]


def read_config(path: Path, kind: Kind, name: str | None = None) -> EngineConfig:
    """The launch configuration of kind ``kind`` in a file, its statements named by ``name`` (the file's
    path where none is given)."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise ReplayError(f"{path}: cannot be read: {e.strerror or e}", EXIT_IO) from None
    return _read_as(text, kind, name or str(path), path)


def read_file(path: Path) -> EngineConfig:
    """The launch configuration a file holds (``sniff`` tells which)."""
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise ReplayError(f"{path}: cannot be read: {e.strerror or e}", EXIT_IO) from None
    return _read_as(text, sniff(text[:SNIFF_BYTES]), str(path), path)


def _read_as(text: str, kind: Kind | None, name: str, path: Path) -> EngineConfig:
    if kind == "kubernetes":
        return from_kubernetes(text, name)
    if kind == "compose":
        return from_compose(text, name)
    if kind == "command":
        return from_command(text, name)
    raise ReplayError(f"{path}: holds no vLLM launch configuration (a command, a compose service or a "
                      "Kubernetes manifest that starts vLLM)")
