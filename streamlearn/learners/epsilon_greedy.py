"""ε-greedy over the regression oracle: per-action reward regression, uniform exploration.

Exploit ŷ = argmax_a μ̂_a(x), the oracle's reward estimates; explore with the
strategy's γ as ε (the distribution (1−ε)·1[a=ŷ] + ε/K shared by every
learner). The chosen action's regressor learns the observed reward with the
oracle's adaptive, normalised, importance-invariant update
(:mod:`streamlearn.learners.oracle`), with importance 1/(K·P(ỹ)) as VW's MTR
reduction weighs it (``importance="ips"``) or 1 (``"none"``). This is the
baseline VW's ``--cbify --epsilon`` runs.
"""

from __future__ import annotations

import numpy as np

from streamlearn.errors import ConfigError
from streamlearn.learners.exploration import Exploration
from streamlearn.learners.oracle_base import OracleLearner

__all__ = ["EpsilonGreedy"]


class EpsilonGreedy(OracleLearner):
    """ε-greedy over per-action linear reward estimates (regression oracle).

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        Source of ε = γ_t (default: the drift-aware ``default_exploration()``).
    lr
        The oracle's learning rate η.
    seed
        Seeds the exploration randomness together with each event's key.
    loss
        ``"squared"`` or ``"logistic"``.
    initial
        Every action's reward estimate before any feedback (default 0.5, the middle of
        the reward range; 1 is optimistic). docs/learners.md says how it was chosen.
    importance
        ``"ips"`` (1/(K·P(ỹ))) or ``"none"``.
    drift_memory
        Share of the oracle's step-size statistics kept after a detected change.

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> from streamlearn.learners.exploration import FixedGamma
    >>> X, y = synthetic_stream(20_000, noise=0.0, seed=1)
    >>> round(replay(EpsilonGreedy(9, 400, FixedGamma(0.05)), X, y, batch_size=16).error_rate, 2)
    0.05
    """

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        lr: float = 0.5,
        seed: int = 0,
        loss: str = "squared",
        initial: float = 0.5,
        importance: str = "none",
        drift_memory: float = 0.0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, loss, lr, seed, initial, drift_memory)
        if importance not in ("ips", "none"):
            raise ConfigError(f"The 'importance' parameter of EpsilonGreedy must be 'ips' or 'none'. "
                              f"Got {importance!r} instead.")
        self.importance = importance

    def _importance(self, actions: np.ndarray, probs: np.ndarray) -> np.ndarray:
        if self.importance == "none":
            return np.ones(len(actions))
        return np.asarray(1.0 / (self.n_actions * probs[np.arange(len(actions)), actions]))
