"""The vectorised fast lane gives exactly the facts of the line-by-line reference parser, on real
logs and on a generated log with every kind of mess, whatever the piece size."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import random
import re
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replay.bundle import read_bundle
from replay.record import fastlog, vllm_log
from replay.record.fastlog import _lines, inert, parse_log_file
from replay.record.inspect import inspect_bundle
from replay.record.recorder import RecordOptions, record
from replay.record.vllm_log import (
    LogParse,
    LogParser,
    _Line,
    extract,
    parse_log,
    physical_lines,
    split_line,
)
from tests.conftest import ROOT, shared

STATS_V1 = ("(APIServer pid=3646) INFO 05-19 10:13:{s:02d} [loggers.py:271] Engine 000: Avg prompt throughput: 12068.8 "
            "tokens/s, Avg generation throughput: 734.9 tokens/s, Running: {r} reqs, Waiting: 33 reqs, GPU KV cache "
            "usage: 87.{r}%, Prefix cache hit rate: 0.0%")
STATS_V0 = ("INFO 05-19 10:13:{s:02d} [metrics.py:455] Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: "
            "2.0 tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: 1 reqs, GPU KV cache usage: 1,234.5%, CPU KV "
            "cache usage: 0.0%.")
ADDED = "(APIServer pid=3646) INFO 05-19 10:13:{s:02d} [async_llm.py:587] Added request cmpl-{r}-0."
ACCESS = 'INFO:     127.0.0.1:59542 - "POST /v1/completions HTTP/1.1" 200 OK'
KV = "(EngineCore_DP0 pid=1133552) INFO 05-19 10:13:{s:02d} [gpu_worker.py:298] Available KV cache memory: 6.51 GiB"
RAY_STATS = STATS_V1.replace("(APIServer pid=3646)", "(ServeReplica:default:VLLMDeployment pid=77)")  # Ray Serve
# data parallelism: each engine's stats line, and 0.13's aggregate of them
DP_STATS = STATS_V1.replace("Engine 000:", "Engine 00{n}:")
# (0.11+ states the multimodal processor cache's hit rate too; V0 the prefix cache's per device)
MM_STATS = STATS_V1.replace("Prefix cache hit rate: 0.0%", "Prefix cache hit rate: 4{r}.5%, MM cache hit rate: 1{r}.0%")
V0_PREFIX = STATS_V0.replace("0.0%.", "0.0%, Prefix cache hit rate: GPU: 2{r}.00%, CPU: 0.00%")
DP_AGGREGATE = STATS_V1.replace("Engine 000:", "2 Engines Aggregated:")
RAY_ADDED = ADDED.replace("(APIServer pid=3646)", "(RayWorkerWrapper pid=78, ip=10.0.0.2)")
# vLLM 0.6 and 0.7 wrote the call site with only its closing bracket
OLD_ADDED = "INFO 05-19 10:13:{s:02d} async_llm_engine.py:211] Added request cmpl-old{r}-0."
OLD_STATS = STATS_V0.replace("[metrics.py:455]", "metrics.py:455]")
# a process name and an id beyond ASCII (a byte offset is not a character offset), and a control
# character that Python counts as white space and a Rust regex's \s does not
WIDE_ADDED = ADDED.replace("(APIServer pid=3646)", "(Wörker_ü pid=5)").replace("cmpl-", "cmpl-é")
CTRL_ADDED = ADDED.replace("cmpl-", "cmpl-\x1c")
WIDE_SPACED = ADDED.replace("cmpl-", "cmpl-é\u2003")  # (white space beyond ASCII, in an id beyond it)
# DEBUG-level chatter: inert lines (parsed, no fact) and one the word 'memory' keeps off the fast lane
DEBUG_PLAIN = "(EngineCore_DP0 pid=12) DEBUG 05-19 10:13:{s:02d} [core.py:10{r}] num_tokens={n} num_reqs={r}"
DEBUG_WORD = "(EngineCore_DP0 pid=12) DEBUG 05-19 10:13:{s:02d} [gpu_model_runner.py:2{r}] Free memory: {n} GiB"
WARN_PLAIN = "WARNING 05-19 10:13:{s:02d} [utils.py:{r}] Using a slow tokenizer; scheduled {n} of them"
# a stats line Ray folded repeats into (the reference parser reads those)
RAY_FOLDED = STATS_V0.replace("INFO", "(RayWorkerWrapper pid=78, ip=10.0.0.2) INFO") + " [repeated {n}x across cluster]"
# real DEBUG lines (vLLM 0.6's client, vLLM 0.8's workers; quoted in vLLM and Neuron issues)
DEBUG_MQ = "DEBUG 05-19 10:13:{s:02d} client.py:191] Waiting for output from MQLLMEngine."
DEBUG_TP = ("(VllmWorker rank={r} pid=24{r}) DEBUG 05-19 10:13:{s:02d} [parallel_state.py:867] world_size=8 rank={r} "
            "local_rank={r} distributed_init_method=tcp://127.0.0.1:39977 backend=nccl")


_DETAILS = ("input_tokens", "max_tokens", "n", "best_of", "logprobs", "prompt_logprobs")
RECEIVED = ("(APIServer pid=1) INFO 05-19 10:13:{s:02d} [logger.py:39] Received request cmpl-rx{r}-0: prompt: "
            "'it\\'s \"{r}\" tokens, params: n=9 of them', params: SamplingParams(n={n}, best_of=None, temperature=0.7, "
            "max_tokens={r}, logprobs=None, prompt_logprobs=5), prompt_token_ids: [1, 2, {r}], lora_request: None.")


def _canon(res: LogParse, ff: Any = None) -> tuple[list[Any], list[Any], list[Any], tuple[Any, ...]]:
    stats, reqs, other = [], [], []
    for f in res.facts:
        if f.kind == "stats":
            d = f.data
            stats.append((f.line, f.rank, f.ts, d.get("kv_usage_pct"), d.get("running"), d.get("waiting"),
                          d.get("swapped"), d.get("preemptions"), d.get("dp"), d.get("prefix_cache_hit_pct"),
                          d.get("mm_cache_hit_pct")))
        elif f.kind.startswith("request_"):
            d, prompt = f.data, f.data.get("prompt")
            reqs.append((f.line, f.rank, f.ts, f.kind, d["request_id"], *(d.get(k) for k in _DETAILS),
                         None if prompt is None else len(prompt),
                         None if prompt is None else hashlib.sha256(prompt.encode()).hexdigest()))
        else:
            other.append((f.line, f.kind, f.data))
    if ff is not None:
        for r in ff.stats_frame().collect().iter_rows(named=True):
            stats.append((r["line"], r["rank"], r["ts"], r["kv_usage_pct"], int(r["running"]), int(r["waiting"]),
                          None if r["swapped"] is None else int(r["swapped"]),
                          None if r["preemptions"] is None else int(r["preemptions"]), r["dp"],
                          r["prefix_cache_hit_pct"], r["mm_cache_hit_pct"]))
        for r in ff.requests_frame().collect().iter_rows(named=True):
            reqs.append((r["line"], r["rank"], r["ts"], r["kind"], r["request_id"], *(r[k] for k in _DETAILS),
                         r["prompt_chars"], r["prompt_sha256"]))
    meta = (res.lines_read, res.lines_parsed, res.continuation_lines, res.quarantine, res.duplicates,
            res.version, res.version_range, res.engine, res.timed_ends)
    return sorted(stats, key=repr), sorted(reqs, key=repr), other, meta  # (a fact may lack a time)


def _reference(path: Path) -> LogParse:
    text = path.read_bytes().decode("utf-8", errors="replace")
    return parse_log(physical_lines(text))


def _messy_log(path: Path, seed: int, real: list[list[str]]) -> None:
    rnd = random.Random(seed)
    out: list[str] = []
    for i in range(2500):
        r, s = rnd.random(), i % 60
        shapes = [STATS_V1, ADDED, ACCESS, KV, STATS_V0, RAY_STATS, RAY_ADDED, OLD_ADDED, OLD_STATS, RECEIVED, WIDE_ADDED,
                  CTRL_ADDED, WIDE_SPACED, DEBUG_PLAIN, DEBUG_WORD, WARN_PLAIN, DEBUG_MQ, DEBUG_TP, RAY_FOLDED, DP_STATS, DP_AGGREGATE]
        if r < 0.5:
            out.append(rnd.choice(shapes).format(s=s, r=i % 7, n=i % 3))
        elif r < 0.56:
            out.append(out[-1] if out else ACCESS)  # overlapping paste: the same line again
        elif r < 0.6:
            out.append("    continuation of a wrapped message")
        elif r < 0.62:
            out.append("\x1b[32m" + STATS_V1.format(s=1, r=2) + "\x1b[0m" if r < 0.61 else
                       _coloured(rnd.choice([STATS_V1, ADDED, STATS_V0, WARN_PLAIN]).format(s=s, r=i % 7, n=i % 3)))
        elif r < 0.64:
            out.append(STATS_V1.format(s=2, r=3) + ADDED.format(s=3, r=4))  # glued by copy-paste
        elif r < 0.65:  # Docker's json-file log
            out.append(json.dumps({"log": rnd.choice([STATS_V1, ADDED, ACCESS, KV]).format(s=s, r=i % 7, n=1) + "\n",
                                   "stream": "stderr", "time": f"2026-05-19T10:13:{s:02d}.1Z"}, separators=(",", ":")))
        elif r < 0.66:  # container envelopes: kubectl --prefix --timestamps, CRI node logs, docker logs -t
            env = rnd.choice(["[pod/vllm-0/vllm] 2026-05-19T10:13:{s:02d}.123Z ", "2026-05-19T10:13:{s:02d}.123456789Z stderr F ",
                              "2026-05-19T12:13:{s:02d}+02:00 ", "2026-05-19T10:13:{s:02d}Z stdout P ",
                              "2026-05-19T10:13:{s:02d}.5-0130 ", "[vllm-0] 2026-05-19T10:13:{s:02d}.000001Z ",
                              "[pod/vllm-ü/vllm] 2026-05-19T10:13:{s:02d}.1Z ", "vllm-1  | ",
                              "vllm_1  | 2026-05-19T10:13:{s:02d}.123456789Z ", "2026-05-19 10:13:{s:02d}.982 [Info] (Process) ",
                              "2026-05-19T10:13:{s:02d}Z [Info] ", "2026-05-19T10:13:{s:02d}+0000 gpu-1 python3[77]: ",
                              "May 19 10:13:{s:02d} gpu-1 vllm[77]: ", "3: ",
                              "        ", "\t"])  # (and a paste's indent)
            out.append(env.format(s=s) + rnd.choice([STATS_V1, ADDED, ACCESS, STATS_V0]).format(s=s, r=i % 7))
        elif r < 0.68:  # CRs: a CRLF line, a progress bar's before a message, one inside a message
            out.append(rnd.choice([ADDED.format(s=7, r=5) + "\r", "Processed prompts:  50%|#####     | 1/2\r"
                                   + STATS_V1.format(s=8, r=1), STATS_V1.format(s=9, r=2).replace("Running", "\rRunning")]))
        elif r < 0.70:
            out.append("")
        elif r < 0.72:
            out.append("(APIServer pid=1) INFO 05-19 10:13:09 [logger.py:40] Received request cmpl-abc: prompt: "
                       "'how much memory does it take', params")
        else:
            block = rnd.choice(real)
            k = rnd.randrange(len(block))
            out.extend(block[k:k + rnd.randrange(1, 8)])
    path.write_bytes(("\n".join(out) + "\n").encode())


def _real_logs() -> list[Path]:
    d = shared("vllm-logs")
    return sorted(d.glob("*.log")) + sorted(shared("vllm-cpu").glob("*.log"))


def test_real_logs_fast_lane_equals_reference(tmp_path: Path) -> None:
    for p in _real_logs():
        res, ff = parse_log_file(p, tmp_path / p.stem, chunk_bytes=2048)
        assert _canon(res, ff) == _canon(_reference(p)), p.name


def test_inert_messages_tell_the_reference_nothing() -> None:
    """Every message of the real logs (and of the messy log's shapes) that the fast lane would take as
    saying nothing gives the reference parser no fact, and no version, version range or engine clue
    from its text; most startup chatter is inert, and no fact-bearing message is."""
    texts = [ln.text for p in _real_logs() for raw in p.read_text(errors="replace").split("\n")
             for ln in split_line(0, raw)]
    texts += [ln.text for shape in (STATS_V1, STATS_V0, ADDED, KV, RECEIVED, OLD_ADDED, WIDE_ADDED, DEBUG_MQ, DEBUG_TP)
              for ln in split_line(0, shape.format(s=1, r=2, n=3))]
    flags = pl.select(inert(pl.Series(texts, dtype=pl.Utf8))).to_series().to_list()
    fact_bearing = 0
    for text, flag in zip(texts, flags, strict=True):
        facts = extract(text)
        fact_bearing += bool(facts)
        if not flag:
            continue
        assert facts == [], text
        parser = LogParser()
        parser.observe(_Line(0, text, "x", None, None, True))
        res = parser.finish()
        assert (res.version, res.version_range, res.engine) == (None, None, None), text
    assert sum(flags) > 100 and fact_bearing > 30
    assert flags[-2:] == [True, True]  # the real DEBUG lines


# one message per pattern of the reference parser, at its barest: each tells it something
_TELLING = [
    "Initializing an LLM engine (v0.6.0) with config: model='m'", "vLLM API server version 0.6.3", "non-default args: {}",
    "MQLLMEngine terminated", "Engine loop has died", "EngineDeadError: x", "Engine core proc EngineCore_0 died unexpectedly",
    "Worker proc VllmWorker-2 died unexpectedly (exit code: None), shutting down executor.",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
    "Got fatal signal from worker processes, shutting down", "RuntimeError: Engine process failed to start",
    "Engine background task failed", "EngineCore encountered a fatal error.", "Engine 000: Avg prompt throughput: 1.0",
    "Graph capturing finished in 5 secs, took 0.5 GiB", "Loading model weights took 1.5 GB", "# GPU blocks: 100, # CPU blocks: 10",
    "Maximum concurrency for 4096 tokens per request: 2.5x", "GPU KV cache size: 1,000 tokens", "No available memory for the cache blocks",
    "To serve at least one request with the models's max seq len (8192), (1.0 GiB KV cache is needed, which is larger",
    "Sequence group c is preempted by PreemptionMode.RECOMPUTE mode. total_num_cumulative_preemption=1",
    "Aborted request cmpl-1.", "Request cmpl-1 details: prompt: 'x'", "Finished request cmpl-1.", "Running: 1 reqs, Waiting: 0 reqs",
    "torch.OutOfMemoryError: CUDA out of memory.", "default since v0.21.0", "using gpu_model_runner", "VllmWorkerProcess ready",
    "Pending: 3 reqs", "Swapped: 0 reqs", "see [worker.py:267] for it", "at scheduler.py:1558", "[loggers.py:271] stats",
    "[kv_cache_utils.py:864] x", "async_llm_engine.py:211 said", "(APIServer pid=1) nested",
    "Free memory on device (1.0/2.0 GiB) on startup.", "CUDA graph pool memory: 0.5 GiB (actual), 0.4 GiB (estimated)",
    "CUDA graph pool memory: -0.19 GiB (actual), 2.43 GiB (estimated), difference: 2.62 GiB",
    "Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 5",
    "Dumping scheduler stats: SchedulerStats(num_running_reqs=200, num_waiting_reqs=0, kv_cache_usage=0.52)",
    "Dumping scheduler output for model execution: SchedulerOutput(num_scheduled_tokens={a: 5}, total_num_scheduled_tokens=5)",
    "Dumping input data for V1 LLM engine (v0.11.0) with config: model='m', ",
    "Sleep mode freed 71.25 GiB memory, 1.38 GiB memory is still in use.",
    "Free memory on device cuda:0 (1.0/2.0 GiB) on startup is less than desired GPU memory utilization (0.9, 1.8 GiB)",
]


@pytest.mark.parametrize("text", _TELLING)
def test_a_message_that_tells_the_reference_something_is_not_inert(text: str) -> None:
    """(Each message is checked to tell the reference something, then to stay off the inert path.)"""
    parser = LogParser()
    parser.observe(_Line(0, text, "x", None, None, True))
    res = parser.finish()
    assert extract(text) or (res.version, res.version_range, res.engine) != (None, None, None)
    assert not pl.select(inert(pl.lit(text))).item()


@pytest.mark.parametrize("seed,chunk,bucket", [(1, 4096, 64), (2, 997, None), (3, 1 << 20, None)])
def test_messy_log_fast_lane_equals_reference(seed: int, chunk: int, bucket: int | None, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """(With a tiny bucket size, repeats are judged across many hash buckets: same result.)"""
    if bucket:
        monkeypatch.setattr(fastlog, "BUCKET_FACTS", bucket)
    real = [p.read_bytes().decode(errors="replace").split("\n") for p in _real_logs()]
    log = tmp_path / "messy.log"
    _messy_log(log, seed, real)
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=chunk)
    got, want = _canon(res, ff), _canon(_reference(log))
    assert got == want
    n_stats, n_reqs = len(got[0]), len(got[1])
    assert n_stats > 100 and n_reqs > 100 and ff.lines > 500  # the fast lane really carried most lines
    assert res.duplicates > 0  # repeated lines were seen and counted once
    assert res.lines_parsed + res.continuation_lines <= res.lines_read  # counts are of the file's lines


@pytest.mark.parametrize("name,compress", [("log.gz", gzip.compress), ("saved-without-suffix.log", gzip.compress),
                                           ("log.bz2", bz2.compress), ("log.xz", lzma.compress),
                                           ("xz-without-suffix.log", lzma.compress)])
def test_record_compressed_log_equals_plain(name: str, compress: Callable[[bytes], bytes], tmp_path: Path) -> None:
    """A gzip, bzip2 or xz log, named as such or not, records as the plain log does, and the bundle
    names the file as given (its sha256 is the compressed file's)."""
    src = shared("vllm-logs/v017_v1_stats_kv_ramp.log")
    packed = tmp_path / name
    packed.write_bytes(compress(src.read_bytes()))
    a, b = tmp_path / "a", tmp_path / "b"
    record([src], a, RecordOptions(year=2025))
    record([packed], b, RecordOptions(year=2025))
    ia, ib = inspect_bundle(read_bundle(a)), inspect_bundle(read_bundle(b))
    assert ia == ib and ia["stats_lines"] > 0 and ia["kv_usage_pct"]
    assert read_bundle(b).meta.inputs[0]["sha256"] == hashlib.sha256(packed.read_bytes()).hexdigest()
    assert not (a / ".spill").exists()  # spilled pieces are cleaned up


_PARTS = [b"a", b"\n", b"\r", b" ", b"\xff", b"\xc3\xa9", b'"', b",", b"\x01", b"\t", b"INFO ", b"\x1b[0m", b"\x00"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PARTS), min_size=1, max_size=60))
def test_line_cutting_equals_the_reference(parts: list[bytes]) -> None:
    """However a piece mixes CR, quotes, separators, NULs and invalid UTF-8, the fast line cutter gives
    exactly the lines (and replacement characters) of the reference cutting; an empty line may read
    as null (the slow lane fills it)."""
    piece = b"".join(parts)
    assert _lines(piece, b"\r" in piece)[0].fill_null("").to_list() == physical_lines(piece.decode("utf-8", errors="replace"))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PARTS), min_size=1, max_size=60))
