"""A SparseBatch handed to a learner is checked: a broken layout is refused, repeated indices
add up as they do in the dense row.

Found by an outside client of the library: a negative column index trained the last column,
one at n_features raised numpy's IndexError, a row naming one column twice was learned by the
second-order learners as two features (their curvature Σx² instead of (Σx)²) though
``to_dense`` sums them, ``decide`` took NaN features that ``update`` refuses, actions 1.7,
"2" and True were taken as 1, 2 and 1, and one entry of 1e200 with reward 1 set its column's
LinUCB width to 0 (A overflowed to inf, A⁻¹ to a finite 0) instead of being skipped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.errors import ConfigError
from streamlearn.features import SparseBatch, as_batch, hash_names
from streamlearn.learners import LEARNERS, FixedGamma, Learner, LinUCB, load_learner, save_learner

K, D = 3, 7

# small integers and halves: any order of summing them is exact, so sums compare bit for bit
entry = st.tuples(st.integers(0, D - 1), st.sampled_from([-2.0, -1.0, -0.5, 0.5, 1.0, 1.5, 3.0]))
rows = st.lists(st.lists(entry, max_size=6), min_size=1, max_size=5)


def batch_of(drawn: list[list[tuple[int, float]]]) -> SparseBatch:
    return SparseBatch.from_rows([[i for i, _ in r] for r in drawn],
                                 [[v for _, v in r] for r in drawn], D)


@settings(max_examples=200, deadline=None)
@given(rows)
def test_checked_rows_are_strictly_increasing_and_sum_repeats(drawn: list[list[tuple[int, float]]]
                                                              ) -> None:
    X = batch_of(drawn)
    Y = as_batch(X, D)
    assert isinstance(Y, SparseBatch)
    assert np.array_equal(Y.to_dense(), X.to_dense())
    for r in range(Y.shape[0]):
        row = Y.indices[Y.indptr[r]:Y.indptr[r + 1]]
        assert (np.diff(row) > 0).all()
    assert as_batch(Y, D) is Y  # checked once, then taken as it is
    taken = Y.take(np.arange(Y.shape[0])[::-1])
    assert as_batch(taken, D) is taken  # rows of a checked batch need no second look


@settings(max_examples=200, deadline=None)
@given(drawn=rows, outputs=st.lists(st.integers(0, K - 1), min_size=5, max_size=5))
def test_the_sparse_fast_paths_equal_their_dense_definitions(
        drawn: list[list[tuple[int, float]]], outputs: list[int]) -> None:
    """``to_dense`` (an assignment), ``scores`` (a gather with ``take``), the held columns
    numbered by a table and the oracle's per-output sums (one bincount) against the plain
    dense arithmetic, bit for bit (the entries are small integers and halves)."""
    from streamlearn.features import held_columns_and_local, scores
    from streamlearn.learners.oracle import _per_output_sum

    X = as_batch(batch_of(drawn), D)
    assert isinstance(X, SparseBatch)
    dense = np.zeros(X.shape)
    for r, row in enumerate(drawn):
        for i, v in row:
            dense[r, i] += v
    assert np.array_equal(X.to_dense(), dense)
    W = np.arange(K * D, dtype=float).reshape(K, D) / 2 - 5
    assert np.array_equal(scores(W, X), dense @ W.T)
    held, local = held_columns_and_local(X)
    assert np.array_equal(held, np.unique(X.indices))
    assert np.array_equal(local, np.searchsorted(held, X.indices))
    out = np.array(outputs[:X.shape[0]], dtype=np.int64)
    values = np.arange(1.0, X.shape[0] + 1.0) / 2
    expected = _per_output_sum(values, out, dense, K, D)  # the dense route: coef.T @ X
    coef = np.zeros((len(out), K))
    coef[np.arange(len(out)), out] = values
    assert np.array_equal(expected, coef.T @ dense)
    assert np.array_equal(_per_output_sum(values, out, X, K, D), expected)


WIDE = 400  # at most 6 entries a row of 400 columns: under the 5 % at which scores goes dense
wide_rows = st.lists(st.lists(st.tuples(st.integers(0, WIDE - 1), st.sampled_from(
    [-2.0, -1.0, -0.5, 0.5, 1.0, 1.5, 3.0])), max_size=6), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(wide_rows)
def test_sparse_scores_sum_each_row_segment_empty_rows_included(
        drawn: list[list[tuple[int, float]]]) -> None:
    """``scores`` on a batch sparse enough to stay sparse (one segment sum per row, empty rows
    anywhere, an all-empty batch too) equals the dense product, bit for bit."""
    from streamlearn.features import scores

    X = as_batch(SparseBatch.from_rows([[i for i, _ in r] for r in drawn],
                                       [[v for _, v in r] for r in drawn], WIDE), WIDE)
    assert isinstance(X, SparseBatch)
    W = np.arange(K * WIDE, dtype=float).reshape(K, WIDE) % 17 / 2 - 4
    assert np.array_equal(scores(W, X), X.to_dense() @ W.T)


def learner(name: str, diagonal: bool = False) -> Learner:
    if diagonal:  # LinUCB's diagonal mode, as at hashed sizes (d + 1 > full_max_features)
        return LinUCB(K, D, FixedGamma(0.1), full_max_features=1, seed=1)
    return LEARNERS[name](K, D, FixedGamma(0.1), seed=1)


CASES = [(name, False) for name in sorted(LEARNERS)] + [("linucb", True)]


@pytest.mark.parametrize(("name", "diagonal"), CASES)
@settings(max_examples=25, deadline=None)
@given(drawn=rows, rewards=st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=5, max_size=5))
def test_repeated_indices_learn_as_the_dense_row(name: str, diagonal: bool,
                                                 drawn: list[list[tuple[int, float]]],
                                                 rewards: list[float]) -> None:
    X = batch_of(drawn)
    sparse, dense = learner(name, diagonal), learner(name, diagonal)
    for _ in range(3):  # a few rounds: the curvature of the first update shapes the next
        _, p_s = sparse.decide(X)
        a_d, p_d = dense.decide(X.to_dense())
        assert np.allclose(p_s, p_d, rtol=1e-9, atol=1e-12)
        r = np.array(rewards[:len(drawn)])
        sparse.update(X, a_d, r, p_d)
        dense.update(X.to_dense(), a_d, r, p_d)
    s_arrays, _ = sparse.state()
    d_arrays, _ = dense.state()
    for key, value in d_arrays.items():
        assert np.allclose(s_arrays[key], value, rtol=1e-9, atol=1e-12), key


@pytest.mark.parametrize(("indptr", "indices", "said"), [
    ([0, 1], [-1], "Got -1"),
    ([0, 2], [3, D], f"Got {D}"),
    ([0, 2], [1], "rise from 0 to len(indices) = 1"),
    ([0, 2, 1, 2], [1, 2], "rise from 0"),
    ([0, 1], [1.5], "integer array"),
])
def test_a_broken_layout_is_refused_saying_what_was_got(indptr: list[int], indices: list[float],
                                                        said: str) -> None:
    X = SparseBatch(np.array(indptr), np.array(indices), np.ones(len(indices)), D)
    model = learner("linucb")
    with pytest.raises(ConfigError, match=f"(?s){said.replace('(', '.').replace(')', '.')}"):
        model.decide(X)
    with pytest.raises(ConfigError):
        model.update(X, np.zeros(len(indptr) - 1, dtype=np.int64), np.ones(len(indptr) - 1),
                     np.full((len(indptr) - 1, K), 1 / K))


@pytest.mark.parametrize("name", sorted(LEARNERS))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_decide_refuses_non_finite_features_as_update_does(name: str, bad: float) -> None:
    model = learner(name)
    dense = np.ones((2, D))
    dense[1, 3] = bad
    for X in (dense, SparseBatch.from_rows([[0], [3]], [[1.0], [bad]], D)):
        with pytest.raises(ConfigError, match="finite"):
            model.decide(X)
        with pytest.raises(ConfigError, match="finite"):
            model.predict(X)
    assert model.n_decided_ == 0


@pytest.mark.parametrize("actions", [[1.7, 0.0], ["1", "0"], [True, False]])
def test_actions_that_are_not_integers_are_refused(actions: list[object]) -> None:
    model = learner("linucb")
    X = np.ones((2, D))
    _, probs = model.decide(X)
    with pytest.raises(ConfigError, match="Actions must be integers"):
        model.update(X, np.array(actions), np.ones(2), probs)
    assert model.n_updated_ == 0


@pytest.mark.parametrize("reward", [0.0, 0.5, 1.0])
def test_a_square_that_overflows_skips_its_row_whatever_the_reward(reward: float) -> None:
    model = learner("linucb", diagonal=True)
    X = SparseBatch.from_rows([[2, 5], [4]], [[1e200, 1.0], [1.0]], D)
    actions = np.array([0, 0])
    probs = np.full((2, K), 1 / K)
    model.update(X, actions, np.full(2, reward), probs)
    assert (model.n_updated_, model.n_skipped_updates_) == (1, 1)
    reference = learner("linucb", diagonal=True)
    reference.update(X.take(np.array([1])), actions[1:], np.full(1, reward), probs[1:])
    for key, value in reference.state()[0].items():
        assert np.array_equal(model.state()[0][key], value), key


@pytest.mark.parametrize("X", [
    SparseBatch(np.array([0, 1]), np.array([1]), np.array(["a"]), D),
    [["a"] * D],
    [[1.0] * D, [1.0]],  # ragged
])
def test_features_that_are_not_numbers_are_refused(X: object) -> None:
    model = learner("banditron")
    with pytest.raises(ConfigError, match=r"numeric|numbers"):
        model.decide(X)


@pytest.mark.parametrize("logged", [[np.nan, 0.5, 0.5], [-0.1, 0.6, 0.5], [np.inf, 0.5, 0.5],
                                    [0.5, 1.5, 0.0]])
@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_a_logged_distribution_that_is_not_one_is_refused(name: str, logged: list[float],
                                                          tmp_path: Path) -> None:
    """A NaN among the other actions' probabilities was taken, and its NaN in the adaptive
    γ's running sums then made the state unsavable (found by an outside client)."""
    model = learner(name)
    X = np.ones((1, D))
    with pytest.raises(ConfigError, match="logged probabilities"):
        model.update(X, np.array([1]), np.ones(1), np.array([logged]))
    save_learner(model, tmp_path / "state")
    assert load_learner(tmp_path / "state").n_updated_ == 0


