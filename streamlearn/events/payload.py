"""The ``x`` payload of instances: classify, convert a whole batch at once, explain rejections.

Forms: a dense list of ``d`` numbers; ``{"idx": [int], "val": [float]}``
(sparse; the only object with exactly these two keys); any other object is
named features ``{"name": value}`` hashed into ``d`` buckets. Numbers are
converted the way numpy converts them (booleans count as 0/1).

The hot path (:func:`feature_batch`) converts every row of a micro-batch in a
few numpy calls and flags the rows that are not numeric, not finite, or out of
range (:class:`~streamlearn.events.raw.DecodeLimits`). Only the rejected rows
go through :func:`explain`, which names the first offending entry.
"""

from __future__ import annotations

import struct
from itertools import chain
from typing import Any

import numpy as np

from streamlearn.events.raw import DecodeLimits, Reject, shown
from streamlearn.features import Batch, SparseBatch, hash_names

__all__ = ["DenseRows", "classify", "dense_feature_batch", "explain", "feature_batch",
           "sparse_feature_batch"]


def classify(x: object, n_features: int, event_id: str) -> tuple[str, Any]:
    """The form of ``x`` and its payload, checking the cheap structural rules."""
    if isinstance(x, list):
        if len(x) != n_features:
            raise Reject("wrong_dimension", f"expected {n_features} features in the dense 'x', "
                                            f"got {len(x)}", event_id)
        return "dense", x
    if isinstance(x, dict):
        if x.keys() == {"idx", "val"}:
            idx, val = x["idx"], x["val"]
            if not (isinstance(idx, list) and isinstance(val, list) and len(idx) == len(val)):
                got = (f"{len(idx)} and {len(val)} entries" if isinstance(idx, list)
                       and isinstance(val, list) else f"{type(idx).__name__} and {type(val).__name__}")
                raise Reject("bad_features", f"expected 'idx' and 'val' lists of equal length, "
                                             f"got {got}", event_id)
            return "sparse", (idx, val)
        return "named", x
    got = "nothing" if x is None else type(x).__name__
    raise Reject("bad_features", f"expected 'x' as a list, an idx/val object or a name→value "
                                 f"object, got {got}", event_id)


def _row_flags(values: np.ndarray, row_of: np.ndarray, n_rows: int,
               limits: DecodeLimits) -> np.ndarray:
    """Per row: every value finite, within ±max_abs_feature, squared norm within the limit."""
    with np.errstate(over="ignore", invalid="ignore"):
        bad = ~(np.abs(values) <= limits.max_abs_feature)  # NaN and inf are out of range too
        sq = np.bincount(row_of, weights=np.where(bad, 0.0, values) ** 2, minlength=n_rows)
    return np.asarray((np.bincount(row_of, weights=bad, minlength=n_rows) == 0)
                      & (sq <= limits.max_row_squared_norm))


