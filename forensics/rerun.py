"""The very same command again, on inputs unchanged since: what it printed and wrote, played back.

A run of ``analyze`` or ``best-checkpoint`` records what it printed (stdout, stderr), the files it
wrote (the report, the JSON, the Markdown) and its exit code, with what it read: a listing of each
analyzed folder (every file's name, size, times and inode) and the identity of each log,
checkpoint folder and config it read outside them. A later run with the same arguments, from the
same folder, on the same kind of terminal, with the same settings in its environment, by the same
code, finds all of that unchanged and plays the record back — before Polars, or the command line
itself, is imported: it takes about a tenth of a second, where importing Polars alone takes a third.

Anything else runs the command as usual: a file touched, another terminal width, a record that
cannot be read. Only a run that gave an answer (``_PLAYED``) and said what it read (:func:`offer`)
is recorded. Only the standard library is imported here.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

from forensics.atomic import umask, write_whole
from forensics.errors import NoCacheDir
from forensics.identity import Identity, code_digest, default_cache_dir, local_zone
from parsers._walk import walk, within

#: Bumped when a record's layout changes.
_LAYOUT = "1"
#: The environment the output depends on: the terminal (rich, typer), the locale, the time zone,
#: where things are written, and the settings of the tool and the libraries it calls.
_SETTINGS = ("TERM", "COLORTERM", "NO_COLOR", "FORCE_COLOR", "PY_COLORS", "TTY_COMPATIBLE", "TTY_INTERACTIVE",
             "COLUMNS", "LINES", "JUPYTER_COLUMNS", "JUPYTER_LINES", "TERMINAL_WIDTH", "UNICODE_VERSION",
             "GITHUB_ACTIONS", "DATABRICKS_RUNTIME_VERSION", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
             "PYTHONIOENCODING", "PYTHONUTF8", "HOME", "XDG_CACHE_HOME", "TMPDIR", "TEMP", "TMP")
_SETTING_PREFIXES = ("GRPO_FORENSICS", "_GRPO_FORENSICS", "TYPER_", "_TYPER", "POLARS_", "WANDB_", "RAY_")
#: The libraries whose output is recorded: an upgrade makes records stale.
_LIBRARIES = ("polars", "pyarrow", "rich", "typer", "yaml", "wandb", "tensorboard", "tensorboardX")
#: The commands played back, and the exit codes of a run of each worth playing back: answers
#: (an incident; no checkpoint saved, or none before the incident), not failures.
_PLAYED = {"analyze": (0, 1), "best-checkpoint": (0, 3, 4)}


def played_back(argv: list[str]) -> int | None:
    """Play back the record of this very command, when there is one and nothing it read has
    changed: its files written, its output printed. Its exit code, or ``None`` (run the command)."""
    record = _record_folder(argv)
    if record is None or sys.stdout is None or sys.stderr is None:
        return None
    try:
        if record.stat().st_uid != _uid():  # only ever play back what this user recorded
            return None
        manifest = json.loads((record / "manifest.json").read_text(encoding="utf-8"))
        if manifest["read"] != _state(manifest["trees"], manifest["inputs"]):
            return None
        read = [*manifest["trees"], *manifest["inputs"]]
        files = [(Path(f["path"]), (record / f["name"]).read_bytes(), f["whole"]) for f in manifest["files"]]
        if any(within(path, place) for path, _, _ in files for place in read):
            return None  # (an output folder turned into a link into a run since: never written through)
        printed = (record / "stdout").read_bytes(), (record / "stderr").read_bytes()
        code = int(manifest["code"])
        for path, data, whole in files:
            _write(path, data, whole)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    for stream, data in zip((sys.stdout, sys.stderr), printed, strict=True):
        _print(stream, data)
    return code


class Recording:
    """Copies of what this process prints, kept for a record (see :func:`record`)."""

    def __init__(self, command: str, folder: Path) -> None:
        self.command, self.folder = command, folder
        self.trees: list[str] = []
        self.inputs: list[str] = []
        self.read: list[str | None] | None = None
        self.files: list[tuple[Path, bool]] = []
        self.streams = {name: getattr(sys, name) for name in ("stdout", "stderr")}
        self.copies = {name: _Copy(stream.buffer) for name, stream in self.streams.items()}
        for name, stream in self.streams.items():
            setattr(sys, name, io.TextIOWrapper(self.copies[name], encoding=stream.encoding, errors=stream.errors,  # type: ignore[arg-type]
                                                line_buffering=stream.line_buffering, write_through=True))

    def stop(self, code: int | None) -> None:
        """Put the streams back; keep the record when the run is one to play back."""
        global _recording
        _recording = None
        for name, stream in self.streams.items():
            try:
                getattr(sys, name).flush()
            except (OSError, ValueError):
                self.copies[name].failed = True
            setattr(sys, name, stream)
        if code in _PLAYED[self.command] and self.read is not None and not any(c.failed for c in self.copies.values()):
            try:
                self._keep(code)
            except (OSError, ValueError):  # (a full disk, a file gone: no record, no harm)
                pass

    def _keep(self, code: int) -> None:
        if _state(self.trees, self.inputs) != self.read:
            return  # something changed while it was read: what was read is no state on record
        printed = {(st.st_dev, st.st_ino) for st in (os.fstat(fd) for fd in (1, 2) if _open(fd))}
        files = []
        for path, whole in self.files:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) in printed:
                return  # (``--json /dev/stdout``, a link: not a file to write again)
            files.append((path, whole))
        self.folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        staging = Path(tempfile.mkdtemp(prefix=".new-", dir=self.folder.parent))
        try:
            for i, (path, _) in enumerate(files):
                shutil.copyfile(path, staging / f"file-{i}")
            for name, copy in self.copies.items():
                (staging / name).write_bytes(bytes(copy.kept))
            manifest = {"code": code, "trees": self.trees, "inputs": self.inputs, "read": self.read,
                        "files": [{"path": str(p), "whole": w, "name": f"file-{i}"} for i, (p, w) in enumerate(files)]}
            (staging / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
            shutil.rmtree(self.folder, ignore_errors=True)
            staging.rename(self.folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


_recording: Recording | None = None


def record(argv: list[str]) -> Recording | None:
    """Start recording this process's output for a later :func:`played_back`, where the command
    is one that can be (``analyze``, ``best-checkpoint``, with a cache); the command says what it read with :func:`offer`."""
    global _recording
    folder = _record_folder(argv)
    if folder is None or not all(_open(fd) and hasattr(getattr(sys, name), "buffer") for fd, name in ((1, "stdout"), (2, "stderr"))):
        return None
    _recording = Recording(argv[0], folder)
    return _recording


def offer(cache_dir: Path, trees: Iterable[Path], inputs: Iterable[Path]) -> None:
    """Say, before reading anything, that this run may be played back: ``trees``, the folders
    analyzed (listed whole), ``inputs``, what else it reads; ``cache_dir``, the cache it uses
    (a record is kept only where :func:`played_back` will look for it). No-op when not recording."""
    if _recording is None or _recording.folder.parent.parent != Path(os.path.abspath(cache_dir)):
        return
    _recording.trees = [os.path.abspath(t) for t in trees]
    _recording.inputs = sorted({os.path.abspath(i) for i in inputs})
    _recording.read = _state(_recording.trees, _recording.inputs)


def also_read(places: Iterable[Path]) -> None:
    """Say that this run read ``places`` too, found only as it read (checkpoint folders a log named)."""
    if _recording is not None and _recording.read is not None:
        more = sorted({os.path.abspath(p) for p in places} - set(_recording.inputs))
        _recording.inputs += more
        _recording.read += _state([], more)


def wrote(path: Path, *, whole: bool) -> None:
    """Say that this run wrote the file ``path`` (``whole``: put in place by a rename, as
    :func:`reports.page.write_page` does; else written in place)."""
    if _recording is not None and _recording.read is not None:
        _recording.files.append((Path(os.path.abspath(path)), whole))


# -- internals ----------------------------------------------------------------------------------


class _Copy(io.RawIOBase):
    """Writes through to ``target``, keeping a copy of what was written."""

    def __init__(self, target: BinaryIO) -> None:
        self.target, self.kept, self.failed = target, bytearray(), False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        try:
            written = self.target.write(data)
        except BaseException:
            self.failed = True  # (a closed pipe: what was printed is not all there was)
            raise
        count = len(data) if written is None else written
        self.kept += bytes(memoryview(data)[:count])
        return count

    def flush(self) -> None:
        try:
            self.target.flush()
        except BaseException:
            self.failed = True
            raise

    def fileno(self) -> int:
        return self.target.fileno()

    def isatty(self) -> bool:
        return self.target.isatty()


def _record_folder(argv: list[str]) -> Path | None:
    """Where the record of ``argv`` is kept: in the cache folder, under a key of everything the
    output depends on but the inputs. ``None`` for a command never played back."""
    if not argv or argv[0] not in _PLAYED or "--no-cache" in argv:
        return None
    try:
        folder = _option(argv, "--cache-dir") or default_cache_dir()
    except NoCacheDir:
        return None
    digest = hashlib.sha256()
    for part in _setting_parts(argv):
        digest.update(part.encode(errors="surrogateescape") + b"\0")
    return Path(os.path.abspath(folder)) / "reruns" / digest.hexdigest()[:32]


def _setting_parts(argv: list[str]) -> Iterable[str]:
    yield _LAYOUT
    yield json.dumps(argv)
    yield os.getcwd()
    yield json.dumps(sorted((k, v) for k, v in os.environ.items() if k in _SETTINGS or k.startswith(_SETTING_PREFIXES)))
    for fd in (0, 1, 2):
        yield f"{fd} {_open(fd) and os.isatty(fd)} {_terminal_size(fd)}"
    for stream in (sys.stdout, sys.stderr):
        yield f"{getattr(stream, 'encoding', None)} {getattr(stream, 'errors', None)}"
    yield f"{umask()} {_uid()} {sys.version} {sys.executable}"
    yield code_digest(whole_package=True)
    yield local_zone()
    for name in _LIBRARIES:  # (found, not imported: where each is installed, and when)
        yield _installed(name)


def _option(argv: list[str], name: str) -> str | None:
    """The last value given to the option ``name`` (``--name VALUE`` or ``--name=VALUE``)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return value