def test_line_ends_from_the_cut_lines_are_the_pieces_lfs(parts: list[bytes]) -> None:
    """Where the native cutter takes a piece (``_lf_lines``), the line ends read off its lines' lengths
    (which the template scanner is given) are the piece's LFs, and the piece's end for a last line
    without one: as the scanner finds them itself."""
    piece = b"".join(parts)
    lines = fastlog._lf_lines(piece)
    lfs = [k for k, b in enumerate(piece) if b == 10]
    if lines is not None:  # (else the reference cuts it, and the scanner finds the LFs itself)
        assert fastlog._line_ends(lines).tolist() == lfs + ([] if piece.endswith(b"\n") else [len(piece)])


@pytest.mark.parametrize("cut", [0, 1], ids=["ends-in-LF", "last-line-open"])
def test_the_template_scanner_given_the_cut_lines_ends_classes_as_it_does_alone(
        cut: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN pieces of logs of real line shapes (V1 at INFO and at DEBUG, from the benchmark's generator),
    cut natively WHEN the template scanner is
    given the lines' ends THEN every line's class and template are those it gives finding the LFs
    itself, with or without a last line's LF."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from bench_record import lifetime

    from replay.record.scan import PieceScanner
    pieces = {"v1": lifetime(0, 3000), "debug": lifetime(1, 1500, debug=True)}
    for name, text in pieces.items():
        piece = text.encode()[:len(text.encode()) - cut]
        lines = fastlog._lf_lines(piece)
        assert lines is not None and lines.len() > 600, name
        a, b = PieceScanner().classify(piece, fastlog._line_ends(lines)), PieceScanner().classify(piece)
        assert (a.codes == b.codes).all() and (a.which == b.which).all() and len(a.codes) == lines.len(), name
        assert (a.which >= 0).any(), name  # (some lines equal a template: the comparison shows something)


@pytest.mark.parametrize("env", ["{t}.123456789Z stderr F ", "{t}.123Z ", "[pod/vllm-0/vllm] {t}+00:00 ", "{t}.5+0200 ",
                                 "vllm-1  | ", "vllm-1  | {t}.123456789Z ", "{t}+0000 gpu-node-1 python3[1234]: ",
                                 "May 19 10:13:00 gpu-node-1 vllm[1234]: ", "12: "])
def test_container_envelopes_take_the_fast_lane(env: str, tmp_path: Path) -> None:
    """Logs from a CRI node log, `kubectl logs --timestamps [--prefix]`, `docker logs -t`, `docker
    compose logs [-t]`, journald (`-o short-iso`) or syslog go through the vectorised lane too (they
    all took the line-by-line parser, six to ten times slower), with the facts and the exact envelope
    times the reference parser gives."""
    lines = []
    for i in range(3000):
        t = f"2026-05-19T10:{i // 60 % 60:02d}:{i % 60:02d}"
        shape = [STATS_V1, ADDED, ACCESS][i % 3]
        lines.append(env.format(t=t) + shape.format(s=i % 60, r=i))
    log = tmp_path / "pods.log"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10)
    assert ff.lines >= 2990  # (a line whose next line is in another piece may still go the long way)
    assert _canon(res, ff) == _canon(_reference(log))
    from replay.record.vllm_log import fact_time_us
    got = ff.requests_frame().select("ts", "t_exact").collect()
    assert got.height == 1000 and got["ts"][0].startswith("2026-05-19T" if "{t}" in env else "05-19 ")
    assert got["t_exact"].to_list() == [fact_time_us(ts, 2026) if "{t}" in env else None for ts in got["ts"]]
    # (a spilled request file holds exact times only where its lines had some)
    assert any("t_exact" in pl.read_ipc_schema(f) for f in ff.requests) == ("{t}" in env)


def _coloured(line: str) -> str:
    """A line as vLLM's ColoredFormatter writes it to a terminal: level in colour, time and call site
    in grey, the process prefix in cyan."""
    line = line.replace("(APIServer pid=3646) ", "\x1b[1;36m(APIServer pid=3646)\x1b[0;0m ")
    for level, code in (("INFO", 32), ("WARNING", 33)):
        line = re.sub(rf"\b{level} (\d\d-\d\d \d\d:\d\d:\d\d) (\[[\w./-]+:\d+\])",
                      lambda m, c=code, lv=level: f"\x1b[{c}m{lv}\x1b[0m \x1b[90m{m[1]}\x1b[0m \x1b[90m{m[2]}\x1b[0m", line)
    return line


def _otel(text: str, t: str, **more: Any) -> str:
    """A record of vLLM's JSON logging (its OTel formatter) of a text line's message."""
    level, _, body = text.partition("] ") if "] " in text else ("INFO", "", text)
    sev = "WARN" if "WARNING" in level else "ERROR" if "ERROR" in level else "INFO"
    return json.dumps({"timestamp": t, "severity_text": sev, "severity_number": 9, "body": body,
                       "logger": "vllm.v1.engine", "service.name": "vllm", **more})


def test_a_log_copied_from_a_web_page_takes_the_fast_lane(tmp_path: Path) -> None:
    """A log whose spaces a web page's copy turned into no-break spaces goes through the vectorised lane
    with the reference's facts, as the log vLLM wrote would."""
    lines = [[STATS_V1, ADDED, ACCESS, WARN_PLAIN][i % 4].format(s=i % 60, r=i, n=i % 3).replace(" ", "\u00a0")
             for i in range(3000)]
    log = tmp_path / "copied.log"
    log.write_text("\ufeff" + "\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10)
    assert ff.lines >= 2990
    got = _canon(res, ff)
    assert got == _canon(_reference(log)) and len(got[0]) == 750 and len(got[1]) == 750


def test_a_log_padded_to_a_width_keeps_its_requests(tmp_path: Path) -> None:
    """A log whose lines were padded with spaces to a width (a terminal's or a viewer's copy, as the lines
    pasted in vLLM pull request 44106 are) has the facts of the log vLLM wrote: its request lines were
    read as none ('Added request x.      ' ended in spaces, not in the request's id)."""
    lines = [[STATS_V1, ADDED, ACCESS, WARN_PLAIN][i % 4].format(s=i % 60, r=i, n=i % 3) for i in range(400)]
    padded, plain = tmp_path / "padded.log", tmp_path / "plain.log"
    padded.write_text("\n".join(ln.ljust(250) + ("\t" if i % 7 == 0 else "") for i, ln in enumerate(lines)) + "\n")
    plain.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(padded, tmp_path / "spill", chunk_bytes=16 << 10)
    got = _canon(res, ff)
    assert got == _canon(_reference(padded)) == _canon(_reference(plain)) and len(got[0]) == 100 and len(got[1]) == 100


@pytest.mark.parametrize("chunk", [2048, 64 << 10])
def test_a_log_printed_by_a_ci_job_reads_at_vllms_own_times_in_both_lanes(chunk: int, tmp_path: Path) -> None:
    """A log a CI job printed at its end (each line stamped with the job's time, all within a second,
    over ten minutes of vLLM's own) goes through the vectorised lane with the reference's facts, at vLLM's
    own times, whatever the size of the pieces its head is read across."""
    lines = [f"2026-09-02T20:18:43.{i:06d}0Z " + [STATS_V1, ADDED, ACCESS, WARN_PLAIN][i % 4].format(s=i % 60, r=i, n=i % 3)
             .replace("10:13:", f"10:{13 + i // 600:02d}:") for i in range(6000)]
    log = tmp_path / "ci.log"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=chunk)
    ref = _reference(log)
    assert res.envelope_dump is not None and ref.envelope_dump == res.envelope_dump and res.envelope_dump[0] < 1
    got = _canon(res, ff)
    assert got == _canon(ref) and len(got[0]) == 1500
    assert ff.stats_frame().select(pl.col("ts").str.starts_with("05-19 10:").all()).collect().item()


def test_a_log_copied_from_a_framed_viewer_takes_the_fast_lane(tmp_path: Path) -> None:
    """A log copied from k9s's log view, each line between the frame's borders and padded to its width,
    goes through the vectorised lane with the reference's facts, as the log vLLM wrote would."""
    lines = ["\u2502 " + [STATS_V1, ADDED, ACCESS, WARN_PLAIN][i % 4].format(s=i % 60, r=i, n=i % 3).ljust(300) + "\u2502"
             for i in range(3000)]
    log = tmp_path / "framed.log"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10)
    assert ff.lines >= 2980  # (of 3000, in 14 pieces: a piece's first line takes the line-by-line parser)
    got = _canon(res, ff)
    plain = tmp_path / "plain.log"
    plain.write_text("\n".join(ln[2:].rstrip("\u2502").rstrip() for ln in lines) + "\n")
    assert got == _canon(_reference(log)) == _canon(_reference(plain)) and len(got[0]) == 750 and len(got[1]) == 750


