"""The driver's raw HTTP client against real sockets: the stub server, and a chunked SSE server that
closes idle keep-alive connections the way uvicorn does."""

from __future__ import annotations

import asyncio
import json

import pytest

from replay.drive.driver import Driver
from replay.drive.http import HttpError, RawHttpClient
from replay.drive.stub import StubServer


async def _with_server(handler, fn):  # type: ignore[no-untyped-def]
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        return await fn(f"http://127.0.0.1:{port}")


def test_driver_over_real_sockets_against_stub() -> None:
    arrivals: list[int] = []
    items = [(i * 2_000, f"r{i}", {"prompt": [1, 2, 3], "max_tokens": 3}) for i in range(200)]
    items.append((400_000, "lp", {"prompt": [1, 2], "max_tokens": 2, "prompt_logprobs": 1}))
    items.append((401_000, "text", {"prompt": "a prompt of seven words, as text", "max_tokens": 3}))

    async def go(url: str) -> dict:
        return await Driver(url, "stub").run(items)

    out = asyncio.run(_with_server(StubServer(arrivals).handle, go))
    assert len(arrivals) == 202 and all(o.status == "ok" for o in out.values())
    # (the stream's closing usage chunk is no token; it tells the prompt's length as the server counted it)
    assert all(o.output_tokens == 3 and o.first_token_us is not None for k, o in out.items() if k != "lp")
    assert all(o.input_tokens == 3 for k, o in out.items() if k.startswith("r")) and out["text"].input_tokens == 7
    assert out["lp"].output_tokens == 2 and out["lp"].first_token_us is None  # unstreamed JSON body
    assert out["lp"].input_tokens == 1  # (its usage, as the stub gives it)


