"""The hot paths rewritten for speed give exactly what their plain definitions give.

Each test puts a vectorised or flat-index rewrite beside a straightforward reference written
here from its definition, on random (hypothesis) inputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn import features as features_module
from streamlearn.datasets.caller import encode_instances
from streamlearn.datasets.synthetic import (
    N_FEATURES,
    N_SWITCHED_OFF,
    N_SWITCHED_ON,
    SUPPORT_WIDTH,
    _features,
    topic_vectors,
)
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.features import SparseBatch, as_sparse
from streamlearn.join import rows as rows_module
from streamlearn.join.rows import RowStore
from streamlearn.learners import randomness
from streamlearn.learners.banditron import banditron_coefficients

seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, rows=st.integers(1, 50))
def test_synthetic_rows_choose_among_all_400_columns_as_the_paper_says(seed: int,
                                                                        rows: int) -> None:
    rng = np.random.default_rng(seed)
    topics = topic_vectors(rng)[rng.integers(0, 9, rows)]
    off_u, on_u = rng.random((rows, N_FEATURES)), rng.random((rows, N_FEATURES))
    # reference: the k allowed coordinates with the smallest uniforms, over every column
    expected = topics.copy()
    for i in range(rows):
        support = np.flatnonzero(topics[i] > 0)
        expected[i, support[np.argsort(off_u[i, support])[:N_SWITCHED_OFF]]] = 0.0
        tail = np.arange(SUPPORT_WIDTH, N_FEATURES)
        expected[i, tail[np.argsort(on_u[i, tail])[:N_SWITCHED_ON]]] = 1.0
    got = _features(topics, off_u, on_u)
    assert got.dtype == np.float32 and np.array_equal(got, expected.astype(np.float32))


@settings(max_examples=40, deadline=None)
@given(seed=seeds, n=st.integers(0, 40), d=st.integers(1, 60), density=st.floats(0.0, 1.0),
       single=st.booleans())
def test_encoded_instances_are_the_json_of_plain_lists(seed: int, n: int, d: int,
                                                       density: float, single: bool) -> None:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * (rng.random((n, d)) < density)
    X = X.astype(np.float32) if single else X
    y = rng.integers(0, 5, n)
    sparse = np.count_nonzero(X) < 0.3 * X.size
    expected = []
    for i in range(n):
        row = X[i].astype(np.float64)
        nz = np.flatnonzero(row)
        x: object = ({"idx": nz.tolist(), "val": row[nz].tolist()} if sparse else row.tolist())
        expected.append((f"q{7 + i}".encode(), orjson.dumps(
            {"id": f"q{7 + i}", "ts": 2.5, "x": x, "label": int(y[i])})))
    assert encode_instances(7, X, y, 2.5, prefix="q") == expected


@settings(max_examples=60, deadline=None)
@given(seed=seeds, window=st.integers(1, 40),
       sizes=st.lists(st.integers(0, 70), min_size=1, max_size=12), labelled=st.booleans())
def test_a_tracker_fed_one_block_equals_one_fed_batch_by_batch(
        seed: int, window: int, sizes: list[int], labelled: bool) -> None:
    """What replay relies on when it feeds its tracker blocks of micro-batches."""
    rng = np.random.default_rng(seed)
    K = 4
    batches = []
    for B in sizes:
        probs = rng.random((B, K)) + 0.01
        probs /= probs.sum(axis=1, keepdims=True)
        batches.append((rng.integers(0, K, B), rng.integers(-1 if not labelled else 0, K, B),
                        probs))
    per_batch, one_block = OnlineErrorTracker(window), OnlineErrorTracker(window)
    for chosen, labels, probs in batches:
        per_batch.observe(chosen, labels=labels, probs=probs)
    one_block.observe(np.concatenate([b[0] for b in batches]),
                      labels=np.concatenate([b[1] for b in batches]),
                      probs=np.concatenate([b[2] for b in batches]))
    assert one_block.rounds == per_batch.rounds
    assert one_block.error_rate == per_batch.error_rate
    assert one_block.window_error_rate == per_batch.window_error_rate
    assert one_block.exploit_mistakes == per_batch.exploit_mistakes
    assert one_block.labelled_rounds == per_batch.labelled_rounds
    assert np.isclose(one_block.exploit_error_estimate, per_batch.exploit_error_estimate,
                      rtol=1e-12, equal_nan=True)
    # the ring holds the last `window` losses in order
    losses = 1.0 - np.concatenate([(c == lab) for c, lab, _ in batches]).astype(float)
    tail = losses[-window:]
    if len(tail):
        assert np.isclose(per_batch.window_error_rate, tail.mean(), rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(seed=seeds, parts=st.integers(1, 4), events=st.integers(0, 120), window=st.integers(1, 30))
def test_combined_trackers_rate_their_events_together(seed: int, parts: int, events: int,
                                                      window: int) -> None:
    """A replica's error rates over its partitions' trackers: the cumulative rate and the
    exploit estimate are those of one tracker fed every event; the window rate is the mean
    of each tracker's last ``window`` losses."""
    rng = np.random.default_rng(seed)
    K = 4
    chosen, rewards = rng.integers(0, K, events), rng.random(events).round(1)
    probs = rng.random((events, K)) + 0.05
    probs /= probs.sum(axis=1, keepdims=True)
    owner = rng.integers(0, parts, events)
    trackers, everything = [OnlineErrorTracker(window) for _ in range(parts)], OnlineErrorTracker()
    for lo in range(0, events, 7):  # batches of up to 7, each split by partition
        rows = np.arange(lo, min(lo + 7, events))
        everything.observe(chosen[rows], rewards[rows], probs=probs[rows])
        for p in range(parts):
            mine = rows[owner[rows] == p]
            trackers[p].observe(chosen[mine], rewards[mine], probs=probs[mine])
    error, in_window, exploit = OnlineErrorTracker.combined(trackers)
    assert np.isclose(error, everything.error_rate, rtol=1e-12)
    assert np.isclose(exploit, everything.exploit_error_estimate, rtol=1e-12, equal_nan=True)
    last = [1.0 - rewards[np.flatnonzero(owner == p)][-window:] for p in range(parts)]
    kept = np.concatenate(last)
    assert np.isclose(in_window, kept.mean() if len(kept) else 0.0, rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(seed=seeds, B=st.integers(1, 40), K=st.integers(2, 12))
def test_banditron_coefficients_match_the_per_event_definition(seed: int, B: int, K: int) -> None:
    rng = np.random.default_rng(seed)
    probs = rng.random((B, K)) + 0.01
    probs /= probs.sum(axis=1, keepdims=True)
    actions, rewards = rng.integers(0, K, B), rng.random(B)
    expected = np.zeros((B, K))
    for i in range(B):  # docs/algorithms.md §2: chosen row + r/P, exploit row − 1
        expected[i, actions[i]] += rewards[i] / probs[i, actions[i]]
        expected[i, int(np.argmax(probs[i]))] -= 1.0
    assert np.array_equal(banditron_coefficients(actions, rewards, probs), expected)


@settings(max_examples=60, deadline=None)
@given(seed=seeds, keys=st.lists(st.integers(-2**63, 2**63 - 1), min_size=0, max_size=30))
def test_uniforms_are_the_splitmix64_of_the_key(seed: int, keys: list[int]) -> None:
    mask = (1 << 64) - 1

    def splitmix(z: int) -> int:
        z = (z + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    mix = splitmix(seed & mask)
    expected = [(splitmix((k & mask) ^ mix) >> 11) * 2.0**-53 for k in keys]
    got = randomness.uniforms(seed & mask, np.array(keys, dtype=np.int64))
    assert got.tolist() == expected


@settings(max_examples=80, deadline=None)
@given(strings=st.lists(st.text(max_size=40), min_size=1, max_size=40))
def test_string_ids_hash_alike_on_the_few_ids_path_and_the_vectorised_one(strings: list[str]) -> None:
    # up to _HASH_IN_PYTHON_UP_TO ids are hashed byte by byte in Python; more go through the
    # loop over character positions: every id must get the same FNV-1a either way
    encoded = [s.encode("utf-8") for s in strings]
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    vectorised = features_module._fnv1a_64(np.array(encoded, dtype=bytes), lengths)
    assert features_module.hash_strings(strings).tolist() == vectorised.tolist()
    for start in range(0, len(strings), 7):  # and in small groups, as small batches come
        assert features_module.hash_strings(strings[start:start + 7]).tolist() \
            == vectorised[start:start + 7].tolist()


@contextmanager
def small_matrix(full_rows: int = 0, d: int = 1) -> Iterator[None]:
    """A dense matrix of 1,024 rows for any row (and ``full_rows`` for rows at least half
    nonzero, when more)."""
    with patch.object(rows_module, "DENSE_MAX_BYTES", 0), \
            patch.object(rows_module, "FULL_ROWS_MAX_BYTES", 8 * d * full_rows):
        yield


def filled_store(seed: int, n: int, d: int, density: float,
                 first: int) -> tuple[np.ndarray, RowStore, np.ndarray]:
    """``n`` rows of ``d`` features put at slots ``first`` on, shuffled, in a store whose dense
    matrix holds 1,024 rows (the slots past it keep their rows sparse)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * (rng.random((n, d)) < density)
    with small_matrix():
        store = RowStore(d)
        store.grow(4096)
        slots = first + rng.permutation(n)
        store.put(slots, X)
    return X, store, slots


@settings(max_examples=40, deadline=None)
@given(seed=seeds, n=st.integers(1, 60), d=st.integers(1, 30), density=st.floats(0.0, 1.0),
       first=st.integers(0, 2000))
def test_rows_put_dense_come_back_with_exactly_their_values(seed: int, n: int, d: int,
                                                            density: float, first: int) -> None:
    """Also across the end of the dense matrix (the slots past it keep their rows sparse)."""
    X, store, slots = filled_store(seed, n, d, density, first)
    with small_matrix():
        got = store.take(slots)
        assert store.dense_rows == 1024
        assert np.array_equal(store.is_sparse[slots], slots >= store.dense_rows)
        assert store.dense is None or len(store.dense) == store.dense_rows
    assert np.array_equal(got.to_dense() if isinstance(got, SparseBatch) else got, X)


def test_the_dense_matrix_keeps_its_rows_when_it_grows() -> None:
    """Allocated once at its limit (address space; pages are backed as rows are written),
    never copied as the store grows, and every dense row below the limit stays dense."""
    rng = np.random.default_rng(5)
    store = RowStore(3)
    store.grow(1024)
    X = rng.normal(size=(4096, 3))
    store.put(np.arange(1024), X[:1024])
    matrix = store.dense
    assert matrix is not None and len(matrix) == store.full_rows_limit
    store.grow(4096)
    store.put(np.arange(1024, 4096), X[1024:])
    assert store.dense is matrix and not store.is_sparse[:4096].any()
    assert np.array_equal(store.take(np.arange(4096)), X)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, n=st.integers(1, 60), d=st.integers(1, 30), density=st.floats(0.0, 1.0),
       first=st.integers(0, 3000))
def test_mostly_nonzero_rows_stay_in_the_matrix_past_its_first_part(
        seed: int, n: int, d: int, density: float, first: int) -> None:
    """Past the first 1,024 rows only rows with at least half their entries nonzero go to the
    matrix (up to its full size, 2,048 rows here); the others, and every row past it, go to
    the arena; all come back with exactly their values."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * (rng.random((n, d)) < density)
    slots = first + rng.permutation(n)
    with small_matrix(full_rows=2048, d=d):
        store = RowStore(d)
        store.grow(4096)
        store.put(slots, X)
        got = store.take(slots)
        assert store.full_rows_limit == 2048
    full = 2 * np.count_nonzero(X, axis=1) >= d
    in_matrix = (slots < 1024) | ((slots < 2048) & full)
    assert np.array_equal(store.is_sparse[slots], ~in_matrix)
    assert np.array_equal(got.to_dense() if isinstance(got, SparseBatch) else got, X)


def test_a_learner_with_its_own_distribution_still_gets_checked_rows() -> None:
    """The default ε-greedy rows skip the row check; an overridden rule never does."""
    from streamlearn.learners.banditron import Banditron

    class Broken(Banditron):
        def _distribution(self, exploit: np.ndarray, gammas: np.ndarray,
                          mask: np.ndarray | None) -> np.ndarray:
            return np.full((len(exploit), self.n_actions), np.nan)

    _, probs = Broken(4, 3).decide(np.ones((5, 3)))
    assert np.allclose(probs, 0.25)  # every broken row replaced by the uniform one


def test_a_refilled_batch_array_is_decided_afresh() -> None:
    """Learners reuse what they computed for a batch within one decide only: a caller that
    refills the same array between calls gets the decisions of the new contents."""
    from streamlearn.learners import make_learner

    rng = np.random.default_rng(11)
    for name in ("linucb", "lints", "bag", "squarecb"):
        learner, twin = make_learner(name, 5, 6, seed=2), make_learner(name, 5, 6, seed=2)
        for start in range(0, 2048, 64):  # learn that the best action is the largest x_j
            warm = rng.normal(size=(64, 6))
            a, p = learner.decide(warm, keys=np.arange(start, start + 64) + 10_000)
            twin.decide(warm.copy(), keys=np.arange(start, start + 64) + 10_000)
            reward = (a == warm[:, :5].argmax(axis=1)).astype(float)
            for one in (learner, twin):
                one.update(warm, a, reward, p)
        buffer = rng.normal(size=(32, 6))
        original = buffer.copy()
        learner.decide(buffer, keys=np.arange(32))
        twin.decide(original, keys=np.arange(32))
        buffer[:] = rng.normal(size=(32, 6))  # the same object, refilled; no update between
        got = learner.decide(buffer, keys=np.arange(32, 64))
        want = twin.decide(buffer.copy(), keys=np.arange(32, 64))
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), name


sparse_entry = st.one_of(st.integers(-2, 7), st.floats(-1.0, 7.5), st.booleans(), st.text(max_size=1))
sparse_value = st.one_of(st.floats(-1e13, 1e13), st.integers(-3, 3), st.booleans(),
                         st.text(max_size=1), st.just(float("nan")), st.just(float("inf")))


@settings(deadline=None)
@given(st.lists(st.integers(0, 5).flatmap(lambda n: st.tuples(
    st.lists(sparse_entry, min_size=n, max_size=n), st.lists(sparse_value, min_size=n, max_size=n))),
    min_size=1, max_size=12))
def test_an_all_sparse_batch_decodes_as_the_mixed_path_does(
        rows: list[tuple[list[object], list[object]]]) -> None:
    """The all-sparse fast path of feature_batch against the per-form path it skips (the
    same rows behind one dense row): the same rows refused, the same entries kept."""
    from streamlearn.events.payload import feature_batch
    from streamlearn.events.raw import DEFAULT_LIMITS

    d = 6
    forms = [("sparse", (idx, val)) for idx, val in rows]
    fast_ok, fast = feature_batch(forms, d, DEFAULT_LIMITS)
    mixed_ok, mixed = feature_batch([("dense", [0.0] * d), *forms], d, DEFAULT_LIMITS)
    assert isinstance(fast, SparseBatch) and isinstance(mixed, SparseBatch)
    assert fast_ok.tolist() == mixed_ok[1:].tolist()
    skip = int(mixed.indptr[1])  # the dense row's entries (none: it is all zeros)
    np.testing.assert_array_equal(fast.indptr, mixed.indptr[1:] - skip)
    np.testing.assert_array_equal(fast.indices, mixed.indices[skip:])
    np.testing.assert_array_equal(fast.values, mixed.values[skip:])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12), st.integers(1, 9), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_as_sparse_is_the_rows_nonzeros_in_order(n: int, d: int, density: float, seed: int) -> None:
    """CSR from one flat scan equals its definition: per row, the non-zero columns in
    increasing order with their values (NaN and -0.0 as numpy's ``!= 0`` says)."""
    rng = np.random.default_rng(seed)
    X = np.where(rng.random((n, d)) < density, rng.normal(size=(n, d)), 0.0)
    if n and d:
        X[rng.integers(n), rng.integers(d)] = rng.choice([np.nan, -0.0, np.inf])
    csr = as_sparse(X)
    assert csr.indptr.tolist() == [0, *np.cumsum([np.count_nonzero(r) for r in X]).tolist()]
    assert csr.indices.dtype == np.int64
    for i, row in enumerate(X):
        cols = [j for j in range(d) if row[j] != 0]
        got = slice(csr.indptr[i], csr.indptr[i + 1])
        assert csr.indices[got].tolist() == cols
        assert np.array_equal(csr.values[got], row[cols], equal_nan=True)
    assert np.array_equal(csr.to_dense(), X, equal_nan=True)


