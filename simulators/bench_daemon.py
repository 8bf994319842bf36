"""Benchmark of ``streamlearn serve`` through a real Kafka broker.

Three measurements, each on fresh topics (2 partitions):

1. **Bare consumer**: a kafka-python consume + decode loop over a backlog of
   instance events (``orjson.loads`` and the features into a numpy row, as the
   in-memory relay of ``simulators.bench_loop``): the ceiling any Python
   consumer has here; and a **bare relay** that also produces one small reply
   per event (what the daemon must do at least: it publishes one decision per
   event). Both consume with the daemon's consumer settings
   (``streamlearn.transport.kafka.FETCH_MAX_WAIT_MS``) and run with its
   collector thresholds (``streamlearn.service.settings.DAEMON_GC_THRESHOLDS``); with kafka-python's
   default 500 ms the relay ran at ~23k or ~37k events/s from one run to the
   next, depending on whether one partition ran dry before the other.
2. **Throughput**: the daemon (a ``python -m streamlearn serve`` process)
   decides the same kind of backlog; events/s from the first to the last
   decision's broker timestamp. The ratio to (1) is the daemon's efficiency.
3. **Latency at a fixed offered load**: instances are produced at ``--rate``
   events/s while a caller answers every decision with feedback (the full
   loop: decide, publish, join, learn, checkpoint), reported as p50 / p99 / max
   after a warm-up, three ways: from the broker's append of the instance (the
   instances topic stamps ``LogAppendTime``) to the decision's send by the daemon
   (its ``CreateTime``): the daemon's own part; from the caller's ``send()`` (adds
   the caller's producer linger, 5 ms as the Java client's default, and its trip to
   the broker); and until the caller read the decision (adds the daemon's linger
   and the caller's fetch). With ``--latency-relay`` the same run is made against a
   **bare relay process** on each ``--kafka-client`` (the daemon's own client settings:
   consume both topics, decode, publish one reply per instance, nothing learned): the
   floor of the daemon's latency on that client and machine.

The stream is SynNonSep instances (d = 400, K = 9) for the Banditron, or with
``--candidates N`` candidate-set requests of N candidates for the daemon's default
candidate learner (``simulators.bench_workloads``).

Usage::

    python -m simulators.bench_daemon [--bootstrap HOST:PORT] [--events 30000] [--rate 2000]
    python -m simulators.bench_daemon --candidates 100 --events 5000 --rate 200
    python -m simulators.bench_daemon --compare-with /tmp/old   # a checkout of another commit

Without ``--bootstrap`` a broker is started with deploy/kafka/kafka.sh in a
temporary directory and stopped at the end.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from simulators.bench_workloads import Workload, candidate_sets, decode_event, fixed_actions
from streamlearn.config import installed_kafka_client

REPO = Path(__file__).resolve().parents[1]
KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"


def start_broker(stack: ExitStack) -> str:
    work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    port = _free_port()
    done = subprocess.run([str(KAFKA_SH), "start", "--port", str(port), "--dir", str(work)],
                          capture_output=True, text=True, check=True)
    stack.callback(subprocess.run, [str(KAFKA_SH), "stop", "--dir", str(work)],
                   capture_output=True, check=False)
    return done.stdout.strip()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU ticks of the whole machine so far: compare two readings for the share
    of the cores in use by everything (other users of a shared machine included)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]
    return float(sum(ticks) - idle), float(sum(ticks))


def make_topics(bootstrap: str, partitions: int = 2) -> dict[str, str]:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    run = uuid.uuid4().hex[:8]
    names = {"instances": f"bench-in-{run}", "feedback": f"bench-fb-{run}",
             "decisions": f"bench-dec-{run}", "dead_letter": f"bench-dlq-{run}"}
    # The broker stamps each instance when it appends it, so the latency can be split into
    # the caller's part (its producer's linger and the trip to the broker) and the daemon's
    # (from the append to the decision's send). The decisions keep the daemon's CreateTime.
    append_time = {"message.timestamp.type": "LogAppendTime"}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(n, partitions, 1,
                                  topic_configs=append_time if key == "instances" else {})
                         for key, n in names.items()], timeout_ms=30_000)
    admin.close()
    time.sleep(1.0)
    return names


def producer(bootstrap: str) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(bootstrap_servers=bootstrap, linger_ms=CALLER_LINGER_MS, acks="all")


#: The caller's producer linger (instances and feedback): the Java client's default since
#: Kafka 4.0, and librdkafka's.
CALLER_LINGER_MS = 5


class Caller:
    """The bench's own clients in the latency runs: the producer of the offered load and the
    caller that reads each decision and answers it with feedback. On this 2-core machine they
    share the cores with the daemon and the broker, so the library matters: kafka-python's
    Python protocol code took ~0.6 of a core at 2,000 events/s, librdkafka's far less."""

    def __init__(self, bootstrap: str, client: str) -> None:
        self.bootstrap, self.client = bootstrap, client
        if client == "kafka-python":
            self._producer = producer(bootstrap)
        else:
            from confluent_kafka import Producer

            self._producer = Producer({
                "bootstrap.servers": bootstrap, "linger.ms": CALLER_LINGER_MS, "acks": "all",
                "partitioner": "murmur2_random"})  # a key's partition as kafka-python picks it

    def send(self, topic: str, key: bytes, value: bytes,
             appended: Callable[[int], None] | None = None) -> None:
        """Queue one message; ``appended(ms)`` gets the broker's timestamp once it is written."""
        if self.client == "kafka-python":
            future = self._producer.send(topic, key=key, value=value)
            if appended is not None:
                future.add_callback(lambda metadata: appended(metadata.timestamp))
            return
        if appended is None:
            self._producer.produce(topic, value, key)
        else:
            self._producer.produce(topic, value, key, on_delivery=lambda err, msg: (
                appended(msg.timestamp()[1]) if err is None else None))
        self._producer.poll(0)  # serves the delivery reports

    def flush(self) -> None:
        self._producer.flush()

    def close(self) -> None:
        if self.client == "kafka-python":
            self._producer.close()
        else:
            self._producer.flush()


