"""Online bagging / bootstrap Thompson sampling over regression oracles (VW's ``--bag``)."""

from __future__ import annotations

import numpy as np

from streamlearn.errors import ConfigError
from streamlearn.features import Batch
from streamlearn.learners import randomness
from streamlearn.learners.base import Learner, check_float, check_int, mix_uniform
from streamlearn.learners.exploration import Exploration, FixedGamma
from streamlearn.learners.oracle import RegressionOracle
from streamlearn.learners.oracle_base import new_change

__all__ = ["Bagging", "poisson_one"]

# P(Poisson(1) ≤ k) for k = 0..19; beyond 19 the remaining mass is below 1e-18
_POISSON_CDF = np.cumsum([np.exp(-1.0) / np.prod(np.arange(1, k + 1)) for k in range(20)])
_BAG_KEY_TAG = np.uint64(1 << 63)  # bootstrap keys never collide with small integer event keys


def poisson_one(u: np.ndarray) -> np.ndarray:
    """Poisson(1) counts from uniforms by inverse CDF.

    >>> poisson_one(np.array([0.1, 0.5, 0.8, 0.95])).astype(int).tolist()
    [0, 1, 2, 3]
    """
    return np.searchsorted(_POISSON_CDF, u, side="right").astype(np.float64)


class Bagging(Learner):
    """N regression oracles trained on Poisson(1) bootstrap weights; play a random copy's best action.

    Each feedback event updates the chosen action's regressor in copy n with
    importance k_n ~ Poisson(1) (Oza & Russell's online bagging) times the
    importance of the event (``importance="ips"``: 1/(K·P(ỹ)), as VW's MTR
    reduction weighs the chosen action; ``"none"``: 1). Every copy votes for its
    best allowed action (ties split the vote), and the action is sampled from the
    votes — bootstrap Thompson sampling, the policy of VW's ``--bag N`` — mixed with
    the exploration strategy's γ: P = (1 − γ)·votes + γ·uniform. The exploit
    action is the most voted one (ties → lowest index).

    The bootstrap counts are keyed randomness too: a pure function of (seed,
    number of feedback events applied before, copy), so a replay of the same
    feedback gives the same weights.

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        Source of γ (default ``FixedGamma(0.0001, detect_drift=True)``: a floor under every
        allowed action, and a change detector that restarts the copies).
    n_bags
        N, the number of copies.
    importance
        ``"ips"`` or ``"none"`` (see above).
    loss, lr
        The oracles' loss and η.
    seed
        Seeds the exploration and bootstrap randomness.
    initial
        Every action's reward estimate before any feedback (default 0.5, the middle of
        the reward range; 1 is optimistic). docs/learners.md says how it was chosen.
    drift_memory
        Share of the oracles' step-size statistics kept after a detected change.

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> X, y = synthetic_stream(20_000, noise=0.05, seed=1)
    >>> round(replay(Bagging(9, 400), X, y, batch_size=16).error_rate, 2)
    0.06
    """

    @classmethod
    def _default_exploration(cls) -> Exploration:
        # a floor under every action (the bootstrap votes explore) and a change detector: on a
        # detected change the copies restart (``drift_memory``)
        return FixedGamma(0.0001, detect_drift=True)

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        n_bags: int = 5,
        importance: str = "ips",
        loss: str = "squared",
        lr: float = 0.5,
        seed: int = 0,
        initial: float = 0.5,
        drift_memory: float = 0.0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, seed)
        self.n_bags = check_int("Bagging", "n_bags", n_bags, low=1)
        if importance not in ("ips", "none"):
            raise ConfigError(f"The 'importance' parameter of Bagging must be 'ips' or 'none'. "
                              f"Got {importance!r} instead.")
        self.importance = importance
        self.oracle_ = RegressionOracle(self.n_bags * self.n_actions, self.n_features, loss,
                                        lr, owner="Bagging", initial=initial)
        self.loss = self.oracle_.loss
        self.lr = self.oracle_.learning_rate
        self.initial = self.oracle_.initial
        self.drift_memory = check_float("Bagging", "drift_memory", drift_memory, 0.0, 1.0, low_open=False)
        self.drift_seen_ = np.zeros(1)

    # ---------------------------------------------------------------- decide
    def decision_scores(self, X: Batch) -> np.ndarray:
        """The copies' mean raw score of each action (B, K)."""
        return np.asarray(self._copy_scores(X).mean(axis=1))

    def _copy_scores(self, X: Batch) -> np.ndarray:
        """Each copy's reward estimates (B, N, K), once per decide."""
        return self._once_per_call("copy_scores", (X,), lambda: self._estimate_copies(X))

    def _estimate_copies(self, X: Batch) -> np.ndarray:
        raw = self.oracle_.predict(X).reshape(-1, self.n_bags, self.n_actions)
        # into [0, 1]; fmax maps NaN (an extreme row's estimate) to 0, the lowest
        return np.asarray(np.fmin(np.fmax(self.oracle_.expected(raw), 0.0), 1.0))

    def votes(self, X: Batch, mask: np.ndarray | None = None) -> np.ndarray:
        """Share of copies whose best allowed action is a (ties split the vote), (B, K)."""
        return self._once_per_call("votes", (X, mask), lambda: self._votes(X, mask))

    def _votes(self, X: Batch, mask: np.ndarray | None) -> np.ndarray:
        per_copy = self._copy_scores(X)
        if mask is not None:
            per_copy = np.where(mask[:, None, :], per_copy, -np.inf)
        best = per_copy == per_copy.max(axis=2, keepdims=True)
        return np.asarray((best / best.sum(axis=2, keepdims=True)).mean(axis=1))

    def _exploit(self, X: Batch, score_matrix: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return np.asarray(np.argmax(self.votes(X, mask), axis=1))

    def _probabilities(
        self, X: Batch, score_matrix: np.ndarray, exploit: np.ndarray, gammas: np.ndarray,
        mask: np.ndarray | None,
    ) -> np.ndarray:
        return mix_uniform(self.votes(X, mask), gammas, mask)

    # ---------------------------------------------------------------- update
    def bootstrap_counts(self, n_events: int) -> np.ndarray:
        """Poisson(1) count of each of the next ``n_events`` events in each copy (B, N)."""
        first = self.n_updated_ * self.n_bags
        keys = _BAG_KEY_TAG | (np.uint64(first) + np.arange(n_events * self.n_bags, dtype=np.uint64))
        return poisson_one(randomness.uniforms(self.seed, keys)).reshape(n_events, self.n_bags)

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        if new_change(self):
            self.oracle_.forget(self.drift_memory)
        B = len(actions)
        counts = self.bootstrap_counts(B)
        if self.importance == "ips":
            counts = counts / (self.n_actions * probs[np.arange(B), actions])[:, None]
        outputs = np.arange(self.n_bags)[None, :] * self.n_actions + actions[:, None]
        self.oracle_.update(X, outputs, np.repeat(rewards[:, None], self.n_bags, axis=1), counts)

    # ----------------------------------------------------------------- state
    def _weights(self) -> np.ndarray:
        return np.asarray(self.oracle_.weights_.reshape(self.n_bags, self.n_actions, -1).mean(axis=0))

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**self.oracle_.arrays(), "drift_seen": self.drift_seen_}

    def _load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.oracle_.load_arrays(arrays)
        self.drift_seen_ = arrays["drift_seen"]
