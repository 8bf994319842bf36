"""Feature batches: dense matrices, sparse CSR batches, named features hashed into buckets.

Every learner works on a *batch*: either a dense ``float64`` array of shape
``(B, d)`` or a :class:`SparseBatch` (CSR layout, ``d`` columns). The two
operations learners need are vectorised for both layouts:

* :func:`scores` — ``X @ W.T`` (one product scores a whole micro-batch);
* :func:`add_outer` — ``W += C.T @ X`` (one product applies a whole batch of
  rank-one updates, ``C`` holding a coefficient per (event, action)).

Examples
--------
>>> import numpy as np
>>> X = SparseBatch.from_rows([[0, 2], [1]], [[1.0, 2.0], [3.0]], n_features=3)
>>> W = np.arange(6, dtype=float).reshape(2, 3)
>>> scores(W, X).tolist()
[[4.0, 13.0], [3.0, 12.0]]
>>> float(np.abs(scores(W, X) - scores(W, X.to_dense())).max())
0.0
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from streamlearn.errors import ConfigError

__all__ = [
    "Batch",
    "SparseBatch",
    "add_outer",
    "as_batch",
    "as_sparse",
    "batch_size",
    "concat_rows",
    "hash_names",
    "hash_strings",
    "held_columns",
    "held_columns_and_local",
    "row_norms",
    "row_starts",
    "scores",
    "take_rows",
]


@dataclass(frozen=True)
class SparseBatch:
    """A batch of sparse rows in CSR layout.

    Invariants: ``indptr`` has ``B + 1`` non-decreasing entries starting at 0
    and ending at ``len(indices)``; every index is in ``[0, n_features)``.
    Duplicate indices inside a row add up (as in :meth:`to_dense`): the learners
    take a batch through :func:`as_batch`, which checks the layout and sums them
    (:meth:`checked`), so a squared value (a second-order learner's curvature) is
    the square of the sum, as for the dense row. The library's own batches hold
    each row's indices strictly increasing, which that check confirms in O(nnz).
    """

    indptr: np.ndarray  # int64, shape (B + 1,)
    indices: np.ndarray  # int64, shape (nnz,)
    values: np.ndarray  # float64, shape (nnz,)
    n_features: int
    # set once :meth:`checked` found this batch valid with no duplicates (the batch is
    # frozen and its arrays are not written to afterwards: a learner's decide and update
    # of the same batch check it once)
    _checked: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.indptr) - 1, self.n_features)

    @classmethod
    def from_rows(
        cls,
        indices: Sequence[Sequence[int]],
        values: Sequence[Sequence[float]],
        n_features: int,
    ) -> SparseBatch:
        """Build a batch from per-row index and value lists (used by decoders and tests)."""
        lengths = np.fromiter((len(r) for r in indices), dtype=np.int64, count=len(indices))
        indptr = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        flat_idx = np.fromiter(
            (i for row in indices for i in row), dtype=np.int64, count=int(indptr[-1])
        )
        flat_val = np.fromiter(
            (v for row in values for v in row), dtype=np.float64, count=int(indptr[-1])
        )
        return cls(indptr, flat_idx, flat_val, int(n_features))

    def checked(self) -> SparseBatch:
        """This batch when it holds to the invariants and each row's indices are strictly
        increasing; the same rows with sorted indices and duplicates summed when they are
        not; a ``ConfigError`` saying what is wrong when the layout is broken. A few numpy
        calls on the fast path (~5–10 µs for one row): every learner call makes it."""
        if self._checked:
            return self
        indptr, indices, values = self.indptr, self.indices, self.values
        if not all(isinstance(a, np.ndarray) for a in (indptr, indices, values)):
            indptr, indices, values = (np.asarray(a) for a in (indptr, indices, values))
        d = self.n_features
        if indptr.ndim != 1 or len(indptr) < 1 or indptr.dtype.kind not in "iu":
            raise ConfigError(f"A SparseBatch's indptr must be a 1-D integer array of B + 1 "
                              f"row starts. Got {indptr.dtype} of shape {indptr.shape}.")
        if indices.ndim != 1 or values.shape != indices.shape or indices.dtype.kind not in "iu":
            raise ConfigError(f"A SparseBatch's indices must be a 1-D integer array and its "
                              f"values one of the same length. Got indices {indices.dtype} "
                              f"{indices.shape} and values {values.shape}.")
        nnz, B = len(indices), len(indptr) - 1
        if indptr[0] != 0 or indptr[-1] != nnz or (
                B > 1 and np.count_nonzero(indptr[1:] < indptr[:-1])):
            raise ConfigError(f"A SparseBatch's indptr must rise from 0 to len(indices) = {nnz}. "
                              f"Got {indptr[:4].tolist()}...{indptr[-2:].tolist()}.")
        if nnz and (np.minimum.reduce(indices) < 0 or np.maximum.reduce(indices) >= d):
            bad = indices[(indices < 0) | (indices >= d)]
            raise ConfigError(f"A SparseBatch's indices must be in [0, {d}) (n_features = {d}). "
                              f"Got {int(bad[0])}.")
        if values.dtype.kind not in "fiub":
            raise ConfigError(f"A SparseBatch's values must be numbers. Got {values.dtype} "
                              f"values such as {values.flat[0].item()!r:.40}.")
        if values.dtype != np.float64 or indices.dtype != np.int64 or indptr.dtype != np.int64:
            values, indices, indptr = (values.astype(np.float64), indices.astype(np.int64),
                                       indptr.astype(np.int64))
        if nnz > 1:
            falls = indices[1:] <= indices[:-1]  # entry i + 1 not above entry i
            if B > 1 and np.count_nonzero(falls):  # allowed where a row starts
                row_start = np.zeros(nnz, dtype=bool)
                row_start[indptr[1:-1][indptr[1:-1] < nnz]] = True
                falls &= ~row_start[1:]
            if np.count_nonzero(falls):
                return _summed_duplicates(indptr, indices, values, d)
        batch = self
        if (indptr is not self.indptr or indices is not self.indices
                or values is not self.values):  # converted (dtypes, lists)
            batch = SparseBatch(indptr, indices, values, d)
        object.__setattr__(batch, "_checked", True)
        return batch

    def row_ids(self) -> np.ndarray:
        """The row of each stored entry (length ``nnz``)."""
        return np.repeat(np.arange(self.shape[0]), np.diff(self.indptr))

    def to_dense(self) -> np.ndarray:
        X = self.checked()  # a broken layout raises rather than writing somewhere
        out = np.zeros(X.shape, dtype=np.float64)
        # a checked batch holds each (row, column) once: an assignment, not np.add.at (~8×
        # slower); + 0.0 stores a -0.0 as the sum onto a zero did
        out[X.row_ids(), X.indices] = X.values + 0.0
        return out

    def take(self, rows: np.ndarray) -> SparseBatch:
        """The sub-batch of the given rows, in the given order (vectorised gather)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        # position of every gathered entry in the source arrays
        offsets = np.arange(int(indptr[-1])) - np.repeat(indptr[:-1], lengths)
        src = np.repeat(starts, lengths) + offsets
        taken = SparseBatch(indptr, self.indices[src], self.values[src], self.n_features)
        if self._checked:  # whole rows of a checked batch
            object.__setattr__(taken, "_checked", True)
        return taken

    def scale_columns(self, scale: np.ndarray, shift: np.ndarray | None = None) -> SparseBatch:
        """Multiply each stored value by ``scale[column]`` (shifting breaks sparsity, so no shift)."""
        if shift is not None:
            raise ConfigError("Sparse batches cannot be centred; standardise dense data only.")
        return SparseBatch(self.indptr, self.indices, self.values * scale[self.indices],
                           self.n_features)


def _summed_duplicates(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray,
                       n_features: int) -> SparseBatch:
    """The rows with their indices sorted and the values of repeated indices summed."""
    B = len(indptr) - 1
    rows = np.repeat(np.arange(B, dtype=np.int64), np.diff(indptr))
    cells, inverse = np.unique(rows * n_features + indices, return_inverse=True)
    summed = np.bincount(inverse, weights=values, minlength=len(cells))
    out_indptr = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(np.bincount(cells // n_features, minlength=B), out=out_indptr[1:])
    batch = SparseBatch(out_indptr, cells % n_features, summed, n_features)
    object.__setattr__(batch, "_checked", True)
    return batch


Batch = np.ndarray | SparseBatch


def batch_size(X: Batch) -> int:
    return int(X.shape[0])


@functools.lru_cache(maxsize=64)
def row_starts(B: int, K: int) -> np.ndarray:
    """The flat index of each row's first entry in a C-ordered (B, K) array (read-only,
    shared): ``row_starts(B, K) + columns`` indexes ``a.reshape(-1)`` with one flat gather,
    cheaper than ``a[np.arange(B), columns]``."""
    starts = np.arange(0, B * K, K)
    starts.flags.writeable = False
    return starts


def concat_rows(batches: Sequence[Batch], n_features: int) -> Batch:
    """The rows of ``batches`` in order (one batch: itself): dense when every batch is dense,
    else a :class:`SparseBatch` holding each dense row's non-zero entries (in column order)."""
    if len(batches) == 1:
        return batches[0]
    dense = [b for b in batches if not isinstance(b, SparseBatch)]
    if len(dense) == len(batches):
        return np.concatenate(dense) if dense else np.zeros((0, n_features))
    sparse = [as_sparse(b) for b in batches]
    lengths = np.concatenate([np.diff(b.indptr) for b in sparse])
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return SparseBatch(indptr, np.concatenate([b.indices for b in sparse]),
                       np.concatenate([b.values for b in sparse]), n_features)


def as_sparse(X: Batch) -> SparseBatch:
    """Any batch as CSR (a dense row keeps its non-zeros, in column order)."""
    if isinstance(X, SparseBatch):
        return X
    X = np.asarray(X)
    nonzero = X != 0
    flat = np.flatnonzero(nonzero)  # row-major positions: CSR order (3.5x np.nonzero's cost)
    indptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.count_nonzero(nonzero, axis=1), out=indptr[1:])
    return SparseBatch(indptr, flat % X.shape[1], X.ravel()[flat], X.shape[1])


def take_rows(X: Batch, rows: np.ndarray) -> Batch:
    if isinstance(X, SparseBatch):
        return X.take(rows)
    return np.asarray(X[rows])


def as_batch(X: object, n_features: int | None = None) -> Batch:
    """Check and convert ``X`` into a float64 batch; raise ``ConfigError`` on a bad shape."""
    if isinstance(X, SparseBatch):
        if n_features is not None and X.n_features != n_features:
            raise ConfigError(
                f"Expected a batch with {n_features} features. Got {X.n_features} instead."
            )
        return X.checked()
    try:
        arr = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:  # strings, ragged rows, objects
        raise ConfigError(f"Expected a numeric feature batch (B, d). Got {type(X).__name__} "
                          f"that is not one ({exc}).") from exc
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ConfigError(f"Expected a 2-D feature batch (B, d). Got an array of shape {arr.shape}.")
    if n_features is not None and arr.shape[1] != n_features:
        raise ConfigError(f"Expected a batch with {n_features} features. Got {arr.shape[1]} instead.")
    return arr


DENSE_ENOUGH = 0.05  # sparse batches at least this dense are multiplied as dense matrices


def held_columns(X: SparseBatch) -> np.ndarray:
    """The columns a sparse batch holds, sorted (as ``np.unique(X.indices)``), in O(d + nnz)."""
    present = np.zeros(X.n_features, dtype=bool)
    present[X.indices] = True
    return np.flatnonzero(present)


def held_columns_and_local(X: SparseBatch) -> tuple[np.ndarray, np.ndarray]:
    """:func:`held_columns`, and each entry's column numbered among them (what
    ``np.searchsorted(held, X.indices)`` gives, by a table lookup: 5–10× faster at a few
    thousand entries)."""
    held = held_columns(X)
    number = np.empty(X.n_features, dtype=np.int64)  # only the held columns' slots are read
    number[held] = np.arange(len(held))
    return held, number[X.indices]


def _as_dense_if_dense_enough(X: SparseBatch) -> np.ndarray | None:
    """The batch as a dense matrix when it has >= 5 % non-zeros (a dense product is faster)."""
    B, d = X.shape
    if not B or len(X.indices) < DENSE_ENOUGH * B * d:
        return None
    flat = np.bincount(X.row_ids() * d + X.indices, weights=X.values, minlength=B * d)
    return flat.reshape(B, d)


def scores(W: np.ndarray, X: Batch) -> np.ndarray:
    """``X @ W.T``: the (B, K) score matrix of a batch under weights W of shape (K, d)."""
    if not isinstance(X, SparseBatch):
        return np.asarray(X @ W.T)
    dense = _as_dense_if_dense_enough(X)
    if dense is not None:
        return np.asarray(dense @ W.T)
    # take, not W[:, X.indices]: numpy's fancy indexing along the second axis is ~4× slower
    contributions = W.take(X.indices, axis=1) * X.values  # (K, nnz)
    # each row's entries are one contiguous segment: one reduceat sums every segment of every
    # action (2.4× faster than a bincount per action on reuters4's 64-row batches); reduceat
    # needs a non-empty segment at each start, so empty rows are left at zero
    starts = X.indptr[:-1]
    held = starts < X.indptr[1:]
    if held.all():
        return np.asarray(np.add.reduceat(contributions, starts, axis=1).T)
    out = np.zeros((W.shape[0], X.shape[0]), dtype=np.float64)
    if held.any():
        out[:, held] = np.add.reduceat(contributions, starts[held], axis=1)
    return out.T


def add_outer(W: np.ndarray, coef: np.ndarray, X: Batch) -> None:
    """In place ``W += coef.T @ X`` for coef of shape (B, K) and W of shape (K, d)."""
    if not isinstance(X, SparseBatch):
        W += coef.T @ X
        return
    dense = _as_dense_if_dense_enough(X)
    if dense is not None:
        W += coef.T @ dense
        return
    row_ids = X.row_ids()
    per_entry = coef[row_ids].T * X.values  # (K, nnz)
    d = W.shape[1]
    for k in np.flatnonzero(np.any(coef != 0.0, axis=0)):
        W[k] += np.bincount(X.indices, weights=per_entry[k], minlength=d)


def row_norms(X: Batch, order: float = 2) -> np.ndarray:
    """Per-row norm (``order`` 2 or ``np.inf``) of a batch."""
    if not isinstance(X, SparseBatch):
        return np.asarray(np.linalg.norm(X, ord=order, axis=1))
    row_ids = X.row_ids()
    B = X.shape[0]
    if order == np.inf:
        out = np.zeros(B)
        np.maximum.at(out, row_ids, np.abs(X.values))
        return out
    return np.sqrt(np.bincount(row_ids, weights=X.values**2, minlength=B))


_FNV_OFFSET, _FNV_PRIME, _U64 = 0xCBF29CE484222325, 0x100000001B3, 0xFFFFFFFFFFFFFFFF


def _fnv1a_64(names: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
    """Vectorised 64-bit FNV-1a over a fixed-width bytes array (one hash per name).

    ``lengths`` gives each name's byte length; without it the length stops at the
    last non-NUL byte, as numpy's ``S`` dtype does (so names ending in NUL need it).
    """
    width = names.dtype.itemsize
    codes = names.view(np.uint8).reshape(len(names), width) if width else np.zeros((len(names), 0),
                                                                                     np.uint8)
    if lengths is None:
        lengths = np.char.str_len(names) if len(names) else np.zeros(0, dtype=np.int64)
    h = np.full(len(names), _FNV_OFFSET, dtype=np.uint64)
    prime = np.uint64(_FNV_PRIME)
    with np.errstate(over="ignore"):
        for col in range(width):  # loop over characters, vectorised over names
            active = lengths > col
            mixed = (h ^ codes[:, col].astype(np.uint64)) * prime
            h = np.where(active, mixed, h)
    return h


#: up to this many strings are hashed byte by byte in Python: the vectorised loop costs
#: ~60 µs whatever the count (one pass per character position), Python ~2 µs per id, so
#: the few ids of a small micro-batch are cheaper this way (the crossing is near 30)
_HASH_IN_PYTHON_UP_TO = 24


def _fnv1a_64_bytes(data: bytes) -> int:
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _U64
    return h


def hash_strings(strings: Sequence[str]) -> np.ndarray:
    """64-bit FNV-1a of each string's UTF-8 bytes, every byte counted (trailing NULs too)."""
    if not len(strings):
        return np.zeros(0, dtype=np.uint64)
    if len(strings) <= _HASH_IN_PYTHON_UP_TO:  # the same hash, without numpy's per-call cost
        return np.array([_fnv1a_64_bytes(s.encode("utf-8")) for s in strings], dtype=np.uint64)
    encoded = [s.encode("utf-8") for s in strings]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    return _fnv1a_64(np.array(encoded, dtype=bytes), lengths)


def hash_names(
    rows: Sequence[Mapping[str, float]] | Sequence[Sequence[str]],
    n_features: int,
    values: Sequence[Sequence[float]] | None = None,
) -> SparseBatch:
    """Hash named features into ``n_features`` buckets (the hashing trick).

    ``rows`` is either a list of ``{name: value}`` mappings, or a list of token
    lists (each token counts 1, or ``values`` gives the weights). The bucket is
    FNV-1a(name) mod ``n_features`` and the sign is the hash's top bit, so
    collisions cancel in expectation.

    >>> b = hash_names([{"colour=red": 1.0, "size": 2.5}], n_features=16)
    >>> b.shape, round(float(abs(b.values).sum()), 1)
    ((1, 16), 3.5)
    """
    if n_features < 1:
        raise ConfigError(f"n_features must be a positive integer. Got {n_features}.")
    names: list[str] = []
    weights: list[float] = []
    lengths: list[int] = []
    if values is not None and len(values) != len(rows):
        raise ConfigError(f"hash_names expects one list of values per row: {len(rows)}. Got "
                          f"{len(values)}.")
    for i, row in enumerate(rows):
        if isinstance(row, Mapping):
            names.extend(row.keys())
            weights.extend(float(v) for v in row.values())
        else:
            names.extend(row)
            if values is not None and len(values[i]) != len(row):
                raise ConfigError(f"hash_names expects one value per name in row {i}: "
                                  f"{len(row)}. Got {len(values[i])}.")
            weights.extend(values[i] if values is not None else [1.0] * len(row))
        lengths.append(len(row))
    if not all(isinstance(name, str) for name in names):
        bad = next(name for name in names if not isinstance(name, str))
        raise ConfigError(f"Feature names must be strings. Got {bad!r:.40}.")
    h = hash_strings(names)
    bucket = (h % np.uint64(n_features)).astype(np.int64)
    sign = np.where((h >> np.uint64(63)) == 1, -1.0, 1.0)
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    # one entry per name, in the row's order (names sharing a bucket are summed by
    # SparseBatch.checked, which every learner applies)
    return SparseBatch(indptr, bucket, sign * np.asarray(weights, dtype=np.float64), n_features)