@pytest.mark.parametrize("logged", [[0.0, 1e-320, 0.0], [0.5, 0.5, 0.5], [0.2, 0.2, 0.2]])
def test_a_logged_row_that_does_not_sum_to_one_is_refused(logged: list[float]) -> None:
    model = learner("linucb")
    with pytest.raises(ConfigError, match=r"summing to 1 .*Got row 0: \["):
        model.update(np.ones((1, D)), np.array([1]), np.ones(1), np.array([logged]))


@pytest.mark.parametrize(("actions", "rewards", "said"), [
    (np.array([10**20]), [1.0], "Actions must be integers"),
    (np.array([None]), [1.0], "Actions must be integers"),
    (np.array([1]), np.array(["1"]), "Rewards must be numbers"),
])
def test_update_arguments_of_the_wrong_kind_are_refused(actions: np.ndarray, rewards: object,
                                                        said: str) -> None:
    model = learner("linucb")
    with pytest.raises(ConfigError, match=said):
        model.update(np.ones((1, D)), actions, rewards, np.full((1, K), 1 / K))


def test_decide_takes_one_key_per_event() -> None:
    model = learner("linucb")
    actions, probs = model.decide(np.zeros((0, D)), keys=[])  # an empty batch, empty keys
    assert actions.shape == (0,) and probs.shape == (0, K)
    for keys in (["a"], [None, None], 7):
        with pytest.raises(ConfigError, match=r"key|Got NoneType None"):
            model.decide(np.ones((2, D)), keys=keys)
    # keys given as strings or as integers decide as before: the same key, the same draw
    a1, _ = model.decide(np.ones((2, D)), keys=["x", "y"])
    a2, _ = learner("linucb").decide(np.ones((2, D)), keys=np.array(["x", "y"]))
    assert np.array_equal(a1, a2)


def test_hash_names_refuses_values_that_do_not_match_the_names() -> None:
    with pytest.raises(ConfigError, match="one value per name in row 0"):
        hash_names([["a", "b"]], D, values=[[2.0]])
    with pytest.raises(ConfigError, match="one list of values per row"):
        hash_names([["a"], ["b"]], D, values=[[1.0]])
    with pytest.raises(ConfigError, match="names must be strings"):
        hash_names([{5: 1.0}], D)  # type: ignore[dict-item]


def test_to_dense_checks_the_layout_too() -> None:
    with pytest.raises(ConfigError, match="Got -1"):
        SparseBatch(np.array([0, 1]), np.array([-1]), np.ones(1), D).to_dense()
