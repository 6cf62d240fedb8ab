"""Custom training-loop logs: the bundled seed-003 format and user-declared TOML formats."""

from __future__ import annotations

import gzip
import math
import re
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest

from parsers._formats import FormatDefinitionError
from parsers.custom import DETAIL_SCHEMA, load_custom_format, looks_like_custom_loop, read_custom_log
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA

FIXTURES = Path(__file__).parent / "fixtures"
SEED003 = FIXTURES / "seed003" / "train.log"
EXAMPLE = FIXTURES / "custom_format_example.toml"


def values(frame: pl.DataFrame, key: str) -> dict[int, float]:
    return dict(frame.filter(pl.col("key") == key).select("step", "value").iter_rows())


def test_seed003_iterations_phases_and_rewards() -> None:
    log = read_custom_log(SEED003)
    assert log.format == "custom_loop" and log.lines == 92
    assert log.metrics.schema == pl.Schema(METRIC_SCHEMA) and log.steps.schema == pl.Schema(STEP_SCHEMA)
    assert log.events.schema == pl.Schema(EVENT_SCHEMA) and log.detail.schema == pl.Schema(DETAIL_SCHEMA)
    assert log.steps["step"].to_list() == [0, 1, 2] and log.steps["line"].to_list() == [35, 57, 80]

    m = log.metrics
    assert values(m, "loss") == {0: 0.1235, 1: 0.0, 2: 0.0}
    assert values(m, "loss/main") == {0: 0.1235, 1: 0.0, 2: 0.0} and values(m, "loss/critic")[0] == 0.0
    assert values(m, "time_ms") == {0: 21747.97, 1: 103634.20, 2: 102913.48}
    # four micro-steps per iteration, averaged; step 3 was interrupted after one
    assert values(m, "reward/mean") == pytest.approx({0: 0.3125, 1: 0.0, 2: 0.0, 3: 0.0})
    assert values(m, "reward/std")[1] == 0.0 and values(m, "reward/std")[0] == pytest.approx((0.4841 + 0.5 + 0.4330 + 0.3307) / 4)
    assert values(m, "phase/samples_generated_s")[0] == pytest.approx((9.812 + 2.201 + 2.187 + 2.209) / 4)
    assert values(m, "phase/samples_generated_s")[1] == pytest.approx((24.918 + 25.067 + 24.985 + 25.104) / 4)
    assert values(m, "phase/optimizer_step_finished_s") == {0: 21.702, 1: 103.591, 2: 102.871}
    assert {"mem_mb", "phase/iteration_start_s", "phase/samples_scored_s", "phase/loss_computed_s", "pg_loss", "kl", "total_loss"} <= set(m["key"])
    assert values(m, "pg_loss")[1] == 0.0
    assert m.filter(pl.col("key") == "loss")["line"].to_list() == [35, 57, 80]
    assert m["time"].null_count() == m.height  # this loop prints no timestamps
    assert any("step 3, unfinished" in n for n in log.notes)

    d = log.detail.filter((pl.col("key") == "reward/mean") & (pl.col("step") == 0)).sort("micro")
    assert d["micro"].to_list() == [0, 1, 2, 3] and d["value"].to_list() == [0.375, 0.5, 0.25, 0.125]


def test_seed003_warnings_are_events_at_their_iteration() -> None:
    events = read_custom_log(SEED003).events
    assert set(events["source"]) == {"custom"} and events["time"].null_count() == events.height
    zero_adv = events.filter(pl.col("kind") == "zero_advantages")
    assert zero_adv.height == 9 and zero_adv["step"].min() == 1 and set(zero_adv["severity"]) == {"warning"}
    assert zero_adv["line"][0] == 39 and zero_adv["message"][0].startswith("WARNING: All advantages are near zero!")
    (logprobs,) = events.filter(pl.col("kind") == "zero_logprobs").iter_rows(named=True)
    assert logprobs["step"] == 2 and logprobs["line"] == 62
    (tb,) = events.filter(pl.col("kind") == "traceback").iter_rows(named=True)
    assert tb["line"] == 87 and tb["step"] == 3 and tb["message"].endswith("KeyboardInterrupt")


