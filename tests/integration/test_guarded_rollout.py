"""A ranker that looks better off-policy than it is live cannot sink the live policy.

``planted:LeakyOracle`` reads the label of every logged context when it is first used,
the rows the promotion gate judges it on included (a leak), and plays action 0 elsewhere:
on every row the gate judges it on it is perfect, at whichever look, so its promotion does
not depend on how much evidence the first look had; live, on fresh SynNonSep contexts, it is
right one time in nine. A real ``serve`` (``--retrain-policy ranker``) against the real
broker promotes it, rolls it out at its first share, and the guardrail — on-policy, what each policy
earns on the events it serves — rolls it back. Over the events of its rollout the live
reward falls short of what the learner alone earned over the same events by at most 0.02
(read from the experience log: every learned decision with the policy that served it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from daemon_harness import REPO, Caller, make_topics, start_publisher, wait_until

from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.durability.experience import read_experience
from streamlearn.retrain.store import read_ranker_state

pytestmark = pytest.mark.integration

TESTS = REPO / "tests"
N, RATE = 200_000, 2000


def _rolled_back(ckpt: Path) -> list[dict[str, object]]:
    path = ckpt / "rankers"
    history = read_ranker_state(path).get("history", []) if path.is_dir() else []
    return [h for h in history if h.get("rollout") == "rolled_back"]


@pytest.mark.cpu_share
def test_a_leaky_ranker_is_promoted_then_rolled_back_by_the_guardrail(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    X, y = synthetic_stream(N, noise=0.05, seed=21)
    topics = make_topics(kafka_bootstrap)
    ckpt, log = tmp_path / "ckpt", tmp_path / "serve.log"
    caller = Caller(kafka_bootstrap, topics, y)
    caller.start()
    publisher = start_publisher(kafka_bootstrap, topics["instances_topic"], X, y, RATE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(TESTS))),
           "PLANTED_LOG_DIR": str(ckpt / "experience")}
    args = [sys.executable, "-m", "streamlearn", "serve", "--bootstrap", kafka_bootstrap,
            "--topics-instances", topics["instances_topic"],
            "--topics-feedback", topics["feedback_topic"],
            "--topics-decisions", topics["decisions_topic"],
            "--topics-dead-letter", topics["dead_letter_topic"],
            "--checkpoint-dir", str(ckpt), "--metrics-port", "-1", "--progress-seconds", "0",
            "--learner", "banditron", "--exploration", "fixed", "--gamma", "0.2", "--seed", "5",
            "--retrain-every-events", "3000", "--retrain-window-rows", "10000",
            "--retrain-rankers", "planted:LeakyOracle", "--retrain-policy", "ranker"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    try:
        wait_until(lambda: bool(_rolled_back(ckpt)), 300, "the leaky ranker's rollback",
                   lambda: log.read_text()[-3000:])
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        caller.stop()
        publisher.stop()
    text = log.read_text()
    assert code == 0 and "Traceback" not in text, text[-3000:]
    history = read_ranker_state(ckpt / "rankers")["history"]
    promoted = next(h for h in history if h.get("promoted"))
    back = _rolled_back(ckpt)[0]
    assert back["reason"] == "guardrail" and back["ranker"] == "leakyoracle", back
    assert back["artifact"] == promoted["artifact"]
    # the promoted ranker looked credibly better off-policy than the learner ...
    assert promoted["advantage_lower"] > 0, promoted["reason"]
    # ... and over the events of its rollout the live reward fell short of the learner's by
    # at most 0.02: decisions from its promotion to its last served event
    rows = read_experience(ckpt / "experience")
    order = np.argsort(rows.decided_at, kind="stable")
    served, rewards, decided = (rows.served_by[order], rows.rewards[order],
                                rows.decided_at[order])
    version = int(back["ranker_version"])
    by_it = np.flatnonzero(served == version)
    assert len(by_it) >= 10, "the ranker served some events before it was rolled back"
    during = slice(int(np.searchsorted(decided, promoted["at"])), int(by_it[-1]) + 1)
    learner_value = float(rewards[during][served[during] == 0].mean())
    live = float(rewards[during].mean())
    share = float((served[during] == version).mean())
    assert learner_value - live <= 0.02, (learner_value, live, share, len(rewards[during]))
    assert float(rewards[by_it].mean()) < learner_value - 0.2  # it was far worse live
