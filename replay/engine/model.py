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
from importlib import resources
from pathlib import Path

from replay.engine.envs import VISION, EnvSpec, installed_version, replay_home
from replay.errors import EXIT_ENGINE, ReplayError

DEFAULT_VOCAB = 131072
DEFAULT_SEED = 0
VL_MIN_PIXELS = 56 * 56  # (4 tokens)
VL_MAX_PIXELS = 1792 * 1792  # (4096 tokens: half the tiny models' 8192 positions)


def transformers_tag(spec: EnvSpec) -> str | None:
    """'tf4.45' for an env with transformers 4.45.x (installed, or pinned by its lock); None when
    neither is there yet."""
    v = installed_version(spec, "transformers")
    m = re.match(r"(\d+)\.(\d+)", v or "")
    return f"tf{m.group(1)}.{m.group(2)}" if m else None


def tiny_model_dir(vocab: int = DEFAULT_VOCAB, seed: int = DEFAULT_SEED,
                   spec: EnvSpec | None = None) -> Path:
    """The tiny model's folder. With ``spec``: the one that env reads, named by its transformers
    version (``tiny-llama-v131072-s0-tf4.45``) once the env or its lock says which; without,
    or before that is known, the name without it."""
    base = f"tiny-qwen2-vl-v{vocab}-s{seed}" if spec is not None and spec.variant == VISION else f"tiny-llama-v{vocab}-s{seed}"
    tag = transformers_tag(spec) if spec is not None else None
    return replay_home() / "models" / (f"{base}-{tag}" if tag else base)


def ensure_tiny_model(spec: EnvSpec, vocab: int = DEFAULT_VOCAB, seed: int = DEFAULT_SEED) -> Path:
    """The tiny model that env serves (a Qwen2-VL in a vision env, else a Llama), built once."""
    out = tiny_model_dir(vocab, seed, spec)
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
        pixels = ["--min-pixels", str(VL_MIN_PIXELS), "--max-pixels", str(VL_MAX_PIXELS)] if vl else []
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
