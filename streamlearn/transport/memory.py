"""An in-process broker and transport with Kafka's offset semantics (unit tests, embedded mode).

:class:`InMemoryBroker` holds topics as partition logs and committed offsets
per group; several :class:`InMemoryTransport` objects can share one, as
consumers share a cluster. A log can be trimmed below an offset (a retention
limit): offsets stay absolute, and reading below the first kept offset is an
error, as on Kafka. A log keeps its own right-sized copy of each value and
knows about how many bytes it holds (:attr:`PartitionLog.nbytes`), so a
retention can be set in bytes.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping, Sequence

from streamlearn.errors import TransportError
from streamlearn.events.raw import own_copy
from streamlearn.transport.protocol import (
    Message,
    Offsets,
    check_offsets,
    partition_for_key,
    produce_each,
)

__all__ = ["MESSAGE_OVERHEAD_BYTES", "InMemoryBroker", "InMemoryTransport", "PartitionLog"]

#: What a kept message costs besides its key and value (the Message object, its offset and
#: timestamp, the list slot), in bytes: an estimate, for a retention set in bytes.
MESSAGE_OVERHEAD_BYTES = 200


def _own_copy(value: bytes | None) -> bytes | None:
    return None if value is None else own_copy(value)


def _held(key: bytes | None, value: bytes | None) -> int:
    return len(key or b"") + len(value or b"") + MESSAGE_OVERHEAD_BYTES


class PartitionLog:
    """One partition: messages from offset ``base`` on (older ones trimmed).

    ``nbytes`` is about what ``messages`` holds: keys, values and
    :data:`MESSAGE_OVERHEAD_BYTES` per message.
    """

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.base = 0  # offset of messages[0]
        self.messages: list[Message] = []
        self.nbytes = 0

    @property
    def end(self) -> int:
        """The offset the next message gets."""
        return self.base + len(self.messages)

    def append(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> Message:
        message = Message(self.topic, self.partition, self.end, key, _own_copy(value),
                          timestamp_ms)
        self.messages.append(message)
        self.nbytes += _held(key, value)
        return message

    def extend(self, keys: Sequence[bytes | None], values: Sequence[bytes | None],
               timestamp_ms: int) -> None:
        end, topic, partition = self.end, self.topic, self.partition
        self.messages.extend(Message(topic, partition, end + i, k, _own_copy(v), timestamp_ms)
                             for i, (k, v) in enumerate(zip(keys, values, strict=True)))
        self.nbytes += sum(_held(k, v) for k, v in zip(keys, values, strict=True))

    def offset_holding(self, position: int, budget_bytes: int) -> int:
        """The offset from which the messages up to ``position`` hold about ``budget_bytes``
        (by the mean size of the kept messages; at most ``position``)."""
        if not self.messages:
            return position
        mean = self.nbytes / len(self.messages)
        return position - int(budget_bytes // mean)

    def read(self, start: int, count: int) -> list[Message]:
        if start < self.base:
            raise TransportError(f"cannot read {self.topic}[{self.partition}] from {start}: "
                                 f"messages before {self.base} were discarded (trimmed)")
        first = start - self.base
        return self.messages[first:first + count]

    def trim(self, below: int) -> None:
        """Forget the messages before offset ``below`` (in bulk: when half the list is old)."""
        drop = min(below - self.base, len(self.messages))
        if drop > 0 and 2 * drop >= len(self.messages):
            self.nbytes -= sum(_held(m.key, m.value) for m in self.messages[:drop])
            del self.messages[:drop]
            self.base += drop

    def skip_to(self, offset: int) -> None:
        """Continue the log at ``offset`` (an empty log may start anywhere)."""
        self.messages = []
        self.base = offset
        self.nbytes = 0


class InMemoryBroker:
    """Topics as partition logs, plus committed offsets per group.

    Several :class:`InMemoryTransport` objects can share one broker, as
    several consumers share one Kafka cluster: a new transport on the same
    group resumes at the committed offsets. Thread-safe; appending wakes
    waiting polls.

    Parameters
    ----------
    default_partitions : int
        Partition count of topics created implicitly (by ``append`` or ``produce``).
    """

    def __init__(self, default_partitions: int = 1) -> None:
        if default_partitions < 1:
            raise TransportError(f"expected default_partitions >= 1, got {default_partitions}")
        self.default_partitions = default_partitions
        self.topics: dict[str, list[PartitionLog]] = {}
        self.group_offsets: dict[str, Offsets] = {}
        self.changed = threading.Condition()
        self._round_robin = itertools.count()

    def create_topic(self, name: str, partitions: int | None = None) -> int:
        """Create ``name`` unless it exists; return its partition count."""
        with self.changed:
            if name not in self.topics:
                count = self.default_partitions if partitions is None else partitions
                if count < 1:
                    raise TransportError(f"topic {name!r}: expected partitions >= 1, got {count}")
                self.topics[name] = [PartitionLog(name, p) for p in range(count)]
            return len(self.topics[name])

    def log(self, topic: str, partition: int) -> PartitionLog:
        return self.topics[topic][partition]

    def append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Message:
        """Append one message (creating the topic if needed) and return it with its offset."""
        with self.changed:
            n_partitions = self.create_topic(topic)
            if partition is None:
                partition = partition_for_key(key, n_partitions, next(self._round_robin))
            elif not 0 <= partition < n_partitions:
                raise TransportError(f"topic {topic!r} has partitions 0..{n_partitions - 1}, got {partition}")
            stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
            message = self.topics[topic][partition].append(key, value, stamp)
            self.changed.notify_all()
            return message

    def extend(self, topic: str, partition: int, keys: Sequence[bytes | None],
               values: Sequence[bytes | None], timestamp_ms: int) -> None:
        """Append several messages to one partition at once (one lock, one wake-up)."""
        if not values:
            return
        with self.changed:
            self.create_topic(topic)
            self.topics[topic][partition].extend(keys, values, timestamp_ms)
            self.changed.notify_all()

    def messages(self, topic: str) -> list[Message]:
        """Every kept message of ``topic``, partition by partition, in offset order."""
        with self.changed:
            return [m for log in self.topics.get(topic, []) for m in log.messages]


class InMemoryTransport:
    """A :class:`Transport` over an :class:`InMemoryBroker`, with Kafka's offset semantics.

    Parameters
    ----------
    instances_topic, feedback_topic, decisions_topic, dead_letter_topic : str
        Topic names, as for the Kafka transport.
    group_id : str
        Consumer group whose committed offsets are the starting positions.
    partitions : int
        Partition count of the two input topics when this creates them.
    broker : InMemoryBroker, optional
        Shared broker; a private one by default.

    Examples
    --------
    >>> t = InMemoryTransport(partitions=2)
    >>> _ = t.append_instance(b"e1", b'{"x": 1}')
    >>> [(m.topic, m.offset) for m in t.poll(10, 0.0)]
    [('instances', 0)]
    """

    def __init__(
        self,
        instances_topic: str = "instances",
        feedback_topic: str = "feedback",
        decisions_topic: str = "decisions",
        dead_letter_topic: str = "dead-letter",
        group_id: str = "streamlearn",
        partitions: int = 1,
        broker: InMemoryBroker | None = None,
        only: list[int] | None = None,
    ) -> None:
        self.instances_topic = instances_topic
        self.feedback_topic = feedback_topic
        self.decisions_topic = decisions_topic
        self.dead_letter_topic = dead_letter_topic
        self.group_id = group_id
        self.broker = broker if broker is not None else InMemoryBroker(partitions)
        n_inst = self.broker.create_topic(instances_topic, partitions)
        n_feed = self.broker.create_topic(feedback_topic, partitions)
        if n_inst != n_feed:
            raise TransportError(
                f"instances and feedback must be co-partitioned: {instances_topic!r} has "
                f"{n_inst} partitions, {feedback_topic!r} has {n_feed}"
            )
        chosen = range(n_inst) if only is None else sorted(set(only))  # as Kafka's `partitions`
        self._assigned = [(t, p) for t in (instances_topic, feedback_topic) for p in chosen]
        committed = self.broker.group_offsets.get(group_id, {})
        self._positions: Offsets = {tp: committed.get(tp, 0) for tp in self._assigned}
        self._next_start = 0
        self._closed = False

    def append_instance(self, key: bytes | None, value: bytes) -> Message:
        """Write a message to the instances topic (as an upstream producer would)."""
        return self.broker.append(self.instances_topic, key, value)

    def append_feedback(self, key: bytes | None, value: bytes) -> Message:
        """Write a message to the feedback topic (as an upstream producer would)."""
        return self.broker.append(self.feedback_topic, key, value)

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("the transport is closed")

    def _take(self, max_records: int) -> list[Message]:
        taken: list[Message] = []
        n = len(self._assigned)
        for i in range(n):
            tp = self._assigned[(self._next_start + i) % n]
            batch = self.broker.log(*tp).read(self._positions[tp], max_records - len(taken))
            if batch:
                taken.extend(batch)
                self._positions[tp] = batch[-1].offset + 1
            if len(taken) >= max_records:
                break
        self._next_start = (self._next_start + 1) % n
        return taken

    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        """Return up to ``max_records`` messages, waiting up to ``timeout_s`` for the first."""
        self._check_open()
        if max_records < 1:
            raise TransportError(f"expected max_records >= 1, got {max_records}")
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self.broker.changed:
            while True:
                taken = self._take(max_records)
                remaining = deadline - time.monotonic()
                if taken or remaining <= 0:
                    return taken
                self.broker.changed.wait(remaining)

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Append to ``topic`` at once (the fake acknowledges every write)."""
        self._check_open()
        self.broker.append(topic, key, value)

    def produce_many(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        """Queue several messages in order (see ``Transport.produce_many``)."""
        self._check_open()
        if self.broker.create_topic(topic) == 1:  # one partition: append them in one go
            self.broker.extend(topic, 0, keys, values, int(time.time() * 1000))
            return
        produce_each(self.produce, topic, keys, values)

    def flush(self, timeout_s: float) -> None:
        """Nothing is ever pending in memory."""
        self._check_open()

    def commit(self, offsets: Mapping[tuple[str, int], int], *, wait: bool = True) -> None:
        """Store ``offsets`` as the group's committed offsets (at once, ``wait`` or not)."""
        self._check_open()
        check_offsets(offsets, set(self._assigned), "commit")
        with self.broker.changed:
            self.broker.group_offsets.setdefault(self.group_id, {}).update(offsets)

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Set the read positions; an offset past the end waits for messages to reach it."""
        self._check_open()
        check_offsets(offsets, set(self._assigned), "seek")
        with self.broker.changed:
            for tp, offset in offsets.items():
                base = self.broker.log(*tp).base
                if offset < base:
                    raise TransportError(f"cannot seek {tp[0]}[{tp[1]}] to {offset}: messages "
                                         f"before {base} were discarded (trimmed)")
        self._positions.update(offsets)

    def assignment(self) -> set[tuple[str, int]]:
        """Every partition of the instances and feedback topics."""
        return set(self._assigned)

    def committed(self) -> Offsets:
        """The group's committed offsets for the assigned partitions."""
        stored = self.broker.group_offsets.get(self.group_id, {})
        return {tp: off for tp, off in stored.items() if tp in self._positions}

    def end_offsets(self) -> Offsets:
        """The log-end offset of each assigned partition."""
        self._check_open()
        with self.broker.changed:
            return {tp: self.broker.log(*tp).end for tp in self._assigned}

    def unread(self) -> dict[tuple[str, int], int | None]:
        """Messages after the read position, per assigned partition."""
        with self.broker.changed:
            return {tp: max(0, self.broker.log(*tp).end - self._positions[tp])
                    for tp in self._assigned}

    def positions(self) -> Offsets:
        """The next offset ``poll`` reads per assigned partition."""
        return dict(self._positions)

    def close(self) -> None:
        """Mark the transport closed; later calls raise TransportError."""
        self._closed = True