def _installed(name: str) -> str:
    from importlib.util import find_spec

    try:
        spec = find_spec(name)
        origin = spec.origin if spec is not None else None
        return f"{name} {origin} {os.stat(origin).st_mtime_ns if origin else None}"
    except (ImportError, ValueError, OSError):
        return f"{name} -"


def _state(trees: Iterable[str], inputs: Iterable[str]) -> list[str | None]:
    """What the analyzed folders and the other inputs look like now."""
    return [*(_listing(Path(t)) for t in trees), *(Identity.text_of(Path(i)) for i in inputs)]


def _listing(folder: Path) -> str | None:
    """A digest of every folder and file under ``folder`` (links not followed into, but named
    with their targets), with each file's size, times and inode: any change to the tree moves it."""
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    links: list[str] = []
    for root, dirs, files in walk(folder, links=links):
        dirs.sort()
        for name in [*dirs, *sorted(files)]:
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:
                st = None
            line = f"{os.path.relpath(path, folder)}\0{st and (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)}\n"
            digest.update(line.encode(errors="surrogateescape"))
    for link in sorted(links):
        try:
            target = os.readlink(link)
        except OSError:
            target = None
        digest.update(f"{os.path.relpath(link, folder)}\0->{target}\n".encode(errors="surrogateescape"))
    return digest.hexdigest()


def _write(path: Path, data: bytes, whole: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if whole:
        write_whole(path, data)
    else:
        path.write_bytes(data)


def _print(stream: Any, data: bytes) -> None:
    """``data`` to ``stream``; a reader that closed the pipe has had enough (as the command says)."""
    if not data:
        return
    try:
        stream.buffer.write(data)
        stream.flush()
    except BrokenPipeError:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)
        except (OSError, ValueError):
            pass


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _terminal_size(fd: int) -> tuple[int, int] | None:
    try:
        return tuple(os.get_terminal_size(fd))  # type: ignore[return-value]
    except (OSError, ValueError):
        return None
