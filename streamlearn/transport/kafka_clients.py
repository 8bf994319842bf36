"""The Kafka client libraries a transport can run on (``kafka.client``), by name."""

from __future__ import annotations

import importlib

from streamlearn.errors import ConfigError
from streamlearn.transport.confluent import ConfluentTransport, SharedConfluentClients
from streamlearn.transport.kafka import KafkaTransport
from streamlearn.transport.kafka_shared import SharedKafkaClients
from streamlearn.transport.protocol import KAFKA_CLIENT_PACKAGES, kafka_client_installed

__all__ = ["CLIENTS", "shared_clients_class", "transport_class"]

#: ``kafka.client`` → (the transport, the clients a replica's partition transports share).
CLIENTS: dict[str, tuple[type[KafkaTransport] | type[ConfluentTransport],
                         type[SharedKafkaClients] | type[SharedConfluentClients]]] = {
    "kafka-python": (KafkaTransport, SharedKafkaClients),
    "confluent": (ConfluentTransport, SharedConfluentClients),
}


def _check(client: str) -> None:
    if client not in CLIENTS:
        raise ConfigError(f"kafka.client must be one of {', '.join(CLIENTS)}. Got {client!r}.")
    package = KAFKA_CLIENT_PACKAGES[client]
    if not kafka_client_installed(client):
        raise ConfigError(f"kafka.client = {client} needs the {package} package, which "
                          "is not installed: pip install 'streamlearn[confluent]' "
                          "(or confluent-kafka)")
    try:  # installed but broken (e.g. a wheel for another platform): say so, not a traceback
        importlib.import_module(package)
    except ImportError as exc:
        raise ConfigError(f"kafka.client = {client} could not import {package}: {exc}. "
                          f"Reinstall it (pip install --force-reinstall "
                          f"{package.replace('_', '-')}) or set kafka.client = kafka-python "
                          f"(the default, auto, takes {client} wherever {package} is "
                          f"installed).") from None


def transport_class(client: str) -> type[KafkaTransport] | type[ConfluentTransport]:
    """The transport of ``kafka.client``; ConfigError when its package is not installed."""
    _check(client)
    return CLIENTS[client][0]


def shared_clients_class(client: str) -> type[SharedKafkaClients] | type[SharedConfluentClients]:
    """The shared clients of a replica for ``kafka.client``."""
    _check(client)
    return CLIENTS[client][1]
