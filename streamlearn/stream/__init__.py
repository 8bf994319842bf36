"""Streams in and out of the daemon: the Transport Protocol and its implementations."""

from __future__ import annotations

from streamlearn.stream.transport import (
    InMemoryBroker,
    InMemoryTransport,
    KafkaTransport,
    Message,
    Offsets,
    Transport,
    ensure_topics,
)

__all__ = [
    "InMemoryBroker",
    "InMemoryTransport",
    "KafkaTransport",
    "Message",
    "Offsets",
    "Transport",
    "ensure_topics",
]
