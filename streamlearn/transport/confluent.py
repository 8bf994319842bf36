"""The Kafka transport on librdkafka (``confluent-kafka``): ``kafka.client = confluent``.

The same :class:`~streamlearn.transport.protocol.Transport` as
:class:`~streamlearn.transport.kafka.KafkaTransport`, with the same guarantees:
the consumer is *assigned* the input partitions (positions exist at once, a
``seek`` right after construction is exact), offsets are committed only when
the caller commits, and the producer is idempotent with ``acks=all``.
librdkafka decodes the protocol, batches and retries in C threads of its own,
so the serving loop's thread spends its time on the events, not on the client.

How librdkafka's behaviour is mapped onto the contract:

- ``poll``: librdkafka's ``consume(n, timeout)`` waits for *n* messages or the
  whole timeout, so a poll takes what is queued without waiting, and only when
  nothing is waits for the first message (``poll(timeout)``), then takes what
  came with it. A poll therefore returns as soon as input is there.
- Nothing produced is dropped: ``message.timeout.ms = 0`` (no delivery
  timeout), so librdkafka retries a message until the broker acknowledges it;
  a delivery that fails anyway (a non-retriable error) is produced again by the
  next ``flush``, and ``flush`` raises until every message is acknowledged.
- Commits are librdkafka's asynchronous ones; ``commit(wait=True)`` polls
  until its commit callback arrives, for at most
  :data:`~streamlearn.transport.kafka.OFFSETS_TIMEOUT_S`, and keeps what those polls
  read for the next ``poll`` (librdkafka's synchronous commit waits for the
  coordinator however long the broker is away). At most one commit not waited
  for is in flight; closing the consumer, which waits for those, is bounded by
  :data:`CLOSE_TIMEOUT_S`.
- ``unread`` is the high watermark of the last fetch response (librdkafka's
  cached watermarks, no network call) minus the position.
- ``end_offsets`` asks the broker through an admin client of its own (one
  ListOffsets request for every assigned partition), not through the consumer:
  the broker answers a connection's requests in order, so on the consumer's
  connection each query waited behind the fetch in flight (up to
  ``kafka.fetch_wait_seconds``), four queries a second held up the serving loop
  for up to 200 ms, and a decision at 50 events/s waited up to 83 ms.

``confluent_kafka`` is imported when a transport is built, so that the package
is needed only by deployments that choose this client.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from streamlearn.errors import TransportError
from streamlearn.transport.buffers import Partition, PartitionBuffers
from streamlearn.transport.kafka import OFFSETS_TIMEOUT_S, check_reachable
from streamlearn.transport.protocol import (
    ClientTuning,
    Message,
    Offsets,
    check_offsets,
    close_flush_seconds,
)

__all__ = ["CLOSE_TIMEOUT_S", "LIBRDKAFKA_LOG", "LINGER_S", "MERGER_LOG", "REPEAT_WINDOW_S",
           "ConfluentTransport", "RepeatLimit", "SharedConfluentClients", "client_config", "close_consumer",
           "consume_ready", "librdkafka_options", "list_end_offsets", "log_client_error",
           "log_merger_error", "open_confluent_clients", "topic_partitions"]

log = logging.getLogger(__name__)
LIBRDKAFKA_LOG = logging.getLogger("streamlearn.librdkafka")  # librdkafka's own log lines

#: A librdkafka line (or client error) of one kind is logged at most once in this many seconds;
#: the next one after it says how many were left out. While a broker is away each client
#: reconnects every 0.1-2 s on each of its connections and logs each failure: an outside test
#: saw 661 lines in a 15 s outage, ~40 a second.
REPEAT_WINDOW_S = 30.0


class RepeatLimit(logging.Filter):
    """Lets through the first line of each kind (the text with its numbers masked) per
    ``window_s``, adding to it how many of its kind were left out since the last one."""

    _MAX_KINDS = 256  # forgets every kind past this many (a bound, not a policy)

    def __init__(self, window_s: float = REPEAT_WINDOW_S,
                 clock: Any = time.monotonic) -> None:
        super().__init__()
        self.window_s, self.clock = window_s, clock
        self._kinds: dict[str, list[float]] = {}  # kind → [last let through, left out since]

    def admit(self, text: str) -> tuple[bool, int]:
        """(whether to log ``text`` now, how many of its kind were left out before it)."""
        kind = re.sub(r"\d+", "#", text)
        now = float(self.clock())
        seen = self._kinds.get(kind)
        if seen is not None and now - seen[0] < self.window_s:
            seen[1] += 1
            return False, 0
        if seen is None and len(self._kinds) >= self._MAX_KINDS:
            self._kinds.clear()
        self._kinds[kind] = [now, 0.0]
        return True, 0 if seen is None else int(seen[1])

    def left_out_note(self, left_out: int) -> str:
        """What a line let through adds about those of its kind left out before it."""
        return f" ({left_out} more like this in the last {self.window_s:.0f} s)" if left_out \
            else ""

    def filter(self, record: logging.LogRecord) -> bool:
        admitted, left_out = self.admit(record.getMessage())
        if admitted and left_out:
            record.msg, record.args = record.getMessage() + self.left_out_note(left_out), ()
        return admitted


LIBRDKAFKA_LOG.addFilter(RepeatLimit())
_CLIENT_ERRORS = RepeatLimit()


def _about_fencing(text: str) -> bool:
    """Whether a librdkafka line or error is about this producer being fenced (ADDPARTS
    says only "old epoch")."""
    lowered = text.lower()
    return "fenced" in lowered or "old epoch" in lowered


class _FencingIsRoutine(logging.Filter):
    """A line about being fenced, as INFO: for the models topic's merger producer a newer
    merger fencing it is the planned handover of the role (an outside test saw librdkafka's
    ERROR ADDPARTS, CRITICAL TXNERR and CRITICAL FATAL lines at every handover)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _about_fencing(record.getMessage()):
            record.levelno, record.levelname = logging.INFO, "INFO"
            # the level was checked before the record was made, at the line's own
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


