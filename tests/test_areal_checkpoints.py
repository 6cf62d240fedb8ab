"""read_areal_checkpoints on real checkpoint trees built in tmp_path (hand-written safetensors)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import struct
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import polars as pl
import pytest

from parsers.areal_checkpoints import read_areal_checkpoints

SCHEMA = {
    "path": pl.String(),
    "step": pl.Int64(),
    "kind": pl.String(),
    "role": pl.String(),
    "complete": pl.Boolean(),
    "resumable": pl.Boolean(),
    "time": pl.Datetime("ms"),
    "problems": pl.List(pl.String()),
}


def safetensors_bytes(tensors: int = 1) -> bytes:
    """A valid safetensors file: ``tensors`` float32 scalars."""
    header = {
        f"w{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
        for i in range(tensors)
    }
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * (4 * tensors)


def hf_export(folder: Path, shards: int = 1) -> Path:
    """What HF ``save_pretrained`` leaves: config and weights (sharded + index if shards > 1)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (folder / "tokenizer.json").write_text("{}")
    if shards == 1:
        (folder / "model.safetensors").write_bytes(safetensors_bytes())
        return folder
    names = [f"model-{k:05d}-of-{shards:05d}.safetensors" for k in range(1, shards + 1)]
    for name in names:
        (folder / name).write_bytes(safetensors_bytes())
    weight_map = {f"layer{k}.w": name for k, name in enumerate(names)}
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


@pytest.fixture
def trial(tmp_path: Path) -> Path:
    path = tmp_path / "fileroot" / "checkpoints" / "alice" / "gsm8k-grpo" / "trial0"
    path.mkdir(parents=True)
    return path


def step_info(trial: Path, text: str) -> None:
    (trial / "recover_info").mkdir()
    (trial / "recover_info" / "step_info.json").write_text(text)


def dcp(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"\x80\x04 pickled metadata, never unpickled")
    (folder / "__0_0.distcp").write_bytes(b"tensor bytes")
    (folder / "__1_0.distcp").write_bytes(b"tensor bytes")
    return folder


def only(frame: pl.DataFrame) -> dict:
    assert frame.height == 1, frame
    return frame.row(0, named=True)


