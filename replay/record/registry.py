"""The evidence families the recorder reads: which kind a file is (each family's sniffers, tried in
one order, the most particular shapes first) and the parser of each kind. A new format is a
sniffer and a parser in its family's module, and a line here.

vLLM's own logs (``vllm-log``, and ``log-export``: one as a logging service exports it) are read
apart, streamed in pieces (``fastlog``), never held whole."""

from __future__ import annotations

import re

from replay.record import (
    aiperf,
    bench_serve,
    dcgm,
    exports,
    fastlog,
    fastsmi,
    gpustat,
    guidellm,
    k8s,
    kernel,
    metrics_csv,
    nvidia_smi,
    prometheus,
)
from replay.record.common import Parser, PieceParser, Sniffer

STREAMED = ("vllm-log", "log-export")


def _sniff_log_export(head: str) -> str | None:
    """A vLLM log as a logging service or tool exports it."""
    return "log-export" if exports.export_kind(head) else None


# a line as vLLM's logger writes it, at any level: '(process) LEVEL MM-DD HH:MM:SS [file.py:N] '
_VLLM_LINE = re.compile(fastlog.STRICT_ANY, re.M)
_VLLM_WORDS = ("INFO ", "WARNING ", "ERROR ", "vllm", "KV cache", "CUDA out of memory", "GPU blocks", "Memory profiling",
               "preempted", "model weights take", "OutOfMemoryError", "(raylet)", "memory usage threshold")


def _sniff_vllm_log(head: str) -> str | None:
    """Last of all: any file with the words of a vLLM log (an excerpt of a DEBUG-level log may hold
    nothing but its lines' shape)."""
    return "vllm-log" if any(k in head for k in _VLLM_WORDS) or _VLLM_LINE.search(head) else None


SNIFFERS: tuple[Sniffer, ...] = (
    aiperf.sniff_records, aiperf.sniff_telemetry, aiperf.sniff_server_metrics, aiperf.sniff_summary,
    bench_serve.sniff, guidellm.sniff,  # (JSON of keys no other family's has: first)
    prometheus.sniff_query_range, prometheus.sniff_vm_export, _sniff_log_export, prometheus.sniff_grafana_json,
    prometheus.sniff_tsdb_dump, k8s.sniff_objects, k8s.sniff_table, k8s.sniff_describe, dcgm.sniff_dmon,
    dcgm.sniff_counters, nvidia_smi.sniff_dmon, kernel.sniff, gpustat.sniff, nvidia_smi.sniff_table, nvidia_smi.sniff_q,
    nvidia_smi.sniff_csv, metrics_csv.sniff, prometheus.sniff_grafana_csv, prometheus.sniff_text, _sniff_vllm_log,
)
PARSERS: dict[str, Parser] = {**prometheus.PARSERS, **fastsmi.PARSERS, **nvidia_smi.PARSERS, **dcgm.PARSERS,
                              **k8s.PARSERS, **kernel.PARSERS, **gpustat.PARSERS, **metrics_csv.PARSERS,
                              **aiperf.PARSERS, **bench_serve.PARSERS, **guidellm.PARSERS}
PIECEWISE: dict[str, PieceParser] = {**fastsmi.PIECEWISE}  # kinds whose parser reads the file in parts itself
KINDS = (*STREAMED, *PARSERS)  # what ``--as`` may name


def detect_kind(text: str) -> str | None:
    """The kind of evidence a file is, from its start (None: not one the recorder reads)."""
    head = text[:20000].replace("\u00a0", " ")  # (a copy from a web page: no-break spaces for its spaces)
    return next((kind for sniff in SNIFFERS if (kind := sniff(head)) is not None), None)
