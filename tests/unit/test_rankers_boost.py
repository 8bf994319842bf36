"""RankBoost, AdaRank and NDCG_Boost: pair algebra vs brute force, weights vs repeated rows."""

from __future__ import annotations

import numpy as np
import pytest

from streamlearn.errors import ConfigError, DataError
from streamlearn.rankers.adarank import AdaRank
from streamlearn.rankers.metrics import auc, ndcg, query_groups
from streamlearn.rankers.ndcg_boost import NDCGBoost
from streamlearn.rankers.rankboost import RankBoost, pair_potential

# --------------------------------------------------------------- naive references


def brute_r(H, y, qid, w, h) -> float:
    """r = Σ D(x0,x1)(h(x1) − h(x0)) over all crucial pairs, D ∝ w0·w1·exp(H0 − H1)."""
    num = den = 0.0
    n = len(y)
    for i0 in range(n):
        for i1 in range(n):
            if qid[i0] == qid[i1] and y[i0] < y[i1]:
                d = w[i0] * w[i1] * np.exp(H[i0] - H[i1])
                den += d
                num += d * (h[i1] - h[i0])
    return num / den


def brute_best_first_round(X, y, qid, w) -> float:
    best = 0.0
    for j in range(X.shape[1]):
        for theta in np.unique(X[:, j])[:-1]:
            r = brute_r(np.zeros(len(y)), y, qid, w, (X[:, j] > theta).astype(float))
            best = r if abs(r) > abs(best) else best
    return best


def ranking_problem(seed: int, n_queries: int = 30, per_query: int = 15, d: int = 6):
    rng = np.random.default_rng(seed)
    n = n_queries * per_query
    X = rng.uniform(size=(n, d))
    qid = np.repeat(np.arange(n_queries), per_query)
    latent = 1.5 * X[:, 0] + X[:, 2] - 0.5 * X[:, 3] + 0.4 * rng.normal(size=n)
    y = np.digitize(latent, np.quantile(latent, [0.6, 0.85])).astype(float)
    return X, y, qid


# ------------------------------------------------------------------------ RankBoost


@pytest.mark.parametrize("graded", [False, True])
def test_pair_potential_equals_brute_force_r(graded: bool) -> None:
    rng = np.random.default_rng(1)
    n = 24
    y = rng.integers(0, 3 if graded else 2, size=n).astype(float)
    qid = np.repeat([4, 9, 11], 8) if graded else np.zeros(n, dtype=int)
    w = rng.uniform(0.2, 2.0, size=n)
    H = rng.normal(size=n)
    h = rng.integers(0, 2, size=n).astype(float)
    level = np.unique(y, return_inverse=True)[1]
    pi = pair_potential(H, level, int(level.max()) + 1, query_groups(qid, n), w)
    assert float(pi @ h) == pytest.approx(brute_r(H, y, qid, w, h), abs=1e-12)


def test_bipartite_r_is_weighted_tpr_minus_fpr() -> None:
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, size=40)
    w = rng.uniform(0.5, 1.5, size=40)
    h = rng.integers(0, 2, size=40).astype(float)
    pi = pair_potential(np.zeros(40), y, 2, query_groups(None, 40), w)
    tpr = (w * h)[y == 1].sum() / w[y == 1].sum()
    fpr = (w * h)[y == 0].sum() / w[y == 0].sum()
    assert float(pi @ h) == pytest.approx(tpr - fpr, abs=1e-12)


def test_first_round_picks_the_brute_force_best_threshold() -> None:
    rng = np.random.default_rng(3)
    X = np.round(rng.uniform(size=(30, 3)), 1)
    y = rng.integers(0, 3, size=30).astype(float)
    qid = np.repeat([0, 1, 2], 10)
    w = rng.uniform(0.5, 2.0, size=30)
    model = RankBoost(n_rounds=1).fit(X, y, qid, sample_weight=w)
    assert abs(model.r_[0]) == pytest.approx(abs(brute_best_first_round(X, y, qid, w)), abs=1e-12)


