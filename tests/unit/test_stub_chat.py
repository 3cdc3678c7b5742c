"""The driver's stub server answers chat completions as vLLM does, so that a multimodal trace can be
driven without an engine: a streamed reply opening with the role, then its tokens, then the usage, whose
prompt tokens count the images by their size."""

from __future__ import annotations

import asyncio
from typing import Any

from replay.drive.driver import Driver, request_body
from replay.drive.stub import StubServer


def _drive(reqs: list[dict[str, Any]]) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        server = await asyncio.start_server(StubServer([]).handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with server:
            d = Driver(url, "stub", timeout_s=10)
            return await d.run([(0, str(r["id"]), request_body(r, [1, 2, 3])) for r in reqs])
    return asyncio.run(main())


def test_image_requests_come_back_with_their_image_tokens() -> None:
    # GIVEN a text request, and two requests of one image each at 224 x 224 and 1792 x 1792
    def img(w: int, h: int) -> list[dict[str, Any]]:
        return [{"type": "image", "count": 1, "width": w, "height": h}]
    reqs = [{"id": "text", "t_us": 0, "input_tokens": 3, "output_tokens": 2},
            {"id": "low", "t_us": 0, "input_tokens": 3, "output_tokens": 2, "mm": img(224, 224)},
            {"id": "high", "t_us": 0, "input_tokens": 3, "output_tokens": 2, "mm": img(1792, 1792)}]
    # WHEN they are driven against the stub (the image requests as chat completions)
    out = _drive(reqs)
    # THEN all complete, each with its output tokens (the role chunk is none), and the images' tokens counted
    assert {k: (o.status, o.output_tokens) for k, o in out.items()} == dict.fromkeys(("text", "low", "high"), ("ok", 2))
    assert out["text"].input_tokens == 3
    assert out["low"].input_tokens == 3 + 64  # (the text's three tokens 'w1 w', 8 x 8 tokens of 28 px)
    assert out["high"].input_tokens == 3 + 4096  # (64 x 64 tokens: within Qwen2-VL's max_pixels)
