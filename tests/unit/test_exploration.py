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
    PageHinkley,
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
        strategy = exploration_from_name(name)
        assert strategy is not None  # only "default" (the learner's own) names no strategy
        g = gammas(strategy, np.arange(1, 5000))
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
    cumulative = Adaptive(detect_drift=False)  # a cumulative mean alone lags behind the change
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


def _exploit_feedback(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Feedback where the exploit action (0) was always played, with the given rewards."""
    probs = np.full((len(rewards), K), 0.01)
    probs[:, 0] = 1 - 0.01 * (K - 1)
    return np.zeros(len(rewards), int), rewards.astype(float), probs


def test_page_hinkley_batches_equal_per_event_and_count_each_change() -> None:
    rng = np.random.default_rng(3)
    signal = np.r_[rng.random(3000) < 0.1, rng.random(3000) < 0.8, rng.random(3000) < 0.1,
                   rng.random(3000) < 0.9].astype(float)
    per_event = PageHinkley(0.05, 20.0)
    alarms = [i for i, e in enumerate(signal) if per_event.update(np.array([e]))[0]]
    batched = PageHinkley(0.05, 20.0)
    seen = []
    for lo in range(0, len(signal), 97):
        changes, last = batched.update(signal[lo:lo + 97])
        if changes:
            seen.append(lo + last)
    assert len(alarms) == 2 and 3000 < alarms[0] < 3100 and 9000 < alarms[1] < 9100
    assert seen[-1] == alarms[-1] and len(seen) == len(alarms)
    np.testing.assert_allclose(batched.state, per_event.state)


def test_adaptive_detects_a_rise_of_the_exploit_error_and_restarts_its_clock() -> None:
    rng = np.random.default_rng(4)
    strategy = Adaptive(c=0.5, power=0.5)
    strategy.observe(*_exploit_feedback(rng.random(20_000) < 0.9))  # exploit right 90% of the time
    before = gammas(strategy, [20_001])[0]
    assert strategy.drift_detections_ == 0
    strategy.observe(*_exploit_feedback(rng.random(500) < 0.1))  # then wrong 90% of the time
    assert strategy.drift_detections_ == 1
    after = gammas(strategy, [20_502, 21_000])
    assert after[0] == 0.5 and after[1] > 3 * before  # γ restarts from its early-stream level
    twin = exploration_from_spec(strategy.spec())
    twin.load(strategy.arrays(), strategy.scalars())
    assert twin.drift_detections_ == 1
    np.testing.assert_array_equal(gammas(twin, [21_500]), gammas(strategy, [21_500]))


def test_fixed_gamma_can_count_changes_without_moving_gamma() -> None:
    rng = np.random.default_rng(4)
    plain = FixedGamma(0.01)
    assert plain.spec() == {"name": "fixed", "gamma": 0.01} and plain.arrays() == {}
    strategy = FixedGamma(0.01, detect_drift=True)
    strategy.observe(*_exploit_feedback(rng.random(20_000) < 0.9))
    assert strategy.drift_detections_ == 0
    strategy.observe(*_exploit_feedback(rng.random(500) < 0.1))
    assert strategy.drift_detections_ == 1
    np.testing.assert_array_equal(gammas(strategy, [20_502, 30_000]), [0.01, 0.01])
    twin = exploration_from_spec(strategy.spec())
    twin.load(strategy.arrays(), strategy.scalars())
    assert twin.drift_detections_ == 1 and repr(twin) == repr(strategy)
    np.testing.assert_array_equal(twin.arrays()["detector"], strategy.arrays()["detector"])
    with pytest.raises(ConfigError, match="'detect_drift' parameter of FixedGamma"):
        FixedGamma(0.01, detect_drift=1)  # type: ignore[arg-type]


def test_adaptive_raises_no_false_alarm_on_a_stationary_stream() -> None:
    rng = np.random.default_rng(5)
    strategy = Adaptive()
    for _ in range(100):  # 10⁶ events at a constant 30% exploit error
        strategy.observe(*_exploit_feedback(rng.random(10_000) < 0.7))
    assert strategy.drift_detections_ == 0
    assert abs(strategy.exploit_error() - (1 - 0.7 / 0.96)) < 0.01  # c = r / P(ŷ), P(ŷ) = 0.96


def test_adaptive_half_life_discounts_old_feedback() -> None:
    strategy = Adaptive(half_life=100.0, detect_drift=False)
    strategy.observe(*_exploit_feedback(np.r_[np.ones(1000), np.zeros(1000)]))
    assert strategy.exploit_error() > 0.99
    with pytest.raises(ConfigError, match="'window' or a 'half_life'"):
        Adaptive(window=10, half_life=5.0)


def test_margin_aware_reports_its_base_strategy_detections() -> None:
    strategy = MarginAware(Adaptive())
    rng = np.random.default_rng(7)
    strategy.observe(*_exploit_feedback(rng.random(5000) < 0.95))
    strategy.observe(*_exploit_feedback(rng.random(1000) < 0.05))
    assert strategy.drift_detections_ == strategy.base.drift_detections_ == 1


@pytest.mark.parametrize("strategy", [Adaptive(), FixedGamma(0.05, detect_drift=True)])
def test_a_baseline_serving_the_decisions_is_no_change_in_the_learners_error(
        strategy: Exploration) -> None:
    """After a step back to a baseline-served mode the logged rows' maximum is the baseline's
    action: the detector read the baseline's error (0.75 here) as the learner's (0.3) rising
    and restarted the exploration (an outside test). It watches the learner's own best
    action."""
    rng = np.random.default_rng(3)
    K, n = 4, 400

    def batch(baseline_serves: bool) -> tuple[np.ndarray, ...]:
        learner_best = rng.integers(0, K, n)  # right for 70 % of the events
        labels = np.where(rng.random(n) < 0.7, learner_best,
                          (learner_best + rng.integers(1, K, n)) % K)
        probs = np.full((n, K), 0.05 / (K - 1))
        if baseline_serves:  # a baseline plays action 0 with 95 % (right for ~1/4 of events)
            probs[:, 0] = 0.95
            actions = np.where(rng.random(n) < 0.95, 0, learner_best)
        else:
            probs[np.arange(n), learner_best] = 0.95
            actions = learner_best
        return actions, (actions == labels).astype(float), probs, learner_best

    for _ in range(5):
        strategy.observe(*batch(baseline_serves=False))
    for _ in range(5):
        strategy.observe(*batch(baseline_serves=True))
    assert strategy.drift_detections_ == 0
    for _ in range(5):  # the logged maximum alone (no exploit given) would have seen a change
        strategy.observe(*batch(baseline_serves=True)[:3])
    assert strategy.drift_detections_ > 0
