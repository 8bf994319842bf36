"""Anytime-valid confidence sequences by betting, for off-policy values and live rewards.

The quantity behind every gate of the loop is the mean μ of **nonnegative** variables
``Y_i`` observed one after another: importance-weighted rewards ``w·r`` (the value of a
policy the logger did not run, with weights of any size), ``w·(1 − r)`` (its upper side),
``1 + r·(w − 1)`` (its advantage over the logger, paired row by row) or plain rewards in
[0, 1] (what a policy earns live). For such variables a lower bound needs no upper bound
on ``Y`` at all (Karampatziakis, Mineiro & Ramdas, "Off-policy confidence sequences",
ICML 2021; Waudby-Smith & Ramdas, "Estimating means of bounded random variables by
betting", JRSS-B 2024): for each candidate value ``m`` a gambler bets a fraction of her
wealth that the next ``Y`` exceeds ``m``,

    K_t(m) = Π_{i≤t} (1 + λ·(Y_i − m)),   0 ≤ λ·m < 1,

which, when μ ≤ m, is a nonnegative supermartingale with ``K_0 = 1``: by Ville's
inequality it ever reaches ``1/α`` with probability at most α. So the set of ``m`` whose
wealth has never reached ``1/α`` is a **confidence sequence**: it holds at every ``t``
simultaneously with probability ≥ 1 − α, however often it is looked at, whatever the
weights, and at any sample size (no normal approximation). Heavy weights only make the
bound slower to rise; they never make it wrong.

The bet: :class:`LowerBound` mixes ``J`` gamblers with fixed fractions
``λ_j·m = c·2^{-j}`` (``c`` = :data:`TOP_FRACTION`) and averages their wealth (an average
of supermartingales is one), so no variance estimate or tuning is needed and the
mixture grows nearly as fast as the best fixed fraction in hindsight (it pays
``log J``). Values of ``m`` are a grid; the reported bound is the largest grid point
below which every point has been rejected, which is conservative by at most one grid
step.

>>> rng = np.random.default_rng(0)
>>> r = (rng.random(4000) < 0.3).astype(float)       # a policy's rewards, logged ...
>>> w = np.where(rng.random(4000) < 0.5, 2.0, 0.0)   # ... half of them with weight 2
>>> 0.22 < lower_bound(w * r, alpha=0.05, high=1.0) < 0.3
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamlearn.errors import ConfigError

__all__ = ["HEAVY_GAMBLERS", "Interval", "LowerBound", "interval_of_mean", "lower_bound", "value_interval"]

TOP_FRACTION = 0.8  # the boldest gambler bets λ·m = 0.8 (a Y of 0 keeps 20 % of its wealth)
HEAVY_GAMBLERS = 12  # fractions 0.8, 0.4, ..., 0.8 / 2^11 ≈ 0.0004: weights up to thousands
BOUNDED_GAMBLERS = 8  # down to 0.8 / 2^7 ≈ 0.006: enough for values in [0, 1]
CHECK_EVERY = 8  # the mixture's wealth is compared with 1/α every this many values
_CHUNK_ELEMENTS = 1 << 20  # values × gamblers × rows per vectorised step (8 MiB of float64)


def _check_alpha(alpha: float) -> float:
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha < 1.0):
        raise ConfigError(f"Expected a miss probability alpha in (0, 1). Got {alpha!r}.")
    return float(alpha)


def _fractions(n_gamblers: int) -> np.ndarray:
    return TOP_FRACTION * 0.5 ** np.arange(n_gamblers)


def _check_values(y: np.ndarray) -> None:
    if len(y) and (not np.isfinite(y).all() or y.min() < 0):
        raise ConfigError("Expected finite values >= 0 for a betting bound. Got "
                          f"{'a non-finite value' if not np.isfinite(y).all() else y.min()}.")


def _bet(y: np.ndarray, m: np.ndarray, fractions: np.ndarray, log_wealth: np.ndarray,
         threshold: float, offset: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every gambler's wealth at every value ``m`` after the values ``y`` in order.

    ``log_wealth`` (M, J) is the wealth after the ``offset`` values seen before. The
    mixture's wealth is read after every :data:`CHECK_EVERY`-th value of the whole sequence
    and after the last of ``y`` (reading less often keeps the bound valid: Ville's
    inequality holds for any times one looks). Returns (the new log wealth, per value of
    ``m`` the index in ``y`` after which the mixture first reached ``threshold`` =
    log(J/α), or -1)."""
    lam = fractions[None, :] / np.maximum(m, 1e-12)[:, None]  # (M, J); at m = 0 any bet is safe
    first = np.full(len(m), -1, dtype=np.int64)
    step = max(CHECK_EVERY, (_CHUNK_ELEMENTS // max(lam.size, 1)) // CHECK_EVERY * CHECK_EVERY)
    for lo in range(0, len(y), step):
        chunk = y[lo:lo + step]
        path = log_wealth[:, :, None] + np.cumsum(
            np.log1p(lam[:, :, None] * (chunk[None, None, :] - m[:, None, None])), axis=2)
        looked = np.arange((CHECK_EVERY - 1 - offset - lo) % CHECK_EVERY, len(chunk), CHECK_EVERY)
        if lo + len(chunk) == len(y) and (not len(looked) or looked[-1] != len(chunk) - 1):
            looked = np.append(looked, len(chunk) - 1)
        if len(looked):
            at = path[:, :, looked]
            peak = at.max(axis=1)  # logsumexp over gamblers, per value and look
            mixed = peak + np.log(np.exp(at - peak[:, None, :]).sum(axis=1))
            hit = mixed >= threshold
            new = (first < 0) & hit.any(axis=1)
            first[new] = lo + looked[hit[new].argmax(axis=1)]
        log_wealth = path[:, :, -1]
    return log_wealth, first


def lower_bound(values: np.ndarray, alpha: float, high: float,
                n_gamblers: int = HEAVY_GAMBLERS, tolerance: float = 1e-4) -> float:
    """The confidence sequence's lower bound on the mean of ``values`` (≥ 0, in order), read
    after the last one, to within ``tolerance`` below; ``high`` bounds the search (a value
    the mean cannot exceed). Each gambler's wealth falls as ``m`` rises, so the rejected
    values are an interval [0, L) and bisection finds L.

    >>> rng = np.random.default_rng(1)
    >>> round(lower_bound(rng.random(10_000), 0.05, high=1.0), 2)  # mean 0.5
    0.49
    """
    alpha = _check_alpha(alpha)
    y = np.asarray(values, dtype=np.float64).reshape(-1)
    _check_values(y)
    if not len(y):
        return 0.0
    fractions = _fractions(n_gamblers)
    threshold = math.log(n_gamblers / alpha)

    def rejected(m: np.ndarray) -> np.ndarray:
        return _bet(y, m, fractions, np.zeros((len(m), n_gamblers)), threshold)[1] >= 0

    coarse = np.linspace(0.0, high, 17)
    hit = rejected(coarse)
    if hit.all():
        return float(high)
    first_open = int(np.flatnonzero(~hit)[0])
    if first_open == 0:
        return 0.0
    lo, hi = float(coarse[first_open - 1]), float(coarse[first_open])
    while hi - lo > tolerance:  # 8 values per pass: the bracket shrinks 9-fold each time
        inner = np.linspace(lo, hi, 10)[1:-1]
        hit = rejected(inner)
        below = np.flatnonzero(hit)
        lo = float(inner[below[-1]]) if len(below) else lo
        above = np.flatnonzero(~hit)
        hi = float(inner[above[0]]) if len(above) else hi
    return lo


def first_crossing(values: np.ndarray, alpha: float, m: float,
                   n_gamblers: int = HEAVY_GAMBLERS) -> int | None:
    """The index of the value after which the mean is first credibly above ``m`` (the
    mixture's wealth at ``m`` reached 1/α at a look), or None: the cheap form of a gate
    that only asks "above m or not". It agrees with :func:`lower_bound` ``≥ m`` whenever
    ``m`` is one of the values that function tries first (``k·high/16``).

    >>> first_crossing(np.full(100, 0.9), 0.05, 0.5) is not None, first_crossing(np.full(100, 0.4), 0.05, 0.5)
    (True, None)
    """
    alpha = _check_alpha(alpha)
    y = np.asarray(values, dtype=np.float64).reshape(-1)
    _check_values(y)
    _, first = _bet(y, np.array([float(m)]), _fractions(n_gamblers), np.zeros((1, n_gamblers)),
                    math.log(n_gamblers / alpha))
    return None if first[0] < 0 else int(first[0])


class LowerBound:
    """A lower confidence sequence kept up to date value by value (see the module doc): the
    state of every gambler at every value of a fixed grid, for the live checks.

    Parameters
    ----------
    grid
        Increasing candidate values of the mean, ``grid[0] ≥ 0``; the bound is one of them.
    alpha
        Miss probability: the bound exceeds the true mean at some time with probability ≤ α.
    n_gamblers
        Bet fractions 0.8·2⁻ʲ, j < n_gamblers.
    """

    def __init__(self, grid: np.ndarray, alpha: float, n_gamblers: int = BOUNDED_GAMBLERS) -> None:
        g = np.asarray(grid, dtype=np.float64)
        if g.ndim != 1 or len(g) < 2 or g[0] < 0 or not (np.diff(g) > 0).all():
            raise ConfigError(f"Expected an increasing grid of at least 2 values >= 0. Got {grid!r}.")
        self.grid = g
        self.alpha = _check_alpha(alpha)
        self._fractions = _fractions(n_gamblers)
        self.log_wealth = np.zeros((len(g), n_gamblers))
        self.rejected = np.zeros(len(g), dtype=bool)
        self.n = 0
        self.total = 0.0

    def update(self, values: np.ndarray) -> None:
        """Observe the next values in order (any number, vectorised)."""
        y = np.asarray(values, dtype=np.float64).reshape(-1)
        _check_values(y)
        if not len(y):
            return
        open_at = np.flatnonzero(~self.rejected)  # a rejected value stays rejected
        if len(open_at):
            wealth, first = _bet(y, self.grid[open_at], self._fractions,
                                 self.log_wealth[open_at],
                                 math.log(len(self._fractions) / self.alpha), self.n)
            self.log_wealth[open_at] = wealth
            self.rejected[open_at[first >= 0]] = True
        self.n += len(y)
        self.total += float(y.sum())

    def lower(self) -> float:
        """The largest grid value below which every value is rejected (``grid[0]`` if none)."""
        open_at = np.flatnonzero(~self.rejected)
        if not len(open_at):
            return float(self.grid[-1])
        first = int(open_at[0])
        return float(self.grid[first - 1]) if first > 0 else float(self.grid[0])

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """Plain arrays and numbers (a checkpoint's)."""
        return {"grid": self.grid.copy(), "alpha": self.alpha, "log_wealth": self.log_wealth.copy(),
                "rejected": self.rejected.copy(), "n": self.n, "total": self.total}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LowerBound:
        log_wealth = np.asarray(state["log_wealth"], dtype=np.float64)
        bound = cls(np.asarray(state["grid"]), float(state["alpha"]), log_wealth.shape[1])
        rejected = np.asarray(state["rejected"], dtype=bool)
        if log_wealth.shape != bound.log_wealth.shape or rejected.shape != bound.rejected.shape:
            raise ConfigError(f"Expected a bound state of shape {bound.log_wealth.shape}. "
                              f"Got {log_wealth.shape} and {rejected.shape}.")
        bound.log_wealth, bound.rejected = log_wealth, rejected
        bound.n, bound.total = int(state["n"]), float(state["total"])
        return bound


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence sequence's current interval and the mean it brackets."""

    low: float
    high: float
    mean: float
    n: int

    def as_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "mean": self.mean, "n": self.n}


def interval_of_mean(values: np.ndarray, alpha: float) -> Interval:
    """A confidence sequence (read at its end) for the mean of values in [0, 1], each side at α/2.

    >>> rewards = np.random.default_rng(2).permutation(np.r_[np.ones(300), np.zeros(700)])
    >>> iv = interval_of_mean(rewards, 0.05)
    >>> round(iv.mean, 2), 0.24 < iv.low < 0.3 < iv.high < 0.36
    (0.3, True)
    """
    r = np.asarray(values, dtype=np.float64)
    if len(r) and (r.min() < 0 or r.max() > 1):
        raise ConfigError(f"Expected values in [0, 1]. Got a range [{r.min()}, {r.max()}].")
    return value_interval(r, np.ones(len(r)), alpha, BOUNDED_GAMBLERS)


def value_interval(rewards: np.ndarray, weights: np.ndarray, alpha: float,
                   n_gamblers: int = HEAVY_GAMBLERS) -> Interval:
    """A confidence sequence for the value ``E[w·r]`` of a policy from logged rewards in [0, 1]
    and importance weights ``w = π(a|x)/p(a|x)`` (unclipped; ``E[w] = 1`` when the target
    never puts mass where the logger could not act). The lower side bets on ``w·r``, the
    upper on ``w·(1 − r)`` (mean ``1 − V``), each at α/2; ``mean`` is the IPS estimate."""
    alpha = _check_alpha(alpha)
    r = np.asarray(rewards, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    low = lower_bound(w * r, alpha / 2, 1.0, n_gamblers)
    high = 1.0 - lower_bound(w * (1.0 - r), alpha / 2, 1.0, n_gamblers)
    mean = float((w * r).mean()) if len(r) else math.nan
    return Interval(low, high, mean, len(r))