def test_serving_turns_numpys_hugepage_advice_off_unless_the_environment_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from streamlearn.service.settings import without_hugepage_advice

    setter = importlib.import_module("numpy._core.multiarray")._set_madvise_hugepage
    before = setter(True)
    try:
        monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
        assert not without_hugepage_advice()
        assert setter(True) is True  # left as the environment asked
        monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE")
        assert without_hugepage_advice()
        assert setter(True) is False  # it was off
    finally:
        setter(before)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
def test_few_rows_sample_alike_in_python_and_in_numpy(rows: int, actions: int, seed: int,
                                                      zeros: float) -> None:
    """Up to 64 probabilities are sampled with Python floats: the same action as numpy's
    cumsum path for every row, zero-probability actions and u at the edges included."""
    rng = np.random.default_rng(seed)
    probs = rng.random((rows, actions)) * (rng.random((rows, actions)) >= zeros)
    probs[rng.random(rows) < 0.2] /= 3.0  # rows that do not sum to one
    u = rng.choice([0.0, 1.0 - 2**-53, *rng.random(4)], size=rows)
    got = randomness.sample(probs, u)
    with patch.object(randomness, "_SAMPLE_IN_PYTHON_UP_TO", 0):
        expected = randomness.sample(probs, u)
    assert got.dtype == expected.dtype and got.tolist() == expected.tolist()
    nonzero = probs.sum(axis=1) > 0
    assert (probs[np.arange(rows), got] > 0)[nonzero].all()


