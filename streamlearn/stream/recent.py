"""Ids of recently closed decisions, so late and duplicate feedback is recognised.

Two generations of plain dicts: ids enter the young one; when the young one
is older than the window (or larger than the capacity) it becomes the old one
and the previous old one is dropped in O(1). An id is therefore remembered
for at least one window after it closed and at most two — what the join
needs, with no per-id eviction work — unless more than ``capacity`` ids close
within a window: then memory stays bounded and an id is remembered for the
next ``capacity`` to 2 × ``capacity`` closes instead (docs/daemon.md §3).

>>> recent = RecentlyClosed(window_s=10.0, capacity=100)
>>> recent.add(["a", "b"], [0, 1], now=0.0)
>>> recent.get("a"), recent.get("z")
(0, None)
>>> recent.add(["c"], [0], now=12.0)  # the first generation is 12 s old: it ages
>>> recent.get("a"), recent.get("c")
(0, 0)
>>> recent.add(["d"], [0], now=25.0)  # and is forgotten one window later
>>> recent.get("a"), recent.get("c"), len(recent)
(None, 0, 2)
>>> full = RecentlyClosed(window_s=600.0, capacity=2)
>>> for t, i in enumerate("pqrst"):
...     full.add([i], [0], now=float(t))  # within one window, but 2 per generation
>>> [i for i in "pqrst" if i in full]
['r', 's', 't']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["RecentlyClosed"]


class RecentlyClosed:
    """id → how it closed (an ``Outcome`` code), kept for one to two windows."""

    def __init__(self, window_s: float, capacity: int) -> None:
        self.window_s, self.capacity = window_s, capacity
        self.young: dict[Any, int] = {}
        self.old: dict[Any, int] = {}
        self.young_since = -np.inf  # when the young generation started

    def __len__(self) -> int:
        return len(self.young) + len(self.old)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self.young or event_id in self.old

    def get(self, event_id: Any) -> int | None:
        how = self.young.get(event_id)
        return self.old.get(event_id) if how is None else how

    def add(self, ids: Sequence[Any], how: Sequence[int], now: float) -> None:
        self.age(now)
        self.young.update(zip(ids, how, strict=True))

    def add_all(self, ids: Sequence[Any], how: int, now: float) -> None:
        self.age(now)
        self.young.update(dict.fromkeys(ids, how))

    def age(self, now: float) -> None:
        """Start a new generation when the young one spans a window or is full."""
        if not math.isfinite(self.young_since):
            self.young_since = now
        elif now - self.young_since >= self.window_s or len(self.young) >= self.capacity:
            self.old, self.young, self.young_since = self.young, {}, now

    def export(self) -> tuple[list[Any], np.ndarray, np.ndarray, float]:
        """(ids, how codes, young flags, young_since)."""
        ids = [*self.old, *self.young]
        how = np.fromiter([*self.old.values(), *self.young.values()], np.int64, count=len(ids))
        young = np.r_[np.zeros(len(self.old), bool), np.ones(len(self.young), bool)]
        return ids, how, young, self.young_since

    @classmethod
    def restore(cls, window_s: float, capacity: int, ids: Sequence[Any], how: np.ndarray,
                young: np.ndarray, young_since: float) -> RecentlyClosed:
        recent = cls(window_s, capacity)
        for event_id, code, is_young in zip(ids, how.tolist(), young.tolist(), strict=True):
            (recent.young if is_young else recent.old)[event_id] = int(code)
        recent.young_since = young_since
        return recent