@pytest.mark.parametrize("esc", ["\x1b[", "^[[", "[", "#033["])  # (the codes as written, in caret notation, without ESC, as rsyslog escapes them)
def test_coloured_logs_take_the_fast_lane(esc: str, tmp_path: Path) -> None:
    """A log vLLM wrote to a terminal (`docker run -t`: colour codes in every prefix) goes through the
    vectorised lane (every coloured line took the line-by-line parser), with the reference's facts;
    so does one pasted with its codes in caret notation or without their ESC byte."""
    lines = [_coloured([STATS_V1, ADDED, ACCESS, WARN_PLAIN][i % 4].format(s=i % 60, r=i, n=i % 3)).replace("\x1b[", esc)
             for i in range(3000)]
    assert f"{esc}90m" in lines[0] and f"{esc}1;36m" in lines[1]
    log = tmp_path / "tty.log"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10)
    assert ff.lines >= 2990
    got = _canon(res, ff)
    assert got == _canon(_reference(log)) and len(got[0]) == 750 and len(got[1]) == 750


_PIECES = ["vllm-1  | ", "2026-06-09 14:01:52.982 [Error] (Process) ", "2026-06-09T14:01:52.1Z ", "[pod/a/b] ",
           "vllm-0-7d9f8 vllm ", "INFO 2026-06-09T14:01:52.1Z [resource.labels.containerName: vllm] ",  # (stern; GKE)
           "1781013712100\t2026-06-09T14:01:52.1Z\t",  # (Grafana's logs download)
           "[2026-06-09T14:01:52Z] ", "^[[0;36m", "^[[0m", "[0;36m", "[0m",  # (Buildkite's time; colour codes in
           # caret notation, and without their ESC)
           "> ", "1201:", "vllm.log-1202-", "  12\t",  # (a quote; grep's and cat -n's line numbers)
           "(EngineCore pid=1) (RayWorkerWrapper pid=2, ip=10.0.0.1) ",  # (a line another process relayed)
           "\u00a0", "\u200b", "\ufeff", "INFO\u00a005-19\u00a010:13:00\u00a0[core.py:1]\u00a0",  # (a web page's copy)
           "\u2502 ", "   \u2502",  # (a framed log viewer's borders)
           "#033[2m#033[33m(raylet)#033[0m ", "#033[36m",  # (colour codes as rsyslog escapes them)
           "(EngineCore_DP0 pid=7) ", "INFO 05-19 10:13:00 [core.py:1] ", "\x1b[32m", "\x1b[0m", '{"timestamp": "', " ",
           "Available KV cache memory: 6.5 GiB", "CUDA out of memory. ", "  File ", "x", "\n", "\r", ACCESS,
           "Finished request c-1.", "(APIServer pid=3646) INFO 05-19 10:13:02 [async_llm.py:587] Finished request cmpl-2-0.",
           *(x.format(s=1, r=2, n=3) for x in (STATS_V1, ADDED, STATS_V0, RECEIVED, OLD_ADDED, DEBUG_PLAIN, DEBUG_WORD, DP_STATS,
                                             RAY_FOLDED, KV, MM_STATS, V0_PREFIX)), _coloured(STATS_V1.format(s=2, r=1, n=1)),
           *(json.dumps({"log": x.format(s=3, r=4, n=1) + "\n", "stream": "stderr", "time": "2026-05-19T10:13:03.5Z"},
                        separators=(",", ":")) for x in (STATS_V1, ADDED, ACCESS)),
           *(_otel(x.format(s=3, r=4, n=1), "2026-05-19T10:13:03.5Z") for x in (STATS_V1, ADDED, WARN_PLAIN)),
           *(json.dumps(rec) for x in (STATS_V1, ADDED) for rec in (  # (log shippers' records: logcli, journald, Vector)
               {"labels": {"pod": "v"}, "line": x.format(s=4, r=5, n=1), "timestamp": "2026-05-19T10:13:04.5Z"},
               {"__REALTIME_TIMESTAMP": "1779185584500000", "MESSAGE": x.format(s=4, r=5, n=1)},
               {"@timestamp": "2026-05-19T10:13:04.5Z", "message": x.format(s=4, r=5, n=1)},
               {"log": x.format(s=5, r=6, n=1) + "\n", "@timestamp": "2026-05-19T10:13:05.5Z"},  # (Docker's field
               {"log": x.format(s=5, r=6, n=1), "time": "2026-05-19T10:13:05.5Z", "message": "m"}))]  # first: not Docker's)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=6).map("".join), min_size=1, max_size=30))
