"""Valid feedback with large (allowed) features is learned, not skipped.

An outside client's features included a unix timestamp (1.7e9, well inside the decoder's
limit of 1e12). Two such rows of one action in a micro-batch made LinUCB's Woodbury system
I + XA⁻¹Xᵀ singular in floating point (1 + s rounds to s), ``np.linalg.solve`` raised, and the
learner's guard then skipped every row of the batch: LinUCB, the default, learned from none
of 1,000 joined feedbacks, LinTS from half, candidate LinUCB from none.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.candidates.learners import CandidateLinUCB
from streamlearn.candidates.sets import CandidateSets
from streamlearn.features import SparseBatch
from streamlearn.learners import Banditron, FixedGamma, LinTS, LinUCB
from streamlearn.learners.linear_posterior import RidgePosterior, woodbury_update


def _sherman_morrison(cov: np.ndarray, rows: np.ndarray) -> np.ndarray:
    for z in rows:  # the per-event reference
        Az = cov @ z
        cov = cov - np.outer(Az, Az) / (1.0 + z @ Az)
    return cov


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 12), D=st.integers(1, 8),
       scale=st.sampled_from([1e-3, 1.0, 1e3]))
def test_the_batch_update_is_the_inverse_of_the_ridge_matrix(seed: int, n: int, D: int,
                                                             scale: float) -> None:
    rng = np.random.default_rng(seed)
    K = 3
    groups = rng.normal(size=(K, n, D)) * scale
    groups[:, rng.integers(0, n):] *= rng.integers(0, 2)  # zero-padded groups, as _woodbury pads
    updated = woodbury_update(np.tile(np.eye(D), (K, 1, 1)), groups)
    for k in range(K):
        expected = np.linalg.inv(np.eye(D) + groups[k].T @ groups[k])
        np.testing.assert_allclose(updated[k], expected, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(updated, updated.transpose(0, 2, 1))


def test_a_floating_point_singular_system_is_added_row_by_row() -> None:
    z = np.array([1.7e9, 0.3, -1.2, 0.5])
    groups = np.stack([np.stack([z, z, np.zeros(4)])])  # two equal rows: I + XA⁻¹Xᵀ singular
    cov = np.eye(4)[None]
    with np.testing.assert_raises(np.linalg.LinAlgError):  # what the joint step meets
        projected = groups @ cov
        np.linalg.solve(np.eye(3) + projected @ groups.transpose(0, 2, 1), projected)
    updated = woodbury_update(cov, groups)
    assert np.isfinite(updated).all()
    reference = _sherman_morrison(np.eye(4), groups[0])
    np.testing.assert_allclose(updated[0], 0.5 * (reference + reference.T), rtol=1e-12, atol=1e-18)


def _timestamp_batch(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 8))
    X[:, 0] = 1.7e9 + np.arange(n)  # an event-time feature
    actions = np.zeros(n, dtype=np.int64)  # all on one action: the hardest case
    rewards = rng.integers(0, 2, n).astype(float)
    return X, actions, rewards, np.full((n, 4), 0.25)


def test_linucb_and_lints_learn_every_row_of_a_batch_with_a_timestamp_feature() -> None:
    for cls in (LinUCB, LinTS):
        learner = cls(4, 8)
        for seed in range(5):
            learner.update(*_timestamp_batch(50, seed))
        assert (learner.n_updated_, learner.n_skipped_updates_) == (250, 0), cls.__name__
        assert np.isfinite(learner.posterior_.cov_).all()


def test_candidate_linucb_learns_every_row_with_a_timestamp_feature() -> None:
    learner = CandidateLinUCB(0, 4, seed=1)
    rng = np.random.default_rng(0)
    items = rng.normal(size=(30, 4))
    items[:, 0] = 1.7e9
    sets = CandidateSets(np.zeros((10, 0)), items, np.arange(0, 31, 3))
    decision = learner.decide(sets)
    learner.update(decision.phi[decision.chosen], np.ones(10), decision.propensities)
    assert learner.n_skipped_updates_ == 0 and np.isfinite(learner.A_inv_).all()
    assert not np.allclose(learner.A_inv_, np.eye(learner.dim))


class _FailsJointly(Banditron):
    """A learner whose update of more than one row fails, as a singular joint system would."""

    def _update(self, X: np.ndarray, actions: np.ndarray, rewards: np.ndarray,  # type: ignore[override]
                probs: np.ndarray, exploit: np.ndarray) -> None:
        if len(actions) > 1:
            raise np.linalg.LinAlgError("singular")
        super()._update(X, actions, rewards, probs, exploit)


def test_rows_that_apply_alone_are_applied_one_at_a_time_when_the_joint_step_fails() -> None:
    learner = _FailsJointly(3, 2, FixedGamma(0.1))
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    actions, probs = np.array([0, 1, 2]), np.full((3, 3), 1 / 3)
    probs[:, 0] = 0.6
    probs[:, 1:] = 0.2
    learner.update(X, actions, np.ones(3), probs)
    assert (learner.n_updated_, learner.n_skipped_updates_) == (3, 0)
    reference = Banditron(3, 2, FixedGamma(0.1))
    for i in range(3):
        reference.update(X[i:i + 1], actions[i:i + 1], np.ones(1), probs[i:i + 1])
    np.testing.assert_array_equal(learner.weights_, reference.weights_)


def _sparse_batch(rng: np.random.Generator, B: int, d: int, extreme: bool) -> SparseBatch:
    rows = [rng.choice(d, size=rng.integers(0, min(d, 5) + 1), replace=False) for _ in range(B)]
    values = [rng.normal(size=len(r)) * 3.0 for r in rows]
    if extreme and any(len(v) for v in values):  # one entry whose square overflows
        i = next(i for i, v in enumerate(values) if len(v))
        values[i][0] = 1e200
    return SparseBatch.from_rows(rows, values, n_features=d)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), K=st.integers(2, 5), d=st.integers(130, 300),
       batches=st.integers(1, 6), extreme=st.booleans())
def test_the_diagonal_guard_on_a_sparse_batch_equals_the_whole_state_guard(
        seed: int, K: int, d: int, batches: int, extreme: bool) -> None:
    """Diagonal mode (d + 1 > 128) saves and checks only the batch's columns; a learner whose
    guard saves and checks everything must end in exactly the same state, rows skipped
    (a square that overflows makes the oracle's state NaN) included."""
    rng = np.random.default_rng(seed)
    columns_guard = LinUCB(K, d, exploration=FixedGamma(0.1))
    whole_guard = LinUCB(K, d, exploration=FixedGamma(0.1))
    whole_guard._snapshot_for = lambda X: whole_guard._snapshot()  # type: ignore[method-assign]
    whole_guard._state_finite_after = lambda X: whole_guard._state_finite()  # type: ignore[method-assign]
    assert not columns_guard.posterior_.full
    for b in range(batches):
        X = _sparse_batch(rng, int(rng.integers(1, 20)), d, extreme and b == batches - 1)
        actions = rng.integers(0, K, size=X.shape[0])
        rewards = rng.integers(0, 2, size=X.shape[0]).astype(float)
        probs = np.full((X.shape[0], K), 1.0 / K)
        for learner in (columns_guard, whole_guard):
            learner.update(X, actions, rewards, probs)
    assert columns_guard.n_updated_ == whole_guard.n_updated_
    assert columns_guard.n_skipped_updates_ == whole_guard.n_skipped_updates_
    got, want = columns_guard.state()[0], whole_guard.state()[0]
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), K=st.integers(1, 5), d=st.integers(1, 40),
       B=st.integers(1, 30))
def test_the_sparse_diagonal_update_adds_each_actions_squares_to_its_columns(
        seed: int, K: int, d: int, B: int) -> None:
    rng = np.random.default_rng(seed)
    posterior = RidgePosterior(K, d, ridge=1.0, full_max_features=1)  # diagonal mode
    posterior.cov_ = rng.uniform(0.1, 1.0, size=(K, d + 1))
    before = posterior.cov_.copy()
    X = _sparse_batch(rng, B, d, extreme=False)
    actions = rng.integers(0, K, size=B)
    posterior._add_sparse_diagonal(X, actions)
    dense = X.to_dense()
    precision = 1.0 / before
    for i in range(B):
        precision[actions[i], :-1] += dense[i] ** 2
        precision[actions[i], -1] += 1.0
    np.testing.assert_allclose(posterior.cov_, 1.0 / precision, rtol=1e-12)
    absent = np.setdiff1d(np.arange(d), X.indices)
    np.testing.assert_array_equal(posterior.cov_[:, absent], before[:, absent])
