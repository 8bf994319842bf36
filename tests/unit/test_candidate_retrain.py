"""Rankers retrained on logged candidate sets: a query per request, the placed candidates as
documents, rewards as relevance, IPS weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from candidate_world import D_C, D_X, SLOTS, logged_world

from streamlearn.candidates.slates import deployed_distribution
from streamlearn.durability.experience import ExperienceLog, read_experience
from streamlearn.durability.recorder import REQUESTS_DIR
from streamlearn.engine.candidates import pair_id
from streamlearn.errors import ConfigError
from streamlearn.retrain.artifact import load_artifact, make_ranker
from streamlearn.retrain.candidates import candidate_queries, logged_requests, run_candidate_retrain
from streamlearn.retrain.promotion import TRIAL_NDCG_MARGIN, candidate_promotion


def logged_slates(directory: Path, n_requests: int, seed: int = 0) -> None:
    """Slates placed in a uniformly random order (so the slot order carries no signal) with
    rewards from a known linear model of φ."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(D_X, D_C))
    beta = rng.normal(size=D_C)
    log = ExperienceLog(directory, segment_rows=5000)
    log.open(None)
    ids, rows, slots, probs, rewards = [], [], [], [], []
    for r in range(n_requests):
        x = rng.normal(size=D_X)
        items = rng.normal(size=(SLOTS, D_C))
        utility = x @ theta @ items.T + items @ beta
        reward = (rng.random(SLOTS) < 1 / (1 + np.exp(-3 * utility))).astype(float)
        for s in range(SLOTS):
            ids.append(pair_id(f"req-{r}", f"c{s}"))
            rows.append(np.concatenate([x, items[s], items[0]]))
            slots.append(s)
            p = np.zeros(SLOTS)
            p[s] = 1.0 / (10 - s)  # the slot propensity of a uniform pick among 10 candidates
            probs.append(p)
            rewards.append(reward[s])
    n = len(ids)
    log.append(ids, np.array(rows), np.array(slots), np.array(probs), np.array(rewards),
               np.full(n, -1), np.zeros(n, int), np.zeros(n))
    log.flush()


def test_requests_become_queries_of_their_placed_candidates(tmp_path: Path) -> None:
    logged_slates(tmp_path / "log", 50)
    rows = read_experience(tmp_path / "log")
    phi, qid, requests = candidate_queries(rows, D_X, D_C)
    assert phi.shape == (150, D_C + D_X * D_C + 1)
    assert len(requests) == 50 and np.bincount(qid).tolist() == [SLOTS] * 50
    assert [requests[q] for q in qid[:3]] == ["req-0"] * 3


def test_listwise_rankers_train_on_logged_slates_and_reorder_them_better_than_chance(
        tmp_path: Path) -> None:
    logged_slates(tmp_path / "log", 3000)
    result = run_candidate_retrain({
        "log_dir": str(tmp_path / "log"), "artifact_dir": str(tmp_path / "rankers"),
        "rankers": ["rankboost", "adarank", "ndcg_boost", "logistic"], "version": 1,
        "candidates": {"d_x": D_X, "d_c": D_C}, "holdout_fraction": 0.3})
    assert result["documents_per_query"] == SLOTS
    assert 2500 < result["train_queries"] + result["heldout_queries"] <= 3000
    random_order = result["learner"]["ndcg"]  # the logged order is random
    for name in ("rankboost", "adarank", "ndcg_boost", "logistic"):
        info = result["rankers"][name]
        assert info["ndcg"] > random_order + 0.03, (name, info, random_order)
        assert info["auc"] > 0.6
        assert load_artifact(info["artifact"]).ranker.n_features_in_ == D_C + D_X * D_C + 1


def test_listwise_rankers_are_refused_without_queries() -> None:
    with pytest.raises(ConfigError, match="needs qid"):
        make_ranker("adarank")
    assert type(make_ranker("adarank", queries=True)).__name__ == "AdaRank"


class Planted:
    """A ranker with known weights on φ (all the judge calls is ``score``)."""

    def __init__(self, w: np.ndarray) -> None:
        self.w = w

    def score(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X @ self.w)


