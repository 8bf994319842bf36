"""Event-time clocks for the join, one per (stream, partition), that never stall.

A decision of partition ``p`` expires by the clock of the *feedback* stream of
``p`` (the feedback it waits for would have arrived by then), and early
feedback becomes unknown by the clock of the *instance* stream of ``p`` (its
decision would have appeared by then). Each clock follows the event times of
its stream, so a backlog being re-read after a restart expires nothing early;
while its partition is *idle* (a poll that was not full returned nothing from
it) the clock moves on with the wall clock, so expiry never stalls.

>>> c = EventClock()
>>> c.observe(100.0)
>>> c.mark_idle(wall=1000.0)
>>> c.now(wall=1004.0)
104.0
>>> c.observe(101.0)  # data again: back to event time, never backwards
>>> c.now(wall=1010.0)
104.0
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["EventClock", "PartitionClocks"]


class EventClock:
    """Monotone event time that advances with the wall clock while idle."""

    def __init__(self) -> None:
        self.event_time = -np.inf
        self.idle_since: float | None = None  # wall time the stream was first seen idle
        self._now = -np.inf
        self.timeless = False  # the last data read had no believed time

    def observe(self, ts_max: float, floor_only: bool = False) -> None:
        """Data with event times up to ``ts_max`` arrived (``floor_only``: only set a start).
        -inf is data whose times are not believed: it tells nothing about time, so it
        neither moves the clock nor ends an idle period (see :meth:`mark_idle`)."""
        if ts_max == -np.inf:
            self.timeless = self.timeless or not floor_only  # a floor is another stream's data
            return
        if floor_only:
            if not math.isfinite(self.event_time):
                self.event_time = ts_max
                # started now: an idle period marked before would count from before the start
                # (the clock ran ahead of the wall clock by the gap)
                self.idle_since = None
            return
        self.event_time = max(self.event_time, ts_max)
        self.idle_since = None
        self.timeless = False

    def mark_idle(self, wall: float) -> None:
        """Nothing unread from now: the clock follows ``wall``. A stream caught up whose last
        data had no believed time (every producer's clock wrong) is at ``wall`` itself: else
        each restart's downtime, which no such data can make up, would hold its expiry back
        for good."""
        if self.idle_since is None:
            self.idle_since = wall
        if self.timeless:  # also when the idle period began before that data (it ends none):
            # from when it began, the clock follows the wall; before, such a clock never started
            self.event_time = max(self.event_time, self.idle_since)

    def now(self, wall: float) -> float:
        if math.isfinite(self.event_time):
            idle = 0.0 if self.idle_since is None else max(0.0, wall - self.idle_since)
            self._now = max(self._now, self.event_time + idle)
        return self._now

    def to_json(self) -> list[float | None]:
        return [v if np.isfinite(v) else None for v in (self.event_time, self._now)]

    @classmethod
    def from_json(cls, values: list[float | None]) -> EventClock:
        """A clock restarted where it was. The downtime is not idle time (it may hide unread
        data), but the time the clock had reached is: an idle period after the restart moves
        it on from there, not from its last data (else a stream idle for T before a restart
        stalled for T after each one, and feedback held for a forgotten id stayed held)."""
        clock = cls()
        clock.event_time, clock._now = (-np.inf if v is None else float(v) for v in values)
        clock.event_time = max(clock.event_time, clock._now)
        return clock


class PartitionClocks:
    """One :class:`EventClock` per ``(stream, partition)``; streams are "instances"/"feedback"."""

    def __init__(self) -> None:
        self.clocks: dict[tuple[str, int], EventClock] = {}

    def _clock(self, stream: str, partition: int) -> EventClock:
        key = (stream, int(partition))
        if key not in self.clocks:
            self.clocks[key] = EventClock()
        return self.clocks[key]

    def observe(self, stream: str, partitions: np.ndarray, ts: np.ndarray,
                floor_only: bool = False) -> None:
        """Per partition, the newest event time of a batch (vectorised over the batch)."""
        if not len(ts):
            return
        first = int(partitions[0])
        if len(ts) == 1 or not (partitions != first).any():  # one partition: one max
            self._clock(stream, first).observe(float(ts.max()), floor_only)
            return
        order = np.argsort(partitions, kind="stable")
        parts, starts = np.unique(partitions[order], return_index=True)
        newest = np.maximum.reduceat(ts[order], starts)
        for p, t in zip(parts.tolist(), newest.tolist(), strict=True):
            self._clock(stream, p).observe(t, floor_only)

    def observe_pair(self, partitions: np.ndarray, instance_ts: np.ndarray,
                     feedback_ts: np.ndarray, feedback_newest: float) -> None:
        """``observe`` of the instance and the feedback stream for one batch of decisions that
        came with their feedback (same partitions; ``feedback_newest`` is ``feedback_ts``'s
        maximum, which the caller has): the one-partition test is made once."""
        if not len(partitions):
            return
        first = int(partitions[0])
        if len(partitions) == 1 or not (partitions != first).any():
            self._clock("instances", first).observe(float(instance_ts.max()))
            self._clock("feedback", first).observe(feedback_newest)
            return
        self.observe("instances", partitions, instance_ts)
        self.observe("feedback", partitions, feedback_ts)

    def mark_idle(self, stream: str, partitions: Iterable[int], wall: float) -> None:
        for p in partitions:
            self._clock(stream, p).mark_idle(wall)

    def advance_all(self, t: float) -> None:
        """Every clock has reached event time ``t`` (a simulation whose time is the round)."""
        for clock in self.clocks.values():
            clock.observe(t)

    def now(self, stream: str, wall: float) -> dict[int, float]:
        return {p: c.now(wall) for (s, p), c in self.clocks.items() if s == stream}

    def now_of(self, stream: str, partition: int, wall: float) -> float:
        """One partition's time (-inf when it has no clock yet)."""
        clock = self.clocks.get((stream, int(partition)))
        return -np.inf if clock is None else clock.now(wall)

    def latest(self, wall: float) -> float:
        return max((c.now(wall) for c in self.clocks.values()), default=-np.inf)

    def to_json(self) -> list[Any]:
        return [[s, p, c.to_json()] for (s, p), c in sorted(self.clocks.items())]

    @classmethod
    def from_json(cls, rows: list[Any]) -> PartitionClocks:
        clocks = cls()
        for stream, partition, values in rows:
            clocks.clocks[(str(stream), int(partition))] = EventClock.from_json(values)
        return clocks