@settings(max_examples=40, deadline=None)
@given(seed=seeds, n=st.integers(1, 80), d=st.integers(1, 20), density=st.floats(0.0, 1.0),
       first=st.integers(0, 1500), in_slot_order=st.booleans(), packed=st.booleans())
def test_exported_rows_import_in_the_saved_order(seed: int, n: int, d: int, density: float,
                                                 first: int, in_slot_order: bool,
                                                 packed: bool) -> None:
    """Rows exported in slot order (the dense rows first: imported without a reorder) or in any
    order (dense and sparse interleaved: reordered) come back as they were put, whether or
    not the export was packed for a snapshot (a dense block mostly zeros as CSR)."""
    X, store, slots = filled_store(seed, n, d, density, first)
    with small_matrix():
        order = np.sort(slots) if in_slot_order else slots
        exported = store.export(order)
        if packed:
            exported = RowStore.packed(exported)
            dense_rows = int((~exported["is_sparse"]).sum())
            mostly_zero = np.count_nonzero(X[~store.is_sparse[slots]]) < 0.5 * dense_rows * d
            assert ("dense_indptr" in exported) == (dense_rows > 0 and mostly_zero)
            assert RowStore.packed(exported) is exported  # packing twice changes nothing
        back = RowStore.imported(exported, d)
    want = X[np.argsort(slots)] if in_slot_order else X
    got = back.to_dense() if isinstance(back, SparseBatch) else back
    assert np.array_equal(got, want)


