"""Full-information multiclass Perceptron: the comparator every replay reports."""

from __future__ import annotations

import numpy as np

from streamlearn.features import Batch, add_outer
from streamlearn.learners.base import LinearLearner
from streamlearn.learners.exploration import Exploration, FixedGamma

__all__ = ["Perceptron"]


class Perceptron(LinearLearner):
    """The multiclass Perceptron (Crammer-Singer style additive update).

    A full-information learner: ``update`` takes the *correct* action in
    ``actions`` with its reward (the replay passes the true labels with reward
    1). For each event with the exploit action ŷ (argmax of the logged
    distribution, i.e. of W x at decision time) and a rewarded action a ≠ ŷ:
    W[a] += r·x, W[ŷ] −= r·x. Under bandit feedback it therefore learns only
    from rewarded events. Its ``decide`` still explores with its strategy, so
    it can serve; the replay reports its exploit error.

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> X, y = synthetic_stream(20_000, noise=0.0, seed=1)
    >>> round(replay(Perceptron(9, 400), X, y, batch_size=16).error_rate, 3)
    0.001
    """

    full_information = True

    @classmethod
    def _default_exploration(cls) -> Exploration:
        return FixedGamma(0.05)  # only its serving would explore; replays score its exploit

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        rows = np.arange(len(actions))
        step = np.where(actions != exploit, rewards, 0.0)
        coef = np.zeros_like(probs)
        coef[rows, actions] += step
        coef[rows, exploit] -= step
        add_outer(self.weights_, coef, X)
