from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
SHARED = ROOT.parent / "shared" / "data"


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
