"""Conformance suite applied to every learner found in ``streamlearn.learners.LEARNERS``.

Each learner at batch size 1 is compared numerically with a naive per-event
reference kept in this file (~20 lines each). A learner without a reference
fails ``test_every_learner_has_a_reference``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np
import pytest

from streamlearn.errors import ConfigError
from streamlearn.features import SparseBatch
from streamlearn.learners import (
    LEARNERS,
    Adaptive,
    Banditron,
    ExpGradientBandit,
    FixedGamma,
    Learner,
    MarginAware,
    PNormBandit,
    load_learner,
    save_learner,
)
from streamlearn.learners.randomness import sample, uniforms

K, D = 4, 12
SEED = 3


def make_stream(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(K, D))
    y = rng.integers(0, K, size=n)
    X = centres[y] + 0.8 * rng.normal(size=(n, D))
    X[:, -1] = 1.0  # bias feature
    return X, y


def build(name: str, **extra: float) -> Learner:
    hyper = {"eg": {"eta": 0.05}}.get(name, {})
    hyper.update(extra)
    return LEARNERS[name](K, D, FixedGamma(0.1), seed=SEED, **hyper)


# ---------------------------------------------------------------- naive references
def _draw(W: np.ndarray, x: np.ndarray, gamma: float, key: int) -> tuple[int, int, np.ndarray]:
    """ŷ = argmax Wx, P = (1-γ)1[ŷ] + γ/K, ỹ sampled with the keyed uniform."""
    yhat = int(np.argmax(W @ x))
    P = np.full(K, gamma / K)
    P[yhat] += 1 - gamma
    ytilde = int(sample(P[None, :], uniforms(SEED, np.array([key])))[0])
    return yhat, ytilde, P


def ref_banditron(X: np.ndarray, y: np.ndarray, gamma: float) -> tuple[list[int], np.ndarray]:
    W = np.zeros((K, D))
    actions = []
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        yhat, ytilde, P = _draw(W, x, gamma, t + 1)
        actions.append(ytilde)
        W[ytilde] += (ytilde == label) * x / P[ytilde]
        W[yhat] -= x
    return actions, W


def ref_pnorm(X: np.ndarray, y: np.ndarray, gamma: float, q: float) -> tuple[list[int], np.ndarray]:
    theta = np.zeros((K, D))
    W = np.zeros((K, D))
    actions = []
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        yhat, ytilde, P = _draw(W, x, gamma, t + 1)
        actions.append(ytilde)
        theta[ytilde] += (ytilde == label) * x / P[ytilde]
        theta[yhat] -= x
        norm = np.sum(np.abs(theta) ** q) ** (1 / q)
        W = np.sign(theta) * np.abs(theta) ** (q - 1) / norm ** (q - 2)
    return actions, theta


def ref_eg(X: np.ndarray, y: np.ndarray, gamma: float, eta: float) -> tuple[list[int], np.ndarray]:
    theta = np.zeros((K, 2 * D))  # dual of [x; -x], not re-centred
    actions = []
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        w = np.exp(eta * theta)
        yhat, ytilde, P = _draw(w[:, :D] - w[:, D:], x, gamma, t + 1)
        actions.append(ytilde)
        u = np.zeros((K, D))
        u[ytilde] += (ytilde == label) * x / P[ytilde]
        u[yhat] -= x
        theta += np.hstack([u, -u])
    return actions, theta - theta.max()


def ref_perceptron(X: np.ndarray, y: np.ndarray, gamma: float) -> tuple[list[int], np.ndarray]:
    W = np.zeros((K, D))
    actions = []
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        yhat, ytilde, _ = _draw(W, x, gamma, t + 1)
        actions.append(ytilde)
        if yhat != label:
            W[label] += x
            W[yhat] -= x
    return actions, W


def ref_epsilon_greedy(X: np.ndarray, y: np.ndarray, gamma: float, lr: float
                       ) -> tuple[list[int], np.ndarray]:
    W = np.zeros((K, D))
    actions = []
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        _, ytilde, _ = _draw(W, x, gamma, t + 1)
        actions.append(ytilde)
        W[ytilde] += lr * (float(ytilde == label) - W[ytilde] @ x) * x / (x @ x)
    return actions, W


REFERENCES: dict[str, tuple[Callable[..., tuple[list[int], np.ndarray]], dict[str, float], str]] = {
    "banditron": (ref_banditron, {}, "weights_"),
    "pnorm": (ref_pnorm, {"q": 3.0}, "theta_"),
    "eg": (ref_eg, {"eta": 0.05}, "theta_"),
    "perceptron": (ref_perceptron, {}, "weights_"),
    "epsilon-greedy": (ref_epsilon_greedy, {"lr": 0.5}, "weights_"),
}

NAMES = sorted(LEARNERS)


def run_per_event(learner: Learner, X: np.ndarray, y: np.ndarray) -> list[int]:
    actions = []
    for t in range(len(y)):
        a, probs = learner.decide(X[t:t + 1], keys=np.array([t + 1]))
        actions.append(int(a[0]))
        if learner.full_information:
            learner.update(X[t:t + 1], y[t:t + 1], np.ones(1), probs)
        else:
            learner.update(X[t:t + 1], a, (a == y[t:t + 1]).astype(float), probs)
    return actions


def test_every_learner_has_a_reference() -> None:
    assert set(REFERENCES) == set(LEARNERS)


@pytest.mark.parametrize("name", NAMES)
def test_batch_of_one_equals_naive_reference(name: str) -> None:
    X, y = make_stream()
    reference, hyper, attr = REFERENCES[name]
    learner = build(name, **hyper)
    actions = run_per_event(learner, X, y)
    ref_actions, ref_state = reference(X, y, 0.1, **hyper)
    assert actions == ref_actions
    np.testing.assert_allclose(getattr(learner, attr), ref_state, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_clone_is_idempotent_and_unfitted(name: str) -> None:
    learner = build(name)
    X, y = make_stream(50)
    run_per_event(learner, X, y)
    clone = learner.clone()
    assert type(clone) is type(learner)
    assert repr(clone) == repr(learner) == repr(clone.clone())
    assert clone.n_decided_ == 0
    fresh = build(name)
    np.testing.assert_array_equal(clone.predict(X), fresh.predict(X))


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_and_keys_give_same_decisions(name: str) -> None:
    X, _ = make_stream(64)
    keys = np.array([f"event-{i}" for i in range(64)])
    a1, p1 = build(name).decide(X, keys=keys)
    a2, p2 = build(name).decide(X, keys=keys)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(p1, p2)
    a3, _ = LEARNERS[name](K, D, FixedGamma(0.1), seed=SEED + 1).decide(X, keys=keys)
    assert not np.array_equal(a1, a3)  # a different seed explores differently


@pytest.mark.parametrize("name", NAMES)
def test_update_never_mutates_inputs(name: str) -> None:
    learner = build(name)
    X, y = make_stream(32)
    actions, probs = learner.decide(X)
    rewards = (actions == y).astype(float)
    copies = [a.copy() for a in (X, actions, rewards, probs)]
    learner.update(X, actions, rewards, probs)
    for before, after in zip(copies, (X, actions, rewards, probs), strict=True):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("name", NAMES)
def test_save_load_gives_identical_next_decisions(name: str, tmp_path: object) -> None:
    learner = LEARNERS[name](K, D, MarginAware(Adaptive(window=50)), seed=SEED,
                             **({"eta": 0.05} if name == "eg" else {}))
    X, y = make_stream(200)
    run_per_event(learner, X[:150], y[:150])
    path = f"{tmp_path}/state"
    save_learner(learner, path)
    restored = load_learner(path)
    twin = copy.deepcopy(learner)  # deepcopy goes through state() too
    keys = np.arange(150, 200)
    a_orig, p_orig = learner.decide(X[150:], keys=keys)
    for other in (restored, twin):
        a_other, p_other = other.decide(X[150:], keys=keys)
        np.testing.assert_array_equal(a_orig, a_other)
        np.testing.assert_array_equal(p_orig, p_other)


@pytest.mark.parametrize("name", NAMES)
def test_mask_restricts_actions_and_renormalises(name: str) -> None:
    learner = build(name)
    X, y = make_stream(200)
    run_per_event(learner, X[:100], y[:100])
    mask = np.zeros((100, K), dtype=bool)
    mask[:, 1] = True
    mask[::2, 3] = True
    actions, probs = learner.decide(X[100:], mask=mask)
    assert mask[np.arange(100), actions].all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert (probs[~mask] == 0).all()
    single = ~mask[:, 3]
    np.testing.assert_array_equal(probs[single, 1], 1.0)


@pytest.mark.parametrize("name", NAMES)
def test_probs_are_a_distribution_peaked_at_the_exploit_action(name: str) -> None:
    learner = build(name)
    X, y = make_stream(200)
    run_per_event(learner, X[:100], y[:100])
    _, probs = learner.decide(X[100:])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    np.testing.assert_array_equal(np.argmax(probs, axis=1), learner.predict(X[100:]))


@pytest.mark.parametrize("name", NAMES)
def test_sparse_and_dense_batches_agree(name: str) -> None:
    X, y = make_stream(120)
    rows = [np.flatnonzero(r).tolist() for r in X]
    sparse = SparseBatch.from_rows(rows, [X[i, r].tolist() for i, r in enumerate(rows)], D)
    dense_learner, sparse_learner = build(name), build(name)
    for lo in range(0, 120, 16):
        idx = np.arange(lo, min(120, lo + 16))
        for learner, batch in ((dense_learner, X[idx]), (sparse_learner, sparse.take(idx))):
            a, p = learner.decide(batch, keys=idx)
            rewards = (a == y[idx]).astype(float)
            learner.update(batch, y[idx] if learner.full_information else a,
                           np.ones(len(idx)) if learner.full_information else rewards, p)
    np.testing.assert_allclose(dense_learner.decision_scores(X), sparse_learner.decision_scores(X),
                               rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_learner_has_numpydoc_with_example(name: str) -> None:
    doc = LEARNERS[name].__doc__ or ""
    assert "Examples" in doc and ">>>" in doc


@pytest.mark.parametrize("name", NAMES)
def test_bad_inputs_raise_config_errors(name: str) -> None:
    learner = build(name)
    with pytest.raises(ConfigError, match="features"):
        learner.decide(np.zeros((2, D + 1)))
    X, _ = make_stream(4)
    a, p = learner.decide(X)
    with pytest.raises(ConfigError, match="Rewards"):
        learner.update(X, a, np.array([0, 1, 2, 0.0]), p)
    with pytest.raises(ConfigError, match="mask"):
        learner.decide(X, mask=np.zeros((4, K), dtype=bool))


def test_gamma_validation_message() -> None:
    with pytest.raises(ConfigError, match=r"The 'gamma' parameter of FixedGamma must be a float in "
                                          r"\(0, 0.5\]. Got 0.7 instead."):
        FixedGamma(0.7)


def test_pnorm_with_q2_is_exactly_banditron() -> None:
    X, y = make_stream(400)
    band = Banditron(K, D, FixedGamma(0.05), seed=1)
    pnorm = PNormBandit(K, D, FixedGamma(0.05), q=2.0, eta=0.3, seed=1)
    for lo in range(0, 400, 7):
        idx = np.arange(lo, min(400, lo + 7))
        outs = [lr.decide(X[idx], keys=idx) for lr in (band, pnorm)]
        np.testing.assert_array_equal(outs[0][0], outs[1][0])
        for lr, (a, p) in zip((band, pnorm), outs, strict=True):
            lr.update(X[idx], a, (a == y[idx]).astype(float), p)
    np.testing.assert_allclose(pnorm.theta_ / 0.3, band.weights_, rtol=1e-12)


def test_eg_stays_finite_over_a_million_rounds() -> None:
    rng = np.random.default_rng(0)
    learner = ExpGradientBandit(K, D, FixedGamma(0.05), eta=0.001, seed=0)
    for _ in range(1000):  # 1,000 batches of 1,000 = 10⁶ rounds
        X = rng.normal(size=(1000, D))
        y = (X[:, 0] > 0).astype(int) + 2 * (X[:, 1] > 0)
        a, p = learner.decide(X)
        learner.update(X, a, (a == y).astype(float), p)
    theta = learner.theta_
    assert np.isfinite(theta).all() and np.isfinite(learner.decision_scores(X)).all()
    assert theta.max() == 0.0
    assert learner.n_updated_ == 1_000_000
    assert np.mean(learner.predict(X) == y) > 0.9  # and it still learns


def test_banditron_update_is_unbiased() -> None:
    """Mean of many sampled Banditron updates ≈ the Perceptron update (and exactly in expectation)."""
    from streamlearn.learners.banditron import banditron_coefficients

    rng = np.random.default_rng(5)
    gamma, label, yhat = 0.2, 2, 0
    P = np.full(K, gamma / K)
    P[yhat] += 1 - gamma
    perceptron = np.zeros(K)
    perceptron[label] += 1.0
    perceptron[yhat] -= 1.0
    # exact expectation over ỹ
    exact = sum(P[a] * banditron_coefficients(np.array([a]), np.array([float(a == label)]),
                                              P[None, :])[0] for a in range(K))
    np.testing.assert_allclose(exact, perceptron, atol=1e-12)
    # sampled: 400,000 draws through the keyed sampler
    n = 400_000
    probs = np.tile(P, (n, 1))
    actions = sample(probs, uniforms(11, rng.permutation(n)))
    coef = banditron_coefficients(actions, (actions == label).astype(float), probs)
    sem = coef.std(axis=0) / math.sqrt(n)
    assert np.all(np.abs(coef.mean(axis=0) - perceptron) < 4 * sem + 1e-12)


def test_sampler_frequencies_match_probabilities() -> None:
    P = np.array([0.7, 0.1, 0.0, 0.2])
    n = 200_000
    actions = sample(np.tile(P, (n, 1)), uniforms(2, np.arange(n)))
    freq = np.bincount(actions, minlength=4) / n
    assert freq[2] == 0.0
    np.testing.assert_allclose(freq, P, atol=4 * math.sqrt(0.25 / n))
