"""``replay synth --servegen`` on real ServeGen clients: each window's recorded count, its burstiness,
lengths from its own distributions, determinism, and clear errors for damaged client files."""

from __future__ import annotations

import ast
import csv
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from replay.errors import ReplayError
from replay.trace.format import read_trace
from replay.trace.servegen import WINDOW_S, ServeGenSpec, synth_servegen
from tests.conftest import DATA, shared

MM = DATA / "servegen" / "multimodal-mm-image"


def _windows(client: Path) -> list[tuple[int, float, float]]:
    trace = next(client.glob("chunk-*-trace.csv"))
    with trace.open(newline="") as fh:
        return [(int(r[0]), float(r[1]), float(r[2])) for r in csv.reader(fh)]


def _supports(client: Path) -> dict[int, dict[str, set[float]]]:
    doc = json.loads(next(client.glob("chunk-*-dataset.json")).read_text())
    return {int(k): {f: {float(v) for v, p in ast.literal_eval(s).items() if p > 0} for f, s in fs.items()}
            for k, fs in doc.items()}


def _by_window(reqs: list[dict], start_s: float) -> dict[int, list[float]]:
    """Arrival times (s, in the client's data) grouped by their rate window."""
    out: dict[int, list[float]] = {}
    for r in reqs:
        t = float(r["src_ts"])
        out.setdefault(int(t // WINDOW_S) * WINDOW_S, []).append(t)
    return out


def test_every_window_gets_its_recorded_count_within_it() -> None:
    # GIVEN a real multimodal client's day (144 windows) WHEN drawn over all of it
    h, reqs = synth_servegen(ServeGenSpec([MM], start_s=0, duration_s=86400, seed=3))
    got = _by_window(reqs, 0)
    # THEN each window holds exactly rate x 600 s arrivals (the rates are counts per window), and none elsewhere
    want = {w: round(rate * WINDOW_S) for w, rate, _ in _windows(MM) if rate > 0}
    assert {w: len(ts) for w, ts in got.items()} == want
    assert sum(want.values()) == len(reqs) > 10_000
    assert [r["t_us"] for r in reqs] == sorted(r["t_us"] for r in reqs) and reqs[0]["t_us"] == 0
    assert h.time["src_origin"] == "synthetic" and h.source["format"] == "servegen"
    assert h.source["clients"][0]["trace_sha256"] and h.source["name"].endswith("multimodal-mm-image/chunk-0")


def test_lengths_and_images_come_from_their_window_distributions() -> None:
    _, reqs = synth_servegen(ServeGenSpec([MM], start_s=0, duration_s=86400, seed=4))
    sup = _supports(MM)
    keys = sorted(sup)
    for r in reqs:
        fs = sup[max(k for k in keys if k <= float(r["src_ts"]))]
        assert r["output_tokens"] in fs["output_tokens"]
        assert r["extra"]["text_tokens"] in fs["text_tokens"]
        images = [m for m in r["mm"] or [] if m["type"] == "image"]
        n_img = sum(m["count"] for m in images)
        assert n_img in fs["image_count"]
        img_tokens = sum(m["tokens"] for m in images)
        if n_img == 1:
            assert img_tokens in fs["image_tokens"]
        # THEN the prompt is the text plus every item's tokens, as the model sees it
        assert r["input_tokens"] == r["extra"]["text_tokens"] + sum(m["tokens"] for m in r["mm"] or [])


def _cv_ratios(client: Path, keep: Callable[[int, float], bool], seed: int) -> list[float]:
    """Per window kept: the drawn gaps' coefficient of variation over the recorded one."""
    _, reqs = synth_servegen(ServeGenSpec([client], start_s=0, duration_s=14 * 86400, seed=seed))
    got = _by_window(reqs, 0)
    ratios = []
    for w, _rate, cv in _windows(client):
        ts = sorted(got.get(w, []))
        if keep(len(ts), cv):
            gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
            ratios.append(statistics.pstdev(gaps) / statistics.fmean(gaps) / cv)
    return ratios


def test_gaps_keep_the_recorded_smoothness() -> None:
    # the multimodal client's arrivals are steadier than Poisson (cv 0.6-0.8 where a Poisson process has 1)
    ratios = _cv_ratios(MM, lambda n, cv: n >= 300 and cv < 0.8, 5)
    assert len(ratios) >= 10
    assert 0.85 < statistics.median(ratios) < 1.15


def test_gaps_keep_the_recorded_burstiness() -> None:
    # the language client's busiest windows are burstier than Poisson (cv 1.4-2)
    ratios = _cv_ratios(shared("traces/servegen/language-m-large"), lambda n, cv: n >= 1000 and cv > 1.4, 5)
    assert len(ratios) >= 10
    assert 0.85 < statistics.median(ratios) < 1.15


def test_reasoning_share_and_language_lengths() -> None:
    client = shared("traces/servegen/reason-deepseek-r1")
    _, reqs = synth_servegen(ServeGenSpec([client], duration_s=7200, seed=6))
    sup = _supports(client)
    ratios = set().union(*(s["reason_ratio"] for s in sup.values() if "reason_ratio" in s))
    assert reqs and all(r["extra"]["reason_ratio"] in ratios for r in reqs)
    assert all(r["extra"]["reason_tokens"] == round(r["output_tokens"] * r["extra"]["reason_ratio"]) for r in reqs)
    assert all(r["mm"] is None and r["input_tokens"] > 0 for r in reqs)


def test_a_fortnight_of_a_language_client() -> None:
    # GIVEN 14 days of a real language client (2,016 windows, most of them empty) WHEN drawn in full
    client = shared("traces/servegen/language-m-large")
    h, reqs = synth_servegen(ServeGenSpec([client], start_s=0, duration_s=14 * 86400, seed=7))
    # THEN every busy window has its count, and every length is one its distributions allow
    assert len(reqs) == sum(round(rate * WINDOW_S) for _, rate, _ in _windows(client) if rate > 0) > 100_000
    sup = _supports(client)
    keys = sorted(sup)
    for r in reqs[::97]:
        fs = sup[max(k for k in keys if k <= float(r["src_ts"]))]
        assert r["input_tokens"] in fs["input_tokens"] and r["output_tokens"] in fs["output_tokens"]
    assert h.source["borrowed_dataset_window"] == 0


def test_a_window_with_no_distribution_borrows_the_nearest_and_says_so(tmp_path: Path) -> None:
    # GIVEN traffic in the first six hours, whose distributions are empty ({}), as ServeGen's data has them
    path = _client(tmp_path, "0,0.1,1,Gamma,1,1\n21600,0.1,1,Gamma,1,1\n",
                   json.dumps({"0": {"input_tokens": "{}", "output_tokens": "{}"},
                               "21600": {"input_tokens": "{700: 1.0}", "output_tokens": "{9: 1.0}"}}))
    h, reqs = synth_servegen(ServeGenSpec([path], start_s=0, duration_s=86400, seed=1))
    # THEN their requests take the nearest window's lengths, and the header counts them
    assert len(reqs) == 120 and {r["input_tokens"] for r in reqs} == {700}
    assert h.source["borrowed_dataset_window"] == 60


def test_same_seed_same_trace_and_rate_scale(tmp_path: Path) -> None:
    a = synth_servegen(ServeGenSpec([MM], duration_s=1800, seed=1))[1]
    assert a == synth_servegen(ServeGenSpec([MM], duration_s=1800, seed=1))[1]
    assert a != synth_servegen(ServeGenSpec([MM], duration_s=1800, seed=2))[1]
    doubled = synth_servegen(ServeGenSpec([MM], start_s=0, duration_s=1800, rate_scale=2.0, seed=1))[1]
    want = sum(round(2 * rate * WINDOW_S) for w, rate, _ in _windows(MM) if w < 1800)
    assert len(doubled) == want
    capped = synth_servegen(ServeGenSpec([MM], duration_s=1800, max_requests=50, seed=1))[1]
    assert capped == a[:50]


def test_two_clients_merge_in_time_order(tmp_path: Path) -> None:
    other = shared("traces/servegen/reason-deepseek-r1")
    h, reqs = synth_servegen(ServeGenSpec([MM, other], start_s=0, duration_s=3600, seed=8))
    clients = {r["extra"]["client"] for r in reqs}
    assert len(clients) == 2 and len(h.source["clients"]) == 2
    assert [r["t_us"] for r in reqs] == sorted(r["t_us"] for r in reqs)


def test_cli_writes_a_trace_the_replayer_reads(tmp_path: Path) -> None:
    from replay.cli import app
    out = tmp_path / "sg.jsonl"
    res = CliRunner().invoke(app, ["synth", "--servegen", str(MM / "chunk-0-dataset.json"), "--duration", "20m",
                                   "--seed", "2", "-o", str(out)])
    assert res.exit_code == 0, res.output
    h, reqs = read_trace(out)
    assert len(reqs) == sum(round(rate * WINDOW_S) for w, rate, _ in _windows(MM) if w < 1200)
    bad = CliRunner().invoke(app, ["synth", "--servegen", str(tmp_path), "-o", str(out)])
    assert isinstance(bad.exception, ReplayError) and "no ServeGen client here" in str(bad.exception)


def _client(tmp_path: Path, trace: str, dataset: str) -> Path:
    (tmp_path / "chunk-9-trace.csv").write_text(trace)
    (tmp_path / "chunk-9-dataset.json").write_text(dataset)
    return tmp_path / "chunk-9-trace.csv"


GOOD_PDF = json.dumps({"0": {"input_tokens": "{10: 0.5, 20: 0.5}", "output_tokens": "{5: 1.0}"}})


@pytest.mark.parametrize(("trace", "dataset", "msg"), [
    ("0,0.5,1.0,Gamma,1.0\n", GOOD_PDF, "chunk-9-trace.csv:1: expected 6 fields"),
    ("0,0.5,1.0,Gamma,1.0,1.0\n600,x,1,Gamma,1,1\n", GOOD_PDF, "chunk-9-trace.csv:2: not a number"),
    ("0,0.5,1.0,Pareto,1.0,1.0\n", GOOD_PDF, "chunk-9-trace.csv:1: unknown gap distribution 'Pareto'"),
    ("0,0.5,1.0,Gamma,0,1.0\n", GOOD_PDF, "chunk-9-trace.csv:1: Gamma needs a positive shape and scale"),
    ("600,0.5,1,Gamma,1,1\n0,0.5,1,Gamma,1,1\n", GOOD_PDF, "chunk-9-trace.csv:2: window 0 s does not follow"),
    ("0,0.5,1.0,Gamma,1.0,1.0\n", '{"0": {"input_tokens": "{10: -1}"}}', "window 0, field 'input_tokens': not a distribution"),
    ("0,0.5,1.0,Gamma,1.0,1.0\n", '{"0": {"input_tokens": "__import__(1)"}}', "field 'input_tokens': not a distribution"),
    ("0,0.5,1.0,Gamma,1.0,1.0\n", '{"0": {"input_tokens": "{}"}}', "every distribution is empty"),
    ("0,0.5,1.0,Gamma,1.0,1.0\n", '{"0": ', "chunk-9-dataset.json:1: not JSON"),
    ("0,0,0,,0,0\n", GOOD_PDF, "no window has any traffic"),
])
def test_damaged_client_files_are_named(tmp_path: Path, trace: str, dataset: str, msg: str) -> None:
    path = _client(tmp_path, trace, dataset)
    with pytest.raises(ReplayError) as e:
        synth_servegen(ServeGenSpec([path], seed=0))
    assert msg in str(e.value)


def test_missing_partner_and_empty_range(tmp_path: Path) -> None:
    (tmp_path / "chunk-3-trace.csv").write_text("0,1,1,Gamma,1,1\n")
    with pytest.raises(ReplayError, match="chunk-3-dataset.json: missing"):
        synth_servegen(ServeGenSpec([tmp_path / "chunk-3-trace.csv"]))
    with pytest.raises(ReplayError, match="no request falls in"):
        synth_servegen(ServeGenSpec([MM], start_s=10 * 86400, duration_s=600))


_PDF = st.dictionaries(st.integers(0, 5000), st.floats(0, 1), max_size=4).map(str)
_FIELDS = ["input_tokens", "output_tokens", "text_tokens", "image_tokens", "image_count", "reason_ratio", "new_field"]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 0.5), st.sampled_from(["Gamma", "Weibull", ""]),
                          st.floats(0, 50), st.floats(0, 50)), min_size=1, max_size=4),
       st.dictionaries(st.sampled_from(_FIELDS), _PDF, min_size=1, max_size=5))
def test_fuzz_any_client_gives_a_trace_or_a_clear_error(rows: list, fields: dict) -> None:
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        trace = "".join(f"{i * 600 + k},{r},1,{d},{a},{b}\n" for i, (k, r, d, a, b) in enumerate(rows))
        path = _client(Path(td), trace, json.dumps({"0": fields}))
        try:
            _, reqs = synth_servegen(ServeGenSpec([path], duration_s=86400, seed=1))
        except ReplayError:
            return
        assert reqs and all(isinstance(r["input_tokens"], int) and r["input_tokens"] >= 0 for r in reqs)
