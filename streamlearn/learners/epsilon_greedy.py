"""ε-greedy linear baseline: per-action reward regression, uniform exploration.

Exploit ŷ = argmax_a ŵ_a·x; explore with the strategy's γ as ε (the same
distribution (1−ε)·1[a=ŷ] + ε/K as every learner). The chosen action's reward
model is updated by normalised least-mean-squares,
ŵ_a += lr·(r − ŵ_a·x)·x / ‖x‖², which is invariant to the scale of x. This is
the "regression oracle" baseline that VW's ε-greedy explorer also uses.
"""

from __future__ import annotations

import numpy as np

from streamlearn.features import Batch, add_outer, row_norms, scores
from streamlearn.learners.base import LinearLearner, check_float
from streamlearn.learners.exploration import Exploration

__all__ = ["EpsilonGreedy"]


class EpsilonGreedy(LinearLearner):
    """ε-greedy over per-action linear reward estimates (NLMS updates).

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> from streamlearn.learners.exploration import FixedGamma
    >>> X, y = synthetic_stream(20_000, noise=0.0, seed=1)
    >>> round(replay(EpsilonGreedy(9, 400, FixedGamma(0.05)), X, y).error_rate, 2)
    0.07
    """

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        lr: float = 0.5,
        seed: int = 0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, seed)
        self.lr = check_float("EpsilonGreedy", "lr", lr, 0.0, 2.0, high_open=True)

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray) -> None:
        rows = np.arange(len(actions))
        predicted = scores(self.weights_, X)[rows, actions]
        sq_norms = row_norms(X) ** 2
        step = np.where(sq_norms > 0, self.lr * (rewards - predicted) / np.maximum(sq_norms, 1e-300),
                        0.0)
        coef = np.zeros_like(probs)
        coef[rows, actions] = step
        add_outer(self.weights_, coef, X)