def test_areal_folder_names_are_zero_based(trial: Path) -> None:
    first = hf_export(trial / "default" / "epoch0epochstep899globalstep899")
    hf_export(trial / "default" / "epoch1epochstep934globalstep1869", shards=3)
    hf_export(trial / "critic" / "epoch0epochstep899globalstep899")

    frame = read_areal_checkpoints(trial)

    assert frame.schema == pl.Schema(SCHEMA)
    assert frame.select("step", "role", "kind").rows() == [
        (900, "critic", "hf_export"),
        (900, "default", "hf_export"),
        (1870, "default", "hf_export"),
    ]
    assert frame["complete"].all() and not frame["resumable"].any()
    assert frame["problems"].to_list() == [[], [], []]
    row = frame.row(1, named=True)
    assert row["path"] == str(first)
    expected = datetime.fromtimestamp(first.stat().st_mtime)
    assert row["time"] == expected.replace(microsecond=expected.microsecond // 1000 * 1000)


def test_realhf_folder_names_are_one_based(trial: Path) -> None:
    hf_export(trial / "actor" / "epoch1epochstep900globalstep900")
    hf_export(trial / "actor" / "epoch2epochstep935globalstep1870")
    hf_export(trial / "critic" / "epoch2epochstep935globalstep1870")

    frame = read_areal_checkpoints(trial)

    assert frame.select("step", "role").rows() == [
        (900, "actor"),
        (1870, "actor"),
        (1870, "critic"),
    ]
    assert frame["complete"].all()


def test_realhf_layout_decides_ambiguous_names(trial: Path) -> None:
    # epoch2epochstep935globalstep1870 reads as either convention; the recover root says realhf.
    hf_export(trial / "actor" / "epoch2epochstep935globalstep1870")
    recover = trial.parents[3] / "recover" / "alice" / "gsm8k-grpo" / "trial0"
    recover.mkdir(parents=True)
    (recover / "recover_info.pkl").write_bytes(b"junk: it is never unpickled")

    assert read_areal_checkpoints(trial)["step"].to_list() == [1870]


def test_realhf_recover_link_is_a_resumable_recover_checkpoint(trial: Path) -> None:
    role = trial / "actor"
    hf_export(role / "epoch1epochstep10globalstep10")
    target = hf_export(role / "recover_checkpoint")
    (role / "epoch1epochstep20globalstep20").symlink_to(target.absolute(), target_is_directory=True)
    recover = trial.parents[3] / "recover" / "alice" / "gsm8k-grpo" / "trial0"
    recover.mkdir(parents=True)
    (recover / "recover_info.pkl").write_bytes(b"junk: it is never unpickled")

    frame = read_areal_checkpoints(trial)

    assert frame.select("step", "kind", "complete", "resumable").rows() == [
        (10, "hf_export", True, False),
        (20, "recover", True, True),
    ]
    assert frame["path"][1] == str(role / "epoch1epochstep20globalstep20")


def test_realhf_recover_link_without_recover_info_is_not_resumable(trial: Path) -> None:
    role = trial / "actor"
    target = hf_export(role / "recover_checkpoint")
    (role / "epoch1epochstep20globalstep20").symlink_to(target.absolute())

    row = only(read_areal_checkpoints(trial))

    assert (row["step"], row["complete"], row["resumable"]) == (20, True, False)
    assert row["problems"][0].startswith("recover_info.pkl missing")


def test_realhf_recover_checkpoint_without_link_has_no_step(trial: Path) -> None:
    hf_export(trial / "actor" / "epoch1epochstep10globalstep10")
    hf_export(trial / "actor" / "recover_checkpoint")

    row = read_areal_checkpoints(trial).row(1, named=True)

    assert (row["step"], row["kind"]) == (None, "recover")
    assert (row["complete"], row["resumable"]) == (True, False)
    assert row["problems"][0].startswith("step unknown")


def test_recover_checkpoint_step_comes_from_step_info(trial: Path) -> None:
    hf_export(trial / "default" / "epoch1epochstep934globalstep1869")
    dcp(trial / "default" / "recover_checkpoint")
    info = {"epoch": 1, "epoch_step": 934, "global_step": 1869, "steps_per_epoch": 935}
    step_info(trial, json.dumps(info, indent=4))

    frame = read_areal_checkpoints(trial)

    assert frame.select("step", "kind", "complete", "resumable").rows() == [
        (1870, "hf_export", True, False),
        (1870, "recover", True, True),
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"epoch": 1, "global_', "step_info.json does not parse: "),
        ('{"epoch": 1}', "step_info.json has no integer global_step"),
        (None, "recover_info/step_info.json missing"),
        ('{"epoch": 1, "global_step": 18446744073709551616}', "step_info.json records an impossible global_step"),
    ],
)
def test_broken_step_info_leaves_step_unknown(trial: Path, text: str | None, problem: str) -> None:
    dcp(trial / "default" / "recover_checkpoint")
    if text is not None:
        step_info(trial, text)

    row = only(read_areal_checkpoints(trial))

    assert (row["step"], row["complete"], row["resumable"]) == (None, True, False)
    assert len(row["problems"]) == 1 and row["problems"][0].startswith(problem)


def test_unfinished_dcp_save_is_incomplete(trial: Path) -> None:
    folder = dcp(trial / "default" / "recover_checkpoint")
    (folder / ".metadata").unlink()
    (folder / "__1_0.distcp").write_bytes(b"")
    step_info(trial, '{"global_step": 4}')

    row = only(read_areal_checkpoints(trial))

    assert (row["step"], row["complete"], row["resumable"]) == (5, False, False)
    assert row["problems"] == [
        ".metadata missing: the DCP save did not finish",
        "__1_0.distcp is empty (0 bytes)",
    ]


def test_older_recover_layout_needs_optimizer_shards(trial: Path) -> None:
    folder = hf_export(trial / "default" / "recover_checkpoint")
    step_info(trial, '{"global_step": 9}')
    assert only(read_areal_checkpoints(trial))["problems"] == [
        "no optimizer state (.metadata + *.distcp, or optim_world_size_*_rank_*.pt)"
    ]

    (folder / "optim_world_size_2_rank_0.pt").write_bytes(b"x")
    (folder / "optim_world_size_2_rank_1.pt").write_bytes(b"x")
    row = only(read_areal_checkpoints(trial))

    assert (row["step"], row["complete"], row["resumable"], row["problems"]) == (10, True, True, [])


