"""Ground truth: planted leaks, steps and fragmentation are found; a clean bundle yields nothing."""

from __future__ import annotations

import math
import random
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.analysis.attribution import FEATURES, attribute, classify_oom
from replay.analysis.pipeline import analyze_bundle
from replay.bundle import BundleMeta, BundleWriter, read_bundle
from replay.errors import ReplayError
from replay.report.check import run_check
from tests.conftest import DATA

GIB = 2**30
INTERVAL = 1_000_000


def make_bundle(path: Path, shape: str, onset_s: int = 120, n: int = 300, seed: int = 0) -> Path:
    """A production-like GPU bundle: vLLM accounted 70 GiB of an 80 GiB GPU; actual memory per shape."""
    rng = random.Random(seed)
    meta = BundleMeta(kind="production", t0_utc="2025-01-01T00:00:00Z", vllm_version="0.8.0", engine="v0",
                      engine_args={"gpu_memory_utilization": 0.9},
                      gpus=[{"index": 0, "name": "H100", "total_bytes": 80 * GIB}])
    w = BundleWriter(path, meta)
    w.event({"t_us": 0, "kind": "memory_profile", "weights_gib": 40.0, "non_torch_gib": 1.0,
             "activation_peak_gib": 4.0, "kv_cache_gib": 25.0, "source": "vllm.log:10"})
    for i in range(n):
        t = i * INTERVAL
        base = 70.5 * GIB + rng.gauss(0, 20 * 2**20)
        if shape == "leak" and i >= onset_s:
            base += (i - onset_s) * 40 * 2**20
        if shape == "step" and i >= onset_s:
            base += 3 * GIB
        w.sample(t, 0, "dcgm", "device_used_bytes", base)
        w.sample(t, None, "vllm-metrics", "kv_usage_ratio", 0.5)
    for j in range(200):  # traffic: every 1.5 s; near the onset the planted requests carry the cause
        t = int(j * 1.5 * INTERVAL)
        near = abs(t - onset_s * INTERVAL) <= 2 * INTERVAL
        w.request({"id": f"r{j}", "arrival_us": t, "sent_us": t, "finish_us": t + 500_000,
                   "input_tokens": 800 + rng.randint(0, 200), "max_tokens": 256,
                   "mm_items": 2 if (near and shape == "step") else 0,
                   "prompt_logprobs": 20 if (near and shape == "leak") else None, "status": "ok"})
    if shape == "fragmentation":
        w.event({"t_us": (n - 1) * INTERVAL, "kind": "oom", "source": "vllm.log:900", "tried_to_allocate_bytes": 2 * GIB,
                 "gpu_total_bytes": 80 * GIB, "free_bytes": 1 * GIB, "process_in_use_bytes": 78 * GIB,
                 "allocated_by_pytorch_bytes": 70 * GIB, "reserved_unallocated_bytes": 6 * GIB, "other_processes": []})
    w.close()
    return path


@pytest.mark.parametrize("shape,cause", [("leak", "prompt_logprobs"), ("step", "multimodal")])
def test_planted_onset_found_within_one_interval_and_cause_first(tmp_path: Path, shape: str, cause: str) -> None:
    a = analyze_bundle(read_bundle(make_bundle(tmp_path / shape, shape)))
    assert a.div.onset_us is not None
    assert abs(a.div.onset_us - 120 * INTERVAL) <= INTERVAL, a.div.onset_us
    assert a.attributions and a.attributions[0].feature == cause
    ids = {f.id for f in a.findings}
    assert "divergence" in ids and f"cause:{cause}" in ids and "headroom" in ids


def test_clean_bundle_has_no_finding(tmp_path: Path) -> None:
    a = analyze_bundle(read_bundle(make_bundle(tmp_path / "clean", "clean")))
    assert a.div.onset_us is None and a.findings == []
    failures, _ = run_check(tmp_path / "clean", 3.0, None, True)
    assert failures == 0


def test_fragmentation_oom_classified(tmp_path: Path) -> None:
    a = analyze_bundle(read_bundle(make_bundle(tmp_path / "frag", "fragmentation")))
    ids = [f.id for f in a.findings]
    assert ids[0] == "oom:fragmentation"
    failures, lines = run_check(tmp_path / "frag", 3.0, None, True)
    assert failures == 1 and any(ln.startswith("FAIL no OOM") for ln in lines)


