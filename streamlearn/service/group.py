"""Consumer-group membership: Kafka decides which replica owns which input partitions.

:class:`GroupMembership` is one ``KafkaConsumer`` subscribed to the *instances*
topic only, in the group ``kafka.group_id``, with kafka-python's KIP-429
``CooperativeStickyAssignor`` (incremental rebalancing: a rebalance revokes only
the partitions that move, the others keep being served) and, when
``group_instance_id`` is set, static membership (KIP-345: a restart within the
session timeout keeps the member's partitions without a rebalance). Its
partitions are paused, so it fetches nothing: it only takes part in the group
protocol, and reports assignment changes for :class:`~streamlearn.service.replica.Replica`
to act on.

**Co-partitioning by construction.** Owning instances partition ``p`` means
serving partition ``p`` of *both* input topics: the replica reads feedback
partition ``p`` itself (assign mode), so the join always sees an event's
instance and feedback together. The alternative — subscribing to both topics
and relying on an assignor that co-partitions — holds for the (eager) range
assignor only; the cooperative one makes no such promise.

The membership consumer polls in its own thread, so heartbeats and joins go on
whatever the serving loop is doing (polled only between serving steps, a member
was evicted while busy). kafka-python calls the rebalance listener inside that
thread's ``poll``; the listener hands each change to the serving thread, which
applies it at its next :meth:`GroupMembership.poll`. A revocation waits until the
serving thread has stopped the partitions (final checkpoints written) — kafka-python
completes the revocation round only after ``on_partitions_revoked`` returns.

With ``kafka.client = confluent`` the member's consumer is librdkafka's, with the same
assignor and static membership; its rebalance callbacks run inside the membership
thread's polls in the same way (:meth:`GroupMembership._open_librdkafka`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from streamlearn.errors import TransportError
from streamlearn.transport import kafka_logs
from streamlearn.transport.kafka import RECONNECT_BACKOFF_MAX_MS

__all__ = ["GroupMembership"]

MIN_POLL_S = 0.05  # the membership thread's shortest poll cycle (a poll may return at once)
#: A settled member polls this often; one the group asks to rejoin (a rebalance) at once.
#: Each kafka-python poll costs about 1 CPU-ms (three hand-offs to its IO thread): at the
#: 0.1 s cadence of a rebalance the membership took 11.5 CPU-ms per second of an idle replica.
SETTLED_POLL_S = 0.5
BUSY_WINDOW_S = 5.0  # the watchdog looks at the poll thread's CPU over windows this long
BUSY_SHARE = 0.15  # ... and replaces the consumer when it used more than this share of a core

log = logging.getLogger("streamlearn.group")

Handler = Callable[[list[int]], None]


class _QuietPreRebalanceCommit(logging.Filter):
    """Drops kafka-python's error log of a failed pre-rebalance commit of the membership
    consumer (the commit of offsets nobody reads, bounded by its short poll, may time out);
    every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Pre-rebalance offset commit failed")


logging.getLogger("kafka.coordinator.consumer").addFilter(_QuietPreRebalanceCommit())
kafka_logs.install()


