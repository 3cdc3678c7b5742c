"""Text from the evidence made inert where the reports show it.

Plotly reads the text of a figure (trace names in the legend and the hover, axis titles and tick
labels, annotations, hover text, and the values a hovertemplate puts in) as its own pseudo-HTML:
``<b>`` is bold, ``<a href=...>`` a link, and the style of ``<span style=...>`` is applied as it is,
so ``background-image:url(...)`` in a host name or a folder name makes the page fetch that URL.
``plotly_text`` makes a string show as itself, and ``plotly_safe`` applies it to every text a figure
shows. A hovertemplate is plotly's markup, not text: evidence reaches one only through a trace's
fields (``%{meta}``, ``%{text}``, ``%{customdata[0]}``), which ``plotly_safe`` escapes.

Markdown reads backticks, brackets, ``*``, ``_``, ``|`` and raw HTML in text: ``md_text`` escapes
evidence for running text and table cells, ``md_code`` puts it in a code span that it cannot close.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

# a trace's fields that plotly shows as text (x and y: as category names on an axis, and in the hover;
# legendgroup is shown nowhere, but escaped alike it keeps no raw markup in the page)
_TRACE_TEXT = ("name", "text", "hovertext", "customdata", "meta", "x", "y", "labels", "legendgroup")
# an axis's: its title and the category names it is told
_AXIS_TEXT = ("categoryarray", "ticktext")


def plotly_text(s: object) -> str:
    """``s`` as plotly shows it literally: no tag, no entity of its own (``&`` too, so ``&lt;`` in the
    evidence shows as ``&lt;``, not ``<``)."""
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _esc(v: Any) -> Any:
    """The strings in ``v`` (a string, or a list or tuple, nested, of strings and numbers) escaped;
    ``v`` itself where it holds none."""
    if isinstance(v, str):
        return plotly_text(v)
    if isinstance(v, (list, tuple)) and any(isinstance(x, (str, list, tuple)) for x in v):
        return [_esc(x) for x in v]
    if getattr(getattr(v, "dtype", None), "kind", None) in ("O", "U", "S"):  # (a numpy array of strings or objects)
        return [_esc(x) for x in v.tolist()]
    return v


def _fields(obj: Any, names: tuple[str, ...]) -> None:
    for k in names:
        if k in obj and obj[k] is not None:
            new = _esc(obj[k])
            if new is not obj[k]:
                obj[k] = new


def _title(obj: Any) -> None:
    if "title" in obj and obj.title is not None and obj.title.text is not None:
        obj.title.text = plotly_text(obj.title.text)


def plotly_safe(fig: go.Figure) -> go.Figure:
    """Escape, in place and once, every text ``fig`` shows: its traces' names, texts, hover texts,
    customdata, meta and category values; its annotations, titles, axis titles and category names,
    legend titles and shape labels. Returns ``fig``."""

    def trace(t: Any) -> None:
        _fields(t, _TRACE_TEXT)
        if "legendgrouptitle" in t and t.legendgrouptitle.text is not None:
            t.legendgrouptitle.text = plotly_text(t.legendgrouptitle.text)

    def axis(ax: Any) -> None:
        _title(ax)
        _fields(ax, _AXIS_TEXT)

    def annotation(a: Any) -> None:
        _fields(a, ("text", "hovertext"))

    def shape(s: Any) -> None:
        _fields(s, ("name",))
        if s.label is not None and s.label.text is not None:
            s.label.text = plotly_text(s.label.text)

    each: list[tuple[Callable[..., Any], Callable[[Any], None]]] = [
        (fig.for_each_trace, trace), (fig.for_each_xaxis, axis), (fig.for_each_yaxis, axis),
        (fig.for_each_annotation, annotation), (fig.for_each_shape, shape)]
    for walk, fn in each:
        walk(fn)
    _title(fig.layout)
    if fig.layout.legend is not None:
        _title(fig.layout.legend)
    return fig


_LINE_ENDS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")  # line ends and other controls (tab kept)
_MD_PUNCT = re.compile(r"[\\`*\[\]|~]")
_UNDERSCORES = re.compile(r"_+")
_BLOCK_START = re.compile(r"^(\s*)(#|[-+=]|\d{1,9}(?=[.)]))")


def _one_line(s: object) -> str:
    return _LINE_ENDS.sub(" ", str(s))


def md_text(s: object) -> str:
    """``s`` as Markdown shows it literally, inside running text or a table cell: on one line, HTML's
    ``<``, ``>`` and ``&`` as entities, and backslashes, backticks, ``*``, ``[``, ``]``, ``|`` and
    ``~`` escaped, ``_`` too where it could open or close emphasis (not inside a word:
    ``vllm_serve.log`` stays readable). Where ``s`` opens a list item's text: ``md_item``."""
    t = _one_line(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    t = _MD_PUNCT.sub(lambda m: "\\" + m.group(0), t)

    def underscores(m: re.Match[str]) -> str:
        i, j = m.start(), m.end()
        if 0 < i and j < len(t) and t[i - 1].isalnum() and t[j].isalnum():
            return m.group(0)
        return "\\_" * (j - i)
    return _UNDERSCORES.sub(underscores, t)


def md_item(s: object) -> str:
    """``md_text`` for text that opens a list item (or a line): a block marker it starts with (``#``,
    ``-``, ``+``, ``=``, ``1.``) escaped too, so it cannot open a heading or a list of its own."""
    t = md_text(s)
    m = _BLOCK_START.match(t)
    if m is None:
        return t
    lead, mark = m.group(1), m.group(2)
    if mark[0].isdigit():  # ('1.' or '1)': the mark after the number)
        return lead + mark + "\\" + t[len(lead) + len(mark):]
    return lead + "\\" + t[len(lead):]


def md_code(s: object) -> str:
    """``s`` in a code span: its fence one backtick longer than the longest run of backticks in it,
    padded where ``s`` starts or ends with a backtick or a space (which the span strips once). Not for
    a table cell (a GFM table splits cells at ``|`` even inside a code span): ``md_text`` there."""
    t = _one_line(s)
    if not t:
        return "` `"
    fence = "`" * (max((len(r) for r in re.findall(r"`+", t)), default=0) + 1)
    pad = " " if t.strip() and (t[0] in "` " or t[-1] in "` ") else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def md_link(text: object, dest: str) -> str:
    """A Markdown link: ``text`` escaped, ``dest`` in angle brackets (spaces and parentheses allowed)."""
    d = _one_line(dest).replace("\\", "\\\\").replace("<", "\\<").replace(">", "\\>")
    return f"[{md_text(text)}](<{d}>)"
