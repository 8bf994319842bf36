"""Checkpoints and the decision journal: what makes ``kill -9`` lose nothing (docs/daemon.md §4).

A checkpoint directory holds ``ckpt-<seq>`` snapshots (written with
:func:`streamlearn.snapshot.write_snapshot`: atomic rename, sha256 of the
arrays) and ``journal-<seq>.jsonl`` segments.

Commit order of :meth:`Checkpointer.save` (the caller has already frozen its
state into plain arrays + JSON):

1. ``transport.flush`` — every decision and dead letter of the processed input
   is acknowledged by the broker;
2. write ``ckpt-<seq>`` — learner arrays, pending joins, next offsets of both
   input topics, counters; atomic, so a crash leaves the old or the new one;
3. ``transport.commit(offsets)`` — only now may the group skip that input (a
   failed commit is logged: restore uses the snapshot's offsets, and the next
   checkpoint commits again); a background checkpoint (below) does not wait for
   the commit to complete, any other does;
4. delete snapshots and journal segments older than the ``keep`` newest snapshots.

The loop's periodic checkpoints write step 2 on a background thread
(``background=True``): the arrays are copied first, so the loop goes on deciding
while the snapshot is written, and steps 3 and 4 run on the loop's thread once it is
(:meth:`Checkpointer.settle`, called every step; a write that failed raises there).
Decisions made meanwhile are journaled in segment ``<seq>``, so a crash before the
snapshot is renamed restores ``ckpt-<seq-1>`` and replays them from the segments
``>= seq-1``. A sequence number is never used twice — the checkpointer starts past
the highest snapshot *and* journal segment — so a segment written before a crash is
never appended to as if it followed a later snapshot. A write still in flight is
settled before the next checkpoint starts and before a final one.

Before step 2 the next journal segment ``journal-<seq>`` is started with the
journaled decisions whose input has not been re-read yet (``carry``), so that
the new snapshot never lacks a decision the previous one could replay.

Invariants: the offsets in a snapshot are exactly the input whose effect the
snapshot's state contains; offsets only move forward; at start the newest
snapshot that restores cleanly is restored — it reads back, its offsets are
valid and the caller's ``accept`` (thawing its state) raises nothing; a
corrupt one is reported and the previous one used, the corrupt one renamed
``corrupt-ckpt-<seq>-<time>``; when none restores nothing is moved and
``StateError`` says why — and the transport seeks to its offsets.

The **decision journal** makes re-emitted decisions identical after a crash.
Before a decision is produced, its record (full probability row + the exact
decision message) is appended to the current segment. After a restart from
snapshot ``s``, the segments ``>= s`` hold every decision made for input the
snapshot has not seen; re-read input whose id is in the journal gets the
journaled decision instead of a new one, so the learner, the pending joins and
the decisions topic see exactly what they saw before the crash. A line that is
not a valid decision (:func:`journal_record_problem`) is skipped on its own and
logged: its id gets a new decision rather than a damaged one. Appends are
flushed to the OS (enough for a process crash); ``fsync_journal`` also survives
power loss at a cost per batch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import shutil
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson

from streamlearn.durability.changelog import Changelog, write_or_warn
from streamlearn.errors import StateError, TransportError
from streamlearn.snapshot import read_snapshot, write_snapshot
from streamlearn.transport.protocol import Transport

__all__ = ["CheckpointMismatch", "Checkpointer", "ConsumedOffsets", "DecisionJournal",
           "JournaledDecision", "Restored", "is_count", "journal_record_problem",
           "offsets_from_json", "offsets_to_json", "short_repr"]

log = logging.getLogger("streamlearn.checkpoint")

_CKPT = re.compile(r"^ckpt-(\d+)$")
_JOURNAL = re.compile(r"^journal-(\d+)\.jsonl$")

Offsets = dict[tuple[str, int], int]


def offsets_to_json(offsets: Offsets) -> list[list[Any]]:
    return [[topic, partition, offset] for (topic, partition), offset in sorted(offsets.items())]


def offsets_from_json(rows: Any, topics: Collection[str] | None = None) -> Offsets:
    """Offsets saved by :func:`offsets_to_json`, validated (``StateError`` if they are not).

    Expected: a list of ``[topic, partition, next offset]`` rows — a non-empty string (one of
    ``topics``, when given) and two ints >= 0 — with no ``(topic, partition)`` twice.

    >>> offsets_from_json([["in", 0, 7]])
    {('in', 0): 7}
    >>> try:
    ...     offsets_from_json([["in", 0, -1]])
    ... except StateError as exc:
    ...     print(exc)
    offsets must be [topic, partition >= 0, offset >= 0] rows. Got ['in', 0, -1].
    """
    if not isinstance(rows, list):
        raise StateError(f"offsets must be a list of [topic, partition, offset] rows. "
                         f"Got {short_repr(rows)}.")
    out: Offsets = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and row[0]
                and is_count(row[1]) and is_count(row[2])):
            raise StateError(f"offsets must be [topic, partition >= 0, offset >= 0] rows. "
                             f"Got {short_repr(row)}.")
        topic, partition, offset = row
        if topics is not None and topic not in topics:
            raise StateError(f"offsets name topic {topic!r}; this daemon reads "
                             f"{sorted(topics)}.")
        if (topic, partition) in out:
            raise StateError(f"offsets hold {topic}[{partition}] twice.")
        out[(topic, partition)] = offset
    return out


def is_count(value: Any) -> bool:
    """An int >= 0 (JSON's true/false are not counts)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages about stored state."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


class CheckpointMismatch(StateError):
    """A sound checkpoint that does not fit this daemon's configuration (another learner class
    or shape): not a corruption, so no older checkpoint is tried and none is set aside."""


class ConsumedOffsets:
    """The next offset to read per ``(topic, partition)``: the input whose effect the state holds.

    Offsets only move forward: :meth:`consumed` raises ``StateError`` at once
    when a message would move one back (input processed twice).

    >>> offsets = ConsumedOffsets({("in", 0): 5})
    >>> offsets.consumed([("in", 0, 5), ("in", 0, 6), ("fb", 1, 0)]); offsets.snapshot()
    {('in', 0): 7, ('fb', 1): 1}
    >>> try:
    ...     offsets.consumed([("in", 0, 3)])
    ... except StateError as exc:
    ...     print(exc)
    offsets only move forward: in[0] is at 7, a message at offset 3 would move it back.
    """

    def __init__(self, start: Offsets | None = None) -> None:
        self._next: Offsets = dict(start or {})

    def consumed(self, messages: Iterable[Any]) -> None:
        """Record processed messages (objects with topic/partition/offset, or such triples)."""
        for m in messages:
            topic, partition, offset = (m if isinstance(m, tuple) else
                                        (m.topic, m.partition, m.offset))
            key = (topic, partition)
            current = self._next.get(key)
            if current is not None and offset < current:
                raise StateError(f"offsets only move forward: {topic}[{partition}] is at {current}, "
                                 f"a message at offset {offset} would move it back.")
            self._next[key] = offset + 1

    def snapshot(self) -> Offsets:
        return dict(self._next)

    def __len__(self) -> int:
        return len(self._next)


@dataclass(frozen=True)
class JournaledDecision:
    """A decision as it was produced: the full distribution and the exact message fields."""

    action: int
    probs: list[float]
    message: dict[str, Any]
    columns: dict[str, Any] = field(default_factory=dict)  # the engine's per-decision columns


@dataclass
class Restored:
    """The snapshot restored at start-up."""

    seq: int
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    offsets: Offsets


class DecisionJournal:
    """Append-only JSON-lines segments of decisions made since a snapshot."""

    def __init__(self, directory: Path, fsync: bool = False) -> None:
        self.directory = directory
        self.fsync = fsync
        self._file: IO[bytes] | None = None
        self.segment = -1
        # the changelog's journal (durability/changelog.py): each batch is written there, and
        # acknowledged, before the local append; None: local only
        self.mirror: Callable[[int, bytes], None] | None = None
        # journal lines a restore from the changelog found, by segment (read by load)
        self.restored: dict[int, list[bytes]] = {}

    def open_segment(self, seq: int) -> None:
        """Append further decisions to ``journal-<seq>.jsonl``."""
        self.close()
        self.segment = seq
        path = self.directory / f"journal-{seq:08d}.jsonl"
        if os.path.lexists(path) and (path.is_symlink() or not path.is_file()):
            aside = path.with_name(f"corrupt-{path.name}-{int(time.time())}")
            log.warning("journal segment %s is not a regular file; moved to %s", path, aside.name)
            os.rename(path, aside)
        self._file = open(path, "ab")  # noqa: SIM115
        if self._file.tell() and _last_byte(path) != b"\n":
            self._file.write(b"\n")  # end a torn last line: the next record starts a line of its own

    def append(self, event_ids: list[str], probs: np.ndarray | list[list[float]],
               messages: list[dict[str, Any]],
               columns: Mapping[str, np.ndarray] | None = None) -> None:
        """Journal one batch of decisions (before they are produced), with the engine's
        per-decision ``columns`` (one value per decision each) under ``"c"``."""
        if self._file is None or not event_ids:
            return
        rows = probs.tolist() if isinstance(probs, np.ndarray) else probs
        if columns:
            per_row = [dict(zip(columns, values, strict=True))
                       for values in zip(*(c.tolist() for c in columns.values()), strict=True)]
            lines = b"".join(orjson.dumps({"p": p, "d": m, "c": c}) + b"\n"
                             for p, m, c in zip(rows, messages, per_row, strict=True))
        else:
            lines = b"".join(orjson.dumps({"p": p, "d": m}) + b"\n"
                             for p, m in zip(rows, messages, strict=True))
        if self.mirror is not None:
            self.mirror(self.segment, lines)
        self._file.write(lines)
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def local_lines(self, from_seq: int) -> dict[int, bytes]:
        """The local segments ``>= from_seq``, each as its complete lines (a torn last line is
        left out), by segment: what this disk journaled that a changelog may no longer hold."""
        out: dict[int, bytes] = {}
        for seq, path in _numbered(self.directory, _JOURNAL):
            if seq < from_seq or path.is_symlink() or not path.is_file():
                continue
            with contextlib.suppress(OSError):  # unreadable: load names it
                data = path.read_bytes()
                complete = data[:data.rfind(b"\n") + 1]
                if complete:
                    out[seq] = complete
        return out

    def load(self, from_seq: int, n_actions: int | None = None) -> dict[str, JournaledDecision]:
        """Every valid journaled decision in segments ``>= from_seq``.

        A line that does not parse (a torn append) or is not a valid decision
        (:func:`journal_record_problem`; ``n_actions``: the learner's K, if known) is skipped
        on its own — every line is a record of its own — and named on one WARNING per segment:
        its id, if its input is re-read, gets a new decision instead of a damaged one. Without
        ``n_actions``, rows of another width than most rows are skipped too.
        """
        found: dict[str, JournaledDecision] = {}
        for seq, path in _numbered(self.directory, _JOURNAL):
            if seq < from_seq:
                continue
            if path.is_symlink() or not path.is_file():
                log.warning("journal segment %s is not a regular file; skipped", path)
                continue
            try:
                lines = path.read_bytes().split(b"\n")
            except OSError as exc:
                raise StateError(f"cannot read the journal segment {path}: "
                                 f"{exc.strerror or exc}") from exc
            _parse_journal(lines, str(path), found, n_actions)
        for seq, batches in sorted(self.restored.items()):
            if seq >= from_seq:
                for number, batch in enumerate(batches, 1):
                    _parse_journal(batch.split(b"\n"), f"changelog journal {seq}/{number}",
                                   found, n_actions)
        return found if n_actions is not None else _of_the_usual_width(found)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _parse_journal(lines: list[bytes], where: str, found: dict[str, JournaledDecision],
                   n_actions: int | None) -> None:
    """Add the valid decisions among ``lines`` to ``found`` (the first of an id wins); the
    damaged ones are named on one WARNING."""
    bad: list[tuple[int, str]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            if number < len(lines):  # the last one is a torn append: not published yet
                bad.append((number, "not valid JSON (a torn append?)"))
            continue
        problem = journal_record_problem(rec, n_actions)
        if problem is not None:
            bad.append((number, problem))
            continue
        d = rec["d"]
        kept = rec.get("c")
        found.setdefault(d["id"], JournaledDecision(
            d.get("action", -1), rec["p"], d,
            {k: float(v) for k, v in kept.items() if _is_number(v)}
            if isinstance(kept, dict) else {}))
    if bad:
        log.warning("journal segment %s: %d damaged line(s) skipped, their decisions are "
                    "not reused; line %d: %s", where, len(bad), *bad[0])


def _reason(exc: Exception) -> str:
    """One line: a StateError's message as it is, anything else with its type."""
    text = str(exc) if isinstance(exc, StateError) else f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:500].rstrip(".")


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1)


