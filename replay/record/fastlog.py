"""The vectorised fast lane for the high-volume lines of a vLLM log.

A day of production log is gigabytes, nearly all of it three line shapes: the periodic stats line,
request added/received/finished lines, and HTTP access lines. Parsing those one by one in Python made
ingestion the slow step of a postmortem, and holding their facts as Python objects made memory grow
with the file. This module reads a log in bounded pieces, recognises those shapes with polars string
expressions, and spills their facts as columnar files. A line takes the fast lane only when it is
clean (no colour codes, no glued second message) and the next line opens a new message, so nothing
could attach to it; every other line (startup accounting, OOM messages, tracebacks, wrapped or
unusually prefixed lines) goes, in file order, to ``vllm_log.LogParser``, which remains the
reference for what a line means. Tests check that both routes give the same facts.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from replay.errors import ReplayError
from replay.record.vllm_log import LogParse, LogParser, split_line

_PROC = r"\((?P<proc>[A-Za-z_][\w-]*(?: [\w=.:,-]+)*? pid=\d+(?:, ip=[\d.]+)?)\) *"
_NUM = r"[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?|[0-9]+(?:\.[0-9]+)?"
FAST = (r"^(?:" + _PROC + r")?INFO (?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)?\s+"
        r"\[(?P<fl>[\w./-]+\.py:\d+)\] ?(?P<msg>.*)$")
ACCESS = r'^(?:' + _PROC + r')?(?:INFO|WARNING|ERROR):\s+[\d.:]+ - "[A-Z]+ [^"\s]* HTTP/[\d.]+" \d+(?: [A-Za-z ]*)?$'
OPENS = (r'^(?:' + _PROC + r'|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s'
         r'|(?:INFO|WARNING|ERROR):\s+[\d.:]+ - ")')
STATS_V0 = (r"Running: (?P<running>\d+) reqs, Swapped: (?P<swapped>\d+) reqs, Pending: (?P<waiting>\d+) reqs, "
            r"GPU KV cache usage: (?P<kv>" + _NUM + r")%, CPU KV cache usage: (?P<cpu_kv>" + _NUM + ")%")
STATS_V1 = (r"Running: (?P<running>\d+) reqs, Waiting: (?P<waiting>\d+) reqs(?:, Preemptions: (?P<pre>\d+))?.*?"
            r"(?:GPU|CPU|XPU|\w+) KV cache usage: (?P<kv>" + _NUM + ")%")
THROUGHPUT = r"Avg prompt throughput: (?P<ptps>" + _NUM + r") tokens/s, Avg generation throughput: (?P<gtps>" + _NUM + ")"
REQUEST = r"^(?P<verb>Added|Finished) request (?P<rid>\S+?)\.?$"
RECEIVED = r"^Received request (?P<rid>\S+?):"
# words that make a line mean more than its shape: such lines take the reference parser
_TRIGGERS = r"(?i)memory|kv cache (?:size|memory)|engine|version|blocks:|took|preempt|non-default args|maximum concurrency"
# a second message glued onto the line (copy-paste): the reference parser splits those
_GLUED = r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d"

CHUNK_BYTES = 16 << 20

STATS_SCHEMA = {"line": pl.Int64, "rank": pl.Utf8, "ts": pl.Utf8, "engine": pl.Utf8, "running": pl.Float64,
                "waiting": pl.Float64, "swapped": pl.Float64, "preemptions": pl.Float64,
                "kv_usage_pct": pl.Float64, "cpu_kv_usage_pct": pl.Float64, "prompt_tps": pl.Float64,
                "gen_tps": pl.Float64}
REQUEST_SCHEMA = {"line": pl.Int64, "rank": pl.Utf8, "ts": pl.Utf8, "kind": pl.Utf8, "request_id": pl.Utf8}


@dataclass
class FastFacts:
    """Columnar facts of the fast lane, spilled to Arrow IPC files (one per piece of the log)."""

    stats: list[Path] = field(default_factory=list)
    requests: list[Path] = field(default_factory=list)
    lines: int = 0
    duplicates: int = 0

    def stats_frame(self) -> pl.LazyFrame:
        return pl.scan_ipc(self.stats) if self.stats else pl.LazyFrame(schema=STATS_SCHEMA)

    def requests_frame(self) -> pl.LazyFrame:
        return pl.scan_ipc(self.requests) if self.requests else pl.LazyFrame(schema=REQUEST_SCHEMA)


def _pieces(path: Path, chunk_bytes: int) -> Iterator[str]:
    """The file's text in pieces that end at a line end (decompressing gzip as it goes)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:  # type: ignore[operator]
            rest = b""
            while True:
                chunk = fh.read(chunk_bytes)
                if not chunk:
                    if rest:
                        yield rest.decode("utf-8", errors="replace")
                    return
                buf = rest + chunk
                cut = buf.rfind(b"\n") + 1
                if cut == 0:
                    rest = buf
                    continue
                rest = buf[cut:]
                yield buf[:cut].decode("utf-8", errors="replace")
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ReplayError(f"{path}: damaged or truncated gzip ({e})") from None


