"""Message transports: Kafka, and an in-memory fake behind the same Protocol.

A transport reads two co-partitioned input topics (instances and feedback)
and writes any topic (decisions, dead letters). Offsets are explicit: the
caller commits the *next* offset to read per ``(topic, partition)`` after it
has made its state durable, and seeks to restored offsets at start-up.

Invariants shared by every implementation:

- ``poll`` returns messages of each partition in offset order, at most
  ``max_records`` in total, and never the same offset twice unless ``seek``
  moved back.
- ``commit`` and ``seek`` accept only assigned partitions and offsets >= 0.
- ``produce`` never drops a message silently: a message the broker did not
  acknowledge is kept and sent again, and ``flush`` raises
  :class:`~streamlearn.errors.TransportError` until every produced message is
  acknowledged. Commit input offsets only after a successful ``flush``.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kafka.partitioner.default import murmur2

from streamlearn.errors import TransportError

__all__ = [
    "InMemoryBroker",
    "InMemoryTransport",
    "KafkaTransport",
    "Message",
    "Offsets",
    "Transport",
    "check_offsets",
    "ensure_topics",
    "partition_for_key",
]

Offsets = dict[tuple[str, int], int]
"""Next offset to read per ``(topic, partition)``."""


@dataclass(frozen=True, slots=True)
class Message:
    """One record read from a topic partition."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


@runtime_checkable
class Transport(Protocol):
    """What the daemon needs from a message transport."""

    instances_topic: str
    feedback_topic: str
    decisions_topic: str
    dead_letter_topic: str

    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        """Return up to ``max_records`` messages from the instances and feedback topics."""
        ...

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue ``value`` for ``topic`` (partitioned by ``key``)."""
        ...

    def flush(self, timeout_s: float) -> None:
        """Block until every produced message is acknowledged, else raise TransportError."""
        ...

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Store the next offsets to read for the consumer group."""
        ...

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Make the next ``poll`` read each given partition from the given offset."""
        ...

    def assignment(self) -> set[tuple[str, int]]:
        """The input partitions this transport reads."""
        ...

    def committed(self) -> Offsets:
        """The group's committed offsets for the assigned partitions that have one."""
        ...

    def end_offsets(self) -> Offsets:
        """The log-end offset (offset of the next message written) per assigned partition."""
        ...

    def close(self) -> None:
        """Flush what can be flushed and release the connections; idempotent."""
        ...


def partition_for_key(key: bytes | None, n_partitions: int, counter: int = 0) -> int:
    """Kafka's default partition for ``key``: murmur2 of the key, as the Java client does.

    Parameters
    ----------
    key : bytes or None
        Record key; ``None`` spreads records round-robin by ``counter``.
    n_partitions : int
        Partition count of the topic.
    counter : int
        Round-robin position for records without a key.

    Examples
    --------
    >>> partition_for_key(b"user-42", 8) == partition_for_key(b"user-42", 8)
    True
    >>> partition_for_key(None, 3, counter=4)
    1
    """
    if key is None:
        return counter % n_partitions
    return (murmur2(key) & 0x7FFFFFFF) % n_partitions


def check_offsets(
    offsets: Mapping[tuple[str, int], int], assigned: set[tuple[str, int]], action: str
) -> None:
    """Raise TransportError unless every entry is an assigned partition with an offset >= 0."""
    for (topic, partition), offset in offsets.items():
        if (topic, partition) not in assigned:
            raise TransportError(
                f"cannot {action} {topic}[{partition}]: not an assigned partition; "
                f"expected one of {sorted(assigned)}"
            )
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise TransportError(
                f"cannot {action} {topic}[{partition}]: expected an offset >= 0, got {offset!r}"
            )


