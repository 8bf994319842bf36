"""A window's worth of decisions closing at once is learned in bounded updates.

An aggregating join policy (sum, average, ...) closes every decision at its window's end, so
one ``learn`` can face tens of thousands of rows; a batch step that costs more than linearly
in its rows then stalled the loop (12,000 rows: minutes) while input piled up. The engine
learns them in updates of at most ``LEARN_CHUNK`` rows, each what a sequence of smaller
micro-batches would have applied.
"""

from __future__ import annotations

from unittest.mock import patch

import numpy as np

from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.engine import Engine
from streamlearn.engine.fixed import LEARN_CHUNK
from streamlearn.join.pending import JoinSettings
from streamlearn.learners.banditron import Banditron
from streamlearn.learners.exploration import FixedGamma


def test_a_whole_window_closing_at_once_is_learned_in_bounded_updates_in_order() -> None:
    n = 2 * LEARN_CHUNK + 300
    X, y = synthetic_stream(n, noise=0.0, seed=5)
    ids = [f"e{i}" for i in range(n)]
    engine = Engine(Banditron(9, X.shape[1], FixedGamma(0.1), seed=2),
                    JoinSettings(window_s=1.0, duplicate_policy="sum"))
    decided = engine.decide(ids, X, None, labels=y, ts=np.zeros(n),
                            partitions=np.zeros(n, np.int64), wall=0.0)
    rewards = (decided.actions == y).astype(float)
    engine.feedback(ids, rewards, np.full(n, 0.5), np.zeros(n, np.int64), 0.5)
    twin = Banditron(9, X.shape[1], FixedGamma(0.1), seed=2)
    engine.advance(2.0, event_time=2.0)  # the window ends: every decision closes with its sum
    with patch.object(engine.learner, "learn_checked", wraps=engine.learner.learn_checked) as update:
        learned = engine.learn()
    assert len(learned.applied) == n and learned.skipped == 0
    assert [len(c.args[1]) for c in update.call_args_list] == [LEARN_CHUNK, LEARN_CHUNK, 300]
    # the same as the three updates applied one after the other, in the order they closed
    closed = learned.closed
    assert isinstance(closed.X, np.ndarray) and isinstance(engine.learner, Banditron)
    for lo in range(0, n, LEARN_CHUNK):
        part = slice(lo, lo + LEARN_CHUNK)
        twin.update(closed.X[part], closed.actions[part], closed.rewards[part], closed.probs[part])
    np.testing.assert_array_equal(engine.learner.weights_, twin.weights_)
