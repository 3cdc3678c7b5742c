"""Importers on the real public traces: exact row counts and token sums computed independently."""

from __future__ import annotations

import bz2
import csv
import gzip
import json
import lzma
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from replay.errors import ReplayError
from replay.trace.format import iter_requests, read_header
from replay.trace.importers import import_trace
from tests.conftest import shared

DATA = Path(__file__).parents[1] / "data"


def _csv_truth(path: Path, in_col: str, out_col: str) -> tuple[int, int, int]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return len(rows), sum(int(r[in_col]) for r in rows), sum(int(r[out_col]) for r in rows)


@pytest.mark.parametrize("rel", ["traces/azure/AzureLLMInferenceTrace_conv.csv", "traces/azure/AzureLLMInferenceTrace_code.csv",
                                 "traces/azure/AzureLLMInferenceTrace_2024_notebook_excerpt.csv",
                                 "traces/azure/AzureLMMInferenceTrace_multimodal_notebook_excerpt.csv"])
def test_azure_exact_counts_and_sums(rel: str, tmp_path: Path) -> None:
    src = shared(rel)
    n, s_in, s_out = _csv_truth(src, "ContextTokens", "GeneratedTokens")
    out = tmp_path / "t.jsonl"
    res = import_trace("azure", src, out)
    reqs = list(iter_requests(out))
    assert (res.rows_read, res.rows_emitted, res.quarantined) == (n, n, 0)
    assert len(reqs) == n
    assert sum(r["input_tokens"] for r in reqs) == s_in
    assert sum(r["output_tokens"] for r in reqs) == s_out
    ts = [r["t_us"] for r in reqs]
    assert ts[0] == 0 and ts == sorted(ts)


def test_azure_conv_timestamps_keep_microseconds(tmp_path: Path) -> None:
    src = shared("traces/azure/AzureLLMInferenceTrace_conv.csv")
    out = tmp_path / "t.jsonl"
    import_trace("azure", src, out)
    reqs = list(iter_requests(out))
    # GIVEN rows 18:15:46.6805900 and 18:15:50.9951690 WHEN imported THEN the offset is exact in µs
    assert reqs[1]["t_us"] == 4_314_579
    assert reqs[1]["src_ts"] == "2023-11-16 18:15:50.9951690"
    assert read_header(out).time["tz_assumed"] == "unknown"


def test_azure_multimodal_images_become_mm_items(tmp_path: Path) -> None:
    src = shared("traces/azure/AzureLMMInferenceTrace_multimodal_notebook_excerpt.csv")
    with src.open(newline="") as fh:
        truth = [int(r["NumImages"]) for r in csv.DictReader(fh)]
    out = tmp_path / "t.jsonl"
    import_trace("azure", src, out)
    got = [sum(m["count"] for m in (r.get("mm") or [])) for r in iter_requests(out)]
    assert got == truth and sum(truth) > 0


@pytest.mark.parametrize("rel,sessions", [("traces/burstgpt/burstgpt1_quoted_head_rows.csv", False),
                                          ("traces/burstgpt/burstgpt3_quoted_head_rows.csv", True)])
def test_burstgpt_by_column_name(rel: str, sessions: bool, tmp_path: Path) -> None:
    src = shared(rel)
    n, s_in, s_out = _csv_truth(src, "Request tokens", "Response tokens")
    out = tmp_path / "t.jsonl"
    import_trace("burstgpt", src, out)
    reqs = list(iter_requests(out))
    assert len(reqs) == n and sum(r["input_tokens"] for r in reqs) == s_in
    assert sum(r["output_tokens"] for r in reqs) == s_out
    assert all("Model" in r["extra"] for r in reqs)
    assert (reqs[0].get("session_id") is not None) == sessions
    if sessions:  # v2: not zero-based, Timestamp 19,440,110 s -> 0
        assert reqs[0]["t_us"] == 0 and reqs[1]["t_us"] == 51_000_000
        with src.open(newline="") as fh:  # Elapsed time (s) is the source's observed latency
            elapsed = [float(r["Elapsed time"]) for r in csv.DictReader(fh)]
        assert [r["src_latency_us"] for r in reqs] == [round(e * 1e6) for e in elapsed]
        assert all("Elapsed time" not in r["extra"] for r in reqs)


