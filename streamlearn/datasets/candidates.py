"""Candidate-set streams: whole streams of requests whose candidates carry their own features.

A :class:`CandidateStream` is every request of a replay, in stream order, as one
:class:`~streamlearn.candidates.sets.CandidateSets`, plus what scoring needs and
a learner never sees: ``expected`` (each candidate's expected reward),
``best_reward`` (each request's best expected reward), so the regret of a
policy that played rows ``chosen`` is exactly ``Σ best_reward − Σ expected[chosen]``.

Two streams are registered in :data:`CANDIDATE_STREAMS` (see :func:`load_candidate_stream`):

* ``ohsumed-candidates`` (and ``ohsumed-candidates-graded``): LETOR 3.0 OHSUMED,
  QueryLevelNorm. Each of the 106 queries is a request (no shared context,
  ``d_x = 0``); its documents are the candidates with their 45 features; reward
  1 for relevance ≥ 1 (graded: 0 / 0.5 / 1 for relevance 0 / 1 / 2). Fold 1's
  train + vali + test hold every query exactly once (the folds are rotations of
  five query subsets). Queries are streamed in a seeded shuffled order,
  reshuffled every pass. Rewards are deterministic, so ``expected`` is the
  realised reward.
* ``synthetic-candidates``: a known logistic-linear reward
  ``P(reward = 1 | x, c) = sigmoid(⟨θ, vec(x ⊗ c)⟩ + ⟨β, c⟩)``, with the realised
  Bernoulli rewards drawn once per candidate.

>>> s = synthetic_candidates(50, d_x=3, d_c=4, seed=1)
>>> len(s), s.sets.context.shape[1], s.sets.items.shape[1], s.regret(s.best_rows())
(50, 3, 4, 0.0)
>>> [len(b) for b in s.batches(20)]
[20, 20, 10]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from streamlearn.candidates.sets import CandidateSets, gather_segments, segment_argmax
from streamlearn.datasets.letor import SPLITS, load_fold, ohsumed_root
from streamlearn.datasets.stream import stream_order
from streamlearn.errors import ConfigError, DataError
from streamlearn.rankers.metrics import query_groups

__all__ = [
    "CANDIDATE_STREAMS",
    "DEFAULT_SYNTHETIC_REQUESTS",
    "CandidateStream",
    "load_candidate_stream",
    "ohsumed_candidates",
    "request_cycle",
    "synthetic_candidates",
]

#: Requests of ``synthetic-candidates`` when no ``rounds`` is given.
DEFAULT_SYNTHETIC_REQUESTS = 10_000
OHSUMED_QUERIES = 106
OHSUMED_FEATURES = 45
_OHSUMED_FOLD = 1  # its train + vali + test hold each of the 106 queries once


@dataclass
class CandidateStream:
    """A whole candidate-set stream: ``sets`` holds all B requests (N candidates) in order.

    Attributes
    ----------
    sets : CandidateSets
        Contexts, candidate features, offsets and each candidate's realised reward.
    expected : numpy.ndarray
        (N,) expected reward of each candidate (the realised reward when rewards
        are deterministic).
    best_reward : numpy.ndarray
        (B,) the best expected reward available in each request.
    candidate_ids, request_ids : list of str
        Stable ids (N and B of them); candidate ids are unique within a request.
    """

    name: str
    sets: CandidateSets
    n_passes: int
    best_reward: np.ndarray
    expected: np.ndarray
    candidate_ids: list[str]
    request_ids: list[str]

    def __post_init__(self) -> None:
        B, N = len(self.sets), len(self.sets.items)
        if self.sets.rewards is None:
            raise DataError(f"Expected realised rewards in the candidate stream {self.name!r}. Got none.")
        if self.expected.shape != (N,) or len(self.candidate_ids) != N:
            raise DataError(f"Expected {N} expected rewards and candidate ids. "
                            f"Got {self.expected.shape} and {len(self.candidate_ids)}.")
        if self.best_reward.shape != (B,) or len(self.request_ids) != B:
            raise DataError(f"Expected {B} best rewards and request ids. "
                            f"Got {self.best_reward.shape} and {len(self.request_ids)}.")

    def __len__(self) -> int:
        return len(self.sets)

    @property
    def rewards(self) -> np.ndarray:
        """(N,) the realised reward of each candidate if chosen."""
        assert self.sets.rewards is not None  # checked in __post_init__
        return self.sets.rewards

    def batches(self, size: int) -> Iterator[CandidateSets]:
        """Consecutive slices of ``size`` requests (the last may be shorter), in stream order."""
        if size < 1:
            raise ConfigError(f"Expected a batch size >= 1. Got {size}.")
        offsets = self.sets.offsets
        for lo in range(0, len(self), size):
            hi = min(lo + size, len(self))
            a, b = int(offsets[lo]), int(offsets[hi])
            yield CandidateSets(self.sets.context[lo:hi], self.sets.items[a:b],
                                offsets[lo:hi + 1] - a, self.rewards[a:b])

    def best_rows(self) -> np.ndarray:
        """(B,) the global row of each request's best candidate (the optimal policy)."""
        return segment_argmax(self.expected, self.sets.offsets)

    def regret(self, chosen: np.ndarray) -> float:
        """Total regret of playing global rows ``chosen`` (B,) against the optimal policy."""
        chosen = self._check_chosen(chosen)
        return float(self.best_reward.sum() - self.expected[chosen].sum())

    def error(self, chosen: np.ndarray) -> float:
        """Online error of playing rows ``chosen``: mean(1 − realised reward)."""
        chosen = self._check_chosen(chosen)
        return float(np.mean(1.0 - self.rewards[chosen])) if len(chosen) else float("nan")

    def _check_chosen(self, chosen: np.ndarray) -> np.ndarray:
        chosen = np.asarray(chosen, dtype=np.int64)
        request = self.sets.request_of
        if chosen.shape != (len(self),) or (len(chosen) and (
                (chosen < 0).any() or (chosen >= len(request)).any()
                or (request[np.clip(chosen, 0, len(request) - 1)] != np.arange(len(self))).any())):
            raise DataError(f"Expected one chosen row per request ({len(self)}), each inside its "
                            f"request's candidates. Got shape {chosen.shape}.")
        return chosen


