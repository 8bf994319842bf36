"""Betting confidence sequences: coverage with heavy weights and repeated looks, exactness of
the incremental form, and the promotion gate built on them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.errors import ConfigError
from streamlearn.evaluation.bounds import (
    RunningMeanBound,
    first_crossing,
    interval_of_mean,
    lower_bound,
    value_interval,
)
from streamlearn.retrain.promotion import passes


def heavy_log(seed: int, n: int, p_rare: float, value_rare: float, value_common: float
              ) -> tuple[np.ndarray, np.ndarray, float]:
    """A target that plays what the logger plays with probability ``p_rare`` only: weight
    1/p_rare on those rows, 0 elsewhere; its true value is ``value_rare``."""
    rng = np.random.default_rng(seed)
    rare = rng.random(n) < p_rare
    r = (rng.random(n) < np.where(rare, value_rare, value_common)).astype(float)
    return r, rare / p_rare, value_rare


@pytest.mark.parametrize("p_rare", [0.001, 0.05])
def test_the_value_interval_covers_at_every_look_with_weights_up_to_1000(p_rare: float) -> None:
    """200 logs with weights up to 1/p_rare: the interval misses the true value in at most
    α = 5 % of them."""
    misses = 0
    for seed in range(200):
        r, w, truth = heavy_log(seed, 2000, p_rare, 0.7, 0.3)
        iv = value_interval(r, w, 0.05)
        misses += not iv.low <= truth <= iv.high
    assert misses / 200 <= 0.05


def test_the_value_interval_holds_the_logged_learners_own_policy_as_it_improves() -> None:
    """The logged learner's greedy policy, valued on rows over which it improved (accuracy
    0.05 → 0.25, ε-greedy over 26 actions at γ = 0.2): the interval must hold the average of
    its conditional values. A sequence for one constant value excluded it, and its own IPS
    value (an outside test: [0.1241, 0.1446] beside IPS 0.1085)."""
    misses, n, K, gamma = 0, 2000, 26, 0.2
    accuracy = np.linspace(0.05, 0.25, n)
    for seed in range(200):
        rng = np.random.default_rng(seed)
        p_greedy = 1 - gamma + gamma / K
        greedy = rng.random(n) < p_greedy
        r = np.where(greedy, rng.random(n) < accuracy, rng.random(n) < 0.02).astype(float)
        w = np.where(greedy, 1.0 / p_greedy, 0.0)  # the target: the greedy action, always
        iv = value_interval(r, w, 0.05)
        misses += not iv.low <= accuracy.mean() <= iv.high
        assert iv.low <= iv.mean <= iv.high
    assert misses / 200 <= 0.05


def test_the_on_policy_interval_covers_and_is_not_much_wider_than_normal() -> None:
    misses, widths = 0, []
    for seed in range(300):
        r = (np.random.default_rng(seed).random(2000) < 0.4).astype(float)
        iv = interval_of_mean(r, 0.05)
        misses += not iv.low <= 0.4 <= iv.high
        widths.append(iv.high - iv.low)
    assert misses / 300 <= 0.05
    normal = 2 * 1.96 * np.sqrt(0.24 / 2000)
    assert np.mean(widths) < 2.0 * normal  # the price of validity at every look


def test_the_on_policy_interval_holds_a_learner_that_improves() -> None:
    """What was live over a window in which it learned: the interval holds the average of
    its conditional means (a sequence for one constant mean crossed itself here)."""
    misses = 0
    for seed in range(200):
        means = np.linspace(0.2, 0.8, 3000)  # a learner that gets better
        r = (np.random.default_rng(seed).random(3000) < means).astype(float)
        iv = interval_of_mean(r, 0.05)
        misses += not iv.low <= means.mean() <= iv.high
        assert iv.low <= iv.mean <= iv.high
    assert misses / 200 <= 0.05


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 400), st.floats(0.0, 3.0))
def test_the_gate_and_the_lower_bound_agree(seed: int, n: int, m: float) -> None:
    """first_crossing at m is exactly 'the bisection's lower bound reaches m' for the values it
    tries first (k·high/16), and the bound never exceeds what the values can support."""
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(n) < 0.05, rng.exponential(20.0, n), rng.random(n) * 2)
    grid_m = round(m * 16 / 4) * 4 / 16  # a multiple of high/16 with high = 4
    crossed = first_crossing(y, 0.05, grid_m) is not None
    assert crossed == (lower_bound(y, 0.05, high=4.0) >= grid_m)


def test_the_running_bound_is_the_same_in_pieces_and_whole_and_restores() -> None:
    rng = np.random.default_rng(3)
    y = (rng.random(4000) < 0.4).astype(float)
    pieces, whole = RunningMeanBound(0.05), RunningMeanBound(0.05)
    for lo in range(0, 4000, 7):
        pieces.update(y[lo:lo + 7])
    whole.update(y)
    assert pieces.n == whole.n == 4000
    assert pieces.squares == pytest.approx(whole.squares)
    assert pieces.lower() == pytest.approx(whole.lower())
    assert 0.35 < whole.lower() < 0.4 < whole.upper() < 0.45
    restored = RunningMeanBound.from_state(whole.state())
    assert (restored.lower(), restored.upper()) == (whole.lower(), whole.upper())


def _running_misses(seed: int, means: np.ndarray, alpha: float) -> bool:
    """Whether the bound missed the running average of the conditional means at any look."""
    rng = np.random.default_rng(seed)
    y = (rng.random(len(means)) < means).astype(float)
    bound = RunningMeanBound(alpha / 2)
    target = np.cumsum(means) / np.arange(1, len(means) + 1)
    for lo in range(0, len(y), 25):  # a look after every batch of 25
        bound.update(y[lo:lo + 25])
        t = target[lo + len(y[lo:lo + 25]) - 1]
        if not bound.lower() <= t <= bound.upper():
            return True
    return False


@pytest.mark.parametrize("shape", ["learning", "drift", "constant"])
def test_the_running_bound_covers_a_moving_mean_at_every_look(shape: str) -> None:
    """Coverage of μ̄_t = (1/t)·Σ μ_i at every look over 300 seeds, for a learner whose
    mean rises from 0.1 to 0.9, a world whose mean falls at the midpoint, and a constant
    one: misses at most α (0.05) plus three standard errors."""
    t = np.arange(4000)
    means = {"learning": 0.1 + 0.8 * (1 - np.exp(-t / 800)),
             "drift": np.where(t < 2000, 0.8, 0.2),
             "constant": np.full(4000, 0.3)}[shape]
    misses = sum(_running_misses(seed, means, 0.05) for seed in range(300))
    assert misses / 300 <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 300)


def test_the_running_bound_follows_a_learner_a_constant_mean_sequence_would_not() -> None:
    """The defect it fixes: a learner that earned 0.2 for 2,000 events and 0.9 for the next
    6,000 — the running average is 0.725; its upper bound must be above it, and far above
    the early 0.2 that a sequence for a constant mean held on to."""
    rng = np.random.default_rng(5)
    means = np.r_[np.full(2000, 0.2), np.full(6000, 0.9)]
    bound = RunningMeanBound(0.025)
    bound.update((rng.random(8000) < means).astype(float))
    assert bound.lower() < means.mean() < bound.upper()
    assert bound.upper() - bound.lower() < 0.06


def test_bad_input_is_refused_with_what_was_expected() -> None:
    with pytest.raises(ConfigError, match="alpha"):
        lower_bound(np.ones(3), 1.5, 1.0)
    with pytest.raises(ConfigError, match=">= 0"):
        first_crossing(np.array([1.0, -1.0]), 0.05, 0.5)
    with pytest.raises(ConfigError, match=r"values in \[0, 1\]"):
        RunningMeanBound(0.05).update(np.array([0.5, 1.5]))
    with pytest.raises(ConfigError, match=r"values in \[0, 1\]"):
        interval_of_mean(np.array([0.5, 2.0]), 0.05)


def test_the_gate_passes_a_clearly_better_challenger_and_not_a_worse_one() -> None:
    rng = np.random.default_rng(0)
    better = 1 + rng.random(3000) * 0.4  # mean 1.2: advantage +0.2
    worse = rng.random(3000) * 1.9  # mean 0.95
    assert passes(better, 0.05) and not passes(worse, 0.05)