def _combined_flags(row_of: np.ndarray, idx: np.ndarray, val: np.ndarray, ok: np.ndarray,
                    n_features: int, limits: DecodeLimits) -> np.ndarray:
    """``ok`` narrowed to the rows whose features *as the learner sees them* are within the
    limits: entries of one row at the same index (repeated sparse indices, named features
    hashed into one bucket) add up, so ``x.val`` entries of 10¹² each, all at index 0, are one
    feature far beyond ±max_abs_feature even though every entry passes :func:`_row_flags`.

    Only a row whose absolute sum could exceed a limit is combined (a sort over its
    entries): a feature and the squared norm of the combined row are at most that sum and
    its square. Rows not ``ok`` are left as they are.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        l1 = np.bincount(row_of, weights=np.abs(val), minlength=len(ok))
        suspect = ok & ~((l1 <= limits.max_abs_feature) & (l1 * l1 <= limits.max_row_squared_norm))
        if not suspect.any():
            return ok
        entries = suspect[row_of]
        key = row_of[entries].astype(np.int64) * n_features + idx[entries].astype(np.int64)
        features, at = np.unique(key, return_inverse=True)
        summed = np.bincount(at, weights=val[entries])
        row = features // n_features
        within = np.abs(summed) <= limits.max_abs_feature
        n_beyond = np.bincount(row, weights=~within, minlength=len(ok))
        sq = np.bincount(row, weights=np.where(within, summed, 0.0) ** 2, minlength=len(ok))
    out = ok.copy()
    out[suspect] = ((n_beyond == 0) & (sq <= limits.max_row_squared_norm))[suspect]
    return out


def _dense_flags(dense: np.ndarray, limits: DecodeLimits) -> np.ndarray:
    """:func:`_row_flags` for a dense (n, d) block."""
    bound = limits.max_abs_feature
    # the usual case first: the whole block within the bound (two flat reductions cost a
    # quarter of two per row; a NaN or an infinity anywhere fails it, as NaN compares false).
    # Its squares cannot overflow then (bound <= 1e100), so no errstate (~5 µs a call)
    if dense.size and bound <= 1e100 and dense.max() <= bound and dense.min() >= -bound:
        return np.asarray(np.einsum("ij,ij->i", dense, dense) <= limits.max_row_squared_norm)
    with np.errstate(over="ignore", invalid="ignore"):
        sq = np.einsum("ij,ij->i", dense, dense)
        # two reductions instead of |dense| (a temporary as large as the batch, in fresh pages:
        # 2.4 µs per 400-feature row); a NaN makes its row's max and min NaN, so it fails too
        within = (dense.max(axis=1, initial=-np.inf) <= bound) & (dense.min(axis=1, initial=np.inf) >= -bound)
    return np.asarray(within & (sq <= limits.max_row_squared_norm))


def _as_float_rows(rows: list[Any], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Convert equal-length rows in one shot (fall back per row to find non-numeric ones).

    Returns the (n, width) array and a per-row flag: every entry a number.
    """
    try:
        out = np.array(rows, dtype=np.float64)
        if out.shape == (len(rows), width):
            return out, np.ones(len(rows), dtype=bool)
    except (ValueError, TypeError, OverflowError):
        pass
    numeric = np.ones(len(rows), dtype=bool)
    out = np.zeros((len(rows), width))
    for i, row in enumerate(rows):  # cold: only when a batch holds a non-numeric row
        try:
            out[i] = np.array(row, dtype=np.float64)
        except (ValueError, TypeError, OverflowError):
            numeric[i] = False
    return out, numeric