def _segment_max(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return np.maximum.reduceat(values, offsets[:-1]) if len(values) else np.zeros(0)


def _check_passes(passes: int, rounds: int | None) -> None:
    if not isinstance(passes, int) or passes < 1:
        raise ConfigError(f"Expected passes to be an int >= 1. Got {passes!r}.")
    if rounds is not None and (not isinstance(rounds, int) or rounds < 1):
        raise ConfigError(f"Expected rounds to be an int >= 1 or None. Got {rounds!r}.")


def ohsumed_candidates(passes: int = 1, seed: int | None = 0, graded: bool = False,
                       data_dir: str | os.PathLike[str] | None = None,
                       rounds: int | None = None, fetch: bool = False) -> CandidateStream:
    """LETOR 3.0 OHSUMED as a candidate-set bandit (module docstring); ``rounds`` cuts or extends.

    Request ids are ``q<qid>.p<pass>`` (pass from 1); candidate ids are the LETOR doc ids.
    ``seed=None`` keeps the queries in file order in every pass. A missing data directory is
    a DataError naming the fixes (:func:`~streamlearn.datasets.letor.ohsumed_root`).
    """
    _check_passes(passes, rounds)
    root = ohsumed_root(data_dir, fetch)
    fold = load_fold(root, _OHSUMED_FOLD)
    X = np.concatenate([fold[s].X for s in SPLITS])
    grade = np.concatenate([fold[s].y for s in SPLITS])
    qid = np.concatenate([fold[s].qid for s in SPLITS])
    docid = np.concatenate([fold[s].docid for s in SPLITS])
    groups = query_groups(qid, len(qid))  # raises unless each query's rows are contiguous
    if groups.n_queries != OHSUMED_QUERIES or X.shape[1] != OHSUMED_FEATURES:
        raise DataError(f"Expected {OHSUMED_QUERIES} queries with {OHSUMED_FEATURES} features in {root}. "
                        f"Got {groups.n_queries} queries with {X.shape[1]} features.")
    if not np.isin(grade, (0.0, 1.0, 2.0)).all():
        raise DataError(f"Expected OHSUMED relevance grades 0/1/2 in {root}. "
                        f"Got {np.unique(grade).tolist()}.")
    reward = grade / 2.0 if graded else (grade >= 1).astype(np.float64)
    query_offsets = np.append(groups.starts, len(qid))
    order = stream_order(groups.n_queries, passes, rounds, seed)
    offsets, rows = gather_segments(query_offsets, order)
    expected = reward[rows]
    pass_of = np.arange(len(order)) // groups.n_queries + 1
    return CandidateStream(
        name="ohsumed-candidates-graded" if graded else "ohsumed-candidates",
        sets=CandidateSets(np.zeros((len(order), 0)), X[rows], offsets, expected.copy()),
        n_passes=int(pass_of[-1]) if len(order) else 0,
        best_reward=_segment_max(expected, offsets),
        expected=expected,
        candidate_ids=[str(d) for d in docid[rows]],
        request_ids=[f"q{q}.p{p}" for q, p in zip(groups.ids[order].tolist(), pass_of.tolist(),
                                                  strict=True)],
    )


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * z)))  # overflow-free logistic


