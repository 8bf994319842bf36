"""The retrain job (run in a worker process) — a pure function, JSON in and out.

:func:`run_retrain` reads the newest window of the experience log, up to the
``watermark`` (the oldest decision still waiting for feedback: every decision before
it is in the log), in decision order (:func:`~streamlearn.retrain.promotion.evidence_order`),
and splits it **in time**: the newest ``holdout_fraction`` of it is held out, the
rest trains. Then it

1. trains each ranker on the training part as a scorer of (context, action) pairs —
   joint features φ(x, a) of the *logged* pairs, label 1[reward > 0] (bipartite:
   rewarded vs unrewarded pairs), ``sample_weight = min(1/p, clip)`` so the objective
   is (up to clipping) the one of uniformly explored data — and saves each as an
   immutable artifact ``<artifact_dir>/<name>-v<version>``;
2. estimates on the held-out slice, with each of ``estimators`` (IPS, SNIPS, DR;
   weights **unclipped**) and a betting confidence sequence (``bound``): what was live
   (``logged``, its on-policy mean reward), the logger's greedy action (``learner``),
   each new ranker as it would be deployed (``ranker:<name>``: its best action with the
   row's exploration rate), the live ranker (``current``, when one serves), ``uniform``
   and the best constant action (``best_constant``, chosen on the training part). DR's
   reward model is fitted on the training part only;
3. judges every **challenger** — the new rankers (evidence from the held-out slice on)
   and those of earlier retrains still in the running (evidence from their own slice on)
   — with :func:`~streamlearn.retrain.promotion.judge`;
4. reports each new ranker's held-out AUC (IPS-weighted, rewarded vs unrewarded logged
   pairs) and NDCG (the held-out logged pairs as one list, by score).

Why in time and unclipped (docs/daemon.md, "What the off-policy values got wrong"):
a split by id hash held out rows from the whole window, so what was live was valued at
its average since the window began, far below what it earns now on a stream it is
still learning; and weights clipped at 20 value a policy that departs from the logger
at the logger's own precision where they agree — SNIPS valued RankBoost at 0.47–0.82
on letter when its true value was 0.15–0.22.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from streamlearn.durability.experience import ExperienceRows, read_experience
from streamlearn.errors import ConfigError, DataError
from streamlearn.evaluation.bounds import interval_of_mean, value_interval
from streamlearn.evaluation.offpolicy import Estimate
from streamlearn.evaluation.policies import (
    ESTIMATORS,
    best_constant,
    constant_policy,
    evaluate_policies,
    fit_reward_model,
    learner_policy,
    uniform_policy,
)
from streamlearn.rankers.joint import joint_features
from streamlearn.rankers.metrics import auc, ndcg
from streamlearn.retrain.artifact import (
    artifact_name,
    every_ranker_failed,
    load_artifact,
    make_ranker,
    recorded_artifact,
    save_artifact,
)
from streamlearn.retrain.promotion import (
    challenger_alpha,
    deployed_policy,
    evidence_order,
    from_key,
    importance,
    judge,
    key_of,
    not_before,
)

__all__ = ["DEFAULT_CLIP", "bound_estimate", "estimate_dict", "estimate_policies", "estimates_on",
           "judge_challengers", "read_window", "run_retrain", "split_in_time"]

DEFAULT_CLIP = 20.0
DEFAULTS: dict[str, Any] = {"segments": None, "max_rows": None, "clip": DEFAULT_CLIP,
                            "holdout_fraction": 0.2, "current": None, "level": 0.95,
                            "estimators": ["ips", "snips", "dr"], "watermark": None,
                            "challengers": [], "challenger_index": 0, "max_evidence": None,
                            "since": None}


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def estimate_dict(est: Estimate) -> dict[str, Any]:
    """An :class:`Estimate` as JSON (non-finite numbers as null)."""
    return {"value": _finite(est.value), "stderr": _finite(est.stderr), "low": _finite(est.low),
            "high": _finite(est.high), "n": est.n, "clipped": est.clipped,
            "ess": _finite(est.ess)}


def _segments(spec: dict[str, Any]) -> tuple[int | None, int | None]:
    seg = spec.get("segments")
    if seg is None:
        return None, None
    if not (isinstance(seg, (list, tuple)) and len(seg) == 2):
        raise ConfigError(f"Expected segments [first, last] or null. Got {seg!r}.")
    return (None if seg[0] is None else int(seg[0])), (None if seg[1] is None else int(seg[1]))


def read_window(log_dir: str | Path, first: int | None, last: int | None, max_rows: int | None,
                watermark: float | None, since: list[Any] | None = None) -> ExperienceRows:
    """Rows of segments ``first..last`` decided before ``watermark`` and at or after the
    key ``since`` (:func:`from_key`), in evidence order: the newest ``max_rows`` of them."""
    rows = read_experience(log_dir, first, last, max_rows, watermark)
    keep = np.ones(len(rows), dtype=bool)
    if watermark is not None:
        keep &= rows.decided_at < watermark
    if since is not None:
        keep &= from_key(rows, since)
    order = evidence_order(rows)
    kept = order[keep[order]]
    return rows.take(kept if max_rows is None else kept[max(0, len(kept) - max_rows):])


def split_in_time(rows: ExperienceRows, fraction: float
                  ) -> tuple[ExperienceRows, ExperienceRows, list[Any] | None]:
    """(training part, held-out slice, the slice's first key): ``rows`` in evidence order,
    the newest ``fraction`` of them held out; the key ([decision time, id hash], None when
    nothing is held out) is where a challenger's evidence starts."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"Expected a held-out fraction in (0, 1). Got {fraction!r}.")
    cut = min(len(rows), round(len(rows) * (1.0 - fraction)))
    key = key_of(rows, cut) if cut < len(rows) else None
    return rows.take(np.arange(cut)), rows.take(np.arange(cut, len(rows))), key


def _training_weights(rows: ExperienceRows, clip: float) -> np.ndarray:
    return np.minimum(1.0 / rows.propensities, clip)


def _quality(ranker: Any, held: ExperienceRows, n_actions: int, clip: float) -> dict[str, Any]:
    """Held-out AUC (IPS-weighted) and NDCG of the logged pairs ranked by score."""
    scores = ranker.score(joint_features(held.X, held.actions, n_actions))
    positive = held.rewards > 0
    out: dict[str, Any] = {"auc": None, "ndcg": None}
    if positive.any() and (~positive).any():
        out["auc"] = float(auc(positive, scores, _training_weights(held, clip)))
        out["ndcg"] = float(ndcg(positive.astype(np.float64), scores, k=None))
    return out


def bound_estimate(held: ExperienceRows, pi: np.ndarray, alpha: float, on_policy: bool) -> dict[str, Any]:
    """The ``bound`` estimate of a policy: a confidence sequence on the held-out slice around
    its IPS mean (``on_policy``: what was live, whose value is the mean reward itself)."""
    if on_policy:
        iv = interval_of_mean(held.rewards, alpha)
        ess = float(len(held))
    else:
        w = importance(held, pi)
        iv = value_interval(held.rewards, w, alpha)
        ess = float(w.sum()) ** 2 / max(float((w * w).sum()), 1e-300)
    return {"value": _finite(iv.mean), "low": iv.low, "high": iv.high, "n": iv.n,
            "stderr": None, "clipped": 0, "ess": _finite(ess)}


def estimate_policies(train: ExperienceRows, held: ExperienceRows, policies: dict[str, np.ndarray],
                      estimators: list[str], level: float, clip: float = math.inf
                      ) -> dict[str, dict[str, dict[str, Any]]]:
    """Each policy's estimates on the held-out slice: IPS, SNIPS and DR (weights clipped at
    ``clip``, unclipped by default; DR's reward model fitted on ``train``) and ``bound``."""
    unknown = [e for e in estimators if e not in (*ESTIMATORS, "bound")]
    if unknown:
        raise ConfigError(f"Expected estimators among {', '.join((*ESTIMATORS, 'bound'))}. "
                          f"Got {unknown}.")
    model = (fit_reward_model(train.X, train.actions, train.rewards, held.probs.shape[1])
             .predict(held.X) if "dr" in estimators else None)
    return estimates_on(held, policies, estimators, level, clip, model)


def estimates_on(rows: ExperienceRows, policies: dict[str, np.ndarray], estimators: list[str],
                 level: float, clip: float, model: np.ndarray | None
                 ) -> dict[str, dict[str, dict[str, Any]]]:
    """Each policy's estimates on ``rows``, in the order asked: the point estimates (DR with
    the reward model's predictions ``model``, (rows, K)) and ``bound``, the confidence
    sequence (on-policy for ``logged``)."""
    point = [e for e in estimators if e != "bound"]
    out: dict[str, dict[str, dict[str, Any]]] = {
        p: {e: estimate_dict(v) for e, v in ests.items()}
        for p, ests in evaluate_policies(rows, policies, point, clip, level, model).items()}
    if "bound" in estimators:
        for name, pi in policies.items():
            out[name]["bound"] = bound_estimate(rows, pi, 1.0 - level, on_policy=name == "logged")
    return {p: {e: out[p][e] for e in estimators} for p in out}


def judge_challengers(log_dir: str | Path, challengers: list[dict[str, Any]],
                      held: ExperienceRows, last_segment: int | None, watermark: float | None,
                      rankers: dict[str, Any], max_evidence: int | None = None
                      ) -> list[dict[str, Any]]:
    """Each challenger's verdict on its evidence: the held-out slice for this retrain's new
    ones (``since`` is the slice's start), and for those of earlier retrains every row from
    their own ``since`` on (read from their first segment: they may predate the window),
    at most its first ``max_evidence`` rows (then it is ``exhausted``: judged a last time).
    ``rankers``: fitted rankers by artifact path (others are loaded)."""
    older = [c for c in challengers if c["artifact"] not in rankers]
    rows = held
    if older:
        first = min(int(c["first_segment"]) for c in older)
        since = min((c["since"] for c in older), key=lambda k: (float(k[0]), int(k[1])))
        rows = read_window(log_dir, first, last_segment, None, watermark, since)
    judged = []
    for entry in challengers:
        ranker = rankers.get(entry["artifact"]) or load_artifact(entry["artifact"]).ranker
        evidence = rows.take(np.flatnonzero(from_key(rows, entry["since"]))[:max_evidence])
        exhausted = max_evidence is not None and len(evidence) >= max_evidence
        pi = deployed_policy(ranker, evidence) if len(evidence) else \
            np.zeros((0, rows.probs.shape[1]))
        segments = evidence.segments
        judged.append({**entry, "looks": int(entry.get("looks", 0)) + 1,
                       "last_segment": None if segments is None else segments[1],
                       "exhausted": exhausted, **judge(evidence, pi, float(entry["alpha"]))})
    return judged


def run_retrain(spec: dict[str, Any]) -> dict[str, Any]:
    """Train, save and evaluate the rankers of ``spec``; judge the challengers (module doc)."""
    started = time.perf_counter()
    spec = {**DEFAULTS, **spec}
    for key in ("log_dir", "rankers", "artifact_dir", "version"):
        if key not in spec:
            raise ConfigError(f"Expected the retrain spec to hold {key!r}. Got keys {sorted(spec)}.")
    clip, level = float(spec["clip"]), float(spec["level"])
    if not clip > 0:
        raise ConfigError(f"Expected an IPS weight clip > 0. Got {clip}.")
    if not 0.0 < level < 1.0:
        raise ConfigError(f"Expected a confidence level in (0, 1). Got {level}.")
    alpha = 1.0 - level
    rankers = [make_ranker(s) for s in spec["rankers"]]  # refuse bad specs before any work
    first, last = _segments(spec)
    watermark = None if spec["watermark"] is None else float(spec["watermark"])
    rows = read_window(spec["log_dir"], first, last, spec["max_rows"], watermark)
    train, held, cut = split_in_time(rows, float(spec["holdout_fraction"]))
    if len(train) == 0 or len(held) == 0 or cut is None:
        raise DataError(f"Expected training and held-out rows. Got {len(train)} training and "
                        f"{len(held)} held-out rows of {len(rows)}.")
    n_actions, n_features = rows.probs.shape[1], rows.X.shape[1]
    labels = (train.rewards > 0).astype(np.float64)
    if labels.min() == labels.max():
        raise DataError("Expected rewarded and unrewarded training rows. Got only one kind.")
    joint = joint_features(train.X, train.actions, n_actions)
    weights = _training_weights(train, clip)
    report_rankers: dict[str, Any] = {}
    policies = {"logged": held.probs.astype(np.float64), "learner": learner_policy(held.probs)}
    current = spec["current"]
    if current is not None:  # recorded paths: the artifact of that name in this store
        current = recorded_artifact(current, spec["artifact_dir"])
        policies["current"] = deployed_policy(load_artifact(current).ranker, held)
    index = int(spec["challenger_index"])
    first_segment = None if rows.segments is None else rows.segments[0]
    epoch = None if spec["since"] is None else float(spec["since"])
    challengers = [{**c, "artifact": recorded_artifact(c["artifact"], spec["artifact_dir"]),
                    "since": not_before(c["since"], epoch)} for c in spec["challengers"]]
    fitted: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for ranker_spec, ranker in zip(spec["rankers"], rankers, strict=True):
        name = artifact_name(ranker_spec)
        fit_started = time.perf_counter()
        try:  # user code: one ranker that fails leaves the others judged
            ranker.fit(joint, labels, sample_weight=weights)
            fit_seconds = time.perf_counter() - fit_started
            deployed = deployed_policy(ranker, held)  # its scores checked on every action
            quality = _quality(ranker, held, n_actions, clip)
            path = save_artifact(spec["artifact_dir"], name, int(spec["version"]), ranker,
                                 n_actions, n_features,
                                 {"spec": ranker_spec, "segments": rows.segments,
                                  "train_rows": len(train), "clip": clip, "evidence_since": cut})
        except Exception as exc:
            failed[name] = f"{type(exc).__name__}: {exc}"
            report_rankers[name] = {"spec": ranker_spec, "failed": failed[name]}
            continue
        policies[f"ranker:{name}"] = deployed
        report_rankers[name] = {"spec": ranker_spec, "artifact": str(path),
                                "policy": f"ranker:{name}", "fit_seconds": fit_seconds,
                                **quality}
        index += 1
        fitted[str(path)] = ranker
        challengers.append({"name": name, "artifact": str(path), "version": int(spec["version"]),
                            "since": not_before(cut, epoch), "first_segment": first_segment,
                            "index": index,
                            "alpha": challenger_alpha(alpha, index), "looks": 0})
    every_ranker_failed(failed, len(rankers))
    policies["uniform"] = uniform_policy(held.probs)
    constant = best_constant(train, clip)
    policies["best_constant"] = constant_policy(len(held), n_actions, constant)
    estimates = estimate_policies(train, held, policies,
                                  list(dict.fromkeys([*spec["estimators"], "bound"])), level)
    judged = judge_challengers(spec["log_dir"], challengers, held, last, watermark, fitted,
                               spec["max_evidence"])
    return {
        "version": int(spec["version"]), "log_dir": str(Path(spec["log_dir"])),
        "segments": list(rows.segments) if rows.segments else None,
        "max_rows": spec["max_rows"], "watermark": watermark, "evidence_since": cut,
        "rows": len(rows), "train_rows": len(train), "heldout_rows": len(held),
        "n_actions": n_actions, "n_features": n_features, "clip": clip, "level": level,
        "holdout_fraction": float(spec["holdout_fraction"]), "estimators": list(spec["estimators"]),
        "current": {"policy": "current" if current is not None else "logged",
                    "artifact": None if current is None else str(current)},
        "best_constant": constant, "rankers": report_rankers, "estimates": estimates,
        "failed_rankers": failed,
        "challengers": judged, "challenger_index": index, "max_evidence": spec["max_evidence"],
        "duration_seconds": time.perf_counter() - started,
    }
