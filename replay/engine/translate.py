"""Production's engine arguments, translated to the vLLM version a replay runs.

An incident's engine arguments are those of production's vLLM; the replay may run another version
(newer, to see whether it fixes the incident, or the CPU build). Each argument is kept, renamed
(the sources' own deprecation texts name the replacement: ``--disable-log-requests`` became
``--enable-log-requests``, its value inverted), or dropped with a sentence saying why: removed in
that version (and when it last existed), never a vLLM argument, an API server argument, or one that
does not apply to the CPU engine. The facts come from the catalogue that
:mod:`replay.engine.catalogue` builds from the released packages; a target environment's own
``--help`` list, when there is one, overrides the catalogue for what the target accepts.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from replay.engine.args import NEVER_EXISTED
from replay.engine.catalogue import Catalogue, Release, load, snake
from replay.versioning import version_key

Kind = Literal["renamed", "dropped", "unknown", "replaced_on_cpu", "kept"]

# API server arguments (never engine arguments) that the catalogue may not list for an old release;
# the catalogue's server_args add the rest.
SERVER_ARGS = frozenset({
    "host", "port", "uds", "api_key", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs",
    "root_path", "middleware", "allowed_origins", "allowed_methods", "allowed_headers",
    "allow_credentials", "uvicorn_log_level", "disable_uvicorn_access_log", "headless",
    "api_server_count", "config", "disable_fastapi_docs", "enable_ssl_refresh",
})

# Quantization methods whose kernels are CUDA's (or another accelerator's): not on the CPU engine.
_CUDA_QUANT = re.compile(r"awq|gptq|marlin|fp8|fp4|modelopt|bitsandbytes|aqlm|hqq|deepspeedfp|"
                         r"experts_int8|squeezellm|qqq|machete|exl2|petit|ptpc|moe_wna16|mxfp|"
                         r"fbgemm|tpu_int8|quark", re.I)
# What the replay decides itself: its model (production's or a tiny one) and what names it.
_MODEL_ARGS = ("model", "tokenizer", "served_model_name", "download_dir", "load_format", "revision",
               "tokenizer_revision", "code_revision", "hf_config_path")


@dataclass(frozen=True)
class Change:
    name: str  # the argument as production gave it (snake_case)
    kind: Kind
    new_name: str | None  # the argument in the target, where it is kept or renamed
    value: Any  # production's value
    note: str  # one sentence for the reader


@dataclass
class Translation:
    args: dict[str, Any]  # snake_case names valid for the target
    changes: list[Change]
    caveats: list[str] = field(default_factory=list)  # about the translation as a whole

    def notes(self) -> list[str]:
        """What the reader is told: the caveats, then every argument not passed as production had it."""
        return [*self.caveats, *(c.note for c in self.changes if c.kind != "kept")]


def flag(name: str) -> str:
    """The command-line spelling of an argument: ``--eplb-config.window_size`` for a config's field."""
    head, dot, sub = name.partition(".")
    return "--" + head.replace("_", "-") + dot + sub


def _show(value: Any) -> str:
    s = json.dumps(value) if isinstance(value, dict | list) else repr(value) if isinstance(value, str) else str(value)
    return s if len(s) <= 60 else s[:59] + "…"


