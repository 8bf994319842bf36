"""InMemoryTransport: Kafka's offset semantics without a broker."""

from __future__ import annotations

import threading
import time

import pytest

from streamlearn.errors import TransportError
from streamlearn.stream.kafka import _split_options
from streamlearn.stream.memory import InMemoryBroker, InMemoryTransport
from streamlearn.stream.transport import Transport, partition_for_key


def drain(transport: InMemoryTransport, max_records: int = 1000) -> list:
    out = []
    while batch := transport.poll(max_records, 0.0):
        out.extend(batch)
    return out


def test_implements_the_protocol() -> None:
    assert isinstance(InMemoryTransport(), Transport)


@pytest.mark.parametrize(
    ("key", "java_murmur2"),
    [  # org.apache.kafka.common.utils.Utils.murmur2 values from Kafka's UtilsTest
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_partition_for_key_matches_the_java_client(key: bytes, java_murmur2: int) -> None:
    for n in (1, 3, 8, 13):
        assert partition_for_key(key, n) == (java_murmur2 & 0x7FFFFFFF) % n


def test_same_key_lands_in_the_same_partition_of_both_topics() -> None:
    t = InMemoryTransport(partitions=4)
    for i in range(40):
        key = f"event-{i}".encode()
        a = t.append_instance(key, b"x")
        b = t.append_feedback(key, b"r")
        assert a.partition == b.partition


def test_poll_returns_each_partition_in_offset_order_and_respects_max_records() -> None:
    t = InMemoryTransport(partitions=3)
    for i in range(30):
        t.append_instance(f"k{i}".encode(), str(i).encode())
        t.append_feedback(f"k{i}".encode(), str(i).encode())
    first = t.poll(7, 0.0)
    assert len(first) == 7
    seen = first + drain(t, 5)
    assert len(seen) == 60
    assert len({(m.topic, m.partition, m.offset) for m in seen}) == 60
    for tp in t.assignment():
        offsets = [m.offset for m in seen if (m.topic, m.partition) == tp]
        assert offsets == list(range(len(offsets)))
    assert t.poll(10, 0.0) == []


def test_poll_waits_for_a_concurrent_append() -> None:
    t = InMemoryTransport()
    timer = threading.Timer(0.05, t.append_instance, args=(b"k", b"late"))
    start = time.monotonic()
    timer.start()
    got = t.poll(10, 5.0)
    timer.join()
    assert [m.value for m in got] == [b"late"]
    assert time.monotonic() - start < 2.0


def test_poll_returns_empty_after_the_timeout() -> None:
    t = InMemoryTransport()
    start = time.monotonic()
    assert t.poll(10, 0.05) == []
    assert time.monotonic() - start >= 0.04


def test_a_new_transport_resumes_at_the_committed_offsets() -> None:
    broker = InMemoryBroker(default_partitions=2)
    first = InMemoryTransport(broker=broker, partitions=2, group_id="g")
    for i in range(10):
        first.append_instance(f"k{i}".encode(), str(i).encode())
    read = drain(first)
    half = {}
    for m in read:
        tp = (m.topic, m.partition)
        if m.offset < 2:
            half[tp] = m.offset + 1
    first.commit(half)
    first.close()

    second = InMemoryTransport(broker=broker, partitions=2, group_id="g")
    assert second.committed() == half
    again = drain(second)
    assert {(m.topic, m.partition, m.offset) for m in again} == {
        (m.topic, m.partition, m.offset) for m in read if m.offset >= half[(m.topic, m.partition)]
    }
    other_group = InMemoryTransport(broker=broker, partitions=2, group_id="other")
    assert len(drain(other_group)) == 10


def test_seek_rereads_and_skips() -> None:
    t = InMemoryTransport()
    for i in range(5):
        t.append_instance(b"k", str(i).encode())
    assert len(drain(t)) == 5
    t.seek({("instances", 0): 1})
    assert [m.value for m in drain(t)] == [b"1", b"2", b"3", b"4"]
    t.seek({("instances", 0): 4})
    assert [m.offset for m in drain(t)] == [4]
    t.seek({("instances", 0): 7})  # past the end: waits until the log reaches it
    for i in range(5, 8):
        t.append_instance(b"k", str(i).encode())
    assert [m.offset for m in drain(t)] == [7]


@pytest.mark.parametrize(
    "offsets",
    [{("decisions", 0): 1}, {("instances", 1): 0}, {("instances", 0): -1}, {("instances", 0): 1.5}],
)
def test_commit_and_seek_reject_unassigned_partitions_and_bad_offsets(offsets: dict) -> None:
    t = InMemoryTransport()
    with pytest.raises(TransportError, match="cannot commit"):
        t.commit(offsets)
    with pytest.raises(TransportError, match="cannot seek"):
        t.seek(offsets)


def test_end_offsets_count_messages_per_partition() -> None:
    t = InMemoryTransport(partitions=2)
    messages = [t.append_instance(f"k{i}".encode(), b"x") for i in range(9)]
    ends = t.end_offsets()
    assert set(ends) == t.assignment()
    for p in (0, 1):
        assert ends[("instances", p)] == sum(m.partition == p for m in messages)
        assert ends[("feedback", p)] == 0


def test_produce_writes_to_any_topic() -> None:
    t = InMemoryTransport()
    t.produce(t.decisions_topic, b"e1", b"d1")
    t.produce(t.dead_letter_topic, None, b"bad")
    t.flush(1.0)
    assert [m.value for m in t.broker.messages("decisions")] == [b"d1"]
    assert [m.value for m in t.broker.messages("dead-letter")] == [b"bad"]
    assert drain(t) == []  # outputs are not inputs


def test_closed_transport_raises() -> None:
    t = InMemoryTransport()
    t.close()
    t.close()
    with pytest.raises(TransportError, match="closed"):
        t.poll(1, 0.0)


def test_input_topics_must_be_co_partitioned() -> None:
    broker = InMemoryBroker()
    broker.create_topic("instances", 3)
    broker.create_topic("feedback", 2)
    with pytest.raises(TransportError, match="co-partitioned"):
        InMemoryTransport(broker=broker)


def test_client_options_are_routed_and_guarded() -> None:
    consumer, producer = _split_options(
        {"security_protocol": "SASL_SSL", "fetch_max_wait_ms": 100, "linger_ms": 20}
    )
    assert consumer == {"security_protocol": "SASL_SSL", "fetch_max_wait_ms": 100}
    assert producer == {"security_protocol": "SASL_SSL", "linger_ms": 20}
    with pytest.raises(TransportError, match="enable_auto_commit"):
        _split_options({"enable_auto_commit": True})
    with pytest.raises(TransportError, match="unknown"):
        _split_options({"sasl_plain_usernme": "typo"})
