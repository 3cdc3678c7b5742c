"""A bundle read back holds its samples' sources and metrics as categories (``SAMPLE_NAMES``), and the
tests on their text (``names_where``, ``device_source``) say the same of categories as of text."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from replay.bundle import (
    SAMPLES_SCHEMA,
    BundleMeta,
    BundleWriter,
    device_source,
    names_where,
    read_bundle,
)

SOURCES = ["nvidia-smi", "nvidia-smi[node-2.csv]", "dcgm[Hostname=n1]", "nvml", "vllm-log:replica-a.log",
           "vllm-metrics", "nvmlx", None, "dcgm"]


def _frame(categorical: bool) -> pl.DataFrame:
    df = pl.DataFrame({"source": SOURCES * 3, "metric": ["device_used_bytes", "kv_usage_ratio", None] * len(SOURCES)})
    return df.with_columns(pl.col("source", "metric").cast(pl.Categorical)) if categorical else df


@pytest.mark.parametrize("categorical", [False, True])
def test_a_text_test_on_names_is_the_same_on_categories(categorical: bool) -> None:
    df = _frame(categorical)
    text = _frame(False)
    for expr, want in [
        (device_source(pl.col("source")), text["source"].str.contains(r"^(?:nvml|dcgm|nvidia-smi)(?:\[|$)")),
        (device_source(pl.col("source"), tagged_only=True), text["source"].str.contains(r"^(?:nvml|dcgm|nvidia-smi)\[")),
        (names_where(pl.col("metric"), lambda m: m.str.ends_with("_bytes")), text["metric"].str.ends_with("_bytes")),
    ]:
        got = df.select(expr)[:, 0]
        assert got.to_list() == want.to_list()  # (nulls as a test on text gives them)
        assert df.filter(expr).height == int(want.sum()) > 0
    assert df.lazy().filter(names_where(pl.col("source"), lambda s: s.str.starts_with("vllm-"))).collect().height == 6


def test_a_bundle_reads_its_names_as_categories_and_keeps_every_row(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production"))
    rows = [(t, g, s, m, float(t)) for t in range(0, 50, 7) for g, s in ((0, "nvidia-smi"), (None, "vllm-log:a.log"))
            for m in ("device_used_bytes", "kv_usage_ratio")]
    for r in rows:
        w.sample(*r)
    w.close()
    b = read_bundle(tmp_path / "b")
    assert b.samples.schema["source"] == pl.Categorical() and b.samples.schema["metric"] == pl.Categorical()
    back = b.samples.with_columns(pl.col("source", "metric").cast(pl.Utf8))
    assert back.schema == pl.Schema(SAMPLES_SCHEMA)
    assert sorted(back.iter_rows(), key=str) == sorted(rows, key=str)
    assert b.samples.filter(device_source(pl.col("source")))["gpu"].to_list() == [0] * 16
