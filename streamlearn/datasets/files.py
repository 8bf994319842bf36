"""User files as datasets: ``csv:PATH`` (dense) and ``libsvm:PATH`` (sparse).

Both map labels of any type to ``0..K-1`` in sorted order (numeric order when
every label is a number) and fail with a :class:`DataError` naming the file,
line and column on: a missing or empty file, ragged rows, a non-numeric or
non-finite value, fewer than 2 classes.

Both read ``.gz``, ``.bz2`` and ``.xz`` files (by suffix) as the built-in
datasets do.

CSV options: ``label_column`` (header name or 0-based index, negative counts
from the end; default the last column), ``categorical`` (comma-separated
names/indices, one-hot encoded with categories in sorted order), ``header``
(yes/no/auto, see :func:`has_header`), ``delimiter`` (one character, or
``tab``, ``comma``, ``semicolon``, ``space``, ``pipe``; default ``,``) and
``standardise`` (default: True when there is a numeric feature column) and
``missing`` (what a missing value does, see :data:`MISSING_VALUES`: ``error``,
the default, stops at it; ``skip`` drops its row; ``impute`` fills a feature with
its column's mean and drops a row whose label is missing). Lines that all end
with the delimiter (an empty last field) are an error that says so, and so is a
file read as one column because the delimiter given is not its own.

libsvm options: ``n_features`` (default: largest index + 1). Indices are
1-based unless some index is 0; ``qid:N`` tokens and ``# comments`` are ignored.
Each line must start with a label without ``,`` or ``:`` (a CSV file, or a
file with no label, is refused at its first line), and some line must hold an
``index:value`` pair.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import logging
import lzma
import os
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from streamlearn.datasets.base import (
    Dataset,
    check_options,
    encode_labels,
    option_bool,
    option_int,
)
from streamlearn.errors import ConfigError, DataError
from streamlearn.features import SparseBatch

__all__ = ["DELIMITER_NAMES", "MISSING_MODES", "MISSING_VALUES", "has_header", "load_csv",
           "load_libsvm"]

log = logging.getLogger(__name__)

#: Names accepted for the csv ``delimiter`` option besides a single character.
DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "space": " ",
                   "pipe": "|"}
#: Fields that are a missing value in a numeric feature column (case-insensitive); in the
#: label column only the empty field is (``NA`` may be a class there).
MISSING_VALUES = ("", "?", "na", "n/a", "nan")
#: What the csv ``missing`` option may say (``--missing``).
MISSING_MODES = ("error", "skip", "impute")

_OPENERS: dict[str, Callable[[Path], bytes]] = {
    ".gz": lambda f: gzip.decompress(f.read_bytes()),
    ".bz2": lambda f: bz2.decompress(f.read_bytes()),
    ".xz": lambda f: lzma.decompress(f.read_bytes()),
}


def _read_text(path: str, kind: str) -> str:
    file = Path(path).expanduser()
    if not file.is_file():
        try:
            looked = file.resolve()
        except (OSError, RuntimeError):  # a symbolic link loop
            raise DataError(f"{kind} file {path}: expected a readable file, got a symbolic link "
                            f"that never ends in one.") from None
        what = ("not a regular file" if os.path.lexists(file) else "not found")
        raise DataError(f"{kind} file {what}: {path} (looked for {looked}).")
    opener = _OPENERS.get(file.suffix.lower())
    try:
        data = opener(file) if opener is not None else file.read_bytes()
    except (EOFError, lzma.LZMAError, zlib.error, gzip.BadGzipFile) as exc:
        raise DataError(f"{kind} file {path} is not a valid {file.suffix} file: {exc}.") from exc
    except OSError as exc:
        # bz2 reports a bad stream as a plain OSError without errno
        if exc.errno is None:
            raise DataError(f"{kind} file {path} is not a valid {file.suffix} file: {exc}.") from exc
        raise DataError(f"Cannot read {kind} file {path}: {exc.strerror or exc}.") from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{kind} file {path} is not UTF-8 text ({exc.reason} at byte "
                        f"{exc.start}).") from exc


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _to_float(values: np.ndarray, lines: np.ndarray, where: str,
              missing_hint: bool = False) -> np.ndarray:
    """Parse strings to finite floats; on failure name the first offending line and value
    (and, with ``missing_hint``, the csv option for a missing one)."""
    try:
        numbers = np.char.strip(values).astype(np.float64)
    except ValueError:
        bad = next(i for i, v in enumerate(values.tolist()) if not _is_number(v))
        raise DataError(f"{where}line {lines[bad]}: expected a number. "
                        f"Got {str(values[bad])!r}{_hint(values[bad], missing_hint)}.") from None
    not_finite = np.flatnonzero(~np.isfinite(numbers))
    if len(not_finite):
        bad = not_finite[0]
        raise DataError(f"{where}line {lines[bad]}: expected a finite number. "
                        f"Got {str(values[bad])!r}{_hint(values[bad], missing_hint)}.")
    return numbers


def _hint(value: object, missing_hint: bool) -> str:
    if not missing_hint or str(value).strip().lower() not in MISSING_VALUES:
        return ""
    return (", a missing value (--missing skip drops its row, --missing impute fills the "
            "column's mean)")


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


def _check_columns(rows: list[list[str]], lines: list[int], path: str, delimiter: str) -> None:
    """A file read as one column: its delimiter is another one (or it has no features)."""
    if any(len(row) > 1 for row in rows):
        return
    sample = [row[0] for row in rows[:200]]
    found = [d for d in (",", ";", "\t", "|", " ")
             if d != delimiter and all(d in line for line in sample)]
    if found:
        shown = {"\t": "tab", " ": "space"}.get(found[0], found[0])
        raise DataError(f"{path}: every line is one field when split at {delimiter!r}, but the "
                        f"lines hold {found[0]!r}: expected --delimiter {shown!r} (option "
                        f"delimiter); got {delimiter!r}.")
    raise DataError(f"{path}: expected a label column and at least one feature column "
                    f"separated by {delimiter!r}. Got one column (line {lines[0]}: "
                    f"{rows[0][0][:60]!r}).")


def _delimiter(name: str, value: object) -> str:
    text = str(value)
    delimiter = DELIMITER_NAMES.get(text.lower(), text)
    if len(delimiter) != 1 or delimiter in "\"\r\n":
        raise ConfigError(f"The 'delimiter' option of dataset {name!r} must be one character or "
                          f"one of {sorted(DELIMITER_NAMES)}. Got {text!r} instead.")
    return delimiter


def has_header(rows: Sequence[Sequence[str]], label: object = -1) -> bool | None:
    """Whether the first row is a header, judged from the data; None when it cannot be told.

    The first row is a header when

    * some column holds numbers on every other row but not on the first (a
      name above numbers: ``x1,x2,label`` over ``0.5,1,3``), or
    * none of its fields is a number while some field of the second row is, or
    * ``label`` is a name found in it.

    Otherwise it is data — unless its label field occurs on no other row:
    then it would become a class of one row, which is far likelier a header
    with numeric names (``0,1,2,3`` over data whose label column holds no
    ``3``) or an all-text header, so the caller must say (None).
    """
    first, rest = rows[0], rows[1:]
    if isinstance(label, str) and label.strip() in (f.strip() for f in first) and not _is_int(label):
        return True
    if not rest:  # one line: a header when none of it is a number (then no data: an error)
        return not any(_is_number(f) for f in first)
    numeric_rest = [all(_is_number(r[c]) for r in rest) for c in range(len(first))]
    if any(numeric and not _is_number(f) for numeric, f in zip(numeric_rest, first, strict=True)):
        return True
    if not any(_is_number(f) for f in first) and any(_is_number(f) for f in rest[0]):
        return True
    try:
        column = int(str(label).strip()) % len(first)
    except ValueError:
        return None
    first_label = first[column].strip()
    if all(r[column].strip() != first_label for r in rest):
        return None
    return False


def _is_int(text: object) -> bool:
    try:
        int(str(text).strip())
    except ValueError:
        return False
    return True


def load_csv(path: str, **options: object) -> Dataset:
    """A dense dataset from a CSV file (see the module docstring for the options)."""
    name = f"csv:{path}"
    check_options(name, options, ["label_column", "categorical", "header", "delimiter",
                                  "standardise", "missing"])
    delimiter = _delimiter(name, options.get("delimiter", ","))
    missing = str(options.get("missing", "error")).strip().lower()
    if missing not in MISSING_MODES:
        raise ConfigError(f"The 'missing' option of dataset {name!r} must be one of "
                          f"{', '.join(MISSING_MODES)}. Got {options.get('missing')!r} instead.")
    rows, lines = _read_csv_rows(_read_text(path, "csv"), path, delimiter)
    _check_columns(rows, lines, path, delimiter)
    data_rows = rows[1:] if len(rows) > 1 else rows
    if len(rows[-1]) > 1 and all(len(r) > 1 and not r[-1].strip() for r in data_rows):
        raise DataError(f"{path}: every line ends with the delimiter {delimiter!r}, so the last "
                        f"column is empty; expected a value after the last {delimiter!r}. Remove "
                        f"the trailing delimiters.")
    width = len(rows[0])
    for row, line in zip(rows, lines, strict=True):
        if len(row) != width:
            raise DataError(f"{path}: line {line} has {len(row)} fields, expected {width}.")
    header_opt = options.get("header", "auto")
    label_opt = options.get("label_column", -1)
    if str(header_opt).strip().lower() == "auto":
        judged = has_header(rows, label_opt)
        if judged is None:
            try:
                field = repr(rows[0][int(str(label_opt)) % width].strip())
            except ValueError:  # a label column given by name, which line 1 does not hold
                field = f"(column {str(label_opt)!r}, not a name on line {lines[0]})"
            raise DataError(f"{path}: cannot tell whether line {lines[0]} is a header: its label "
                            f"field {field} occurs on no "
                            f"other line, so as data it would be a class of one row. Expected "
                            f"--header yes or --header no (option header); got auto.")
        header = judged
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
    label = _column_index(label_opt, names, header, path)
    cat_opt = options.get("categorical", "")
    refs = cat_opt.split(",") if isinstance(cat_opt, str) else (
        list(cat_opt) if isinstance(cat_opt, (list, tuple)) else [cat_opt])
    categorical = {_column_index(r, names, header, path) for r in refs if str(r).strip()}
    if label in categorical:
        raise ConfigError(f"Column {names[label]!r} of {path} cannot be both the label and "
                          f"categorical.")
    table = np.array(rows, dtype=str)
    line_numbers = np.array(lines)
    numeric = [c for c in range(width) if c != label and c not in categorical]
    table, line_numbers, absent = _missing_values(table, line_numbers, numeric, label, names,
                                                  path, missing)
    blocks = []
    for col in range(width):
        if col == label:
            continue
        if col in categorical:
            categories, codes = np.unique(np.char.strip(table[:, col]), return_inverse=True)
            blocks.append(np.eye(len(categories))[codes.reshape(-1)])
        else:
            where = f"{path}: column {names[col]!r}, "
            values = table[:, col] if absent is None else np.where(absent[:, col], "0",
                                                                     table[:, col])
            column = _to_float(values, line_numbers, where, missing_hint=True)
            if absent is not None and absent[:, col].any():
                column[absent[:, col]] = column[~absent[:, col]].mean()
            blocks.append(column[:, None])
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


def _missing_values(table: np.ndarray, lines: np.ndarray, numeric: list[int], label: int,
                    names: list[str], path: str, mode: str,
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(table, lines, absent): rows with a missing value dropped (``skip``; ``impute``: those
    whose label is missing), and with ``impute`` where the remaining numeric features are
    missing (None otherwise). ``error``: an empty label is refused here, a missing feature
    where it is parsed (naming the option)."""
    stripped = np.char.lower(np.char.strip(table))
    absent = np.zeros(table.shape, dtype=bool)
    if numeric:
        absent[:, numeric] = np.isin(stripped[:, numeric], MISSING_VALUES)
    no_label = stripped[:, label] == ""
    if mode == "error":
        if no_label.any():
            raise DataError(f"{path}: label column {names[label]!r}, line "
                            f"{lines[np.argmax(no_label)]}: expected a label. Got '' (a missing "
                            f"value: --missing skip or --missing impute drop its row).")
        return table, lines, None
    drop = no_label | (absent.any(axis=1) if mode == "skip" else False)
    if drop.all():
        raise DataError(f"{path}: every row has a missing value, so --missing {mode} leaves "
                        f"no data. Expected some complete rows.")
    if mode == "impute":
        empty = [names[c] for c in numeric if absent[~drop, c].all()]
        if empty:
            raise DataError(f"{path}: column {empty[0]!r} has no value to impute from (every "
                            f"value is missing). Expected at least one number.")
    if drop.any():
        log.warning("%s: %d row(s) with a missing %s dropped (--missing %s)", path,
                    int(drop.sum()), "value" if mode == "skip" else "label", mode)
    kept = ~drop
    return table[kept], lines[kept], absent[kept] if mode == "impute" else None


