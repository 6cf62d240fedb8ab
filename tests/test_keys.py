"""``analyze`` keeps only the metric keys an analysis reads (``forensics.keys``): same findings,
same reports, from a fraction of the rows. Every committed fixture run and built runs of other
shapes are analyzed both ways."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from areal_builder import RunSpec, write_run
from typer.testing import CliRunner
from verl_builder import nccl_hang_run, ray_oom_kill_run, zero_score_run

from forensics import analyze
from forensics.cli import app
from forensics.keys import ANALYSIS_KEYS
from parsers import read_areal_log
from reports import render_html

FIXTURES = Path(__file__).parent / "fixtures"
RUNS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and not p.name.startswith("_"))


def both_ways(path: Path):
    return analyze([path]), analyze([path], keys=ANALYSIS_KEYS)


def without_counts_of_kept_series(document: dict) -> str:
    """The document without what counts the kept series: the series found in several copies, and
    how many server stats values were folded per minute (with ``keys``, of the kept ones)."""
    for run in document["runs"]:
        run.pop("series_sources")
        run["notes"] = [n for n in run["notes"] if "series were found in several copies" not in n]
        for source in run["sources"]:
            source["notes"] = [n for n in source["notes"] if "server stats values kept as" not in n]
    return json.dumps(document, default=str)


def html_without_counts(analysis) -> str:
    counts = r"\d+ server stats values kept as \d+|\d+ series were found in several copies"
    return re.sub(counts, "…", render_html(analysis))


def same_analysis(full, kept) -> None:
    assert without_counts_of_kept_series(kept.to_document()) == without_counts_of_kept_series(full.to_document())
    pattern = re.compile(ANALYSIS_KEYS)
    for a, b in zip(full.runs, kept.runs, strict=True):
        assert b.series_sources == {k: v for k, v in a.series_sources.items() if pattern.search(k)}
    assert html_without_counts(kept) == html_without_counts(full)
    for a, b in zip(full.runs, kept.runs, strict=True):
        wanted = a.metrics.filter(pl.col("key").cast(pl.String).map_elements(lambda k: bool(pattern.search(k)), return_dtype=pl.Boolean))
        assert b.metrics.equals(wanted)  # the parse-time filter drops exactly the other keys, nothing else


@pytest.mark.parametrize("name", RUNS)
def test_fixture_runs_analyze_the_same_with_only_the_analysis_keys(name: str) -> None:
    full, kept = both_ways(FIXTURES / name)
    same_analysis(full, kept)
    if not name.startswith("seed"):  # a real filter: most of an AReaL table and of SGLang's stats are not read
        assert kept.runs[0].metrics.height < full.runs[0].metrics.height / 2


def test_verl_runs_analyze_the_same(tmp_path: Path) -> None:
    for scenario in (zero_score_run, nccl_hang_run, ray_oom_kill_run):
        write = scenario(tmp_path / scenario.__name__)
        same_analysis(*both_ways(write.root))


def test_the_table_filter_still_counts_values_that_are_not_numbers(tmp_path: Path) -> None:
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=6))
    text = paths.trainer_log.read_text()
    cell = re.search(r"(│ grpo_actor/entropy/avg\s+│\s*)(\S+)( │)", text)
    assert cell is not None
    broken = "n/a".rjust(len(cell.group(2)))
    paths.trainer_log.write_text(text[: cell.start(2)] + broken + text[cell.end(2) :])
    full, kept = read_areal_log(paths.trainer_log), read_areal_log(paths.trainer_log, keys=ANALYSIS_KEYS)
    assert "1 table values were not numbers" in full.notes
    assert kept.notes == full.notes
    assert kept.metrics["key"].cast(pl.String).str.contains(ANALYSIS_KEYS).all()
    assert kept.metrics.height < full.metrics.height


def test_the_metrics_command_keeps_every_key(tmp_path: Path) -> None:
    out = tmp_path / "metrics.parquet"
    result = CliRunner().invoke(app, ["metrics", str(FIXTURES / "areal_seed000"), "--no-cache", "--format", "parquet", "--output", str(out)])
    assert result.exit_code == 0, result.output
    keys = set(pl.read_parquet(out)["key"].unique())
    assert "grpo_actor/entropy/avg" in keys and not re.search(ANALYSIS_KEYS, "grpo_actor/entropy/avg")
