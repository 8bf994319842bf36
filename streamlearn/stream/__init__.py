"""Streams in and out of the daemon: the Transport Protocol and its implementations."""

from __future__ import annotations

from streamlearn.stream.kafka import KafkaTransport, ensure_topics
from streamlearn.stream.memory import InMemoryBroker, InMemoryTransport
from streamlearn.stream.transport import Message, Offsets, Transport

__all__ = [
    "InMemoryBroker",
    "InMemoryTransport",
    "KafkaTransport",
    "Message",
    "Offsets",
    "Transport",
    "ensure_topics",
]