def synthetic_candidates(n_requests: int, d_x: int = 5, d_c: int = 5, min_candidates: int = 2,
                         max_candidates: int = 20, seed: int = 0) -> CandidateStream:
    """Requests with 1 shared context and a seeded number of candidates, known logistic reward.

    Contexts and candidate features are standard normal; ``θ ~ N(0, 1/d_x)`` per
    entry and ``β ~ N(0, 1/d_c)``, so the logit has variance ``d_c + 1`` (0 + 1
    when ``d_x = 0``) whatever the dimensions. Each request has a uniform
    number of candidates in ``[min_candidates, max_candidates]``. Request ids
    are ``r<i>``, candidate ids ``c<global row>``.
    """
    for name, value, low in (("n_requests", n_requests, 1), ("d_x", d_x, 0), ("d_c", d_c, 1),
                             ("min_candidates", min_candidates, 1)):
        if not isinstance(value, int) or value < low:
            raise ConfigError(f"Expected {name} to be an int >= {low}. Got {value!r}.")
    if not isinstance(max_candidates, int) or max_candidates < min_candidates:
        raise ConfigError(f"Expected max_candidates to be an int >= min_candidates ({min_candidates}). "
                          f"Got {max_candidates!r}.")
    rng = np.random.default_rng(seed)
    theta = rng.normal(0.0, 1.0 / np.sqrt(max(d_x, 1)), size=(d_x, d_c))
    beta = rng.normal(0.0, 1.0 / np.sqrt(d_c), size=d_c)
    sizes = rng.integers(min_candidates, max_candidates + 1, size=n_requests)
    offsets = np.zeros(n_requests + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    context = rng.standard_normal((n_requests, d_x))
    items = rng.standard_normal((int(offsets[-1]), d_c))
    request_of = np.repeat(np.arange(n_requests), sizes)
    logits = np.einsum("ni,ij,nj->n", context[request_of], theta, items) + items @ beta
    expected = _sigmoid(logits)
    rewards = (rng.random(len(expected)) < expected).astype(np.float64)
    return CandidateStream(
        name="synthetic-candidates",
        sets=CandidateSets(context, items, offsets, rewards),
        n_passes=1,
        best_reward=_segment_max(expected, offsets),
        expected=expected,
        candidate_ids=[f"c{k}" for k in range(len(expected))],
        request_ids=[f"r{i}" for i in range(n_requests)],
    )


def _load_ohsumed(passes: int, seed: int, rounds: int | None,
                  data_dir: str | os.PathLike[str] | None, graded: bool,
                  fetch: bool) -> CandidateStream:
    return ohsumed_candidates(passes=passes, seed=seed, graded=graded, data_dir=data_dir,
                              rounds=rounds, fetch=fetch)


def _load_synthetic(passes: int, seed: int, rounds: int | None,
                    data_dir: str | os.PathLike[str] | None, graded: bool,
                    fetch: bool) -> CandidateStream:
    """``rounds`` distinct requests (default 10,000); later passes replay them reshuffled."""
    _check_passes(passes, rounds)
    base = synthetic_candidates(rounds if rounds is not None else DEFAULT_SYNTHETIC_REQUESTS, seed=seed)
    if passes == 1:
        return base
    n = len(base)
    order = np.concatenate([np.arange(n), stream_order(n, passes - 1, None, seed + 1)])
    offsets, rows = gather_segments(base.sets.offsets, order)
    pass_of = np.arange(len(order)) // n + 1
    return CandidateStream(
        name=base.name,
        sets=CandidateSets(base.sets.context[order], base.sets.items[rows], offsets, base.rewards[rows]),
        n_passes=passes,
        best_reward=base.best_reward[order],
        expected=base.expected[rows],
        candidate_ids=[base.candidate_ids[r] for r in rows.tolist()],
        request_ids=[f"{base.request_ids[r]}.p{p}" for r, p in zip(order.tolist(), pass_of.tolist(),
                                                                   strict=True)],
    )


#: Shuffled passes over OHSUMED's queries a simulated caller plays before it starts over.
OHSUMED_CALLER_PASSES = 20


def request_cycle(name: str, seed: int, data_dir: str | os.PathLike[str] | None = None,
                  fetch: bool = False) -> tuple[CandidateStream, np.ndarray]:
    """The requests a simulated caller cycles through, each held once, and the order it plays
    them in (request ``n`` is ``stream`` request ``order[n mod len(order)]``).

    OHSUMED: its 106 queries in file order, played in :data:`OHSUMED_CALLER_PASSES` shuffled
    passes — the order of ``load_candidate_stream(name, passes=20, seed=seed)``, without its
    20 copies of the candidates (120 MB). Another stream: its requests, in order.
    """
    entry = CANDIDATE_STREAMS.get(name)
    if entry is not None and entry[0] is _load_ohsumed:
        stream = ohsumed_candidates(passes=1, seed=None, graded=entry[1], data_dir=data_dir,
                                    fetch=fetch)
        return stream, stream_order(len(stream), OHSUMED_CALLER_PASSES, None, seed)
    stream = load_candidate_stream(name, seed=seed, data_dir=data_dir, fetch=fetch)
    return stream, np.arange(len(stream))


CandidateLoader = Callable[[int, int, int | None, str | os.PathLike[str] | None, bool, bool],
                          CandidateStream]

#: stream name → (loader, graded flag) for :func:`load_candidate_stream`.
CANDIDATE_STREAMS: dict[str, tuple[CandidateLoader, bool]] = {
    "ohsumed-candidates": (_load_ohsumed, False),
    "ohsumed-candidates-graded": (_load_ohsumed, True),
    "synthetic-candidates": (_load_synthetic, False),
}


def load_candidate_stream(name: str, passes: int = 1, seed: int = 0, rounds: int | None = None,
                          data_dir: str | os.PathLike[str] | None = None,
                          fetch: bool = False) -> CandidateStream:
    """A registered candidate-set stream by name (:data:`CANDIDATE_STREAMS`).

    ``ohsumed-candidates[-graded]``: ``passes`` shuffled passes over the 106
    queries, cut or extended to ``rounds`` requests when given.
    ``synthetic-candidates``: ``rounds`` distinct requests (default 10,000),
    repeated reshuffled for each further pass. ``data_dir`` and ``fetch`` are those of
    ``--data-dir`` and ``--fetch`` (OHSUMED cannot be fetched: the error says where to get it).

    >>> load_candidate_stream("nope")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    streamlearn.errors.ConfigError: Expected a candidate stream in [...]. Got 'nope' instead.
    """
    entry = CANDIDATE_STREAMS.get(name)
    if entry is None:
        raise ConfigError(f"Expected a candidate stream in {sorted(CANDIDATE_STREAMS)}. "
                          f"Got {name!r} instead.")
    loader, graded = entry
    return loader(passes, seed, rounds, data_dir, graded, fetch)
