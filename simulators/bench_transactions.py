"""What exactly-once publishing would cost: decisions in a Kafka transaction per step.

An exactly-once mode would publish each step's decisions, its changelog records and its
input offsets in one transaction (``send_offsets_to_transaction``), and callers would read
the decisions ``read_committed``: a decision becomes visible when its step's transaction
commits. This measures, on a real broker and at ``--rate`` events/s in steps of what
arrived since the last one, the latency a caller reading the decisions sees (send → read)
for three ways to publish them:

* ``idempotent`` — what the daemon does (an idempotent producer, no transaction);
* ``journal-ack`` — what ``checkpoint.changelog`` adds: one journal record per step,
  written to the changelog and acknowledged before the step's decisions are sent;
* ``transaction`` — the step's decisions in one transaction, committed before the next
  step; the reader ``read_committed``.

    python -m simulators.bench_transactions [--bootstrap HOST:PORT] [--rate 2000]
        [--seconds 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from contextlib import ExitStack
from typing import Any

import numpy as np

from simulators.bench_daemon import start_broker
from streamlearn.transport.kafka import ensure_topics

VALUE = b'{"id": "req-000000000000", "action": 3, "prob": 0.91, "explored": false, ' \
        b'"model": "linucb-v123", "ts": 1764840000.123}'


def reader(bootstrap: str, topic: str, isolation: str, n: int, seen: dict[int, float],
           ready: threading.Event) -> None:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level=isolation,
                             enable_auto_commit=False, fetch_max_wait_ms=5)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_end(tp)
    consumer.position(tp)
    ready.set()
    deadline = time.monotonic() + 120
    while len(seen) < n and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=100).values():
            now = time.perf_counter()
            for r in records:
                seen[int(r.key)] = now
    consumer.close()


def run(bootstrap: str, way: str, rate: float, seconds: float) -> dict[str, float]:
    from kafka import KafkaProducer

    topic = f"bench-tx-{uuid.uuid4().hex[:8]}"
    changelog = f"{topic}-changelog"
    ensure_topics(bootstrap, [topic, changelog], 1)
    transactional = way == "transaction"
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                             linger_ms=0, **({"transactional_id": topic} if transactional else {}))
    journal: Any = None
    if way == "journal-ack":
        journal = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0,
                                transactional_id=changelog)
        journal.init_transactions()
        journal.begin_transaction()
    if transactional:
        producer.init_transactions()
    n = int(rate * seconds)
    seen: dict[int, float] = {}
    ready = threading.Event()
    thread = threading.Thread(target=reader, args=(bootstrap, topic, "read_committed"
                                                   if transactional else "read_uncommitted",
                                                   n, seen, ready))
    thread.start()
    ready.wait(30)
    time.sleep(0.5)
    sent: dict[int, float] = {}
    start = time.perf_counter()
    i = 0
    while i < n:
        due = int((time.perf_counter() - start) * rate) + 1  # the events arrived by now
        batch = range(i, min(due, n))
        if not batch:
            time.sleep(0.0005)
            continue
        arrived = {k: start + k / rate for k in batch}
        if journal is not None:
            journal.send(changelog, key=b"j", value=VALUE * len(batch)).get(timeout=30)
        if transactional:
            producer.begin_transaction()
        for k in batch:
            producer.send(topic, key=str(k).encode(), value=VALUE, partition=0)
            sent[k] = arrived[k]
        if transactional:
            producer.commit_transaction()
        i = batch.stop
    producer.flush()
    thread.join()
    producer.close()
    if journal is not None:
        journal.close()
    latency = np.array([seen[k] - sent[k] for k in sent if k in seen]) * 1e3
    return {"p50": float(np.percentile(latency, 50)), "p99": float(np.percentile(latency, 99)),
            "read": len(latency) / n}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bootstrap")
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    ways = ("idempotent", "journal-ack", "transaction")
    results: dict[str, list[dict[str, float]]] = {w: [] for w in ways}
    with ExitStack() as stack:
        bootstrap = args.bootstrap or start_broker(stack)
        for k in range(args.repeats):
            for way in ways:
                res = run(bootstrap, way, args.rate, args.seconds)
                results[way].append(res)
                print(f"run {k + 1}/{args.repeats} {way:<12} arrival → read by the caller "
                      f"p50 {res['p50']:.1f} ms, p99 {res['p99']:.1f} ms "
                      f"({100 * res['read']:.0f} % read)", flush=True)
    base = np.median([r["p50"] for r in results["idempotent"]])
    print(f"median of {args.repeats} at {args.rate:,.0f} events/s:")
    for way in ways:
        p50 = float(np.median([r["p50"] for r in results[way]]))
        p99 = float(np.median([r["p99"] for r in results[way]]))
        print(f"  {way:<12} p50 {p50:.1f} ms (+{p50 - base:.1f} ms against idempotent), "
              f"p99 {p99:.1f} ms")


if __name__ == "__main__":
    main()
