"""A backlog read long after it was written: feedback that the loop reads before its decision
(held early, docs/daemon.md §3) must still join, whatever the backlog's age.

The early-feedback hold runs on the instance stream's event time. It used to run on the
decisions' wall-clock time instead, so reading a backlog more than
``join.backward_window_seconds`` old dropped every held feedback as ``unknown_id`` (found by
an outside client: instances and their feedback interleaved, read after an outage).
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from loop_helpers import Clock, drain, settings_of

from streamlearn.candidates.learners import CandidateLinUCB
from streamlearn.learners import make_learner
from streamlearn.service.daemon import Daemon
from streamlearn.transport.memory import InMemoryTransport

K, D = 5, 3


def backlog(transport: InMemoryTransport, n: int, start_ms: int, partitions: int,
            rng: np.random.Generator) -> None:
    """``n`` instances and one feedback each, spread over the partitions; in each partition
    every feedback comes after its instance, a random number of instances later."""
    queues: list[list[tuple[str, bytes, int]]] = [[] for _ in range(partitions)]
    t = start_ms
    waiting: list[tuple[int, str]] = []  # (partition, id) decided but not yet answered
    for i in range(n):
        p, event_id = int(rng.integers(partitions)), f"é{i}-\u202e"
        t += int(rng.integers(1, 5))
        queues[p].append(("instances", orjson.dumps({"id": event_id, "x": rng.normal(size=D).tolist()}), t))
        waiting.append((p, event_id))
        while waiting and rng.random() < 0.6:  # answer some of what waits, oldest first
            q, answered = waiting.pop(0)
            t += 1
            queues[q].append(("feedback", orjson.dumps({"id": answered, "reward": 1.0}), t))
    for q, answered in waiting:
        t += 1
        queues[q].append(("feedback", orjson.dumps({"id": answered, "reward": 1.0}), t))
    for p, queue in enumerate(queues):
        for topic, value, ts in queue:
            transport.broker.append(topic, orjson.loads(value)["id"].encode(), value, p, ts)


@pytest.mark.parametrize("age_s", [0.0, 9.0, 11.0, 60.0, 3600.0])
@pytest.mark.parametrize("seed", range(4))
def test_every_feedback_of_an_old_backlog_joins(age_s: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    partitions = 1 + seed % 3
    clock = Clock()
    transport = InMemoryTransport(partitions=partitions)
    n = 300
    backlog(transport, n, int((clock.t - age_s) * 1000) - 2000, partitions, rng)
    daemon = Daemon(settings_of(learner_n_actions=K, learner_n_features=D,
                                   limits_poll_timeout_seconds=0.0,
                                   limits_poll_max_records=int(rng.integers(7, 120))),
                    transport, make_learner("linucb", K, D, seed=0), wall_clock=clock)
    drain(daemon)
    c = daemon.counters
    assert c.decisions == n
    assert c.feedback["unknown"] == 0 and transport.broker.messages("dead-letter") == []
    assert c.feedback["joined"] == n, c.feedback


def test_held_feedback_whose_decision_never_comes_still_becomes_unknown() -> None:
    """The hold is bounded in event time: feedback whose instance never appears is dropped once
    the instance stream is ``backward_window`` past it, old backlog or not, and the window has
    passed on the wall clock since it came (a backlog re-read in a second holds it that long)."""
    clock = Clock()
    transport = InMemoryTransport(partitions=1)
    old = int((clock.t - 3600) * 1000)
    transport.broker.append("feedback", b"ghost", orjson.dumps({"id": "ghost", "reward": 1.0}), 0, old)
    for i in range(3):  # instances 0, 5 and 11 s of event time later
        value = orjson.dumps({"id": f"e{i}", "x": [0.0] * D})
        transport.broker.append("instances", f"e{i}".encode(), value, 0, old + 1 + (0, 5000, 11000)[i])
    daemon = Daemon(settings_of(learner_n_actions=K, learner_n_features=D,
                                   limits_poll_timeout_seconds=0.0, limits_poll_max_records=1),
                    transport, make_learner("linucb", K, D, seed=0), wall_clock=clock)
    unknown_after = []  # after each message read (one per poll)
    while daemon.counters.messages < 4:
        read = daemon.counters.messages
        daemon.step()
        if daemon.counters.messages > read:
            unknown_after.append(daemon.counters.feedback["unknown"])
    assert unknown_after == [0, 0, 0, 0]  # the stream is 11 s past it, the wall clock 0 s
    clock.t += 9.9
    daemon.step()
    assert daemon.counters.feedback["unknown"] == 0
    clock.t += 0.2
    daemon.step()
    assert daemon.counters.feedback["unknown"] == 1  # 10 s of wall time since it came
    [dead] = transport.broker.messages("dead-letter")
    assert orjson.loads(dead.value or b"")["reason"] == "unknown_id"


@pytest.mark.parametrize("age_s", [0.0, 60.0])
def test_every_feedback_of_an_old_candidate_backlog_joins(age_s: float) -> None:
    """The same in candidate mode: requests of 2-4 candidates, one reward per request."""
    rng = np.random.default_rng(7)
    clock = Clock()
    transport = InMemoryTransport(partitions=1)
    t = int((clock.t - age_s) * 1000) - 2000
    n, waiting = 200, []
    for i in range(n):
        t += 2
        cands = [{"id": f"c{j}", "x": rng.normal(size=2).tolist()} for j in range(int(rng.integers(2, 5)))]
        request = {"id": f"r{i}", "x": rng.normal(size=2).tolist(), "candidates": cands}
        transport.broker.append("instances", f"r{i}".encode(), orjson.dumps(request), 0, t)
        waiting.append(f"r{i}")
        while waiting and rng.random() < 0.5:
            t += 1
            answered = waiting.pop(0)
            transport.broker.append("feedback", answered.encode(),
                                    orjson.dumps({"id": answered, "reward": 1.0}), 0, t)
    for answered in waiting:
        t += 1
        transport.broker.append("feedback", answered.encode(),
                                orjson.dumps({"id": answered, "reward": 1.0}), 0, t)
    settings = settings_of(limits_poll_timeout_seconds=0.0, limits_poll_max_records=37,
                              candidates_enabled=True, candidates_shared_features=2,
                              candidates_candidate_features=2, learner_n_actions=2,
                              learner_n_features=6)
    daemon = Daemon(settings, transport, CandidateLinUCB(2, 2, seed=3), wall_clock=clock)
    drain(daemon)
    assert daemon.counters.decisions == n
    assert daemon.counters.feedback["unknown"] == 0 and transport.broker.messages("dead-letter") == []
    assert daemon.counters.feedback["joined"] == n, daemon.counters.feedback
