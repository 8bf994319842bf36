"""The regression oracle against a naive per-event implementation of VW's gd update (and VW itself)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.errors import ConfigError
from streamlearn.features import SparseBatch
from streamlearn.learners.oracle import (
    RegressionOracle,
    _block_gram,
    _flow_steps,
    _joint_sensitivity,
    _output_blocks,
    lambert_wexpmx,
)


def naive_vw(X: np.ndarray, outs: np.ndarray, ys: np.ndarray, hs: np.ndarray, loss: str,
             n_outputs: int, lr: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """gd.cc's adaptive/normalised/invariant rule, one event and one output at a time."""
    d = X.shape[1]
    W, b, G, Gb, N = (np.zeros((n_outputs, d)), np.zeros(n_outputs), np.zeros((n_outputs, d)),
                      np.zeros(n_outputs), np.zeros(d))
    tw = nsnx = 0.0
    for x, o, yv, h in zip(X, outs, ys, hs, strict=True):
        raw = W[o] @ x + b[o]
        p = np.clip(raw, 0, 1) if loss == "squared" else raw
        g = 2 * (p - yv) if loss == "squared" else 1 / (1 + np.exp(-p)) - yv
        if h == 0 or g == 0:
            continue
        newN = np.maximum(N, np.abs(x))
        grown = (newN > N) & (N > 0)
        W[:, grown] *= N[grown] / newN[grown]
        N = newN
        G[o] += h * g * g * x * x
        Gb[o] += h * g * g
        tw += h
        nsnx += h * (np.sum(np.divide(x * x, N * N, out=np.zeros(d), where=N > 0)) + 1)
        M = np.sqrt(tw / nsnx)
        r = np.divide(1, np.sqrt(G[o]) * N, out=np.zeros(d), where=G[o] * N > 0)
        s, eta = M * (x * x @ r + 1 / np.sqrt(Gb[o])), lr * h
        if loss == "squared":
            u = (yv - p) * (1 - np.exp(-2 * eta * s)) / s
        else:  # VW's logloss::get_update with the label mixed as in get_update
            u = 0.0
            for label, weight in ((1.0, yv), (-1.0, 1 - yv)):
                dd = np.exp(label * p)
                w = lambert_wexpmx(np.array([eta * s + label * p + dd]))[0]
                u += weight * -(label * w + p) / s
        W[o] += u * M * x * r
        b[o] += u * M / np.sqrt(Gb[o])
    return W, b


