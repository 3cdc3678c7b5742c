"""Engine arguments: validated against the chosen vLLM version's own argument list before start.

The list comes from that version's own API server parser, run in its env by
``scripts/check_engine.py --options`` (cached in the env), so an argument the version does not
have is refused with the nearest real one named, instead of a server that dies later. A CUDA build
on a host without a GPU stops at device inference when its parser is built (0.6.4 on: ``Failed to
infer device type``); the script puts in the same device-less CUDA platform ``versions check``
uses. Where even that cannot run (a release that resolves its platform at import), the list is
the catalogue's for that release (read from its sources; no ``--no-…`` negations).
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from replay.engine.envs import EnvSpec
from replay.errors import EXIT_USAGE, ReplayError

# Arguments seen in incident configs that never existed in any vLLM, with what to use instead.
NEVER_EXISTED = {
    "enable-multimodal": "multimodal support is implied by the model; see --limit-mm-per-prompt",
    "enable-memory-budget": "vLLM's memory budget is --gpu-memory-utilization (or --kv-cache-memory-bytes)",
    "memory-budget-pct": "use --gpu-memory-utilization (a fraction of total GPU memory, e.g. 0.85)",
}
MIN_OPTIONS = 20  # fewer than this from a parser is no argument list


def known_args(spec: EnvSpec) -> list[str]:
    """The long options (kebab-case, no dashes) the version's API server accepts."""
    cache = spec.path / "replay-args.json"
    if cache.exists():
        cached: list[str] = json.loads(cache.read_text())
        return cached
    opts, why = parser_options(spec)
    if opts is not None:
        cache.write_text(json.dumps(opts))
        return opts
    fallback = catalogue_args(spec.version)
    if fallback is None:
        raise ReplayError(f"could not read the argument list of vLLM {spec.version} ({spec.python} "
                          f"scripts/check_engine.py --options: {why}), and the catalogue has no "
                          f"release {spec.version}")
    return fallback


def parser_options(spec: EnvSpec, timeout_s: float = 600.0) -> tuple[list[str] | None, str]:
    """The option strings of the version's own parser, run in its env, or None and why not."""
    script = resources.files("replay.engine.scripts") / "check_engine.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    with tempfile.TemporaryDirectory(prefix="replay-args-") as tmp:
        out = Path(tmp) / "options.json"
        try:
            p = subprocess.run([str(spec.python), str(script), "--options", str(out), "--dist", spec.dist],
                               capture_output=True, text=True, check=False, timeout=timeout_s, env=env, cwd=tmp)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, " ".join(str(e).split())[:300]
        if p.returncode != 0 or not out.exists():
            tail = [ln for ln in p.stderr.splitlines() if ln.strip()][-1:] or [f"exit {p.returncode}"]
            return None, tail[0][:300]
        opts = sorted({o.lstrip("-") for o in json.loads(out.read_text())} - {"help"})
    if len(opts) < MIN_OPTIONS:
        return None, f"the parser has {len(opts)} options"
    return opts, ""


def catalogue_args(version: str) -> list[str] | None:
    """The argument names (kebab-case) the catalogue read from the release's sources, or None."""
    from replay.engine.catalogue import load
    cat = load()
    r = cat.resolve(version)
    if r is None:
        return None
    return sorted(n.replace("_", "-") for n in cat.releases[r].known)


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
