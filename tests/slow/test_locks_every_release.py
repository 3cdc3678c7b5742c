"""Every CUDA release of the catalogue resolves as of its own release day (metadata only: uv's
``pip compile``, no install), for one fixed target (Python 3.11, x86_64-manylinux_2_28), and its
lock holds torch, transformers, tokenizers and xformers within the release's own requirements (as
the catalogue read them from its package) and uploaded before the lock's cutoff. The releases that
need an override, a package's own cutoff or have no wheel are exactly those ``replay.engine.lock``
lists. uv's cache makes a rerun fast; the resolutions run side by side."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import pytest
from packaging.specifiers import SpecifierSet

from replay.engine import lock
from replay.engine.catalogue import load
from replay.errors import ReplayError

pytestmark = pytest.mark.slow
PYTHON, PLATFORM = "3.11", "x86_64-manylinux_2_28"
KEY = ("torch", "transformers", "tokenizers", "xformers")


@pytest.fixture(scope="module")
def locks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, lock.Lock | str]:
    home = tmp_path_factory.mktemp("locks")

    def one(v: str) -> tuple[str, lock.Lock | str]:
        try:
            return v, lock.resolve("vllm", v, home, python=PYTHON, plat=PLATFORM)
        except ReplayError as e:
            return v, e.message

    lock.uv_bin()  # found once, before the threads
    with ThreadPoolExecutor(6) as ex:
        return dict(ex.map(one, load().versions))


@cache
def _uploaded(package: str) -> dict[str, str]:
    """version -> its first file's upload instant on PyPI (one JSON read a package)."""
    req = urllib.request.Request(f"https://pypi.org/pypi/{package}/json", headers={"User-Agent": "replay-tests"})
    with urllib.request.urlopen(req, timeout=120) as r:
        data = json.loads(r.read())
    return {v: min(f["upload_time_iso_8601"] for f in fs) for v, fs in data["releases"].items() if fs}


def test_every_release_resolves_or_is_known_not_to(locks: dict[str, lock.Lock | str]) -> None:
    failed = {v: got for v, got in locks.items() if isinstance(got, str)}
    assert failed == {v: f"could not resolve vllm=={v} for {PLATFORM} (no wheel): {why}"
                      for v, why in lock.NO_WHEEL["x86_64"].items()}
    assert len(locks) - len(failed) >= 65


def test_key_packages_within_the_release_requirements(locks: dict[str, lock.Lock | str]) -> None:
    cat = load()
    for v, lk in locks.items():
        if isinstance(lk, str):
            continue
        assert lk.pins["vllm"] == v and lk.release_day == cat.releases[v].date, v
        for pkg, spec in cat.releases[v].requires.items():
            assert pkg in lk.pins, f"{v}: {pkg} not in its lock"
            assert lk.pins[pkg] in SpecifierSet(spec), f"{v}: {pkg}=={lk.pins[pkg]} not {spec}"
        assert {"torch", "transformers", "tokenizers"} <= set(lk.pins), v
    # the figures: what 0.6.3 was built and tested with
    got = locks["0.6.3"]
    assert not isinstance(got, str)
    assert {k: got.pins.get(k) for k in KEY} == {"torch": "2.4.0", "transformers": "4.45.2",
                                                  "tokenizers": "0.20.1", "xformers": "0.0.27.post2"}


def test_key_packages_not_newer_than_the_cutoff(locks: dict[str, lock.Lock | str]) -> None:
    for v, lk in locks.items():
        if isinstance(lk, str):
            continue
        for pkg in KEY:
            if pkg not in lk.pins:
                continue
            at = _uploaded(pkg)[lk.pins[pkg]]
            limit = lk.package_cutoffs.get(pkg, lk.cutoff)
            assert at < limit.replace("T00:00:00Z", "T00:00:00"), f"{v}: {pkg}=={lk.pins[pkg]} uploaded {at}"


def test_overrides_and_cutoffs_are_exactly_the_recorded_ones(locks: dict[str, lock.Lock | str]) -> None:
    for v, lk in locks.items():
        if isinstance(lk, str):
            continue
        overrides = lock.OVERRIDES.get(v, ())
        assert lk.overrides == list(overrides), v
        want = {**lock.PACKAGE_CUTOFFS.get(v, {}), **{lock.normalise(o.package): o.cutoff for o in overrides}}
        assert lk.package_cutoffs == want, f"{v}: resolution needed {lk.package_cutoffs}; record it in lock.py"
        for o in overrides:
            assert lk.pins[lock.normalise(o.package)] == o.version, v
