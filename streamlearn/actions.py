"""Orders of actions and the distributions a policy samples from, for any layer to use.

* :func:`best_first` — each row's actions best first by score (the ``ranking`` of a decision);
* :func:`exploit_around` — 1 − γ on the best allowed action, γ spread over the allowed ones
  (how a ranker is deployed: with the learner's exploration rate);
* :func:`exploration_rates` — γ of a logged distribution.
"""

from __future__ import annotations

import numpy as np

from streamlearn.features import row_starts

__all__ = ["best_first", "exploit_around", "exploration_rates"]


def best_first(scores: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """(B, K) action orders: allowed actions by score (NaN lowest, ties by index), then the
    disallowed ones.

    >>> best_first(np.array([[np.nan, 0.2, 0.9]]), np.array([[True, True, False]])).tolist()
    [[1, 0, 2]]
    """
    allowed = np.ones(scores.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    negated = -np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf, posinf=np.inf,
                             neginf=-np.inf)
    return np.lexsort((negated, ~allowed), axis=-1)


def exploit_around(scores: np.ndarray, mask: np.ndarray | None, gamma: np.ndarray) -> np.ndarray:
    """Distributions that put 1 − γ on the best-scored allowed action and spread γ
    uniformly over the allowed actions (per row).

    >>> exploit_around(np.array([[0.1, 0.9, 0.5]]), np.array([[True, False, True]]), np.array([0.2]))
    array([[0.1, 0. , 0.9]])
    """
    allowed = np.ones(scores.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    top = best_first(scores, allowed)[:, 0]
    n = allowed.sum(axis=1, keepdims=True)
    gamma = np.clip(np.asarray(gamma, dtype=np.float64), 0.0, 1.0)[:, None]
    probs = np.where(allowed, gamma / np.maximum(n, 1), 0.0)
    probs[np.arange(len(top)), top] += 1.0 - gamma[:, 0]
    return probs


def exploration_rates(probs: np.ndarray, mask: np.ndarray | None,
                      top: np.ndarray | None = None) -> np.ndarray:
    """γ of each logged distribution: (1 − max p)·n/(n − 1) over its n allowed actions.

    ``top``: each row's argmax when the caller has it (gathering p there is ~4× cheaper than
    a row-wise maximum on a batch of 64)."""
    largest = probs.max(axis=1) if top is None else probs.take(row_starts(*probs.shape) + top)
    if mask is None:
        K = probs.shape[1]
        return np.asarray((1.0 - largest) * K / max(K - 1, 1))
    allowed = mask.sum(axis=1)
    return np.asarray((1.0 - largest) * allowed / np.maximum(allowed - 1, 1))
