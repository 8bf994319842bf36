"""Quiets one spurious kafka-python 3.0.12 error: a socket read racing the client's own close.

``KafkaConsumer.close`` closes its connections from the calling thread while the client's
heartbeat thread may be driving the IO loop. A read task woken just before the close then
calls ``recv`` on a transport whose socket the close has just set to ``None``; kafka-python
logs the ``AttributeError`` with its traceback on ``kafka.net.transport`` and aborts that
connection — which the close was doing anyway. Nothing is lost, but the traceback reads as
a failure in every log of a clean shutdown. :class:`ClosedSocketReadFilter` drops exactly
that record (a read error whose exception is ``'NoneType' object has no attribute 'recv'``);
every other record of the logger, read errors on open sockets included, passes.
"""

from __future__ import annotations

import logging

__all__ = ["ClosedSocketReadFilter", "install"]

TRANSPORT_LOGGER = "kafka.net.transport"


class ClosedSocketReadFilter(logging.Filter):
    """False for kafka-python's log of a read on a socket its own close already released."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, AttributeError)
                    and str(record.msg).endswith("Error receiving network data closing socket")
                    and "'NoneType' object has no attribute 'recv'" in str(exc))


def install() -> None:
    """Attach the filter to kafka-python's transport logger (idempotent)."""
    logger = logging.getLogger(TRANSPORT_LOGGER)
    if not any(isinstance(f, ClosedSocketReadFilter) for f in logger.filters):
        logger.addFilter(ClosedSocketReadFilter())
