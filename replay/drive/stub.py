"""A minimal OpenAI-compatible completions server, for measuring the driver rather than an engine.

It answers ``POST /v1/completions`` (streamed as server-sent events, or one JSON body when
``stream`` is false), ``GET /v1/models``, ``GET /health`` and ``GET /metrics`` over plain asyncio
with HTTP/1.1 keep-alive, and does no work per token, so what a benchmark measures is the
driver's own timing. Run it as ``python -m replay.drive.stub --port 8123``; it records the arrival
time of every completion request (``--arrivals FILE``, monotonic µs) when asked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

_MAX_TOKENS = 4  # at most this many streamed chunks per request, whatever max_tokens says


def _response(status: str, body: bytes, ctype: str) -> bytes:
    head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n")
    return head.encode() + body


def _completion(req: dict[str, Any]) -> bytes:
    n = max(1, min(_MAX_TOKENS, int(req.get("max_tokens") or 1)))
    if not req.get("stream"):
        obj = {"id": "cmpl-stub", "object": "text_completion", "choices": [{"index": 0, "text": "x" * n}],
               "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
        return _response("200 OK", json.dumps(obj).encode(), "application/json")
    chunk = json.dumps({"id": "cmpl-stub", "object": "text_completion", "choices": [{"index": 0, "text": "x"}]})
    body = "".join(f"data: {chunk}\n\n" for _ in range(n))
    if (req.get("stream_options") or {}).get("include_usage"):  # (as vLLM ends such a stream: compact JSON)
        prompt = req.get("prompt")
        used = len(prompt) if isinstance(prompt, list) else len(str(prompt or "").split())  # (a word a token)
        body += "data: " + json.dumps({"id": "cmpl-stub", "object": "text_completion", "choices": [], "usage": {
            "prompt_tokens": used, "completion_tokens": n, "total_tokens": used + n}}, separators=(",", ":")) + "\n\n"
    body += "data: [DONE]\n\n"
    return _response("200 OK", body.encode(), "text/event-stream")


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
                if method == "POST" and path.startswith("/v1/completions"):
                    if self.arrivals is not None:
                        self.arrivals.append(t_us)
                    try:
                        req = json.loads(body or b"{}")
                    except json.JSONDecodeError:
                        writer.write(_response("400 Bad Request", b'{"error":"bad json"}', "application/json"))
                    else:
                        writer.write(_completion(req))
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