def test_rankboost_training_auc_rises() -> None:
    rng = np.random.default_rng(4)
    X = rng.normal(size=(400, 5))
    y = (X[:, 0] - 0.7 * X[:, 3] + 0.5 * rng.normal(size=400) > 0).astype(int)
    model = RankBoost(n_rounds=60).fit(X, y)
    aucs = np.asarray(auc(y, model.staged_scores(X)))
    assert aucs[-1] > aucs[0] + 0.05
    assert np.all(np.diff(aucs) > -0.01)  # monotone up to small dips


# ---------------------------------------------------- weights == repeated rows


@pytest.mark.parametrize("with_qid", [False, True])
def test_rankboost_weighted_equals_repeated(with_qid: bool) -> None:
    X, y, qid = ranking_problem(5, n_queries=6, per_query=10, d=4)
    if not with_qid:
        y = (y > 0).astype(float)
    counts = np.random.default_rng(6).integers(1, 4, size=len(y))
    q = qid if with_qid else None
    a = RankBoost(n_rounds=15, max_bins=8).fit(X, y, q, sample_weight=counts)
    b = RankBoost(n_rounds=15, max_bins=8).fit(
        np.repeat(X, counts, axis=0), np.repeat(y, counts), None if q is None else np.repeat(q, counts)
    )
    np.testing.assert_array_equal(a.features_, b.features_)
    np.testing.assert_array_equal(a.thresholds_, b.thresholds_)
    np.testing.assert_allclose(a.alphas_, b.alphas_, rtol=1e-9)


def test_adarank_weighted_equals_repeated_queries() -> None:
    X, y, qid = ranking_problem(7, n_queries=12, per_query=10)
    counts = np.random.default_rng(8).integers(1, 4, size=12)
    w = np.repeat(counts, 10).astype(float)
    rows = np.concatenate([np.tile(np.arange(q * 10, q * 10 + 10), c) for q, c in enumerate(counts)])
    new_qid = np.repeat(np.arange(counts.sum()), 10)  # each copy is its own query
    for measure in ("ndcg", "map"):
        a = AdaRank(n_rounds=10, measure=measure).fit(X, y, qid, sample_weight=w)
        b = AdaRank(n_rounds=10, measure=measure).fit(X[rows], y[rows], new_qid)
        np.testing.assert_array_equal(a.features_, b.features_)
        np.testing.assert_allclose(a.alphas_, b.alphas_, rtol=1e-9)


def test_ndcg_boost_weighted_equals_repeated_rows() -> None:
    X, y, qid = ranking_problem(9, n_queries=5, per_query=8, d=4)
    counts = np.random.default_rng(10).integers(1, 4, size=len(y))
    a = NDCGBoost(n_rounds=8, max_bins=6).fit(X, y, qid, sample_weight=counts)
    b = NDCGBoost(n_rounds=8, max_bins=6).fit(
        np.repeat(X, counts, axis=0), np.repeat(y, counts), np.repeat(qid, counts)
    )
    assert len(a.features_) > 0
    np.testing.assert_array_equal(a.features_, b.features_)
    np.testing.assert_array_equal(a.thresholds_, b.thresholds_)
    np.testing.assert_allclose(a.alphas_, b.alphas_, rtol=1e-9)
    np.testing.assert_allclose(a.train_bound_, b.train_bound_, rtol=1e-9)


def test_pointwise_logistic_weighted_equals_repeated() -> None:
    from simulators.rankers.letor import PointwiseLogistic

    X, y, _ = ranking_problem(14, n_queries=4, per_query=15, d=4)
    counts = np.random.default_rng(15).integers(1, 4, size=len(y))
    a = PointwiseLogistic(ridge=0.5).fit(X, y, sample_weight=counts)
    b = PointwiseLogistic(ridge=0.5).fit(np.repeat(X, counts, axis=0), np.repeat(y, counts))
    np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-8, atol=1e-10)
    assert np.std(a.coef_) > 0.01


# ----------------------------------------------------- better than random ranking


@pytest.mark.parametrize(
    "make", [lambda: AdaRank(n_rounds=30), lambda: NDCGBoost(n_rounds=30)], ids=["adarank", "ndcgboost"]
)
def test_listwise_rankers_beat_random_on_held_out_queries(make) -> None:
    X, y, qid = ranking_problem(11, n_queries=40)
    train = qid < 25
    model = make().fit(X[train], y[train], qid[train])
    learned = float(ndcg(y[~train], model.score(X[~train]), qid[~train], k=10))
    rng = np.random.default_rng(12)
    random = float(np.mean([ndcg(y[~train], rng.random((~train).sum()), qid[~train], k=10)
                            for _ in range(20)]))
    assert learned > random + 0.15


