"""Text from the evidence cannot act in the reports: plotly reads a figure's text as markup (a
``<span style=...url(...)>`` in a DCGM host name or a folder name made the page fetch that URL, a
``<b>`` in a request id was bold), and Markdown reads backticks, brackets and raw HTML (a file name
with backticks closed the draft's code span and put an ``<img onerror=...>`` in it).

``hostile_bundles`` records evidence that carries such payloads (a DCGM export, a vLLM log whose
file name, model and request id carry them) and writes a replay beside it whose folder name,
request ids, sources and notes carry them too; tests/integration/test_report_leaks.py loads the
reports it gives in headless Chromium with a listener behind the URLs."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from replay.bundle import BundleMeta, BundleWriter
from replay.record.recorder import RecordOptions, record
from replay.report.escape import md_code, md_item, md_text, plotly_text
from replay.report.html import write_report
from replay.report.postmortem import render_postmortem
from tests.unit.report_helpers import page_specs

BOLD_ID = "cmpl-<b>bold</b>-0"  # (no space: a request id as a vLLM log line carries it)
S = 1_000_000
GIB = 2**30


def css_url(port: int, tag: str) -> str:
    """``http://127.0.0.1:PORT/TAG`` as CSS reads it, with no '/' (a file or folder name cannot hold one)."""
    return f"http:\\00002f\\00002f127.0.0.1:{port}\\00002f{tag}"


def span(port: int, tag: str, text: str = "x", close: bool = True) -> str:
    """Markup that makes a page which renders it as HTML fetch ``/TAG`` from the listener at ``port``."""
    return f'<span style="background-image:url({css_url(port, tag)})">{text}' + ("</span>" if close else "")


def md_payload(port: int, tag: str) -> str:
    """Markdown and HTML that fetch ``/TAG`` when the draft is rendered, and a backtick run to end a code span."""
    return f"``` ![i](http://127.0.0.1:{port}/{tag}) <img src=http://127.0.0.1:{port}/{tag}-img onerror=alert(1)> [l](x) *e* _u_ |"


