"""Parsed frames kept between runs as Parquet, keyed by file identity, outside the analyzed tree.

One entry per (reader, source path): the parse's frames as Parquet, its counts as JSON, and
the identity of what was parsed (size, mtime, ctime, inode, a hash of the head and of the bytes
just before the end). On the next run:

- an unchanged file is not parsed at all;
- a grown log (same head, same bytes where it used to end) is parsed only from a clean cut a
  little before its old end — the last step header, or the first line of the server's last
  minute — and the result is spliced onto the rows before the cut;
- anything else (rewritten, truncated, rotated into place) is parsed afresh.

The key includes a digest of the parser code, so a changed parser never serves old frames.
Entries are written to a temporary folder and renamed into place: parallel runs never see a
half-written entry. The writing happens on a background thread, beside the parsing of the next
source; a read of an entry waits for its pending write, and the process waits for all of them
before it exits.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from forensics.discover import RunLocation
from forensics.identity import CACHE_ENV as CACHE_ENV  # (the cache's own name for it, too)
from forensics.identity import Identity, code_digest, default_cache_dir, local_zone
from forensics.parsed import FRAMES, Parsed, rows_where
from parsers.schema import EVENT_SCHEMA, METRIC_SCHEMA, STEP_SCHEMA

#: How far back from a grown file's old end the cut may lie; further back, parse afresh.
MAX_REWIND = 64 << 20


@dataclass(frozen=True)
class Splice:
    """What a reader tells the cache of how a grown log of its own is parsed from a cut and joined
    to the old parse (a reader with none is parsed afresh). See ``forensics.readers``."""

    later_copy: str | None = None
    """How the reader keeps the later copy of a step logged twice (a relaunch appending to its log),
    which a splice must apply across the cut. ``header``: a step going back abandons every earlier
    table from that step on; ``key``: each key's later value; ``lineage``: as ``key``, every step
    copy listed — and a grown part going back is parsed afresh with the whole file, for the splice
    cannot judge such a restart from it alone (a loop's values may sit above their step line; a
    verl restart's validation line holds values of the step it resumed from)."""
    aligned_lines: int = 1
    """A part read alone is read as the whole file reads it when its line numbers start at a
    multiple of this, plus one (the reader folds values in blocks of lines)."""
    minute_folds: bool = False
    """Values are folded per minute: a key with values in one minute on both sides of the cut is
    folded as one by a fresh parse (the file is then parsed afresh)."""
    record_keys: frozenset[str] = frozenset()
    """With ``minute_folds``, the keys that are a row a line, not folded: compared at their own time."""
    whole_file_kinds: frozenset[str] = frozenset()
    """Events the reader counts over the whole file (a server's launches): a grown part with more
    of them than the part it re-read is parsed afresh."""
    restart_lines_kept: int | None = None
    """How many of :attr:`Parsed.restart_lines` the reader keeps, its last ones (``None``: all)."""
    first_facts: bool = False
    """A fact printed twice (a relaunch's config) is the first line's, as the reader keeps it; else the last's."""
    later_facts: frozenset[str] = frozenset()
    """With ``first_facts``, the facts a later line overrides all the same."""
    end_notes: frozenset[str] = frozenset()
    """Notes of how a file ends (a step header whose table is not written yet), counts aside: a
    grown part may say one that the part re-read did not, for a fresh parse of the file says it too."""


class ParseCache:
    """A folder of parsed sources. ``ParseCache(path)``; ``parsed(...)`` reads through it."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.outcomes: dict[str, str] = {}
        """Per source path, what the last read did: ``hit``, ``grown`` or ``parsed``."""
        self._tails: dict[Path, tuple[tuple[int, int, int, int], Parsed]] = {}
        # (per entry, the part a splice read last and what it was read from: the next splice of a
        # log grown again from the same cut re-reads those bytes, and gets this)

    def parsed(self, reader: str, path: Path, parse: Callable[[Path], Parsed], *, variant: str = "",
               splice: Splice | None = None) -> Parsed:
        """``parse(path)``, or its cached result when ``path`` has not changed since (grown, where
        ``splice`` says how: parsed from a cut near its old end)."""
        try:
            identity = Identity.of(path)
        except OSError:
            return parse(path)
        entry = self._entry(reader, path, variant)
        _written(entry)
        stored = _load(entry)
        if stored is not None:
            old_identity, old, read_as = stored
            old = old.moved(read_as, str(path)) if read_as else old
            if old_identity == identity:
                self.outcomes[str(path)] = "hit"
                return old
            if splice is not None and identity.grew_from(old_identity, path):
                try:
                    grown = self._splice(splice, path, old, old_identity, parse, entry)
                except OSError:  # no room for the scratch copy of the tail: parse the whole file
                    grown = None
                if grown is not None:
                    self.outcomes[str(path)] = "grown"
                    self._keep(entry, path, identity, grown)
                    return grown
        result = parse(path)
        self.outcomes[str(path)] = "parsed"
        self._keep(entry, path, identity, result)
        return result

    def _keep(self, entry: Path, path: Path, identity: Identity, parsed: Parsed) -> None:
        """Store ``parsed`` under ``identity`` — unless the file changed while it was read (a live
        log growing): what was read then lies somewhere between two sizes, and no identity says which."""
        try:
            unchanged = Identity.of(path) == identity
        except OSError:
            unchanged = False
        if unchanged:
            _write_later(entry, lambda: self._store(entry, identity, parsed, str(path)))

    def writable(self) -> bool:
        """Whether entries can be written here now (the folder made if need be, a file made and removed)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            with tempfile.NamedTemporaryFile(prefix=".probe-", dir=self.directory):
                return True
        except OSError:
            return False

    def clear(self) -> None:
        """Remove every entry."""
        wait_for_writes()
        shutil.rmtree(self.directory / "parsed", ignore_errors=True)
        shutil.rmtree(self.directory / "results", ignore_errors=True)

    def inputs_key(self, locations: Sequence[RunLocation], *options: str) -> str:
        """A key for everything an analysis of ``locations`` reads (logs, checkpoints, config) and the code."""
        digest = hashlib.sha256(f"{code_digest(whole_package=True)}\0{local_zone()}".encode())
        for option in options:
            digest.update(b"\0option\0" + option.encode())
        for location in locations:
            digest.update(f"\0run\0{location.run_id}\0{location.root}\0{location.skipped}".encode(errors="surrogateescape"))
            for kind, path in read_by(location):
                digest.update(f"\0{kind}\0{path}\0{Identity.text_of(path)}".encode(errors="surrogateescape"))  # (names need not be UTF-8)
        return digest.hexdigest()[:32]

    def recall(self, key: str) -> dict[str, bytes] | None:
        """The outputs remembered under ``key`` (see :meth:`remember`), or ``None`` (also when a
        folder they were remembered with has changed since)."""
        entry = self.directory / "results" / key
        try:
            if entry.stat().st_uid != os.getuid():  # only ever load what this user wrote
                return None
            kept = {p.name: p.read_bytes() for p in entry.iterdir()}
            watched = json.loads(kept.pop(_WATCHED, b"{}"))
        except (OSError, ValueError):
            return None
        return kept if all(Identity.text_of(Path(path)) == then for path, then in watched.items()) else None

    def remember(self, key: str, parts: dict[str, bytes], watched: Iterable[Path] = ()) -> None:
        """Keep finished outputs (a rendered report, a summary) for an unchanged set of inputs.
        ``watched``: folders the outputs read that the key does not cover (checkpoints a log named
        where it saved them): a change in one makes the outputs stale."""
        entry = self.directory / "results" / key
        staging = None
        try:
            entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            staging = Path(tempfile.mkdtemp(prefix=".new-", dir=entry.parent))
            parts = {**parts, _WATCHED: json.dumps({str(p): Identity.text_of(p) for p in watched}).encode()}
            for name, data in parts.items():
                (staging / name).write_bytes(data)
            shutil.rmtree(entry, ignore_errors=True)
            staging.rename(entry)
        except OSError:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)

    # -- internals ------------------------------------------------------------------------------

    def _entry(self, reader: str, path: Path, variant: str) -> Path:
        key = hashlib.sha256(f"{reader}\0{path.resolve()}\0{variant}\0{code_digest()}\0{local_zone()}".encode()).hexdigest()[:32]
        return self.directory / "parsed" / key

    def _store(self, entry: Path, identity: Identity, parsed: Parsed, read_as: str) -> None:
        """Write the entry beside its final place, then rename it in; a cache that cannot be written is skipped."""
        staging = None
        try:
            entry.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            staging = Path(tempfile.mkdtemp(prefix=".new-", dir=entry.parent))
            for name, frame in parsed.frames().items():
                frame.write_parquet(staging / f"{name}.parquet", compression="lz4", statistics=False)
            meta = {"identity": identity.__dict__, "parsed": parsed.meta(), "read_as": read_as}
            (staging / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
            old = entry.with_name(f"{entry.name}.old-{os.getpid()}")
            if entry.exists():
                entry.rename(old)
            staging.rename(entry)
            shutil.rmtree(old, ignore_errors=True)
        except (OSError, pl.exceptions.PolarsError):  # a full disk, say
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)

    def _splice(self, policy: Splice, path: Path, old: Parsed, old_identity: Identity,
                parse: Callable[[Path], Parsed], entry: Path) -> Parsed | None:
        """``old`` extended by a parse of what ``path`` grew by, or ``None`` when no clean cut is found."""
        cut_line = _cut_line(old)
        if cut_line is None:
            return None
        offset = _offset_of_line(path, old_identity.size, old.lines, cut_line)
        if offset is None:
            return None
        # Blank lines before the part read put its lines where they are in the log, modulo what the reader folds by.
        pad = (cut_line - 1) % policy.aligned_lines
        before = cut_line - 1 - pad  # (the lines before the part's first, blank or not)
        scratch = self.directory / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        kept = self._tails.pop(entry, None)
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            # (the old part re-read is the last splice's grown part when the cut has not moved: the
            # same bytes, which a log that only grew still holds, read under the same name)
            if kept is not None and kept[0] == (offset, pad, old_identity.size, old_identity.inode):
                old_tail = kept[1]
            else:
                old_tail, _ = _parse_range(path, offset, old_identity.size, Path(tmp, "old", path.name), parse, pad)
            new_tail, end = _parse_range(path, offset, None, Path(tmp, "new", path.name), parse, pad)
        self._tails[entry] = ((offset, pad, end, old_identity.inode), new_tail)
        reread = old_tail.shifted(before, str(path))  # (the old parse's last lines, read again, on its line numbers)
        at_header = bool(old.steps.height) and cut_line == old.steps["line"].max()
        if at_header and (new_tail.steps.is_empty() or new_tail.steps["line"].min() != 1 + pad):
            return None  # the cut is not where the last step header was: do not trust the splice
        if old.steps.height and not at_header and not (_same_values(old, reread, cut_line)
                                                       and _says_nothing_new(old_tail.notes, new_tail.notes, policy.end_notes)):
            # (a line the reader named after the last step: the part re-read must give what the old parse
            # did, and the grown part say nothing it did not — a table whose header lies above the cut)
            return None
        if old_tail.reading != old.reading or new_tail.reading != old.reading:
            return None  # (the reader chose from the part's head to read it otherwise: Ray prefixes that begin later)
        if before + old_tail.lines != old.lines:  # (the part re-read does not end where the old parse did:
            return None  # the cut, found by counting lines back, is misplaced)
        notes = _spliced_notes(old.notes, old_tail.notes, new_tail.notes)
        if notes is None:
            return None
        if not _same_events(old.events.filter(pl.col("line") >= cut_line), reread.events):
            return None  # the reader's events depend on lines before the cut (one warning per streak): parse it all
        head = old.before(cut_line)
        tail = new_tail.shifted(before, str(path))
        if policy.later_copy == "lineage" and (_goes_back(tail) or _logs_again(head, tail)):
            return None  # (a restart: the reader judges re-logged steps, and counts them, over the whole file)
        if policy.minute_folds and _shares_a_minute(head, tail, policy.record_keys):
            return None
        if _counted(new_tail, policy.whole_file_kinds) != _counted(old_tail, policy.whole_file_kinds):
            return None  # (a relaunch in the grown part: instances are counted over the whole file)
        return replace(
            old,
            **_later_copies(policy.later_copy, head.frames(), tail.frames(), _last_header(old), cut_line),
            lines=before + new_tail.lines,
            restart_lines=_restarts(old.restart_lines, cut_line, new_tail.restart_lines, before, policy.restart_lines_kept),
            unparsed_lines=max(0, old.unparsed_lines - old_tail.unparsed_lines) + new_tail.unparsed_lines,
            notes=notes,
            facts=_spliced_facts(policy, old.facts, new_tail.facts),
        )


