"""The Banditron paper's SynSep / SynNonSep generator (docs/algorithms.md §2), vectorised.

Fix 9 random bit vectors v_1..v_9 ∈ {0,1}^400, each with 20–40 ones inside the
first 120 coordinates. An example: pick a topic i uniformly, copy v_i, switch
off 5 random ones of its support, switch on 20 random coordinates among the
last 280. Label = i. SynNonSep: with probability 0.05 the label is replaced by
a uniformly random *different* label.

>>> X, y = synthetic_stream(1000, noise=0.05, seed=3)
>>> X.shape, int(X[0, 120:].sum()), sorted(set(y.tolist())) == list(range(9))
((1000, 400), 20, True)

:class:`SyntheticRows` gives the same rows on demand, in any order, without
holding the ``(n, 400)`` matrix: 2 bytes per row are kept (topic and label),
and a row's features are generated when asked for, by moving the random
generator to the position where :func:`synthetic_stream` drew them.

>>> rows = SyntheticRows(1000, noise=0.05, seed=3)
>>> bool((rows.features(np.array([7, 2, 999])) == X[[7, 2, 999]]).all())
True
>>> bool((rows.labels == y).all())
True
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

__all__ = ["N_CLASSES", "N_FEATURES", "SyntheticRows", "synthetic_stream", "topic_vectors"]

N_CLASSES = 9
N_FEATURES = 400
SUPPORT_WIDTH = 120
N_SWITCHED_OFF = 5
N_SWITCHED_ON = 20


def topic_vectors(rng: np.random.Generator) -> np.ndarray:
    """The 9 fixed topic bit vectors (20–40 ones each, all in the first 120 coordinates)."""
    topics = np.zeros((N_CLASSES, N_FEATURES))
    for i in range(N_CLASSES):
        n_ones = int(rng.integers(20, 41))
        topics[i, rng.choice(SUPPORT_WIDTH, size=n_ones, replace=False)] = 1.0
    return topics


def _subset_mask(uniforms: np.ndarray, allowed: np.ndarray, k: int) -> np.ndarray:
    """Per row, the mask of the k allowed coordinates with the smallest ``uniforms``."""
    keys = np.where(allowed, uniforms, np.inf)
    chosen = np.argpartition(keys, k - 1, axis=1)[:, :k]
    mask = np.zeros(allowed.shape, dtype=bool)
    np.put_along_axis(mask, chosen, True, axis=1)
    return mask


def _features(topics: np.ndarray, off_uniforms: np.ndarray, on_uniforms: np.ndarray) -> np.ndarray:
    """Rows from their topic vectors and the uniforms that pick the switched-off/on coordinates.

    The same masks as ``_subset_mask`` over all 400 columns, computed on the columns that
    can be chosen: the support lies in the first 120, the switched-on ones in the last 280.
    """
    head = topics[:, :SUPPORT_WIDTH]
    off = _subset_mask(off_uniforms[:, :SUPPORT_WIDTH], head > 0, N_SWITCHED_OFF)
    out = np.empty(topics.shape, dtype=np.float32)
    out[:, :SUPPORT_WIDTH] = np.where(off, 0.0, head)
    tail = on_uniforms[:, SUPPORT_WIDTH:]
    on = np.argpartition(tail, N_SWITCHED_ON - 1, axis=1)[:, :N_SWITCHED_ON]
    out[:, SUPPORT_WIDTH:] = 0.0
    np.put_along_axis(out[:, SUPPORT_WIDTH:], on, 1.0, axis=1)
    return out


def synthetic_stream(
    n: int, noise: float = 0.05, seed: int = 0, topic_seed: int | None = None,
    chunk: int = 100_000,
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` examples ``(X float32-valued float64 (n, 400), y int64 (n,))``.

    ``noise=0`` is SynSep, ``noise=0.05`` SynNonSep. ``topic_seed`` fixes the
    topic vectors separately from the example stream (default: ``seed``).
    Returns float32 features to keep 10⁶×400 streams at 1.6 GB rather than 3.2 GB;
    learners cast per batch.
    """
    topics = topic_vectors(np.random.default_rng(seed if topic_seed is None else topic_seed))
    rng = np.random.default_rng([seed, 1])
    X = np.empty((n, N_FEATURES), dtype=np.float32)
    y = rng.integers(0, N_CLASSES, size=n)
    # Random-number order (SyntheticRows relies on it): y; then per chunk the off-uniforms
    # (rows × 400) and the on-uniforms (rows × 400), one 64-bit draw each; then flip, shift.
    for start in range(0, n, chunk):  # chunks bound the temporary memory, each fully vectorised
        stop = min(n, start + chunk)
        base = topics[y[start:stop]]
        off_uniforms = rng.random(base.shape)
        X[start:stop] = _features(base, off_uniforms, rng.random(base.shape))
    labels = y.copy()
    flip = rng.random(n) < noise
    shift = rng.integers(1, N_CLASSES, size=n)  # a uniformly random *different* label
    labels[flip] = (labels[flip] + shift[flip]) % N_CLASSES
    return X, labels.astype(np.int64)


