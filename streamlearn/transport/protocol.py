"""The message transport Protocol and what every implementation shares.

Implementations: :class:`streamlearn.transport.kafka.KafkaTransport` (kafka-python)
and :class:`streamlearn.transport.memory.InMemoryTransport` (an in-process fake
with Kafka's offset semantics, for unit tests and the embedded mode).

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

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from kafka.partitioner.default import murmur2

from streamlearn.errors import TransportError
from streamlearn.events.raw import Message

__all__ = ["KAFKA_CLIENT_PACKAGES", "ClientTuning", "Message", "Offsets", "Transport",
           "check_offsets", "close_flush_seconds", "kafka_client_installed", "partition_for_key",
           "partitions_for_keys", "produce_each"]

Offsets = dict[tuple[str, int], int]
"""Next offset to read per ``(topic, partition)``."""

#: ``kafka.client`` → the Python package of that client library.
KAFKA_CLIENT_PACKAGES = {"kafka-python": "kafka", "confluent": "confluent_kafka"}


def kafka_client_installed(client: str) -> bool:
    """Whether the package of client library ``client`` is installed (found, not imported:
    importing confluent-kafka takes ~60 ms, and only a Kafka transport needs it)."""
    return importlib.util.find_spec(KAFKA_CLIENT_PACKAGES[client]) is not None


@dataclass(frozen=True, slots=True)
class ClientTuning:
    """How a Kafka transport's clients trade latency for CPU per event (``kafka.*`` settings).

    Attributes
    ----------
    linger_s : float or None
        The producer holds a batch this long before sending it: one produce request per
        batch and partition instead of one per message, at up to this much latency (at low
        rates the whole of it: a decision's batch is alone). None: the client's own default
        (``LINGER_S`` of :mod:`streamlearn.transport.kafka` and of
        :mod:`streamlearn.transport.confluent`).
    fetch_wait_s : float
        Longest the broker holds a fetch with less than ``fetch_min_bytes`` to return.
    fetch_min_bytes : int
        Bytes the broker waits for before it answers a fetch (1: at once).
    """

    linger_s: float | None = None
    fetch_wait_s: float = 0.05
    fetch_min_bytes: int = 1


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

    def produce_many(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        """Queue several messages in order; on a refusal raise TransportError whose ``queued``
        says how many were queued before it."""
        ...

    def flush(self, timeout_s: float) -> None:
        """Block until every produced message is acknowledged, else raise TransportError."""
        ...

    def commit(self, offsets: Mapping[tuple[str, int], int], *, wait: bool = True) -> None:
        """Store the next offsets to read for the consumer group.

        With ``wait=False`` the commit may complete after the call returns (a failure is
        then logged, not raised); commits complete in the order they were made.
        """
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

    def unread(self) -> dict[tuple[str, int], int | None]:
        """Per assigned partition: records on the broker that ``poll`` has not returned yet.

        Known without a network call (Kafka: the high watermark of the last fetch
        response minus the position); ``None`` while not known yet.
        """
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
    return int((murmur2(key) & 0x7FFFFFFF) % n_partitions)


#: Below this many keys of one length :func:`partitions_for_keys` hashes them one by one:
#: the vectorised hash makes ~5 numpy calls per 4 bytes of key whatever the count.
VECTOR_HASH_MIN_KEYS = 16


def partitions_for_keys(keys: Sequence[bytes], n_partitions: int) -> np.ndarray:
    """:func:`partition_for_key` of each key (none may be ``None``), vectorised over the keys
    of each length (kafka-python's murmur2 is pure Python: 2.5 µs for an 8-byte key, 7.4 µs
    for a 36-byte UUID on the development machine).

    >>> keys = [b"user-42", b"e1", b"7f3a9c2e-1b4d-4c8e-9a2f-3e5d7c9b1a4f"] * 10
    >>> partitions_for_keys(keys, 6).tolist() == [partition_for_key(k, 6) for k in keys]
    True
    """
    if len(keys) < VECTOR_HASH_MIN_KEYS:
        return np.array([partition_for_key(k, n_partitions) for k in keys], dtype=np.int64)
    out = np.empty(len(keys), dtype=np.int64)
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length).tolist()
        if len(rows) < VECTOR_HASH_MIN_KEYS:
            out[rows] = [partition_for_key(keys[i], n_partitions) for i in rows]
            continue
        data = np.frombuffer(b"".join([keys[i] for i in rows]), dtype=np.uint8)
        hashed = _murmur2_rows(data.reshape(len(rows), length))
        out[rows] = (hashed & np.uint32(0x7FFFFFFF)) % n_partitions
    return out


def _murmur2_rows(data: np.ndarray) -> np.ndarray:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) of each row of the
    ``(n, length)`` uint8 array, as uint32; uint32 products wrap modulo 2**32 as Java's ints do."""
    n, length = data.shape
    m = np.uint32(0x5BD1E995)
    h = np.full(n, (0x9747B28C ^ length) & 0xFFFFFFFF, dtype=np.uint32)
    words = np.ascontiguousarray(data[:, :length & ~3]).view("<u4")  # little-endian blocks
    for i in range(length // 4):
        k = words[:, i] * m
        k ^= k >> np.uint32(24)
        k *= m
        h *= m
        h ^= k
    tail = length & ~3
    extra = length % 4
    if extra >= 3:
        h ^= data[:, tail + 2].astype(np.uint32) << np.uint32(16)
    if extra >= 2:
        h ^= data[:, tail + 1].astype(np.uint32) << np.uint32(8)
    if extra >= 1:
        h ^= data[:, tail].astype(np.uint32)
        h *= m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    return h


def close_flush_seconds(timeout_s: float, last_flush_timed_out: bool) -> float:
    """How long a closing transport waits for its produced messages: ``timeout_s``, or
    nothing right after a flush that timed out (the final checkpoint's, while the broker is
    away). Waiting as long again gains nothing — what is not acknowledged is journaled or
    re-read after a restart (at least once) — and doubled a SIGTERM's stop during an outage
    (an outside test: 20-23 s on librdkafka, 31 s on kafka-python, whose producer's close
    then waited a third time)."""
    return 0.0 if last_flush_timed_out else timeout_s


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


def produce_each(produce: Callable[[str, bytes | None, bytes], None], topic: str,
                 keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
    """``produce_many`` by one ``produce`` per message (``TransportError.queued`` set on failure)."""
    for n, (key, value) in enumerate(zip(keys, values, strict=True)):
        try:
            produce(topic, key, value)
        except TransportError as exc:
            exc.queued = n  # type: ignore[attr-defined]
            raise
