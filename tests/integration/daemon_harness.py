"""Shared pieces of the daemon's acceptance tests against a real broker.

The *caller* is what an application around streamlearn does: it publishes
instance events, reads the decisions, and answers each decision once with a
reward (1 when the chosen action is the label). It records every decision
it sees per id, so a test can check that re-emitted decisions are identical.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from streamlearn.datasets.caller import SimulatedCaller, StreamSource
from streamlearn.transport.kafka_clients import transport_class
from streamlearn.transport.protocol import Transport

PARTITIONS = 2


def make_topics(bootstrap: str, partitions: int = PARTITIONS,
                configs: dict[str, str] | None = None) -> dict[str, str]:
    """Fresh topic names for one run, created with ``partitions`` partitions."""
    run = uuid.uuid4().hex[:8]
    names = {"instances_topic": f"in-{run}", "feedback_topic": f"fb-{run}",
             "decisions_topic": f"dec-{run}", "dead_letter_topic": f"dlq-{run}"}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(n, partitions, 1, topic_configs=dict(configs or {}))
                             for n in names.values()], timeout_ms=30_000)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            described = admin.describe_topics(list(names.values()))
            if all(t["partitions"] and all(p["leader_id"] >= 0 for p in t["partitions"])
                   for t in described):
                break
            time.sleep(0.2)
    finally:
        admin.close()
    return names


#: ``kafka.client`` values; a test parametrized over them runs on both client libraries
#: (confluent is skipped where confluent-kafka is not installed).
CLIENTS = [pytest.param("kafka-python"),
           pytest.param("confluent", marks=pytest.mark.skipif(
               importlib.util.find_spec("confluent_kafka") is None,
               reason="confluent-kafka is not installed (the 'confluent' extra)"))]


def transport(bootstrap: str, topics: dict[str, str], group: str = "streamlearn",
              client: str = "kafka-python") -> Transport:
    return transport_class(client)(bootstrap, topics["instances_topic"], topics["feedback_topic"],
                                   topics["decisions_topic"], topics["dead_letter_topic"],
                                   group_id=group, request_timeout_s=30)


def producer(bootstrap: str, **kw: Any) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all",
                         reconnect_backoff_max_ms=1000, **kw)


def instance_value(i: int, x: np.ndarray, label: int, ts: float | None = None) -> bytes:
    """The sparse form ``{"idx", "val"}`` (the synthetic rows are ~10 % non-zero); ``ts``: an
    event time of its own (none: the broker's timestamp)."""
    nz = np.flatnonzero(x)
    value: dict[str, Any] = {"id": f"e{i}", "x": {"idx": nz.tolist(), "val": x[nz].tolist()},
                             "label": int(label)}
    if ts is not None:
        value["ts"] = ts
    return orjson.dumps(value)


def future_ts(i: int, every: int) -> float | None:
    """Every ``every``-th instance stamped far ahead (a producer with a wrong clock): two
    minutes, or 1e300, by turns; the others none. 0: never."""
    if not every or i % every != every // 2:
        return None
    return time.time() + 120.0 if (i // every) % 2 == 0 else 1e300


def publish_instances(prod: KafkaProducer, topic: str, X: np.ndarray, y: np.ndarray,
                      rows: Iterable[int], future_every: int = 0) -> None:
    for i in rows:
        prod.send(topic, key=f"e{i}".encode(),
                  value=instance_value(i, X[i], int(y[i]), future_ts(i, future_every)))


def read_all(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Any]:
    """Every record of ``topic`` up to its current end."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             group_id=None, consumer_timeout_ms=1000,
                             isolation_level="read_committed")  # not what a fence aborted
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        end = consumer.end_offsets(parts)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in parts):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end in {timeout_s} s")
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(records)
        return out
    finally:
        consumer.close()


class Caller(threading.Thread):
    """The library's simulated caller (``SimulatedCaller``) against the broker, in a thread.

    It answers each decision once (reward 1 iff the action is the label ``y[i]`` of
    event ``e<i>``; none for every ``drop_every``-th event), and records every
    decision seen per id, so a test can check that re-emitted decisions are identical.
    """

    def __init__(self, bootstrap: str, topics: dict[str, str], y: np.ndarray,
                 drop_every: int = 0, delay_mean_s: float = 0.0) -> None:
        super().__init__(daemon=True, name="caller")
        self.bootstrap, self.topics = bootstrap, topics
        source = StreamSource.from_arrays(np.zeros((len(y), 1)), y, int(np.max(y)) + 1)
        self.caller = SimulatedCaller(source, "e", delay_mean_s=delay_mean_s, dropped=(
            (lambda n: n % drop_every == 0) if drop_every else (lambda n: n < 0)))
        self.caller.remember(0, y)
        self.first: dict[str, bytes] = {}  # id → first decision value
        self.mismatches: list[tuple[str, bytes, bytes]] = []
        self.n_decisions = 0
        self.feedback_ids: list[str] = []
        self.dropped_ids: list[str] = []
        self.hold = threading.Event()  # set → decisions are recorded but not answered yet
        self._stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _run(self) -> None:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                 group_id=None, reconnect_backoff_max_ms=1000)
        topic = self.topics["decisions_topic"]
        deadline = time.monotonic() + 60
        while not consumer.partitions_for_topic(topic) and time.monotonic() < deadline:
            time.sleep(0.2)
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        prod = producer(self.bootstrap)
        waiting: list[bytes] = []
        while not self._stop_event.is_set():
            for records in consumer.poll(timeout_ms=50, max_records=2000).values():
                for r in records:
                    self.n_decisions += 1
                    event_id = orjson.loads(r.value)["id"]
                    seen = self.first.get(event_id)
                    if seen is None:
                        self.first[event_id] = r.value
                        waiting.append(r.value)
                    elif seen != r.value:
                        self.mismatches.append((event_id, seen, r.value))
            if self.hold.is_set():
                continue
            if waiting:
                dropped_before = self.caller.stats.dropped
                scheduled_before = self.caller.scheduled
                self.caller.answer(waiting, time.time())
                if self.caller.stats.dropped > dropped_before:  # those never get feedback
                    kept = set(self.caller._queue.scheduled_ids[scheduled_before:])
                    self.dropped_ids += [i for i in (orjson.loads(v)["id"] for v in waiting)
                                         if i not in kept]
                waiting = []
            answered = self.caller.due(time.time())
            for key, value in answered:
                prod.send(self.topics["feedback_topic"], key=key, value=value)
                self.feedback_ids.append(key.decode())
            if answered:
                prod.flush()
        prod.close()
        consumer.close()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)


def wait_until(predicate: Any, timeout_s: float, what: str, detail: Any = None,
               interval_s: float = 0.2) -> float:
    """Wait for ``predicate()``; return the seconds waited, or fail saying what was missing."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            extra = f"; {detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{extra}")
        time.sleep(interval_s)
    return time.monotonic() - started


REPO = Path(__file__).resolve().parents[2]


def serve_crashable(bootstrap: str, topics: dict[str, str], ckpt: Path, log: Path,
                    *extra: str, gamma: float = 0.05) -> subprocess.Popen[bytes]:
    """``streamlearn serve`` as the crash tests run it (Banditron, fixed γ, checkpoints every
    5,000 input messages or 2 s, a one-hour join window), output appended to ``log``."""
    args = [sys.executable, "-m", "streamlearn", "serve", "--bootstrap", bootstrap,
            "--topics-instances", topics["instances_topic"],
            "--topics-feedback", topics["feedback_topic"],
            "--topics-decisions", topics["decisions_topic"],
            "--topics-dead-letter", topics["dead_letter_topic"],
            "--checkpoint-dir", str(ckpt), "--checkpoint-every-events", "5000",
            "--checkpoint-every-seconds", "2", "--metrics-port", "-1",
            "--progress-seconds", "0", "--learner", "banditron", "--exploration", "fixed",
            "--gamma", str(gamma), "--seed", "5", "--join-window-seconds", "3600", *extra]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "ab") as out:
        began = out.tell()
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    STARTED.append(proc)
    LOG_FROM[proc.pid] = (log, began)
    return proc


#: where in its log each daemon of :func:`serve_crashable` began writing, by pid
LOG_FROM: dict[int, tuple[Path, int]] = {}
_HEADER = re.compile(r"streamlearn serve: .*; checkpoints: ")


def wait_started(proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    """Wait until ``proc`` (from :func:`serve_crashable`) printed its header: from then on a
    SIGTERM stops it cleanly, where one during its imports kills it (exit -15). A test that
    stops the daemon it started last needs this: the daemons before may have done all the
    work, so that every other condition already holds when it starts."""
    log, began = LOG_FROM[proc.pid]
    wait_until(lambda: _HEADER.search(log.read_bytes()[began:].decode("utf-8", "replace"))
               is not None, timeout_s, "the daemon to start",
               lambda: log.read_bytes()[began:].decode("utf-8", "replace")[-2000:])


#: every daemon :func:`serve_crashable` started; the integration conftest kills those still
#: running when their test ends (a failed test must not leave a daemon behind for the next)
STARTED: list[subprocess.Popen[bytes]] = []


class Publisher(threading.Thread):
    """Publishes every instance at about ``rate`` per second (chunks every 0.1 s) until all
    are published or :meth:`stop` is called (then it flushes what it sent and closes).

    With ``hold_at`` it stops after that many instances until :meth:`release` (or
    :meth:`stop`): a test can then act on a stream that is known not to be over, however
    slowly the daemon started."""

    def __init__(self, bootstrap: str, topic: str, X: np.ndarray, y: np.ndarray,
                 rate: int, hold_at: int | None = None, future_every: int = 0) -> None:
        super().__init__(daemon=True, name="publisher")
        self.bootstrap, self.topic, self.X, self.y, self.rate = bootstrap, topic, X, y, rate
        self.hold_at, self.future_every = hold_at, future_every
        self._stop_event = threading.Event()
        self._released = threading.Event()

    def release(self) -> None:
        """Publishes the rest after a hold."""
        self._released.set()

    def run(self) -> None:
        prod = producer(self.bootstrap)
        chunk = self.rate // 10
        for lo in range(0, len(self.y), chunk):
            if self.hold_at is not None and lo >= self.hold_at:
                prod.flush()
                while not (self._released.is_set() or self._stop_event.is_set()):
                    self._released.wait(0.1)
            if self._stop_event.is_set():
                break
            publish_instances(prod, self.topic, self.X, self.y,
                              range(lo, min(len(self.y), lo + chunk)), self.future_every)
            time.sleep(0.1)
        prod.flush()
        prod.close()

    def stop(self, timeout: float = 30) -> None:
        self._stop_event.set()
        self.join(timeout)


def start_publisher(bootstrap: str, topic: str, X: np.ndarray, y: np.ndarray,
                    rate: int, hold_at: int | None = None, future_every: int = 0) -> Publisher:
    """A started :class:`Publisher` (``future_every``: see :func:`future_ts`)."""
    publisher = Publisher(bootstrap, topic, X, y, rate, hold_at, future_every)
    publisher.start()
    return publisher
