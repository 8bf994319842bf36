"""The Kafka transports against a real Kafka 4.x broker (started by conftest.py): every test
taking ``make_transport`` runs on kafka-python's KafkaTransport and on librdkafka's
ConfluentTransport (``kafka.client``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from transport_contract import CHECKS

from streamlearn.errors import TransportError
from streamlearn.transport.confluent import ConfluentTransport
from streamlearn.transport.kafka import FETCH_MAX_WAIT_MS, KafkaTransport, ensure_topics
from streamlearn.transport.kafka_clients import CLIENTS, shared_clients_class, transport_class
from streamlearn.transport.protocol import (
    VECTOR_HASH_MIN_KEYS,
    Message,
    Transport,
    partition_for_key,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3

Factory = Callable[..., KafkaTransport | ConfluentTransport]


@pytest.fixture(params=list(CLIENTS))
def client(request: pytest.FixtureRequest) -> str:
    """The client library under test (``kafka.client``)."""
    if request.param == "confluent":
        pytest.importorskip("confluent_kafka")
    return str(request.param)


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
def make_transport(kafka_bootstrap: str, topics: dict[str, str], client: str) -> Iterator[Factory]:
    opened: list[KafkaTransport | ConfluentTransport] = []

    def make(group_id: str = "g", **kwargs: Any) -> KafkaTransport | ConfluentTransport:
        transport = open_transport(kafka_bootstrap, topics, group_id, client=client, **kwargs)
        opened.append(transport)
        return transport

    yield make
    for transport in opened:
        transport.close()


@pytest.fixture
def make_shared_transport(kafka_bootstrap: str, topics: dict[str, str],
                          client: str) -> Iterator[Factory]:
    """Transports over one set of shared clients per group (as a replica's partition daemons)."""
    clients: dict[str, Any] = {}
    opened: list[KafkaTransport | ConfluentTransport] = []

    def make(group_id: str = "g", **kwargs: Any) -> KafkaTransport | ConfluentTransport:
        if group_id not in clients:
            clients[group_id] = shared_clients_class(client)(kafka_bootstrap, group_id)
        transport = open_transport(kafka_bootstrap, topics, group_id, client=client,
                                   shared=clients[group_id], **kwargs)
        opened.append(transport)
        return transport

    yield make
    for transport in opened:
        transport.close()
    for shared in clients.values():
        shared.close()


class KafkaHarness:
    """The contract's harness on a real broker: fresh topics, input written by kafka-python."""

    partitions, shares_cluster = PARTITIONS, True

    def __init__(self, bootstrap: str, topics: dict[str, str], make: Factory) -> None:
        from kafka import KafkaProducer

        self.bootstrap, self.topics, self.make = bootstrap, topics, make
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)

    def transport(self, group: str) -> Transport:
        return self.make(group_id=group)

    def write(self, role: str, key: bytes, value: bytes) -> None:
        self.producer.send(self.topics[f"{role}_topic"], key=key, value=value)
        self.producer.flush()

    def outputs(self, role: str) -> list[bytes]:
        from daemon_harness import read_all

        return [r.value for r in sorted(read_all(self.bootstrap, self.topics[f"{role}_topic"]),
                                        key=lambda r: (r.partition, r.offset))]


@pytest.mark.parametrize("clients", ["own", "shared"])
@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_transport_contract(check: Callable[[Any], None], clients: str, kafka_bootstrap: str,
                            topics: dict[str, str], make_transport: Factory,
                            make_shared_transport: Factory) -> None:
    """Every check on a transport with its own clients, and on one over shared clients."""
    harness = KafkaHarness(kafka_bootstrap, topics,
                           make_transport if clients == "own" else make_shared_transport)
    try:
        check(harness)
    finally:
        harness.producer.close()