def test_classify_co_tenant_and_budget() -> None:
    co = classify_oom({"gpu_total_bytes": 80 * GIB, "tried_to_allocate_bytes": GIB, "reserved_unallocated_bytes": 10 * 2**20,
                       "allocated_by_pytorch_bytes": 60 * GIB, "process_in_use_bytes": 61 * GIB,
                       "other_processes": [{"pid": 9, "used_bytes": 18 * GIB}]})
    assert co[0][0] == "co-tenant process"
    bud = classify_oom({"gpu_total_bytes": 80 * GIB, "tried_to_allocate_bytes": GIB, "reserved_unallocated_bytes": 10 * 2**20,
                        "allocated_by_pytorch_bytes": 78 * GIB, "process_in_use_bytes": 78.5 * GIB, "other_processes": []})
    assert bud[0][0].startswith("budget too high")


def test_the_process_torch_lists_by_its_host_pid_is_the_one_that_ran_out(tmp_path: Path) -> None:
    """GIVEN vLLM 0.8.0's worker OOM in a container (issue 15105), where torch names its own process
    'Process 133288 has 22.97 GiB memory in use' (the host's PID) and no 'this process' line THEN it is
    no co-tenant: 22.97 GiB beside PyTorch's own 20.39 GiB is more than the 22.98 GiB in use. With the
    'this process' line, a listed process is a co-tenant, as before; and one the sum leaves room for too."""
    from replay.record.recorder import RecordOptions, record
    record([DATA / "v080_v1_oom_own_process_by_host_pid.log"], tmp_path / "b", RecordOptions(year=2025))
    ooms = [e for e in read_bundle(tmp_path / "b").events if e["kind"] == "oom"]
    assert len(ooms) == 2
    for oom in ooms:
        causes = classify_oom(oom)
        assert "co-tenant process" not in [c for c, _, _ in causes]
        assert causes[0][0] == "non-torch growth" and f"process {oom['other_processes'][0]['pid']}" in causes[0][2]
    own = dict(ooms[0], process_in_use_bytes=ooms[0]["other_processes"][0]["used_bytes"] - GIB)
    assert classify_oom(own)[0][0] == "co-tenant process"  # (torch said which is its own: the listed is another)
    beside = dict(ooms[0], other_processes=[{"pid": 5, "used_bytes": 2 * GIB}])  # (fits beside PyTorch's 20.39 GiB)
    assert [c for c, _, _ in classify_oom(beside)][:1] == ["co-tenant process"]


def test_an_allocation_the_gpu_could_never_hold_is_said_so() -> None:
    """GIVEN real torch OOMs of one oversized tensor: 74.16 GiB asked of a 44.40 GiB GPU with 29.89 GiB free
    (a vLLM-served OCR model, dots.ocr issue 196), and 19.68 GiB asked with 11.88 GiB free (a 24 GB GPU,
    quoted in a public repository) THEN the first cause is the allocation's size, at high confidence, not
    'PyTorch holds nearly all memory' (it held a third) nor fragmentation; a slow growth to the limit is
    still the budget's."""
    from replay.record.vllm_log import extract
    huge = extract("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 74.16 GiB. GPU 0 has a total capacity of "
                   "44.40 GiB of which 29.89 GiB is free. Process 2684311 has 14.51 GiB memory in use. Of the allocated memory "
                   "13.44 GiB is allocated by PyTorch, and 738.96 MiB is reserved by PyTorch but unallocated.")[0][1]
    big = extract("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 19.68 GiB. GPU 0 has a total capacity of "
                  "23.68 GiB of which 11.88 GiB is free. Including non-PyTorch memory, this process has 11.79 GiB memory in "
                  "use. Of the allocated memory 11.44 GiB is allocated by PyTorch, and 43.59 MiB is reserved by PyTorch but "
                  "unallocated.")[0][1]
    assert [(c, conf) for c, conf, _ in classify_oom(huge)] == [("allocation larger than the GPU", "high")]
    assert "44.40 GiB" in classify_oom(huge)[0][2]
    assert [(c, conf) for c, conf, _ in classify_oom(big)] == [("one oversized allocation", "high")]
    slow = dict(big, free_bytes=100 * 2**20, tried_to_allocate_bytes=200 * 2**20)
    assert classify_oom(slow)[0][0].startswith("budget too high")


