"""Open-loop driver: each request leaves at its scheduled time, never held back by outstanding ones.

One scheduler coroutine wakes for the next due request and launches every request that is due,
so timing error does not grow with the number of outstanding requests (unlike one ``asyncio.sleep``
per request). Bodies are serialised ahead, while the scheduler would otherwise sleep, and sent
through the lightweight client in ``replay.drive.http``. Responses are streamed to record time to
first token and finish; errors and aborts are recorded per request, never dropped.

A request with multimodal items goes to ``/v1/chat/completions`` as one user message: its images, made
when its body is serialised (``replay.drive.images``), then its prompt as text. The server's count of
its prompt tokens, which includes the image tokens, is recorded; a request the server refuses (more
images than ``limit_mm_per_prompt``, a type the model cannot take) is recorded with the server's words.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from replay.drive import images
from replay.drive.http import HttpClient, HttpError, RawHttpClient
from replay.trace.prompts import PROMPT_VOCAB

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MM_KEY = "_mm"  # (in a body: the request's multimodal items and their seed, made into content parts when sent)


@dataclass
class Outcome:
    id: str
    scheduled_us: int
    sent_us: int | None = None
    first_token_us: int | None = None
    finish_us: int | None = None
    output_tokens: int | None = None
    input_tokens: int | None = None  # as the server counted the prompt (its usage), None where it did not say
    status: str = "pending"  # ok | error | aborted | pending
    error: str | None = None


@dataclass
class DriverStats:
    sent: int = 0
    finished: int = 0
    failed: int = 0
    lateness_us: list[int] = field(default_factory=list)
    connection_cap: int | None = None  # in flight at most, for want of file descriptors (None: no cap)
    waited_for_connection: int = 0  # requests sent late because that many were in flight
    resent: int = 0  # requests sent again on a new connection: the server had closed the idle one they went on
    # (as a server closes keep-alive connections), so it never saw them; none of them counts as failed


FD_RESERVE = 256  # descriptors kept for the rest of the process: sampler, logs, the bundle's files


def connection_budget() -> int | None:
    """How many requests may be in flight at once before this process runs out of file descriptors
    (each is a connection): the soft limit, raised to the hard one as load generators do, less a
    reserve. None where the platform has no such limit. A trace that sends thousands at once (a batch
    job, a length-only dataset) would otherwise fail on this side with 'Too many open files', which the
    bundle would show as the server's errors."""
    try:
        import resource
    except ImportError:  # (not on Windows)
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return None if soft == resource.RLIM_INFINITY else max(16, soft - FD_RESERVE)


