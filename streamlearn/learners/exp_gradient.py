"""Exponential-gradient bandit learner EG± (potential-based family, docs/algorithms.md §3).

The exponential potential gives W_ij ∝ exp(η·Θ_ij) with Θ updated by the
Banditron's unbiased U. EG weights are positive, so features are mapped to
[x; −x] (EG±): the effective weights are W⁺ − W⁻ and the dual of the negated
copy receives −U. The normalising constant does not change the argmax, so the
dual is re-centred after every update (Θ ← Θ − max Θ): Θ ≤ 0, exp never
overflows, and entries far below the maximum underflow harmlessly to 0 — this
is what keeps millions of rounds stable. Keep η·‖x‖_∞·K/γ ≲ 1.
"""

from __future__ import annotations

import math

import numpy as np

from streamlearn.features import Batch, add_outer
from streamlearn.learners.banditron import banditron_coefficients
from streamlearn.learners.base import Learner, check_float
from streamlearn.learners.exploration import Exploration

__all__ = ["ExpGradientBandit"]


class ExpGradientBandit(Learner):
    """EG± bandit learner: multiplicative updates, mistake bound free of the dimension.

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        How γ is chosen (default ``Adaptive()``, drift-aware; the paper fixes γ: ``FixedGamma(γ)``).
    eta
        Learning rate of the exponential link (> 0).
    seed
        Seeds the exploration randomness with each event's key.

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> from streamlearn.learners.exploration import FixedGamma
    >>> X, y = synthetic_stream(20_000, noise=0.0, seed=1)
    >>> result = replay(ExpGradientBandit(9, 400, FixedGamma(0.014), eta=0.01), X, y,
    ...                 batch_size=16)
    >>> round(result.error_rate, 2)
    0.04
    """

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        eta: float = 0.01,
        seed: int = 0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, seed)
        self.eta = check_float("ExpGradientBandit", "eta", eta, 0.0, math.inf)
        # dual of [x; −x]: columns [0, d) for +x, [d, 2d) for −x; invariant: max(theta_) <= 0
        self.theta_ = np.zeros((self.n_actions, 2 * self.n_features))
        self._w = np.zeros((self.n_actions, self.n_features))

    def _weights(self) -> np.ndarray:
        return self._w

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        coef = banditron_coefficients(actions, rewards, probs, exploit)
        d = self.n_features
        positive, negative = self.theta_[:, :d], self.theta_[:, d:]
        add_outer(positive, coef, X)  # views: updates land in theta_
        add_outer(negative, -coef, X)
        self.theta_ -= self.theta_.max()
        self._refresh()

    def _refresh(self) -> None:
        exp_theta = np.exp(self.eta * self.theta_)
        d = self.n_features
        self._w = exp_theta[:, :d] - exp_theta[:, d:]

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"theta": self.theta_}

    def _load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.theta_ = arrays["theta"]
        self._refresh()