def test_whole_requests_are_read_back_in_decision_order_with_their_slates(tmp_path: Path) -> None:
    stream, _, chosen, slot_p = logged_world(tmp_path / "log", 300, seed=3)
    whole = logged_requests(read_experience(tmp_path / "log" / REQUESTS_DIR),
                            read_experience(tmp_path / "log"), D_X, D_C)
    assert whole.request_ids == stream.request_ids  # decided in this order
    np.testing.assert_array_equal(whole.offsets, stream.sets.offsets)
    np.testing.assert_array_equal(whole.logged, chosen)
    np.testing.assert_allclose(whole.slot_probs, slot_p, rtol=1e-6)  # stored as float32
    assert stream.sets.rewards is not None
    np.testing.assert_array_equal(whole.rewards, stream.sets.rewards[chosen])
    cut = logged_requests(read_experience(tmp_path / "log" / REQUESTS_DIR),
                          read_experience(tmp_path / "log"), D_X, D_C, watermark=100.0)
    assert cut.request_ids == stream.request_ids[:100]  # decided before the watermark
    part = whole.take(np.array([5, 2]))
    assert part.request_ids == [stream.request_ids[5], stream.request_ids[2]]
    np.testing.assert_array_equal(part.phi[part.logged[0]], whole.phi[whole.logged[5]])


def test_a_planted_better_ranker_passes_the_per_slot_gate_and_a_worse_one_does_not(
        tmp_path: Path) -> None:
    """On 3,000 logged requests, the true scorer (deployed with the logged γ) passes the gate
    against the ε-greedy learner, its negation does not, and each one's per-slot intervals
    hold its value at that slot given the logged prefix."""
    stream, truth, chosen, _ = logged_world(tmp_path / "log", 3000, seed=4)
    whole = logged_requests(read_experience(tmp_path / "log" / REQUESTS_DIR),
                            read_experience(tmp_path / "log"), D_X, D_C)
    mu = np.asarray(stream.expected)
    for sign, should_pass in ((1.0, True), (-1.0, False)):
        ranker = Planted(sign * truth)
        verdict = whole.judge(ranker, 0.05)  # type: ignore[arg-type]
        assert verdict["passed"] is should_pass, verdict
        scores = ranker.score(whole.phi)
        placed = np.zeros(len(mu), dtype=bool)
        for s, interval in enumerate(verdict["slots"]):
            dist = deployed_distribution(scores, whole.offsets, placed, whole.gamma)
            value = np.add.reduceat(dist * mu, whole.offsets[:-1]).mean()
            assert interval["low"] <= value <= interval["high"], (sign, s, value, interval)
            placed[chosen[:, s]] = True


def test_a_retrain_reports_per_slot_verdicts_when_the_request_log_is_there(
        tmp_path: Path) -> None:
    logged_world(tmp_path / "log", 1500, seed=5)
    result = run_candidate_retrain({
        "log_dir": str(tmp_path / "log"), "artifact_dir": str(tmp_path / "rankers"),
        "rankers": ["logistic", "rankboost"], "version": 1,
        "candidates": {"d_x": D_X, "d_c": D_C}, "holdout_fraction": 0.3})
    assert 300 < result["offpolicy"]["requests"] < 600  # the held-out requests
    for name in ("logistic", "rankboost"):
        verdict = result["rankers"][name]["offpolicy"]
        assert len(verdict["slots"]) == SLOTS and verdict["rows"] == 3 * result["offpolicy"]["requests"]
    logged_slates(tmp_path / "old", 100)  # a log without a request log: measured, not judged
    old = run_candidate_retrain({
        "log_dir": str(tmp_path / "old"), "artifact_dir": str(tmp_path / "rankers"),
        "rankers": ["logistic"], "version": 2, "candidates": {"d_x": D_X, "d_c": D_C}})
    assert "no request log" in old["offpolicy"]["skipped"]
    assert "offpolicy" not in old["rankers"]["logistic"]


def _report(offpolicy: dict[str, dict[str, Any]], ndcg: dict[str, float],
            learner_ndcg: float) -> dict[str, Any]:
    return {"version": 4, "learner": {"ndcg": learner_ndcg},
            "offpolicy": {"learner_slots": [0.5, 0.4, 0.3]},
            "rankers": {name: {"artifact": f"/a/{name}", "ndcg": ndcg[name],
                               "offpolicy": offpolicy[name]} for name in ndcg}}


def _verdict(passed: bool, lower: float, high: float) -> dict[str, Any]:
    return {"rows": 900, "passed": passed, "advantage_lower": lower, "ess": 300.0,
            "alpha": 0.01, "value": {"low": high - 0.2, "high": high, "mean": high - 0.1}}


