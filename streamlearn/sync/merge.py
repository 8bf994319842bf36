"""Merging learner states learned apart, weighted by the examples each saw.

Every replica's partition learners start a sync round from the same global
model G and learn locally; :func:`merge` builds the next global model from
their states M_p and the examples n_p each learned since G:

* **averaged** arrays — the Banditron family's weights (the Banditron's W, the
  p-norm / EG dual θ, Newtron's and SOBA's weights): G + Σ_p (n_p / Σ n)(M_p − G),
  the example-weighted average of the models (iterative parameter mixing,
  McDonald et al. 2010), in the space the learner keeps (θ, the dual, for
  p-norm and EG);
* **additive** arrays — sufficient statistics (the ridge statistics b = Σ r·z
  and the precision A = λI + Σ zzᵀ of LinUCB / linear TS, AdaGrad's summed
  squared gradients and the oracle's norm totals) and the regression oracle's
  weights: G + Σ_p (M_p − G), what one learner that saw every example holds
  (exactly, for the statistics; for the oracle's AdaGrad steps, sized by the
  pooled squared gradients, it is one learner's step with a stale model —
  measured on letter, 30,000 events, 3 replicas: bagging 0.909 summed vs 0.945
  averaged, SquareCB 0.887 vs 0.922, single replica 0.836 / 0.801). A posterior
  covariance is merged as its inverse, the precision, and turned back afterwards;
* **maxima** (the oracle's per-feature scale, a running max): the elementwise max;
* **local** arrays (the exploration's ring and change detector, drift
  bookkeeping): each partition keeps its own.

Counters (decided, updated) are additive too, so exploration schedules run on
global counts. :func:`rebase` carries a partition's local progress onto a new
global model: G' + (M_now − M_ref), with M_ref the state it published (its
progress since then is what the new global model does not hold yet).

>>> base = {"learner.weights": np.zeros(2), "learner.xty": np.zeros(2)}
>>> a = {"learner.weights": np.array([1.0, 0.0]), "learner.xty": np.array([1.0, 0.0])}
>>> b = {"learner.weights": np.array([0.0, 3.0]), "learner.xty": np.array([0.0, 3.0])}
>>> out = merge(base, [(a, 1.0), (b, 3.0)])
>>> out["learner.weights"].tolist(), out["learner.xty"].tolist()
([0.25, 2.25], [1.0, 3.0])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from streamlearn.errors import StateError

__all__ = ["AVERAGED_CLASSES", "merge", "merge_counters", "rebase", "rule_of"]

Arrays = dict[str, np.ndarray]

_ADDITIVE = ("xty", "sq_grad", "norm_totals", "cov")  # cov: merged as its precision
_MAXIMA = ("scale",)
_LOCAL_PREFIX = "exploration."
_LOCAL = ("drift_seen",)
#: learners whose weights are averaged (the rest sum their progress)
AVERAGED_CLASSES = frozenset({"Banditron", "PNormBandit", "ExpGradientBandit", "Newtron", "SOBA"})


def rule_of(name: str, learner_class: str = "Banditron") -> str:
    """"additive", "max", "local" or "average" for an array of ``Learner.state()``."""
    if name.startswith(_LOCAL_PREFIX) or name.endswith(_LOCAL):
        return "local"
    last = name.rsplit(".", 1)[-1]
    if last in _ADDITIVE:
        return "additive"
    if last in _MAXIMA:
        return "max"
    return "average" if learner_class in AVERAGED_CLASSES else "additive"


def _precision(cov: np.ndarray) -> np.ndarray:
    """A posterior covariance (a diagonal (K, D) or full (K, D, D)) → its precision."""
    return np.asarray(1.0 / cov if cov.ndim == 2 else np.linalg.inv(cov))


def _to_space(arrays: Arrays) -> Arrays:
    return {k: (_precision(v) if k.endswith(".cov") else v) for k, v in arrays.items()}


def _from_space(arrays: Arrays) -> Arrays:
    out = dict(arrays)
    for name in [k for k in arrays if k.endswith(".cov")]:
        cov = _precision(arrays[name])  # the inverse of the precision
        if cov.ndim == 3:
            cov = 0.5 * (cov + cov.transpose(0, 2, 1))
            mean = name[:-len("cov")] + "mean"
            xty = name[:-len("cov")] + "xty"
            if mean in out and xty in out:  # full mode: θ = A⁻¹ b follows the statistics
                out[mean] = np.einsum("kij,kj->ki", cov, out[xty])
        out[name] = cov
    return out


def _combine(target: Arrays, ref: Arrays, parts: Sequence[tuple[Arrays, float]],
             local: Arrays, learner_class: str) -> Arrays:
    """target + Σ c_p (part_p − ref) per rule, in merge space (c_p = w_p when averaged)."""
    names = set(target)
    for part, _ in parts:
        if set(part) != names:
            raise StateError(f"Cannot merge learner states with different arrays: "
                             f"{sorted(set(part) ^ names)}.")
    t, r = _to_space(target), _to_space(ref)
    ps = [(_to_space(p), w) for p, w in parts]
    out: Arrays = {}
    for name in names:
        rule = rule_of(name, learner_class)
        if rule == "local":
            out[name] = np.array(local[name], copy=True)
        elif rule == "max":
            out[name] = np.maximum.reduce([t[name], *(p[name] for p, _ in ps)])
        else:
            acc = np.array(t[name], dtype=np.float64, copy=True)
            for p, w in ps:
                acc += (w if rule == "average" else 1.0) * (p[name] - r[name])
            out[name] = acc
    return _from_space(out)


def merge(base: Arrays, parts: Sequence[tuple[Arrays, float]],
          learner_class: str = "Banditron") -> Arrays:
    """The next global model from ``base`` and the replicas' (state, examples) pairs."""
    total = float(sum(n for _, n in parts))
    weights = [(p, (n / total) if total > 0 else 1.0 / len(parts)) for p, n in parts]
    return _combine(base, base, weights, base, learner_class)


def rebase(new_global: Arrays, published: Arrays, now: Arrays,
           learner_class: str = "Banditron") -> Arrays:
    """``now``'s progress since ``published`` carried onto ``new_global`` (local arrays: now's)."""
    return _combine(new_global, published, [(now, 1.0)], now, learner_class)


def merge_counters(base: dict[str, Any], parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Additive counters: base + Σ (part − base)."""
    out = dict(base)
    for key in ("n_decided", "n_updated", "n_skipped_updates"):
        out[key] = int(base.get(key, 0)) + sum(int(p.get(key, 0)) - int(base.get(key, 0))
                                               for p in parts)
    return out