@pytest.mark.parametrize("back", [False, True])
def test_streamed_blocks_match_whole_file(back: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a CSV read in 1 KiB pieces (quoted newlines, blank lines, bad rows, optionally a step back
    in time) THEN the trace and quarantine equal those of a whole-file read."""
    import replay.trace.importers as im

    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens,note"]
    for i in range(400):
        ts = f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.5"
        note = '"a, ""quoted""\nnote"' if i % 37 == 0 else "n"
        tokens = "x" if i % 53 == 0 else str(10 + i)
        lines.append(f"{ts},{tokens},{i % 7},{note}")
        if i % 91 == 5:
            lines.append("")  # a blank line: a row with no fields (quarantined), in its place
    if back:
        lines[300] = "2023-11-16 18:00:00.1,5,5,back"  # earlier than everything before it
    src = tmp_path / "a.csv"
    src.write_text("\n".join(lines) + "\n")
    outs = {}
    for size in (1 << 30, 1024):
        monkeypatch.setattr(im, "CSV_BLOCK_BYTES", size)
        out = tmp_path / f"t{size}.jsonl"
        res = import_trace("azure", src, out)
        q = res.quarantine_path.read_text() if res.quarantine_path else ""
        outs[size] = (list(iter_requests(out)), q, read_header(out).time, res.rows_read, res.quarantined)
    assert outs[1024] == outs[1 << 30]
    reqs, q, time, n, n_bad = outs[1024]
    assert n == 405 and n_bad == 13 and q.count("\n") == 13
    assert (time["backwards_steps"] >= 1) == back and time["sorted"] is not back
    assert (reqs[0]["src_ts"] == "2023-11-16 18:00:00.1") == back
    assert [r["t_us"] for r in reqs] == sorted(r["t_us"] for r in reqs) and reqs[0]["t_us"] == 0
    assert sum('""' not in r["extra"]["note"] and "quoted" in r["extra"]["note"] for r in reqs) == 10


@pytest.mark.parametrize("end", ["", "\n", "\n\n  \n"])
def test_a_file_that_fits_in_a_block_is_one_block(end: str, tmp_path: Path) -> None:
    """GIVEN a CSV smaller than a block, ending in a line end, in none (as the Azure traces do) or in
    blank space THEN it is read as one block with every row, and in blocks of 64 bytes the same rows
    come out in order (a file that does not end in a line end left its last row a block of its own)."""
    import replay.trace.importers as im
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   + "\n".join(f"2023-11-16 18:00:{i:02d}.5,{i},1" for i in range(30)) + end)
    cols = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]

    def rows(block_bytes: int | None) -> list[list[str]]:
        return [b().collect().drop("src_row").rows() for b in im._csv_blocks(src, src, cols, ",", block_bytes)()]

    whole = rows(None)
    # (a blank line and one of spaces before the end are rows, which the import quarantines)
    assert len(whole) == 1 and len(whole[0]) == (32 if "  " in end else 30) and whole[0][29][1] == "29"
    small = rows(64)
    assert len(small) > 10 and [r for b in small for r in b] == whole[0]


def test_a_token_count_that_is_negative_or_fractional_is_quarantined(tmp_path: Path) -> None:
    """GIVEN token counts of -3, 12.7 and -1 among good ones ('1,024' and 3.0 are counts), in a CSV
    and in JSON lines THEN those rows are quarantined as not counts, and the trace written reads
    back (a negative count made a trace that the trace reader refused; a fraction was cut unsaid)."""
    src = tmp_path / "a.csv"
    src.write_text('TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:47,-3,5\n'
                   '2023-11-16 18:15:48,12.7,5\n2023-11-16 18:15:49,8,-1\n2023-11-16 18:15:50,"1,024",3.0\n')
    res = import_trace("azure", src, tmp_path / "a.jsonl")
    assert res.quarantine_path is not None
    q = [json.loads(x) for x in res.quarantine_path.read_text().splitlines()]
    assert [(x["line"], x["reason"].split(" unparseable")[0]) for x in q] == [
        (3, "input_tokens"), (4, "input_tokens"), (5, "output_tokens")]
    assert all(x["reason"].endswith("as a count (an integer >= 0)") for x in q)
    assert [(r["input_tokens"], r["output_tokens"]) for r in iter_requests(tmp_path / "a.jsonl")] == [(10, 5), (1024, 3)]
    jl = tmp_path / "m.jsonl"
    jl.write_text("".join(json.dumps({"timestamp": t, "input_length": n, "output_length": 4}) + "\n"
                          for t, n in ((0, 100), (1000, -5), (2000, 7.5), (3000, 64))))
    res = import_trace("mooncake", jl, tmp_path / "m.out.jsonl")
    assert (res.rows_emitted, res.quarantined) == (2, 2)
    assert [r["input_tokens"] for r in iter_requests(tmp_path / "m.out.jsonl")] == [100, 64]


def test_burstgpt_zero_response_is_failed(tmp_path: Path) -> None:
    src = tmp_path / "b.csv"
    src.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                   "5,ChatGPT,472,18,490,Conversation log\n7,GPT-4,100,0,100,API log\n")
    out = tmp_path / "t.jsonl"
    import_trace("burstgpt", src, out)
    r = list(iter_requests(out))
    assert [x["output_kind"] for x in r] == ["observed", "failed"]


@pytest.mark.parametrize("rel", ["traces/mooncake/conversation_trace.jsonl", "traces/mooncake/synthetic_trace.jsonl",
                                 "traces/mooncake/arxiv_mooncake_trace_first20.jsonl"])
def test_mooncake_hash_ids_to_prefix_blocks(rel: str, tmp_path: Path) -> None:
    src = shared(rel)
    rows = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    out = tmp_path / "t.jsonl"
    import_trace("mooncake", src, out)
    reqs = list(iter_requests(out))
    assert len(reqs) == len(rows)
    assert sum(r["input_tokens"] for r in reqs) == sum(x["input_length"] for x in rows)
    assert sum(len(r["prefix_blocks"]) for r in reqs) == sum(len(x["hash_ids"]) for x in rows)
    assert max(r["t_us"] for r in reqs) == max(x["timestamp"] for x in rows) * 1000
    assert read_header(out).prefix["block_size"] == 512


def test_a_vllm_timed_trace_is_read_in_seconds(tmp_path: Path) -> None:
    """GIVEN Mooncake's conversation trace (timestamps in whole ms) exported as vLLM bench's timed_trace
    (the same keys, timestamps in seconds as decimals) WHEN each is imported with auto THEN the Mooncake
    file is read as Mooncake and the export as vllm-timed-trace, and both give every request at the same
    time and length (read as Mooncake's ms, the export's arrivals were a thousand times too close)."""
    from replay.trace.exporters import export_trace
    src = shared("traces/mooncake/conversation_trace.jsonl")
    first = import_trace("auto", src, tmp_path / "m.jsonl")
    export_trace("vllm-timed-trace", tmp_path / "m.jsonl", tmp_path / "timed.jsonl")
    again = import_trace("auto", tmp_path / "timed.jsonl", tmp_path / "t.jsonl")
    assert (first.format, again.format) == ("mooncake", "vllm-timed-trace")
    a, b = list(iter_requests(tmp_path / "m.jsonl")), list(iter_requests(tmp_path / "t.jsonl"))
    assert len(a) == len(b) > 100 and max(r["t_us"] for r in b) > 1_000_000_000  # (hours of a real trace)
    assert [(r["t_us"], r["input_tokens"], r["output_tokens"]) for r in a] == \
        [(r["t_us"], r["input_tokens"], r["output_tokens"]) for r in b]
    assert read_header(tmp_path / "t.jsonl").prefix["block_size"] == 16


def test_vidur_and_splitwise(tmp_path: Path) -> None:
    src = shared("traces/vidur/splitwise_conv.head500.csv")
    n, s_in, _ = _csv_truth(src, "num_prefill_tokens", "num_decode_tokens")
    import_trace("vidur", src, tmp_path / "v.jsonl")
    r = list(iter_requests(tmp_path / "v.jsonl"))
    assert len(r) == n == 500 and sum(x["input_tokens"] for x in r) == s_in
    assert r[1]["t_us"] == 4_314_579
    src2 = shared("traces/splitwise-sim/test_trace.csv")
    n2, s2, _ = _csv_truth(src2, "prompt_size", "token_size")
    import_trace("splitwise", src2, tmp_path / "s.jsonl")
    r2 = list(iter_requests(tmp_path / "s.jsonl"))
    assert len(r2) == n2 and sum(x["input_tokens"] for x in r2) == s2


def test_bailian_jsonl(tmp_path: Path) -> None:
    src = tmp_path / "b.jsonl"
    src.write_text('{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 100, "output_length": 5, "type": "text", "turn": 1, "hash_ids": [1, 2]}\n'
                   '{"chat_id": 2, "parent_chat_id": 1, "timestamp": 1.75, "input_length": 300, "output_length": 7, "type": "text", "turn": 2, "hash_ids": [1, 2, 3]}\n')
    import_trace("bailian", src, tmp_path / "t.jsonl")
    r = list(iter_requests(tmp_path / "t.jsonl"))
    assert [x["t_us"] for x in r] == [0, 1_250_000]
    assert r[0]["session_id"] is None and r[1]["session_id"] == "1"
    assert r[1]["prefix_blocks"] == [1, 2, 3]


@pytest.mark.parametrize("name", ["servegen_offline_trace_f_head25.jsonl", "servegen_offline_trace_c_head6.jsonl"])
def test_servegen_offline_batch_jobs(name: str, tmp_path: Path) -> None:
    # GIVEN the first rows of real ServeGen offline traces (a stat trace and a content-hash trace)
    src = Path(__file__).parents[1] / "data" / name
    rows = [json.loads(x) for x in src.read_text().splitlines()]
    out = tmp_path / "t.jsonl"
    res = import_trace("servegen-offline", src, out)
    reqs = list(iter_requests(out))
    h = read_header(out)
    # THEN every request arrives at 0 (a batch is submitted at once), in the file's order, with its id
    assert (res.rows_read, res.rows_emitted, res.quarantined) == (len(rows), len(rows), 0)
    assert [r["t_us"] for r in reqs] == [0] * len(rows)
    assert [r["id"] for r in reqs] == [str(x["request_id"]) for x in rows]
    assert [r["input_tokens"] for r in reqs] == [x["input_length"] for x in rows]
    assert [r["extra"]["type"] for r in reqs] == [x["type"] for x in rows]
    assert h.time["src_origin"].startswith("none")
    if "output_length" in rows[0]:  # a stat trace: output and the latency the batch saw
        assert [r["output_tokens"] for r in reqs] == [x["output_length"] for x in rows]
        assert [r["src_latency_us"] for r in reqs] == [x["duration"] * 1000 for x in rows]
        assert h.prefix["block_size"] is None
    else:  # a content-hash trace: 16-token block hashes and images, no output length
        assert all(r["output_tokens"] is None and r["output_kind"] == "unknown" for r in reqs)
        assert [r["prefix_blocks"] for r in reqs] == [x["hash_ids"] for x in rows]
        assert [sum(m["count"] for m in r["mm"]) for r in reqs] == [len(x["img_ids"]) for x in rows]
        assert [r["extra"]["img_ids"] for r in reqs] == [x["img_ids"] for x in rows]
        assert h.prefix["block_size"] == 16
        # the blocks cover the prompt: ceil(input_length / 16) of them
        assert all(len(r["prefix_blocks"]) == -(-r["input_tokens"] // 16) for r in reqs)


def test_servegen_offline_bad_rows_quarantined(tmp_path: Path) -> None:
    src = tmp_path / "o.jsonl"
    src.write_text('{"request_id": 0, "type": "text", "input_length": 61, "output_length": 2370, "duration": 14000}\n'
                   '{"request_id": 1, "type": "text", "input_length": "n/a", "output_length": 5, "duration": 1}\n')
    res = import_trace("servegen-offline", src, tmp_path / "t.jsonl")
    assert (res.rows_emitted, res.quarantined) == (1, 1)
    q = [json.loads(x) for x in (tmp_path / "t.jsonl.quarantine.jsonl").read_text().splitlines()]
    assert q[0]["line"] == 2 and "input_tokens" in q[0]["reason"]


@pytest.mark.parametrize(("fmt", "rel"), [
    ("azure", "traces/azure/AzureLLMInferenceTrace_code.csv"),
    ("azure", "traces/azure/AzureLMMInferenceTrace_multimodal_notebook_excerpt.csv"),
    ("burstgpt", "traces/burstgpt/burstgpt1_quoted_head_rows.csv"),
    ("burstgpt", "traces/burstgpt/burstgpt3_quoted_head_rows.csv"),
    ("mooncake", "traces/mooncake/conversation_trace.jsonl"),
    ("mooncake", "traces/mooncake/arxiv_mooncake_trace_first20.jsonl"),
    ("vidur", "traces/vidur/splitwise_conv.head500.csv"),
    ("vidur", "traces/vidur/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.head200.csv"),
    ("splitwise", "traces/splitwise-sim/test_trace.csv"),
])
def test_auto_tells_each_real_trace_by_its_columns(fmt: str, rel: str, tmp_path: Path) -> None:
    src = shared(rel)
    res = import_trace("auto", src, tmp_path / "a.jsonl")
    import_trace(fmt, src, tmp_path / "n.jsonl")
    assert res.format == fmt
    assert list(iter_requests(tmp_path / "a.jsonl")) == list(iter_requests(tmp_path / "n.jsonl"))


def test_auto_on_jsonl_shapes_and_what_is_not_a_trace(tmp_path: Path) -> None:
    for name, fmt in [("servegen_offline_trace_f_head25.jsonl", "servegen-offline"),
                      ("servegen_offline_trace_c_head6.jsonl", "servegen-offline")]:
        assert import_trace("auto", Path(__file__).parents[1] / "data" / name, tmp_path / "o.jsonl").format == fmt
    bailian = tmp_path / "b.jsonl"  # Bailian names its chats (and counts seconds); Mooncake does not
    bailian.write_text('{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 100, "output_length": 5}\n')
    assert import_trace("auto", bailian, tmp_path / "o.jsonl").format == "bailian"
    bench = tmp_path / "d.jsonl"
    bench.write_text('{"prompt": "hello", "output_tokens": 3}\n')
    assert import_trace("auto", bench, tmp_path / "o.jsonl").format == "vllm-bench"
    with pytest.raises(ReplayError, match="already a replay-trace/1 trace"):
        import_trace("auto", tmp_path / "o.jsonl", tmp_path / "o2.jsonl")
    odd = tmp_path / "odd.csv"
    odd.write_text("when,prompt_len\n1,2\n")
    with pytest.raises(ReplayError, match=r"cannot tell the format from its columns \(prompt_len, when\)"):
        import_trace("auto", odd, tmp_path / "o.jsonl")
    garbage = tmp_path / "g.csv"
    garbage.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ReplayError, match=r"g.csv:1: not a text trace \(binary content\)"):
        import_trace("auto", garbage, tmp_path / "o.jsonl")
    windows = tmp_path / "chunk-4-trace.csv"
    windows.write_text("0,0.5,1.0,Gamma,1.0,1.0\n")
    with pytest.raises(ReplayError, match="replay synth --servegen"):
        import_trace("auto", windows, tmp_path / "o.jsonl")


def test_vllm_bench_keeps_prompt(tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    src.write_text('{"prompt": "hello there", "output_tokens": 12}\n{"prompt": "a b c", "output_tokens": 3}\n')
    import_trace("vllm-bench", src, tmp_path / "t.jsonl")
    r = list(iter_requests(tmp_path / "t.jsonl"))
    assert [x["prompt"] for x in r] == ["hello there", "a b c"] and r[0]["output_tokens"] == 12


# --- bad input ------------------------------------------------------------------------------------
def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "e.csv"
    p.write_text("")
    with pytest.raises(ReplayError, match="empty file"):
        import_trace("azure", p, tmp_path / "o.jsonl")


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match="is a directory"):
        import_trace("azure", tmp_path, tmp_path / "o.jsonl")


@pytest.mark.parametrize("kind,compress", [("gzip", gzip.compress), ("bzip2", bz2.compress), ("xz", lzma.compress)])
def test_truncated_compressed_trace(kind: str, compress: Callable[[bytes], bytes], tmp_path: Path) -> None:
    data = compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n" + b"2023-11-16 18:15:46.6805900,374,44\n" * 2000)
    p = tmp_path / "t.csv"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ReplayError, match=f"t.csv: damaged or truncated {kind}"):
        import_trace("azure", p, tmp_path / "o.jsonl")


def test_wrong_columns_named(tmp_path: Path) -> None:
    p = tmp_path / "w.csv"
    p.write_text("time,in,out\n1,2,3\n")
    with pytest.raises(ReplayError, match=r"w\.csv:1: not an azure file: missing column\(s\) TIMESTAMP"):
        import_trace("azure", p, tmp_path / "o.jsonl")


def test_ragged_row_names_line(tmp_path: Path) -> None:
    p = tmp_path / "r.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47.1,1,2,3,4\n")
    with pytest.raises(ReplayError, match=r"r\.csv:3: expected 3 fields, found 5"):
        import_trace("azure", p, tmp_path / "o.jsonl")


def test_unparseable_rows_quarantined_with_lines(tmp_path: Path) -> None:
    p = tmp_path / "q.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\nyesterday,1,2\n"
                 "2023-11-16 18:15:48.00,abc,2\n2023-11-16 18:15:49.00,10,20\n")
    res = import_trace("azure", p, tmp_path / "o.jsonl")
    assert (res.rows_read, res.rows_emitted, res.quarantined) == (4, 2, 2)
    q = [json.loads(x) for x in res.quarantine_path.read_text().splitlines()]  # type: ignore[union-attr]
    assert [x["line"] for x in q] == [3, 4]
    assert "arrival time unparseable" in q[0]["reason"] and "input_tokens unparseable" in q[1]["reason"]
    assert read_header(tmp_path / "o.jsonl").import_counts["quarantined"] == 2


def test_bad_jsonl_line(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n{"timestamp": 1, "input_len\n')
    with pytest.raises(ReplayError, match=r"m\.jsonl:2: not JSON"):
        import_trace("mooncake", p, tmp_path / "o.jsonl")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.one_of(st.integers(0, 10**6).map(str), st.text("abc1", max_size=3)),
                               st.one_of(st.integers(0, 5000).map(str), st.just(""), st.just("x")),
                               st.integers(0, 500).map(str)), min_size=1, max_size=30))
def test_property_splitwise_rows_are_emitted_or_quarantined(rows: list[tuple[str, str, str]], tmp_path_factory: pytest.TempPathFactory) -> None:
    d = tmp_path_factory.mktemp("p")
    p = d / "s.csv"
    p.write_text("request_id,arrival_timestamp,prompt_size,token_size\n" + "".join(f"{i},{a},{b},{c}\n" for i, (a, b, c) in enumerate(rows)))
    try:
        res = import_trace("splitwise", p, d / "o.jsonl")
    except ReplayError as e:
        assert "every row was quarantined" in e.message
        return
    assert res.rows_emitted + res.quarantined == len(rows)
    got = list(iter_requests(d / "o.jsonl"))
    assert len(got) == res.rows_emitted
    assert all(r["t_us"] >= 0 for r in got)


@pytest.mark.parametrize("block", [1 << 20, 24])
def test_blank_lines_are_quarantined_in_place(block: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN blank lines right after the header and between rows (LF and CRLF), read whole or in
    pieces that start on a blank line THEN each is one quarantined row with its own line number, and
    the rows after them keep theirs."""
    import replay.trace.importers as im
    monkeypatch.setattr(im, "CSV_BLOCK_BYTES", block)
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n\n2023-11-16 18:00:00,1,1\n\r\n\n2023-11-16 18:00:01,2,2\n")
    out = tmp_path / "t.jsonl"
    res = import_trace("azure", src, out)
    assert (res.rows_read, res.rows_emitted, res.quarantined) == (5, 2, 3)
    assert [r["src_row"] for r in iter_requests(out)] == [1, 4]
    assert res.quarantine_path is not None
    q = [json.loads(x) for x in res.quarantine_path.read_text().splitlines()]
    assert [x["line"] for x in q] == [2, 4, 5] and {x["reason"] for x in q} == {"empty row (a blank line, or no values)"}


@pytest.mark.parametrize("gz", [False, True])
def test_header_sha256_is_the_source_file_as_given(gz: bool, tmp_path: Path) -> None:
    """The header's sha256 is that of the file as given (hashed while its blocks are read for a plain
    CSV, beforehand for a gzip), whatever path the import took."""
    import hashlib
    src = shared("traces/azure/AzureLLMInferenceTrace_code.csv")
    if gz:
        src2 = tmp_path / "code.csv.gz"
        src2.write_bytes(gzip.compress(src.read_bytes()))
        src = src2
    out = tmp_path / "t.jsonl"
    import_trace("azure", src, out)
    assert read_header(out).source["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()


def test_failed_reimport_leaves_the_last_good_import(tmp_path: Path) -> None:
    """GIVEN a trace imported with quarantined rows WHEN a file whose every row is bad is imported to
    the same output THEN the error names the file and where its rows' reasons are, and the trace and
    its quarantine are still those of the good import."""
    good = tmp_path / "good.csv"
    good.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,1,1\n2023-11-16 18:00:01,x,2\n")
    out = tmp_path / "t.jsonl"
    res = import_trace("azure", good, out)
    assert res.quarantine_path is not None
    before = (out.read_bytes(), res.quarantine_path.read_bytes())
    broken = tmp_path / "broken.csv"
    broken.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nnot a time,x,y\n")
    with pytest.raises(ReplayError, match="broken.csv.*every row was quarantined.*t.jsonl.rejected.jsonl"):
        import_trace("azure", broken, out)
    assert (out.read_bytes(), res.quarantine_path.read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken.csv", "good.csv", "t.jsonl", "t.jsonl.quarantine.jsonl", "t.jsonl.rejected.jsonl"]
    assert "not a time" in (tmp_path / "t.jsonl.rejected.jsonl").read_text()


@pytest.mark.parametrize("fmt,rel,compress", [("azure", "traces/azure/AzureLLMInferenceTrace_code.csv", gzip.compress),
                                              ("mooncake", "traces/mooncake/conversation_trace.jsonl", gzip.compress),
                                              ("azure", "traces/azure/AzureLLMInferenceTrace_code.csv", lzma.compress),
                                              ("mooncake", "traces/mooncake/conversation_trace.jsonl", bz2.compress)])
def test_compressed_saved_without_its_suffix_imports_as_the_plain_file(fmt: str, rel: str, compress: Callable[[bytes], bytes],
                                                                        tmp_path: Path) -> None:
    """A compressed export (gzip, bzip2, xz) is recognised by its content, not its name: the same
    requests as the plain file (it used to be parsed as raw bytes and end in an internal error)."""
    src = shared(rel)
    disguised = tmp_path / src.name  # compressed bytes under the plain name
    disguised.write_bytes(compress(src.read_bytes()))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    ra, rb = import_trace(fmt, src, a), import_trace(fmt, disguised, b)
    assert (rb.rows_read, rb.rows_emitted, rb.input_tokens_sum) == (ra.rows_read, ra.rows_emitted, ra.input_tokens_sum)
    assert ra.rows_emitted > 100
    assert list(iter_requests(b)) == list(iter_requests(a))
    plain = tmp_path / "plain.jsonl"  # and a trace file itself, gzipped under a plain name, reads as one
    plain.write_bytes(compress(a.read_bytes()))
    assert read_header(plain).import_counts == read_header(a).import_counts


_SUFFIXES = ["", "Z", "+01:00", "-05:30", "+0530", "-0000", " "]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.text("0123456789", max_size=10), st.sampled_from(_SUFFIXES),
                          st.sampled_from([" ", "T"])), min_size=1, max_size=30))
