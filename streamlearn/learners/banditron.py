"""Banditron (Kakade, Shalev-Shwartz & Tewari, ICML 2008), vectorised over micro-batches."""

from __future__ import annotations

import numpy as np

from streamlearn.features import Batch, add_outer, row_starts
from streamlearn.learners.base import LinearLearner

__all__ = ["Banditron", "banditron_coefficients"]


def banditron_coefficients(
    actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
    exploit: np.ndarray | None = None,
) -> np.ndarray:
    """The (B, K) update coefficients: U = coef.T @ X.

    ``exploit`` is the learner's own best action ŷ at decision time; by default the
    logged distribution's maximum, which it is whenever the learner alone decided.

    Row ŷ loses x; the chosen row ỹ gains r·x / P(ỹ). Its expectation over ỹ is
    the Perceptron update (for r = 1[ỹ = y]).
    """
    B, K = probs.shape
    starts = row_starts(B, K)
    chosen = starts + actions
    coef = np.zeros(B * K)
    coef[chosen] = rewards / probs.take(chosen)
    coef[starts + (probs.argmax(axis=1) if exploit is None else exploit)] -= 1.0  # ŷ's entries
    return coef.reshape(B, K)


class Banditron(LinearLearner):
    """The Banditron: a Perceptron that learns from bandit feedback.

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        How γ is chosen (default ``Adaptive()``, drift-aware; the paper fixes γ: ``FixedGamma(γ)``).
    seed
        Seeds the exploration randomness together with each event's key.

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> from streamlearn.learners.exploration import FixedGamma
    >>> X, y = synthetic_stream(20_000, noise=0.0, seed=1)
    >>> result = replay(Banditron(9, 400, FixedGamma(0.014)), X, y, batch_size=16)
    >>> round(result.error_rate, 2)
    0.04
    """

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        add_outer(self.weights_, banditron_coefficients(actions, rewards, probs, exploit), X)