def _spliced_facts(policy: Splice, old: dict[str, str], grown: dict[str, str]) -> dict[str, str]:
    """The facts of the old parse and of the grown part, as the reader keeps a fact printed twice."""
    if not policy.first_facts:
        return {**old, **grown}
    return {**grown, **old} | {key: value for key, value in grown.items() if key in policy.later_facts}


#: A count in a note, with or without thousands separators (not the comma after it: "step 1, unfinished").
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+")
#: How near the end an event must start to be possibly still open (a traceback being written).
_OPEN_EVENT_LINES = 200


def _spliced_notes(old: tuple[str, ...], old_tail: tuple[str, ...], new_tail: tuple[str, ...]) -> tuple[str, ...] | None:
    """The whole grown file's notes from the old parse's, its re-read tail's and the grown tail's:
    counts are the old file's less the re-read part's plus the grown part's (``789 stats lines kept
    as 595``); a note of the re-read part stays only if the grown part says it too (a table cut
    off mid-row, completed since); what a tail says of itself alone and the whole did not (no
    launch line in it) is not said. ``None`` when the counts do not add up, or the grown part alone
    says something of the whole file that neither the old parse nor the re-read part said."""
    def numbers(note: str | None) -> list[int]:
        return [int(n.replace(",", "")) for n in _NUMBER.findall(note)] if note else []

    said, reread, grown = ({_shape(n): n for n in notes} for notes in (old, old_tail, new_tail))
    out = []
    for key, note in said.items():
        if key not in reread and key not in grown:
            out.append(note)
            continue
        counts = numbers(note)
        if not counts:
            if key in grown or key not in reread:
                out.append(note)
            continue
        extra = numbers(grown.get(key)) or [0] * len(counts)
        less = numbers(reread.get(key)) or [0] * len(counts)
        total = [a - b + c for a, b, c in zip(counts, less, extra, strict=True)]
        if min(total) < 0:
            return None
        if any(total):
            out.append(_renumbered(note, total))
    for key, note in grown.items():
        if key not in said and key not in reread:
            if not numbers(note):  # (a judgment of the whole file, "no launch line", the grown part cannot make alone)
                return None
            out.append(note)
    return tuple(out)


