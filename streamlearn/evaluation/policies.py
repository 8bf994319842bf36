"""Target policies over logged rows, the held-out split, the DR reward model and one evaluation call.

A policy here is an ``(n, K)`` distribution over actions for each logged row. The
builders: :func:`learner_policy` (the logger's greedy action, argmax of the logged
distribution), :func:`uniform_policy` (uniform over the actions the logger could
choose, ``probs > 0``), :func:`constant_policy`, :func:`best_constant` (chosen on a
training split by SNIPS) and :func:`ranker_policy` (a ranker's greedy action over
the allowed actions). Off-policy estimates only see actions the logger could take:
an action whose logged probability is 0 has weight 0 on every row, so a policy
putting mass on such actions cannot be evaluated — hence ``uniform`` is uniform
over the *logged-allowed* actions, and a constant action the logger never allows
on a row contributes nothing there (IPS counts it as reward 0, SNIPS ignores it).

:func:`holdout_mask` splits by a stable hash of the event id (64-bit FNV-1a, then
the murmur3 64-bit finaliser, since FNV's high bits barely change between ids that
differ in their last character), so the same log always gives the same held-out
slice, independent of row order and of which segments are read.
:func:`fit_reward_model` is per-action ridge regression, fitted on the training
split only — DR must never use a model fit on the rows it
evaluates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from streamlearn.errors import ConfigError, DataError
from streamlearn.evaluation.offpolicy import Estimate, doubly_robust, ips, snips
from streamlearn.features import hash_strings
from streamlearn.rankers.base import Ranker
from streamlearn.rankers.joint import action_scores, greedy

__all__ = ["ESTIMATORS", "LoggedRows", "LoggedSlice", "RewardModel", "best_constant",
           "constant_policy", "evaluate_policies", "fit_reward_model", "holdout_mask",
           "learner_policy", "ranker_policy", "uniform_policy"]

ESTIMATORS = ("ips", "snips", "dr")


class LoggedRows(Protocol):
    """What the evaluation reads of an experience log (``ExperienceRows`` has it)."""

    ids: list[str]
    X: np.ndarray
    actions: np.ndarray
    probs: np.ndarray
    rewards: np.ndarray

    @property
    def propensities(self) -> np.ndarray: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class LoggedSlice:
    """A subset of logged rows (the arrays of :class:`LoggedRows`, selected by a mask)."""

    ids: list[str]
    X: np.ndarray
    actions: np.ndarray
    probs: np.ndarray
    rewards: np.ndarray

    @classmethod
    def of(cls, rows: LoggedRows, mask: np.ndarray) -> LoggedSlice:
        keep = np.asarray(mask, dtype=bool)
        ids = [i for i, k in zip(rows.ids, keep.tolist(), strict=True) if k]
        return cls(ids, rows.X[keep], rows.actions[keep], rows.probs[keep], rows.rewards[keep])

    @property
    def propensities(self) -> np.ndarray:
        return np.asarray(self.probs[np.arange(len(self.actions)), self.actions], dtype=np.float64)

    def __len__(self) -> int:
        return len(self.actions)


def _fmix64(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finaliser: every input bit affects every output bit."""
    h = h.astype(np.uint64)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return np.asarray(h)