#: librdkafka's lines of the merger's transactional producer (a child of LIBRDKAFKA_LOG)
MERGER_LOG = logging.getLogger("streamlearn.librdkafka.merger")
MERGER_LOG.addFilter(_FencingIsRoutine())
MERGER_LOG.addFilter(RepeatLimit())


def log_merger_error(error: Any) -> None:
    """The merger producer's client errors: being fenced by a newer merger is routine."""
    if _about_fencing(str(error)):
        log.info("librdkafka (models merger): %s: another replica is the merger now", error)
        return
    log_client_error(error)

#: How long closing the consumer may take: librdkafka's close waits for the commits in flight,
#: which wait for the group coordinator as long as the broker is away (40 s measured); past
#: this the consumer is left to the process exit.
CLOSE_TIMEOUT_S = 5.0


#: kafka-python option names (``KafkaConfig.client_options``) → librdkafka's.
_OPTION_NAMES = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
}

#: librdkafka settings the transport fixes (manual commits, idempotent acks=all producer).
_OWNED = frozenset({"bootstrap.servers", "group.id", "enable.auto.commit",
                    "enable.auto.offset.store", "enable.idempotence", "acks",
                    "message.timeout.ms", "transactional.id", "partitioner"})

#: librdkafka's local queue of prefetched records per partition (its default, 64 MB, holds
#: about 40,000 events of 1.6 KB per partition in memory before the loop asks for them).
QUEUED_MAX_KBYTES = 16384

#: How long librdkafka postpones a partition's next fetch once its local queue is full. Its
#: default (1000 ms) idles the consumer for a second each time the loop falls 16 MB behind:
#: under a backlog the fetches then come in bursts a second apart.
FETCH_QUEUE_BACKOFF_MS = 10

#: The producer's linger where ``kafka.linger_seconds`` is unset. librdkafka sends from its
#: own C threads, so more, smaller produce requests cost the serving loop next to nothing: at
#: 2,000 events/s 1 ms instead of kafka-python's 5 ms had callers read their decisions 3.6 ms
#: sooner (median 6.7 against 10.3 ms; p99 12.6 against 16.4), for ~4 % of the throughput
#: under a backlog (docs/performance.md, "The producer linger per client").
LINGER_S = 0.001


def librdkafka_options(options: Mapping[str, object]) -> dict[str, str]:
    """``client_options`` as librdkafka settings: the kafka-python names of
    ``KafkaConfig.client_options`` are translated, librdkafka's own names pass as they are.

    >>> librdkafka_options({"security_protocol": "SSL", "ssl_cafile": "/ca.pem"})
    {'security.protocol': 'SSL', 'ssl.ca.location': '/ca.pem'}
    """
    out: dict[str, str] = {}
    for key, value in options.items():
        name = _OPTION_NAMES.get(key, key)
        if name in _OWNED:
            raise TransportError(f"client_options may not set {name!r}: the transport fixes it "
                                 "(manual commits, idempotent acks=all producer)")
        if "_" in name:  # a kafka-python name without a librdkafka counterpart here
            raise TransportError(f"unknown client option {key!r} for the confluent client: "
                                 f"expected one of {sorted(_OPTION_NAMES)} or a librdkafka "
                                 "setting (e.g. 'socket.keepalive.enable')")
        out[name] = str(value)
    return out


def client_config(bootstrap_servers: str,
                  client_options: Mapping[str, object] | None = None) -> dict[str, Any]:
    """The settings every librdkafka client of a transport shares (consumer, producer and the
    admin client of ``end_offsets``): the servers, client id, reconnect backoff,
    ``client_options`` (security settings included) and where errors and log lines go."""
    return {"bootstrap.servers": bootstrap_servers, "client.id": "streamlearn",
            "reconnect.backoff.max.ms": 2000, **librdkafka_options(client_options or {}),
            "error_cb": log_client_error, "logger": LIBRDKAFKA_LOG}


