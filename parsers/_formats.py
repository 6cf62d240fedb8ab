"""Log formats declared as data: ``parsers/formats/<name>.json``.

A format names its line regex, the prefixes other tools add, the events it recognises
(kind, severity, regex over the message) and the metrics some lines carry, each with
verbatim samples that the tests replay. Adding a recognised line is an edit to JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import polars as pl


class FormatDefinitionError(ValueError):
    """A format file is malformed (bad JSON, bad regex, missing samples)."""


@dataclass(frozen=True)
class EventPattern:
    kind: str
    severity: str
    regex: str
    samples: tuple[str, ...]
    unless: str | None = None
    """A line ``regex`` finds something in is no such event where this one does too (a refused
    connection to W&B's API is no inference server's)."""


@dataclass(frozen=True)
class MetricPattern:
    name: str
    literal: str
    """Text every matching line contains: a cheap filter run before the regex."""
    regex: str
    keys: dict[str, str]
    samples: tuple[str, ...]


@dataclass(frozen=True)
class LogFormat:
    name: str
    title: str
    source: str
    line_regex: str
    fields: dict[str, str]
    """One-group regexes for single fields of a line: cheaper than the full regex's groups."""
    timestamp_format: str
    levels: dict[str, str]
    prefixes: dict[str, str]
    events: tuple[EventPattern, ...]
    metrics: tuple[MetricPattern, ...]
    traceback_start: str
    traceback_exception: str
    traceback_kinds: tuple[tuple[str, str], ...]
    untimed_events: tuple[EventPattern, ...] = ()
    """Patterns for lines outside the format's own (a C++ library's stderr among a logger's lines)."""

    @property
    def any_event(self) -> str:
        """One regex matching wherever any event pattern matches."""
        return _any(self.events)

    @property
    def any_untimed_event(self) -> str:
        return _any(self.untimed_events)

    def classify(self, message: pl.Expr, *, untimed: bool = False) -> pl.Expr:
        """The event kind of each message (first matching pattern wins), else null."""
        expr: Any = pl.lit(None, dtype=pl.String)
        for pattern in reversed(self.untimed_events if untimed else self.events):
            hit = message.str.contains(pattern.regex)
            if pattern.unless:
                hit = hit & ~message.str.contains(pattern.unless)
            expr = pl.when(hit).then(pl.lit(pattern.kind)).otherwise(expr)
        return expr

    def severity_of(self, kind: pl.Expr, level: pl.Expr) -> pl.Expr:
        """Severity from the pattern where it sets one, else from the logger level."""
        by_level = level.replace_strict(self.levels, default="info")
        by_kind = kind.replace_strict({p.kind: p.severity for p in self.events}, default=None)
        return pl.coalesce(by_kind, by_level)

    @property
    def kinds(self) -> frozenset[str]:
        """Every event kind this format can give a line."""
        return frozenset({p.kind for p in (*self.events, *self.untimed_events)} | {kind for kind, _ in self.traceback_kinds}
                         | {"traceback"})

    def traceback_kind(self, exception_line: pl.Expr) -> pl.Expr:
        expr: Any = pl.lit("traceback")
        for kind, regex in reversed(self.traceback_kinds):
            expr = pl.when(exception_line.str.contains(regex)).then(pl.lit(kind)).otherwise(expr)
        return expr

    def chain_kind(self, first: pl.Expr, at_end: pl.Expr) -> pl.Expr:
        """A chained traceback's kind: its last exception's (``at_end``, that exception's
        :meth:`traceback_kind`), unless that one is of no kind of its own and the chain's ``first``
        exception is (a CUDA OOM re-raised as ``RuntimeError: train step 50 failed``)."""
        return pl.when(at_end == "traceback").then(self.traceback_kind(first.fill_null(""))).otherwise(at_end)


def _any(patterns: tuple[EventPattern, ...]) -> str:
    return "|".join(f"(?:{re.sub(r'[(][?]P<[^>]+>', '(?:', p.regex)})" for p in patterns)


def _require(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise FormatDefinitionError(f"{where}: missing '{key}'")
    return data[key]


def _compiled(regex: str, where: str) -> str:
    try:
        re.compile(regex)
    except re.error as exc:
        raise FormatDefinitionError(f"{where}: invalid regex {regex!r}: {exc}") from exc
    return regex


def _items(data: dict[str, Any], section: str, where: str) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{where}: {section}[{i}]", item) for i, item in enumerate(data.get(section, []))]


def _samples(item: dict[str, Any], here: str) -> tuple[str, ...]:
    samples = tuple(_require(item, "samples", here))
    if not samples:
        raise FormatDefinitionError(f"{here}: a pattern needs at least one sample")
    return samples


def parse_format(data: dict[str, Any], where: str) -> LogFormat:
    """Build a :class:`LogFormat` from its JSON object, checking what can be checked."""
    line = _require(data, "line", where)
    events, untimed = (
        [
            EventPattern(
                kind=_require(item, "kind", here),
                severity=_require(item, "severity", here),
                regex=_compiled(_require(item, "regex", here), here),
                samples=_samples(item, here),
                unless=_compiled(item["unless"], here) if "unless" in item else None,
            )
            for here, item in _items(data, section, where)
        ]
        for section in ("events", "untimed_events")
    )
    metrics = [
        MetricPattern(
            name=_require(item, "name", here),
            literal=_require(item, "literal", here),
            regex=_compiled(_require(item, "regex", here), here),
            keys=dict(_require(item, "keys", here)),
            samples=_samples(item, here),
        )
        for here, item in _items(data, "metrics", where)
    ]
    tracebacks = data.get("tracebacks", {})
    return LogFormat(
        name=_require(data, "name", where),
        title=_require(data, "title", where),
        source=_require(data, "source", where),
        line_regex=_compiled(_require(line, "regex", where), where),
        fields={k: _compiled(v, where) for k, v in line.get("fields", {}).items()},
        timestamp_format=_require(line, "timestamp_format", where),
        levels=dict(line.get("levels", {})),
        prefixes={k: _compiled(v, where) for k, v in data.get("prefixes", {}).items()},
        events=tuple(events),
        metrics=tuple(metrics),
        traceback_start=_compiled(tracebacks.get("start", "^Traceback \\(most recent call last\\):"), where),
        traceback_exception=_compiled(tracebacks.get("exception", "^$^"), where),
        traceback_kinds=tuple((k["kind"], _compiled(k["regex"], where)) for k in tracebacks.get("kinds", [])),
        untimed_events=tuple(untimed),
    )


@cache
def load_format(name: str) -> LogFormat:
    """The bundled format ``name`` (``parsers/formats/<name>.json``)."""
    path = resources.files("parsers") / "formats" / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise FormatDefinitionError(f"formats/{name}.json: {exc}") from exc
    return parse_format(data, f"formats/{name}.json")


def format_names() -> list[str]:
    """Every bundled format, found by glob (there is no hand-kept list)."""
    folder = resources.files("parsers") / "formats"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))
