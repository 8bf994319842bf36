"""LETOR 3.0 reader: ``rel qid:N 1:v 2:v ... #docid = D`` files, folds, query-level norm.

LETOR ships each collection in three versions: ``QueryLevelNorm`` (every
feature min-max scaled to [0, 1] inside each query — the version the LETOR
baselines use), ``Feature-min`` and ``Feature-null`` (raw values). Given the
collection root, :func:`load_fold` reads ``QueryLevelNorm/FoldK/{train,vali,test}.txt``
(or ``.txt.gz``); given a raw-feature folder (``trainingset.txt`` names) it applies
the same query-level normalisation, :func:`query_level_norm`, on reading.

Examples
--------
>>> import io
>>> text = "2 qid:1 1:0.5 2:1 #docid = 7\\n0 qid:1 1:1 2:0 #docid = 8\\n"
>>> d = parse_letor(io.StringIO(text))
>>> d.X.tolist(), d.y.tolist(), d.qid.tolist(), d.docid.tolist()
([[0.5, 1.0], [1.0, 0.0]], [2.0, 0.0], [1, 1], ['7', '8'])
"""

from __future__ import annotations

import gzip
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from streamlearn.errors import DataError
from streamlearn.rankers.metrics import query_groups

__all__ = ["LETOR_OHSUMED", "LetorData", "default_letor_dir", "load_fold", "ohsumed_root",
           "parse_letor", "query_level_norm"]

SPLITS = ("train", "vali", "test")
#: LETOR 3.0 OHSUMED's folder under the data directory.
LETOR_OHSUMED = "letor3-ohsumed"
#: Where LETOR 3.0 is published (OHSUMED.rar, under Microsoft Research's download agreement).
LETOR_PAGE = ("https://www.microsoft.com/en-us/research/project/"
              "letor-learning-rank-information-retrieval/")
_RAW_NAMES = {"train": "trainingset", "vali": "validationset", "test": "testset"}


@dataclass(frozen=True)
class LetorData:
    """One LETOR file: features ``X`` (n, d), grades ``y``, contiguous ``qid``, ``docid``."""

    X: np.ndarray
    y: np.ndarray
    qid: np.ndarray
    docid: np.ndarray

    @property
    def n_queries(self) -> int:
        return query_groups(self.qid, len(self.y)).n_queries


def parse_letor(stream: TextIO, source: str = "<stream>", n_features: int | None = None) -> LetorData:
    """Parse LETOR/SVMlight lines; missing features are 0, ``NULL`` values are rejected."""
    labels: list[float] = []
    qids: list[int] = []
    docids: list[str] = []
    rows: list[list[tuple[int, float]]] = []
    max_index = 0
    for lineno, raw in enumerate(stream, start=1):
        body, _, comment = raw.partition("#")
        parts = body.split()
        if not parts:
            continue
        try:
            labels.append(float(parts[0]))
            if not parts[1].startswith("qid:"):
                raise ValueError("second field is not qid:N")
            qids.append(int(parts[1][4:]))
            pairs = [(int(k), float(v)) for k, v in (p.split(":", 1) for p in parts[2:])]
        except (ValueError, IndexError) as exc:
            raise DataError(f"{source}:{lineno}: expected 'rel qid:N i:v ...'. Got {exc}.") from exc
        if pairs:
            max_index = max(max_index, max(k for k, _ in pairs))
        rows.append(pairs)
        docids.append(comment.split("=", 1)[1].strip() if "=" in comment else "")
    d = n_features if n_features is not None else max_index
    X = np.zeros((len(rows), d))
    for i, pairs in enumerate(rows):
        for k, v in pairs:
            if not 1 <= k <= d:
                raise DataError(f"{source}:{i + 1}: feature index {k} outside 1..{d}.")
            X[i, k - 1] = v
    if not np.isfinite(X).all():
        raise DataError(f"{source}: non-finite feature values.")
    qid = np.asarray(qids, dtype=np.int64)
    query_groups(qid, len(qid))  # checks that each query's lines are contiguous
    return LetorData(X, np.asarray(labels), qid, np.asarray(docids))