def stream(n: int = 400, d: int = 6, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 5.0, size=d)
    X[rng.random((n, d)) < 0.3] = 0.0  # some zeros, as in sparse data
    y = np.clip(0.5 + 0.2 * X[:, 0] - 0.1 * X[:, 1] + 0.1 * rng.normal(size=n), 0, 1)
    return X, y


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_batch_of_one_equals_the_naive_per_event_rule(loss: str) -> None:
    X, y = stream()
    rng = np.random.default_rng(1)
    outs, hs = rng.integers(0, 3, size=len(y)), rng.choice([0.0, 0.5, 1.0, 3.0], size=len(y))
    oracle = RegressionOracle(3, X.shape[1], loss=loss)
    for i in range(len(y)):
        oracle.update(X[i:i + 1], outs[i:i + 1, None], y[i:i + 1, None], hs[i:i + 1, None])
    W, b = naive_vw(X, outs, y, hs, loss, 3)
    np.testing.assert_allclose(oracle.weights_, W, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(oracle.intercept_, b, rtol=1e-9, atol=1e-12)


def test_matches_vowpal_wabbit_itself() -> None:
    pyvw = pytest.importorskip("vowpalwabbit.pyvw")
    X, y = stream(300, 3)
    vw = pyvw.Workspace("--quiet --min_prediction 0 --max_prediction 1")
    oracle = RegressionOracle(1, 3)
    for i in range(len(y)):
        line = f"{y[i]:.9g} | " + " ".join(f"f{j}:{v:.9g}" for j, v in enumerate(X[i]) if v != 0)
        ex = vw.parse(line)
        vw.learn(ex)
        vw_pred = ex.get_simplelabel_prediction()  # predicted before learning, clipped to [0, 1]
        vw.finish_example(ex)
        ours = float(np.clip(oracle.predict(X[i:i + 1])[0, 0], 0, 1))
        assert abs(vw_pred - ours) < 1e-5  # VW stores float32
        oracle.update(X[i:i + 1], np.zeros((1, 1), int), y[i:i + 1, None], np.ones((1, 1)))
    vw.finish()


def test_dense_and_sparse_batches_agree_and_only_touched_columns_move() -> None:
    X, y = stream(320, 8)
    X[:, 7] = 0.0  # a column no event uses
    rows = [np.flatnonzero(r).tolist() for r in X]
    sparse = SparseBatch.from_rows(rows, [X[i, r].tolist() for i, r in enumerate(rows)], 8)
    outs = np.random.default_rng(2).integers(0, 4, size=(320, 2))
    outs[:, 1] = (outs[:, 0] + 1) % 4  # two distinct outputs per event, as bagging updates them
    dense_oracle, sparse_oracle = RegressionOracle(4, 8), RegressionOracle(4, 8)
    for lo in range(0, 320, 32):
        idx = np.arange(lo, lo + 32)
        targets, weights = np.repeat(y[idx, None], 2, axis=1), np.ones((32, 2))
        dense_oracle.update(X[idx], outs[idx], targets, weights)
        sparse_oracle.update(sparse.take(idx), outs[idx], targets, weights)
    np.testing.assert_allclose(dense_oracle.weights_, sparse_oracle.weights_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dense_oracle.predict(X), sparse_oracle.predict(sparse), rtol=1e-10)
    assert not dense_oracle.weights_[:, 7].any() and not dense_oracle.sq_grad_[:, 7].any()


def test_n_identical_events_in_a_batch_move_like_one_event_of_importance_n() -> None:
    x = np.array([[1.0, -2.0, 0.5]])
    batch = RegressionOracle(1, 3)
    batch.update(np.repeat(x, 5, axis=0), np.zeros((5, 1), int), np.ones((5, 1)), np.ones((5, 1)))
    single = RegressionOracle(1, 3)
    single.update(x, np.zeros((1, 1), int), np.ones((1, 1)), np.full((1, 1), 5.0))
    np.testing.assert_allclose(batch.predict(x), single.predict(x), rtol=1e-12)
    assert batch.predict(x)[0, 0] <= 1.0  # the invariant update never overshoots the target


def batch_gram(X: np.ndarray, out: np.ndarray, rate: np.ndarray, rate_b: np.ndarray) -> np.ndarray:
    """⟨x_e, x_f⟩ in the metric of update e's output, for every pair (the naive reference)."""
    return np.asarray((X * rate[out]) @ X.T + rate_b[out][:, None])


def blocks_of(gram: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The per-output blocks of a full Gram matrix, as the oracle forms them."""
    index, valid = _output_blocks(out)
    return gram[index[:, :, None], index[:, None, :]], index, valid


def test_joint_sensitivity_counts_only_the_updates_pushing_the_same_way() -> None:
    """Same output: events pulling one way add to each other's sensitivity; events pulling
    against them (or moving another output, or orthogonal) do not."""
    x, other = np.array([1.0, 2.0, 0.0]), np.array([0.0, 0.0, 3.0])
    X = np.vstack([x, x, x, -x, other, x])
    out = np.array([0, 0, 0, 0, 0, 1])
    direction = np.array([1.0, 1.0, -1.0, -1.0, 1.0, 1.0])  # row 3: -x pulled down = x pushed up
    rate, rate_b = np.full((2, 3), 0.5), np.zeros(2)
    q = 0.5 * float(x @ x)
    expected = [3 * q, 3 * q, q, 3 * q, 0.5 * float(other @ other), q]
    blocks = blocks_of(batch_gram(X, out, rate, rate_b), out)
    np.testing.assert_allclose(_joint_sensitivity(*blocks, direction), expected)


def integrated_flow(gram: np.ndarray, h: np.ndarray, residual: np.ndarray, rate: float,
                    n_steps: int = 2000) -> np.ndarray:
    """RK4 on d(st)/dt = −rate·H·r, dr/dt = gram·d(st)/dt from r(0) = residual, t ∈ [0, 1]."""
    def velocity(r: np.ndarray) -> np.ndarray:
        return -rate * h * r

    st, r, dt = np.zeros_like(residual), residual.copy(), 1.0 / n_steps
    for _ in range(n_steps):
        k1 = velocity(r)
        k2 = velocity(r + 0.5 * dt * gram @ k1)
        k3 = velocity(r + 0.5 * dt * gram @ k2)
        k4 = velocity(r + dt * gram @ k3)
        step = dt * (k1 + 2 * k2 + 2 * k3 + k4) / 6
        st, r = st + step, r + gram @ step
    return st


def flow_steps(gram: np.ndarray, out: np.ndarray, h: np.ndarray, residual: np.ndarray,
               rate: float) -> np.ndarray:
    """_flow_steps on the blocks of a full Gram matrix."""
    return _flow_steps(*blocks_of(gram, out), h, residual, rate)


def test_the_squared_batch_step_is_the_exact_gradient_flow_of_each_outputs_batch_loss() -> None:
    """Per output, the closed form matches the integrated flow; outputs do not interact."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(9, 4))
    X[3] = X[1]  # a repeated event
    X[4] = -X[2]  # and one pulling against another
    out = np.array([0, 1, 1, 1, 1, 2, 1, 2, 0])
    h = rng.uniform(0.2, 3.0, size=9)
    residual = rng.uniform(-1.0, 1.0, size=9)
    gram = 0.3 * batch_gram(X, out, rng.uniform(0.1, 1.0, size=(3, 4)), np.array([0.2, 0.5, 0.1]))
    steps = flow_steps(gram, out, h, residual, rate=1.7)
    for o in range(3):
        rows = np.flatnonzero(out == o)
        block = gram[np.ix_(rows, rows)]
        expected = integrated_flow(block, h[rows], residual[rows], 1.7)
        # what the step does: the predictions it moves, and the weights (the rows' combination);
        # the coefficients may differ along directions that move neither (a repeated event)
        np.testing.assert_allclose(block @ steps[rows], block @ expected, rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(steps[rows] @ X[rows], expected @ X[rows], rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(steps[rows].sum(), expected.sum(), rtol=1e-8, atol=1e-12)
        moved = residual[rows] + block @ steps[rows]  # the flow only lowers the batch loss
        assert h[rows] @ moved**2 < h[rows] @ residual[rows] ** 2


@pytest.mark.parametrize("sparse", [False, True])
def test_the_block_gram_is_the_naive_gram_within_each_output(sparse: bool) -> None:
    rng = np.random.default_rng(8)
    X = rng.normal(size=(11, 5)) * (rng.random((11, 5)) < 0.6)
    out = rng.integers(0, 4, size=11)
    rate, rate_b = rng.uniform(0.1, 1.0, size=(4, 5)), rng.uniform(0.0, 1.0, size=4)
    index, valid = _output_blocks(out)
    nonzero = [np.flatnonzero(row) for row in X]
    values = [row[i] for row, i in zip(X, nonzero, strict=True)]
    batch = SparseBatch.from_rows(nonzero, values, 5) if sparse else X
    blocks = _block_gram(batch, index, out, rate, rate_b)
    both = valid[:, :, None] & valid[:, None, :]
    expected = batch_gram(X, out, rate, rate_b)[index[:, :, None], index[:, None, :]]
    np.testing.assert_allclose(blocks[both], expected[both], rtol=1e-12)


def test_a_single_events_flow_step_is_vws_invariant_step() -> None:
    sensitivity, h, residual, eta = 0.8, 2.5, -0.6, 0.5
    step = flow_steps(np.array([[sensitivity]]), np.array([0]), np.array([h]), np.array([residual]), 2 * eta)
    expected = -residual * -np.expm1(-2 * eta * h * sensitivity) / sensitivity
    np.testing.assert_allclose(step, [expected], rtol=1e-12)


def test_the_flow_step_stays_finite_when_the_metric_overflows() -> None:
    gram = np.array([[1e308, -1e308, 0.0], [-1e308, 1e308, 0.0], [0.0, 0.0, 1e-300]])
    steps = flow_steps(gram, np.zeros(3, dtype=int), np.array([1e10, 1.0, 1.0]),
                        np.array([0.5, -0.5, 1.0]), 1.0)
    assert np.isfinite(steps).all()


def test_without_signal_the_intercept_converges_to_the_best_constant() -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(20_000, 5))
    y = (rng.random(20_000) < 0.3).astype(float)
    oracle = RegressionOracle(1, 5, initial=1.0)
    for lo in range(0, 20_000, 50):
        oracle.update(X[lo:lo + 50], np.zeros((50, 1), int), y[lo:lo + 50, None], np.ones((50, 1)))
    assert abs(float(oracle.predict(X).mean()) - 0.3) < 0.03


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_extreme_but_finite_inputs_never_give_nan(loss: str) -> None:
    oracle = RegressionOracle(2, 3, loss=loss)
    for scale in (1e-100, 1.0, 1e100, 1e-150, 1e-100, 1e150):  # x² stays finite (VW caps it too)
        X = np.array([[scale, -scale, 1.0], [0.0, scale, -1.0]])
        oracle.update(X, np.array([[0], [1]]), np.array([[1.0], [0.0]]), np.array([[1e6], [1e-6]]))
        assert np.isfinite(oracle.weights_).all() and np.isfinite(oracle.intercept_).all()
        assert np.isfinite(oracle.predict(X)).all()


def test_bad_hyperparameters_are_named() -> None:
    with pytest.raises(ConfigError, match=r"The 'loss' parameter of RegressionOracle must be one of"):
        RegressionOracle(2, 3, loss="hinge")
    with pytest.raises(ConfigError, match=r"The 'lr' parameter of RegressionOracle must be a float in"):
        RegressionOracle(2, 3, learning_rate=0.0)
    with pytest.raises(ConfigError, match=r"The 'initial' parameter of RegressionOracle"):
        RegressionOracle(2, 3, initial=2.0)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.integers(0, 2**31 - 1),
       st.sampled_from([1e-6, 1e-2, 1.0, 1e3, 1e12]))
def test_the_flow_step_only_lowers_each_outputs_batch_loss_whatever_the_event_order(
    n: int, n_outputs: int, seed: int, scale: float,
) -> None:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * scale
    X[rng.random(n) < 0.3] = X[0]  # repeated events
    out = rng.integers(0, n_outputs, size=n)
    h = rng.choice([0.01, 1.0, 50.0], size=n)
    residual = rng.uniform(-1.0, 1.0, size=n)
    gram = batch_gram(X, out, rng.uniform(0.0, 1.0, size=(n_outputs, 3)), rng.uniform(0.0, 1.0, n_outputs))
    steps = flow_steps(gram, out, h, residual, rate=1.0)
    assert np.isfinite(steps).all()
    for o in np.unique(out):
        rows = np.flatnonzero(out == o)
        moved = residual[rows] + gram[np.ix_(rows, rows)] @ steps[rows]
        before, after = h[rows] @ residual[rows] ** 2, h[rows] @ moved**2
        assert after <= before * (1 + 1e-9) + 1e-12
    perm = rng.permutation(n)  # the events' order in the batch does not matter
    permuted = flow_steps(gram[np.ix_(perm, perm)], out[perm], h[perm], residual[perm], 1.0)
    same_output = out[:, None] == out[None, :]
    np.testing.assert_allclose((gram * same_output)[np.ix_(perm, perm)] @ permuted,
                               ((gram * same_output) @ steps)[perm], rtol=1e-5, atol=1e-4)
