"""Input files as given: text with a byte-order mark reads as plain UTF-8, whatever the read size."""

from __future__ import annotations

import io

from hypothesis import assume, given, settings
from hypothesis import strategies as st

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