class Driver:
    def __init__(self, base_url: str, model: str, *, speed: float = 1.0, concurrency: int | None = None,
                 client: HttpClient | None = None, timeout_s: float = 600.0) -> None:
        self.base_url = base_url
        self.model = model
        self.speed = speed
        self.concurrency = concurrency
        self.client: HttpClient = client if client is not None else RawHttpClient(base_url, timeout_s)
        self.stats = DriverStats()
        self.outcomes: dict[str, Outcome] = {}
        self._stop = asyncio.Event()
        self.t0: float = 0.0
        self._ready: dict[int, tuple[str, bytes]] = {}

    def now_us(self) -> int:
        return int((time.perf_counter() - self.t0) * 1_000_000)

    def stop(self) -> None:
        self._stop.set()

    def _payload(self, body: dict[str, Any]) -> tuple[str, bytes]:
        """The path a body goes to and its bytes."""
        stream = body.get("prompt_logprobs") is None  # vLLM refuses prompt_logprobs with stream=True
        # (a streamed reply ends with a chunk of its usage, so that a prompt sent as text has its length
        # in tokens as the server's tokenizer counted it; 'stream' stays last: ``_one`` reads it there)
        usage = {"stream_options": {"include_usage": True}} if stream else {}
        path, body = (CHAT, chat_body(body)) if MM_KEY in body else (COMPLETIONS, body)
        return path, json.dumps({**body, "model": self.model, **usage, "stream": stream}, separators=(",", ":")).encode()

    def _prepare(self, items: list[tuple[int, str, dict[str, Any]]], i: int, deadline_us: int) -> None:
        """Serialise upcoming bodies while the scheduler would otherwise sleep (not at send time)."""
        j = i
        while j < len(items) and j < i + 256 and self.now_us() < deadline_us:
            if j not in self._ready:
                self._ready[j] = self._payload(items[j][2])
            j += 1

    async def run(self, items: list[tuple[int, str, dict[str, Any]]], *,
                  t0: float | None = None, on_tick: Callable[[], None] | None = None) -> dict[str, Outcome]:
        """items: (scheduled µs from start at speed 1, request id, JSON body)."""
        self.t0 = t0 if t0 is not None else time.perf_counter()
        cap = self.concurrency
        if not cap:
            cap = self.stats.connection_cap = connection_budget()
        sem = asyncio.Semaphore(cap) if cap else None
        tasks: set[asyncio.Task[None]] = set()
        try:
            i = 0
            n = len(items)
            while i < n and not self._stop.is_set():
                due_us = int(items[i][0] / self.speed)
                wait = due_us - self.now_us()
                if wait > 1500:
                    self._prepare(items, i, due_us - 1500)
                    wait = due_us - self.now_us()
                    if wait > 1500:
                        try:
                            await asyncio.wait_for(self._stop.wait(), (wait - 1000) / 1e6)
                        except asyncio.TimeoutError:
                            pass
                    continue
                while wait > 0:  # final approach: yield to the loop without oversleeping
                    await asyncio.sleep(0)
                    wait = due_us - self.now_us()
                now = self.now_us()
                while i < n and int(items[i][0] / self.speed) <= now:
                    sched, rid, body = items[i]
                    oc = Outcome(rid, int(sched / self.speed))
                    self.outcomes[rid] = oc
                    path, payload = self._ready.pop(i) if i in self._ready else self._payload(body)
                    t = asyncio.create_task(self._one(oc, path, payload, sem))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                    i += 1
                if on_tick:
                    on_tick()
            for sched, rid, _ in items[i:]:  # never sent: stopped (engine died, Ctrl-C)
                self.outcomes[rid] = Outcome(rid, int(sched / self.speed), status="aborted",
                                             error="not sent: replay stopped")
            while tasks and not self._stop.is_set():
                await asyncio.wait(set(tasks), timeout=0.2)
                if on_tick:
                    on_tick()
        finally:
            for t in list(tasks):
                t.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.aclose()
            self.stats.resent = int(getattr(self.client, "resent", 0))
        for oc in self.outcomes.values():
            if oc.status == "pending":
                oc.status, oc.error = "aborted", oc.error or "in flight when the replay stopped"
        return self.outcomes

    async def _one(self, oc: Outcome, path: str, payload: bytes, sem: asyncio.Semaphore | None) -> None:
        if sem:
            if sem.locked() and not self.concurrency:
                self.stats.waited_for_connection += 1
            await sem.acquire()
        n_out = 0

        def on_data(data: bytes) -> None:
            nonlocal n_out
            if data == b"[DONE]":
                return
            if b'"choices":[]' in data:  # (the usage chunk: no token)
                m = _PROMPT_TOKENS.search(data)
                oc.input_tokens = int(m.group(1)) if m else None
                return
            if b'"error"' in data:
                try:
                    err = json.loads(data).get("error")
                except (json.JSONDecodeError, AttributeError):
                    err = None
                if err:
                    oc.status, oc.error = "error", str(err)[:300]
                    return
            if oc.first_token_us is None:
                oc.first_token_us = self.now_us()
            if b'"delta":{"role"' not in data:  # (a chat reply's first chunk names the role: no token)
                n_out += 1

        streamed = payload.endswith(b'"stream":true}')
        try:
            oc.sent_us = self.now_us()
            self.stats.sent += 1
            self.stats.lateness_us.append(oc.sent_us - oc.scheduled_us)
            status, text = await self.client.post(path, payload, on_data if streamed else None)
            oc.finish_us = self.now_us()
            if status != 200:
                oc.status, oc.error = "error", f"HTTP {status}: {server_error(text)}"
                self.stats.failed += 1
                return
            if streamed:
                oc.output_tokens = n_out
            else:  # one JSON body (prompt_logprobs): no TTFT; usage read without parsing the logprobs
                m = _COMPLETION_TOKENS.search(text[-4096:]) or _COMPLETION_TOKENS.search(text)
                oc.output_tokens = int(m.group(1)) if m else None
                m = _PROMPT_TOKENS.search(text[-4096:]) or _PROMPT_TOKENS.search(text)
                oc.input_tokens = int(m.group(1)) if m else None
            if oc.status == "pending":
                oc.status = "ok"
                self.stats.finished += 1
            else:
                self.stats.failed += 1
        except asyncio.CancelledError:
            oc.status, oc.error = "aborted", "in flight when the replay stopped"
            raise
        except HttpError as e:
            oc.status, oc.error = "error", str(e)[:300]
            oc.finish_us = self.now_us()
            self.stats.failed += 1
        finally:
            if sem:
                sem.release()


