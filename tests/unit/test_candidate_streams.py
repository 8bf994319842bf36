"""Candidate-set streams: shapes, seeded determinism, exact regret, OHSUMED as a bandit."""

from __future__ import annotations

import numpy as np
import pytest

from streamlearn.candidates.sets import CandidateSets
from streamlearn.datasets.candidates import (
    CANDIDATE_STREAMS,
    CandidateStream,
    load_candidate_stream,
    ohsumed_candidates,
    synthetic_candidates,
)
from streamlearn.errors import ConfigError, DataError


def _uniform_rows(stream: CandidateStream, seed: int) -> np.ndarray:
    """A uniform random policy: one row per request, drawn inside its segment."""
    u = np.random.default_rng(seed).random(len(stream))
    return stream.sets.offsets[:-1] + (u * stream.sets.sizes).astype(np.int64)


def test_synthetic_shapes_and_ranges() -> None:
    s = synthetic_candidates(300, d_x=4, d_c=6, min_candidates=3, max_candidates=7, seed=2)
    B, N = len(s), len(s.sets.items)
    assert B == 300 and s.sets.context.shape == (300, 4) and s.sets.items.shape[1] == 6
    assert s.sets.sizes.min() >= 3 and s.sets.sizes.max() <= 7
    assert s.expected.shape == (N,) and s.best_reward.shape == (B,)
    assert len(s.candidate_ids) == N and len(s.request_ids) == B
    assert ((s.expected > 0) & (s.expected < 1)).all()
    assert set(np.unique(s.rewards).tolist()) <= {0.0, 1.0}
    assert np.allclose(s.best_reward, np.maximum.reduceat(s.expected, s.sets.offsets[:-1]))


def test_synthetic_is_determined_by_its_seed() -> None:
    a, b, c = (synthetic_candidates(200, seed=k) for k in (5, 5, 6))
    assert np.array_equal(a.sets.items, b.sets.items) and np.array_equal(a.rewards, b.rewards)
    assert np.array_equal(a.sets.offsets, b.sets.offsets) and a.candidate_ids == b.candidate_ids
    assert not np.array_equal(a.expected[:50], c.expected[:50])


def test_synthetic_without_shared_context() -> None:
    s = synthetic_candidates(50, d_x=0, d_c=3, seed=0)
    assert s.sets.context.shape == (50, 0) and np.isfinite(s.expected).all()


def test_optimal_policy_has_zero_regret_and_uniform_positive() -> None:
    s = synthetic_candidates(2000, seed=0)
    assert s.regret(s.best_rows()) == 0.0
    uniform = s.regret(_uniform_rows(s, 1)) / len(s)
    assert uniform > 0.1  # a random pick loses a good share of the best reward
    assert s.error(s.best_rows()) < s.error(_uniform_rows(s, 1))


def test_regret_rejects_rows_outside_their_request() -> None:
    s = synthetic_candidates(10, seed=0)
    rows = s.best_rows()
    rows[0] = s.sets.offsets[1]  # request 1's first candidate, played for request 0
    with pytest.raises(DataError, match="inside its request"):
        s.regret(rows)


def test_batches_cover_the_stream_in_order() -> None:
    s = synthetic_candidates(23, seed=3)
    parts = list(s.batches(5))
    assert [len(p) for p in parts] == [5, 5, 5, 5, 3]
    assert all(isinstance(p, CandidateSets) for p in parts)
    assert np.array_equal(np.concatenate([p.items for p in parts]), s.sets.items)
    assert np.array_equal(np.concatenate([p.rewards for p in parts if p.rewards is not None]), s.rewards)
    assert np.array_equal(parts[2].items, s.sets.take(np.arange(10, 15)).items)
    with pytest.raises(ConfigError):
        next(s.batches(0))


@pytest.mark.parametrize("kwargs", [{"n_requests": 0}, {"n_requests": 5, "d_c": 0},
                                    {"n_requests": 5, "min_candidates": 4, "max_candidates": 3}])
def test_synthetic_rejects_bad_options(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="Expected"):
        synthetic_candidates(**kwargs)


def test_registry_names_and_unknown_name() -> None:
    names = {"ohsumed-candidates", "ohsumed-candidates-graded", "synthetic-candidates"}
    assert names <= set(CANDIDATE_STREAMS)
    with pytest.raises(ConfigError, match="Got 'ohsumed' instead"):
        load_candidate_stream("ohsumed")


def test_synthetic_passes_replay_the_same_requests_reshuffled() -> None:
    one = load_candidate_stream("synthetic-candidates", passes=1, seed=4, rounds=40)
    two = load_candidate_stream("synthetic-candidates", passes=2, seed=4, rounds=40)
    assert len(two) == 80 and two.n_passes == 2
    assert np.array_equal(two.sets.items[:len(one.sets.items)], one.sets.items)
    assert sorted(two.request_ids[40:]) == sorted(f"{r}.p2" for r in one.request_ids)
    assert np.isclose(two.best_reward[40:].sum(), one.best_reward.sum())


@pytest.mark.needs_data
def test_ohsumed_candidates() -> None:
    s = ohsumed_candidates(passes=2, seed=0)
    assert len(s) == 212 and s.n_passes == 2 and s.sets.context.shape == (212, 0)
    assert s.sets.items.shape == (2 * 16140, 45)
    first, second = s.request_ids[:106], s.request_ids[106:]
    assert len(set(first)) == 106 and {r.split(".")[0] for r in first} == {r.split(".")[0] for r in second}
    assert [r.split(".")[0] for r in first] != [r.split(".")[0] for r in second]  # reshuffled per pass
    assert set(np.unique(s.rewards).tolist()) == {0.0, 1.0}
    assert np.array_equal(s.expected, s.rewards)
    assert s.regret(s.best_rows()) == 0.0 and s.regret(_uniform_rows(s, 0)) > 0
    o = s.sets.offsets
    assert all(len(set(s.candidate_ids[o[i]:o[i + 1]])) == o[i + 1] - o[i] for i in range(len(s)))
    again = ohsumed_candidates(passes=2, seed=0)
    assert again.request_ids == s.request_ids and np.array_equal(again.sets.items, s.sets.items)
    assert ohsumed_candidates(seed=1).request_ids != s.request_ids[:106]


@pytest.mark.needs_data
def test_ohsumed_graded_and_rounds() -> None:
    g = load_candidate_stream("ohsumed-candidates-graded", passes=1, seed=0)
    values, counts = np.unique(g.rewards, return_counts=True)
    assert values.tolist() == [0.0, 0.5, 1.0] and counts.tolist() == [11303, 2585, 2252]
    cut = load_candidate_stream("ohsumed-candidates", passes=1, seed=0, rounds=150)
    assert len(cut) == 150 and cut.n_passes == 2