def _num(col: pl.Expr) -> pl.Expr:
    return col.str.replace_all(",", "", literal=True).cast(pl.Float64, strict=False)


def _classify(lines: pl.Series, first_no: int) -> pl.DataFrame:
    """One row per physical line: its number, and for fast-lane lines their kind and fields."""
    df = pl.DataFrame({"raw": lines}).with_row_index("i").with_columns(
        line=pl.col("i").cast(pl.Int64) + first_no,
        raw=pl.col("raw").str.strip_suffix("\r"),
    )
    opens_next = pl.col("raw").shift(-1).str.contains(OPENS).fill_null(False)
    clean = ~pl.col("raw").str.contains("\x1b", literal=True) & opens_next
    df = df.with_columns(clean.alias("clean"))
    parts = pl.col("raw").str.extract_groups(FAST)
    df = df.with_columns(
        p=pl.when(pl.col("clean")).then(parts),
        access=pl.col("clean") & pl.col("raw").str.contains(ACCESS),
    ).unnest("p")
    msg = pl.col("msg")
    is_stats = msg.str.contains("KV cache usage", literal=True) & msg.str.contains("reqs", literal=True)
    df = df.with_columns(
        v0=pl.when(is_stats).then(msg.str.extract_groups(STATS_V0)),
        v1=pl.when(is_stats).then(msg.str.extract_groups(STATS_V1)),
        tp=pl.when(is_stats).then(msg.str.extract_groups(THROUGHPUT)),
        req=msg.str.extract_groups(REQUEST),
        rec=msg.str.extract(RECEIVED, 1),
        trig=msg.str.contains(_TRIGGERS),
        glued=msg.str.contains(_GLUED).fill_null(False),
    )
    v0_ok = pl.col("v0").struct.field("kv").is_not_null()
    v1_ok = pl.col("v1").struct.field("kv").is_not_null()
    req_ok = pl.col("req").struct.field("rid").is_not_null()
    kind = (pl.when(pl.col("glued")).then(pl.lit(None, dtype=pl.Utf8))
            .when(is_stats & v0_ok).then(pl.lit("stats_v0"))
            .when(is_stats & v1_ok).then(pl.lit("stats_v1"))
            .when(req_ok).then(pl.lit("request_") + pl.col("req").struct.field("verb").str.to_lowercase())
            .when(pl.col("rec").is_not_null() & ~pl.col("trig")).then(pl.lit("request_received"))
            .when(pl.col("access")).then(pl.lit("access")))
    return df.with_columns(kind=kind)