_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')


def server_error(text: bytes) -> str:
    """The server's own message from an error body (OpenAI's ``{"error": {"message": ..}}``, or vLLM's
    older ``{"message": ..}``), else the body's start; 300 characters at most."""
    try:
        obj = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        obj = None
    err = obj.get("error", obj) if isinstance(obj, dict) else None
    msg = err.get("message") if isinstance(err, dict) else None
    return (msg if isinstance(msg, str) else text[:300].decode(errors="replace"))[:300]


def chat_text(ids: list[int]) -> str:
    """Token ids as text the tiny models' tokenizers read as as many tokens: ``w<id>`` is two tokens to
    them ('w' or ' w', then the number, below PROMPT_VOCAB), so a word stands for each pair of ids and a
    lone ' w' for an odd one (``[11, 12, 13]`` -> ``'w11 w'``)."""
    words = [f"w{t % PROMPT_VOCAB}" for t in ids[::2][:len(ids) // 2]] + (["w"] if len(ids) % 2 else [])
    return " ".join(words)


def chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """A body with multimodal items -> a chat completions body: one user message of the items as content
    parts (images made now, from the items' sizes and the request's seed) and the prompt as text of as
    many tokens (``chat_text``)."""
    out = {k: v for k, v in body.items() if k not in (MM_KEY, "prompt", "logprobs", "best_of")}
    mm = body[MM_KEY]
    prompt = body.get("prompt")
    text = chat_text(prompt) if isinstance(prompt, list) else str(prompt or "")
    parts = images.content_parts(mm["items"], mm["seed"])
    out["messages"] = [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]
    if isinstance(body.get("logprobs"), int):  # (chat's logprobs are a flag and a count)
        out.update(logprobs=True, top_logprobs=body["logprobs"])
    return out


def request_body(r: dict[str, Any], prompt_ids: list[int] | None, *, output_policy: str = "observed") -> dict[str, Any]:
    """Trace request -> completions body that reproduces its memory-relevant shape (a request with
    multimodal items carries them, and is sent as a chat completion with its images)."""
    s = r.get("sampling") or {}
    n_out = r.get("output_tokens")
    if n_out is None or output_policy == "max_tokens":
        n_out = r.get("max_tokens") or n_out or 16
    body: dict[str, Any] = {"prompt": prompt_ids if prompt_ids is not None else r.get("prompt"),
                            "max_tokens": max(1, int(n_out)), "ignore_eos": True,
                            "temperature": s.get("temperature", 0.0)}
    for k in ("top_p", "n", "best_of", "logprobs", "prompt_logprobs", "min_tokens", "stop"):
        if s.get(k) is not None:
            body[k] = s[k]
    if r.get("mm"):
        body[MM_KEY] = {"items": r["mm"], "seed": str(r["id"])}
        taken = images.recorded_tokens(r["mm"])  # (a prompt's tokens count its items' where the trace says how many,
        if taken and isinstance(body["prompt"], list):  # and the chat template's: the text is the rest)
            taken += images.chat_frame_tokens(images.images_per_request(r["mm"]))
            body["prompt"] = body["prompt"][:max(1, len(body["prompt"]) - taken)]
    return body
