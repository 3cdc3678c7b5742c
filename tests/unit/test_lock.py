"""The lock's recorded resolution results: overrides stated in the lock and read back, and a
release without a wheel for the target refused before uv runs (no network here; the resolutions
themselves are in tests/unit/test_envs.py and, for every release, tests/slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.engine import lock
from replay.errors import ReplayError


def test_an_override_is_stated_in_the_lock_and_read_back() -> None:
    o = lock.OVERRIDES["0.8.0"][0]
    lk = lock.Lock("vllm==0.8.0", "2025-03-18", "2025-03-19T00:00:00Z", "3.11", "x86_64-manylinux_2_28",
                   {"vllm": "0.8.0", "xgrammar": "0.1.17"}, "vllm==0.8.0\nxgrammar==0.1.17\n",
                   {"xgrammar": o.cutoff}, overrides=[o])
    text = lk.text()
    assert "# xgrammar==0.1.17 instead of ==0.1.16, uploaded before 2025-03-26T00:00:00Z: 0.1.16 is no" in text
    assert "# xgrammar: uploaded before" not in text  # said once, as the override
    back = lock.Lock.parse(text)
    assert back.overrides == [o] and back.package_cutoffs == {"xgrammar": o.cutoff}
    assert back.pins == {"vllm": "0.8.0", "xgrammar": "0.1.17"}


def test_recorded_results_name_real_releases() -> None:
    from replay.engine.catalogue import load
    versions = set(load().versions)
    assert set(lock.OVERRIDES) | set(lock.PACKAGE_CUTOFFS) | set(lock.NO_WHEEL["x86_64"]) <= versions
    for overrides in lock.OVERRIDES.values():
        assert all(o.version != o.pinned and o.why for o in overrides)


def test_a_release_without_a_wheel_for_the_target_is_refused_before_uv(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    monkeypatch.setattr(lock, "_uv", lambda *a: pytest.fail("uv ran"))
    with pytest.raises(ReplayError, match=r"vllm==0\.15\.0 for x86_64-manylinux_2_28 \(no wheel\): PyPI holds "
                                          r"only its aarch64 wheels"):
        lock.resolve("vllm", "0.15.0", tmp_path, python="3.11", plat="x86_64-manylinux_2_28")


def test_overrides_file_holds_the_replacements() -> None:
    path = lock._overrides_file(lock.OVERRIDES["0.34.0"])
    assert path.read_text() == "flashinfer-python==0.7.4\n"
