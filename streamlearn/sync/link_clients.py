"""The Kafka clients of the models link, on the replica's library (``kafka.client``).

:class:`~streamlearn.sync.kafka_link.KafkaModelLink` holds the protocol (which
partitions it reads, when a catch-up is answered, how the merger is fenced); the
classes here are the few client operations it needs, on kafka-python
(:class:`KafkaPythonLinkClients`) or librdkafka (:class:`ConfluentLinkClients`):
a ``read_committed`` consumer *assigned* partitions of the models topic (no group),
a plain ``acks=all`` producer for the replicas' states, and the merger's
transactional producer.

Contract both keep (``tests/integration/test_model_link.py`` runs on both):

- ``add(partition, offset)`` starts reading a partition at ``offset`` (``None``: its
  beginning) without moving the partitions already read; ``drop`` stops reading one;
- ``poll`` returns ``(partition, value)`` of the records that arrived, as soon as there
  are any (at most ``timeout_s`` of waiting); empty values (tombstones) are left out;
- ``position(p) >= end_offsets()[p]`` once everything committed before the
  ``end_offsets`` call has been returned (transaction markers included: both
  libraries move the position past them);
- ``send`` queues a state and returns a :class:`Delivery`; ``settle`` waits for the
  given deliveries and returns the first failure's message (``None``: all delivered);
- ``open_merger(id)`` initialises the transactional producer (fencing every earlier
  one of the same id); its ``publish`` is one committed transaction, and raises
  :class:`MergerFenced` once a newer producer of the id exists, ``TransportError`` on
  any other failure.

Client errors surface as the library's own exception types (``errors``), which the
link's reader thread logs and outlives.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from streamlearn.errors import TransportError
from streamlearn.transport.kafka import RECONNECT_BACKOFF_MAX_MS

__all__ = ["ConfluentLinkClients", "Delivery", "KafkaPythonLinkClients", "LinkClients",
           "MergerFenced", "MergerProducer", "link_clients"]

METADATA_WAIT_S = 30.0  # a topic created just now: how long to wait for its partitions
OFFSETS_WAIT_S = 10.0  # reading a partition's end offsets (leaders settling: asked again)
#: librdkafka's models consumer: how long the broker holds a fetch (librdkafka's default, 500 ms,
#: also delays the end-offset query queued behind it on the connection: a merger's catch-up
#: took ~960 ms; with 100 ms, ~260 ms, against kafka-python's ~460 ms)
FETCH_WAIT_MS = 100


class MergerFenced(TransportError):
    """A newer merger's producer (same transactional id) exists: this one publishes nothing."""