def holdout_mask(ids: Sequence[str], fraction: float) -> np.ndarray:
    """``True`` for the held-out rows: those whose mixed id hash is below ``fraction`` of 2⁶⁴.

    >>> holdout_mask(["a", "b", "c"], 0.0).tolist(), holdout_mask(["a", "b", "c"], 1.0).tolist()
    ([False, False, False], [True, True, True])
    """
    if not (isinstance(fraction, (int, float)) and 0.0 <= fraction <= 1.0):
        raise ConfigError(f"Expected a held-out fraction in [0, 1]. Got {fraction!r}.")
    mixed = _fmix64(hash_strings(list(ids)))
    unit = (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.asarray(unit < fraction)


# ---------------------------------------------------------------------------- policies
def _one_hot(actions: np.ndarray, n_actions: int) -> np.ndarray:
    out = np.zeros((len(actions), n_actions))
    out[np.arange(len(actions)), actions] = 1.0
    return out


def learner_policy(probs: np.ndarray) -> np.ndarray:
    """The logger's greedy policy: all mass on argmax of each logged distribution (ties: lower)."""
    P = np.asarray(probs)
    return _one_hot(np.argmax(P, axis=1), P.shape[1])


def uniform_policy(probs: np.ndarray) -> np.ndarray:
    """Uniform over the actions the logger could choose (``probs > 0``) on each row."""
    allowed = (np.asarray(probs) > 0).astype(np.float64)
    return np.asarray(allowed / np.maximum(allowed.sum(axis=1, keepdims=True), 1.0))


def constant_policy(n_rows: int, n_actions: int, action: int) -> np.ndarray:
    """Always ``action`` (on rows where the logger never allows it, the estimate has no data)."""
    if not 0 <= action < n_actions:
        raise ConfigError(f"Expected a constant action in [0, {n_actions}). Got {action}.")
    return _one_hot(np.full(n_rows, action), n_actions)


def ranker_policy(ranker: Ranker, X: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """The ranker's greedy action among the logged-allowed actions of each row."""
    P = np.asarray(probs)
    return _one_hot(greedy(action_scores(ranker, X, P.shape[1]), P > 0), P.shape[1])


def best_constant(rows: LoggedRows, clip: float = math.inf) -> int:
    """The constant action with the highest SNIPS value on ``rows`` (ties: lower action)."""
    K = rows.probs.shape[1]
    values = np.array([snips(rows.rewards, rows.actions, rows.propensities,
                             target_actions=np.full(len(rows), a), clip=clip).value
                       for a in range(K)])  # one vectorised estimate per action, not per row
    if np.isnan(values).all():
        raise DataError("Expected some rows to choose a best constant action. Got none.")
    return int(np.nanargmax(values))


# ------------------------------------------------------------------------ reward model
@dataclass(frozen=True)
class RewardModel:
    """Per-action linear reward predictions ``clip(X·coef[a] + intercept[a], 0, 1)``."""

    coef: np.ndarray  # (K, d)
    intercept: np.ndarray  # (K,)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """r̂(x, a) for every row and action: ``(n, K)`` in [0, 1]."""
        out = np.asarray(X, dtype=np.float64) @ self.coef.T + self.intercept
        return np.asarray(np.clip(out, 0.0, 1.0))


def fit_reward_model(X: np.ndarray, actions: np.ndarray, rewards: np.ndarray, n_actions: int,
                     ridge: float = 1.0) -> RewardModel:
    """Ridge regression of the reward on the context, one per action, intercept unpenalised.

    An action with no training rows predicts the overall mean reward.
    """
    if not ridge > 0:
        raise ConfigError(f"Expected a ridge penalty > 0. Got {ridge}.")
    Xf = np.asarray(X, dtype=np.float64)
    a = np.asarray(actions).reshape(-1)
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    d = Xf.shape[1]
    coef = np.zeros((n_actions, d))
    intercept = np.full(n_actions, float(r.mean()) if len(r) else 0.0)
    for action in range(n_actions):  # K solves of d×d systems, never a loop over rows
        rows = a == action
        if not rows.any():
            continue
        x_mean, r_mean = Xf[rows].mean(axis=0), float(r[rows].mean())
        Xc = Xf[rows] - x_mean
        coef[action] = np.linalg.solve(Xc.T @ Xc + ridge * np.eye(d), Xc.T @ (r[rows] - r_mean))
        intercept[action] = r_mean - x_mean @ coef[action]
    return RewardModel(coef, intercept)


# -------------------------------------------------------------------------- evaluation
def evaluate_policies(
    rows: LoggedRows, policies: Mapping[str, np.ndarray],
    estimators: Sequence[str] = ESTIMATORS, clip: float = math.inf, level: float = 0.95,
    reward_model: np.ndarray | None = None,
) -> dict[str, dict[str, Estimate]]:
    """Estimate each policy (name → (n, K) distribution) with each estimator.

    ``reward_model`` is r̂ for these rows, ``(n, K)``, required by ``"dr"`` and
    fitted on *other* rows (:func:`fit_reward_model` on a training split).
    """
    unknown = [e for e in estimators if e not in ESTIMATORS]
    if unknown:
        raise ConfigError(f"Expected estimators among {', '.join(ESTIMATORS)}. Got {unknown}.")
    if "dr" in estimators and reward_model is None:
        raise ConfigError("The 'dr' estimator needs a reward model fitted on a training split. Got None.")
    p = rows.propensities
    out: dict[str, dict[str, Estimate]] = {}
    for name, dist in policies.items():  # a handful of policies, each estimate vectorised
        pi = np.asarray(dist, dtype=np.float64)
        if pi.shape != rows.probs.shape:
            raise ConfigError(f"Expected policy {name!r} of shape {rows.probs.shape}. Got {pi.shape}.")
        result: dict[str, Estimate] = {}
        for est in estimators:
            if est == "ips":
                result[est] = ips(rows.rewards, rows.actions, p, clip=clip, level=level,
                                  target_probs=pi)
            elif est == "snips":
                result[est] = snips(rows.rewards, rows.actions, p, clip=clip, level=level,
                                    target_probs=pi)
            else:
                assert reward_model is not None
                result[est] = doubly_robust(rows.rewards, rows.actions, p, None, reward_model,
                                            clip=clip, level=level, target_probs=pi)
        out[name] = result
    return out
