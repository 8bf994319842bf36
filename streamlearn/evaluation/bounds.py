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

The bet: :func:`lower_bound` mixes ``J`` gamblers with fixed fractions
``λ_j·m = c·2^{-j}`` (``c`` = :data:`TOP_FRACTION`) and averages their wealth (an average
of supermartingales is one), so no variance estimate or tuning is needed and the
mixture grows nearly as fast as the best fixed fraction in hindsight (it pays
``log J``). Values of ``m`` are a grid; the reported bound is the largest grid point
below which every point has been rejected, which is conservative by at most one grid
step.

What a policy earns *live* is another matter: its mean moves (a learner improves, the
world drifts), and a sequence for a constant mean, which rejects a value for good, would
hold on to an early value. The live checks use :class:`RunningMeanBound`, a sequence for
the running average of the conditional means.

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

__all__ = ["HEAVY_GAMBLERS", "Interval", "RunningMeanBound", "interval_of_mean", "lower_bound",
           "running_lower_bound", "value_interval"]

TOP_FRACTION = 0.8  # the boldest gambler bets λ·m = 0.8 (a Y of 0 keeps 20 % of its wealth)
HEAVY_GAMBLERS = 12  # fractions 0.8, 0.4, ..., 0.8 / 2^11 ≈ 0.0004: weights up to thousands
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


#: the fixed bet sizes of :class:`RunningMeanBound`: 0.9, 0.9/√2, ..., 0.9/2^9.5 ≈ 0.0012
RUNNING_LAMBDAS = 0.9 * 2.0 ** (-0.5 * np.arange(20))


def _psi(lam: np.ndarray) -> np.ndarray:
    """ψ_E(λ) = −log(1 − λ) − λ, the empirical-Bernstein exponent (λ in [0, 1))."""
    return np.asarray(-np.log1p(-lam) - lam)


def _squares_around_predictions(y: np.ndarray, n_before: int, total_before: float) -> float:
    """V's part of ``y``: Σ (Y_i − Ŷ_{i−1})² with the predictable centre
    Ŷ_{i−1} = min(1, (½ + Σ_{j<i} Y_j)/i) after ``n_before`` values summing to
    ``total_before``. The centre is at most 1, so Y_i − Ŷ_{i−1} ≥ −1 for any Y_i ≥ 0: the
    supermartingale of :class:`RunningMeanBound` holds for values unbounded above, as
    importance-weighted rewards are (for values in [0, 1] the clip never acts)."""
    before = total_before + np.concatenate([[0.0], np.cumsum(y)[:-1]])
    predicted = np.minimum(1.0, (0.5 + before) / (n_before + 1.0 + np.arange(len(y))))
    return float(((y - predicted) ** 2).sum())


def _running_radius(n: int, squares: float, alpha: float) -> float:
    """min_j (log(J/α) + ψ_E(λ_j)·V) / (λ_j·n): how far below Ȳ the running average of the
    conditional means can be, at ``alpha``."""
    lam = RUNNING_LAMBDAS
    return float(((math.log(len(lam) / alpha) + _psi(lam) * squares) / (lam * n)).min())


def running_lower_bound(values: np.ndarray, alpha: float) -> float:
    """A lower bound, at every look at once with probability ≥ 1 − ``alpha``, on the **running
    average of the conditional means** μ̄_t of nonnegative values (unbounded above:
    importance-weighted rewards) whose conditional means are at most 1 (a policy's value,
    whatever it does as the rows go on: a learner that improves, a world that drifts), read
    after the last value: the lower side of :class:`RunningMeanBound`.

    >>> w = np.where(np.random.default_rng(3).random(4000) < 0.1, 10.0, 0.0)  # mean ~1
    >>> y = w * 0.5  # a reward of 0.5 where the target acts: value ~0.5
    >>> 0.45 < running_lower_bound(y, 0.05) < float(y.mean())
    True
    """
    y = np.asarray(values, dtype=np.float64).reshape(-1)
    _check_values(y)
    if not len(y):
        return 0.0
    radius = _running_radius(len(y), _squares_around_predictions(y, 0, 0.0), _check_alpha(alpha))
    return max(0.0, float(y.mean()) - radius)


