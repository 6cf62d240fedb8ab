"""Every format's samples are its tests (as in lnav): each sample line must parse with the
format's line regex and be recognised as the kind it illustrates, whichever format it is in.
"""

from __future__ import annotations

import re

import pytest

from parsers._formats import FormatDefinitionError, format_names, load_format, parse_format
from parsers._lines import ANSI


def _message(fmt, line: str) -> str:
    line = re.sub(ANSI, "", line)
    for prefix in fmt.prefixes.values():
        line = re.sub(prefix, "", line, count=1)
    match = re.match(fmt.line_regex, line)
    assert match, f"{fmt.name}: sample does not match the line regex: {line!r}"
    return match.group("message") or ""


EVENT_SAMPLES = [
    (name, pattern.kind, sample)
    for name in format_names()
    for pattern in load_format(name).events
    for sample in pattern.samples
]
UNTIMED_SAMPLES = [
    (name, pattern.kind, sample)
    for name in format_names()
    for pattern in load_format(name).untimed_events
    for sample in pattern.samples
]
METRIC_SAMPLES = [
    (name, pattern, sample)
    for name in format_names()
    for pattern in load_format(name).metrics
    for sample in pattern.samples
]


@pytest.mark.parametrize(("name", "kind", "sample"), EVENT_SAMPLES)
def test_event_sample_is_recognised_as_its_kind(name: str, kind: str, sample: str) -> None:
    fmt = load_format(name)
    message = _message(fmt, sample)
    first = next((p.kind for p in fmt.events if re.search(p.regex, message)), None)
    assert first == kind


@pytest.mark.parametrize(("name", "kind", "sample"), UNTIMED_SAMPLES)
def test_untimed_event_sample_is_not_a_logger_line_and_is_its_kind(name: str, kind: str, sample: str) -> None:
    fmt = load_format(name)
    assert not re.search(fmt.line_regex, sample)
    assert next((p.kind for p in fmt.untimed_events if re.search(p.regex, sample)), None) == kind


@pytest.mark.parametrize(("name", "pattern", "sample"), METRIC_SAMPLES, ids=lambda v: getattr(v, "name", None))
def test_metric_sample_yields_every_value(name: str, pattern, sample: str) -> None:
    fmt = load_format(name)
    match = re.search(pattern.regex, _message(fmt, sample))
    assert match
    for group in pattern.keys:
        float(match.group(group))


def test_every_pattern_has_samples_and_every_format_loads() -> None:
    assert "areal" in format_names()
    for name in format_names():
        fmt = load_format(name)
        assert fmt.events, name
        assert all(p.samples for p in fmt.events)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "x", "title": "x", "source": "x"}, "missing 'line'"),
        (
            {"name": "x", "title": "x", "source": "x", "line": {"regex": "(", "timestamp_format": "%H"}},
            "invalid regex",
        ),
        (
            {
                "name": "x", "title": "x", "source": "x",
                "line": {"regex": ".*", "timestamp_format": "%H"},
                "events": [{"kind": "k", "severity": "error", "regex": "a", "samples": []}],
            },
            "at least one sample",
        ),
    ],
)
def test_broken_format_says_where_and_why(data: dict, message: str) -> None:
    with pytest.raises(FormatDefinitionError, match=message) as info:
        parse_format(data, "formats/broken.json")
    assert "formats/broken.json" in str(info.value)


@pytest.mark.parametrize(("name", "pattern", "sample"), METRIC_SAMPLES, ids=lambda v: getattr(v, "name", None))
def test_metric_literal_prefilter_keeps_every_sample(name: str, pattern, sample: str) -> None:
    assert pattern.literal in sample


@pytest.mark.parametrize(("name", "kind", "sample"), EVENT_SAMPLES)
def test_field_regexes_agree_with_the_line_regex(name: str, kind: str, sample: str) -> None:
    fmt = load_format(name)
    line = re.sub(ANSI, "", sample)
    for prefix in fmt.prefixes.values():
        line = re.sub(prefix, "", line, count=1)
    whole = re.match(fmt.line_regex, line)
    for field, regex in fmt.fields.items():
        assert re.search(regex, line).group(1) == whole.group(field)
