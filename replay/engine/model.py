"""The embedded default model: a tiny Llama built locally into the cache on first use.

Random weights with a fixed seed, head_dim 64 (the CPU attention backend needs >= 64), and a
byte-level BPE tokenizer trained locally. The vocabulary size is configurable because the cost of
``prompt_logprobs`` grows with prompt length x vocabulary. Built by the engine env's own python,
so ``replay`` itself needs neither torch nor transformers. No hub download anywhere.
"""

from __future__ import annotations

import fcntl
import subprocess
from importlib import resources
from pathlib import Path

from replay.engine.envs import EnvSpec, replay_home
from replay.errors import EXIT_ENGINE, ReplayError

DEFAULT_VOCAB = 131072
DEFAULT_SEED = 0


def tiny_model_dir(vocab: int = DEFAULT_VOCAB, seed: int = DEFAULT_SEED) -> Path:
    return replay_home() / "models" / f"tiny-llama-v{vocab}-s{seed}"


def ensure_tiny_model(spec: EnvSpec, vocab: int = DEFAULT_VOCAB, seed: int = DEFAULT_SEED) -> Path:
    out = tiny_model_dir(vocab, seed)
    if (out / "replay_model.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "replay_model.json").exists():
            return out
        script = resources.files("replay.engine.scripts") / "build_tiny_model.py"
        p = subprocess.run([str(spec.python), str(script), str(out), "--vocab", str(vocab),
                            "--seed", str(seed)], capture_output=True, text=True, check=False)
        if p.returncode != 0:
            tail = "\n".join(p.stderr.strip().splitlines()[-5:])
            raise ReplayError(f"could not build the tiny model in {out}:\n{tail}", EXIT_ENGINE)
    return out
