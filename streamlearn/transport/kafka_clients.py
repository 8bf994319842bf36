"""The Kafka client libraries a transport can run on (``kafka.client``), by name."""

from __future__ import annotations

import importlib.util

from streamlearn.errors import ConfigError
from streamlearn.transport.confluent import ConfluentTransport, SharedConfluentClients
from streamlearn.transport.kafka import KafkaTransport
from streamlearn.transport.kafka_shared import SharedKafkaClients

__all__ = ["CLIENTS", "shared_clients_class", "transport_class"]

#: ``kafka.client`` → (the transport, the clients a replica's partition transports share).
CLIENTS: dict[str, tuple[type[KafkaTransport] | type[ConfluentTransport],
                         type[SharedKafkaClients] | type[SharedConfluentClients]]] = {
    "kafka-python": (KafkaTransport, SharedKafkaClients),
    "confluent": (ConfluentTransport, SharedConfluentClients),
}

_PACKAGES = {"kafka-python": "kafka", "confluent": "confluent_kafka"}


def _check(client: str) -> None:
    if client not in CLIENTS:
        raise ConfigError(f"kafka.client must be one of {', '.join(CLIENTS)}. Got {client!r}.")
    if importlib.util.find_spec(_PACKAGES[client]) is None:
        raise ConfigError(f"kafka.client = {client} needs the {_PACKAGES[client]} package, which "
                          "is not installed: pip install 'streamlearn[confluent]' "
                          "(or confluent-kafka)")


def transport_class(client: str) -> type[KafkaTransport] | type[ConfluentTransport]:
    """The transport of ``kafka.client``; ConfigError when its package is not installed."""
    _check(client)
    return CLIENTS[client][0]


def shared_clients_class(client: str) -> type[SharedKafkaClients] | type[SharedConfluentClients]:
    """The shared clients of a replica for ``kafka.client``."""
    _check(client)
    return CLIENTS[client][1]
