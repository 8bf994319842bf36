"""Rankers retrained on logged candidate sets: a query per request, the placed candidates as
documents, rewards as relevance, IPS weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamlearn.durability.experience import ExperienceLog, read_experience
from streamlearn.engine.candidates import pair_id
from streamlearn.errors import ConfigError
from streamlearn.retrain.artifact import load_artifact, make_ranker
from streamlearn.retrain.candidates import candidate_queries, run_candidate_retrain

D_X, D_C, SLOTS = 2, 3, 3


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
