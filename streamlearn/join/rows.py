"""Feature rows stored by slot, for decisions that wait for feedback.

Dense rows live in one ``(slots, d)`` matrix over the first slots (at most
``DENSE_MAX_BYTES``, or ``FULL_ROWS_MAX_BYTES`` for rows with at least half their
entries nonzero); sparse rows, and dense rows put in slots beyond that
matrix, live in one append-only *arena* of indices and values, each slot
pointing at its ``(start, length)``. Putting and taking a batch are a handful of numpy calls
whatever its size (segment gathers, no per-row Python); the arena is compacted
when the dead entries outnumber the live ones. A gather that mixes dense and
sparse rows returns CSR.

>>> store = RowStore(n_features=4)
>>> store.grow(8)
>>> store.put(np.array([3, 5]), SparseBatch.from_rows([[0, 2], [1]], [[1.0, 2.0], [3.0]], 4))
>>> store.put(np.array([1]), np.array([[0.0, 5.0, 0.0, 6.0]]))
>>> store.take(np.array([5, 1, 3])).to_dense().tolist()
[[0.0, 3.0, 0.0, 0.0], [0.0, 5.0, 0.0, 6.0], [1.0, 0.0, 2.0, 0.0]]
"""

from __future__ import annotations

import numpy as np

from streamlearn.features import Batch, SparseBatch, as_sparse, concat_rows

__all__ = ["RowStore", "segment_gather"]

# The dense matrix covers the first slots only, up to this many bytes; dense rows put in
# slots beyond it (a large backlog of pending decisions) go to the sparse arena, which holds
# a mostly-zero row in a fraction of the memory. The matrix is allocated at its full size
# when the first dense row arrives and never copied: the allocation is address space only,
# and the operating system backs each page when a row is first written there, so a store
# that never holds more than a few rows costs a few pages. (Growing it by doubling copied
# every row and touched every page twice; with NumPy's hugepage advice, which `serve` turns
# off (settings.without_hugepage_advice), a first touch cost up to ~9 ms per MB on the
# development machine, and growing to 32 MB cost 0.2-0.4 s on the hot path.)
DENSE_MAX_BYTES = 32 << 20

# A dense row with at least half its entries nonzero takes more memory in the arena (an
# index and a value per entry, 16 bytes) than in the matrix (8 bytes per feature): for such
# rows the matrix reaches this far (address space again: only the rows written are backed;
# 80,000 pending rows of 400 features). Under a backlog of 30,000 such rows the arena's puts
# and compactions held 19 % of py-spy's samples of the daemon's step; a store alone took
# 5.4 µs per row put, 0.64 µs with the rows in the matrix (docs/performance.md, 2026-12-05).
FULL_ROWS_MAX_BYTES = 256 << 20


