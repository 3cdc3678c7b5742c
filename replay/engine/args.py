"""Engine arguments: validated against the chosen vLLM version's own argument list before start.

The list comes from that version's ``--help`` (cached in its env), so an argument the version
does not have is refused with the nearest real one named, instead of a server that dies later.
"""

from __future__ import annotations

import difflib
import json
import re
import subprocess
from typing import Any

from replay.engine.envs import EnvSpec
from replay.errors import EXIT_USAGE, ReplayError

# Arguments seen in incident configs that never existed in any vLLM, with what to use instead.
NEVER_EXISTED = {
    "enable-multimodal": "multimodal support is implied by the model; see --limit-mm-per-prompt",
    "enable-memory-budget": "vLLM's memory budget is --gpu-memory-utilization (or --kv-cache-memory-bytes)",
    "memory-budget-pct": "use --gpu-memory-utilization (a fraction of total GPU memory, e.g. 0.85)",
}


def known_args(spec: EnvSpec) -> list[str]:
    cache = spec.path / "replay-args.json"
    if cache.exists():
        cached: list[str] = json.loads(cache.read_text())
        return cached
    opts: set[str] = set()
    for flag in ("--help=all", "--help"):
        p = subprocess.run([str(spec.python), "-m", "vllm.entrypoints.openai.api_server", flag],
                           capture_output=True, text=True, check=False, timeout=300)
        opts = set(re.findall(r"(?<![\w-])--([a-z0-9][a-z0-9-]+)", p.stdout))
        if p.returncode == 0 and len(opts) > 20:
            break
    if len(opts) < 20:
        raise ReplayError(f"could not read the argument list of vLLM {spec.version} "
                          f"({spec.python} -m vllm.entrypoints.openai.api_server --help failed)")
    out = sorted(opts)
    cache.write_text(json.dumps(out))
    return out


def normalise(key: str) -> str:
    return key.strip().lstrip("-").replace("_", "-")


def to_argv(args: dict[str, Any], allowed: list[str] | None, version: str) -> list[str]:
    """Engine args dict -> argv list (never a shell string), refusing unknown arguments."""
    argv: list[str] = []
    for raw_key, value in args.items():
        key = normalise(raw_key)
        if allowed is not None and key not in allowed:
            hint = NEVER_EXISTED.get(key)
            near = difflib.get_close_matches(key, allowed, n=1, cutoff=0.5)
            msg = f"engine argument {raw_key!r} does not exist in vLLM {version}"
            if hint:
                msg += f" (nor in any vLLM release): {hint}"
            elif near:
                msg += f"; nearest real argument: --{near[0]}"
            raise ReplayError(msg, EXIT_USAGE)
        if value is None or value is False:
            continue
        if value is True:
            argv.append(f"--{key}")
        elif isinstance(value, (dict, list)):
            argv += [f"--{key}", json.dumps(value)]
        else:
            argv += [f"--{key}", str(value)]
    return argv


def parse_set(pairs: list[str]) -> dict[str, Any]:
    """``--set key=value`` overrides; values are JSON when they parse as JSON, else strings."""
    out: dict[str, Any] = {}
    for p in pairs:
        if "=" not in p:
            raise ReplayError(f"--set {p!r}: expected key=value", EXIT_USAGE)
        k, v = p.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out
