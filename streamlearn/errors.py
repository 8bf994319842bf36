"""The exception hierarchy: one root, narrow subclasses.

Messages name what was expected and what was got (and, on a stream, the
topic[partition], offset and event id) so that a user can act on them.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DataError",
    "InvalidEventError",
    "OwnershipLost",
    "StateError",
    "StreamlearnError",
    "TransportError",
]


class StreamlearnError(Exception):
    """Root of every error streamlearn raises on purpose."""


class ConfigError(StreamlearnError, ValueError):
    """A configuration value, CLI option or hyperparameter is invalid."""


class DataError(StreamlearnError):
    """A dataset is missing, corrupt or malformed."""


class StateError(StreamlearnError):
    """A saved state or checkpoint is missing, corrupt, or of another format."""


class InvalidEventError(StreamlearnError):
    """An event on a stream failed validation; ``reason`` is a short stable code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class TransportError(StreamlearnError):
    """The message transport (Kafka or embedded) failed."""


class OwnershipLost(StreamlearnError):
    """This process may no longer write a partition's decisions or state: another replica
    claimed it (service/claims.py), or its changelog writer was fenced (transport/keyed_log.py).
    """