def test_fast_lane_equals_reference_on_lines_built_from_every_shape(lines: list[str]) -> None:
    """Lines glued, wrapped, enveloped, coloured and repeated at random from the pieces of every
    shape both lanes know give the same facts and counts in both, in tiny pieces. (This found a
    message glued twice onto one line losing both copies in the fast lane's repeat check.)"""
    with tempfile.TemporaryDirectory() as td:
        log = Path(td) / "x.log"
        log.write_text("\n".join(lines) + "\n")
        res, ff = parse_log_file(log, Path(td) / "spill", chunk_bytes=512)
        assert _canon(res, ff) == _canon(_reference(log))


@pytest.mark.parametrize("spaced", [False, True])
def test_docker_json_file_logs_take_the_fast_lane(spaced: bool, tmp_path: Path) -> None:
    """The file Docker's json-file driver keeps ('{"log":"…\\n","stream":"stderr","time":"…"}' a line,
    as Docker writes it or re-serialised with spaces) goes through the vectorised lane (every line
    took the line-by-line parser: 10 s for 30 MB), with the reference's facts and Docker's exact
    times; colour codes escaped inside, a line Docker split (no line end), a line that is not JSON
    and one whose time is not a time read as the reference reads them."""
    sep = (", ", ": ") if spaced else (",", ":")
    lines = []
    for i in range(3000):
        t = f"2026-05-19T10:{i // 60 % 60:02d}:{i % 60:02d}.123456789Z"
        text = [STATS_V1, ADDED, ACCESS, _coloured(STATS_V1)][i % 4].format(s=i % 60, r=i, n=1)
        ends = "" if i % 97 == 5 else "\n"  # (Docker splits a line over 16 KiB: the first part has no line end)
        lines.append(json.dumps({"log": text + ends, "stream": "stderr", "time": t if i % 89 else "yesterday"},
                                separators=sep))
    lines[7] = '{"log": "not JSON at all'
    log = tmp_path / "container-json.log"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10)
    assert ff.lines >= 2850
    got = _canon(res, ff)
    assert got == _canon(_reference(log)) and len(got[0]) > 1400 and len(got[1]) > 700
    from replay.record.vllm_log import fact_time_us
    rq = ff.requests_frame().select("ts", "t_exact").collect()
    assert rq["ts"][0].startswith("2026-05-19T")  # (Docker's time where it gave one, vLLM's own where not)
    assert rq["t_exact"].to_list() == [fact_time_us(x, 2026) if x.startswith("2026") else None for x in rq["ts"]]
    assert rq["t_exact"].null_count() > 0