def test_a_recover_checkpoint_missing_a_ranks_shard_is_incomplete(trial: Path) -> None:
    """Each trainer rank writes its own shard: with one lost (a gap in the DCP ranks, or fewer
    ``optim_world_size_W`` shards than W), the checkpoint cannot be resumed from."""
    folder = dcp(trial / "default" / "recover_checkpoint")
    (folder / "__3_0.distcp").write_bytes(b"tensor bytes")  # ranks 0, 1, 3: rank 2's is gone
    step_info(trial, '{"global_step": 59}')
    row = only(read_areal_checkpoints(trial))
    assert (row["complete"], row["resumable"], row["problems"]) == (False, False, ["shards missing for ranks 2 of at least 4"])

    shutil.rmtree(trial / "default" / "recover_checkpoint")
    folder = hf_export(trial / "default" / "recover_checkpoint")
    for rank in (0, 1, 2):
        (folder / f"optim_world_size_4_rank_{rank}.pt").write_bytes(b"x")
    row = only(read_areal_checkpoints(trial))
    assert (row["complete"], row["resumable"], row["problems"]) == (False, False, ["optimizer shards missing for ranks 3 of 4"])


def test_a_recover_checkpoint_missing_its_last_ranks_shards_is_incomplete(trial: Path) -> None:
    """Eight trainer ranks (``d8p1t1``); an interrupted ``rsync -a`` brought ``.metadata`` (it sorts
    first) and ranks 0–5's shards, and left rank 6's half-copied under rsync's temporary name. No
    gap below the highest rank present tells it: the ``.metadata``, which names every shard file
    (its storage entries' ``relative_path``), does."""
    folder = trial / "default" / "recover_checkpoint"
    folder.mkdir(parents=True)
    storage = {("actor.weight", rank): {"relative_path": f"__{rank}_0.distcp", "offset": 0, "length": 12} for rank in range(8)}
    (folder / ".metadata").write_bytes(pickle.dumps({"state_dict_metadata": {}, "storage_data": storage}, protocol=4))
    for rank in range(6):
        (folder / f"__{rank}_0.distcp").write_bytes(b"tensor bytes")
    (folder / ".__6_0.distcp.Xa93kQ").write_bytes(b"tensor")
    step_info(trial, '{"global_step": 59}')
    row = only(read_areal_checkpoints(trial))
    assert (row["complete"], row["resumable"]) == (False, False)
    assert row["problems"] == ["2 of the 8 shard files its .metadata names missing (__6_0.distcp, __7_0.distcp): a rank's save did not arrive"]
    for rank in (6, 7):
        (folder / f"__{rank}_0.distcp").write_bytes(b"tensor bytes")
    assert only(read_areal_checkpoints(trial))["problems"] == []


def test_missing_shard(trial: Path) -> None:
    folder = hf_export(trial / "default" / "epoch0epochstep99globalstep99", shards=3)
    (folder / "model-00002-of-00003.safetensors").unlink()

    row = only(read_areal_checkpoints(trial))

    assert (row["step"], row["complete"]) == (100, False)
    assert row["problems"] == [
        "model-00002-of-00003.safetensors listed in model.safetensors.index.json is missing"
    ]


def test_shards_without_their_index(trial: Path) -> None:
    folder = hf_export(trial / "default" / "epoch0epochstep99globalstep99", shards=3)
    (folder / "model.safetensors.index.json").unlink()

    assert only(read_areal_checkpoints(trial))["problems"] == [
        "model.safetensors.index.json missing (3 of 3 shards present)"
    ]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (
            struct.pack("<Q", 9 * 10**9) + b"\0" * 304,
            "model.safetensors header is unreadable (declared 9 GB header in a 312-byte file)",
        ),
        (b"<html>garbage</html>", "model.safetensors header is unreadable (declared"),
        (
            struct.pack("<Q", 6) + b"{nope}",
            "model.safetensors header is unreadable (not valid JSON)",
        ),
        (
            struct.pack("<Q", 2) + b"[]",
            "model.safetensors header is unreadable (not a JSON object)",
        ),
        (
            safetensors_bytes(tensors=4)[:-5],
            "model.safetensors is truncated (11 of the 16 data bytes its header describes)",
        ),
        (b"\x01\x02\x03", "model.safetensors is too short for a safetensors header (3-byte file)"),
        (b"", "model.safetensors is empty (0 bytes)"),
    ],
    ids=["huge-length", "garbage", "not-json", "not-object", "truncated", "too-short", "empty"],
)
def test_unreadable_safetensors(trial: Path, content: bytes, problem: str) -> None:
    folder = hf_export(trial / "default" / "epoch0epochstep9globalstep9")
    (folder / "model.safetensors").write_bytes(content)

    row = only(read_areal_checkpoints(trial))

    assert row["complete"] is False
    assert len(row["problems"]) == 1 and row["problems"][0].startswith(problem), row["problems"]


