"""Streams in and out of the daemon: the :class:`Transport` protocol and its implementations.

:mod:`~streamlearn.transport.protocol` (the protocol every transport implements),
:mod:`~streamlearn.transport.kafka` (kafka-python), :mod:`~streamlearn.transport.confluent`
(librdkafka), :mod:`~streamlearn.transport.kafka_shared` (one consumer and producer for a
replica's partitions), :mod:`~streamlearn.transport.memory` (in process, Kafka's offset
semantics), :mod:`~streamlearn.transport.embedded` (in memory with a simulated caller on the
other side), :mod:`~streamlearn.transport.align` (input in event-time order across
partitions) and :mod:`~streamlearn.transport.lag` (consumer lag for ``/readyz``).
"""

from __future__ import annotations

from streamlearn.transport.kafka import KafkaTransport, ensure_topics
from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport
from streamlearn.transport.protocol import Message, Offsets, Transport

__all__ = ["InMemoryBroker", "InMemoryTransport", "KafkaTransport", "Message", "Offsets",
           "Transport", "ensure_topics"]