def journal_record_problem(rec: Any, n_actions: int | None = None) -> str | None:
    """Why a parsed journal line is not a decision that may be published again (None if it is).

    A record is ``{"p": probabilities, "d": the decision message}``. Every message has a
    string ``id`` and a finite ``ts``; a learner's decision has an int ``action`` in
    ``[0, K)`` (K = ``n_actions``, or the row's width), ``p`` a row of K finite numbers in
    [0, 1] summing to 1 with ``p[action] > 0`` and ``prob == p[action]``; a candidate-set
    decision (no ``action``) has its placed ``candidates`` (ids with probabilities in (0, 1])
    and a non-empty ``ranking``.

    >>> journal_record_problem({"p": [0.9, 0.1], "d": {"id": "a", "action": 0, "prob": 0.9,
    ...                                                  "ts": 1.0}})
    >>> journal_record_problem({"p": [0.9, 0.1], "d": {"id": "a", "action": 7, "prob": 0.9,
    ...                                                  "ts": 1.0}})
    'action must be an int in [0, 2), got 7'
    """
    if not isinstance(rec, dict) or not isinstance(rec.get("d"), dict) or "p" not in rec:
        return 'expected {"p": [...], "d": {...}}'
    d, p = rec["d"], rec["p"]
    if not isinstance(d.get("id"), str):
        return f"id must be a string, got {short_repr(d.get('id'))}"
    if not _is_number(d.get("ts")):
        return f"ts must be a finite number, got {short_repr(d.get('ts'))}"
    for name, kind in (("explored", bool), ("model", str)):
        if name in d and not isinstance(d[name], kind):
            return f"{name} must be a {kind.__name__}, got {short_repr(d[name])}"
    if not (isinstance(p, list) and p and all(_is_number(v) and 0 <= v <= 1 for v in p)):
        return f"p must be a non-empty list of numbers in [0, 1], got {short_repr(p)}"
    if "action" not in d:
        return _candidates_problem(d)
    k = len(p) if n_actions is None else n_actions
    if len(p) != k:
        return f"p must hold {k} probabilities (one per action), got {len(p)}"
    action = d["action"]
    if not (is_count(action) and action < k):
        return f"action must be an int in [0, {k}), got {short_repr(action)}"
    if abs(math.fsum(p) - 1.0) > _SUM_TOLERANCE:
        return f"p must sum to 1, got {math.fsum(p)!r}"
    if not p[action] > 0:
        return f"p[action] must be > 0 (the action was played), got {p[action]!r}"
    if not (_is_number(d.get("prob")) and math.isclose(d["prob"], p[action], rel_tol=1e-9)):
        return f"prob must be p[action] = {p[action]!r}, got {short_repr(d.get('prob'))}"
    ranking = d.get("ranking")
    if ranking is not None and not (isinstance(ranking, list)
                                    and all(is_count(a) and a < k for a in ranking)):
        return f"ranking must be a list of actions in [0, {k}), got {short_repr(ranking)}"
    return None


