"""The experience log: every learned (joined or expired) decision, on disk, for retraining.

Rows are (id, context x, logged action, the full logged distribution, reward,
label, model version, decision time, the policy that served the decision — 0 for
the learner, else a ranker's version — and the exploration rate a policy deployed
at that decision would use). They are buffered in memory and written as
*segments* — ``segment-00000012.npz`` (plain arrays, ``allow_pickle=False``) — by
:meth:`ExperienceLog.flush`. A segment is written to a temporary file, fsynced
and renamed, so a reader sees a whole segment or none.

Rotation: the buffer becomes a segment when it holds ``segment_rows`` rows (or a
little more: one appended batch is never split), when its oldest row is
``segment_seconds`` old, and at every checkpoint. Sparse contexts are stored as
CSR, dense ones as float32; :func:`read_experience` returns them dense. Retention
deletes the oldest segments while the log holds more than ``retention_bytes`` or
while the oldest is older than ``retention_seconds``.

Durability with the checkpoint (the invariant that makes ``kill -9`` lose or
duplicate no row): the daemon flushes the log before it freezes its state, and
the checkpoint records :attr:`ExperienceLog.next_segment`. Every segment numbered
from the restored checkpoint's ``next_segment`` on holds rows whose feedback the
restarted daemon re-reads and joins again, so :meth:`ExperienceLog.open` deletes
them (and stray temporary files) before the loop starts.

>>> import tempfile
>>> log = ExperienceLog(tempfile.mkdtemp(), segment_rows=2)
>>> log.open(None)
>>> log.append(["a", "b"], np.eye(2), np.array([0, 1]), np.full((2, 2), 0.5),
...            np.array([1.0, 0.0]), np.full(2, -1), np.zeros(2, int), np.arange(2.0))
>>> log.append(["c"], np.ones((1, 2)), np.array([0]), np.full((1, 2), 0.5),
...            np.array([1.0]), np.full(1, -1), np.zeros(1, int), np.arange(1.0))
>>> log.flush(); log.segments(), log.next_segment
([0, 1], 2)
>>> rows = read_experience(log.directory); rows.ids, rows.propensities.tolist()
(['a', 'b', 'c'], [0.5, 0.5, 0.5])
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamlearn.actions import exploration_rates
from streamlearn.errors import ConfigError, DataError, StateError
from streamlearn.features import Batch, SparseBatch
from streamlearn.snapshot import pack_strings, unpack_strings

__all__ = ["ExperienceLog", "ExperienceRows", "dense_rows", "list_segments", "read_experience"]

log = logging.getLogger("streamlearn.experience")

_SEGMENT = re.compile(r"^segment-(\d{8})\.npz$")
_COLUMNS = ("actions", "probs", "rewards", "labels", "model_version", "decided_at", "served_by",
            "gamma", "baseline")


def _segment_path(directory: Path, seq: int) -> Path:
    return directory / f"segment-{seq:08d}.npz"


def list_segments(log_dir: str | os.PathLike[str]) -> list[int]:
    """The sequence numbers of the log's complete segments, oldest first."""
    directory = Path(log_dir)
    if not directory.is_dir():
        raise ConfigError(f"Expected an experience log directory. Got {str(directory)!r}, "
                          "which is not a directory.")
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := _SEGMENT.match(p.name)))


