"""Closing the membership: the revocation kafka-python delivers while it closes never blocks it.

kafka-python 3.0.12 runs the rebalance listener on its IO loop, and its ``close`` revokes the
member's partitions through that listener. The replica has handed every partition over before
it closes the membership, so nobody will apply that revocation: waiting for it (0.5 s, as the
listener once did) only stalled the client's IO loop while it closed, which let a socket read
race the close (a logged ``AttributeError`` traceback in a CI run of the scale-out test).
"""

from __future__ import annotations

import time
from typing import Any

import kafka
import pytest
from kafka.structs import TopicPartition

from streamlearn.service.group import GroupMembership


class ClosingConsumer:
    """A healthy consumer whose ``close`` revokes its partitions through the listener."""

    DEFAULT_CONFIG = kafka.KafkaConsumer.DEFAULT_CONFIG
    revoke_took_s: float | None = None

    def __init__(self, **config: Any) -> None:
        self.listener: Any = None

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self.listener = listener

    def poll(self, timeout_ms: int = 0, max_records: int = 1) -> dict[Any, Any]:
        time.sleep(timeout_ms / 1000)
        return {}

    def close(self, autocommit: bool = False, timeout_ms: int | None = None) -> None:
        started = time.monotonic()
        self.listener.on_partitions_revoked([TopicPartition("instances", 0)])
        ClosingConsumer.revoke_took_s = time.monotonic() - started


def test_the_revocation_delivered_while_closing_returns_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka, "KafkaConsumer", ClosingConsumer)
    revoked: list[list[int]] = []
    member = GroupMembership("localhost:9092", "instances", "g", on_assigned=lambda p: None,
                             on_revoked=revoked.append, on_lost=lambda p: None)
    time.sleep(0.3)
    member.close()
    assert ClosingConsumer.revoke_took_s is not None, "close never reached the consumer"
    assert ClosingConsumer.revoke_took_s < 0.05, ClosingConsumer.revoke_took_s
    assert revoked == []  # nobody applies it: the replica handed its partitions over already
