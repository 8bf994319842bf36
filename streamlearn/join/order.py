"""The pending decisions oldest first, for shedding and expiry without sorting the store.

A join at its bound sheds the oldest decisions at every step, and one whose decisions wait
out their window expires the oldest at every step; finding them by sorting (or scanning)
the whole store cost O(P log P) (O(P)) a step: at the default bound of 200,000 pending
decisions, 1.3 ms (3.7 ms) of join work a step of two decisions, now 0.14 ms (0.25 ms)
(docs/performance.md, "Shedding and expiry at the bound").

:class:`OldestFirst` keeps one entry ``(slot, sequence number, decision time)`` per decision
added, in order of (decision time, slot): the order the store's sort gives. An entry is
*live* while its slot is active and still holds the decision it was made for (the slot's
current sequence number equals the entry's); closed decisions' entries are skipped when
met and dropped when the stale entries outnumber the live ones. A step's decisions share
its decision time and time moves forward, so appending keeps the order; an append that
would break it (a restart's restored decisions, journaled decisions re-published with
their first time, a wall clock set back, decisions at one time in a slot order that
goes down) marks the entries unsorted, and the next query rebuilds them from the store
with the one stable sort the store used before. Every answer is therefore the sort's.

>>> order = OldestFirst()
>>> order.grow(8)
>>> active = np.zeros(8, dtype=bool); times = np.zeros(8)
>>> def add(slots, t):
...     active[slots] = True; times[slots] = t; order.append(np.array(slots), np.full(len(slots), t))
>>> add([0, 1], 5.0); add([2], 7.0); add([3], 6.0)  # slot 3 older than slot 2: unsorted
>>> order.oldest(3, active, times).tolist()
[0, 1, 3]
>>> active[[0, 1]] = False
>>> order.oldest(1, active, times).tolist(), order.up_to(6.5, active, times).tolist()
([3], [3])
"""

from __future__ import annotations

import numpy as np

__all__ = ["OldestFirst"]

_MIN_COMPACT = 4096  # entries beyond twice the live ones before the stale ones are dropped


class OldestFirst:
    """Pending slots in order of (decision time, slot); see the module docstring."""

    def __init__(self) -> None:
        self.slot_seq = np.zeros(0, dtype=np.int64)  # per slot: the sequence number of its decision
        self._next_seq = 1  # 0 marks a slot that never held a decision
        self._slots = np.zeros(0, dtype=np.int64)  # entries[head:tail]
        self._seqs = np.zeros(0, dtype=np.int64)
        self._times = np.zeros(0)
        self._head = self._tail = 0
        self.sorted = True  # the entries are in (time, slot) order
        self._last: tuple[float, int] = (-np.inf, -1)  # the last entry's (time, slot)
        self.min_compact = _MIN_COMPACT

    def grow(self, capacity: int) -> None:
        """Room for slots below ``capacity``."""
        grown = np.zeros(capacity, dtype=np.int64)
        grown[:len(self.slot_seq)] = self.slot_seq
        self.slot_seq = grown

    def append(self, slots: np.ndarray, times: np.ndarray) -> None:
        """Entries for decisions just put in ``slots`` at decision ``times``."""
        n = len(slots)
        if n == 0:
            return
        slots = np.asarray(slots, dtype=np.int64)
        times = np.asarray(times, dtype=np.float64)
        seqs = np.arange(self._next_seq, self._next_seq + n, dtype=np.int64)
        self._next_seq += n
        self.slot_seq[slots] = seqs
        if n > 1:
            order = np.lexsort((slots, times))
            slots, times, seqs = slots[order], times[order], seqs[order]
        first, last = (float(times[0]), int(slots[0])), (float(times[-1]), int(slots[-1]))
        # NaN compares false: an entry at NaN makes the order unsorted, and the sort decides
        if self.sorted and not (first[0] > self._last[0] or
                                (first[0] == self._last[0] and first[1] > self._last[1])):
            self.sorted = False
        self._last = last  # read only while sorted (a rebuild sets it)
        self._put(slots, seqs, times)

    def _put(self, slots: np.ndarray, seqs: np.ndarray, times: np.ndarray) -> None:
        n = len(slots)
        if self._tail + n > len(self._slots):
            live = self._tail - self._head
            size = max(2 * (live + n), 1024)
            for name in ("_slots", "_seqs", "_times"):
                kept = getattr(self, name)[self._head:self._tail]
                grown = np.empty(size, dtype=kept.dtype)
                grown[:live] = kept
                setattr(self, name, grown)
            self._head, self._tail = 0, live
        self._slots[self._tail:self._tail + n] = slots
        self._seqs[self._tail:self._tail + n] = seqs
        self._times[self._tail:self._tail + n] = times
        self._tail += n

    def compact(self, active: np.ndarray, n_live: int) -> None:
        """Drop the closed decisions' entries once they outnumber the live ones (``n_live``;
        checked as decisions are added: amortised O(1) an entry)."""
        if self._tail - self._head <= 2 * n_live + self.min_compact:
            return
        at = slice(self._head, self._tail)
        keep = self._live(self._slots[at], self._seqs[at], active)
        slots, seqs, times = self._slots[at][keep], self._seqs[at][keep], self._times[at][keep]
        self._head = self._tail = 0
        self._put(slots, seqs, times)

    def _live(self, slots: np.ndarray, seqs: np.ndarray, active: np.ndarray) -> np.ndarray:
        return np.asarray(active[slots] & (self.slot_seq[slots] == seqs))

    def _sort(self, active: np.ndarray, decided_at: np.ndarray) -> None:
        """Rebuild the entries from the store: its live slots by (time, slot)."""
        live = np.flatnonzero(active)
        live = live[np.argsort(decided_at[live], kind="stable")]
        self._head = self._tail = 0
        self._put(live, self.slot_seq[live], decided_at[live])
        self.sorted = True
        self._last = ((float(decided_at[live[-1]]), int(live[-1])) if len(live)
                      else (-np.inf, -1))

    def oldest(self, n: int, active: np.ndarray, decided_at: np.ndarray) -> np.ndarray:
        """The ``n`` oldest live slots (fewer when fewer are live), oldest first."""
        if not self.sorted:
            self._sort(active, decided_at)
        found: list[np.ndarray] = []
        wanted, at = n, self._head
        while wanted > 0 and at < self._tail:
            end = min(self._tail, at + max(2 * wanted, 64))
            slots = self._slots[at:end]
            live = np.flatnonzero(self._live(slots, self._seqs[at:end], active))
            if at == self._head:  # the closed decisions' entries at the front go for good
                self._head += int(live[0]) if len(live) else end - at
            found.append(slots[live[:wanted]])
            wanted -= min(wanted, len(live))
            at = end
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def up_to(self, bound: float, active: np.ndarray, decided_at: np.ndarray) -> np.ndarray:
        """The live slots whose decision time is at most ``bound``, oldest first."""
        if not self.sorted:
            self._sort(active, decided_at)
        end = self._head + int(np.searchsorted(self._times[self._head:self._tail], bound,
                                               side="right"))
        slots = self._slots[self._head:end]
        live = np.flatnonzero(self._live(slots, self._seqs[self._head:end], active))
        self._head += int(live[0]) if len(live) else end - self._head
        return slots[live]

    def first_time(self, active: np.ndarray, decided_at: np.ndarray) -> float:
        """The oldest live decision's time (inf when none is live)."""
        first = self.oldest(1, active, decided_at)
        return float(decided_at[first[0]]) if len(first) else np.inf