_SUM_TOLERANCE = 1e-6  # the rows are float64 distributions: off by a few ulps at most


def _candidates_problem(d: dict[str, Any]) -> str | None:
    placed = d.get("candidates")
    if not (isinstance(placed, list) and placed and all(
            isinstance(c, dict) and isinstance(c.get("id"), str) and _is_number(c.get("prob"))
            and 0 < c["prob"] <= 1 for c in placed)):
        return (f"a decision needs an action, or candidates (ids with probabilities in (0, 1]); "
                f"got {short_repr(placed)}")
    ranking = d.get("ranking")
    if not (isinstance(ranking, list) and ranking and all(isinstance(c, str) for c in ranking)):
        return f"ranking must be a non-empty list of candidate ids, got {short_repr(ranking)}"
    if not (_is_number(d.get("prob")) and 0 < d["prob"] <= 1):
        return f"prob must be a number in (0, 1], got {short_repr(d.get('prob'))}"
    return None


def _of_the_usual_width(found: dict[str, JournaledDecision]) -> dict[str, JournaledDecision]:
    """The learners' decisions whose row has the width most rows have (K), and every
    candidate-set decision; a row of another width is damage (logged)."""
    widths = Counter(len(j.probs) for j in found.values() if j.action >= 0)
    if len(widths) < 2:
        return found
    usual = widths.most_common(1)[0][0]
    odd = {i for i, j in found.items() if j.action >= 0 and len(j.probs) != usual}
    log.warning("journal: %d decision(s) with a probability row of another width than %d "
                "skipped, e.g. id %r", len(odd), usual, min(odd))
    return {i: j for i, j in found.items() if i not in odd}


