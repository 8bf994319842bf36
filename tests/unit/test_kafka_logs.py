"""kafka-python's log of a read racing its own close is dropped; every other read error is kept.

Driven through kafka-python's real transport code (``KafkaTCPTransport._sock_recv``), so the
test fails if a kafka-python release changes the record the filter recognises.
"""

from __future__ import annotations

import logging

import pytest
from kafka.net.transport import KafkaTCPTransport

from streamlearn.transport import kafka_logs


class BrokenSocket:
    def recv(self, n: int) -> bytes:
        raise ConnectionResetError("reset by peer")

    def getpeername(self) -> tuple[str, int]:
        return ("127.0.0.1", 9092)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 40000)


def read_errors(sock: object, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    kafka_logs.install()
    transport = KafkaTCPTransport(net=None, sock=sock)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=kafka_logs.TRANSPORT_LOGGER):
        _, err = transport._sock_recv()
    assert err is not None  # kafka-python still reports the error to its caller
    return [r for r in caplog.records if r.name == kafka_logs.TRANSPORT_LOGGER]


def test_a_read_on_a_socket_released_by_close_is_not_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    assert read_errors(None, caplog) == []


def test_a_read_error_on_an_open_socket_is_still_logged_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    records = read_errors(BrokenSocket(), caplog)
    assert len(records) == 1 and records[0].levelno == logging.ERROR
    assert records[0].exc_info is not None
    assert isinstance(records[0].exc_info[1], ConnectionResetError)


def test_install_is_idempotent() -> None:
    kafka_logs.install()
    kafka_logs.install()
    logger = logging.getLogger(kafka_logs.TRANSPORT_LOGGER)
    assert sum(isinstance(f, kafka_logs.ClosedSocketReadFilter) for f in logger.filters) == 1


def test_a_task_registering_a_socket_released_by_close_is_not_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """The selector's side of the same race (an outside test, during a changelog open): a
    task registers a socket its close has released (descriptor -1); kafka-python's own
    register_event raises, and its loop logs "Unhandled exception in task" with it."""
    import selectors
    import socket

    from kafka.net.selector import NetworkSelector

    kafka_logs.install()
    net = NetworkSelector()
    released = socket.socket()
    released.close()
    logger = logging.getLogger(kafka_logs.SELECTOR_LOGGER)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=kafka_logs.SELECTOR_LOGGER):
        try:
            net.register_event(released, selectors.EVENT_READ, lambda: None)
        except ValueError:
            logger.exception("Unhandled exception in task %s:", "task")  # as its loop does
        try:
            raise ValueError("another bug")
        except ValueError:
            logger.exception("Unhandled exception in task %s:", "task")
    messages = [str(r.exc_info[1]) for r in caplog.records
                if r.name == kafka_logs.SELECTOR_LOGGER and r.exc_info]
    assert messages == ["another bug"]