def test_a_kill_is_explained_only_by_a_kill_of_the_same_named_container() -> None:
    """An exit 137 takes the cause the kubelet gave for a kill of the same container (its probe, its pod's
    eviction), never that of a kill whose container is not named (two unnamed ones are not one container)."""
    from replay.analysis.pipeline import kill_cause
    probe = {"kind": "container_killed", "container": "vllm", "probe": "liveness"}
    evicted = {"kind": "container_killed", "container": None, "evicted": "ephemeral-storage"}
    named, unnamed = ({"kind": "container_killed", "container": c, "exit_code": 137} for c in ("vllm", None))
    events = [probe, evicted, named, unnamed]
    assert [kill_cause(e, events) for e in events] == [("probe", "liveness"), ("evicted", "ephemeral-storage"),
                                                      ("probe", "liveness"), None]


def test_check_thresholds(tmp_path: Path) -> None:
    make_bundle(tmp_path / "step", "step")
    failures, lines = run_check(tmp_path / "step", 3.0, None, False)
    assert failures == 1 and lines[0].startswith("FAIL discrepancy")
    failures, _ = run_check(tmp_path / "step", 10.0, 4 * GIB, False)
    assert failures == 0


def test_a_request_still_in_flight_at_the_onset_is_attributed() -> None:
    """A prompt_logprobs prefill raises memory while it runs, seconds after it was sent (on the CPU
    engine of a machine without AVX-512: 6-8 s). It was only compared by its send time, so the chat
    requests sent just before the onset took the blame; a request known to be in flight at the onset
    (finished after it) is now among those near it. One whose finish is unknown is not: a log without
    finish lines would make every earlier request look in flight."""
    onset = 60_000_000
    rows = [{"id": f"chat-{i}", "sent_us": i * 1_000_000, "finish_us": i * 1_000_000 + 700_000, "input_tokens": 300,
             "max_tokens": 64 + 8 * (i >= 55), "prompt_logprobs": None} for i in range(90)]
    rows.append({"id": "logprobs-0", "sent_us": onset - 8_000_000, "finish_us": onset + 50_000_000,
                 "input_tokens": 2500, "max_tokens": 1, "prompt_logprobs": 20})
    rows.append({"id": "logprobs-unknown-end", "sent_us": onset - 30_000_000, "finish_us": None,
                 "input_tokens": 2500, "max_tokens": 1, "prompt_logprobs": 20})
    df = pl.DataFrame(rows, schema_overrides={"finish_us": pl.Int64, "prompt_logprobs": pl.Int64}).with_columns(
        arrival_us=pl.col("sent_us"), logprobs=pl.lit(None, pl.Int64), n=pl.lit(None, pl.Int64),
        best_of=pl.lit(None, pl.Int64), mm_items=pl.lit(None, pl.Int64), prefix_blocks=pl.lit(None, pl.Int64))
    got = attribute(df, onset)
    assert got[0].feature == "prompt_logprobs" and got[0].near_ids == ["logprobs-0"]
    assert all("logprobs-unknown-end" not in a.near_ids for a in got)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_attribution_of_a_requests_file_equals_one_pass_over_its_rows(seed: int, tmp_path: Path) -> None:
    """Attribution reads the requests file as two streaming queries (those near the onset, and the means of
    the rest) so that a day of requests is never held; they must give what one pass over the rows in
    memory gives: the same features, scores and ids, with unknown times and finishes in neither part."""
    rng = random.Random(seed)
    onset = 500_000_000

    def maybe(v: int) -> int | None:
        return None if rng.random() < 0.15 else v
    rows = [{"id": f"r{i}", "sent_us": maybe(rng.randrange(0, 10**9)), "arrival_us": maybe(rng.randrange(0, 10**9)),
             "finish_us": maybe(rng.randrange(0, 10**9)), "input_tokens": maybe(rng.randrange(1, 9000)),
             "max_tokens": maybe(rng.randrange(1, 4096)), "prompt_logprobs": maybe(rng.choice([0, 0, 0, 5])),
             "logprobs": maybe(rng.choice([0, 0, 1])), "n": maybe(rng.choice([1, 1, 2])), "best_of": None,
             "mm_items": maybe(rng.choice([0, 1, 3])), "prefix_blocks": maybe(rng.randrange(0, 40)),
             "image_tokens": maybe(rng.randrange(0, 2000))} for i in range(20_000)]
    df = pl.DataFrame(rows, schema={k: pl.Utf8 if k == "id" else pl.Int64 for k in rows[0]})
    near_rows = df.filter((pl.coalesce("sent_us", "arrival_us") - onset).abs() <= 30_000_000)
    df = pl.concat([df, near_rows.with_columns(input_tokens=pl.col("input_tokens") * 4, id=pl.col("id") + "-near")])
    df.write_parquet(tmp_path / "requests.parquet", row_group_size=1_000)

    got = attribute(pl.scan_parquet(tmp_path / "requests.parquet"), onset, before_us=30_000_000, after_us=30_000_000)
    t = pl.coalesce("sent_us", "arrival_us")
    marked = df.with_columns(_near=((t >= onset - 30_000_000) & (t <= onset + 30_000_000))
                             | ((t < onset - 30_000_000) & (pl.col("finish_us") > onset).fill_null(False)))
    near, rest = marked.filter(pl.col("_near")), marked.filter(~pl.col("_near"))
    assert near.height and rest.height < df.height - near.height  # (some rows' nearness is unknown)
    want = {}
    for k, v in FEATURES.items():
        nm, rm = near.select(v.mean()).item() or 0.0, rest.select(v.mean()).item() or 0.0
        if nm > 0 and math.log((nm + 1) / (rm + 1)) > 0.05:
            want[k] = (round(math.log((nm + 1) / (rm + 1)), 3), near.filter(v > rm)["id"].to_list())
    assert "input_length" in want
    assert {a.feature: (a.score, a.near_ids) for a in got} == want


