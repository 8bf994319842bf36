"""A promoted ranker as the exploitation policy: distributions, masks, unbiased propensities."""

from __future__ import annotations

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamlearn.actions import exploit_around
from streamlearn.engine import Engine, Mixture
from streamlearn.join.pending import JoinSettings
from streamlearn.learners import Banditron, FixedGamma
from streamlearn.service.retraining import ranking_lists

K = 5


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, (4, K), elements=st.floats(allow_nan=True, allow_infinity=True)),
       hnp.arrays(bool, (4, K)), hnp.arrays(np.float64, 4, elements=st.floats(0.0, 1.0)))
@example(np.tile([np.nan, -np.inf, np.nan, np.nan, np.nan], (4, 1)), np.ones((4, K), bool),
         np.zeros(4))  # NaN and −inf tie (found by a CI run)
def test_distributions_stay_in_the_mask_and_sum_to_one(scores: np.ndarray, mask: np.ndarray,
                                                       gamma: np.ndarray) -> None:
    mask[:, 0] |= ~mask.any(axis=1)  # every event allows at least one action
    probs = exploit_around(scores, mask, gamma)
    assert np.isfinite(probs).all() and (probs >= 0).all()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert (probs[~mask] == 0).all()
    top = np.argmax(probs, axis=1)
    assert mask[np.arange(4), top].all()
    assert (probs.max(axis=1) >= 1 - gamma - 1e-12).all()
    rankings = ranking_lists(scores, mask)
    for row, allowed, ranking in zip(scores, mask, rankings, strict=True):
        assert sorted(ranking) == np.flatnonzero(allowed).tolist()  # every allowed action once
        # NaN ranks as −inf (best_first); nan_to_num's default would turn −inf into the
        # most negative float and order it above NaN
        ordered = np.nan_to_num(row[ranking], nan=-np.inf, neginf=-np.inf)
        assert (ordered[:-1] >= ordered[1:]).all()  # best first


def test_logged_propensities_are_the_sampling_frequencies() -> None:
    """Decisions with a ranker's scores: the logged probability of each action is how often
    it is chosen (χ² over 40,000 keyed draws, fixed seed)."""
    learner = Banditron(K, 3, FixedGamma(0.3), seed=4)
    engine = Engine(learner, JoinSettings(window_s=1e9, max_pending=100_000))
    n = 40_000
    X = np.tile([[1.0, 0.5, -0.2]], (n, 1))
    scores = np.tile([[0.1, 0.7, 0.3, -1.0, 0.2]], (n, 1))
    mask = np.tile([[True, True, False, True, True]], (n, 1))
    decided = engine.decide([f"k{i}" for i in range(n)], X, mask, labels=np.full(n, -1),
                            ts=np.zeros(n), partitions=np.zeros(n, int), wall=0.0,
                            mixture=Mixture((7,), (1.0,), (scores,)))
    p = decided.probs[0]
    np.testing.assert_allclose(p, [0.3 / 4, 0.7 + 0.3 / 4, 0.0, 0.3 / 4, 0.3 / 4])
    assert (decided.probs == p).all()
    counts = np.bincount(decided.actions, minlength=K)
    assert counts[2] == 0
    allowed = p > 0
    expected = n * p[allowed]
    chi2 = float((((counts[allowed] - expected) ** 2) / expected).sum())
    assert chi2 < 16.27  # χ²(3) at p = 0.001
    # the ranker's distribution is also what the join stored: the learner learns with it
    assert np.allclose(engine.joins.probs[engine.joins.active][0], p)
    assert (decided.columns["served_by"] == 7).all()
    np.testing.assert_allclose(decided.columns["gamma"], 0.3)


def test_a_mixture_logs_the_probability_of_the_whole_sampling_procedure() -> None:
    """The learner (30 %) and a ranker (70 %) share the events: each event is served by the
    policy its key draws, and the logged distribution is the mixture — the frequency of
    every action over 40,000 keyed draws (χ², fixed seed), and the share each policy served."""
    learner = Banditron(K, 3, FixedGamma(0.3), seed=5)
    engine = Engine(learner, JoinSettings(window_s=1e9, max_pending=100_000))
    n = 40_000
    X = np.tile([[1.0, 0.5, -0.2]], (n, 1))
    scores = np.tile([[0.1, 0.2, 0.3, -1.0, 0.9]], (n, 1))  # the ranker's best: action 4
    _, learner_probs = learner.decide(X[:1], None, keys=["probe"])  # untrained: the same for all
    decided = engine.decide([f"m{i}" for i in range(n)], X, None, labels=np.full(n, -1),
                            ts=np.zeros(n), partitions=np.zeros(n, int), wall=0.0,
                            mixture=Mixture((0, 3), (0.3, 0.7), (None, scores)))
    ranker = exploit_around(scores[:1], None, np.array([0.3]))[0]
    expected_p = 0.3 * learner_probs[0] + 0.7 * ranker
    np.testing.assert_allclose(decided.probs[0], expected_p)
    counts = np.bincount(decided.actions, minlength=K)
    expected = n * expected_p
    chi2 = float((((counts - expected) ** 2) / expected).sum())
    assert chi2 < 18.47  # χ²(4) at p = 0.001
    served = decided.columns["served_by"]
    assert set(np.unique(served).tolist()) == {0, 3}
    assert abs((served == 3).mean() - 0.7) < 0.01  # 4.4 standard errors
    # the logged propensity of each event is the mixture's, whichever policy served it
    np.testing.assert_allclose(decided.probs[np.arange(n), decided.actions],
                               expected_p[decided.actions])
