"""The models topic over Kafka: one partition, compacted, read from its beginning.

The link's consumer polls in its own thread (kafka-python completes a fetch only
while ``poll`` waits; polled in short slices between serving steps, it fell
seconds behind under load). The thread buffers every message; :meth:`fetch`
hands them over; :meth:`request_catch_up` asks the thread to read up to the
topic's current end, and :meth:`caught_up` says (without waiting) whether it has.
The serving thread never blocks on the models topic.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping

from streamlearn.errors import TransportError

__all__ = ["KafkaModelLink", "ensure_models_topic"]

log = logging.getLogger("streamlearn.sync")


def ensure_models_topic(bootstrap: str, topic: str,
                        client_options: Mapping[str, object] | None = None) -> None:
    """Create the models topic (one partition, ``cleanup.policy=compact``) if it is missing."""
    from streamlearn.stream.kafka import ensure_topics

    ensure_topics(bootstrap, [topic], 1, client_options=client_options,
                  topic_configs={"cleanup.policy": "compact"})


class KafkaModelLink:
    """Chunks go out keyed ``<key>/<i>`` (compaction keeps the newest of each); every
    message of the topic is read, from its beginning, by a background thread."""

    def __init__(self, bootstrap: str, topic: str,
                 client_options: Mapping[str, object] | None = None) -> None:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition
        from kafka.errors import KafkaError

        options = dict(client_options or {})
        self.topic = topic
        self.tp = TopicPartition(topic, 0)
        self._buffer: deque[bytes] = deque()
        self._lock = threading.Lock()
        # catch-up requests, numbered: the serving thread asks, the reader answers the newest
        self._asked = 0
        self._answered = 0
        self._closed = threading.Event()
        try:
            self.consumer = KafkaConsumer(
                **{k: v for k, v in options.items() if k in KafkaConsumer.DEFAULT_CONFIG},
                bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                client_id="streamlearn-models")
            deadline = time.monotonic() + 30.0  # a topic created just now: wait for its metadata
            while not self.consumer.partitions_for_topic(topic):
                if time.monotonic() > deadline:
                    raise TransportError(f"no metadata for the models topic {topic!r} after 30 s")
                time.sleep(0.1)
            self.consumer.assign([self.tp])
            self.consumer.seek_to_beginning(self.tp)
            self.producer = KafkaProducer(
                **{k: v for k, v in options.items() if k in KafkaProducer.DEFAULT_CONFIG},
                bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                client_id="streamlearn-models")
            self.producer.partitions_for(topic)  # its metadata now, not at the first publish
        except KafkaError as exc:
            raise TransportError(f"cannot open the models topic {topic!r}: {exc}") from exc
        self._thread = threading.Thread(target=self._run, name="streamlearn-models",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kafka.errors import KafkaError

        target, target_for = 0, 0  # the end offset the newest request must reach
        while not self._closed.is_set():
            try:
                batches = self.consumer.poll(timeout_ms=100, max_records=1000)
                values = [r.value for records in batches.values() for r in records if r.value]
                with self._lock:
                    self._buffer.extend(values)
                    asked = self._asked
                if asked > self._answered:
                    if target_for != asked:  # the end as of (after) the request
                        target, target_for = self.consumer.end_offsets([self.tp])[self.tp], asked
                    if self.consumer.position(self.tp) >= target:
                        with self._lock:
                            self._answered = target_for
            except KafkaError as exc:
                log.warning("models topic: poll failed: %s", exc)
                self._closed.wait(0.5)
            except Exception:  # never die silently: the replica would stop adopting models
                log.exception("models topic: reader thread failed; retrying")
                self._closed.wait(0.5)
        self.consumer.close()

    def send(self, key: bytes, values: list[bytes]) -> None:
        from kafka.errors import KafkaError

        try:
            for i, value in enumerate(values):
                self.producer.send(self.topic, key=key + b"/%d" % i, value=value)
            self.producer.flush(timeout=30)
        except KafkaError as exc:  # the next round publishes again
            raise TransportError(f"publishing to the models topic failed: {exc}") from exc

    def fetch(self) -> list[bytes]:
        """The messages read since the last call (never waits: the thread reads)."""
        with self._lock:
            values = list(self._buffer)
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
