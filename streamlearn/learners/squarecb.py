"""SquareCB (Foster & Rakhlin, ICML 2020): inverse gap weighting over a regression oracle."""

from __future__ import annotations

import numpy as np

from streamlearn.features import Batch
from streamlearn.learners.base import check_float
from streamlearn.learners.exploration import Exploration
from streamlearn.learners.oracle_base import OracleLearner, inverse_gap_weighting

__all__ = ["SquareCB"]


class SquareCB(OracleLearner):
    """SquareCB: play action a ≠ ŷ with probability 1/(A + λ_t·(μ̂_ŷ − μ̂_a)).

    μ̂ are the regression oracle's reward estimates, ŷ their argmax, A the number of
    allowed actions. The greediness λ_t comes from the exploration strategy's γ_t:
    λ_t = greediness·A/γ_t, so an action whose estimate is a full reward below the
    best gets about γ_t/(greediness·A) — the exploration an ε-greedy learner with
    ε = γ_t would give it — and closer actions get more. With ``SqrtSchedule``
    (γ_t ∝ √(K/t)) this is Foster & Rakhlin's λ_t ∝ √(K·t); the default
    drift-aware ``Adaptive`` strategy gives λ_t ∝ t^{1/3} scaled by the estimated
    exploit error and restarts it when a change is detected.

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        Source of γ_t (default ``Adaptive()``).
    greediness
        Scale of λ_t.
    loss, lr
        The oracle's loss and η.
    seed
        Seeds the exploration randomness together with each event's key.
    initial
        Every action's reward estimate before any feedback (1: optimistic, as VW's
        default cost encoding).
    drift_memory
        Share of the oracle's step-size statistics kept when the exploration detects a
        change (0: the step sizes restart).

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> X, y = synthetic_stream(20_000, noise=0.05, seed=1)
    >>> round(replay(SquareCB(9, 400), X, y, batch_size=16).error_rate, 2)
    0.06
    """

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        greediness: float = 1.0,
        loss: str = "squared",
        lr: float = 0.5,
        seed: int = 0,
        initial: float = 1.0,
        drift_memory: float = 0.0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, loss, lr, seed, initial, drift_memory)
        self.greediness = check_float("SquareCB", "greediness", greediness, 0.0, 1e6)

    def _probabilities(
        self, X: Batch, score_matrix: np.ndarray, exploit: np.ndarray, gammas: np.ndarray,
        mask: np.ndarray | None,
    ) -> np.ndarray:
        allowed = self.n_actions if mask is None else mask.sum(axis=1)
        greediness = self.greediness * allowed / gammas
        return inverse_gap_weighting(self.expected_rewards(score_matrix), exploit, greediness, mask)
