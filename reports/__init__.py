"""Renderers for a finished analysis or comparison: HTML pages, the terminal summary, Markdown.

Nothing here parses logs or detects anything.
"""

from reports.compare_html import render_compare_html, write_compare_html
from reports.html import render_html, write_html
from reports.index_html import render_index_html, write_index_html
from reports.markdown import render_markdown
from reports.terminal import render_comparison, render_fleet_summary, render_summary

__all__ = [
    "render_compare_html",
    "render_comparison",
    "render_fleet_summary",
    "render_html",
    "render_index_html",
    "render_markdown",
    "render_summary",
    "write_compare_html",
    "write_html",
    "write_index_html",
]
