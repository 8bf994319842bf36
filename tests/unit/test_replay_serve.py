"""One engine: ``replay`` and the serving loop reach the same learner on the same stream.

The serving side is the real :class:`Daemon` on the in-memory transport, fed
in lockstep like the replay's micro-batches: a batch of instances is decided,
then the feedback due by the end of that batch arrives (immediately, or after
the replay's own delay draws), then the next batch. Both key the exploration
by the event ids ``e<n>``, so the same state makes the same decisions.
"""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
from loop_helpers import settings_of

from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.learners import Banditron, EpsilonGreedy, FixedGamma, Learner
from streamlearn.replay.fixed import _FeedbackDraws, replay
from streamlearn.service.daemon import Daemon
from streamlearn.transport.memory import InMemoryTransport

N, B, K, D = 3000, 50, 9, 400
X, Y = synthetic_stream(N, noise=0.05, seed=4)


def learner(name: str) -> Learner:
    if name == "banditron":
        return Banditron(K, D, FixedGamma(0.05), seed=2)
    return EpsilonGreedy(K, D, FixedGamma(0.05), seed=2)


def serve_in_lockstep(model: Learner, delay_mean: float) -> Daemon:
    transport = InMemoryTransport(partitions=1)
    broker = transport.broker
    settings = settings_of(learner_n_actions=K, learner_n_features=D,
                              limits_poll_max_records=10 * B, limits_poll_timeout_seconds=0.0,
                              join_window_seconds=1e9)
    daemon = Daemon(settings, transport, model)
    delays, _ = _FeedbackDraws(N, delay_mean, 0.0, seed=0).take(N)
    stamp = int(time.time() * 1000)
    in_flight: list[tuple[int, float]] = []  # (round, reward) not delivered yet
    answered = 0

    def step_until(done: object) -> None:
        for _ in range(1000):
            if done():  # type: ignore[operator]
                return
            daemon.step()
        raise AssertionError("the daemon did not get there")

    for lo in range(0, N, B):
        hi = min(N, lo + B)
        for n in range(lo, hi):
            stamp += 1
            broker.append("instances", f"e{n}".encode(), orjson.dumps(
                {"id": f"e{n}", "x": X[n].tolist(), "label": int(Y[n])}), 0, stamp)
        step_until(lambda hi=hi: daemon.counters.instances == hi)
        decisions = [orjson.loads(m.value or b"") for m in broker.messages("decisions")[lo:hi]]
        in_flight += [(int(d["id"][1:]), float(d["action"] == Y[int(d["id"][1:])]))
                      for d in decisions]
        due = sorted(f for f in in_flight if f[0] + delays[f[0]] < hi)
        in_flight = [f for f in in_flight if f[0] + delays[f[0]] >= hi]
        for n, reward in due:
            stamp += 1
            broker.append("feedback", f"e{n}".encode(),
                          orjson.dumps({"id": f"e{n}", "reward": reward}), 0, stamp)
        answered += len(due)
        step_until(lambda answered=answered: daemon.counters.feedback["joined"] == answered)
    return daemon


@pytest.mark.parametrize("name", ["banditron", "epsilon-greedy"])
def test_replay_and_serve_agree_with_immediate_feedback(name: str) -> None:
    replayed_model = learner(name)
    result = replay(replayed_model, X, Y, batch_size=B, id_format="e{}")
    daemon = serve_in_lockstep(learner(name), delay_mean=0.0)
    assert abs(daemon.tracker.error_rate - result.error_rate) <= 1e-9
    assert daemon.learner.n_updated_ == replayed_model.n_updated_ == N
    served, _ = daemon.learner.state()
    for key, value in replayed_model.state()[0].items():
        np.testing.assert_allclose(served[key], value, rtol=0, atol=1e-9)


def test_replay_and_serve_agree_with_delayed_feedback() -> None:
    replayed_model = learner("banditron")
    result = replay(replayed_model, X, Y, batch_size=B, delay_mean=120.0, id_format="e{}",
                    window=10 ** 6)
    daemon = serve_in_lockstep(learner("banditron"), delay_mean=120.0)
    actions = [orjson.loads(m.value or b"")["action"]
               for m in daemon.transport.broker.messages("decisions")]  # type: ignore[attr-defined]
    assert len(actions) == N
    served_error = float(np.mean(np.array(actions) != Y))
    print(f"error: replay {result.error_rate:.6f}, served {served_error:.6f}")
    assert abs(served_error - result.error_rate) <= 0.01
    assert daemon.learner.n_updated_ == replayed_model.n_updated_