@pytest.mark.parametrize("pct,gap,named", [(float("nan"), None, "--max-discrepancy"), (-1.0, None, "--max-discrepancy"),
                                           (float("inf"), None, "--max-discrepancy"), (3.0, -5, "--max-gap-bytes")])
def test_check_refuses_a_limit_that_is_no_limit(pct: float, gap: int | None, named: str, tmp_path: Path) -> None:
    """A gate whose limit is NaN, infinite or below zero fails (or passes) every bundle for no reason of
    the bundle's: refused by name, before the bundle is read."""
    with pytest.raises(ReplayError, match="^" + named):
        run_check(tmp_path / "not-read", pct, gap, False)


@pytest.mark.parametrize("n_ooms", [3, 9])
def test_a_crash_loops_alike_ooms_are_one_finding_that_counts_them(tmp_path: Path, n_ooms: int) -> None:
    """GIVEN a crash loop (the same CUDA OOM every restart) and one OOM unlike the others THEN the alike
    ones are one finding that says how many and when the first and last were, with the first few
    occurrences and the last as its evidence; the unlike one stays a finding of its own."""
    meta = BundleMeta(kind="production", t0_utc="2025-01-01T00:00:00Z", gpus=[{"index": 0, "total_bytes": 80 * GIB}])
    w = BundleWriter(tmp_path / "b", meta)
    oom = {"kind": "oom", "tried_to_allocate_bytes": 2 * GIB, "gpu_total_bytes": 80 * GIB, "free_bytes": GIB,
           "process_in_use_bytes": 78 * GIB, "allocated_by_pytorch_bytes": 70 * GIB,
           "reserved_unallocated_bytes": 6 * GIB, "other_processes": []}
    for k in range(n_ooms):
        w.event({**oom, "t_us": (60 + 300 * k) * 1_000_000, "source": f"vllm.log:{100 * k + 7}"})
    w.event({**oom, "t_us": 9_000_000_000, "source": "vllm.log:99999", "reserved_unallocated_bytes": 3 * GIB})
    w.close()
    frag = [f for f in analyze_bundle(read_bundle(tmp_path / "b")).findings if f.id == "oom:fragmentation"]
    assert len(frag) == 2
    last_s = 60 + 300 * (n_ooms - 1)
    assert frag[0].detail.endswith(f"({n_ooms} times; the first at 60.0 s, the last at {last_s}.0 s)")
    assert "times" not in frag[1].detail and "3.00 GiB reserved" in frag[1].detail
    sources = [e.get("source") for e in frag[0].evidence]
    if n_ooms <= 6:
        assert sources == [f"vllm.log:{100 * k + 7}" for k in range(n_ooms)]
    else:
        assert sources[:5] == [f"vllm.log:{100 * k + 7}" for k in range(5)] and sources[-1] == f"vllm.log:{100 * (n_ooms - 1) + 7}"
        assert frag[0].evidence[5] == {"what": f"{n_ooms - 6} more alike"}