def open_transport(bootstrap: str, topics: dict[str, str], group_id: str,
                   client: str = "kafka-python", **kwargs: Any) -> Any:
    return transport_class(client)(
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


def poll_until(transport: Transport, count: int, timeout_s: float = 30.0) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got.extend(transport.poll(500, 0.5))
    return got


def produce_keyed(transport: Transport, topic: str, values: range, prefix: str) -> None:
    for i in values:
        transport.produce(topic, f"event-{i}".encode(), f"{prefix}{i}".encode())
    transport.flush(30.0)


@pytest.mark.parametrize("client", ["kafka-python"])
def test_producer_is_idempotent_and_options_cannot_weaken_it(
    kafka_bootstrap: str, topics: dict[str, str], make_transport: Factory
) -> None:
    t = make_transport()
    t.produce(t.decisions_topic, b"e1", b"d1")
    t.flush(30.0)
    assert t.producer_id >= 0  # only idempotent producers get an id from the broker
    with pytest.raises(TransportError, match="enable_idempotence"):
        open_transport(kafka_bootstrap, topics, "g", client_options={"enable_idempotence": False})


@pytest.mark.parametrize("client", ["kafka-python"])
def test_consumer_does_not_hold_a_fetch_for_the_idle_topic_long(make_transport: Factory) -> None:
    """kafka-python keeps one fetch in flight per broker, without the partitions whose records
    are still buffered: at its default 500 ms wait, an idle feedback topic's fetch held up the
    next instances under a backlog (docs/performance.md, the broker's bimodal relay rate)."""
    t = make_transport()
    assert t._consumer.config["fetch_max_wait_ms"] == FETCH_MAX_WAIT_MS <= 100


def test_unknown_topic_is_a_clear_error(kafka_bootstrap: str, client: str) -> None:
    options = ({"allow_auto_create_topics": False} if client == "kafka-python"
               else {"allow.auto.create.topics": False})
    with pytest.raises(TransportError, match="not found"):
        transport_class(client)(
            kafka_bootstrap,
            "no-such-instances",
            "no-such-feedback",
            "d",
            "dl",
            group_id="g",
            client_options=options,
            request_timeout_s=2.0,
        )


def ends_once_readable(t: Any, timeout_s: float = 30.0) -> dict[tuple[str, int], int]:
    """The end offsets, asked again while they cannot be read: a new admin client's first
    answer (right after a broker restart, or the first one at all) took more than the 3 s of
    one call on a loaded CI machine (the daemon's lag tracker asks again likewise)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ends: dict[tuple[str, int], int] = t.end_offsets()
            return ends
        except TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


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
    assert sum(ends_once_readable(t).values()) == 100  # the retries wrote no duplicates
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


def test_transports_sharing_clients_read_only_their_partitions(
        make_shared_transport: Factory, kafka_bootstrap: str, topics: dict[str, str]) -> None:
    """Two partition transports over one consumer (a replica serving partitions 0 and 1): each
    reads exactly its partition's records in offset order, a seek of one does not move the
    other, and once one closes the other still reads its own partition from a seek."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for p in range(PARTITIONS):
        for i in range(40):
            producer.send(topics["instances_topic"], value=f"{p}:{i}".encode(), partition=p)
    producer.flush()
    producer.close()
    first = make_shared_transport(group_id="replica", partitions=[0])
    second = make_shared_transport(group_id="replica", partitions=[1])
    with pytest.raises(TransportError, match="read by another transport"):
        make_shared_transport(group_id="replica", partitions=[1])

    def read(transport: Transport, count: int) -> list[bytes]:
        got = [m.value or b"" for m in poll_until(transport, count, timeout_s=30.0)]
        assert {m.split(b":")[0] for m in got} <= {str(transport_partition(transport)).encode()}
        return got

    assert read(first, 40) == [f"0:{i}".encode() for i in range(40)]
    second.seek({(topics["instances_topic"], 1): 30})
    assert read(second, 10) == [f"1:{i}".encode() for i in range(30, 40)]
    first.seek({(topics["instances_topic"], 0): 38})
    assert read(first, 2) == [b"0:38", b"0:39"]
    first.close()
    second.seek({(topics["instances_topic"], 1): 0})
    assert read(second, 40) == [f"1:{i}".encode() for i in range(40)]


def transport_partition(transport: Transport) -> int:
    (p,) = {p for _, p in transport.assignment()}
    return p


def test_poll_returns_as_soon_as_input_is_there(make_transport: Factory) -> None:
    """A poll with a long timeout returns the first records when they arrive, not when
    ``max_records`` are there or the timeout is over (librdkafka's ``consume`` alone would
    wait for either)."""
    t = make_transport(group_id="prompt")
    assert poll_until(t, 0) == []  # assigned; nothing written yet
    produce_keyed(t, t.instances_topic, range(3), "p")
    started = time.monotonic()
    got: list[Message] = []
    while len(got) < 3 and time.monotonic() - started < 20.0:
        got.extend(t.poll(500, 5.0))
    assert len(got) == 3
    assert time.monotonic() - started < 4.0


def test_a_batch_of_keyed_messages_lands_on_each_keys_partition(
        make_transport: Factory, kafka_bootstrap: str) -> None:
    """``produce_many`` of small and large batches (kafka-python: the partitions of a large
    one hashed at once by the transport) puts each message on Kafka's murmur2 partition of
    its key, as the Java client would, with keys of several lengths."""
    from daemon_harness import read_all

    t = make_transport(group_id="keys")
    keys = [f"{uuid.uuid4()}"[:n].encode()  # enough of each length to be hashed at once
            for n in (*range(1, 10), 36) for _ in range(2 * VECTOR_HASH_MIN_KEYS)]
    for batch in (keys[:VECTOR_HASH_MIN_KEYS - 1], keys):
        t.produce_many(t.decisions_topic, batch, [b"v"] * len(batch))
    t.flush(30.0)
    records = read_all(kafka_bootstrap, t.decisions_topic)
    assert len(records) == VECTOR_HASH_MIN_KEYS - 1 + len(keys)
    assert [(r.key, r.partition) for r in records if r.partition
            != partition_for_key(r.key, PARTITIONS)] == []


@pytest.mark.parametrize("client", ["confluent"])
def test_confluent_options_cannot_weaken_the_producer_or_commit_for_us(
        kafka_bootstrap: str, topics: dict[str, str], client: str) -> None:
    for option in ({"enable.idempotence": False}, {"enable.auto.commit": True},
                   {"acks": "1"}, {"message.timeout.ms": 1000}):
        with pytest.raises(TransportError, match="may not set"):
            open_transport(kafka_bootstrap, topics, "g", client=client, client_options=option)
    with pytest.raises(TransportError, match="unknown client option"):
        open_transport(kafka_bootstrap, topics, "g", client=client,
                       client_options={"fetch_max_wait_ms": 5})


@pytest.mark.parametrize("client", ["kafka-python"])
def test_the_latency_settings_reach_the_clients(make_transport: Factory) -> None:
    """kafka.linger_seconds, fetch_wait_seconds and fetch_min_bytes (ClientTuning)."""
    from streamlearn.transport.protocol import ClientTuning

    t = make_transport(tuning=ClientTuning(linger_s=0.002, fetch_wait_s=0.01, fetch_min_bytes=512))
    assert t._consumer.config["fetch_max_wait_ms"] == 10
    assert t._consumer.config["fetch_min_bytes"] == 512
    assert t._producer.config["linger_ms"] == 2


def test_end_offsets_do_not_wait_behind_a_fetch_in_flight(make_transport: Factory) -> None:
    """The broker answers one connection's requests in order, so a ListOffsets sent on the
    consumer's connection waits for the fetch the broker is holding there (up to
    ``fetch_wait_seconds``). The lag tracker asks once a second from the serving loop: on
    librdkafka, asking each partition on the consumer held the loop up to 4 × 50 ms and a
    decision at 50 events/s up to 83 ms (docs/performance.md). Here a fetch waits up to
    1.5 s: end offsets must come without it (the old way took ≥ 1.5 s per partition asked)."""
    from streamlearn.transport.protocol import ClientTuning

    t = make_transport(group_id="ends", tuning=ClientTuning(fetch_wait_s=1.5))
    produce_keyed(t, t.instances_topic, range(6), "e")
    t.flush(10.0)
    got: list[Message] = []
    started = time.monotonic()
    while len(got) < 6 and time.monotonic() - started < 20.0:
        got.extend(t.poll(500, 0.5))
    assert len(got) == 6
    # the first call opens the admin client's connection: not timed, and asked again while
    # it cannot be read (a fresh client's first answer took over 3 s on a loaded CI machine)
    assert ends_once_readable(t)
    t.poll(500, 0.3)  # caught up and idle: the consumer's next fetch is held at the broker
    timings = []
    for _ in range(3):
        began = time.monotonic()
        ends = t.end_offsets()
        timings.append(time.monotonic() - began)
        assert sum(ends[(t.instances_topic, p)] for p in range(PARTITIONS)) == 6
        t.poll(500, 0.2)
    assert max(timings) < 1.0, timings
