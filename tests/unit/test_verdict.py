"""The verdict: production beside its replays, aligned on the requests both hold.

Production and replays are written with BundleWriter in the formats the recorder and the replayer write:
production's requests arrive every 2 s from 100 s after its t0 (the trace's window starts there), the
replay's on its own clock from 30 s (its engine took that long to start), under the same ids. So a
replay's time + 70 s is production's, and trace time is production's less 100 s.
"""

from __future__ import annotations

import html as htmllib
import random
import re
from pathlib import Path
from typing import Any

import pytest

from replay.analysis.pipeline import analyze_bundle
from replay.analysis.verdict import (
    align,
    at_request,
    trace_clock,
    trace_hms,
    verdict_lines,
    verdicts,
)
from replay.bundle import BundleMeta, BundleWriter, read_bundle
from replay.errors import ReplayError
from tests.conftest import DATA

GIB = 2**30
MIB = 2**20
S = 1_000_000
T0 = "2025-03-01T10:00:00Z"
N_REQ = 91  # r0000 .. r0090, trace 0 .. 180 s


def production(path: Path, *, oom_s: float | None = 170.0, leak_s: float | None = None, memory: bool = True,
               crash_kind: str = "oom", early: bool = False, outliers: int = 0) -> Path:
    """A GPU production bundle: vLLM 0.6.3 accounted 70 GiB of 80; device memory from DCGM every second."""
    rng = random.Random(1)
    meta = BundleMeta(kind="production", t0_utc=T0, vllm_version="0.6.3", engine="v0",
                      engine_args={"gpu_memory_utilization": 0.9}, gpus=[{"index": 0, "name": "A100", "total_bytes": 80 * GIB}])
    w = BundleWriter(path, meta)
    w.event({"t_us": 0, "kind": "engine_start", "marker": "vLLM API server version", "source": "vllm.log:1"})
    if memory:
        w.event({"t_us": 1 * S, "kind": "memory_profile", "weights_gib": 40.0, "non_torch_gib": 1.0,
                 "activation_peak_gib": 4.0, "kv_cache_gib": 25.0, "source": "vllm.log:10"})
        for i in range(300):
            v = 70.5 * GIB + rng.gauss(0, 10 * MIB) + (max(0.0, i - leak_s) * 60 * MIB if leak_s is not None else 0)
            w.sample(i * S, 0, "dcgm", "device_used_bytes", v)
    for k in range(N_REQ):
        t = (100 + 2 * k) * S + (50 * S if k < outliers else 0)  # (outliers: arrivals a log misplaced)
        w.request({"id": f"r{k:04d}", "arrival_us": t, "finish_us": t + 500_000, "input_tokens": 500, "status": "ok"})
    if early:  # a request before the trace's window: not in the trace
        w.request({"id": "before-window", "arrival_us": 90 * S, "finish_us": 91 * S, "input_tokens": 10, "status": "ok"})
    if oom_s is not None:
        w.event({"t_us": int(oom_s * S), "kind": crash_kind, "source": "vllm.log:900",
                 **({"tried_to_allocate_bytes": 2 * GIB} if crash_kind == "oom" else {"message": "Engine background task failed"})})
    w.close()
    return path