class SyntheticRows:
    """The rows of ``synthetic_stream(n, noise, seed, topic_seed, chunk)``, generated on demand.

    Keeps each row's topic and label (1 byte each); :meth:`features` generates
    the feature rows asked for — in any order, identical to the matrix
    :func:`synthetic_stream` returns — by moving a copy of the PCG64
    generator (``advance``) to where that function drew their uniforms:
    after the draw of ``y`` at position P, chunk ``c`` (rows ``s_c..s_c+m_c``)
    has its off-uniforms at ``P + 800·s_c`` and its on-uniforms at
    ``P + 800·s_c + 400·m_c``, 400 per row. Rows asked for together are
    generated in index order, consecutive ones with one draw.
    """

    def __init__(self, n: int, noise: float = 0.05, seed: int = 0, topic_seed: int | None = None,
                 chunk: int = 100_000) -> None:
        self.n, self.chunk = n, chunk
        self.topics = topic_vectors(np.random.default_rng(seed if topic_seed is None else topic_seed))
        rng = np.random.default_rng([seed, 1])
        topic = rng.integers(0, N_CLASSES, size=n)
        self._start = rng.bit_generator.state  # position P: the first uniform of chunk 0
        tail = self._generator_at(N_FEATURES * 2 * n)
        flip = np.concatenate([tail.random(min(chunk, n - i)) < noise for i in range(0, n, chunk)]
                              or [np.zeros(0, dtype=bool)])
        shift = tail.integers(1, N_CLASSES, size=n)  # one call: its 32-bit draws are buffered
        labels = topic.copy()
        labels[flip] = (labels[flip] + shift[flip]) % N_CLASSES
        self.topic_of = topic.astype(np.uint8)
        self.labels = labels.astype(np.int64)

    def _generator_at(self, draws: int) -> np.random.Generator:
        """A generator ``draws`` 64-bit draws past position P (with P's buffered 32 bits)."""
        bits = np.random.PCG64()
        bits.state = cast(Any, self._start)
        bits.advance(draws)  # advance drops the buffered 32-bit half; put it back
        state: Any = {**bits.state, "has_uint32": self._start["has_uint32"],
                      "uinteger": self._start["uinteger"]}
        bits.state = state
        return np.random.Generator(bits)

    def features(self, rows: np.ndarray) -> np.ndarray:
        """``X[rows]`` of :func:`synthetic_stream` as float32, ``(len(rows), 400)``."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.n):
            raise IndexError(f"rows must be in [0, {self.n}). Got {rows.min()}..{rows.max()}.")
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        off = np.empty((len(rows), N_FEATURES))
        on = np.empty((len(rows), N_FEATURES))
        # runs of consecutive rows inside one chunk: one draw each for off and for on
        breaks = np.flatnonzero((np.diff(sorted_rows) != 1)
                                | (sorted_rows[1:] // self.chunk != sorted_rows[:-1] // self.chunk))
        bounds = np.concatenate([[0], breaks + 1, [len(rows)]]).astype(np.int64)
        off_gen = on_gen = None
        off_pos = on_pos = 0
        per_row = N_FEATURES
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            if lo == hi:
                continue
            first = int(sorted_rows[lo])
            chunk_start = first - first % self.chunk
            chunk_rows = min(self.chunk, self.n - chunk_start)
            off_at = per_row * (2 * chunk_start + (first - chunk_start))
            on_at = off_at + per_row * chunk_rows
            off_gen, off_pos = self._move(off_gen, off_pos, off_at)
            on_gen, on_pos = self._move(on_gen, on_pos, on_at)
            count = per_row * (hi - lo)
            off_gen.random(out=off[lo:hi].reshape(-1))
            on_gen.random(out=on[lo:hi].reshape(-1))
            off_pos += count
            on_pos += count
        X = np.empty((len(rows), N_FEATURES), dtype=np.float32)
        X[order] = _features(self.topics[self.topic_of[sorted_rows]], off, on)
        return X

    def _move(self, gen: np.random.Generator | None, position: int,
              target: int) -> tuple[np.random.Generator, int]:
        """``gen`` moved to draw ``target`` next (forward in place, else a fresh copy)."""
        if gen is None or target < position:
            return self._generator_at(target), target
        if target > position:
            cast(np.random.PCG64, gen.bit_generator).advance(target - position)
        return gen, target
