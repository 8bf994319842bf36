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

from collections.abc import Iterable, Mapping
from typing import Any

from streamlearn.transport.buffers import Partition, PartitionBuffers
from streamlearn.transport.kafka import close_producer, open_clients, to_message
from streamlearn.transport.protocol import ClientTuning, Message, close_flush_seconds

__all__ = ["SharedKafkaClients"]


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
        self.flush_timed_out = False  # the last flush of the producer, by any transport
        self._partitions = PartitionBuffers()
        self._closed = False

    def attach(self, partitions: Mapping[Partition, Any]) -> None:
        """Add a transport's partitions to the consumer's assignment."""
        self._partitions.attach(partitions)
        self.consumer.assign(list(self._partitions.assigned.values()))

    def detach(self, partitions: Iterable[Partition]) -> None:
        """Remove a (closing) transport's partitions and their buffered records."""
        if self._partitions.detach(partitions) and not self._closed:
            self.consumer.assign(list(self._partitions.assigned.values()))

    def forget_buffered(self, positions: Mapping[Partition, int]) -> None:
        """A transport sought these partitions: drop what was fetched from before."""
        self._partitions.seek(positions)

    def buffered(self, partition: Partition) -> int:
        """Records of ``partition`` fetched but not yet taken."""
        return self._partitions.buffered(partition)

    def take(self, partitions: Iterable[Partition], max_records: int,
             timeout_s: float) -> list[Message]:
        """Up to ``max_records`` buffered records of ``partitions`` (a consumer poll of at most
        ``timeout_s`` first when none is buffered). kafka-python errors propagate."""
        return self._partitions.take(partitions, max_records, lambda: self._fill(timeout_s))

    def _fill(self, timeout_s: float) -> None:
        batches = self.consumer.poll(timeout_ms=int(timeout_s * 1000),
                                     max_records=self.fetch_max_records)
        self._partitions.put(to_message(r) for records in batches.values() for r in records)

    def close(self, timeout_s: float = 10.0) -> None:
        """Close both clients (after the transports: their ``close`` flushes); the producer
        waits for nothing more after a flush of it that timed out (``close_flush_seconds``)."""
        if self._closed:
            return
        self._closed = True
        self.consumer.close(autocommit=False)
        close_producer(self.producer, close_flush_seconds(timeout_s, self.flush_timed_out))
