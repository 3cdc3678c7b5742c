"""A minimal OpenAI-compatible completions server, for measuring the driver rather than an engine.

It answers ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streamed as server-sent
events, or one JSON body when ``stream`` is false), ``GET /v1/models``, ``GET /health`` and
``GET /metrics`` over plain asyncio with HTTP/1.1 keep-alive, and does no work per token, so what a
benchmark measures is the driver's own timing. A chat prompt's tokens are its words and its PNG
images' tokens on Qwen2-VL's grid, read from each image's header (the image is not decoded). Run it as ``python -m replay.drive.stub --port 8123``; it records the arrival
time of every completion request (``--arrivals FILE``, monotonic µs) when asked.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import struct
import time
from pathlib import Path
from typing import Any

from replay.drive.images import grid_tokens

_MAX_TOKENS = 4  # at most this many streamed chunks per request, whatever max_tokens says


def _response(status: str, body: bytes, ctype: str) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n")
    return head.encode() + body


def _completion(req: dict[str, Any], chat: bool = False) -> bytes:
    n = max(1, min(_MAX_TOKENS, int(req.get("max_tokens") or 1)))
    kind = "chat.completion" if chat else "text_completion"
    if not req.get("stream"):
        choice = {"index": 0, "message": {"role": "assistant", "content": "x" * n}} if chat else {"index": 0, "text": "x" * n}
        used = _prompt_tokens(req) if chat else 1  # (a text completion's unstreamed usage: 1, whatever its prompt)
        obj = {"id": "cmpl-stub", "object": kind, "choices": [choice],
               "usage": {"prompt_tokens": used, "completion_tokens": n, "total_tokens": n + used}}
        return _response("200 OK", json.dumps(obj).encode(), "application/json")
    kind += ".chunk" if chat else ""
    each = {"index": 0, "delta": {"content": "x"}} if chat else {"index": 0, "text": "x"}
    chunk = json.dumps({"id": "cmpl-stub", "object": kind, "choices": [each]})
    role = json.dumps({"id": "cmpl-stub", "object": kind, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
                      separators=(",", ":"))  # (a chat stream opens with the role, as vLLM's does: no token)
    body = (f"data: {role}\n\n" if chat else "") + "".join(f"data: {chunk}\n\n" for _ in range(n))
    if (req.get("stream_options") or {}).get("include_usage"):  # (as vLLM ends such a stream: compact JSON)
        used = _prompt_tokens(req)
        body += "data: " + json.dumps({"id": "cmpl-stub", "object": kind, "choices": [], "usage": {
            "prompt_tokens": used, "completion_tokens": n, "total_tokens": used + n}}, separators=(",", ":")) + "\n\n"
    body += "data: [DONE]\n\n"
    return _response("200 OK", body.encode(), "text/event-stream")


def _prompt_tokens(req: dict[str, Any]) -> int:
    """A prompt's tokens: its ids, or a word a token; a chat message's text parts as the tiny models'
    tokenizer reads ``chat_text`` ('w12' two tokens, a lone 'w' one) and its PNG data-URL images by their
    size on Qwen2-VL's grid (no chat template's tokens)."""
    prompt = req.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    if "messages" not in req:
        return len(str(prompt or "").split())
    used = 0
    for m in req.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        parts: list[Any] = content if isinstance(content, list) else [{"type": "text", "text": str(content or "")}]
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text":
                used += sum(min(2, len(w)) for w in str(part.get("text") or "").split())
            elif part.get("type") == "image_url":
                used += _png_tokens(str((part.get("image_url") or {}).get("url") or ""))
    return used


def _png_tokens(url: str) -> int:
    """The tokens of a PNG data URL's image, from the width and height in its IHDR (the first 24 bytes);
    0 for anything else."""
    head = base64.b64decode(url.partition(",")[2][:32] + "==", validate=False)[:24] if url.startswith("data:image/png;base64,") else b""
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n":
        return 0
    width, height = struct.unpack(">II", head[16:24])
    return grid_tokens(width, height) if width and height else 0


class StubServer:
    def __init__(self, arrivals: list[int] | None = None) -> None:
        self.arrivals = arrivals

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                t_us = time.monotonic_ns() // 1000
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = (lines[0].split(" ") + ["", ""])[:3]
                length = 0
                for ln in lines[1:]:
                    if ln.lower().startswith("content-length:"):
                        length = int(ln.split(":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                if method == "POST" and path.startswith(("/v1/completions", "/v1/chat/completions")):
                    if self.arrivals is not None:
                        self.arrivals.append(t_us)
                    try:
                        req = json.loads(body or b"{}")
                    except json.JSONDecodeError:
                        writer.write(_response("400 Bad Request", b'{"error":"bad json"}', "application/json"))
                    else:
                        writer.write(_completion(req, chat=path.startswith("/v1/chat/")))
                elif path.startswith("/v1/models"):
                    writer.write(_response("200 OK", b'{"data":[{"id":"stub"}]}', "application/json"))
                elif path.startswith("/health"):
                    writer.write(_response("200 OK", b"", "text/plain"))
                elif path.startswith("/metrics"):
                    writer.write(_response("200 OK", b"vllm:num_requests_running 0\n", "text/plain"))
                else:
                    writer.write(_response("404 Not Found", b"", "text/plain"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()


async def serve(port: int, arrivals_path: Path | None) -> None:
    arrivals: list[int] | None = [] if arrivals_path else None
    stub = StubServer(arrivals)
    server = await asyncio.start_server(stub.handle, "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"stub listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await stop.wait()
    if arrivals_path and arrivals is not None:
        arrivals_path.write_text("\n".join(map(str, arrivals)) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--arrivals", type=Path, default=None, help="write request arrival times (monotonic µs) here on exit")
    a = ap.parse_args()
    asyncio.run(serve(a.port, a.arrivals))


if __name__ == "__main__":
    main()
