"""Analyses kept between commands (``replay.analysis.cache``): read back while the bundle and the code are
as they were, made again where either changed or the kept one cannot be read, none kept when asked, and
the least recently used removed past the bound."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replay.analysis import cache
from replay.analysis.pipeline import Analysis, analyze_bundle
from replay.bundle import read_bundle
from replay.record.recorder import RecordOptions, record
from tests.conftest import DATA

EVIDENCE = [DATA / "v08x_v0_mq_oom_stated_twice.log", DATA / "h200_query_gpu_load.csv"]


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Path]:
    """The bundles analysed anew (not read back), in order; analyses kept under tmp_path/cache."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    seen: list[Path] = []

    def counted(b: object) -> Analysis:
        seen.append(b.path)  # type: ignore[attr-defined]
        return analyze_bundle(b)  # type: ignore[arg-type]
    monkeypatch.setattr(cache, "analyze_bundle", counted)
    return seen


def _bundle(out: Path, evidence: list[Path] = EVIDENCE) -> Path:
    record(evidence, out, RecordOptions(year=2025))
    return out


def _kept(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache").glob("*" + cache.SUFFIX))


def test_an_analysis_is_read_back_while_its_bundle_and_the_code_are_as_they_were(made: list[Path], tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    b = _bundle(tmp_path / "b")
    first = cache.analysis_of(b)
    again = cache.analysis_of(b)
    assert made == [b] and len(_kept(tmp_path)) == 1
    assert again is not first and again.bundle.path == b and again.bundle.events == first.bundle.events
    assert again.summary() == first.summary() and first.summary()["findings"]
    assert again.gap.equals(first.gap) and again.gap.height > 0
    # the bundle written again (whole, as the recorder writes it): analysed anew
    _bundle(b)
    cache.analysis_of(b)
    assert made == [b, b]
    # the code changed: analysed anew
    monkeypatch.setattr(cache, "_code", lambda: "another")
    cache.analysis_of(b)
    assert made == [b, b, b] and len(_kept(tmp_path)) == 3


def test_a_kept_analysis_that_cannot_be_read_is_made_and_kept_again(made: list[Path], tmp_path: Path) -> None:
    b = _bundle(tmp_path / "b")
    want = cache.analysis_of(b).summary()
    (kept,) = _kept(tmp_path)
    kept.write_bytes(kept.read_bytes()[:1000])  # (cut short)
    assert cache.analysis_of(b).summary() == want and made == [b, b]
    assert cache.analysis_of(b).summary() == want and made == [b, b]  # (kept whole again)
    kept.write_bytes(b"not a pickle")
    assert cache.analysis_of(b).summary() == want and made == [b, b, b]


def test_off_keeps_none_and_past_the_bound_the_least_recently_used_go(made: list[Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = _bundle(tmp_path / "one"), _bundle(tmp_path / "two", EVIDENCE[:1])
    monkeypatch.setenv(cache.CACHE_ENV, "off")
    cache.analysis_of(one)
    cache.analysis_of(one)
    assert made == [one, one] and not (tmp_path / "cache").exists()
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    cache.analysis_of(one)
    (first,) = _kept(tmp_path)
    os.utime(first, ns=(10**18, 10**18))  # (used long ago)
    monkeypatch.setattr(cache, "MAX_BYTES", first.stat().st_size + 1)  # (room for one)
    cache.analysis_of(two)
    (left,) = _kept(tmp_path)
    assert left != first and made == [one, one, one, two]
    # a file of the user's beside them is never removed
    mine = tmp_path / "cache" / "notes.txt"
    mine.write_text("mine")
    cache.analysis_of(one)
    assert mine.exists() and len(_kept(tmp_path)) == 1


def test_analyze_report_and_postmortem_of_a_bundle_analyse_it_once(made: list[Path], tmp_path: Path) -> None:
    from replay.cli import app
    b = _bundle(tmp_path / "b")
    runner = CliRunner()
    for argv in (["analyze", str(b)], ["report", str(b), "-o", str(tmp_path / "r.html")],
                 ["postmortem", str(b), "-o", str(tmp_path / "pm.md")], ["check", str(b), "--max-discrepancy", "100"]):
        r = runner.invoke(app, argv)
        assert r.exit_code in (0, 1), (argv, r.output)
    assert made == [b]
    assert "CUDA OOM" in (tmp_path / "pm.md").read_text() and (tmp_path / "r.html").stat().st_size > 100_000


def test_an_analysis_that_cannot_be_kept_is_still_given(made: list[Path], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a cache folder that cannot be written, or an analysis pickle cannot carry THEN the analysis is
    given all the same, and nothing is left in the folder."""
    import pickle
    b = _bundle(tmp_path / "b")
    want = analyze_bundle(read_bundle(b)).summary()

    def refused(*args: object, **kw: object) -> None:
        raise pickle.PicklingError("cannot pickle")
    monkeypatch.setattr(cache.pickle, "dump", refused)
    assert cache.analysis_of(b).summary() == want and not _kept(tmp_path) and not list((tmp_path / "cache").iterdir())
    monkeypatch.undo()
    monkeypatch.setenv(cache.CACHE_ENV, str(b / "bundle.json" / "not-a-folder"))
    assert cache.analysis_of(b).summary() == want
