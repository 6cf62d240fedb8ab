"""The public surface is pinned: nothing leaks out or goes missing unnoticed."""

from __future__ import annotations

import forensics
import parsers
import reports


def test_public_names_are_exactly_all() -> None:
    for module in (forensics, parsers, reports):
        # dir(), not vars(): ``forensics`` imports its names on first use
        public = sorted(n for n in dir(module) if not n.startswith("_") and not isinstance(getattr(module, n), type(forensics)))
        assert sorted(module.__all__) == public, module.__name__


def test_every_command_has_help_with_an_example_and_is_in_the_readme() -> None:
    from pathlib import Path

    from forensics.cli import app

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    for command in app.registered_commands:
        doc = command.callback.__doc__ or ""
        name = command.name or command.callback.__name__
        assert "Example:" in doc, name
        assert f"grpo-forensics {name}" in readme, name


def test_paths_may_be_one_path_or_several_strings_or_paths() -> None:
    from pathlib import Path

    from forensics import analyze
    from forensics.analysis import locate

    fixture = Path(__file__).parent / "fixtures" / "sglang_hang"
    expected = [r.to_dict() for r in analyze([fixture]).runs]
    for given in (str(fixture), fixture, [str(fixture)], (p for p in [fixture])):
        assert [r.to_dict() for r in analyze(given).runs] == expected, given
    assert [loc.run_id for loc in locate(str(fixture))] == [r["run_id"] for r in expected]
    shown = repr(analyze(fixture))  # short: the dataclass's own repr printed every piece of evidence
    assert len(shown) < 300 and "reward_collapse@" in shown and "resume step" in shown, shown


def test_the_watcher_takes_str_paths_too(tmp_path) -> None:
    from pathlib import Path

    from forensics.watch import Watcher

    fixture = Path(__file__).parent / "fixtures" / "areal_healthy_sparse" / "outputs"
    watcher = Watcher(str(fixture), state_dir=str(tmp_path / "state"))
    assert watcher.path == fixture and watcher.state_dir == tmp_path / "state" and watcher.poll() == []