def hostile_bundles(root: Path, port: int) -> tuple[Path, Path]:
    """(production, replay): production recorded from a DCGM query_range export of two hosts (one host
    name a payload) and a vLLM 0.7.2 log whose file name, model and request id carry payloads; the
    replay of its trace written with BundleWriter in a folder whose name is a payload, with payloads
    in its request ids, event sources, inputs and notes."""
    root.mkdir(parents=True, exist_ok=True)
    labels = {"gpu": "0", "UUID": "GPU-11111111-2222-3333-4444-555555555555", "device": "nvidia0",
              "modelName": "NVIDIA H100 80GB HBM3", "instance": "dcgm:9400", "job": "dcgm"}
    series: list[dict[str, Any]] = [
        {"metric": {**labels, "Hostname": host, "__name__": "DCGM_FI_DEV_FB_USED"},
         "values": [[1_739_362_800 + 15 * k, str(used + 100 * k)] for k in range(8)]}
        for host, used in ((span(port, "dcgm-host", "node-1"), 60_000), ("node-2 <b>bold host</b>", 30_000))]
    dcgm = root / "dcgm.json"
    dcgm.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": series}}))
    # a file name holds no '/': the span is left open, and the backticks end a code span around it
    log = root / f"vllm`` <img src=x onerror=alert(1)> {span(port, 'file-name', close=False)}.log"
    model = span(port, "model").replace("\\", "\\\\")  # (as Python's repr in the args line writes it)
    log.write_text("INFO 02-12 12:20:00 api_server.py:712] vLLM API server version 0.7.2\n"
                   f"INFO 02-12 12:20:00 api_server.py:713] args: Namespace(model='{model}', gpu_memory_utilization=0.9)\n"
                   f"INFO 02-12 12:20:21 async_llm_engine.py:211] Added request {BOLD_ID}.\n"
                   "ERROR 02-12 12:20:21 async_llm_engine.py:68] Engine background task failed\n")
    prod = root / "prod"
    record([dcgm, log], prod, RecordOptions(year=2025))

    rep = root / f"run {span(port, 'compare-folder', close=False)}"
    note = f"a note {span(port, 'note')} {md_payload(port, 'md-note')}"
    source = f"server {span(port, 'event-source')} {md_payload(port, 'md-source')}.log:3"
    meta = BundleMeta(kind="replay", t0_utc="2025-06-01T08:00:00Z", vllm_version="0.8.5", engine="v1",
                      model=span(port, "replay-model"), notes=[note],
                      inputs=[{"path": f"in {span(port, 'input-path')} {md_payload(port, 'md-input')}", "kind": "vllm-log",
                               "sha256": "0" * 64, "notes": [note]}],
                      extra={"device": "cpu", "outcome": "capacity_guard", "capacity_bytes": 4 * GIB,
                             "trace": {"bundle_sha256": "0" * 64, "window_us": [0, 30 * S],
                                       "production_t0_utc": "2025-02-12T12:20:00Z"}})
    w = BundleWriter(rep, meta)
    w.event({"t_us": 2 * S, "kind": "engine_start", "marker": f"Initializing {span(port, 'marker')}", "source": source})
    w.event({"t_us": 5 * S, "kind": "engine_ready", "source": "replay", "rss_bytes": 2 * GIB, "device": "cpu"})
    for i in range(60):
        w.sample(int((5 + i * 0.5) * S), None, "process", "process_rss_bytes", 2 * GIB + i * 50 * 2**20)
    ids = [BOLD_ID, f"r {span(port, 'request-id')}", f"r2 {md_payload(port, 'md-request')}"]
    for k, rid in enumerate(ids):
        t = (10 + 3 * k) * S
        w.request({"id": rid, "arrival_us": t, "sent_us": t, "finish_us": t + S, "input_tokens": 500,
                   "status": "ok", "source": source})
    w.event({"t_us": 30 * S, "kind": "emulated_oom", "source": source, "label": f"EMULATED OOM {span(port, 'label')}"})
    w.close()
    return prod, rep


def figure_specs(html: str) -> list[dict[str, Any]]:
    """The plotly figures a report page holds, as it hands them to Plotly.newPlot."""
    return page_specs(html)


def _strings(obj: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(obj, str):
        return [(path, obj)]
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _strings(v, f"{path}.{k}")]
    if isinstance(obj, list):
        return [x for v in obj for x in _strings(v, path)]
    return []


def test_plotly_text_shows_as_itself() -> None:
    assert plotly_text('<span style="x">a</span> & &lt;') == '&lt;span style="x"&gt;a&lt;/span&gt; &amp; &amp;lt;'
    assert plotly_text(3) == "3"


def test_markdown_escapes() -> None:
    assert md_text("vllm_serve.log") == "vllm_serve.log"  # (a '_' inside a word opens nothing)
    assert md_text("_u_ *e* `c` [l](x) a|b <i> &amp; \\") == "\\_u\\_ \\*e\\* \\`c\\` \\[l\\](x) a\\|b &lt;i&gt; &amp;amp; \\\\"
    assert md_text("line\nbreak\r# not a heading") == "line break # not a heading"
    assert md_text("0.7.2 --host") == "0.7.2 --host"  # (inside a line: no block to open)
    assert md_item("# h") == "\\# h" and md_item("1. x") == "1\\. x" and md_item("- x") == "\\- x"
    assert md_code("a`b") == "``a`b``" and md_code("``x") == "``` ``x ```" and md_code("p\nq") == "`p q`"
    assert md_code("<img src=x>") == "`<img src=x>`"


