"""Input files as given: text with a byte-order mark reads as plain UTF-8, whatever the read size; a pipe is
refused by name."""

from __future__ import annotations

import io
import os
import threading
from contextlib import suppress
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from replay.errors import ReplayError
from replay.filehash import text_bom, utf8_chunks

_MARKED = {"utf-8-sig": b"", "utf-16": b"", "utf-32": b"", "utf-16-be": b"\xfe\xff", "utf-32-be": b"\x00\x00\xfe\xff"}


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_categories=["Cs"]), max_size=300), st.sampled_from(sorted(_MARKED)),
       st.integers(1, 64))
def test_marked_text_reads_as_its_utf8(text: str, encoding: str, size: int) -> None:
    """Any text (astral characters across read boundaries included) in any marked encoding, read in
    chunks of any size, is its UTF-8 bytes without the mark."""
    assume(not (encoding == "utf-16" and text.startswith("\x00")))  # FF FE 00 00 is UTF-32's mark (the usual rule)
    data = _MARKED[encoding] + text.encode(encoding)
    assert text_bom(data) is not None
    assert b"".join(utf8_chunks(io.BytesIO(data), size)) == text.encode("utf-8")


@given(st.binary(max_size=200), st.integers(1, 64))
def test_unmarked_bytes_pass_through_unchanged(data: bytes, size: int) -> None:
    if text_bom(data) is None:
        assert b"".join(utf8_chunks(io.BytesIO(data), size)) == data


def test_damaged_utf16_reads_with_replacement_characters() -> None:
    data = "ab".encode("utf-16") + b"\x00\xd8" + "c".encode("utf-16-le") + b"x"  # a lone surrogate, an odd byte
    out = b"".join(utf8_chunks(io.BytesIO(data), 3)).decode("utf-8")
    assert out.startswith("ab") and "c" in out and "\ufffd" in out


def _reads(what: str, src: Path, tmp_path: Path) -> object:
    from replay.record.recorder import RecordOptions, record
    from replay.trace.format import read_header
    from replay.trace.importers import import_trace
    if what == "import":
        return import_trace("azure", src, tmp_path / "t.jsonl")
    if what == "record":
        return record([src], tmp_path / "b", RecordOptions(year=2025))
    return read_header(src)


@pytest.mark.parametrize("what", ["import", "record", "trace"])
def test_a_pipe_is_refused_by_name_not_taken_for_empty(what: str, tmp_path: Path) -> None:
    """GIVEN a pipe with data waiting in it (as /dev/stdin or a shell's <(…) give) THEN the importer,
    the recorder and the trace reader refuse it by name, unread, and say what to do (it was read
    more than once: the second read found nothing, and the recorder wrote an 'empty' log)."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    data = Path(__file__).parents[1] / "data" / "v017_v1_stats_kv_ramp.log"

    def feed() -> None:  # (blocks until a reader opens the pipe)
        with suppress(OSError), pipe.open("wb") as w:
            w.write(data.read_bytes()[:4096])

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        with pytest.raises(ReplayError) as e:
            _reads(what, pipe, tmp_path)
        assert e.value.message.startswith(f"{pipe}: a pipe or device, not a file: save what it gives to a file")
    finally:  # (let the feeder go)
        fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
        feeder.join(5)
        os.close(fd)
    assert not (tmp_path / "t.jsonl").exists() and not (tmp_path / "b" / "bundle.json").exists()
