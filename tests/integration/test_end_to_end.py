"""Acceptance: 50,000 instances through a real broker, decided, joined, learned, counted.

The caller works in lockstep blocks of BATCH instances (publish a block, wait
for all its decisions, answer them, wait until the daemon joined them), so the
daemon learns exactly as the in-process replay with ``batch_size=BATCH`` does,
however its polls split a block; the error rates then differ only by the
exploration draws (event ids vs row numbers as keys) and by when the dropped
decisions expire (15 s later here, at once in the replay; a reward-0 update is
a large perturbation, so only 1 % are dropped). Free-running streams are
covered by the crash-safety and outage tests.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest
from daemon_harness import (
    Caller,
    make_topics,
    producer,
    publish_instances,
    read_all,
    transport,
    wait_until,
)
from loop_helpers import settings_of
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.learners.banditron import Banditron
from streamlearn.learners.exploration import FixedGamma
from streamlearn.replay import replay
from streamlearn.service.daemon import Daemon
from streamlearn.service.http import MetricsServer
from streamlearn.service.metrics import PrometheusObserver

pytestmark = pytest.mark.integration

N = 50_000
BATCH = 1_000  # instances per block: decided, then answered, then learned, as replay does
DROP_EVERY = 100  # 1 % of the decisions never get feedback; they expire to reward 0


def learner() -> Banditron:
    return Banditron(9, 400, FixedGamma(0.05), seed=5)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_end_to_end_through_the_broker(kafka_bootstrap: str, tmp_path: Path) -> None:
    X, y = synthetic_stream(N, noise=0.05, seed=21)
    topics = make_topics(kafka_bootstrap)
    settings = settings_of(checkpoint_dir=str(tmp_path / "ckpt"),
                              checkpoint_every_events=20_000, join_window_seconds=15.0,
                              limits_poll_max_records=BATCH)
    registry = CollectorRegistry()
    daemon = Daemon(settings, transport(kafka_bootstrap, topics), learner(),
                    PrometheusObserver(registry))
    server = MetricsServer(registry, port=0)
    server.start()
    caller = Caller(kafka_bootstrap, topics, y, drop_every=DROP_EVERY)
    caller.start()
    runner = threading.Thread(target=daemon.run, name="daemon")
    runner.start()
    try:
        # Lockstep blocks: the caller answers a block once all of it is decided and the next
        # block is sent once its feedback is joined, so every block is decided with the same
        # weights however the polls split it -- the in-process replay with batch_size=BATCH.
        prod = producer(kafka_bootstrap)
        started = time.perf_counter()
        caller.hold.set()
        for lo in range(0, N, BATCH):
            block = [f"e{i}" for i in range(lo, lo + BATCH)]
            publish_instances(prod, topics["instances_topic"], X, y, range(lo, lo + BATCH))
            prod.flush()
            wait_until(lambda block=block: all(i in caller.first for i in block), 60,
                       f"decisions of block {lo}", interval_s=0.01)
            caller.hold.clear()
            wait_until(lambda lo=lo: len(caller.feedback_ids) + len(caller.dropped_ids)
                       == lo + BATCH, 60, f"answers to block {lo}", interval_s=0.01)
            caller.hold.set()
            wait_until(lambda: daemon.counters.feedback["joined"] == len(caller.feedback_ids),
                       60, f"joins of block {lo}", interval_s=0.01)
        decided_s = time.perf_counter() - started
        n_dropped = len(range(0, N, DROP_EVERY))
        joined_s = wait_until(lambda: daemon.counters.feedback["joined"] == N - n_dropped
                              and daemon.counters.feedback["expired"] == n_dropped, 120,
                              "every feedback joined and every dropped decision expired",
                              lambda: f"counters {daemon.counters.to_json()}")
        print(f"{N} decided and answered in {decided_s:.1f} s, expiries {joined_s:.1f} s later")
        metrics = scrape(server.url)
    finally:
        daemon.request_stop()
        runner.join(60)
        caller.stop()
        server.stop()
        daemon.transport.close()
    assert not runner.is_alive() and caller.error is None

    decisions = read_all(kafka_bootstrap, topics["decisions_topic"])
    feedback = read_all(kafka_bootstrap, topics["feedback_topic"])
    instances = read_all(kafka_bootstrap, topics["instances_topic"])
    dead = read_all(kafka_bootstrap, topics["dead_letter_topic"])
    ids = {orjson.loads(r.value)["id"] for r in decisions}
    assert ids == {f"e{i}" for i in range(N)} and len(decisions) == N
    assert sorted(orjson.loads(r.value)["id"] for r in feedback) == sorted(caller.feedback_ids)
    assert len(caller.feedback_ids) == N - len(caller.dropped_ids)

    def metric(name: str, **labels: str) -> float:
        return metrics.get((name, tuple(sorted(labels.items()))), 0.0)

    assert metric("streamlearn_instances_total") == len(instances) == N
    assert (metric("streamlearn_decisions_total", explored="true")
            + metric("streamlearn_decisions_total", explored="false")) == len(decisions)
    assert metric("streamlearn_feedback_total", outcome="joined") == len(feedback)
    assert metric("streamlearn_feedback_total", outcome="expired") == len(caller.dropped_ids)
    for outcome in ("late", "unknown", "duplicate"):
        assert metric("streamlearn_feedback_total", outcome=outcome) == 0
    assert len(dead) == 0
    assert not any(name == "streamlearn_invalid_events_total" for name, _ in metrics)

    actions = np.empty(N, dtype=np.int64)
    for r in decisions:
        d = orjson.loads(r.value)
        actions[int(d["id"][1:])] = d["action"]
    daemon_error = float(np.mean(actions != y))
    reference = replay(learner(), X, y, batch_size=BATCH, drop=1 / DROP_EVERY, seed=5)
    print(f"daemon error {daemon_error:.4f}, in-process replay {reference.error_rate:.4f}")
    assert abs(daemon_error - reference.error_rate) <= 0.02
