"""The embedded default model: a tiny Llama built locally into the cache on first use.

Random weights with a fixed seed, head_dim 64 (the CPU attention backend needs >= 64), and a
byte-level BPE tokenizer trained locally. The vocabulary size is configurable because the cost of
``prompt_logprobs`` grows with prompt length x vocabulary. Built by the engine env's own python
and transformers, so ``replay`` itself needs neither torch nor transformers, and cached per
transformers minor version: what transformers 5 saves (``tokenizer_class: TokenizersBackend``)
transformers 4.45 cannot load, so each version reads a model its own transformers wrote.
No hub download anywhere.
"""

from __future__ import annotations

import fcntl
import json
import re
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from replay.engine.envs import VISION, EnvSpec, installed_version, replay_home
from replay.errors import EXIT_ENGINE, ReplayError

DEFAULT_VOCAB = 131072
DEFAULT_SEED = 0
VL_MIN_PIXELS = 56 * 56  # (4 tokens)
VL_MAX_PIXELS = 1792 * 1792  # (4096 tokens: half the tiny models' 8192 positions)
VL_MAX_IMAGE_TOKENS = 4096


@dataclass(frozen=True)
class VisionTower:
    """The tiny Qwen2-VL's vision tower: an image resized to multiples of ``patch * merge`` pixels within
    [min_pixels, max_pixels] and cut into ``patch``-pixel patches, ``merge`` x ``merge`` of them one token;
    so its image tokens, and their memory, grow with resolution up to ``max_pixels``."""

    patch: int = 14
    merge: int = 2
    max_pixels: int = VL_MAX_PIXELS
    min_pixels: int = VL_MIN_PIXELS

    def problems(self) -> list[tuple[str, bool, str, object]]:
        """(option, holds, what it must be, value) of each setting, for ``errors.refuse_options``."""
        per_token = (self.patch * self.merge) ** 2
        return [("--vision-patch", 2 <= self.patch <= 64, "a patch of 2 to 64 pixels", self.patch),
                ("--vision-merge", 1 <= self.merge <= 4, "1 to 4 patches a side merged into one token", self.merge),
                ("--vision-max-pixels", per_token <= self.max_pixels <= VL_MAX_IMAGE_TOKENS * per_token,
                 f"from one token's {per_token:,} pixels to {VL_MAX_IMAGE_TOKENS:,} tokens' "
                 f"{VL_MAX_IMAGE_TOKENS * per_token:,} (the tiny model's positions hold 8,192)", self.max_pixels)]

    @property
    def tag(self) -> str:
        """'' for the default tower, else what sets it apart in the model's folder name ('-p16m2x1048576')."""
        return "" if self == VisionTower() else f"-p{self.patch}m{self.merge}x{self.max_pixels}"


def transformers_tag(spec: EnvSpec) -> str | None:
    """'tf4.45' for an env with transformers 4.45.x (installed, or pinned by its lock); None when
    neither is there yet."""
    v = installed_version(spec, "transformers")
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return f"tf{m.group(1)}.{m.group(2)}" if m else None


def tiny_model_dir(vocab: int = DEFAULT_VOCAB, seed: int = DEFAULT_SEED,
                   spec: EnvSpec | None = None, tower: VisionTower | None = None) -> Path:
    """The tiny model's folder. With ``spec``: the one that env reads, named by its transformers
    version (``tiny-llama-v131072-s0-tf4.45``) once the env or its lock says which; without,
    or before that is known, the name without it. A vision env's is a Qwen2-VL, named by its tower
    where that is not the default one."""
    vl = spec is not None and spec.variant == VISION
    base = (f"tiny-qwen2-vl-v{vocab}-s{seed}{(tower or VisionTower()).tag}" if vl else f"tiny-llama-v{vocab}-s{seed}")
    tag = transformers_tag(spec) if spec is not None else None
    return replay_home() / "models" / (f"{base}-{tag}" if tag else base)


def ensure_tiny_model(spec: EnvSpec, vocab: int = DEFAULT_VOCAB, seed: int = DEFAULT_SEED,
                      tower: VisionTower | None = None) -> Path:
    """The tiny model that env serves (a Qwen2-VL with ``tower`` in a vision env, else a Llama), built once."""
    tower = tower or VisionTower()
    out = tiny_model_dir(vocab, seed, spec, tower)
    if transformers_tag(spec) is None:
        raise ReplayError(f"cannot build the tiny model: no transformers in {spec.path} "
                          f"(install the env first: replay versions install {spec.version})", EXIT_ENGINE)
    if (out / "replay_model.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "replay_model.json").exists():
            return out
        vl = spec.variant == VISION
        script = resources.files("replay.engine.scripts") / ("build_tiny_vl_model.py" if vl else "build_tiny_model.py")
        pixels = ["--patch", str(tower.patch), "--merge", str(tower.merge), "--min-pixels", str(tower.min_pixels),
                  "--max-pixels", str(tower.max_pixels)] if vl else []
        p = subprocess.run([str(spec.python), str(script), str(out), "--vocab", str(vocab),
                            "--seed", str(seed), *pixels], capture_output=True, text=True, check=False)
        if p.returncode != 0:
            tail = "\n".join(p.stderr.strip().splitlines()[-5:])
            raise ReplayError(f"could not build the tiny model in {out}:\n{tail}", EXIT_ENGINE)
    return out


def takes_images(model: str | Path, spec: EnvSpec) -> bool:
    """Whether the served model takes images: its config.json has a vision tower; a model not built yet
    (the tiny one), whether its env is a vision env."""
    cfg = Path(model) / "config.json"
    try:
        return "vision_config" in json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, TypeError):
        return spec.variant == VISION
