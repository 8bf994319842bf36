"""Ranking metrics: AUC, ROC curve, NDCG@k, AP/MAP, P@k — vectorised per query.

Conventions (documented in ``docs/rankers.md`` §Metrics):

* **Queries.** ``qid`` gives each row's query; each query's rows must be
  contiguous (LETOR files are; a sorted ``qid`` array always is). Per-query
  values are returned in order of first appearance. Means are unweighted over
  queries.
* **Ties.** Within a query, documents are ordered by score descending and
  equal scores keep their original row order — exactly what LETOR 3.0's
  ``Eval-Score-3.0.pl`` does (it sorts by line number, then stably by score).
  AUC instead counts a tied positive/negative pair as ½ (rank-sum, midranks).
* **Gain and discount.** NDCG uses gain ``2**rel - 1``. ``discount="burges"``
  (default, docs/algorithms.md §6, ranx's ``ndcg_burges``) is ``1/log2(1 + rank)``;
  ``discount="letor"`` is the discount of ``Eval-Score-3.0.pl``: ranks 1 and 2
  get 1, rank r >= 3 gets ``1/log2(r)``. The LETOR protocol reports the latter
  so that figures compare with the published baselines.
* **No relevant document.** A query whose ideal DCG is 0 scores NDCG 0, and a
  query with no relevant document scores AP 0 (both as ``Eval-Score-3.0.pl``).
* **Short queries.** NDCG@k of a query with fewer than k documents is its
  NDCG over all its documents; P@k always divides by k.

Examples
--------
>>> import numpy as np
>>> y = np.array([0, 1, 1, 0, 2, 0]); s = np.array([0.1, 0.9, 0.3, 0.3, 0.8, 0.2])
>>> q = np.array([1, 1, 1, 2, 2, 2])
>>> round(auc(y, s), 4)
0.9444
>>> np.round(ndcg(y, s, q, k=2, per_query=True), 4).tolist()
[1.0, 1.0]
>>> round(mean_average_precision(y, s, q), 4)
1.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from streamlearn.errors import DataError

__all__ = [
    "QueryGroups",
    "auc",
    "average_precision",
    "evaluate",
    "mean_average_precision",
    "ndcg",
    "ndcg_curve",
    "precision_at_k",
    "query_groups",
    "rank_order",
    "roc_curve",
]

Discount = Literal["burges", "letor"]


class QueryGroups:
    """Contiguous query groups of ``n`` rows.

    Attributes: ``starts`` (first row of each query), ``sizes``, ``index``
    (the query number 0..Q-1 of each row), ``ids`` (the qid value of each query).
    """

    __slots__ = ("ids", "index", "n_queries", "sizes", "starts")

    def __init__(self, qid: object, n: int) -> None:
        q = np.asarray(qid).reshape(-1) if qid is not None else np.zeros(n, dtype=np.int64)
        if q.shape[0] != n:
            raise DataError(f"Expected {n} qid values (one per row). Got {q.shape[0]} instead.")
        change = np.ones(n, dtype=bool)
        if n:
            change[1:] = q[1:] != q[:-1]
        self.starts = np.flatnonzero(change)
        self.n_queries = len(self.starts)
        if n and len(np.unique(q)) != self.n_queries:
            raise DataError(
                "Each query's rows must be contiguous (e.g. qid sorted). "
                f"Got {len(np.unique(q))} distinct qids in {self.n_queries} runs instead."
            )
        self.sizes = np.diff(np.append(self.starts, n))
        self.index = np.cumsum(change) - 1
        self.ids = q[self.starts] if n else q[:0]

    def positions(self) -> np.ndarray:
        """0-based position of each row inside its query (in row order)."""
        return np.asarray(np.arange(len(self.index)) - self.starts[self.index])

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Per-query sums of a per-row array (``np.add.reduceat``)."""
        if self.n_queries == 0:
            return np.zeros(0)
        return np.add.reduceat(np.asarray(values, dtype=np.float64), self.starts)


def query_groups(qid: object, n: int) -> QueryGroups:
    """The :class:`QueryGroups` of a qid array (``None``: one query of n rows)."""
    return QueryGroups(qid, n)


def _as_1d(name: str, a: object, n: int | None = None) -> np.ndarray:
    arr = np.asarray(a, dtype=np.float64).reshape(-1)
    if n is not None and arr.shape[0] != n:
        raise DataError(f"Expected {name} of length {n}. Got length {arr.shape[0]} instead.")
    if not np.isfinite(arr).all():
        raise DataError(f"{name} must be finite. Got NaN or inf.")
    return arr