def test_a_death_of_unstated_cause_is_no_oom_and_what_cannot_be_judged_is_said(tmp_path: Path) -> None:
    """GIVEN the real head of a 0.7.2 log (vLLM #13152): the engine's death, no OOM line, no memory figures
    THEN the analysis states no OOM (its 'oom_s' was the death's time), the first crash as an engine death
    of a cause unstated, and that neither memory nor the death's cause can be judged from it; a CUDA OOM
    logged before a death is that death's stated cause, and a memory series leaves only the cause unjudged."""
    from replay.record.recorder import RecordOptions, record
    record([DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log"], tmp_path / "b", RecordOptions(year=2025))
    a = analyze_bundle(read_bundle(tmp_path / "b"))
    s = a.summary()
    assert s["oom_s"] is None and a.findings == []
    assert {k: s["crash"][k] for k in ("kind", "s", "cause_stated", "oom")} == {
        "kind": "engine_death", "s": 0.0, "cause_stated": False, "oom": False}
    assert [u.id for u in a.unjudged] == ["memory:unmeasured", "crash:unstated"]
    assert "v072_80gb_qwen25_72b_awq_runtime_oom_head.log:4" in a.unjudged[1].what
    # an OOM line 3 s before the death states its cause; device memory makes memory judged
    meta = BundleMeta(kind="production", t0_utc="2025-01-01T00:00:00Z", vllm_version="0.7.2", engine="v0")
    w = BundleWriter(tmp_path / "c", meta)
    w.event({"t_us": 7_000_000, "kind": "oom", "source": "x.log:5", "tried_to_allocate_bytes": GIB})
    w.event({"t_us": 10_000_000, "kind": "engine_death", "source": "x.log:9", "message": "Engine background task failed"})
    for i in range(20):
        w.sample(i * INTERVAL, 0, "nvidia-smi", "device_used_bytes", 70 * GIB)
    w.close()
    c = analyze_bundle(read_bundle(tmp_path / "c"))
    assert c.summary()["oom_s"] == 7.0 and c.summary()["crash"]["kind"] == "oom"
    assert [u.id for u in c.unjudged] == ["memory:unaccounted"]


MIB = 2**20


def _detect(mib: list[float], step_us: int = 250_000):  # type: ignore[no-untyped-def]
    from replay.analysis.divergence import detect
    return detect(pl.DataFrame({"t_us": [i * step_us for i in range(len(mib))], "gap_bytes": [float(v) * MIB for v in mib],
                                "actual_bytes": [3000.0 * MIB + v * MIB for v in mib]}))


def _episodes_one_by_one(t: list[int], excess: list[float], first: int, thr: float, low: float,
                         confirm: int) -> list[tuple[int, int | None]]:
    """The hysteresis episodes as a loop over the samples reads them: the reference for ``_episodes``."""
    episodes: list[tuple[int, int | None]] = []
    run, active = 0, None
    for i, ex in enumerate(excess):
        if active is None:
            run = run + 1 if ex > thr else 0
            if run >= confirm:
                active = t[first + i - confirm + 1]
        elif ex < low:
            episodes.append((active, t[first + i]))
            active, run = None, 0
    return episodes + ([(active, None)] if active is not None else [])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([0.0, 20.0, 40.0, 60.0, 100.0, 300.0]), max_size=60), st.integers(0, 4),
       st.integers(1, 4))