def test_config_json_missing(trial: Path) -> None:
    folder = hf_export(trial / "default" / "epoch0epochstep9globalstep9")
    (folder / "config.json").unlink()

    assert only(read_areal_checkpoints(trial))["problems"] == ["config.json missing"]


def test_lora_adapter_is_a_complete_export(trial: Path) -> None:
    folder = trial / "default" / "epoch0epochstep9globalstep9"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text('{"r": 8}')
    (folder / "adapter_model.safetensors").write_bytes(safetensors_bytes())

    row = only(read_areal_checkpoints(trial))

    assert (row["complete"], row["problems"]) == (True, [])


def test_junk_never_raises(trial: Path) -> None:
    role = trial / "default"
    hf_export(role / "weight_update")  # disk-mode weight sync, not a checkpoint
    loop = role / "epoch0epochstep1globalstep1"
    loop.symlink_to(loop)
    (role / "epoch0epochstep2globalstep2").write_text("a file where a folder belongs")
    (role / "epoch0epochstep3globalstep3").mkdir()
    fifo = hf_export(role / "epoch0epochstep4globalstep4")
    (fifo / "model.safetensors").unlink()
    os.mkfifo(fifo / "model.safetensors")  # opening it would block forever
    dangling = hf_export(role / "epoch0epochstep5globalstep5")
    (dangling / "model.safetensors").unlink()
    (dangling / "model.safetensors").symlink_to(dangling / "gone.safetensors")
    (dangling / "config.json").write_text("{")

    frame = read_areal_checkpoints(trial)

    assert frame["step"].to_list() == [2, 3, 4, 5, 6]
    assert not frame["complete"].any()
    assert frame["problems"].to_list() == [
        ["epoch0epochstep1globalstep1 cannot be listed: Too many levels of symbolic links"],
        ["epoch0epochstep2globalstep2 cannot be listed: Not a directory"],
        ["folder is empty"],
        ["model.safetensors is not a regular file"],
        [
            "config.json does not parse: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
            "model.safetensors cannot be read: No such file or directory",
        ],
    ]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied_is_a_problem(trial: Path) -> None:
    folder = hf_export(trial / "default" / "epoch0epochstep9globalstep9")
    (folder / "model.safetensors").chmod(0)
    try:
        row = only(read_areal_checkpoints(trial))
    finally:
        (folder / "model.safetensors").chmod(0o644)
    assert row["problems"] == ["model.safetensors cannot be read: Permission denied"]


def test_sorted_by_step_then_path_with_unknown_steps_last(trial: Path) -> None:
    dcp(trial / "default" / "recover_checkpoint")
    hf_export(trial / "default" / "epoch0epochstep19globalstep19")
    hf_export(trial / "critic" / "epoch0epochstep9globalstep9")
    hf_export(trial / "critic" / "epoch0epochstep19globalstep19")

    frame = read_areal_checkpoints(trial)

    assert frame.select("step", "role").rows() == [
        (10, "critic"),
        (20, "critic"),
        (20, "default"),
        (None, "default"),
    ]


def test_empty_trial_dir(trial: Path) -> None:
    frame = read_areal_checkpoints(trial)
    assert frame.is_empty() and frame.schema == pl.Schema(SCHEMA)


def test_nonexistent_path(tmp_path: Path) -> None:
    frame = read_areal_checkpoints(tmp_path / "no" / "such" / "trial")
    assert frame.is_empty() and frame.schema == pl.Schema(SCHEMA)


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry under root, without following links: mode, mtime_ns and content hash."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(folder) / name
            info = path.lstat()
            regular = path.is_file() and not path.is_symlink()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if regular else ""
            seen[str(path)] = (info.st_mode, info.st_mtime_ns, digest)
    return seen