def test_figures_and_page_carry_no_markup_from_the_evidence(tmp_path: Path) -> None:
    """Both ways round (production with its replay, the replay with production): every text of every
    figure is escaped, the only markup of a hovertemplate is plotly's <extra>, and outside the figures
    the page holds the payloads as text only."""
    prod, rep = hostile_bundles(tmp_path, 9)
    for main, other in ((prod, rep), (rep, prod)):
        out = tmp_path / f"{main.name[:3]}.html"
        write_report(main, [other], out)
        html = out.read_text()
        specs = figure_specs(html)
        assert len(specs) == html.count('id="fig-') >= 2
        texts = [x for spec in specs for x in _strings({"data": spec["data"], "layout": spec["layout"]})
                 if ".template." not in x[0]]
        raw = [(p, t) for p, t in texts if not p.endswith(".hovertemplate") and re.search(r"[<>]", t)]
        assert raw == []
        for p, t in texts:
            if p.endswith(".hovertemplate"):
                assert set(re.findall(r"<[^>]*>", t)) <= {"<extra>", "</extra>"}, t
                assert "span" not in t and "127.0.0.1" not in t, t
        shown = " ".join(t for _, t in texts)
        assert "&lt;b&gt;bold&lt;/b&gt;" in shown and "background-image" in shown  # (there, as text)
        for payload in ('<span style="background-image', "<b>bold", "<img src=x"):
            assert payload not in html


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_postmortem_markdown_renders_no_markup_from_the_evidence(tmp_path: Path) -> None:
    """The draft, rendered as Markdown with raw HTML allowed (as GitHub or a wiki would, before their
    own sanitising), holds only the draft's own structure: no <img>, no <span>, no link but the
    report's, no emphasis or code span that the evidence opened; the payloads read as text."""
    markdown_it = pytest.importorskip("markdown_it")
    prod, rep = hostile_bundles(tmp_path, 9)
    md_parser = markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    link = "report (1).html"
    drafts = ((render_postmortem(prod, link, [rep]), ("vllm`` <img src=x onerror=alert(1)>", "cmpl-<b>bold</b>-0",
                                                     "![i](http://127.0.0.1:9/md-request)")),
              (render_postmortem(rep, None), ("![i](http://127.0.0.1:9/md-note) <img src=http://127.0.0.1:9/md-note-img",)))
    for md, shown in drafts:
        assert "127.0.0.1" in md  # (the payloads are in the draft)
        p = _Tags()
        p.feed(md_parser.render(md))
        tags = {t for t, _ in p.tags}
        assert tags <= {"h1", "h2", "p", "ul", "ol", "li", "strong", "code", "table", "thead", "tbody", "tr", "th",
                        "td", "a"}, tags
        assert [a.get("href") for t, a in p.tags if t == "a"] in ([], ["report%20(1).html"])
        text = "".join(p.text)
        for literal in ('<span style="background-image', "[l](x) *e* _u_ |", *shown):
            assert literal in text, literal
    pm = render_postmortem(prod, None)
    inputs = [ln for ln in pm.splitlines() if "<img src=x onerror" in ln and ln.startswith("- ")]
    assert inputs and re.match(r"- ```/\S+/vllm`` <img src=x onerror=alert\(1\)> <span .*x\.log``` \(vllm-log\)", inputs[0])
    # (the file name in a code span fenced by one backtick more than the run it holds)


def test_a_file_name_that_is_not_utf8_is_written_escaped(tmp_path: Path) -> None:
    """A log whose file name is not UTF-8 (a byte 0xff) reaches the report and the postmortem as a
    surrogate: both are written, the name escaped (it was an internal error and a 0-byte file)."""
    import os
    import shutil

    from replay.record.recorder import RecordOptions, record
    from replay.report.html import write_report
    from replay.report.postmortem import write_postmortem
    from tests.conftest import DATA
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/v\xff.log"))
    shutil.copyfile(DATA / "v017_v1_stats_kv_ramp.log", odd)
    record([odd], tmp_path / "b", RecordOptions(year=2025))
    assert write_report(tmp_path / "b", [], tmp_path / "r.html") > 0
    write_postmortem(tmp_path / "b", tmp_path / "pm.md", None)
    assert "\\udcff" in (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "\\udcff" in (tmp_path / "pm.md").read_text(encoding="utf-8")