class RunningMeanBound:
    """A two-sided confidence sequence for the **running average of conditional means** of
    values in [0, 1] observed one after another — what a policy earns live, which changes
    as it learns or as the world drifts — kept up to date in O(1) state.

    With μ_i = E[Y_i | the past] (any sequence: a learner that improves, a world that
    drifts) and μ̄_t = (1/t)·Σ_{i≤t} μ_i, the target moves, so a bound for a constant
    mean does not apply: such a sequence rejects a value of the mean for good once it
    has been implausible *at some time*, and a learner that earned 0.2 early and 0.8
    now keeps an upper bound near 0.2. This one uses the predictable-mixture
    empirical-Bernstein supermartingale (Howard, Ramdas, McAuliffe & Sekhon,
    "Time-uniform, nonparametric, nonasymptotic confidence sequences", Ann. Statist.
    2021; Waudby-Smith & Ramdas 2024, §3): for a fixed λ in [0, 1),

        exp(λ·Σ_{i≤t}(Y_i − μ_i) − ψ_E(λ)·V_t),   V_t = Σ_{i≤t} (Y_i − Ŷ_{i−1})²,

    where ``Ŷ_{i−1} = (½ + Σ_{j<i} Y_j)/i`` is a predictable estimate, is a nonnegative
    supermartingale (exp(λξ − ψ_E(λ)ξ²) ≤ 1 + λξ for ξ ≥ −1, and 1 + x ≤ eˣ); this holds
    for *conditional* means μ_i, whatever they do. By Ville's inequality and a union
    over the J bet sizes of :data:`RUNNING_LAMBDAS` (each at α/J), with probability
    ≥ 1 − α, at every t at once,

        μ̄_t ≥ Ȳ_t − min_j (log(J/α) + ψ_E(λ_j)·V_t) / (λ_j·t),

    and the same on 1 − Y (the same V_t) for the upper side; each side at ``alpha``.
    The sides are not intersected over time: the target moves.

    >>> b = RunningMeanBound(0.025)
    >>> b.update((np.random.default_rng(0).random(4000) < 0.3).astype(float))
    >>> 0.25 < b.lower() < 0.3 < b.upper() < 0.35
    True
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = _check_alpha(alpha)
        self.n = 0
        self.total = 0.0
        self.squares = 0.0  # V_t

    def update(self, values: np.ndarray) -> None:
        """Observe the next values (in [0, 1]) in order, vectorised."""
        y = np.asarray(values, dtype=np.float64).reshape(-1)
        if not len(y):
            return
        if not np.isfinite(y).all() or y.min() < 0.0 or y.max() > 1.0:
            raise ConfigError(f"Expected finite values in [0, 1] for a live bound. Got a range "
                              f"[{np.nanmin(y)}, {np.nanmax(y)}] "
                              f"{'with a non-finite value' if not np.isfinite(y).all() else ''}"
                              .rstrip() + ".")
        self.squares += _squares_around_predictions(y, self.n, self.total)
        self.n += len(y)
        self.total += float(y.sum())

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan

    def _radius(self) -> float:
        return _running_radius(self.n, self.squares, self.alpha)

    def lower(self) -> float:
        """The lower bound on μ̄_t (0 before any value)."""
        return max(0.0, self.mean - self._radius()) if self.n else 0.0

    def upper(self) -> float:
        """The upper bound on μ̄_t (1 before any value)."""
        return min(1.0, self.mean + self._radius()) if self.n else 1.0

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """Plain numbers (a checkpoint's)."""
        return {"alpha": self.alpha, "n": self.n, "total": self.total, "squares": self.squares}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> RunningMeanBound:
        bound = cls(float(state["alpha"]))
        bound.n, bound.total, bound.squares = (int(state["n"]), float(state["total"]),
                                               float(state["squares"]))
        if bound.n < 0 or not 0.0 <= bound.total <= bound.n or bound.squares < 0.0:
            raise ConfigError(f"Expected a live bound's state with 0 <= total <= n and squares "
                              f">= 0. Got {state!r}.")
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
    """A confidence sequence (read at its end) for the **running average of the conditional
    means** of values in [0, 1] (:class:`RunningMeanBound`, each side at α/2): what a
    policy that was live earned over a window in which it learned or the world drifted.
    A sequence for one constant mean would reject every value once the mean has moved
    (its low end above its high end).

    >>> rewards = np.random.default_rng(2).permutation(np.r_[np.ones(300), np.zeros(700)])
    >>> iv = interval_of_mean(rewards, 0.05)
    >>> round(iv.mean, 2), 0.22 < iv.low < 0.3 < iv.high < 0.38
    (0.3, True)
    >>> drifting = np.r_[np.zeros(500), np.ones(500)]  # earned 0, then 1
    >>> iv = interval_of_mean(drifting, 0.05); iv.low < 0.5 < iv.high
    True
    """
    r = np.asarray(values, dtype=np.float64)
    if len(r) and (r.min() < 0 or r.max() > 1):
        raise ConfigError(f"Expected values in [0, 1]. Got a range [{r.min()}, {r.max()}].")
    bound = RunningMeanBound(_check_alpha(alpha) / 2)
    bound.update(r)
    return Interval(bound.lower(), bound.upper(), bound.mean, len(r))


def value_interval(rewards: np.ndarray, weights: np.ndarray, alpha: float) -> Interval:
    """A confidence sequence for the value of a policy over logged rows — the **running
    average of its conditional values** E[w_i·r_i | the past], which move when the policy
    learns along the rows (the logged learner's own greedy policy) or the world drifts —
    from rewards in [0, 1] and importance weights ``w = π(a|x)/p(a|x)`` (unclipped;
    ``E[w] = 1`` when the target never puts mass where the logger could not act). The lower
    side is :func:`running_lower_bound` on ``w·r``, the upper one minus it on ``w·(1 − r)``
    (conditional means ``1 − V_i``), each at α/2; ``mean`` is the IPS estimate. A
    sequence for one constant value (the betting one of :func:`lower_bound`, before) held
    on to early rows: an outside test saw the logged learner's interval wholly above its
    IPS value and the true one, about 3 standard errors."""
    alpha = _check_alpha(alpha)
    r = np.asarray(rewards, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    low = running_lower_bound(w * r, alpha / 2)
    high = 1.0 - running_lower_bound(w * (1.0 - r), alpha / 2) if len(r) else 1.0
    mean = float((w * r).mean()) if len(r) else math.nan
    return Interval(low, high, mean, len(r))
