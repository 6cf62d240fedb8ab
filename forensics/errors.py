"""What can go wrong, named. The CLI maps each to an exit code and one line on stderr.

    ForensicsError
    ├── UnusableInput          exit 2: nothing readable found, path missing
    │   ├── PathNotFound
    │   ├── NoRunsFound
    │   └── NoCacheDir         (the CLI then goes on without a cache)
    └── NoCheckpoint           best-checkpoint only
        ├── NoCheckpointSaved      exit 3: healthy run, nothing saved
        └── NoCheckpointBeforeIncident  exit 4
"""

from __future__ import annotations


class ForensicsError(Exception):
    """Base of every error the tool reports to a user."""


class UnusableInput(ForensicsError):
    """Nothing readable was found at the given path."""


class PathNotFound(UnusableInput):
    """The path does not exist."""


class NoRunsFound(UnusableInput):
    """The path holds no log this tool recognises."""


class NoCacheDir(UnusableInput):
    """No user cache folder is set and the user has no home folder to find one in."""


class NoCheckpoint(ForensicsError):
    """No checkpoint can be recommended."""


class NoCheckpointSaved(NoCheckpoint):
    """The run is healthy but saved no complete checkpoint."""


class NoCheckpointBeforeIncident(NoCheckpoint):
    """No complete checkpoint precedes the first incident."""