def open_confluent_clients(bootstrap_servers: str, group_id: str,
                           client_options: Mapping[str, object] | None = None,
                           auto_offset_reset: str = "earliest",
                           tuning: ClientTuning | None = None,
                           on_delivery: Any = None, on_commit: Any = None) -> tuple[Any, Any]:
    """(consumer, idempotent acks=all producer) on librdkafka, as the transport opens them."""
    from confluent_kafka import Consumer, KafkaException, Producer

    tuning = tuning or ClientTuning()
    check_reachable(bootstrap_servers)
    common = client_config(bootstrap_servers, client_options)
    try:
        consumer = Consumer({
            "fetch.wait.max.ms": round(tuning.fetch_wait_s * 1000),
            "fetch.min.bytes": tuning.fetch_min_bytes,
            "queued.max.messages.kbytes": QUEUED_MAX_KBYTES,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            **common,
            "group.id": group_id, "enable.auto.commit": False,
            "enable.auto.offset.store": False, "auto.offset.reset": auto_offset_reset,
            "enable.partition.eof": False,
            **({} if on_commit is None else {"on_commit": on_commit}),
        })
        producer = Producer({
            "linger.ms": (LINGER_S if tuning.linger_s is None else tuning.linger_s) * 1000,
            **common,
            "enable.idempotence": True, "acks": "all", "message.timeout.ms": 0,
            "partitioner": "murmur2_random",  # a key's partition as the Java and kafka-python clients pick it
            **({} if on_delivery is None else {"on_delivery": on_delivery}),
        })
    except KafkaException as exc:
        raise TransportError(f"cannot connect to Kafka at {bootstrap_servers}: {exc}") from exc
    return consumer, producer


class _Commits:
    """The consumer's commits not waited for: how many are in flight (the consumer's commit
    callback, served by its polls, counts them down; a failure is logged and the next
    checkpoint commits again)."""

    def __init__(self) -> None:
        self.made = self.completed = 0  # commits made / completed (they complete in order)
        self.errors: dict[int, Any] = {}  # the failures of commits waited for, by number
        self.waited: set[int] = set()

    @property
    def in_flight(self) -> int:
        return self.made - self.completed

    def on_commit(self, error: Any, partitions: Any) -> None:
        self.completed += 1
        if self.completed in self.waited:  # its caller reports it
            self.waited.discard(self.completed)
            if error is not None:
                self.errors[self.completed] = error
        elif error is not None:
            log.warning("committing offsets %s failed (the next checkpoint commits again): %s",
                        [(p.topic, p.partition, p.offset) for p in partitions or []], error)


def log_client_error(error: Any) -> None:
    """librdkafka's client-level errors (a broker down, all brokers down): it reconnects by
    itself; a fatal error (the idempotent producer's state lost) is logged as an error."""
    admitted, left_out = _CLIENT_ERRORS.admit(str(error))
    if admitted or error.fatal():  # a fatal one always
        (log.error if error.fatal() else log.info)(
            "librdkafka: %s%s", error, _CLIENT_ERRORS.left_out_note(left_out))


def _message(record: Any) -> Message:
    return Message(record.topic(), record.partition(), record.offset(), record.key(),
                   record.value(), record.timestamp()[1])


def topic_partitions(client: Any, topic: str, wait_s: float = 30.0) -> frozenset[int]:
    """The partitions of ``topic`` as the broker reports them to ``client``, waiting up to
    ``wait_s`` for those of a topic created just now; TransportError after that."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + wait_s
    while True:
        try:
            found = client.list_topics(topic, timeout=5).topics.get(topic)
        except KafkaException:
            found = None
        if found is not None and found.error is None and found.partitions:
            return frozenset(found.partitions)
        if time.monotonic() > deadline:
            raise TransportError(f"no partition metadata for {topic!r} after {wait_s:.0f} s")
        time.sleep(0.1)


def consume_ready(consumer: Any, max_records: int, timeout_s: float) -> list[Any]:
    """Up to ``max_records`` records: what is queued now, else what the first record to arrive
    within ``timeout_s`` brings (``consume(n, t)`` alone would wait for n or all of t)."""
    records: list[Any] = consumer.consume(max_records, 0)
    if not records and timeout_s > 0:
        first = consumer.poll(timeout_s)
        if first is not None:
            records = [first, *consumer.consume(max_records - 1, 0)] if max_records > 1 \
                else [first]
    return records


def _settling(error: Any) -> bool:
    """Whether a librdkafka error is one a restarted broker gives until its partition leaders
    and group coordinators settle (or one librdkafka marks retriable): worth asking again."""
    from confluent_kafka import KafkaError

    if not isinstance(error, KafkaError):
        return False
    return bool(error.retriable()) or error.code() in {
        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TRANSPORT,
        KafkaError.REQUEST_TIMED_OUT,
        # the client knows a newer leader epoch than the broker yet: a restarted broker
        # that has not loaded its partitions' leadership (seen for ~1 s after a restart)
        KafkaError.UNKNOWN_LEADER_EPOCH}


def _stale_epoch(exc: Exception) -> bool:
    """Whether a librdkafka error says the client asked with a partition leader epoch older
    than the broker's (its metadata predates a leader change, e.g. a broker restart)."""
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.code() == KafkaError.FENCED_LEADER_EPOCH


