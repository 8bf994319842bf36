"""The models topic over Kafka: compacted, global models on partition 0, replica states on 1.

**Two partitions, so that only the merger reads the replicas' states.** Every
replica must read the global models (partition 0); only the merger (the replica
serving instances partition 0) needs the replicas' states. With both on one
partition every replica fetched every replica's state, several times a second:
with 3 replicas on SynNonSep (0.15 MB states) 2.4 MB/s per replica, in proportion
to the group's size (the models client's IO thread was the busiest thread after
the serving one). :meth:`KafkaModelLink.follow_states` makes the reader add
partition 1 when this replica becomes the merger, from the offset the newest
global model names (``states_from``: every state based on that version was
published after it, so nothing older is needed), and drop it when the role moves.
A models topic made with one partition (before this layout) still works: both
kinds then share partition 0 and every replica reads everything, as before.

The topic is created with ``segment.ms`` of 60 s so that the log cleaner can
compact it (Kafka never compacts the active segment, 7 days long by default):
what a replica reads from the beginning at its start stays bounded by about a
minute of publishes plus one message per key.

**The merger is fenced by Kafka.** Global models go out in transactions of one
producer whose ``transactional.id`` is the topic's (``streamlearn-merger-<topic>``),
and every reader reads ``read_committed``. Whoever takes the merger role opens
that producer (``init_transactions``) *before* the catch-up that precedes its
first merge: the broker then aborts the previous merger's open transaction and
refuses every later one of its (``ProducerFencedError``), so a replica paused
past its session timeout, woken up still believing it merges, publishes nothing;
and what the previous merger committed before the fence is read by the catch-up,
so the new merger's version is above it. Global versions on the topic are
therefore unique and increasing whatever the pauses. (Checking the topic's end
before publishing, as the hub does too, cannot do this alone: a pause between
the check and the send defeats it.) The broker must allow transactions: on a
single broker, ``transaction.state.log.replication.factor=1`` and
``transaction.state.log.min.isr=1`` (deploy/kafka does).

The link's consumer polls in its own thread (kafka-python completes a fetch only
while ``poll`` waits; polled in short slices between serving steps, it fell
seconds behind under load). The thread buffers every message; :meth:`fetch`
hands them over; :meth:`request_catch_up` asks the thread to read up to the
topic's current end, and :meth:`caught_up` says (without waiting) whether it has.
The serving thread never blocks on the models topic's reads, nor on the broker's
acknowledgement of a state it publishes (only the merger waits for its own, which its
next catch-up must find).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from streamlearn.errors import TransportError

__all__ = ["KafkaModelLink", "ensure_models_topic"]

log = logging.getLogger("streamlearn.sync")


GLOBALS, STATES = 0, 1  # the models topic's partitions (one partition: both on 0)
IDLE_POLL_MS = 500  # the reader's poll when this replica is not the merger
TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.ms": "60000",
                 "min.cleanable.dirty.ratio": "0.1"}


def ensure_models_topic(bootstrap: str, topic: str,
                        client_options: Mapping[str, object] | None = None) -> None:
    """Create the models topic (two partitions, compacted; see the module docstring) if it
    is missing."""
    from streamlearn.transport.kafka import ensure_topics

    ensure_topics(bootstrap, [topic], 2, client_options=client_options,
                  topic_configs=TOPIC_CONFIGS)


class KafkaModelLink:
    """Chunks go out keyed ``<key>/<i>`` (compaction keeps the newest of each); a background
    thread reads the global models from the beginning, and the replica states while
    :meth:`follow_states` is on."""

    def __init__(self, bootstrap: str, topic: str,
                 client_options: Mapping[str, object] | None = None) -> None:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition
        from kafka.errors import KafkaError

        options = dict(client_options or {})
        self.topic, self._bootstrap = topic, bootstrap
        self._producer_options = {k: v for k, v in options.items()
                                  if k in KafkaProducer.DEFAULT_CONFIG}
        # the merger's transactional producer: opened (fencing the previous merger) by the
        # reader thread before it answers a catch-up while following, or by a global send
        self._merger: Any = None
        self._merger_lock = threading.Lock()  # opening, using and dropping it
        self.tp = TopicPartition(topic, GLOBALS)
        self._buffer: deque[tuple[bool, bytes]] = deque()  # (from the states partition, value)
        self._lock = threading.Lock()
        # catch-up requests, numbered: the serving thread asks, the reader answers the newest
        self._asked = 0
        self._answered = 0
        # the states partition: wanted by the serving thread, applied by the reader thread
        self._follow: tuple[bool, int | None] = (False, None)
        self._following = False
        self._states_read_to: int | None = None  # position on it at the last catch-up
        self._closed = threading.Event()
        # a replica's last state publish: a non-merger does not wait for the broker's acks
        # on the serving thread (a few ms, twice a second); the next publish settles it
        self._states_in_flight: list[Any] = []
        try:
            self.consumer = KafkaConsumer(
                **{k: v for k, v in options.items() if k in KafkaConsumer.DEFAULT_CONFIG},
                bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                isolation_level="read_committed",  # never a fenced merger's model
                auto_offset_reset="earliest",  # a compacted-away start offset: the oldest kept
                client_id="streamlearn-models")
            deadline = time.monotonic() + 30.0  # a topic created just now: wait for its metadata
            while not (parts := self.consumer.partitions_for_topic(topic)):
                if time.monotonic() > deadline:
                    raise TransportError(f"no metadata for the models topic {topic!r} after 30 s")
                time.sleep(0.1)
            self.states_tp = TopicPartition(topic, STATES) if STATES in parts else None
            self.consumer.assign([self.tp])
            self.consumer.seek_to_beginning(self.tp)
            self.producer = KafkaProducer(
                **self._producer_options, bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                client_id="streamlearn-models")
            self.producer.partitions_for(topic)  # its metadata now, not at the first publish
        except KafkaError as exc:
            raise TransportError(f"cannot open the models topic {topic!r}: {exc}") from exc
        self._thread = threading.Thread(target=self._run, name="streamlearn-models",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kafka.errors import KafkaError

        targets: dict[object, int] = {}  # the end offsets the newest request must reach
        target_for = 0
        while not self._closed.is_set():
            try:
                with self._lock:  # read together: a request made after follow_states sees it
                    follow, asked = self._follow, self._asked
                if follow[0] != self._following:
                    self._set_following(*follow)
                    target_for = 0  # a pending request's targets now include the change
                # a poll returns as soon as records arrive; the wait only bounds how late a
                # catch-up request or a follow change is seen, which only the merger makes
                wait_ms = 100 if self._following or asked > self._answered else IDLE_POLL_MS
                batches = self.consumer.poll(timeout_ms=wait_ms, max_records=1000)
                values = [(tp == self.states_tp, r.value) for tp, records in batches.items()
                          for r in records if r.value]
                with self._lock:
                    self._buffer.extend(values)
                if asked > self._answered:
                    if self._following and self._merger is None:
                        self._open_merger()  # fence the previous merger before reading the end
                        target_for = 0  # (ends read before the fence are not enough)
                    if target_for != asked:  # the ends as of (after) the request
                        targets = self.consumer.end_offsets(list(self.consumer.assignment()))
                        target_for = asked
                    if all(self.consumer.position(tp) >= end for tp, end in targets.items()):
                        with self._lock:
                            self._answered = target_for
                            self._states_read_to = targets.get(self.states_tp)
            except (KafkaError, TransportError) as exc:
                log.warning("models topic: %s", exc)
                self._closed.wait(0.5)
            except Exception:  # never die silently: the replica would stop adopting models
                log.exception("models topic: reader thread failed; retrying")
                self._closed.wait(0.5)
        self.consumer.close()

    def _open_merger(self) -> Any:
        """The merger's transactional producer, opened now if it is not (``init_transactions``
        fences every earlier producer of the same id and aborts its open transaction)."""
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        with self._merger_lock:
            if self._merger is None:
                producer = KafkaProducer(
                    **self._producer_options, bootstrap_servers=self._bootstrap, acks="all",
                    linger_ms=5, transactional_id=f"streamlearn-merger-{self.topic}",
                    client_id="streamlearn-models-merger")
                try:
                    producer.init_transactions()
                except KafkaError as exc:
                    producer.close(timeout=5)
                    raise TransportError(
                        f"cannot open the merger's transactional producer on {self.topic!r} "
                        f"({exc}); the broker must allow transactions (on one broker: "
                        "transaction.state.log.replication.factor=1 and "
                        "transaction.state.log.min.isr=1)") from exc
                self._merger = producer
            return self._merger

    def _drop_merger(self) -> None:
        with self._merger_lock:
            producer, self._merger = self._merger, None
        if producer is not None:
            producer.close(timeout=5)

    def _set_following(self, on: bool, from_offset: int | None) -> None:
        """In the reader thread: add the states partition (from ``from_offset``, or its
        beginning) or drop it."""
        self._following = on
        if self.states_tp is None:  # one partition: the states are read with the models
            return
        self.consumer.assign([self.tp, self.states_tp] if on else [self.tp])
        if on and from_offset is not None:
            self.consumer.seek(self.states_tp, from_offset)
        elif on:
            self.consumer.seek_to_beginning(self.states_tp)
        with self._lock:
            self._states_read_to = None

    def follow_states(self, on: bool, from_offset: int | None = None) -> None:
        """Read the replicas' states too (the merger) from ``from_offset``, or stop reading
        them; applied by the reader thread, before it answers a later catch-up request."""
        with self._lock:
            self._follow = (on, from_offset)

    def states_position(self) -> int | None:
        """The states partition's offset the last answered catch-up read up to (None if this
        link does not follow it, or the topic has one partition)."""
        with self._lock:
            return self._states_read_to

    def send(self, key: bytes, values: list[bytes]) -> None:
        from kafka.errors import KafkaError

        if key == b"global":
            self._send_global(values)
            return
        partition = GLOBALS if self.states_tp is None else STATES
        with self._lock:
            following = self._follow[0]
        try:
            self._settle_states()
            futures = [self.producer.send(self.topic, key=key + b"/%d" % i, value=value,
                                          partition=partition)
                       for i, value in enumerate(values)]
            if following:  # the merger's catch-up before its merge must find its own state
                self.producer.flush(timeout=30)
            self._states_in_flight = futures
        except KafkaError as exc:  # the next round publishes again
            raise TransportError(f"publishing to the models topic failed: {exc}") from exc

    def _settle_states(self) -> None:
        """The previous state publish, before the next: done long since at a sync interval's
        distance (else waited for, so that at most one is in flight); a failure is logged
        (that state is simply never merged; the one being published supersedes it)."""
        pending, self._states_in_flight = self._states_in_flight, []
        if not all(f.is_done for f in pending):
            self.producer.flush(timeout=30)
        failed = [f.exception for f in pending if f.is_done and f.failed()]
        if failed:
            log.warning("models topic: the previous state publish failed: %s", failed[0])

    def _send_global(self, values: list[bytes]) -> None:
        """One transaction of the merger's producer; fenced (another replica opened the
        producer since), it is dropped and nothing of this model is ever read. A merger (a
        follower) publishes only with the producer its last catch-up opened; a writer outside
        that protocol opens one here."""
        from kafka.errors import KafkaError, ProducerFencedError

        with self._lock:
            following = self._follow[0]
        if following and self._merger is None:
            raise TransportError("not published: the merger's producer was dropped since the "
                                 "last catch-up (the next one opens it again)")
        producer = self._open_merger()
        try:
            with self._merger_lock:
                producer.begin_transaction()
                for i, value in enumerate(values):
                    producer.send(self.topic, key=b"global/%d" % i, value=value,
                                  partition=GLOBALS)
                producer.commit_transaction()
        except ProducerFencedError as exc:
            self._drop_merger()
            raise TransportError("not published: another replica is the merger now "
                                 f"(fenced by the broker: {exc})") from exc
        except KafkaError as exc:  # the next round publishes again, from a fresh producer
            self._drop_merger()  # (an aborted transaction is never read)
            raise TransportError(f"publishing to the models topic failed: {exc}") from exc

    def fetch(self) -> list[bytes]:
        """The messages read since the last call (never waits: the thread reads)."""
        with self._lock:
            following = self._follow[0]  # states read before an unfollow are not handed out
            values = [value for is_state, value in self._buffer if following or not is_state]
            self._buffer.clear()
        return values

    def request_catch_up(self) -> None:
        """Ask the reader to read everything published so far (answered by :meth:`caught_up`)."""
        with self._lock:
            self._asked += 1

    def caught_up(self) -> bool:
        """Whether everything published before the last :meth:`request_catch_up` has been
        read (the messages are then in :meth:`fetch`); never waits."""
        with self._lock:
            return self._answered >= self._asked

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=10)
        self.producer.close(timeout=10)
        self._drop_merger()