def test_candidate_promotion_passes_then_trials_then_refuses() -> None:
    """A ranker whose per-slot verdict passed is promoted (the highest lower bound); with
    none passed, the best held-out NDCG ahead of the learner's by the margin enters as a
    trial, unless a ranker is already on trial or its value is credibly below the learner's."""
    both = {"a": _verdict(True, 0.02, 0.9), "b": _verdict(True, 0.05, 0.9)}
    decision = candidate_promotion(_report(both, {"a": 0.9, "b": 0.7}, 0.8), trial=True)
    assert decision["promote"] and decision["ranker"] == "b" and not decision.get("trial")

    thin = {"a": _verdict(False, -0.3, 0.9), "b": _verdict(False, -0.2, 0.9)}
    report = _report(thin, {"a": 0.8 + TRIAL_NDCG_MARGIN + 0.01, "b": 0.7}, 0.8)
    decision = candidate_promotion(report, trial=True)
    assert decision["promote"] and decision["trial"] and decision["ranker"] == "a"
    assert decision["artifact"] == "/a/a" and decision["version"] == 4
    assert not candidate_promotion(report, trial=False)["promote"]

    close = _report(thin, {"a": 0.8 + TRIAL_NDCG_MARGIN - 0.01, "b": 0.7}, 0.8)
    assert not candidate_promotion(close, trial=True)["promote"]
    worse = _report({"a": _verdict(False, -0.3, 0.35), "b": thin["b"]},
                    {"a": 0.95, "b": 0.7}, 0.8)  # its whole interval below the learner's 0.4
    assert not candidate_promotion(worse, trial=True)["promote"]


def test_a_trial_replaces_only_the_learner_and_waits_longer_after_each_failure(
        tmp_path: Path) -> None:
    """RankerState (retrain.policy = ranker, candidate mode): a trial-worthy report puts its
    ranker at the rollout's first share; none starts while one is rolled out; after the
    first failed trial the next waits 2 retrains, after the second 4."""
    from loop_helpers import settings_of

    from streamlearn.retrain.artifact import save_artifact
    from streamlearn.service.metrics import Observer
    from streamlearn.service.ranker_state import RankerState

    state = RankerState(settings_of(retrain_every_events=300, retrain_policy="ranker",
                                    retrain_rankers="rocchio"),
                        Observer(), tmp_path / "rankers", lambda: 0.0)
    state.open()
    ranker = make_ranker("rocchio")
    ranker.fit(np.eye(4), np.array([1.0, 0.0, 1.0, 0.0]))
    thin = _verdict(False, -0.3, 0.9)

    def retrain() -> dict[str, Any]:
        version = state.take_version()
        path = save_artifact(tmp_path / "rankers", "rocchio", version, ranker, 1, 4)
        return {"version": version, "learner": {"ndcg": 0.8},
                "offpolicy": {"learner_slots": [0.5]},
                "rankers": {"rocchio": {"artifact": str(path), "ndcg": 0.95,
                                        "offpolicy": thin}}}

    state.apply_candidates(retrain(), 0.0)  # v1: a trial
    assert state.rollout.candidate is not None and state.rollout.candidate.version == 1
    state.apply_candidates(retrain(), 0.0)  # v2: one is rolled out already
    assert state.rollout.candidate.version == 1
    state.rollout.roll_back("guardrail")  # v1 fails: the next trial waits for retrain 3 + 2
    assert state.state["trial_after"] == 5
    for _ in range(2):  # v3, v4
        state.apply_candidates(retrain(), 0.0)
        assert state.rollout.candidate is None
    state.apply_candidates(retrain(), 0.0)  # v5: a trial again
    assert state.rollout.candidate is not None and state.rollout.candidate.version == 5
    state.rollout.roll_back("guardrail")
    assert state.state["trial_after"] == 6 + 4
    history = [h for h in state.state["history"] if "trial" in h]
    assert [h["version"] for h in history if h["trial"]] == [1, 5]


