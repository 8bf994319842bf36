"""Candidate mode with ``retrain.policy = ranker``: a retrained ranker takes slots, a bad one never.

A real ``serve`` on the embedded ``ohsumed-candidates`` stream (3 slots) retrains a
planted ranker every 3,000 learned slots (``tests/planted.py``): ``RelevanceOracle`` knows
every candidate's true reward, ``RelevanceAntiOracle`` puts the irrelevant ones first.
The better one is promoted (through the off-policy gate or, when the learner's log is
too thin for it, as a trial at the rollout's first share), rolled out slot by slot, and
completes its rollout; the slots it placed earn more than the learner's. The worse one
is judged at every retrain and never promoted: no slot is ever placed by it.

The daemon is stopped once what is tested has happened (or the bound runs out): the
tests wait on the ranker history, not on a stream being long enough.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from daemon_harness import REPO, STARTED, wait_until

from streamlearn.commands.evaluate import evaluate
from streamlearn.durability.experience import read_experience
from streamlearn.retrain.store import read_ranker_state

pytestmark = [pytest.mark.integration, pytest.mark.needs_data]


def _serve(ckpt: Path, log: Path, ranker: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "streamlearn", "serve",
            "--embedded-dataset", "ohsumed-candidates", "--embedded-slots", "3",
            "--max-events", "1000000", "--checkpoint-dir", str(ckpt),
            # every snapshot of the run kept, so the journal keeps every decision: with the
            # default 2 a snapshot just before the stop left a journal of a few decisions
            "--checkpoint-keep", "1000",
            "--metrics-port", "-1", "--progress-seconds", "0",
            "--retrain-every-events", "3000", "--retrain-policy", "ranker",
            # 250 learned slots per rollout share (default 500): at 2 % of ~2,000 slots/s a
            # stage takes ~6 s, shorter than the ~10 s between promotions of newer versions,
            # each of which restarts the rollout at its first share
            "--retrain-rollout-stage-events", "250",
            "--retrain-rankers", f"planted:{ranker}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(REPO / "tests")))}
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    STARTED.append(proc)
    return proc


def _history(ckpt: Path) -> list[dict[str, Any]]:
    path = ckpt / "rankers"
    return list(read_ranker_state(path).get("history", [])) if path.is_dir() else []


def _stop(proc: subprocess.Popen[bytes], log: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0, log.read_text()[-3000:]


def test_a_planted_better_ranker_is_promoted_and_takes_slots(tmp_path: Path) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "serve.log"
    proc = _serve(ckpt, log, "RelevanceOracle")
    try:
        wait_until(lambda: any(h.get("rollout") == "completed" for h in _history(ckpt)), 600,
                   "the oracle's rollout to complete", lambda: log.read_text()[-2000:], 1.0)
    finally:
        _stop(proc, log)
    history = _history(ckpt)
    promoted = [h for h in history if h.get("promoted")]
    assert promoted and promoted[0]["ranker"] == "relevanceoracle", history
    rows = read_experience(ckpt / "experience")
    served = np.asarray(rows.served_by)
    rewards = np.asarray(rows.rewards, dtype=np.float64)
    by_ranker, by_learner = served > 0, served == 0
    assert by_ranker.sum() > 1000, f"{int(by_ranker.sum())} slots placed by the ranker"
    # the oracle's slots earn more than the learner's: ~0.97 against ~0.5 on OHSUMED
    assert rewards[by_ranker].mean() > rewards[by_learner].mean() + 0.2, (
        rewards[by_ranker].mean(), rewards[by_learner].mean())
    checks = [h for h in history if h.get("rollout") == "consistency"]
    assert all(h["reason"] == "inside" for h in checks), checks
    # γ logged per slot is the learner's exploration at its request (CandidateLinUCB's ε =
    # 0.01 spread: a few %), not 1 − the placed propensity (~1 wherever the oracle placed it)
    assert np.percentile(np.asarray(rows.gamma), 95) < 0.2, np.percentile(rows.gamma, [50, 95])
    _decisions_describe_what_served_them(ckpt)
    _evaluate_reproduces_the_loops_verdicts(ckpt, history)


def _decisions_describe_what_served_them(ckpt: Path) -> None:
    """A decision whose first slot the oracle placed ranks by the oracle and is `explored`
    only where the oracle explored (γ of a few %), not wherever it disagrees with the
    learner (about half of the requests)."""
    served = []
    for path in sorted(ckpt.glob("journal-*.jsonl")):
        for line in path.read_bytes().splitlines():
            try:
                decision = orjson.loads(line)["d"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # a torn last line
            if "policy" in decision["candidates"][0]:
                served.append(decision)
    assert len(served) >= 50, f"{len(served)} journaled decisions led by the oracle"
    explored = np.mean([d["explored"] for d in served])
    assert explored < 0.15, f"{explored:.2%} of the oracle's decisions say explored"
    for d in served:  # its best candidate leads the ranking; placed first unless explored
        assert (d["ranking"][0] == d["candidates"][0]["id"]) is (not d["explored"]), d


def _evaluate_reproduces_the_loops_verdicts(ckpt: Path, history: list[dict[str, Any]]) -> None:
    """`streamlearn evaluate --retrain V` on the candidate log: the loop's per-slot values
    and verdicts of retrain V, to 1e-12."""
    judged = [h for h in history if any((i or {}).get("offpolicy")
                                        for i in (h.get("rankers") or {}).values())]
    assert judged, history
    entry = judged[-1]
    args = argparse.Namespace(log_dir=str(ckpt / "experience"), policy=None, estimator=None,
                              segments=None, max_rows=None, holdout_only=False,
                              holdout_fraction=None, clip=None, level=None, artifacts=None,
                              json=True, retrain=entry["version"])
    report = evaluate(args)
    assert report["mode"] == "candidates" and report["retrain"] == entry["version"]
    for name, info in entry["rankers"].items():
        recorded, got = info["offpolicy"], report["estimates"][f"ranker:{name}"]
        assert got["verdict"]["passed"] == recorded["passed"]
        assert got["verdict"]["advantage_lower"] == pytest.approx(recorded["advantage_lower"],
                                                                  abs=1e-12)
        for mine, theirs in zip(got["slots"], recorded["slots"], strict=True):
            for key in ("low", "high", "mean"):
                assert mine[key] == pytest.approx(theirs[key], abs=1e-12), (name, key)


def test_a_planted_worse_ranker_is_never_promoted(tmp_path: Path) -> None:
    ckpt, log = tmp_path / "ckpt", tmp_path / "serve.log"
    proc = _serve(ckpt, log, "RelevanceAntiOracle")

    def judged() -> list[dict[str, Any]]:
        return [h for h in _history(ckpt)
                if (h.get("rankers") or {}).get("relevanceantioracle", {}).get("offpolicy")]
    try:
        wait_until(lambda: len(judged()) >= 4, 600, "four off-policy verdicts on the anti-oracle",
                   lambda: log.read_text()[-2000:], 1.0)
    finally:
        _stop(proc, log)
    assert not any(h.get("promoted") for h in _history(ckpt)), _history(ckpt)
    verdicts = [h["rankers"]["relevanceantioracle"]["offpolicy"] for h in judged()]
    assert not any(v["passed"] for v in verdicts), verdicts
    rows = read_experience(ckpt / "experience")
    assert len(rows) and not np.asarray(rows.served_by).any()
