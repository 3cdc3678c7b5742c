"""The report, loaded in a real headless Chromium, fetches nothing the evidence names and shows the
evidence's text as text: a listener on 127.0.0.1 stands behind every URL the hostile bundles of
tests/unit/test_report_safety.py carry (a DCGM host name, a compare bundle's folder name, a request
id, a file name, a model name, a note), and every trace of every figure is hovered, so hover text
is drawn too."""

from __future__ import annotations

import html
import http.server
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from replay.report.html import write_report
from tests.unit.test_report_safety import BOLD_ID, hostile_bundles

pytestmark = pytest.mark.integration

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=30000", "--dump-dom"]

# After the figures are drawn: hover the first, middle and last point of every trace of every figure,
# one at a time (plotly draws one hover per 50 ms), and keep each hover label's markup in
# body[data-hovers].
HOVER_ALL = """<script>
(function(){
 var b=document.body,out=[],todo=[];
 function next(){
  if(!todo.length){b.dataset.hovers=JSON.stringify(out);b.dataset.hovered="1";return;}
  var h=todo.shift();
  try{Plotly.Fx.hover(h[0],[{curveNumber:h[1],pointNumber:h[2]}],h[3]);}catch(e){out.push("ERROR "+e);}
  setTimeout(function(){var l=h[0].querySelector(".hoverlayer");out.push(l?l.innerHTML:"");next();},80);
 }
 function start(){
  if(b.dataset.figuresRendered!==b.dataset.figuresExpected){setTimeout(start,50);return;}
  document.querySelectorAll(".js-plotly-plot").forEach(function(gd){
   gd._fullData.forEach(function(tr,i){
    var n=(gd.calcdata[i]||[]).length,sp=(tr.xaxis||"x")+(tr.yaxis||"y");
    [0,Math.floor(n/2),n-1].filter(function(p,k,a){return p>=0&&a.indexOf(p)===k;})
     .forEach(function(p){todo.push([gd,i,p,sp]);});
   });
  });
  next();
 }
 start();
})();
</script>
</body>"""


@pytest.fixture
def listener() -> Iterator[tuple[int, list[str]]]:
    """A local HTTP server on 127.0.0.1 that records every path asked of it."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            hits.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield srv.server_address[1], hits
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(timeout=10)


class _Svg(HTMLParser):
    """The text of the SVG <text> elements of a page, the bold tspans among them, and the elements
    styled with a URL."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.texts: list[str] = []
        self.bold = 0
        self.url_styled: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "text":
            self.depth += 1
            self.texts.append("")
        style = dict(attrs).get("style") or ""
        if tag == "tspan" and "bold" in style:
            self.bold += 1
        if "url(" in style:
            self.url_styled.append(style)

    def handle_endtag(self, tag: str) -> None:
        if tag == "text" and self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.texts[-1] += data


def _svg(markup: str) -> _Svg:
    p = _Svg()
    p.feed(markup)
    return p


def test_the_report_fetches_nothing_the_evidence_names(tmp_path: Path, listener: tuple[int, list[str]]) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("chromium not installed (.ci/run installs Debian's chromium)")
    port, hits = listener
    prod, rep = hostile_bundles(tmp_path / "ev", port)
    for n, (main, other) in enumerate(((prod, rep), (rep, prod))):
        page = tmp_path / f"report{n}.html"
        write_report(main, [other], page)
        probe = tmp_path / f"hovered{n}.html"
        probe.write_text(page.read_text().replace("</body>", HOVER_ALL, 1))
        r = subprocess.run([chromium, *FLAGS, f"--user-data-dir={tmp_path / f'u{n}'}", probe.as_uri()],
                           capture_output=True, text=True, timeout=180)
        assert hits == [], f"{main.name}: the page fetched {sorted(set(hits))}"
        body = next(ln for ln in r.stdout.splitlines() if "<body" in ln)
        assert 'data-errors="0"' in body and 'data-hovered="1"' in body, body[:300]
        expected = int(body.split('data-figures-expected="')[1].split('"')[0])
        assert expected >= 2 and f'data-figures-rendered="{expected}"' in body
        attr = re.search(r'data-hovers="([^"]*)"', body)
        assert attr is not None
        hovers = json.loads(html.unescape(attr.group(1)))
        assert hovers and not [h for h in hovers if h.startswith("ERROR")]
        drawn = _svg(r.stdout)
        hovered = _svg("".join(hovers))
        shown = " ".join(drawn.texts + hovered.texts)
        assert drawn.bold == hovered.bold == 0  # (a <b> in the evidence is no bold text)
        assert drawn.url_styled == hovered.url_styled == []
        assert '<span style="background-image:url(http:' in shown  # (the payloads, shown as text)
        if main == prod:
            assert BOLD_ID in drawn.texts  # the request id on the swimlane's axis, as it is
            assert any("engine_death @ vllm`` <img src=x onerror=alert(1)> <span" in t for t in hovered.texts)
            assert any("device used, dcgm[Hostname=<span" in t for t in drawn.texts)  # (the legend)
            # a hovertemplate's %{meta} (the host's series) and <extra>%{meta}</extra> (the run's name)
            assert any(re.fullmatch(r"dcgm\[Hostname=<span .*node-1</span>\] GPU 0: [\d.]+ GiB", t) for t in hovered.texts)
            assert rep.name in hovered.texts
        else:
            assert any(t.startswith("r <span style=") for t in drawn.texts)  # (the swimlane's axis)
            assert any(t.startswith("r <span style=") and t.endswith(": in 500 tok, prompt_logprobs null, ok")
                       for t in hovered.texts)
