"""Acceptance of robustness: an outside client, hostile input and a SIGKILL through a real broker.

The client (``outsider.py``) knows only the documented event format. Three
runs of the same seeded 20,000-event stream, in lockstep blocks:

* clean, uninterrupted — the reference;
* clean, SIGKILLed once mid-stream, 2,000 instances published while it is
  down, restarted — the learner must be where the uninterrupted run was: the
  error over the next 4,000 events within 0.02 of the same window of the
  reference (defect 3);
* with 200 hostile messages mixed in and the same SIGKILL — every valid id
  decided, no decision outside its ``actions`` subset, the joined count in
  ``streamlearn inspect --json`` equal to the feedback sent, the error per
  2,000 events within 0.03 of the reference, every invalid message on the
  dead-letter topic with a specific reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from conftest import free_port
from outsider import REPO, Problem, RunResult, play

pytestmark = pytest.mark.integration

PROBLEM = Problem(noise=0.1)
# killed before the first checkpoint (due at 10,000 messages): the restart re-reads everything
# from offset 0; before the fix the backlog was decided by a model that had not yet re-learned
# the re-read feedback (0.59 vs 0.39 over the next 4,000 events)
KILL_AT = 3_000
BACKLOG = 2_000  # instances published while the daemon is down


def topics(bootstrap: str, tag: str) -> dict[str, str]:
    from daemon_harness import make_topics

    names = make_topics(bootstrap, partitions=2)
    return {"instances": names["instances_topic"], "feedback": names["feedback_topic"],
            "decisions": names["decisions_topic"], "dead_letter": names["dead_letter_topic"]}


@pytest.fixture(scope="module")
def reference(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return play(kafka_bootstrap, topics(kafka_bootstrap, "ref"), tmp_path_factory.mktemp("ref"),
                free_port(), PROBLEM, backlog_at=KILL_AT, backlog=BACKLOG)


def window_error(run: RunResult, lo: int, hi: int) -> float:
    actions = np.array([run.first[f"o{i}"]["action"] for i in range(lo, hi)])
    return float((actions != PROBLEM.y[lo:hi]).mean())


def test_sigkill_leaves_the_learner_where_an_uninterrupted_run_is(
        kafka_bootstrap: str, tmp_path: Path, reference: RunResult) -> None:
    killed = play(kafka_bootstrap, topics(kafka_bootstrap, "kill"), tmp_path, free_port(), PROBLEM,
                  backlog_at=KILL_AT, backlog=BACKLOG, kill=True)
    before = window_error(killed, 0, KILL_AT), window_error(reference, 0, KILL_AT)
    after = (window_error(killed, KILL_AT, KILL_AT + 4000),
             window_error(reference, KILL_AT, KILL_AT + 4000))
    print(f"error before the kill {before[0]:.4f} (reference {before[1]:.4f}); next 4,000 after "
          f"the restart {after[0]:.4f} (reference {after[1]:.4f})")
    assert before[0] == before[1]  # lockstep: identical until the kill
    assert abs(after[0] - after[1]) <= 0.02


def test_hostile_client_with_a_sigkill(kafka_bootstrap: str, tmp_path: Path,
                                       reference: RunResult) -> None:
    names = topics(kafka_bootstrap, "hostile")
    run = play(kafka_bootstrap, names, tmp_path, free_port(), PROBLEM, backlog_at=KILL_AT,
               backlog=BACKLOG, kill=True, hostile=200)
    valid = [h for h in run.hostile if h[2]]
    invalid = [h for h in run.hostile if not h[2]]
    assert len(valid) > 20 and len(invalid) > 100

    # every valid id decided, within its mask, with a finite propensity
    for event_id in [f"o{i}" for i in range(PROBLEM.n)] + [h[0] for h in valid]:
        decision = run.first[str(event_id)]
        assert 0 <= decision["action"] < PROBLEM.k and 0 < decision["prob"] <= 1
    for event_id, value, _ in valid:
        allowed = orjson.loads(value).get("actions")
        if allowed is not None:
            assert run.first[str(event_id)]["action"] in allowed

    # the learner was not poisoned: the error per 2,000 events follows the clean run
    gaps = np.abs(np.array(run.errors) - np.array(reference.errors))
    print("error per 2,000 events:", [round(e, 3) for e in run.errors], "reference:",
          [round(e, 3) for e in reference.errors])
    assert gaps.max() <= 0.03, gaps

    # every invalid message on the dead-letter topic, each with a specific reason
    # (at-least-once: dead letters of input re-read after the kill come twice; one per offset)
    instance_letters = list({(d["partition"], d["offset"]): d for d in run.dead_letters
                             if d["topic"] == names["instances"]}.values())
    assert len(instance_letters) == len(invalid)
    reasons = {d["reason"] for d in instance_letters}
    assert "value_out_of_range" in reasons and "bad_features" not in {
        d["reason"] for d in instance_letters if "idx" not in d["detail"]}
    for letter in instance_letters:
        assert letter["detail"] and letter["detail"] != letter["reason"], letter
    assert not [d for d in run.dead_letters if d["topic"] == names["feedback"]]

    # the checkpoint's joined count equals the feedback the client sent
    done = subprocess.run([sys.executable, "-m", "streamlearn", "inspect", "--json",
                           str(tmp_path / "ckpt")], capture_output=True, text=True, cwd=REPO,
                          check=True)
    state = json.loads(done.stdout)
    assert state["other"]["counters"]["feedback"]["joined"] == run.feedback_sent
    assert "Traceback" not in run.log


def test_hostile_client_with_retraining_and_a_sigkill(kafka_bootstrap: str,
                                                       tmp_path: Path) -> None:
    """The same outside client, hostile messages and SIGKILL, with the rankers retraining
    (docs/daemon.md §8): rankings stay inside the masks, the experience log holds every answered
    decision once with finite contexts, and no retrain fails."""
    names = topics(kafka_bootstrap, "hostile-retrain")
    run = play(kafka_bootstrap, names, tmp_path, free_port(), PROBLEM, backlog_at=KILL_AT,
               backlog=BACKLOG, kill=True, hostile=200,
               extra=("--retrain-every-events", "2000", "--experience-segment-rows", "700"))
    valid = [h for h in run.hostile if h[2]]
    ranked = 0
    for event_id, value, _ in valid:
        decision, allowed = run.first[str(event_id)], orjson.loads(value).get("actions")
        if "ranking" in decision:
            ranked += 1
            expected = sorted(allowed) if allowed is not None else list(range(PROBLEM.k))
            assert sorted(decision["ranking"]) == expected, decision
    late = [run.first[f"o{i}"] for i in range(PROBLEM.n - 2000, PROBLEM.n)]
    assert ranked > 0 and all("ranking" in d for d in late)

    from streamlearn.durability.experience import read_experience
    from streamlearn.service.retraining import read_ranker_state

    rows = read_experience(tmp_path / "ckpt" / "experience")
    assert len(rows.ids) == len(set(rows.ids)) == run.feedback_sent
    assert np.isfinite(rows.X).all() and np.abs(rows.X).max() <= 1e12
    history = read_ranker_state(tmp_path / "ckpt" / "rankers")["history"]
    # at least one retrain finished and none failed; on a loaded machine retrains due while
    # one runs are overruns, so how many finish within the stream is not fixed (the cadence
    # is tested in test_retrain.py)
    assert len(history) >= 1
    assert "retrain failed" not in run.log and "Traceback" not in run.log


def test_outside_client_with_baselines_typed_feedback_and_hostile_baselines(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The outside client next to its own system (docs/kafka.md "Event shapes"): every
    instance carries its baseline, ``serve --rollout apprentice`` with an exploration budget
    lets the learner serve 30 % of the events; each decision is answered with a click, a
    conversion and a dwell (``type``, summed with weights); 150 instances valid but for their
    baseline (negative, too large, strings, floats, booleans, lists, nested objects, a
    30-digit integer, "NaN", not among the event's actions) are mixed in, and the daemon is
    SIGKILLed once. Nothing crashes; every bad baseline is a ``bad_baseline`` dead letter
    that says what came; every decision repeats the baseline it saw, and the baseline's
    share is served by it."""
    problem = Problem(n=4000, noise=0.1, seed=12)
    names = topics(kafka_bootstrap, "baselines")
    run = play(kafka_bootstrap, names, tmp_path, free_port(), problem, block=500,
               backlog_at=2000, backlog=1000, kill=True, hostile=30, hostile_baseline=150,
               baselines=True,
               feedback_types=(("click", 1.0), ("conversion", 0.5), ("dwell", 0.25)),
               extra=("--rollout", "apprentice", "--rollout-explore-budget", "0.3",
                      "--join-duplicate-policy", "sum", "--join-reward-weights",
                      "click=1,conversion=2", "--join-window-seconds", "3"))
    assert "Traceback" not in run.log

    by_learner = 0
    for i in range(problem.n):
        d = run.first[f"o{i}"]
        assert d["baseline"] == problem.baseline(i), d
        if d.get("policy") == "baseline":
            assert d["action"] == d["baseline"] and 0.7 - 1e-9 <= d["prob"] <= 1.0, d
        else:
            assert "policy" not in d and 0 < d["prob"] <= 1.0, d
            by_learner += 1
    assert 0.2 < by_learner / problem.n < 0.4  # the budget, drawn by key

    bad_baseline_ids = {str(h[0]) for h in run.hostile if h[0] and h[0].startswith("b")
                        and not h[2]}
    assert len(bad_baseline_ids) > 100
    letters = list({(d["partition"], d["offset"]): d for d in run.dead_letters
                    if d["topic"] == names["instances"]}.values())
    assert len(letters) == sum(1 for h in run.hostile if not h[2])
    reasons = {str(d["id"]): d for d in letters if d["id"] in bad_baseline_ids}
    assert set(reasons) == bad_baseline_ids
    for letter in reasons.values():
        assert letter["reason"] == "bad_baseline", letter
        assert letter["detail"].startswith("expected 'baseline' "), letter
        assert ", got " in letter["detail"]
    assert not [d for d in letters if d["reason"] == "bad_baseline" and d["id"] not in
                bad_baseline_ids]
    for event_id, value, valid in run.hostile:
        if valid and str(event_id).startswith("b"):
            sent = orjson.loads(value)
            decision = run.first[str(event_id)]
            assert decision.get("baseline") == sent["baseline"], decision
            assert decision["action"] in sent.get("actions", range(problem.k))
    # typed feedback, several events per decision: none refused
    assert not [d for d in run.dead_letters if d["topic"] == names["feedback"]]

    done = subprocess.run([sys.executable, "-m", "streamlearn", "inspect", "--json",
                           str(tmp_path / "ckpt")], capture_output=True, text=True, cwd=REPO,
                          check=True)
    adoption = json.loads(done.stdout)["adoption"]
    assert adoption["mode"] == "apprentice" and adoption["history"] == []
    assert adoption["live_value"]["learner"]["events"] > 0
    assert adoption["live_value"]["baseline"]["events"] > adoption["live_value"]["learner"][
        "events"]
    assert 0.0 <= adoption["agreement"] <= 1.0