def _representatives(fast: pl.DataFrame) -> list[tuple[str, int]]:
    """One real line per (process kind, call site, shape) with its count, for version inference."""
    key = [pl.col("proc").str.replace_all(r"\d+", "0").fill_null(""), pl.col("fl").fill_null(""), pl.col("kind"),
           pl.col("msg").str.slice(0, 7).fill_null("")]
    g = fast.group_by(key).agg(pl.col("raw").first(), pl.len().alias("n"))
    return [(str(r), int(n)) for r, n in g.select("raw", "n").iter_rows()]


def parse_log_file(path: Path, spill: Path, chunk_bytes: int | None = None) -> tuple[LogParse, FastFacts]:
    """Parse a vLLM log file in bounded pieces. Stats and request facts of both lanes end up in the
    returned FastFacts (columnar, on disk under ``spill``), every other fact and the file's counts,
    version and engine in the LogParse."""
    spill.mkdir(parents=True, exist_ok=True)
    parser = LogParser(defer_repeats=True)
    ff = FastFacts()
    first_no = 1
    prev_fast = False
    for k, text in enumerate(_pieces(path, chunk_bytes or CHUNK_BYTES)):
        lines = pl.Series("raw", [text]).str.split("\n").explode()
        if text.endswith("\n"):
            lines = lines.slice(0, len(lines) - 1)
        n = len(lines)
        if n == 0:
            continue
        df = _classify(lines, first_no)
        is_fast = df["kind"].is_not_null()
        # the line-by-line parser gets every other line, in order, with a barrier after fast ones
        prev = is_fast.shift(1).fill_null(prev_fast)
        slow = df.select("line", "raw").with_columns(prev=prev).filter(~is_fast)
        for no, raw, after_fast in slow.iter_rows():
            if after_fast:
                parser.barrier()
            parser.feed(int(no), str(raw))
        prev_fast = bool(is_fast[-1])
        if prev_fast:
            parser.barrier()
        fast = df.filter(is_fast)
        if fast.height:
            ff.lines += fast.height
            parser.res.lines_parsed += fast.height
            parser.res.lines_read = max(parser.res.lines_read, first_no + n - 1)
            for raw, weight in _representatives(fast):
                for ln in split_line(0, raw):
                    parser.observe(ln, weight)
            _spill_fast(fast, f"{k:06d}", spill, ff)
        first_no += n
    res = parser.finish()
    _spill_slow(res, spill, ff)
    _drop_repeats(ff, spill, res)
    return res, ff


_KEY = pl.struct("rank", "key_ts", "kind", "msg").hash(seed=7)


def _spill_fast(fast: pl.DataFrame, tag: str, spill: Path, ff: FastFacts) -> None:
    """Write this piece's stats and request facts (with the hash of their repeat key)."""
    fast = fast.with_columns(
        rank=pl.col("proc").fill_null("main"),
        ts=pl.concat_str(["md", "hms"], separator=" "),
    ).filter(pl.col("kind") != "access").with_columns(
        key_ts=pl.col("ts"), repeatable=pl.lit(True),
        kind=pl.when(pl.col("kind").str.starts_with("stats")).then(pl.lit("stats")).otherwise(pl.col("kind")),
        engine=pl.when(pl.col("kind") == "stats_v0").then(pl.lit("v0")).when(pl.col("kind") == "stats_v1").then(pl.lit("v1")),
    ).with_columns(h=_KEY)
    if fast.height == 0:
        return
    st = fast.filter(pl.col("kind") == "stats")
    if st.height:
        v0 = pl.col("engine") == "v0"
        out = st.select(
            "line", "rank", "ts", "engine", "h", "repeatable",
            running=pl.when(v0).then(pl.col("v0").struct.field("running")).otherwise(pl.col("v1").struct.field("running")).cast(pl.Float64),
            waiting=pl.when(v0).then(pl.col("v0").struct.field("waiting")).otherwise(pl.col("v1").struct.field("waiting")).cast(pl.Float64),
            swapped=pl.when(v0).then(pl.col("v0").struct.field("swapped").cast(pl.Float64)),
            preemptions=pl.when(~v0).then(pl.col("v1").struct.field("pre").cast(pl.Float64)),
            kv_usage_pct=_num(pl.when(v0).then(pl.col("v0").struct.field("kv")).otherwise(pl.col("v1").struct.field("kv"))),
            cpu_kv_usage_pct=_num(pl.when(v0).then(pl.col("v0").struct.field("cpu_kv"))),
            prompt_tps=_num(pl.col("tp").struct.field("ptps")),
            gen_tps=_num(pl.col("tp").struct.field("gtps")),
        )
        f = spill / f"stats.{tag}.arrow"
        out.write_ipc(f)
        ff.stats.append(f)
    rq = fast.filter(pl.col("kind").str.starts_with("request_"))
    if rq.height:
        out = rq.select("line", "rank", "ts", "kind", "h", "repeatable",
                        request_id=pl.coalesce(pl.col("req").struct.field("rid"), pl.col("rec")))
        f = spill / f"requests.{tag}.arrow"
        out.write_ipc(f)
        ff.requests.append(f)


