"""Every transport implements :class:`~streamlearn.transport.protocol.Transport` — checked by mypy.

The functions below are never called: returning each implementation where a
``Transport`` is expected makes ``mypy --strict`` (run in CI) verify every
method of the Protocol, with its signature, against every transport.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamlearn.transport.confluent import ConfluentTransport
    from streamlearn.transport.embedded import EmbeddedTransport
    from streamlearn.transport.kafka import KafkaTransport
    from streamlearn.transport.lag import LagTracker
    from streamlearn.transport.memory import InMemoryTransport
    from streamlearn.transport.protocol import Transport

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