@dataclass
class ExperienceRows:
    """Logged rows, oldest first."""

    ids: list[str]
    X: np.ndarray  # (n, d) float32 contexts
    actions: np.ndarray  # (n,) int64 logged actions
    probs: np.ndarray  # (n, K) float32: the logged sampling distribution (0 = never chosen)
    rewards: np.ndarray  # (n,) float64 in [0, 1]
    labels: np.ndarray  # (n,) int64, -1 when unknown (labels come from simulations only)
    model_version: np.ndarray  # (n,) int64: the model version that decided
    decided_at: np.ndarray  # (n,) float64 seconds (event time)
    served_by: np.ndarray  # (n,) int64: 0 = the learner served it, v = the ranker of version v
    gamma: np.ndarray  # (n,) float64: the exploration rate at the decision
    # (n,) int64: what the caller's own system would have done, -1: not given
    baseline: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    segments: tuple[int, int] | None = None  # first and last segment read

    def __post_init__(self) -> None:
        if len(self.baseline) != len(self.ids):
            self.baseline = np.full(len(self.ids), -1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def propensities(self) -> np.ndarray:
        """The logged probability of each row's chosen action (float64)."""
        return np.asarray(self.probs[np.arange(len(self.actions)), self.actions], dtype=np.float64)

    def take(self, rows: np.ndarray) -> ExperienceRows:
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        return _rows([self.ids[i] for i in rows.tolist()], self.X[rows],
                     {c: getattr(self, c)[rows] for c in _COLUMNS}, self.segments)


def _rows(ids: list[str], X: np.ndarray, columns: dict[str, np.ndarray],
          segments: tuple[int, int] | None = None) -> ExperienceRows:
    return ExperienceRows(ids, X, columns["actions"], columns["probs"], columns["rewards"],
                          columns["labels"], columns["model_version"], columns["decided_at"],
                          columns["served_by"], columns["gamma"], columns["baseline"], segments)



def _learner_gamma(probs: np.ndarray) -> np.ndarray:
    """γ of distributions the learner logged (segments written before the column existed)."""
    p = np.asarray(probs, dtype=np.float64)
    return np.asarray(exploration_rates(p, p > 0), dtype=np.float64)


def dense_rows(X: Batch) -> np.ndarray:
    """A batch as a dense float32 (B, d) array."""
    if isinstance(X, SparseBatch):
        return X.to_dense().astype(np.float32)
    return np.asarray(X, dtype=np.float32)


def _stored_rows(X: Batch) -> dict[str, np.ndarray]:
    """A batch as stored: CSR (float32 values, int32 indices) when sparse — SynNonSep's
    rows take a fifth of the bytes, and a segment written at a checkpoint stalls the loop
    for less — else dense float32."""
    if isinstance(X, SparseBatch):
        return {"X.indptr": np.asarray(X.indptr, np.int64), "X.indices": X.indices.astype(np.int32),
                "X.values": X.values.astype(np.float32), "X.width": np.array([X.n_features])}
    dense = np.asarray(X, dtype=np.float32)
    if np.count_nonzero(dense) >= 0.3 * dense.size:
        return {"X": dense}
    rows, cols = np.nonzero(dense)
    indptr = np.zeros(len(dense) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(dense)), out=indptr[1:])
    return {"X.indptr": indptr, "X.indices": cols.astype(np.int32), "X.values": dense[rows, cols],
            "X.width": np.array([dense.shape[1]])}


def _merge(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One segment's arrays from buffered chunks (dense if any chunk is dense)."""
    if any("X" in c for c in chunks):
        chunks = [{**{k: v for k, v in c.items() if not k.startswith("X.")},
                   "X": _stored_dense(c)} for c in chunks]
    merged = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]
              if k not in ("X.indptr", "X.width")}
    if "X.indptr" in chunks[0]:
        starts = np.cumsum([0] + [int(c["X.indptr"][-1]) for c in chunks[:-1]])
        merged["X.indptr"] = np.concatenate(
            [[0]] + [c["X.indptr"][1:] + start for c, start in zip(chunks, starts, strict=True)])
        merged["X.width"] = chunks[0]["X.width"]
    return merged


def _stored_dense(arrays: dict[str, np.ndarray]) -> np.ndarray:
    if "X" in arrays:
        return np.asarray(arrays["X"], dtype=np.float32)
    indptr = arrays["X.indptr"]
    dense = np.zeros((len(indptr) - 1, int(arrays["X.width"][0])), dtype=np.float32)
    rows = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    np.add.at(dense, (rows, arrays["X.indices"]), arrays["X.values"])
    return dense


def _read_segment(path: Path) -> ExperienceRows | None:
    """One segment, or None if retention deleted it meanwhile."""
    try:
        if not zipfile.is_zipfile(path):
            if not path.exists():
                return None  # deleted by retention meanwhile
            raise StateError(f"{path} is not a readable experience segment: not an .npz archive.")
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        return None
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise StateError(f"{path} is not a readable experience segment: {exc}") from exc
    try:
        ids = unpack_strings(arrays["ids_utf8"], arrays["ids_ends"])
        if "served_by" not in arrays:  # written before the column existed: the learner served
            arrays["served_by"] = np.zeros(len(ids), np.int64)
            arrays["gamma"] = _learner_gamma(arrays["probs"])
        if "baseline" not in arrays:  # written before baselines were logged: none given
            arrays["baseline"] = np.full(len(ids), -1, np.int64)
        return _rows(ids, _stored_dense(arrays), {c: arrays[c] for c in _COLUMNS})
    except KeyError as exc:
        raise StateError(f"{path} lacks the array {exc}: not an experience segment.") from exc