@pytest.mark.parametrize("shape", ["logcli", "journald", "vector", "log-and-@timestamp"])
def test_log_shippers_json_records_take_the_fast_lane(shape: str, tmp_path: Path) -> None:
    """Logs exported by log shippers, one JSON record a line (logcli: line, timestamp; journald:
    MESSAGE, __REALTIME_TIMESTAMP in µs; Vector: message, @timestamp; Docker's 'log' first with
    another shipper's time) go through the vectorised lane with the reference's facts and the
    records' exact times; a record with two text fields, a time that is a number, or a second time
    field reads as the reference reads it."""
    lines = []
    for i in range(3000):
        sec = 1779185580 + i
        iso = datetime.fromtimestamp(sec, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.123456789Z")
        text = [STATS_V1, ADDED, ACCESS][i % 3].format(s=i % 60, r=i, n=1)
        rec: dict[str, Any] = {"logcli": {"labels": {"app": "vllm"}, "line": text, "timestamp": iso},
                               "journald": {"__REALTIME_TIMESTAMP": str(sec * 10**6 + 123456), "_PID": "7", "MESSAGE": text},
                               "vector": {"@timestamp": iso, "message": text + "\n", "host": "n1"},
                               "log-and-@timestamp": {"log": text + "\n", "@timestamp": iso}}[shape]
        if i % 101 == 7:
            rec = {**rec, "log": text}  # (two text fields: the reference's order decides)
        if i % 103 == 9:
            rec = {**rec, "time": sec}  # (a time that is a number: the reference ignores it)
        if i % 107 == 11:
            rec = {**rec, "timestamp": iso, "@timestamp": iso}
        lines.append(json.dumps(rec))
    log = tmp_path / "shipped.log"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10)
    assert ff.lines >= 2750  # (a record the reference must read, and the line before it, take the long way)
    got = _canon(res, ff)
    assert got == _canon(_reference(log)) and len(got[0]) > 900 and len(got[1]) > 900
    rq = ff.requests_frame().select("ts", "t_exact").collect()
    assert rq["ts"][0].startswith("2026-05-19T10:13:01.123456") and rq["t_exact"].null_count() == 0


