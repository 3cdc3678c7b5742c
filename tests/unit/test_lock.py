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


def test_python_allows_requires_python_specifiers() -> None:
    assert lock.python_allows(">=3.9,<3.13", "3.12.4") and not lock.python_allows(">=3.9,<3.13", "3.13")
    assert lock.python_allows(">=3.8", "3.11") and not lock.python_allows(">=3.8", "3.7.17")
    assert lock.python_allows("<3.15, >=3.11", "3.14.0") and not lock.python_allows("<3.15,>=3.11", "3.10.12")
    assert lock.python_allows("~=3.10", "3.12") and not lock.python_allows("~=3.10.2", "3.11.0")
    assert not lock.python_allows("!=3.9.*", "3.9.7") and lock.python_allows("==3.11.*", "3.11.7")
    assert lock.python_allows(">3.8", "3.8.1") and not lock.python_allows(">3.8", "3.8")
    with pytest.raises(ValueError, match="'>=three' is not a version specifier"):
        lock.python_allows(">=three", "3.11")


def test_target_python_is_the_hosts_where_the_release_allows_it() -> None:
    assert lock.target_python("0.6.3", host="3.11.7") == "3.11"  # Requires-Python >=3.8
    assert lock.target_python("0.10.2", host="3.11.7") == "3.11"  # >=3.9,<3.14
    assert lock.target_python(host="3.7.1") == "3.7"  # no release: nothing to refuse
    assert lock.target_python("9.9.9", host="3.7.1") == "3.7"  # a release the catalogue does not hold
    with pytest.raises(ReplayError) as e:
        lock.target_python("0.34.0", host="3.10.12")
    assert e.value.exit_code == 2
    assert e.value.message == ("vLLM 0.34.0 requires Python >=3.11,<3.15 (its Requires-Python); this host's "
                               "Python is 3.10.12: run replay under a Python that version allows")
    with pytest.raises(ReplayError, match=r"vLLM 0\.8\.5 requires Python >=3\.9,<3\.13 .* is 3\.13\.1"):
        lock.target_python("0.8.5", host="3.13.1")


def test_a_python_the_release_refuses_is_refused_before_uv(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    monkeypatch.setattr(lock, "_uv", lambda *a: pytest.fail("uv ran"))
    monkeypatch.setattr(lock, "release_date", lambda *a: pytest.fail("PyPI was asked"))
    with pytest.raises(ReplayError, match=r"vLLM 0\.8\.5 requires Python >=3\.9,<3\.13 \(its Requires-Python\); "
                                          r"the target Python is 3\.13"):
        lock.resolve("vllm", "0.8.5", tmp_path, python="3.13", plat="x86_64-manylinux_2_28")
    monkeypatch.setattr(lock, "host_python", lambda: "3.8.18")
    with pytest.raises(ReplayError, match=r"vLLM 0\.34\.0 requires .*; this host's Python is 3\.8\.18"):
        lock.resolve("vllm", "0.34.0", tmp_path, plat="x86_64-manylinux_2_28")
    assert not (tmp_path / "locks").exists()


def test_versions_install_refuses_the_hosts_python_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    from replay import cli
    from replay.engine import envs
    monkeypatch.setenv("REPLAY_HOME", str(tmp_path))
    monkeypatch.setenv("REPLAY_DEVICE", "cuda")
    monkeypatch.setattr(lock, "host_python", lambda: "3.10.12")
    monkeypatch.setattr(envs, "install", lambda *a, **k: pytest.fail("an env was built"))
    monkeypatch.setattr("sys.argv", ["replay", "versions", "install", "0.6.3", "0.34"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    said = capfd.readouterr().err.strip().splitlines()
    assert said == ["error: vLLM 0.34.0 requires Python >=3.11,<3.15 (its Requires-Python); this host's "
                    "Python is 3.10.12: run replay under a Python that version allows"]
    assert not (tmp_path / "envs").exists()