class Delivery:
    """One queued state chunk: ``done`` once the broker answered, ``error`` if it refused."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = False
        self.error: str | None = None


class MergerProducer(Protocol):
    def publish(self, records: Sequence[tuple[bytes, bytes]], partition: int) -> None: ...
    def close(self) -> None: ...


class LinkClients(Protocol):
    """What the models link needs of a Kafka client library; see the module docstring."""

    partitions: frozenset[int]  # the models topic's partitions
    errors: tuple[type[BaseException], ...]  # the library's exception types

    def add(self, partition: int, offset: int | None) -> None: ...
    def drop(self, partition: int) -> None: ...
    def poll(self, timeout_s: float, max_records: int) -> list[tuple[int, bytes]]: ...
    def end_offsets(self) -> dict[int, int]: ...
    def position(self, partition: int) -> int: ...
    def send(self, key: bytes, value: bytes, partition: int) -> Delivery: ...
    def settle(self, deliveries: Sequence[Delivery], timeout_s: float) -> str | None: ...
    def open_merger(self, transactional_id: str) -> MergerProducer: ...
    def close_consumer(self) -> None: ...
    def close_producer(self, timeout_s: float) -> None: ...


class KafkaPythonLinkClients:
    """The models link's clients on kafka-python."""

    def __init__(self, bootstrap: str, topic: str, options: Mapping[str, object]) -> None:
        from kafka import KafkaConsumer, KafkaProducer
        from kafka.errors import KafkaError

        self.topic, self._bootstrap = topic, bootstrap
        self.errors: tuple[type[BaseException], ...] = (KafkaError,)
        common = {"reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS, **options}
        self._producer_options = {k: v for k, v in common.items()
                                  if k in KafkaProducer.DEFAULT_CONFIG}
        self.consumer = KafkaConsumer(
            **{k: v for k, v in common.items() if k in KafkaConsumer.DEFAULT_CONFIG},
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
            isolation_level="read_committed",  # never a fenced merger's model
            auto_offset_reset="earliest",  # a compacted-away start offset: the oldest kept
            client_id="streamlearn-models")
        deadline = time.monotonic() + METADATA_WAIT_S
        while not (parts := self.consumer.partitions_for_topic(topic)):
            if time.monotonic() > deadline:
                raise TransportError(f"no partition metadata for {topic!r} after "
                                     f"{METADATA_WAIT_S:.0f} s")
            time.sleep(0.1)
        self.partitions = frozenset(parts)
        self._assigned: dict[int, Any] = {}
        self.producer = KafkaProducer(
            **self._producer_options, bootstrap_servers=bootstrap, acks="all", linger_ms=5,
            client_id="streamlearn-models")
        self.producer.partitions_for(topic)  # its metadata now, not at the first publish

    def add(self, partition: int, offset: int | None) -> None:
        from kafka import TopicPartition

        tp = self._assigned[partition] = TopicPartition(self.topic, partition)
        # kafka-python keeps the position of a partition an assign call retains
        self.consumer.assign(list(self._assigned.values()))
        if offset is None:
            self.consumer.seek_to_beginning(tp)
        else:
            self.consumer.seek(tp, offset)

    def drop(self, partition: int) -> None:
        if self._assigned.pop(partition, None) is not None:
            self.consumer.assign(list(self._assigned.values()))

    def poll(self, timeout_s: float, max_records: int) -> list[tuple[int, bytes]]:
        batches = self.consumer.poll(timeout_ms=round(timeout_s * 1000), max_records=max_records)
        return [(tp.partition, r.value) for tp, records in batches.items() for r in records
                if r.value]

    def end_offsets(self) -> dict[int, int]:
        ends = self.consumer.end_offsets(list(self._assigned.values()))
        return {tp.partition: end for tp, end in ends.items()}

    def position(self, partition: int) -> int:
        return int(self.consumer.position(self._assigned[partition]))

    def send(self, key: bytes, value: bytes, partition: int) -> Delivery:
        delivery = Delivery()

        def delivered(_: Any) -> None:
            delivery.done = True

        def failed(exc: BaseException) -> None:
            delivery.done, delivery.error = True, str(exc)

        future = self.producer.send(self.topic, key=key, value=value, partition=partition)
        future.add_callback(delivered)
        future.add_errback(failed)
        return delivery

    def settle(self, deliveries: Sequence[Delivery], timeout_s: float) -> str | None:
        if not all(d.done for d in deliveries):
            self.producer.flush(timeout=timeout_s)
        return next((d.error for d in deliveries if d.error is not None), None)

    def open_merger(self, transactional_id: str) -> MergerProducer:
        from kafka import KafkaProducer

        producer = KafkaProducer(
            **self._producer_options, bootstrap_servers=self._bootstrap, acks="all",
            linger_ms=5, transactional_id=transactional_id,
            client_id="streamlearn-models-merger")
        try:
            producer.init_transactions()
        except self.errors:
            producer.close(timeout=5)
            raise
        return _KafkaPythonMerger(producer, self.topic)

    def close_consumer(self) -> None:
        self.consumer.close()

    def close_producer(self, timeout_s: float) -> None:
        self.producer.close(timeout=timeout_s)


class _TransactionalMerger:
    """One transaction per publish; the library's fenced error → :class:`MergerFenced`."""

    def __init__(self, producer: Any, topic: str) -> None:
        self.producer, self.topic = producer, topic

    def publish(self, records: Sequence[tuple[bytes, bytes]], partition: int) -> None:
        errors = self._errors()
        try:
            self.producer.begin_transaction()
            for key, value in records:
                self._send(key, value, partition)
            self._commit()
        except errors as exc:
            if self._fenced(exc):
                raise MergerFenced(str(exc)) from exc
            raise TransportError(str(exc)) from exc

    def _errors(self) -> tuple[type[BaseException], ...]:
        raise NotImplementedError

    def _send(self, key: bytes, value: bytes, partition: int) -> None:
        raise NotImplementedError

    def _commit(self) -> None:
        raise NotImplementedError

    def _fenced(self, exc: BaseException) -> bool:
        raise NotImplementedError


class _KafkaPythonMerger(_TransactionalMerger):
    def _errors(self) -> tuple[type[BaseException], ...]:
        from kafka.errors import KafkaError

        return (KafkaError,)

    def _send(self, key: bytes, value: bytes, partition: int) -> None:
        self.producer.send(self.topic, key=key, value=value, partition=partition)

    def _commit(self) -> None:
        self.producer.commit_transaction()

    def _fenced(self, exc: BaseException) -> bool:
        from kafka.errors import ProducerFencedError

        return isinstance(exc, ProducerFencedError)

    def close(self) -> None:
        self.producer.close(timeout=5)


class ConfluentLinkClients:
    """The models link's clients on librdkafka (``kafka.client = confluent``): its consumer
    fetches and its producers send in C threads, which an idle models topic barely wakes
    (docs/performance.md)."""

    def __init__(self, bootstrap: str, topic: str, options: Mapping[str, object]) -> None:
        from confluent_kafka import Consumer, KafkaException, Producer

        from streamlearn.transport import confluent

        self.topic = topic
        self.errors: tuple[type[BaseException], ...] = (KafkaException,)
        self._common: dict[str, object] = {
            "bootstrap.servers": bootstrap, "reconnect.backoff.max.ms": 2000,
            **confluent.librdkafka_options(options),
            "error_cb": confluent.log_client_error, "logger": confluent.LIBRDKAFKA_LOG}
        # assigned partitions only: the group id is required by librdkafka, never joined
        self.consumer = Consumer({
            **self._common, "client.id": "streamlearn-models", "group.id": f"{topic}.reader",
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "enable.partition.eof": False, "fetch.wait.max.ms": FETCH_WAIT_MS,
            "fetch.error.backoff.ms": FETCH_WAIT_MS})
        self.partitions = confluent.topic_partitions(self.consumer, topic, METADATA_WAIT_S)
        self._starts: dict[int, int] = {}  # assigned partition → offset it was assigned at
        self.producer = Producer({**self._common, "client.id": "streamlearn-models",
                                  "acks": "all", "linger.ms": 5})

    def add(self, partition: int, offset: int | None) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        from streamlearn.transport.confluent import watermarks

        if offset is None:  # the position before the first record is read: the log start
            # (a models topic created a moment ago answers "not leader" until its leader is
            # elected: seen in CI as a replica that stopped at start; asked again meanwhile)
            low, _ = watermarks(self.consumer, TopicPartition(self.topic, partition),
                                time.monotonic() + METADATA_WAIT_S)
            offset = max(low, 0)
        self.drop(partition)
        self.consumer.incremental_assign(
            [TopicPartition(self.topic, partition, offset if offset >= 0 else OFFSET_BEGINNING)])
        self._starts[partition] = offset

    def drop(self, partition: int) -> None:
        from confluent_kafka import TopicPartition

        if self._starts.pop(partition, None) is not None:
            self.consumer.incremental_unassign([TopicPartition(self.topic, partition)])

    def poll(self, timeout_s: float, max_records: int) -> list[tuple[int, bytes]]:
        from confluent_kafka import KafkaException

        from streamlearn.transport.confluent import consume_ready

        out: list[tuple[int, bytes]] = []
        for record in consume_ready(self.consumer, max_records, timeout_s):
            error = record.error()
            if error is not None:
                if error.fatal() or not error.retriable():
                    raise KafkaException(error)
                continue  # librdkafka recovers by itself (a broker away)
            value = record.value()
            if value and record.partition() in self._starts:  # not a dropped partition's
                out.append((record.partition(), value))
        self.producer.poll(0)  # delivery reports of the states sent
        return out

    def end_offsets(self) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        from streamlearn.transport.confluent import watermarks

        deadline = time.monotonic() + OFFSETS_WAIT_S
        return {p: watermarks(self.consumer, TopicPartition(self.topic, p), deadline)[1]
                for p in self._starts}

    def position(self, partition: int) -> int:
        from confluent_kafka import TopicPartition

        offset = int(self.consumer.position([TopicPartition(self.topic, partition)])[0].offset)
        # nothing read yet (librdkafka's OFFSET_INVALID): still where it was assigned
        return offset if offset >= 0 else self._starts[partition]

    def send(self, key: bytes, value: bytes, partition: int) -> Delivery:
        delivery = Delivery()

        def delivered(error: Any, _: Any) -> None:
            delivery.done = True
            if error is not None:
                delivery.error = str(error)

        self.producer.produce(self.topic, value, key, partition=partition, on_delivery=delivered)
        self.producer.poll(0)
        return delivery

    def settle(self, deliveries: Sequence[Delivery], timeout_s: float) -> str | None:
        self.producer.poll(0)
        if not all(d.done for d in deliveries):
            self.producer.flush(timeout_s)
        if not all(d.done for d in deliveries):
            return f"not acknowledged within {timeout_s:.0f} s"
        return next((d.error for d in deliveries if d.error is not None), None)

    def open_merger(self, transactional_id: str) -> MergerProducer:
        from confluent_kafka import Producer

        from streamlearn.transport import confluent

        producer = Producer({**self._common, "client.id": "streamlearn-models-merger",
                             "acks": "all", "linger.ms": 5, "transactional.id": transactional_id,
                             "logger": confluent.MERGER_LOG,
                             "error_cb": confluent.log_merger_error})
        producer.init_transactions(30)
        return _ConfluentMerger(producer, self.topic)

    def close_consumer(self) -> None:
        self.consumer.close()

    def close_producer(self, timeout_s: float) -> None:
        self.producer.flush(timeout_s)


class _ConfluentMerger(_TransactionalMerger):
    def _errors(self) -> tuple[type[BaseException], ...]:
        from confluent_kafka import KafkaException

        return (KafkaException,)

    def _send(self, key: bytes, value: bytes, partition: int) -> None:
        self.producer.produce(self.topic, value, key, partition=partition)

    def _commit(self) -> None:
        self.producer.commit_transaction(30)

    def _fenced(self, exc: BaseException) -> bool:
        from confluent_kafka import KafkaError

        error = exc.args[0] if exc.args else None
        return isinstance(error, KafkaError) and error.code() in (
            KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)

    def close(self) -> None:
        from confluent_kafka import KafkaException

        try:
            self.producer.purge()  # a fenced or failed producer's queue is never delivered
            self.producer.flush(0)
        except KafkaException:  # fenced (fatal): librdkafka refuses even to flush; nothing is lost
            pass


def link_clients(client: str, bootstrap: str, topic: str,
                 options: Mapping[str, object]) -> LinkClients:
    """The models link's clients for ``kafka.client``."""
    if client == "confluent":
        return ConfluentLinkClients(bootstrap, topic, options)
    return KafkaPythonLinkClients(bootstrap, topic, options)
