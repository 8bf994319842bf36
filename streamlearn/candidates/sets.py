"""A batch of requests, each with its own candidate set, as segments.

Request ``r`` owns candidate rows ``offsets[r] : offsets[r + 1]`` of ``items``;
``context[r]`` is its shared context (``d_x = 0`` when there is none). Every
request has at least one candidate. ``rewards`` (optional, simulations and
replays) is each candidate's reward if it were chosen — what a stream knows and
a learner never sees.

>>> sets = CandidateSets(np.zeros((2, 0)), np.arange(10.0).reshape(5, 2), np.array([0, 2, 5]))
>>> sets.sizes.tolist(), sets.request_of.tolist(), len(sets)
([2, 3], [0, 0, 1, 1, 1], 2)
>>> sets.take(np.array([1])).items.tolist()
[[4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from streamlearn.errors import DataError

__all__ = ["CandidateSets", "gather_segments", "segment_argmax", "segment_sample"]


@dataclass
class CandidateSets:
    """``context`` (B, d_x), ``items`` (N, d_c), ``offsets`` (B + 1,) int64."""

    context: np.ndarray
    items: np.ndarray
    offsets: np.ndarray
    rewards: np.ndarray | None = None  # (N,) reward of each candidate (simulations only)

    def __post_init__(self) -> None:
        self.context = np.asarray(self.context, dtype=np.float64)
        self.items = np.asarray(self.items, dtype=np.float64)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        B, N = len(self.offsets) - 1, len(self.items)
        if self.context.ndim != 2 or self.items.ndim != 2 or self.offsets.ndim != 1:
            raise DataError("Expected context (B, d_x), items (N, d_c) and offsets (B + 1,). Got "
                            f"shapes {self.context.shape}, {self.items.shape}, {self.offsets.shape}.")
        if B < 0 or self.context.shape[0] != B or self.offsets[0] != 0 or self.offsets[-1] != N:
            raise DataError(f"Expected offsets from 0 to {N} for {self.context.shape[0]} requests. "
                            f"Got {self.offsets.tolist()[:5]}...")
        if B and (np.diff(self.offsets) < 1).any():
            raise DataError("Expected at least one candidate per request. Got an empty set.")
        if self.rewards is not None:
            self.rewards = np.asarray(self.rewards, dtype=np.float64)
            if self.rewards.shape != (N,):
                raise DataError(f"Expected one reward per candidate ({N}). Got {self.rewards.shape}.")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def request_of(self) -> np.ndarray:
        """(N,) the request of each candidate row."""
        return np.repeat(np.arange(len(self)), self.sizes)

    def take(self, requests: np.ndarray) -> CandidateSets:
        """The sub-batch of the given requests (in that order)."""
        requests = np.asarray(requests, dtype=np.int64)
        offsets, rows = gather_segments(self.offsets, requests)
        return CandidateSets(self.context[requests], self.items[rows], offsets,
                             None if self.rewards is None else self.rewards[rows])


def gather_segments(offsets: np.ndarray, segments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The offsets and source rows of the given segments laid end to end (in that order).

    >>> o, rows = gather_segments(np.array([0, 2, 5]), np.array([1, 0, 1]))
    >>> o.tolist(), rows.tolist()
    ([0, 3, 5, 8], [2, 3, 4, 0, 1, 2, 3, 4])
    """
    segments = np.asarray(segments, dtype=np.int64)
    starts, sizes = offsets[segments], offsets[segments + 1] - offsets[segments]
    out = np.zeros(len(segments) + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    rows = np.repeat(starts - out[:-1], sizes) + np.arange(out[-1])
    return out, np.asarray(rows, dtype=np.int64)


def segment_argmax(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(B,) the global row of each segment's largest value (the first on ties; NaN lowest).

    >>> segment_argmax(np.array([1.0, 3.0, 2.0, 5.0, 5.0]), np.array([0, 3, 5])).tolist()
    [1, 3]
    """
    v = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
    starts = np.asarray(offsets[:-1])
    if not len(starts):
        return np.zeros(0, dtype=np.int64)
    # O(N): each segment's maximum, then the first row equal to it (every segment is non-empty)
    best = np.maximum.reduceat(v, starts)
    at_max = np.flatnonzero(v == np.repeat(best, np.diff(offsets)))
    return np.asarray(at_max[np.searchsorted(at_max, starts)], dtype=np.int64)


def segment_sample(probs: np.ndarray, offsets: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """(B,) the global row sampled in each segment by inverse CDF with one uniform per segment.

    >>> segment_sample(np.array([0.5, 0.5, 0.1, 0.9]), np.array([0, 2, 4]), np.array([0.7, 0.05])).tolist()
    [1, 2]
    """
    cumulative = np.cumsum(probs)
    base = np.concatenate([[0.0], cumulative])[offsets[:-1]]
    sizes = np.diff(offsets)
    within = cumulative - np.repeat(base, sizes)
    totals = within[offsets[1:] - 1]
    target = np.repeat(np.asarray(uniforms) * totals, sizes)
    below = (within <= target).astype(np.int64)  # rows whose cumulative mass is not past u
    counts = np.add.reduceat(below, offsets[:-1]) if len(below) else np.zeros(0, np.int64)
    return np.asarray(offsets[:-1] + np.minimum(counts, sizes - 1))