def segment_gather(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, positions): the CSR row pointer and source positions of the segments, in order."""
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    positions = np.arange(int(indptr[-1]), dtype=np.int64) - np.repeat(indptr[:-1] - starts,
                                                                       lengths)
    return indptr, positions


class RowStore:
    """Feature rows by slot; see the module docstring."""

    def __init__(self, n_features: int) -> None:
        self.n_features = n_features
        self.capacity = 0
        self.dense: np.ndarray | None = None  # allocated when the first dense row arrives
        self.is_sparse = np.zeros(0, dtype=bool)
        self.start = np.zeros(0, dtype=np.int64)  # sparse slots: first arena entry
        self.length = np.zeros(0, dtype=np.int64)  # sparse slots: entries (0 when free)
        self.arena_idx = np.zeros(1024, dtype=np.int64)
        self.arena_val = np.zeros(1024)
        self.used = 0  # arena entries written (live + dead)

    @property
    def dense_limit(self) -> int:
        """Rows of the dense matrix (see ``DENSE_MAX_BYTES``)."""
        return max(1024, DENSE_MAX_BYTES // (8 * self.n_features))

    @property
    def full_rows_limit(self) -> int:
        """Rows of the dense matrix for rows mostly nonzero (see ``FULL_ROWS_MAX_BYTES``)."""
        return max(self.dense_limit, FULL_ROWS_MAX_BYTES // (8 * self.n_features))

    @property
    def dense_rows(self) -> int:
        """Slots below this hold a dense row in the matrix, whatever its zeros."""
        return min(self.capacity, self.dense_limit)

    def _in_matrix(self, slots: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Which rows of the dense batch ``X`` go to the matrix (the others to the arena)."""
        inside = slots < self.dense_rows
        if inside.all():
            return inside
        full = slots < min(self.capacity, self.full_rows_limit)
        if full.any():
            full &= 2 * np.count_nonzero(X, axis=1) >= self.n_features
        return inside | full

    def grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        self.is_sparse = np.concatenate([self.is_sparse, np.zeros(extra, dtype=bool)])
        self.start = np.concatenate([self.start, np.zeros(extra, dtype=np.int64)])
        self.length = np.concatenate([self.length, np.zeros(extra, dtype=np.int64)])
        self.capacity = capacity

    def put(self, slots: np.ndarray, X: Batch) -> None:
        if not isinstance(X, SparseBatch):
            X = np.asarray(X)
            in_matrix = self._in_matrix(slots, X)
            if not in_matrix.all():  # rows past the matrix (or mostly zero past its first part)
                inside = np.flatnonzero(in_matrix)
                if len(inside):
                    self.put(slots[inside], X[inside])
                X, slots = as_sparse(X[~in_matrix]), slots[~in_matrix]
            else:
                if self.dense is None:  # free rows are never read; see DENSE_MAX_BYTES
                    self.dense = np.empty((self.full_rows_limit, self.n_features))
                self.dense[slots] = X
                self.is_sparse[slots] = False
                self.length[slots] = 0
                return
        nnz = len(X.indices)
        if self.used + nnz > len(self.arena_idx):
            self._compact(extra=nnz)
        self.arena_idx[self.used:self.used + nnz] = X.indices
        self.arena_val[self.used:self.used + nnz] = X.values
        self.is_sparse[slots] = True
        self.start[slots] = self.used + X.indptr[:-1]
        self.length[slots] = np.diff(X.indptr)
        self.used += nnz

    def _compact(self, extra: int) -> None:
        """Move the live entries to the front; grow the arena so ``extra`` more fit."""
        live = np.flatnonzero(self.length)
        indptr, positions = segment_gather(self.start[live], self.length[live])
        size = max(len(self.arena_idx), 2 * (int(indptr[-1]) + extra))
        idx, val = np.zeros(size, dtype=np.int64), np.zeros(size)
        idx[:len(positions)] = self.arena_idx[positions]
        val[:len(positions)] = self.arena_val[positions]
        self.arena_idx, self.arena_val = idx, val
        self.start[live] = indptr[:-1]
        self.used = int(indptr[-1])

    def _sparse_take(self, slots: np.ndarray) -> SparseBatch:
        indptr, positions = segment_gather(self.start[slots], self.length[slots])
        return SparseBatch(indptr, self.arena_idx[positions], self.arena_val[positions],
                           self.n_features)

    def take(self, slots: np.ndarray) -> Batch:
        sparse = self.is_sparse[slots]
        if not sparse.any():
            if self.dense is None:
                return np.zeros((len(slots), self.n_features))
            return np.asarray(self.dense[slots])
        if sparse.all():
            return self._sparse_take(slots)
        assert self.dense is not None
        # mixed: CSR of the dense rows, then of the sparse ones, put back in the asked order
        dense_at, sparse_at = np.flatnonzero(~sparse), np.flatnonzero(sparse)
        both = concat_rows([as_sparse(self.dense[slots[dense_at]]),
                            self._sparse_take(slots[sparse_at])], self.n_features)
        order = np.empty(len(slots), dtype=np.int64)
        order[np.concatenate([dense_at, sparse_at])] = np.arange(len(slots))
        assert isinstance(both, SparseBatch)
        return both.take(order)

    def clear(self, slots: np.ndarray) -> None:
        self.length[slots] = 0  # their arena entries are dead; compaction reclaims them

    def export(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The rows of ``slots`` as plain arrays (dense block + CSR block + which is which),
        fresh copies of the live ones; :meth:`packed` makes them smaller for a snapshot.

        The least work that copies the rows: the serving thread calls this while deciding
        waits, so what makes a snapshot smaller is left to :meth:`packed`, which a
        background snapshot runs on its writer thread. Each numpy call of more than a few
        hundred elements lets another Python thread take the interpreter's lock, and under
        a backlog kafka-python's network thread takes it for up to the 5 ms switch interval:
        the packing's eight calls held a 10,000-row checkpoint's serving thread 50-150 ms
        (docs/performance.md, 2026-12-06).
        """
        sparse = self.is_sparse[slots]
        dense_slots = slots[~sparse]
        dense = (self.dense[dense_slots] if self.dense is not None
                 else np.zeros((len(dense_slots), self.n_features)))
        csr = self._sparse_take(slots[sparse])
        return {"is_sparse": sparse, "indptr": csr.indptr, "indices": csr.indices,
                "values": csr.values, "dense": dense}

    @staticmethod
    def packed(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """:meth:`export`'s arrays with a dense block that is mostly zeros in CSR form (a
        snapshot of many pending 0/1 rows would otherwise be mostly zeros); already packed
        arrays are returned as they are."""
        dense = arrays["dense"]
        if "dense_indptr" in arrays or not dense.size or np.count_nonzero(dense) >= 0.5 * dense.size:
            return arrays
        packed = as_sparse(dense)
        return {**arrays, "dense_indptr": packed.indptr, "dense_indices": packed.indices,
                "dense_values": packed.values, "dense": np.zeros((0, dense.shape[1]))}

    @staticmethod
    def imported(arrays: dict[str, np.ndarray], n_features: int) -> Batch:
        """The batch of rows saved by :meth:`export`, in the saved order."""
        sparse = arrays["is_sparse"].astype(bool)
        if "dense_indptr" in arrays:
            dense: Batch = SparseBatch(arrays["dense_indptr"], arrays["dense_indices"],
                                       arrays["dense_values"], n_features)
        else:
            dense = arrays["dense"].reshape(-1, n_features)
        if not sparse.any():
            return dense.to_dense() if isinstance(dense, SparseBatch) else dense
        csr = SparseBatch(arrays["indptr"], arrays["indices"], arrays["values"], n_features)
        both = concat_rows([as_sparse(dense), csr], n_features)
        assert isinstance(both, SparseBatch)
        dense_at, sparse_at = np.flatnonzero(~sparse), np.flatnonzero(sparse)
        if not sparse[:len(dense_at)].any():  # the dense rows first, as an export in slot
            return both                       # order has them: nothing to reorder
        order = np.empty(len(sparse), dtype=np.int64)
        order[np.concatenate([dense_at, sparse_at])] = np.arange(len(sparse))
        return both.take(order)
