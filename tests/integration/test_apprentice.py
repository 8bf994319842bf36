"""Acceptance: ``serve --rollout apprentice`` next to an existing system, across a SIGKILL —
through a real broker and a real ``python -m streamlearn serve``.

Every instance carries the caller's own choice (``"baseline"``: the label on two events in
three, a wrong action on the others). With no exploration budget the baseline serves every
event: each decision is the baseline with propensity 1 (``"policy": "baseline"``), and the
learner learns from what is logged all the same. The daemon is killed with SIGKILL
mid-stream and restarted; decisions it re-emits must be byte-identical to the first ones,
every id must be decided, every feedback applied once, and ``/metrics`` must export the
agreement of the learner's own choice with the baseline while it runs.
"""

from __future__ import annotations

import math
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest
from daemon_harness import Caller, make_topics, producer, serve_crashable, wait_until
from test_crash_safety import drain_and_stop

from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.snapshot import read_snapshot

pytestmark = pytest.mark.integration

N = 20_000
RATE = 5_000  # instances per second offered: a four-second stream
K = 9  # the synthetic stream's actions (serve's default learner.n_actions)


def baseline_of(i: int, y: np.ndarray) -> int:
    """The existing system: right on two events in three, one action off on the others."""
    return int(y[i]) if i % 3 else int((y[i] + 1) % K)


def start_publisher(bootstrap: str, topic: str, X: np.ndarray, y: np.ndarray
                    ) -> threading.Thread:
    """Every instance, with its baseline, at about ``RATE`` per second, in a thread."""
    def publish() -> None:
        prod = producer(bootstrap)
        chunk = RATE // 10
        for lo in range(0, N, chunk):
            for i in range(lo, min(N, lo + chunk)):
                nz = np.flatnonzero(X[i])
                value = {"id": f"e{i}", "x": {"idx": nz.tolist(), "val": X[i, nz].tolist()},
                         "label": int(y[i]), "baseline": baseline_of(i, y)}
                prod.send(topic, key=f"e{i}".encode(), value=orjson.dumps(value))
            time.sleep(0.1)
        prod.flush()
        prod.close()

    publisher = threading.Thread(target=publish, daemon=True, name="publisher")
    publisher.start()
    return publisher


def scrape(log: Path, started: int) -> dict[str, float]:
    """The samples of ``/metrics`` of the process whose start is logged after byte ``started``
    of ``log`` (empty while it is not answering yet)."""
    found = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)",
                      log.read_bytes()[started:].decode(errors="replace"))
    if found is None:
        return {}
    try:
        with urllib.request.urlopen(found.group(1), timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


def test_apprentice_serves_the_baseline_across_a_sigkill(kafka_bootstrap: str,
                                                        tmp_path: Path) -> None:
    started = time.monotonic()
    X, y = synthetic_stream(N, noise=0.05, seed=28)
    topics = make_topics(kafka_bootstrap)
    ckpt, log = tmp_path / "ckpt", tmp_path / "serve.log"
    args = ("--rollout", "apprentice", "--metrics-port", "0", "--checkpoint-every-seconds", "1")
    caller = Caller(kafka_bootstrap, topics, y)
    caller.start()
    publisher = start_publisher(kafka_bootstrap, topics["instances_topic"], X, y)
    proc = serve_crashable(kafka_bootstrap, topics, ckpt, log, *args)
    rng = np.random.default_rng(28)
    # the agreement is exported once feedback was learned from, while the first process runs
    samples: dict[str, float] = {}

    def exported() -> bool:
        samples.update(scrape(log, 0))
        return not math.isnan(samples.get("streamlearn_baseline_agreement", math.nan))

    wait_until(exported, 60, "streamlearn_baseline_agreement on /metrics",
               lambda: f"{samples}; {log.read_text()[-2000:]}")
    agreement = samples["streamlearn_baseline_agreement"]
    assert 0.0 <= agreement <= 1.0
    assert samples['streamlearn_rollout_mode{mode="apprentice"}'] == 1.0
    assert samples['streamlearn_rollout_mode{mode="online"}'] == 0.0
    assert samples['streamlearn_rollout_share{role="baseline"}'] == 1.0
    assert samples['streamlearn_rollout_share{role="learner"}'] == 0.0
    # killed while it decides, with checkpoints behind it and decisions in flight
    wait_until(lambda: len(caller.first) >= N // 2, 90, "half the stream to be decided",
               lambda: log.read_text()[-2000:])
    time.sleep(float(rng.uniform(0.0, 0.5)))
    assert proc.poll() is None, log.read_text()[-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    killed_at = len(caller.first)
    assert list(ckpt.glob("ckpt-*")), "no checkpoint before the kill"
    proc = serve_crashable(kafka_bootstrap, topics, ckpt, log, *args)
    publisher.join(60)
    code = drain_and_stop(proc, caller, kafka_bootstrap, topics, N, log)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert caller.error is None
    assert killed_at < N  # the kill hit a live stream
    assert "restored checkpoint" in text

    # every id decided by the baseline, with propensity 1; re-emitted decisions identical
    assert caller.mismatches == []
    assert set(caller.first) == {f"e{i}" for i in range(N)}
    wrong = []
    for event_id, value in caller.first.items():
        d = orjson.loads(value)
        b = baseline_of(int(event_id[1:]), y)
        if not (d["action"] == d["baseline"] == b and d["prob"] == 1.0
                and d.get("policy") == "baseline" and d["explored"] is False):
            wrong.append(d)
    assert not wrong, f"{len(wrong)} decisions not the baseline's, e.g. {wrong[:3]}"

    # the learner learned from every logged decision, exactly once; the mode was kept
    arrays, meta = read_snapshot(sorted(ckpt.glob("ckpt-*"))[-1])
    counters = meta["counters"]
    assert counters["instances"] == counters["decisions"] == N
    assert counters["feedback"]["joined"] == N
    assert meta["learner"]["counters"]["n_updated"] == N
    assert counters["invalid"] == {}
    adoption = meta["adoption"]
    assert adoption["mode"] == "apprentice" and adoption["history"] == []
    assert adoption["share"] == 0.0 and adoption["events"] == N
    assert adoption["stats"]["baseline"]["n"] == N
    assert adoption["stats"]["learner"]["n"] == 0
    assert adoption["agreement"] is not None and 0.0 <= adoption["agreement"] <= 1.0
    weights = arrays["learner.weights"]
    assert np.isfinite(weights).all() and np.abs(weights).sum() > 0  # the model moved
    assert "Traceback" not in text
    print(f"agreement scraped {agreement:.3f}, final {adoption['agreement']:.3f}; killed at "
          f"{killed_at} decided; {caller.n_decisions} decision messages for {N} ids; "
          f"{time.monotonic() - started:.1f} s")
