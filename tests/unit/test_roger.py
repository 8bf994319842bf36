"""Roger / n'Roger: ES mechanics, AUC fitness, sample weights, the n'Roger median."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamlearn.errors import ConfigError
from streamlearn.rankers.metrics import auc
from streamlearn.rankers.roger import (
    NRoger,
    Roger,
    learning_rates,
    mutate_step_sizes,
    select_best,
)


def brute_force_auc(scores: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
    """Naive O(n²) weighted AUC over all positive/negative pairs, ties ½."""
    w = np.ones(len(y)) if w is None else w
    pos, neg = y > 0, y <= 0
    sp, sn = scores[pos][:, None], scores[neg][None, :]
    pair = (sp > sn) + 0.5 * (sp == sn)
    return float((w[pos][:, None] * w[neg][None, :] * pair).sum() / (w[pos].sum() * w[neg].sum()))


def separable_toy(seed: int = 0, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 6))
    y = (X @ np.array([1.5, -2.0, 0.7, 0.0, 0.0, 0.0]) > 0.4).astype(int)
    return X, y


def test_select_best_keeps_the_best_mu_parents_first_on_ties() -> None:
    fitness = np.array([0.5, 0.9, 0.7, 0.9, 0.1, 0.95])
    keep = select_best(fitness, 3)
    assert keep.tolist() == [5, 1, 3]
    # the kept set is exactly the μ largest, whatever μ
    rng = np.random.default_rng(3)
    f = rng.random(50)
    for mu in (1, 7, 20):
        kept = select_best(f, mu)
        assert sorted(f[kept]) == sorted(np.sort(f)[-mu:])


def test_self_adaptation_formula() -> None:
    n = 9
    tau_global, tau_gene = learning_rates(n)
    assert tau_global == pytest.approx(1 / math.sqrt(2 * n))
    assert tau_gene == pytest.approx(1 / math.sqrt(2 * math.sqrt(n)))
    rng = np.random.default_rng(0)
    sigma = rng.random((4, n)) + 0.1
    g, gi = rng.standard_normal(4), rng.standard_normal((4, n))
    out = mutate_step_sizes(sigma, g, gi)
    for r in range(4):
        for i in range(n):
            assert out[r, i] == pytest.approx(sigma[r, i] * math.exp(tau_global * g[r]
                                                                    + tau_gene * gi[r, i]))
    floored = mutate_step_sizes(np.full((1, n), 1e-9), np.zeros(1), np.zeros((1, n)), 1e-3)
    assert np.all(floored == 1e-3)


def test_es_never_loses_its_best_fitness() -> None:
    # (μ+λ) selection is elitist: the best training AUC is non-decreasing over generations.
    X, y = separable_toy(1)
    model = Roger(generations=25, seed=4)
    model.fit(X, y)
    assert np.all(np.diff(model.history_) >= 0)
    assert model.fitness_ == model.history_[-1]


@pytest.mark.parametrize("hypothesis", ["linear", "l1"])
def test_roger_learns_a_separable_problem(hypothesis: str) -> None:
    X, y = separable_toy(0)
    X_test, y_test = separable_toy(1)
    model = Roger(hypothesis=hypothesis, generations=40, seed=0)
    model.fit(X, y)
    assert model.history_[0] < 0.95  # random start is not already good
    assert model.fitness_ > 0.95
    assert auc(y_test, model.score(X_test)) > 0.95
    assert model.fitness_ == pytest.approx(brute_force_auc(model.score(X), y))
    weights, centres = model.feature_weights()
    assert np.abs(weights).sum() == pytest.approx(1.0)
    assert (centres is None) == (hypothesis == "linear")
    if hypothesis == "linear":  # informative features carry the weight, with the right signs
        assert weights[0] > 0 and weights[1] < 0 and np.abs(weights[3:]).max() < abs(weights[1])


@pytest.mark.parametrize("model_class", [Roger, NRoger])
def test_weighted_fit_equals_fit_on_repeated_rows(model_class: type) -> None:
    X, y = separable_toy(2, n=120)
    X = np.round(X, 1)  # plus ties in scores
    rng = np.random.default_rng(5)
    w = rng.integers(0, 4, size=len(y))
    params = {"generations": 15, "seed": 7}
    if model_class is NRoger:
        params["n_runs"] = 3
    weighted = model_class(**params)
    weighted.fit(X, y, sample_weight=w.astype(float))
    repeated = model_class(**params)
    repeated.fit(np.repeat(X, w, axis=0), np.repeat(y, w))
    X_test, _ = separable_toy(3, n=50)
    np.testing.assert_array_equal(weighted.score(X_test), repeated.score(X_test))
    np.testing.assert_array_equal(weighted.feature_weights()[0], repeated.feature_weights()[0])


def test_weights_change_the_fitness() -> None:
    # The weighted training AUC the ES maximises is the brute-force weighted AUC.
    X, y = separable_toy(4, n=100)
    w = np.random.default_rng(1).random(len(y)) * 3
    model = Roger(generations=5, seed=2)
    model.fit(X, y, sample_weight=w)
    assert model.fitness_ == pytest.approx(brute_force_auc(model.score(X), y, w))


def test_nroger_is_the_median_of_rank_normalised_runs() -> None:
    X, y = separable_toy(5, n=150)
    model = NRoger(n_runs=5, generations=10, seed=3)
    model.fit(X, y)
    assert len(model.runs_) == 5 and len(set(model.run_seeds())) == 5
    X_test, _ = separable_toy(6, n=40)
    per_run = []
    for run in model.runs_:
        train = run.score(X)
        test = run.score(X_test)
        # naive mid-rank fraction of each test score among the run's training scores
        per_run.append([(np.sum(train < s) + 0.5 * np.sum(train == s)) / len(train)
                        for s in test])
    np.testing.assert_allclose(model.score(X_test), np.median(np.array(per_run), axis=0))
    # each run is an independent Roger with its own seed
    single = Roger(generations=10, seed=model.run_seeds()[2])
    single.fit(X, y)
    np.testing.assert_array_equal(single.weights_, model.runs_[2].weights_)


def test_parameter_validation() -> None:
    X, y = separable_toy(0, n=30)
    with pytest.raises(ConfigError, match="hypothesis"):
        Roger(hypothesis="quadratic").fit(X, y)
    with pytest.raises(ConfigError, match="mu"):
        Roger(mu=0).fit(X, y)
    with pytest.raises(ConfigError, match="queries"):
        Roger().fit(X, y, qid=np.repeat([1, 2], 15))


def test_l1_explanation_is_canonical_and_ranks_like_the_model() -> None:
    X, y = separable_toy(8)
    model = Roger(hypothesis="l1", generations=20, seed=5)
    model.fit(X, y)
    weights, centres = model.feature_weights()
    assert centres is not None
    low, high = X.min(axis=0), X.max(axis=0)
    assert np.all((centres >= low) & (centres < high))
    # the canonical (weight, centre) pairs rank the training rows exactly as the model does
    span = high - low
    canonical = (np.abs(X - centres) / span) @ weights
    assert auc(y, canonical) == pytest.approx(model.fitness_, abs=1e-12)
    assert auc(y, canonical) == pytest.approx(auc(y, model.score(X)), abs=1e-12)