def rank_order(y_score: object, groups: QueryGroups) -> np.ndarray:
    """Row permutation: queries in order, each by score descending, ties by row order."""
    s = _as_1d("y_score", y_score, len(groups.index))
    return np.lexsort((np.arange(len(s)), -s, groups.index))


# ---------------------------------------------------------------------- AUC / ROC
def auc(y_true: object, y_score: object, sample_weight: object = None) -> float | np.ndarray:
    """Area under the ROC curve by the weighted rank sum, ties counting ½.

    ``y_true`` > 0 is positive. ``y_score`` is ``(n,)`` (returns a float) or
    ``(m, n)`` — m scorings of the same examples, e.g. a population — (returns
    m AUCs). O(m·n log n). Raises :class:`DataError` without both classes.
    """
    y = _as_1d("y_true", y_true) > 0
    n = len(y)
    S = np.asarray(y_score, dtype=np.float64)
    one = S.ndim == 1
    S = S.reshape(1, -1) if one else S
    if S.ndim != 2 or S.shape[1] != n:
        raise DataError(f"Expected y_score of shape ({n},) or (m, {n}). Got {S.shape} instead.")
    if not np.isfinite(S).all():
        raise DataError("y_score must be finite. Got NaN or inf.")
    w = np.ones(n) if sample_weight is None else _as_1d("sample_weight", sample_weight, n)
    w_pos, w_neg = float(w[y].sum()), float(w[~y].sum())
    if w_pos <= 0 or w_neg <= 0:
        raise DataError(
            "AUC needs positive weight on both classes. "
            f"Got positive weight {w_pos} and negative weight {w_neg}."
        )
    m = S.shape[0]
    order = np.argsort(S, axis=1, kind="stable")
    ss = np.take_along_axis(S, order, axis=1)
    pos_w = np.where(y, w, 0.0)[order]
    neg_w = np.where(y, 0.0, w)[order]
    new = np.ones(ss.shape, dtype=bool)
    new[:, 1:] = ss[:, 1:] != ss[:, :-1]
    flat_new = new.ravel()
    gid = np.cumsum(flat_new) - 1
    first = np.flatnonzero(flat_new)
    neg_g = np.bincount(gid, neg_w.ravel(), len(first))
    pos_g = np.bincount(gid, pos_w.ravel(), len(first))
    neg_below = (np.cumsum(neg_w, axis=1) - neg_w).ravel()[first]
    contrib = pos_g * (neg_below + 0.5 * neg_g)
    # a rank sum over weights rounds: 1 + 3e-14 was reported as a ranker's AUC
    out = np.clip(np.bincount(first // n, contrib, m) / (w_pos * w_neg), 0.0, 1.0)
    return float(out[0]) if one else out


def roc_curve(
    y_true: object, y_score: object, sample_weight: object = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC points ``(fpr, tpr, thresholds)``, thresholds descending from +inf.

    Point i classifies ``score >= thresholds[i]`` as positive; one point per
    distinct score, so ``np.trapz(tpr, fpr)`` equals :func:`auc`.
    """
    y = _as_1d("y_true", y_true) > 0
    s = _as_1d("y_score", y_score, len(y))
    w = np.ones(len(y)) if sample_weight is None else _as_1d("sample_weight", sample_weight, len(y))
    order = np.argsort(-s, kind="stable")
    ss, ys, ws = s[order], y[order], w[order]
    last = np.flatnonzero(np.append(ss[1:] != ss[:-1], True))
    tp = np.cumsum(np.where(ys, ws, 0.0))[last]
    fp = np.cumsum(np.where(ys, 0.0, ws))[last]
    if tp[-1] <= 0 or fp[-1] <= 0:
        raise DataError("A ROC curve needs positive weight on both classes.")
    tpr = np.concatenate([[0.0], tp / tp[-1]])
    fpr = np.concatenate([[0.0], fp / fp[-1]])
    return fpr, tpr, np.concatenate([[np.inf], ss[last]])


# ---------------------------------------------------------------------- per query
def _discounts(pos: np.ndarray, discount: Discount) -> np.ndarray:
    if discount == "burges":
        return 1.0 / np.log2(pos + 2.0)
    if discount == "letor":
        return 1.0 / np.log2(np.maximum(pos + 1.0, 2.0))
    raise DataError(f"discount must be 'burges' or 'letor'. Got {discount!r} instead.")


def _cumulative_dcg(
    rel_sorted: np.ndarray, groups: QueryGroups, max_k: int, discount: Discount
) -> np.ndarray:
    """(Q, max_k) cumulative DCG at ranks 1..max_k of rows already ranked per query."""
    pos = groups.positions()
    keep = pos < max_k
    table = np.zeros((groups.n_queries, max_k))
    gain = np.power(2.0, rel_sorted[keep]) - 1.0
    table[groups.index[keep], pos[keep]] = gain * _discounts(pos[keep], discount)
    return np.cumsum(table, axis=1)


def ndcg_curve(
    y_rel: object, y_score: object, qid: object, max_k: int = 10,
    discount: Discount = "burges",
) -> np.ndarray:
    """Per-query NDCG@1..max_k as a ``(n_queries, max_k)`` array (0 where IDCG = 0)."""
    rel = _as_1d("y_rel", y_rel)
    if max_k < 1:
        raise DataError(f"k must be an int >= 1. Got {max_k} instead.")
    groups = query_groups(qid, len(rel))
    order = rank_order(y_score, groups)
    ideal = np.lexsort((-rel, groups.index))
    dcg = _cumulative_dcg(rel[order], groups, max_k, discount)
    idcg = _cumulative_dcg(rel[ideal], groups, max_k, discount)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(idcg > 0, dcg / np.where(idcg > 0, idcg, 1.0), 0.0)


def ndcg(
    y_rel: object, y_score: object, qid: object = None, k: int | None = 10,
    discount: Discount = "burges", per_query: bool = False,
) -> float | np.ndarray:
    """NDCG@k (``k=None``: over whole lists), mean over queries or ``per_query``."""
    rel = _as_1d("y_rel", y_rel)
    groups = query_groups(qid, len(rel))
    kk = int(groups.sizes.max()) if k is None and len(rel) else (k or 1)
    values = ndcg_curve(rel, y_score, qid, kk, discount)[:, kk - 1]
    return values if per_query else float(values.mean())


def average_precision(y_rel: object, y_score: object, qid: object = None) -> np.ndarray:
    """Per-query non-interpolated AP, binary relevance ``rel > 0`` (0 with no relevant)."""
    rel = _as_1d("y_rel", y_rel) > 0
    groups = query_groups(qid, len(rel))
    hits = rel[rank_order(y_score, groups)].astype(np.float64)
    cum_hits = np.cumsum(hits)
    before = cum_hits[groups.starts] - hits[groups.starts]  # hits of earlier queries
    prec = (cum_hits - before[groups.index]) / (groups.positions() + 1.0)
    n_rel = groups.sums(hits)
    total = groups.sums(prec * hits)
    return np.where(n_rel > 0, total / np.maximum(n_rel, 1.0), 0.0)


def mean_average_precision(y_rel: object, y_score: object, qid: object = None) -> float:
    """MAP: the mean over queries of :func:`average_precision`."""
    return float(average_precision(y_rel, y_score, qid).mean())


def precision_at_k(
    y_rel: object, y_score: object, qid: object = None, k: int = 10, per_query: bool = False
) -> float | np.ndarray:
    """P@k: relevant (``rel > 0``) documents among the top k, divided by k."""
    rel = _as_1d("y_rel", y_rel) > 0
    if k < 1:
        raise DataError(f"k must be an int >= 1. Got {k} instead.")
    groups = query_groups(qid, len(rel))
    hits = rel[rank_order(y_score, groups)] & (groups.positions() < k)
    values = groups.sums(hits) / k
    return values if per_query else float(values.mean())


def evaluate(
    y_rel: object, y_score: object, qid: object, ks: Sequence[int] = (1, 3, 5, 10),
    discount: Discount = "letor",
) -> dict[str, float]:
    """Mean NDCG@k and P@k for each k in ``ks`` and MAP (keys ``NDCG@k``, ``P@k``, ``MAP``)."""
    max_k = max(ks)
    curve = ndcg_curve(y_rel, y_score, qid, max_k, discount).mean(axis=0)
    out = {f"NDCG@{k}": float(curve[k - 1]) for k in ks}
    out.update({f"P@{k}": float(precision_at_k(y_rel, y_score, qid, k)) for k in ks})
    out["MAP"] = mean_average_precision(y_rel, y_score, qid)
    return out
