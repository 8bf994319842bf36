"""What the daemon publishes: decisions and dead letters, each retried until queued.

A batch is half-done while its outputs are being queued, so a refused
produce is retried (after ``retry_seconds``) until the transport takes it;
only a stop request aborts, and then nothing of the batch is committed.
"""

from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Sequence

import orjson

from streamlearn.errors import TransportError
from streamlearn.events import Rejection
from streamlearn.transport.protocol import Transport

__all__ = ["Outputs", "dead_letter_value"]

log = logging.getLogger("streamlearn.daemon")


def dead_letter_value(rejection: Rejection, max_bytes: int) -> bytes:
    """``{"reason","detail","topic","partition","offset","id","value_b64","truncated","size"}``."""
    value = rejection.value or b""
    return orjson.dumps({
        "reason": rejection.reason, "detail": rejection.detail, "topic": rejection.topic,
        "partition": rejection.partition, "offset": rejection.offset, "id": rejection.event_id,
        "value_b64": base64.b64encode(value[:max_bytes]).decode("ascii"),
        "truncated": len(value) > max_bytes, "size": len(value),
    })


class Outputs:
    """Queues decisions and dead letters on the transport, retrying refused produces."""

    def __init__(self, transport: Transport, stop: threading.Event, retry_seconds: float,
                 dead_letter_max_bytes: int) -> None:
        self.transport, self.stop = transport, stop
        self.retry_seconds, self.dead_letter_max_bytes = retry_seconds, dead_letter_max_bytes

    def decisions(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        self.produce_all(self.transport.decisions_topic, keys, values)

    def dead_letter(self, rejection: Rejection) -> None:
        self.produce_all(self.transport.dead_letter_topic, [rejection.key],
                         [dead_letter_value(rejection, self.dead_letter_max_bytes)])

    def produce_all(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        """Queue every message, in order; while the transport refuses, wait and retry."""
        done = 0
        while done < len(values):
            try:
                self.transport.produce_many(topic, keys[done:], values[done:])
                return
            except TransportError as exc:
                done += getattr(exc, "queued", 0)  # messages queued before the refusal
                if self.stop.is_set():
                    raise
                log.warning("cannot queue a message for %s, retrying in %.1f s: %s", topic,
                            self.retry_seconds, exc)
                self.stop.wait(self.retry_seconds)