@example([(0, "", "-05:30", " ")])  # a zone west of UTC: the time in UTC is later
def test_azure_timestamp_fast_form_agrees_with_the_full_parser(rows: list[tuple[int, str, str, str]]) -> None:
    """Both parsers give the time Python's ISO parser gives (UTC where no zone is stated); the cheap
    one, shaped on the first row, either agrees exactly (any number of fraction digits, 'T' or ' ',
    any zone) or leaves the row to the full parser, and it takes every row shaped like the first (in
    the first row's zone)."""
    import datetime as dt

    import polars as pl

    from replay.trace.importers import _parse_timestamp_us
    vals, ref = [], []
    for secs, frac, suffix, sep in rows:
        base = (dt.datetime(2023, 1, 1) + dt.timedelta(seconds=secs % (3 * 365 * 86400))).strftime(f"%Y-%m-%d{sep}%H:%M:%S")
        vals.append(base + ("." + frac if frac else "") + suffix)
        when = dt.datetime.fromisoformat(vals[-1].strip().replace("Z", "+00:00"))
        when = when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)
        ref.append((when - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1))
    p = _parse_timestamp_us("ts", vals[0])
    df = pl.DataFrame({"ts": vals, "ref": ref}).with_columns(fast=p.fast, full=p.full)
    assert (df["full"] == df["ref"]).all(), df.filter(pl.col("full") != pl.col("ref"))
    taken = df.filter(pl.col("fast").is_not_null())
    assert (taken["fast"] == taken["ref"]).all(), taken.filter(pl.col("fast") != pl.col("ref"))
    kind = {"": "", "Z": "Z", "+01:00": "+01:00", "-05:30": "-05:30"}  # (other suffixes: the full parser's)

    def shape(r: tuple[int, str, str, str]) -> tuple[str, str] | None:
        return (r[3], kind[r[2]]) if r[2] in kind and len(r[1]) <= 9 else None
    expect = shape(rows[0]) or (" ", "")  # a first row the cheap form cannot take: it takes the 2023 shape
    assert df.filter(pl.Series([shape(r) == expect for r in rows]))["fast"].null_count() == 0


