"""NDCG_Boost: boosting the expected NDCG of a ranking distribution — a RECONSTRUCTION.

docs/algorithms.md §6 marks this [recon]: the thesis chapter's exact formulas were
not available, so this is our reconstruction following its structure
(expected NDCG, Jensen bound, expected ranks from pairwise probabilities,
per-document weights, a binary weak learner per round). Within a query with
scores F, document j is ranked above i with probability
``P_ji = σ(2(F_j − F_i))``, so the expected rank is

    E[π(i)] = 1 + Σ_{j≠i} P_ji.

Since 1/log₂(1+x) is convex, Jensen gives E[1/log₂(1+π(i))] >= 1/log₂(1+E[π(i)]),
hence the expected NDCG is bounded below by

    G(F) = (1/Q) Σ_q (1/N_q) Σ_{i∈q} (2^{rel_i} − 1) / log₂(1 + E[π(i)]),

N_q the ideal DCG. Each round computes the per-document weights
ρ_k = ∂G/∂F_k = 2[a_k Σ_j S_kj − Σ_j S_kj a_j] (a_i = gain_i·|f′(E[π(i)])|/N_q,
S_kj = σ′(2(F_k − F_j))), fits the binary weak learner h = 1[x_j > θ]
maximising |Σ ρ h| (the thresholds of :class:`~streamlearn.rankers.rankboost.ThresholdBins`),
and sets its weight by a line search of G over a geometric grid of steps,
times ``learning_rate``. Cost: O(Σ_q n_q²) per round (pairs inside a query).

Sample weights count copies: a document of weight w is w identical documents
(E[π(i)] = ½ + Σ_j w_j P_ji, N_q with w positions per document), so a
weighted fit equals the fit on repeated rows.
"""

from __future__ import annotations

import numpy as np

from streamlearn.rankers.base import FitData, Ranker, as_matrix, check_float, check_int
from streamlearn.rankers.metrics import QueryGroups
from streamlearn.rankers.rankboost import ThresholdBins, staged_threshold_scores

__all__ = ["NDCGBoost", "expected_ndcg_bound"]

_STEPS = 2.0 ** np.arange(-5, 4)  # line-search grid of |α|
_LN2 = np.log(2.0)


def _ideal_dcg(gain: np.ndarray, w: np.ndarray) -> float:
    """DCG of the ideal order when document i fills w_i consecutive positions."""
    order = np.argsort(-gain, kind="stable")
    g, ww = gain[order], w[order]
    end = np.cumsum(ww)
    start = end - ww
    top = int(np.ceil(end[-1])) + 1
    cum = np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(1, top + 1) + 1.0))])
    grid = np.arange(top + 1, dtype=np.float64)
    return float(g @ (np.interp(end, grid, cum) - np.interp(start, grid, cum)))


class _Query:
    """One query's slice, gains, weights and ideal DCG."""

    __slots__ = ("gain", "norm", "rows", "w")

    def __init__(self, rows: slice, gain: np.ndarray, w: np.ndarray) -> None:
        self.rows, self.gain, self.w = rows, gain, w
        self.norm = _ideal_dcg(gain, w)

    def expected_ranks(self, F: np.ndarray) -> np.ndarray:
        """E[π(i)] for score vectors F of shape (..., n)."""
        diff = F[..., None, :] - F[..., :, None]  # [i, j] = F_j − F_i
        return np.asarray(0.5 + (0.5 * (1.0 + np.tanh(diff))) @ self.w)

    def value(self, F: np.ndarray) -> np.ndarray:
        E = self.expected_ranks(F)
        return np.asarray((self.w * self.gain / np.log2(1.0 + E)).sum(axis=-1) / self.norm)

    def gradient(self, F: np.ndarray) -> np.ndarray:
        E = self.expected_ranks(F)
        a = self.w * self.gain * _LN2 / ((1.0 + E) * np.log(1.0 + E) ** 2) / self.norm
        t = np.tanh(F[:, None] - F[None, :])
        S = 0.25 * (1.0 - t * t)  # σ′(2(F_k − F_j))
        return np.asarray(2.0 * (a * (S @ self.w) - self.w * (S @ a)))


