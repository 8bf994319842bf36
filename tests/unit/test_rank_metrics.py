"""Ranking metrics against brute-force definitions (with ties) and against ranx."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamlearn.errors import DataError
from streamlearn.rankers import metrics

# ------------------------------------------------------------------ brute force


def brute_auc(y: np.ndarray, s: np.ndarray, w: np.ndarray) -> float:
    num = den = 0.0
    for i in range(len(y)):
        for j in range(len(y)):
            if y[i] > 0 and y[j] <= 0:
                den += w[i] * w[j]
                num += w[i] * w[j] * (1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0)
    return num / den


def ranked(rel: list[float], score: list[float]) -> list[float]:
    # score descending, ties keep original order (Python's sort is stable)
    idx = sorted(range(len(rel)), key=lambda i: -score[i])
    return [rel[i] for i in idx]


def brute_ndcg(rel: list[float], score: list[float], k: int, discount: str) -> float:
    def dcg(rs: list[float]) -> float:
        total = 0.0
        for r, g in enumerate(rs[:k], start=1):
            d = 1 / math.log2(1 + r) if discount == "burges" else 1 / math.log2(max(r, 2))
            total += (2**g - 1) * d
        return total

    ideal = dcg(sorted(rel, reverse=True))
    return dcg(ranked(rel, score)) / ideal if ideal > 0 else 0.0


def brute_ap(rel: list[float], score: list[float]) -> float:
    rs = ranked(rel, score)
    hits, total = 0, 0.0
    for i, r in enumerate(rs, start=1):
        if r > 0:
            hits += 1
            total += hits / i
    return total / hits if hits else 0.0


def brute_pk(rel: list[float], score: list[float], k: int) -> float:
    return sum(1 for r in ranked(rel, score)[:k] if r > 0) / k


def random_queries(rng: np.random.Generator, n_queries: int = 25):
    sizes = rng.integers(1, 15, size=n_queries)
    qid = np.repeat(np.arange(n_queries) * 3 + 7, sizes)
    rel = rng.integers(0, 3, size=len(qid)).astype(float)
    score = rng.integers(0, 4, size=len(qid)).astype(float)  # many ties
    return qid, rel, score


def per_query(qid: np.ndarray, *arrays: np.ndarray):
    for q in dict.fromkeys(qid.tolist()):
        m = qid == q
        yield tuple(a[m].tolist() for a in arrays)


# ------------------------------------------------------------------------ tests


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_brute_force_with_ties_and_weights(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 60
    y = rng.integers(0, 2, size=n)
    y[:2] = [0, 1]
    s = rng.integers(0, 6, size=n).astype(float)
    w = rng.uniform(0.1, 3.0, size=n)
    assert metrics.auc(y, s, w) == pytest.approx(brute_auc(y, s, w), abs=1e-12)
    assert metrics.auc(y, s) == pytest.approx(brute_auc(y, s, np.ones(n)), abs=1e-12)


def test_auc_population_rows_match_single_calls() -> None:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, size=40)
    S = rng.integers(0, 5, size=(7, 40)).astype(float)
    w = rng.uniform(0.5, 2, size=40)
    many = metrics.auc(y, S, w)
    assert isinstance(many, np.ndarray)
    np.testing.assert_allclose(many, [float(metrics.auc(y, row, w)) for row in S], atol=1e-12)


def test_auc_needs_both_classes() -> None:
    with pytest.raises(DataError, match="both classes"):
        metrics.auc([1, 1, 1], [0.1, 0.2, 0.3])


def test_roc_curve_area_equals_auc() -> None:
    rng = np.random.default_rng(4)
    y = rng.integers(0, 2, size=80)
    s = rng.integers(0, 10, size=80).astype(float)
    w = rng.uniform(0.2, 2, size=80)
    fpr, tpr, thr = metrics.roc_curve(y, s, w)
    assert fpr[0] == tpr[0] == 0.0 and fpr[-1] == tpr[-1] == 1.0
    assert np.all(np.diff(thr) < 0)
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    assert area == pytest.approx(metrics.auc(y, s, w), abs=1e-12)


@pytest.mark.parametrize("discount", ["burges", "letor"])
@pytest.mark.parametrize("seed", range(3))
def test_query_metrics_match_brute_force_with_ties(seed: int, discount: str) -> None:
    rng = np.random.default_rng(seed)
    qid, rel, score = random_queries(rng)
    for k in (1, 3, 5, 10):
        got = metrics.ndcg(rel, score, qid, k=k, discount=discount, per_query=True)  # type: ignore[arg-type]
        want = [brute_ndcg(r, s, k, discount) for r, s in per_query(qid, rel, score)]
        np.testing.assert_allclose(got, want, atol=1e-12)
        got_p = metrics.precision_at_k(rel, score, qid, k=k, per_query=True)
        want_p = [brute_pk(r, s, k) for r, s in per_query(qid, rel, score)]
        np.testing.assert_allclose(got_p, want_p)
    ap = metrics.average_precision(rel, score, qid)
    np.testing.assert_allclose(ap, [brute_ap(r, s) for r, s in per_query(qid, rel, score)])


def test_no_relevant_document_scores_zero() -> None:
    rel = np.array([0, 0, 0, 1, 0])
    score = np.array([0.3, 0.2, 0.1, 0.0, 0.5])
    qid = np.array([1, 1, 1, 2, 2])
    assert metrics.ndcg(rel, score, qid, k=3, per_query=True).tolist()[0] == 0.0  # type: ignore[union-attr]
    assert metrics.average_precision(rel, score, qid).tolist() == [0.0, 0.5]


def test_queries_must_be_contiguous() -> None:
    with pytest.raises(DataError, match="contiguous"):
        metrics.ndcg([1, 0, 1], [0.1, 0.2, 0.3], [1, 2, 1])


def test_ndcg_matches_ranx_burges() -> None:
    ranx = pytest.importorskip("ranx")
    rng = np.random.default_rng(11)
    qid, rel, _ = random_queries(rng, 30)
    rel[np.r_[0, np.cumsum(np.bincount(np.unique(qid, return_inverse=True)[1]))[:-1]]] = 2
    score = rng.normal(size=len(qid))  # ranx breaks ties its own way: no ties here
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, dict[str, float]] = {}
    for i, (q, r, s) in enumerate(zip(qid, rel, score, strict=True)):
        if r > 0:
            qrels.setdefault(str(q), {})[f"d{i}"] = int(r)
        run.setdefault(str(q), {})[f"d{i}"] = float(s)
    for k in (1, 3, 5, 10):
        want = ranx.evaluate(ranx.Qrels(qrels), ranx.Run(run), f"ndcg_burges@{k}")
        assert metrics.ndcg(rel, score, qid, k=k) == pytest.approx(want, abs=1e-9)


def test_evaluate_keys_and_consistency() -> None:
    rng = np.random.default_rng(2)
    qid, rel, score = random_queries(rng)
    out = metrics.evaluate(rel, score, qid, ks=(1, 5))
    assert set(out) == {"NDCG@1", "NDCG@5", "P@1", "P@5", "MAP"}
    assert out["NDCG@5"] == pytest.approx(metrics.ndcg(rel, score, qid, k=5, discount="letor"))
