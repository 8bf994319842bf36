"""The retrain job on logged candidate sets (the daemon's candidate mode) — JSON in and out.

In candidate mode every experience-log row is one *placed candidate*: its id is
``["<request id>", "<candidate id>"]``, its row the shared context, the
candidate's features and the exploit candidate's features, its action the slot
and its propensity the slot's. :func:`run_candidate_retrain` turns that into
learning-to-rank data — a query per request, its documents the placed
candidates, φ(x, c) = [c, vec(x ⊗ c), 1] as features, the reward as relevance
and ``min(1/p, clip)`` as the weight — so the listwise rankers (AdaRank,
NDCG_Boost) get multi-document queries from the loop, and the pointwise and
pairwise ones (RankBoost, logistic, ...) train on the same rows.

Requests are split into training and held-out ones by the hash of the request
id (a query is never split). On the held-out queries each ranker's NDCG of the
placed candidates (mean over queries with a rewarded and an unrewarded
candidate) is reported next to the learner's own (its slot order), with the
IPS-weighted AUC of rewarded vs unrewarded candidates.

These are re-ranking measures of the slates the learner chose; an unbiased
estimate of a ranker's *online* value would need every candidate of a request
in the log, which holds only the placed ones, so candidate-mode rankers are
trained and measured but not promoted to serve (docs/daemon.md §8).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.candidates.joint import stored_joint_features
from streamlearn.durability.experience import ExperienceRows, read_experience
from streamlearn.errors import ConfigError, DataError
from streamlearn.evaluation.policies import holdout_mask
from streamlearn.rankers.metrics import auc, ndcg
from streamlearn.retrain.artifact import artifact_name, make_ranker, save_artifact

__all__ = ["candidate_queries", "run_candidate_retrain"]


def candidate_queries(rows: ExperienceRows, d_x: int, d_c: int,
                      ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(φ of every row, its query number, the request id of each query), rows in log order."""
    X = np.asarray(rows.X, dtype=np.float64)
    if X.shape[1] != d_x + 2 * d_c:
        raise DataError(f"Expected candidate rows of d_x + 2·d_c = {d_x + 2 * d_c} columns. Got "
                        f"{X.shape[1]}.")
    requests = [orjson.loads(i)[0] for i in rows.ids]
    names, qid = np.unique(np.array(requests, dtype=object), return_inverse=True)
    phi = stored_joint_features(X, d_x, d_c)
    return phi, np.asarray(qid, dtype=np.int64), [str(n) for n in names]


def _by_query(qid: np.ndarray) -> np.ndarray:
    return np.argsort(qid, kind="stable")


def _heldout_quality(scores: np.ndarray, rewards: np.ndarray, qid: np.ndarray,
                     weights: np.ndarray) -> dict[str, float | None]:
    """NDCG over held-out queries that have a rewarded and an unrewarded candidate; AUC."""
    positive = rewards > 0
    out: dict[str, float | None] = {"ndcg": None, "auc": None}
    if positive.any() and (~positive).any():
        out["auc"] = float(auc(positive, scores, weights))
    n_pos = np.bincount(qid, weights=positive.astype(np.float64))
    n_all = np.bincount(qid)
    mixed = (n_pos > 0) & (n_pos < n_all)
    keep = mixed[qid]
    if keep.any():
        order = _by_query(qid[keep])
        out["ndcg"] = float(ndcg(rewards[keep][order], scores[keep][order], qid[keep][order],
                                 k=None))
    return out


def run_candidate_retrain(spec: dict[str, Any]) -> dict[str, Any]:
    """Train, save and measure the rankers of ``spec`` on logged candidate sets.

    ``spec`` is the fixed-action job's (``log_dir``, ``rankers``, ``artifact_dir``,
    ``version``, ``max_rows``, ``clip``, ``holdout_fraction``) plus
    ``candidates: {"d_x", "d_c"}``.
    """
    started = time.perf_counter()
    try:
        d_x, d_c = int(spec["candidates"]["d_x"]), int(spec["candidates"]["d_c"])
        clip, fraction = float(spec.get("clip", 20.0)), float(spec.get("holdout_fraction", 0.2))
        names = list(spec["rankers"])
        log_dir, artifact_dir, version = spec["log_dir"], spec["artifact_dir"], int(spec["version"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"Expected a candidate retrain spec with candidates.d_x/d_c, rankers, "
                          f"log_dir, artifact_dir and version. Got {exc!r}.") from exc
    rankers = [make_ranker(n, queries=True) for n in names]
    rows = read_experience(log_dir, None, None, spec.get("max_rows"))
    phi, qid, requests = candidate_queries(rows, d_x, d_c)
    held_query = holdout_mask(requests, fraction)
    held = held_query[qid]
    if held.all() or not held.any():
        raise DataError(f"Expected training and held-out requests. Got {int((~held_query).sum())} "
                        f"and {int(held_query.sum())} of {len(requests)}.")
    weights = np.minimum(1.0 / np.maximum(rows.propensities, 1e-12), clip)
    rewards = np.asarray(rows.rewards, dtype=np.float64)
    train = np.flatnonzero(~held)[_by_query(qid[~held])]  # a query's rows together
    if rewards[train].min() == rewards[train].max():
        raise DataError("Expected rewarded and unrewarded training candidates. Got one kind.")
    test = np.flatnonzero(held)
    slot = np.asarray(rows.actions, dtype=np.float64)
    learner_quality = {"ndcg": _heldout_quality(-slot[test], rewards[test], qid[test],
                                                weights[test])["ndcg"]}  # its slot order
    report: dict[str, Any] = {}
    for name_spec, ranker in zip(names, rankers, strict=True):
        name = artifact_name(name_spec)
        labels = (rewards[train] > 0).astype(np.float64) if ranker.binary_labels \
            else rewards[train]
        fit_started = time.perf_counter()
        ranker.fit(phi[train], labels, qid=qid[train], sample_weight=weights[train])
        fit_seconds = time.perf_counter() - fit_started
        path = save_artifact(artifact_dir, name, version, ranker, 1, phi.shape[1],
                             {"spec": name_spec, "train_rows": len(train), "clip": clip,
                              "candidates": {"d_x": d_x, "d_c": d_c}})
        report[name] = {"spec": name_spec, "artifact": str(path), "fit_seconds": fit_seconds,
                        **_heldout_quality(np.asarray(ranker.score(phi[test])), rewards[test],
                                           qid[test], weights[test])}
    train_queries = len(np.unique(qid[train]))
    return {
        "version": version, "log_dir": str(Path(log_dir)), "candidates": {"d_x": d_x, "d_c": d_c},
        "segments": list(rows.segments) if rows.segments else None, "rows": len(rows),
        "train_rows": len(train), "heldout_rows": len(test), "train_queries": train_queries,
        "heldout_queries": len(np.unique(qid[test])),
        "documents_per_query": len(train) / max(train_queries, 1),
        "clip": clip, "holdout_fraction": fraction, "learner": learner_quality,
        "rankers": report, "duration_seconds": time.perf_counter() - started,
    }