def caller_reader(bootstrap: str, client: str, topic: str
                  ) -> tuple[Callable[[], list[tuple[Any, Any, int]]], Callable[[], None]]:
    """(read: the next records of ``topic`` from its start as (key, value, broker timestamp),
    waiting up to 0.2 s; close) on the caller's client library (:class:`Caller`)."""
    if client == "kafka-python":
        c = consumer_for(bootstrap, topic)
        return (lambda: [(r.key, r.value, r.timestamp) for records in
                         c.poll(timeout_ms=200).values() for r in records]), c.close
    from confluent_kafka import Consumer, TopicPartition

    from streamlearn.transport.confluent import consume_ready
    from streamlearn.transport.kafka import FETCH_MAX_WAIT_MS

    rc = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                   "enable.auto.commit": False, "fetch.wait.max.ms": FETCH_MAX_WAIT_MS})
    parts = rc.list_topics(topic, timeout=30).topics[topic].partitions
    rc.assign([TopicPartition(topic, p, 0) for p in parts])
    return (lambda: [(m.key(), m.value(), m.timestamp()[1]) for m in consume_ready(rc, 500, 0.2)
                     if m.error() is None]), rc.close


def consumer_for(bootstrap: str, topic: str) -> Any:
    from kafka import KafkaConsumer, TopicPartition

    from streamlearn.transport.kafka import FETCH_MAX_WAIT_MS

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      fetch_max_wait_ms=FETCH_MAX_WAIT_MS)
    while not c.partitions_for_topic(topic):
        time.sleep(0.1)
    parts = [TopicPartition(topic, p) for p in c.partitions_for_topic(topic)]
    c.assign(parts)
    c.seek_to_beginning(*parts)
    return c


#: An entry of a configuration's serve options that is not one: the checkout to run that
#: daemon from (``--compare-with DIR``); every other daemon runs from this one.
TREE_MARK = "tree="


