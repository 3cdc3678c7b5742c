"""`replay matrix` and `replay bisect` behind the runner seam: the product of versions and settings, the
manifest, resuming (completed runs skipped, failed ones retried), retries, a run's OOM as its result,
the verdicts against production and the report, and the bisect's search. Runs go through the stub
server (``replay.matrix.stubrun``): the real driver and real bundles, no engine."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from replay.bundle import BundleMeta, BundleWriter, read_bundle
from replay.drive.runner import RunOptions
from replay.errors import ReplayError
from replay.matrix.bisect import BisectAnswer, Step, run_bisect, runnable_versions, search
from replay.matrix.local import LocalBackend
from replay.matrix.orchestrate import run_matrix, summary_lines
from replay.matrix.plan import Manifest, expand, parse_sets, run_id, split_versions, tp_pp
from replay.matrix.stubrun import StubRun
from replay.trace.format import read_trace
from tests.conftest import ROOT

TRACE = ROOT / "traces" / "example_incident_short.jsonl"
S = 1_000_000
GIB = 2**30
FAST = RunOptions(speed=32.0)  # (the trace's 9.6 s in 0.3 s)


def quiet() -> Console:
    return Console(file=open(os.devnull, "w"), width=120)  # noqa: SIM115


class Counting:
    """The stub runner, counting its calls by version; ``fail`` (version -> exception) raised on a version's
    first ``times`` calls."""

    def __init__(self, oom: tuple[str, ...] = (), fail: dict[str, BaseException] | None = None, times: int = 1) -> None:
        self.stub = StubRun(oom_versions=oom)
        self.calls: list[str] = []
        self.fail = fail or {}
        self.times = times

    def __call__(self, trace: Path, opts: RunOptions, console: Console | None = None) -> Any:
        self.calls.append(opts.vllm)
        if opts.vllm in self.fail and self.calls.count(opts.vllm) <= self.times:
            raise self.fail[opts.vllm]
        return self.stub(trace, opts, console)


def production(path: Path, *, oom_s: float = 104.5) -> Path:
    """A GPU production bundle that ran the example trace's requests from 100 s after its t0 and hit an
    OOM at ``oom_s`` (requests after it failed); device memory from DCGM every 0.5 s."""
    _, reqs = read_trace(TRACE)
    meta = BundleMeta(kind="production", t0_utc="2025-03-01T10:00:00Z", vllm_version="0.32.0", engine="v1",
                      engine_args={"max_model_len": 8192, "max_logprobs": 20, "gpu_memory_utilization": 0.9},
                      gpus=[{"index": 0, "name": "H100", "total_bytes": 80 * GIB}])
    w = BundleWriter(path, meta)
    w.event({"t_us": 0, "kind": "engine_start", "marker": "vLLM API server version", "source": "vllm.log:1"})
    w.event({"t_us": S, "kind": "memory_profile", "weights_gib": 40.0, "non_torch_gib": 1.0,
             "activation_peak_gib": 4.0, "kv_cache_gib": 25.0, "source": "vllm.log:10"})
    for i in range(int(oom_s * 2)):
        t = i / 2
        w.sample(int(t * S), 0, "dcgm", "device_used_bytes", 70.5 * GIB + (max(0.0, t - 103.0) * 4 * GIB))
    for r in reqs:
        t = 100 * S + int(r["t_us"])
        after = t >= oom_s * S
        s = r.get("sampling") or {}
        w.request({"id": str(r["id"]), "arrival_us": t, "finish_us": None if after else t + 300_000,
                   "input_tokens": r["input_tokens"], "max_tokens": r.get("max_tokens"),
                   "prompt_logprobs": s.get("prompt_logprobs"), "status": "error" if after else "ok"})
    w.event({"t_us": int(oom_s * S), "kind": "oom", "source": "vllm.log:900", "tried_to_allocate_bytes": 2 * GIB})
    w.close()
    return path


# -- the plan ------------------------------------------------------------------------------------------


def test_sets_versions_and_the_product() -> None:
    assert parse_sets(["max_num_seqs=4,8", 'limit_mm_per_prompt={"image":2,"video":1}']) == {
        "max_num_seqs": ["4", "8"], "limit_mm_per_prompt": ['{"image":2,"video":1}']}
    for bad in (["max_num_seqs"], ["=4"], ["a=1,"], ["a=1", "a=2"], ["a=1,1"]):
        with pytest.raises(ReplayError) as e:
            parse_sets(bad)
        assert e.value.exit_code == 2
    assert split_versions(["0.31,0.32", "0.32", "0.30"]) == ["0.31", "0.32", "0.30"]
    with pytest.raises(ReplayError):
        split_versions([])
    runs = expand(["0.31.0", "0.32.0"], {"max_num_seqs": ["4", "8"], "enable_prefix_caching": ["true", "false"]})
    assert len(runs) == 8 and runs[0].id == "0.31.0+max_num_seqs=4+enable_prefix_caching=true"
    assert runs[-1].settings == {"max_num_seqs": "8", "enable_prefix_caching": "false"}
    assert all(r.bundle == f"runs/{r.id}.bundle" for r in runs) and len({r.id for r in runs}) == 8
    assert [r.id for r in expand(["0.32.0"], {})] == ["0.32.0"]
    odd = run_id("0.32.0", {"limit_mm_per_prompt": '{"image": 2}'})  # (a file name, kept apart by a digest)
    assert "/" not in odd and " " not in odd and odd != run_id("0.32.0", {"limit_mm_per_prompt": '{"image": 3}'})


# -- the matrix, locally -----------------------------------------------------------------------------


def test_matrix_of_a_trace_runs_the_product_and_a_rerun_skips_what_completed(tmp_path: Path) -> None:
    """GIVEN a trace, versions 0.31 and 0.32 and two max_num_seqs values, 0.32 ending in an OOM THEN four
    runs, each a bundle with its settings, the OOM a completed run that reproduced (exit 10), the others
    judged by their own evidence; one report across them; a rerun runs nothing."""
    fn = Counting(oom=("0.32.0",))
    res = run_matrix(TRACE, tmp_path / "m", ["0.31", "0.32"], {"max_num_seqs": ["4", "8"]}, FAST, run_fn=fn,
                     console=quiet())
    assert sorted(fn.calls) == ["0.31.0", "0.31.0", "0.32.0", "0.32.0"] and not res.failed
    man = json.loads((tmp_path / "m" / "matrix.json").read_text())
    assert man["format"] == "replay-matrix/1" and man["input"]["kind"] == "trace" and man["report"] == "report.html"
    runs = {r["id"]: r for r in man["runs"]}
    assert set(runs) == {"0.31.0+max_num_seqs=4", "0.31.0+max_num_seqs=8", "0.32.0+max_num_seqs=4",
                         "0.32.0+max_num_seqs=8"}
    oom = runs["0.32.0+max_num_seqs=8"]
    assert (oom["status"], oom["exit_code"], oom["outcome"], oom["reproduced"]) == ("completed", 10, "capacity_guard", True)
    assert "exit 10" in oom["reason"] and oom["verdict"].startswith("OOM at")
    ok = runs["0.31.0+max_num_seqs=4"]
    assert (ok["status"], ok["exit_code"], ok["reproduced"]) == ("completed", 0, None)  # (no memory: cannot judge)
    b = read_bundle(tmp_path / "m" / oom["bundle"])
    assert b.meta.vllm_version == "0.32.0" and b.meta.engine_args == {"max_num_seqs": 8} and b.requests.height == 15
    assert (tmp_path / "m" / "runs" / "0.32.0+max_num_seqs=8.log").read_text().count("capacity_guard") == 1
    html = (tmp_path / "m" / "report.html").read_text()
    assert all(f"{rid}.bundle" in html for rid in runs)
    again = Counting()
    res2 = run_matrix(TRACE, tmp_path / "m", ["0.31", "0.32"], {"max_num_seqs": ["4", "8"]}, FAST, run_fn=again,
                      console=quiet())
    assert again.calls == [] and [r.status for r in res2.runs] == ["completed"] * 4
    assert [r.reproduced for r in res2.runs] == [None, None, True, True]


def test_a_failed_run_is_reported_and_retried_by_the_rerun(tmp_path: Path) -> None:
    """GIVEN 0.31's engine cannot start (a ReplayError: not tried again) THEN the matrix goes on, the run is
    failed with its reason, the others completed; the rerun runs 0.31 alone."""
    fn = Counting(fail={"0.31.0": ReplayError("vLLM 0.31.0 server did not become ready (see server.log)", 4)})
    res = run_matrix(TRACE, tmp_path / "m", ["0.31", "0.32"], {}, FAST, run_fn=fn, console=quiet())
    assert fn.calls == ["0.31.0", "0.32.0"]
    failed = {r.id: r for r in res.runs}["0.31.0"]
    assert (failed.status, failed.exit_code, failed.attempts) == ("failed", 4, 1)
    assert "did not become ready" in (failed.reason or "") and failed.errors == [failed.reason]
    assert [r.id for r in res.failed] == ["0.31.0"] and "0.31.0: failed" in summary_lines(res.runs)[0]
    assert (tmp_path / "m" / "report.html").exists()  # (across the runs that completed)
    fn2 = Counting()
    res2 = run_matrix(TRACE, tmp_path / "m", ["0.31", "0.32"], {}, FAST, run_fn=fn2, console=quiet())
    assert fn2.calls == ["0.31.0"] and not res2.failed
    again = {r.id: r for r in res2.runs}["0.31.0"]
    assert again.attempts == 2 and again.reason == "completed" and again.errors == []


def test_a_run_that_raises_is_tried_again_up_to_the_limit(tmp_path: Path) -> None:
    once = Counting(fail={"0.32.0": RuntimeError("connection reset by the node")})
    res = run_matrix(TRACE, tmp_path / "a", ["0.32"], {}, FAST, run_fn=once, console=quiet(),
                     backend=LocalBackend(max_retries=1))
    r = res.runs[0]
    assert (r.status, r.attempts, r.errors) == ("completed", 2, ["RuntimeError: connection reset by the node"])
    always = Counting(fail={"0.32.0": RuntimeError("disk on fire")}, times=99)
    res = run_matrix(TRACE, tmp_path / "b", ["0.32"], {}, FAST, run_fn=always, console=quiet(),
                     backend=LocalBackend(max_retries=2))
    r = res.runs[0]
    assert (r.status, r.attempts, len(r.errors)) == ("failed", 3, 3) and r.reason == "RuntimeError: disk on fire"
    assert res.report is None and not (tmp_path / "b" / "runs" / "0.32.0.bundle").exists()


def test_an_interrupted_matrix_keeps_its_manifest_and_resumes(tmp_path: Path) -> None:
    fn = Counting(fail={"0.32.0": KeyboardInterrupt()})
    with pytest.raises(KeyboardInterrupt):
        run_matrix(TRACE, tmp_path / "m", ["0.31", "0.32"], {}, FAST, run_fn=fn, console=quiet())
    man = Manifest.read(tmp_path / "m")
    assert man is not None and {r.id: r.status for r in man.runs.values()} == {"0.31.0": "completed",
                                                                               "0.32.0": "interrupted"}
    fn2 = Counting()
    run_matrix(TRACE, tmp_path / "m", ["0.31", "0.32"], {}, FAST, run_fn=fn2, console=quiet())
    assert fn2.calls == ["0.32.0"]


def test_a_folder_of_another_matrix_is_refused(tmp_path: Path) -> None:
    run_matrix(TRACE, tmp_path / "m", ["0.32"], {}, FAST, run_fn=Counting(), console=quiet())
    with pytest.raises(ReplayError, match="other options") as e:
        run_matrix(TRACE, tmp_path / "m", ["0.32"], {}, RunOptions(speed=4.0), run_fn=Counting(), console=quiet())
    assert e.value.exit_code == 2 and "speed 32.0 there, 4.0 now" in e.value.message
    other = tmp_path / "other.jsonl"
    other.write_text(TRACE.read_text().replace("chat-12", "chat-13"))
    with pytest.raises(ReplayError, match="another input"):
        run_matrix(other, tmp_path / "m", ["0.32"], {}, FAST, run_fn=Counting(), console=quiet())
    # a run whose bundle was removed runs again
    import shutil
    shutil.rmtree(tmp_path / "m" / "runs" / "0.32.0.bundle")
    fn = Counting()
    run_matrix(TRACE, tmp_path / "m", ["0.32"], {}, FAST, run_fn=fn, console=quiet())
    assert fn.calls == ["0.32.0"]


def test_a_folder_keeps_its_trace_when_another_bundle_is_refused_and_runs_ask_for_their_devices(tmp_path: Path) -> None:
    run_matrix(production(tmp_path / "a.bundle"), tmp_path / "m", ["0.32"], {}, FAST, run_fn=Counting(), console=quiet())
    trace = (tmp_path / "m" / "trace.jsonl").read_bytes()
    with pytest.raises(ReplayError, match="another input"):
        run_matrix(production(tmp_path / "b.bundle", oom_s=103.5), tmp_path / "m", ["0.32"], {}, FAST,
                   run_fn=Counting(), console=quiet())
    assert (tmp_path / "m" / "trace.jsonl").read_bytes() == trace
    assert tp_pp({"tensor_parallel_size": "2"}, RunOptions(set_args=["pipeline_parallel_size=2"])) == 4
    assert tp_pp({}, RunOptions()) == 1
    with pytest.raises(ReplayError, match="whole number"):
        tp_pp({"tensor_parallel_size": "two"}, RunOptions())


def test_matrix_of_a_production_bundle_is_judged_against_production(tmp_path: Path) -> None:
    """GIVEN production's bundle THEN its trace is made once (DIR/trace.jsonl) and every run replays it; each
    run's verdict is against production's OOM: 0.32 (an OOM) reproduced it, 0.31 ran past production's OOM
    without one: not reproduced."""
    prod = production(tmp_path / "prod.bundle")
    res = run_matrix(prod, tmp_path / "m", ["0.31", "0.32"], {}, FAST, run_fn=Counting(oom=("0.32.0",)),
                     console=quiet())
    man = json.loads((tmp_path / "m" / "matrix.json").read_text())
    assert man["input"]["kind"] == "bundle" and man["trace"] == "trace.jsonl" and (tmp_path / "m" / "trace.jsonl").exists()
    by = {r.id: r for r in res.runs}
    assert by["0.32.0"].reproduced is True and by["0.32.0"].verdict and by["0.32.0"].verdict.startswith("reproduced at 0.32.0")
    assert by["0.31.0"].reproduced is False and by["0.31.0"].verdict and "not reproduced at 0.31.0" in by["0.31.0"].verdict
    b = read_bundle(tmp_path / "m" / by["0.31.0"].bundle)
    assert b.meta.extra["trace"]["bundle_sha256"] and b.requests.height == 15
    html = (tmp_path / "m" / "report.html").read_text()
    assert "prod.bundle" in html and "reproduced at 0.32.0" in html


# -- bisect ------------------------------------------------------------------------------------------


VERSIONS = ["0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]


def judged_by(answer: dict[str, bool | None], ran: list[list[str]]) -> Any:
    def judge(vs: list[str]) -> dict[str, Step]:
        ran.append(vs)
        return {v: Step(v, answer[v], f"line of {v}") for v in vs}
    return judge


@pytest.mark.parametrize("first", VERSIONS[1:])
def test_bisect_finds_the_first_release_that_reproduces(first: str) -> None:
    answer = {v: VERSIONS.index(v) >= VERSIONS.index(first) for v in VERSIONS}
    ran: list[list[str]] = []
    ans = search(VERSIONS, "0.27.1", "0.34.0", judged_by(answer, ran))
    assert ans.found and (ans.direction, ans.first) == ("starts", first)
    assert ans.before == VERSIONS[VERSIONS.index(first) - 1] and ans.untested == []
    assert ran[0] == ["0.27.1", "0.34.0"] and len(ran) <= 1 + 3  # (the ends, then log2(7) steps at most)
    assert f"starts reproducing at {first}" in ans.message and f"line of {first}" in ans.message


def test_bisect_finds_the_release_that_fixed_it_and_skips_what_cannot_be_judged() -> None:
    """GIVEN --good newer than --bad (the incident stopped reproducing) and 0.31 unjudgeable THEN the fix is
    0.32 with 0.31 skipped; where only unjudgeable releases are left between, the answer is a range."""
    answer: dict[str, bool | None] = {v: VERSIONS.index(v) < VERSIONS.index("0.32.0") for v in VERSIONS}
    answer["0.31.0"] = None
    ans = search(VERSIONS, "0.34.0", "0.27.1", judged_by(answer, []))
    assert (ans.found, ans.direction, ans.before, ans.first) == (False, "stops", "0.30.0", "0.32.0")
    assert ans.untested == ["0.31.0"] and "between 0.30.0 and 0.32.0" in ans.message
    answer["0.31.0"] = True
    ans = search(VERSIONS, "0.34.0", "0.27.1", judged_by(answer, []))
    assert (ans.found, ans.direction, ans.first, ans.before) == (True, "stops", "0.32.0", "0.31.0")
    assert ans.message.startswith("the incident stops reproducing at 0.32.0")


def test_bisect_stops_where_the_ends_do_not_differ() -> None:
    ran: list[list[str]] = []
    ans = search(VERSIONS, "0.27.1", "0.34.0", judged_by(dict.fromkeys(VERSIONS, True), ran))
    assert not ans.found and ran == [["0.27.1", "0.34.0"]] and "--good 0.27.1 reproduces the incident too" in ans.message
    with pytest.raises(ReplayError, match="not a release this host can run"):
        search(VERSIONS, "0.26.0", "0.34.0", judged_by({}, []))
    with pytest.raises(ReplayError, match="both 0.32.0"):
        search(VERSIONS, "0.32.0", "0.32.0", judged_by({}, []))


def test_cpu_host_bisects_the_local_cpu_builds_in_release_order() -> None:
    from replay.engine import envs
    assert runnable_versions("cpu") == envs.CPU_RELEASES_LOCAL
    cuda = runnable_versions("cuda")
    assert cuda[0] == "0.6.0" and "0.6.3" in cuda and cuda == sorted(cuda, key=cuda.index)


def test_bisect_replays_each_step_and_writes_the_answer_with_its_evidence(tmp_path: Path) -> None:
    """GIVEN production's bundle and a runner where 0.30 and later reproduce its OOM THEN bisect 0.27.1..0.32.0
    replays the ends and 0.30/0.31 between, finds 0.30.0, keeps every step's bundle, and writes bisect.md
    (the answer, each step's verdict and evidence), bisect.json and a report across the steps; run again,
    it replays nothing."""
    prod = production(tmp_path / "prod.bundle")
    fn = Counting(oom=("0.30.0", "0.31.0", "0.32.0"))
    ans, report = run_bisect(prod, tmp_path / "b", "0.27", "0.32", FAST, run_fn=fn, console=quiet())
    assert isinstance(ans, BisectAnswer) and ans.found and (ans.first, ans.before, ans.direction) == ("0.30.0", "0.27.1", "starts")
    assert fn.calls[:2] == ["0.27.1", "0.32.0"] and sorted(fn.calls[2:]) == ["0.30.0", "0.31.0"][:len(fn.calls) - 2]
    assert all((tmp_path / "b" / s.bundle / "bundle.json").exists() for s in ans.steps)
    md = (tmp_path / "b" / "bisect.md").read_text()
    assert "starts reproducing at 0.30.0" in md and "reproduced at 0.30.0" in md and "not reproduced at 0.27.1" in md
    assert json.loads((tmp_path / "b" / "bisect.json").read_text())["first"] == "0.30.0"
    assert report is not None and "0.30.0.bundle" in report.read_text()
    again = Counting()
    ans2, _ = run_bisect(prod, tmp_path / "b", "0.27", "0.32", FAST, run_fn=again, console=quiet())
    assert again.calls == [] and ans2.first == "0.30.0"


# -- the commands --------------------------------------------------------------------------------------


def _app() -> typer.Typer:
    from replay.matrix.commands import bisect_cmd, matrix_cmd
    app = typer.Typer(rich_markup_mode="rich")  # (as replay.cli's)
    app.command("matrix")(matrix_cmd)
    app.command("bisect")(bisect_cmd)
    return app


def test_the_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`replay matrix TRACE --vllm 0.31 0.32 --set max_num_seqs=4,8` and `replay bisect`, registered as
    replay.cli registers them, through the stub runner."""
    from replay.matrix import local
    monkeypatch.setattr(local, "default_run", StubRun(oom_versions=("0.32.0",)))
    runner = CliRunner()
    r = runner.invoke(_app(), ["matrix", str(TRACE), "--vllm", "0.31", "0.32", "--set", "max_num_seqs=4,8",
                               "--speed", "32", "-o", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert "0.32.0+max_num_seqs=8: completed" in r.output and (tmp_path / "m" / "report.html").exists()
    assert len(json.loads((tmp_path / "m" / "matrix.json").read_text())["runs"]) == 4
    # the input after the versions; a rerun skips all four
    r = runner.invoke(_app(), ["matrix", "--vllm", "0.31,0.32", "--set", "max_num_seqs=4,8", "--speed", "32",
                               "-o", str(tmp_path / "m"), str(TRACE)])
    assert r.exit_code == 0 and "4 runs, 4 completed before" in r.output, r.output
    with pytest.raises(ReplayError, match="--set 'max_num_seqs'"):
        runner.invoke(_app(), ["matrix", str(TRACE), "--vllm", "0.31", "--set", "max_num_seqs", "-o", str(tmp_path / "x")],
                      catch_exceptions=False)
    prod = production(tmp_path / "prod.bundle")
    r = runner.invoke(_app(), ["bisect", str(prod), "--good", "0.31", "--bad", "0.32", "--speed", "32",
                               "-o", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert "starts reproducing at 0.32.0" in " ".join(r.output.split())
    helptext = runner.invoke(_app(), ["matrix", "--help"], env={"COLUMNS": "200"}).output
    assert "--ray" in helptext and "--set" in helptext and "replay[cluster]" in helptext


def test_the_warm_up_is_an_option_of_every_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`replay matrix … --warmup 2` gives each run that warm-up and keeps it in the matrix's options (a rerun
    with another is another matrix); without it the options are as before the option was there."""
    from replay.matrix import local
    seen: list[int | None] = []
    stub = StubRun()

    def run(trace: Path, opts: RunOptions, console: Console | None = None) -> Any:
        seen.append(opts.warmup)
        return stub(trace, opts, console)
    monkeypatch.setattr(local, "default_run", run)
    runner = CliRunner()
    r = runner.invoke(_app(), ["matrix", str(TRACE), "--vllm", "0.31", "0.32", "--warmup", "2", "--speed", "32",
                               "-o", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert seen == [2, 2] and json.loads((tmp_path / "m" / "matrix.json").read_text())["options"]["warmup"] == 2
    r = runner.invoke(_app(), ["matrix", str(TRACE), "--vllm", "0.31", "--speed", "32", "-o", str(tmp_path / "n")])
    assert r.exit_code == 0 and seen[-1] is None, r.output
    assert "warmup" not in json.loads((tmp_path / "n" / "matrix.json").read_text())["options"]
    with pytest.raises(ReplayError, match="--warmup"):
        runner.invoke(_app(), ["matrix", str(TRACE), "--vllm", "0.31", "--warmup", "-1", "-o", str(tmp_path / "x")],
                      catch_exceptions=False)
