"""Checkpoints and the decision journal: what makes ``kill -9`` lose nothing (DESIGN.md §6).

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
   checkpoint commits again);
4. delete snapshots and journal segments older than the ``keep`` newest snapshots.

Before step 2 the next journal segment ``journal-<seq>`` is started with the
journaled decisions whose input has not been re-read yet (``carry``), so that
the new snapshot never lacks a decision the previous one could replay.

Invariants: the offsets in a snapshot are exactly the input whose effect the
snapshot's state contains; offsets only move forward; at start the newest
snapshot that reads back cleanly is restored (a corrupt one is reported and
the previous one used; the corrupt one is renamed ``corrupt-ckpt-<seq>-<time>``)
and the transport seeks to its offsets.

The **decision journal** makes re-emitted decisions identical after a crash.
Before a decision is produced, its record (full probability row + the exact
decision message) is appended to the current segment. After a restart from
snapshot ``s``, the segments ``>= s`` hold every decision made for input the
snapshot has not seen; re-read input whose id is in the journal gets the
journaled decision instead of a new one, so the learner, the pending joins and
the decisions topic see exactly what they saw before the crash. Appends are
flushed to the OS (enough for a process crash); ``fsync_journal`` also survives
power loss at a cost per batch.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson

from streamlearn.errors import StateError, TransportError
from streamlearn.snapshot import read_snapshot, write_snapshot
from streamlearn.stream.transport import Transport

__all__ = ["Checkpointer", "ConsumedOffsets", "DecisionJournal", "JournaledDecision", "Restored",
           "offsets_from_json", "offsets_to_json"]

log = logging.getLogger("streamlearn.checkpoint")

_CKPT = re.compile(r"^ckpt-(\d+)$")
_JOURNAL = re.compile(r"^journal-(\d+)\.jsonl$")

Offsets = dict[tuple[str, int], int]


def offsets_to_json(offsets: Offsets) -> list[list[Any]]:
    return [[topic, partition, offset] for (topic, partition), offset in sorted(offsets.items())]


def offsets_from_json(rows: list[list[Any]]) -> Offsets:
    return {(str(t), int(p)): int(o) for t, p, o in rows}


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

    def open_segment(self, seq: int) -> None:
        """Append further decisions to ``journal-<seq>.jsonl``."""
        self.close()
        self.segment = seq
        self._file = open(self.directory / f"journal-{seq:08d}.jsonl", "ab")  # noqa: SIM115

    def append(self, event_ids: list[str], probs: np.ndarray, messages: list[dict[str, Any]]) -> None:
        """Journal one batch of decisions (before they are produced)."""
        if self._file is None or not event_ids:
            return
        rows = probs.tolist()
        lines = b"".join(orjson.dumps({"p": p, "d": m}) + b"\n"
                         for p, m in zip(rows, messages, strict=True))
        self._file.write(lines)
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def load(self, from_seq: int) -> dict[str, JournaledDecision]:
        """Every journaled decision in segments ``>= from_seq`` (a torn last line is skipped)."""
        found: dict[str, JournaledDecision] = {}
        for seq, path in _numbered(self.directory, _JOURNAL):
            if seq < from_seq:
                continue
            for line in path.read_bytes().split(b"\n"):
                try:
                    rec = orjson.loads(line)
                    found.setdefault(rec["d"]["id"], JournaledDecision(
                        int(rec["d"].get("action", -1)), rec["p"], rec["d"]))  # -1: candidates
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue  # empty or torn line (a crash in the middle of an append)
        return found

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _numbered(directory: Path, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
    out = []
    for path in directory.iterdir():
        match = pattern.match(path.name)
        if match:
            out.append((int(match.group(1)), path))
    return sorted(out)


class Checkpointer:
    """Writes and restores checkpoints in ``directory``; see the module docstring.

    Parameters
    ----------
    directory
        Where ``ckpt-<seq>`` and ``journal-<seq>.jsonl`` live (created if missing).
    keep
        Snapshots kept (>= 2 so a corrupt newest one has a fallback).
    every_events, every_s
        A checkpoint is due after this many input messages (or as many as there are pending
        decisions, if more: :meth:`due`) or seconds, whichever first.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 2,
                 every_events: int = 10_000, every_s: float = 30.0,
                 fsync_journal: bool = False) -> None:
        if keep < 1 or every_events < 1 or every_s <= 0:
            raise StateError(f"Checkpointer needs keep >= 1, every_events >= 1, every_s > 0. "
                             f"Got {keep}, {every_events}, {every_s}.")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep, self.every_events, self.every_s = keep, every_events, every_s
        self.journal = DecisionJournal(self.directory, fsync_journal)
        existing = _numbered(self.directory, _CKPT)
        self.seq = existing[-1][0] if existing else 0
        self.offsets = ConsumedOffsets()  # the live offsets; a snapshot saves a copy
        self.events_since = 0
        self.last_time = time.monotonic()

    def restore(self) -> Restored | None:
        """The newest snapshot that reads back cleanly (None if there is none)."""
        restored = None
        for seq, path in reversed(_numbered(self.directory, _CKPT)):
            try:
                arrays, meta = read_snapshot(path)
                offsets = offsets_from_json(meta["offsets"])
            except (StateError, KeyError, TypeError, ValueError) as exc:
                # set aside (not deleted: it is evidence), so it never counts as a kept snapshot
                aside = path.with_name(f"corrupt-{path.name}-{int(time.time())}")
                log.error("checkpoint %s is unusable, falling back to an older one (moved to %s): "
                          "%s", path, aside.name, exc)
                os.rename(path, aside)
                continue
            restored = Restored(seq, arrays, meta, offsets)
            self.offsets = ConsumedOffsets(offsets)
            break
        # decisions made after the restored snapshot go on in its journal segment
        self.journal.open_segment(restored.seq if restored else 0)
        return restored

    def due(self, n_events: int, pending: int = 0) -> bool:
        """Count ``n_events`` processed input messages; whether a checkpoint is due now.

        With ``pending`` decisions awaiting feedback, the message count due is at least
        ``pending``: a snapshot writes every pending decision's row, so under a backlog whose
        feedback has not come (yet) a snapshot every ``every_events`` messages would write
        rows in proportion to the backlog *squared*; this way a snapshot writes at most about
        one row per message read since the one before. ``every_s`` still bounds the interval.
        """
        self.events_since += n_events
        return (self.events_since >= max(self.every_events, pending)
                or time.monotonic() - self.last_time >= self.every_s)

    def save(self, transport: Transport, arrays: dict[str, np.ndarray], meta: dict[str, Any],
             flush_timeout_s: float = 30.0, carry: Iterable[JournaledDecision] = ()) -> int:
        """Flush → next journal segment (+ ``carry``) → snapshot with :attr:`offsets` → commit
        → prune."""
        offsets = self.offsets.snapshot()
        transport.flush(flush_timeout_s)
        seq = self.seq + 1
        self.journal.open_segment(seq)
        carried = list(carry)
        if carried:
            self.journal.append([c.message["id"] for c in carried],
                                np.array([c.probs for c in carried]), [c.message for c in carried])
        write_snapshot(self.directory / f"ckpt-{seq:08d}", arrays,
                       {**meta, "seq": seq, "offsets": offsets_to_json(offsets)})
        self.seq = seq
        if offsets:
            try:
                transport.commit(offsets)
            except TransportError as exc:  # the snapshot is the truth; the group catches up later
                log.warning("snapshot %d written but committing its offsets failed: %s", seq, exc)
        self._prune()
        self.events_since = 0
        self.last_time = time.monotonic()
        return seq

    def _prune(self) -> None:
        snapshots = _numbered(self.directory, _CKPT)
        for _seq, path in snapshots[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)
        oldest_kept = snapshots[-self.keep:][0][0] if snapshots else 0
        for seq, path in _numbered(self.directory, _JOURNAL):
            if seq < oldest_kept:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        self.journal.close()