def _pause_to_ask_again(error: Any, deadline: float) -> bool:
    """After ``error``: whether to ask again before ``deadline`` (a settling broker, with
    time left); if so, after a pause of 0.1 s."""
    if not _settling(error) or deadline - time.monotonic() <= 0.1:
        return False
    time.sleep(0.1)
    return True


def watermarks(consumer: Any, partition: Any, deadline: float) -> tuple[int, int]:
    """(low, high) watermarks of a ``confluent_kafka.TopicPartition``, read from the broker.

    A broker that has just come back, or a topic created a moment ago, answers "not leader"
    (or "leader not available") until leadership settles: asked again until ``deadline``
    (``time.monotonic()``), after which, or on any other error, the KafkaException is raised.
    """
    from confluent_kafka import KafkaException

    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                partition, timeout=max(deadline - time.monotonic(), 0.001), cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            if not _pause_to_ask_again(exc.args[0] if exc.args else None, deadline):
                raise


def list_end_offsets(admin: Any, partitions: list[Any], deadline: float) -> dict[Partition, int]:
    """The log-end offsets of ``partitions`` (``confluent_kafka.TopicPartition`` s) through
    ``admin`` (an ``AdminClient``), in one ListOffsets request per leader; partitions whose
    leader is settling are asked again until ``deadline`` (``time.monotonic()``). Raises
    KafkaException on a lasting error, TimeoutError when no answer came by the deadline."""
    from concurrent.futures import TimeoutError as FutureTimeout

    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined,unused-ignore]

    # OffsetSpec is a re-export: an error under --strict only (no implicit re-exports), and
    # `mypy simulators` (not strict) follows this import too: hence unused-ignore above

    ends: dict[Partition, int] = {}
    left = list(partitions)
    while left:
        timeout = max(deadline - time.monotonic(), 0.001)
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call,unused-ignore]
        futures = admin.list_offsets({tp: latest for tp in left},
                                     request_timeout=timeout)
        again: list[Any] = []
        error: Any = None
        for tp, future in futures.items():
            try:
                ends[(tp.topic, tp.partition)] = int(
                    future.result(timeout=max(deadline - time.monotonic(), 0.001)).offset)
            except FutureTimeout as exc:
                raise TimeoutError(f"no end offset of {tp.topic}[{tp.partition}] by the "
                                   "deadline") from exc
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not _settling(error):
                    raise
                again.append(tp)
        if again and not _pause_to_ask_again(error, deadline):
            raise KafkaException(error if isinstance(error, KafkaError)
                                 else KafkaError(KafkaError._TIMED_OUT))
        left = again
    return ends


def read_committed(consumer: Any, partitions: list[Any], deadline: float) -> list[Any]:
    """The group's committed offsets of ``partitions`` (``confluent_kafka.TopicPartition`` s,
    offset < 0 where none is committed), asked again while the coordinator settles (until
    ``deadline``, ``time.monotonic()``): a raised error and a per-partition one alike.
    Raises KafkaException on a lasting error, or a settling one at the deadline."""
    from confluent_kafka import KafkaException

    while True:
        try:
            found: list[Any] = consumer.committed(
                partitions, timeout=max(deadline - time.monotonic(), 0.001))
        except KafkaException as exc:
            if _pause_to_ask_again(exc.args[0] if exc.args else None, deadline):
                continue
            raise
        error = next((tp.error for tp in found if tp.error is not None), None)
        if error is None:
            return found
        if not _pause_to_ask_again(error, deadline):
            raise KafkaException(error)


def start_positions(consumer: Any, partitions: list[Any], auto_offset_reset: str,
                    deadline: float) -> list[Any]:
    """The ``confluent_kafka.TopicPartition`` s with the offsets reading starts from: the
    group's committed offsets (:func:`read_committed`), else the ``auto_offset_reset`` end of
    the log, as a number where the broker gives it (:func:`_reset_offset`).

    An assignment without offsets leaves the committed-offset lookup to librdkafka, which can
    stall for good: an OffsetFetch answered with a request-level error (a group coordinator
    still loading, as on a broker that creates ``__consumer_offsets`` for this very request)
    leaves the partition waiting and is never asked again
    (https://github.com/confluentinc/librdkafka/issues/5586). A daemon started on a fresh
    broker then read nothing for three minutes, until its test gave up. Raises
    KafkaException when the offsets cannot be read by ``deadline``.
    """
    from confluent_kafka import TopicPartition

    return [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else
                           _reset_offset(consumer, tp, auto_offset_reset, deadline))
            for tp in read_committed(consumer, partitions, deadline)]


