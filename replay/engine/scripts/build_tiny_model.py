"""Build the embedded tiny Llama (random weights, fixed seed) and a locally trained tokenizer.

Run with an engine environment's own python (it has torch, transformers and tokenizers, which
vLLM depends on): ``python build_tiny_model.py OUT_DIR --vocab 131072 --seed 0``. The files are
in the format of that env's transformers (4.45 and 5.x write different tokenizer configs), so
the model is built once per transformers version. No model hub is contacted.
"""

import argparse
import json
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def train_tokenizer(vocab: int, extra_special: tuple[str, ...] = ()) -> Any:  # (a PreTrainedTokenizerFast)
    """A byte-level BPE trained in a second on words such as ``w123`` (the words synthesised prompts
    are made of), with ``<unk> <s> </s>`` and ``extra_special`` as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(4000)]
    corpus = [" ".join(words[j:j + 40]) for j in range(0, len(words), 7)] + [
        "The quick brown fox jumps over the lazy dog.",
        "Memory ran out although the engine said there was room.",
    ]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab, 8000), special_tokens=["<unk>", "<s>", "</s>", *extra_special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    more = {"additional_special_tokens": list(extra_special)} if extra_special else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", **more)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=131072)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-pos", type=int, default=8192)
    a = ap.parse_args()

    import tokenizers
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    fast = train_tokenizer(a.vocab)
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    cfg = LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, vocab_size=a.vocab, max_position_embeddings=a.max_pos,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    fast.save_pretrained(a.out)
    with open(os.path.join(a.out, "replay_model.json"), "w") as fh:
        json.dump({"kind": "tiny-llama", "vocab": a.vocab, "seed": a.seed,
                   "tokenizer_vocab": fast.vocab_size, "head_dim": 64,
                   "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                   "torch": torch.__version__}, fh)
    print(json.dumps({"ok": True, "out": a.out, "tokenizer_vocab": fast.vocab_size}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
