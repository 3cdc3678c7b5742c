"""The driver's one seam to the engine's HTTP API: POST a JSON body, stream the answer back.

A replay must send thousands of requests a second on a small machine without disturbing the
engine or its own schedule, and a general-purpose client spends milliseconds of CPU per request.
``RawHttpClient`` is a minimal HTTP/1.1 client on asyncio streams (keep-alive pool, chunked and
sized bodies, server-sent events handed over line by line) that spends tens of microseconds.
``FakeHttpClient`` ships beside it, the way httpx ships MockTransport, so the driver can be tested
without a server: it calls a handler with the decoded request and plays back its answer.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import Callable
from typing import Any, Protocol

OnData = Callable[[bytes], None]


class HttpError(Exception):
    """The request failed below HTTP (refused, reset, timed out, malformed response)."""


class HttpClient(Protocol):
    async def post(self, path: str, body: bytes, on_data: OnData | None = None) -> tuple[int, bytes]:
        """POST ``body``; SSE ``data:`` payloads go to ``on_data`` as they arrive, any other body is
        returned whole. Returns (status, body-or-empty)."""
        ...

    async def aclose(self) -> None: ...


def _sse(buf: bytearray, on_data: OnData) -> None:
    """Hand complete ``data:`` lines in ``buf`` to ``on_data``; keep a partial last line in ``buf``."""
    end = buf.rfind(b"\n")
    if end < 0:
        return
    for line in bytes(buf[:end]).split(b"\n"):
        if line.startswith(b"data:"):
            on_data(line[5:].strip())
    del buf[:end + 1]


class RawHttpClient:
    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"only plain http://host:port URLs are supported, got {base_url!r}")
        self.host, self.port = u.hostname, u.port or 80
        self.prefix = u.path.rstrip("/")
        self.timeout_s = timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._closing: set[asyncio.StreamWriter] = set()  # closed, not yet confirmed by the loop
        self._head = (f"Host: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                      "Accept: text/event-stream, application/json\r\n").encode()

    async def post(self, path: str, body: bytes, on_data: OnData | None = None) -> tuple[int, bytes]:
        req = (f"POST {self.prefix}{path} HTTP/1.1\r\n".encode() + self._head
               + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        for attempt in (0, 1):
            reused = bool(self._idle)
            if reused:
                reader, writer = self._idle.pop()
            else:
                try:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection(self.host, self.port, limit=1 << 22), min(self.timeout_s, 30.0))
                except (OSError, asyncio.TimeoutError) as e:
                    raise HttpError(f"cannot connect to {self.host}:{self.port}: {e or type(e).__name__}") from None
            keep = False
            try:
                writer.write(req)
                async with asyncio.timeout(self.timeout_s):
                    try:
                        status_line = await reader.readuntil(b"\r\n")
                    except (asyncio.IncompleteReadError, ConnectionError):
                        if reused and attempt == 0:
                            continue  # the server closed an idle keep-alive connection: retry fresh
                        raise
                    status, out, keep = await self._response(reader, status_line, on_data)
                return status, out
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError) as e:
                raise HttpError(f"{type(e).__name__}: {e}") from None
            except TimeoutError:
                raise HttpError(f"no complete response within {self.timeout_s:.0f} s") from None
            finally:
                if keep:
                    self._idle.append((reader, writer))
                else:
                    writer.close()
                    self._closing.add(writer)
        raise HttpError("connection closed before a response")

    async def _response(self, reader: asyncio.StreamReader, status_line: bytes,
                        on_data: OnData | None) -> tuple[int, bytes, bool]:
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError(f"not an HTTP response: {status_line[:80]!r}")
        status = int(parts[1])
        length: int | None = None
        chunked = False
        keep = parts[0] == b"HTTP/1.1"
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"connection":
                keep = b"close" not in value.lower()
        stream = on_data is not None and status == 200
        buf = bytearray()
        if chunked:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    break
                buf += (await reader.readexactly(size + 2))[:-2]
                if stream and on_data is not None:
                    _sse(buf, on_data)
        elif length is not None:
            buf += await reader.readexactly(length)
        else:
            buf += await reader.read()
            keep = False
        if stream and on_data is not None:
            buf += b"\n"
            _sse(buf, on_data)
            return status, b"", keep
        return status, bytes(buf), keep

    async def aclose(self) -> None:
        """Close every connection and let the loop finish closing them (no transport outlives it)."""
        while self._idle:
            _, w = self._idle.pop()
            w.close()
            self._closing.add(w)
        waits = [w.wait_closed() for w in self._closing]
        self._closing.clear()
        if waits:
            await asyncio.wait_for(asyncio.gather(*waits, return_exceptions=True), 5.0)


Handler = Callable[[str, dict[str, Any]], tuple[int, str]]


class FakeHttpClient:
    """Calls ``handler(path, json_body) -> (status, text)``; text in SSE form is streamed to on_data."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[tuple[str, dict[str, Any]]] = []

    async def post(self, path: str, body: bytes, on_data: OnData | None = None) -> tuple[int, bytes]:
        obj = json.loads(body)
        self.requests.append((path, obj))
        await asyncio.sleep(0)
        status, text = self.handler(path, obj)
        if on_data is not None and status == 200 and text.lstrip().startswith("data:"):
            buf = bytearray(text.encode() + b"\n")
            _sse(buf, on_data)
            return status, b""
        return status, text.encode()

    async def aclose(self) -> None:
        return None