def test_hysteresis_episodes_are_those_a_loop_over_the_samples_finds(levels: list[float], first: int, confirm: int) -> None:
    """GIVEN a gap's excess over its baseline in steps around the threshold (100) and the level that ends an
    episode (50): runs over it shorter and longer than ``confirm``, ends under it, an episode still on at
    the end THEN the episodes numpy finds are those a loop over the samples finds."""
    import numpy as np

    from replay.analysis.divergence import _episodes
    t = [1_000 * i for i in range(first + len(levels))]
    want = _episodes_one_by_one(t, levels, first, 100.0, 50.0, confirm)
    assert _episodes(t, np.asarray(levels, dtype=float), first, 100.0, 50.0, confirm) == want


def test_the_largest_gap_is_its_first_sample_where_it_is_reached_again() -> None:
    """GIVEN a gap that reaches its peak, falls, and reaches the same peak again THEN the largest gap is
    dated to the first of them; the gap's samples in no order are taken in time order first."""
    mib = [5, 5, 6, 5, 5, 6, 5, 5, 400, 900, 300, 900, 900, 20]
    d = _detect(mib)
    assert (d.max_gap_bytes, d.max_gap_us) == (900 * MIB, 9 * 250_000)
    from replay.analysis.divergence import detect
    shuffled = pl.DataFrame({"t_us": [i * 250_000 for i in range(len(mib))], "gap_bytes": [v * MIB for v in map(float, mib)],
                             "actual_bytes": [3000.0 * MIB] * len(mib)}).reverse()
    assert detect(shuffled).max_gap_us == 9 * 250_000


def test_a_level_step_before_a_sudden_rise_is_not_its_onset() -> None:
    """GIVEN a CPU replay's gap as measured (a fresh server's first requests creep it up 10 MiB, one more
    request steps it 10 MiB above the baseline and it stays level, then a long prompt_logprobs prefill
    raises it by hundreds of MiB a sample) WHEN detected THEN the onset is the first sample of the rise,
    not the creep or the level step that kept the cumulative excess above zero; without the step, the
    same sample."""
    creep = [6, 8, 14, 14, 16, 16.7, 16.7, 17, 17]
    rise = [120, 330, 540, 990, 1400, 1800, 2100]
    stepped = _detect(creep + [26, 26, 26, 26] + rise)
    plain = _detect(creep + [17, 17, 17, 17] + rise)
    assert stepped.onset_us == plain.onset_us == 13 * 250_000, (stepped.onset_us, plain.onset_us)
    # (as measured in a clean run: each chat request 2.4 MiB more, the last step held for two samples only)
    crept = _detect([10.2, 12.1, 12.1, 12.2, 12.2, 14.5, 14.5, 14.5, 14.5, 16.9, 16.9, 22.2, 22.3, 151.0, 350.2,
                     589.5, 1081.3, 1618.6])
    assert crept.onset_us == 13 * 250_000, crept.onset_us
    # a staircase (each image request's step stays) is on its way well before its last step: its onset stays
    # at its first (as measured: the CI gate's workload through the vision env)
    stairs = _detect(creep + [17, 17, 17, 17, 60, 60, 60, 60, 80, 80, 80, 150, 160, 170])
    assert stairs.onset_us == 13 * 250_000, stairs.onset_us
    # a rise over two samples begins at the first of them
    two = _detect(creep + [17, 17, 60] + rise)
    assert two.onset_us == 11 * 250_000, two.onset_us


def test_a_surge_that_dips_under_the_threshold_before_it_holds_is_its_onset() -> None:
    """GIVEN a gap as measured in a multimodal replay: a photo's request steps it ~10 MiB above the baseline
    and it stays level, then the first scans surge it past the threshold, it dips back under it (the
    encoder's activations freed) and crosses for good only later WHEN detected THEN the onset is the
    surge's first sample, not the photo's step (the rise to the crossing that held, from the dip, is too
    small to be taken for the divergence's start)."""
    creep = [6, 8, 14, 14, 16, 16.7, 16.7, 17, 17]
    d = _detect(creep + [27] * 8 + [70, 215, 190, 100, 100, 100, 100, 100, 100, 170, 170, 170, 170, 170])
    assert d.first_crossing_us == 26 * 250_000, d.first_crossing_us
    assert d.onset_us == 17 * 250_000, d.onset_us