def serve(bootstrap: str, topics: dict[str, str], ckpt: Path, mode: tuple[str, ...],
          extra: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    tree = next((Path(e[len(TREE_MARK):]) for e in extra if e.startswith(TREE_MARK)), REPO)
    extra = tuple(e for e in extra if not e.startswith(TREE_MARK))
    if "--checkpoint-changelog" in extra:  # a changelog of this run's own
        extra = (*extra, "--topics-changelog", f"{topics['instances']}-changelog")
    args = [sys.executable, "-m", "streamlearn", "serve", "--bootstrap", bootstrap,
            "--topics-instances", topics["instances"], "--topics-feedback", topics["feedback"],
            "--topics-decisions", topics["decisions"],
            "--topics-dead-letter", topics["dead_letter"], "--checkpoint-dir", str(ckpt),
            "--metrics-port", "-1", "--progress-seconds", "0", *mode, *extra]
    return quiet_process(args, tree)


def quiet_process(args: list[str], tree: Path) -> subprocess.Popen[bytes]:
    """``args`` run from the checkout ``tree`` (first on the import path), output discarded."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)
    return subprocess.Popen(args, cwd=tree, env={**os.environ, "PYTHONPATH": path},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def bare_rate(bootstrap: str, topic: str, n: int, decode: Callable[[Any], object],
              relay_to: str | None = None) -> float:
    """Consume + decode (``orjson.loads``, the features into numpy: ``decode``) (+ produce one
    small reply per event with ``relay_to``)."""
    from streamlearn.service.settings import DAEMON_GC_THRESHOLDS

    c = consumer_for(bootstrap, topic)
    prod = producer(bootstrap) if relay_to else None
    thresholds = gc.get_threshold()
    gc.set_threshold(*DAEMON_GC_THRESHOLDS)  # as the daemon's process: nothing favours either
    try:
        got, started = 0, None
        while got < n:
            for records in c.poll(timeout_ms=500, max_records=500).values():
                if started is None:
                    started = time.perf_counter()
                for r in records:
                    event = orjson.loads(r.value)
                    decode(event)
                    if prod is not None:
                        prod.send(relay_to, key=r.key, value=orjson.dumps({"id": event["id"]}))
                got += len(records)
        if prod is not None:
            prod.flush()
            prod.close()
        elapsed = time.perf_counter() - (started or time.perf_counter())
    finally:
        gc.set_threshold(*thresholds)
    c.close()
    return n / elapsed


def bare_confluent_rate(bootstrap: str, topic: str, n: int, decode: Callable[[Any], object],
                        relay_to: str) -> float:
    """The bare relay on librdkafka: consume, decode, produce one small reply per event, with
    the confluent transport's client settings (``kafka.client = confluent``)."""
    from confluent_kafka import TopicPartition

    from streamlearn.service.settings import DAEMON_GC_THRESHOLDS
    from streamlearn.transport.confluent import open_confluent_clients

    c, prod = open_confluent_clients(bootstrap, f"bench-relay-{uuid.uuid4().hex[:8]}")
    parts = c.list_topics(topic, timeout=30).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    thresholds = gc.get_threshold()
    gc.set_threshold(*DAEMON_GC_THRESHOLDS)
    try:
        got, started = 0, None
        while got < n:
            records = c.consume(500, 0) or c.consume(1, 0.5)
            if records and started is None:
                started = time.perf_counter()
            for r in records:
                if r.error() is not None:
                    continue
                event = orjson.loads(r.value())
                decode(event)
                prod.produce(relay_to, orjson.dumps({"id": event["id"]}), r.key())
                got += 1
            prod.poll(0)
        prod.flush(60)
        elapsed = time.perf_counter() - (started or time.perf_counter())
    finally:
        gc.set_threshold(*thresholds)
    c.close()
    return n / elapsed


def throughput(bootstrap: str, load: Workload, work: Path, configs: dict[str, tuple[str, ...]],
               confluent_relay: bool = False) -> dict[str, float]:
    """Events/s of the bare consumer, the bare relay(s) and the daemon in each configuration,
    each on the same backlog (daemons in turn on fresh topics)."""
    rates: dict[str, float] = {}
    for label, extra in configs.items():
        rates.update(_throughput(bootstrap, load, work, extra, label,
                                 bare=not rates, confluent_relay=confluent_relay))
    return rates


def _throughput(bootstrap: str, load: Workload, work: Path, extra: tuple[str, ...], label: str,
                bare: bool, confluent_relay: bool) -> dict[str, float]:
    topics = make_topics(bootstrap)
    prod = producer(bootstrap)
    for key, value in zip(load.keys, load.values, strict=True):
        prod.send(topics["instances"], key=key, value=value)
    prod.flush()
    prod.close()
    n = len(load.keys)
    rates: dict[str, float] = {}
    if bare:
        rates["bare"] = bare_rate(bootstrap, topics["instances"], n, load.relay_decode)
        rates["relay"] = bare_rate(bootstrap, topics["instances"], n, load.relay_decode,
                                   relay_to=topics["dead_letter"])
        if confluent_relay:
            rates["confluent relay"] = bare_confluent_rate(
                bootstrap, topics["instances"], n, load.relay_decode, topics["dead_letter"])
    proc = serve(bootstrap, topics, work / f"ckpt-{topics['instances']}", load.serve_args, extra)
    # Nothing reads the decisions while the daemon works (the relay's replies are not read
    # either): a consumer beside it would take CPU from it and the broker on a small machine.
    # Only the end offsets are asked, five times a second; the timestamps are read afterwards.
    c = consumer_for(bootstrap, topics["decisions"])
    parts = sorted(c.assignment(), key=lambda tp: tp.partition)
    cpu_from = None  # the daemon's CPU time from its first decision on (not its start-up)
    while (decided := sum(c.end_offsets(parts).values())) < n:
        if cpu_from is None and decided > 0:
            cpu_from = (cpu_seconds(proc.pid), decided)
        time.sleep(0.2)
    if cpu_from is not None:
        rates[f"{label} cpu"] = (cpu_seconds(proc.pid) - cpu_from[0]) / (n - cpu_from[1])
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    stamps: list[int] = []
    while len(stamps) < n:
        for records in c.poll(timeout_ms=500).values():
            stamps.extend(r.timestamp for r in records)
    c.close()
    rates[label] = n / ((max(stamps) - min(stamps)) / 1000.0)
    return rates


#: A latency configuration that is not a daemon: the bare relay process on this client.
RELAY_MARK = "relay="


def relay_process(bootstrap: str, topics: dict[str, str], client: str) -> subprocess.Popen[bytes]:
    """The bare relay (:func:`serve_relay`) in a process of its own, as the daemon runs."""
    args = [sys.executable, "-m", "simulators.bench_daemon", "--bootstrap", bootstrap,
            "--serve-relay", client, "--relay-topics",
            ",".join(topics[k] for k in ("instances", "feedback", "decisions"))]
    return quiet_process(args, REPO)


def serve_relay(bootstrap: str, client: str, instances: str, feedback: str,
                decisions: str) -> None:
    """Until SIGTERM: read the instances and the feedback from their start with the daemon's
    client settings on ``client``, decode every message (``orjson`` and the features into
    numpy), publish one reply per instance (its id and a first choice), learn nothing. The
    least a daemon must do per message, so its latency is the floor of the daemon's."""
    from streamlearn.service.settings import DAEMON_GC_THRESHOLDS

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    gc.set_threshold(*DAEMON_GC_THRESHOLDS)
    if client == "kafka-python":
        from kafka import TopicPartition

        from streamlearn.transport.kafka import open_clients

        consumer, prod = open_clients(bootstrap, None)
        parts = [TopicPartition(t, p) for t in (instances, feedback)
                 for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)

        def read() -> list[tuple[str, bytes | None, bytes]]:
            return [(r.topic, r.key, r.value) for records in
                    consumer.poll(timeout_ms=100, max_records=500).values() for r in records]

        def publish(key: bytes | None, value: bytes) -> None:
            prod.send(decisions, key=key, value=value)
    else:
        from confluent_kafka import TopicPartition as ConfluentPartition

        from streamlearn.transport.confluent import consume_ready, open_confluent_clients

        consumer, prod = open_confluent_clients(bootstrap, f"bench-relay-{uuid.uuid4().hex[:8]}")
        consumer.assign([ConfluentPartition(t, p, 0) for t in (instances, feedback)
                         for p in consumer.list_topics(t, timeout=30).topics[t].partitions])

        def read() -> list[tuple[str, bytes | None, bytes]]:
            return [(m.topic(), m.key(), m.value()) for m in consume_ready(consumer, 500, 0.1)
                    if m.error() is None]

        def publish(key: bytes | None, value: bytes) -> None:
            prod.produce(decisions, value, key)
            prod.poll(0)
    while not stop.is_set():
        for topic, key, value in read():
            event = orjson.loads(value)
            if topic == instances:
                publish(key, orjson.dumps(relay_reply(event)))
    prod.flush()
    consumer.close()


def relay_reply(event: dict[str, Any]) -> dict[str, Any]:
    """The bare relay's decode of one instance and its reply: the first action, or the
    request's candidates in the order given."""
    decode_event(event)
    if "candidates" in event:
        return {"id": event["id"], "candidates": [{"id": c["id"]} for c in event["candidates"]]}
    return {"id": event["id"], "action": 0, "prob": 1.0}


def latency(bootstrap: str, load: Workload, rate: float, work: Path, warmup: int,
            extra: tuple[str, ...] = (), caller_client: str = "kafka-python") -> dict[str, Any]:
    topics = make_topics(bootstrap)
    ckpt = work / f"ckpt-{topics['instances']}"
    relay = next((e[len(RELAY_MARK):] for e in extra if e.startswith(RELAY_MARK)), None)
    proc = (serve(bootstrap, topics, ckpt, load.serve_args, extra) if relay is None
            else relay_process(bootstrap, topics, relay))
    time.sleep(5.0)  # let the daemon start before the clock runs
    cpu_from, machine_from = cpu_seconds(proc.pid), machine_busy()
    sent_ms: dict[str, int] = {}  # the broker's append time of each instance
    called_ms: dict[str, float] = {}  # when the caller called send()
    decided_ms: dict[str, int] = {}
    received_ms: dict[str, float] = {}  # when the caller had the decision
    done = threading.Event()

    def answer() -> None:  # the caller: read decisions, send feedback
        read, close = caller_reader(bootstrap, caller_client, topics["decisions"])
        fb = Caller(bootstrap, caller_client)
        while not done.is_set():
            records = read()
            now_ms = time.time() * 1000.0
            for key, value, stamp in records:
                d = orjson.loads(value)
                decided_ms.setdefault(d["id"], stamp)
                received_ms.setdefault(d["id"], now_ms)
                fb.send(topics["feedback"], key,
                        orjson.dumps({"id": d["id"], "reward": load.reward(d)}))
        fb.close()
        close()

    from streamlearn.service.settings import DAEMON_GC_THRESHOLDS

    def sent(event_id: str) -> Callable[[int], None]:
        return lambda stamp: sent_ms.__setitem__(event_id, stamp)

    # This process must not pause the stream it times: the instances' timestamps are taken
    # at send(), so a collector pause here delays them on the wire and reads as the daemon's
    # latency. Nothing is kept per sent instance but its timestamp (no futures: 300,000 of
    # them made full collections of 50-480 ms), the workload is frozen out of the
    # collector, and the thresholds are the daemon's (docs/performance.md).
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*DAEMON_GC_THRESHOLDS)
    caller = threading.Thread(target=answer, daemon=True)
    caller.start()
    prod = Caller(bootstrap, caller_client)
    try:
        start = time.perf_counter()
        for i, (key, value) in enumerate(zip(load.keys, load.values, strict=True)):
            due = start + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            called_ms[key.decode()] = time.time() * 1000.0
            prod.send(topics["instances"], key, value, sent(key.decode()))
        n = len(load.keys)
        offered = n / (time.perf_counter() - start)
        prod.flush()
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
    deadline = time.monotonic() + 30
    while len(sent_ms) < n:  # every send acknowledged; its callback may trail the flush
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n - len(sent_ms)} instances were not acknowledged")
        time.sleep(0.05)
    deadline = time.monotonic() + 120
    while len(decided_ms) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    cpu = (cpu_seconds(proc.pid) - cpu_from) / max(len(decided_ms), 1)
    busy = [b - a for a, b in zip(machine_from, machine_busy(), strict=True)]
    done.set()
    caller.join(10)
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    ids = [key.decode() for key in load.keys[warmup:]]
    lat = np.array([decided_ms[i] - sent_ms[i] for i in ids if i in decided_ms]) / 1000.0
    seen = np.array([received_ms[i] - called_ms[i] for i in ids if i in received_ms]) / 1000.0
    from_call = np.array([decided_ms[i] - called_ms[i] for i in ids if i in decided_ms]) / 1000.0
    history = ckpt / "rankers" / "state.json"
    retrains = len(orjson.loads(history.read_bytes()).get("history", [])) if history.exists() else 0
    quarters = np.array_split(lat, 4)  # in send order: does the tail grow with uptime?
    return {"offered": offered, "decided": len(decided_ms), "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "max": float(lat.max()), "n": len(lat),
            "call_p50": float(np.percentile(from_call, 50)),
            "call_p99": float(np.percentile(from_call, 99)),
            "seen_p50": float(np.percentile(seen, 50)), "seen_p99": float(np.percentile(seen, 99)),
            "retrains": retrains, "cpu": cpu, "machine_busy": busy[0] / busy[1],
            "quarter_p99": [float(np.percentile(q, 99)) for q in quarters],
            "quarter_max": [float(q.max()) for q in quarters]}


