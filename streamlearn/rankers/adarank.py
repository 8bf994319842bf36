"""AdaRank (Xu & Li, SIGIR 2007): boosting a query-level IR measure.

Weak rankers are single features (rank a query's documents by ``x_j``). Each
round picks the feature maximising Σ_q P(q)·E(q, x_j) — E is MAP's AP or
NDCG@k per query, precomputed once per feature — sets
α = ½ ln(Σ P(1+E) / Σ P(1−E)), adds α·x_j to the combined ranker f and
re-weights queries by P(q) ∝ u(q)·exp(−E(q, f)) (E of the *combined* ranker).

Guards against stagnation (our addition, in the spirit of RankLib's AdaRank
tolerance): the feature picked in the previous round is not eligible (a repeat
only rescales it), and a round that does not raise the u-weighted training
measure is undone and its feature excluded until some other feature is
accepted — without this, AdaRank on OHSUMED cycles between two near-collinear
features forever. Training stops when no eligible feature has Σ P·E > 0.

Sample weights become query weights: u(q) = mean of q's documents' weights
(document weights inside a query cannot change a query-level measure).
Weight 2 on every document of a query therefore equals repeating the query.
"""

from __future__ import annotations

import numpy as np

from streamlearn.rankers.base import FitData, Ranker, as_matrix, check_choice, check_int
from streamlearn.rankers.metrics import QueryGroups, average_precision, ndcg

__all__ = ["AdaRank", "query_measure"]


def query_measure(
    y: np.ndarray, score: np.ndarray, groups: QueryGroups, measure: str, k: int
) -> np.ndarray:
    """Per-query AP (``measure="map"``) or NDCG@k (``"ndcg"``) of ranking by ``score``."""
    if measure == "map":
        return average_precision(y, score, groups.index)
    return np.asarray(ndcg(y, score, groups.index, k=k, per_query=True))


class AdaRank(Ranker):
    """AdaRank-MAP / AdaRank-NDCG over single-feature weak rankers.

    Parameters
    ----------
    n_rounds : int
        Maximum boosting rounds.
    measure : {"ndcg", "map"}
        The query-level measure E that is boosted.
    k : int
        Cut-off of NDCG@k when ``measure="ndcg"``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> X = rng.uniform(size=(400, 5)); qid = np.repeat(np.arange(20), 20)
    >>> y = (X[:, 1] + 0.3 * X[:, 3] + 0.2 * rng.normal(size=400) > 0.9).astype(int)
    >>> model = AdaRank(n_rounds=20).fit(X, y, qid)
    >>> int(model.features_[0])
    1
    """

    requires_qid = True

    def __init__(self, n_rounds: int = 100, measure: str = "ndcg", k: int = 10) -> None:
        self.n_rounds = check_int("AdaRank", "n_rounds", n_rounds)
        self.measure = check_choice("AdaRank", "measure", measure, ("ndcg", "map"))
        self.k = check_int("AdaRank", "k", k)

    def _fit(self, data: FitData) -> None:
        X, y, groups = data.X, data.y, data.groups
        u = groups.sums(data.w) / groups.sizes
        E0 = np.column_stack(
            [query_measure(y, X[:, j], groups, self.measure, self.k) for j in range(X.shape[1])]
        )  # (Q, d), once
        P = u / u.sum()
        F = np.zeros(len(y))
        features: list[int] = []
        alphas: list[float] = []
        train: list[float] = []
        # F = 0 ties every document, and ties break by row order: measuring it would credit
        # the rows' given order (a logged slate's) to the empty model, and the guard below
        # would then refuse every first round that does not beat that order
        current = -np.inf
        # a feature that never varies inside a query ranks nothing: its measure would be the
        # rows' given order (ties break by row order), a logged slate's on the daemon's logs
        starts = groups.starts
        varies = np.zeros(X.shape[1], dtype=bool)
        if len(starts):
            spread = np.maximum.reduceat(X, starts, axis=0) - np.minimum.reduceat(X, starts, axis=0)
            varies = np.asarray((spread > 0).any(axis=0), dtype=bool)
        eligible = varies.copy()
        while len(features) < self.n_rounds:
            gain = np.where(eligible, P @ E0, -np.inf)
            j = int(np.argmax(gain))
            if not gain[j] > 0:
                break  # every feature is excluded or useless
            e = E0[:, j]
            alpha = 0.5 * np.log(float(P @ (1.0 + e)) / max(float(P @ (1.0 - e)), 1e-12))
            F_next = F + alpha * X[:, j]
            E = query_measure(y, F_next, groups, self.measure, self.k)
            value = float(u @ E / u.sum())
            if not value > current + 1e-12:
                eligible[j] = False  # stagnation guard: this feature does not help now
                continue
            F, current = F_next, value
            P = u * np.exp(-E)
            P /= P.sum()
            features.append(j)
            alphas.append(alpha)
            train.append(value)
            eligible[:] = varies
            eligible[j] = False  # never the same feature twice in a row
        self.features_ = np.asarray(features, dtype=np.int64)
        self.alphas_ = np.asarray(alphas, dtype=np.float64)
        self.train_measure_ = np.asarray(train, dtype=np.float64)
        self.coef_ = np.bincount(self.features_, self.alphas_, X.shape[1])

    def _score(self, X: np.ndarray) -> np.ndarray:
        return X @ self.coef_

    def staged_scores(self, X: object) -> np.ndarray:
        """(T, n) scores of the combined ranker after each round 1..T."""
        arr = as_matrix(X, getattr(self, "n_features_in_", None))
        return np.cumsum(arr[:, self.features_].T * self.alphas_[:, None], axis=0)