def replay(path: Path, *, version: str = "0.8.5", oom_s: float | None = 103.5, leak_s: float | None = None,
           speed: float = 1.0, ids: str = "r", trace: bool = True, last_k: int = N_REQ, outcome: str | None = None,
           in_flight: tuple[str, ...] = (), heavy: str | None = None, memory: bool = True) -> Path:
    """A CPU replay of the trace: the engine ready at 20 s, requests from 30 s, process RSS every 0.5 s."""
    rng = random.Random(2)
    extra: dict[str, Any] = {"device": "cpu", "speed": speed, "capacity_bytes": 4 * GIB,
                             "outcome": outcome or ("capacity_guard" if oom_s is not None else "completed")}
    if trace:
        extra["trace"] = {"bundle_sha256": "0" * 64, "window_us": [100 * S, 300 * S], "production_t0_utc": T0}
    meta = BundleMeta(kind="replay", t0_utc="2025-06-01T08:00:00Z", vllm_version=version, engine="v1", extra=extra)
    w = BundleWriter(path, meta)
    w.event({"t_us": 2 * S, "kind": "engine_start", "marker": "Initializing a V1 LLM engine", "source": "server.log:3"})
    if memory:
        w.event({"t_us": 20 * S, "kind": "engine_ready", "source": "replay", "rss_bytes": 2 * GIB, "device": "cpu"})
    end = oom_s if oom_s is not None else 30 + (2 * (last_k - 1)) / speed + 5
    i = 0
    while memory and 20 + i * 0.5 <= end:
        t = 20 + i * 0.5
        v = 2 * GIB + rng.gauss(0, 2 * MIB) + (max(0.0, t - leak_s) * 100 * MIB if leak_s is not None else 0)
        w.sample(int(t * S), None, "process", "process_rss_bytes", v)
        i += 1
    for k in range(last_k):
        t = 30 * S + int(2 * k * S / speed)
        fin = None if f"r{k:04d}" in in_flight else t + 500_000
        big = f"r{k:04d}" == heavy  # (a long prompt with prompt_logprobs: what the attribution points to)
        w.request({"id": f"{ids}{k:04d}", "arrival_us": t, "sent_us": t, "finish_us": fin, "input_tokens": 3000 if big else 500,
                   "prompt_logprobs": 20 if big else None, "status": "ok" if fin else "aborted", "source": "replay"})
    if oom_s is not None:
        w.event({"t_us": int(oom_s * S), "kind": "emulated_oom", "source": "replay",
                 "label": "EMULATED OOM (capacity guard on CPU), not a real device OOM"})
    w.event({"t_us": int(end * S) + S, "kind": "engine_shutdown", "source": "server.log:99", "message": "EngineDeadError"})
    w.close()
    return path


def test_alignment_is_the_median_offset_of_the_requests_both_hold(tmp_path: Path) -> None:
    """Three arrivals a log misplaced by 50 s do not move it: replay time + 70 s is production's."""
    p = read_bundle(production(tmp_path / "prod", outliers=3))
    r = read_bundle(replay(tmp_path / "r"))
    al = align(p, r)
    assert (al.method, al.offset_us, al.shared, al.scale) == ("request_ids", 70 * S, N_REQ, 1.0)
    assert al.to_reference(103_500_000) == 173_500_000
    clock = trace_clock(p, [r])
    assert (clock.basis, clock.origin_us) == ("window", 100 * S)


def test_alignment_without_shared_ids_falls_back_and_says_which(tmp_path: Path) -> None:
    """No id in common: the trace's window start places the replay's first request at trace 0 (production's
    100 s); without a window, the first request of each (production's first is a request before the
    window, at 90 s, so that guess is 10 s off, and the method says it was a guess)."""
    p = read_bundle(production(tmp_path / "prod", early=True))
    win = align(p, read_bundle(replay(tmp_path / "w", ids="x")))
    assert (win.method, win.offset_us, win.shared) == ("window", 70 * S, 0)
    first = align(p, read_bundle(replay(tmp_path / "f", ids="x", trace=False)))
    assert (first.method, first.offset_us) == ("first_request", 60 * S) and "assumed" in first.note
    both = align(p, read_bundle(replay(tmp_path / "i", trace=False)))  # (ids shared: no guess needed)
    assert (both.method, both.offset_us) == ("request_ids", 70 * S)


def test_window_start_follows_production_t0(tmp_path: Path) -> None:
    """A trace cut from a production bundle whose t0 was 10 s later than this one's: its window start
    lies 10 s further on this bundle's clock."""
    p = read_bundle(production(tmp_path / "prod"))
    r = read_bundle(replay(tmp_path / "r", ids="x"))
    r.meta.extra["trace"]["production_t0_utc"] = "2025-03-01T10:00:10Z"
    assert align(p, r).offset_us == 80 * S and trace_clock(p, [r]).origin_us == 110 * S
    r.meta.extra["trace"]["offset_us"] = 95 * S  # (the trace's t=0 itself, as `replay run BUNDLE` states it: first)
    assert align(p, r).offset_us == 75 * S and trace_clock(p, [r]).origin_us == 105 * S