@settings(max_examples=150, deadline=None)
@given(seed=seeds, n=st.integers(0, 20), d=st.integers(1, 12),
       specials=st.lists(st.sampled_from([np.nan, np.inf, -np.inf, 500.0, -500.0, 1e6]),
                         max_size=4))
def test_dense_row_flags_are_each_rows_bound_and_norm_check(seed: int, n: int, d: int,
                                                            specials: list[float]) -> None:
    """The whole-block shortcut of ``_dense_flags`` flags each row as the per-row definition
    does: every entry finite and within ``max_abs_feature``, the squared norm within
    ``max_row_squared_norm``."""
    from streamlearn.events.payload import _dense_flags
    from streamlearn.events.raw import DecodeLimits

    rng = np.random.default_rng(seed)
    dense = rng.normal(scale=30.0, size=(n, d))
    for value in specials[:dense.size]:  # a few entries anywhere: non-finite or out of bound
        dense.flat[rng.integers(dense.size)] = value
    # ±500 breaks the entry bound only, a row of many large entries the norm bound only
    limits = DecodeLimits(max_abs_feature=100.0, max_row_squared_norm=2e4)
    expected = [bool(np.isfinite(row).all() and (np.abs(row) <= 100.0).all()
                     and float(row @ row) <= 2e4) for row in dense]
    assert _dense_flags(dense, limits).tolist() == expected


