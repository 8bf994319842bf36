"""User files as datasets: ``csv:PATH`` (dense) and ``libsvm:PATH`` (sparse).

Both map labels of any type to ``0..K-1`` in sorted order (numeric order when
every label is a number) and fail with a :class:`DataError` naming the file,
line and column on: a missing or empty file, ragged rows, a non-numeric or
non-finite value, fewer than 2 classes.

CSV options: ``label_column`` (header name or 0-based index, negative counts
from the end; default the last column), ``categorical`` (comma-separated
names/indices, one-hot encoded with categories in sorted order), ``header``
(``True``/``False``; default auto: the first row is a header when none of its
fields is a number while some field of the second row is — so an
all-categorical file with a header needs ``header=True``), ``delimiter``
(default ``,``) and ``standardise`` (default: True when there is a numeric
feature column).

libsvm options: ``n_features`` (default: largest index + 1). Indices are
1-based unless some index is 0; ``qid:N`` tokens and ``# comments`` are ignored.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from simulators.datasets.base import (
    Dataset,
    check_options,
    encode_labels,
    option_bool,
    option_int,
)
from streamlearn.errors import ConfigError, DataError
from streamlearn.features import SparseBatch

__all__ = ["load_csv", "load_libsvm"]


def _read_text(path: str, kind: str) -> str:
    file = Path(path).expanduser()
    if not file.is_file():
        raise DataError(f"{kind} file not found: {path} (looked for {file.resolve()}).")
    try:
        return file.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{kind} file {path} is not UTF-8 text ({exc.reason} at byte "
                        f"{exc.start}).") from exc
    except OSError as exc:
        raise DataError(f"Cannot read {kind} file {path}: {exc.strerror or exc}.") from exc


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _to_float(values: np.ndarray, lines: np.ndarray, where: str) -> np.ndarray:
    """Parse strings to finite floats; on failure name the first offending line and value."""
    try:
        numbers = np.char.strip(values).astype(np.float64)
    except ValueError:
        bad = next(i for i, v in enumerate(values.tolist()) if not _is_number(v))
        raise DataError(f"{where}line {lines[bad]}: expected a number. "
                        f"Got {str(values[bad])!r}.") from None
    not_finite = np.flatnonzero(~np.isfinite(numbers))
    if len(not_finite):
        bad = not_finite[0]
        raise DataError(f"{where}line {lines[bad]}: expected a finite number. "
                        f"Got {str(values[bad])!r}.")
    return numbers


def _column_index(ref: object, names: Sequence[str], header: bool, path: str) -> int:
    text = str(ref).strip()
    if header and text in names:
        return list(names).index(text)
    try:
        index = int(text)
    except ValueError:
        hint = f"; columns are {list(names)}" if header else " (the file has no header)"
        raise ConfigError(f"Expected a column name or 0-based index of {path}. "
                          f"Got {ref!r}{hint}.") from None
    if not -len(names) <= index < len(names):
        raise ConfigError(f"Expected a column index in [{-len(names)}, {len(names)}) for "
                          f"{path}. Got {index}.")
    return index % len(names)


def _read_csv_rows(text: str, path: str, delimiter: str) -> tuple[list[list[str]], list[int]]:
    reader = csv.reader(io.StringIO(text), delimiter=delimiter)
    rows, lines = [], []
    for row in reader:
        if row and any(field.strip() for field in row):
            rows.append(row)
            lines.append(reader.line_num)
    if not rows:
        raise DataError(f"csv file {path} is empty.")
    return rows, lines


def load_csv(path: str, **options: object) -> Dataset:
    """A dense dataset from a CSV file (see the module docstring for the options)."""
    name = f"csv:{path}"
    check_options(name, options, ["label_column", "categorical", "header", "delimiter",
                                  "standardise"])
    delimiter = str(options.get("delimiter", ","))
    rows, lines = _read_csv_rows(_read_text(path, "csv"), path, delimiter)
    width = len(rows[0])
    for row, line in zip(rows, lines, strict=True):
        if len(row) != width:
            raise DataError(f"{path}: line {line} has {len(row)} fields, expected {width}.")
    header_opt = options.get("header", "auto")
    if header_opt == "auto":
        header = not any(_is_number(f) for f in rows[0]) and (
            len(rows) == 1 or any(_is_number(f) for f in rows[1]))
    else:
        header = option_bool(name, "header", header_opt)
    names = [f.strip() for f in rows[0]] if header else [str(i) for i in range(width)]
    if header:
        rows, lines = rows[1:], lines[1:]
    if not rows:
        raise DataError(f"csv file {path} has a header but no data rows.")
    if width < 2:
        raise DataError(f"{path}: expected a label column and at least one feature column. "
                        f"Got {width} column.")
    label = _column_index(options.get("label_column", -1), names, header, path)
    cat_opt = options.get("categorical", "")
    refs = cat_opt.split(",") if isinstance(cat_opt, str) else (
        list(cat_opt) if isinstance(cat_opt, (list, tuple)) else [cat_opt])
    categorical = {_column_index(r, names, header, path) for r in refs if str(r).strip()}
    if label in categorical:
        raise ConfigError(f"Column {names[label]!r} of {path} cannot be both the label and "
                          f"categorical.")
    table = np.array(rows, dtype=str)
    line_numbers = np.array(lines)
    blocks = []
    for col in range(width):
        if col == label:
            continue
        if col in categorical:
            categories, codes = np.unique(np.char.strip(table[:, col]), return_inverse=True)
            blocks.append(np.eye(len(categories))[codes.reshape(-1)])
        else:
            where = f"{path}: column {names[col]!r}, "
            blocks.append(_to_float(table[:, col], line_numbers, where)[:, None])
    X = np.hstack(blocks)
    y, class_names = encode_labels(np.char.strip(table[:, label]),
                                   f"label column {names[label]!r} of {path}")
    has_numeric = width - 1 > len(categorical)
    standardise = option_bool(name, "standardise", options.get("standardise", has_numeric))
    return Dataset(
        name=name, X=X, y=y, n_classes=len(class_names), class_names=class_names,
        n_features=X.shape[1],
        description=f"CSV file {path}: {len(y):,} rows, label column {names[label]!r}, "
                    f"{X.shape[1]} features ({len(categorical)} categorical column(s) one-hot), "
                    f"{len(class_names)} classes.",
        standardise=standardise,
    )


def load_libsvm(path: str, **options: object) -> Dataset:
    """A sparse dataset from a libsvm / SVMlight file (``label idx:val ...`` per line)."""
    name = f"libsvm:{path}"
    check_options(name, options, ["n_features"])
    labels, tokens, token_lines, counts, label_lines = [], [], [], [], []
    for number, raw in enumerate(_read_text(path, "libsvm").splitlines(), start=1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        pairs = [t for t in fields[1:] if not t.startswith("qid:")]
        labels.append(fields[0])
        label_lines.append(number)
        tokens.extend(pairs)
        token_lines.extend([number] * len(pairs))
        counts.append(len(pairs))
    if not labels:
        raise DataError(f"libsvm file {path} is empty.")
    lines = np.array(token_lines, dtype=np.int64)
    parts = np.char.partition(np.array(tokens, dtype=str), ":") if tokens \
        else np.zeros((0, 3), dtype=str)
    no_colon = np.flatnonzero((parts[:, 1] != ":") | (parts[:, 0] == "") | (parts[:, 2] == ""))
    if len(no_colon):
        bad = no_colon[0]
        raise DataError(f"{path}: line {lines[bad]}: expected index:value. Got {tokens[bad]!r}.")
    index_float = _to_float(parts[:, 0], lines, f"{path}: feature index, ")
    bad_index = np.flatnonzero((index_float < 0) | (index_float != np.floor(index_float)))
    if len(bad_index):
        bad = bad_index[0]
        raise DataError(f"{path}: line {lines[bad]}: expected a non-negative integer feature "
                        f"index. Got {str(parts[bad, 0])!r}.")
    values = _to_float(parts[:, 2], lines, f"{path}: feature value, ")
    indices = index_float.astype(np.int64)
    if len(indices) and indices.min() > 0:
        indices -= 1  # 1-based (the libsvm convention) unless some index is 0
    needed = int(indices.max()) + 1 if len(indices) else 1
    n_features = option_int(name, "n_features", options.get("n_features", needed))
    if n_features < needed:
        raise ConfigError(f"The 'n_features' option of {name} must be at least {needed} "
                          f"(the largest feature index + 1). Got {n_features}.")
    label_values = np.array(labels, dtype=str)
    if _is_number(labels[0]):  # numeric labels: a stray non-number is a typo, say where
        _to_float(label_values, np.array(label_lines), f"{path}: label, ")
    y, class_names = encode_labels(label_values, f"the labels of {path}")
    indptr = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return Dataset(
        name=name, X=SparseBatch(indptr, indices, values, n_features), y=y,
        n_classes=len(class_names), class_names=class_names, n_features=n_features,
        description=f"libsvm file {path}: {len(y):,} rows, {n_features} features "
                    f"({len(values):,} stored values), {len(class_names)} classes.",
        standardise=False,
    )
