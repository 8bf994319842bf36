"""Choosing the Kafka client library (``kafka.client``) and its latency settings."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest

from streamlearn.config import load_config
from streamlearn.errors import ConfigError, TransportError
from streamlearn.transport import kafka_clients
from streamlearn.transport.confluent import ConfluentTransport, SharedConfluentClients, librdkafka_options
from streamlearn.transport.kafka import FETCH_MAX_WAIT_MS, KafkaTransport
from streamlearn.transport.kafka_shared import SharedKafkaClients
from streamlearn.transport.protocol import ClientTuning


def test_the_client_and_its_settings_come_from_file_env_and_flags() -> None:
    cfg = load_config(environ={"STREAMLEARN_KAFKA_CLIENT": "confluent",
                               "STREAMLEARN_KAFKA_LINGER_SECONDS": "0.002"},
                      cli={"kafka.fetch_min_bytes": "4096"})
    assert cfg.kafka.client == "confluent"
    assert cfg.kafka.tuning() == ClientTuning(linger_s=0.002, fetch_wait_s=0.05,
                                              fetch_min_bytes=4096)
    with pytest.raises(ConfigError, match=r"kafka\.client"):
        load_config(environ={"STREAMLEARN_KAFKA_CLIENT": "librdkafka"})


def _pretend_confluent_installed(monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    """``importlib.util.find_spec`` finds confluent-kafka, or not, whatever is installed."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        if name == "confluent_kafka":
            return real("orjson") if installed else None  # any spec stands for "installed"
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("installed", [True, False])
def test_the_default_client_is_librdkafka_when_it_is_installed(
        monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    """``kafka.client = auto`` (the default) is settled when the configuration is built: the
    transport, the group membership and the models link all see the library itself."""
    _pretend_confluent_installed(monkeypatch, installed)
    expected = "confluent" if installed else "kafka-python"
    assert load_config(environ={}).kafka.client == expected
    assert load_config(cli={"kafka.client": "auto"}).kafka.client == expected
    assert load_config(environ={"STREAMLEARN_KAFKA_CLIENT": "kafka-python"}).kafka.client == \
        "kafka-python"  # a client asked for is kept
    # serve's first line names the library, and says why when none was asked for
    from streamlearn.commands.serve import _client_note

    library = "librdkafka" if installed else "kafka-python"
    assert _client_note(load_config(environ={})) == (
        f" via {library}, the default: confluent-kafka is {'' if installed else 'not '}installed")
    assert _client_note(load_config(cli={"kafka.client": "auto"})) == _client_note(
        load_config(environ={}))  # auto asked for by name: still says why
    assert _client_note(load_config(environ={"STREAMLEARN_KAFKA_CLIENT": "kafka-python"})) == \
        " via kafka-python"


def test_default_tuning_is_the_one_kafka_python_had() -> None:
    """The defaults keep kafka-python's clients exactly as they were configured before the
    settings existed (5 ms linger, 50 ms fetch wait, answer fetches at once); the linger
    left unset is each client's own (librdkafka's 1 ms: docs/kafka.md)."""
    from streamlearn.transport import confluent, kafka

    assert ClientTuning() == ClientTuning(None, 0.05, 1)
    assert load_config(environ={}).kafka.tuning() == ClientTuning()
    assert FETCH_MAX_WAIT_MS == 50
    assert (kafka.LINGER_S, confluent.LINGER_S) == (0.005, 0.001)


@pytest.mark.parametrize(("linger_s", "linger_ms"), [(None, 1.0), (0.004, 4.0), (0.0, 0.0)])
def test_the_librdkafka_producer_lingers_as_set_else_1_ms(
        monkeypatch: pytest.MonkeyPatch, linger_s: float | None, linger_ms: float) -> None:
    pytest.importorskip("confluent_kafka")
    import confluent_kafka

    from streamlearn.transport import confluent

    made: dict[str, dict[str, Any]] = {}

    def client(kind: str) -> Any:
        def make(config: dict[str, Any]) -> str:
            made[kind] = config
            return kind
        return make

    monkeypatch.setattr(confluent, "check_reachable", lambda servers: True)
    monkeypatch.setattr(confluent_kafka, "Consumer", client("consumer"))
    monkeypatch.setattr(confluent_kafka, "Producer", client("producer"))
    assert confluent.open_confluent_clients(
        "127.0.0.1:9", "g", tuning=ClientTuning(linger_s=linger_s)) == ("consumer", "producer")
    assert made["producer"]["linger.ms"] == linger_ms


def test_each_client_names_its_transport_and_shared_clients() -> None:
    assert kafka_clients.transport_class("kafka-python") is KafkaTransport
    assert kafka_clients.shared_clients_class("kafka-python") is SharedKafkaClients
    if importlib.util.find_spec("confluent_kafka") is not None:
        assert kafka_clients.transport_class("confluent") is ConfluentTransport
        assert kafka_clients.shared_clients_class("confluent") is SharedConfluentClients


def test_confluent_without_its_package_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend_confluent_installed(monkeypatch, False)
    with pytest.raises(ConfigError, match=r"pip install 'streamlearn\[confluent\]'"):
        kafka_clients.transport_class("confluent")


def test_a_broken_confluent_install_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found but failing to import (e.g. a wheel for another platform), it is a ConfigError
    saying what failed and what to do, not an ImportError traceback from the transport."""
    import importlib

    _pretend_confluent_installed(monkeypatch, True)
    real = importlib.import_module

    def import_module(name: str, *args: Any) -> Any:
        if name == "confluent_kafka":
            raise ImportError("librdkafka.so.1: cannot open shared object file")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", import_module)
    with pytest.raises(ConfigError, match=r"could not import confluent_kafka: librdkafka\.so\.1"
                       r".*kafka\.client = kafka-python"):
        kafka_clients.transport_class(load_config(environ={}).kafka.client)


def test_security_options_are_translated_for_librdkafka() -> None:
    options = load_config(environ={"STREAMLEARN_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                                   "STREAMLEARN_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                                   "STREAMLEARN_KAFKA_SASL_USERNAME": "u",
                                   "STREAMLEARN_KAFKA_SASL_PASSWORD": "p"}).kafka.client_options()
    assert librdkafka_options(options) == {"security.protocol": "SASL_SSL",
                                           "sasl.mechanism": "SCRAM-SHA-512",
                                           "sasl.username": "u", "sasl.password": "p"}
    assert librdkafka_options({"socket.keepalive.enable": True}) == {
        "socket.keepalive.enable": "True"}


@pytest.mark.parametrize("option", ["enable.idempotence", "acks", "message.timeout.ms",
                                    "enable.auto.commit", "group.id", "partitioner"])
def test_librdkafka_options_cannot_weaken_the_guarantees(option: str) -> None:
    with pytest.raises(TransportError, match="may not set"):
        librdkafka_options({option: "x"})


def test_an_unknown_kafka_python_name_is_refused_for_librdkafka() -> None:
    with pytest.raises(TransportError, match="unknown client option 'fetch_max_wait_ms'"):
        librdkafka_options({"fetch_max_wait_ms": 5})


class _FlakyWatermarks:
    """A consumer whose watermark query fails ``failures`` times with ``code`` first."""

    def __init__(self, code: int, failures: int) -> None:
        self.code, self.failures, self.calls = code, failures, 0

    def get_watermark_offsets(self, tp: object, timeout: float, cached: bool) -> tuple[int, int]:
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code))
        return 0, 42


class _FlakyListOffsets:
    """An admin client whose ListOffsets answers fail ``failures`` times with ``code`` first
    (per partition, as librdkafka reports them: in each partition's future)."""

    def __init__(self, code: int, failures: int) -> None:
        self.code, self.failures, self.calls = code, failures, 0

    def list_offsets(self, specs: dict[Any, Any], request_timeout: float) -> dict[Any, Any]:
        from concurrent.futures import Future
        from types import SimpleNamespace

        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        answers: dict[Any, Any] = {}
        for tp in specs:
            answer: Future[Any] = Future()
            if self.calls <= self.failures:
                answer.set_exception(KafkaException(KafkaError(self.code)))
            else:
                answer.set_result(SimpleNamespace(offset=42))
            answers[tp] = answer
        return answers


def _transport_over(admin: Any = None, timeout_s: float = 5.0, consumer: Any = None,
                    ) -> ConfluentTransport:
    from confluent_kafka import TopicPartition

    transport = object.__new__(ConfluentTransport)
    transport._closed = False
    transport._admin, transport._consumer = admin, consumer
    transport._tp = {("t", 0): TopicPartition("t", 0)}
    transport._offsets_timeout_s = timeout_s
    return transport


def test_end_offsets_ask_again_while_a_restarted_broker_settles_its_leaders() -> None:
    """Seen in CI right after a broker restart: "Not leader for partition" for a moment."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError

    for code in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE):
        admin = _FlakyListOffsets(code, failures=3)
        assert _transport_over(admin).end_offsets() == {("t", 0): 42}
        assert admin.calls == 4


def test_the_models_link_asks_again_while_a_new_models_topic_elects_its_leader() -> None:
    """Seen in CI: a replica started with a models topic created a moment before stopped with
    "Failed to get watermark offsets: Broker: Not leader for partition". Its librdkafka link
    now reads the log start (and end offsets) as the transport does: asked again while the
    leader settles, a lasting error raised at once."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError, KafkaException

    from streamlearn.sync.link_clients import ConfluentLinkClients

    class Consumer(_FlakyWatermarks):
        def __init__(self, code: int, failures: int) -> None:
            super().__init__(code, failures)
            self.assigned: list[object] = []

        def incremental_assign(self, partitions: list[object]) -> None:
            self.assigned.extend(partitions)

    def link(consumer: Consumer) -> ConfluentLinkClients:
        clients = object.__new__(ConfluentLinkClients)
        clients.consumer, clients.topic, clients._starts = consumer, "models", {}
        return clients

    settling = Consumer(KafkaError.NOT_LEADER_FOR_PARTITION, failures=3)
    clients = link(settling)
    clients.add(0, None)
    assert settling.calls == 4 and clients._starts == {0: 0} and len(settling.assigned) == 1
    assert clients.end_offsets() == {0: 42}
    lasting = Consumer(KafkaError.TOPIC_AUTHORIZATION_FAILED, failures=100)
    with pytest.raises(KafkaException):
        link(lasting).add(0, None)
    assert lasting.calls == 1


def test_end_offsets_fail_at_once_on_a_lasting_error_and_at_the_deadline_on_a_transient_one(
        ) -> None:
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError

    lasting = _FlakyListOffsets(KafkaError.TOPIC_AUTHORIZATION_FAILED, failures=100)
    with pytest.raises(TransportError, match="could not read end offsets"):
        _transport_over(lasting).end_offsets()
    assert lasting.calls == 1
    settling = _FlakyListOffsets(KafkaError.NOT_LEADER_FOR_PARTITION, failures=10**6)
    started = time.monotonic()
    with pytest.raises(TransportError, match="end offsets"):
        _transport_over(settling, timeout_s=0.5).end_offsets()
    assert time.monotonic() - started < 2.0


class _SettlingCoordinator:
    """A consumer whose first ``failures`` commits complete with ``code`` (its commit
    callback is served by its next consume, as librdkafka's is)."""

    def __init__(self, code: int, failures: int) -> None:
        self.code, self.failures = code, failures
        self.commits: list[list[Any]] = []
        self.unserved = 0
        self.transport: ConfluentTransport | None = None

    def commit(self, offsets: list[Any], asynchronous: bool) -> None:
        self.commits.append(offsets)
        self.unserved += 1

    def consume(self, n: int, timeout: float) -> list[Any]:
        from confluent_kafka import KafkaError

        assert self.transport is not None
        for _ in range(self.unserved):
            failed = len(self.commits) <= self.failures
            self.transport._commits.on_commit(KafkaError(self.code) if failed else None, [])
        self.unserved = 0
        return []

    def poll(self, timeout: float) -> None:
        return None


def _committing_transport(consumer: _SettlingCoordinator, timeout_s: float = 5.0,
                          ) -> ConfluentTransport:
    from streamlearn.transport.confluent import _Commits

    transport = _transport_over(timeout_s=timeout_s, consumer=consumer)
    transport._commits, transport._assigned = _Commits(), {("t", 0)}
    transport._shared, transport._read, transport.bootstrap_servers = None, [], "fake"
    consumer.transport = transport
    return transport


def test_a_waited_commit_is_made_again_while_a_restarted_broker_settles_its_coordinator(
        ) -> None:
    """Seen in CI right after a broker restart: "Not coordinator" for a moment."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError

    consumer = _SettlingCoordinator(KafkaError.NOT_COORDINATOR, failures=2)
    _committing_transport(consumer).commit({("t", 0): 7})
    assert len(consumer.commits) == 3
    lasting = _SettlingCoordinator(KafkaError.GROUP_AUTHORIZATION_FAILED, failures=100)
    with pytest.raises(TransportError, match=r"commit of .* failed"):
        _committing_transport(lasting).commit({("t", 0): 7})
    assert len(lasting.commits) == 1


def test_librdkafka_lines_of_one_kind_are_logged_once_per_window(
        caplog: pytest.LogCaptureFixture) -> None:
    """A broker away: each connection's failed reconnects (every 0.1-2 s, two lines each) were
    all logged, 661 lines in a 15 s outage. One line of each kind per window now, the next
    saying how many were left out."""
    from streamlearn.transport.confluent import RepeatLimit

    now = [0.0]
    logger = logging.getLogger("streamlearn.test.repeats")
    limit = RepeatLimit(window_s=30.0, clock=lambda: now[0])
    logger.addFilter(limit)
    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            for attempt in range(200):  # 20 s of refusals on two connections, 0.1 s apart
                now[0] = attempt * 0.1
                for broker in ("bootstrap", "1"):
                    logger.error("FAIL [thrd:127.0.0.1:29092/%s]: connect failed after %dms",
                                 broker, attempt % 7)
            now[0] = 31.0
            logger.error("FAIL [thrd:127.0.0.1:29092/1]: connect failed after 3ms")
            logger.error("a different line")
    finally:
        logger.removeFilter(limit)
    lines = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert lines == ["FAIL [thrd:127.0.0.1:29092/bootstrap]: connect failed after 0ms",
                     "FAIL [thrd:127.0.0.1:29092/1]: connect failed after 0ms",
                     "FAIL [thrd:127.0.0.1:29092/1]: connect failed after 3ms "
                     "(199 more like this in the last 30 s)",
                     "a different line"]


def test_the_merger_producers_fencing_lines_are_routine(caplog: pytest.LogCaptureFixture) -> None:
    """Every handover of the merger role logged librdkafka's ERROR ADDPARTS, CRITICAL TXNERR
    and CRITICAL FATAL lines (an outside test): being fenced by the next merger is planned.
    They are INFO lines now (not shown at the default WARNING); other lines keep their level."""
    from streamlearn.transport.confluent import MERGER_LOG

    fenced = "FATAL [thrd:main]: Fatal error: Broker: Producer attempted an operation with an " \
             "old epoch: Producer fenced by a newer instance"
    with caplog.at_level(logging.WARNING, logger=MERGER_LOG.name):
        MERGER_LOG.critical(fenced)
        MERGER_LOG.error('ADDPARTS [streamlearn-models-merger#producer-6]: Failed to add '
                         'partition "m" [0] to transaction: Broker: Producer attempted an '
                         'operation with an old epoch')
        MERGER_LOG.error("FAIL [thrd:127.0.0.1:1/bootstrap]: connect failed after 1ms")
    assert [(r.levelname, r.getMessage()[:4]) for r in caplog.records] == [("ERROR", "FAIL")]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=MERGER_LOG.name):
        MERGER_LOG.critical(fenced + " (again)")
    assert [r.levelname for r in caplog.records] == ["INFO"]


def _recording_clients(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """kafka-python's producer and consumer replaced by recorders of their settings."""
    import kafka

    made: list[tuple[str, dict[str, Any]]] = []

    class Recorder:
        kind = ""

        def __init__(self, **settings: Any) -> None:
            made.append((self.kind, settings))

        def __getattr__(self, name: str) -> Any:  # any call: nothing to do, empty partitions
            answers: dict[str, Any] = {"partitions_for_topic": {0, 1}, "partitions_for": {0, 1},
                                       "end_offsets": {}}
            return lambda *args, **kwargs: answers.get(name)

    class Producer(Recorder):
        kind, DEFAULT_CONFIG = "producer", kafka.KafkaProducer.DEFAULT_CONFIG

    class Consumer(Recorder):
        kind, DEFAULT_CONFIG = "consumer", kafka.KafkaConsumer.DEFAULT_CONFIG

    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    monkeypatch.setattr(kafka, "KafkaConsumer", Consumer)
    return made


def test_every_kafka_python_client_retries_the_broker_at_least_every_two_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-python doubles the wait between reconnects up to 30 s by default: after a broker
    outage of 30 s the replicas' changelog producers, group membership and models link
    each waited up to 25 s more before they noticed the broker was back."""
    from streamlearn.sync.link_clients import KafkaPythonLinkClients
    from streamlearn.transport.kafka import RECONNECT_BACKOFF_MAX_MS
    from streamlearn.transport.keyed_log import KafkaKeyedLog

    made = _recording_clients(monkeypatch)
    link = KafkaPythonLinkClients("127.0.0.1:1", "models", {"security_protocol": "PLAINTEXT"})
    link.open_merger("streamlearn-merger-models")
    changelog = KafkaKeyedLog("127.0.0.1:1", "changelog", 0)
    with contextlib.suppress(KeyError):  # the recorder has no end offset to read
        next(iter(changelog.records()), None)
    kinds = sorted(kind for kind, _ in made)
    assert kinds == ["consumer", "consumer", "producer", "producer", "producer"], kinds
    assert all(s["reconnect_backoff_max_ms"] == RECONNECT_BACKOFF_MAX_MS <= 2000
               for _, s in made), made
    assert all(s.get("security_protocol", "PLAINTEXT") == "PLAINTEXT" for _, s in made)


class _LoadingCoordinator:
    """A consumer whose committed-offset lookup fails while its group coordinator loads: first
    as a raised error, then as per-partition errors, then answered (offset 5 for partition 0,
    none committed for partition 1). Its partitions hold offsets 3 to 8 (watermarks 3, 9);
    with ``watermarks_error`` that question is refused with this code instead."""

    def __init__(self, code: int, raised: int, per_partition: int,
                 watermarks_error: int | None = None) -> None:
        self.code, self.raised, self.per_partition, self.calls = code, raised, per_partition, 0
        self.watermarks_error = watermarks_error

    def get_watermark_offsets(self, partition: Any, timeout: float,
                              cached: bool) -> tuple[int, int]:
        from confluent_kafka import KafkaError, KafkaException

        assert not cached  # the broker's answer, not what the consumer last fetched
        if self.watermarks_error is not None:
            raise KafkaException(KafkaError(self.watermarks_error))
        return 3, 9

    def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
        from confluent_kafka import KafkaError, KafkaException

        self.calls += 1
        if self.calls <= self.raised:
            raise KafkaException(KafkaError(self.code))
        failing = self.calls <= self.raised + self.per_partition
        # librdkafka's TopicPartition has a read-only error: a stand-in with its four fields
        return [SimpleNamespace(topic=tp.topic, partition=tp.partition,
                                offset=5 if tp.partition == 0 else -1001,
                                error=KafkaError(self.code) if failing else None)
                for tp in partitions]


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_reading_starts_at_the_committed_offsets_asked_again_while_the_coordinator_loads(
        reset: str) -> None:
    """librdkafka's own lookup after an assignment without offsets can stall for good (a
    request-level error leaves the partition waiting, never asked again:
    https://github.com/confluentinc/librdkafka/issues/5586): a daemon on a fresh broker read
    nothing for three minutes. The transport reads the committed offsets itself, asks again
    while the coordinator settles, and assigns explicit positions: the committed offset, else
    the reset end of the log as a number (so librdkafka fetches at once and knows the
    partition's watermarks within a fetch: given the logical end, 0.6-1.2 s passed first, and
    a fresh daemon held its first instances back meanwhile), else the logical end when the
    broker does not give that number."""
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, TopicPartition

    from streamlearn.transport.confluent import start_positions

    consumer = _LoadingCoordinator(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, raised=2,
                                   per_partition=2)
    starts = start_positions(consumer, [TopicPartition("t", 0), TopicPartition("t", 1)], reset,
                             time.monotonic() + 5)
    assert consumer.calls == 5
    assert [(tp.partition, tp.offset) for tp in starts] == [
        (0, 5), (1, 3 if reset == "earliest" else 9)]
    refused = _LoadingCoordinator(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, raised=0,
                                  per_partition=0,
                                  watermarks_error=KafkaError.TOPIC_AUTHORIZATION_FAILED)
    starts = start_positions(refused, [TopicPartition("t", 0), TopicPartition("t", 1)], reset,
                             time.monotonic() + 5)
    assert [(tp.partition, tp.offset) for tp in starts] == [
        (0, 5), (1, OFFSET_BEGINNING if reset == "earliest" else OFFSET_END)]


def test_a_lasting_committed_offsets_error_is_raised_at_once_a_settling_one_at_the_deadline(
        ) -> None:
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    from streamlearn.transport.confluent import start_positions

    lasting = _LoadingCoordinator(KafkaError.GROUP_AUTHORIZATION_FAILED, raised=100,
                                  per_partition=0)
    with pytest.raises(KafkaException):
        start_positions(lasting, [TopicPartition("t", 0)], "earliest", time.monotonic() + 5)
    assert lasting.calls == 1
    settling = _LoadingCoordinator(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, raised=0,
                                   per_partition=10**6)
    started = time.monotonic()
    with pytest.raises(KafkaException):
        start_positions(settling, [TopicPartition("t", 0)], "earliest", time.monotonic() + 0.5)
    assert time.monotonic() - started < 2.0
