"""One Kafka consumer and one producer shared by the partition transports of a replica.

A replica of a scaled-out group (``kafka.membership = group``) runs one daemon,
with its own :class:`~streamlearn.transport.kafka.KafkaTransport`, per partition it
owns. With a consumer and a producer per transport, a replica's Kafka clients —
each with its IO thread, its fetch requests and its metadata — grew with its
partitions, and every replica added to a group added its own. Built with
``shared=`` a :class:`SharedKafkaClients`, the transports use its consumer and
producer instead: the consumer is assigned the union of their partitions, so one
fetch brings records for all of them, and each transport takes its own
partitions' records from a buffer per partition.

Invariants: records of one partition are handed out in offset order, only to
the transport that attached that partition (two transports may not attach the
same one); a ``seek`` drops the partition's buffered records (they were fetched
from the old position); detaching a partition drops its buffer and its
assignment, and the positions of the partitions still attached are untouched
(kafka-python keeps a partition's state across ``assign`` calls that retain it).
Single-threaded, like the transports: the replica steps its daemons in turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from streamlearn.errors import TransportError
from streamlearn.transport.kafka import open_clients, to_message
from streamlearn.transport.protocol import ClientTuning, Message

__all__ = ["SharedKafkaClients"]

Partition = tuple[str, int]


class SharedKafkaClients:
    """The consumer and producer of every ``KafkaTransport(..., shared=this)``.

    Parameters
    ----------
    bootstrap_servers, group_id, client_options, auto_offset_reset, tuning
        As for :class:`~streamlearn.transport.kafka.KafkaTransport`.
    fetch_max_records : int
        Records one consumer poll may return, for all attached partitions together.
    """

    def __init__(self, bootstrap_servers: str, group_id: str,
                 client_options: Mapping[str, object] | None = None,
                 auto_offset_reset: str = "earliest", fetch_max_records: int = 2000,
                 tuning: ClientTuning | None = None) -> None:
        self.consumer, self.producer = open_clients(bootstrap_servers, group_id, client_options,
                                                    auto_offset_reset, tuning)
        self.fetch_max_records = fetch_max_records
        self._assigned: dict[Partition, Any] = {}  # (topic, partition) → kafka TopicPartition
        self._buffers: dict[Partition, deque[Message]] = {}
        self._closed = False

    def attach(self, partitions: Mapping[Partition, Any]) -> None:
        """Add a transport's partitions to the consumer's assignment."""
        taken = sorted(set(partitions) & set(self._assigned))
        if taken:
            raise TransportError(f"partitions {taken} are read by another transport already")
        self._assigned.update(partitions)
        self._buffers.update({tp: deque() for tp in partitions})
        self.consumer.assign(list(self._assigned.values()))

    def detach(self, partitions: Iterable[Partition]) -> None:
        """Remove a (closing) transport's partitions and their buffered records."""
        gone = [tp for tp in partitions if tp in self._assigned]
        for tp in gone:
            del self._assigned[tp], self._buffers[tp]
        if gone and not self._closed:
            self.consumer.assign(list(self._assigned.values()))

    def forget_buffered(self, partitions: Iterable[Partition]) -> None:
        for tp in partitions:
            if tp in self._buffers:
                self._buffers[tp].clear()

    def buffered(self, partition: Partition) -> int:
        """Records of ``partition`` fetched but not yet taken."""
        buffer = self._buffers.get(partition)
        return 0 if buffer is None else len(buffer)

    def take(self, partitions: Iterable[Partition], max_records: int,
             timeout_s: float) -> list[Message]:
        """Up to ``max_records`` buffered records of ``partitions`` (a consumer poll of at most
        ``timeout_s`` first when none is buffered). kafka-python errors propagate."""
        mine = [self._buffers[tp] for tp in partitions if tp in self._buffers]
        if not any(mine):
            self._fill(timeout_s)
        out: list[Message] = []
        for buffer in mine:
            while buffer and len(out) < max_records:
                out.append(buffer.popleft())
        return out

    def _fill(self, timeout_s: float) -> None:
        batches = self.consumer.poll(timeout_ms=int(timeout_s * 1000),
                                     max_records=self.fetch_max_records)
        for records in batches.values():
            for r in records:
                buffer = self._buffers.get((r.topic, r.partition))
                if buffer is not None:  # a partition detached meanwhile: not ours to keep
                    buffer.append(to_message(r))

    def close(self, timeout_s: float = 10.0) -> None:
        """Close both clients (after the transports: their ``close`` flushes)."""
        if self._closed:
            return
        self._closed = True
        self.consumer.close(autocommit=False)
        self.producer.close(timeout=timeout_s)
