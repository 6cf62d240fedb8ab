"""A damaged copy of the ``areal_seed000`` fixture: every command must survive it without a
traceback, still find the step-940 collapse, count what it skipped, leave the tree untouched
(also when it is read-only), and escape hostile log text in its HTML and Markdown reports.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import stat
from pathlib import Path

import polars as pl
import pytest
from conftest import FIXTURES, tree_state
from typer.testing import CliRunner

from forensics import analyze
from forensics.cli import app

runner = CliRunner()
TRIAL = Path("logs/root/gsm8k-grpo-full-local/trial0")
CKPT = Path("checkpoints/root/gsm8k-grpo-full-local/trial0")
XSS = "<script>alert(1)</script> <img src=x onerror=alert(2)> [x](javascript:alert(3)) ![i](http://evil/x.png)"
ROTATE_AT = (30_000, 70_000)  # trainer.log.2.gz: lines 1..30000, trainer.log.1: ..70000, trainer.log: the rest
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def build_damaged_tree(root: Path) -> Path:
    """Copy the committed fixture and damage it in every way a real outputs/ tree gets damaged."""
    outputs = root / "outputs"
    shutil.copytree(FIXTURES / "areal_seed000" / "outputs", outputs, symlinks=True)
    trial = outputs / TRIAL
    packed = trial / "trainer.log.gz"
    lines = gzip.decompress(packed.read_bytes()).split(b"\n")
    packed.unlink()
    a, b = ROTATE_AT

    # Oldest rotation, gzipped, one step header's number damaged past what an Int64 holds.
    oldest = lines[:a]
    header = next(i for i, line in enumerate(oldest) if b"Train step 100/" in line)
    oldest[header] = oldest[header].replace(b"Train step 100/", b"Train step 99999999999999999999/")
    (trial / "trainer.log.2.gz").write_bytes(gzip.compress(b"\n".join(oldest) + b"\n"))

    # Middle rotation: the collapse, hostile text, and every kind of byte-level damage.
    middle = lines[a:b]
    first_timeout = next(i for i, line in enumerate(middle) if b"timed out after" in line)
    middle[first_timeout] = middle[first_timeout].replace(b"(attempt 1/3)", b"(attempt 1/3) " + XSS.encode())
    server_line = (trial / "llm_server.log").read_bytes().split(b"\n")[0]
    junk = [
        b"\x00" * 4096,  # NUL run
        bytes(range(256)) * 8,  # binary junk, with a newline in it
        b"\xff\xfe invalid \xc3( utf-8 \xed\xa0\x80 here",
        b"20251111-10:00:00.000 StatsLogger INFO: crlf line\r",
        b"x" * (6 << 20),  # one line of several MB
        middle[5][:40] + server_line + middle[5][40:],  # two processes interleaved mid-line
    ]
    middle[1000:1000] = junk
    middle[2000:2400] = [line + b"\r" for line in middle[2000:2400]]  # a CRLF stretch
    (trial / "trainer.log.1").write_bytes(b"\n".join(middle) + b"\n")

    # Newest: cut off mid-table-row at EOF (killed while printing a table).
    newest = lines[b:]
    last_row = max(i for i, line in enumerate(newest) if line.startswith("│".encode()))
    (trial / "trainer.log").write_bytes(b"\n".join(newest[:last_row]) + b"\n" + newest[last_row][: len(newest[last_row]) // 2])

    # The server log ends without a newline and has CRLF line ends.
    server = (trial / "llm_server.log").read_bytes().rstrip(b"\n").replace(b"\n", b"\r\n")
    (trial / "llm_server.log").write_bytes(server)

    # Empty files, a symlink loop, a file nobody may read.
    (trial / "main.log").write_bytes(b"")
    (trial / "empty.log").write_bytes(b"")
    (trial / "loop_a").symlink_to("loop_b")
    (trial / "loop_b").symlink_to("loop_a")
    (trial / "self").symlink_to(".", target_is_directory=True)
    secret = trial / "secret.log"
    secret.write_bytes(b"\n".join(lines[:200]) + b"\n")
    secret.chmod(0)
    if hasattr(os, "mkfifo"):  # a named pipe with a log's name: opening it would wait for a writer
        os.mkfifo(trial / "rollout.log")

    # Checkpoints: a zero-length shard, a safetensors file with a corrupt header, bad step_info.json.
    ckpt = outputs / CKPT / "default"
    (ckpt / "epoch1epochstep464globalstep1399" / "model.safetensors").write_bytes(b"")
    corrupt = ckpt / "epoch1epochstep564globalstep1499" / "model.safetensors"
    body = corrupt.read_bytes()
    corrupt.write_bytes(body[:8] + b"{not json at all" + body[24:])
    (outputs / CKPT / "recover_info" / "step_info.json").write_text('{"global_step": 13', encoding="utf-8")
    (ckpt / "epoch9epochstep9globalstep99999999999999999999").mkdir()  # not a step any run reaches
    return outputs


@pytest.fixture
def damaged(tmp_path: Path):
    tree = build_damaged_tree(tmp_path / "tree")
    yield tree
    for folder, dirs, files in os.walk(tree):  # restore write/read permission so tmp_path can be removed
        for name in [*dirs, *files]:
            path = Path(folder, name)
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR | stat.S_IRUSR)
    tree.chmod(tree.stat().st_mode | stat.S_IWUSR)


def physical_line(path: str, number: int) -> str:
    """Line ``number`` counting ``\\n`` only (conftest's ``read_line`` also splits at a lone ``\\r``)."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.split(b"\n")[number - 1].decode("utf-8", errors="replace")


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "Traceback" not in text, text[-3000:]
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def analyze_doc(tree: Path, out: Path, *extra: str) -> tuple[dict, int]:
    doc_path = out / "analysis.json"
    result = invoke("analyze", str(tree), "--json", str(doc_path), "--out", str(out / "report"), *extra)
    assert result.exit_code in (0, 1), result.output[-2000:]
    return json.loads(doc_path.read_text()), result.exit_code


def test_analyze_survives_damage(damaged: Path, tmp_path: Path) -> None:
    before = tree_state(damaged)
    doc, code = analyze_doc(damaged, tmp_path)
    assert code == 0  # no --fail-on-incident: an incident is a finding, not a failure
    [run] = doc["runs"]
    first = run["incidents"][0]
    assert (first["kind"], first["onset_step"]) == ("reward_collapse", 940)
    assert first["cause"] == "inference_server_unresponsive"

    # Rotated copies are read oldest first, each with its own line numbers.
    trainer = [s for s in run["sources"] if Path(s["path"]).name.startswith("trainer.log")]
    assert [Path(s["path"]).name for s in trainer] == ["trainer.log.2.gz", "trainer.log.1", "trainer.log"]
    counts = {Path(s["path"]).name: s for s in trainer}
    # counted to the last line with text (a trailing table rule is not counted)
    assert ROTATE_AT[0] - 5 <= counts["trainer.log.2.gz"]["lines"] <= ROTATE_AT[0]
    # the damaged middle copy: its junk lines are counted as unparsed, never dropped silently
    assert counts["trainer.log.1"]["unparsed_lines"] >= 4
    # a header whose step number is damaged: counted, said, its table not given to another step
    assert counts["trainer.log.2.gz"]["unparsed_lines"] >= 1
    assert any("no readable step number" in note for note in counts["trainer.log.2.gz"]["notes"])
    assert run["steps"]["first"] == 1 and run["steps"]["last"] >= 1800

    # What could not be read is said: the unreadable file (not as root), the bad checkpoints.
    said = json.dumps(run)
    if not IS_ROOT:
        assert "secret.log" in said
    if hasattr(os, "mkfifo"):
        assert "rollout.log: a named pipe, not a file: not read" in said
    checkpoints = {Path(c["path"]).name: c for c in run["checkpoints"]}
    # the recover checkpoint whose step_info.json does not parse is not trusted (the reason is not
    # in the v1 document: checkpoints carry no problems field)
    assert all(not c["complete"] for c in run["checkpoints"] if c["kind"] == "recover")
    assert checkpoints["epoch1epochstep464globalstep1399"]["complete"] is False
    assert checkpoints["epoch1epochstep564globalstep1499"]["complete"] is False
    assert not any("99999999999999999999" in name for name in checkpoints)
    assert run["recommendation"]["step"] == 900

    # Evidence points at real lines of the damaged files.
    for item in first["evidence"]:
        line = re.sub(r"\x1b\[[0-9;]*m", "", physical_line(item["file"], item["line"])).rstrip()
        assert item["text"][:120] in line or item["text"].startswith(line), item

    assert tree_state(damaged) == before


def test_fail_on_incident_exit_code(damaged: Path, tmp_path: Path) -> None:
    _, code = analyze_doc(damaged, tmp_path, "--fail-on-incident")
    assert code == 1


@pytest.fixture(params=["cache", "no-cache"])
def cache_args(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    """Each untouched-tree test runs with a fresh parse cache (cold, then warm) and without one."""
    return ["--cache-dir", str(tmp_path / "cache")] if request.param == "cache" else ["--no-cache"]


def all_commands(tree: Path, out: Path, cache: list[str]) -> None:
    """Every command over ``tree``, each asserted to answer without a traceback."""
    doc, code = analyze_doc(tree, out, *cache)
    assert code == 0 and doc["runs"][0]["incidents"][0]["onset_step"] == 940
    best = invoke("best-checkpoint", str(tree), *cache)
    assert best.exit_code == 0 and best.output.strip().endswith("epoch0epochstep899globalstep899")
    events = invoke("events", str(tree), *cache)
    assert events.exit_code == 0
    rows = [json.loads(line) for line in events.output.splitlines() if line.startswith("{")]
    assert any(r["kind"] == "request_timeout" for r in rows)
    metrics = invoke("metrics", str(tree), "--format", "jsonl", "--output", str(out / "m.jsonl"), *cache)
    assert metrics.exit_code == 0 and (out / "m.jsonl").stat().st_size > 0
    compare = invoke("compare", str(FIXTURES / "areal_seed000" / "outputs"), str(tree), "--out", str(out / "cmp"), *cache)
    assert compare.exit_code == 0, compare.output[-2000:]


def test_every_command_answers_without_writing_into_the_tree_or_the_network(damaged: Path, tmp_path: Path, cache_args: list[str],
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With a cache: every command on the tree as found (cold), then on the tree made read-only
    (served from the cache, its reports written again over the first). Without: on the read-only
    tree (as root, which may write anyway, the tree's state is what shows nothing was written).
    Sockets are forbidden throughout: only ``--wandb`` may reach out."""
    import socket

    tried: list[object] = []

    def refuse(*args: object, **kwargs: object) -> None:
        tried.append(args)
        raise OSError("network access attempted in a test that forbids it")

    for name in ("connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    before = tree_state(damaged)
    if "--cache-dir" in cache_args:
        all_commands(damaged, tmp_path, cache_args)
        assert tree_state(damaged) == before and any((tmp_path / "cache" / "parsed").iterdir())
    for folder, dirs, files in os.walk(damaged):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    damaged.chmod(damaged.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = tree_state(damaged)
    all_commands(damaged, tmp_path, cache_args)
    assert tree_state(damaged) == before
    assert tried == []


def test_cache_inside_the_tree_is_refused(damaged: Path, tmp_path: Path) -> None:
    before = tree_state(damaged)
    refused = invoke("analyze", str(damaged), "--cache-dir", str(damaged / "cache"), "--no-html")
    assert refused.exit_code == 2 and "inside the analyzed path" in refused.stderr
    assert tree_state(damaged) == before


@pytest.mark.parametrize(
    "command",
    [
        ["analyze", "{tree}", "--no-html", "--json", "{tree}/a.json"],
        ["analyze", "{tree}", "--no-html", "--markdown", "{tree}/logs/a.md"],
        ["analyze", "{tree}", "--out", "{tree}/report"],
        ["metrics", "{tree}", "--output", "{tree}/m.csv"],
        ["compare", "{tree}", "{tree}", "--no-html", "--json", "{tree}/c.json"],
    ],
)
def test_an_output_inside_the_tree_is_refused_before_any_work(damaged: Path, command: list[str]) -> None:
    before = tree_state(damaged)
    refused = invoke(*[part.format(tree=damaged) for part in command], "--no-cache")
    assert refused.exit_code == 2 and "inside the analyzed path" in refused.stderr
    assert refused.stdout == ""  # refused first: no summary printed, nothing read
    assert tree_state(damaged) == before


def test_an_out_folder_that_is_a_file_is_refused_first(damaged: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("mine")
    refused = invoke("analyze", str(damaged), "--no-cache", "--out", str(tmp_path / "afile"))
    assert refused.exit_code == 2 and refused.stdout == "" and "is a file; give a folder" in refused.stderr
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("option", [["analyze", "--json"], ["analyze", "--markdown"], ["metrics", "--output"],
                                    ["compare", "{tree}", "--json"]])
def test_a_file_output_that_is_a_folder_is_refused_first(damaged: Path, tmp_path: Path, option: list[str]) -> None:
    """``--json DIR``: refused before the analysis, in a sentence, not after it with a raw errno."""
    command, *rest, flag = option
    refused = invoke(command, str(damaged), *[part.format(tree=damaged) for part in rest], "--no-cache", flag, str(tmp_path))
    assert refused.exit_code == 2 and refused.stdout == ""
    assert f"{flag} {tmp_path} is a folder; give a file to write (or - for stdout)" in refused.stderr


def test_outputs_beside_a_log_given_alone_are_inside_its_run(tmp_path: Path) -> None:
    """A file given alone is read with its folder (the run's: checkpoints, config): a cache or report
    there is refused, one elsewhere is not; a loop or a missing path is answered as such."""
    log = tmp_path / "run" / "trainer.log"
    log.parent.mkdir()
    log.write_bytes(gzip.decompress((FIXTURES / "areal_seed000/outputs/logs/root/gsm8k-grpo-full-local/trial0/trainer.log.gz").read_bytes()))
    beside = invoke("best-checkpoint", str(log), "--cache-dir", str(log.parent / "cache"))
    assert beside.exit_code == 2 and "inside the analyzed path" in beside.stderr and not (log.parent / "cache").exists()
    best = invoke("best-checkpoint", str(log), "--cache-dir", str(tmp_path / "cache"))
    # Not refused: no checkpoint beside it, though the log says some were saved — so not known, exit 2.
    assert "inside" not in best.stderr and "Yet the logs say checkpoints were saved" in best.stderr, best.stderr
    missing = invoke("analyze", str(tmp_path / "nothing-here"), "--cache-dir", str(tmp_path / "cache"))
    assert missing.exit_code == 2 and "no such file" in missing.stderr
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for command in (["analyze", "--no-html"], ["events"], ["metrics"], ["best-checkpoint"]):
        looped = invoke(*command, str(tmp_path / "a"), "--cache-dir", str(tmp_path / "cache"))
        assert looped.exit_code == 2, (command, looped.stderr)


def test_hostile_text_is_escaped(damaged: Path, tmp_path: Path) -> None:
    analyze_doc(damaged, tmp_path)
    page = (tmp_path / "report" / "report.html").read_text(encoding="utf-8")
    assert "alert(1)" in page  # the line is shown ...
    for raw in ("<script>alert(1)", "<img src=x onerror", "javascript:alert(3))\"", 'src="http://evil'):
        assert raw not in page, raw  # ... but never as live markup
    markdown = invoke("analyze", str(damaged), "--markdown", "-", "--no-html")
    assert markdown.exit_code == 0
    assert "alert(1)" in markdown.stdout
    text = re.sub(r"`[^`\n]*`", "", markdown.stdout)  # a code span shows its text literally: safe
    for raw in ("<script>", "<img src=x", "[x](javascript:", "![i](http://evil"):
        assert raw not in text, raw


def test_debug_traceback_only_for_genuine_errors(damaged: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    plain = runner.invoke(app, ["analyze", str(missing), "--out", str(tmp_path / "r")])
    assert plain.exit_code == 2 and "Traceback" not in plain.output + plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1
    debug = runner.invoke(app, ["analyze", str(missing), "--out", str(tmp_path / "r"), "--debug"])
    assert debug.exit_code == 2  # stderr may carry the traceback here
    healthy = runner.invoke(app, ["analyze", str(damaged), "--out", str(tmp_path / "r"), "--debug", "--no-html"])
    assert healthy.exit_code == 0 and "Traceback" not in healthy.output + healthy.stderr


@pytest.mark.skipif(IS_ROOT, reason="root bypasses file permissions, so the unreadable-file case cannot be made")
def test_unreadable_file_is_reported_not_raised(damaged: Path, tmp_path: Path) -> None:
    doc, _ = analyze_doc(damaged, tmp_path)
    assert "secret.log" in json.dumps(doc)
    lone = invoke("analyze", str(damaged / TRIAL / "secret.log"), "--no-html")
    assert lone.exit_code == 2


@pytest.mark.skipif(IS_ROOT and shutil.which("setpriv") is None, reason="root reads any file; setpriv (util-linux) drops that")
def test_an_unreadable_log_given_by_name_is_said_in_one_line(tmp_path: Path) -> None:
    """A log the user names but may not read: exit 2 and one line saying so (Click's usage box,
    several lines, before)."""
    import subprocess
    import sys

    log = tmp_path / "run" / "train.log"
    log.parent.mkdir()
    shutil.copy(FIXTURES / "seed003" / "train.log", log)
    log.chmod(0)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if IS_ROOT else []
    done = subprocess.run([*drop, sys.executable, "-c", "from forensics.cli import app; app()", "analyze", str(log),
                           "--no-html", "--no-cache", "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=120)
    log.chmod(0o644)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Permission denied" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_is_named_not_opened(damaged: Path) -> None:
    """Given by name, a pipe is refused with why (exit 2); it is never opened, which would wait
    for a writer that will not come."""
    lone = invoke("analyze", str(damaged / TRIAL / "rollout.log"), "--no-html")
    assert lone.exit_code == 2
    assert "rollout.log: a named pipe, not a file: not read" in " ".join(lone.output.split())


def test_a_folder_tree_thousands_deep_is_walked_not_a_recursion_error(tmp_path: Path) -> None:
    """Python 3.11's os.walk and rglob recurse once per level: 1,500 nested folders beside the run
    stopped the whole analysis (exit 70). The run is analyzed; the walk reaches the deepest file."""
    outputs = tmp_path / "outputs"
    shutil.copytree(FIXTURES / "areal_seed000" / "outputs", outputs)
    deep = outputs / TRIAL
    for _ in range(1500):  # (deeper than the recursion limit, within the longest path a call takes)
        deep = deep / "d"
        deep.mkdir()
    (deep / "worker.log").write_text("RuntimeError: deep down\n")
    from parsers._walk import walk

    assert [name for _, _, names in walk(outputs) for name in names if name == "worker.log"] == ["worker.log"]
    try:
        result = invoke("analyze", str(outputs), "--no-html", "--no-cache")
        assert result.exit_code == 0, result.output
    finally:  # (shutil.rmtree, pytest's cleanup, recurses too)
        (deep / "worker.log").unlink()
        while deep != outputs / TRIAL:
            deep.rmdir()
            deep = deep.parent


def _seed_trial(tmp_path: Path) -> tuple[Path, bytes]:
    outputs = tmp_path / "run" / "outputs"
    shutil.copytree(FIXTURES / "areal_seed000" / "outputs", outputs, symlinks=True)
    packed = outputs / TRIAL / "trainer.log.gz"
    return packed, packed.read_bytes()


@pytest.mark.parametrize("damage", ["cut", "corrupt", "junk", "padded"])
def test_an_unread_part_is_warned_wherever_the_verdict_is(tmp_path: Path, damage: str) -> None:
    """A torn or corrupt .gz reads as a shorter log, a junk trainer.log.gz as none: each says so in
    the terminal, the Markdown and the HTML, not only in the JSON. Zero padding after the last
    gzip member (some tools add it) is no damage."""
    packed, data = _seed_trial(tmp_path)
    if damage == "cut":
        packed.write_bytes(data[: len(data) * 3 // 5])
    elif damage == "corrupt":
        middle = len(data) * 3 // 5
        packed.write_bytes(data[:middle] + bytes(b ^ 0x5A for b in data[middle : middle + 64]) + data[middle + 64 :])
    elif damage == "junk":
        packed.write_bytes(bytes(random.Random(3).randrange(256) for _ in range(50_000)))
    else:
        packed.write_bytes(data + b"\0" * 1024)
    out = tmp_path / "out"
    result = invoke("analyze", str(tmp_path / "run"), "--no-cache", "--out", str(out), "--json", str(out / "a.json"),
                    "--markdown", str(out / "a.md"))
    [run] = json.loads((out / "a.json").read_text())["runs"]
    [trainer] = [s for s in run["sources"] if Path(s["path"]).name == "trainer.log.gz"]
    terminal, markdown, page = result.output, (out / "a.md").read_text(), (out / "report.html").read_text()
    if damage == "padded":
        assert not any("gzip" in note for note in trainer["notes"])
        assert run["incidents"][0]["onset_step"] == 940 and "warning: trainer.log" not in terminal
        return
    said = {"cut": "gzip stream cut off", "corrupt": "gzip stream corrupt", "junk": "no format this tool reads"}[damage]
    assert any(said in note for note in trainer["notes"]), trainer
    assert "warning: trainer.log.gz" in " ".join(terminal.split())
    assert said in " ".join(terminal.split()) and said in markdown and said in page
    assert "looks healthy" not in terminal + markdown + page
    if damage == "junk":  # nothing judged: the newest checkpoint (saved after the collapse) is not called healthy
        best = invoke("best-checkpoint", str(tmp_path / "run"), "--no-cache")
        assert best.exit_code == 2 and best.stdout == "" and "no checkpoint can be called healthy" in best.stderr
    if damage == "cut":  # the step log's copy ends early: silence after it is the copy's end, not the run's
        assert [i["kind"] for i in run["incidents"]] == ["reward_collapse"]  # no stall invented where the copy ends
        last = run["steps"]["last"]
        assert f"had not recovered by step {last}, the last step that could be read" in run["incidents"][0]["summary"]
        assert any(n.startswith(f"steps after step {last} could not be read") and "checkpoints were saved up to step 1869" in n
                   for n in run["notes"]), run["notes"]


def test_checkpoints_saved_past_the_last_step_read_mean_the_run_went_on(tmp_path: Path) -> None:
    """A trainer.log copied while the run was young (cut at a line, nothing torn): checkpoints go
    to step 1869, so the silence after its last step is no stall, and the collapse is said as far
    as the steps go."""
    packed, data = _seed_trial(tmp_path)
    text = gzip.decompress(data)
    packed.unlink()
    packed.with_suffix("").write_bytes(text[: text.rindex(b"\n", 0, len(text) * 11 // 20) + 1])
    [run] = analyze([tmp_path / "run"]).runs
    assert [i.kind for i in run.incidents] == ["reward_collapse"]
    last = int(run.steps["step"].max())
    assert last < 1869 and f"had not recovered by step {last}" in run.incidents[0].summary
    assert any("checkpoints were saved up to step 1869" in n for n in run.notes), run.notes


def test_a_utf16_log_is_said_not_read(tmp_path: Path) -> None:
    """A server log saved as UTF-16 (a Windows tool's copy): every other byte a NUL, nothing in it
    can be read as UTF-8 text — a warning that says so and how to convert it, not a silent loss."""
    from areal_builder import RunSpec, write_run

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=20))
    server = paths.log_dir / "llm_server.log"
    server.write_bytes(server.read_text().encode("utf-16"))
    [run] = analyze([paths.fileroot]).runs
    [report] = [s for s in run.sources if s.path == str(server)]
    assert "not read: the file is UTF-16 text (convert it with iconv -f UTF-16 -t UTF-8)" in report.notes
    assert run.caveat() is not None
    [trainer] = [s for s in run.sources if s.path == str(paths.trainer_log)]
    assert not [n for n in trainer.notes if "UTF-16" in n]


def test_a_payload_dumped_on_one_line_is_cut_to_its_ends(tmp_path: Path) -> None:
    """AReaL prints a failed request's whole payload on its error line (here 40 MB): the event keeps
    the line's head and its last error, says how much it left out, and every line after it keeps
    its number. A main.log that is one line of junk is said not read, not dropped in silence."""
    from areal_builder import RunSpec, write_run

    from parsers._lines import LONG_LINE

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=20))
    lines = paths.trainer_log.read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if b"Train step 10/" in line)
    stamp = re.search(rb"\d{8}-\d\d:\d\d:\d\d\.\d{3}", lines[at])[0]  # type: ignore[index]
    payload = (b"\x1b[31m" + stamp + b" [Remote Inference Engine Rank 0] ERROR: Workflow execution failed: Failed after"
               b" 3 retries each. Payload: {'input_ids': [" + b"151644, " * 5_000_000 + b"]}. Last error: TimeoutError()\x1b[0m")
    lines.insert(at, payload)
    paths.trainer_log.write_bytes(b"\n".join(lines))
    (paths.log_dir / "main.log").write_bytes(b"x" * (3 << 20))

    [run] = analyze([paths.fileroot]).runs
    [event] = run.events.filter(pl.col("line") == at + 1).to_dicts()
    assert event["kind"] == "workflow_failed"
    assert len(event["message"]) < LONG_LINE / 8
    assert event["message"].endswith("Last error: TimeoutError()")
    assert "bytes of this line left out" in event["message"]
    [step] = run.steps.filter(pl.col("step") == 15).to_dicts()
    assert "Train step 15/" in physical_line(step["file"], step["line"])
    [junk] = [s for s in run.sources if s.path == str(paths.log_dir / "main.log")]
    assert "named like a trainer or server log, but no format this tool reads" in junk.notes[0]


def test_a_collapse_under_way_where_the_log_starts_leaves_no_checkpoint_known_healthy(tmp_path: Path) -> None:
    """Only the newest part of trainer.log was copied: it starts at step 41 with the reward already
    zero (the collapse began at 30, unseen). The step-40 checkpoint is 10 steps into the collapse:
    none is called healthy, best-checkpoint exits 4, and the reason names the newest candidate."""
    from areal_builder import RunSpec, healthy_reward, write_run

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, save_freq_steps=10,
                                                    reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))
    text = paths.trainer_log.read_text()
    paths.trainer_log.write_text(text[text.rindex("\n", 0, text.index("Train step 41/")) + 1:])
    [run] = analyze([paths.fileroot]).runs
    assert [(i.kind, i.onset_step) for i in run.incidents] == [("reward_collapse", 41)]
    rec = run.recommendation
    assert rec.checkpoint is None and "already under way at step 41, the first step the logs hold" in rec.reason
    assert "The newest before it is step 40" in rec.reason
    result = runner.invoke(app, ["best-checkpoint", str(paths.fileroot), "--no-cache"])
    assert result.exit_code == 4 and result.stdout == ""


def test_a_trainer_log_ending_in_killed_is_a_crash(tmp_path: Path) -> None:
    """The kernel's OOM killer SIGKILLs the trainer: its log ends with the shell's bare ``Killed``
    (no traceback, no ``Training completes!``). A crash after the last step, the line cited, and
    where to look for why; the same word in the server's log is the server's, not a training crash."""
    from areal_builder import RunSpec, write_run

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=20))
    with paths.trainer_log.open("a") as fh:
        fh.write("Killed\n")
    [run] = analyze([paths.fileroot]).runs
    [crash] = run.incidents
    # (the line has no time of its own: it takes the last logged line's, step 20's table)
    assert (crash.kind, crash.cause) == ("crash", "training_worker_crash") and crash.onset_step in (20, 21)
    assert "and the run logged no step after it" in crash.summary
    last = len(paths.trainer_log.read_text().splitlines())
    assert (crash.evidence[0].kind, crash.evidence[0].file, crash.evidence[0].line) == ("process_killed", str(paths.trainer_log), last)
    assert any("dmesg" in s for s in crash.suggestions)

    server = write_run(tmp_path / "other", RunSpec(last_step=20))
    with (server.log_dir / "llm_server.log").open("a") as fh:
        fh.write("Killed\n")
    [other] = analyze([server.fileroot]).runs
    assert not [i for i in other.incidents if i.kind == "crash"]


@pytest.mark.parametrize(
    ("damage", "said"),
    [("utf-16", "not read: the file is UTF-16 text (convert it with iconv -f UTF-16 -t UTF-8)"),
     ("empty", "empty: nothing to read"),
     ("junk", "named like a trainer or server log, but no format this tool reads")],
)
def test_a_verl_console_that_cannot_be_read_is_named(tmp_path: Path, damage: str, said: str) -> None:
    """verl's console (``train.log``, its step lines) saved by PowerShell as UTF-16, left empty or
    overwritten with junk: the run is judged on its JSONL copy, and the console is named as unread
    with why — never dropped without a word."""
    from verl_builder import VerlRunSpec, write_verl_run

    paths = write_verl_run(tmp_path / "run", VerlRunSpec(steps=40, save_freq=10, score=lambda s: 0.0 if s >= 30 else 0.5))
    console = paths.train_log
    assert console.name == "train.log"
    console.write_bytes({"utf-16": console.read_text().encode("utf-16"), "empty": b"",
                         "junk": bytes(random.Random(5).randrange(1, 256) for _ in range(20_000))}[damage])
    [run] = analyze(tmp_path / "run").runs
    [unread] = [s for s in run.sources if Path(s.path).name == "train.log"]
    assert unread.kind == "unreadable" and any(said in note for note in unread.notes), unread
    assert any(said in note for note in run.data_lost())


def test_control_characters_from_logs_and_folder_names_never_reach_a_terminal(tmp_path: Path) -> None:
    """A trial folder named with a terminal title sequence and a right-to-left override, and a log
    line carrying a title and a hyperlink (OSC) sequence: the terminal summary, the Markdown, the
    alarms and the report show them as escapes; events keep the line without them."""
    from datetime import timedelta

    from areal_builder import LogLine, RunSpec, healthy_reward, write_run

    osc = "\x1b]0;HACKED\x07\x1b]8;;http://evil.example/\x07click\x1b]8;;\x07"

    def timeout(step: int, at) -> list[LogLine]:
        said = f"HTTP request to 172.17.0.2:30000/generate timed out after 600.00s (attempt 1/3) {osc}"
        return [LogLine(at - timedelta(seconds=5), said, "/AReaL/areal/utils/http.py", "WARNING")] if 58 <= step <= 61 else []

    trial = "trial0\x1b]0;FROM_FOLDER\x07\u202egnp.exe"
    paths = write_run(tmp_path / "outputs", RunSpec(last_step=90, trial=trial, step_lines=timeout,
                                                     reward=lambda step: 0.0 if step >= 60 else healthy_reward(step)))
    out = tmp_path / "report"
    shown = [invoke("analyze", str(paths.fileroot), "--out", str(out), "--no-cache"),
             invoke("analyze", str(paths.fileroot), "--markdown", "-", "--no-html", "--no-cache"),
             invoke("watch", str(paths.fileroot), "--replay")]
    for result in shown:
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output and "\u202e" not in result.output
    for result in shown[:2]:  # (the run is named by its folder, shown; rich drops the BEL itself)
        assert "trial0\\x1b]0;FROM_FOLDER" in result.output and "\\u202egnp.exe" in result.output
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "\x1b" not in page and "\u202e" not in page and "\\u202egnp.exe" in page
    events = [json.loads(line) for line in invoke("events", str(paths.fileroot), "--kind", "request_timeout", "--no-cache").stdout.splitlines()]
    assert events and all("\x1b" not in e["message"] and e["message"].endswith("(attempt 1/3) click") for e in events)


def _as_a_user(command: list[str]) -> list[str]:
    """``command`` without root's power to read every folder (the reviewer's case: a checkpoint
    folder owned by a service account), through ``setpriv`` when running as root."""
    if os.geteuid() != 0:
        return command
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root reads every folder, and setpriv is not here to drop that power")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--", *command]


def _cli(args: list[str], cwd: Path, *, as_user: bool = False, cache: bool = False):
    """The command in a process of its own; ``cache``: with the session's parse cache (a user's
    default), for tests that read the same logs many ways."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "forensics", *args, *([] if cache else ["--no-cache"])]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(_as_a_user(command) if as_user else command, cwd=cwd, env=env, capture_output=True, text=True)


def test_a_fleet_says_what_it_could_not_read(tmp_path: Path) -> None:
    """Runs side by side, one folder among them unreadable, and one run's log: a fleet said
    nothing of either (a single run prints them as warnings) — each is said once on stderr, and a
    folder inside one run's is that run's note alone, not every run's."""
    team = tmp_path / "team"
    for name in ("sglang_hang", "sglang_oom"):
        shutil.copytree(FIXTURES / name, team / name)
    (team / "locked").mkdir()
    (team / "locked").chmod(0)
    oom_trial = next((team / "sglang_oom").rglob("trainer.log*")).parent
    (oom_trial / "node2").mkdir()
    (oom_trial / "node2").chmod(0)
    try:
        done = _cli(["analyze", str(team), "--no-html", "--out", str(tmp_path / "out"), "--workers", "2"], tmp_path, as_user=True)
    finally:
        for folder in (team / "locked", oom_trial / "node2"):
            folder.chmod(0o700)
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if "warning" in line]
    assert [w for w in warned if "locked" in w] == ["grpo-forensics: warning: locked: Permission denied"]
    assert [w for w in warned if "node2" in w] == ["grpo-forensics: warning: gsm8k-grpo-oom/trial0: node2: Permission denied"]
    assert pl.read_parquet(tmp_path / "out" / "index.parquet").height == 2


def test_a_fleet_started_in_a_folder_its_workers_cannot_enter_runs_in_this_process(tmp_path: Path) -> None:
    """``su nobody -c …`` from /root: spawned workers start in the caller's folder, could not enter
    it and died, every run misreported as killed for memory (exit 70)."""
    shut = tmp_path / "shut"
    shut.mkdir()
    runs = [str(FIXTURES / name / "outputs") for name in ("sglang_hang", "sglang_oom")]
    shut.chmod(0)
    try:
        done = _cli(["analyze", *runs, "--no-html", "--out", str(tmp_path / "out"), "--workers", "2"], shut, as_user=True)
    finally:
        shut.chmod(0o700)
    assert done.returncode == 0, done.stderr
    assert "worker processes could not start in the current folder" in " ".join(done.stdout.split())
    assert pl.read_parquet(tmp_path / "out" / "index.parquet")["error"].null_count() == 2


def test_the_checkpoint_answer_does_not_depend_on_how_the_run_is_spelled(tmp_path: Path) -> None:
    """From inside the trial's log folder, ``.``, ``../trial0`` and a log's name are the same run
    as its absolute path: its checkpoints are found (they had been lost: exit 4, "none saved")."""
    shutil.copytree(FIXTURES / "sglang_hang", tmp_path / "run")
    trial = tmp_path / "run" / "outputs" / "logs" / "root" / "gsm8k-grpo-hang" / "trial0"
    answers = {spelled: _cli(["best-checkpoint", spelled], trial) for spelled in (str(trial), ".", "../trial0", "trainer.log.gz")}
    assert {(r.returncode, Path(r.stdout.strip()).resolve()) for r in answers.values()} == {
        (0, Path(answers[str(trial)].stdout.strip()).resolve())}, {k: (r.returncode, r.stdout, r.stderr) for k, r in answers.items()}


def test_a_report_folder_that_cannot_be_written_is_known_before_the_analysis(tmp_path: Path) -> None:
    """Run from a folder the user may not write: the default report goes to the user's temp folder
    (it was the whole summary, then exit 2 for ``grpo-forensics-report``); an ``--out`` there is
    refused before anything is analyzed."""
    shut = tmp_path / "shared"
    shut.mkdir()
    shut.chmod(0o555)
    runs = [str(FIXTURES / name / "outputs") for name in ("sglang_hang", "sglang_oom")]
    try:
        alone = _cli(["analyze", runs[0]], shut, as_user=True)
        fleet = _cli(["analyze", *runs, "--no-html"], shut, as_user=True)
        refused = _cli(["analyze", runs[0], "--out", str(shut / "report")], shut, as_user=True)
    finally:
        shut.chmod(0o700)
    assert alone.returncode == 0, alone.stderr
    [written] = re.findall(r"report:(\S+)", re.sub(r"\s+", "", alone.stdout))
    assert Path(written).is_file() and Path(written).parent.name.startswith("grpo-forensics-report-")
    assert fleet.returncode == 0 and "index:" in fleet.stdout, fleet.stderr
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip() == f"grpo-forensics: --out {shut / 'report'} cannot be written: permission denied"


def test_a_runs_logs_given_one_by_one_are_the_run_as_its_folder_is(tmp_path: Path) -> None:
    """Rotated parts, the server log, a .gz twin, and the run's checkpoint folder given beside it:
    one run with the folder's verdict. They had been a run each (the live part's collapse at step
    1033 with no checkpoint, the server log an empty run, every value exported twice), and the
    checkpoint folder 'no training run found', exit 2."""
    import gzip as gz

    shutil.copytree(FIXTURES / "areal_seed000", tmp_path / "run")
    trial = tmp_path / "run" / "outputs" / "logs" / "root" / "gsm8k-grpo-full-local" / "trial0"
    lines = gz.decompress((trial / "trainer.log.gz").read_bytes()).splitlines(keepends=True)
    (trial / "trainer.log.gz").unlink()
    cut = next(i for i, line in enumerate(lines) if i > len(lines) // 2 and b"Train step" in line)
    (trial / "trainer.log.1").write_bytes(b"".join(lines[:cut]))
    (trial / "trainer.log").write_bytes(b"".join(lines[cut:]))
    (trial / "llm_server.log.gz").write_bytes(gz.compress((trial / "llm_server.log").read_bytes()))

    def verdict(*paths: Path) -> list[tuple]:
        done = _cli(["analyze", *map(str, paths), "--no-html", "--json", "-"], tmp_path, cache=True)
        assert done.returncode == 0, done.stderr
        return [(r["run_id"], [(i["kind"], i["onset_step"], i["cause"]) for i in r["incidents"]], r["recommendation"]["step"])
                for r in json.loads(done.stdout)["runs"]]

    folder = verdict(trial)
    assert folder[0][1][0] == ("reward_collapse", 940, "inference_server_unresponsive") and folder[0][2] == 900
    checkpoints = tmp_path / "run" / "outputs" / "checkpoints"
    assert verdict(trial / "trainer.log.1", trial / "trainer.log", trial / "llm_server.log", trial / "llm_server.log.gz") == folder
    assert verdict(trial, checkpoints) == verdict(trial / "trainer.log", trial / "trainer.log.1", trial / "llm_server.log") == folder
    rows = _cli(["metrics", str(trial / "llm_server.log"), str(trial / "llm_server.log.gz")], tmp_path).stdout
    assert rows == _cli(["metrics", str(trial / "llm_server.log")], tmp_path).stdout
    # The logs copied off the cluster, the checkpoints given from where they are kept: the run's.
    copy = shutil.copytree(trial, tmp_path / "copy" / "trial0")
    for kept in (checkpoints, checkpoints / "root" / "gsm8k-grpo-full-local" / "trial0"):
        assert [v[1:] for v in verdict(copy, kept)] == [v[1:] for v in folder]
    # One part given alone: what it leaves beside it is said, not silently left out.
    alone = _cli(["analyze", str(trial / "trainer.log"), "--no-html", "--json", "-"], tmp_path)
    [run] = json.loads(alone.stdout)["runs"]
    assert sorted(Path(s["path"]).name for s in run["sources"] if s["kind"] == "not_given") == [
        "llm_server.log", "llm_server.log.gz", "trainer.log.1"]
    assert "warning: trainer.log.1: not read: beside the log given" in " ".join(alone.stderr.split())


def test_links_to_folders_are_not_followed_but_said_when_nothing_else_is_found(tmp_path: Path) -> None:
    """A folder of links to runs kept elsewhere, a trial's logs linked into ``outputs/logs``: links
    in a walked tree are not followed (one to ``/``, to ``..`` or to a sibling run would take in
    what was not given), but where nothing else was found the answer says so and how to give them;
    given as paths, they are read."""
    shutil.copytree(FIXTURES / "areal_seed000" / "outputs", tmp_path / "outputs")
    experiment = tmp_path / "outputs" / "logs" / "root" / "gsm8k-grpo-full-local"
    (experiment / "trial0").rename(tmp_path / "kept_trial0")
    (experiment / "trial0").symlink_to(tmp_path / "kept_trial0")
    shutil.copytree(FIXTURES / "sglang_oom" / "outputs", tmp_path / "store" / "oom")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "oom").symlink_to(tmp_path / "store" / "oom")
    (tmp_path / "runs" / "up").symlink_to("..")
    for folder, link in ((tmp_path / "outputs", experiment / "trial0"), (tmp_path / "runs", tmp_path / "runs" / "oom")):
        done = _cli(["analyze", str(folder), "--no-html", "--out", str(tmp_path / "out")], tmp_path)
        assert done.returncode == 2 and "links to folders are not followed" in done.stderr and str(link) in done.stderr, done.stderr
        alone = _cli(["analyze", str(link), "--no-html", "--json", "-", "--out", str(tmp_path / "out")], tmp_path)
        assert alone.returncode == 0 and json.loads(alone.stdout)["runs"][0]["incidents"], alone.stderr
    # A link into the run's own folder (``latest -> trial0``) is no second run.
    (tmp_path / "kept_trial0" / "latest").symlink_to(".")
    done = _cli(["analyze", str(tmp_path / "kept_trial0"), "--no-html", "--json", "-", "--out", str(tmp_path / "out")], tmp_path)
    assert done.returncode == 0 and len(json.loads(done.stdout)["runs"]) == 1


def test_nothing_is_written_into_the_checkpoints_a_run_given_by_its_logs_reads(tmp_path: Path) -> None:
    """Given the trial's log folder or a log, its checkpoint folder is read (the recommendation is
    there): ``--out`` or ``--json`` into it is refused, as with ``outputs/`` given."""
    shutil.copytree(FIXTURES / "sglang_oom", tmp_path / "run")
    trial = next((tmp_path / "run" / "outputs" / "logs").rglob("trainer.log*")).parent
    saved = tmp_path / "run" / "outputs" / "checkpoints" / trial.relative_to(tmp_path / "run" / "outputs" / "logs")
    before = tree_state(tmp_path / "run")
    for given, option in ((trial, ["--out", str(saved / "rep")]), (next(trial.glob("trainer.log*")), ["--json", str(saved / "a.json")])):
        done = _cli(["analyze", str(given), "--no-html", *option], tmp_path)
        assert done.returncode == 2 and "is inside the analyzed path" in done.stderr, done.stderr
    assert tree_state(tmp_path / "run") == before


def test_a_checkpoint_folder_that_cannot_be_listed_is_said_not_called_empty(tmp_path: Path) -> None:
    """The logs are readable, the trial's checkpoint folder is not (another account's): the logs
    are analyzed, the folder is named unread, and best-checkpoint exits 2 (not 4, "none saved before")."""
    shutil.copytree(FIXTURES / "sglang_hang", tmp_path / "run")
    hidden = tmp_path / "run" / "outputs" / "checkpoints" / "root" / "gsm8k-grpo-hang" / "trial0" / "default"
    hidden.chmod(0)
    try:
        best = _cli(["best-checkpoint", "run/outputs"], tmp_path, as_user=True)
        doc = _cli(["analyze", "run/outputs", "--no-html", "--json", "-"], tmp_path, as_user=True)
    finally:
        hidden.chmod(0o755)
    assert best.returncode == 2 and "could not be listed" in best.stderr, (best.returncode, best.stderr)
    [run] = json.loads(doc.stdout)["runs"]
    assert run["incidents"] and any(w.startswith("checkpoints not read:") and "Permission denied" in w
                                    for w in run["recommendation"]["warnings"])


def test_a_folder_name_that_is_not_utf8_is_a_run_not_read_not_an_internal_error(tmp_path: Path) -> None:
    """A trial folder named with a Latin-1 byte (an old tool's, an SMB share's): the run is said
    unread with the reason, exit 2, and in a fleet the other runs and the index are still written."""
    shutil.copytree(FIXTURES / "sglang_hang", tmp_path / "one")
    for side in ("logs", "checkpoints"):
        folder = tmp_path / "one" / "outputs" / side / "root" / "gsm8k-grpo-hang"
        os.rename(folder / "trial0", os.fsdecode(bytes(folder / "tri") + b"\xe9l0"))
    alone = _cli(["analyze", "one", "--no-html"], tmp_path)
    assert alone.returncode == 2 and "tri\\xe9l0: the name is not valid UTF-8" in alone.stderr, alone.stderr
    shutil.copytree(FIXTURES / "sglang_oom", tmp_path / "good")
    fleet = _cli(["analyze", "good", "one", "--out", str(tmp_path / "fleet")], tmp_path)
    assert fleet.returncode == 2 and "internal error" not in fleet.stderr, fleet.stderr
    runs = pl.read_parquet(tmp_path / "fleet" / "index.parquet")
    assert sorted(runs["run_id"]) == ["gsm8k-grpo-hang/tri\\xe9l0", "gsm8k-grpo-oom/trial0"]


def test_run_from_inside_the_tree_the_report_goes_to_a_folder_of_this_users_own(tmp_path: Path) -> None:
    """No --out, the working folder inside the run: the report goes to the temp folder, in a
    folder private to this user — not one shared name another account may own (the write had
    failed after the whole analysis, exit 2) or read."""
    shutil.copytree(FIXTURES / "sglang_hang", tmp_path / "run")
    temp = tmp_path / "tmp"
    temp.mkdir()
    (temp / "grpo-forensics-report").mkdir(mode=0o755)  # another user's, by the old shared name
    if os.geteuid() == 0:
        os.chown(temp / "grpo-forensics-report", 65534, 65534)
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(_as_a_user([sys.executable, "-m", "forensics", "analyze", ".", "--no-cache"]),
                          cwd=tmp_path / "run" / "outputs", env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    [written] = [p for p in temp.glob("grpo-forensics-report*/report.html")]
    assert written.parent.name != "grpo-forensics-report" and stat.S_IMODE(written.parent.stat().st_mode) == 0o700
    assert f"report:{written}" in re.sub(r"\s+", "", done.stdout)  # (wrapped to the terminal's width)


@pytest.mark.parametrize("command", [["events"], ["metrics"], ["best-checkpoint"], ["analyze", "--no-html", "--json", "-"], ["watch", "--replay"],
                                     ["analyze", "--no-html"], ["analyze", "sglang_oom", "--no-html"], ["compare", "sglang_oom", "--no-html"]])
def test_a_closed_standard_output_is_bad_input_not_an_internal_error(tmp_path: Path, command: list[str]) -> None:
    """``cmd >&-`` (stdout closed: Python gives None, not a stream): one line on stderr, exit 2 as
    for a full disk — not exit 70, "internal error"; nor exit 0 with the summary (or a fleet's
    table, or the comparison) printed nowhere."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cache = [] if command[0] == "watch" else ["--no-cache"]  # (watch keeps its own state)
    args = [str(FIXTURES / name / "outputs") if name == "sglang_oom" else name for name in command[1:]]
    done = subprocess.run([sys.executable, "-m", "forensics", command[0], str(FIXTURES / "sglang_hang" / "outputs"), *args,
                           *cache, *(["--out", str(tmp_path / "out")] if command[0] == "analyze" else [])],
                          env=env, stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("grpo-forensics: standard output is closed: nowhere to write")


def test_a_terminal_width_of_zero_still_prints_the_summary(tmp_path: Path) -> None:
    """``COLUMNS=0`` (some CI runners): rich took it literally and printed nothing, the report's
    path included, exit 0."""
    env = {**os.environ, "COLUMNS": "0"}
    result = CliRunner(env=env).invoke(app, ["analyze", str(FIXTURES / "sglang_hang" / "outputs"), "--out", str(tmp_path / "r"), "--no-cache"])
    assert result.exit_code == 0 and "incident-1" in result.stdout and "report:" in result.stdout


def test_help_read_in_part_by_a_pipe_exits_0() -> None:
    """``grpo-forensics --help | head -1``: the reader had enough; rich's help had ended with 1."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    entry = "from forensics.entry import main; main()"
    for args in (["--help"], ["analyze", "--help"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first line: every write meets a closed pipe
        try:
            done = subprocess.run([sys.executable, "-c", entry, *args], stdout=write, stderr=subprocess.PIPE, env=env)
        finally:
            os.close(write)
        assert done.returncode == 0, (args, done.stderr)


@pytest.mark.parametrize("args", [["analyze", ".", "--workers", "0"], ["compare", "."], ["analyze", "--bogus"], ["analyze", "--json"],
                                  ["best-checkpoint"], ["watch", ".", "--interval", "abc"]])
def test_a_wrong_option_or_argument_is_one_line_on_stderr(args: list[str]) -> None:
    """Exit 2 with a one-line reason (the contract): click's usage panel was five lines of box."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "forensics", *args], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"grpo-forensics: {args[0]}: ") and f"(see grpo-forensics {args[0]} --help)" in line, line


@pytest.mark.parametrize("into_the_row", [0, 40], ids=["after-a-rule", "inside-a-row"])
def test_a_log_cut_inside_a_table_is_said_and_no_run_is_called_healthy(tmp_path: Path, into_the_row: int) -> None:
    """A copy taken while step 162's table was being written, its checkpoints going on to step 400:
    the cut was said nowhere (0 unparsed) and the run "looks healthy"."""
    shutil.copytree(FIXTURES / "sglang_hang", tmp_path / "run")
    trial = tmp_path / "run" / "outputs" / "logs" / "root" / "gsm8k-grpo-hang" / "trial0"
    text = gzip.decompress((trial / "trainer.log.gz").read_bytes())
    (trial / "trainer.log.gz").unlink()
    rule = text.index("├".encode(), text.index(b"Train step 162/"))
    (trial / "trainer.log").write_bytes(text[: text.index(b"\n", rule) + 1 + into_the_row])
    [run] = analyze([tmp_path / "run" / "outputs"]).runs
    assert run.step_range()["last"] == 162 and not run.incidents
    lost = run.data_lost()
    assert "trainer.log: the log ends inside step 162's table, cut off while it was written: its rows so far are read" in lost
    assert any(line.startswith("steps after step 162 could not be read (checkpoints were saved up to step 400)") for line in lost)
    assert run.caveat() == "part of the logs could not be read"
    shown = invoke("analyze", str(tmp_path / "run" / "outputs"), "--no-html")
    assert "No incident found in what could be read" in shown.output and "looks healthy" not in shown.output


@pytest.mark.parametrize(("command", "option"), [
    *((command, "--cache-dir") for command in (["analyze", "--no-html"], ["best-checkpoint"], ["events"], ["metrics"])),
    (["metrics"], "--output"),
])
def test_nothing_is_written_in_the_checkpoint_folder_read_for_a_log_given_alone(tmp_path: Path, command: list[str], option: str) -> None:
    """Given a trial's trainer.log, its run's checkpoint folder is read too: a cache or an export
    there was written beside the checkpoints (an --json there was refused)."""
    from areal_builder import RunSpec, write_run

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=20, save_freq_steps=10))
    before = tree_state(paths.checkpoint_root)
    target = paths.checkpoint_root / "default" / ("cache" if option == "--cache-dir" else "m.csv")
    done = invoke(*command, str(paths.trainer_log), option, str(target))
    assert done.exit_code == 2 and "is inside the analyzed path" in done.output
    assert tree_state(paths.checkpoint_root) == before


def test_a_folder_where_the_trainer_log_should_be_is_said(tmp_path: Path) -> None:
    """A botched copy left a folder named trainer.log: the run was read from the server log alone
    and nothing named the trainer's log (a pipe in its place is said)."""
    shutil.copytree(FIXTURES / "sglang_hang", tmp_path / "run")
    trial = tmp_path / "run" / "outputs" / "logs" / "root" / "gsm8k-grpo-hang" / "trial0"
    (trial / "trainer.log.gz").unlink()
    (trial / "trainer.log" / "part0").mkdir(parents=True)
    [run] = analyze([tmp_path / "run" / "outputs"]).runs
    assert "trainer.log: a folder, not a log: read as any folder is" in run.data_lost()


def test_steps_no_log_holds_are_no_baseline_for_the_cause(tmp_path: Path) -> None:
    """Only the newest part of the trainer log survives (logrotate's ``rotate 1``), from step 1200:
    the cause's failures are counted in the steps read, not compared with "0 in the 50 steps
    before" that no log holds (a p-value from missing data)."""
    packed, data = _seed_trial(tmp_path)
    text = gzip.decompress(data)
    start = text.rindex(b"\n", 0, text.index(b"Train step 1200/")) + 1
    packed.with_name("trainer.log").write_bytes(text[start:])
    packed.unlink()
    [run] = analyze([tmp_path / "run"]).runs
    incident = run.incidents[0]
    assert run.step_range()["first"] == 1200 and incident.onset_step == 1200
    assert incident.cause == "inference_server_unresponsive"
    assert "steps before" not in incident.summary and "p=" not in incident.summary
    assert "request_timeout in steps 1200–1202" in incident.summary


@pytest.mark.parametrize("fleet", [False, True])
def test_a_link_already_in_the_out_folder_is_replaced_not_written_through(tmp_path: Path, fleet: bool) -> None:
    """``--out OUT`` where ``OUT/report.html`` (or a fleet's ``index.html``) is a link into the
    analyzed run (a "latest report" folder made by hand): the page replaces the link; the run's
    file it pointed at is left as it was."""
    from areal_builder import RunSpec, write_run

    paths = write_run(tmp_path / "run" / "outputs", RunSpec(last_step=30, save_freq_steps=10))
    given = [str(paths.fileroot)] + ([str(write_run(tmp_path / "other" / "outputs", RunSpec(last_step=20)).fileroot)] if fleet else [])
    [config] = paths.fileroot.rglob("config.yaml")
    before = tree_state(tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    page = out / ("index.html" if fleet else "report.html")
    page.symlink_to(config)
    result = runner.invoke(app, ["analyze", *given, "--out", str(out), "--no-cache"])
    assert result.exit_code == 0, result.output
    assert tree_state(tmp_path / "run") == before
    assert not page.is_symlink() and page.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html")


@pytest.mark.parametrize("command", [["analyze", "--no-html"], ["events"], ["metrics"]])
def test_a_copy_with_nothing_readable_in_it_is_unusable_input(tmp_path: Path, command: list[str]) -> None:
    """A W&B run killed before its first flush (an empty ``.wandb``), a TensorBoard events file that
    is no TFRecord stream: nothing readable was found, exit 2 with the reason (as an empty
    ``trainer.log`` is), not a "run" of no steps and exit 0."""
    wandb_run = tmp_path / "a" / "wandb" / "offline-run-20250101_000000-abc12345"
    wandb_run.mkdir(parents=True)
    (wandb_run / "run-abc12345.wandb").write_bytes(b"")
    board = tmp_path / "b" / "runs" / "Nov29_10-00-00_host"
    board.mkdir(parents=True)
    (board / "events.out.tfevents.1700000000.host.1.0").write_bytes(random.Random(1).randbytes(20000))
    for folder, said in ((tmp_path / "a", "no records"), (tmp_path / "b", "not a TFRecord stream")):
        done = invoke(*command, str(folder))
        assert done.exit_code == 2 and "nothing readable in it" in done.stderr and said in done.stderr, done.output
        assert "Traceback" not in done.output
    # beside a run that was read (a fleet of two), the same: said, exit 2 once the other is done
    from areal_builder import RunSpec, write_run

    good = write_run(tmp_path / "good" / "outputs", RunSpec(last_step=20)).fileroot
    done = invoke(*command, str(good), str(tmp_path / "a"), *(["--out", str(tmp_path / "fleet")] if command[0] == "analyze" else []))
    assert done.exit_code == 2 and "nothing readable in it" in done.stderr, done.output


def test_two_outputs_given_one_path_are_refused_before_the_analysis(tmp_path: Path) -> None:
    """``--json R --markdown R`` would leave only the Markdown in R; ``--json R --out R`` would fail
    as a folder after the whole analysis: both are refused up front, nothing written; a JSON file
    inside the report folder is fine."""
    run = FIXTURES / "areal_seed000" / "outputs"
    for options in (["--json", "r.json", "--markdown", "r.json", "--no-html"], ["--json", "rep", "--out", "rep"],
                    ["--json", "rep/report.html", "--out", "rep"]):
        done = invoke("analyze", str(run), *[str(tmp_path / o) if not o.startswith("--") else o for o in options])
        assert done.exit_code == 2 and ("give each its own" in done.stderr or "is the report.html --out writes" in done.stderr), done.output
    assert list(tmp_path.iterdir()) == []
    done = invoke("analyze", str(run), "--json", str(tmp_path / "rep" / "a.json"), "--out", str(tmp_path / "rep"), "--no-cache")
    assert done.exit_code == 0 and sorted(p.name for p in (tmp_path / "rep").iterdir()) == ["a.json", "report.html"]
