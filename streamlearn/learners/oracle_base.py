"""Learners built on the regression oracle (:class:`~streamlearn.learners.oracle.RegressionOracle`).

An :class:`OracleLearner` keeps one regressor per action that predicts the
action's reward from x; its scores are the regressors' raw outputs and its
exploit action is their (masked) argmax. Subclasses choose the sampling
distribution (``_probabilities``) and the importance weight of each update
(``_importance``); the update itself — the chosen action's regressor moves
towards the observed reward — is shared.
"""

from __future__ import annotations

import numpy as np

from streamlearn.features import Batch
from streamlearn.learners.base import Learner, check_float
from streamlearn.learners.exploration import Exploration, default_exploration
from streamlearn.learners.oracle import RegressionOracle

__all__ = ["OracleLearner", "inverse_gap_weighting", "new_change"]


def new_change(learner: Learner) -> bool:
    """Whether the exploration detected a change the learner has not acted on yet (then mark it seen).

    Learners with a ``drift_seen_`` array and a ``drift_memory`` forget part of what they
    learned once per detected change, before applying the batch whose feedback revealed it.
    """
    detections = float(learner.drift_detections_)
    seen: np.ndarray = learner.drift_seen_  # type: ignore[attr-defined]
    if detections <= seen[0]:
        return False
    learner.drift_seen_ = np.array([detections])  # type: ignore[attr-defined]
    return bool(learner.drift_memory < 1.0)  # type: ignore[attr-defined]


def inverse_gap_weighting(
    rewards: np.ndarray, exploit: np.ndarray, greediness: np.ndarray, mask: np.ndarray | None
) -> np.ndarray:
    """Foster & Rakhlin's inverse gap weighting over the allowed actions.

    P(a) = 1/(A + λ·(μ_ŷ − μ_a)) for allowed a ≠ ŷ, P(ŷ) = 1 − Σ_{a≠ŷ} P(a), where A is
    the number of allowed actions and λ the greediness of each event. ``rewards`` holds
    the reward estimates μ (B, K). Every P(a) ≤ 1/A ≤ P(ŷ), so the row maximum is at ŷ.

    >>> p = inverse_gap_weighting(np.array([[0.9, 0.5, 0.0]]), np.array([0]), np.array([10.0]), None)
    >>> [round(float(v), 4) for v in p[0]]
    [0.7738, 0.1429, 0.0833]
    """
    B, K = rewards.shape
    rows = np.arange(B)
    allowed = np.full(B, float(K)) if mask is None else mask.sum(axis=1).astype(np.float64)
    gap = np.maximum(rewards[rows, exploit][:, None] - rewards, 0.0)
    probs = 1.0 / (allowed[:, None] + greediness[:, None] * gap)
    if mask is not None:
        probs = np.where(mask, probs, 0.0)
    probs[rows, exploit] = 0.0
    probs[rows, exploit] = np.maximum(1.0 - probs.sum(axis=1), 1.0 / allowed)
    return np.asarray(probs / probs.sum(axis=1, keepdims=True))


class OracleLearner(Learner):
    """A learner whose state is a :class:`RegressionOracle` with one regressor per action."""

    @classmethod
    def _default_exploration(cls) -> Exploration:
        return default_exploration()

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        loss: str = "squared",
        lr: float = 0.5,
        seed: int = 0,
        initial: float = 0.0,
        drift_memory: float = 0.0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, seed)
        self.oracle_ = RegressionOracle(self.n_actions, self.n_features, loss, lr,
                                        owner=type(self).__name__, initial=initial)
        self.loss = self.oracle_.loss
        self.lr = self.oracle_.learning_rate
        self.initial = self.oracle_.initial
        self.drift_memory = check_float(type(self).__name__, "drift_memory", drift_memory, 0.0, 1.0,
                                        low_open=False)
        self.drift_seen_ = np.zeros(1)  # the exploration's detections already acted on

    def decision_scores(self, X: Batch) -> np.ndarray:
        """The regressors' raw outputs ``X @ W.T + b`` (B, K)."""
        return self.oracle_.predict(X)

    def expected_rewards(self, score_matrix: np.ndarray) -> np.ndarray:
        """Reward estimates in [0, 1] from raw scores (clipped, as VW clips to the label range)."""
        return np.asarray(np.clip(self.oracle_.expected(score_matrix), 0.0, 1.0))

    def _weights(self) -> np.ndarray:
        return self.oracle_.weights_

    def _importance(self, actions: np.ndarray, probs: np.ndarray) -> np.ndarray:
        """Importance weight of each update; 1 by default (plain regression on what was seen)."""
        return np.ones(len(actions))

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        if new_change(self):
            self.oracle_.forget(self.drift_memory)
        importance = self._importance(actions, probs)
        self.oracle_.update(X, actions[:, None], rewards[:, None], importance[:, None])

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**self.oracle_.arrays(), "drift_seen": self.drift_seen_}

    def _load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.oracle_.load_arrays(arrays)
        self.drift_seen_ = arrays["drift_seen"]