@settings(max_examples=80, deadline=None)
@given(seed=seeds, d_x=st.integers(0, 4), d_c=st.integers(1, 6),
       sizes=st.lists(st.integers(1, 5), max_size=6))
def test_joint_features_are_each_rows_candidate_interactions_and_bias(
        seed: int, d_x: int, d_c: int, sizes: list[int]) -> None:
    """φ(x, c) = [c, vec(x ⊗ c), 1] row by row, as the module defines it."""
    from streamlearn.candidates.joint import joint_features
    from streamlearn.candidates.sets import CandidateSets

    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    context, items = rng.normal(size=(len(sizes), d_x)), rng.normal(size=(int(offsets[-1]), d_c))
    expected = [np.concatenate([c, np.outer(context[r], c).ravel(), [1.0]])
                for r in range(len(sizes)) for c in items[offsets[r]:offsets[r + 1]]]
    phi = joint_features(CandidateSets(context, items, offsets))
    assert phi.shape == (len(items), d_c + d_x * d_c + 1)
    assert phi.tolist() == [row.tolist() for row in expected]


@given(seed=seeds, B=st.integers(0, 30), d=st.integers(1, 300), per_row=st.integers(0, 12))
def test_held_columns_are_the_unique_indices_and_number_each_entry_as_unique_does(
        seed: int, B: int, d: int, per_row: int) -> None:
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, d, size=rng.integers(0, per_row + 1)) for _ in range(B)]
    X = SparseBatch.from_rows(rows, [np.ones(len(r)) for r in rows], n_features=d)
    held = features_module.held_columns(X)
    unique, inverse = np.unique(X.indices, return_inverse=True)
    np.testing.assert_array_equal(held, unique)
    np.testing.assert_array_equal(np.searchsorted(held, X.indices), inverse)


