"""No worse than a constant: on a stream whose labels ignore the features, every bandit learner
should make at most 1 − (largest prior) + 0.02 mistakes — about what always playing the most
frequent action makes.

The stream: 8 actions with prior 40/20/10/10/8/6/4/2 %, 10 Gaussian features plus a bias, 50,000
events, fixed seed, micro-batches of 64, every learner at its defaults.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamlearn.learners import LEARNERS, make_learner
from streamlearn.replay import replay

PRIOR = np.array([0.40, 0.20, 0.10, 0.10, 0.08, 0.06, 0.04, 0.02])
LIMIT = 1.0 - PRIOR.max() + 0.02

# Known gaps (docs/results.md): mistake-driven learners have no notion of a best constant action.
# The Banditron family and SOBA only move on their own mistakes or successes and keep oscillating
# between labels; Newtron's log-loss fit of the prior is too noisy under bandit feedback.
KNOWN_GAPS = {"banditron", "pnorm", "eg", "soba", "newtron"}


def no_signal_stream(n: int = 50_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.choice(len(PRIOR), size=n, p=PRIOR)
    X = np.hstack([rng.normal(size=(n, 10)), np.ones((n, 1))])
    return X, y


BANDIT_LEARNERS = [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason="known gap, see KNOWN_GAPS"))
    if name in KNOWN_GAPS else name
    for name in sorted(LEARNERS) if not LEARNERS[name].full_information
]


@pytest.mark.parametrize("name", BANDIT_LEARNERS)
def test_no_worse_than_always_playing_the_most_frequent_action(name: str) -> None:
    X, y = no_signal_stream()
    learner = make_learner(name, len(PRIOR), X.shape[1], seed=0)
    error = replay(learner, X, y, batch_size=64).error_rate
    assert error <= LIMIT, f"{name}: online error {error:.4f} > {LIMIT:.2f}"
