"""The membership on librdkafka (``kafka.client = confluent``): rebalance callbacks reach the
serving thread, and the serving thread can ask for the assignment while a revocation waits.

librdkafka's ``Consumer.assignment()`` waits while a rebalance callback runs, and the
revocation callback waits until the serving thread has stopped the partitions; the serving
thread asks for the assignment (``Replica._recover``). Asking the consumer deadlocked the
replica (2 of 3 runs of the scale-out test); the member now answers from what the callbacks
reported. librdkafka is replaced by a fake with that locking (this is about our threads).
"""

from __future__ import annotations

import importlib.util
import threading
import time
from typing import Any

import pytest

from streamlearn.service.group import GroupMembership

pytestmark = pytest.mark.skipif(importlib.util.find_spec("confluent_kafka") is None,
                                reason="confluent-kafka is not installed (the 'confluent' extra)")


class Partition:
    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition


class Metadata:
    def __init__(self, topic: str) -> None:
        partitions = {0: None, 1: None, 2: None}
        self.topics = {topic: type("T", (), {"error": None, "partitions": partitions})()}


class FakeLibrdkafka:
    """Serves scripted rebalances in ``poll``; ``assignment()`` waits for a running callback
    as librdkafka's does (its main thread is busy with the rebalance)."""

    def __init__(self, settings: dict[str, object]) -> None:
        self.settings = settings
        self.callbacks: dict[str, Any] = {}
        self.script: list[tuple[str, list[int]]] = []
        self.in_callback = threading.Lock()
        self.owned: list[int] = []
        self.paused: list[int] = []
        self.closed = False

    def list_topics(self, topic: str, timeout: float) -> Metadata:
        return Metadata(topic)

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.topic = topics[0]
        self.callbacks = callbacks

    def poll(self, timeout: float) -> None:
        if not self.script:
            time.sleep(min(timeout, 0.01))
            return
        kind, parts = self.script.pop(0)
        with self.in_callback:
            self.callbacks[kind](self, [Partition(self.topic, p) for p in parts])
            if kind != "on_assign":
                self.owned = [p for p in self.owned if p not in parts]

    def incremental_assign(self, partitions: list[Partition]) -> None:
        self.owned += [tp.partition for tp in partitions]

    def pause(self, partitions: list[Partition]) -> None:
        self.paused += [tp.partition for tp in partitions]

    def assignment(self) -> list[Partition]:
        if not self.in_callback.acquire(timeout=2.0):  # librdkafka would wait for ever
            raise AssertionError("deadlock: assignment() waited for a running rebalance callback")
        try:
            return [Partition(self.topic, p) for p in self.owned]
        finally:
            self.in_callback.release()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[FakeLibrdkafka]:
    import confluent_kafka

    made: list[FakeLibrdkafka] = []

    def consumer(settings: dict[str, object]) -> FakeLibrdkafka:
        made.append(FakeLibrdkafka(settings))
        return made[-1]

    monkeypatch.setattr(confluent_kafka, "Consumer", consumer)
    return made


def test_the_serving_thread_reads_the_assignment_while_a_revocation_waits_for_it(
        fake: list[FakeLibrdkafka]) -> None:
    seen: list[tuple[str, list[int], set[int]]] = []
    member: GroupMembership

    def handler(kind: str) -> Any:
        def apply(parts: list[int]) -> None:  # as Replica._recover does, from the handler
            seen.append((kind, parts, member.assigned()))
        return apply

    member = GroupMembership("localhost:9092", "instances", "g", on_assigned=handler("assigned"),
                             on_revoked=handler("revoked"), on_lost=handler("lost"),
                             group_instance_id="r1", client="confluent")
    consumer = fake[0]
    try:
        assert consumer.settings["partition.assignment.strategy"] == "cooperative-sticky"
        assert consumer.settings["group.instance.id"] == "r1"
        consumer.script += [("on_assign", [0, 1, 2]), ("on_revoke", [1]), ("on_lost", [2])]
        deadline = time.monotonic() + 10
        while len(seen) < 3 and time.monotonic() < deadline:
            member.poll(0.05)  # the serving thread; a deadlock leaves `seen` short
            assert member.assigned() <= {0, 1, 2}
        assert [(kind, parts) for kind, parts, _ in seen] == [
            ("assigned", [0, 1, 2]), ("revoked", [1]), ("lost", [2])]
        # the revocation waits for its handler, which reads it without waiting for it; (the
        # assignment handler is not waited for: the revocation may have come in by then)
        assert seen[1][2] == {0, 2} and seen[2][2] == {0}
        assert consumer.paused == [0, 1, 2]  # membership only: the replica fetches itself
        assert member.assigned() == {0}
    finally:
        member.close()
    assert consumer.closed
