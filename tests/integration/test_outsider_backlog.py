"""An outside client leaves a backlog larger than the join's dense row matrix, with hostile
values and odd Unicode ids, and kills the daemon in the middle of it.

With d = 400 the dense matrix of pending rows covers 10,485 slots (32 MB); a backlog of
16,000 instances without feedback puts the later rows in the sparse arena, and the
SIGKILL makes the restarted daemon restore both kinds from its checkpoint. Nothing may be
lost: every valid instance gets a decision, every invalid one a dead letter, and every
feedback joins.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import free_port
from daemon_harness import make_topics
from outsider import Client, Daemon, Problem

pytestmark = pytest.mark.integration

N, D, K = 16_000, 400, 9


def test_a_backlog_past_the_dense_rows_survives_a_sigkill(kafka_bootstrap: str,
                                                           tmp_path: Path) -> None:
    names = make_topics(kafka_bootstrap, partitions=2)
    t = {"instances": names["instances_topic"], "feedback": names["feedback_topic"],
         "decisions": names["decisions_topic"], "dead_letter": names["dead_letter_topic"]}
    daemon = Daemon(kafka_bootstrap, t, tmp_path / "ckpt", tmp_path / "log.txt", free_port(),
                    Problem(n=10, d=D, k=K, seed=1))
    client = Client(kafka_bootstrap, t)
    rng = np.random.default_rng(7)
    ids, labels = [], []
    for i in range(N):
        x = np.zeros(D)
        nz = rng.choice(D, 40, replace=False)
        x[nz] = rng.normal(size=40)
        if i % 97 == 0:
            x[nz[0]] = 1e300  # finite but past limits.max_abs_feature: a dead letter
        if i % 89 == 0:
            x[nz[1]] = -0.0
        if i % 83 == 0:
            x[nz[2]] = 5e-324  # subnormal
        event_id = f"é🙂\u200b{i}\U0001F600ñ"
        ids.append(event_id)
        labels.append(int(rng.integers(K)))
        client.send_instance(event_id, orjson.dumps({"id": event_id, "x": x.tolist()}))
    client.flush()
    try:
        daemon.start()
        client.wait(lambda: len(client.first) >= 9_000, 120, "9,000 decisions", daemon.tail)
        daemon.kill()
        daemon.start()

        def rejected() -> set[tuple[str, int, int]]:
            return {(d["topic"], d["partition"], d["offset"]) for d in client.dead_letters}

        client.wait(lambda: len(client.first) + len(rejected()) >= N, 180,
                    "a decision or a dead letter for every instance", daemon.tail)
        client.drain_dead_letters()
        assert len(client.first) + len(rejected()) == N
        assert {d["reason"] for d in client.dead_letters} == {"value_out_of_range"}
        assert all(ids[i] in client.first for i in range(N) if i % 97)
        assert all(0 <= d["action"] < K for d in client.first.values())
        for event_id, label in zip(ids, labels, strict=True):
            if event_id in client.first:
                client.send_feedback(event_id, float(client.first[event_id]["action"] == label))
        client.flush()
        deadline = time.monotonic() + 120
        joined = 0.0
        while time.monotonic() < deadline:
            joined = daemon.metric("streamlearn_feedback_total", 'outcome="joined"')
            if joined >= len(client.first):
                break
            time.sleep(0.5)
        assert joined == len(client.first), daemon.tail()
        assert daemon.stop() == 0
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.kill()
        client.close()