def _page_hinkley_reference(state: np.ndarray, delta: float, threshold: float,
                            e: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The Page–Hinkley step on arrays, as the test defines it (m_t = Σ (e_i − ē_i − δ),
    an alarm when m_t − min m > λ, then a restart): the new state, changes, last alarm."""
    changes, last, offset = 0, -1, 0
    while len(e):
        count, total, m, m_min = state
        n = count + np.arange(1, len(e) + 1)
        mean = (total + np.cumsum(e)) / n
        m_path = m + np.cumsum(e - mean - delta)
        m_min_path = np.minimum(m_min, np.minimum.accumulate(m_path))
        alarms = np.flatnonzero(m_path - m_min_path > threshold)
        if not len(alarms):
            state = np.array([n[-1], total + e.sum(), m_path[-1], m_min_path[-1]])
            break
        changes += 1
        last = offset + int(alarms[0])
        offset = last + 1
        state = np.zeros(4)
        e = e[alarms[0] + 1:]
    return state, changes, last


@settings(max_examples=60, deadline=None)
@given(seed=seeds, batches=st.lists(st.integers(0, 70), min_size=1, max_size=8),
       rate=st.floats(0.0, 1.0), threshold=st.floats(0.5, 20.0))
def test_page_hinkley_on_python_floats_is_the_array_definition_bit_for_bit(
        seed: int, batches: list[int], rate: float, threshold: float) -> None:
    from streamlearn.learners.exploration import PageHinkley

    rng = np.random.default_rng(seed)
    detector, state = PageHinkley(0.05, threshold), np.zeros(4)
    for size in batches:
        e = (rng.random(size) < rate).astype(np.float64)
        state, changes, last = _page_hinkley_reference(state, 0.05, threshold, e)
        assert detector.update(e) == (changes, last)
        assert detector.state.tobytes() == state.tobytes()


@settings(max_examples=60, deadline=None)
@given(seed=seeds, B=st.integers(0, 40), K=st.integers(1, 12), masked=st.booleans())
def test_exploration_rates_at_the_given_argmax_are_those_at_the_row_maximum(
        seed: int, B: int, K: int, masked: bool) -> None:
    from streamlearn.actions import exploration_rates

    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(K), size=B) if B else np.zeros((0, K))
    mask = (rng.random((B, K)) < 0.7) | (probs == probs.max(axis=1, keepdims=True)) \
        if masked and B else None
    expected = exploration_rates(probs, mask)
    assert exploration_rates(probs, mask, probs.argmax(axis=1)).tobytes() == expected.tobytes()
