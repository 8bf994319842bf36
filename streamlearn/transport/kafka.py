"""The Kafka transport (kafka-python): one assigned consumer, an idempotent producer."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from streamlearn.errors import TransportError
from streamlearn.transport import kafka_logs
from streamlearn.transport.protocol import (
    VECTOR_HASH_MIN_KEYS,
    ClientTuning,
    Message,
    Offsets,
    check_offsets,
    close_flush_seconds,
    partitions_for_keys,
)

if TYPE_CHECKING:
    import threading

    from streamlearn.transport.kafka_shared import SharedKafkaClients

__all__ = ["CONNECT_TIMEOUT_S", "FETCH_MAX_WAIT_MS", "LINGER_S", "OFFSETS_TIMEOUT_S",
           "RECONNECT_BACKOFF_MAX_MS", "KafkaTransport", "check_reachable", "close_producer",
           "ensure_topics", "open_clients", "open_offsets_reader", "to_message"]

#: How long :func:`check_reachable` waits for some bootstrap server to accept a connection.
CONNECT_TIMEOUT_S = 5.0

#: Every kafka-python client the daemon opens retries a broker connection at least this often
#: (``reconnect_backoff_max_ms``; librdkafka's ``reconnect.backoff.max.ms`` is set alike).
#: kafka-python's default, 30 s, doubles the wait after each failed attempt: after a broker
#: outage of 30 s a client's next attempt could come 25 s after the broker was back, and the
#: changelog's producers, the group membership and the models link each waited out their own.
RECONNECT_BACKOFF_MAX_MS = 2000

#: The consumer's default ``fetch_max_wait_ms`` (``kafka.fetch_wait_seconds``; kafka-python's
#: default is 500). kafka-python keeps one
#: fetch in flight per broker and leaves out of it every partition whose records are still
#: buffered; so while a poll's instances are being worked through, the fetch in flight holds
#: only the other partitions — the feedback topic's, often empty — and the broker keeps it up
#: to this long waiting for data. The next instances cannot be fetched until it returns: under
#: a backlog at 500 ms the daemon spent 24 µs per event polling against 10.5 µs at 5–100 ms
#: (docs/performance.md). An idle consumer sends about 1000 / this many fetches per second.
FETCH_MAX_WAIT_MS = round(ClientTuning().fetch_wait_s * 1000)

#: The producer's linger where ``kafka.linger_seconds`` is unset. kafka-python's sender thread
#: is Python: it wakes for each new batch and takes the GIL from the serving loop for each
#: produce request, so batches are held long enough to gather a step's decisions. At 2,000
#: events/s 1 ms instead read decisions ~1 ms sooner but took 4 % more CPU per event and
#: ~5 % of the throughput under a backlog (docs/performance.md, "The producer linger per
#: client").
LINGER_S = 0.005

#: Bound on the ``end_offsets`` and ``commit`` requests of the serving loop (at most
#: ``request_timeout_s``). The loop asks for the end offsets to measure its lag
#: (``LagTracker``, once a second) and commits after each snapshot; a healthy broker answers
#: in milliseconds. While the broker is away the loop must not sit in these requests for the
#: full request timeout (30 s): a SIGTERM 8 s into an outage then took 22-31 s to stop
#: ``serve``; a failed commit is retried by the next checkpoint (the snapshot holds the offsets).
OFFSETS_TIMEOUT_S = 3.0

kafka_logs.install()  # no traceback in the log of a clean close (see the module)

_OWNED_OPTIONS = frozenset(
    {
        "bootstrap_servers",
        "group_id",
        "enable_auto_commit",
        "enable_idempotence",
        "acks",
        "key_serializer",
        "value_serializer",
        "key_deserializer",
        "value_deserializer",
        "transactional_id",
    }
)


log = logging.getLogger(__name__)


def _log_failed_commit(offsets: object, response: object) -> None:
    """The callback of a commit not waited for: a failure is logged (the next commits again)."""
    if isinstance(response, BaseException):
        log.warning("committing offsets %s failed (the next checkpoint commits again): %r",
                    offsets, response)


def _split_options(options: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """Route each client option to the consumer and/or the producer that knows it."""
    from kafka import KafkaConsumer, KafkaProducer

    owned = sorted(_OWNED_OPTIONS.intersection(options))
    if owned:
        raise TransportError(
            f"client_options may not set {owned}: the transport fixes them "
            "(manual commits, idempotent acks=all producer, raw bytes)"
        )
    unknown = sorted(set(options) - set(KafkaConsumer.DEFAULT_CONFIG) - set(KafkaProducer.DEFAULT_CONFIG))
    if unknown:
        raise TransportError(f"unknown kafka-python client options {unknown}")
    consumer = {k: v for k, v in options.items() if k in KafkaConsumer.DEFAULT_CONFIG}
    producer = {k: v for k, v in options.items() if k in KafkaProducer.DEFAULT_CONFIG}
    return consumer, producer


def _host_port(server: str) -> tuple[str, int]:
    host, _, port = server.strip().rpartition(":")
    return host.strip("[]"), int(port)


def check_reachable(bootstrap_servers: str, timeout_s: float | None = None,
                    abandon: threading.Event | None = None) -> bool:
    """Return True once some bootstrap server accepts a TCP connection, False as soon as
    ``abandon`` is set (the wait given up: a stop asked for while a broker was awaited);
    else raise TransportError.

    kafka-python, given an address where nothing listens, retries for its
    ``bootstrap_timeout_ms`` (30 s) and logs every attempt; this check fails
    within ``timeout_s`` (default :data:`CONNECT_TIMEOUT_S`) with one message
    instead. Refused connections are retried until then, so a broker that is
    still starting is waited for.
    """
    timeout_s = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    servers = [s for s in bootstrap_servers.split(",") if s.strip()]
    problems: dict[str, str] = {}
    while abandon is None or not abandon.is_set():
        for server in servers:
            remaining = deadline - time.monotonic()
            try:
                host, port = _host_port(server)
                with socket.create_connection((host, port), timeout=max(min(remaining, 2.0), 0.1)):
                    return True
            except ValueError:
                problems[server] = "not HOST:PORT"
            except socket.gaierror as exc:
                problems[server] = f"unknown host ({exc.strerror or exc})"
            except TimeoutError:
                problems[server] = "connection timed out"
            except OSError as exc:
                problems[server] = (exc.strerror or str(exc)).lower()
        if time.monotonic() >= deadline:
            details = "; ".join(f"{server}: {why}" for server, why in problems.items())
            raise TransportError(f"cannot reach Kafka at {bootstrap_servers}: expected a broker "
                                 f"accepting connections within {timeout_s:g} s, got {details}")
        pause = min(0.25, max(deadline - time.monotonic(), 0.0))
        if abandon is None:
            time.sleep(pause)
        else:
            abandon.wait(pause)
    return False


def ensure_topics(
    bootstrap_servers: str,
    names: Iterable[str],
    partitions: int,
    replication_factor: int = 1,
    client_options: Mapping[str, object] | None = None,
    timeout_s: float = 30.0,
    topic_configs: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Create the missing topics among ``names``; return every topic's partition count.

    ``topic_configs`` (e.g. ``{"cleanup.policy": "compact"}``) apply to the topics created.

    Existing topics are left as they are, so a returned count may differ from
    ``partitions``; :class:`KafkaTransport` refuses input topics that are not
    co-partitioned.
    """
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    wanted = list(dict.fromkeys(names))
    check_reachable(bootstrap_servers)
    admin_keys = set(KafkaAdminClient.DEFAULT_CONFIG)
    options = {k: v for k, v in (client_options or {}).items() if k in admin_keys}
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **options)
    except KafkaError as exc:
        raise TransportError(f"cannot reach Kafka at {bootstrap_servers}: {exc}") from exc
    try:
        missing = [n for n in wanted if n not in set(admin.list_topics())]
        if missing:
            # A concurrent creator is fine: the counts are read below.
            with contextlib.suppress(TopicAlreadyExistsError):
                admin.create_topics(
                    [NewTopic(n, partitions, replication_factor, topic_configs=dict(topic_configs or {}))
                     for n in missing],
                    timeout_ms=int(timeout_s * 1000),
                )
        deadline = time.monotonic() + timeout_s
        while True:
            described = {
                t.get("name", t.get("topic")): len(t["partitions"])
                for t in admin.describe_topics(wanted)
                if all(p["leader_id"] >= 0 for p in t["partitions"])
            }
            if all(described.get(n, 0) > 0 for n in wanted) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    except KafkaError as exc:
        raise TransportError(f"could not create topics {wanted} on {bootstrap_servers}: {exc}") from exc
    finally:
        admin.close()
    absent = [n for n in wanted if described.get(n, 0) == 0]
    if absent:
        raise TransportError(f"topics {absent} not visible on {bootstrap_servers} after {timeout_s} s")
    return {n: described[n] for n in wanted}