# A sequence number this checkpointer could have written: one per checkpoint, so 10¹² is
# 30,000 years at one a second. A larger one (a stray "ckpt-99999999999999999999") is not
# ours: counting on from it made every later number overflow the snapshot's JSON, and the
# daemon crashed at every restart (found by an outside client).
MAX_SEQ = 10**12


def _numbered(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    out = []
    for path in directory.iterdir():
        match = pattern.match(path.name)
        if not match:
            continue
        digits = match.group(1)  # its length bounds the int() of an absurdly long name
        if len(digits) > len(str(MAX_SEQ)) or int(digits) > MAX_SEQ:
            log.warning("ignoring %s in the checkpoint directory: its number is beyond any this "
                        "daemon writes (%d)", path.name, MAX_SEQ)
            continue
        out.append((int(digits), path))
    return sorted(out)


def copy_holding_the_lock(array: np.ndarray) -> np.ndarray:
    """A read-only copy of ``array``, made without letting go of the interpreter's lock.

    ``np.array(a, copy=True)`` of more than a few hundred elements lets other Python threads
    run while it copies, and getting the lock back waits for the thread that took it: up to
    the 5 ms switch interval when that thread is busy, as kafka-python's network thread is
    under a backlog. A snapshot copies some 25 arrays: ~100 ms of the serving thread in a
    microbenchmark with one busy thread beside it, 0.4-1.8 ms through ``tobytes`` (one
    ``memcpy`` holding the lock; docs/performance.md, 2026-12-06).
    """
    if array.dtype.hasobject:  # not in a snapshot; copied as numpy does it
        return np.array(array, copy=True)
    return np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape)


