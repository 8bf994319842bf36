"""Every transport implements :class:`~streamlearn.stream.transport.Transport` — checked by mypy.

The functions below are never called: returning each implementation where a
``Transport`` is expected makes ``mypy --strict`` (run in CI) verify every
method of the Protocol, with its signature, against every transport.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamlearn.service.http import LagTracker
    from streamlearn.stream.confluent import ConfluentTransport
    from streamlearn.stream.embedded import EmbeddedTransport
    from streamlearn.stream.kafka import KafkaTransport
    from streamlearn.stream.memory import InMemoryTransport
    from streamlearn.stream.transport import Transport

    def _memory(t: InMemoryTransport) -> Transport:
        return t

    def _embedded(t: EmbeddedTransport) -> Transport:
        return t

    def _kafka(t: KafkaTransport) -> Transport:
        return t

    def _confluent(t: ConfluentTransport) -> Transport:
        return t

    def _lag_tracker(t: LagTracker) -> Transport:
        return t
