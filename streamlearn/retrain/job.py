"""The retrain job (run in a worker process) and the promotion rule — pure functions, JSON in and out.

:func:`run_retrain` reads a window of the experience log, splits it by
:func:`~streamlearn.evaluation.policies.holdout_mask` into a training part and a
held-out slice, and then

1. trains each ranker on the training part as a scorer of (context, action)
   pairs — joint features φ(x, a) of the *logged* pairs, label 1[reward > 0]
   (bipartite: rewarded vs unrewarded pairs), ``sample_weight = min(1/p, clip)``
   so the objective is (up to clipping) the one of uniformly explored data;
2. saves each as an immutable artifact ``<artifact_dir>/<name>-v<version>``;
3. estimates on the held-out slice, with each of ``estimators`` (default SNIPS and
   DR, with intervals): the online learner's greedy policy (``learner``, the
   argmax of each logged distribution), the current promoted ranker
   (``current``, when ``spec["current"]`` is an artifact path), each new ranker's
   greedy policy (``ranker:<name>``), ``uniform`` and the best constant action
   (``best_constant``, chosen by SNIPS on the training part). DR's reward model
   is fitted on the training part only;
4. reports each ranker's held-out AUC (IPS-weighted, rewarded vs unrewarded
   logged pairs) and NDCG (the held-out logged pairs as one list, by score).

The IPS clip defaults to :data:`DEFAULT_CLIP` = 20, the daemon's
``retrain.clip``: one held-out row then moves an estimate by at most 20/n (0.5 %
of a 4,000-row slice), and training cannot be dominated by a few rare explored
rows. The price is a bias: rows whose logged propensity is below 1/20 count less,
so IPS understates, and SNIPS pulls towards the logger's behaviour, a policy that
often departs from the logged greedy action; DR corrects only a residual with
the clipped weight and is the least affected. The clipped count is reported.

:func:`promotion_decision` is Personalizer's Auto-Optimize rule: the new ranker
with the highest lower confidence bound is promoted only if that bound is
strictly above the current policy's point estimate. A candidate whose interval
is degenerate (standard error 0) is never promoted.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from streamlearn.errors import ConfigError, DataError
from streamlearn.evaluation.offpolicy import _Z, Estimate
from streamlearn.evaluation.policies import (
    best_constant,
    constant_policy,
    evaluate_policies,
    fit_reward_model,
    holdout_mask,
    learner_policy,
    ranker_policy,
    uniform_policy,
)
from streamlearn.rankers.metrics import auc, ndcg
from streamlearn.retrain.artifact import artifact_name, load_artifact, make_ranker, save_artifact
from streamlearn.retrain.joint import joint_features
from streamlearn.stream.experience import ExperienceRows, read_experience

__all__ = ["DEFAULT_CLIP", "estimate_dict", "promotion_decision", "run_retrain", "split_rows"]

DEFAULT_CLIP = 20.0
DEFAULTS: dict[str, Any] = {"segments": None, "max_rows": None, "clip": DEFAULT_CLIP,
                            "holdout_fraction": 0.2, "current": None, "level": 0.95,
                            "estimators": ["snips", "dr"]}


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def estimate_dict(est: Estimate) -> dict[str, Any]:
    """An :class:`Estimate` as JSON (non-finite numbers as null)."""
    return {"value": _finite(est.value), "stderr": _finite(est.stderr), "low": _finite(est.low),
            "high": _finite(est.high), "n": est.n, "clipped": est.clipped,
            "ess": _finite(est.ess)}


MIN_ESS = 20.0  # fewer effectively-matched held-out rows than this: no evidence to promote on


def wilson_lower(value: float, n: float, z: float) -> float:
    """The Wilson score lower bound of a mean of [0, 1] rewards observed on ``n`` rows.

    >>> round(wilson_lower(1.0, 20, 1.959963984540054), 3)  # 20 of 20 rewarded
    0.839
    """
    centre = value + z * z / (2 * n)
    spread = z * math.sqrt(max(value * (1 - value), 0.0) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)


def promotion_bound(estimate: dict[str, Any], level: float) -> float | None:
    """A candidate's lower bound for promotion: its interval's, but never above the Wilson
    bound on its effective sample size (a sample whose matched rows all agree has a zero
    standard error, not a certain value), and none below :data:`MIN_ESS` matched rows."""
    low, value, ess = estimate.get("low"), estimate.get("value"), estimate.get("ess")
    if low is None or value is None:
        return None
    if ess is None:
        return float(low)
    if ess < MIN_ESS:
        return None
    z = _Z[level] if level in _Z else _Z[0.95]
    return float(min(low, wilson_lower(min(max(value, 0.0), 1.0), ess, z)))


def split_rows(rows: ExperienceRows, fraction: float) -> tuple[ExperienceRows, ExperienceRows]:
    """(training part, held-out slice) of ``rows`` by :func:`holdout_mask`."""
    held = holdout_mask(rows.ids, fraction)
    return rows.take(~held), rows.take(held)


def _segments(spec: dict[str, Any]) -> tuple[int | None, int | None]:
    seg = spec.get("segments")
    if seg is None:
        return None, None
    if not (isinstance(seg, (list, tuple)) and len(seg) == 2):
        raise ConfigError(f"Expected segments [first, last] or null. Got {seg!r}.")
    return (None if seg[0] is None else int(seg[0])), (None if seg[1] is None else int(seg[1]))


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


def run_retrain(spec: dict[str, Any]) -> dict[str, Any]:
    """Train, save and evaluate the rankers of ``spec``; a JSON-able report (see the module doc)."""
    started = time.perf_counter()
    spec = {**DEFAULTS, **spec}
    for key in ("log_dir", "rankers", "artifact_dir", "version"):
        if key not in spec:
            raise ConfigError(f"Expected the retrain spec to hold {key!r}. Got keys {sorted(spec)}.")
    clip, level = float(spec["clip"]), float(spec["level"])
    if not clip > 0:
        raise ConfigError(f"Expected an IPS weight clip > 0. Got {clip}.")
    rankers = [make_ranker(s) for s in spec["rankers"]]  # refuse bad specs before any work
    first, last = _segments(spec)
    rows = read_experience(spec["log_dir"], first, last, spec["max_rows"])
    train, held = split_rows(rows, float(spec["holdout_fraction"]))
    if len(train) == 0 or len(held) == 0:
        raise DataError(f"Expected training and held-out rows. Got {len(train)} training and "
                        f"{len(held)} held-out rows of {len(rows)}.")
    n_actions, n_features = rows.probs.shape[1], rows.X.shape[1]
    labels = (train.rewards > 0).astype(np.float64)
    if labels.min() == labels.max():
        raise DataError("Expected rewarded and unrewarded training rows. Got only one kind.")
    joint = joint_features(train.X, train.actions, n_actions)
    weights = _training_weights(train, clip)
    report_rankers: dict[str, Any] = {}
    policies = {"learner": learner_policy(held.probs)}
    current = spec["current"]
    if current is not None:
        policies["current"] = ranker_policy(load_artifact(current).ranker, held.X, held.probs)
    for ranker_spec, ranker in zip(spec["rankers"], rankers, strict=True):
        name = artifact_name(ranker_spec)
        fit_started = time.perf_counter()
        ranker.fit(joint, labels, sample_weight=weights)
        fit_seconds = time.perf_counter() - fit_started
        path = save_artifact(spec["artifact_dir"], name, int(spec["version"]), ranker, n_actions,
                             n_features, {"spec": ranker_spec, "segments": rows.segments,
                                          "train_rows": len(train), "clip": clip})
        policies[f"ranker:{name}"] = ranker_policy(ranker, held.X, held.probs)
        report_rankers[name] = {"spec": ranker_spec, "artifact": str(path),
                                "policy": f"ranker:{name}", "fit_seconds": fit_seconds,
                                **_quality(ranker, held, n_actions, clip)}
    policies["uniform"] = uniform_policy(held.probs)
    constant = best_constant(train, clip)
    policies["best_constant"] = constant_policy(len(held), n_actions, constant)
    model = fit_reward_model(train.X, train.actions, train.rewards, n_actions)
    estimates = evaluate_policies(held, policies, spec["estimators"], clip, level,
                                  model.predict(held.X) if "dr" in spec["estimators"] else None)
    return {
        "version": int(spec["version"]), "log_dir": str(Path(spec["log_dir"])),
        "segments": list(rows.segments) if rows.segments else None,
        "rows": len(rows), "train_rows": len(train), "heldout_rows": len(held),
        "n_actions": n_actions, "n_features": n_features, "clip": clip, "level": level,
        "holdout_fraction": float(spec["holdout_fraction"]), "estimators": list(spec["estimators"]),
        "current": {"policy": "current" if current is not None else "learner",
                    "artifact": None if current is None else str(current)},
        "best_constant": constant, "rankers": report_rankers,
        "estimates": {p: {e: estimate_dict(v) for e, v in ests.items()}
                      for p, ests in estimates.items()},
        "duration_seconds": time.perf_counter() - started,
    }


def promotion_decision(result: dict[str, Any], estimator: str = "snips") -> dict[str, Any]:
    """Auto-Optimize: promote the best-LCB new ranker iff its LCB > the current policy's value."""
    estimates = result["estimates"]
    current_policy = result["current"]["policy"]
    if estimator not in estimates.get(current_policy, {}):
        raise ConfigError(f"Expected {estimator!r} estimates in the retrain result. "
                          f"Got {sorted(estimates.get(current_policy, {}))}.")
    current_value = estimates[current_policy][estimator]["value"]
    candidates = [(info["policy"], name) for name, info in result["rankers"].items()]
    level = float(result.get("level", 0.95))
    bounds = [(promotion_bound(estimates[policy][estimator], level), name)
              for policy, name in candidates]
    lows = [(low, name) for low, name in bounds if low is not None]
    decision: dict[str, Any] = {"promote": False, "ranker": None, "lower": None,
                                "current_value": current_value, "estimator": estimator,
                                "current": current_policy}
    if not lows:
        return {**decision, "reason": f"no new ranker has a lower bound on at least {MIN_ESS:.0f} "
                                      "effectively matched held-out rows"}
    lower, name = max(lows, key=lambda t: t[0])  # ties: the first listed ranker
    decision.update(ranker=name, lower=lower,
                    artifact=result["rankers"][name]["artifact"])
    if current_value is None:
        return {**decision, "reason": f"the current policy ({current_policy}) has no estimate"}
    if lower > current_value:
        return {**decision, "promote": True,
                "reason": f"{name}: lower bound {lower:.4f} > {current_policy} {current_value:.4f}"}
    return {**decision, "reason": f"{name}: lower bound {lower:.4f} <= "
                                  f"{current_policy} {current_value:.4f}"}