class Checkpointer:
    """Writes and restores checkpoints in ``directory``; see the module docstring.

    Parameters
    ----------
    directory
        Where ``ckpt-<seq>`` and ``journal-<seq>.jsonl`` live (created if missing).
    keep
        Snapshots kept (>= 2 so a corrupt newest one has a fallback).
    every_events, every_s
        A checkpoint is due after this many input messages (or as many as the last snapshot
        held pending decisions, if more: :meth:`due`) or seconds, whichever first.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 2,
                 every_events: int = 10_000, every_s: float = 30.0,
                 fsync_journal: bool = False, changelog: Changelog | None = None) -> None:
        if keep < 1 or every_events < 1 or every_s <= 0:
            raise StateError(f"Checkpointer needs keep >= 1, every_events >= 1, every_s > 0. "
                             f"Got {keep}, {every_events}, {every_s}.")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep, self.every_events, self.every_s = keep, every_events, every_s
        self.journal = DecisionJournal(self.directory, fsync_journal)
        self.changelog = changelog
        if changelog is not None:
            self.journal.mirror = changelog.journal
            changelog.where = str(self.directory)  # its log lines name the partition's directory
        self.restored_from = "none"  # where the last restore found its state: local, changelog
        # checkpoints written to disk but not to the changelog (its broker away); counted on
        # the snapshot thread, read by the serving thread
        self.local_only = 0
        self.broker_deadline: float | None = None  # stop_waiting_after
        numbers = [seq for pattern in (_CKPT, _JOURNAL) for seq, _ in _numbered(self.directory, pattern)]
        self.seq = max(numbers, default=0)  # never reuse a number (see the module docstring)
        self._writer: ThreadPoolExecutor | None = None
        self._in_flight: tuple[int, Offsets, Future[None]] | None = None
        self.offsets = ConsumedOffsets()  # the live offsets; a snapshot saves a copy
        self.events_since = 0
        self.last_time = time.monotonic()
        self.requested = False  # a checkpoint asked for at the next step (request)
        self._pending_now = 0  # as the last due() was told
        self.pending_saved = 0  # decisions pending when the last snapshot was taken

    def request(self) -> None:
        """Make the next :meth:`due` true: state a crash must not undo has changed (a
        rollout's step or rollback, an adoption mode switch), which would otherwise wait up
        to ``every_events`` messages for its checkpoint."""
        self.requested = True

    def restore(self, accept: Callable[[Restored], object] | None = None,
                topics: Collection[str] | None = None) -> Restored | None:
        """The newest snapshot that reads back cleanly (None if there is none).

        A snapshot is unusable when reading it, checking its ``seq`` and ``offsets`` (rows
        of ``topics``, when given) or ``accept(restored)`` (the caller's own restore, e.g.
        thawing the daemon's state) raises anything but :class:`CheckpointMismatch`; then the
        next older one is tried. When one is restored, the unusable newer ones are set aside
        (``corrupt-ckpt-<seq>-<time>``), each on one ERROR line. When snapshots exist but
        none is usable, none is moved and ``StateError`` names each one's problem.
        """
        if self.changelog is not None:
            from_changelog = self._restore_changelog(accept, topics)
            if from_changelog is not None:
                return from_changelog
        restored = None
        unusable: list[tuple[Path, Exception]] = []
        for seq, path in reversed(_numbered(self.directory, _CKPT)):
            try:
                candidate = self._read(seq, path, topics)
                if accept is not None:
                    accept(candidate)
            except CheckpointMismatch:
                raise
            except Exception as exc:  # any failure: corrupt, whatever raised it
                unusable.append((path, exc))
                continue
            restored = candidate
            self.offsets = ConsumedOffsets(candidate.offsets)
            break
        if restored is None and unusable:
            raise StateError(
                f"no checkpoint in {self.directory} can be restored: "
                + "; ".join(f"{path.name}: {_reason(problem)}" for path, problem in unusable)
                + ". Nothing was moved; to start from a fresh state, move them out of "
                  "checkpoint.dir.")
        for path, problem in unusable:
            # set aside (not deleted: it is evidence), so it never counts as a kept snapshot
            aside = path.with_name(f"corrupt-{path.name}-{int(time.time())}")
            log.error("checkpoint %s is unusable, falling back to an older one (moved to %s): "
                      "%s", path, aside.name, _reason(problem))
            os.rename(path, aside)
        # decisions made after the restored snapshot go on in its journal segment
        self.journal.open_segment(restored.seq if restored else 0)
        self.restored_from = "local" if restored is not None else "none"
        if restored is not None and self.changelog is not None:
            self._journal_local_again(restored.seq)
        return restored

    def _journal_local_again(self, seq: int) -> None:
        """A restore from this disk reuses its local journal: write what the changelog no
        longer holds of it there again, committed, so that the next owner has it too. The
        changelog's copy of those lines was in the transaction of this replica's killed
        run, aborted by the reopen, and Kafka's cleaner removes aborted records: an outside
        test saw a replica restore from its disk with 211 journaled decisions, the next
        owner restore from the changelog with none, and 800 ids decided again differently."""
        assert self.changelog is not None
        held = {line for batches in self.journal.restored.values() for batch in batches
                for line in batch.split(b"\n")}
        again = {}
        for segment, lines in self.journal.local_lines(seq).items():
            missing = b"".join(line + b"\n" for line in lines.split(b"\n")[:-1]
                               if line not in held)
            if missing:
                again[segment] = missing
        if again:
            self.changelog.journal_again(again)

    def _restore_changelog(self, accept: Callable[[Restored], object] | None,
                           topics: Collection[str] | None) -> Restored | None:
        """The changelog's newest checkpoint, unless the local newest snapshot is it (then None:
        the local one is restored, with the changelog's journal lines added) or the changelog
        holds none (None: whatever is local is restored, then published)."""
        assert self.changelog is not None
        local = _numbered(self.directory, _CKPT)
        hint: Any = {}
        if local:
            with contextlib.suppress(OSError, orjson.JSONDecodeError):
                hint = orjson.loads((local[-1][1] / "meta.json").read_bytes())
        if not isinstance(hint, dict):
            hint = {}
        state_id, start = hint.get("changelog_state"), hint.get("changelog_from", 0)
        found = self.changelog.restore(state_id if isinstance(state_id, str) else None,
                                       start if is_count(start) else 0)
        self.journal.restored = found.journal
        log.info("changelog read: %d records, %.1f MB in %.2f s (for %s)", found.records,
                 found.bytes_read / 1e6, found.seconds, self.directory)
        if found.manifest is None or not found.arrays:
            return None  # nothing there, or the local copy is current
        seq = found.seq
        try:
            restored = Restored(seq, found.arrays, found.meta,
                                offsets_from_json(found.meta.get("offsets"), topics))
            if accept is not None:
                accept(restored)
        except CheckpointMismatch:
            raise
        except Exception as exc:
            raise StateError(f"the changelog's checkpoint {seq} does not restore: "
                             f"{_reason(exc)}") from exc
        # the local snapshots and journal are an older owner's: a stale cache, dropped
        for pattern in (_CKPT, _JOURNAL):
            for _, path in _numbered(self.directory, pattern):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        self.seq = max(self.seq, seq)
        self.offsets = ConsumedOffsets(restored.offsets)
        self.journal.open_segment(seq)
        self.restored_from = "changelog"
        return restored

    @staticmethod
    def _read(seq: int, path: Path, topics: Collection[str] | None) -> Restored:
        arrays, meta = read_snapshot(path)
        if meta.get("seq", seq) != seq:
            raise StateError(f"its meta.json says it is snapshot {meta.get('seq')!r}, not {seq}.")
        if "offsets" not in meta:
            raise StateError("its meta.json has no offsets.")
        return Restored(seq, arrays, meta, offsets_from_json(meta["offsets"], topics))

    def due(self, n_events: int, pending: int = 0) -> bool:
        """Count ``n_events`` processed input messages; whether a checkpoint is due now.

        ``pending``: the decisions awaiting feedback now, each a row the next snapshot
        writes. The message count due is at least the number the previous snapshot wrote
        (:attr:`pending_saved`): under a backlog whose feedback has not come (yet) a snapshot
        every ``every_events`` messages would write rows in proportion to the backlog
        *squared*; this way the intervals double, and as each message adds at most one
        pending decision, a snapshot writes at most two rows per message read since the one
        before. (Counting against the decisions pending *now*, which grow with the messages,
        left only ``every_s`` to checkpoint a backlog after its first ``every_events``, an
        outside test found.) ``every_s`` still bounds the interval.
        """
        self.events_since += n_events
        self._pending_now = pending
        return (self.requested or self.events_since >= max(self.every_events, self.pending_saved)
                or time.monotonic() - self.last_time >= self.every_s)

    def save(self, transport: Transport, arrays: dict[str, np.ndarray], meta: dict[str, Any],
             flush_timeout_s: float = 30.0, carry: Iterable[JournaledDecision] = (),
             background: bool = False,
             finish: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
             handed_over: Collection[str] = ()) -> int:
        """Flush → next journal segment (+ ``carry``) → snapshot with :attr:`offsets` → commit
        (waited for) → prune. With ``background``, the snapshot is written on a thread of its
        own and the commit (not waited for) and prune wait for :meth:`settle`; a write in
        flight is settled first. ``finish`` (arrays → the arrays written) runs where the
        snapshot is written: on the writer thread for a background one, so that work which
        only makes the snapshot smaller does not hold the caller. A background snapshot
        copies the arrays first, except those named in ``handed_over``: copies the caller
        made for it, which nothing else holds or changes."""
        self.settle(transport)
        offsets = self.offsets.snapshot()
        if self.broker_deadline is not None:  # stopping: no wait goes past it
            flush_timeout_s = min(flush_timeout_s,
                                  max(self.broker_deadline - time.monotonic(), 0.0))
        transport.flush(flush_timeout_s)
        seq = self.seq + 1
        self.journal.open_segment(seq)
        carried = list(carry)
        if carried:
            # rows of their own widths: a candidate batch's width is its largest slot count
            # (np.array of them failed on a restored journal of mixed batches, seen in CI)
            self.journal.append([c.message["id"] for c in carried],
                                [np.asarray(c.probs).tolist() for c in carried],
                                [c.message for c in carried])
        path = self.directory / f"ckpt-{seq:08d}"
        full_meta = {**meta, "seq": seq, "offsets": offsets_to_json(offsets)}
        if self.changelog is not None:  # which changelog checkpoint the local one is
            full_meta["changelog_state"] = uuid.uuid4().hex
            full_meta["changelog_from"] = self.changelog.resume_offset
        self.seq = seq
        self.events_since = 0
        self.pending_saved = self._pending_now
        self.last_time = time.monotonic()
        self.requested = False
        if background:  # copies: the live arrays and meta change while the thread writes
            frozen = {name: a if name in handed_over else copy_holding_the_lock(a)
                      for name, a in arrays.items()}
            detached = orjson.loads(orjson.dumps(full_meta, option=orjson.OPT_SERIALIZE_NUMPY))
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="streamlearn-snapshot")
            self._in_flight = (seq, offsets, self._writer.submit(self._write, seq, path, frozen,
                                                                 detached, finish))
            return seq
        self._write(seq, path, arrays, full_meta, finish)
        self._written(transport, seq, offsets, wait_for_commit=True)
        return seq

    def _write(self, seq: int, path: Path, arrays: dict[str, np.ndarray],
               meta: dict[str, Any],
               finish: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None) -> None:
        """The snapshot on disk, then in the changelog (if any: a broker away leaves it local
        only, the next one is published; a fenced changelog raises Fenced)."""
        if finish is not None:
            arrays = finish(arrays)
        write_snapshot(path, arrays, meta)
        if self.changelog is not None and not write_or_warn(self.changelog, seq, arrays, meta):
            self.local_only += 1

    def stop_waiting_after(self, deadline: float) -> None:
        """Stopping: from now on no wait on the broker (a flush, the changelog's writes, a
        snapshot's being written in the background) goes past ``deadline`` (a
        ``time.monotonic()``)."""
        if self.broker_deadline is not None:  # an earlier one stands
            deadline = min(deadline, self.broker_deadline)
        self.broker_deadline = deadline
        if self.changelog is not None:
            self.changelog.log.stop_waiting_after(deadline)

    def settle(self, transport: Transport, block: bool = True) -> int | None:
        """Finish the snapshot written in the background, if any (wait for it unless not
        ``block``): commit its offsets (not waited for) and prune. Its number when it was
        finished now, else None; a write that failed raises its error here."""
        if self._in_flight is None:
            return None
        seq, offsets, written = self._in_flight
        if not block and not written.done():
            return None
        self._in_flight = None
        written.result()
        self._written(transport, seq, offsets, wait_for_commit=False)
        return seq

    def _written(self, transport: Transport, seq: int, offsets: Offsets,
                 wait_for_commit: bool) -> None:
        if offsets:
            try:
                transport.commit(offsets, wait=wait_for_commit)
            except TransportError as exc:  # the snapshot is the truth; the group catches up later
                log.warning("snapshot %d written but committing its offsets failed: %s", seq, exc)
        self._prune()

    def _prune(self) -> None:
        snapshots = _numbered(self.directory, _CKPT)
        for _seq, path in snapshots[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        oldest_kept = snapshots[-self.keep:][0][0] if snapshots else 0
        for seq, path in _numbered(self.directory, _JOURNAL):
            if seq < oldest_kept:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:  # e.g. a directory of that name: not ours to delete
                    log.warning("could not delete the old journal segment %s: %s", path, exc)

    def close(self) -> None:
        """Close the journal; a snapshot still being written is waited for (it is complete
        or absent on disk, never torn) but not committed: call :meth:`settle` for that."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
        if self._in_flight is not None:
            seq, _, written = self._in_flight
            self._in_flight = None
            if written.exception() is not None:
                log.warning("snapshot %d could not be written: %s", seq, written.exception())
        self.journal.close()
        if self.changelog is not None:
            self.changelog.close()
