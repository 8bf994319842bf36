from __future__ import annotations

import numpy as np
import pytest

from streamlearn.errors import ConfigError
from streamlearn.learners import Banditron
from streamlearn.learners.exploration import (
    STRATEGIES,
    Adaptive,
    CubeRootSchedule,
    Exploration,
    FixedGamma,
    MarginAware,
    SqrtSchedule,
    exploration_from_name,
    exploration_from_spec,
)

K = 5


def gammas(strategy: Exploration, rounds: object, scores: np.ndarray | None = None) -> np.ndarray:
    t = np.asarray(rounds)
    s = np.zeros((len(t), K)) if scores is None else scores
    return strategy.gammas(s, np.argmax(s, axis=1), t, None, K)


def test_schedules_follow_their_formulas_and_stay_at_most_half() -> None:
    t = np.array([1, 10, 1000, 10**6])
    np.testing.assert_allclose(gammas(SqrtSchedule(c=0.3), t), np.minimum(0.5, 0.3 * np.sqrt(K / t)))
    np.testing.assert_allclose(gammas(CubeRootSchedule(c=0.7), t),
                               np.minimum(0.5, 0.7 * np.cbrt(K / t)))
    for name in STRATEGIES:
        g = gammas(exploration_from_name(name), np.arange(1, 5000))
        assert (g > 0).all() and (g <= 0.5).all()


def test_adaptive_estimate_is_unbiased_for_the_exploit_error() -> None:
    """c = r·1[ỹ=ŷ]/P(ŷ) has mean 1[ŷ=y]: r̂ recovers a known exploit error of 30%."""
    rng = np.random.default_rng(0)
    n, gamma = 200_000, 0.2
    probs = np.full((n, K), gamma / K)
    probs[:, 0] += 1 - gamma  # ŷ = 0 always
    label = np.where(rng.random(n) < 0.7, 0, rng.integers(1, K, size=n))
    u = rng.random(n)
    actions = (np.cumsum(probs, axis=1) <= u[:, None]).sum(axis=1)
    strategy = Adaptive()
    strategy.observe(actions, (actions == label).astype(float), probs)
    assert abs(strategy.exploit_error() - 0.3) < 0.01


def test_adaptive_gamma_uses_only_past_feedback() -> None:
    strategy = Adaptive(c=1.0, c_floor=0.01)
    before = gammas(strategy, [100, 100])
    assert before[0] == before[1]  # one batch: one γ per round number, fixed before sampling
    probs = np.full((50, K), 0.04)
    probs[:, 0] = 0.84
    strategy.observe(np.zeros(50, int), np.ones(50), probs)  # exploit always right: r̂ → 0
    after = gammas(strategy, [100])
    assert after[0] < before[0]
    assert after[0] == pytest.approx(0.01 * np.sqrt(K / 100))  # the floor


def test_adaptive_window_tracks_drift() -> None:
    strategy = Adaptive(window=100)
    probs = np.full((300, K), 0.04)
    probs[:, 0] = 0.84
    rewards = np.r_[np.ones(200), np.zeros(100)]  # the exploit action stops working
    strategy.observe(np.zeros(300, int), rewards, probs)
    assert strategy.exploit_error() == 1.0
    cumulative = Adaptive()
    cumulative.observe(np.zeros(300, int), rewards, probs)
    assert cumulative.exploit_error() < 0.5


def test_margin_aware_explores_more_on_ambiguous_contexts() -> None:
    strategy = MarginAware(FixedGamma(0.1))
    warm = np.tile([1.0, 0.5, 0, 0, 0], (100, 1))
    gammas(strategy, np.arange(1, 101), warm)  # learn the typical gap (0.5)
    scores = np.array([[1.0, 0.99, 0, 0, 0], [3.0, 0.0, 0, 0, 0]])
    g = gammas(strategy, [101, 102], scores)
    assert g[0] > 0.1 > g[1]


def test_specs_round_trip_and_bad_values_are_named() -> None:
    for strategy in (FixedGamma(0.2), SqrtSchedule(0.5), Adaptive(2.0, 0.1, 10),
                     MarginAware(CubeRootSchedule(0.3))):
        assert repr(exploration_from_spec(strategy.spec())) == repr(strategy)
    with pytest.raises(ConfigError, match="'c' parameter of Adaptive"):
        Adaptive(c=-1)
    with pytest.raises(ConfigError, match="exploration strategy"):
        exploration_from_spec({"name": "boltzmann"})
    with pytest.raises(ConfigError, match="--exploration must be one of"):
        exploration_from_name("boltzmann")


def test_decisions_do_not_depend_on_the_feedback_of_their_own_batch() -> None:
    """γ is fixed before sampling: deciding a batch twice from one state gives the same result."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(64, 6))
    learner = Banditron(K, 6, Adaptive())
    twin = Banditron(K, 6, Adaptive())
    a1, p1 = learner.decide(X, keys=np.arange(64))
    a2, p2 = twin.decide(X, keys=np.arange(64))
    learner.update(X, a1, np.ones(64), p1)  # feedback arrives after the decision
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(p1, p2)
