"""Every registered learner, whatever the input and the weights: finite state, decisions in the mask.

Until the hardening of 2026-11-30, one instance of ``[1e308] * d`` turned a weight row into
−1e308, later rows into ±inf/NaN, and decisions then ignored their mask. The
decoder now rejects such values, but the learners must stay safe on their own:
these are property tests over extreme floats (±1e308, subnormals, −0.0, mixed
scales), masks and every learner in ``LEARNERS``. A numpy RuntimeWarning (overflow, invalid
value) fails them: every such step is either avoided or deliberate (inside ``np.errstate``,
its non-finite result ranked or replaced right after).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlearn.features import SparseBatch
from streamlearn.learners import LEARNERS, Banditron, FixedGamma, Learner

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

K, D = 4, 6
EXTREME = [1e308, -1e308, 1.7976931348623157e308, -1.7976931348623157e308, 5e-324, -5e-324,
           1e-320, -0.0, 0.0, 1.0, -1.0, 1e150, -1e150, 1e-150, 3.5]

values = st.sampled_from(EXTREME) | st.floats(allow_nan=False, allow_infinity=False)
rows = st.lists(st.lists(values, min_size=D, max_size=D), min_size=1, max_size=5)


def learner(name: str) -> Learner:
    return LEARNERS[name](K, D, FixedGamma(0.1), seed=1)


def masks_for(n: int, draw: st.DrawFn) -> np.ndarray | None:
    if not draw(st.booleans()):
        return None
    mask = np.array(draw(st.lists(st.lists(st.booleans(), min_size=K, max_size=K),
                                  min_size=n, max_size=n)), dtype=bool)
    mask[~mask.any(axis=1), draw(st.integers(0, K - 1))] = True
    return mask


def check_decisions(actions: np.ndarray, probs: np.ndarray, mask: np.ndarray | None) -> None:
    assert np.isfinite(probs).all()
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    assert (probs >= 0).all()
    assert (probs[np.arange(len(actions)), actions] > 0).all()
    if mask is not None:
        assert mask[np.arange(len(actions)), actions].all()
        assert (probs[~mask] == 0).all()


def state_is_finite(model: Learner) -> bool:
    arrays, _ = model.state()
    return all(np.isfinite(a).all() for a in arrays.values() if a.dtype.kind == "f")


@pytest.mark.parametrize("name", sorted(LEARNERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_extreme_input_never_breaks_a_learner(name: str, data: st.DataObject) -> None:
    model = learner(name)
    for _ in range(4):
        X = np.array(data.draw(rows))
        sparse = data.draw(st.booleans())
        batch = SparseBatch.from_rows([list(range(D))] * len(X), X.tolist(), D) if sparse else X
        mask = masks_for(len(X), data.draw)
        actions, probs = model.decide(batch, mask)
        check_decisions(actions, probs, mask)
        rewards = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=len(X),
                                              max_size=len(X))))
        before = model.n_updated_ + model.n_skipped_updates_
        model.update(batch, actions, rewards, probs)
        assert state_is_finite(model)
        assert model.n_updated_ + model.n_skipped_updates_ == before + len(X)


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_decisions_obey_the_mask_whatever_the_weights(name: str) -> None:
    model = learner(name)
    arrays, meta = model.state()
    for key in list(arrays):
        if key.startswith("learner.") and arrays[key].dtype.kind == "f":
            arrays[key] = np.full_like(arrays[key], -1e308)  # as bad as finite weights get
    model = type(model).from_state(arrays, meta)
    X = np.full((3, D), 1e308)
    mask = np.array([[False, True, True, False]] * 3)
    actions, probs = model.decide(X, mask)
    check_decisions(actions, probs, mask)


def test_an_update_that_would_overflow_is_skipped_and_counted() -> None:
    model = Banditron(K, D, FixedGamma(0.1))
    X = np.vstack([np.ones(D), np.full(D, 1e308), 2 * np.ones(D)])
    _, probs = model.decide(X)
    actions = np.array([1, 1, 1])  # explored (P = γ/K): row 1 would gain 1e308 / 0.025 = inf
    model.update(X, actions, np.ones(3), probs)
    assert np.isfinite(model.weights_).all()
    assert (model.n_updated_, model.n_skipped_updates_) == (2, 1)
    reference = Banditron(K, D, FixedGamma(0.1))
    reference.update(X[[0, 2]], actions[[0, 2]], np.ones(2), probs[[0, 2]])
    assert np.array_equal(model.weights_, reference.weights_)  # the good rows were applied
    arrays, meta = model.state()
    assert meta["counters"]["n_skipped_updates"] == 1
    assert type(model).from_state(arrays, meta).n_skipped_updates_ == 1