class InMemoryBroker:
    """Topics as lists of messages per partition, plus committed offsets per group.

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
        self.topics: dict[str, list[list[Message]]] = {}
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
                self.topics[name] = [[] for _ in range(count)]
            return len(self.topics[name])

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
            log = self.topics[topic][partition]
            stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
            message = Message(topic, partition, len(log), key, value, stamp)
            log.append(message)
            self.changed.notify_all()
            return message

    def messages(self, topic: str) -> list[Message]:
        """Every message of ``topic``, partition by partition, in offset order."""
        with self.changed:
            return [m for log in self.topics.get(topic, []) for m in log]


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
        self._assigned = [(t, p) for t in (instances_topic, feedback_topic) for p in range(n_inst)]
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
            log = self.broker.topics[tp[0]][tp[1]]
            start = self._positions[tp]
            batch = log[start : start + max_records - len(taken)]
            if batch:
                taken.extend(batch)
                self._positions[tp] = start + len(batch)
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

    def flush(self, timeout_s: float) -> None:
        """Nothing is ever pending in memory."""
        self._check_open()

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Store ``offsets`` as the group's committed offsets."""
        self._check_open()
        check_offsets(offsets, set(self._assigned), "commit")
        with self.broker.changed:
            self.broker.group_offsets.setdefault(self.group_id, {}).update(offsets)

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Set the read positions; an offset past the end waits for messages to reach it."""
        self._check_open()
        check_offsets(offsets, set(self._assigned), "seek")
        self._positions.update(offsets)

    def assignment(self) -> set[tuple[str, int]]:
        """Every partition of the instances and feedback topics."""
        return set(self._assigned)

    def committed(self) -> Offsets:
        """The group's committed offsets for the assigned partitions."""
        stored = self.broker.group_offsets.get(self.group_id, {})
        return {tp: off for tp, off in stored.items() if tp in self._positions}

    def end_offsets(self) -> Offsets:
        """Number of messages in each assigned partition."""
        self._check_open()
        with self.broker.changed:
            return {tp: len(self.broker.topics[tp[0]][tp[1]]) for tp in self._assigned}

    def positions(self) -> Offsets:
        """The next offset ``poll`` reads per assigned partition."""
        return dict(self._positions)

    def close(self) -> None:
        """Mark the transport closed; later calls raise TransportError."""
        self._closed = True


_OWNED_OPTIONS = frozenset(
    {
        "bootstrap_servers",
        "group_id",
        "enable_auto_commit",
        "enable_idempotence",
        "acks",
        "key_serializer",
        "value_serializer",
        "key_deserializer",
        "value_deserializer",
        "transactional_id",
    }
)


def _split_options(options: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """Route each client option to the consumer and/or the producer that knows it."""
    from kafka import KafkaConsumer, KafkaProducer

    owned = sorted(_OWNED_OPTIONS.intersection(options))
    if owned:
        raise TransportError(
            f"client_options may not set {owned}: the transport fixes them "
            "(manual commits, idempotent acks=all producer, raw bytes)"
        )
    unknown = sorted(set(options) - set(KafkaConsumer.DEFAULT_CONFIG) - set(KafkaProducer.DEFAULT_CONFIG))
    if unknown:
        raise TransportError(f"unknown kafka-python client options {unknown}")
    consumer = {k: v for k, v in options.items() if k in KafkaConsumer.DEFAULT_CONFIG}
    producer = {k: v for k, v in options.items() if k in KafkaProducer.DEFAULT_CONFIG}
    return consumer, producer


def ensure_topics(
    bootstrap_servers: str,
    names: Iterable[str],
    partitions: int,
    replication_factor: int = 1,
    client_options: Mapping[str, object] | None = None,
    timeout_s: float = 30.0,
) -> dict[str, int]:
    """Create the missing topics among ``names``; return every topic's partition count.

    Existing topics are left as they are, so a returned count may differ from
    ``partitions``; :class:`KafkaTransport` refuses input topics that are not
    co-partitioned.
    """
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    wanted = list(dict.fromkeys(names))
    admin_keys = set(KafkaAdminClient.DEFAULT_CONFIG)
    options = {k: v for k, v in (client_options or {}).items() if k in admin_keys}
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **options)
    except KafkaError as exc:
        raise TransportError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
    try:
        missing = [n for n in wanted if n not in set(admin.list_topics())]
        if missing:
            # A concurrent creator is fine: the counts are read below.
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(n, partitions, replication_factor) for n in missing],
                    timeout_ms=int(timeout_s * 1000),
                )
        deadline = time.monotonic() + timeout_s
        while True:
            described = {
                t.get("name", t.get("topic")): len(t["partitions"])
                for t in admin.describe_topics(wanted)
                if all(p["leader_id"] >= 0 for p in t["partitions"])
            }
            if all(described.get(n, 0) > 0 for n in wanted) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    except KafkaError as exc:
        raise TransportError(f"could not create topics {wanted} on {bootstrap_servers}: {exc}") from exc
    finally:
        admin.close()
    absent = [n for n in wanted if described.get(n, 0) == 0]
    if absent:
        raise TransportError(f"topics {absent} not visible on {bootstrap_servers} after {timeout_s} s")
    return {n: described[n] for n in wanted}


@dataclass(slots=True)
class _Pending:
    topic: str
    key: bytes | None
    value: bytes
    future: object