def test_candidate_mode_exports_per_slot_values_and_the_live_rankers_version(
        tmp_path: Path) -> None:
    """A candidate retrain's pooled per-slot values reach streamlearn_policy_value (logged
    and each ranker), and streamlearn_ranker_version names only a ranker live in the
    rollout: a trial at 2 % leaves it at 0 (the learner ranks the other 98 %)."""
    from loop_helpers import settings_of

    from streamlearn.retrain.artifact import save_artifact
    from streamlearn.service.metrics import Observer
    from streamlearn.service.ranker_state import RankerState

    class Recorder(Observer):
        def __init__(self) -> None:
            self.values: dict[str, tuple[float, float, float]] = {}
            self.versions: list[int] = []

        def on_policy_value(self, policy: str, estimator: str, value: float, low: float,
                            high: float) -> None:
            assert estimator == "bound"
            self.values[policy] = (value, low, high)

        def on_ranker_version(self, version: int) -> None:
            self.versions.append(version)

    observer = Recorder()
    state = RankerState(settings_of(retrain_every_events=300, retrain_policy="ranker",
                                    retrain_rankers="rocchio", candidates_enabled=True),
                        observer, tmp_path / "rankers", lambda: 0.0)
    state.open()
    ranker = make_ranker("rocchio")
    ranker.fit(np.eye(4), np.array([1.0, 0.0, 1.0, 0.0]))
    version = state.take_version()
    path = save_artifact(tmp_path / "rankers", "rocchio", version, ranker, 1, 4)
    verdict = {**_verdict(False, -0.3, 0.9), "value": {"mean": 0.6, "low": 0.3, "high": 0.9}}
    state.apply_candidates({"version": version, "learner": {"ndcg": 0.8},
                            "offpolicy": {"learner_slots": [0.5],
                                          "logged": {"mean": 0.5, "low": 0.45, "high": 0.55}},
                            "rankers": {"rocchio": {"artifact": str(path), "ndcg": 0.95,
                                                    "offpolicy": verdict}}}, 0.0)
    assert observer.values == {"logged": (0.5, 0.45, 0.55), "ranker:rocchio": (0.6, 0.3, 0.9)}
    assert state.rollout.candidate is not None  # a trial at the first share ...
    assert set(observer.versions) == {0}  # ... is not what ranks the decisions
    assert state.state["best_measured"] == str(path) and not state.state.get("live")


def test_a_retrain_starts_on_flushed_logs_the_request_log_included(tmp_path: Path) -> None:
    """The rows a retrain judges on are on disk when its job is handed over: the request log
    is flushed with the experience log (it used to wait for a checkpoint or 50,000 rows, so
    early retrains found no whole request to judge on)."""
    from loop_helpers import settings_of

    from streamlearn.candidates.sets import CandidateSets
    from streamlearn.service.metrics import Observer
    from streamlearn.service.retraining import Retraining

    retraining = Retraining(settings_of(retrain_every_events=10, candidates_enabled=True,
                                        candidates_shared_features=D_X,
                                        candidates_candidate_features=D_C,
                                        retrain_holdout_fraction=0.9,
                                        checkpoint_dir=str(tmp_path)), Observer())
    recorder = retraining.experience
    recorder.open(None, restored=False)
    sets = CandidateSets(np.zeros((4, D_X)), np.ones((12, D_C)), np.arange(0, 13, 3))
    chosen = np.array([[0, 1], [3, 4], [6, 7], [9, 10]])
    recorder.record_requests([f"r{i}" for i in range(4)], [f"c{i}" for i in range(12)], sets,
                             chosen, np.full((4, 2), 0.5), np.full(4, 0.1), np.arange(4.0), 0, 2)
    recorder.log.append([pair_id("r0", "c0")], np.zeros((1, D_X + 2 * D_C)), np.array([0]),
                        np.array([[0.5, 0.0]]), np.array([1.0]), np.full(1, -1),
                        np.zeros(1, int), np.zeros(1))
    assert recorder.requests is not None and not recorder.requests.segments()  # buffered
    submitted: list[Any] = []
    retraining.scheduler.worker.submit = lambda job, spec: submitted.append(spec)  # type: ignore[method-assign, assignment]
    retraining.scheduler._start(1.0, 10.0)
    assert submitted and recorder.requests.segments() and recorder.log.segments()
    retraining.close()


