"""Records of several partitions fetched by one shared consumer, buffered per partition.

The shared clients of a replica (:class:`~streamlearn.transport.kafka_shared.SharedKafkaClients`,
:class:`~streamlearn.transport.confluent.SharedConfluentClients`) read the partitions of all
of its transports with one consumer; :class:`PartitionBuffers` keeps what a fetch brought
until the transport that attached the partition takes it.

Invariants: a partition's records are handed out in the order they were put (offset
order); only partitions attached are kept (a record of a partition detached meanwhile is
dropped: not ours to keep); a partition is attached by one transport at a time; after a
seek to P no record below P is handed out (a fetch made before the seek can still deliver
records from the old position: librdkafka did, under load, in one CI run of three).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from streamlearn.errors import TransportError
from streamlearn.transport.protocol import Message

__all__ = ["Partition", "PartitionBuffers"]

Partition = tuple[str, int]


class PartitionBuffers:
    """The attached partitions (each with its client's own partition handle) and a buffer each."""

    def __init__(self) -> None:
        self.assigned: dict[Partition, Any] = {}  # (topic, partition) → the client's handle
        self._buffers: dict[Partition, deque[Message]] = {}
        self._sought: dict[Partition, int] = {}  # a seek's position until a record reaches it

    def attach(self, partitions: Mapping[Partition, Any]) -> None:
        """Add partitions; a TransportError if another transport has attached one already."""
        taken = sorted(set(partitions) & set(self.assigned))
        if taken:
            raise TransportError(f"partitions {taken} are read by another transport already")
        self.assigned.update(partitions)
        self._buffers.update({tp: deque() for tp in partitions})

    def detach(self, partitions: Iterable[Partition]) -> list[Any]:
        """Remove partitions and their buffered records; their handles, for the client."""
        gone = [tp for tp in partitions if tp in self.assigned]
        handles = [self.assigned.pop(tp) for tp in gone]
        for tp in gone:
            del self._buffers[tp]
            self._sought.pop(tp, None)
        return handles

    def seek(self, positions: Mapping[Partition, int]) -> None:
        """Partitions were sought to ``positions``: their buffered records (fetched from the
        old positions) are dropped, and so is any record below its position that still
        arrives from a fetch made before the seek."""
        for tp, position in positions.items():
            if tp in self._buffers:
                self._buffers[tp].clear()
                self._sought[tp] = int(position)

    def buffered(self, partition: Partition) -> int:
        """Records of ``partition`` fetched but not yet taken."""
        buffer = self._buffers.get(partition)
        return 0 if buffer is None else len(buffer)

    def put(self, messages: Iterable[Message]) -> None:
        """Buffer fetched records under their partitions (a detached partition's are dropped)."""
        for m in messages:
            tp = (m.topic, m.partition)
            buffer = self._buffers.get(tp)
            if buffer is None:
                continue
            if self._sought:
                floor = self._sought.get(tp)
                if floor is not None:
                    if m.offset < floor:
                        continue  # fetched from before the seek
                    del self._sought[tp]
            buffer.append(m)

    def take(self, partitions: Iterable[Partition], max_records: int,
             fill: Callable[[], None]) -> list[Message]:
        """Up to ``max_records`` buffered records of ``partitions``, in order; when none is
        buffered, ``fill()`` (one fetch) first."""
        mine = [self._buffers[tp] for tp in partitions if tp in self._buffers]
        if not any(mine):
            fill()
        out: list[Message] = []
        for buffer in mine:
            while buffer and len(out) < max_records:
                out.append(buffer.popleft())
        return out