def test_the_gpus_of_a_node_sharing_each_time_are_detected_without_error() -> None:
    """GIVEN two GPUs sampled at the same seconds, one jumping a GiB a second before the other (the
    crossing is the second sample at its time, and the first sample after the last zero is a second
    later) WHEN detected THEN the crossing is that second and the onset the one after it, as before
    the rise was looked for up to the first sample over the threshold (which then looked only at the
    first sample at the crossing's time, and failed)."""
    from replay.analysis.divergence import detect
    gib = 2**30
    rows = [(s * 1_000_000, gpu, 10 * gib + x, x + (s % 3) * 2**20) for s in range(40) for gpu in (0, 1)
            for x in [0.0 if s < 30 or (s == 30 and gpu == 0) else 1.0 * gib]]
    g = pl.DataFrame(rows, schema={"t_us": pl.Int64, "gpu": pl.Int32, "actual_bytes": pl.Float64,
                                   "gap_bytes": pl.Float64}, orient="row")
    d = detect(g)
    assert (d.first_crossing_us, d.onset_us) == (30_000_000, 31_000_000)


def test_a_slow_leak_keeps_its_onset_where_it_began() -> None:
    """A clean leak of 1 MiB a sample from sample 100 on crosses long after it began: its onset stays at its
    start however level its last samples look."""
    d = _detect([0.0] * 100 + [float(i) for i in range(1, 400)], step_us=1_000_000)
    assert d.first_crossing_us is not None and d.first_crossing_us > 150_000_000
    assert d.onset_us is not None and abs(d.onset_us - 100_000_000) <= 10_000_000, d.onset_us


_BUDGET_OOM = {"kind": "oom", "gpu_total_bytes": 80 * GIB, "tried_to_allocate_bytes": GIB, "free_bytes": 10 * 2**20,
               "reserved_unallocated_bytes": 10 * 2**20, "allocated_by_pytorch_bytes": 78 * GIB,
               "process_in_use_bytes": 78.5 * GIB, "other_processes": []}


@pytest.mark.parametrize("fleet", [False, True], ids=["one log", "two replicas"])
def test_an_ooms_kv_usage_is_its_own_replicas_when_it_struck(tmp_path: Path, fleet: bool) -> None:
    """GIVEN an OOM at 100 s in b.log, whose KV usage was 42 % then (and 10 % after its engine restarted),
    and, with two replicas, a.log's usage at 97 % later on WHEN the bundle is analysed THEN the OOM's
    finding states 42 %: the usage when and where it struck. Before, every OOM took the last KV sample of
    the bundle, whichever replica's and however long after."""
    names = ["a.log", "b.log"] if fleet else ["b.log"]
    meta = BundleMeta(kind="production", t0_utc="2025-01-01T00:00:00Z", gpus=[{"index": 0, "total_bytes": 80 * GIB}],
                      inputs=[{"path": f"/logs/{n}", "kind": "vllm-log"} for n in names])
    w = BundleWriter(tmp_path / "b", meta)
    own = "vllm-log[b.log]" if fleet else "vllm-log"
    for s in range(0, 300, 10):
        w.sample(s * INTERVAL, None, own, "kv_usage_ratio", 0.42 if s <= 100 else 0.10)
        if fleet:
            w.sample(s * INTERVAL + 5, None, "vllm-log[a.log]", "kv_usage_ratio", 0.97)
    w.event({**_BUDGET_OOM, "t_us": 105 * INTERVAL, "source": "b.log:900"})
    w.close()
    budget = [f for f in analyze_bundle(read_bundle(tmp_path / "b")).findings if f.id.startswith("oom:budget")]
    assert len(budget) == 1 and "with KV usage at 42%" in budget[0].detail, budget
