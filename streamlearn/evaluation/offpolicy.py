"""Off-policy estimators of a target policy's value from logged bandit feedback (ALGORITHMS.md §7).

A logged event is (x, a, p, r): context, chosen action, its propensity, reward.
For a deterministic target policy π with actions ``target``:

* IPS:   V̂ = (1/n) Σ r·w,            w = 1[π(x)=a]/p (clipped at ``clip``)
* SNIPS: V̂ = Σ r·w / Σ w
* DR:    V̂ = (1/n) Σ [r̂(x,π(x)) + (r − r̂(x,a))·w]

Each returns an :class:`Estimate` with a normal-approximation confidence
interval (for SNIPS, by the delta method). Weights are clipped at ``clip`` (a
bias–variance trade-off; ``clip=inf`` is unbiased).

>>> import numpy as np
>>> logged = np.array([0, 1, 1, 0]); p = np.full(4, 0.5); r = np.array([1.0, 0.0, 1.0, 1.0])
>>> target = np.array([0, 0, 1, 1])
>>> round(ips(r, logged, p, target).value, 3), round(snips(r, logged, p, target).value, 3)
(1.0, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from streamlearn.errors import ConfigError

__all__ = ["Estimate", "doubly_robust", "importance_weights", "ips", "snips"]

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


def _z(level: float) -> float:
    if level not in _Z:
        raise ConfigError(f"Confidence level must be one of {sorted(_Z)}. Got {level}.")
    return _Z[level]


def importance_weights(
    logged_actions: np.ndarray, propensities: np.ndarray, target_actions: np.ndarray,
    clip: float = math.inf,
) -> tuple[np.ndarray, int]:
    """w = 1[π(x)=a]/p clipped at ``clip``; returns (weights, number clipped)."""
    p = np.asarray(propensities, dtype=float)
    if p.size and (not np.isfinite(p).all() or p.min() <= 0 or p.max() > 1):
        raise ConfigError("Propensities must be in (0, 1].")
    if clip <= 0:
        raise ConfigError(f"The weight clip must be > 0. Got {clip}.")
    raw = (np.asarray(logged_actions) == np.asarray(target_actions)) / p
    return np.minimum(raw, clip), int((raw > clip).sum())


def _interval(terms: np.ndarray, value: float, clipped: int, level: float) -> Estimate:
    n = len(terms)
    stderr = float(terms.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    half = _z(level) * stderr
    return Estimate(value, stderr, value - half, value + half, n, clipped)


def ips(rewards: np.ndarray, logged_actions: np.ndarray, propensities: np.ndarray,
        target_actions: np.ndarray, clip: float = math.inf, level: float = 0.95) -> Estimate:
    """Inverse propensity scoring."""
    w, clipped = importance_weights(logged_actions, propensities, target_actions, clip)
    terms = np.asarray(rewards, dtype=float) * w
    return _interval(terms, float(terms.mean()) if len(terms) else math.nan, clipped, level)


def snips(rewards: np.ndarray, logged_actions: np.ndarray, propensities: np.ndarray,
          target_actions: np.ndarray, clip: float = math.inf, level: float = 0.95) -> Estimate:
    """Self-normalised IPS (ratio estimator; delta-method interval)."""
    w, clipped = importance_weights(logged_actions, propensities, target_actions, clip)
    r = np.asarray(rewards, dtype=float)
    total = float(w.sum())
    if total == 0.0:
        return Estimate(math.nan, math.inf, -math.inf, math.inf, len(r), clipped)
    value = float((r * w).sum() / total)
    # linearisation: terms whose mean is ≈ 0 and whose variance gives the ratio's variance
    influence = w * (r - value) / (total / len(r))
    est = _interval(influence, 0.0, clipped, level)
    half = est.high
    return Estimate(value, est.stderr, value - half, value + half, len(r), clipped)


def doubly_robust(
    rewards: np.ndarray, logged_actions: np.ndarray, propensities: np.ndarray,
    target_actions: np.ndarray, reward_model: np.ndarray, clip: float = math.inf,
    level: float = 0.95,
) -> Estimate:
    """Doubly robust: ``reward_model`` is r̂ of shape (n, K) for every action."""
    w, clipped = importance_weights(logged_actions, propensities, target_actions, clip)
    r_hat = np.asarray(reward_model, dtype=float)
    rows = np.arange(len(w))
    direct = r_hat[rows, np.asarray(target_actions)]
    correction = (np.asarray(rewards, dtype=float) - r_hat[rows, np.asarray(logged_actions)]) * w
    terms = direct + correction
    return _interval(terms, float(terms.mean()) if len(terms) else math.nan, clipped, level)
