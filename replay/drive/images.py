"""Images for a trace's multimodal items: deterministic PNGs at the recorded sizes, as data URLs.

A trace keeps what an image costs, not the image: its width and height (``synth``), or the tokens it
took (ServeGen), or only that there was one (Azure's image counts). Each image is made from the
item's size and a seed that names the request and the item, so a replay sends the same bytes every
time, and no two requests send the same image (vLLM caches processed items by their content: the
same image in every request would reach the encoder once). The pixels are a tile repeated along
each row, which zlib packs small (a 1024 x 768 image is some 0.2 MB of data URL); all rows but the
last are the same for every image of a size and compressed once, the last is the request's own.
Stdlib only: ``replay`` needs neither PIL nor numpy to send images.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import math
import random
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeGuard

PIXELS_PER_TOKEN = 28 * 28  # Qwen2-VL and its kin: 14-pixel patches, 2 x 2 merged into one token
DEFAULT_SIDE = 448  # an image item of no recorded size (Azure's counts): 448 x 448
TILE = 64  # pixels of the seeded tile repeated along each row
CHAT_TEMPLATE_TOKENS = 16  # the tiny Qwen2-VL's '<|im_start|>user\n' … '<|im_end|>\n<|im_start|>assistant\n'
IMAGE_MARKER_TOKENS = 2  # its '<|vision_start|>' and '<|vision_end|>' around each image's tokens


@dataclass(frozen=True)
class ImageSize:
    width: int
    height: int
    source: Literal["recorded", "tokens", "default"]  # where the size came from


def image_size(item: dict[str, Any]) -> ImageSize:
    """One image of an ``mm`` item: its recorded width and height; else a square of the item's tokens
    per image (``tokens`` / ``count``) at 28 x 28 pixels a token; else 448 x 448."""
    w, h = item.get("width"), item.get("height")
    if _positive_int(w) and _positive_int(h):
        return ImageSize(int(w), int(h), "recorded")
    tokens, count = item.get("tokens"), item.get("count", 1)
    if _positive_int(tokens) and _positive_int(count):
        side = max(28, round(math.sqrt(int(tokens) / int(count) * PIXELS_PER_TOKEN)))
        return ImageSize(side, side, "tokens")
    return ImageSize(DEFAULT_SIDE, DEFAULT_SIDE, "default")


@dataclass(frozen=True)
class TokenGrid:
    """How a Qwen2-VL-style processor turns an image into tokens: the image resized to multiples of
    ``patch * merge`` pixels within [min_pixels, max_pixels], one token per ``merge`` x ``merge`` patches.
    The defaults are Qwen2-VL's and Qwen2.5-VL's published preprocessor configuration."""

    patch: int = 14
    merge: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 16384

    @classmethod
    def of_model(cls, model_dir: str | Path) -> TokenGrid:
        """The grid a model folder states: the tiny models' ``replay_model.json``, else the image processor's
        settings in ``preprocessor_config.json`` / ``processor_config.json``; Qwen2-VL's where none says."""
        d = Path(model_dir)
        meta = _json_object(d / "replay_model.json")
        if not meta:
            proc = _json_object(d / "preprocessor_config.json") or _json_object(d / "processor_config.json")
            proc = proc.get("image_processor", proc) if isinstance(proc.get("image_processor"), dict) else proc
            size: dict[str, Any] = proc["size"] if isinstance(proc.get("size"), dict) else {}
            meta = {"patch": proc.get("patch_size"), "merge": proc.get("merge_size"),
                    "min_pixels": proc.get("min_pixels", size.get("shortest_edge")),
                    "max_pixels": proc.get("max_pixels", size.get("longest_edge"))}
        return cls(**{k: meta[k] for k in ("patch", "merge", "min_pixels", "max_pixels") if _positive_int(meta.get(k))})