@pytest.mark.parametrize("fmt,rel", [("azure", "traces/azure/AzureLLMInferenceTrace_code.csv"),
                                     ("mooncake", "traces/mooncake/conversation_trace.jsonl")])
@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_byte_order_mark_imports_as_the_plain_file(fmt: str, rel: str, encoding: str, tmp_path: Path) -> None:
    """Excel's 'CSV UTF-8' starts with a byte-order mark, and Windows tools write UTF-16: the same
    requests as the plain file (a mark used to hide the first column: 'missing TIMESTAMP; found
    TIMESTAMP'), with the header's sha256 still that of the file as given."""
    import hashlib
    src = shared(rel)
    marked = tmp_path / src.name
    marked.write_bytes(src.read_bytes().decode("utf-8").encode(encoding))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    ra, rb = import_trace(fmt, src, a), import_trace(fmt, marked, b)
    assert (rb.rows_read, rb.rows_emitted, rb.input_tokens_sum) == (ra.rows_read, ra.rows_emitted, ra.input_tokens_sum)
    assert ra.rows_emitted > 100 and list(iter_requests(b)) == list(iter_requests(a))
    assert read_header(b).source["sha256"] == hashlib.sha256(marked.read_bytes()).hexdigest()


def test_jsonl_cut_short_says_so(tmp_path: Path) -> None:
    """A JSONL trace whose last line breaks off (an interrupted download) is named as such, with the
    command that imports the rest; a bad line elsewhere is only named."""
    src = shared("traces/mooncake/conversation_trace.jsonl")
    lines = src.read_text().splitlines(keepends=True)[:20]
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines)[:-30])
    with pytest.raises(ReplayError, match=r"cut.jsonl:20: not JSON .*ends mid-line.*head -n 19 "):
        import_trace("mooncake", cut, tmp_path / "o.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines[:5]) + "garbage{\n" + "".join(lines[5:]))
    with pytest.raises(ReplayError, match=r"bad.jsonl:6: not JSON \([^)]*\)$"):
        import_trace("mooncake", bad, tmp_path / "o.jsonl")


def test_jsonl_fields_that_are_objects_or_lists(tmp_path: Path) -> None:
    """GIVEN real Mooncake lines whose required field holds an object on every line, and vLLM-bench
    lines whose prompt is an object WHEN imported THEN every row is quarantined as unparseable, with
    the reasons beside the output (polars cast the object's fields instead, and the import died with
    a Rust panic); and where one line's field is an object while the others' are numbers, the error
    names that line and the line it disagrees with (it named neither)."""
    src = shared("traces/mooncake/conversation_trace.jsonl")
    rows = [json.loads(ln) for ln in src.read_text().splitlines()[:30]]
    nested = tmp_path / "nested.jsonl"
    nested.write_text("".join(json.dumps({**r, "input_length": {"tokens": r["input_length"]}}) + "\n" for r in rows))
    with pytest.raises(ReplayError, match=r"every row was quarantined \(30\)"):
        import_trace("mooncake", nested, tmp_path / "o.jsonl")
    q = [json.loads(ln) for ln in (tmp_path / "o.jsonl.rejected.jsonl").read_text().splitlines()]
    assert len(q) == 30 and all(e["reason"] == "input_tokens unparseable as a count (an integer >= 0)" for e in q)
    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"prompt": {"text": "hi"}, "output_tokens": r["output_length"]}) + "\n" for r in rows))
    with pytest.raises(ReplayError, match="every row was quarantined"):
        import_trace("vllm-bench", bench, tmp_path / "b.jsonl")
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({**r, "input_length": {"tokens": 5}} if i == 6 else r) + "\n" for i, r in enumerate(rows)))
    with pytest.raises(ReplayError, match=r"mixed.jsonl:7: 'input_length' is an object here but a plain value on line 1"):
        import_trace("mooncake", mixed, tmp_path / "m.jsonl")


