"""Ids of recently closed decisions, so late and duplicate feedback is recognised.

Two generations of plain dicts: ids enter the young one; when the young one
is older than the window (or larger than the capacity) it becomes the old one
and the previous old one is dropped in O(1). An id is therefore remembered
for at least one window after it closed and at most two — what the join
needs, with no per-id eviction work — unless more than ``capacity`` ids close
within a window: then memory stays bounded and an id is remembered for the
next ``capacity`` to 2 × ``capacity`` closes instead (docs/daemon.md §3).

A generation's age is counted on two clocks, and it ages only when both have
passed a window: the join's event time (``now``) and the caller's wall clock.
Event time alone leaps when a restart re-reads a backlog whose instance stream
runs ahead of its feedback stream: a decision closed early in the leap was
forgotten within a second of wall time, before its own feedback was re-read,
which then waited for a decision that never came and was dead-lettered as
unknown (506 feedback events in one CI run).

>>> recent = RecentlyClosed(window_s=10.0, capacity=100)
>>> recent.add(["a", "b"], [0, 1], now=0.0, wall=0.0)
>>> recent.get("a"), recent.get("z")
(0, None)
>>> recent.add(["c"], [0], now=12.0, wall=12.0)  # the first generation is 12 s old: it ages
>>> recent.get("a"), recent.get("c")
(0, 0)
>>> recent.add(["d"], [0], now=25.0, wall=25.0)  # and is forgotten one window later
>>> recent.get("a"), recent.get("c"), len(recent)
(None, 0, 2)
>>> recent.age(now=60.0, wall=26.0)  # 35 s of event time, 1 s of wall: not a window of both
>>> recent.get("c")
0
>>> full = RecentlyClosed(window_s=600.0, capacity=2)
>>> for t, i in enumerate("pqrst"):
...     full.add([i], [0], now=float(t), wall=float(t))  # within one window, 2 per generation
>>> [i for i in "pqrst" if i in full]
['r', 's', 't']

A checkpoint exports every remembered id (up to 2 × ``capacity``, 400,000 at the
defaults). Packing them all anew made each checkpoint's pause grow with the
daemon's uptime, to ~95 ms at 400,000 ids (docs/performance.md): each generation
keeps its packed form beside its dict instead, extended with the ids added since
the last export. An aged generation is never packed again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["RecentlyClosed"]


class _Packed:
    """One generation's ids as exported (UTF-8 bytes, byte lengths, how codes), in the order
    they were added; the batches added since the last :meth:`arrays` are packed there.

    It equals the packed dict exactly while every id was added once (``count`` equals the
    dict's length); otherwise (an id added again moves nothing in the dict but would
    repeat here) the owner packs the dict anew (:meth:`of`).
    """

    def __init__(self) -> None:
        self.unpacked: list[tuple[list[Any], list[int] | int]] = []
        self.count = 0  # ids added, packed or not
        self.data = np.zeros(0, dtype=np.uint8)
        self.lengths = np.zeros(0, dtype=np.int64)
        self.how = np.zeros(0, dtype=np.int64)

    @classmethod
    def of(cls, generation: dict[Any, int]) -> _Packed:
        packed = cls()
        packed.add(list(generation), list(generation.values()))
        return packed

    def add(self, ids: list[Any], how: list[int] | int) -> None:
        self.unpacked.append((ids, how))
        self.count += len(ids)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.unpacked:
            encoded = [str(i).encode("utf-8") for ids, _ in self.unpacked for i in ids]
            how = [np.full(len(ids), h, dtype=np.int64) if isinstance(h, int)
                   else np.asarray(h, dtype=np.int64) for ids, h in self.unpacked]
            self.data = np.concatenate([self.data, np.frombuffer(b"".join(encoded), np.uint8)])
            self.lengths = np.concatenate(
                [self.lengths, np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))])
            self.how = np.concatenate([self.how, *how])
            self.unpacked = []
        return self.data, self.lengths, self.how


class RecentlyClosed:
    """id → how it closed (an ``Outcome`` code), kept for one to two windows."""

    def __init__(self, window_s: float, capacity: int) -> None:
        self.window_s, self.capacity = window_s, capacity
        self.young: dict[Any, int] = {}
        self.old: dict[Any, int] = {}
        self.young_since = -np.inf  # when the young generation started (event time)
        self.young_since_wall: float | None = None  # and by the wall clock (None: not yet)
        self._young_packed, self._old_packed = _Packed(), _Packed()

    def __len__(self) -> int:
        return len(self.young) + len(self.old)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self.young or event_id in self.old

    def get(self, event_id: Any) -> int | None:
        how = self.young.get(event_id)
        return self.old.get(event_id) if how is None else how

    def add(self, ids: Sequence[Any], how: Sequence[int], now: float, wall: float) -> None:
        self.age(now, wall)
        self.add_unaged(ids, how)

    def add_unaged(self, ids: Sequence[Any], how: Sequence[int]) -> None:
        """Add to the young generation as it is: for ids whose closing (of their parts) aged
        the memory in the same step already."""
        ids, how = list(ids), list(how)  # copies: the caller's may be reused
        self.young.update(zip(ids, how, strict=True))
        self._young_packed.add(ids, how)

    def add_all(self, ids: Sequence[Any], how: int, now: float, wall: float) -> None:
        self.age(now, wall)
        ids = list(ids)
        self.young.update(dict.fromkeys(ids, how))
        self._young_packed.add(ids, how)

    def age(self, now: float, wall: float) -> None:
        """Start a new generation when the young one spans a window of event time and of
        wall time, or is full."""
        if self.young_since_wall is None:  # new, or restored: the wall clock counts from here
            self.young_since_wall = wall
        if not math.isfinite(self.young_since):
            self.young_since = now
        elif ((now - self.young_since >= self.window_s
               and wall - self.young_since_wall >= self.window_s)
              or len(self.young) >= self.capacity):
            self.old, self.young = self.young, {}
            self.young_since, self.young_since_wall = now, wall
            self._old_packed, self._young_packed = self._young_packed, _Packed()

    def export(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        """(UTF-8 bytes and end offsets of the ids as ``pack_strings`` gives them, how codes,
        young flags, young_since): the old generation first, each in its dict's order."""
        if self._old_packed.count != len(self.old):
            self._old_packed = _Packed.of(self.old)
        if self._young_packed.count != len(self.young):
            self._young_packed = _Packed.of(self.young)
        old_data, old_lengths, old_how = self._old_packed.arrays()
        data, lengths, how = self._young_packed.arrays()
        young = np.r_[np.zeros(len(self.old), bool), np.ones(len(self.young), bool)]
        return (np.concatenate([old_data, data]), np.cumsum(np.concatenate([old_lengths, lengths])),
                np.concatenate([old_how, how]), young, self.young_since)

    @classmethod
    def restore(cls, window_s: float, capacity: int, ids: Sequence[Any], how: np.ndarray,
                young: np.ndarray, young_since: float) -> RecentlyClosed:
        recent = cls(window_s, capacity)
        for event_id, code, is_young in zip(ids, how.tolist(), young.tolist(), strict=True):
            (recent.young if is_young else recent.old)[event_id] = int(code)
        recent.young_since = young_since
        return recent
