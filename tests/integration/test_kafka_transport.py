"""KafkaTransport against a real Kafka 4.x broker (started by conftest.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from streamlearn.errors import TransportError
from streamlearn.stream.kafka import KafkaTransport, ensure_topics
from streamlearn.stream.transport import Message, Transport, partition_for_key

pytestmark = pytest.mark.integration

PARTITIONS = 3

Factory = Callable[..., KafkaTransport]


@pytest.fixture
def topics(kafka_bootstrap: str) -> dict[str, str]:
    """Fresh topic names for one test, created with PARTITIONS partitions."""
    run = uuid.uuid4().hex[:8]
    names = {
        "instances_topic": f"instances-{run}",
        "feedback_topic": f"feedback-{run}",
        "decisions_topic": f"decisions-{run}",
        "dead_letter_topic": f"dead-letter-{run}",
    }
    counts = ensure_topics(kafka_bootstrap, names.values(), PARTITIONS)
    assert counts == dict.fromkeys(names.values(), PARTITIONS)
    return names


@pytest.fixture
def make_transport(kafka_bootstrap: str, topics: dict[str, str]) -> Iterator[Factory]:
    opened: list[KafkaTransport] = []

    def make(group_id: str = "g", **kwargs: Any) -> KafkaTransport:
        transport = open_transport(kafka_bootstrap, topics, group_id, **kwargs)
        opened.append(transport)
        return transport

    yield make
    for transport in opened:
        transport.close()


def open_transport(bootstrap: str, topics: dict[str, str], group_id: str, **kwargs: Any) -> KafkaTransport:
    return KafkaTransport(
        bootstrap,
        topics["instances_topic"],
        topics["feedback_topic"],
        topics["decisions_topic"],
        topics["dead_letter_topic"],
        group_id=group_id,
        **kwargs,
    )


def values(messages: list[Message]) -> list[bytes]:
    return sorted(m.value for m in messages if m.value is not None)


def poll_until(transport: KafkaTransport, count: int, timeout_s: float = 30.0) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got.extend(transport.poll(500, 0.5))
    return got


def produce_keyed(transport: KafkaTransport, topic: str, values: range, prefix: str) -> None:
    for i in values:
        transport.produce(topic, f"event-{i}".encode(), f"{prefix}{i}".encode())
    transport.flush(30.0)


def test_round_trip_on_both_topics_is_co_partitioned(make_transport: Factory) -> None:
    t = make_transport()
    assert isinstance(t, Transport)
    produce_keyed(t, t.instances_topic, range(40), "x")
    produce_keyed(t, t.feedback_topic, range(40), "r")
    got = poll_until(t, 80)
    assert len(got) == 80
    assert values([m for m in got if m.topic == t.instances_topic]) == sorted(
        f"x{i}".encode() for i in range(40)
    )
    partition_of: dict[tuple[str, bytes | None], int] = {(m.topic, m.key): m.partition for m in got}
    for i in range(40):
        key = f"event-{i}".encode()
        expected = partition_for_key(key, PARTITIONS)
        assert partition_of[(t.instances_topic, key)] == expected
        assert partition_of[(t.feedback_topic, key)] == expected
    for tp in t.assignment():
        offsets = [m.offset for m in got if (m.topic, m.partition) == tp]
        assert offsets == sorted(offsets) == list(range(len(offsets)))
    assert sum(t.end_offsets().values()) == 80
    assert t.poll(10, 0.2) == []


def test_new_transport_resumes_at_committed_offsets(make_transport: Factory) -> None:
    first = make_transport(group_id="resume")
    produce_keyed(first, first.instances_topic, range(30), "x")
    got = poll_until(first, 30)
    assert len(got) == 30
    commit = {(m.topic, m.partition): m.offset + 1 for m in got if m.offset < 3}
    first.commit(commit)
    first.close()

    second = make_transport(group_id="resume")
    assert second.committed() == commit
    rest = poll_until(second, 30 - sum(commit.values()))
    assert values(rest) == values([m for m in got if m.offset >= commit[(m.topic, m.partition)]])
    assert second.poll(10, 0.2) == []

    fresh = make_transport(group_id="never-committed")
    assert fresh.committed() == {}
    assert len(poll_until(fresh, 30)) == 30


def test_seek_right_after_construction_and_after_reading(make_transport: Factory) -> None:
    writer = make_transport(group_id="seek-writer")
    produce_keyed(writer, writer.instances_topic, range(30), "x")
    writer.commit({tp: 0 for tp in writer.assignment()})

    reader = make_transport(group_id="seek-writer")
    ends = reader.end_offsets()
    start = {tp: min(2, end) for tp, end in ends.items()}
    reader.seek(start)  # before any poll: restore-from-checkpoint path
    first = poll_until(reader, 30 - sum(start.values()))
    assert {(m.topic, m.partition, m.offset) for m in first} == {
        (tp[0], tp[1], off) for tp, end in ends.items() for off in range(start[tp], end)
    }
    reader.seek({tp: 0 for tp in reader.assignment()})
    again = poll_until(reader, 30)
    assert values(again) == sorted(f"x{i}".encode() for i in range(30))
    with pytest.raises(TransportError, match="not an assigned partition"):
        reader.seek({(reader.decisions_topic, 0): 0})


def test_producer_is_idempotent_and_options_cannot_weaken_it(
    kafka_bootstrap: str, topics: dict[str, str], make_transport: Factory
) -> None:
    t = make_transport()
    t.produce(t.decisions_topic, b"e1", b"d1")
    t.flush(30.0)
    assert t.producer_id >= 0  # only idempotent producers get an id from the broker
    with pytest.raises(TransportError, match="enable_idempotence"):
        open_transport(kafka_bootstrap, topics, "g", client_options={"enable_idempotence": False})


def test_unknown_topic_is_a_clear_error(kafka_bootstrap: str) -> None:
    with pytest.raises(TransportError, match="not found"):
        KafkaTransport(
            kafka_bootstrap,
            "no-such-instances",
            "no-such-feedback",
            "d",
            "dl",
            group_id="g",
            client_options={"allow_auto_create_topics": False},
            request_timeout_s=2.0,
        )


def test_broker_outage_loses_nothing(make_transport: Factory, kafka_control: Any) -> None:
    t = make_transport(group_id="outage")
    produce_keyed(t, t.instances_topic, range(50), "x")
    got = poll_until(t, 50)
    assert len(got) == 50

    kafka_control.stop()
    assert not kafka_control.running()
    outage_started = time.monotonic()
    for i in range(50, 100):  # produced while the broker is down: kept, not lost
        t.produce(t.instances_topic, f"event-{i}".encode(), f"x{i}".encode())
    with pytest.raises(TransportError, match="not acknowledged"):
        t.flush(1.0)
    polled_during_outage: list[Message] = []
    while time.monotonic() - outage_started < 10.0:
        polled_during_outage.extend(t.poll(100, 0.5))  # must neither raise nor return junk
    assert polled_during_outage == []

    kafka_control.start()  # same port and log dir

    t.flush(60.0)
    got.extend(poll_until(t, 50, timeout_s=60.0))
    assert values(got) == sorted(f"x{i}".encode() for i in range(100))
    assert sum(t.end_offsets().values()) == 100  # the retries wrote no duplicates
    t.commit({(m.topic, m.partition): m.offset + 1 for m in got})
    assert sum(t.committed().values()) == 100


def test_prometheus_fixture_scrapes_a_target(prometheus: Any) -> None:
    from prometheus_client import CollectorRegistry, Counter, start_http_server

    registry = CollectorRegistry()
    Counter("streamlearn_fixture_check", "conftest self-check", registry=registry).inc(3)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        prom = prometheus(f"127.0.0.1:{server.server_port}")
        result = prom.wait_for("streamlearn_fixture_check_total")
        assert float(result[0]["value"][1]) == 3.0
    finally:
        server.shutdown()
        thread.join(timeout=5)
