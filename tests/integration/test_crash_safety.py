"""Acceptance: SIGKILL the serving process at random moments; nothing lost, nothing twice.

The daemon runs as a real ``python -m streamlearn serve`` process. While
100,000 instances stream in, it is killed with SIGKILL at 6 seeded random
moments and restarted each time. At the end it is stopped with SIGTERM (final
checkpoint). The checkpoint's exact counters are compared with the topics:
each feedback on the feedback topic was applied exactly once (count and an
id checksum), every id got a decision, and every decision re-emitted after a
restart is byte-identical to the first one. One instance in 2,500 carries an
event time far in the future (a producer with a wrong clock): one such
instance used to move its partition's join clock a minute ahead, and after a
restart the feedback re-read before its decision was dropped as unknown.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
from daemon_harness import (
    CLIENTS,
    Caller,
    make_topics,
    read_all,
    serve_crashable,
    start_publisher,
    wait_started,
    wait_until,
)
from kafka import KafkaConsumer, TopicPartition

from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.service.counters import id_checksum
from streamlearn.snapshot import read_snapshot

pytestmark = pytest.mark.integration

N = 100_000
RATE = 4_000  # instances per second offered by the caller
KILLS = 6


def serve(bootstrap: str, topics: dict[str, str], ckpt: Path, log: Path,
          client: str) -> subprocess.Popen[bytes]:
    return serve_crashable(bootstrap, topics, ckpt, log, "--kafka-client", client)


def committed_everything(bootstrap: str, topics: dict[str, str]) -> bool:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="streamlearn",
                             enable_auto_commit=False)
    try:
        parts = [TopicPartition(topics[t], p) for t in ("instances_topic", "feedback_topic")
                 for p in consumer.partitions_for_topic(topics[t]) or []]
        end = consumer.end_offsets(parts)
        return all((consumer.committed(tp) or 0) >= end[tp] for tp in parts)
    finally:
        consumer.close()


def kill_at(marks: np.ndarray, start: Callable[[int], subprocess.Popen[bytes]], caller: Caller,
            log: Path, rng: np.random.Generator) -> tuple[subprocess.Popen[bytes], list[int]]:
    """Start ``serve`` (``start(0)``), SIGKILL it at each mark and start the next
    (``start(k)``); the last one started and the decided ids at each kill."""
    proc = start(0)
    kill_log = []
    for k, mark in enumerate(marks, 1):
        # kill while it is deciding: past the mark, once it emits new decisions, after a delay
        wait_until(lambda mark=mark: len(caller.first) >= mark, 120, "the stream to progress",
                   lambda: log.read_text()[-2000:])
        seen = caller.n_decisions
        wait_until(lambda seen=seen: caller.n_decisions > seen + 200, 60, "the daemon to serve",
                   lambda: log.read_text()[-2000:])
        time.sleep(float(rng.uniform(0.0, 1.5)))
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        kill_log.append(len(caller.first))
        proc = start(k)
    return proc, kill_log


def drain_and_stop(proc: subprocess.Popen[bytes], caller: Caller, bootstrap: str,
                   topics: dict[str, str], n: int, log: Path) -> int:
    """Wait until ``proc`` has started, every id is decided and answered and all input is
    committed; then stop ``serve`` with SIGTERM (final checkpoint) and the caller; the exit
    code."""
    try:
        wait_started(proc)
        wait_until(lambda: len(caller.first) == n, 300, "a decision for every id",
                   lambda: f"{len(caller.first)} decided; log {log.read_text()[-2000:]}")
        wait_until(lambda: len(caller.feedback_ids) == n, 60, "feedback for every decision")
        wait_until(lambda: committed_everything(bootstrap, topics), 120,
                   "the daemon to commit all input", interval_s=1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        caller.stop()
    return code


@pytest.mark.parametrize("client", CLIENTS)
def test_sigkill_at_random_moments_loses_nothing(kafka_bootstrap: str, tmp_path: Path,
                                                 client: str) -> None:
    X, y = synthetic_stream(N, noise=0.05, seed=8)
    topics = make_topics(kafka_bootstrap)
    ckpt, log = tmp_path / "ckpt", tmp_path / "serve.log"
    caller = Caller(kafka_bootstrap, topics, y)
    caller.start()

    publisher = start_publisher(kafka_bootstrap, topics["instances_topic"], X, y, RATE,
                                future_every=2_500)
    rng = np.random.default_rng(20261130)
    marks = np.sort(rng.uniform(0.05, 0.9, size=KILLS)) * N  # spread over the whole stream
    proc, kill_log = kill_at(marks, lambda k: serve(kafka_bootstrap, topics, ckpt, log, client),
                             caller, log, rng)
    publisher.join(120)
    code = drain_and_stop(proc, caller, kafka_bootstrap, topics, N, log)
    assert code == 0, log.read_text()[-3000:]
    assert caller.error is None
    print(f"decided ids at each kill: {kill_log}; decision messages {caller.n_decisions} "
          f"for {N} ids")
    assert min(kill_log) < N  # every kill hit a live stream (input was still flowing)

    # re-emitted decisions are identical (same action, prob, every byte)
    assert caller.mismatches == []
    assert caller.n_decisions > N  # restarts did re-emit decisions

    # exactly once, from the checkpoint the final stop wrote
    newest = sorted(ckpt.glob("ckpt-*"))[-1]
    _arrays, meta = read_snapshot(newest)
    counters = meta["counters"]
    feedback = [orjson.loads(r.value)["id"] for r in read_all(kafka_bootstrap,
                                                              topics["feedback_topic"])]
    assert len(feedback) == len(set(feedback)) == N  # the caller answered each id once
    assert counters["feedback"]["joined"] == len(feedback)
    assert int(counters["applied_checksum"]) == id_checksum(feedback)
    assert meta["learner"]["counters"]["n_updated"] == len(feedback)
    assert counters["instances"] == counters["decisions"] == N
    for outcome in ("late", "expired", "unknown", "duplicate"):
        assert counters["feedback"][outcome] == 0, counters
    assert counters["invalid"] == {}
    assert "Traceback" not in log.read_text()


def test_a_replacement_machine_restores_from_the_changelog_alone(kafka_bootstrap: str,
                                                                 tmp_path: Path) -> None:
    """``checkpoint.changelog``: at every SIGKILL the checkpoint directory is wiped (the
    machine is gone); the next daemon restores from the changelog topic alone, and still
    every id is decided once (re-emits byte-identical) and every feedback applied once."""
    n, kills = 40_000, 3
    X, y = synthetic_stream(n, noise=0.05, seed=9)
    topics = make_topics(kafka_bootstrap)
    changelog = f"{topics['instances_topic']}-changelog"
    log = tmp_path / "serve.log"
    caller = Caller(kafka_bootstrap, topics, y)
    caller.start()
    publisher = start_publisher(kafka_bootstrap, topics["instances_topic"], X, y, RATE)
    rng = np.random.default_rng(20261204)

    def machine(k: int) -> subprocess.Popen[bytes]:
        return serve_crashable(kafka_bootstrap, topics, tmp_path / f"disk-{k}", log,
                               "--checkpoint-changelog", "true", "--topics-changelog", changelog)

    # each restart an empty directory of its own
    proc, kill_log = kill_at(np.sort(rng.uniform(0.1, 0.85, size=kills)) * n, machine, caller,
                             log, rng)
    publisher.join(120)
    code = drain_and_stop(proc, caller, kafka_bootstrap, topics, n, log)
    assert code == 0, log.read_text()[-3000:]
    assert caller.error is None
    assert min(kill_log) < n
    assert log.read_text().count("restored checkpoint") >= kills, log.read_text()[-3000:]
    assert caller.mismatches == [] and caller.n_decisions > n

    from streamlearn.durability.changelog import Changelog
    from streamlearn.transport.keyed_log import KafkaKeyedLog

    final = Changelog(KafkaKeyedLog(kafka_bootstrap, changelog, 0, write=False)).restore()
    counters = final.meta["counters"]
    feedback = [orjson.loads(r.value)["id"] for r in read_all(kafka_bootstrap,
                                                              topics["feedback_topic"])]
    assert len(feedback) == len(set(feedback)) == n
    assert counters["feedback"]["joined"] == n
    assert int(counters["applied_checksum"]) == id_checksum(feedback)
    assert counters["instances"] == counters["decisions"] == n
    for outcome in ("late", "expired", "unknown", "duplicate"):
        assert counters["feedback"][outcome] == 0, counters
    assert "Traceback" not in log.read_text()
