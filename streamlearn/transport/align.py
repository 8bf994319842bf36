"""Input in event-time order across the input partitions (the rule Kafka Streams uses).

A Kafka consumer returns whatever its fetches hold, partition by partition:
with a backlog (after a restart, or when the daemon falls behind) one poll
can return thousands of instances before any of the feedback that was
written *before* them. Deciding those instances before learning from that
feedback makes the restored model decide with stale weights — measured as a
higher error for thousands of events after a ``kill -9`` (docs/daemon.md §1,
"Align": 0.5935 on the 4,000 events after the restart against 0.3887 uninterrupted).

:class:`InputAligner` buffers what the transport returns and releases
messages in timestamp order: a buffered message is released only when no
assigned partition can still deliver an older one. A partition bounds the
release by the newest timestamp it has buffered while it has unread records
on the broker (``Transport.unread``); a partition that is caught up imposes no
bound. A partition with unread records and nothing buffered blocks release
for at most ``max_wait_s`` (its fetch is on the way), then it is passed over.

Invariants: within a partition messages leave in offset order (the order key
is the running maximum of the partition's timestamps, so a timestamp that
goes backwards never reorders a partition); every polled message is released
exactly once; at most ``max_buffered`` messages wait.

>>> from streamlearn.transport.memory import InMemoryTransport
>>> t = InMemoryTransport(partitions=1)
>>> for ts, topic in ((1, "instances"), (3, "instances"), (2, "feedback"), (1, "instances")):
...     _ = t.broker.append(topic, b"k", b"v", timestamp_ms=ts)
>>> [(m.topic, m.timestamp_ms) for m in InputAligner(t).poll(10, 0.0)]  # partition order kept
[('instances', 1), ('feedback', 2), ('instances', 3), ('instances', 1)]
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from streamlearn.transport.protocol import Message, Transport

__all__ = ["InputAligner"]

TopicPartition = tuple[str, int]


class InputAligner:
    """Releases polled messages in event-time order; see the module docstring.

    Parameters
    ----------
    transport
        Where messages come from (``poll`` and ``unread`` are used).
    max_wait_s
        How long a partition with unread records but nothing buffered may hold back the others.
    max_buffered
        Beyond this many buffered messages the oldest are released regardless.
    clock
        Monotonic seconds (injectable for tests).
    """

    def __init__(self, transport: Transport, max_wait_s: float = 0.5, max_buffered: int = 20_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.transport = transport
        self.max_wait_s, self.max_buffered, self.clock = max_wait_s, max_buffered, clock
        self._code: dict[TopicPartition, int] = {}  # partition → small int code
        self._messages: list[Message] = []
        self._part = np.zeros(0, dtype=np.int64)  # per buffered message: partition code
        self._order = np.zeros(0)  # per buffered message: running-max timestamp of its partition
        self._newest = np.zeros(0)  # per partition code: the running max so far
        self._blocked_since: float | None = None
        self.idle: set[TopicPartition] = set()  # caught up with nothing buffered (after a poll)

    def __len__(self) -> int:
        return len(self._messages)

    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        """Poll the transport and return what may be processed now. The poll waits up to
        ``timeout_s`` for input only when nothing buffered may be released now: a remainder
        of an earlier poll (the last few hundred messages of a burst) waited a whole timeout
        (0.1 s) before, for input that was not coming."""
        ready_now = len(self) >= max_records or (
            len(self) > 0 and bool((self._order <= self._bound(self.transport.unread())).any()))
        fresh = self.transport.poll(max_records, 0.0 if ready_now else timeout_s)
        if fresh:
            self._buffer(fresh)
        return self._release(max_records)

    def _codes(self, tps: list[TopicPartition]) -> np.ndarray:
        for tp in tps:
            if tp not in self._code:
                self._code[tp] = len(self._code)
                self._newest = np.append(self._newest, -np.inf)
        return np.array([self._code[tp] for tp in tps], dtype=np.int64)

    def _buffer(self, fresh: list[Message]) -> None:
        part = self._codes([(m.topic, m.partition) for m in fresh])
        ts = np.array([m.timestamp_ms for m in fresh], dtype=np.float64)
        order = np.empty(len(fresh))
        # a handful of partitions (the order among them does not matter); vectorised within each
        for code in dict.fromkeys(part.tolist()):
            rows = np.flatnonzero(part == code)
            running = np.maximum(np.maximum.accumulate(ts[rows]), self._newest[code])
            order[rows] = running
            self._newest[code] = running[-1]
        self._messages.extend(fresh)
        self._part = np.concatenate([self._part, part])
        self._order = np.concatenate([self._order, order])

    def _bound(self, unread: dict[TopicPartition, int | None]) -> float:
        """The newest order key that no partition can still undercut."""
        buffered_max = np.full(len(self._code), -np.inf)
        np.maximum.at(buffered_max, self._part, self._order)
        bound, blocked = np.inf, False
        for tp, left in unread.items():
            if left == 0:
                continue  # caught up: everything it has is already buffered
            code = self._code.get(tp)
            if code is not None and np.isfinite(buffered_max[code]):
                bound = min(bound, float(buffered_max[code]))
            else:
                blocked = True  # records on the broker (or not known), none here yet
        now = self.clock()
        if not blocked or not self._messages:
            # the wait counts from when a buffered message is first held back: counted while
            # nothing was buffered (a daemon polling before its first fetch came back, 0.9 s
            # after a restart), it was used up before the re-read backlog arrived, whose
            # instances then left ahead of the feedback written before them
            self._blocked_since = None
            return bound
        if self._blocked_since is None:
            self._blocked_since = now
        return bound if now - self._blocked_since >= self.max_wait_s else -np.inf

    def _release(self, max_records: int) -> list[Message]:
        unread = self.transport.unread()
        ready = self._order <= self._bound(unread)
        overflow = len(self._messages) - self.max_buffered
        if overflow > 0:  # release the oldest regardless of the bound
            ready |= self._order <= np.partition(self._order, overflow - 1)[overflow - 1]
        picked = np.flatnonzero(ready)
        picked = picked[np.argsort(self._order[picked], kind="stable")][:max_records]
        out = [self._messages[i] for i in picked.tolist()]
        if len(picked):
            keep = np.ones(len(self._messages), dtype=bool)
            keep[picked] = False
            self._messages = [m for m, k in zip(self._messages, keep.tolist(), strict=True) if k]
            self._part, self._order = self._part[keep], self._order[keep]
        buffered = set(self._part.tolist())
        waiting = {tp for tp, code in self._code.items() if code in buffered}
        self.idle = {tp for tp, left in unread.items() if left == 0 and tp not in waiting}
        return out