def test_nothing_under_the_tree_is_modified(trial: Path) -> None:
    hf_export(trial / "default" / "epoch0epochstep899globalstep899", shards=3)
    broken = hf_export(trial / "default" / "epoch1epochstep934globalstep1869")
    (broken / "model.safetensors").write_bytes(b"junk")
    dcp(trial / "default" / "recover_checkpoint")
    step_info(trial, '{"global_step": 1869}')
    (trial / "default" / "epoch1epochstep935globalstep1870").symlink_to("missing")
    root = trial.parents[3]
    before = snapshot(root)

    read_areal_checkpoints(trial)

    assert snapshot(root) == before


def test_a_checkpoint_saved_after_a_recovered_collapse_is_named_as_a_closer_resume_point(tmp_path: Path) -> None:
    """The reward was zero in steps 20-29, then healthy to step 60. The choice stays the newest
    checkpoint before the first onset (the contract), but a warning names the newest one saved
    since the recovery; the recover checkpoint saved then is not called broken."""
    from areal_builder import RunSpec, healthy_reward, write_run

    from forensics import analyze

    spec = RunSpec(last_step=60, save_freq_steps=10, recover_mode="auto", recover_freq_steps=10,
                   reward=lambda s: 0.0 if 20 <= s < 30 else healthy_reward(s))
    paths = write_run(tmp_path / "outputs", spec)
    [run] = analyze([paths.fileroot]).runs
    assert [(i.onset_step, i.end_step) for i in run.incidents] == [(20, 30)]
    rec = run.recommendation
    assert rec.step == 10
    [closer] = [w for w in rec.warnings if "ended at step 30 and the run was healthy since" in w]
    assert "step 60 (" in closer and "resume from it only if they did no harm" in closer
    assert not [w for w in rec.warnings if "would continue from the broken state" in w]


def test_without_a_launcher_line_the_recommendation_says_why_it_gives_no_command(tmp_path: Path) -> None:
    """A run started from a wrapper script: its log has no 'Starting local process with command'
    line, so no resume command can be built — the warnings say so, and what to add."""
    from areal_builder import RunSpec, healthy_reward, write_run

    from forensics import analyze

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=40, save_freq_steps=10,
                                                    reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))
    lines = paths.trainer_log.read_text().splitlines(keepends=True)
    paths.trainer_log.write_text("".join(line for line in lines if "Starting local process with command" not in line))
    [run] = analyze([paths.fileroot]).runs
    rec = run.recommendation
    assert rec.step == 20 and rec.resume_command is None
    [why] = [w for w in rec.warnings if w.startswith("No resume command: the trainer log has no launcher line")]
    assert f"actor.path={rec.checkpoint}" in why


def test_no_checkpoint_saved_in_steps_that_logged_no_reward_is_called_healthy(tmp_path: Path) -> None:
    """The reward is 0 from step 30, but steps 21–35 are gone from trainer.log: the collapse is
    first seen at 36 and began between 21 and 36. The step-30 export was saved in that stretch, so
    it is not known healthy: the choice is step 20, and a warning says why 30 was passed over."""
    import re

    from areal_builder import RunSpec, healthy_reward, write_run

    from forensics import analyze

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, save_freq_steps=10,
                                                    reward=lambda s: 0.0 if s >= 30 else healthy_reward(s)))
    kept, lost = [], False
    for line in paths.trainer_log.read_text().splitlines(keepends=True):
        if m := re.search(r"Train step (\d+)/", line):
            lost = 21 <= int(m[1]) <= 35
        if not lost:
            kept.append(line)
    paths.trainer_log.write_text("".join(kept))
    [run] = analyze([paths.fileroot]).runs
    [incident] = run.incidents
    assert (incident.onset_step, incident.began_after) == (36, 20)
    rec = run.recommendation
    assert rec.step == 20 and "began between steps 21 and 36" in rec.reason
    [passed_over] = [w for w in rec.warnings if w.startswith("skipped checkpoint") and "globalstep29" in w]
    assert "may already have begun" in passed_over