def require_window(entry: dict[str, Any], rows: ExperienceRows,
                   log_dir: str | os.PathLike[str]) -> None:
    """Refuse to reproduce a retrain (its history ``entry``) on ``rows`` that are not the
    window it judged: segments of it removed since (experience retention deletes the oldest)
    would give other figures without a word. A removed segment that held none of the
    window's rows (all after its watermark) changes nothing unless the window was cut at its
    row cap, where older rows could have taken their place."""
    first, last = (int(v) for v in entry["segments"])
    expected = int(entry.get("rows") or 0)
    present = set(list_segments(log_dir))
    missing = [seq for seq in range(first, last + 1) if seq not in present]
    cap = entry.get("max_rows")
    capped = cap is not None and expected >= int(cap)
    if len(rows) == expected and not (missing and capped):
        return
    why = (f"{log_dir} no longer holds segment(s) {', '.join(map(str, missing))} (removed by "
           "experience retention or by hand)" if missing else "the log has changed since")
    raise DataError(f"Expected retrain {entry.get('version')}'s window, segments {first}..{last} "
                    f"with {expected:,} rows, to reproduce what it judged. Got {len(rows):,} "
                    f"rows: {why}. Without --retrain, --segments A:B evaluates the segments "
                    "still there.")


def read_experience(log_dir: str | os.PathLike[str], first_segment: int | None = None,
                    last_segment: int | None = None, max_rows: int | None = None,
                    decided_before: float | None = None) -> ExperienceRows:
    """The rows of segments ``first_segment..last_segment`` (inclusive; default all),
    the newest ``max_rows`` of them if given — counting, with ``decided_before``, only the
    rows decided before that time (the others are read too; the caller filters them)."""
    seqs = [s for s in list_segments(log_dir)
            if (first_segment is None or s >= first_segment)
            and (last_segment is None or s <= last_segment)]
    parts: list[tuple[int, ExperienceRows]] = []
    total = 0
    for seq in reversed(seqs):  # newest first, so max_rows reads only what it needs
        if max_rows is not None and total >= max_rows:
            break
        part = _read_segment(_segment_path(Path(log_dir), seq))
        if part is not None:
            parts.append((seq, part))
            total += len(part) if decided_before is None else int(
                (part.decided_at < decided_before).sum())
    parts.reverse()
    if not parts:
        return ExperienceRows([], np.zeros((0, 0), np.float32), np.zeros(0, np.int64),
                              np.zeros((0, 0), np.float32), np.zeros(0), np.zeros(0, np.int64),
                              np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64),
                              np.zeros(0), np.zeros(0, np.int64))
    rows = _rows([i for _, p in parts for i in p.ids], np.concatenate([p.X for _, p in parts]),
                 {c: np.concatenate([getattr(p, c) for _, p in parts]) for c in _COLUMNS},
                 (parts[0][0], parts[-1][0]))
    if max_rows is not None and decided_before is None and len(rows) > max_rows:
        rows = rows.take(np.arange(len(rows) - max_rows, len(rows)))
    return rows