def test_vllm_json_logging_takes_the_fast_lane(tmp_path: Path) -> None:
    """vLLM's own JSON logging goes through the vectorised lane (7.0 s for 40 MB; now 1.7 s) with the
    reference's facts and exact times; a record with an exception, a body of several lines or with
    white space at its ends, a body that is not a string, an odd severity and a record inside
    Docker's JSON read as the reference reads them."""
    lines = []
    for i in range(3000):
        t = f"2026-05-19T10:{i // 60 % 60:02d}:{i % 60:02d}.{i:06d}Z"
        text = [STATS_V1, ADDED, KV, WARN_PLAIN][i % 4].format(s=i % 60, r=i, n=1)
        more: dict[str, Any] = {}
        if i % 101 == 3:
            more["exception"] = "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA out of memory."
        line = _otel(text, t, **more)
        if i % 103 == 4:
            line = line.replace('"body": "', '"body": " \\n')
        if i % 107 == 5:
            line = line.replace('"severity_text": "INFO"', '"severity_text": 7')
        if i % 109 == 6:
            line = json.dumps({"log": line + "\n", "stream": "stderr", "time": t}, separators=(",", ":"))
        lines.append(line)
    lines[9] = json.dumps({"timestamp": "2026-05-19T10:00:09Z", "body": 5})
    log = tmp_path / "vllm.jsonl"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10)
    assert ff.lines >= 2100  # (all but the KV lines, a quarter, which take the long way in any log)
    got = _canon(res, ff)
    assert got == _canon(_reference(log)) and len(got[0]) > 700 and len(got[1]) > 700
    assert any(o[1] == "oom" for o in got[2])  # (from a record's exception, read the long way)


def test_a_log_whose_request_lines_all_run_fast_records_its_requests(tmp_path: Path) -> None:
    """When no request line needs the line-by-line parser, no spilled file has the columns only
    'Received request' lines fill: the requests are still recorded, those columns null."""
    log = tmp_path / "fast.log"
    log.write_text("".join(ADDED.format(s=i % 60, r=i) + "\n" + ACCESS + "\n" for i in range(500)))
    record([log], tmp_path / "b", RecordOptions(year=2026))
    reqs = read_bundle(tmp_path / "b").requests
    assert reqs.height == 500 and reqs["id"].n_unique() == 500 and reqs["input_tokens"].null_count() == 500


def test_old_call_site_form_takes_the_fast_lane(tmp_path: Path) -> None:
    """vLLM 0.6 and 0.7 logs ('INFO 02-12 12:20:21 async_llm_engine.py:211] Added request …', the
    call site without its opening bracket) go through the vectorised lane too (they all took the
    line-by-line parser), with the reference parser's facts."""
    log = tmp_path / "v07.log"
    log.write_text("".join((OLD_ADDED if i % 10 else OLD_STATS).format(s=i % 60, r=i) + "\n" for i in range(3000)))
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10)
    assert ff.lines >= 2990
    got = _canon(res, ff)
    assert got == _canon(_reference(log)) and len(got[0]) == 300 and len(got[1]) == 2700


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("slice_bytes", [None, 3000])
def test_received_request_lines_take_the_fast_lane(keep: bool, slice_bytes: int | None, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """'Received request' lines (vLLM 0.6-0.9 log one per request by default, with prompt, parameters
    and token ids) go through the vectorised lane with every detail the reference reads: parameters
    after the last 'params: ' (a prompt that says 'params: n=9' does not count), the token count,
    the prompt's length and sha256, and the prompt itself only with --keep-prompts. A prompt quoting
    a stats line stays a stats fact, as in the reference. The same where a piece's lines are read a
    few KiB at a time (``RECEIVED_SLICE_BYTES``)."""
    if slice_bytes is not None:
        monkeypatch.setattr(fastlog, "RECEIVED_SLICE_BYTES", slice_bytes)
    quoting = ("(APIServer pid=1) INFO 05-19 10:14:00 [logger.py:39] Received request cmpl-q-0: prompt: 'my log says "
               "Running: 5 reqs, Waiting: 0 reqs, GPU KV cache usage: 80.0%, why?', params: SamplingParams(n=1)")
    lines = [RECEIVED.format(s=i % 60, r=i, n=i % 3) for i in range(2000)] + [quoting, ADDED.format(s=1, r=5)]
    log = tmp_path / "recv.log"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10, keep_prompts=keep)
    assert ff.lines >= 1990
    got, want = _canon(res, ff), _canon(_reference(log))
    assert got == want
    rows = ff.requests_frame().filter(pl.col("kind") == "request_received").sort("line").collect()
    assert rows.height == 2000 and rows["input_tokens"].to_list()[:3] == [3, 3, 3]
    assert rows["max_tokens"].to_list()[:3] == [0, 1, 2] and rows["n"].to_list()[:3] == [0, 1, 2]
    assert rows["prompt_logprobs"][0] == 5 and rows["best_of"][0] is None and rows["prompt_sha256"].null_count() == 0
    assert (rows["prompt"].null_count() == 0) is keep
    assert [s for s in got[0] if s[0] == 2001] and not [r for r in got[1] if r[0] == 2001]  # the quoting line: stats