class KafkaTransport:
    """A :class:`Transport` on kafka-python: one consumer, one idempotent producer.

    The consumer is *assigned* (not subscribed) every partition of both input
    topics, or the ``partitions`` subset of them, so positions exist as soon as
    the object is built: ``seek`` right after construction is exact, with no
    rebalance to wait for or to undo it. ``group_id`` names where offsets are
    committed (a standalone group, visible to lag tools); start positions are
    the committed offsets, else ``auto_offset_reset``. Several replicas split the
    partitions with disjoint ``partitions`` lists. Instances and feedback must
    have the same partition count and be keyed by the same event id, so that an
    event's decision and its feedback reach the same replica.

    Parameters
    ----------
    bootstrap_servers : str
        ``host:port[,host:port...]``.
    instances_topic, feedback_topic, decisions_topic, dead_letter_topic : str
        Topic names.
    group_id : str
        Consumer group for committed offsets.
    client_options : mapping, optional
        kafka-python options passed to the consumer and/or producer that know
        them, e.g. ``security_protocol``, ``sasl_mechanism``,
        ``sasl_plain_username``, ``sasl_plain_password``, ``ssl_cafile``.
    partitions : list of int, optional
        The input partitions this replica reads; all by default.
    auto_offset_reset : {"earliest", "latest"}
        Start position of a partition without a committed offset.
    request_timeout_s : float
        Bound on metadata discovery, commit and end-offset requests.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        instances_topic: str,
        feedback_topic: str,
        decisions_topic: str,
        dead_letter_topic: str,
        group_id: str,
        client_options: Mapping[str, object] | None = None,
        partitions: list[int] | None = None,
        auto_offset_reset: str = "earliest",
        request_timeout_s: float = 30.0,
    ) -> None:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition
        from kafka.errors import KafkaError

        self.instances_topic = instances_topic
        self.feedback_topic = feedback_topic
        self.decisions_topic = decisions_topic
        self.dead_letter_topic = dead_letter_topic
        self.bootstrap_servers = bootstrap_servers
        self._timeout_ms = int(request_timeout_s * 1000)
        self._pending: list[_Pending] = []
        self._closed = False
        consumer_opts, producer_opts = _split_options(client_options or {})
        common: dict[str, object] = {"client_id": "streamlearn", "reconnect_backoff_max_ms": 2000}
        try:
            self._consumer = KafkaConsumer(
                **{**common, **consumer_opts},
                bootstrap_servers=bootstrap_servers,
                group_id=group_id,
                enable_auto_commit=False,
                auto_offset_reset=auto_offset_reset,
            )
            self._producer = KafkaProducer(
                **{"linger_ms": 5, **common, **producer_opts},
                bootstrap_servers=bootstrap_servers,
                enable_idempotence=True,
                acks="all",
            )
        except KafkaError as exc:
            raise TransportError(f"cannot connect to Kafka at {bootstrap_servers}: {exc}") from exc
        counts = {t: self._partition_count(t, request_timeout_s) for t in (instances_topic, feedback_topic)}
        n_inst, n_feed = counts[instances_topic], counts[feedback_topic]
        if n_inst != n_feed:
            self.close()
            raise TransportError(
                f"instances and feedback must be co-partitioned: {instances_topic!r} has "
                f"{n_inst} partitions, {feedback_topic!r} has {n_feed}"
            )
        chosen = list(range(n_inst)) if partitions is None else sorted(set(partitions))
        if not chosen or not all(0 <= p < n_inst for p in chosen):
            self.close()
            raise TransportError(f"expected partitions within 0..{n_inst - 1}, got {partitions}")
        self._assigned = {(t, p) for t in (instances_topic, feedback_topic) for p in chosen}
        self._tp = {tp: TopicPartition(*tp) for tp in self._assigned}
        self._consumer.assign(list(self._tp.values()))
        for topic in (decisions_topic, dead_letter_topic):
            # Fetch output metadata now, so that a later send never blocks on it.
            try:
                self._producer.partitions_for(topic)
            except KafkaError as exc:
                self.close()
                raise TransportError(f"output topic {topic!r} is not available: {exc!r}") from exc

    def _partition_count(self, topic: str, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._consumer.partitions_for_topic(topic)
            if found:
                return len(found)
            if time.monotonic() > deadline:
                self.close()
                raise TransportError(
                    f"topic {topic!r} not found on {self.bootstrap_servers} within {timeout_s} s; "
                    "create it (streamlearn.stream.transport.ensure_topics)"
                )
            time.sleep(0.2)

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("the transport is closed")

    @property
    def producer_id(self) -> int:
        """The idempotent producer id the broker assigned (-1 until the first send)."""
        manager = self._producer._transaction_manager
        return -1 if manager is None else int(manager.producer_id_and_epoch.producer_id)

    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        """Fetch up to ``max_records``; while the broker is away this returns ``[]``."""
        from kafka.errors import KafkaError

        self._check_open()
        try:
            batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            if getattr(exc, "retriable", False):
                return []  # kafka-python reconnects on its own; the next poll resumes
            raise TransportError(f"poll failed on {self.bootstrap_servers}: {exc!r}") from exc
        return [
            Message(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp)
            for records in batches.values()
            for r in records
        ]

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue one message; kafka-python retries it until the broker acknowledges it."""
        from kafka.errors import KafkaError

        self._check_open()
        try:
            future = self._producer.send(topic, value=value, key=key)
        except KafkaError as exc:
            raise TransportError(f"could not queue a message for {topic}: {exc!r}") from exc
        self._pending.append(_Pending(topic, key, value, future))
        if len(self._pending) >= 50_000:
            self._reap()

    def _reap(self) -> int:
        """Drop acknowledged messages, re-send failed ones; return how many are in flight."""
        kept: list[_Pending] = []
        for item in self._pending:
            future = item.future
            if not future.is_done:  # type: ignore[attr-defined]
                kept.append(item)
            elif future.failed():  # type: ignore[attr-defined]
                item.future = self._producer.send(item.topic, value=item.value, key=item.key)
                kept.append(item)
        self._pending = kept
        return len(kept)

    def flush(self, timeout_s: float) -> None:
        """Wait until every produced message is acknowledged, else raise TransportError.

        Messages not acknowledged are kept (failed ones are sent again), so a
        later ``flush`` can still deliver them; nothing is dropped.
        """
        from kafka.errors import KafkaError

        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(KafkaError):  # a timeout: in-flight messages counted below
                self._producer.flush(timeout=max(deadline - time.monotonic(), 0.0))
            in_flight = self._reap()
            if in_flight == 0:
                return
            if time.monotonic() >= deadline:
                raise TransportError(
                    f"{in_flight} produced messages not acknowledged by {self.bootstrap_servers} "
                    f"within {timeout_s} s; they are kept and retried by the next flush"
                )

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit the next offsets to read (synchronously)."""
        from kafka import OffsetAndMetadata
        from kafka.errors import KafkaError

        self._check_open()
        check_offsets(offsets, self._assigned, "commit")
        payload = {self._tp[tp]: OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()}
        try:
            self._consumer.commit(payload, timeout_ms=self._timeout_ms)
        except KafkaError as exc:
            raise TransportError(f"commit of {dict(offsets)} failed: {exc!r}") from exc

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Set the positions the next ``poll`` reads from."""
        self._check_open()
        check_offsets(offsets, self._assigned, "seek")
        for tp, off in offsets.items():
            self._consumer.seek(self._tp[tp], off)

    def assignment(self) -> set[tuple[str, int]]:
        """The assigned input partitions."""
        return set(self._assigned)

    def committed(self) -> Offsets:
        """Committed offsets of the group for the assigned partitions that have one."""
        from kafka.errors import KafkaError

        self._check_open()
        found: Offsets = {}
        try:
            for tp, kafka_tp in self._tp.items():
                off = self._consumer.committed(kafka_tp, timeout_ms=self._timeout_ms)
                if off is not None:
                    found[tp] = off
        except KafkaError as exc:
            raise TransportError(f"could not read committed offsets: {exc!r}") from exc
        return found

    def end_offsets(self) -> Offsets:
        """Log-end offsets of the assigned partitions."""
        from kafka.errors import KafkaError

        self._check_open()
        try:
            ends = self._consumer.end_offsets(list(self._tp.values()), timeout_ms=self._timeout_ms)
        except KafkaError as exc:
            raise TransportError(f"could not read end offsets: {exc!r}") from exc
        return {(tp.topic, tp.partition): off for tp, off in ends.items()}

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush (best effort), then close the consumer without committing and the producer."""
        if self._closed:
            return
        try:
            if hasattr(self, "_producer"):
                self.flush(timeout_s)
        except TransportError:
            pass  # the error already says how many messages are lost; close anyway
        self._closed = True
        if hasattr(self, "_consumer"):
            self._consumer.close(autocommit=False)
        if hasattr(self, "_producer"):
            self._producer.close(timeout=timeout_s)
