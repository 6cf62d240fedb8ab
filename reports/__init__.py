"""Renderers for a finished analysis: the HTML post-mortem and the terminal summary.

Nothing here parses logs or detects anything; plotly is imported only when HTML is rendered.
"""

from reports.html import render_html, write_html
from reports.terminal import render_summary

__all__ = ["render_html", "write_html", "render_summary"]