@pytest.mark.parametrize("slice_bytes", [None, 5000])
def test_received_lines_of_every_shape_read_as_the_reference_reads_them(slice_bytes: int | None, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The vectorised lane takes a 'Received request' line's prompt and token ids as whole matches and
    its parameters by a split (captures over kilobytes of prompt were its slowest step): on lines whose
    prompt quotes the markers themselves, is double-quoted with escapes, is None or runs to kilobytes,
    whose id list is empty, cut short with '...', spaced oddly or missing, and whose parameters are
    missing, it reads what the line-by-line reference reads; also a few KiB of lines at a time. Where
    the first 'prompt: ' or 'prompt_token_ids: [' is no match (a quoted one cut short, an odd space, a
    tab, a newline or another script's digits), the match after it is the reference's too."""
    if slice_bytes is not None:
        monkeypatch.setattr(fastlog, "RECEIVED_SLICE_BYTES", slice_bytes)
    head = "(APIServer pid=1) INFO 05-19 10:15:{s:02d} [logger.py:39] Received request cmpl-{i}-0: "
    params = "params: SamplingParams(n={n}, best_of=None, temperature=0.7, max_tokens={m}, logprobs=2, prompt_logprobs=None)"
    bodies = [
        "prompt: 'it says prompt_token_ids: [9, 9, 9] and params: n=7, max_tokens=1', " + params + ", prompt_token_ids: [1, 2, 3], lora_request: None.",
        'prompt: "it\'s a \\"quoted\\" prompt", ' + params + ", prompt_token_ids: [], lora_request: None.",
        "prompt: None, " + params + ", prompt_token_ids: [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16...",
        "prompt: '" + "long words " * 400 + "', " + params + ", prompt_token_ids: [" + ", ".join(map(str, range(900))) + "], lora_request: None.",
        "prompt: 'spaced ids', " + params + ", prompt_token_ids: [ 1 ,2,\u20033 ], lora_request: None.",
        "prompt: 'no ids', " + params + ", lora_request: None.",
        "prompt: 'no params at all', prompt_token_ids: [4, 5], lora_request: None.",
        "prompt: 'unterminated , " + params,
        "prompt: 'quotes prompt_token_ids: [x, and prompt: z', " + params + ", prompt_token_ids: [7, 8], lora_request: None.",
        "prompt: \u2003'a prompt after an odd space', prompt: 'the second', " + params + ", prompt_token_ids: [\t1,\t2].",
        "prompt: 'ids in other digits', " + params + ", prompt_token_ids: [\u0661, \u0662], lora_request: None.",
    ]
    lines = [head.format(s=i % 60, i=i) + bodies[i % len(bodies)].format(n=i % 4 + 1, m=10 + i) for i in range(400)]
    lines.append("(APIServer pid=1) INFO 05-19 10:16:00 [async_llm.py:587] Added request cmpl-x-0.")
    log = tmp_path / "recv.log"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64 << 10, keep_prompts=True)
    assert ff.lines >= 390  # (they took the vectorised lane)
    got, want = _canon(res, ff), _canon(_reference(log))
    assert got == want
    rows = ff.requests_frame().filter(pl.col("kind") == "request_received").sort("line").collect()
    assert rows["input_tokens"].to_list()[:11] == [3, 0, None, 900, 3, None, 2, None, 2, 2, 2]
    assert rows["prompt"].to_list()[8:10] == ["'quotes prompt_token_ids: [x, and prompt: z'", "'the second'"]
    assert rows["max_tokens"].to_list()[:3] == [10, 11, 12] and rows["logprobs"][0] == 2


_HEAD_PARTS = ["(APIServer pid=1) ", "(EngineCore_DP0 pid=2)", "[VllmWorker rank=0]", "INFO 05-19 10:13:09 ", "DEBUG 05-19 ",
               "WARNING 12-31 23:59:59.123 ", "ERROR 2025-05-19 ", "INFO  | ", "0: ", "web-1  | ", "[pod/v/c] ",
               "2025-05-19T10:13:09.5Z ", "stdout F ", "Mar  1 10:13:09 host vllm[1]: ", "\x1b[32m", "\x1b[0m", "\r", " ",
               "[2025-05-19T10:13:09Z] ", "^[[32m", "^[", "[0;36m", ">", "> ", "12:", "v.log-3-", "7\t", "\u00a0", "\u200b", "\ufeff",
               "\u2502 ", "\u2502", "  \u2502", "#033[2m", "#033[0m",
               "[loggers.py:271] ", "text", "{", "x", "    ", "\t"]


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(_HEAD_PARTS), min_size=1, max_size=8))
def test_the_cheap_tests_of_a_line_agree_with_the_full_ones(parts: list[str]) -> None:
    """The line-by-line parser skips its envelope patterns for a line that opens as vLLM's own, and its
    search for a glued second message where no level and time follow the line's own head: whatever a
    line is made of, that gives what trying them all gives."""
    line = "".join(parts)
    assert vllm_log._strip(line) == vllm_log._strip_envelopes(line)
    if not vllm_log._glued(line):
        assert vllm_log.GLUE.split(line) == [line]


def test_a_debug_level_excerpt_is_a_vllm_log(tmp_path: Path) -> None:
    """An excerpt of a DEBUG-level log (nothing but DEBUG lines in its head) is recognised as a vLLM
    log by the shape of its lines; it was refused as of no known kind and every line quarantined."""
    log = tmp_path / "debug.log"
    log.write_text("".join(f"DEBUG 05-19 10:{i // 60:02d}:{i % 60:02d} [block_pool.py:200] Freed 16 blocks of request "
                           f"cmpl-{i}\n" for i in range(3000)))
    reps, summary = record([log], tmp_path / "b", RecordOptions(year=2025))
    assert reps[0].kind == "vllm-log" and reps[0].parsed == 3000 and summary["quarantined"] == 0


@settings(max_examples=200, deadline=None)
@example(lengths=[0, 4], chunk=3, bound=1, final_lf=False, gz=False, tail=1 << 16)  # (a line across a window's start)
@given(lengths=st.lists(st.integers(0, 700), min_size=1, max_size=12), chunk=st.integers(1, 200),
       bound=st.integers(1, 400), final_lf=st.booleans(), gz=st.booleans(), tail=st.sampled_from([1, 2, 7, 64, 1 << 16]))
def test_text_pieces_hand_on_every_line_and_stand_in_for_those_over_the_bound(
        lengths: list[int], chunk: int, bound: int, final_lf: bool, gz: bool, tail: int) -> None:
    """GIVEN lines of any length, read in chunks of any size (a plain file's pieces read whole, a
    window's end of any length looked at for their cut) THEN the pieces end at line ends and hold
    every line in order, except those longer than the bound (and than a chunk), which come as a
    LongLine with their length and first bytes; the hash is the file's either way."""
    was, fastlog.TAIL_BYTES = fastlog.TAIL_BYTES, tail
    try:
        _pieces_hold_every_line(lengths, chunk, bound, final_lf, gz)
    finally:
        fastlog.TAIL_BYTES = was


def _pieces_hold_every_line(lengths: list[int], chunk: int, bound: int, final_lf: bool, gz: bool) -> None:
    lines = [bytes([97 + i % 26]) * n for i, n in enumerate(lengths)]
    data = b"\n".join(lines) + (b"\n" if final_lf else b"")
    with tempfile.TemporaryDirectory() as td:
        path = Path(td) / ("t.log.gz" if gz else "t.log")
        path.write_bytes(gzip.compress(data) if gz else data)
        h = hashlib.sha256()
        got: list[bytes | fastlog.LongLine] = []
        for piece in fastlog.text_pieces(path, chunk, h, bound):
            if isinstance(piece, fastlog.LongLine):
                got.append(piece)
            else:
                assert piece.endswith(b"\n") or piece is not None
                got += piece.split(b"\n")[:-1] if piece.endswith(b"\n") else piece.split(b"\n")
        assert h.hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()
    limit = max(bound, chunk)
    want: list[bytes | fastlog.LongLine] = [fastlog.LongLine(len(ln), ln[:fastlog.LONG_LINE_HEAD], limit) if len(ln) > limit else ln
                                            for ln in lines]
    if not final_lf and lines[-1] == b"":
        want.pop()  # (no last line: the file ends with the line end of the one before)
    assert got == want


def test_a_line_too_long_to_read_is_quarantined_and_the_lines_around_it_are_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a log with a line far over the bound (a blob pasted without line ends) in the middle of a
    traceback, and another at its end without a final line end THEN each is one quarantined line that
    names its length and keeps its first bytes, the facts before and after it are read with the right
    line numbers, and the message it interrupts is not joined across it."""
    monkeypatch.setattr(fastlog, "MAX_LINE_BYTES", 4096)
    monkeypatch.setattr(fastlog, "CHUNK_BYTES", 1024)
    head = ["INFO 08-20 03:10:00 [model_runner.py:1112] Model loading took 16.5557 GiB and 2.803817 seconds",
            "ERROR 08-20 03:10:01 [engine.py:467] Traceback (most recent call last):"]
    tail = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity "
            "of 44.53 GiB of which 448.00 KiB is free. Including non-PyTorch memory, this process has 44.52 GiB memory "
            "in use. Of the allocated memory 43.10 GiB is allocated by PyTorch, and 130.50 MiB is reserved by "
            "PyTorch but unallocated.",
            "(APIServer pid=7) INFO 08-20 03:10:09 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            "Avg generation throughput: 0.0 tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 7.5%, "
            "Prefix cache hit rate: 0.0%"]
    log = tmp_path / "v.log"
    log.write_text("\n".join([*head, "B" * 50_000, *tail, "Q" * 9000]))
    out = tmp_path / "b"
    record([log], out, RecordOptions(year=2025, keep_quarantine_text=True))
    b = read_bundle(out)
    q = [json.loads(x) for x in (out / "quarantine.jsonl").read_text().splitlines()]
    assert [(e["line"], e["raw"][:3]) for e in q] == [(3, "BBB"), (6, "QQQ")]
    assert q[0]["reason"].startswith("a line of 50,000 bytes, longer than the 4,096 bytes a log line may have")
    assert "9,000 bytes" in q[1]["reason"]
    inp = b.meta.inputs[0]
    assert (inp["lines_read"], inp["quarantined"]) == (6, 2)
    facts = inspect_bundle(b)
    assert facts["weights_gib"] == 16.5557 and facts["kv_usage_pct"] == [7.5] and facts["running"] == [3]
    oom = [e for e in b.events if e["kind"] == "oom"]
    assert len(oom) == 1 and oom[0]["tried_to_allocate_bytes"] == 2 << 20 and oom[0]["source"].endswith(":4")


def test_a_piece_that_opens_like_a_compressed_stream_is_read_as_text(tmp_path: Path) -> None:
    """A log piece whose first bytes are a zlib header ('x^', then a colour code as caret notation) was
    taken for a compressed stream by the CSV reader ('corrupt deflate stream': the recording failed); it
    is read as the text it is, as the reference reads it."""
    log = tmp_path / "x.log"
    log.write_text("x^[[0;36m2026-06-09 14:01:52.982 [Error] (Process) \n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=512)
    assert _canon(res, ff) == _canon(_reference(log)) and res.lines_read == 1


def test_the_caches_hit_rates_of_a_stats_line_become_samples(tmp_path: Path) -> None:
    """GIVEN stats lines stating the prefix cache's and the multimodal cache's hit rates (V1 0.11+; V0's per
    device) WHEN recorded, through either lane THEN each is a 'vllm-log' sample, as a ratio, at its line's
    time; a line that does not state one gives none (not 0)."""
    from replay.bundle import read_bundle
    from replay.record.recorder import RecordOptions, record
    lines = [MM_STATS.format(s=1, r=2), STATS_V1.replace(", Prefix cache hit rate: 0.0%", "").format(s=2, r=3),
             V0_PREFIX.format(s=3, r=5)]
    log = tmp_path / "v.log"
    log.write_text("\n".join(lines) + "\n")
    res, ff = parse_log_file(log, tmp_path / "spill", chunk_bytes=64)
    assert _canon(res, ff)[0] == _canon(_reference(log))[0]
    record([log], tmp_path / "b", RecordOptions(year=2026))
    s = read_bundle(tmp_path / "b").samples
    hits = {m: s.filter((s["metric"] == m) & (s["source"] == "vllm-log")).sort("t_us")["value"].to_list()
            for m in ("prefix_cache_hit_ratio", "mm_cache_hit_ratio")}
    assert hits == {"prefix_cache_hit_ratio": [0.425, 0.25], "mm_cache_hit_ratio": [0.12]}, hits
