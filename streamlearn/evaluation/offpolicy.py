"""Off-policy estimators of a target policy's value from logged bandit feedback (docs/algorithms.md §7).

A logged event is (x, a, p, r): context, chosen action, its propensity, reward.
The target policy π is given either as deterministic ``target_actions`` (n,) or
as ``target_probs``: π's probability of each *logged* action (n,), or its full
distribution (n, K) — so uniform and ε-soft policies are evaluable. With
w = π(a|x)/p (clipped at ``clip``):

* IPS:   V̂ = (1/n) Σ r·w
* SNIPS: V̂ = Σ r·w / Σ w
* DR:    V̂ = (1/n) Σ [Σ_b π(b|x) r̂(x,b) + (r − r̂(x,a))·w]   (needs the full (n, K) π)

Each returns an :class:`Estimate` with a normal-approximation confidence
interval (for SNIPS, by the delta method). Weights are clipped at ``clip`` (a
bias–variance trade-off; ``clip=inf`` is unbiased). A deterministic target is the
one-hot distribution, so both forms give identical numbers.

>>> import numpy as np
>>> logged = np.array([0, 1, 1, 0]); p = np.full(4, 0.5); r = np.array([1.0, 0.0, 1.0, 1.0])
>>> target = np.array([0, 0, 1, 1])
>>> round(ips(r, logged, p, target).value, 3), round(snips(r, logged, p, target).value, 3)
(1.0, 1.0)
>>> round(ips(r, logged, p, target_probs=np.full((4, 2), 0.5)).value, 3)  # the uniform policy
0.75
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from streamlearn.errors import ConfigError

__all__ = ["Estimate", "doubly_robust", "importance_weights", "ips", "snips", "target_probability"]

_Z = {0.9: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}


@dataclass(frozen=True)
class Estimate:
    """A policy value estimate with its standard error and confidence interval."""

    value: float
    stderr: float
    low: float
    high: float
    n: int
    clipped: int  # how many weights were clipped
    ess: float = math.nan  # effective sample size of the importance weights, (Σw)²/Σw²


def effective_sample_size(w: np.ndarray) -> float:
    """(Σw)²/Σw²: how many equally weighted rows the weighted sample is worth (0 if none)."""
    total = float(np.square(w).sum())
    return float(w.sum()) ** 2 / total if total > 0 else 0.0


def _z(level: float) -> float:
    if level not in _Z:
        raise ConfigError(f"Confidence level must be one of {sorted(_Z)}. Got {level}.")
    return _Z[level]


def target_probability(logged_actions: np.ndarray, target_actions: np.ndarray | None = None,
                       target_probs: np.ndarray | None = None) -> np.ndarray:
    """π(a_i|x_i) of each logged action, from exactly one of the two target forms."""
    a = np.asarray(logged_actions).reshape(-1)
    if (target_actions is None) == (target_probs is None):
        raise ConfigError("Expected exactly one of target_actions and target_probs. "
                          f"Got {'both' if target_actions is not None else 'neither'}.")
    if target_actions is not None:
        return np.asarray(a == np.asarray(target_actions).reshape(-1), dtype=np.float64)
    pi = np.asarray(target_probs, dtype=np.float64)
    if pi.ndim == 2 and pi.shape[0] == len(a):
        pi = pi[np.arange(len(a)), a]
    if pi.shape != a.shape or (pi.size and (not np.isfinite(pi).all() or pi.min() < 0
                                            or pi.max() > 1 + 1e-9)):
        raise ConfigError(f"Expected target_probs in [0, 1] of shape ({len(a)},) or ({len(a)}, K). "
                          f"Got shape {pi.shape}.")
    return np.asarray(pi)


def importance_weights(
    logged_actions: np.ndarray, propensities: np.ndarray, target_actions: np.ndarray | None = None,
    clip: float = math.inf, target_probs: np.ndarray | None = None,
) -> tuple[np.ndarray, int]:
    """w = π(a|x)/p clipped at ``clip``; returns (weights, number clipped)."""
    p = np.asarray(propensities, dtype=float)
    if p.size and (not np.isfinite(p).all() or p.min() <= 0 or p.max() > 1):
        raise ConfigError("Propensities must be in (0, 1].")
    if clip <= 0:
        raise ConfigError(f"The weight clip must be > 0. Got {clip}.")
    raw = target_probability(logged_actions, target_actions, target_probs) / p
    return np.minimum(raw, clip), int((raw > clip).sum())


def _interval(terms: np.ndarray, value: float, clipped: int, level: float) -> Estimate:
    n = len(terms)
    stderr = float(terms.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    half = _z(level) * stderr
    return Estimate(value, stderr, value - half, value + half, n, clipped)


def ips(rewards: np.ndarray, logged_actions: np.ndarray, propensities: np.ndarray,
        target_actions: np.ndarray | None = None, clip: float = math.inf, level: float = 0.95,
        target_probs: np.ndarray | None = None) -> Estimate:
    """Inverse propensity scoring."""
    w, clipped = importance_weights(logged_actions, propensities, target_actions, clip, target_probs)
    terms = np.asarray(rewards, dtype=float) * w
    est = _interval(terms, float(terms.mean()) if len(terms) else math.nan, clipped, level)
    return dataclasses.replace(est, ess=effective_sample_size(w))


def snips(rewards: np.ndarray, logged_actions: np.ndarray, propensities: np.ndarray,
          target_actions: np.ndarray | None = None, clip: float = math.inf, level: float = 0.95,
          target_probs: np.ndarray | None = None) -> Estimate:
    """Self-normalised IPS (ratio estimator; delta-method interval)."""
    w, clipped = importance_weights(logged_actions, propensities, target_actions, clip, target_probs)
    r = np.asarray(rewards, dtype=float)
    total = float(w.sum())
    if total == 0.0:
        return Estimate(math.nan, math.inf, -math.inf, math.inf, len(r), clipped, 0.0)
    value = float((r * w).sum() / total)
    # linearisation: terms whose mean is ≈ 0 and whose variance gives the ratio's variance
    influence = w * (r - value) / (total / len(r))
    est = _interval(influence, 0.0, clipped, level)
    half = est.high
    return Estimate(value, est.stderr, value - half, value + half, len(r), clipped,
                    effective_sample_size(w))


def doubly_robust(
    rewards: np.ndarray, logged_actions: np.ndarray, propensities: np.ndarray,
    target_actions: np.ndarray | None, reward_model: np.ndarray, clip: float = math.inf,
    level: float = 0.95, target_probs: np.ndarray | None = None,
) -> Estimate:
    """Doubly robust: ``reward_model`` is r̂ of shape (n, K) for every action.

    A stochastic target must be its full (n, K) distribution (the direct term
    averages r̂ over it). Fit ``reward_model`` on other rows than these.
    """
    r_hat = np.asarray(reward_model, dtype=float)
    a = np.asarray(logged_actions).reshape(-1)
    rows = np.arange(len(a))
    if r_hat.ndim != 2 or r_hat.shape[0] != len(a):
        raise ConfigError(f"Expected reward_model of shape ({len(a)}, K). Got {r_hat.shape}.")
    if target_actions is not None:
        direct = r_hat[rows, np.asarray(target_actions).reshape(-1)]
    else:
        pi = np.asarray(target_probs, dtype=float)
        if pi.shape != r_hat.shape:
            raise ConfigError(f"DR needs the full target distribution of shape {r_hat.shape}. "
                              f"Got target_probs of shape {pi.shape}.")
        direct = (pi * r_hat).sum(axis=1)
    w, clipped = importance_weights(a, propensities, target_actions, clip, target_probs)
    correction = (np.asarray(rewards, dtype=float) - r_hat[rows, a]) * w
    terms = direct + correction
    est = _interval(terms, float(terms.mean()) if len(terms) else math.nan, clipped, level)
    return dataclasses.replace(est, ess=effective_sample_size(w))
