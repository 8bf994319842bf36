"""Routing classifiers and text features against naive references."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import pytest

from streamlearn.errors import ConfigError, DataError
from streamlearn.rankers.base import Ranker
from streamlearn.rankers.metrics import auc
from streamlearn.rankers.routing import (
    LDA,
    LocalRegion,
    LogisticRegression,
    Network,
    Rocchio,
    stratified_holdout,
)
from streamlearn.rankers.text_features import (
    LSI,
    build_vocabulary,
    chi2_scores,
    document_term_matrix,
    select_chi2,
    tfidf,
)


def toy(seed: int = 0, n: int = 200, d: int = 5, noise: float = 1.0) -> tuple[np.ndarray,
                                                                           np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    beta = np.zeros(d)
    beta[:3] = [1.0, -1.0, 0.5]
    y = (X @ beta + noise * rng.normal(size=n) > 0).astype(int)
    return X, y


# ---------------------------------------------------------------- text features
@pytest.mark.parametrize("exact_limit", [1000, 10])  # exact SVD, randomized SVD
def test_lsi_reconstructs_a_low_rank_matrix(exact_limit: int) -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(120, 4)) @ rng.normal(size=(4, 90))
    lsi = LSI(n_components=4, exact_limit=exact_limit, seed=1).fit(a)
    np.testing.assert_allclose(lsi.reconstruct(lsi.transform(a)), a, atol=1e-8)
    np.testing.assert_allclose(lsi.components_.T @ lsi.components_, np.eye(4), atol=1e-10)
    np.testing.assert_allclose(lsi.singular_values_, np.linalg.svd(a, compute_uv=False)[:4])
    # a rank-2 truncation is the best rank-2 approximation (Eckart–Young residual)
    two = LSI(n_components=2, exact_limit=exact_limit, seed=1).fit(a)
    s = np.linalg.svd(a, compute_uv=False)
    residual = np.linalg.norm(a - two.reconstruct(two.transform(a)))
    assert residual == pytest.approx(np.sqrt((s[2:] ** 2).sum()), rel=1e-6)


def test_lsi_rejects_too_many_components() -> None:
    with pytest.raises(ConfigError, match="n_components"):
        LSI(n_components=5).fit(np.ones((3, 10)))


def test_chi2_equals_brute_force_contingency() -> None:
    rng = np.random.default_rng(2)
    present = rng.random((60, 12)) < rng.random(12)
    present[:, 5] = True  # empty margin: scores 0
    y = rng.random(60) < 0.3
    scores = chi2_scores(present, y)
    for j in range(present.shape[1]):
        observed = np.array([[np.sum(present[:, j] & y), np.sum(present[:, j] & ~y)],
                             [np.sum(~present[:, j] & y), np.sum(~present[:, j] & ~y)]], float)
        expected = observed.sum(1, keepdims=True) * observed.sum(0, keepdims=True) / 60
        brute = 0.0 if (expected == 0).any() else ((observed - expected) ** 2 / expected).sum()
        assert scores[j] == pytest.approx(brute, abs=1e-10)
    top = select_chi2(present, y, 3)
    assert set(top) == set(np.argsort(-scores, kind="stable")[:3])


def test_vocabulary_counts_and_tfidf() -> None:
    docs = [["oil", "price", "oil"], ["price", "wheat"], ["oil", "wheat", "zinc"], ["oil"]]
    vocab = build_vocabulary(docs, min_df=2, max_terms=10)
    assert vocab.terms == ("oil", "price", "wheat")  # df 3, 2, 2; zinc (df 1) dropped
    counts = document_term_matrix(docs, vocab)
    assert counts.tolist() == [[2, 1, 0], [0, 1, 1], [1, 0, 1], [1, 0, 0]]
    weights = tfidf(counts, vocab.idf())
    idf = np.log(4 / np.array([3, 2, 2]))
    first = np.array([(1 + np.log(2)) * idf[0], idf[1], 0.0])
    np.testing.assert_allclose(weights[0], first / np.linalg.norm(first), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(weights, axis=1), 1.0, rtol=1e-6)


# ---------------------------------------------------------------- classifiers
def test_rocchio_centroid_formula() -> None:
    X, y = toy(1, n=40)
    w = np.random.default_rng(0).random(40)
    model = Rocchio(beta=2.0, gamma=0.5)
    model.fit(X, y, sample_weight=w)
    pos = sum(w[i] * X[i] for i in range(40) if y[i]) / sum(w[i] for i in range(40) if y[i])
    neg = sum(w[i] * X[i] for i in range(40) if not y[i]) / sum(
        w[i] for i in range(40) if not y[i])
    np.testing.assert_allclose(model.weights_, 2.0 * pos - 0.5 * neg)
    np.testing.assert_allclose(model.score(X[:3]), X[:3] @ (2.0 * pos - 0.5 * neg))


def test_lda_matches_the_pooled_covariance_formula() -> None:
    X, y = toy(3, n=80, d=4)
    model = LDA(shrinkage=0.3)
    model.fit(X, y)
    m1, m0 = X[y == 1].mean(0), X[y == 0].mean(0)
    scatter = sum(np.outer(x - (m1 if t else m0), x - (m1 if t else m0))
                  for x, t in zip(X, y, strict=True))
    cov = scatter / (len(y) - 2)
    shrunk = 0.7 * cov + 0.3 * np.trace(cov) / 4 * np.eye(4)
    np.testing.assert_allclose(model.weights_, np.linalg.solve(shrunk, m1 - m0), rtol=1e-10)


@pytest.mark.parametrize("ridge", [0.1, 1.0, 10.0])
def test_irls_logistic_regression_matches_scikit_learn(ridge: float) -> None:
    sklearn_lm = pytest.importorskip("sklearn.linear_model")
    X, y = toy(4, n=150, d=6)
    ours = LogisticRegression(ridge=ridge)
    ours.fit(X, y)
    theirs = sklearn_lm.LogisticRegression(C=1.0 / ridge, tol=1e-12, max_iter=10000,
                                           solver="lbfgs").fit(X, y)
    np.testing.assert_allclose(ours.coef_, theirs.coef_[0], atol=1e-5)
    assert ours.intercept_ == pytest.approx(theirs.intercept_[0], abs=1e-5)
    assert ours.n_iter_ < 30  # Newton converges in a handful of steps


@pytest.mark.parametrize("make_model", [Rocchio, LDA, LogisticRegression,
                                        lambda: Network(hidden=0, max_epochs=200, seed=3),
                                        lambda: Network(hidden=4, max_epochs=200, seed=3)])
def test_weighted_fit_equals_repeated_rows(make_model: Callable[[], Ranker]) -> None:
    X, y = toy(5, n=60)
    w = np.random.default_rng(1).integers(0, 4, size=60)
    a = make_model().fit(X, y, sample_weight=w.astype(float)).score(X)
    b = make_model().fit(np.repeat(X, w, axis=0), np.repeat(y, w)).score(X)
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


def test_network_early_stopping_stops_and_keeps_the_best_epoch() -> None:
    # Few noisy rows, many features: the held-out loss must turn up and stop training.
    X, y = toy(6, n=90, d=40, noise=2.0)
    for hidden in (0, 5):
        model = Network(hidden=hidden, learning_rate=0.3, max_epochs=3000, patience=25,
                        seed=1)
        model.fit(X, y)
        assert model.stopped_epoch_ < 3000
        assert model.stopped_epoch_ == model.best_epoch_ + 25
        assert model.best_epoch_ == int(np.argmin(model.holdout_loss_)) + 1
        assert model.holdout_loss_[-1] > model.holdout_loss_.min()


def test_networks_learn_a_clean_problem() -> None:
    X, y = toy(7, n=400, noise=0.1)
    X_test, y_test = toy(8, n=400, noise=0.1)
    for hidden in (0, 4):
        model = Network(hidden=hidden, seed=0)
        model.fit(X, y)
        assert auc(y_test, model.score(X_test)) > 0.95


def test_stratified_holdout_takes_a_third_of_each_class() -> None:
    y = np.array([1] * 30 + [0] * 90)
    held = stratified_holdout(y, 1 / 3, np.random.default_rng(0))
    assert held[y == 1].sum() == 10 and held[y == 0].sum() == 30


def test_local_region_trains_on_the_top_rocchio_documents() -> None:
    X, y = toy(9, n=300)
    model = LocalRegion(LogisticRegression(), n_top=120)
    model.fit(X, y)
    screen = Rocchio().fit(X, y).score(X)
    top = np.argsort(-screen, kind="stable")[:120]
    direct = LogisticRegression()
    direct.fit(X[top], y[top])
    inner = model.model_
    assert isinstance(inner, LogisticRegression)
    np.testing.assert_allclose(inner.coef_, direct.coef_)
    scores = model.score(X)
    inside = screen >= model.threshold_
    assert inside.sum() == 120 and scores[inside].min() > scores[~inside].max()
    # inside the region the order is the classifier's
    assert np.array_equal(np.argsort(scores[inside]), np.argsort(direct.score(X[inside])))


def test_classifiers_need_both_classes() -> None:
    X, _ = toy(0, n=20)
    with pytest.raises(DataError, match="relevant"):
        LDA().fit(X, np.zeros(20))


def test_roger_eval_runs_a_small_task() -> None:
    from simulators.rankers import roger as roger_eval

    parser = argparse.ArgumentParser()
    roger_eval.add_arguments(parser)
    args = parser.parse_args(["--dataset", "nursery", "--methods", "roger-linear,nroger",
                              "--generations", "3", "--runs", "2", "--offspring", "10"])
    try:
        result = roger_eval.evaluate_roger(args)
    except DataError as exc:
        pytest.skip(f"nursery data not available: {exc}")
    assert result["task"] == "nursery priority-vs-rest"
    assert result["n_train"] + result["n_test"] == 12958
    assert [r["method"] for r in result["results"]] == ["roger-linear", "nroger"]
    assert all(r["test_auc"] > 0.5 for r in result["results"])
    with pytest.raises(ConfigError, match="--task"):
        roger_eval.build_task(parser.parse_args(["--dataset", "nursery", "--task", "nope"]))


def test_roger_eval_names_the_bench_extra_when_scikit_learn_is_missing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from simulators.rankers import roger as roger_eval

    monkeypatch.setitem(sys.modules, "sklearn.linear_model", None)
    monkeypatch.setitem(sys.modules, "sklearn.svm", None)
    with pytest.raises(ConfigError, match=r"streamlearn\[bench\]"):
        roger_eval._sklearn_model("linearsvc", 0)


def test_rank_cli_reports_a_bad_option_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from streamlearn.cli import main

    assert main(["rank", "routing", "--features", "lsi,bogus"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--features" in err and "bogus" in err