@pytest.mark.parametrize("collapsed", [True, False])
def test_an_earlier_runs_checkpoints_under_the_same_trial_name_are_not_this_runs(tmp_path: Path, collapsed: bool) -> None:
    """AReaL's default names reused: an earlier run of gsm8k-grpo/trial0 (Nov 5, a save every 35
    steps, 120 steps, its logs cleared) left its exports; the rerun (Nov 10, a save every 10 steps)
    logged steps 1–45. Its own saves are steps 10–40; the step-35, 70 and 105 exports are dated
    days before its first step, of steps after it: never chosen, each said with the first step's
    line."""
    import shutil
    from datetime import datetime

    from areal_builder import RunSpec, write_run

    from forensics import analyze

    root = tmp_path / "outputs"
    old = write_run(root, RunSpec(last_step=120, save_freq_steps=35, start=datetime(2025, 11, 5, 9, 0), seed=7))
    shutil.rmtree(old.log_dir)
    reward = (lambda s: 0.0 if s >= 38 else 0.5) if collapsed else (lambda s: 0.5 + (s % 5) / 50)
    write_run(root, RunSpec(last_step=45, save_freq_steps=10, start=datetime(2025, 11, 10, 9, 0), reward=reward))
    [run] = analyze([root]).runs
    rec = run.recommendation
    assert rec.step == 30 if collapsed else rec.step == 40
    left = sorted(w for w in rec.warnings if "an earlier run's save left in the folder" in w)
    assert [w.split(": dated")[0].rsplit("/", 1)[1] for w in left] == [
        "epoch0epochstep104globalstep104", "epoch0epochstep34globalstep34", "epoch0epochstep69globalstep69"]
    assert "before the run logged its first step (1, at 2025-11-10 09:00:00, trainer.log:" in left[0]


def test_checkpoints_read_in_a_zone_behind_the_logs_are_this_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Logs and file times written on a cluster in UTC, the tree copied with its times (``rsync -a``)
    and read in New York: the files' times read five hours behind the logs', which the step log's
    own time (written before its last line was logged, as read here) shows. The run's saves are
    its own, the newest chosen, not "an earlier run's"; an earlier run's days before still are."""
    import time
    from datetime import datetime

    from areal_builder import RunSpec, write_run

    from forensics import analyze

    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        root = tmp_path / "outputs"
        old = write_run(root, RunSpec(last_step=120, save_freq_steps=35, start=datetime(2025, 11, 5, 9, 0), seed=7))
        shutil.rmtree(old.log_dir)
        write_run(root, RunSpec(last_step=45, save_freq_steps=10, start=datetime(2025, 11, 10, 9, 0), finished=True,
                                steps_per_epoch=45, total_epochs=1))
        monkeypatch.setenv("TZ", "America/New_York")
        time.tzset()
        rec = analyze([root]).runs[0].recommendation
    finally:
        monkeypatch.undo()
        time.tzset()
    assert rec.step == 40
    assert len([w for w in rec.warnings if "an earlier run's save left in the folder" in w]) == 3


def test_checkpoints_dated_after_every_log_line_tell_nothing_of_which_attempt_saved_them(tmp_path: Path) -> None:
    """A relaunch from step 30 abandoned an attempt that had collapsed at 35 and saved an export at
    45. Dated as saved, that export is passed over; in a copy (``cp -r``: every file dated when
    copied, after every log line) its date tells nothing, and the choice says so."""
    import shutil
    from datetime import timedelta

    from areal_builder import Relaunch, RunSpec, checkpoint_name, write_hf_checkpoint, write_run

    from forensics import analyze

    spec = RunSpec(last_step=60, save_freq_steps=10, recover_mode="auto", reward=lambda s: 0.0 if s >= 50 else 0.5,
                   relaunch=Relaunch(stop_after=45, resume_from=30, first_reward=lambda s: 0.0 if s >= 35 else 0.5))
    paths = write_run(tmp_path / "outputs", spec)
    export = paths.checkpoint_root / "default" / checkpoint_name(45, 935)
    write_hf_checkpoint(export, 45)
    saved = (paths.step_times[30] + timedelta(minutes=14)).timestamp()
    for f in [*export.iterdir(), export]:
        os.utime(f, (saved, saved))
    original = analyze([paths.fileroot]).runs[0].recommendation
    assert original.step == 40 and any("saved by an attempt a relaunch abandoned" in w for w in original.warnings)

    copy = tmp_path / "copy"
    shutil.copytree(paths.fileroot, copy)
    for f in copy.rglob("*"):
        os.utime(f)  # what cp -r leaves: every file dated now
    copied = analyze([copy]).runs[0].recommendation
    [untold] = [w for w in copied.warnings if w.startswith(f"Step {copied.step} was also reached by an attempt")]
    assert "dated after every log line" in untold