def test_seed003_gzipped_reads_the_same(tmp_path: Path) -> None:
    packed = tmp_path / "train.log.gz"
    packed.write_bytes(gzip.compress(SEED003.read_bytes()))
    plain, zipped = read_custom_log(SEED003), read_custom_log(packed)
    assert zipped.metrics.drop("file").equals(plain.metrics.drop("file"))
    assert zipped.events.drop("file").equals(plain.events.drop("file"))
    assert (zipped.lines, zipped.unparsed_lines) == (plain.lines, plain.unparsed_lines)


def test_detection_of_the_loop_format() -> None:
    assert looks_like_custom_loop(SEED003)
    areal = FIXTURES / "areal_seed000" / "outputs" / "logs" / "root" / "gsm8k-grpo-full-local" / "trial0" / "llm_server.log"
    assert not looks_like_custom_loop(areal)


def test_restarted_loop_keeps_the_later_copy_of_a_step(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    lines = SEED003.read_text(encoding="utf-8").splitlines()
    restarted = lines[:57] + ["iter 1: loss 0.0500 (main 0.0500, critic 0.0000), time 30000.00ms"]
    log.write_text("\n".join(restarted) + "\n", encoding="utf-8")
    parsed = read_custom_log(log)
    assert values(parsed.metrics, "loss") == {0: 0.1235, 1: 0.05}
    assert values(parsed.metrics, "time_ms")[1] == 30000.0


def example_log(tmp_path: Path) -> Path:
    log = tmp_path / "loop.log"
    log.write_text(
        "starting run toy\n"
        "2025-06-01 14:03:12 | step 1 | reward=0.6250 reward_std=0.3125 loss=-0.0132 grad_norm=0.87\n"
        "2025-06-01 14:05:39 WARNING all advantages are zero in 8/8 groups\n"
        "2025-06-01 14:05:40 | step 2 | reward=0.0000 reward_std=0.0000 loss=nan grad_norm=inf\n"
        "\x1b[31m2025-06-01 14:07:01 | step 3 | reward=0.0000 reward_std=0.0000 loss=0.0000 grad_norm=0.01\x1b[0m\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
        encoding="utf-8",
    )
    return log


def test_user_format_from_the_documented_example(tmp_path: Path) -> None:
    fmt = load_custom_format(EXAMPLE)
    log = read_custom_log(example_log(tmp_path), fmt)
    assert log.format == "toy-grpo-loop" and log.lines == 6 and log.unparsed_lines == 1
    m = log.metrics
    assert values(m, "reward/mean") == {1: 0.625, 2: 0.0, 3: 0.0} and values(m, "reward/std")[1] == 0.3125
    assert values(m, "loss")[1] == -0.0132 and math.isnan(values(m, "loss")[2])
    assert values(m, "grad_norm")[2] == math.inf
    times = dict(m.filter(pl.col("key") == "loss").select("step", "time").iter_rows())
    assert times == {1: datetime(2025, 6, 1, 14, 3, 12), 2: datetime(2025, 6, 1, 14, 5, 40), 3: datetime(2025, 6, 1, 14, 7, 1)}
    events = {r["kind"]: r for r in log.events.iter_rows(named=True)}
    assert events["zero_advantages"]["step"] == 2 and events["zero_advantages"]["line"] == 3
    assert events["cuda_oom"]["severity"] == "error" and events["cuda_oom"]["step"] == 4  # after the last step line


def read_with(tmp_path: Path, format_text: str, log_text: str):
    """``log_text`` read with the TOML format ``format_text``, both written under ``tmp_path``."""
    toml, log = tmp_path / "fmt.toml", tmp_path / "x.log"
    toml.write_text(format_text, encoding="utf-8")
    log.write_text(log_text, encoding="utf-8")
    return read_custom_log(log, load_custom_format(toml))


def test_user_format_without_values_table_keys_by_group(tmp_path: Path) -> None:
    parsed = read_with(tmp_path, "name = 'bare'\nregex = '^it=(?P<step>\\d+) r=(?P<reward>\\S+)'\nstep_line_at = 'start'\n",
                       "it=5 r=0.5\nit=6 r=0.25\n")
    assert values(parsed.metrics, "reward") == {5: 0.5, 6: 0.25}


def test_a_step_group_that_catches_no_whole_number_reads_nothing_of_its_line(tmp_path: Path) -> None:
    """``(?P<step>\\S+)`` on ``it=12/60`` or ``it=abc``: not a step line, and its values not the
    next step's — unread, counted and said (they had all become one "step 0", or the next step's)."""
    parsed = read_with(tmp_path, "name = 'loose'\nregex = '^it=(?P<step>\\S+) r=(?P<reward>\\S+)'\n",
                       "it=5 r=0.5\nit=abc r=9\nit=6 r=0.25\nit=7/60 r=9\n")
    assert values(parsed.metrics, "reward") == {5: 0.5, 6: 0.25}
    assert parsed.steps["step"].to_list() == [5, 6] and parsed.unparsed_lines == 2
    assert "2 lines matched a pattern with a step group that caught no whole number (e.g. 'abc'): not read" in parsed.notes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name = 'x'\nregex = '(?P<step>\\d+) (?P<v>\\S+)'\nexec = 'import os'\n", "unknown key 'exec'"),
        ("name = 'x'\nregex = '(?P<step>\\d+) (?P<v>\\S+)'\n[[events]]\nkind = 'k'\nregex = 'a'\ncode = 1\n", "unknown key 'events[0].code'"),
        ("name = 'x'\nregex = '(?P<v>\\S+)'\n", "(?P<step>"),
        ("regex = '(?P<step>\\d+) (?P<v>\\S+)'\n", "missing key 'name'"),
        ("name = 'x'\nregex = '(?P<step>\\d+) (?<=a)(?P<v>\\S+)'\n", "key 'regex' is not a usable regex: look-around"),
        ("name = 'x'\nregex = '(?P<step>\\d+ (?P<v>\\S+)'\n", "key 'regex' is not a usable regex"),
        ("name = 'x'\nregex = '(?P<time>\\S+) (?P<step>\\d+) (?P<v>\\S+)'\n", "time_format"),
        ("name = 'x'\nregex = '(?P<step>\\d+) (?P<v>\\S+)'\n[values]\nw = 'w'\n", "'values.w' names no group"),
        ("name = 'x'\nregex = '(?P<step>\\d+) (?P<v>\\S+)'\nsamples = ['step x']\n", "does not match"),
        ("name = 'x'\nregex = '(?P<step>\\d+) (?P<v>\\S+)'\nsamples = ['3 abc']\n", "is not a number"),
        ("name = 'x'\nregex = '(?P<step>\\d+) (?P<v>\\S+)'\n[[events]]\nkind = 'k'\nseverity = 'loud'\nregex = 'a'\n", "severity"),
        ("name = 'x'\nregex = '(?P<step>\\d+)'\n", "no value group"),
        ("name = 'x'\nregex = 42\n", "key 'regex' must be a str"),
        ("name = 'x\n", "fmt.toml"),
    ],
)
def test_bad_user_format_names_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    toml = tmp_path / "fmt.toml"
    toml.write_text(text, encoding="utf-8")
    with pytest.raises(FormatDefinitionError) as info:
        load_custom_format(toml)
    assert str(toml) in str(info.value) and message in str(info.value)


