from __future__ import annotations

import numpy as np
import pytest

from streamlearn.errors import ConfigError
from streamlearn.evaluation.offpolicy import doubly_robust, ips, snips

K = 4


World = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]


def logged_world(n: int, seed: int) -> World:
    """Uniform logging over K actions; reward prob depends on (context, action)."""
    rng = np.random.default_rng(seed)
    context = rng.integers(0, 3, size=n)
    mean_reward = np.array([[0.9, 0.1, 0.2, 0.3], [0.1, 0.8, 0.3, 0.2], [0.2, 0.2, 0.7, 0.1]])
    logged = rng.integers(0, K, size=n)
    propensity = np.full(n, 1.0 / K)
    rewards = (rng.random(n) < mean_reward[context, logged]).astype(float)
    target = context.copy()  # the optimal policy: action = context
    true_value = float(mean_reward[context, target].mean())
    return rewards, logged, propensity, target, mean_reward[context], true_value


@pytest.mark.parametrize("estimator", ["ips", "snips", "dr"])
def test_interval_covers_the_true_value_about_95_percent(estimator: str) -> None:
    covered = 0
    trials = 200
    for seed in range(trials):
        r, a, p, target, model, truth = logged_world(2000, seed)
        if estimator == "ips":
            est = ips(r, a, p, target)
        elif estimator == "snips":
            est = snips(r, a, p, target)
        else:
            est = doubly_robust(r, a, p, target, model * 0.8)  # a biased model: DR stays unbiased
        covered += int(est.low <= truth <= est.high)
    assert 0.90 <= covered / trials <= 0.99


def test_ips_is_unbiased_and_dr_with_a_perfect_model_has_less_variance() -> None:
    values_ips, values_dr = [], []
    for seed in range(100):
        r, a, p, target, model, truth = logged_world(1000, seed)
        values_ips.append(ips(r, a, p, target).value - truth)
        values_dr.append(doubly_robust(r, a, p, target, model).value - truth)
    assert abs(np.mean(values_ips)) < 3 * np.std(values_ips) / 10
    assert np.std(values_dr) < np.std(values_ips)


def test_clipping_counts_and_bounds_weights() -> None:
    r = np.ones(3)
    est = ips(r, np.array([0, 0, 1]), np.array([0.01, 0.5, 0.5]), np.array([0, 0, 1]), clip=10.0)
    assert est.clipped == 1
    assert est.value == pytest.approx((10 + 2 + 2) / 3)


def test_bad_propensities_are_rejected() -> None:
    with pytest.raises(ConfigError, match="Propensities"):
        ips(np.ones(2), np.zeros(2, int), np.array([0.0, 0.5]), np.zeros(2, int))
