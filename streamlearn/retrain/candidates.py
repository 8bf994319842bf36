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

These are re-ranking measures of the slates the learner chose. An unbiased estimate
of a ranker's *online* value needs every candidate of a request: the daemon's
**request log** (``<log_dir>/requests``, :mod:`streamlearn.durability.recorder`) keeps
them. When it is there, each ranker is also judged **off-policy, per slot given the
logged prefix** (:func:`streamlearn.candidates.slates.slot_terms`) on the held-out
requests whose every placed candidate has its reward (decided before the ``watermark``
and since what serves last changed, ``since``):
deployed with the learner's exploration at each request, its value at each slot (a
confidence sequence per slot) and the promotion gate's verdict against what placed the
logged slots (:func:`streamlearn.retrain.promotion.judge_weighted`), under ``offpolicy``.
The miss probability is spent as for fixed actions: the j-th ranker judged since what
serves last changed (``challenger_index`` + j) is judged at
:func:`~streamlearn.retrain.promotion.challenger_alpha` (1 − ``level``, j). With
``retrain.policy = "ranker"`` the daemon acts on the verdict
(:meth:`streamlearn.service.ranker_state.RankerState.apply_candidates`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.candidates.joint import stored_joint_features
from streamlearn.candidates.sets import gather_segments
from streamlearn.candidates.slates import deployed_slot_probs, slot_terms, slot_values, slot_weights
from streamlearn.durability.experience import ExperienceRows, read_experience
from streamlearn.durability.recorder import REQUESTS_DIR
from streamlearn.errors import ConfigError, DataError
from streamlearn.evaluation.bounds import interval_of_mean
from streamlearn.evaluation.offpolicy import effective_sample_size
from streamlearn.evaluation.policies import holdout_mask
from streamlearn.features import hash_strings
from streamlearn.rankers.base import Ranker
from streamlearn.rankers.metrics import auc, ndcg
from streamlearn.retrain.artifact import (
    artifact_name,
    every_ranker_failed,
    make_ranker,
    save_artifact,
)
from streamlearn.retrain.promotion import challenger_alpha, judge_weighted

log = logging.getLogger("streamlearn.retrain")

__all__ = ["LoggedRequests", "candidate_queries", "heldout_requests", "logged_requests",
           "run_candidate_retrain"]


@dataclass
class LoggedRequests:
    """Whole logged requests in evidence order (decision time, then id hash): φ of every
    candidate, the requests' offsets, the placed rows (B, k; −1 past a request's slots) with
    their conditional propensities and rewards, and the learner's exploration per request."""

    request_ids: list[str]
    phi: np.ndarray
    offsets: np.ndarray
    logged: np.ndarray
    slot_probs: np.ndarray
    rewards: np.ndarray
    gamma: np.ndarray
    segments: tuple[int, int] | None = None  # the request log's segments read

    def __len__(self) -> int:
        return len(self.request_ids)

    def deployed(self, ranker: Ranker) -> np.ndarray:
        """(B, k) the ranker deployed on these requests as the loop deploys it (1 − γ on its
        best-scored candidate not yet placed, γ spread over those): its probability of each
        logged candidate given the logged prefix."""
        scores = np.asarray(ranker.score(self.phi), dtype=np.float64)
        return deployed_slot_probs(scores, self.offsets, self.logged, self.gamma)

    def uniform(self) -> np.ndarray:
        """(B, k) a uniformly random pick among the candidates not yet placed, given the
        logged prefix (a ranker deployed with γ = 1)."""
        return deployed_slot_probs(np.zeros(len(self.phi)), self.offsets, self.logged,
                                   np.ones(len(self)))

    def judge(self, ranker: Ranker, alpha: float) -> dict[str, Any]:
        """The ranker deployed on these requests: its value per slot given the logged prefix,
        and the gate's verdict against the logger (both at ``alpha``)."""
        return self.judge_target(self.deployed(ranker), alpha)

    def judge_target(self, target: np.ndarray, alpha: float) -> dict[str, Any]:
        """:meth:`judge` of a target's (B, k) probabilities of the logged candidates."""
        slots = slot_values(self.rewards, self.logged, self.slot_probs, target, alpha)
        weights = slot_weights(self.logged, self.slot_probs, target)
        used = self.logged >= 0
        return {**judge_weighted(*slot_terms(self.rewards, self.logged, self.slot_probs, target),
                                 alpha),
                "slots": [{**iv.as_dict(), "ess": effective_sample_size(weights[used[:, s], s])}
                          for s, iv in enumerate(slots)]}

    def logger_intervals(self, alpha: float) -> list[dict[str, Any]]:
        """What placed the logged slots (on-policy): its mean reward at each slot with a
        confidence sequence (each side at α/2)."""
        used = self.logged >= 0
        return [{**interval_of_mean(self.rewards[used[:, s], s], alpha).as_dict(),
                 "ess": float(used[:, s].sum())} for s in range(used.shape[1])]

    def take(self, requests: np.ndarray) -> LoggedRequests:
        """The given requests (in that order)."""
        offsets, rows = gather_segments(self.offsets, requests)
        remap = np.full(len(self.phi) + 1, -1, dtype=np.int64)  # old global row -> new
        remap[rows] = np.arange(len(rows))
        logged = remap[self.logged[requests]]  # −1 stays −1 (the extra last entry)
        return LoggedRequests([self.request_ids[i] for i in requests.tolist()], self.phi[rows],
                              offsets, logged, self.slot_probs[requests],
                              self.rewards[requests], self.gamma[requests], self.segments)

    def logger_pooled(self, alpha: float) -> dict[str, Any]:
        """What placed the logged slots, every slot pooled (request after request): its mean
        reward per slot with a confidence sequence (each side at α/2)."""
        used = self.logged >= 0
        return interval_of_mean(self.rewards[used], alpha).as_dict()

    def logger_slots(self) -> list[float]:
        """The logger's mean reward at each slot (on-policy)."""
        used = self.logged >= 0
        return [float(self.rewards[used[:, s], s].mean()) if used[:, s].any() else math.nan
                for s in range(used.shape[1])]


def logged_requests(requests: ExperienceRows, learned: ExperienceRows, d_x: int, d_c: int,
                    watermark: float | None = None, since: float | None = None,
                    ) -> LoggedRequests:
    """The request log's requests whose every placed candidate is in the experience log
    (``learned``, with its reward) and that were decided before ``watermark`` (and at or
    after ``since``)."""
    if len(requests) and requests.X.shape[1] != d_x + d_c:
        raise DataError(f"Expected request-log rows of d_x + d_c = {d_x + d_c} columns. Got "
                        f"{requests.X.shape[1]}.")
    reward_of = dict(zip(learned.ids, np.asarray(learned.rewards, np.float64).tolist(),
                         strict=True))
    names = [orjson.loads(i)[0] for i in requests.ids]
    uniq, request = np.unique(np.array(names, dtype=object), return_inverse=True)
    request = np.asarray(request, dtype=np.int64)
    placed = np.asarray(requests.actions) >= 0
    rewards = np.array([reward_of.get(i, math.nan) if p else 0.0
                        for i, p in zip(requests.ids, placed.tolist(), strict=True)])
    missing = np.bincount(request, weights=np.isnan(rewards), minlength=len(uniq)) > 0
    decided = np.zeros(len(uniq))
    decided[request] = requests.decided_at
    keep = ~missing & (decided < (math.inf if watermark is None else watermark)) & \
        (decided >= (-math.inf if since is None else since))
    hashed = hash_strings([str(u) for u in uniq])
    order = np.lexsort((hashed, decided))
    order = order[keep[order]]
    rank = np.full(len(uniq), -1, dtype=np.int64)
    rank[order] = np.arange(len(order))
    rows = np.flatnonzero(rank[request] >= 0)
    rows = rows[np.argsort(rank[request[rows]], kind="stable")]  # a request's rows together
    B = len(order)
    sizes = np.bincount(rank[request[rows]], minlength=B)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    k = int(requests.actions[rows].max()) + 1 if len(rows) else 1
    logged = np.full((B, k), -1, dtype=np.int64)
    slot_probs, slot_rewards = np.zeros((B, k)), np.zeros((B, k))
    at = np.flatnonzero(placed[rows])
    r, slot = rank[request[rows[at]]], requests.actions[rows[at]]
    logged[r, slot] = at
    slot_probs[r, slot] = requests.probs[rows[at], slot]
    slot_rewards[r, slot] = rewards[rows[at]]
    gamma = np.zeros(B)
    gamma[rank[request[rows]]] = requests.gamma[rows]
    X = np.asarray(requests.X[rows], dtype=np.float64)
    return LoggedRequests([str(uniq[i]) for i in order.tolist()],
                          stored_joint_features(X, d_x, d_c), offsets, logged, slot_probs,
                          slot_rewards, gamma, requests.segments)


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


def heldout_requests(log_dir: Path, learned: ExperienceRows, d_x: int, d_c: int,
                     fraction: float, watermark: float | None, since: float | None,
                     max_rows: int | None, segments: list[int] | None = None,
                     ) -> LoggedRequests | str:
    """The held-out requests of the request log, whole (or why there are none to judge on):
    read from its ``segments`` [first, last] (default: all), the newest 50 × ``max_rows``
    rows of them when ``max_rows`` is given."""
    directory = log_dir / REQUESTS_DIR
    if not directory.is_dir():
        return "no request log (written by serve in candidate mode)"
    rewards = np.asarray(learned.rewards)
    if len(rewards) and (rewards.min() < 0 or rewards.max() > 1):
        return (f"rewards outside [0, 1] (range [{rewards.min():g}, {rewards.max():g}]): the "
                "bounds need rewards in [0, 1]")
    # a request's candidates are many rows: read enough for the learned rows' requests
    first, last = segments if segments is not None else (None, None)
    requests = read_experience(directory, first, last, None if max_rows is None else 50 * max_rows)
    whole = logged_requests(requests, learned, d_x, d_c, watermark, since)
    held = np.flatnonzero(holdout_mask(whole.request_ids, fraction))
    if not len(held):
        return ("no held-out request with every placed candidate's reward yet"
                + ("" if since is None else " since what serves last changed"))
    return whole.take(held)


def run_candidate_retrain(spec: dict[str, Any]) -> dict[str, Any]:
    """Train, save and measure the rankers of ``spec`` on logged candidate sets.

    ``spec`` is the fixed-action job's (``log_dir``, ``rankers``, ``artifact_dir``,
    ``version``, ``max_rows``, ``clip``, ``holdout_fraction``) plus
    ``candidates: {"d_x", "d_c"}``, ``challenger_index`` (rankers already judged since
    what serves last changed; default 0) and ``since`` (when it changed: the rankers are
    judged on the requests decided since, against what served them; default: all).
    """
    started = time.perf_counter()
    try:
        d_x, d_c = int(spec["candidates"]["d_x"]), int(spec["candidates"]["d_c"])
        clip, fraction = float(spec.get("clip", 20.0)), float(spec.get("holdout_fraction", 0.2))
        names = list(spec["rankers"])
        log_dir, artifact_dir, version = spec["log_dir"], spec["artifact_dir"], int(spec["version"])
        index = int(spec.get("challenger_index") or 0)
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
    level = float(spec.get("level", 0.95))
    judged = heldout_requests(Path(log_dir), rows, d_x, d_c, fraction, spec.get("watermark"),
                              spec.get("since"), spec.get("max_rows"))
    report: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name_spec, ranker in zip(names, rankers, strict=True):
        name = artifact_name(name_spec)
        labels = (rewards[train] > 0).astype(np.float64) if ranker.binary_labels \
            else rewards[train]
        fit_started = time.perf_counter()
        try:  # user code: one ranker that fails leaves the others judged
            ranker.fit(phi[train], labels, qid=qid[train], sample_weight=weights[train])
            fit_seconds = time.perf_counter() - fit_started
            held_scores, train_scores = ranker.score(phi[test]), ranker.score(phi[train])
            quality = _heldout_quality(held_scores, rewards[test], qid[test], weights[test])
            path = save_artifact(artifact_dir, name, version, ranker, 1, phi.shape[1],
                                 {"spec": name_spec, "train_rows": len(train), "clip": clip,
                                  "candidates": {"d_x": d_x, "d_c": d_c}})
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
            report[name] = {"spec": name_spec, "failed": failed[name]}
            continue
        report[name] = {"spec": name_spec, "artifact": str(path), "fit_seconds": fit_seconds,
                        **quality}
        if np.ptp(train_scores) == 0.0:
            # a fit that kept nothing (AdaRank with no eligible round): every candidate ties,
            # and the tie-break by row order would pass the learner's own order off as its
            report[name].update(ndcg=None, auc=None, degenerate=(
                "its scores are constant on the training rows (the fit kept nothing): not "
                "measured, not judged"))
            log.warning("retrain %d: %s %s", version, name, report[name]["degenerate"])
            continue
        if isinstance(judged, LoggedRequests):
            index += 1
            report[name]["offpolicy"] = judged.judge(ranker, challenger_alpha(1.0 - level, index))
            report[name]["offpolicy"].update(alpha=challenger_alpha(1.0 - level, index),
                                             version=version)
    every_ranker_failed(failed, len(rankers))
    train_queries = len(np.unique(qid[train]))
    return {
        "failed_rankers": failed,
        "version": version, "log_dir": str(Path(log_dir)), "candidates": {"d_x": d_x, "d_c": d_c},
        "segments": list(rows.segments) if rows.segments else None, "rows": len(rows),
        "train_rows": len(train), "heldout_rows": len(test), "train_queries": train_queries,
        "heldout_queries": len(np.unique(qid[test])),
        "documents_per_query": len(train) / max(train_queries, 1),
        "clip": clip, "holdout_fraction": fraction, "learner": learner_quality,
        "max_rows": spec.get("max_rows"), "watermark": spec.get("watermark"),
        "since": spec.get("since"), "level": level,
        "offpolicy": ({"requests": len(judged), "alpha": 1.0 - level,
                       "learner_slots": judged.logger_slots(),
                       "logged": judged.logger_pooled(1.0 - level),
                       "request_segments": None if judged.segments is None
                       else list(judged.segments)}
                      if isinstance(judged, LoggedRequests) else {"skipped": judged}),
        "challenger_index": index,
        "rankers": report, "duration_seconds": time.perf_counter() - started,
    }
