"""Exploration randomness as a pure function of (seed, event key), vectorised.

No RNG object is carried from event to event: the uniform draw of an event is
``splitmix64(seed_mix ^ hash(key))`` mapped to [0, 1). Replaying the same events
against the same state therefore reproduces the same decisions, which is what
makes crash recovery and replays exact.

>>> u = uniforms(7, np.array([1, 2, 3]))
>>> bool(np.all((u >= 0) & (u < 1))), bool(np.array_equal(u, uniforms(7, [1, 2, 3])))
(True, True)
>>> bool(np.array_equal(uniforms(7, ["a", "b"]), uniforms(7, np.array(["a", "b"]))))
True
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from streamlearn.features import _fnv1a_64, hash_strings

__all__ = ["hash_keys", "sample", "splitmix64", "uniforms"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S11, _S27, _S30, _S31 = (np.uint64(s) for s in (11, 27, 30, 31))
_UNIT = 1.0 / (1 << 53)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 arrays (wrapping arithmetic).

    Array arithmetic on uint64 wraps silently, so no ``errstate`` is needed here.
    The input is never modified: the first addition makes the array worked on in place.
    """
    z = np.asarray(x, dtype=np.uint64) + _GOLDEN
    z ^= z >> _S30
    z *= _MIX1
    z ^= z >> _S27
    z *= _MIX2
    z ^= z >> _S31
    return z


def hash_keys(keys: object) -> np.ndarray:
    """One uint64 per key: integers are used as they are, strings/bytes are FNV-1a hashed.

    A list of strings is hashed byte for byte (an id ending in NUL keeps its NUL);
    a numpy ``U`` array has already lost trailing NULs when it was built.
    """
    if type(keys) is np.ndarray and keys.dtype == np.int64:  # round numbers: the hot path
        return keys.astype(np.uint64).reshape(-1)
    if isinstance(keys, (list, tuple)) and keys and all(isinstance(k, str) for k in keys):
        return hash_strings(keys)
    arr = np.asarray(keys)
    if arr.dtype.kind in "iu":
        return arr.astype(np.uint64).reshape(-1)  # negative keys wrap, still one value per key
    if arr.dtype.kind == "O":
        items: Sequence[object] = arr.reshape(-1).tolist()
        if all(isinstance(k, str) for k in items):
            return hash_strings(items)  # type: ignore[arg-type]
        arr = np.array([k.encode("utf-8") if isinstance(k, str) else bytes(k)  # type: ignore[call-overload]
                        for k in items], dtype=bytes)
    if arr.dtype.kind == "U":
        arr = np.char.encode(arr, "utf-8")
    if arr.dtype.kind != "S":
        raise TypeError(f"Event keys must be integers or strings. Got dtype {arr.dtype}.")
    return _fnv1a_64(arr.reshape(-1))


@functools.lru_cache(maxsize=64)
def _seed_mix(seed: int) -> np.uint64:
    return np.uint64(splitmix64(np.array([seed], dtype=np.uint64))[0])


_MASK64 = (1 << 64) - 1
#: Up to this many keys are mixed with Python integers: the seven numpy operations of
#: :func:`splitmix64` cost ~10 µs whatever the size, which a micro-batch of one to eight
#: events paid on every decide (docs/performance.md). The same arithmetic, bit for bit.
_MIX_IN_PYTHON_UP_TO = 24


def _splitmix64_int(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def uniforms(seed: int, keys: object) -> np.ndarray:
    """Uniform [0, 1) draws, one per key, determined by (seed, key) alone."""
    hashed = hash_keys(keys)
    if len(hashed) <= _MIX_IN_PYTHON_UP_TO:
        mix = int(_seed_mix(seed))
        return np.array([(_splitmix64_int(h ^ mix) >> 11) * _UNIT for h in hashed.tolist()],
                        dtype=np.float64)
    bits = splitmix64(hashed ^ _seed_mix(seed))
    bits >>= _S11
    u = bits.astype(np.float64)
    u *= _UNIT
    return u


#: Up to this many probabilities (rows × actions) are sampled in Python: the same sums in
#: the same order as ``cumsum``, so the same action, without numpy's per-call costs.
_SAMPLE_IN_PYTHON_UP_TO = 64


def _sample_row(row: list[float], u: float) -> int:
    # the running sums in order (as cumsum adds them); a distribution's CDF never falls, so
    # the first entry above the threshold is a bisection (past the end: NaN sums, action 0)
    cdf = list(accumulate(row))
    total = cdf[-1]
    first = bisect_right(cdf, min(u * total, math.nextafter(total, 0.0)))
    return first if first < len(cdf) else 0


def sample(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling of one action per row; never returns a zero-probability action.

    The action is the first index whose CDF exceeds u·total; a zero-probability
    action never raises the CDF, so it can never be that first index. The
    threshold is kept strictly below the total so rounding cannot run past the end.
    """
    probs = np.asarray(probs)
    if probs.size <= _SAMPLE_IN_PYTHON_UP_TO and probs.ndim == 2 and probs.shape[1]:
        return np.array([_sample_row(row, x) for row, x in zip(probs.tolist(), u.tolist(),
                                                               strict=True)], dtype=np.int64)
    cdf = probs.cumsum(axis=1)
    total = cdf[:, -1]
    threshold = u * total
    np.minimum(threshold, np.nextafter(total, 0.0), out=threshold)
    return np.asarray((cdf > threshold[:, None]).argmax(axis=1))