def test_the_resume_command_points_the_server_at_the_export_however_the_config_spells_the_model(tmp_path: Path) -> None:
    """``actor.path: /models/Qwen/`` and ``sglang.model_path: /models/Qwen`` name one model: the
    command from an export sets the server's path to it too (else its first rollouts are the base model's)."""
    import re

    from areal_builder import RunSpec, healthy_reward, write_run

    from forensics import analyze

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=60, save_freq_steps=10, reward=lambda s: 0.0 if s >= 35 else healthy_reward(s)))
    text, section, out = paths.config.read_text(), None, []
    for line in text.splitlines():
        section = line.split(":")[0] if re.match(r"^\S", line) else section
        if section == "actor" and line.strip().startswith("path:"):
            line = line.split("path:")[0] + "path: /models/Qwen2.5-1.5B-Instruct/"
        if section == "sglang" and line.strip().startswith("model_path:"):
            line = line.split("model_path:")[0] + "model_path: /models/Qwen2.5-1.5B-Instruct"
        out.append(line)
    paths.config.write_text("\n".join(out) + "\n")
    rec = analyze([paths.fileroot]).runs[0].recommendation
    assert rec.checkpoint and f"sglang.model_path={rec.checkpoint}" in (rec.resume_command or "").split()


@pytest.mark.parametrize("version", ["0.5.1", "1.0.0"])
def test_the_resume_command_is_the_one_the_runs_areal_release_takes(tmp_path: Path, version: str) -> None:
    """AReaL v1.0 moved its launcher to ``areal.infra.launcher.local`` and took ``resume`` out of
    ``recover.mode`` (``on`` recovers): the release the run's ``version.json`` names decides both,
    in the command and in the advice given without a launcher line."""
    from areal_builder import RunSpec, write_run

    from forensics import analyze

    paths = write_run(tmp_path / "outputs", RunSpec(era="v0.5", last_step=60, save_freq_steps=10, recover_mode="auto",
                                                    recover_freq_steps=35, reward=lambda s: 0.0 if s >= 40 else 0.5))
    stamp = paths.log_dir / "version.json"
    stamp.write_text(json.dumps({**json.loads(stamp.read_text()), "version": version}))
    rec = analyze([paths.fileroot]).runs[0].recommendation
    assert rec.checkpoint == str(paths.recover_checkpoint)
    words = (rec.resume_command or "").split()
    launcher, resume = (("areal.infra.launcher.local", "recover.mode=on") if version == "1.0.0"
                        else ("areal.launcher.local", "recover.mode=resume"))
    assert words[:3] == ["python3", "-m", launcher] and resume in words


def test_the_resume_command_from_an_export_names_a_trial_not_already_on_disk(tmp_path: Path) -> None:
    """The command from an export launches a new trial; run once, that trial is on disk (and broke
    too, its recover checkpoint saved after its own collapse). Asked again, the command names
    another, so AReaL cannot resume that trial's state nor write over its logs."""
    from areal_builder import RunSpec, write_run

    from forensics import analyze

    spec = RunSpec(last_step=60, save_freq_steps=10, reward=lambda s: 0.0 if s >= 35 else 0.5)
    paths = write_run(tmp_path / "outputs", spec)

    def trial_named() -> str:
        command = analyze([paths.fileroot]).runs[0].recommendation.resume_command or ""
        [name] = [w.split("=", 1)[1] for w in command.split() if w.startswith("trial_name=")]
        return name

    assert trial_named() == "trial0-from-step30"
    write_run(tmp_path / "outputs", replace(spec, trial="trial0-from-step30", reward=lambda s: 0.0 if s >= 20 else 0.5))
    assert trial_named() == "trial0-from-step30-2"


