"""RankBoost with thresholded-feature weak rankers, never enumerating pairs.

Freund, Iyer, Schapire & Singer (2003). Crucial pairs (x₀ ranked below x₁)
are all pairs inside one query whose grades differ (without ``qid``: all
pairs of different grade; binary labels without ``qid`` is RankBoost.B).
D₁ is uniform over crucial pairs, weighted by ``w(x₀)·w(x₁)``; after t rounds
D(x₀, x₁) ∝ w₀w₁·exp(H(x₀) − H(x₁)), H = Σ α h. This factorises as
v_low(x₀)·v_high(x₁) with v_low = w·e^{H}, v_high = w·e^{−H}, so

    r(h) = Σ_pairs D(x₀,x₁)(h(x₁) − h(x₀)) = Σ_x π(x) h(x),
    π(x) = [v_high(x)·L(x) − v_low(x)·U(x)] / Z,

where L(x) sums v_low over lower grades and U(x) v_high over higher grades of
x's query (per-query per-grade prefix sums) and Z = Σ v_high·L: O(n) per round.
For binary labels this is r = weighted TPR − weighted FPR of the threshold.

Weak rankers are ``h(x) = 1[x_j > θ]``; a reversed sign is the same
threshold with a negative α (Σπ = 0 per query, so r(1−h) = −r(h) and the
constant shift does not change a ranking). Candidate thresholds: all distinct
values of a feature if there are at most ``max_bins``, else cuts at weighted
quantiles; rows are binned once, and each round costs one ``bincount`` per
feature, O(d·n). α = ½ ln((1+r)/(1−r)) (the paper's choice for weak rankers
with values in [0, 1], minimising its bound on Z), |r| capped at 1 − 1e-9.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from streamlearn.rankers.base import FitData, Ranker, as_matrix, check_int
from streamlearn.rankers.metrics import QueryGroups

__all__ = ["RankBoost", "ThresholdBins", "pair_potential", "staged_threshold_scores"]

_R_CAP = 1.0 - 1e-9


@dataclass(frozen=True)
class ThresholdBins:
    """Per-feature candidate thresholds and every row's bin.

    ``bins[j, i]`` = number of thresholds of feature j strictly below ``X[i, j]``,
    so ``X[i, j] > thresholds[j][b]`` ⇔ ``bins[j, i] > b``.
    """

    thresholds: list[np.ndarray]
    bins: np.ndarray  # (d, n), the smallest unsigned dtype that holds max_bins

    @classmethod
    def fit(cls, X: np.ndarray, w: np.ndarray, max_bins: int) -> ThresholdBins:
        n, d = X.shape
        thresholds: list[np.ndarray] = []
        dtype = np.uint8 if max_bins <= 256 else np.uint16 if max_bins <= 65536 else np.int64
        bins = np.empty((d, n), dtype=dtype)
        unit = bool(np.all(w == 1.0))
        columns = np.ascontiguousarray(X.T)
        for j in range(d):  # once per feature: one sort, O(n log n)
            col = columns[j]
            if unit:  # counts are the weights; no inverse permutation needed
                values, mass = np.unique(col, return_counts=True)
            else:
                values, inverse = np.unique(col, return_inverse=True)
                mass = np.bincount(inverse, w, len(values))
            if len(values) <= max_bins:
                cuts = values[:-1]
            else:
                frac = np.cumsum(mass) / float(np.sum(mass))
                at = np.searchsorted(frac, np.arange(1, max_bins) / max_bins, side="left")
                cuts = values[np.unique(np.minimum(at, len(values) - 2))]
            bins[j] = np.searchsorted(cuts, col, side="left")
            thresholds.append(cuts)
        return cls(thresholds, bins)

    def above_sums(self, j: int, values: np.ndarray) -> np.ndarray:
        """``Σ values[x]`` over rows with ``X[:, j] > thresholds[j][b]``, for every b."""
        n_cuts = len(self.thresholds[j])
        per_bin = np.bincount(self.bins[j], values, n_cuts + 1)
        return np.cumsum(per_bin[::-1])[::-1][1:]

    def best(self, values: np.ndarray) -> tuple[int, int, float]:
        """The (feature, threshold index, Σ values·h) with the largest |Σ values·h|."""
        best = (-1, -1, 0.0)
        for j in range(len(self.thresholds)):
            if len(self.thresholds[j]) == 0:
                continue
            sums = self.above_sums(j, values)
            b = int(np.argmax(np.abs(sums)))
            if abs(sums[b]) > abs(best[2]):
                best = (j, b, float(sums[b]))
        return best


def staged_threshold_scores(
    X: np.ndarray, features: np.ndarray, thresholds: np.ndarray, alphas: np.ndarray
) -> np.ndarray:
    """(T, n) scores Σ_{s<=t} α_s·1[x_{j_s} > θ_s] after each round t of a threshold ensemble."""
    fired = X[:, features] > thresholds
    return np.cumsum(fired.T * alphas[:, None], axis=0)


def _grade_levels(y: np.ndarray) -> tuple[np.ndarray, int]:
    levels, index = np.unique(y, return_inverse=True)
    return index, len(levels)


def pair_potential(
    H: np.ndarray, level: np.ndarray, n_levels: int, groups: QueryGroups, w: np.ndarray
) -> np.ndarray:
    """π(x) with Σ_x π(x)h(x) = Σ_pairs D(x₀,x₁)(h(x₁) − h(x₀)), D ∝ w₀w₁e^{H₀−H₁}."""
    Q = groups.n_queries
    qi = groups.index
    hmax = np.maximum.reduceat(H, groups.starts) if Q else H[:0]
    hmin = np.minimum.reduceat(H, groups.starts) if Q else H[:0]
    Hs = H - (0.5 * (hmax + hmin))[qi]  # per-query shift: pairs are inside a query
    v_low, v_high = w * np.exp(Hs), w * np.exp(-Hs)
    cell = qi * n_levels + level
    low = np.bincount(cell, v_low, Q * n_levels).reshape(Q, n_levels)
    high = np.bincount(cell, v_high, Q * n_levels).reshape(Q, n_levels)
    below = (np.cumsum(low, axis=1) - low).ravel()[cell]  # v_low of lower grades
    above = (np.cumsum(high[:, ::-1], axis=1)[:, ::-1] - high).ravel()[cell]
    Z = float(np.dot(v_high, below))
    if Z <= 0:
        return np.zeros_like(H)
    return np.asarray((v_high * below - v_low * above) / Z)


class RankBoost(Ranker):
    """RankBoost / RankBoost.B with thresholded-feature weak rankers.

    Parameters
    ----------
    n_rounds : int
        Boosting rounds (weak rankers); fewer if no threshold has r ≠ 0.
    max_bins : int
        Candidate thresholds per feature: every distinct value when a feature
        has at most this many, else this many weighted-quantile cuts.

    Examples
    --------
    >>> from streamlearn.rankers.metrics import auc
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(300, 4)); y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    >>> model = RankBoost(n_rounds=30).fit(X[:200], y[:200])
    >>> round(auc(y[200:], model.score(X[200:])), 2)
    0.99
    """

    def __init__(self, n_rounds: int = 100, max_bins: int = 256) -> None:
        self.n_rounds = check_int("RankBoost", "n_rounds", n_rounds)
        self.max_bins = check_int("RankBoost", "max_bins", max_bins, low=2)

    def _fit(self, data: FitData) -> None:
        X, w, groups = data.X, data.w, data.groups
        level, n_levels = _grade_levels(data.y)
        started, started_cpu = time.perf_counter(), time.process_time()
        table = ThresholdBins.fit(X, w, self.max_bins)
        binned, binned_cpu = time.perf_counter(), time.process_time()
        H = np.zeros(len(w))
        features, thresholds, alphas, rs = [], [], [], []
        for _ in range(self.n_rounds):
            pi = pair_potential(H, level, n_levels, groups, w)
            j, b, r = table.best(pi)
            if j < 0 or abs(r) < 1e-12:
                break  # no weak ranker orders any remaining pair weight
            rc = float(np.clip(r, -_R_CAP, _R_CAP))
            alpha = 0.5 * np.log((1.0 + rc) / (1.0 - rc))
            H += alpha * (table.bins[j] > b)
            features.append(j)
            thresholds.append(float(table.thresholds[j][b]))
            alphas.append(alpha)
            rs.append(r)
        self.features_ = np.asarray(features, dtype=np.int64)
        self.thresholds_ = np.asarray(thresholds, dtype=np.float64)
        self.alphas_ = np.asarray(alphas, dtype=np.float64)
        self.r_ = np.asarray(rs, dtype=np.float64)
        self.timings_ = {  # wall and process-CPU seconds of the one-off binning and the rounds
            "binning_s": binned - started, "rounds_s": time.perf_counter() - binned,
            "binning_cpu_s": binned_cpu - started_cpu,
            "rounds_cpu_s": time.process_time() - binned_cpu,
        }

    def _score(self, X: np.ndarray) -> np.ndarray:
        fired = X[:, self.features_] > self.thresholds_
        return fired.astype(np.float64) @ self.alphas_

    def staged_scores(self, X: object) -> np.ndarray:
        """(T, n) scores after each round 1..T (for choosing T on validation data)."""
        arr = as_matrix(X, getattr(self, "n_features_in_", None))
        return staged_threshold_scores(arr, self.features_, self.thresholds_, self.alphas_)
