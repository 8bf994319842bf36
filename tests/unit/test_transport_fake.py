"""InMemoryTransport specifics (the shared contract is tests/transport_contract.py)."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.errors import TransportError
from streamlearn.transport.kafka import _split_options
from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport
from streamlearn.transport.protocol import (
    VECTOR_HASH_MIN_KEYS,
    Transport,
    partition_for_key,
    partitions_for_keys,
)


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
        many = [key] * VECTOR_HASH_MIN_KEYS  # hashed at once
        assert partitions_for_keys(many, n).tolist() == [(java_murmur2 & 0x7FFFFFFF) % n] * len(many)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.binary(max_size=40), max_size=3 * VECTOR_HASH_MIN_KEYS),
       same_length=st.integers(0, 12), repeats=st.integers(0, 2 * VECTOR_HASH_MIN_KEYS),
       n=st.integers(1, 64))
def test_partitions_of_a_batch_are_each_keys_partition(keys: list[bytes], same_length: int,
                                                       repeats: int, n: int) -> None:
    """Vectorised over the keys of one length (when there are enough of them) or one by one:
    always :func:`partition_for_key` of each key, in order."""
    keys = keys + [bytes([i % 256]) * same_length for i in range(repeats)]
    assert partitions_for_keys(keys, n).tolist() == [partition_for_key(k, n) for k in keys]


def test_same_key_lands_in_the_same_partition_of_both_topics() -> None:
    t = InMemoryTransport(partitions=4)
    for i in range(40):
        key = f"event-{i}".encode()
        a = t.append_instance(key, b"x")
        b = t.append_feedback(key, b"r")
        assert a.partition == b.partition


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
