"""Reading a report's figures as the page holds them."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import numpy as np

_SPEC = re.compile(r"var spec=(.*?);\nPlotly\.newPlot", re.S)


def decoded(obj: Any) -> Any:
    """``obj`` (a figure's JSON) with each of plotly's typed arrays ({"dtype": "f8", "bdata": base64}, as
    plotly writes a numpy array) as the list of its numbers."""
    if isinstance(obj, dict):
        if set(obj) >= {"dtype", "bdata"} and set(obj) <= {"dtype", "bdata", "shape"}:
            return np.frombuffer(base64.b64decode(obj["bdata"]), dtype=np.dtype(obj["dtype"])).tolist()
        return {k: decoded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decoded(v) for v in obj]
    return obj


def page_specs(html: str, start: int = 0) -> list[dict[str, Any]]:
    """The plotly specs of a report's figures, in page order from ``start``, their typed arrays as lists."""
    return [decoded(json.loads(m[1])) for m in _SPEC.finditer(html, start)]
