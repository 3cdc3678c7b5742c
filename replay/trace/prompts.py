"""Deterministic prompt synthesis from token counts (for traces that carry no text).

Prompts are sent as token-id lists so the engine sees exactly ``input_tokens`` tokens; shared
``prefix_blocks`` map to identical leading id blocks so vLLM's prefix cache behaves as in production.
"""

from __future__ import annotations

import hashlib
import random

FIRST_ID = 10  # ids below are special tokens in the tiny model's tokenizer
PROMPT_VOCAB = 4000  # synthesised ids are below this: the model's vocabulary must be at least as large


def _block_ids(key: str, n: int, vocab: int) -> list[int]:
    seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    rng = random.Random(seed)
    return [FIRST_ID + rng.randrange(vocab - FIRST_ID) for _ in range(n)]


def synth_prompt_ids(n_tokens: int, seed: int, request_id: str, *, vocab: int = PROMPT_VOCAB,
                     prefix_blocks: list[int] | None = None, block_size: int | None = None) -> list[int]:
    ids: list[int] = []
    if prefix_blocks and block_size:
        for b in prefix_blocks:
            if len(ids) >= n_tokens:
                break
            ids += _block_ids(f"{seed}:block:{b}", block_size, vocab)
    if len(ids) < n_tokens:
        ids += _block_ids(f"{seed}:req:{request_id}", n_tokens - len(ids), vocab)
    return ids[:n_tokens]


def synth_prompt_text(n_tokens: int, seed: int, request_id: str) -> str:
    rng = random.Random(f"{seed}:{request_id}")
    return " ".join(f"w{rng.randrange(4000)}" for _ in range(max(1, n_tokens)))
