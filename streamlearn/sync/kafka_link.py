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
The serving thread never blocks on the models topic: the reads are this thread's, and
:meth:`KafkaModelLink.send` runs in the hub's send thread
(:mod:`streamlearn.sync.outbox`), where a state waits for the broker's acknowledgement
of the previous one (only the merger waits for its own, which its next catch-up must
find) and a merged model for its transaction's commit.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping

from streamlearn.errors import TransportError
from streamlearn.sync.link_clients import Delivery, MergerFenced, MergerProducer, link_clients

__all__ = ["KafkaModelLink", "ensure_models_topic"]

log = logging.getLogger("streamlearn.sync")


GLOBALS, STATES = 0, 1  # the models topic's partitions (one partition: both on 0)
IDLE_POLL_S = 0.5  # the reader's poll when this replica is not the merger
SETTLE_TIMEOUT_S = 30.0  # longest wait for the broker's acknowledgement of a state
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
    :meth:`follow_states` is on. ``client`` is the replica's ``kafka.client``
    (:mod:`streamlearn.sync.link_clients`)."""

    def __init__(self, bootstrap: str, topic: str,
                 client_options: Mapping[str, object] | None = None,
                 client: str = "kafka-python") -> None:
        self.topic = topic
        # the merger's transactional producer: opened (fencing the previous merger) by the
        # reader thread before it answers a catch-up while following, or by a global send
        self._merger: MergerProducer | None = None
        self._merger_lock = threading.Lock()  # opening, using and dropping it
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
        # (a few ms, twice a second); the next publish settles it
        self._states_in_flight: list[Delivery] = []
        try:
            self.clients = link_clients(client, bootstrap, topic, client_options or {})
            self._errors: tuple[type[BaseException], ...] = (TransportError,
                                                             *self.clients.errors)
            self.states_partition = STATES if STATES in self.clients.partitions else None
            self.clients.add(GLOBALS, None)
        except TransportError:
            raise
        except Exception as exc:  # the library's own errors
            raise TransportError(f"cannot open the models topic {topic!r}: {exc}") from exc
        self._thread = threading.Thread(target=self._run, name="streamlearn-models",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        targets: dict[int, int] = {}  # the end offsets the newest request must reach
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
                wait_s = 0.1 if self._following or asked > self._answered else IDLE_POLL_S
                values = [(partition == self.states_partition, value)
                          for partition, value in self.clients.poll(wait_s, 1000)]
                with self._lock:
                    self._buffer.extend(values)
                if asked > self._answered:
                    if self._following and self._merger is None:
                        self._open_merger()  # fence the previous merger before reading the end
                        target_for = 0  # (ends read before the fence are not enough)
                    if target_for != asked:  # the ends as of (after) the request
                        targets = self.clients.end_offsets()
                        target_for = asked
                    if all(self.clients.position(p) >= end for p, end in targets.items()):
                        with self._lock:
                            self._answered = target_for
                            self._states_read_to = (None if self.states_partition is None
                                                    else targets.get(self.states_partition))
            except self._errors as exc:
                log.warning("models topic: %s", exc)
                self._closed.wait(0.5)
            except Exception:  # never die silently: the replica would stop adopting models
                log.exception("models topic: reader thread failed; retrying")
                self._closed.wait(0.5)
        self.clients.close_consumer()

    def _open_merger(self) -> MergerProducer:
        """The merger's transactional producer, opened now if it is not (``init_transactions``
        fences every earlier producer of the same id and aborts its open transaction)."""
        with self._merger_lock:
            if self._merger is None:
                try:
                    self._merger = self.clients.open_merger(f"streamlearn-merger-{self.topic}")
                except self._errors as exc:
                    raise TransportError(
                        f"cannot open the merger's transactional producer on {self.topic!r} "
                        f"({exc}); the broker must allow transactions (on one broker: "
                        "transaction.state.log.replication.factor=1 and "
                        "transaction.state.log.min.isr=1)") from exc
            return self._merger

    def _drop_merger(self) -> None:
        with self._merger_lock:
            producer, self._merger = self._merger, None
        if producer is not None:
            producer.close()

    def _set_following(self, on: bool, from_offset: int | None) -> None:
        """In the reader thread: add the states partition (from ``from_offset``, or its
        beginning) or drop it."""
        self._following = on
        if self.states_partition is None:  # one partition: the states are read with the models
            return
        if on:
            self.clients.add(self.states_partition, from_offset)
        else:
            self.clients.drop(self.states_partition)
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
        if key == b"global":
            self._send_global(values)
            return
        partition = GLOBALS if self.states_partition is None else STATES
        with self._lock:
            following = self._follow[0]
        try:
            self._settle_states()
            deliveries = [self.clients.send(key + b"/%d" % i, value, partition)
                          for i, value in enumerate(values)]
            if following:  # the merger's catch-up before its merge must find its own state
                failed = self.clients.settle(deliveries, SETTLE_TIMEOUT_S)
                if failed is not None:
                    raise TransportError(failed)
                deliveries = []
            self._states_in_flight = deliveries
        except self._errors as exc:  # the next round publishes again
            raise TransportError(f"publishing to the models topic failed: {exc}") from exc

    def _settle_states(self) -> None:
        """The previous state publish, before the next: done long since at a sync interval's
        distance (else waited for, so that at most one is in flight); a failure is logged
        (that state is simply never merged; the one being published supersedes it)."""
        pending, self._states_in_flight = self._states_in_flight, []
        failed = self.clients.settle(pending, SETTLE_TIMEOUT_S) if pending else None
        if failed is not None:
            log.warning("models topic: the previous state publish failed: %s", failed)

    def _send_global(self, values: list[bytes]) -> None:
        """One transaction of the merger's producer; fenced (another replica opened the
        producer since), it is dropped and nothing of this model is ever read. A merger (a
        follower) publishes only with the producer its last catch-up opened; a writer outside
        that protocol opens one here."""
        with self._lock:
            following = self._follow[0]
        if following and self._merger is None:
            raise TransportError("not published: the merger's producer was dropped since the "
                                 "last catch-up (the next one opens it again)")
        producer = self._open_merger()
        try:
            with self._merger_lock:
                producer.publish([(b"global/%d" % i, value) for i, value in enumerate(values)],
                                 GLOBALS)
        except MergerFenced as exc:
            self._drop_merger()
            raise TransportError("not published: another replica is the merger now "
                                 f"(fenced by the broker: {exc})") from exc
        except self._errors as exc:  # the next round publishes again, from a fresh producer
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
        self.clients.close_producer(10)
        self._drop_merger()