def _queries(data: FitData) -> list[_Query]:
    groups: QueryGroups = data.groups
    gain = np.power(2.0, data.y) - 1.0
    out = []
    for start, size in zip(groups.starts.tolist(), groups.sizes.tolist(), strict=True):
        rows = slice(start, start + size)
        if size > 1 and gain[rows].max() > 0:  # queries with IDCG 0 contribute nothing
            out.append(_Query(rows, gain[rows], data.w[rows]))
    return out


def expected_ndcg_bound(F: np.ndarray, data: FitData) -> float:
    """G(F): the Jensen lower bound on expected NDCG, averaged over queries."""
    qs = _queries(data)
    return float(sum(float(q.value(F[q.rows])) for q in qs)) / max(data.groups.n_queries, 1)


class NDCGBoost(Ranker):
    """NDCG_Boost [recon]: thresholded-feature boosting of an expected-NDCG bound.

    Parameters
    ----------
    n_rounds : int
        Boosting rounds.
    learning_rate : float
        Shrinkage in (0, 1] applied to each line-searched step.
    max_bins : int
        Candidate thresholds per feature (as :class:`~streamlearn.rankers.rankboost.RankBoost`).

    Examples
    --------
    >>> from streamlearn.rankers.metrics import ndcg
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(size=(600, 4)); qid = np.repeat(np.arange(30), 20)
    >>> y = np.digitize(X[:, 0] + 0.5 * X[:, 2] + 0.3 * rng.normal(size=600), [0.9, 1.3])
    >>> model = NDCGBoost(n_rounds=20).fit(X[:400], y[:400], qid[:400])
    >>> bool(ndcg(y[400:], model.score(X[400:]), qid[400:]) > ndcg(y[400:], X[400:, 1], qid[400:]))
    True
    """

    requires_qid = True

    def __init__(self, n_rounds: int = 100, learning_rate: float = 1.0, max_bins: int = 256) -> None:
        self.n_rounds = check_int("NDCGBoost", "n_rounds", n_rounds)
        self.learning_rate = check_float("NDCGBoost", "learning_rate", learning_rate, 0.0, 1.0)
        self.max_bins = check_int("NDCGBoost", "max_bins", max_bins, low=2)

    def _fit(self, data: FitData) -> None:
        table = ThresholdBins.fit(data.X, data.w, self.max_bins)
        queries = _queries(data)
        Q = max(data.groups.n_queries, 1)
        F = np.zeros(len(data.y))
        current = sum(float(q.value(F[q.rows])) for q in queries) / Q
        features, thresholds, alphas, bound = [], [], [], []
        for _ in range(self.n_rounds):
            rho = np.zeros_like(F)
            for q in queries:
                rho[q.rows] = q.gradient(F[q.rows])
            j, b, corr = table.best(rho)
            if j < 0 or abs(corr) < 1e-15:
                break
            h = (table.bins[j] > b).astype(np.float64)
            steps = np.sign(corr) * _STEPS
            values = np.zeros(len(steps))
            for q in queries:
                hq = h[q.rows]
                values += q.value(F[q.rows] + steps[:, None] * hq) if np.ptp(hq) > 0 else (
                    q.value(F[q.rows]))
            values /= Q
            k = int(np.argmax(values))
            if not values[k] > current:
                break  # no step along the best weak learner raises the bound
            alpha = self.learning_rate * float(steps[k])
            F += alpha * h
            current = sum(float(q.value(F[q.rows])) for q in queries) / Q
            features.append(j)
            thresholds.append(float(table.thresholds[j][b]))
            alphas.append(alpha)
            bound.append(current)
        self.features_ = np.asarray(features, dtype=np.int64)
        self.thresholds_ = np.asarray(thresholds, dtype=np.float64)
        self.alphas_ = np.asarray(alphas, dtype=np.float64)
        self.train_bound_ = np.asarray(bound, dtype=np.float64)

    def _score(self, X: np.ndarray) -> np.ndarray:
        return (X[:, self.features_] > self.thresholds_).astype(np.float64) @ self.alphas_

    def staged_scores(self, X: object) -> np.ndarray:
        """(T, n) scores after each round 1..T."""
        arr = as_matrix(X, getattr(self, "n_features_in_", None))
        return staged_threshold_scores(arr, self.features_, self.thresholds_, self.alphas_)