def test_a_steps_mean_does_not_depend_on_how_long_the_log_is(tmp_path: Path) -> None:
    """The micro-steps' mean of a step is the same read from the first part of a loop's log or from
    all of it (the cache keeps the first part's values when the log grows)."""
    lines = SEED003.read_bytes().splitlines(keepends=True)
    head = next(i for i, line in enumerate(lines) if line.startswith(b"[Micro 0]"))
    iterations = sum(1 for line in lines[head:] if line.startswith(b"iter "))

    def renumbered(offset: int) -> list[bytes]:
        return [re.sub(rb"^iter (\d+):", lambda m: b"iter %d:" % (int(m[1]) + offset), line) for line in lines[head:]]

    data = b"".join(lines[:head] + [line for k in range(6) for line in renumbered(k * iterations)])
    log = tmp_path / "train.log"
    log.write_bytes(data[: data.index(b"\n", 3894) + 1])
    short = read_custom_log(log).metrics
    log.write_bytes(data)
    whole = read_custom_log(log).metrics
    columns, done = ["step", "key", "value", "line"], pl.col("step") < short["step"].max()  # (the last step goes on)
    assert short.filter(done).height and short.filter(done).select(columns).sort(columns).equals(
        whole.filter(done & (pl.col("line") <= short["line"].max())).select(columns).sort(columns))