def _spill_slow(res: LogParse, spill: Path, ff: FastFacts) -> None:
    """Move the reference parser's stats and request facts into the same columnar files."""
    st = [f for f in res.facts if f.kind == "stats"]
    rq = [f for f in res.facts if f.kind.startswith("request_")]
    res.facts = [f for f in res.facts if f.kind != "stats" and not f.kind.startswith("request_")]
    base = {"line": [f.line for f in st], "rank": [f.rank for f in st], "ts": [f.ts for f in st],
            "key_ts": [f.key_ts for f in st], "kind": ["stats"] * len(st), "msg": [f.text for f in st],
            "repeatable": [f.logged_ts for f in st]}
    if st:
        cols = {k: [f.data.get(k) for f in st] for k in ("engine", "running", "waiting", "swapped", "preemptions",
                                                          "kv_usage_pct", "cpu_kv_usage_pct", "prompt_tps", "gen_tps")}
        df = pl.DataFrame({**base, **cols}, schema_overrides={k: v for k, v in STATS_SCHEMA.items() if k in cols})
        df = df.with_columns(h=_KEY).select("line", "rank", "ts", "engine", "h", "repeatable", *list(cols)[1:])
        f = spill / "stats.slow.arrow"
        df.write_ipc(f)
        ff.stats.append(f)
    if rq:
        df = pl.DataFrame({"line": [f.line for f in rq], "rank": [f.rank for f in rq], "ts": [f.ts for f in rq],
                           "key_ts": [f.key_ts for f in rq], "kind": [f.kind for f in rq], "msg": [f.text for f in rq],
                           "request_id": [f.data["request_id"] for f in rq]})
        df = df.with_columns(h=_KEY, repeatable=pl.lit(True)).select("line", "rank", "ts", "kind", "h", "repeatable", "request_id")
        f = spill / "requests.slow.arrow"
        df.write_ipc(f)
        ff.requests.append(f)


def _drop_repeats(ff: FastFacts, spill: Path, res: LogParse) -> None:
    """A line repeated identically within a rank (overlapping pastes) is one fact: keep the first.
    Only (line, key hash) pairs are held in memory for this, never the facts themselves."""
    for name in ("stats", "requests"):
        files: list[Path] = getattr(ff, name)
        if not files:
            continue
        keys = pl.scan_ipc(files).filter("repeatable").select("line", "h").collect().sort("line", maintain_order=True)
        drop = keys.filter(~pl.col("h").is_first_distinct())
        res.duplicates += drop.height
        out = spill / f"{name}.arrow"
        lf = pl.scan_ipc(files).join(drop.lazy(), on=["line", "h"], how="anti", maintain_order="left")
        lf = lf.sort("line", maintain_order=True).drop("h", "repeatable")
        tmp = spill / f"{name}.tmp.arrow"
        lf.sink_ipc(tmp)
        for f in files:
            f.unlink()
        tmp.replace(out)
        setattr(ff, name, [out])
