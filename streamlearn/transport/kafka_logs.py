"""Quiets one spurious kafka-python 3.0.12 error: a socket read racing the client's own close.

``KafkaConsumer.close`` closes its connections from the calling thread while the client's
heartbeat thread may be driving the IO loop. A read task woken just before the close then
calls ``recv`` on a transport whose socket the close has just set to ``None``; kafka-python
logs the ``AttributeError`` with its traceback on ``kafka.net.transport`` and aborts that
connection — which the close was doing anyway. Nothing is lost, but the traceback reads as
a failure in every log of a clean shutdown. :class:`ClosedSocketReadFilter` drops exactly
that record (a read error whose exception is ``'NoneType' object has no attribute 'recv'``);
every other record of the logger, read errors on open sockets included, passes.

The same race shows on ``kafka.net.selector``: a task of a connection closed meanwhile
unregisters its socket, whose descriptor the close has set to -1, and the selector logs
``Unhandled exception in task`` with ``ValueError: Invalid file descriptor: -1`` (Python's
selectors say so of a closed socket; in the outside test that saw it, during a changelog
open whose restore completed, it was raised while handling ``KeyError: ... is not
registered``). :class:`ClosedSocketSelectorFilter` drops exactly
that record.
"""

from __future__ import annotations

import logging

__all__ = ["ClosedSocketReadFilter", "ClosedSocketSelectorFilter", "install"]

TRANSPORT_LOGGER = "kafka.net.transport"
SELECTOR_LOGGER = "kafka.net.selector"


class ClosedSocketReadFilter(logging.Filter):
    """False for kafka-python's log of a read on a socket its own close already released."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, AttributeError)
                    and str(record.msg).endswith("Error receiving network data closing socket")
                    and "'NoneType' object has no attribute 'recv'" in str(exc))


class ClosedSocketSelectorFilter(logging.Filter):
    """False for kafka-python's log of a task unregistering a socket its close released."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, ValueError) and str(exc) == "Invalid file descriptor: -1"
                    and str(record.msg).startswith("Unhandled exception in task"))


def install() -> None:
    """Attach the filters to kafka-python's transport and selector loggers (idempotent)."""
    for name, kind in ((TRANSPORT_LOGGER, ClosedSocketReadFilter),
                       (SELECTOR_LOGGER, ClosedSocketSelectorFilter)):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
