"""Feature rows stored by slot, for decisions that wait for feedback.

Dense rows live in one ``(capacity, d)`` matrix (one fancy-index gather per
batch); sparse rows are kept as per-slot index/value arrays and gathered into
one CSR batch. A gather that mixes both returns CSR.
"""

from __future__ import annotations

import numpy as np

from streamlearn.features import Batch, SparseBatch

__all__ = ["RowStore", "as_sparse"]


def as_sparse(X: Batch) -> SparseBatch:
    """Any batch as CSR (dense rows keep their non-zeros)."""
    if isinstance(X, SparseBatch):
        return X
    rows, cols = np.nonzero(X)
    indptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=X.shape[0]), out=indptr[1:])
    return SparseBatch(indptr, cols.astype(np.int64), X[rows, cols], X.shape[1])


def _csr(idx_rows: list[np.ndarray], val_rows: list[np.ndarray], n_features: int) -> SparseBatch:
    indptr = np.zeros(len(idx_rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in idx_rows], out=indptr[1:])
    if not idx_rows:
        return SparseBatch(indptr, np.zeros(0, np.int64), np.zeros(0), n_features)
    return SparseBatch(indptr, np.concatenate(idx_rows).astype(np.int64),
                       np.concatenate(val_rows).astype(np.float64), n_features)


class RowStore:
    """Feature rows by slot; see the module docstring."""

    def __init__(self, n_features: int) -> None:
        self.n_features = n_features
        self.capacity = 0
        self.dense: np.ndarray | None = None  # allocated when the first dense row arrives
        self.is_sparse = np.zeros(0, dtype=bool)
        self.sparse_idx: list[np.ndarray | None] = []
        self.sparse_val: list[np.ndarray | None] = []

    def grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        self.is_sparse = np.concatenate([self.is_sparse, np.zeros(extra, dtype=bool)])
        self.sparse_idx.extend([None] * extra)
        self.sparse_val.extend([None] * extra)
        if self.dense is not None:
            self.dense = np.concatenate([self.dense, np.zeros((extra, self.n_features))])
        self.capacity = capacity

    def put(self, slots: np.ndarray, X: Batch) -> None:
        if not isinstance(X, SparseBatch):
            if self.dense is None:
                self.dense = np.zeros((self.capacity, self.n_features))
            self.dense[slots] = X
            self.is_sparse[slots] = False
            return
        self.is_sparse[slots] = True
        ptr = X.indptr
        for j, slot in enumerate(slots.tolist()):
            self.sparse_idx[slot] = X.indices[ptr[j]:ptr[j + 1]]
            self.sparse_val[slot] = X.values[ptr[j]:ptr[j + 1]]

    def take(self, slots: np.ndarray) -> Batch:
        sparse = self.is_sparse[slots]
        if not sparse.any():
            if self.dense is None:
                return np.zeros((len(slots), self.n_features))
            return self.dense[slots]
        idx_rows: list[np.ndarray] = []
        val_rows: list[np.ndarray] = []
        for slot, is_sparse in zip(slots.tolist(), sparse.tolist(), strict=True):
            if is_sparse:
                idx_rows.append(self.sparse_idx[slot])
                val_rows.append(self.sparse_val[slot])
            else:
                assert self.dense is not None
                nz = np.flatnonzero(self.dense[slot])
                idx_rows.append(nz)
                val_rows.append(self.dense[slot, nz])
        return _csr(idx_rows, val_rows, self.n_features)

    def clear(self, slots: np.ndarray) -> None:
        for slot in slots[self.is_sparse[slots]].tolist():
            self.sparse_idx[slot] = self.sparse_val[slot] = None

    def export(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The rows of ``slots`` as plain arrays (dense block + CSR block + which is which).

        Dense rows that are mostly zeros are saved in CSR form too (a snapshot of
        many pending 0/1 rows would otherwise be mostly zeros).
        """
        sparse = self.is_sparse[slots]
        dense_slots = slots[~sparse]
        dense = (self.dense[dense_slots] if self.dense is not None
                 else np.zeros((len(dense_slots), self.n_features)))
        csr = as_sparse(self.take(slots[sparse])) if sparse.any() else _csr([], [], self.n_features)
        out = {"is_sparse": sparse, "indptr": csr.indptr, "indices": csr.indices,
               "values": csr.values}
        if dense.size and np.count_nonzero(dense) < 0.5 * dense.size:
            packed = as_sparse(dense)
            out.update({"dense_indptr": packed.indptr, "dense_indices": packed.indices,
                        "dense_values": packed.values, "dense": np.zeros((0, self.n_features))})
        else:
            out["dense"] = dense
        return out

    @staticmethod
    def imported(arrays: dict[str, np.ndarray], n_features: int) -> Batch:
        """The batch of rows saved by :meth:`export`, in the saved order."""
        sparse = arrays["is_sparse"].astype(bool)
        if "dense_indptr" in arrays:
            dense = SparseBatch(arrays["dense_indptr"], arrays["dense_indices"],
                                arrays["dense_values"], n_features).to_dense()
        else:
            dense = arrays["dense"].reshape(-1, n_features)
        if not sparse.any():
            return dense
        csr = SparseBatch(arrays["indptr"], arrays["indices"], arrays["values"], n_features)
        idx_rows: list[np.ndarray] = []
        val_rows: list[np.ndarray] = []
        d_pos = s_pos = 0
        for is_sparse in sparse.tolist():
            if is_sparse:
                lo, hi = csr.indptr[s_pos], csr.indptr[s_pos + 1]
                idx_rows.append(csr.indices[lo:hi])
                val_rows.append(csr.values[lo:hi])
                s_pos += 1
            else:
                nz = np.flatnonzero(dense[d_pos])
                idx_rows.append(nz)
                val_rows.append(dense[d_pos, nz])
                d_pos += 1
        return _csr(idx_rows, val_rows, n_features)