def test_a_replay_at_twice_the_speed_is_scaled(tmp_path: Path) -> None:
    p = read_bundle(production(tmp_path / "prod"))
    r = read_bundle(replay(tmp_path / "r", speed=2.0, oom_s=66.75))  # (trace 73.5 s at twice the speed)
    al = align(p, r)
    assert (al.scale, al.offset_us) == (2.0, 40 * S)
    [v] = verdicts(p, [r])
    assert v.trace_time_us == 73_500_000 and v.delta_s == 3.5 and v.at_request == "r0036"


def test_an_oom_replay_reproduced_at_the_request_it_came_at(tmp_path: Path) -> None:
    """The replay's capacity guard fired at trace 73.5 s, production's OOM was at trace 70 s: reproduced,
    3.5 s later, at r0036 (trace 72 s: the last request to arrive before it)."""
    p, r = production(tmp_path / "prod"), replay(tmp_path / "r")
    [v] = verdicts(read_bundle(p), [read_bundle(r)])
    assert (v.run, v.version, v.reproduced, v.how) == ("r", "0.8.5", True, "oom")
    assert (v.at_request, v.trace_time_us, v.production_trace_time_us, v.delta_s) == ("r0036", 73_500_000, 70 * S, 3.5)
    assert v.production_what == "OOM" and v.alignment is not None and v.alignment.method == "request_ids"
    assert verdict_lines([v]) == ["reproduced at 0.8.5: emulated OOM (capacity guard) at request r0036, 3.5 s after production's OOM at trace 00:01:10"]
    assert "production: request r0035 arrived 0.0 s before it, the last to arrive of those in flight" in v.evidence
    assert "replay: request r0036 arrived 1.5 s before it, the last to arrive (none was in flight)" in v.evidence


def test_the_request_in_flight_at_the_oom_is_the_one_named(tmp_path: Path) -> None:
    """r0030 (trace 60 s) never finished: it was in flight at the OOM when r0036 had finished; it is named.
    Of two in flight, the one the traffic attribution points to (a 3,000-token prompt with prompt_logprobs,
    r0028) is named before the last to arrive (r0034, a plain one)."""
    p, r = production(tmp_path / "prod"), replay(tmp_path / "r", in_flight=("r0030",))
    [v] = verdicts(read_bundle(p), [read_bundle(r)])
    assert v.at_request == "r0030" and v.after_request_s == 13.5
    assert at_request(read_bundle(r), 103_500_000) == ("r0030", 90 * S)
    two = read_bundle(replay(tmp_path / "two", in_flight=("r0028", "r0034"), heavy="r0028"))
    assert at_request(two, 103_500_000) == ("r0034", 98 * S)  # (no attribution given: the last in flight)
    [w] = verdicts(read_bundle(p), [two])
    assert w.at_request == "r0028" and any("attribution points to (prompt logprobs)" in e for e in w.evidence)


def test_a_clean_replay_is_not_reproduced(tmp_path: Path) -> None:
    p = production(tmp_path / "prod")
    r = replay(tmp_path / "r", version="0.9.0", oom_s=None)
    [v] = verdicts(read_bundle(p), [read_bundle(r)])
    assert (v.reproduced, v.how, v.at_request, v.trace_time_us, v.delta_s) == (False, "none", None, None, None)
    assert verdict_lines([v]) == ["not reproduced at 0.9.0: no OOM, no engine death and no divergence "
                                  "(production: OOM at trace 00:01:10)"]


