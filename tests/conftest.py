"""Shared test setup: the fixture builder is importable, fixtures are addressed by name."""

from __future__ import annotations

import gzip
import hashlib
import os
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
sys.path.insert(0, str(FIXTURES))


#: The longest test files, handed out first: pytest-xdist gives each worker a file at a time, in
#: the order collected, and a long file handed out last leaves one worker running it alone.
SLOWEST_FIRST = ("test_benchmark.py", "test_hostile.py", "test_watch.py", "test_fleet.py", "test_cache.py", "test_rerun.py",
                 "test_ray_parser.py", "test_detect.py", "test_cli_analyze.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: each file's own order kept)


@pytest.fixture(autouse=True, scope="session")
def _private_parse_cache(tmp_path_factory: pytest.TempPathFactory):
    """CLI calls in tests cache parses in a folder of their own, never in the user's ~/.cache."""
    os.environ["GRPO_FORENSICS_CACHE"] = str(tmp_path_factory.mktemp("parse-cache"))
    yield
    os.environ.pop("GRPO_FORENSICS_CACHE", None)


@pytest.fixture
def fixture_run():
    """Path to a committed fixture's ``outputs/`` tree, by name."""

    def get(name: str) -> Path:
        path = FIXTURES / name / "outputs"
        assert path.is_dir(), f"missing fixture {name}; rebuild with python tests/fixtures/build.py"
        return path

    return get


def read_line(path: str | Path, number: int) -> str:
    """Line ``number`` (1-based, lines end at ``\n`` only) of a plain or gzipped file, as text."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    lines = data.split(b"\n")
    assert number <= len(lines), f"{path} has fewer than {number} lines"
    return lines[number - 1].decode("utf-8", errors="replace").rstrip("\r")


def tree_state(root: Path) -> dict[str, tuple[str, int, int]]:
    """Content hash, mtime and mode of every file and folder under ``root``."""
    state = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            st = path.lstat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
            state[str(path)] = (digest, st.st_mtime_ns, st.st_mode)
    return state