_JSONL_KEYS = {"mooncake": ["timestamp", "input_length", "output_length", "hash_ids"],
               "bailian": ["timestamp", "input_length", "output_length", "hash_ids", "chat_id", "parent_chat_id"],
               "vllm-bench": ["prompt", "output_tokens", "timestamp"],
               "servegen-offline": ["request_id", "input_length", "output_length", "duration", "hash_ids", "img_ids"],
               "sharegpt": ["id", "conversations"]}
_JSON_VALUE = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(), st.text(max_size=4)),
                           lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=3), c, max_size=2)),
                           max_leaves=6)


@settings(max_examples=160, deadline=None)
@example("bailian", [{"chat_id": 0, "parent_chat_id": 1, "output_length": {"": None}, "timestamp": 19419,
                      "input_length": {"": None}, "hash_ids": 0}])  # (a Rust panic: polars cast the object's fields)
@given(st.sampled_from(list(_JSONL_KEYS)),
       st.lists(st.fixed_dictionaries({k: st.one_of(st.integers(0, 10**6), _JSON_VALUE)
                                       for k in sorted({k for ks in _JSONL_KEYS.values() for k in ks})}), min_size=1, max_size=5))
def test_fuzz_jsonl_importers_any_json_values(fmt: str, rows: list) -> None:
    """JSON lines whose fields hold any JSON value (objects, lists, huge numbers, null): imported with
    every row counted as emitted or quarantined, or refused with a clear error; never a traceback."""
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        src = Path(td) / "t.jsonl"
        src.write_text("".join(json.dumps({k: v for k, v in r.items() if k in _JSONL_KEYS[fmt]}) + "\n" for r in rows))
        try:
            res = import_trace(fmt, src, Path(td) / "o.jsonl")
        except ReplayError:
            return
        assert res.rows_read == len(rows) and res.rows_emitted + res.quarantined == res.rows_read