def in_memory_rate(load: Workload, blas_threads: int) -> float:
    """The loop alone (decode, decide, publish, join) on the in-memory transport."""
    from streamlearn.learners.banditron import Banditron
    from streamlearn.learners.exploration import FixedGamma
    from streamlearn.service.daemon import Daemon, DaemonSettings
    from streamlearn.service.settings import LimitsConfig
    from streamlearn.transport.memory import InMemoryTransport

    transport = InMemoryTransport(partitions=2)
    for key, value in zip(load.keys, load.values, strict=True):
        transport.append_instance(key, value)
    settings = DaemonSettings(limits=LimitsConfig(poll_timeout_seconds=0.0),
                              blas_threads=blas_threads)
    daemon = Daemon(settings, transport, Banditron(9, 400, FixedGamma(0.05)))
    started = time.perf_counter()
    daemon.run(max_instances=len(load.keys))
    return len(load.keys) / (time.perf_counter() - started)


def retrain_latency(bootstrap: str, load: Workload, args: argparse.Namespace,
                    work: Path) -> None:
    """p99 instance→decision latency without retraining and while retraining (A B C A B C)."""
    n = args.latency_events
    every = ("--retrain-every-events", str(args.retrain_every_events))
    configs = {"no retraining": (),
               "retrain in a process": (*every, "--retrain-worker", "process"),
               "retrain in a thread": (*every, "--retrain-worker", "thread")}
    p99: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(2):
        for name, extra in configs.items():
            res = latency(bootstrap, load.head(n), args.rate, work, n // 10, extra,
                          args.caller_client)
            p99[name].append(res["p99"])
            print(f"{name:<22} offered {res['offered']:,.0f}/s: appended → sent p50 "
                  f"{res['p50'] * 1e3:.1f} ms, "
                  f"p99 {res['p99'] * 1e3:.1f} ms, max {res['max'] * 1e3:.1f} ms, "
                  f"{res['retrains']} retrains", flush=True)
    base = float(np.median(p99["no retraining"]))
    for name, values in p99.items():
        print(f"{name:<22} median p99 {np.median(values) * 1e3:.1f} ms "
              f"(ratio to no retraining {np.median(values) / base:.2f})")