@pytest.mark.parametrize("healthy", [False, True])
def test_a_checkpoint_folder_behind_a_link_to_nothing_is_said_and_no_choice_is_made(tmp_path: Path, healthy: bool) -> None:
    """``outputs/checkpoints`` a link to storage not mounted (or not copied with the logs): not "no
    checkpoint was saved" (exit 3 or 4, a script starts over from the base model) but exit 2, the
    link named in a warning."""
    import subprocess
    import sys

    from areal_builder import RunSpec, healthy_reward, write_run

    spec = RunSpec(last_step=60, save_freq_steps=10, reward=healthy_reward if healthy else (lambda s: 0.0 if s >= 35 else healthy_reward(s)))
    paths = write_run(tmp_path / "outputs", spec)
    shutil.rmtree(paths.fileroot / "checkpoints")
    os.symlink(tmp_path / "not_mounted" / "checkpoints", paths.fileroot / "checkpoints")
    done = subprocess.run([sys.executable, "-m", "forensics", "best-checkpoint", str(paths.fileroot), "--json", "--no-cache"],
                          capture_output=True, text=True, cwd=Path(__file__).parent.parent)
    assert done.returncode == 2, done.stderr
    [warning] = json.loads(done.stdout)["warnings"]
    assert f"{paths.fileroot / 'checkpoints'} links to {tmp_path / 'not_mounted' / 'checkpoints'}, which does not exist" in warning


@pytest.mark.parametrize("copied", [False, True])
def test_a_recover_checkpoint_an_interrupted_save_overwrote_in_part_is_not_chosen(tmp_path: Path, copied: bool) -> None:
    """``recover_checkpoint`` is overwritten in place, ``.metadata`` last: the process died ten minutes
    into the step-70 save, rank 0's shard rewritten, rank 1's and the metadata still step 60's. Not
    resumed from (the step-60 export is chosen instead), where the files' times are the saves'; in a
    copy (every file dated when it was copied, in no order) the times tell nothing and it stands."""
    from datetime import timedelta

    from areal_builder import RunSpec, write_run

    from forensics import analyze

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=69, save_freq_steps=20, recover_mode="auto", recover_freq_steps=10))
    folder = paths.recover_checkpoint
    assert folder is not None and (folder / "__0_0.distcp").is_file()
    written = os.stat(folder / ".metadata").st_mtime
    later = (paths.step_times[69] + timedelta(seconds=50)).timestamp()
    (folder / "__0_0.distcp").write_bytes(os.urandom(96))
    os.utime(folder / "__0_0.distcp", (later, later))
    if copied:  # (cp -r without -p: the whole tree dated now)
        for path in [*paths.checkpoint_root.rglob("*"), paths.checkpoint_root]:
            os.utime(path)
    else:
        os.utime(folder, (written, written))
    rec = analyze([paths.fileroot]).runs[0].recommendation
    if copied:
        assert rec.checkpoint == str(folder)
    else:
        assert rec.checkpoint is not None and rec.checkpoint.endswith("globalstep59")
        assert any("__0_0.distcp written after its .metadata by 10 min" in w for w in rec.warnings), rec.warnings


def test_a_run_whose_only_collapse_a_relaunch_re_ran_and_no_checkpoint_exits_as_healthy(tmp_path: Path) -> None:
    """The only collapse was in an attempt a relaunch abandoned (re-run healthy from step 40), and
    the run's one checkpoint, its recover save, was cut short: no incident in the run's history and
    no checkpoint — exit 3, as the reason says, not 4."""
    from areal_builder import Relaunch, RunSpec, write_run
    from typer.testing import CliRunner

    from forensics.cli import app

    paths = write_run(tmp_path / "outputs", RunSpec(last_step=90, recover_mode="auto", recover_freq_steps=40,
                                                    relaunch=Relaunch(stop_after=70, resume_from=40, first_reward=lambda s: 0.0 if s >= 45 else 0.5),
                                                    reward=lambda s: 0.5 + (s % 4) / 40))
    (paths.recover_checkpoint / ".metadata").unlink()
    result = CliRunner().invoke(app, ["best-checkpoint", str(paths.fileroot), "--json", "--no-cache"])
    assert result.exit_code == 3, result.output
    assert json.loads(result.stdout)["reason"].startswith("No incident in the run's final history")