def to_message(record: Any) -> Message:
    """A kafka-python ``ConsumerRecord`` as the transports hand it out."""
    return Message(record.topic, record.partition, record.offset, record.key, record.value,
                   record.timestamp)


def _shared_options() -> dict[str, object]:
    """What every kafka-python client of a transport is opened with (before the caller's
    ``client_options``)."""
    return {"client_id": "streamlearn", "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS}


def open_clients(bootstrap_servers: str, group_id: str | None,
                 client_options: Mapping[str, object] | None = None,
                 auto_offset_reset: str = "earliest",
                 tuning: ClientTuning | None = None) -> tuple[Any, Any]:
    """(consumer, idempotent acks=all producer) as every streamlearn transport opens them;
    ``tuning`` sets the producer's linger and the consumer's fetch wait and size (client
    options given for those win)."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import KafkaError

    consumer_opts, producer_opts = _split_options(client_options or {})
    check_reachable(bootstrap_servers)
    tuning = tuning or ClientTuning()
    common = _shared_options()
    fetch = {"fetch_max_wait_ms": round(tuning.fetch_wait_s * 1000),
             "fetch_min_bytes": tuning.fetch_min_bytes}
    try:
        consumer = KafkaConsumer(
            **{**fetch, **common, **consumer_opts},
            bootstrap_servers=bootstrap_servers,
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset=auto_offset_reset,
        )
        producer = KafkaProducer(
            **{"linger_ms": round((LINGER_S if tuning.linger_s is None else tuning.linger_s)
                                  * 1000), **common, **producer_opts},
            bootstrap_servers=bootstrap_servers,
            enable_idempotence=True,
            acks="all",
        )
    except KafkaError as exc:
        raise TransportError(f"cannot connect to Kafka at {bootstrap_servers}: {exc}") from exc
    return consumer, producer


def open_offsets_reader(bootstrap_servers: str,
                        client_options: Mapping[str, object] | None = None) -> Any:
    """A consumer of no group that only asks for offsets, beside a transport's own.

    The broker answers one connection's requests in order, so a ListOffsets request sent on
    a consumer's connection waits behind the fetch the broker holds there (up to
    ``kafka.fetch_wait_seconds``); this consumer never fetches, so it is answered at once."""
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    consumer_opts, _ = _split_options(client_options or {})
    try:
        return KafkaConsumer(**{**_shared_options(), **consumer_opts},
                             bootstrap_servers=bootstrap_servers, group_id=None,
                             enable_auto_commit=False)
    except KafkaError as exc:
        raise TransportError(f"cannot connect to Kafka at {bootstrap_servers}: {exc}") from exc


@dataclass(slots=True)
class _Pending:
    topic: str
    key: bytes | None
    value: bytes
    future: object


class KafkaTransport:
    """A :class:`Transport` on kafka-python: one consumer, one idempotent producer.

    The consumer is *assigned* (not subscribed) every partition of both input
    topics, or the ``partitions`` subset of them, so positions exist as soon as
    the object is built: ``seek`` right after construction is exact, with no
    rebalance to wait for or to undo it. ``group_id`` names where offsets are
    committed (a standalone group, visible to lag tools); start positions are
    the committed offsets, else ``auto_offset_reset``. Several replicas split the
    partitions with disjoint ``partitions`` lists. Instances and feedback must
    have the same partition count and be keyed by the same event id, so that an
    event's decision and its feedback reach the same replica.

    Parameters
    ----------
    bootstrap_servers : str
        ``host:port[,host:port...]``.
    instances_topic, feedback_topic, decisions_topic, dead_letter_topic : str
        Topic names.
    group_id : str
        Consumer group for committed offsets.
    client_options : mapping, optional
        kafka-python options passed to the consumer and/or producer that know
        them, e.g. ``security_protocol``, ``sasl_mechanism``,
        ``sasl_plain_username``, ``sasl_plain_password``, ``ssl_cafile``.
    partitions : list of int, optional
        The input partitions this replica reads; all by default.
    auto_offset_reset : {"earliest", "latest"}
        Start position of a partition without a committed offset.
    request_timeout_s : float
        Bound on metadata discovery, commit and end-offset requests (the latter two at most
        ``OFFSETS_TIMEOUT_S``).
    shared : SharedKafkaClients, optional
        Use these clients (one consumer and producer for several transports, e.g. the
        partition daemons of a replica) instead of opening a consumer and a producer;
        ``bootstrap_servers``, ``group_id``, ``client_options``, ``auto_offset_reset``
        and ``tuning`` are then the shared clients'.
    tuning : ClientTuning, optional
        The producer's linger and the consumer's fetch settings (``kafka.*``).
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
        shared: SharedKafkaClients | None = None,
        tuning: ClientTuning | None = None,
    ) -> None:
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        self.instances_topic = instances_topic
        self.feedback_topic = feedback_topic
        self.decisions_topic = decisions_topic
        self.dead_letter_topic = dead_letter_topic
        self.bootstrap_servers = bootstrap_servers
        self._timeout_ms = int(request_timeout_s * 1000)
        self._offsets_timeout_ms = min(self._timeout_ms, int(OFFSETS_TIMEOUT_S * 1000))
        self._pending: list[_Pending] = []
        self._closed = False
        # the last flush on this transport's producer ended with messages not acknowledged
        # (kept by the shared clients instead when the producer is theirs: _producer_owner)
        self.flush_timed_out = False
        self._shared = shared
        self._client_options = dict(client_options or {})
        self._offsets_reader: Any = None  # see end_offsets: opened when first needed
        if shared is None:
            self._consumer, self._producer = open_clients(
                bootstrap_servers, group_id, client_options, auto_offset_reset, tuning)
        else:
            self._consumer, self._producer = shared.consumer, shared.producer
        counts = {t: self._partition_count(t, request_timeout_s) for t in (instances_topic, feedback_topic)}
        n_inst, n_feed = counts[instances_topic], counts[feedback_topic]
        if n_inst != n_feed:
            self.close()
            raise TransportError(
                f"instances and feedback must be co-partitioned: {instances_topic!r} has "
                f"{n_inst} partitions, {feedback_topic!r} has {n_feed}"
            )
        chosen = list(range(n_inst)) if partitions is None else sorted(set(partitions))
        if not chosen or not all(0 <= p < n_inst for p in chosen):
            self.close()
            raise TransportError(f"expected partitions within 0..{n_inst - 1}, got {partitions}")
        self._assigned = {(t, p) for t in (instances_topic, feedback_topic) for p in chosen}
        self._tp = {tp: TopicPartition(*tp) for tp in self._assigned}
        self._commit_in_flight: Any = None  # the future of the last commit not waited for
        if shared is None:
            self._consumer.assign(list(self._tp.values()))
        else:
            shared.attach(self._tp)
        for topic in (decisions_topic, dead_letter_topic):
            # Fetch output metadata now, so that a later send never blocks on it.
            try:
                self._producer.partitions_for(topic)
            except KafkaError as exc:
                self.close()
                raise TransportError(f"output topic {topic!r} is not available: {exc!r}") from exc

    def _partition_count(self, topic: str, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            found = self._consumer.partitions_for_topic(topic)
            if found:
                return len(found)
            if time.monotonic() > deadline:
                self.close()
                raise TransportError(
                    f"topic {topic!r} not found on {self.bootstrap_servers} within {timeout_s} s; "
                    "create it (streamlearn.transport.kafka.ensure_topics)"
                )
            time.sleep(0.2)

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("the transport is closed")

    @property
    def producer_id(self) -> int:
        """The idempotent producer id the broker assigned (-1 until the first send)."""
        manager = self._producer._transaction_manager
        return -1 if manager is None else int(manager.producer_id_and_epoch.producer_id)

    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        """Fetch up to ``max_records``; while the broker is away this returns ``[]``."""
        from kafka.errors import KafkaError

        self._check_open()
        try:
            if self._shared is not None:
                return self._shared.take(self._tp, max_records, timeout_s)
            batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            if getattr(exc, "retriable", False):
                return []  # kafka-python reconnects on its own; the next poll resumes
            raise TransportError(f"poll failed on {self.bootstrap_servers}: {exc!r}") from exc
        return [to_message(r) for records in batches.values() for r in records]

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue one message; kafka-python retries it until the broker acknowledges it."""
        self.produce_many(topic, [key], [value])

    def produce_many(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        """Queue several messages in order (see ``Transport.produce_many``): :meth:`produce`
        with its per-call steps hoisted out of the loop (one ``send`` per message remains)."""
        from kafka.errors import KafkaError

        self._check_open()
        send = self._producer.send
        partitions: list[int | None] = [None] * len(keys)
        if len(keys) >= VECTOR_HASH_MIN_KEYS and all(key is not None for key in keys):
            # kafka-python's partitioner hashes each key in Python; the same murmur2 partition
            # for the whole batch at once (its partition count as the partitioner reads it)
            try:
                known = self._producer.partitions_for(topic)
            except KafkaError as exc:
                raise _not_queued(topic, exc, 0) from exc
            partitions = partitions_for_keys(cast(Sequence[bytes], keys), len(known)).tolist()
        for n, (key, value) in enumerate(zip(keys, values, strict=True)):
            try:
                future = send(topic, value=value, key=key, partition=partitions[n])
            except KafkaError as exc:
                raise _not_queued(topic, exc, n) from exc
            self._pending.append(_Pending(topic, key, value, future))
            if len(self._pending) >= 50_000:
                self._reap()

    def _reap(self) -> int:
        """Drop acknowledged messages, re-send failed ones; return how many are in flight."""
        kept: list[_Pending] = []
        for item in self._pending:
            future = item.future
            if not future.is_done:  # type: ignore[attr-defined]
                kept.append(item)
            elif future.failed():  # type: ignore[attr-defined]
                item.future = self._producer.send(item.topic, value=item.value, key=item.key)
                kept.append(item)
        self._pending = kept
        return len(kept)

    def flush(self, timeout_s: float) -> None:
        """Wait until every produced message is acknowledged, else raise TransportError.

        Messages not acknowledged are kept (failed ones are sent again), so a
        later ``flush`` can still deliver them; nothing is dropped.
        """
        from kafka.errors import KafkaError

        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(KafkaError):  # a timeout: in-flight messages counted below
                self._producer.flush(timeout=max(deadline - time.monotonic(), 0.0))
            in_flight = self._reap()
            if in_flight == 0:
                self._producer_owner.flush_timed_out = False
                return
            if time.monotonic() >= deadline:
                self._producer_owner.flush_timed_out = True
                raise TransportError(
                    f"{in_flight} produced messages not acknowledged by {self.bootstrap_servers} "
                    f"within {timeout_s} s; they are kept and retried by the next flush"
                )

    def commit(self, offsets: Mapping[tuple[str, int], int], *, wait: bool = True) -> None:
        """Commit the next offsets to read: synchronously, or (``wait=False``) sent now and
        completed by the client's IO while the loop goes on, a failure logged.

        A synchronous commit round-trips to the group coordinator (7-12 ms on the
        development machine, docs/performance.md), which the loop's periodic checkpoints
        need not wait for: restore reads the snapshot's offsets, the group's are for lag
        tools (and the next checkpoint commits again).

        At most one commit not waited for is in flight: kafka-python does not queue them
        (one made while the connection is at its in-flight limit fails at once, so a later
        commit could fail while an earlier one lands). A commit made while one is still in
        flight waits; the coordinator answers one connection in order, so the last commit
        made is the one that stands.
        """
        from kafka import OffsetAndMetadata
        from kafka.errors import KafkaError

        self._check_open()
        check_offsets(offsets, self._assigned, "commit")
        payload = {self._tp[tp]: OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()}
        try:
            in_flight = self._commit_in_flight is not None and not self._commit_in_flight.is_done
            if wait or in_flight:
                self._consumer.commit(payload, timeout_ms=self._offsets_timeout_ms)
            else:
                self._commit_in_flight = self._consumer.commit_async(
                    payload, callback=_log_failed_commit)
        except KafkaError as exc:
            raise TransportError(f"commit of {dict(offsets)} failed: {exc!r}") from exc

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Set the positions the next ``poll`` reads from."""
        self._check_open()
        check_offsets(offsets, self._assigned, "seek")
        for tp, off in offsets.items():
            self._consumer.seek(self._tp[tp], off)
        if self._shared is not None:  # records fetched before the seek are not to be read
            self._shared.forget_buffered(offsets)

    def assignment(self) -> set[tuple[str, int]]:
        """The assigned input partitions."""
        return set(self._assigned)

    def committed(self) -> Offsets:
        """Committed offsets of the group for the assigned partitions that have one."""
        from kafka.errors import KafkaError

        self._check_open()
        found: Offsets = {}
        try:
            for tp, kafka_tp in self._tp.items():
                off = self._consumer.committed(kafka_tp, timeout_ms=self._timeout_ms)
                if off is not None:
                    found[tp] = off
        except KafkaError as exc:
            raise TransportError(f"could not read committed offsets: {exc!r}") from exc
        return found

    def end_offsets(self) -> Offsets:
        """Log-end offsets of the assigned partitions, asked through a consumer of their own
        (:func:`open_offsets_reader`: not behind the fetch the broker holds for this one)."""
        from kafka.errors import KafkaError

        self._check_open()
        if self._offsets_reader is None:  # only the lag tracker asks, once a second
            self._offsets_reader = open_offsets_reader(self.bootstrap_servers,
                                                       self._client_options)
        try:
            ends = self._offsets_reader.end_offsets(
                list(self._tp.values()),
                timeout_ms=self._offsets_timeout_ms)
        except KafkaError as exc:
            raise TransportError(f"could not read end offsets: {exc!r}") from exc
        return {(tp.topic, tp.partition): off for tp, off in ends.items()}

    def unread(self) -> dict[tuple[str, int], int | None]:
        """High watermark of the last fetch response minus the consumer's position, per partition.

        Both are kept by kafka-python's subscription state (no network call);
        ``None`` before the first fetch response of a partition.
        """
        out: dict[tuple[str, int], int | None] = {}
        for tp, kafka_tp in self._tp.items():
            try:
                state = self._consumer._subscription.assignment[kafka_tp]
                position = state.position.offset if state.has_valid_position else None
                highwater = state.highwater
            except (AttributeError, KeyError):  # the client's internals moved: say "not known"
                position = highwater = None
            lag = None if position is None or highwater is None else max(0, highwater - position)
            if lag is not None and self._shared is not None:  # fetched, not yet taken
                lag += self._shared.buffered(tp)
            out[tp] = lag
        return out

    @property
    def _producer_owner(self) -> KafkaTransport | SharedKafkaClients:
        """What keeps the producer's state (``flush_timed_out``): the shared clients when the
        producer is theirs (their close and their other transports' read it), else this."""
        return self if self._shared is None else self._shared

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush (best effort: not at all after a flush that timed out, see
        :func:`~streamlearn.transport.protocol.close_flush_seconds`), then close the consumer
        without committing and the producer."""
        if self._closed:
            return
        wait = close_flush_seconds(timeout_s, self._producer_owner.flush_timed_out)
        try:
            if hasattr(self, "_producer"):
                self.flush(wait)
        except TransportError:
            pass  # the error already says how many messages are lost; close anyway
        self._closed = True
        if getattr(self, "_offsets_reader", None) is not None:
            self._offsets_reader.close(autocommit=False)
        if self._shared is not None:  # the clients stay open for the other transports
            self._shared.detach(getattr(self, "_tp", {}))
            return
        if hasattr(self, "_consumer"):
            self._consumer.close(autocommit=False)
        if hasattr(self, "_producer"):
            close_producer(self._producer, wait)


def close_producer(producer: Any, timeout_s: float) -> None:
    """Close a kafka-python producer, waiting at most ``timeout_s`` for what it has not sent.

    kafka-python's ``close`` flushes first and raises when that flush times out, leaving the
    producer open: its ``__del__`` then tried again at the process exit and printed the same
    traceback (an outside test's SIGTERM during a broker outage). What it had not sent is
    journaled or re-read after a restart (at least once), so the producer is closed anyway,
    as its own close does after a timeout: the sender thread stopped at once."""
    from kafka.errors import KafkaError

    try:
        producer.close(timeout=timeout_s)
    except KafkaError as exc:
        log.warning("closing the Kafka producer: %r; closed without waiting (what it had not "
                    "sent is journaled or re-read after a restart)", exc)
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()
        producer._closed = True  # as its own close marks it: its __del__ does nothing more


def _not_queued(topic: str, exc: Exception, queued: int) -> TransportError:
    """The error of a ``produce_many`` that queued only its first ``queued`` messages."""
    error = TransportError(f"could not queue a message for {topic}: {exc!r}")
    error.queued = queued  # type: ignore[attr-defined]
    return error
