"""Candidate-set learners: distributions, naive per-request references, unbiased draws, learning."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.candidates.joint import joint_features
from streamlearn.candidates.learners import (
    CandidateBanditron,
    CandidateEpsilonGreedy,
    CandidateLearner,
    CandidateLinUCB,
    CandidateSquareCB,
)
from streamlearn.candidates.sets import CandidateSets, segment_argmax, segment_sample
from streamlearn.candidates.slates import SlateMixture
from streamlearn.replay.candidates import replay_candidates

D_X, D_C = 2, 3


def learners() -> list[CandidateLearner]:
    return [CandidateEpsilonGreedy(D_X, D_C, seed=1), CandidateSquareCB(D_X, D_C, seed=1),
            CandidateLinUCB(D_X, D_C, seed=1), CandidateBanditron(D_X, D_C, seed=1)]


def random_sets(rng: np.random.Generator, n_requests: int, max_size: int = 8) -> CandidateSets:
    sizes = rng.integers(1, max_size + 1, n_requests)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return CandidateSets(rng.normal(size=(n_requests, D_X)), rng.normal(size=(offsets[-1], D_C)),
                         offsets, rng.random(offsets[-1]))


def trained(learner: CandidateLearner, seed: int) -> CandidateLearner:
    rng = np.random.default_rng(seed)
    sets = random_sets(rng, 40)
    decision = learner.decide(sets)
    rows = decision.chosen
    assert sets.rewards is not None
    learner.update(decision.phi[rows], sets.rewards[rows], decision.propensities,
                   decision.phi[decision.exploit])
    return learner


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 30))
def test_every_request_gets_a_distribution_over_its_own_candidates(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    sets = random_sets(rng, n)
    for learner in learners():
        decision = trained(learner, seed).decide(sets)
        probs = decision.probs
        assert np.isfinite(probs).all() and (probs >= -1e-12).all()
        np.testing.assert_allclose(np.add.reduceat(probs, sets.offsets[:-1]), 1.0, atol=1e-9)
        request = sets.request_of[decision.chosen]
        assert (request == np.arange(n)).all()  # each request plays one of its own candidates
        assert (decision.propensities > 0).all()


def naive_probabilities(learner: CandidateLearner, sets: CandidateSets) -> np.ndarray:
    """The per-request algorithm written as a plain loop (ALGORITHMS: batch of 1 = reference)."""
    phi = joint_features(sets)
    out = []
    for r in range(len(sets)):
        rows = phi[sets.offsets[r]:sets.offsets[r + 1]]
        n = len(rows)
        if isinstance(learner, CandidateBanditron):
            p = [learner.gamma / n] * n
            p[int(np.argmax(rows @ learner.weights_))] += 1 - learner.gamma
        elif isinstance(learner, CandidateLinUCB):
            theta = learner.A_inv_ @ learner.b_
            upper = [float(x @ theta + learner.alpha * np.sqrt(x @ learner.A_inv_ @ x)) for x in rows]
            p = [learner.epsilon / n] * n
            p[int(np.argmax(upper))] += 1 - learner.epsilon
        else:
            mu = [float(learner.oracle.predict(x[None, :])[0, 0]) for x in rows]
            if isinstance(learner, CandidateSquareCB):
                mu = [min(max(m, 0.0), 1.0) for m in mu]
                best = int(np.argmax(mu))
                lam = learner.greediness * np.sqrt(n * (learner.n_requests_ + 1 + r))
                p = [1.0 / (n + lam * (mu[best] - m)) for m in mu]
                p[best] = 0.0
                p[best] = 1.0 - sum(p)
            else:
                assert isinstance(learner, CandidateEpsilonGreedy)
                p = [learner.epsilon / n] * n
                p[int(np.argmax(mu))] += 1 - learner.epsilon
        out.extend(p)
    return np.array(out)


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_batched_decisions_equal_the_per_request_reference(index: int) -> None:
    rng = np.random.default_rng(5)
    sets = random_sets(rng, 25)
    learner = trained(learners()[index], 3)
    expected = naive_probabilities(learner, sets)
    np.testing.assert_allclose(learner.distribution(sets, joint_features(sets)), expected,
                               rtol=1e-9, atol=1e-12)


def test_linucb_batch_update_is_the_ridge_posterior() -> None:
    rng = np.random.default_rng(2)
    learner = CandidateLinUCB(D_X, D_C, ridge=2.0)
    phis, rewards = [], []
    for _ in range(3):
        phi, r = rng.normal(size=(7, learner.dim)), rng.random(7)
        learner.update(phi, r, np.ones(7))
        phis.append(phi)
        rewards.append(r)
    Phi, R = np.vstack(phis), np.concatenate(rewards)
    np.testing.assert_allclose(learner.A_inv_, np.linalg.inv(2.0 * np.eye(learner.dim) + Phi.T @ Phi),
                               atol=1e-10)
    np.testing.assert_allclose(learner.b_, Phi.T @ R)


def test_logged_propensities_are_the_sampling_frequencies() -> None:
    """One request decided 30,000 times with different keys: frequencies match probs (χ²)."""
    learner = trained(CandidateSquareCB(D_X, D_C, seed=7), 1)
    rng = np.random.default_rng(9)
    one = random_sets(rng, 1, max_size=6)
    n = 30_000
    many = one.take(np.zeros(n, dtype=np.int64))
    learner.n_requests_ = 10**6  # every copy at (almost) the same round: one distribution
    decision = learner.decide(many, keys=np.arange(n))
    p = decision.probs[: one.sizes[0]]
    counts = np.bincount(decision.chosen % one.sizes[0], minlength=one.sizes[0])
    keep = p > 0
    chi2 = float((((counts[keep] - n * p[keep]) ** 2) / (n * p[keep])).sum())
    assert chi2 < 20.5  # χ² with ≤ 5 degrees of freedom at p = 0.001


def test_segment_sampling_matches_the_distribution() -> None:
    probs = np.array([0.2, 0.8, 0.0, 1.0, 0.0, 0.5, 0.25, 0.25])
    offsets = np.array([0, 2, 5, 8])
    u = np.random.default_rng(0).random((20_000, 3))
    picks = np.stack([segment_sample(probs, offsets, row) for row in u])
    assert (picks[:, 1] == 3).all()  # zero-probability candidates are never drawn
    freq = np.bincount(picks.ravel(), minlength=8) / 20_000
    np.testing.assert_allclose(freq, probs, atol=0.015)
    assert segment_argmax(np.array([np.nan, 1.0, 1.0]), np.array([0, 3])).tolist() == [1]


def linear_stream(n: int, seed: int) -> tuple[CandidateSets, np.ndarray]:
    """Bernoulli rewards with a known logistic-linear mean in φ(x, c) (exact regret)."""
    rng = np.random.default_rng(seed)
    sets = random_sets(rng, n, max_size=10)
    theta = rng.normal(size=joint_features(sets).shape[1]) * 1.5
    expected = 1.0 / (1.0 + np.exp(-(joint_features(sets) @ theta)))
    sets.rewards = (rng.random(len(expected)) < expected).astype(float)
    return sets, expected


def test_banditron_batch_of_one_is_the_per_event_update() -> None:
    """Batch of one: w += φ(x, c̃)·r/P(c̃) − φ(x, ĉ), exactly (docs/algorithms.md §2 on φ)."""
    rng = np.random.default_rng(3)
    learner = CandidateBanditron(D_X, D_C, gamma=0.2, seed=2)
    w = np.zeros(learner.dim)
    for _ in range(50):
        sets = random_sets(rng, 1)
        assert sets.rewards is not None
        decision = learner.decide(sets)
        phi = joint_features(sets)
        c_hat = int(np.argmax(phi @ w))  # the reference's own exploit choice
        assert c_hat == int(decision.exploit[0])
        c = int(decision.chosen[0])
        r = float(sets.rewards[c] > 0.5)
        w = w + phi[c] * r / decision.probs[c] - phi[c_hat]
        learner.update(phi[[c]], np.array([r]), decision.probs[[c]], phi[[c_hat]])
        np.testing.assert_allclose(learner.weights_, w)


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_each_learner_has_far_less_regret_than_playing_at_random(index: int) -> None:
    sets, expected = linear_stream(20_000, seed=4)
    result = replay_candidates(learners()[index], sets, batch_size=32, expected=expected)
    best = expected[segment_argmax(expected, sets.offsets)]
    uniform_regret = float(np.mean(best - np.add.reduceat(expected, sets.offsets[:-1]) / sets.sizes))
    print(type(learners()[index]).__name__, result.mean_regret, uniform_regret)
    assert result.mean_regret < 0.15 * uniform_regret


@pytest.mark.parametrize("index", [0, 2])
def test_slates_learn_every_slot_and_rank_better_candidates_first(index: int) -> None:
    sets, expected = linear_stream(10_000, seed=6)
    learner = learners()[index]
    result = replay_candidates(learner, sets, batch_size=32, expected=expected, slots=3)
    assert result.slot_error_rates is not None and result.slot_regrets is not None
    chosen = result.chosen
    filled = chosen >= 0
    assert (filled[:, 0]).all() and (filled.sum(axis=1) == np.minimum(sets.sizes, 3)).all()
    for row in chosen:  # distinct candidates of the request in its slots
        placed = row[row >= 0]
        assert len(set(placed.tolist())) == len(placed)
    assert (result.propensities[filled] > 0).all()
    print(type(learner).__name__, result.slot_error_rates, result.slot_regrets)
    assert result.slot_error_rates[0] < result.slot_error_rates[2]  # better candidates first
    assert max(result.slot_regrets) < 0.1


def test_slate_slot_propensities_are_the_conditional_sampling_frequencies() -> None:
    """One request decided 30,000 times: given slot 1, slot 2's candidates come with the
    frequencies its logged propensities say (χ²), and they sum to 1 over the remaining."""
    learner = trained(CandidateSquareCB(D_X, D_C, seed=4), 2)
    one = random_sets(np.random.default_rng(8), 1, max_size=5)
    while one.sizes[0] < 4:
        one = random_sets(np.random.default_rng(int(one.sizes[0]) + 100), 1, max_size=5)
    n, size = 30_000, int(one.sizes[0])
    learner.n_requests_ = 10**6
    slate = learner.decide_slate(one.take(np.zeros(n, dtype=np.int64)), np.full(n, 2),
                                 keys=np.arange(n))
    first, second = slate.chosen[:, 0] % size, slate.chosen[:, 1] % size
    top = np.bincount(first, minlength=size).argmax()
    given_top = first == top
    p2 = np.zeros(size)
    p2[second[given_top]] = slate.slot_probs[given_top, 1]
    assert abs(p2.sum() - 1.0) < 1e-5 and p2[top] == 0.0  # λ_t moves by < 3 % over the copies
    counts = np.bincount(second[given_top], minlength=size)
    keep = p2 > 0
    m = int(given_top.sum())
    chi2 = float((((counts[keep] - m * p2[keep]) ** 2) / (m * p2[keep])).sum())
    assert chi2 < 18.47  # χ² with ≤ 4 degrees of freedom at p = 0.001


def test_replay_command_on_a_candidate_stream(capsys: pytest.CaptureFixture[str]) -> None:
    """`streamlearn replay` dispatches candidate-set datasets, slates included; a batch
    whose requests all have fewer candidates than --slots is filled as far as it goes."""
    import orjson

    from streamlearn.cli import main

    assert main(["replay", "--dataset", "synthetic-candidates", "--rounds", "3000",
                 "--learner", "epsilon-greedy", "--slots", "3", "--batch-size", "1",
                 "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["requests"] == 3000 and len(report["slot_error_rates"]) == 3
    assert report["mean_regret"] < 0.2
    assert main(["replay", "--dataset", "synthetic-candidates", "--learner", "pnorm"]) == 2
    assert "candidate-set stream" in capsys.readouterr().err
    assert main(["replay", "--dataset", "synsep", "--rounds", "100", "--slots", "2"]) == 2


@given(st.lists(st.lists(st.sampled_from([-np.inf, -1.0, 0.0, 0.5, 1.0, np.inf, np.nan]),
                         min_size=1, max_size=6), min_size=1, max_size=8))
def test_segment_argmax_is_each_segments_first_largest_value(segments: list[list[float]]) -> None:
    values = np.array([v for seg in segments for v in seg])
    offsets = np.concatenate([[0], np.cumsum([len(seg) for seg in segments])])
    expected, start = [], 0
    for seg in segments:  # the reference: NaN below everything (-inf too), ties to the first
        ranked = [(0, 0.0) if np.isnan(v) else (1, v) for v in seg]
        expected.append(start + ranked.index(max(ranked)))
        start += len(seg)
    assert segment_argmax(values, offsets).tolist() == expected


@pytest.mark.parametrize("learner", learners(), ids=lambda learner: type(learner).__name__)
def test_a_slate_mixture_logs_the_mixture_and_at_share_zero_changes_nothing(
        learner: CandidateLearner) -> None:
    """A ranker at share 0 leaves every slate and propensity as the learner alone decides it;
    at share 1 it places every slot (served_by its version) with 1 − γ + γ/n on its best
    remaining candidate; at 0.5 every propensity is ½·π_ranker + ½·q_learner of its slot
    and the ranker places about half the slots."""
    learner = trained(learner, 3)
    sets = random_sets(np.random.default_rng(5), 400)
    slots = np.full(len(sets), 3)
    keys = [f"r{i}" for i in range(len(sets))]
    scores = np.random.default_rng(6).normal(size=len(sets.items))
    start = learner.n_requests_
    alone = learner.decide_slate(sets, slots, keys=keys)
    learner.n_requests_ = start  # SquareCB's λ_t moves with the requests seen
    zero = learner.decide_slate(sets, slots, keys=keys,
                                mixture=SlateMixture((7,), (0.0,), (scores,)))
    np.testing.assert_array_equal(zero.chosen, alone.chosen)
    np.testing.assert_allclose(zero.slot_probs, alone.slot_probs)
    assert not zero.served_by.any() and not alone.served_by.any()
    np.testing.assert_allclose(zero.gamma, alone.gamma)

    learner.n_requests_ = start
    full = learner.decide_slate(sets, slots, keys=keys,
                                mixture=SlateMixture((7,), (1.0,), (scores,)))
    used = full.chosen >= 0
    assert (full.served_by[used] == 7).all() and (full.served_by[~used] == 0).all()
    best = segment_argmax(scores, sets.offsets)
    first_is_best = full.chosen[:, 0] == best
    n = sets.sizes
    expected = np.where(first_is_best, 1 - full.gamma + full.gamma / n, full.gamma / n)
    np.testing.assert_allclose(full.slot_probs[:, 0], expected)

    learner.n_requests_ = start
    half = learner.decide_slate(sets, slots, keys=keys,
                                mixture=SlateMixture((7,), (0.5,), (scores,)))
    used = half.chosen >= 0
    assert 0.4 < (half.served_by[used] == 7).mean() < 0.6
    ranker = np.where(half.chosen[:, 0] == best, 1 - half.gamma + half.gamma / n, half.gamma / n)
    learner_p = alone.probs[half.chosen[:, 0]]
    np.testing.assert_allclose(half.slot_probs[:, 0], 0.5 * ranker + 0.5 * learner_p)