def test_a_divergence_is_reproduced_at_its_onset(tmp_path: Path) -> None:
    """Production's memory left its accounting at trace 50 s, the replay's at trace 51.2 s (its onset the next
    sample): reproduced as a divergence, after r0025, compared with production's onset, not its OOM."""
    p = production(tmp_path / "prod", leak_s=150.0, oom_s=None)
    r = replay(tmp_path / "r", oom_s=None, leak_s=81.2)
    [v] = verdicts(read_bundle(p), [read_bundle(r)])
    assert (v.reproduced, v.how, v.at_request, v.production_what) == (True, "divergence", "r0025", "divergence onset")
    assert v.delta_s is not None and 0.5 <= v.delta_s <= 2.5
    line = verdict_lines([v])[0]
    assert v.same_request is True  # (production's onset came after r0025 too)
    assert re.fullmatch(r"reproduced at 0\.8\.5: the divergence began \d\.\d s after request r0025 \(the same request "
                        r"as production's\), \d\.\d s after production's divergence onset at trace 00:00:5\d(\.\d)?", line), line


def test_no_verdict_without_production_memory_or_crash(tmp_path: Path) -> None:
    """Production's evidence holds requests and nothing else (no memory series, no crash): the replay's OOM is
    stated, but whether it reproduced anything cannot be judged. A production whose memory was measured and
    stayed with its accounting has nothing to reproduce either."""
    r = read_bundle(replay(tmp_path / "r"))
    [v] = verdicts(read_bundle(production(tmp_path / "bare", memory=False, oom_s=None)), [r])
    assert (v.reproduced, v.how, v.at_request) == (None, "oom", "r0036")
    assert "no crash and no memory evidence" in v.evidence[0] and "nvidia-smi" in v.evidence[0]
    assert verdict_lines([v])[0].startswith("cannot judge at 0.8.5: production (bare) has no crash and no memory evidence")
    [clean] = verdicts(read_bundle(production(tmp_path / "clean", oom_s=None)), [r])
    assert clean.reproduced is None and "nothing to reproduce" in clean.evidence[0]


def test_a_replay_that_stopped_short_of_the_crash_cannot_say_it_did_not_reproduce(tmp_path: Path) -> None:
    """A replay of the trace's first 40 s (r0000..r0020) with no OOM: production's OOM at trace 70 s lies past
    it, so 'not reproduced' would be a claim about traffic it never sent. An interrupted replay likewise."""
    p = read_bundle(production(tmp_path / "prod"))
    [short] = verdicts(p, [read_bundle(replay(tmp_path / "short", oom_s=None, last_k=21))])
    assert (short.reproduced, short.how) == (None, "unknown") and "before production's OOM at trace 00:01:10" in short.evidence[0]
    [stopped] = verdicts(p, [read_bundle(replay(tmp_path / "ctrlc", oom_s=None, outcome="interrupted"))])
    assert (stopped.reproduced, stopped.how) == (None, "unknown")


def test_an_engine_death_is_not_called_an_oom(tmp_path: Path) -> None:
    """Production's engine died with no OOM line and no memory series: the replay's OOM is compared with that
    death, named a death."""
    p = production(tmp_path / "prod", memory=False, crash_kind="engine_death")
    [v] = verdicts(read_bundle(p), [read_bundle(replay(tmp_path / "r"))])
    assert (v.reproduced, v.production_what, v.delta_s) == (True, "engine death", 3.5)
    assert any("a crash, not an OOM" in e for e in v.evidence)
    assert any(e.startswith("production: no memory measured") for e in v.evidence)


def test_verdicts_refuse_bundles_of_the_wrong_kind(tmp_path: Path) -> None:
    p, r = read_bundle(production(tmp_path / "prod")), read_bundle(replay(tmp_path / "r"))
    with pytest.raises(ReplayError, match="not a replay"):
        verdicts(p, [p])
    with pytest.raises(ReplayError, match="against a production bundle"):
        verdicts(r, [r])


def test_trace_time_reads_as_a_clock() -> None:
    assert [trace_hms(x) for x in (0, 72 * S, 3_723_400_000, -3 * S, None)] == [
        "00:00:00", "00:01:12", "01:02:03.4", "-00:00:03", "?"]


