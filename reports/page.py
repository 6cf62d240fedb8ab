"""The page shell shared by every HTML rendering: escaping, the template and the inlined plotly.js.

Everything that came from a log or a path is untrusted. In markup it goes through :func:`e`;
figures travel as JSON in ``<script type="application/json">`` blocks, escaped by
:func:`script_json` so that no value can end the block. The page loads nothing: plotly.js
(the vendored basic bundle) and the page script are inlined, and its Content-Security-Policy
forbids every network fetch.
"""

from __future__ import annotations

import html
import json
import re
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from forensics.atomic import write_whole
from forensics.model import iso
from reports.visible import visible

_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def write_page(path: Path, text: str | bytes) -> Path:
    """``text`` as the file ``path``, put in place whole (see :func:`forensics.atomic.write_whole`)."""
    return write_whole(path, text.encode("utf-8") if isinstance(text, str) else text)


def e(value: Any) -> str:
    """Text for HTML (element content or a quoted attribute)."""
    return visible(html.escape("" if value is None else str(value), quote=True))


def script_json(value: Any) -> str:
    """``value`` as JSON that cannot end the ``<script>`` element it is embedded in."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    return re.sub("[<>&\u2028\u2029]", lambda m: _JSON_ESCAPES[m.group(0)], text)


def short(path: str, root: str) -> str:
    """``path`` relative to the run root when it lies inside it."""
    root = root.rstrip("/")
    return path[len(root) + 1 :] if root and path.startswith(root + "/") else path


def fmt_time(t: datetime | None) -> str:
    return iso(t) or "time unknown"


def _asset(name: str) -> str:
    return resources.files("reports").joinpath(name).read_text(encoding="utf-8")


@cache
def plotly_js() -> str:
    """The vendored plotly.js basic bundle, safe to inline in a ``<script>`` element."""
    return _asset("vendor/plotly-basic.min.js").replace("</script", "<\\/script")


def figure_block(plot_id: str, figure: dict[str, Any]) -> str:
    """A figure's data for the page script, which draws it into ``#plot_id``."""
    return f'<script type="application/json" data-plot="{e(plot_id)}">{script_json(figure)}</script>'


def render_page(*, title: str, head_note: str, body: str, footer: str, figures: list[str], nav: str = "") -> str:
    """Fill the page template. ``body``, ``footer``, ``nav`` and ``figures`` are already-safe markup."""
    values = {
        "title": e(title),
        "head_note": e(head_note),
        "nav": nav,
        "body": body,
        "footer": footer,
        "figure_data": "\n".join(figures),
        "plotly_js": plotly_js() if figures else "",
        "page_js": _asset("_page.js"),
    }
    # One pass: text substituted in is never scanned for placeholders again.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], _asset("_page.html"))
