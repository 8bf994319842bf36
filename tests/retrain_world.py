"""A simulated experience log with known rewards, and planted rankers, for the retrain tests.

Contexts x ~ N(0, I_5), K = 4 actions, reward ~ Bernoulli(σ(2⟨θ_a, x⟩)). The
logger's greedy action is the argmax of a *permuted* θ (a poor policy), explored
ε-greedily with ε = 0.3 (every propensity >= 0.075, below the clip of 20). The
planted rankers score joint features φ(x, a) = x ⊗ e_a linearly with the true θ
(``PlantedBest``: the best action) or its negation (``PlantedWorst``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamlearn.durability.experience import ExperienceLog
from streamlearn.rankers.base import FitData, Ranker

K, D, EPS = 4, 5, 0.3
THETA = np.random.default_rng(2024).normal(size=(K, D))


def mean_reward(X: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-2.0 * X @ THETA.T)))


def write_log(directory: Path, n: int, seed: int, segment_rows: int = 1000) -> None:
    """Write ``n`` logged rows as segments of ``segment_rows`` with the real experience log."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D)).astype(np.float32)
    greedy = np.argmax(X @ np.roll(THETA, 1, axis=0).T, axis=1)
    probs = np.full((n, K), EPS / K, dtype=np.float32)
    probs[np.arange(n), greedy] += 1 - EPS
    actions = (probs.cumsum(axis=1) < rng.random((n, 1))).sum(axis=1).clip(0, K - 1)
    rewards = (rng.random(n) < mean_reward(X.astype(np.float64))[np.arange(n), actions]).astype(float)
    log = ExperienceLog(directory, segment_rows=segment_rows)
    log.open(None)
    ids = [f"{seed}-{i}" for i in range(n)]
    for lo in range(0, n, segment_rows):  # one appended batch per segment
        rows = slice(lo, lo + segment_rows)
        log.append(ids[rows], X[rows], actions[rows].astype(np.int64), probs[rows], rewards[rows],
                   np.full(len(ids[rows]), -1, dtype=np.int64),
                   np.zeros(len(ids[rows]), dtype=np.int64), np.arange(n, dtype=float)[rows])
    log.flush()


class PlantedBest(Ranker):
    """Scores (x, a) by ⟨θ_a, x⟩: its greedy policy is the best one."""

    sign = 1.0

    def __init__(self) -> None:
        pass

    def _fit(self, data: FitData) -> None:
        self.weights_ = self.sign * THETA.ravel()

    def _score(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X @ self.weights_)


class PlantedWorst(PlantedBest):
    """Scores (x, a) by −⟨θ_a, x⟩: its greedy policy is the worst one."""

    sign = -1.0
