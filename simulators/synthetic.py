"""The Banditron paper's SynSep / SynNonSep generator (ALGORITHMS.md §2), vectorised.

Fix 9 random bit vectors v_1..v_9 ∈ {0,1}^400, each with 20–40 ones inside the
first 120 coordinates. An example: pick a topic i uniformly, copy v_i, switch
off 5 random ones of its support, switch on 20 random coordinates among the
last 280. Label = i. SynNonSep: with probability 0.05 the label is replaced by
a uniformly random *different* label.

>>> X, y = synthetic_stream(1000, noise=0.05, seed=3)
>>> X.shape, int(X[0, 120:].sum()), sorted(set(y.tolist())) == list(range(9))
((1000, 400), 20, True)
"""

from __future__ import annotations

import numpy as np

__all__ = ["N_CLASSES", "N_FEATURES", "synthetic_stream", "topic_vectors"]

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


def _random_subset_mask(rng: np.random.Generator, allowed: np.ndarray, k: int) -> np.ndarray:
    """Per row, a mask of k coordinates chosen uniformly among the allowed ones (vectorised)."""
    keys = np.where(allowed, rng.random(allowed.shape), np.inf)
    chosen = np.argpartition(keys, k - 1, axis=1)[:, :k]
    mask = np.zeros(allowed.shape, dtype=bool)
    np.put_along_axis(mask, chosen, True, axis=1)
    return mask


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
    for start in range(0, n, chunk):  # chunks bound the temporary memory, each fully vectorised
        stop = min(n, start + chunk)
        base = topics[y[start:stop]]
        off = _random_subset_mask(rng, base > 0, N_SWITCHED_OFF)
        tail = np.zeros_like(base, dtype=bool)
        tail[:, SUPPORT_WIDTH:] = True
        on = _random_subset_mask(rng, tail, N_SWITCHED_ON)
        X[start:stop] = np.where(off, 0.0, base) + on
    labels = y.copy()
    flip = rng.random(n) < noise
    shift = rng.integers(1, N_CLASSES, size=n)  # a uniformly random *different* label
    labels[flip] = (labels[flip] + shift[flip]) % N_CLASSES
    return X, labels.astype(np.int64)