def _shape(note: str) -> str:
    """``note`` with its counts blanked: what it says, whatever the numbers."""
    return _NUMBER.sub("#", note)


def _renumbered(note: str, values: list[int]) -> str:
    """``note`` with its numbers replaced by ``values``, each written as the one it replaces was."""
    tokens = iter(values)

    def swap(found: re.Match[str]) -> str:
        value = next(tokens)
        return f"{value:,}" if "," in found.group() else str(value)

    return _NUMBER.sub(swap, note)


def _same_events(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    """The same events at the same lines and times (an undated line is dated from a line above it,
    which a part read from it has not). A flood's message one parse held and the other did not (its
    batches were cut elsewhere) is the same line's."""
    columns = ["line", "kind", "time"]
    a, b = a.select(*columns, "message").sort(columns), b.select(*columns, "message").sort(columns)
    if not a.select(columns).equals(b.select(columns)):
        return False
    held = a["message"].is_not_null() & b["message"].is_not_null()
    return bool((a["message"] == b["message"]).filter(held).all())


def _same_values(old: Parsed, old_tail: Parsed, cut: int) -> bool:
    """Whether the re-read part gives the steps and values the old parse had from line ``cut`` on."""
    for name in ("steps", "metrics", "superseded"):
        mine, theirs = getattr(old, name).filter(pl.col("line") >= cut), getattr(old_tail, name)
        columns = [c for c in mine.columns if c != "file"]
        if not mine.select(columns).sort(columns, nulls_last=True).equals(theirs.select(columns).sort(columns, nulls_last=True)):
            return False
    return True


def _says_nothing_new(reread: tuple[str, ...], grown: tuple[str, ...], end_notes: frozenset[str] = frozenset()) -> bool:
    """Whether every note of the grown part, but those of how the file ends, was said of the re-read
    part (counts aside)."""
    return {_shape(n) for n in grown} - {_shape(n) for n in end_notes} <= {_shape(n) for n in reread}


def _goes_back(tail: Parsed) -> bool:
    """Whether a grown part goes back (a restart): its step lines, or the steps of its values line
    after line. Its first step line is the old parse's last, parsed again: that one's going back,
    if it did, the old parse has already judged."""
    values = tail.metrics.filter(pl.col("step").is_not_null()).group_by("line").agg(pl.col("step").min()).sort("line")
    return bool((tail.steps.sort("line")["step"].diff() <= 0).any() or (values["step"].diff() < 0).any())


def _logs_again(head: Parsed, tail: Parsed) -> bool:
    """Whether a grown part logs a step the part before the cut has logged past (a restart that
    began before the cut, still logging the steps it went back to). The cut's own step may be on
    both sides: a loop's values can sit above their step line."""
    first = min((s for s in (tail.steps["step"].min(), tail.metrics["step"].min()) if s is not None), default=None)
    last = max((s for s in (head.steps["step"].max(), head.metrics["step"].max()) if s is not None), default=None)
    return first is not None and last is not None and first < last


def _last_header(parsed: Parsed) -> int | None:
    """The step of the last step line in ``parsed`` (by line)."""
    return parsed.steps.sort("line")["step"][-1] if parsed.steps.height else None


def _later_copies(rule: str | None, head: dict[str, pl.DataFrame], tail: dict[str, pl.DataFrame], last: int | None,
                  cut: int) -> dict[str, pl.DataFrame]:
    """``head``'s frames followed by ``tail``'s, a step the tail logs again losing its earlier copy
    in the head, as the reader itself does (each part's own repeats the reader already dropped).
    ``last``: the step of the old parse's last step line; ``cut``: the tail's first line.

    The head's metric rows are kept as slices, stepped rows before unstepped as a reader gives
    them: a long run's values are neither copied nor sorted for a few new steps.
    """
    frames = {name: pl.concat([head[name], tail[name]], how="vertical_relaxed") for name in FRAMES}
    if rule is None:
        return frames
    old, new = head["metrics"], tail["metrics"]
    stepped, loose = pl.col("step").is_not_null(), pl.col("step").is_null()
    # (A "lineage" tail never goes back past the old parse's last step line, which that parse judged.)
    again = pl.col("step").is_in(new["step"].drop_nulls().unique().implode())
    if rule == "header":  # the tail going back abandons the head from there on
        # (a step line at the cut is the old parse's last, read again: realhf's table of it lies above)
        back = tail["steps"].filter(pl.col("line") > cut)["step"].min()
        again = pl.col("step") >= back if back is not None and last is not None and back <= last else pl.lit(False)
    parts = [rows_where(old, stepped & ~again)]
    if rule != "header":  # per key: the head keeps a re-logged step's keys the tail does not log again
        parts.append(old.filter(again).join(new.select("step", "key").unique(), on=["step", "key"], how="anti"))
    else:  # the earlier copies the tail replaced are kept as such, as AReaL's reader keeps its own
        frames["superseded"] = pl.concat([head["superseded"], old.filter(stepped & again), tail["superseded"]]).sort("line", maintain_order=True)
    parts += [new.filter(stepped), rows_where(old, loose), new.filter(loose)]
    frames["metrics"] = pl.concat(parts, how="vertical_relaxed")
    if rule not in ("header", "lineage"):  # these readers list a re-logged step once, its latest copy (the others: every copy)
        frames["steps"] = frames["steps"].unique("step", keep="last").sort("line")
    return frames


def _cut_line(parsed: Parsed) -> int | None:
    """A line from which parsing can restart with no state carried over (``None``: none is known).

    - Where the reader names such lines (:attr:`Parsed.restart_lines`: a step header whose tables
      follow it, a logger line after the last step's tables, the first line of one of a server log's
      last minutes), the last of them no later than the last event near the end (a traceback still
      being written when the file was read goes on past its first line); in a log of steps, where
      all are later, the first (the event was over by then: a header or logger line is a new record);
    - else the last step header (its tables follow it);
    - else the first line of the last minute of timed values; else the first line of undated values
      (a step not logged yet, whose values are folded when it is); else the file's last line (it may
      have been cut mid-line when it was read) — in these three, no later than the last event near the end.
    """
    last_event = parsed.events["line"].max()
    # (a short log with no event yet has nothing still being written)
    open_at = int(last_event) if last_event is not None and last_event > parsed.lines - _OPEN_EVENT_LINES else None
    if parsed.restart_lines is not None:
        lines = parsed.restart_lines
        first = min(lines, default=None) if parsed.steps.height else None
        return max((line for line in lines if open_at is None or line <= open_at), default=first)
    if parsed.steps.height:
        return int(parsed.steps["line"].max())
    last = parsed.metrics["time"].max()
    first_value = parsed.metrics["line"].min()
    if last is not None:
        # Lazy: a long server log's rows are millions; only the last minute's lines are read.
        last_minute = last.replace(second=0, microsecond=0)
        cut = int(parsed.metrics.lazy().filter(pl.col("time") >= last_minute).select(pl.col("line").min()).collect().item())
    elif first_value is not None:
        cut = int(first_value)
    else:
        cut = max(1, parsed.lines)
    return cut if open_at is None else min(cut, open_at)


def _restarts(old: tuple[int, ...] | None, cut: int, grown: tuple[int, ...] | None, before: int,
              kept: int | None) -> tuple[int, ...] | None:
    """The restart lines (see :attr:`Parsed.restart_lines`) of a file spliced at ``cut``: the old
    parse's before it and the grown part's (its lines ``before`` on), the last ``kept`` of them."""
    if grown is None or old is None:
        return old if grown is None else tuple(before + line for line in grown)
    if not grown or not old:
        return ()
    return tuple(sorted({line for line in old if line < cut} | {before + line for line in grown}))[-kept if kept else None:]


def _shares_a_minute(head: Parsed, tail: Parsed, record_keys: frozenset[str]) -> bool:
    """Whether a folded key has values in one minute on both sides of the cut, which a fresh parse
    folds as one (a line of the minute before written after the first of the next: two processes,
    one log; a relaunch whose clock is behind), or a record's value is on both sides at one time
    (ranks' copies of one record, which a fresh parse counts once)."""
    first = tail.metrics["time"].min()
    if first is None:
        return False
    key = pl.col("key").cast(pl.String)
    folded = ~key.is_in(list(record_keys))
    mine = head.metrics.lazy().filter(pl.col("time") >= first.replace(second=0, microsecond=0))  # type: ignore[union-attr]
    theirs = tail.metrics.lazy()
    for where, when in ((folded, pl.col("time").dt.truncate("1m")), (~folded, pl.col("time"))):
        both = [frame.filter(where).select(when.alias("when"), key).unique() for frame in (mine, theirs)]
        if both[0].join(both[1], on=["when", "key"]).select(pl.len()).collect().item():
            return True
    return False


def _counted(parsed: Parsed, kinds: frozenset[str]) -> int:
    return parsed.events.filter(pl.col("kind").cast(pl.String).is_in(list(kinds))).height if kinds else 0


def _offset_of_line(path: Path, size: int, lines: int, line: int) -> int | None:
    """Byte offset where 1-based ``line`` starts, searching back from ``size`` (the file had ``lines`` lines)."""
    if line <= 1:
        return 0
    if line > lines + 1:
        return None
    block = 1 << 20
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        ends_with_newline = fh.read(1) == b"\n"
        wanted = lines - line + 1 + ends_with_newline  # newlines from the end to the one ending line - 1
        pos = size
        while pos > 0 and size - pos < MAX_REWIND:
            start = max(0, pos - block)
            fh.seek(start)
            data = fh.read(pos - start)
            found = data.count(b"\n")
            if found >= wanted:
                at = len(data)
                for _ in range(wanted):
                    at = data.rindex(b"\n", 0, at)
                return start + at + 1
            wanted -= found
            pos = start
    return None


def _parse_range(path: Path, start: int, stop: int | None, scratch: Path, parse: Callable[[Path], Parsed],
                 pad: int = 0) -> tuple[Parsed, int]:
    """``parse`` of bytes ``start:stop`` of ``path``, copied to ``scratch`` (never written near ``path``)
    after ``pad`` blank lines; and where the bytes copied ended."""
    scratch.parent.mkdir(exist_ok=True)
    end = start
    with open(path, "rb") as src, open(scratch, "wb") as dst:
        dst.write(b"\n" * pad)
        src.seek(start)
        remaining = None if stop is None else stop - start
        while remaining is None or remaining > 0:
            chunk = src.read(1 << 22 if remaining is None else min(1 << 22, remaining))
            if not chunk:
                break
            dst.write(chunk)
            end += len(chunk)
            if remaining is not None:
                remaining -= len(chunk)
    return parse(scratch), end


# Entry writes in flight, by entry folder: one writer thread for the process (Parquet encoding
# releases the GIL), so a cold analysis encodes one source while it parses the next.
_writes: dict[Path, Future[None]] = {}
_writes_lock = threading.Lock()
_writer: ThreadPoolExecutor | None = None


def _write_later(entry: Path, write: Callable[[], None]) -> None:
    global _writer
    with _writes_lock:
        if _writer is None:
            # Its thread is joined when the interpreter exits: no entry is left half-written.
            _writer = ThreadPoolExecutor(1, thread_name_prefix="grpo-forensics-cache")
        _writes[entry] = _writer.submit(write)


def _written(entry: Path) -> None:
    """Wait for the pending write of ``entry``, if any."""
    with _writes_lock:
        pending = _writes.pop(entry, None)
    if pending is not None:
        pending.result()


def wait_for_writes() -> None:
    """Wait until every entry write started by this process is on disk."""
    with _writes_lock:
        pending = list(_writes.values())
        _writes.clear()
    for write in pending:
        write.result()


#: The columns each stored frame must have.
_COLUMNS = {"steps": STEP_SCHEMA, "metrics": METRIC_SCHEMA, "events": EVENT_SCHEMA, "superseded": METRIC_SCHEMA}


def _load(entry: Path) -> tuple[Identity, Parsed, str | None] | None:
    try:
        if hasattr(os, "getuid") and any(p.stat().st_uid != os.getuid() for p in (entry, *entry.iterdir())):
            return None  # only ever load what this user wrote, as for results
        meta = json.loads((entry / "meta.json").read_text(encoding="utf-8"))
        frames = {name: pl.read_parquet(entry / f"{name}.parquet") for name in FRAMES}
        if any(not set(_COLUMNS[name]) <= set(frame.columns) for name, frame in frames.items()):
            return None  # (readable, but not what was written: a bad sync of a shared cache, a hand's edit)
        return Identity(**meta["identity"]), Parsed.from_parts(meta["parsed"], frames), meta.get("read_as")
    except (OSError, ValueError, KeyError, TypeError, pl.exceptions.PolarsError):
        return None


def read_by(location: RunLocation) -> list[tuple[str, Path]]:
    """What an analysis of ``location`` reads, by kind (a log's, or ``extra``): its logs, its config,
    its other copies, its checkpoint folder."""
    extra = [location.root / "config.yaml", *location.twins] + ([location.checkpoint_dir] if location.checkpoint_dir else [])
    return [(s.kind, s.path) for s in location.logs] + [("extra", p) for p in extra]


def folders_beyond(checkpoints: Iterable[str], keyed: Iterable[Path], named: Iterable[str | Path | None] = ()) -> list[Path]:
    """The folders holding ``checkpoints`` (paths an analysis listed), and the save folders logs
    ``named`` (a verl console's absolute ``default_local_dir``, though it held nothing yet), outside
    the ``keyed`` checkpoint folders. An inputs key does not cover them; a result remembered must be
    watched for a change in them (see :meth:`ParseCache.remember`)."""
    keyed = [Path(os.path.abspath(k)) for k in keyed]
    folders = {Path(os.path.abspath(c)).parent for c in checkpoints} | {Path(os.path.abspath(n)) for n in named if n}
    return sorted(f for f in folders if not any(f == k or k in f.parents for k in keyed))


#: A remembered result's record of the folders it was made with (see :meth:`ParseCache.remember`).
_WATCHED = "watched.json"