#: Largest libsvm feature dimension: 2²² columns are 32 MB per action of a dense weight row.
MAX_LIBSVM_FEATURES = 1 << 22


def load_libsvm(path: str, **options: object) -> Dataset:
    """A sparse dataset from a libsvm / SVMlight file (``label idx:val ...`` per line)."""
    name = f"libsvm:{path}"
    check_options(name, options, ["n_features"])
    labels, tokens, token_lines, counts, label_lines = [], [], [], [], []
    for number, raw in enumerate(_read_text(path, "libsvm").splitlines(), start=1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        if "," in fields[0] or ":" in fields[0]:
            raise DataError(f"{path}: line {number}: expected a libsvm line 'label index:value "
                            f"...' starting with a label. Got {raw.strip()[:60]!r} (a CSV file, "
                            f"a multi-label or a missing label are not supported).")
        pairs = [t for t in fields[1:] if not t.startswith("qid:")]
        labels.append(fields[0])
        label_lines.append(number)
        tokens.extend(pairs)
        token_lines.extend([number] * len(pairs))
        counts.append(len(pairs))
    if not labels:
        raise DataError(f"libsvm file {path} is empty.")
    if not tokens:
        raise DataError(f"{path}: expected libsvm lines 'label index:value ...'. Got "
                        f"{len(labels)} line(s) without any index:value pair, from line "
                        f"{label_lines[0]} on: {labels[0][:60]!r}.")
    lines = np.array(token_lines, dtype=np.int64)
    parts = np.char.partition(np.array(tokens, dtype=str), ":")
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
    if needed > MAX_LIBSVM_FEATURES:  # the learners keep dense (K, d) arrays
        bad = int(np.argmax(indices))
        raise DataError(f"{path}: line {lines[bad]}: expected feature indices below "
                        f"{MAX_LIBSVM_FEATURES:,} (the learners hold dense arrays of K x d "
                        f"weights; hash larger spaces into fewer columns). Got "
                        f"{str(parts[bad, 0])!r}.")
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