class DenseRows:
    """Dense ``x`` lists converted into one float64 block the moment each is parsed.

    A parsed 400-number list is ~13 KB of Python objects; converted at once and dropped,
    the next message's parse reuses the same warm memory, where converting a whole chunk's
    lists at the end walks objects that have left the caches and keeps them alive for the
    collector to scan (docs/performance.md, "Dense instances converted as they are parsed").
    Row ``i`` converts exactly as ``np.array(row, dtype=np.float64)`` would (booleans 0/1,
    numeric strings parsed, ``None`` as NaN); a row that does not convert is zero and
    flagged not numeric. The lists are not kept: to explain a refused row, read it again
    from its message (the cold path).

    >>> rows = DenseRows(capacity=2, width=2)
    >>> rows.add([1, 2.5]), rows.add(["a", 1])
    (0, 1)
    >>> rows.block.tolist(), rows.numeric.tolist()
    ([[1.0, 2.5], [0.0, 0.0]], [True, False])
    """

    def __init__(self, capacity: int, width: int) -> None:
        self.block = np.empty((capacity, width))
        self.numeric = np.ones(capacity, dtype=bool)
        self.n = 0
        # Packing a list's floats with ``struct`` straight into the block's memory is ~2.5×
        # faster than numpy's assignment from a list (a 400-number row: 2.5 against 6.3 µs);
        # it takes exactly the numbers (floats, ints, booleans) and converts them as numpy
        # does. Anything else (a numeric string, null, a nested list) raises and the row
        # takes numpy's assignment, whose conversions and refusals it keeps.
        self._packed_row = struct.Struct(f"={width}d")
        # (numpy's empty block has no byte view: an empty one, which only an empty row fits)
        self._memory = self.block.data.cast("B") if self.block.size else memoryview(bytearray())

    def add(self, row: list[Any]) -> int:
        """Convert ``row`` (a list of ``width`` entries) into the next row; its row number."""
        i = self.n
        if len(row) != self.block.shape[1]:  # assignment would broadcast a shorter list
            raise ValueError(f"expected a dense row of {self.block.shape[1]} entries, got {len(row)}")
        try:
            self._packed_row.pack_into(self._memory, i * self._packed_row.size, *row)
        except (struct.error, TypeError, OverflowError):
            self._assign(i, row)
        self.n = i + 1
        return i

    def _assign(self, i: int, row: list[Any]) -> None:
        """Row ``i`` converted by numpy (numeric strings parsed, null as NaN), or zero and
        flagged not numeric."""
        try:
            self.block[i] = row
        except (ValueError, TypeError, OverflowError):  # cold: a non-numeric entry
            self.block[i] = 0.0
            self.numeric[i] = False

    def take(self, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(values, numeric flags) of ``rows``: a view when they are consecutive rows, in order."""
        if rows and rows == list(range(rows[0], rows[0] + len(rows))):
            return self.block[rows[0]:rows[0] + len(rows)], self.numeric[rows[0]:rows[0] + len(rows)]
        at = np.asarray(rows, dtype=np.int64)
        return self.block[at], self.numeric[at]


def _flat_floats(values: list[Any], lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Flat entries of several rows → (float64 entries, per-row flag: every entry a number)."""
    n_rows = len(lengths)
    try:
        flat = np.array(values, dtype=np.float64)
        if flat.ndim == 1:  # a nested list ([1] for 1) is no number
            return flat, np.ones(n_rows, dtype=bool)
    except (ValueError, TypeError, OverflowError):
        pass
    flat = np.zeros(sum(lengths))
    numeric = np.ones(n_rows, dtype=bool)
    pos = 0
    for r, length in enumerate(lengths):  # cold: only when a batch holds a non-numeric entry
        try:
            row = np.array(values[pos:pos + length], dtype=np.float64)
            numeric[r] = row.ndim == 1
            if numeric[r]:
                flat[pos:pos + length] = row
        except (ValueError, TypeError, OverflowError):
            numeric[r] = False
        pos += length
    return flat, numeric


def dense_feature_batch(rows: list[Any], n_features: int,
                        limits: DecodeLimits) -> tuple[np.ndarray, np.ndarray]:
    """:func:`feature_batch` of rows that are all dense lists of ``n_features`` entries."""
    dense, numeric = _as_float_rows(rows, n_features)
    ok = numeric & _dense_flags(dense, limits)
    return ok, dense if ok.all() else dense[ok]


def _converted_dense_batch(dense_rows: DenseRows, rows: list[int],
                           limits: DecodeLimits) -> tuple[np.ndarray, np.ndarray]:
    """:func:`dense_feature_batch` of rows already in ``dense_rows``."""
    dense, numeric = dense_rows.take(rows)
    ok = numeric & _dense_flags(dense, limits)
    return ok, dense if ok.all() else dense[ok]


def _sparse_entries(payloads: list[Any], n_features: int, limits: DecodeLimits
                    ) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
    """(entries per row, flat indices as floats, flat values, per-row ok flag) of
    ``(idx, val)`` payloads: a row is ok when every index is an integer in [0, n_features)
    and every value a number that passes :func:`_row_flags`."""
    lengths = [len(idx) for idx, _ in payloads]
    row_of = np.repeat(np.arange(len(payloads)), lengths)
    idx, idx_ok = _flat_floats(list(chain.from_iterable(p[0] for p in payloads)), lengths)
    val, val_ok = _flat_floats(list(chain.from_iterable(p[1] for p in payloads)), lengths)
    in_range = (idx >= 0) & (idx < n_features) & (idx == np.floor(idx))
    idx_ok &= np.bincount(row_of, weights=~in_range, minlength=len(payloads)) == 0
    ok = idx_ok & val_ok & _row_flags(val, row_of, len(payloads), limits)
    return lengths, idx, val, _combined_flags(row_of, idx, val, ok, n_features, limits)


def sparse_feature_batch(payloads: list[Any], n_features: int,
                         limits: DecodeLimits) -> tuple[np.ndarray, SparseBatch]:
    """:func:`feature_batch` of rows that are all ``(idx, val)`` lists: the accepted rows'
    entries are taken in one step (no Python step per row)."""
    lengths, idx, val, ok = _sparse_entries(payloads, n_features, limits)
    counts = np.asarray(lengths, dtype=np.int64)
    indptr = np.zeros(int(ok.sum()) + 1, dtype=np.int64)
    np.cumsum(counts[ok], out=indptr[1:])
    # checked: a row's repeated indices summed once here (the join keeps the rows so)
    if ok.all():
        return ok, SparseBatch(indptr, idx.astype(np.int64), val, n_features).checked()
    entries = np.repeat(ok, counts)
    return ok, SparseBatch(indptr, idx[entries].astype(np.int64), val[entries],
                           n_features).checked()


def feature_batch(forms: list[tuple[str, Any]], n_features: int, limits: DecodeLimits,
                  dense_rows: DenseRows | None = None) -> tuple[np.ndarray, Batch]:
    """Build the feature batch of ``(form, payload)`` rows; return (row ok flags, batch of ok rows).

    With ``dense_rows``, a dense row's payload is its row number there (already converted);
    without, the list of its entries.
    """
    n = len(forms)
    kinds = {form for form, _ in forms}
    if kinds <= {"dense"} and dense_rows is not None:  # an empty batch too
        return _converted_dense_batch(dense_rows, [p for _, p in forms], limits)
    if kinds <= {"dense"}:
        return dense_feature_batch([p for _, p in forms], n_features, limits)
    if kinds == {"sparse"}:
        return sparse_feature_batch([p for _, p in forms], n_features, limits)
    ok = np.ones(n, dtype=bool)
    idx_rows: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    val_rows: list[np.ndarray] = [np.zeros(0)] * n
    for form in ("dense", "sparse", "named"):
        members = [i for i, (f, _) in enumerate(forms) if f == form]
        if not members:
            continue
        if form == "dense":
            if dense_rows is not None:
                dense, good = dense_rows.take([forms[i][1] for i in members])
            else:
                dense, good = _as_float_rows([forms[i][1] for i in members], n_features)
            good = good & _dense_flags(dense, limits)  # good may be a view of dense_rows
            for j, i in enumerate(members):
                nz = np.flatnonzero(dense[j])
                idx_rows[i], val_rows[i], ok[i] = nz, dense[j, nz], bool(good[j])
            continue
        if form == "sparse":
            lengths, idx, val, good = _sparse_entries([forms[i][1] for i in members], n_features,
                                                      limits)
        else:
            lengths = [len(forms[i][1]) for i in members]
            row_of = np.repeat(np.arange(len(members)), lengths)
            names = [list(forms[i][1].keys()) for i in members]
            val, good = _flat_floats([v for i in members for v in forms[i][1].values()], lengths)
            good &= _row_flags(val, row_of, len(members), limits)
            hashed = hash_names(names, n_features,
                                values=np.split(np.where(np.isfinite(val), val, 0.0),
                                                np.cumsum(lengths)[:-1]))  # type: ignore[arg-type]
            idx = hashed.indices.astype(np.float64)
            val = hashed.values
            good = _combined_flags(row_of, idx, val, good, n_features, limits)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        for j, i in enumerate(members):
            ok[i] = bool(good[j])
            if ok[i]:  # a refused row's indices may be NaN or infinite: never cast to int
                idx_rows[i] = idx[starts[j]:starts[j + 1]].astype(np.int64)
                val_rows[i] = val[starts[j]:starts[j + 1]]
    keep = np.flatnonzero(ok)
    indptr = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum([len(idx_rows[i]) for i in keep], out=indptr[1:])
    if len(keep) == 0:
        return ok, SparseBatch(indptr, np.zeros(0, np.int64), np.zeros(0), n_features)
    indices = np.concatenate([idx_rows[i] for i in keep]).astype(np.int64)
    values = np.concatenate([val_rows[i] for i in keep]).astype(np.float64)
    return ok, SparseBatch(indptr, indices, values, n_features).checked()  # names summed


def _entries(form: str, payload: Any) -> list[tuple[str, object]]:
    """(where, value) of every feature value of a rejected row, for the detail text."""
    if form == "dense":
        return [(f"x[{i}]", v) for i, v in enumerate(payload)]
    if form == "sparse":
        return [(f"x.val[{j}] (feature {shown(i, 20)})", v) for j, (i, v) in
                enumerate(zip(payload[0], payload[1], strict=True))]
    return [(f"x[{shown(name, 40)}]", v) for name, v in payload.items()]


def explain(form: str, payload: Any, n_features: int, limits: DecodeLimits) -> tuple[str, str]:
    """``(reason, detail)`` for a row :func:`feature_batch` refused (cold path)."""
    if form == "sparse":
        for j, i in enumerate(payload[0]):
            if not (isinstance(i, (int, float)) and not isinstance(i, bool)):
                return "bad_features", f"x.idx[{j}] is not a number: {shown(i, 40)}"
            if i != int(i):
                return "bad_features", f"x.idx[{j}] = {shown(i)} is not an integer index"
            if not 0 <= i < n_features:
                return ("wrong_dimension", f"x.idx[{j}] = {int(i)} is outside the "
                                           f"{n_features} features [0, {n_features})")
    square_sum = 0.0
    for where, v in _entries(form, payload):
        try:
            value = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            return "bad_features", f"{where} is not a number: {shown(v, 40)}"
        if not np.isfinite(value):
            return "non_finite", f"{where} is {shown(v, 40)}: expected a finite number"
        if abs(value) > limits.max_abs_feature:
            return ("value_out_of_range", f"{where} = {value:.6g} is beyond ±"
                                          f"{limits.max_abs_feature:.6g} (limits.max_abs_feature)")
        square_sum += value * value
    if square_sum > limits.max_row_squared_norm:
        return ("value_out_of_range", f"the squared norm of x, {square_sum:.6g}, exceeds "
                                      f"{limits.max_row_squared_norm:.6g} (limits.max_row_squared_norm)")
    return _explain_combined(form, payload, n_features, limits)


def _explain_combined(form: str, payload: Any, n_features: int,
                      limits: DecodeLimits) -> tuple[str, str]:
    """Every entry is within the limits, their sum at one feature is not (see
    :func:`_combined_flags`): name that feature, or the combined squared norm."""
    if form == "sparse":
        buckets, values, place = [int(i) for i in payload[0]], [float(v) for v in payload[1]], \
            "feature {}"
    else:  # named: the buckets they hash into, signs included
        hashed = hash_names([payload], n_features)
        buckets, values = hashed.indices.tolist(), hashed.values.tolist()
        place = "bucket {} (names hashed into it)"
    summed: dict[int, float] = {}
    count: dict[int, int] = {}
    for b, v in zip(buckets, values, strict=True):
        summed[b] = summed.get(b, 0.0) + v
        count[b] = count.get(b, 0) + 1
    for b in buckets:
        if abs(summed[b]) > limits.max_abs_feature:
            return ("value_out_of_range", f"x's {count[b]} entries at {place.format(b)} add up to "
                                          f"{summed[b]:.6g}, beyond ±{limits.max_abs_feature:.6g} "
                                          f"(limits.max_abs_feature)")
    square_sum = sum(v * v for v in summed.values())
    return ("value_out_of_range", f"the squared norm of x with its repeated features added up, "
                                  f"{square_sum:.6g}, exceeds {limits.max_row_squared_norm:.6g} "
                                  f"(limits.max_row_squared_norm)")