def test_a_library_panic_is_an_internal_error_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A Rust library's panic (pyo3's PanicException derives from BaseException, not Exception) ends
    the CLI with exit 70 and one line naming it, as any other bug does: it printed a traceback."""
    import replay.cli as cli

    class PanicException(BaseException):  # (pyo3_runtime's name)
        pass

    def app() -> None:
        raise PanicException("assertion failed: values.dtype() == &self.in_dtype")

    monkeypatch.setattr(cli, "app", app)
    monkeypatch.delenv("REPLAY_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 70
    assert "internal error: PanicException: assertion failed" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("block", [1 << 20, 64])
def test_numbers_read_as_numbers_keep_their_text_where_it_matters(block: int, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN token columns that a block may read as integers THEN a row quarantined for its time
    keeps its values as written ('007', not 7); and numbers with a thousands separator or padding, in
    blocks of their own, read as the text parser reads them."""
    import replay.trace.importers as im
    monkeypatch.setattr(im, "CSV_BLOCK_BYTES", block)
    head = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    filler = "8,GPT-4,1,1,2,API log\n" * 8
    src = tmp_path / "b.csv"
    src.write_text(head + "5,ChatGPT,120,30,150,Conversation log\nyesterday,ChatGPT,007,30,37,Conversation log\n" + filler)
    res = import_trace("burstgpt", src, tmp_path / "t.jsonl")
    assert (res.rows_read, res.rows_emitted, res.quarantined) == (10, 9, 1)
    assert res.quarantine_path is not None
    (q,) = [json.loads(x) for x in res.quarantine_path.read_text().splitlines()]
    assert q["line"] == 3 and q["raw"]["Request tokens"] == "007" and q["raw"]["Response tokens"] == "30"
    src.write_text(head + "5,ChatGPT,120,30,150,Conversation log\n" + filler + "8,GPT-4, 44,0,44,API log\n" + filler
                   + '9,ChatGPT,"1,200",30,1230,Conversation log\n')
    res = import_trace("burstgpt", src, tmp_path / "t.jsonl")
    assert (res.rows_read, res.quarantined) == (19, 0)
    assert [r["input_tokens"] for r in iter_requests(tmp_path / "t.jsonl")] == [120, *[1] * 8, 44, *[1] * 8, 1200]


@pytest.mark.parametrize("fmt,rel", [("azure", "traces/azure/AzureLLMInferenceTrace_conv.csv"),
                                     ("burstgpt", "traces/burstgpt/burstgpt1_quoted_head_rows.csv")])
@pytest.mark.parametrize("sep", [";", "\t"])
def test_semicolon_and_tab_separated_files_import_as_the_comma_one(fmt: str, rel: str, sep: str, tmp_path: Path) -> None:
    """A trace re-saved by a spreadsheet in a locale whose decimal mark is a comma (';' between fields,
    '12,5' seconds), or as TSV, gives the requests of the comma-separated file (it was refused: 'missing
    columns TIMESTAMP;ContextTokens;…'); and `auto` tells its format."""
    src = shared(rel)
    with src.open(newline="") as fh:
        rows = list(csv.reader(fh))
    if fmt == "burstgpt":  # (seconds with a fraction, to show the decimal comma read)
        rows = [rows[0]] + [[f"{r[0]}.5", *r[1:]] for r in rows[1:]]
    plain, other = tmp_path / "plain.csv", tmp_path / "other.csv"
    with plain.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    with other.open("w", newline="") as fh:
        csv.writer(fh, delimiter=sep).writerows([r if sep == "\t" or fmt != "burstgpt" or i == 0 else
                                                 [r[0].replace(".", ","), *r[1:]] for i, r in enumerate(rows)])
    a, b = import_trace(fmt, plain, tmp_path / "a.jsonl"), import_trace("auto", other, tmp_path / "b.jsonl")
    assert b.format == fmt and (b.rows_read, b.rows_emitted, b.input_tokens_sum) == (a.rows_read, a.rows_emitted, a.input_tokens_sum)
    assert a.rows_emitted == len(rows) - 1 and b.quarantined == 0
    drop = ("src_ts",)  # (the time as written: "5,5" against "5.5")
    assert [{k: v for k, v in r.items() if k not in drop} for r in iter_requests(tmp_path / "b.jsonl")] == \
        [{k: v for k, v in r.items() if k not in drop} for r in iter_requests(tmp_path / "a.jsonl")]


