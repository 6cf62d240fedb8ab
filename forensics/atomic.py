"""A file put in place whole: written beside its place, then renamed into it.

A link already there (into an analyzed run, say) is replaced, never written through, and a reader
never sees half a file. Only the standard library: a played-back run writes with it too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_whole(path: Path, data: bytes) -> Path:
    """``data`` as the file ``path``, with the permissions a new file gets (the umask's)."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(temp, 0o666 & ~umask())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def umask() -> int:
    """This process's umask (reading it means setting it: it is set back at once)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