def query_level_norm(X: np.ndarray, qid: np.ndarray) -> np.ndarray:
    """Min-max scale each feature to [0, 1] inside each query (0 where constant)."""
    groups = query_groups(qid, X.shape[0])
    lo = np.minimum.reduceat(X, groups.starts, axis=0)[groups.index]
    hi = np.maximum.reduceat(X, groups.starts, axis=0)[groups.index]
    span = hi - lo
    return np.where(span > 0, (X - lo) / np.where(span > 0, span, 1.0), 0.0)


def _open(path: Path) -> TextIO:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return io.StringIO(raw.decode("ascii"))


def _find(folder: Path, stem: str) -> Path | None:
    for name in (f"{stem}.txt", f"{stem}.txt.gz"):
        if (folder / name).is_file():
            return folder / name
    return None


def load_fold(root: str | Path, fold: int) -> dict[str, LetorData]:
    """Read ``train``, ``vali`` and ``test`` of ``FoldK`` under a LETOR collection folder.

    ``root`` may be the collection root (``QueryLevelNorm`` is used), the
    ``QueryLevelNorm`` folder itself, or a raw-feature folder (``Feature-min``),
    which is query-level normalised on reading.
    """
    base = Path(root)
    if (base / "QueryLevelNorm").is_dir():
        base = base / "QueryLevelNorm"
    folder = base / f"Fold{fold}"
    if not folder.is_dir():
        raise DataError(
            f"Expected a LETOR fold folder {folder} (root with QueryLevelNorm/Fold1..5). Not found."
        )
    out: dict[str, LetorData] = {}
    for split in SPLITS:
        path = _find(folder, split)
        raw = path is None
        if raw:
            path = _find(folder, _RAW_NAMES[split])
        if path is None:
            raise DataError(f"Expected {folder}/{split}.txt(.gz). Not found.")
        data = parse_letor(_open(path), str(path))
        if raw:
            data = LetorData(query_level_norm(data.X, data.qid), data.y, data.qid, data.docid)
        out[split] = data
    d = {v.X.shape[1] for v in out.values()}
    if len(d) != 1:  # a split may lack the highest feature index: pad to the widest
        width = max(d)
        out = {k: LetorData(np.pad(v.X, ((0, 0), (0, width - v.X.shape[1]))), v.y, v.qid, v.docid)
               for k, v in out.items()}
    return out


def default_letor_dir(data_dir: str | os.PathLike[str] | None = None,
                      fetch: bool = False) -> Path:
    """``<data dir>/letor3-ohsumed`` (:func:`ohsumed_root`)."""
    return ohsumed_root(data_dir, fetch)


def ohsumed_root(data_dir: str | os.PathLike[str] | None = None, fetch: bool = False) -> Path:
    """``<data dir>/letor3-ohsumed`` (``--data-dir``, else ``$STREAMLEARN_DATA_DIR``, ...),
    checked to hold ``QueryLevelNorm/Fold1``: when it does not, a DataError says where it
    looked and how to get the data. LETOR cannot be fetched (``fetch`` only changes the
    wording): it is a RAR archive behind a download agreement."""
    from streamlearn.datasets.base import ENV_DATA_DIR, resolve_data_dir

    base = resolve_data_dir(data_dir)
    root = base / LETOR_OHSUMED
    if (root / "QueryLevelNorm" / "Fold1").is_dir() or (root / "Fold1").is_dir():
        return root
    lead = ("--fetch cannot download LETOR 3.0 OHSUMED (a RAR archive behind Microsoft "
            "Research's download agreement)" if fetch else
            f"LETOR 3.0 OHSUMED not found in {base}")
    raise DataError(
        f"{lead}: expected {root}/QueryLevelNorm/Fold1/{{train,vali,test}}.txt(.gz). Fix: pass "
        f"--data-dir DIR (or set {ENV_DATA_DIR}) to a folder holding {LETOR_OHSUMED}/, or "
        f"download OHSUMED.rar from {LETOR_PAGE} and unpack its QueryLevelNorm folder into "
        f"DIR/{LETOR_OHSUMED}/ (docs/datasets.md).")
