"""Acceptance of retraining's durability: SIGKILL during retraining and during log rotation
loses and duplicates no experience-log row, and the restart serves the last good ranker.

A real ``serve`` process against the real broker retrains RankBoost every 3,000
learned decisions in its worker process and rotates a log segment every 1,000
rows (plus one per checkpoint). Once a first ranker is live, it is killed with
SIGKILL up to four times right after a retrain started (the kill lands inside the job)
and up to three times at random moments of a stream whose segments rotate every ~0.25 s
(at least two of the first kind and one of the second). At the end the log must
hold every answered decision exactly once — checked by ids, an id checksum and
each row's action, propensity and reward against the decision the caller saw and
the feedback it sent — and the decisions after the last restart carry the ranking
of a ranker that was live before it.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from daemon_harness import Caller, make_topics, serve_crashable, start_publisher, wait_until
from test_crash_safety import drain_and_stop

from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.durability.experience import read_experience
from streamlearn.retrain.artifact import load_artifact
from streamlearn.service.counters import id_checksum
from streamlearn.service.retraining import read_ranker_state

pytestmark = pytest.mark.integration

# 30 s of stream for up to seven kill cycles (each waits for a retrain to start, or for 2,000
# more decisions, then restarts). On a starved machine a retrain can take so long that the
# daemon decides the whole stream first (seen in CI beside a CPU hog: 120,000 events gone
# after five kills); then the cycles stop there, and the kills so far must include two inside
# a retrain and one at a random moment
N = 120_000
RATE = 4_000


def serve(bootstrap: str, topics: dict[str, str], ckpt: Path, log: Path) -> subprocess.Popen[bytes]:
    return serve_crashable(bootstrap, topics, ckpt, log, "--retrain-every-events", "3000",
                           "--retrain-rankers", "rankboost", "--retrain-window-rows", "2000",
                           "--experience-segment-rows", "1000", gamma=0.2)


@pytest.mark.cpu_share
def test_sigkill_during_retrain_and_rotation_keeps_the_log_exact(kafka_bootstrap: str,
                                                                 tmp_path: Path) -> None:
    X, y = synthetic_stream(N, noise=0.05, seed=9)
    topics = make_topics(kafka_bootstrap)
    ckpt, log = tmp_path / "ckpt", tmp_path / "serve.log"
    caller = Caller(kafka_bootstrap, topics, y)
    caller.start()

    publisher = start_publisher(kafka_bootstrap, topics["instances_topic"], X, y, RATE)
    rng = np.random.default_rng(20261201)
    proc = serve(kafka_bootstrap, topics, ckpt, log)
    wait_until(lambda: "retrain 1: ranker" in log.read_text(), 120, "a first good ranker",
               lambda: log.read_text()[-2000:])
    kills: list[str] = []

    def stream_over() -> bool:  # every instance published and decided: nothing more will come
        return not publisher.is_alive() and len(caller.first) >= N

    for k in range(7):
        if k % 2 == 0:  # right after a retrain started: inside the job
            started = len(re.findall(r"retrain \d+ started", log.read_text()))

            def retrain_started(s: int = started) -> bool:
                return len(re.findall(r"retrain \d+ started", log.read_text())) > s

            wait_until(lambda: retrain_started() or stream_over(), 120, "a retrain to start",
                       lambda: log.read_text()[-2000:])
            if not retrain_started():
                break  # the stream ran out first (a slow machine): the kills so far count
            time.sleep(float(rng.uniform(0.05, 0.5)))
            last = re.findall(r"retrain \d+( started|: ranker)", log.read_text())[-1]
            in_flight = last == " started"
            kills.append("retrain" if in_flight else "retrain (already done)")
        else:  # a random moment while segments rotate every ~0.25 s
            seen = caller.n_decisions
            wait_until(lambda s=seen: caller.n_decisions > s + 2000 or stream_over(), 120,
                       "the daemon to serve", lambda: log.read_text()[-2000:])
            if caller.n_decisions <= seen + 2000:
                break  # the stream ran out first
            time.sleep(float(rng.uniform(0.0, 0.3)))
            kills.append("random")
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        proc = serve(kafka_bootstrap, topics, ckpt, log)
    publisher.join(120)
    code = drain_and_stop(proc, caller, kafka_bootstrap, topics, N, log)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert caller.error is None and caller.mismatches == []
    print(f"kills: {kills}")
    assert kills.count("retrain") >= 2  # at least two kills landed inside a job
    assert "random" in kills  # and one at a random moment of the rotation

    rows = read_experience(ckpt / "experience")
    assert len(rows.ids) == len(set(rows.ids)) == N  # nothing twice, nothing lost
    assert id_checksum(rows.ids) == id_checksum(caller.feedback_ids)
    first = {i: orjson.loads(v) for i, v in caller.first.items()}
    assert rows.actions.tolist() == [first[i]["action"] for i in rows.ids]
    np.testing.assert_allclose(rows.propensities, [first[i]["prob"] for i in rows.ids], rtol=1e-6)
    labels = np.array([y[int(i[1:])] for i in rows.ids])
    np.testing.assert_array_equal(rows.rewards, (rows.actions == labels).astype(float))

    state = read_ranker_state(ckpt / "rankers")
    assert load_artifact(state["live"]).version >= 1  # the last good ranker loads and verifies
    assert not [p for p in (ckpt / "rankers").iterdir() if p.name.startswith(".")]
    late = [first[f"e{i}"] for i in range(N - 1000, N)]
    assert all("ranking" in d for d in late)  # served after the last restart, with a ranker
    assert "Traceback" not in text