def _cpu_reason(name: str, value: Any) -> str | None:
    """Why production's ``name=value`` cannot apply to the CPU engine (the sentence's tail), or None."""
    if name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                "data_parallel_size_local", "decode_context_parallel_size",
                "prefill_context_parallel_size"):
        try:
            n = int(value)
        except (TypeError, ValueError):
            return None
        return "the replay runs 1" if n > 1 else None
    if name == "quantization":
        return ("its kernels are CUDA's; the replay's model is not quantized"
                if value and _CUDA_QUANT.search(str(value)) else None)
    if name == "kv_cache_dtype":
        return "the CPU engine's KV cache takes the model's dtype" if "fp8" in str(value).lower() else None
    if name in ("gpu_memory_utilization", "device_memory_utilization", "kv_cache_memory_bytes",
                "num_gpu_blocks_override"):
        return "the CPU engine sizes its KV cache by VLLM_CPU_KVCACHE_SPACE"
    if name in ("swap_space", "cpu_offload_gb", "kv_offloading_size", "kv_offloading_backend",
                "cpu_offload_params"):
        return "it moves GPU memory to the host, which the CPU engine has none of"
    if name == "distributed_executor_backend":
        return "the CPU engine runs in one process" if str(value).lower() == "ray" else None
    if name in ("enable_expert_parallel", "enable_eplb", "enable_dbo", "enable_sleep_mode"):
        return "it is a GPU feature" if value else None
    if name in ("speculative_config", "speculative_model", "num_speculative_tokens"):
        return "the replay runs no draft model" if value else None
    if name in ("kv_transfer_config", "kv_events_config", "ec_transfer_config"):
        return "the replay runs one engine, connected to none" if value else None
    if (name in ("compilation_config", "optimization_level", "max_seq_len_to_capture",
                 "max_context_len_to_capture")
            or "cudagraph" in name or "cuda_graph" in name):
        return "CUDA graphs and their compilation are a GPU engine's"
    if name in _MODEL_ARGS:
        return "the replay chooses its own model"
    return None


def _cpu_note(name: str, value: Any, reason: str) -> str:
    return f"production's {name}={_show(value)} does not apply to the CPU engine; {reason}"