_CLOCK_ONLY = r'''name = "clock-loop"
regex = '^\[(?P<time>[^\]]+)\] iter (?P<step>\d+) reward=(?P<reward>\S+)'
time_format = "%s"
samples = ["[%s] iter 12 reward=0.5000"]
[[events]]
kind = "request_timeout"
severity = "error"
regex = 'ReadTimeout'
samples = ["[%s] ERROR judge request failed: httpx.ReadTimeout"]
'''


@pytest.mark.parametrize(("time_format", "first", "modified", "days"), [
    # a time of day only, across midnight; the file written an hour after its last line
    ("%H:%M:%S", datetime(2025, 6, 1, 20, 0), datetime(2025, 6, 2, 17, 0), 0),
    # the file's time the next morning, earlier in the day than its last line: the day before's
    ("%H:%M:%S", datetime(2025, 6, 1, 20, 0), datetime(2025, 6, 3, 9, 0), 0),
    # copied a day later: the copy's day is the last line's (all the tool can know)
    ("%H:%M:%S", datetime(2025, 6, 1, 20, 0), datetime(2025, 6, 3, 17, 0), 1),
    # syslog's month and day, no year, across New Year
    ("%b %d %H:%M:%S", datetime(2025, 12, 31, 20, 0), datetime(2026, 1, 1, 17, 0), 0),
    # no year, through 29 February of a leap year
    ("%m-%d %H:%M:%S", datetime(2024, 2, 28, 20, 0), datetime(2024, 2, 29, 17, 0), 0),
])
def test_times_with_no_date_or_no_year_are_put_on_the_calendar(tmp_path: Path, time_format: str, first: datetime,
                                                               modified: datetime, days: int) -> None:
    """``[23:55:00] iter 12 …`` (or ``Jun 01 23:55:00``) parse in year 1: they are dated from the
    file's modification time, a day (a year) added where the clock goes back, each as it was written."""
    import os
    from datetime import timedelta

    stamp = datetime(2025, 6, 1, 23, 55).strftime(time_format)
    fmt_file = tmp_path / "fmt.toml"
    fmt_file.write_text(_CLOCK_ONLY % (time_format, stamp, stamp))
    fmt = load_custom_format(fmt_file)
    written, lines = [], []
    for step in range(1, 201):
        at = first + timedelta(minutes=6 * step)
        if step == 150:
            lines.append(f"[{at:{time_format}}] ERROR judge request failed: httpx.ReadTimeout")
        lines.append(f"[{at:{time_format}}] iter {step} reward=0.5")
        written.append(at)
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    os.utime(log, (modified.timestamp(), modified.timestamp()))
    parsed = read_custom_log(log, fmt)
    shift = timedelta(days=days)
    assert parsed.steps["time"].to_list() == [at + shift for at in written]
    assert parsed.events["time"].to_list() == [written[149] + shift]
    assert parsed.metrics.sort("step")["time"].to_list() == [at + shift for at in written]
    assert any("a day added" in n or "a year added" in n for n in parsed.notes)
    from typer.testing import CliRunner

    from forensics.cli import app
    done = CliRunner().invoke(app, ["analyze", str(log), "--log-format", str(fmt_file), "--no-html", "--no-cache"])
    assert done.exit_code in (0, 1) and "internal error" not in done.output, done.output
