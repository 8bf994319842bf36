"""Potential-based bandit learners (Wang, Jin & Valizadegan, AISTATS 2010): the p-norm link.

The learner keeps a dual matrix Θ (K×d) and plays with W = ∇Φ(Θ). With the
p-norm potential Φ = ½‖Θ‖²_q over all K·d entries,

    W_ij = sign(Θ_ij)·|Θ_ij|^{q−1} / ‖Θ‖_q^{q−2},

and the Banditron's unbiased update is applied to the dual: Θ += η·U. The link
is positively homogeneous of degree 1, so η rescales Θ and W alike and never
changes a decision; it is kept for the family's uniform interface. q = 2 gives
W = Θ: the Banditron exactly. q ≈ 2·ln(K·d) behaves like exponential gradient.
The general form is our reconstruction (docs/algorithms.md §3 [recon]).
"""

from __future__ import annotations

import math

import numpy as np

from streamlearn.features import Batch, add_outer
from streamlearn.learners.banditron import banditron_coefficients
from streamlearn.learners.base import Learner, check_float
from streamlearn.learners.exploration import Exploration

__all__ = ["PNormBandit", "pnorm_link"]


def pnorm_link(theta: np.ndarray, q: float) -> np.ndarray:
    """W = ∇½‖Θ‖²_q, computed scaled by max|Θ| so that nothing overflows for large q."""
    top = float(np.max(np.abs(theta))) if theta.size else 0.0
    if top == 0.0:
        return np.zeros_like(theta)
    scaled = np.abs(theta) / top  # in [0, 1]
    powered = scaled ** (q - 1.0)
    norm_scaled = float(np.sum(scaled**q)) ** (1.0 / q)  # ‖Θ/top‖_q ≥ 1
    return np.asarray(np.sign(theta) * powered * (top / norm_scaled ** (q - 2.0)))


class PNormBandit(Learner):
    """Bandit learner with the p-norm link (potential-based family).

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        How γ is chosen (default ``Adaptive()``, drift-aware; the paper fixes γ: ``FixedGamma(γ)``).
    q
        The dual norm's exponent, > 1. ``None`` (default) uses q = 2·ln(K·d).
    eta
        Dual step size (> 0); irrelevant to decisions (homogeneous link), kept for the family.
    seed
        Seeds the exploration randomness with each event's key.

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> from streamlearn.learners.exploration import FixedGamma
    >>> X, y = synthetic_stream(20_000, noise=0.0, seed=1)
    >>> result = replay(PNormBandit(9, 400, FixedGamma(0.014), q=2.0), X, y, batch_size=16)
    >>> round(result.error_rate, 2)
    0.04
    """

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        q: float | None = None,
        eta: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, seed)
        self.q = q
        self.eta = check_float("PNormBandit", "eta", eta, 0.0, math.inf)
        default_q = 2.0 * math.log(self.n_actions * self.n_features)
        self.q_ = max(2.0, default_q) if q is None else check_float(
            "PNormBandit", "q", q, 1.0, 1000.0)
        self.theta_ = np.zeros((self.n_actions, self.n_features))
        self._w = np.zeros_like(self.theta_)

    def _weights(self) -> np.ndarray:
        return self._w

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        add_outer(self.theta_, self.eta * banditron_coefficients(actions, rewards, probs, exploit), X)
        self._w = self.theta_.copy() if self.q_ == 2.0 else pnorm_link(self.theta_, self.q_)

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"theta": self.theta_}

    def _load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.theta_ = arrays["theta"]
        self._w = self.theta_.copy() if self.q_ == 2.0 else pnorm_link(self.theta_, self.q_)