def configurations(args: argparse.Namespace) -> dict[str, tuple[str, ...]]:
    """The daemons to compare, by label: one per ``--kafka-client``, then one per ``--variant``,
    then the ``--compare-with`` checkout's."""
    configs: dict[str, tuple[str, ...]] = {
        client: ("--kafka-client", client) for client in args.kafka_client.split(",")}
    first = next(iter(configs.values()))
    for variant in args.variant:  # on the first client unless its options name another
        label, _, options = variant.partition("=")
        configs[label] = (*first, *shlex.split(options))
    if args.compare_with:  # the first client's daemon, run from the other checkout
        configs[f"at {args.compare_with}"] = (f"{TREE_MARK}{args.compare_with}", *first)
    return configs


def compare(bootstrap: str, load: Workload, args: argparse.Namespace, work: Path,
            configs: dict[str, tuple[str, ...]], unit: str) -> None:
    """Throughput, then latency, of every configuration in turn (A B A B ...), with ratios."""
    confluent = any("confluent" in " ".join(extra) for extra in configs.values())
    rates: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        got = throughput(bootstrap, load.head(args.events), work, configs, confluent)
        for key, value in got.items():
            rates.setdefault(key, []).append(value)
        relay = got["relay"]
        print("throughput  " + "; ".join(
            f"daemon [{label}] {got[label]:,.0f} {unit} ({got[label] / relay:.2f}x the "
            f"kafka-python relay, "
            f"{got.get(label + ' cpu', float('nan')) * 1e6:.0f} µs CPU per event)"
            for label in configs) + f" (backlog of {args.events:,}); bare kafka-python "
            f"consume+decode {got['bare']:,.0f}; bare kafka-python relay (consume+decode+produce "
            f"one reply) {relay:,.0f}" + (f"; bare confluent relay {got['confluent relay']:,.0f}"
                                          if confluent else ""), flush=True)
    n = args.latency_events
    timed = dict(configs)
    if args.latency_relay:  # the floor: a bare relay process on each client, same load
        timed.update({f"relay {client}": (f"{RELAY_MARK}{client}",)
                      for client in args.kafka_client.split(",")})
    lat: dict[str, dict[str, list[float]]] = {label: {} for label in timed}
    for _ in range(args.repeats):
        for label, extra in timed.items():
            res = latency(bootstrap, load.head(n), args.rate, work, n // 10, extra,
                          args.caller_client)
            for key in ("p50", "p99", "max", "call_p50", "call_p99", "seen_p50", "seen_p99",
                        "cpu", "machine_busy"):
                lat[label].setdefault(key, []).append(res[key])
            print(f"latency     [{label}] offered {res['offered']:,.0f} {unit}, "
                  f"{res['decided']:,} decided; instance appended → decision sent p50 "
                  f"{res['p50'] * 1e3:.1f} ms, p99 {res['p99'] * 1e3:.1f} ms, max "
                  f"{res['max'] * 1e3:.1f} ms; from the caller's send() p50 "
                  f"{res['call_p50'] * 1e3:.1f} ms, p99 {res['call_p99'] * 1e3:.1f} ms; as the caller "
                  f"read it p50 {res['seen_p50'] * 1e3:.1f} ms, p99 {res['seen_p99'] * 1e3:.1f} ms; "
                  f"daemon {res['cpu'] * 1e6:.0f} µs CPU per event, machine "
                  f"{res['machine_busy']:.0%} busy (after {n // 10:,} warm-up events, "
                  f"n={res['n']:,}; feedback for every decision)", flush=True)
            if args.latency_quarters:
                print("latency     by quarter of the run: p99 "
                      + " / ".join(f"{x * 1e3:.0f}" for x in res["quarter_p99"]) + " ms, max "
                      + " / ".join(f"{x * 1e3:.0f}" for x in res["quarter_max"]) + " ms",
                      flush=True)
    if args.repeats < 2:
        return
    print(f"median of {args.repeats} (machine state as it was: compare within this run)")
    first = next(iter(configs))
    for label in configs:
        to_relay = [d / r for d, r in zip(rates[label], rates["relay"], strict=True)]
        to_first = [d / f for d, f in zip(rates[label], rates[first], strict=True)]
        ms = {k: ", ".join(f"{x * 1e3:.1f}" for x in v) for k, v in lat[label].items()}
        med = {k: float(np.median(v)) * 1e3 for k, v in lat[label].items()}
        cpu = (f"; CPU per event {np.median(rates[label + ' cpu']) * 1e6:.0f} µs under the "
               f"backlog, {med['cpu'] * 1e3:.0f} µs at {args.rate:,.0f}/s; machine busy "
               f"{', '.join(f'{x:.0%}' for x in lat[label]['machine_busy'])} in its latency runs"
               if label + " cpu" in rates else "")
        print(f"  [{label}] daemon {np.median(rates[label]):,.0f} {unit}; daemon / kafka-python "
              f"relay {', '.join(f'{x:.2f}' for x in to_relay)} (median "
              f"{np.median(to_relay):.2f}); daemon / [{first}] daemon "
              f"{', '.join(f'{x:.2f}' for x in to_first)} (median {np.median(to_first):.2f}); "
              f"appended → sent p50 {ms['p50']} ms (median {med['p50']:.1f}), p99 {ms['p99']} "
              f"ms (median {med['p99']:.1f}); from the caller's send() p50 {ms['call_p50']} ms "
              f"(median {med['call_p50']:.1f}), p99 {ms['call_p99']} ms (median "
              f"{med['call_p99']:.1f}); as read by the caller p50 median {med['seen_p50']:.1f}, p99 "
              f"median {med['seen_p99']:.1f} ms" + cpu)
    for label in timed.keys() - configs.keys():
        med = {k: float(np.median(v)) * 1e3 for k, v in lat[label].items()}
        print(f"  [{label}] (latency only) appended → sent p50 median {med['p50']:.1f} ms, p99 "
              f"median {med['p99']:.1f} ms; from the caller's send() p50 median "
              f"{med['call_p50']:.1f}, p99 median {med['call_p99']:.1f} ms; "
              f"{med['cpu'] * 1e3:.0f} µs CPU per event at {args.rate:,.0f}/s")
    print(f"  bare kafka-python relay {np.median(rates['relay']):,.0f} {unit}"
          + (f", bare confluent relay {np.median(rates['confluent relay']):,.0f} {unit}"
             if confluent else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bootstrap", help="HOST:PORT of a running broker (default: start one)")
    parser.add_argument("--events", type=int, default=30_000, help="backlog for throughput")
    parser.add_argument("--rate", type=float, default=2_000.0, help="offered load, events/s")
    parser.add_argument("--latency-events", type=int, default=30_000)
    parser.add_argument("--latency-quarters", action="store_true",
                        help="also print p99 and max for each quarter of the latency run (with "
                             "a long run, e.g. --latency-events 300000: whether the tail grows)")
    parser.add_argument("--format", choices=("dense", "sparse"), default="dense")
    parser.add_argument("--candidates", type=int, default=0, metavar="N",
                        help="candidate mode: requests of N candidates with 45 dense features "
                             "each, the daemon's default candidate learner (0: fixed actions)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1,
                        help="repeat the throughput runs (bare, relay, daemon on a fresh "
                             "backlog each time) and the latency run; medians are printed")
    parser.add_argument("--retrain-every-events", type=int, metavar="N",
                        help="measure only latency: without retraining, then retraining every N "
                             "learned decisions in a process and in a thread (docs/performance.md)")
    parser.add_argument("--kafka-client", default="kafka-python",
                        help="comma-separated kafka.client values: one daemon per client, run "
                             "in turn on the same backlog and at the same load (e.g. "
                             "kafka-python,confluent); with confluent the bare relay is run on "
                             "librdkafka too")
    parser.add_argument("--caller-client", choices=("auto", "kafka-python", "confluent"),
                        default="auto",
                        help="the Kafka client of the bench's own offered load and answering "
                             "caller in the latency runs (confluent: librdkafka, which leaves "
                             "more of a small machine's cores to the daemon and the broker; "
                             "auto, the default: confluent when confluent-kafka is installed)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=OPTIONS",
                        help="one more daemon to compare, with these serve options (e.g. "
                             "'linger0=--kafka-linger-seconds 0'), on the first --kafka-client "
                             "unless the options name another; repeatable")
    parser.add_argument("--compare-with", metavar="DIR",
                        help="one more daemon: the first --kafka-client's, run from this "
                             "checkout (e.g. an older commit), in turn with the others")
    parser.add_argument("--latency-relay", action="store_true",
                        help="also time the latency run against a bare relay process on each "
                             "--kafka-client (consume, decode, reply; nothing learned): the "
                             "floor of the daemon's latency here")
    parser.add_argument("--serve-relay", choices=("kafka-python", "confluent"),
                        help=argparse.SUPPRESS)  # the relay process of --latency-relay
    parser.add_argument("--relay-topics", help=argparse.SUPPRESS)  # instances,feedback,decisions
    parser.add_argument("--in-memory", action="store_true",
                        help="only time the loop on the in-memory transport (no broker), with "
                             "one BLAS thread and with the library's default")
    args = parser.parse_args(argv)
    if args.caller_client == "auto":  # the caller is not what is measured: the lighter client
        args.caller_client = installed_kafka_client()
    if args.serve_relay:
        if not (args.bootstrap and args.relay_topics):
            parser.error("--serve-relay needs --bootstrap and --relay-topics")
        serve_relay(args.bootstrap, args.serve_relay, *args.relay_topics.split(","))
        return 0
    if args.candidates < 0:
        parser.error(f"argument --candidates: expected an integer >= 0, got {args.candidates}")
    if args.candidates and args.in_memory:
        parser.error("--in-memory times the fixed-action loop; candidate mode in memory is "
                     "`python -m simulators.bench_loop --candidates N`")
    total = args.events if args.in_memory else max(args.events, args.latency_events)
    load = (candidate_sets(total, args.candidates, args.seed) if args.candidates
            else fixed_actions(total, args.format, args.seed))
    unit = "requests/s" if args.candidates else "events/s"
    if args.in_memory:
        for threads, label in ((1, "1 BLAS thread (default)"), (0, "BLAS library default")):
            rate = in_memory_rate(load, threads)
            print(f"in-memory loop, {args.format} JSON, {label}: {rate:,.0f} events/s "
                  f"({args.events:,} instances, no feedback)")
        return 0
    with ExitStack() as stack:
        bootstrap = args.bootstrap or start_broker(stack)
        work = Path(tempfile.mkdtemp(prefix="bench-daemon-"))
        if args.retrain_every_events:
            retrain_latency(bootstrap, load, args, work)
            return 0
        from kafka.record import util as record_util

        crc = "C (crc32c package)" if record_util.crc32c_c is not None else "pure Python"
        print(f"broker {bootstrap}; {load.description}, 2 partitions; kafka-python CRC32C: {crc}; "
              f"the latency runs' load and caller on {args.caller_client}")
        compare(bootstrap, load, args, work, configurations(args), unit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