def test_the_cheap_time_parser_is_shaped_on_a_semicolon_files_first_time(tmp_path: Path) -> None:
    """The first time, which shapes the cheap parser, is read with the file's own separator (with ','
    a ';' file gave none, and its 2024-shaped times all took the full parser)."""
    from replay.trace.importers import _first_value
    p = tmp_path / "t.csv"
    p.write_text("trace;TIMESTAMP;ContextTokens;GeneratedTokens\ncode_1week;2024-05-10 00:00:00.009930+00:00;2162;5\n")
    assert _first_value(p, "TIMESTAMP") == "2024-05-10 00:00:00.009930+00:00"


def test_a_file_whose_zone_changes_is_read_in_each_rows_own_zone(tmp_path: Path) -> None:
    """Times in local time across a change of summer time ('+01:00', then '+02:00'): every row is read in
    its own zone, in order (the cheap parser takes only the first row's zone; the others send the file
    to the full parser, not to a constant offset)."""
    p = tmp_path / "dst.csv"
    p.write_text("trace,TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "conv,2024-03-31 01:59:59.500000+01:00,10,1\n"
                 "conv,2024-03-31 03:00:00.250000+02:00,20,2\n"
                 "conv,2024-03-31 03:00:01+02:00,30,3\n")
    res = import_trace("azure", p, tmp_path / "t.jsonl")
    assert (res.rows_read, res.rows_emitted) == (3, 3)
    assert [r["t_us"] for r in iter_requests(tmp_path / "t.jsonl")] == [0, 750_000, 1_500_000]
    assert read_header(tmp_path / "t.jsonl").time["t0_src_us"] == 1_711_846_799_500_000  # 00:59:59.5 UTC


def test_import_tells_its_progress_through_the_file(tmp_path: Path) -> None:
    """`replay import` draws a progress bar: a CSV import says, block by block, how many of the file's
    bytes it has read, up to all of them; a pass it has to make again (rows out of time order) starts
    again from the beginning under its own name; a JSON lines import, read whole, says so at its end."""
    src = shared("traces/azure/AzureLLMInferenceTrace_conv.csv")
    rows = src.read_text().splitlines()
    big = tmp_path / "big.csv"  # (several blocks' worth, in time order)
    big.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:{i // 60000 % 60:02d}:{i // 1000 % 60:02d}.{i % 1000:03d}0000,{i % 4000 + 1},{i % 300}\n"
        for i in range(300_000)))
    seen: list[tuple[int, int, str]] = []
    import_trace("azure", big, tmp_path / "a.jsonl", progress=lambda d, t, w: seen.append((d, t, w)))
    size = big.stat().st_size
    assert len(seen) > 3 and {w for _, _, w in seen} == {"reading"} and {t for _, t, _ in seen} == {size}
    done = [d for d, _, _ in seen]
    assert done == sorted(done) and done[0] < size and done[-1] == size
    back = tmp_path / "back.csv"  # a row out of time order: read in order first, then sorted
    back.write_text("\n".join([rows[0], rows[2], rows[1], *rows[3:]]) + "\n")
    seen.clear()
    import_trace("azure", back, tmp_path / "b.jsonl", progress=lambda d, t, w: seen.append((d, t, w)))
    assert [w for _, _, w in seen][0] == "reading" and seen[-1][2].startswith("sorting") and seen[-1][0] == seen[-1][1]
    seen.clear()
    import_trace("mooncake", shared("traces/mooncake/conversation_trace.jsonl"), tmp_path / "c.jsonl",
                 progress=lambda d, t, w: seen.append((d, t, w)))
    assert seen and seen[-1][0] == seen[-1][1]
    packed = tmp_path / "big.csv.gz"  # decompressed first: how much of the compressed file is read, then the reading
    packed.write_bytes(gzip.compress(big.read_bytes()))
    seen.clear()
    import_trace("azure", packed, tmp_path / "d.jsonl", progress=lambda d, t, w: seen.append((d, t, w)))
    unpacking = [(d, t) for d, t, w in seen if w == "decompressing"]
    assert len(unpacking) > 3 and unpacking[-1] == (packed.stat().st_size,) * 2
    assert [w for _, _, w in seen][-1] == "reading" and seen[-1][:2] == (size, size)


def test_an_output_path_that_cannot_be_written_is_named_not_an_internal_error(tmp_path: Path) -> None:
    """-o naming a folder is refused before the import runs (it failed at the end, as an internal
    error); a path that cannot be written (a file where a folder must be) is named with why, exit 74."""
    import subprocess
    import sys
    src = str(shared("traces/azure/AzureLLMInferenceTrace_code.csv"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("x")
    cases = [(tmp_path / "folder", 2, "is a folder; name a file to write, such as"),
             (tmp_path / "file" / "t.jsonl", 74, f"{tmp_path / 'file'}: ")]
    for out, code, said in cases:
        r = subprocess.run([sys.executable, "-m", "replay", "import", "azure", src, "-o", str(out)],
                           capture_output=True, text=True, env={"COLUMNS": "300", "PATH": "/usr/bin:/bin"})
        assert r.returncode == code, r.stderr
        assert said in r.stderr and "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert list((tmp_path / "folder").iterdir()) == [] and (tmp_path / "file").read_text() == "x"


def test_an_os_error_is_told_by_the_path_the_user_gave_and_why_in_words() -> None:
    """The target of a rename (not the part file written first), errno in words, and an error whose
    'file name' is a descriptor still makes a line (os.fsdecode of an int raised)."""
    import errno

    from replay.cli import os_error_message
    assert os_error_message(OSError(errno.ENOSPC, "No space left on device", "/x/t.jsonl.part")) == \
        "/x/t.jsonl: no space left on the device"
    assert os_error_message(OSError(errno.EISDIR, "Is a directory", "/o.jsonl.part", None, "/o.jsonl")) == "/o.jsonl: is a folder"
    assert os_error_message(OSError(errno.EBADF, "Bad file descriptor", 3)) == "3: bad file descriptor"


def test_import_command_loads_only_what_it_needs(tmp_path: Path) -> None:
    """`replay import` starts without the modules other commands need (reports, HTTP) and without
    pydantic, which typer 0.29 imports to coerce every parameter (0.19 s more per command here)."""
    src = tmp_path / "t.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    code = ("import runpy, sys\n"
            f"sys.argv = ['replay', 'import', 'azure', {str(src)!r}, '-o', {str(tmp_path / 'o.jsonl')!r}]\n"
            "try:\n    runpy.run_module('replay', run_name='__main__')\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in ('pydantic', 'plotly', 'jinja2', 'httpx') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "o.jsonl").read_text().count("\n") == 2  # (it did import: header and one request)


def test_a_quoted_field_longer_than_a_block_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN quoted fields with line ends in them, several times longer than a block THEN the rows come
    out as a whole-file read gives them (the block grows until the field closes)."""
    import replay.trace.importers as im
    long_note = '"' + "\n".join(f"part {k}, with a comma" for k in range(300)) + '"'
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,note\n" + "".join(
        f"2023-11-16 18:00:{i:02d}.5,{10 + i},1,{long_note if i % 4 == 1 else 'n'}\n" for i in range(20)))
    assert len(long_note) > 5 * 1024
    got = {}
    for size in (1 << 30, 1024):
        monkeypatch.setattr(im, "CSV_BLOCK_BYTES", size)
        import_trace("azure", src, tmp_path / f"{size}.jsonl")
        got[size] = list(iter_requests(tmp_path / f"{size}.jsonl"))
    assert got[1024] == got[1 << 30] and len(got[1024]) == 20
    assert [r["extra"]["note"].count("\n") for r in got[1024]][:3] == [0, 299, 0]


def test_a_quote_that_never_closes_stops_the_import_at_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a CSV with a stray quote on line 3 and many rows after it THEN the import stops with an error
    naming that line once the open field has grown past the bound, without reading the rest of the file
    into one block (it took 15 s and 1.3 GB, then an internal error, on a 139 MB file)."""
    import replay.trace.importers as im
    monkeypatch.setattr(im, "CSV_BLOCK_BYTES", 4096)
    monkeypatch.setattr(im, "CSV_CARRY_BYTES", 64 << 10)
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.5,10,1\n2023-11-16 18:00:01.5,\"11,1\n"
                   + "".join(f"2023-11-16 18:00:{i % 60:02d}.5,{i},1\n" for i in range(20_000)))
    read: list[int] = []
    blocks = im._csv_blocks(src, src, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], ",")
    with pytest.raises(ReplayError, match=r"a\.csv:3: cannot be read as CSV \(a field over 128 KiB, or a quote"):
        for _ in blocks(progress=lambda done, total: read.append(done)):
            pass
    assert read[-1] < 100 << 10 < src.stat().st_size
    with pytest.raises(ReplayError, match=r"a\.csv:3: .*a quote that opens a field and never closes"):
        import_trace("azure", src, tmp_path / "a.jsonl")


