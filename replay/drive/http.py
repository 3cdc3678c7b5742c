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
import time
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


# a pooled connection idle this long is not reused: servers close theirs after a while (uvicorn, and so
# vLLM, after 5 s: VLLM_HTTP_TIMEOUT_KEEP_ALIVE), and one reused just as the server closes it loses its request
IDLE_MAX_S = 4.0


class RawHttpClient:
    def __init__(self, base_url: str, timeout_s: float = 600.0, idle_max_s: float = IDLE_MAX_S) -> None:
        u = urllib.parse.urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"only plain http://host:port URLs are supported, got {base_url!r}")
        self.host, self.port = u.hostname, u.port or 80
        self.prefix = u.path.rstrip("/")
        self.timeout_s = timeout_s
        self.idle_max_s = idle_max_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []  # (.., when it went idle)
        self._closing: set[asyncio.StreamWriter] = set()  # closed, not yet confirmed by the loop
        self.resent = 0  # requests sent again on a new connection, the pooled one having been closed under them
        self._head = (f"Host: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                      "Accept: text/event-stream, application/json\r\n").encode()

    def _pooled(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The most recently used idle connection that can still carry a request; those the server has
        closed (its end seen) or that have idled longer than servers keep them are closed here."""
        now = time.monotonic()
        while self._idle:
            reader, writer, since = self._idle.pop()
            if not (reader.at_eof() or reader.exception() is not None or writer.is_closing()
                    or now - since > self.idle_max_s):
                return reader, writer
            self._drop(writer)
        return None

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        writer.close()
        self._closing.add(writer)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 22), min(self.timeout_s, 30.0))
        except (OSError, asyncio.TimeoutError) as e:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {e or type(e).__name__}") from None

    async def post(self, path: str, body: bytes, on_data: OnData | None = None) -> tuple[int, bytes]:
        """A request sent on a pooled connection that the server closed without a byte of answer (it
        closed the connection as idle while the request was on its way: uvicorn's keep-alive timeout) is
        sent once more, on a new connection (never on another pooled one, which may be as stale): the
        server never saw it, so it is no failure. On a new connection the same is an error."""
        req = (f"POST {self.prefix}{path} HTTP/1.1\r\n".encode() + self._head
               + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        pooled = self._pooled()
        while True:
            reader, writer = pooled if pooled is not None else await self._connect()
            keep = False
            try:
                writer.write(req)
                async with asyncio.timeout(self.timeout_s):
                    try:
                        status_line = await reader.readuntil(b"\r\n")
                    except (asyncio.IncompleteReadError, ConnectionError) as e:
                        if pooled is not None and not getattr(e, "partial", b""):
                            pooled = None  # stale: not a byte came back; again, on a new connection
                            self.resent += 1
                            continue
                        raise
                    status, out, keep = await self._response(reader, status_line, on_data)
                return status, out
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, ValueError) as e:
                raise HttpError(f"{type(e).__name__}: {e}") from None
            except TimeoutError:
                raise HttpError(f"no complete response within {self.timeout_s:.0f} s") from None
            finally:
                if keep:
                    self._idle.append((reader, writer, time.monotonic()))
                else:
                    self._drop(writer)

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
            self._drop(self._idle.pop()[1])
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
