"""Acceptance (issue 10): the daemon retrains its rankers on schedule, exports what it
measured to a real Prometheus, and promotes a ranker when, and only when, its lower
confidence bound beats the current policy.

Every run is a real ``python -m streamlearn serve`` on its embedded simulator with
the retrainer in its default worker process.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_prometheus_scrape import _read_until, _value

from streamlearn.service.retraining import read_ranker_state
from streamlearn.stream.experience import read_experience

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]  # planted.py: the planted rankers


def serve(ckpt: Path, *args: str, linger: float = 0.0) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(TESTS))),
           "PLANTED_LOG_DIR": str(ckpt / "experience")}
    return subprocess.Popen(
        [sys.executable, "-m", "streamlearn", "serve", "--checkpoint-dir", str(ckpt),
         "--progress-seconds", "0", "--linger-seconds", str(linger), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def finish(proc: subprocess.Popen[str], stop: bool = False) -> str:
    """Wait for ``serve`` to end by itself (``stop``: end its linger with SIGTERM)."""
    if stop and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return err


@pytest.mark.needs_data
def test_retraining_on_letter_reaches_prometheus(prometheus: Callable[..., Any],
                                                 tmp_path: Path) -> None:
    proc = serve(tmp_path, "--embedded-dataset", "letter", "--retrain-every-events", "3000",
                 "--retrain-window-rows", "5000", "--max-events", "30000", "--embedded-rate",
                 "3000", "--metrics-port", "0", linger=120)
    try:
        port = int(_read_until(proc, r"metrics on http://127\.0\.0\.1:(\d+)/metrics", 60).group(1))
        server = prometheus(f"127.0.0.1:{port}")
        _read_until(proc, r"daemon totals", 120)
        stopped_at = time.time()
        server.wait_for("timestamp(streamlearn_instances_total)",
                        lambda r: bool(r) and float(r[0]["value"][1]) > stopped_at, 30)
        retrains = _value(server.query("streamlearn_retrain_duration_seconds_count"))
        assert retrains >= 2
        assert _value(server.query("sum(streamlearn_ranker_promotions_total)")) == retrains
        assert _value(server.query("streamlearn_retrain_failures_total")) == 0
        for metric in ("auc", "ndcg"):
            assert 0 <= _value(server.query(f'streamlearn_ranker_quality{{metric="{metric}"}}')) <= 1
        exported = {}
        for policy in ("learner", "uniform", "best_constant", "ranker:logistic"):
            for estimator in ("snips", "dr"):
                labels = f'{{policy="{policy}", estimator="{estimator}"}}'
                exported[policy, estimator] = tuple(
                    _value(server.query(f"streamlearn_policy_value{suffix}{labels}"))
                    for suffix in ("_lower", "", "_upper"))
        assert _value(server.query("streamlearn_ranker_version")) >= 1
    finally:
        finish(proc, stop=True)
    state = read_ranker_state(tmp_path / "rankers")
    assert len(state["history"]) == retrains
    # the gauges hold the last retrain's estimates; one no held-out row could weigh is NaN
    for (policy, estimator), gauges in exported.items():
        recorded = state["history"][-1]["estimates"][policy][estimator]
        for key, gauge in zip(("low", "value", "high"), gauges, strict=True):
            if recorded[key] is None:
                assert math.isnan(gauge), (policy, estimator, key, gauge)
            else:
                assert gauge == pytest.approx(recorded[key], rel=1e-9), (policy, estimator, key)
        if recorded["value"] is not None:
            assert gauges[0] <= gauges[1] <= gauges[2], (policy, estimator)
    rows = read_experience(tmp_path / "experience")
    assert len(rows.ids) == len(set(rows.ids)) > 25_000  # every learned decision, once
    # `streamlearn evaluate` on the same log reproduces what the loop estimated
    last = state["history"][-1]
    out = subprocess.run(
        [sys.executable, "-m", "streamlearn", "evaluate", str(tmp_path / "experience"),
         "--retrain", str(last["version"]), "--policy", "learner", "--policy", "uniform",
         "--estimator", "snips,dr", "--json"],
        capture_output=True, text=True, check=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}).stdout
    report = orjson.loads(out)
    for policy in ("learner", "uniform"):
        for estimator in ("snips", "dr"):
            ours = last["estimates"][policy][estimator]
            theirs = report["estimates"][policy][estimator]
            assert theirs["value"] == pytest.approx(ours["value"], abs=1e-12), (policy, estimator)
            assert theirs["low"] == pytest.approx(ours["low"], abs=1e-12)


@pytest.mark.needs_data
def test_retraining_every_few_seconds_on_a_drifting_stream(tmp_path: Path) -> None:
    proc = serve(tmp_path, "--embedded-dataset", "pendigits", "--embedded-drift-at", "9000",
                 "--retrain-every-seconds", "2", "--retrain-rankers", "logistic",
                 "--retrain-window-rows", "5000", "--max-events", "45000", "--embedded-rate",
                 "3000", "--metrics-port", "-1")
    err = finish(proc)
    history = read_ranker_state(tmp_path / "rankers")["history"]
    times = [entry["started"] for entry in history]
    assert len(history) >= 4, err[-2000:]  # 15 s of stream, one retrain every 2 s at most
    assert min(b - a for a, b in itertools.pairwise(times)) >= 1.9
    assert all(entry["ranker"] == "logistic" for entry in history)


@pytest.mark.needs_data
@pytest.mark.parametrize("planted, better", [("CentroidOracle", True),
                                             ("CentroidAntiOracle", False)])
def test_promotion_fires_when_and_only_when_the_lower_bound_wins(
        tmp_path: Path, planted: str, better: bool) -> None:
    proc = serve(tmp_path, "--embedded-dataset", "pendigits", "--retrain-every-events", "3000",
                 "--retrain-rankers", f"planted:{planted}", "--exploration", "fixed",
                 "--gamma", "0.3", "--max-events", "15000", "--embedded-rate", "3000",
                 "--metrics-port", "-1")
    err = finish(proc)
    history = read_ranker_state(tmp_path / "rankers")["history"]
    assert len(history) >= 3, err[-2000:]
    for entry in history:
        wins = entry["lower"] is not None and entry["lower"] > entry["current_value"]
        assert entry["promoted"] == wins, entry
    promoted = [entry for entry in history if entry["promoted"]]
    if better:  # the first retrain already beats the learner; later ones only tie the promoted one
        assert promoted and promoted[0] is history[0], history
        assert "promoted" in err and "rejected" in err
    else:
        assert not promoted, history


@pytest.mark.needs_data
def test_sigusr1_rolls_the_promoted_ranker_back(tmp_path: Path) -> None:
    log = tmp_path / "serve.err"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(TESTS))),
           "PLANTED_LOG_DIR": str(tmp_path / "experience")}
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlearn", "serve", "--checkpoint-dir", str(tmp_path),
             "--progress-seconds", "0", "--embedded-dataset", "pendigits",
             "--retrain-every-events", "3000", "--retrain-rankers", "planted:CentroidOracle",
             "--retrain-policy", "ranker", "--exploration", "fixed", "--gamma", "0.3",
             "--embedded-rate", "3000", "--metrics-port", "-1"],
            stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while "promoted (" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "promoted (" in log.read_text(), log.read_text()[-2000:]
        proc.send_signal(signal.SIGUSR1)
        while "rolled back" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None  # a rollback does not stop the daemon
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    text = log.read_text()
    assert code == 0 and "rolled back" in text and "now the online learner" in text, text[-2000:]
    state = read_ranker_state(tmp_path / "rankers")
    rollbacks = [entry for entry in state["history"] if "rolled_back" in entry]
    assert len(rollbacks) == 1 and rollbacks[0]["promoted_now"] is None
