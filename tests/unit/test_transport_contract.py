"""The Transport contract (``tests/transport_contract.py``) on the in-memory and embedded transports."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from transport_contract import CHECKS, Harness

from streamlearn.transport.embedded import EmbeddedTransport
from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport
from streamlearn.transport.protocol import Transport


class MemoryHarness:
    partitions, shares_cluster = 2, True

    def __init__(self) -> None:
        self.broker = InMemoryBroker(self.partitions)

    def transport(self, group: str) -> Transport:
        return InMemoryTransport(group_id=group, partitions=self.partitions, broker=self.broker)

    def write(self, role: str, key: bytes, value: bytes) -> None:
        self.broker.append(role, key, value)

    def outputs(self, role: str) -> list[bytes]:
        topic = {"decisions": "decisions", "dead_letter": "dead-letter"}[role]
        return [m.value or b"" for m in self.broker.messages(topic)]


class EmbeddedHarness:
    """The embedded transport with its simulator publishing nothing: input comes from the test."""

    partitions, shares_cluster = 1, False

    def __init__(self) -> None:
        self.current: EmbeddedTransport | None = None

    def transport(self, group: str) -> Transport:
        self.current = EmbeddedTransport(max_instances=0)
        return self.current

    def write(self, role: str, key: bytes, value: bytes) -> None:
        assert self.current is not None
        topic = {"instances": self.current.instances_topic,
                 "feedback": self.current.feedback_topic}[role]
        self.current.broker.append(topic, key, value, partition=0)

    def outputs(self, role: str) -> list[bytes]:
        assert self.current is not None
        stats = self.current.stats
        return list(stats.recent_decisions if role == "decisions" else stats.dead_letters)


HARNESSES: dict[str, Callable[[], Harness]] = {"memory": MemoryHarness, "embedded": EmbeddedHarness}


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("kind", sorted(HARNESSES))
def test_transport_contract(kind: str, check: Callable[[Harness], None]) -> None:
    check(HARNESSES[kind]())
