"""A run at a time: the ``metrics`` export (each run's metric frame in turn, in slices, one file)
and ``analyze_each`` (each run's analysis in turn), which ``events`` writes as it goes."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from forensics import export
from forensics.analysis import analyze, analyze_each
from forensics.export import EXPORT_SCHEMA, metric_rows, write_metrics

READ = {
    "csv": lambda p: pl.read_csv(p, schema=EXPORT_SCHEMA),
    "jsonl": lambda p: pl.read_ndjson(p, schema=EXPORT_SCHEMA),
    "parquet": pl.read_parquet,
}


def exported(path: Path, fmt: str, frames) -> pl.DataFrame:
    written = write_metrics(frames, fmt, str(path) if fmt == "csv" else path)  # a name or a path
    frame = READ[fmt](path)
    assert frame.height == written
    return frame


def test_several_runs_are_exported_in_turn_whatever_the_slices(fixture_run, tmp_path: Path, monkeypatch) -> None:
    runs = [fixture_run("areal_healthy_sparse"), fixture_run("sglang_hang")]
    whole = {fmt: exported(tmp_path / f"whole.{fmt}", fmt, metric_rows(runs)) for fmt in READ}
    monkeypatch.setattr(export, "SLICE_ROWS", 4_096)  # each run in several slices
    sliced = list(metric_rows(runs))
    assert len(sliced) > 2 and max(s.height for s in sliced) == 4_096
    for fmt in READ:
        assert exported(tmp_path / f"sliced.{fmt}", fmt, iter(sliced)).equals(whole[fmt])
    assert (tmp_path / "sliced.csv").read_text().count("run_id,") == 1  # one header

    # The same rows as each run's own metric frame, in analyze's order of runs.
    expected = pl.concat(
        r.metrics.select(
            pl.lit(r.run_id).alias("run_id"), pl.col("source").cast(pl.String), "step", "time",
            pl.col("key").cast(pl.String), "value", pl.lit(r.root).alias("root"), pl.col("file").cast(pl.String),
        )
        for r in analyze(runs).runs
    )
    assert whole["parquet"].equals(expected)
    assert whole["parquet"].schema == pl.Schema(EXPORT_SCHEMA)
    assert expected.height > 50_000
    # Each value says which log it was read from (one server's series apart from another's).
    assert set(whole["csv"]["file"].map_elements(lambda f: Path(f).name, return_dtype=pl.String)) == {
        "trainer.log.gz", "llm_server.log.gz"}


@pytest.mark.parametrize("fmt", sorted(READ))
def test_an_empty_export_is_still_a_readable_file(tmp_path: Path, fmt: str) -> None:
    frame = exported(tmp_path / f"empty.{fmt}", fmt, iter([]))
    assert frame.is_empty() and frame.columns == list(EXPORT_SCHEMA)


def test_a_run_is_read_only_once_the_one_before_is_written(fixture_run, tmp_path: Path) -> None:
    """The export holds one run at a time: the second run is read after the first is consumed
    (here it is gone by then, so it gives no rows)."""
    first, second = tmp_path / "a", tmp_path / "b"
    shutil.copytree(fixture_run("areal_healthy_sparse"), first)
    shutil.copytree(fixture_run("sglang_hang"), second)
    rows = metric_rows([first, second])
    head = next(rows)
    shutil.rmtree(second)
    rest = list(rows)
    ids = pl.concat([head, *rest])["run_id"].unique().to_list()
    assert len(ids) == 1 and head.height > 0


def test_a_bad_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="csv, jsonl, parquet"):
        write_metrics(iter([]), "xlsx", tmp_path / "x")


def test_analyze_each_judges_a_run_once_the_one_before_is_consumed(fixture_run, tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    shutil.copytree(fixture_run("sglang_hang"), first)
    shutil.copytree(fixture_run("areal_healthy_sparse"), second)
    whole = analyze([first, second])
    each = list(analyze_each([first, second]))
    assert [r.to_dict() for r in each] == [r.to_dict() for r in whole.runs]
    assert [bool(r.incidents) for r in each] == [True, False]

    runs = analyze_each([first, second])
    assert next(runs).incidents
    shutil.rmtree(second)
    [gone] = list(runs)  # found before, read only now: nothing left to read
    assert gone.steps.is_empty() and all(s.lines == 0 for s in gone.sources)


def test_jsonl_keeps_nan_and_infinity_and_times_as_analyze_gives_them(tmp_path: Path) -> None:
    """JSON has no NaN or infinity: they are written as the strings float() reads back, not null;
    whole-second times carry no '.000' (as in the analysis document and events)."""
    import json
    import math

    from typer.testing import CliRunner

    from forensics.cli import app

    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    log.write_text("".join(f"2025-06-01 14:{s:02d}:12 | step {s} | reward=0.5 reward_std=0.3 loss={loss} grad_norm=0.87\n"
                           for s, loss in enumerate(["0.1", "nan", "inf", "-inf"], 1)))
    fmt = Path(__file__).parent / "fixtures" / "custom_format_example.toml"
    for kind in ("jsonl", "csv"):
        result = CliRunner().invoke(app, ["metrics", str(log.parent), "--log-format", str(fmt), "--format", kind,
                                          "--output", str(tmp_path / f"m.{kind}")])
        assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    loss = [float(r["value"]) for r in rows if r["key"] == "loss"]
    assert loss[0] == 0.1 and math.isnan(loss[1]) and loss[2:] == [math.inf, -math.inf]
    assert rows[0]["time"] == "2025-06-01T14:01:12" and isinstance(rows[0]["value"], float)
    assert ",2025-06-01T14:01:12," in (tmp_path / "m.csv").read_text() and ".000" not in (tmp_path / "m.csv").read_text()
    csv = pl.read_csv(tmp_path / "m.csv", schema=EXPORT_SCHEMA)
    assert csv.filter(pl.col("key") == "loss")["value"].is_nan().sum() == 1


def test_metrics_into_a_new_folder_and_a_keys_regex_that_finds_nothing(tmp_path: Path) -> None:
    """``--output`` into a folder not made yet makes it (as ``--json`` does); a ``--keys`` that
    finds no key says so on stderr — a typo must not read as a run that logged nothing."""
    from typer.testing import CliRunner

    from forensics.cli import app

    run = str(Path(__file__).parent / "fixtures" / "sglang_oom" / "outputs")
    runner = CliRunner()
    made = runner.invoke(app, ["metrics", run, "--no-cache", "--output", str(tmp_path / "new" / "sub" / "m.csv")])
    assert made.exit_code == 0, made.output
    assert pl.read_csv(tmp_path / "new" / "sub" / "m.csv").height > 100
    typo = runner.invoke(app, ["metrics", run, "--no-cache", "--keys", "task_rewrd"])
    assert typo.exit_code == 0 and "no metric key matched --keys 'task_rewrd'" in typo.stderr
    found = runner.invoke(app, ["metrics", run, "--no-cache", "--keys", "task_reward"])
    assert found.exit_code == 0 and "no metric key matched" not in found.stderr


def test_metrics_output_dash_is_stdout_and_nothing_goes_where_a_run_is_read_from(tmp_path: Path, monkeypatch) -> None:
    """`--output -` is stdout, as `--json -` and `--markdown -` are (it wrote a file named `-` into the
    run folder the command was run from); an output inside a verl checkpoint folder the console names
    on another disk is refused, as `analyze` refuses it (it was written there)."""
    from typer.testing import CliRunner
    from verl_builder import VerlRunSpec, write_verl_run

    from forensics.cli import app

    runner = CliRunner()
    write_verl_run(tmp_path / "run", VerlRunSpec(steps=30, save_freq=4))
    monkeypatch.chdir(tmp_path / "run")
    result = runner.invoke(app, ["metrics", ".", "--output", "-", "--no-cache"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "run" / "-").exists()
    assert result.stdout.startswith("run_id,source,step,time,key,value,root,file")
    parquet = runner.invoke(app, ["metrics", ".", "--output", "-", "--format", "parquet", "--no-cache"])
    assert parquet.exit_code == 2 and "needs --output FILE" in parquet.output

    monkeypatch.chdir(tmp_path)
    shutil.move(tmp_path / "run" / "checkpoints", tmp_path / "disk")
    log = tmp_path / "run" / "train.log"
    log.write_text(log.read_text().replace(str(tmp_path / "run" / "checkpoints"), str(tmp_path / "disk")))
    kept = sorted((tmp_path / "disk").rglob("*"))
    [experiment] = {p.parent for p in (tmp_path / "disk").rglob("global_step_*")}
    write_verl_run(tmp_path / "before", VerlRunSpec(steps=10))  # (a run exported first: its rows are not left there)
    result = runner.invoke(app, ["metrics", str(tmp_path / "before"), "run", "--output", str(experiment / "m.csv"), "--no-cache"])
    assert result.exit_code == 2 and "nothing is written there" in result.output, result.output
    assert sorted((tmp_path / "disk").rglob("*")) == kept