def test_the_real_v072_death_beside_a_replay_of_its_request(tmp_path: Path) -> None:
    """GIVEN the real head of a 0.7.2 log (vLLM #13152): one request added, then the engine's death, no OOM
    line, no memory figures; and a replay of that request that ran out of memory 2.1 s after sending it
    THEN reproduced, at that same request, 2.1 s after production's engine death at trace 00:00:00."""
    from replay.record.recorder import RecordOptions, record
    record([DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log"], tmp_path / "prod", RecordOptions(year=2025))
    p = read_bundle(tmp_path / "prod")
    rid = "cmpl-b57e07640a1646f08fbf1844f1d76ee5-0"
    w = BundleWriter(tmp_path / "r", BundleMeta(kind="replay", vllm_version="0.7.2", engine="v0", extra={"device": "cpu"}))
    w.request({"id": rid, "arrival_us": 30 * S, "sent_us": 30 * S, "status": "aborted", "source": "replay"})
    w.event({"t_us": 32_100_000, "kind": "oom", "source": "server.log:70", "tried_to_allocate_bytes": 2 * GIB})
    w.close()
    [v] = verdicts(p, [read_bundle(tmp_path / "r")])
    assert (v.reproduced, v.how, v.at_request, v.same_request, v.delta_s) == (True, "oom", rid, True, 2.1)
    assert verdict_lines([v]) == [f"reproduced at 0.7.2: OOM at request {rid} (the same request as production's), "
                                  "2.1 s after production's engine death at trace 00:00:00"]


def test_the_report_puts_production_beside_its_replays(tmp_path: Path) -> None:
    """report PRODUCTION --compare R1 R2: one verdict row per replay, and every run on trace time: the
    replay's samples from its 20 s sit at trace -10 s, its OOM marker at trace 73.5 s, production's own
    memory and accounting drawn beside them (on an axis of their own: GPU GiB against CPU GiB)."""
    from replay.report.html import compare_figure, write_report
    p = production(tmp_path / "prod")
    r1, r2 = replay(tmp_path / "r1"), replay(tmp_path / "r2", version="0.9.0", oom_s=None)
    out = tmp_path / "c.html"
    write_report(p, [r1, r2], out)
    text = htmllib.unescape(out.read_text())
    assert "Verdict: production beside its replays" in text and "Production beside its replays, on trace time" in text
    assert "reproduced at 0.8.5: emulated OOM (capacity guard) at request r0036, 3.5 s after production's OOM at trace 00:01:10" in text
    assert "not reproduced at 0.9.0: no OOM, no engine death and no divergence" in text
    fig = compare_figure([analyze_bundle(read_bundle(x)) for x in (p, r1, r2)])
    by = {t.name: t for t in fig.data}
    act = by["r1: actual (process:process_rss_bytes)"]
    assert act.x[0] == -10.0 and act.yaxis == "y2"
    assert by["prod (production): actual (dcgm:device_used_bytes)"].yaxis == "y"
    assert "prod (production): accounted by vLLM" in by and "r1: accounted by vLLM" in by
    lane = [t for t in fig.data if t.mode == "markers" and t.name == "r1"][0]
    assert 73.5 in lane.x and 70.0 in [t for t in fig.data if t.mode == "markers" and t.name == "prod (production)"][0].x


def test_the_postmortem_states_each_verdict_with_its_evidence(tmp_path: Path) -> None:
    from replay.report.postmortem import render_postmortem
    p = production(tmp_path / "prod")
    md = render_postmortem(p, None, [replay(tmp_path / "r1"), replay(tmp_path / "r2", version="0.9.0", oom_s=None)])
    assert "## Reproduction" in md
    assert "- reproduced at 0.8.5: emulated OOM (capacity guard) at request r0036, 3.5 s after production's OOM at trace 00:01:10" in md
    assert "- not reproduced at 0.9.0: no OOM, no engine death and no divergence (production: OOM at trace 00:01:10)" in md
    assert "  - aligned on 91 request id(s) both hold" in md
    assert "Replays of its trace: reproduced at 0.8.5" in md
    assert "## Reproduction" not in render_postmortem(p, None)