def _parse(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def translate(args: dict[str, Any], *, production: str | None, target: str,
              catalogue: Catalogue | None = None, device: Literal["cpu", "cuda"] = "cuda",
              target_known: list[str] | None = None) -> Translation:
    """Production's engine arguments (``args``, as production's vLLM stated them) for vLLM ``target``.

    ``production``: production's vLLM version (None when unknown). ``target_known``: the target
    environment's own argument list (kebab-case, :func:`replay.engine.args.known_args`), which
    overrides the catalogue for what the target accepts."""
    cat = catalogue if catalogue is not None else load()
    caveats: list[str] = []
    tgt_v = cat.resolve(target)
    tgt: Release | None = cat.releases[tgt_v] if tgt_v else None
    if target_known is not None:
        known = frozenset(snake(k) for k in target_known)
    elif tgt is not None:
        known = tgt.known
        if tgt_v != target.split("+", 1)[0]:
            caveats.append(f"vLLM {target} is not in the catalogue ({cat.versions[0]}..{cat.versions[-1]}): "
                           f"its arguments are taken as {tgt_v}'s")
    else:
        known = frozenset()
        caveats.append(f"vLLM {target} is older than every release in the catalogue and its own argument "
                       f"list was not given: no production argument can be checked against it")
    prod_v = cat.resolve(production) if production else None
    server = SERVER_ARGS | frozenset(tgt.server_args if tgt else ())
    if tgt is None or target_known is not None:
        server |= frozenset(s for r in cat.releases.values() for s in r.server_args)
    engine_t = frozenset(tgt.engine_args) if tgt else frozenset()
    server -= engine_t
    tv = target if target_known is not None or tgt_v is None else tgt_v

    out: dict[str, Any] = {}
    changes: list[Change] = []
    given = {snake(k) for k in args}

    def add(c: Change) -> None:
        changes.append(c)

    for raw, value in args.items():
        name = snake(raw)
        if name in server and (name not in known or name not in engine_t):
            add(Change(name, "dropped", None, value,
                       f"{flag(name)} is an API server argument, not an engine argument; dropped "
                       f"(the replay runs its own server)"))
            continue
        if name in ("model", "served_model_name") and device != "cpu":
            add(Change(name, "dropped", None, value,
                       f"production's {name}={_show(value)} is not passed: the replay chooses and names "
                       f"its own model"))
            continue
        new, new_value, how = name, value, ""
        if name not in known:
            r = _renamed(cat, name, value, known, tv, given)
            if isinstance(r, str):
                add(Change(name, "dropped", None, value, r))
                continue
            if r is not None:
                new, new_value, how = r
            else:
                add(_gone(cat, name, value, known, tv, prod_v, tgt if target_known is not None else None))
                continue
        if device == "cpu":
            reason = _cpu_reason(new, new_value) or (_cpu_reason(name, value) if new != name else None)
            if reason is not None:
                add(Change(name, "replaced_on_cpu", None, value, _cpu_note(name, value, reason)))
                continue
        if new == name:
            out[name] = value
            add(Change(name, "kept", name, value, f"{flag(name)}={_show(value)} kept"))
            continue
        head, _, sub = new.partition(".")
        if sub:  # a field of a JSON config argument: eplb_window_size -> eplb_config.window_size
            cfg = out.get(head, args.get(head, {}))
            cfg = _parse(cfg) if isinstance(cfg, str) else cfg
            if not isinstance(cfg, dict):
                add(Change(name, "dropped", None, value,
                           f"{flag(name)} became {flag(head)}'s field {sub!r} in vLLM {tv}, but production's "
                           f"{flag(head)} is not a JSON object to put it in; dropped"))
                continue
            out[head] = {**cfg, sub: new_value}
        else:
            out[new] = new_value
        add(Change(name, "renamed", new, value, how))
    return Translation(out, changes, caveats)


def _renamed(cat: Catalogue, name: str, value: Any, known: frozenset[str], target: str,
             given: set[str]) -> tuple[str, Any, str] | str | None:
    """Where an argument the target lacks went, by the sources' deprecation texts: (new name, new
    value, note); a note alone where the replacement cannot take production's value; None where the
    sources name no replacement the target has."""
    chain: list[tuple[str, str]] = []  # (name, release that says so)
    cur = name
    for _ in range(6):
        got = cat.replacement(cur, until=target) or cat.replacement(cur)
        if got is None:
            break
        nxt, said = got
        chain.append((nxt, said))
        cur = nxt.split("=", 1)[0]
        if cur.split(".", 1)[0] in known:
            break
    if chain and chain[-1][0].split("=", 1)[0].split(".", 1)[0] in known:
        spec, said = chain[-1]
        return _apply(cat, name, value, spec, said, target, given)
    # the other way: production's argument replaced an older one, which the target has (a downgrade)
    for old in sorted(cat.ever_known):
        got = cat.replacement(old)
        if got and got[0] == name and old in known:
            back = _apply(cat, old, value, name, got[1], target, given, reverse=True)
            if isinstance(back, tuple):
                return old, back[1], (f"{flag(name)} does not exist in {target}; it replaced "
                                      f"{flag(old)} (stated in {got[1]}), which {target} has: "
                                      f"{flag(old)}={_show(back[1])}")
            return back
    if chain:
        spec, said = chain[-1]
        new = spec.split("=", 1)[0]
        last = cat.last_with(name, before=_next(cat, target))
        where = f"removed after {last}" if last else "not in it"
        return (f"{flag(name)} does not exist in {target} ({where}); vLLM {said} named "
                f"{flag(new)} for it, which {target} lacks too; dropped")
    return None


def _next(cat: Catalogue, version: str) -> str | None:
    """The first catalogue release after ``version`` (so 'before it' includes the version itself)."""
    later = [v for v in cat.versions if version_key(v) > version_key(version)]
    return later[0] if later else None


def _default(cat: Catalogue, name: str) -> Any:
    """An argument's default in the newest release that has it (None when unknown)."""
    for v in reversed(cat.versions):
        e = cat.releases[v].engine_args.get(name)
        if e is not None:
            return e.get("default")
    return None


def _apply(cat: Catalogue, name: str, value: Any, spec: str, said: str, target: str, given: set[str],
           reverse: bool = False) -> tuple[str, Any, str] | str:
    new, _, set_to = spec.partition("=")
    base = f"{flag(name)} does not exist in {target}"
    if new in given and not reverse:
        return f"{base}; its replacement {flag(new)} (stated in {said}) is set by production too; dropped"
    if set_to == "…":
        return (f"{base}; vLLM {said} says to use {flag(new)} instead, with a value written for it; "
                f"dropped")
    if set_to:  # "--disable-mm-preprocessor-cache" -> "--mm-processor-cache-gb 0": for a switch
        if not value:
            return f"{base}; production's {name}={_show(value)} is the default there; dropped"
        v = _parse(set_to)
        return new, v, f"{base}: {flag(name)} became {flag(new)}={_show(v)} (stated in {said})"
    new_d = _default(cat, new)
    flip = _inverse(name, new)
    switch = isinstance(new_d, bool) or (new_d is None and _SWITCH.match(new) is not None)
    if isinstance(value, bool) and not switch and not flip:
        return (f"{base}; vLLM {said} says to use {flag(new)} instead, which takes a value, not a switch; "
                f"dropped")
    if flip and isinstance(value, bool):
        return new, not value, (f"{base}: {flag(name)}={value} became {flag(new)}={not value} "
                                f"(stated in {said})")
    head, dot, sub = new.partition(".")
    if dot:
        return new, value, f"{base}: it is {flag(head)}'s field {sub!r} (stated in {said})"
    return new, value, f"{base}: renamed to {flag(new)} (stated in {said})"


_SWITCH = re.compile(r"(enable|disable|use|no|skip|allow|trust|force|include|exclude|is|async|fully)_")


def _inverse(a: str, b: str) -> bool:
    """Whether two switches mean the opposite (disable_log_requests / enable_log_requests)."""
    pairs = (("disable_", "enable_"), ("no_", ""))
    return any((a.startswith(x) and b == y + a[len(x):]) or (b.startswith(x) and a == y + b[len(x):])
               for x, y in pairs)


def _gone(cat: Catalogue, name: str, value: Any, known: frozenset[str], target: str,
          prod_v: str | None, listed: Release | None) -> Change:
    """An argument the target lacks and no rename explains. ``listed``: the catalogue's release for
    the target where the target's own argument list was given instead."""
    base = f"{flag(name)} does not exist in {target}"
    by_help = listed is not None
    if listed is not None and name in listed.known:
        return Change(name, "dropped", None, value,
                      f"{base} by its own argument list (the catalogue lists it for {listed.version}); dropped")
    if name in cat.ever_known:
        last = cat.last_with(name, before=_next(cat, target))
        first = cat.first_with(name)
        if last is not None and (first is None or version_key(first) <= version_key(target)):
            why = f"removed after {last}"
        elif first is not None:
            why = f"added in {first}"
        else:
            why = "not in its argument list"
        said = cat.replacement(name)
        dep = next((v for v in cat.versions if name in cat.releases[v].deprecated), None)
        tail = f", deprecated since {dep}" if dep and not said and version_key(dep) <= version_key(target) else ""
        if prod_v and name not in cat.releases[prod_v].known:
            tail += f"; production's vLLM {prod_v} did not list it either"
        return Change(name, "dropped", None, value, f"{base} ({why}{tail}); dropped")
    hint = NEVER_EXISTED.get(name.replace("_", "-"))
    near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    span = f"{cat.versions[0]}..{cat.versions[-1]}"
    why = (f"{flag(name)} is not an argument of vLLM {target}"
           + (" (by its own argument list)" if by_help else "")
           + f" nor of any vLLM release {span}")
    if hint:
        why += f": {hint}"
    elif near:
        why += f" (nearest: {flag(near[0])})"
    return Change(name, "unknown", None, value, why + "; dropped")