def test_an_artifact_that_no_longer_loads_is_rolled_back_by_name_not_as_a_failed_trial(
        tmp_path: Path) -> None:
    """A restart finds the rolled-out trial's artifact gone: that arm is rolled back with
    reason 'unloadable' (not 'manual', not a failed trial); a path recorded relative to
    another working directory is found by name in the rankers directory."""
    import shutil

    from loop_helpers import settings_of

    from streamlearn.retrain.artifact import save_artifact
    from streamlearn.retrain.store import RankerStore
    from streamlearn.service.metrics import Observer
    from streamlearn.service.ranker_state import RankerState

    class Rollbacks(Observer):
        def __init__(self) -> None:
            self.reasons: list[str] = []

        def on_rollback(self, reason: str) -> None:
            self.reasons.append(reason)

    settings = settings_of(retrain_every_events=300, retrain_policy="ranker",
                           retrain_rankers="rocchio", candidates_enabled=True)
    state = RankerState(settings, Observer(), tmp_path / "rankers", lambda: 0.0)
    state.open()
    ranker = make_ranker("rocchio")
    ranker.fit(np.eye(4), np.array([1.0, 0.0, 1.0, 0.0]))
    version = state.take_version()
    path = save_artifact(tmp_path / "rankers", "rocchio", version, ranker, 1, 4)
    state.apply_candidates({"version": version, "learner": {"ndcg": 0.8},
                            "offpolicy": {"learner_slots": [0.5]},
                            "rankers": {"rocchio": {"artifact": str(path), "ndcg": 0.95,
                                                    "offpolicy": _verdict(False, -0.3, 0.9)}}},
                           0.0)
    assert state.rollout.candidate is not None  # a trial
    store = RankerStore(tmp_path / "rankers")
    store.open()
    assert store.load(f"../elsewhere/rankers/{path.name}") is not None  # found by its name
    rollout = state.rollout.export()
    shutil.rmtree(path)
    observer = Rollbacks()
    again = RankerState(settings, observer, tmp_path / "rankers", lambda: 0.0)
    again.open(rollout)
    assert observer.reasons == ["unloadable"] and again.rollout.candidate is None
    assert "trial_after" not in again.state  # not counted as a failed trial


def test_a_ranker_whose_fit_kept_nothing_is_flagged_not_measured_or_judged(
        tmp_path: Path) -> None:
    """Constant scores tie every candidate, and the tie-break by row order would report the
    learner's own slot order as the ranker's NDCG: such a ranker is flagged, and spends no
    share of the miss probability."""
    logged_world(tmp_path / "log", 800, seed=6)
    result = run_candidate_retrain({
        "log_dir": str(tmp_path / "log"), "artifact_dir": str(tmp_path / "rankers"),
        "rankers": ["planted:KeepsNothing", "logistic"], "version": 1,
        "candidates": {"d_x": D_X, "d_c": D_C}, "holdout_fraction": 0.3})
    flat = result["rankers"]["keepsnothing"]
    assert flat["ndcg"] is None and "constant" in flat["degenerate"] and "offpolicy" not in flat
    assert result["rankers"]["logistic"]["offpolicy"]["alpha"] == pytest.approx(0.05 / 2)
    assert result["challenger_index"] == 1  # only logistic was judged


def test_reported_verdicts_spend_the_miss_probability_too(tmp_path: Path) -> None:
    """retrain.policy = learner in candidate mode: nothing is promoted, yet every verdict is
    a look, so the spending carries over from one retrain to the next."""
    from loop_helpers import settings_of

    from streamlearn.service.metrics import Observer
    from streamlearn.service.ranker_state import RankerState

    state = RankerState(settings_of(retrain_every_events=300, candidates_enabled=True),
                        Observer(), tmp_path / "rankers", lambda: 0.0)
    state.open()
    state.apply_candidates({"version": state.take_version(), "challenger_index": 3,
                            "rankers": {}}, 0.0)
    assert state.challengers()[1] == 3


def test_a_retrain_running_when_the_daemon_stops_is_abandoned_and_its_files_removed(
        tmp_path: Path) -> None:
    from concurrent.futures import Future

    from loop_helpers import settings_of

    from streamlearn.retrain.artifact import save_artifact
    from streamlearn.service.metrics import Observer
    from streamlearn.service.retraining import Retraining

    retraining = Retraining(settings_of(retrain_every_events=10,
                                        checkpoint_dir=str(tmp_path)), Observer())
    retraining.rankers.open()
    version = retraining.rankers.take_version()
    ranker = make_ranker("rocchio")
    ranker.fit(np.eye(4), np.array([1.0, 0.0, 1.0, 0.0]))
    path = save_artifact(tmp_path / "rankers", "rocchio", version, ranker, 1, 4)
    retraining.scheduler.running_version = version
    retraining.scheduler.worker.job = Future()  # still running
    retraining.close()
    assert not path.exists()
    entry = retraining.rankers.state["abandoned"][-1]
    assert entry["version"] == version and "stopped" in entry["reason"]
    assert not retraining.rankers.state["history"]  # the history holds applied retrains only
