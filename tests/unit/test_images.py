"""Images for multimodal requests, and the driver sending them as chat completions.

The PNGs are read back by a decoder written from the PNG specification (chunks, CRCs, zlib, one
filter byte per row), not by the encoder's own code; the engine-side check that vLLM's processor
takes them, at the token counts Qwen2-VL gives each size, is tests/integration/test_multimodal.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib
from typing import Any

import pytest

from replay.drive import images
from replay.drive.driver import CHAT, COMPLETIONS, Driver, chat_text, request_body
from replay.drive.http import FakeHttpClient


def decode_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, RGB bytes) of an 8-bit RGB PNG whose rows are all unfiltered; each chunk's CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, head = 8, b"", b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(kind + body)
        head, idat = (body, idat) if kind == b"IHDR" else (head, idat + body if kind == b"IDAT" else idat)
        pos += 12 + n
    w, h, depth, colour = struct.unpack(">IIBB", head[:10])
    assert (depth, colour) == (8, 2)
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w) and all(raw[y * (1 + 3 * w)] == 0 for y in range(h))
    return w, h, b"".join(raw[y * (1 + 3 * w) + 1:(y + 1) * (1 + 3 * w)] for y in range(h))


def test_png_has_the_size_asked_and_its_pixels_follow_from_the_seed() -> None:
    # GIVEN two seeds WHEN a 100 x 37 image is made from each, twice
    w, h, px = decode_png(images.png(100, 37, "r1:0:0"))
    again = decode_png(images.png(100, 37, "r1:0:0"))[2]
    other = decode_png(images.png(100, 37, "r2:0:0"))[2]
    # THEN it is 100 x 37, the same seed gives the same pixels, another seed others
    assert (w, h) == (100, 37) and px == again and px != other
    assert len(set(px)) > 200  # (not a flat colour: every byte value nearly)


def test_data_url_of_a_large_image_stays_small() -> None:
    url = images.data_url(1024, 768, "s")
    assert url.startswith("data:image/png;base64,")
    assert decode_png(base64.b64decode(url.split(",", 1)[1]))[:2] == (1024, 768)
    assert len(url) < 400_000  # (2.4 MB of pixels)


@pytest.mark.parametrize("item,size", [
    ({"type": "image", "count": 1, "width": 1024, "height": 768}, (1024, 768, "recorded")),
    ({"type": "image", "count": 2, "tokens": 512}, (448, 448, "tokens")),  # 256 tokens an image, 28 x 28 px each
    ({"type": "image", "count": 3}, (448, 448, "default")),
    ({"type": "image", "width": 0, "height": 10, "tokens": 1}, (28, 28, "tokens")),
])
def test_image_size_from_what_the_trace_recorded(item: dict[str, Any], size: tuple[int, int, str]) -> None:
    got = images.image_size(item)
    assert (got.width, got.height, got.source) == size


def test_content_parts_one_image_each_and_other_types_by_name() -> None:
    mm = [{"type": "image", "count": 2, "width": 64, "height": 32}, {"type": "audio", "count": 1, "tokens": 50}]
    parts = images.content_parts(mm, "r7")
    assert [p["type"] for p in parts] == ["image_url", "image_url", "audio"]
    urls = [p["image_url"]["url"] for p in parts[:2]]
    assert urls[0] != urls[1]  # (two images of a request are two images, not one sent twice)
    assert images.content_parts(mm, "r7")[0] == parts[0]


def test_limit_mm_per_prompt_is_the_most_images_a_request_holds() -> None:
    reqs = [{"mm": None}, {"mm": [{"type": "image", "count": 2}, {"type": "image"}]}, {"mm": [{"type": "audio", "count": 5}]}]
    assert images.limit_mm_per_prompt(reqs) == {"image": 3}
    assert images.limit_mm_per_prompt([{"mm": None}, {}]) == {}


def _chat_handler(seen: list[tuple[str, dict[str, Any]]]) -> Any:
    def handler(path: str, body: dict[str, Any]) -> tuple[int, str]:
        seen.append((path, body))
        if path == COMPLETIONS:
            return 200, 'data: {"choices":[{"text":"x"}]}\n\ndata: {"choices":[],"usage":{"prompt_tokens":3}}\n\ndata: [DONE]\n\n'
        n_img = sum(p["type"] == "image_url" for p in body["messages"][0]["content"])
        if n_img > 2:
            return 400, json.dumps({"error": {"message": "At most 2 image(s) may be provided in one prompt.",
                                              "type": "BadRequestError", "code": 400}})
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
        chunks += [{"choices": [{"index": 0, "delta": {"content": "y"}}]}] * body["max_tokens"]
        chunks += [{"choices": [], "usage": {"prompt_tokens": 100 * n_img + 5}}]
        return 200, "".join(f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks) + "data: [DONE]\n\n"  # (compact, as vLLM writes)
    return handler


def test_driver_sends_images_as_chat_and_records_the_servers_counts_and_refusals() -> None:
    # GIVEN a text request, one with an image, and one with more images than the server takes
    reqs = [{"id": "t", "t_us": 0, "input_tokens": 3, "output_tokens": 2},
            {"id": "i", "t_us": 1000, "input_tokens": 3, "output_tokens": 2,
             "mm": [{"type": "image", "count": 1, "width": 56, "height": 56}],
             "sampling": {"logprobs": 2}},
            {"id": "many", "t_us": 2000, "input_tokens": 3, "output_tokens": 2,
             "mm": [{"type": "image", "count": 3, "width": 28, "height": 28}]}]
    seen: list[tuple[str, dict[str, Any]]] = []
    d = Driver("http://fake", "m", client=FakeHttpClient(_chat_handler(seen)))
    items = [(r["t_us"], r["id"], request_body(r, [11, 12, 13])) for r in reqs]
    out = asyncio.run(d.run(items))
    # THEN the text request went to completions, the others to chat with their images before the text
    paths = {b.get("prompt") is not None and "t" or ("many" if len(b["messages"][0]["content"]) > 2 else "i"): p
             for p, b in seen}
    assert paths == {"t": COMPLETIONS, "i": CHAT, "many": CHAT}
    chat = next(b for p, b in seen if p == CHAT and len(b["messages"][0]["content"]) == 2)
    assert chat["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert chat["messages"][0]["content"][1] == {"type": "text", "text": "w11 w"}  # (3 tokens to the tiny tokenizer)
    assert "_mm" not in chat and "prompt" not in chat and (chat["logprobs"], chat["top_logprobs"]) == (True, 2)
    # AND the server's prompt tokens (image tokens in them) and output tokens are recorded, the role chunk no token
    assert (out["i"].status, out["i"].input_tokens, out["i"].output_tokens) == ("ok", 105, 2)
    # AND the refused request carries the server's own message
    assert out["many"].status == "error"
    assert out["many"].error == "HTTP 400: At most 2 image(s) may be provided in one prompt."


@pytest.mark.parametrize("mm,says", [
    ('"image"', "mm must be null or a list of items"),
    ('[3]', "mm[0] must be an object with a type"),
    ('[{"type": 7}]', "mm[0] must be an object with a type"),
    ('[{"type": "image", "count": 0}]', "mm[0].count must be null or an integer >= 1, got 0"),
    ('[{"type": "image"}, {"type": "image", "width": -5}]', "mm[1].width must be null or an integer >= 0, got -5"),
    ('[{"type": "image", "tokens": 1.5}]', "mm[0].tokens must be null or an integer >= 0, got 1.5"),
])
def test_trace_with_a_bad_mm_item_is_refused_at_its_line(mm: str, says: str, tmp_path: Any) -> None:
    from replay.errors import ReplayError
    from replay.trace.format import read_trace
    t = tmp_path / "t.jsonl"
    t.write_text('{"kind": "header", "schema": "replay-trace/1", "source": {}, "time": {}}\n'
                 '{"t_us": 0, "input_tokens": 4, "mm": [{"type": "image", "width": 8, "height": 8, "tokens": null}]}\n'
                 f'{{"t_us": 1, "input_tokens": 4, "mm": {mm}}}\n')
    with pytest.raises(ReplayError) as e:
        read_trace(t)
    assert e.value.message.startswith(f"{t}:3: ") and says in e.value.message


@pytest.mark.parametrize("ids,text", [
    ([11, 12, 13], "w11 w"), ([5], "w"), ([5, 6], "w5"), ([], ""), ([4001, 2, 9, 9], "w1 w9"),
])
def test_chat_text_is_a_word_for_each_pair_of_ids(ids: list[int], text: str) -> None:
    assert chat_text(ids) == text


def test_text_of_a_request_whose_items_recorded_their_tokens_is_the_rest_of_its_prompt() -> None:
    # GIVEN a ServeGen request: 300 prompt tokens, of which its two images took 256
    r = {"id": "sg", "t_us": 0, "input_tokens": 300, "output_tokens": 1, "mm": [{"type": "image", "count": 2, "tokens": 256}]}
    body = request_body(r, list(range(10, 310)))
    # THEN its text is the other 24 tokens: the images, 128 tokens each (some 317 x 317 pixels), bring theirs,
    # and the chat template its 16 and 2 an image
    assert body["prompt"] == list(range(10, 34)) and images.image_size(r["mm"][0]).width == 317
    # AND a request whose items recorded sizes only keeps all its text
    r = {**r, "mm": [{"type": "image", "count": 1, "width": 64, "height": 64}]}
    assert len(request_body(r, list(range(10, 310)))["prompt"]) == 300