class GroupMembership:
    """One member of the serving group; see the module docstring.

    ``on_revoked`` / ``on_assigned`` / ``on_lost`` receive instance partition
    numbers and run inside :meth:`poll`. The revocation handler must finish what
    it does with those partitions before it returns; lost partitions (this member
    was evicted, e.g. after a pause longer than the session timeout) belong to
    another member already, so their handler must not write their state.
    """

    def __init__(self, bootstrap_servers: str, instances_topic: str, group_id: str,
                 on_assigned: Handler, on_revoked: Handler, on_lost: Handler,
                 group_instance_id: str | None = None,
                 client_options: Mapping[str, object] | None = None,
                 session_timeout_ms: int = 10_000, client: str = "kafka-python") -> None:
        from kafka import KafkaConsumer
        from kafka.consumer.subscription_state import ConsumerRebalanceListener
        from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
        from kafka.errors import KafkaError

        self.topic = instances_topic
        self.session_timeout_s = session_timeout_ms / 1000
        self.handlers = {"assigned": on_assigned, "revoked": on_revoked, "lost": on_lost}
        self._changes: queue.Queue[tuple[str, list[int], threading.Event]] = queue.Queue()
        self._closed = threading.Event()
        member = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            """Runs in the membership thread: hands each change to the serving thread."""

            def on_partitions_revoked(self, revoked: Any) -> None:
                member._hand_over("revoked", revoked, wait=True)

            def on_partitions_assigned(self, assigned: Any) -> None:
                tps = [tp for tp in assigned if tp.topic == member.topic]
                member.consumer.pause(*tps)  # membership only: the replica fetches itself
                member._hand_over("assigned", tps, wait=False)

            def on_partitions_lost(self, lost: Any) -> None:  # evicted: another owns them now
                member._hand_over("lost", lost, wait=False)

        options = {"reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
                   **{k: v for k, v in (client_options or {}).items()
                      if k in KafkaConsumer.DEFAULT_CONFIG}}

        def open_consumer() -> Any:
            consumer = KafkaConsumer(
                **options, bootstrap_servers=bootstrap_servers, group_id=group_id,
                group_instance_id=group_instance_id,
                # Auto-commit, though this consumer reads nothing. Without it, now and then
                # one replica's membership consumer burnt a core from its start (a busy loop
                # inside kafka-python 3.0.12's coordinator code, cf. dpkp/kafka-python#2695)
                # and the group evicted it ten seconds later (4 replicas in 7 diagnostic runs
                # of 3; with auto-commit no eviction in 18, the busy loop once). The watchdog
                # in _run replaces a consumer caught in that loop.
                # The offsets it commits (of paused partitions) are read by no one; see
                # _QuietPreRebalanceCommit.
                enable_auto_commit=True, auto_commit_interval_ms=1000,
                partition_assignment_strategy=(CooperativeStickyAssignor,),
                session_timeout_ms=session_timeout_ms,
                heartbeat_interval_ms=max(session_timeout_ms // 5, 500),
                client_id="streamlearn-member")
            # the group leader assigns only partitions it has metadata for: fetch it first
            deadline = time.monotonic() + 30.0
            while not consumer.partitions_for_topic(instances_topic):
                if time.monotonic() > deadline:
                    consumer.close(autocommit=False)
                    raise TransportError(f"no partition metadata for {instances_topic!r} "
                                         "after 30 s")
                time.sleep(0.1)
            consumer.subscribe([instances_topic], listener=Listener())
            return consumer

        self._open_consumer = open_consumer
        self.reopened = 0  # consumers replaced after a busy loop (see _run)
        self.client = client
        # librdkafka: the assignment as the rebalance callbacks told it. Its consumer's own
        # assignment() waits while a callback runs, and the revocation callback waits for the
        # serving thread, which asks for the assignment (Replica._recover): a deadlock.
        self._assignment: set[int] = set()
        self._assignment_lock = threading.Lock()
        try:
            self.consumer = open_consumer() if client != "confluent" else self._open_librdkafka(
                bootstrap_servers, group_id, group_instance_id, client_options or {},
                session_timeout_ms)
        except KafkaError as exc:
            raise TransportError(f"cannot join the group {group_id!r}: {exc}") from exc
        self._thread = threading.Thread(
            target=self._run_librdkafka if client == "confluent" else self._run,
            name="streamlearn-membership", daemon=True)
        self._thread.start()

    # ------------------------------------------------------ membership thread
    def _run(self) -> None:
        """Poll continuously: heartbeats and joins progress whatever the serving loop does."""
        from kafka.errors import KafkaError

        window, cpu = time.monotonic(), time.thread_time()
        while not self._closed.is_set():
            started = time.monotonic()
            try:
                self.consumer.poll(timeout_ms=100, max_records=1)
                # a poll can return at once (the client's next deadline at 0): never spin on it
                rest = MIN_POLL_S - (time.monotonic() - started)
                if rest > 0:
                    self._closed.wait(rest)
                # Heartbeats go on in the client's IO thread; only a rejoin (JoinGroup,
                # SyncGroup, the revocation round) needs this poll: settled, poll less often.
                while (time.monotonic() - started < SETTLED_POLL_S and not self._rejoining()
                       and not self._closed.wait(MIN_POLL_S)):
                    pass
                if time.monotonic() - window >= BUSY_WINDOW_S:
                    # Watchdog: this thread only waits on a healthy client (~1 % of a core).
                    # Stuck in the client's busy loop, it burns most of one: replace the
                    # consumer (with static membership it takes its slot back, same partitions).
                    share = (time.thread_time() - cpu) / (time.monotonic() - window)
                    if share > BUSY_SHARE:
                        self._reopen(share)
                    window, cpu = time.monotonic(), time.thread_time()
            except KafkaError as exc:  # a broker outage: the member rejoins when it is back
                log.warning("group poll failed: %s", exc)
                self._closed.wait(0.5)
            except Exception:  # never let the thread die silently: the replica would be deaf
                log.exception("group membership thread failed; retrying")
                self._closed.wait(0.5)
        self.consumer.close(autocommit=False)

    def _open_librdkafka(self, bootstrap_servers: str, group_id: str,
                         group_instance_id: str | None, client_options: Mapping[str, object],
                         session_timeout_ms: int) -> Any:
        """The member's consumer on librdkafka (``kafka.client = confluent``): the same group
        protocol and assignor (KIP-429 cooperative-sticky), so its rebalance callbacks hand
        over the same changes; heartbeats run in librdkafka's own threads."""
        from confluent_kafka import Consumer, KafkaException

        from streamlearn.transport import confluent

        member = self

        def track(partitions: list[Any], assigned: bool) -> None:
            with member._assignment_lock:
                for tp in partitions:
                    if tp.topic == member.topic:
                        (member._assignment.add if assigned
                         else member._assignment.discard)(tp.partition)

        def on_assign(consumer: Any, partitions: list[Any]) -> None:
            consumer.incremental_assign(partitions)
            consumer.pause(partitions)  # membership only: the replica fetches itself
            track(partitions, True)
            member._hand_over("assigned", partitions, wait=False)

        def on_revoke(consumer: Any, partitions: list[Any]) -> None:
            track(partitions, False)
            member._hand_over("revoked", partitions, wait=True)

        def on_lost(consumer: Any, partitions: list[Any]) -> None:
            track(partitions, False)
            member._hand_over("lost", partitions, wait=False)

        settings: dict[str, object] = {
            "bootstrap.servers": bootstrap_servers, "reconnect.backoff.max.ms": 2000,
            **confluent.librdkafka_options(client_options),
            "error_cb": confluent.log_client_error, "logger": confluent.LIBRDKAFKA_LOG,
            "client.id": "streamlearn-member", "group.id": group_id,
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": max(session_timeout_ms // 5, 500),
            "enable.auto.commit": False, "enable.partition.eof": False}
        if group_instance_id is not None:
            settings["group.instance.id"] = group_instance_id
        try:
            consumer = Consumer(settings)
            # the group leader assigns only partitions it has metadata for: fetch it first
            try:
                confluent.topic_partitions(consumer, self.topic)
            except TransportError:
                consumer.close()
                raise
            consumer.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke,
                               on_lost=on_lost)
        except KafkaException as exc:
            raise TransportError(f"cannot join the group {group_id!r}: {exc}") from exc
        return consumer

    def _run_librdkafka(self) -> None:
        """The membership thread on librdkafka: its polls only serve the rebalance callbacks
        (heartbeats go on in librdkafka's threads), so a settled member polls seldom."""
        while not self._closed.is_set():
            try:
                event = self.consumer.poll(SETTLED_POLL_S)
                if event is not None and event.error() is not None:
                    log.warning("group poll: %s", event.error())
            except Exception:  # never let the thread die silently: the replica would be deaf
                log.exception("group membership thread failed; retrying")
                self._closed.wait(0.5)
        self.consumer.close()

    def _rejoining(self) -> bool:
        """Whether the group waits for this member to (re)join: a rebalance began or the member
        is not a stable part of the group. kafka-python has no public call for it; read from
        its coordinator (attribute reads, no IO; a client without them: always true, so the
        thread polls at the MIN_POLL_S cadence)."""
        coordinator = getattr(self.consumer, "_coordinator", None)
        try:
            return bool(coordinator.need_rejoin() or not coordinator.stable())  # type: ignore[union-attr]
        except AttributeError:
            return True

    def _reopen(self, share: float) -> None:
        log.warning("group client busy-looping (%.0f %% of a core in its poll thread): "
                    "replacing its consumer", 100 * share)
        from kafka.errors import KafkaError

        try:
            self.consumer.close(autocommit=False, timeout_ms=5000)
        except Exception:  # a stuck client may not close cleanly; the new one takes over
            log.exception("closing the busy group consumer failed")
        while not self._closed.is_set():
            try:
                self.consumer = self._open_consumer()
            except (KafkaError, TransportError) as exc:
                log.warning("group consumer not reopened (retrying in 1 s): %s", exc)
                self._closed.wait(1.0)
                continue
            self.reopened += 1
            return

    def _hand_over(self, kind: str, tps: Any, wait: bool) -> None:
        parts = sorted(tp.partition for tp in tps if tp.topic == self.topic)
        if not parts:
            return
        (log.warning if kind == "lost" else log.info)("partitions %s %s", parts, kind)
        done = threading.Event()
        self._changes.put((kind, parts, done))
        # A revocation completes (final checkpoints written) before this member rejoins.
        # Once closing, nobody applies it (the replica has handed every partition over
        # already): return at once. This runs on kafka-python's IO thread, and blocking it
        # while the client closes from another thread let a socket read race the close
        # (a logged AttributeError inside kafka-python 3.0.12's transport).
        while wait and not self._closed.is_set() and not done.wait(0.1):
            pass

    # -------------------------------------------------------- serving thread
    def poll(self, timeout_s: float = 0.0) -> None:
        """Apply the assignment changes Kafka made since the last call (in this thread)."""
        try:
            kind, parts, done = self._changes.get(timeout=timeout_s) if timeout_s > 0 \
                else self._changes.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                self.handlers[kind](parts)
            finally:
                done.set()
            try:
                kind, parts, done = self._changes.get_nowait()
            except queue.Empty:
                return

    def assigned(self) -> set[int]:
        """The instances partitions the group assigns this member, as its client last heard."""
        if self.client == "confluent":
            with self._assignment_lock:
                return set(self._assignment)
        try:
            return {tp.partition for tp in self.consumer.assignment() if tp.topic == self.topic}
        except Exception:  # a consumer being replaced (see _reopen): nothing is known now
            return set()

    def close(self) -> None:
        """Leave the group (a static member keeps its slot for the session timeout); pending
        revocations are applied first."""
        self._closed.set()
        self.poll()
        self._thread.join(timeout=30)