def _json_object(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def grid_tokens(width: int, height: int, grid: TokenGrid = TokenGrid()) -> int:
    """The tokens one image of ``width`` x ``height`` takes: transformers' ``smart_resize`` for Qwen2-VL
    (each side rounded to the factor, then scaled down to max_pixels or up to min_pixels keeping the
    aspect), one token per factor x factor pixels."""
    f = grid.patch * grid.merge
    h, w = round(height / f) * f, round(width / f) * f
    if h * w > grid.max_pixels:
        beta = math.sqrt(height * width / grid.max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < grid.min_pixels:
        beta = math.sqrt(grid.min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return (h // f) * (w // f)


def item_image_tokens(item: dict[str, Any], grid: TokenGrid = TokenGrid()) -> int | None:
    """The image tokens an ``mm`` item takes, all its images: the tokens the trace recorded (ServeGen),
    else its size's on ``grid``; an item of no size is the 448 x 448 image the driver sends for it.
    None for an item that is not an image (its tokens are not the image tower's)."""
    if item.get("type", "image") != "image":
        return None
    tokens, count = item.get("tokens"), item.get("count", 1)
    n = int(count) if _positive_int(count) else 1
    if _positive_int(tokens):
        return int(tokens)
    size = image_size(item)
    return n * grid_tokens(size.width, size.height, grid)


def request_image_tokens(mm: list[dict[str, Any]] | None, grid: TokenGrid = TokenGrid()) -> int | None:
    """A request's image tokens, all its items together; None for a request with no image."""
    got = [t for t in (item_image_tokens(m, grid) for m in mm or []) if t is not None]
    return sum(got) if got else None


def _positive_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def png(width: int, height: int, seed: str) -> bytes:
    """An RGB PNG of ``width`` x ``height``: every row but the last a tile seeded by the size, compressed
    once per size; the last row from ``seed``, compressed on its own after them (a deflate stream may
    go on from a full flush), so an image costs one row's compression, not its whole."""
    body, adler = _body(width, height)
    last = b"\x00" + random.Random(_seed_bytes(seed)).randbytes(width * 3)
    tail = zlib.compressobj(6, zlib.DEFLATED, -15)
    idat = b"\x78\x9c" + body + tail.compress(last) + tail.flush() + struct.pack(">I", zlib.adler32(last, adler))
    head = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", head) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


@functools.lru_cache(maxsize=16)
def _body(width: int, height: int) -> tuple[bytes, int]:
    """The first ``height - 1`` rows of every image of that size, as raw deflate ending in a full flush,
    and their Adler-32 (the zlib checksum, carried on over the last row)."""
    rng = random.Random(_seed_bytes(f"{width}x{height}"))
    tile = [rng.randbytes(TILE * 3) for _ in range(TILE)]
    reps = -(-width // TILE)
    raw = b"".join(b"\x00" + (tile[y % TILE] * reps)[:width * 3] for y in range(height - 1))
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(raw) + c.flush(zlib.Z_FULL_FLUSH), zlib.adler32(raw)


def _seed_bytes(seed: str) -> bytes:
    return hashlib.blake2b(seed.encode(), digest_size=8).digest()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def data_url(width: int, height: int, seed: str) -> str:
    return "data:image/png;base64," + base64.b64encode(png(width, height, seed)).decode()


def content_parts(mm: list[dict[str, Any]], seed: str) -> list[dict[str, Any]]:
    """A request's ``mm`` items as OpenAI chat content parts: each image (``count`` of an item) as a PNG
    data URL; an item of another type as a part of that type, for the server to take or refuse by its
    own words (the replay makes no media but images)."""
    parts: list[dict[str, Any]] = []
    for i, item in enumerate(mm):
        kind = str(item.get("type", "image"))
        count = item.get("count", 1)
        n = int(count) if _positive_int(count) else 1
        if kind != "image":
            parts += [{"type": kind} for _ in range(n)]
            continue
        size = image_size(item)
        parts += [{"type": "image_url", "image_url": {"url": data_url(size.width, size.height, f"{seed}:{i}:{k}")}}
                  for k in range(n)]
    return parts


def images_per_request(mm: list[dict[str, Any]] | None) -> int:
    """How many images a request's items hold."""
    return sum(int(m.get("count", 1)) if _positive_int(m.get("count", 1)) else 1
               for m in mm or [] if m.get("type", "image") == "image")


def chat_frame_tokens(images: int) -> int:
    """The tokens the tiny Qwen2-VL's chat template puts around one user message's text (its role
    markers, 16) and each image's tokens (``<|vision_start|>`` and ``<|vision_end|>``, 2): a prompt
    count a server made of a chat request holds them, and the replay's chat template adds them again."""
    return CHAT_TEMPLATE_TOKENS + IMAGE_MARKER_TOKENS * images


def recorded_tokens(mm: list[dict[str, Any]] | None) -> int:
    """The tokens a request's items took where the trace recorded them (ServeGen); 0 where it did not."""
    return sum(int(m["tokens"]) for m in mm or [] if _positive_int(m.get("tokens")))


def limit_mm_per_prompt(requests: list[dict[str, Any]]) -> dict[str, int]:
    """vLLM's ``limit_mm_per_prompt`` the trace needs: the most images any request holds ({} for none)."""
    most = max((images_per_request(r.get("mm")) for r in requests), default=0)
    return {"image": most} if most else {}
