"""Conformance suite applied to every learner found in ``streamlearn.learners.LEARNERS``.

Each learner at batch size 1 is compared numerically with a naive per-event
reference kept in this file (~20 lines each). A learner without a reference
fails ``test_every_learner_has_a_reference``.
"""

from __future__ import annotations

import copy
import functools
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


class NaiveOracle:
    """VW's adaptive, normalised, invariant squared-loss update, one event at a time (gd.cc)."""

    def __init__(self, outputs: int, lr: float = 0.5, initial: float = 0.0) -> None:
        self.W, self.b = np.zeros((outputs, D)), np.full(outputs, initial)
        self.G, self.Gb, self.N = np.zeros((outputs, D)), np.zeros(outputs), np.zeros(D)
        self.tw = self.nsnx = 0.0
        self.lr = lr

    def mean(self, x: np.ndarray) -> np.ndarray:
        return np.clip(self.W @ x + self.b, 0.0, 1.0)

    def learn(self, x: np.ndarray, outs: list[int], ys: list[float], hs: list[float]) -> None:
        """One event updating distinct outputs ``outs`` (all from the same pre-event state)."""
        todo = [(o, yv, h, self.mean(x)[o]) for o, yv, h in zip(outs, ys, hs, strict=True)
                if h > 0 and self.mean(x)[o] != yv]
        if not todo:
            return
        N = np.maximum(self.N, np.abs(x))
        grown = (N > self.N) & (self.N > 0)
        self.W[:, grown] *= self.N[grown] / N[grown]
        self.N = N
        for o, yv, h, p in todo:
            self.G[o] += h * (2 * (p - yv)) ** 2 * x * x
            self.Gb[o] += h * (2 * (p - yv)) ** 2
        norm_x = np.sum(np.divide(x * x, N * N, out=np.zeros(D), where=N > 0)) + 1.0
        self.tw += sum(h for _, _, h, _ in todo)
        self.nsnx += sum(h * norm_x for _, _, h, _ in todo)
        M = np.sqrt(self.tw / self.nsnx)
        steps = []
        for o, yv, h, p in todo:
            denom = np.sqrt(self.G[o]) * N
            r = np.divide(1.0, denom, out=np.zeros(D), where=denom > 0)
            rb = 1 / np.sqrt(self.Gb[o])
            s = M * (x * x @ r + rb)
            u = (yv - p) * (1 - np.exp(-2 * self.lr * h * s)) / s if self.lr * h * s >= 1e-6 else (
                2 * (yv - p) * self.lr * h)
            steps.append((o, u * M * x * r, u * M * rb))
        for o, dw, db in steps:
            self.W[o] += dw
            self.b[o] += db


def _keyed(P: np.ndarray, key: int) -> int:
    return int(sample(P[None, :], uniforms(SEED, np.array([key])))[0])


def ref_epsilon_greedy(X: np.ndarray, y: np.ndarray, gamma: float,
                       initial: float) -> tuple[list[int], np.ndarray]:
    oracle, actions = NaiveOracle(K, initial=initial), []
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        P = np.full(K, gamma / K)
        P[np.argmax(oracle.W @ x + oracle.b)] += 1 - gamma
        a = _keyed(P, t + 1)
        actions.append(a)
        oracle.learn(x, [a], [float(a == label)], [1.0])
    return actions, oracle.W


def ref_squarecb(X: np.ndarray, y: np.ndarray, gamma: float) -> tuple[list[int], np.ndarray]:
    oracle, actions = NaiveOracle(K, initial=1.0), []
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        best, mu = int(np.argmax(oracle.W @ x + oracle.b)), oracle.mean(x)
        P = 1.0 / (K + (K / gamma) * (mu[best] - mu))  # inverse gap weighting, λ = K/γ
        P[best] = 0.0
        P[best] = max(1.0 - P.sum(), 1.0 / K)
        a = _keyed(P / P.sum(), t + 1)
        actions.append(a)
        oracle.learn(x, [a], [float(a == label)], [1.0])
    return actions, oracle.W


