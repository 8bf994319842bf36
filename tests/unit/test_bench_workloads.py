"""The broker benchmark's streams are what the daemon accepts, and its caller rewards the
right decisions."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from loop_helpers import settings_of

from simulators import bench_daemon
from simulators.bench_workloads import D_C, Workload, candidate_sets, fixed_actions
from streamlearn.candidates.learners import CandidateLinUCB
from streamlearn.cli import main
from streamlearn.service.daemon import Daemon
from streamlearn.transport.memory import InMemoryTransport


@pytest.mark.parametrize("load", [fixed_actions(5, "dense", 0), fixed_actions(5, "sparse", 0),
                                  candidate_sets(5, 7, 0)])
def test_the_serve_options_of_each_workload_are_valid(load: Workload,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--print-config", *load.serve_args]) == 0
    assert "[candidates]" in capsys.readouterr().out


def test_fixed_action_rewards_follow_the_label() -> None:
    load = fixed_actions(50, "dense", 3)
    events = [orjson.loads(v) for v in load.values]
    assert all(np.shape(load.relay_decode(e)) == (400,) for e in events)
    for e in events:
        right = {"id": e["id"], "action": e["label"]}
        wrong = {"id": e["id"], "action": (e["label"] + 1) % 9}
        assert (load.reward(right), load.reward(wrong)) == (1.0, 0.0)


def test_candidate_requests_are_all_decided_and_the_best_candidate_is_rewarded() -> None:
    n, per_request = 40, 7
    load = candidate_sets(n, per_request, 1)
    transport = InMemoryTransport(partitions=1)
    for key, value in zip(load.keys, load.values, strict=True):
        transport.append_instance(key, value)
    settings = settings_of(candidates_enabled=True, candidates_shared_features=0,
                              candidates_candidate_features=D_C, learner_n_actions=2,
                              learner_n_features=2 * D_C, limits_poll_timeout_seconds=0.0)
    daemon = Daemon(settings, transport, CandidateLinUCB(0, D_C, seed=1))
    while daemon.counters.messages < n:
        daemon.step()
    decisions = [orjson.loads(m.value or b"") for m in transport.broker.messages(transport.decisions_topic)]
    assert len(decisions) == n and not transport.broker.messages(transport.dead_letter_topic)
    rewards = np.array([load.reward(d) for d in decisions])
    assert set(np.unique(rewards)) <= {0.0, 1.0}
    for d in decisions:  # exactly one candidate per request earns the reward
        request = orjson.loads(load.values[int(d["id"][1:])])
        ids = [c["id"] for c in request["candidates"]]
        paid = [load.reward({"id": d["id"], "candidates": [{"id": c}]}) for c in ids]
        assert sum(paid) == 1.0 and len(ids) == per_request


def test_candidates_in_memory_is_refused_with_where_to_look(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_daemon.main(["--in-memory", "--candidates", "5"])
    assert exit_info.value.code == 2
    assert "bench_loop --candidates" in capsys.readouterr().err


def test_the_in_memory_loop_runs_on_the_fixed_action_workload(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_daemon.main(["--in-memory", "--events", "200"]) == 0
    assert capsys.readouterr().out.count("events/s (200 instances") == 2