async def _chunked_closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Chunked SSE split mid-line; after each response the connection stays open but is closed
    by the server once the client has put it back in its pool."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    body = json.loads(await reader.readexactly(length))
    if body.get("max_tokens") == 99:
        writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nbad request")
    else:
        events = b"".join(b'data: {"choices":[{"text":"x"}]}\n\n' for _ in range(body["max_tokens"])) + b"data: [DONE]\n\n"
        pieces = [events[i:i + 7] for i in range(0, len(events), 7)]
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n")
        for p in pieces:
            writer.write(f"{len(p):x}\r\n".encode() + p + b"\r\n")
        writer.write(b"0\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()  # idle keep-alive connection closed by the server


def test_raw_client_chunked_sse_and_stale_keepalive_retry() -> None:
    async def go(url: str) -> list:
        c = RawHttpClient(url, timeout_s=5)
        got = []
        for n in (4, 2, 99):
            data: list[bytes] = []
            status, text = await c.post("/v1/completions", json.dumps({"max_tokens": n}).encode(), data.append)
            got.append((status, text, data))
            await asyncio.sleep(0.1)  # the server closes the pooled connection meanwhile
        await c.aclose()
        return got

    got = asyncio.run(_with_server(_chunked_closing, go))
    assert [g[0] for g in got] == [200, 200, 400]
    assert [len([d for d in g[2] if d != b"[DONE]"]) for g in got[:2]] == [4, 2]
    assert got[0][2][-1] == b"[DONE]" and got[2][1] == b"bad request"


def test_raw_client_refused_is_a_clear_error() -> None:
    async def go() -> None:
        c = RawHttpClient("http://127.0.0.1:9", timeout_s=2)
        await c.post("/v1/completions", b"{}", None)

    with pytest.raises(HttpError, match="cannot connect to 127.0.0.1:9"):
        asyncio.run(go())


_BURST = """
import asyncio, json, resource, sys
import replay.drive.driver as D
from replay.drive.stub import StubServer
resource.setrlimit(resource.RLIMIT_NOFILE, (320, 320))  # a low open-file limit, hard too: it cannot be raised
if sys.argv[1] == "uncapped":
    D.connection_budget = lambda: None
async def main():
    server = await asyncio.start_server(StubServer([]).handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        d = D.Driver(url, "stub", timeout_s=4)
        out = await d.run([(0, f"r{i}", {"prompt": [1, 2], "max_tokens": 2}) for i in range(1200)])
    st = [o.status for o in out.values()]
    print(json.dumps({"ok": st.count("ok"), "error": st.count("error"), "cap": d.stats.connection_cap,
                      "waited": d.stats.waited_for_connection,
                      "late": max(o.sent_us - o.scheduled_us for o in out.values())}))
asyncio.run(main())
"""


@pytest.mark.parametrize("mode", ["capped", "uncapped"])
def test_a_burst_larger_than_the_open_file_limit(mode: str) -> None:
    """A trace that sends 1,200 requests at once (a batch job) from a process allowed 320 open files:
    every request is sent, those beyond the limit a little late and counted, instead of failing on this
    side with 'Too many open files', which the bundle would show as errors of the server."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _BURST, mode], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.splitlines()[-1])
    if mode == "capped":
        assert (got["ok"], got["error"], got["cap"]) == (1200, 0, 320 - 256)
        assert got["waited"] > 1000 and got["late"] > 0
    else:  # the failure the cap prevents (this test fails if the limit stops mattering)
        assert got["error"] > 0 and got["cap"] is None


def _idle_closing_server(keep_alive_s: float, drop_reused: bool = False):  # type: ignore[no-untyped-def]
    """A real HTTP/1.1 server in threads of its own (the standard library's), that closes a keep-alive
    connection idle for ``keep_alive_s`` as uvicorn does. With ``drop_reused``, a request that arrives on
    a connection that has served one already is read and left unanswered, the connection closed: the
    race in which the server's keep-alive timer fires as the request arrives. Returns (server, counts)."""
    import http.server
    import socketserver
    import threading

    counts = {"answered": 0, "dropped": 0, "connections": 0}
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = keep_alive_s  # (the socket's: an idle connection's wait for its next request ends here)

        def setup(self) -> None:
            super().setup()
            self.served = 0
            with lock:
                counts["connections"] += 1

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if drop_reused and self.served:
                with lock:
                    counts["dropped"] += 1
                self.close_connection = True
                return
            self.served += 1
            n = int(body.get("max_tokens", 1))
            if body.get("stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for _ in range(n):
                    ev = b'data: {"choices":[{"text":"x"}]}\n\n'
                    self.wfile.write(f"{len(ev):x}\r\n".encode() + ev + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            else:
                out = json.dumps({"choices": [{"text": "x" * n}],
                                  "usage": {"prompt_tokens": 2, "completion_tokens": n}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
            self.wfile.flush()
            with lock:
                counts["answered"] += 1

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, counts


def _bursts(n_bursts: int, sizes: list[int], pauses_us: list[int]) -> list[tuple[int, str, dict]]:
    """Bursts of requests sent at once (of ``sizes`` in turn), each followed by a pause (of ``pauses_us`` in
    turn); every fourth request without streaming (the prompt_logprobs shape: one JSON body)."""
    items, t = [], 0
    for b in range(n_bursts):
        for k in range(sizes[b % len(sizes)]):
            body: dict = {"prompt": [1, 2], "max_tokens": 2}
            if (b + k) % 4 == 0:
                body["prompt_logprobs"] = 1
            items.append((t, f"b{b}-{k}", body))
        t += pauses_us[b % len(pauses_us)]
    return items


def test_no_request_lost_to_connections_the_server_closed_when_idle() -> None:
    """Bursts of concurrent requests, each followed by a pause past the server's keep-alive timeout
    (0.1 s) or about as long as it: every pooled connection is closed by the server, some just as a
    request goes out on it. The client's retry once took another pooled connection, as stale; nothing
    may be lost now."""
    server, counts = _idle_closing_server(0.1)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    items = _bursts(40, [6], [150_000, 100_000, 95_000, 105_000, 250_000, 98_000, 102_000])
    try:
        d = Driver(url, "stub", timeout_s=10)
        out = asyncio.run(d.run(items))
    finally:
        server.shutdown()
        server.server_close()
    bad = {k: o.error for k, o in out.items() if o.status != "ok"}
    assert not bad, f"{len(bad)} of {len(items)} lost: {list(bad.items())[:3]}"
    assert d.stats.failed == 0 and d.stats.finished == len(items) == counts["answered"] == 240
    assert counts["connections"] > 40  # (the server did close idle connections: the test tests something)


def test_a_request_the_server_dropped_on_a_reused_connection_is_resent_fresh() -> None:
    """A server that closes a reused connection on the request it just read, unanswered (the keep-alive
    timer's race, made certain): each such request goes again on a new connection, once, and is
    answered; none is counted failed. (A burst of four fills the pool; each lone request after it finds
    pooled connections left to take: the retry once took one of them, and lost the request.)"""
    server, counts = _idle_closing_server(5.0, drop_reused=True)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    items = _bursts(20, [4, 1, 1, 1], [50_000])
    try:
        d = Driver(url, "stub", timeout_s=10)
        out = asyncio.run(d.run(items))
    finally:
        server.shutdown()
        server.server_close()
    assert [o.status for o in out.values()].count("ok") == len(items) == counts["answered"] == 35
    assert counts["dropped"] > 0 and d.stats.resent == counts["dropped"]
    assert d.stats.failed == 0