def _reset_offset(consumer: Any, tp: Any, auto_offset_reset: str, deadline: float) -> int:
    """Where a partition with no committed offset starts: its first offset (``earliest``) or
    its end (``latest``) as the broker gives them now, else the logical end for librdkafka to
    resolve. Given the logical one, librdkafka looks the offset up itself and learns the
    partition's watermarks only from its first fetch answer: 0.6–1.2 s after the assignment
    on the development machine, while ``unread`` could not say whether the partition held
    records and the aligner held the first instances of a fresh daemon back (45–450 ms for
    a caller that started as soon as ``/readyz`` said ready). With a number
    it fetches at once (watermarks known within 0.1 s). An offset retention has deleted
    meanwhile is reset by librdkafka as before (``auto.offset.reset``); a leader that is
    still settling is asked again until ``deadline`` (:func:`watermarks`)."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaException

    try:
        low, high = watermarks(consumer, tp, deadline)
    except KafkaException:
        low = high = -1  # not answered: librdkafka looks it up
    if auto_offset_reset == "earliest":
        return int(low) if low >= 0 else OFFSET_BEGINNING
    return int(high) if high >= 0 else OFFSET_END


def _records(records: list[Any], where: str) -> list[Message]:
    """The records as messages; an error event is skipped when librdkafka recovers from it by
    itself (a broker away: the next polls resume) and raised otherwise."""
    out: list[Message] = []
    for record in records:
        error = record.error()
        if error is None:
            out.append(_message(record))
        elif error.retriable() or not error.fatal():
            log.debug("poll on %s: %s", where, error)
        else:
            raise TransportError(f"poll failed on {where}: {error}")
    return out


class ConfluentTransport:
    """A :class:`Transport` on librdkafka: one assigned consumer, one idempotent producer.

    Parameters are those of :class:`~streamlearn.transport.kafka.KafkaTransport`;
    ``client_options`` take the names of ``KafkaConfig.client_options`` (translated,
    see :func:`librdkafka_options`) or librdkafka's own dotted settings, and ``shared``
    is a :class:`SharedConfluentClients`.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        instances_topic: str,
        feedback_topic: str,
        decisions_topic: str,
        dead_letter_topic: str,
        group_id: str,
        client_options: Mapping[str, object] | None = None,
        partitions: list[int] | None = None,
        auto_offset_reset: str = "earliest",
        request_timeout_s: float = 30.0,
        shared: SharedConfluentClients | None = None,
        tuning: ClientTuning | None = None,
    ) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        self.instances_topic = instances_topic
        self.feedback_topic = feedback_topic
        self.decisions_topic = decisions_topic
        self.dead_letter_topic = dead_letter_topic
        self.bootstrap_servers = bootstrap_servers
        self._timeout_s = request_timeout_s
        self._offsets_timeout_s = min(request_timeout_s, OFFSETS_TIMEOUT_S)
        self._closed = False
        # the last flush on this transport's producer ended with messages not acknowledged
        # (kept by the shared clients instead when the producer is theirs: _producer_owner)
        self.flush_timed_out = False
        self._shared = shared
        self._assigned: set[Partition] = set()
        self._tp: dict[Partition, Any] = {}
        self._sought: dict[Partition, int] = {}  # the last seek's offsets (start positions)
        self._read: deque[Message] = deque()  # read while waiting for a commit, not polled yet
        self._admin: Any = None  # the AdminClient of end_offsets, opened when first needed
        self._admin_config = client_config(bootstrap_servers, client_options)
        if shared is None:
            self._deliveries, self._commits = _Deliveries(), _Commits()
            self._consumer, self._producer = open_confluent_clients(
                bootstrap_servers, group_id, client_options, auto_offset_reset, tuning,
                self._deliveries.on_delivery, self._commits.on_commit)
        else:
            self._deliveries, self._commits = shared.deliveries, shared.commits
            self._consumer, self._producer = shared.consumer, shared.producer
        counts = {t: self._partition_count(t) for t in (instances_topic, feedback_topic)}
        n_inst, n_feed = counts[instances_topic], counts[feedback_topic]
        if n_inst != n_feed:
            self.close()
            raise TransportError(
                f"instances and feedback must be co-partitioned: {instances_topic!r} has "
                f"{n_inst} partitions, {feedback_topic!r} has {n_feed}")
        chosen = list(range(n_inst)) if partitions is None else sorted(set(partitions))
        if not chosen or not all(0 <= p < n_inst for p in chosen):
            self.close()
            raise TransportError(f"expected partitions within 0..{n_inst - 1}, got {partitions}")
        self._assigned = {(t, p) for t in (instances_topic, feedback_topic) for p in chosen}
        self._tp = {tp: TopicPartition(*tp) for tp in sorted(self._assigned)}
        reset = auto_offset_reset if shared is None else shared.auto_offset_reset
        try:
            starts = start_positions(self._consumer, list(self._tp.values()), reset,
                                     time.monotonic() + self._timeout_s)
        except KafkaException as exc:
            self.close()
            raise TransportError(f"could not read the committed offsets of group {group_id!r} "
                                 f"within {self._timeout_s:g} s: {exc}") from exc
        self._sought.update({(tp.topic, tp.partition): tp.offset for tp in starts
                             if tp.offset >= 0})
        if shared is None:
            self._consumer.assign(starts)
        else:
            shared.attach(self._tp, starts)
        for topic in (decisions_topic, dead_letter_topic):  # output metadata now, not at a send
            try:
                self._metadata(topic)
            except TransportError as exc:
                self.close()
                raise TransportError(f"output topic {topic!r} is not available: {exc}") from exc

    def _metadata(self, topic: str) -> int:
        """The partition count of ``topic`` (0 when the broker does not know it)."""
        from confluent_kafka import KafkaException

        try:
            found = self._producer.list_topics(topic, timeout=self._timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise TransportError(f"no metadata from {self.bootstrap_servers}: {exc}") from exc
        if found is None or found.error is not None:
            return 0
        return len(found.partitions)

    def _partition_count(self, topic: str) -> int:
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                count = self._metadata(topic)
            except TransportError:
                count = 0
            if count:
                return count
            if time.monotonic() > deadline:
                self.close()
                raise TransportError(
                    f"topic {topic!r} not found on {self.bootstrap_servers} within "
                    f"{self._timeout_s} s; create it (streamlearn.transport.kafka.ensure_topics)")
            time.sleep(0.2)

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("the transport is closed")

    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        """Up to ``max_records`` as soon as there are any, waiting at most ``timeout_s``;
        while the broker is away this returns ``[]``."""
        self._check_open()
        if self._shared is not None:
            return self._shared.take(self._tp, max_records, timeout_s)
        if self._read:  # read while a commit was waited for
            return [self._read.popleft() for _ in range(min(max_records, len(self._read)))]
        records = consume_ready(self._consumer, max_records, timeout_s)
        self._producer.poll(0)  # delivery reports, without waiting
        return _records(records, self.bootstrap_servers)

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue one message; librdkafka retries it until the broker acknowledges it."""
        self.produce_many(topic, [key], [value])

    def produce_many(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        """Queue several messages in order (see ``Transport.produce_many``)."""
        self._check_open()
        produce = self._producer.produce
        for n, (key, value) in enumerate(zip(keys, values, strict=True)):
            try:
                produce(topic, value, key)
            except BufferError:  # the local queue is full: let deliveries drain it, once
                self._producer.poll(0.5)
                try:
                    produce(topic, value, key)
                except (BufferError, Exception) as exc:
                    error = TransportError(f"could not queue a message for {topic}: {exc!r}")
                    error.queued = n  # type: ignore[attr-defined]
                    raise error from exc
            except Exception as exc:  # KafkaException: e.g. an unknown topic
                error = TransportError(f"could not queue a message for {topic}: {exc!r}")
                error.queued = n  # type: ignore[attr-defined]
                raise error from exc
        self._deliveries.queued += len(values)

    def flush(self, timeout_s: float) -> None:
        """Wait until every produced message is acknowledged, else raise TransportError.

        A message whose delivery failed is produced again; nothing is dropped."""
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            for topic, key, value in self._deliveries.take_failed():
                self._producer.produce(topic, value, key)
                self._deliveries.queued += 1
            in_flight = self._producer.flush(max(deadline - time.monotonic(), 0.0))
            if in_flight == 0 and not self._deliveries.failed:
                self._producer_owner.flush_timed_out = False
                return
            if time.monotonic() >= deadline:
                self._producer_owner.flush_timed_out = True
                raise TransportError(
                    f"{in_flight + len(self._deliveries.failed)} produced messages not "
                    f"acknowledged by {self.bootstrap_servers} within {timeout_s} s; they are "
                    "kept and retried by the next flush")

    def commit(self, offsets: Mapping[tuple[str, int], int], *, wait: bool = True) -> None:
        """Commit the next offsets to read: synchronously (bounded by ``OFFSETS_TIMEOUT_S``),
        or sent now and completed by librdkafka while the loop goes on (a failure logged).

        librdkafka sends the commits of one consumer on one connection to the coordinator,
        in the order they were made, so the last commit made is the one that stands. At most
        one commit not waited for is in flight (as with kafka-python): one made while another
        is waits, so that commits do not pile up while the coordinator is away (closing the
        consumer waits for every one of them)."""
        from confluent_kafka import KafkaException, TopicPartition

        self._check_open()
        check_offsets(offsets, self._assigned, "commit")
        payload = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
        if not wait and self._commits.in_flight:
            wait = True  # one in flight already: this one waits (see above)
        deadline = time.monotonic() + self._offsets_timeout_s
        while True:
            try:
                self._consumer.commit(offsets=payload, asynchronous=True)
            except KafkaException as exc:
                raise TransportError(f"commit of {dict(offsets)} failed: {exc}") from exc
            self._commits.made += 1
            if not wait:
                return
            number = self._commits.made
            self._commits.waited.add(number)
            # The commit callback is served by the consumer's polls: poll, keeping what they
            # read for the next ``poll`` (librdkafka's synchronous commit waits for the
            # coordinator however long it is away, and holds up polls from other threads).
            while self._commits.completed < number:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._commits.waited.discard(number)
                    raise TransportError(f"commit of {dict(offsets)} not acknowledged within "
                                         f"{self._offsets_timeout_s:g} s")
                self._read_ahead(min(left, 0.05))
            error = self._commits.errors.pop(number, None)
            if error is None:
                return
            # a restarted broker answers "not coordinator" (or "loading") until the group's
            # coordinator settles: the same commit again, within the same deadline
            if not _pause_to_ask_again(error, deadline):
                raise TransportError(f"commit of {dict(offsets)} failed: {error}")

    def _read_ahead(self, timeout_s: float) -> None:
        """Poll the consumer (serving its callbacks); what it reads is returned by ``poll``."""
        if self._shared is not None:
            self._shared.fill(timeout_s)
        else:
            self._read.extend(_records(consume_ready(self._consumer, 500, timeout_s),
                                       self.bootstrap_servers))

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Set the positions the next ``poll`` reads from (records fetched from the old
        positions are not returned)."""
        from confluent_kafka import TopicPartition

        self._check_open()
        check_offsets(offsets, self._assigned, "seek")
        targets = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
        if not targets:
            return
        # Re-assigning a partition at an offset is exact in every fetch state; seek() refuses
        # a partition whose fetcher has not started yet (right after assign).
        self._consumer.incremental_unassign([TopicPartition(t, p) for (t, p) in offsets])
        self._consumer.incremental_assign(targets)
        self._sought.update(offsets)
        if self._read:  # read from the old positions
            self._read = deque(m for m in self._read if (m.topic, m.partition) not in offsets)
        if self._shared is not None:
            self._shared.forget_buffered(offsets)

    def assignment(self) -> set[tuple[str, int]]:
        """The assigned input partitions."""
        return set(self._assigned)

    def committed(self) -> Offsets:
        """Committed offsets of the group for the assigned partitions that have one."""
        from confluent_kafka import KafkaException

        self._check_open()
        try:
            found = read_committed(self._consumer, list(self._tp.values()),
                                   time.monotonic() + self._timeout_s)
        except KafkaException as exc:
            raise TransportError(f"could not read committed offsets: {exc}") from exc
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}

    def end_offsets(self) -> Offsets:
        """Log-end offsets of the assigned partitions (within ``OFFSETS_TIMEOUT_S`` in all),
        asked through the transport's admin client (see the module docstring)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        self._check_open()
        deadline = time.monotonic() + self._offsets_timeout_s
        for fresh in (False, True):  # a second client at most, when the first one's is stale
            if self._admin is None:  # opened at the first call: only the lag tracker asks
                self._admin = AdminClient(self._admin_config)
            try:
                return list_end_offsets(self._admin, list(self._tp.values()), deadline)
            except TimeoutError as exc:
                raise TransportError(f"end offsets not read within "
                                     f"{self._offsets_timeout_s:g} s: {exc}") from exc
            except KafkaException as exc:
                # After a broker restart the partitions' leader epochs are newer than the
                # admin client's metadata, and librdkafka asks again with the old epoch:
                # FENCED_LEADER_EPOCH at every try, for good (a known librdkafka fault; an
                # outside test's /readyz stayed not ready for minutes after a broker
                # restart while decisions flowed). A new client reads the metadata afresh.
                self._admin = None
                if fresh or not _stale_epoch(exc) or deadline - time.monotonic() <= 0.1:
                    raise TransportError(f"could not read end offsets: {exc}") from exc
        raise AssertionError("unreachable: the second try returns or raises")

    def unread(self) -> dict[tuple[str, int], int | None]:
        """High watermark of the last fetch response minus the position, per partition
        (librdkafka's cached values: no network call); ``None`` before they are known."""
        from confluent_kafka import KafkaException

        positions = {(tp.topic, tp.partition): tp.offset
                     for tp in self._consumer.position(list(self._tp.values()))}
        out: dict[tuple[str, int], int | None] = {}
        for tp, confluent_tp in self._tp.items():
            try:
                low, high = self._consumer.get_watermark_offsets(confluent_tp, cached=True)
            except KafkaException:  # not known yet (no fetch response): say so
                low = high = -1
            position = positions.get(tp, -1)
            if position < 0:  # nothing read since the assignment: where reading starts
                position = self._sought.get(tp, low if low == high else -1)
            if high < 0 or position < 0:
                out[tp] = None
                continue
            lag = max(0, high - position)
            if self._shared is not None:
                lag += self._shared.buffered(tp)
            elif self._read:
                lag += sum(1 for m in self._read if (m.topic, m.partition) == tp)
            out[tp] = lag
        return out

    @property
    def _producer_owner(self) -> ConfluentTransport | SharedConfluentClients:
        """What keeps the producer's state (``flush_timed_out``): the shared clients when the
        producer is theirs (their close and their other transports' read it), else this."""
        return self if self._shared is None else self._shared

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush (best effort: not at all after a flush that timed out, see
        :func:`~streamlearn.transport.protocol.close_flush_seconds`), then close the consumer
        without committing."""
        if self._closed:
            return
        try:
            if hasattr(self, "_producer"):
                self.flush(close_flush_seconds(timeout_s, self._producer_owner.flush_timed_out))
        except TransportError:
            pass  # the error says how many messages are not acknowledged; close anyway
        self._closed = True
        self._admin = None  # an AdminClient has no close: its threads end when it is freed
        if self._shared is not None:  # the clients stay open for the other transports
            self._shared.detach(self._tp)
            return
        close_consumer(self._consumer)


def close_consumer(consumer: Any, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close ``consumer`` (it commits nothing: auto-commit is off), waiting at most
    ``timeout_s``; a close still waiting for the coordinator then goes on in the background."""
    closer = threading.Thread(target=consumer.close, name="streamlearn-consumer-close",
                              daemon=True)
    closer.start()
    closer.join(timeout_s)
    if closer.is_alive():
        log.warning("closing the Kafka consumer did not finish within %g s (commits in flight "
                    "wait for the group coordinator): left to the process exit", timeout_s)


class _Deliveries:
    """The producer's delivery reports: failed messages are kept to be produced again."""

    def __init__(self) -> None:
        self.failed: deque[tuple[str, bytes | None, bytes]] = deque()
        self.queued = 0

    def on_delivery(self, error: Any, record: Any) -> None:
        if error is not None:
            log.warning("delivery to %s failed, producing it again: %s", record.topic(), error)
            self.failed.append((record.topic(), record.key(), record.value()))

    def take_failed(self) -> list[tuple[str, bytes | None, bytes]]:
        taken = list(self.failed)
        self.failed.clear()
        return taken


class SharedConfluentClients:
    """One librdkafka consumer and producer for the partition transports of a replica.

    The counterpart of :class:`~streamlearn.transport.kafka_shared.SharedKafkaClients`, with
    the same invariants (see that module): records of a partition are handed out in offset
    order to the transport that attached it; a seek drops its buffered records; attaching or
    detaching partitions leaves the others' positions where they are (librdkafka's
    incremental assignment).
    """

    def __init__(self, bootstrap_servers: str, group_id: str,
                 client_options: Mapping[str, object] | None = None,
                 auto_offset_reset: str = "earliest", fetch_max_records: int = 2000,
                 tuning: ClientTuning | None = None) -> None:
        self.deliveries, self.commits = _Deliveries(), _Commits()
        self.consumer, self.producer = open_confluent_clients(
            bootstrap_servers, group_id, client_options, auto_offset_reset, tuning,
            self.deliveries.on_delivery, self.commits.on_commit)
        self.bootstrap_servers = bootstrap_servers
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_records = fetch_max_records
        self.flush_timed_out = False  # the last flush of the producer, by any transport
        self._partitions = PartitionBuffers()
        self._closed = False

    def attach(self, partitions: Mapping[Partition, Any], starts: list[Any]) -> None:
        """Add a transport's partitions to the consumer's assignment, reading from ``starts``
        (:func:`start_positions`)."""
        self._partitions.attach(partitions)
        self.consumer.incremental_assign(starts)

    def detach(self, partitions: Iterable[Partition]) -> None:
        """Remove a (closing) transport's partitions and their buffered records."""
        gone = self._partitions.detach(list(partitions))
        if gone and not self._closed:
            self.consumer.incremental_unassign(gone)

    def forget_buffered(self, positions: Mapping[Partition, int]) -> None:
        """A transport sought these partitions: drop what was fetched from before."""
        self._partitions.seek(positions)

    def buffered(self, partition: Partition) -> int:
        """Records of ``partition`` fetched but not yet taken."""
        return self._partitions.buffered(partition)

    def take(self, partitions: Iterable[Partition], max_records: int,
             timeout_s: float) -> list[Message]:
        """Up to ``max_records`` buffered records of ``partitions`` (a consume of at most
        ``timeout_s`` first when none is buffered)."""
        return self._partitions.take(partitions, max_records, lambda: self.fill(timeout_s))

    def fill(self, timeout_s: float) -> None:
        """Buffer what one consume of at most ``timeout_s`` reads (serving the callbacks)."""
        records = _records(consume_ready(self.consumer, self.fetch_max_records, timeout_s),
                           self.bootstrap_servers)
        self.producer.poll(0)
        self._partitions.put(records)

    def close(self, timeout_s: float = 10.0) -> None:
        """Close both clients (after the transports: their ``close`` flushes); the producer
        waits for nothing more after a flush of it that timed out (``close_flush_seconds``)."""
        if self._closed:
            return
        self._closed = True
        self.producer.flush(close_flush_seconds(timeout_s, self.flush_timed_out))
        close_consumer(self.consumer)