def ref_bag(X: np.ndarray, y: np.ndarray, gamma: float, n_bags: int,
            initial: float) -> tuple[list[int], np.ndarray]:
    oracle, actions = NaiveOracle(n_bags * K, initial=initial), []
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        votes = np.zeros(K)
        for n in range(n_bags):  # each copy votes for its best actions, ties split
            mu = oracle.mean(x)[n * K:(n + 1) * K]
            votes += (mu == mu.max()) / np.sum(mu == mu.max()) / n_bags
        P = (1 - gamma) * votes + gamma / K
        a = _keyed(P / P.sum(), t + 1)
        actions.append(a)
        keys = np.array([(1 << 63) | (t * n_bags + n) for n in range(n_bags)], dtype=np.uint64)
        counts = np.searchsorted(np.cumsum([np.exp(-1) / math.factorial(k) for k in range(20)]),
                                 uniforms(SEED, keys), side="right")  # Poisson(1)
        oracle.learn(x, [n * K + a for n in range(n_bags)], [float(a == label)] * n_bags,
                     list(counts / (K * P[a] / P.sum())))
    return actions, oracle.W


def ref_linucb(X: np.ndarray, y: np.ndarray, gamma: float, alpha: float,
               full: bool = True) -> tuple[list[int], np.ndarray]:
    """Full mode: exact ridge. Diagonal mode: means from the oracle, widths from diag(A)."""
    A, b, actions = np.tile(np.eye(D + 1), (K, 1, 1)), np.zeros((K, D + 1)), []
    oracle = NaiveOracle(K, initial=0.5)  # diagonal mode's means
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        z = np.append(x, 1.0)
        cov = [np.linalg.inv(A[k]) if full else np.diag(1 / np.diag(A[k])) for k in range(K)]
        means = [cov[k] @ b[k] @ z for k in range(K)] if full else oracle.W @ x + oracle.b
        ucb = [means[k] + alpha * np.sqrt(z @ cov[k] @ z) for k in range(K)]
        P = np.full(K, gamma / K)
        P[int(np.argmax(ucb))] += 1 - gamma
        a = _keyed(P, t + 1)
        actions.append(a)
        A[a] += np.outer(z, z)
        b[a] += float(a == label) * z
        oracle.learn(x, [a], [float(a == label)], [1.0])
    if not full:
        return actions, oracle.W
    return actions, np.array([np.linalg.solve(A[k], b[k]) for k in range(K)])


def ref_lints(X: np.ndarray, y: np.ndarray, gamma: float, scale: float,
              n_samples: int) -> tuple[list[int], np.ndarray]:
    A, b, actions = np.tile(np.eye(D + 1), (K, 1, 1)), np.zeros((K, D + 1)), []
    normals = np.random.default_rng([SEED, 0x7415]).standard_normal((n_samples, K))
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        z = np.append(x, 1.0)
        mean = np.array([np.linalg.solve(A[k], b[k]) @ z for k in range(K)])
        width = np.array([np.sqrt(z @ np.linalg.solve(A[k], z)) for k in range(K)])
        best = np.argmax(mean + scale * width * normals, axis=1)  # one posterior draw per row
        P = (1 - gamma) * np.bincount(best, minlength=K) / n_samples + gamma / K
        a = _keyed(P / P.sum(), t + 1)
        actions.append(a)
        A[a] += np.outer(z, z)
        b[a] += float(a == label) * z
    return actions, np.array([np.linalg.solve(A[k], b[k]) for k in range(K)])


