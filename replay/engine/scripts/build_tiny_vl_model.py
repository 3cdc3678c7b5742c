"""Build the embedded tiny vision-language model: a Qwen2-VL (random weights, fixed seed) whose image
tokens grow with the image's size, as in the production models of vLLM's multimodal memory issues.

Run with a vision engine environment's own python (torch, torchvision, transformers):
``python build_tiny_vl_model.py OUT_DIR --seed 0 --min-pixels 3136 --max-pixels 3211264``.
The vision tower cuts an image, resized to multiples of ``patch * merge`` pixels within
[min, max] pixels, into patches of ``--patch`` pixels and merges ``--merge`` x ``--merge`` of them into
one token: a W x H image takes about (W / 28) x (H / 28) tokens. The tokenizer is the text model's
(words such as ``w123``) with Qwen2-VL's special tokens; the chat template puts
``<|vision_start|><|image_pad|><|vision_end|>`` where an image part is. No model hub is contacted.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_tiny_model import train_tokenizer  # noqa: E402  (the text model's tokenizer, beside this script)

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--max-pos", type=int, default=8192)
    ap.add_argument("--patch", type=int, default=14)
    ap.add_argument("--merge", type=int, default=2)
    ap.add_argument("--min-pixels", type=int, default=56 * 56)
    ap.add_argument("--max-pixels", type=int, default=1792 * 1792)
    a = ap.parse_args()

    import tokenizers
    import torch
    import transformers
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    torch.manual_seed(a.seed)
    fast = train_tokenizer(a.vocab, SPECIAL)
    fast.chat_template = CHAT_TEMPLATE
    ids = {t: fast.convert_tokens_to_ids(t) for t in SPECIAL}
    vocab = max(a.vocab, len(fast))
    hidden = 128
    cfg = Qwen2VLConfig(
        text_config={
            "hidden_size": hidden, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": vocab, "max_position_embeddings": a.max_pos,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]},
            "bos_token_id": 1, "eos_token_id": ids["<|im_end|>"], "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 2, "embed_dim": 128, "hidden_size": hidden, "num_heads": 2, "mlp_ratio": 2,
            "patch_size": a.patch, "spatial_merge_size": a.merge, "temporal_patch_size": 2, "in_channels": 3,
        },
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    model = Qwen2VLForConditionalGeneration(cfg).to(torch.bfloat16)
    pixels = {"min_pixels": a.min_pixels, "max_pixels": a.max_pixels}
    size = {"shortest_edge": a.min_pixels, "longest_edge": a.max_pixels}
    images = Qwen2VLImageProcessor(patch_size=a.patch, merge_size=a.merge, size=size, **pixels)
    videos = Qwen2VLVideoProcessor(patch_size=a.patch, merge_size=a.merge, size=size, **pixels)
    proc = Qwen2VLProcessor(image_processor=images, tokenizer=fast, video_processor=videos,
                            chat_template=CHAT_TEMPLATE)
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    proc.save_pretrained(a.out)
    fast.save_pretrained(a.out)
    with open(os.path.join(a.out, "replay_model.json"), "w") as fh:
        json.dump({"kind": "tiny-qwen2-vl", "vocab": vocab, "seed": a.seed, "tokenizer_vocab": len(fast),
                   "patch": a.patch, "merge": a.merge, "min_pixels": a.min_pixels, "max_pixels": a.max_pixels,
                   "image_token": "<|image_pad|>", "image_token_id": ids["<|image_pad|>"],
                   "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                   "torch": torch.__version__}, fh)
    print(json.dumps({"ok": True, "out": a.out, "tokenizer_vocab": len(fast)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
