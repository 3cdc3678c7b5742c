from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SHARED = ROOT.parent / "shared" / "data"

# analyses are made anew in each test (a test that changes the analysis's code in its process would read
# one kept by another): tests/unit/test_analysis_cache.py keeps them in a folder of its own
os.environ["REPLAY_ANALYSIS_CACHE"] = "off"

if os.environ.get("PYTEST_XDIST_WORKER"):
    # (a pytest-xdist worker starts with COLUMNS=80 and LINES=24 in its environment: the CLI's consoles,
    # made as replay.cli is imported, would keep 80 columns whatever width a test asks for)
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


def shared(rel: str) -> Path:
    p = SHARED / rel
    if not p.exists():
        pytest.skip(f"reference data {p} not present")
    return p


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_gpu = Path("/dev/nvidiactl").exists()
    for it in items:
        if "gpu" in it.keywords and not has_gpu:
            it.add_marker(pytest.mark.skip(reason="no NVIDIA GPU on this host"))
        if "integration" in it.keywords and not shutil.which("chromium") and "browser" in it.keywords:
            it.add_marker(pytest.mark.skip(reason="chromium not installed"))


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: `make test` runs two workers, --dist loadgroup)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With --dist loadgroup, the tests that drive real processes (tests/integration: the engine, Ray,
    Chromium) run one after another in one worker, since each asserts that none of its processes is left
    on the machine; the other tests run a module at a time (its module fixtures made once) in either.
    `make test` hands them out in the order collected (--no-loadscope-reorder): tests/integration, the
    longest of them, first.
    (xdist's own grouping by xdist_group marks renames the tests, which pytest 9 no longer lets it do.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/integration" if path.startswith("tests/integration/") else path

    return Grouped(config, log)


@contextmanager
def metrics_server(body: bytes, delay_s: float = 0.0) -> Iterator[str]:
    """A local /metrics endpoint answering ``body`` after ``delay_s``; yields its base URL."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            time.sleep(delay_s)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