def ref_newtron(X: np.ndarray, y: np.ndarray, gamma: float, alpha: float, beta: float,
                full: bool = True, play: str = "greedy") -> tuple[list[int], np.ndarray]:
    W, A, actions = np.zeros((K, D)), np.eye(K * D), []  # A₀ = I/D with D (radius) = 1
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        s = W @ x
        s = np.where(s >= s.max() - 1e-9 * (1 + abs(s.max())), s.max(), s)
        p = np.exp(alpha * (s - s.max())) / np.exp(alpha * (s - s.max())).sum()
        near = s >= s.max() - 1e-9 * (1 + abs(s.max()))  # near-ties count as ties (lowest index)
        P = (1 - gamma) * (p if play == "softmax" else np.eye(K)[np.argmax(near)]) + gamma / K
        a = _keyed(P / P.sum(), t + 1)
        actions.append(a)
        e = np.eye(K)[a] - 1.0 / K
        g = alpha * np.kron(-(1 - p[a]) / P[a] * e if a == label else p[a] / P[a] * e, x)
        kappa = P[a] if a == label else 1.0
        A += kappa * beta * (np.outer(g, g) if full else np.diag(g * g))
        W = W - np.linalg.solve(A, g).reshape(K, D)
    return actions, W


def ref_soba(X: np.ndarray, y: np.ndarray, gamma: float, a: float,
             full: bool = False) -> tuple[list[int], np.ndarray]:
    A = a * np.eye(K * D) if full else np.full(K * D, a)  # the full A or its diagonal
    W, theta, margin, actions = np.zeros((K, D)), np.zeros(K * D), 0.0, []
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        _, ytilde, P = _draw(W, x, gamma, t + 1)
        actions.append(ytilde)
        if ytilde == label:
            s = W @ x
            ybar = int(np.argmax(np.where(np.arange(K) == ytilde, -np.inf, s)))
            g = np.kron(np.eye(K)[ybar] - np.eye(K)[ytilde], x) / P[ytilde]
            z = np.sqrt(P[ytilde]) * g
            zAz = z @ np.linalg.solve(A, z) if full else np.sum(z * z / A)
            m = (np.sum(W.ravel() * z) ** 2 + 2 * np.sum(W.ravel() * g)) / (1 + zAz)
            if margin + m >= 0:
                margin += m
                A += np.outer(z, z) if full else z * z
                theta -= g
        W = (np.linalg.solve(A, theta) if full else theta / A).reshape(K, D)
    return actions, W


