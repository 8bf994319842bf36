"""UCI Machine Learning Repository datasets: letter, pendigits, optdigits, nursery.

Files, checksums and licence (CC BY 4.0) come from each folder's
PROVENANCE.txt in the shared data directory; rows keep the files' order, so the
conventional test split (where there is one) is a suffix starting at
``Dataset.test_start``.

Standardisation: the dense numeric sets get ``standardise=True``. letter's 16
columns are different geometric statistics; pendigits (pen coordinates 0–100)
and optdigits (pixel counts 0–16) share one unit, but the linear bandit
learners need centred features: z-scoring measurably lowers their online error
on both (docs/results.md; e.g. Perceptron on pendigits 0.170 → 0.112).
Constant columns stay 0 when standardised. nursery (one-hot) keeps False.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamlearn.datasets.base import Dataset, DatasetFiles, RemoteFile, read_payloads
from streamlearn.errors import DataError

__all__ = [
    "LETTER",
    "NURSERY",
    "NURSERY_ATTRIBUTES",
    "OPTDIGITS",
    "PENDIGITS",
    "load_letter",
    "load_nursery",
    "load_optdigits",
    "load_pendigits",
    "split_fields",
]

UCI_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases"

LETTER = DatasetFiles("letter", (
    RemoteFile("letter/letter-recognition.data",
               f"{UCI_URL}/letter-recognition/letter-recognition.data",
               "2b89f3602cf768d3c8355267d2f13f2417809e101fc2b5ceee10db19a60de6e2", 712565),
))
PENDIGITS = DatasetFiles("pendigits", (
    RemoteFile("pendigits/pendigits.tra", f"{UCI_URL}/pendigits/pendigits.tra",
               "e2b9eb9f0d0467e2b64a4816a3420edf2b8043447576f4b84337aba44a9f97d3", 502098),
    RemoteFile("pendigits/pendigits.tes", f"{UCI_URL}/pendigits/pendigits.tes",
               "8bd03229c5c5291fefe43e45465dd948d2645bf23328b9d993e0b777666b2015", 234366),
))
OPTDIGITS = DatasetFiles("optdigits", (
    RemoteFile("optdigits/optdigits.tra", f"{UCI_URL}/optdigits/optdigits.tra",
               "e1b683cc211604fe8fd8c4417e6a69f31380e0c61d4af22e93cc21e9257ffedd", 563639),
    RemoteFile("optdigits/optdigits.tes", f"{UCI_URL}/optdigits/optdigits.tes",
               "6ebb3d2fee246a4e99363262ddf8a00a3c41bee6014c373ed9d9216ba7f651b8", 264712),
))
NURSERY = DatasetFiles("nursery", (
    RemoteFile("nursery/nursery.data", f"{UCI_URL}/nursery/nursery.data",
               "8e0389c3dd37590248a921c2726d869ee96b817761a35eb8416afa24f31f931d", 1059371),
))

# Attribute values in nursery.names order (the data spells "non-prob" as "nonprob").
NURSERY_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "parents": ("usual", "pretentious", "great_pret"),
    "has_nurs": ("proper", "less_proper", "improper", "critical", "very_crit"),
    "form": ("complete", "completed", "incomplete", "foster"),
    "children": ("1", "2", "3", "more"),
    "housing": ("convenient", "less_conv", "critical"),
    "finance": ("convenient", "inconv"),
    "social": ("nonprob", "slightly_prob", "problematic"),
    "health": ("recommended", "priority", "not_recom"),
}
# UCI class order minus 'recommend' (2 of 12,960 rows), which is dropped.
NURSERY_CLASSES = ("not_recom", "very_recom", "priority", "spec_prior")
NURSERY_DROPPED = "recommend"
DIGITS = [str(d) for d in range(10)]


def split_fields(payload: bytes, n_fields: int, source: str) -> np.ndarray:
    """A ``(rows, n_fields)`` array of strings from comma-separated lines (blank lines skipped)."""
    lines = [line for line in payload.decode("latin-1").splitlines() if line.strip()]
    rows = [line.split(",") for line in lines]
    widths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    bad = np.flatnonzero(widths != n_fields)
    if len(rows) == 0:
        raise DataError(f"{source} has no data rows.")
    if len(bad):
        raise DataError(f"{source}: data row {bad[0] + 1} has {widths[bad[0]]} fields, "
                        f"expected {n_fields}.")
    return np.array(rows, dtype=str)


def _numbers(fields: np.ndarray, source: str) -> np.ndarray:
    try:
        return fields.astype(np.float64)
    except ValueError as exc:
        raise DataError(f"{source}: expected numeric features ({exc}).") from exc


def _digit_labels(fields: np.ndarray, source: str) -> np.ndarray:
    labels = _numbers(fields, source)
    if not np.isin(labels, np.arange(10)).all():
        raise DataError(f"{source}: expected digit labels 0..9.")
    return labels.astype(np.int64)


def load_letter(data_dir: Path, *, fetch: bool = False) -> Dataset:
    """UCI Letter Recognition: 20,000 × 16 integer features, 26 classes A–Z.

    Conventional split: first 16,000 rows train, last 4,000 test.
    """
    (path, payload), = read_payloads(LETTER, data_dir, fetch).items()
    fields = split_fields(payload, 17, path)
    codes = np.char.str_len(fields[:, 0]) == 1
    y = np.array([ord(c) for c in fields[:, 0].tolist()], dtype=np.int64) - ord("A")
    if not codes.all() or y.min() < 0 or y.max() > 25:
        raise DataError(f"{path}: expected a letter A..Z in the first column.")
    return Dataset(
        name="letter", X=_numbers(fields[:, 1:], path), y=y, n_classes=26,
        class_names=[chr(ord("A") + k) for k in range(26)], n_features=16,
        description="UCI Letter Recognition (Slate 1991): 20,000 rows, 16 integer features "
                    "0-15, 26 classes; standardised (heterogeneous statistics); "
                    "test split = last 4,000 rows.",
        standardise=True, test_start=16000,
    )


def _load_train_test(spec: DatasetFiles, data_dir: Path, fetch: bool, n_features: int,
                     description: str) -> Dataset:
    parts = []
    for path, payload in read_payloads(spec, data_dir, fetch).items():
        fields = split_fields(payload, n_features + 1, path)
        parts.append((_numbers(fields[:, :-1], path), _digit_labels(fields[:, -1], path)))
    (X_tra, y_tra), (X_tes, y_tes) = parts
    return Dataset(
        name=spec.name, X=np.vstack([X_tra, X_tes]), y=np.concatenate([y_tra, y_tes]),
        n_classes=10, class_names=list(DIGITS), n_features=n_features,
        description=description.format(n_tra=len(y_tra), n_tes=len(y_tes)),
        standardise=True, test_start=len(y_tra),
    )


def load_pendigits(data_dir: Path, *, fetch: bool = False) -> Dataset:
    """UCI Pen-Based digits: 7,494 (.tra) + 3,498 (.tes) rows × 16 coordinates 0–100."""
    return _load_train_test(
        PENDIGITS, data_dir, fetch, 16,
        "UCI Pen-Based Recognition of Handwritten Digits (Alpaydin & Alimoglu 1998): "
        "{n_tra:,} .tra + {n_tes:,} .tes rows, 16 pen coordinates 0-100 (standardised: "
        "centring helps linear learners), 10 classes; test split = the .tes rows.",
    )


def load_optdigits(data_dir: Path, *, fetch: bool = False) -> Dataset:
    """UCI Optical digits: 3,823 (.tra) + 1,797 (.tes) rows × 64 pixel counts 0–16."""
    return _load_train_test(
        OPTDIGITS, data_dir, fetch, 64,
        "UCI Optical Recognition of Handwritten Digits (Alpaydin & Kaynak 1998): "
        "{n_tra:,} .tra + {n_tes:,} .tes rows, 64 pixel counts 0-16 (standardised), "
        "10 classes; test split = the .tes rows.",
    )


def load_nursery(data_dir: Path, *, fetch: bool = False) -> Dataset:
    """UCI Nursery: 8 categorical attributes one-hot encoded (27 features), 4 classes.

    The class 'recommend' has only 2 of the 12,960 rows; they are dropped (a
    2-row class can be neither learned nor evaluated, and merging it into
    another class would invent labels), leaving 12,958 rows.
    """
    (path, payload), = read_payloads(NURSERY, data_dir, fetch).items()
    fields = split_fields(payload, len(NURSERY_ATTRIBUTES) + 1, path)
    fields = fields[fields[:, -1] != NURSERY_DROPPED]
    blocks = []
    for col, (attribute, values) in enumerate(NURSERY_ATTRIBUTES.items()):
        onehot = fields[:, col, None] == np.array(values)[None, :]
        unknown = np.flatnonzero(~onehot.any(axis=1))
        if len(unknown):
            raise DataError(f"{path}: unexpected {attribute} value "
                            f"{fields[unknown[0], col]!r}; expected one of {list(values)}.")
        blocks.append(onehot)
    labels = fields[:, -1, None] == np.array(NURSERY_CLASSES)[None, :]
    if not labels.any(axis=1).all():
        bad = fields[~labels.any(axis=1), -1][0]
        raise DataError(f"{path}: unexpected class {bad!r}; expected one of "
                        f"{[*NURSERY_CLASSES, NURSERY_DROPPED]}.")
    y = np.argmax(labels, axis=1).astype(np.int64)
    counts = ", ".join(f"{c} {n:,}" for c, n in zip(NURSERY_CLASSES, np.bincount(y, minlength=4),
                                                     strict=True))
    X = np.hstack(blocks).astype(np.float64)
    return Dataset(
        name="nursery", X=X, y=y, n_classes=len(NURSERY_CLASSES),
        class_names=list(NURSERY_CLASSES), n_features=X.shape[1],
        description=f"UCI Nursery (Rajkovic et al.): {len(y):,} rows, 8 categorical attributes "
                    f"one-hot encoded into {X.shape[1]} binary features (not standardised); "
                    f"the 2 rows of class 'recommend' are dropped; classes {counts}.",
        standardise=False,
    )
