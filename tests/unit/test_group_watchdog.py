"""The membership thread's watchdog: a group consumer stuck in a busy poll loop is replaced.

kafka-python's consumer is replaced by a fake (this is about our thread, not the client):
one whose ``poll`` spins on the CPU, as kafka-python 3.0.12's did now and then, and one
whose ``poll`` waits, as a healthy client does.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import kafka
import pytest

from streamlearn.service import group
from streamlearn.service.group import GroupMembership


class FakeConsumer:
    DEFAULT_CONFIG = kafka.KafkaConsumer.DEFAULT_CONFIG
    opened: ClassVar[list[FakeConsumer]] = []
    busy = True  # the first consumer opened spins; replacements are healthy

    def __init__(self, **config: Any) -> None:
        self.spins, self.closed = FakeConsumer.busy, False
        FakeConsumer.busy = False
        FakeConsumer.opened.append(self)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}

    def subscribe(self, topics: list[str], listener: Any) -> None:
        pass

    def poll(self, timeout_ms: int = 0, max_records: int = 1) -> dict[Any, Any]:
        deadline = time.monotonic() + timeout_ms / 1000
        while self.spins and time.monotonic() < deadline:
            pass  # the client's loop that never waits
        if not self.spins:
            time.sleep(timeout_ms / 1000)
        return {}

    def close(self, autocommit: bool = False, timeout_ms: int | None = None) -> None:
        self.closed = True


@pytest.mark.parametrize("first_spins", [True, False])
def test_a_busy_group_consumer_is_replaced_and_a_healthy_one_is_kept(
        monkeypatch: pytest.MonkeyPatch, first_spins: bool) -> None:
    monkeypatch.setattr(kafka, "KafkaConsumer", FakeConsumer)
    monkeypatch.setattr(group, "BUSY_WINDOW_S", 0.5)
    FakeConsumer.opened, FakeConsumer.busy = [], first_spins
    member = GroupMembership("localhost:9092", "instances", "g", on_assigned=lambda p: None,
                             on_revoked=lambda p: None, on_lost=lambda p: None)
    try:
        time.sleep(2.0)  # four watchdog windows
    finally:
        member.close()
    if first_spins:
        assert member.reopened == 1
        assert FakeConsumer.opened[0].closed and not FakeConsumer.opened[1].spins
    else:
        assert member.reopened == 0 and len(FakeConsumer.opened) == 1