class ExperienceLog:
    """Append-only segment log of learned decisions; see the module docstring.

    Parameters
    ----------
    directory
        Where the segments live (created if missing).
    segment_rows, segment_seconds
        Rotation: a segment closes at this many rows or when its oldest row is this old.
    retention_bytes, retention_seconds
        Retention: the oldest segments are deleted beyond this size or age.
    """

    def __init__(self, directory: str | os.PathLike[str], segment_rows: int = 50_000,
                 segment_seconds: float = 60.0, retention_bytes: int = 2 << 30,
                 retention_seconds: float = 7 * 86_400.0,
                 wall_clock: Callable[[], float] = time.time) -> None:
        if segment_rows < 1 or segment_seconds <= 0 or retention_bytes < 1 or retention_seconds <= 0:
            raise ConfigError("experience.segment_rows, segment_seconds, retention_bytes and "
                              "retention_seconds must be positive. Got "
                              f"{segment_rows}, {segment_seconds}, {retention_bytes}, "
                              f"{retention_seconds}.")
        self.directory = Path(directory)
        self.segment_rows, self.segment_seconds = segment_rows, segment_seconds
        self.retention_bytes, self.retention_seconds = retention_bytes, retention_seconds
        self.wall_clock = wall_clock
        self.next_segment = 0
        self.rows_written = 0
        self._buffer: list[dict[str, np.ndarray]] = []
        self._buffered_ids: list[str] = []
        self._buffer_since = np.inf
        self._sizes: dict[int, tuple[int, float]] = {}  # seq -> (bytes, written at)

    # ----------------------------------------------------------------- restore
    def open(self, next_segment: int | None) -> None:
        """Recover the directory to a checkpoint's position (``None``: no checkpoint, so
        every segment is ahead of it); delete temporary files of interrupted writes."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.iterdir():
            if path.name.startswith(".segment-") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
        keep_below = 0 if next_segment is None else next_segment
        dropped = 0
        for seq in list_segments(self.directory):
            path = _segment_path(self.directory, seq)
            if seq >= keep_below:
                path.unlink(missing_ok=True)
                dropped += 1
            else:
                stat = path.stat()
                self._sizes[seq] = (stat.st_size, stat.st_mtime)
        if dropped:
            log.info("experience log: dropped %d segment(s) written after the checkpoint "
                     "(their feedback is joined again)", dropped)
        self.next_segment = max(keep_below, max(self._sizes, default=-1) + 1)
        self._buffer, self._buffered_ids, self._buffer_since = [], [], np.inf

    # ------------------------------------------------------------------ append
    def append(self, ids: Sequence[str], X: Batch, actions: np.ndarray, probs: np.ndarray,
               rewards: np.ndarray, labels: np.ndarray, model_version: np.ndarray,
               decided_at: np.ndarray, served_by: np.ndarray | None = None,
               gamma: np.ndarray | None = None, baseline: np.ndarray | None = None) -> None:
        """Buffer rows; a full or old buffer becomes a segment. Without ``served_by`` the
        learner served every row, and ``gamma`` is then that of the logged distributions."""
        if not len(ids):
            return
        self._buffer.append({
            **_stored_rows(X), "actions": np.asarray(actions, np.int64),
            "probs": np.asarray(probs, np.float32), "rewards": np.asarray(rewards, np.float64),
            "labels": np.asarray(labels, np.int64),
            "model_version": np.asarray(model_version, np.int64),
            "decided_at": np.asarray(decided_at, np.float64),
            "served_by": (np.zeros(len(ids), np.int64) if served_by is None
                          else np.asarray(served_by, np.int64)),
            "gamma": (_learner_gamma(probs) if gamma is None
                      else np.asarray(gamma, np.float64)),
            "baseline": (np.full(len(ids), -1, np.int64) if baseline is None
                         else np.asarray(baseline, np.int64))})
        self._buffered_ids.extend(str(i) for i in ids)
        now = self.wall_clock()
        self._buffer_since = min(self._buffer_since, now)
        if len(self._buffered_ids) >= self.segment_rows or now - self._buffer_since >= self.segment_seconds:
            self.flush()

    @property
    def buffered(self) -> int:
        return len(self._buffered_ids)

    def flush(self) -> None:
        """Write the buffer as one segment, then apply retention."""
        if self._buffered_ids:
            self._write_segment(self._buffered_ids, _merge(self._buffer))
            self.rows_written += len(self._buffered_ids)
            self._buffer, self._buffered_ids, self._buffer_since = [], [], np.inf
        self._retain()

    def _write_segment(self, ids: list[str], arrays: dict[str, np.ndarray]) -> None:
        seq = self.next_segment
        utf8, ends = pack_strings(ids)
        path = _segment_path(self.directory, seq)
        tmp = self.directory / f".segment-{seq:08d}-{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as fh:
            np.savez(fh, **{"ids_utf8": utf8, "ids_ends": ends, **arrays})  # type: ignore[arg-type]
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # a reader sees the whole segment or none
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self._sizes[seq] = (path.stat().st_size, self.wall_clock())
        self.next_segment = seq + 1

    def _retain(self) -> None:
        now = self.wall_clock()
        total = sum(size for size, _ in self._sizes.values())
        for seq in sorted(self._sizes):
            size, written = self._sizes[seq]
            if total <= self.retention_bytes and now - written <= self.retention_seconds:
                break
            if seq == self.next_segment - 1:  # keep the newest segment whatever its size
                break
            _segment_path(self.directory, seq).unlink(missing_ok=True)
            del self._sizes[seq]
            total -= size

    def segments(self) -> list[int]:
        """The complete segments on disk, oldest first."""
        return list_segments(self.directory)