# ------------------------------------------------------------------ interface


def test_validation_messages() -> None:
    with pytest.raises(ConfigError, match=r"The 'n_rounds' parameter of RankBoost must be an int "
                                          r">= 1\. Got 0 instead\."):
        RankBoost(n_rounds=0)
    with pytest.raises(ConfigError, match="'measure' parameter of AdaRank"):
        AdaRank(measure="err")
    with pytest.raises(ConfigError, match="'learning_rate' parameter of NDCGBoost"):
        NDCGBoost(learning_rate=0.0)
    with pytest.raises(DataError, match="needs qid"):
        AdaRank().fit(np.ones((4, 2)), [0, 1, 0, 1])
    with pytest.raises(ConfigError, match="not fitted"):
        RankBoost().score(np.ones((2, 2)))


def test_get_params_and_clone() -> None:
    model = NDCGBoost(n_rounds=7, learning_rate=0.5)
    assert model.get_params() == {"n_rounds": 7, "learning_rate": 0.5, "max_bins": 256}
    twin = model.clone()
    assert twin is not model and twin.get_params() == model.get_params()


# ------------------------------------------------------------- LETOR reader + CLI


def write_fake_letor(root, seed: int = 13) -> None:
    """A tiny LETOR-layout collection: QueryLevelNorm/Fold1/{train,vali,test}.txt."""
    X, y, qid = ranking_problem(seed, n_queries=18, per_query=12, d=5)
    folder = root / "QueryLevelNorm" / "Fold1"
    folder.mkdir(parents=True)
    for name, queries in (("train", range(0, 10)), ("vali", range(10, 14)),
                          ("test", range(14, 18))):
        lines = []
        for i in np.flatnonzero(np.isin(qid, list(queries))):
            feats = " ".join(f"{j + 1}:{v:.6f}" for j, v in enumerate(X[i]))
            lines.append(f"{int(y[i])} qid:{qid[i] + 1} {feats} #docid = {i}")
        (folder / f"{name}.txt").write_text("\n".join(lines) + "\n")


def test_load_fold_reads_letor_lines(tmp_path) -> None:
    from streamlearn.datasets.letor import load_fold

    write_fake_letor(tmp_path)
    data = load_fold(tmp_path, 1)
    assert data["train"].X.shape == (120, 5) and data["test"].n_queries == 4
    assert data["vali"].docid[0] == "120"
    with pytest.raises(DataError, match="Fold2"):
        load_fold(tmp_path, 2)


def test_rank_letor_cli_json(tmp_path, capsys) -> None:
    import json

    from streamlearn.cli import main

    write_fake_letor(tmp_path)
    code = main(["rank", "letor", str(tmp_path), "--folds", "1", "--algo", "rankboost,adarank",
                 "--peers", "none", "--rounds", "20", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["results"]) == {"rankboost", "adarank-map", "adarank-ndcg"}
    for entry in out["results"].values():
        assert 0.0 <= entry["mean"]["MAP"] <= 1.0 and len(entry["curve"]) == 10
        assert 1 <= entry["folds"][0]["selected"]["rounds"] <= 20
    assert main(["rank", "letor", str(tmp_path), "--folds", "7"]) == 2


def test_adarank_learns_from_rows_already_in_their_best_order() -> None:
    """Logged slates come in the logger's order, often a good one. The empty model ties
    every row, and its tie-break by row order must not count as a model to beat: AdaRank
    used to keep no round at all here (constant scores)."""
    rng = np.random.default_rng(0)
    n_q, per = 200, 3
    y = np.tile([1.0, 0.0, 0.0], n_q)  # the relevant document first in every query
    X = np.column_stack([y + rng.normal(0, 0.7, n_q * per), rng.normal(size=n_q * per),
                         np.ones(n_q * per)])  # the joint features' constant term
    qid = np.repeat(np.arange(n_q), per)
    model = AdaRank(n_rounds=10).fit(X, y, qid)
    assert len(model.features_) >= 1 and np.ptp(model.score(X)) > 0
    assert 2 not in model.features_.tolist()  # a feature constant in every query ranks nothing