REFERENCES: dict[str, tuple[Callable[..., tuple[list[int], np.ndarray]], dict[str, float], str]] = {
    "banditron": (ref_banditron, {}, "weights_"),
    "pnorm": (ref_pnorm, {"q": 3.0}, "theta_"),
    "eg": (ref_eg, {"eta": 0.05}, "theta_"),
    "perceptron": (ref_perceptron, {}, "weights_"),
    "epsilon-greedy": (ref_epsilon_greedy, {"initial": 0.5}, "oracle_.weights_"),
    "squarecb": (ref_squarecb, {}, "oracle_.weights_"),
    "bag": (ref_bag, {"n_bags": 3, "initial": 0.5}, "oracle_.weights_"),
    "linucb": (ref_linucb, {"alpha": 0.3}, "posterior_.mean_"),
    "lints": (ref_lints, {"scale": 0.5, "n_samples": 16}, "posterior_.mean_"),
    "newtron": (ref_newtron, {"alpha": 2.0, "beta": 0.05}, "weights_"),
    "soba": (ref_soba, {"a": 1.0}, "weights_"),
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
    np.testing.assert_allclose(_attribute(learner, attr), ref_state, rtol=1e-9, atol=1e-9)


def _attribute(learner: Learner, dotted: str) -> np.ndarray:
    return np.asarray(functools.reduce(getattr, dotted.split("."), learner))


# learners in another mode than their default (full ↔ diagonal covariance, Newtron's softmax play)
OTHER_MODES: list[tuple[str, dict[str, float], Callable[..., tuple[list[int], np.ndarray]],
                        dict[str, float], str]] = [
    ("linucb", {"alpha": 0.3, "full_max_features": 1}, ref_linucb, {"alpha": 0.3, "full": False},
     "posterior_.oracle_.weights_"),
    ("newtron", {"alpha": 2.0, "beta": 0.05, "full_max_dim": 1}, ref_newtron,
     {"alpha": 2.0, "beta": 0.05, "full": False}, "weights_"),
    ("newtron", {"alpha": 2.0, "beta": 0.05, "play": "softmax"}, ref_newtron,
     {"alpha": 2.0, "beta": 0.05, "play": "softmax"}, "weights_"),
    ("soba", {"a": 1.0, "full_max_dim": 10_000}, ref_soba, {"a": 1.0, "full": True}, "weights_"),
]


@pytest.mark.parametrize(("name", "hyper", "reference", "ref_hyper", "attr"), OTHER_MODES,
                         ids=["linucb-diagonal", "newtron-diagonal", "newtron-softmax", "soba-full"])
def test_batch_of_one_equals_naive_reference_other_mode(
    name: str, hyper: dict[str, float], reference: Callable[..., tuple[list[int], np.ndarray]],
    ref_hyper: dict[str, float], attr: str,
) -> None:
    X, y = make_stream()
    learner = build(name, **hyper)
    actions = run_per_event(learner, X, y)
    ref_actions, ref_state = reference(X, y, 0.1, **ref_hyper)
    assert actions == ref_actions
    np.testing.assert_allclose(_attribute(learner, attr), ref_state, rtol=1e-9, atol=1e-9)


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


def test_soba_update_blocks_of_one_are_the_per_event_updates_in_event_order() -> None:
    """A batch's update in blocks of one event equals its events applied one at a time;
    larger blocks are the same per-event algorithm only when the batch is one block."""
    X, y = make_stream(256, seed=4)
    per_event, blocked = (build("soba", update_block=1) for _ in range(2))
    whole = build("soba", update_block=64)
    for lo in range(0, 256, 64):
        idx = np.arange(lo, lo + 64)
        actions, probs = blocked.decide(X[idx], keys=idx)
        rewards = (actions == y[idx]).astype(float)
        blocked.update(X[idx], actions, rewards, probs)
        whole.update(X[idx], actions, rewards, probs)
        for i in idx - lo:
            per_event.update(X[idx][i:i + 1], actions[i:i + 1], rewards[i:i + 1], probs[i:i + 1])
        np.testing.assert_allclose(blocked.weights_, per_event.weights_, rtol=1e-12, atol=1e-15)
    assert not np.allclose(whole.weights_, per_event.weights_)


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


def test_newtron_gradient_estimate_is_unbiased() -> None:
    """E over ỹ ~ P of Newtron's estimate = α(p − e_y) ⊗ x, projected to rows summing to zero."""
    from streamlearn.learners import Newtron

    rng = np.random.default_rng(6)
    x, label = rng.normal(size=D), 2
    learner = Newtron(K, D, FixedGamma(0.3), alpha=1.5, beta=1e-12, full_max_dim=0)
    learner.weights_ = rng.normal(size=(K, D))
    s = learner.weights_ @ x
    p = np.exp(1.5 * (s - s.max())) / np.exp(1.5 * (s - s.max())).sum()
    _, P = learner.decide(x[None, :])
    expected = np.zeros(K)
    for a in range(K):  # exact expectation: each action's estimate weighted by its probability
        twin = copy.deepcopy(learner)
        twin.curvature_.inverse_[:] = 1.0  # A⁻¹ = I and β ≈ 0: the step is the estimate itself
        twin._update(x[None, :], np.array([a]), np.array([float(a == label)]), P,
                     P.argmax(axis=1))
        expected += P[0, a] * (learner.weights_ - twin.weights_) @ x / (x @ x)
    gradient = 1.5 * (p - np.eye(K)[label])
    np.testing.assert_allclose(expected, gradient - gradient.mean(), atol=1e-9)