def test_a_field_too_long_for_pythons_csv_reader_is_named_by_its_line(tmp_path: Path) -> None:
    """GIVEN a row with a field of 200 KiB (no quote) and a field too many, which the reader refuses,
    among good rows THEN the import's error names its line (finding it with Python's reader, whose
    field limit is 128 KiB, was an internal error)."""
    src = tmp_path / "a.csv"
    src.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.5,10,1\n" + "x" * (200 << 10)
                   + ",1,2,3\n2023-11-16 18:00:01.5,11,1\n")
    with pytest.raises(ReplayError, match=r"a\.csv:3: cannot be read as CSV \(a field over 128 KiB"):
        import_trace("azure", src, tmp_path / "a.jsonl")


def test_sharegpt_array_and_lines(tmp_path: Path) -> None:
    """GIVEN conversations in ShareGPT V3's layout (an indented JSON array), and the same as JSON lines
    WHEN imported (by name, and by 'auto') THEN each conversation's first turn is its prompt, as vLLM's
    benchmark takes it (a system turn too), tokens are unknown, the whole conversation stays in extra,
    and one without a first turn is quarantined with its element's number or its line."""
    src = DATA / "sharegpt_v3_layout.json"
    rows = json.loads(src.read_text())
    res = import_trace("auto", src, tmp_path / "a.jsonl")
    assert res.format == "sharegpt" and (res.rows_read, res.rows_emitted, res.quarantined) == (6, 5, 1)
    got = list(iter_requests(tmp_path / "a.jsonl"))
    want = [r for r in rows if r["conversations"]]
    assert [g["prompt"] for g in got] == [r["conversations"][0]["value"] for r in want]
    assert got[-1]["prompt"] == "You are a helpful assistant."
    assert [g["extra"] for g in got] == want and all(g["t_us"] == 0 for g in got)
    assert all(g["input_tokens"] is None and g["output_tokens"] is None and g["output_kind"] == "unknown" for g in got)
    q = [json.loads(ln) for ln in (tmp_path / "a.jsonl.quarantine.jsonl").read_text().splitlines()]
    assert [(e["line"], e["raw"]["id"]) for e in q] == [(5, "empty_0")]
    lines = tmp_path / "sg.jsonl"
    lines.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    res = import_trace("auto", lines, tmp_path / "b.jsonl")
    assert res.format == "sharegpt" and list(iter_requests(tmp_path / "b.jsonl")) == got
    assert read_header(tmp_path / "b.jsonl").source["format"] == "sharegpt"


@pytest.mark.parametrize("text,match", [
    ("[1, 2]", "cannot be read as a JSON array of conversations"),
    ('[{"id": "a", "conversations": "hi"}]', "'conversations' is not a list of turns with a 'value'"),
    ('[{"id": "a", "turns": []}]', "missing column"),
])
def test_sharegpt_refuses_what_is_not_conversations(tmp_path: Path, text: str, match: str) -> None:
    src = tmp_path / "s.json"
    src.write_text(text)
    with pytest.raises(ReplayError, match=match):
        import_trace("sharegpt", src, tmp_path / "o.jsonl")


def test_auto_names_sharegpt_for_an_array_it_cannot_tell(tmp_path: Path) -> None:
    src = tmp_path / "s.json"
    src.write_text('[{"prompt": "hi"}]')
    with pytest.raises(ReplayError, match="a JSON array, not JSON lines or CSV; .*replay import sharegpt"):
        import_trace("auto", src, tmp_path / "o.jsonl")


_TURN = st.one_of(st.fixed_dictionaries({"from": _JSON_VALUE, "value": _JSON_VALUE}), _JSON_VALUE)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.fixed_dictionaries({"id": _JSON_VALUE, "conversations": st.one_of(st.lists(_TURN, max_size=3), _JSON_VALUE)}),
                          _JSON_VALUE), min_size=1, max_size=5), st.booleans())
def test_fuzz_sharegpt_any_conversations(rows: list, as_lines: bool) -> None:
    """ShareGPT arrays and lines whose turns hold any JSON value: imported with every conversation
    emitted or quarantined, or refused with a clear error; never a traceback."""
    import tempfile
    with tempfile.TemporaryDirectory() as td:
        src = Path(td) / "s.json"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows) if as_lines else json.dumps(rows))
        try:
            res = import_trace("sharegpt", src, Path(td) / "o.jsonl")
        except ReplayError:
            return
        assert res.rows_read == len(rows) and res.rows_emitted + res.quarantined == res.rows_read
