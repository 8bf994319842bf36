"""The one batch-ranker interface and its shared validation.

A ranker learns a scoring function from labelled rows; higher scores rank
first. ``fit`` validates the inputs once (here) and calls the ranker's
``_fit``; ``score`` validates and calls ``_score``. Constructors hold
hyperparameters only, stored under the same names; learned state ends in ``_``.

Labels ``y`` are relevance grades (>= 0; binary rankers treat ``y > 0`` as
positive). ``qid`` (optional) groups rows into queries whose rows are
contiguous; rankers that compare documents only within a query use it.
``sample_weight`` (>= 0) means "this row counts w times": every ranker's
weighted fit equals its fit on rows repeated by integer weights (tested).
"""

from __future__ import annotations

import abc
import inspect
from typing import Any, ClassVar, Self

import numpy as np

from streamlearn.errors import ConfigError, DataError
from streamlearn.learners.base import check_float, check_int
from streamlearn.rankers.metrics import QueryGroups, query_groups

__all__ = ["FitData", "Ranker", "as_matrix", "check_choice", "check_float", "check_int"]


def check_choice(owner: str, name: str, value: object, choices: tuple[str, ...]) -> str:
    """Validate a string hyperparameter against its allowed values."""
    if not isinstance(value, str) or value not in choices:
        raise ConfigError(
            f"The '{name}' parameter of {owner} must be one of {', '.join(map(repr, choices))}. "
            f"Got {value!r} instead."
        )
    return value


class FitData:
    """Validated training data: ``X`` (n, d) float64, ``y`` (n,), ``w`` (n,), ``groups``."""

    __slots__ = ("X", "groups", "w", "y")

    def __init__(self, X: np.ndarray, y: np.ndarray, w: np.ndarray, groups: QueryGroups) -> None:
        self.X, self.y, self.w, self.groups = X, y, w, groups


def merge_duplicate_rows(x: np.ndarray, y: np.ndarray,
                         weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge identical ``(x, y)`` rows, summing their weights; drop zero-weight rows.

    Rows come out in a canonical (sorted) order, so data given with integer
    weights and the same data with rows repeated that many times merge to the
    same arrays: fitting on the merged rows makes both fits identical.
    """
    keep = weight > 0
    rows = np.concatenate([x[keep], y[keep, None].astype(np.float64)], axis=1)
    unique, inverse = np.unique(rows, axis=0, return_inverse=True)
    merged = np.bincount(inverse.ravel(), weights=weight[keep], minlength=unique.shape[0])
    return unique[:, :-1], unique[:, -1], merged


def as_matrix(X: object, n_features: int | None = None) -> np.ndarray:
    """``X`` as a finite float64 (n, d) array; checks d against ``n_features`` if given."""
    arr = np.asarray(X, dtype=np.float64)
    if arr.ndim != 2:
        raise DataError(f"Expected X of shape (n_samples, n_features). Got shape {arr.shape}.")
    if n_features is not None and arr.shape[1] != n_features:
        raise DataError(f"Expected X with {n_features} features. Got {arr.shape[1]} instead.")
    if not np.isfinite(arr).all():
        raise DataError("X must be finite. Got NaN or inf.")
    return arr


class Ranker(abc.ABC):
    """Base class of every batch ranker.

    Subclasses implement ``_fit(data)`` and ``_score(X)``. Set ``requires_qid``
    if the ranker needs query groups (AdaRank) and ``binary_labels`` if it uses
    ``y > 0`` only.
    """

    requires_qid: ClassVar[bool] = False
    binary_labels: ClassVar[bool] = False

    # ------------------------------------------------------------------ params
    def get_params(self) -> dict[str, Any]:
        """The constructor's hyperparameters by name."""
        sig = inspect.signature(type(self).__init__)
        # a ranker without a constructor of its own has object's (*args, **kwargs): none
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return {name: getattr(self, name) for name, p in sig.parameters.items()
                if name != "self" and p.kind in named}

    def clone(self) -> Self:
        """A fresh, unfitted ranker with the same hyperparameters."""
        return type(self)(**self.get_params())

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # --------------------------------------------------------------------- fit
    def fit(
        self, X: object, y: object, qid: object = None, sample_weight: object = None
    ) -> Self:
        """Learn from rows ``X`` with relevance ``y``; returns ``self``."""
        data = self._validate(X, y, qid, sample_weight)
        self.n_features_in_ = data.X.shape[1]
        self._fit(data)
        return self

    def _validate(self, X: object, y: object, qid: object, sample_weight: object) -> FitData:
        name = type(self).__name__
        arr = as_matrix(X)
        n = arr.shape[0]
        if n == 0:
            raise DataError(f"{name} needs at least one training row. Got 0.")
        labels = np.asarray(y, dtype=np.float64).reshape(-1)
        if labels.shape[0] != n or not np.isfinite(labels).all() or labels.min() < 0:
            raise DataError(
                f"Expected y: {n} finite relevance grades >= 0. "
                f"Got {labels.shape[0]} values (min {labels.min() if labels.size else None})."
            )
        if sample_weight is None:
            w = np.ones(n)
        else:
            w = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
            if w.shape[0] != n or not np.isfinite(w).all() or (w.size and w.min() < 0):
                raise DataError(
                    f"Expected sample_weight: {n} finite values >= 0. Got {w.shape[0]} values."
                )
            if w.sum() <= 0:
                raise DataError("sample_weight must not be all zero.")
        if self.requires_qid and qid is None:
            raise DataError(f"{name} ranks within queries and needs qid. Got qid=None.")
        return FitData(arr, labels, w, query_groups(qid, n))

    @abc.abstractmethod
    def _fit(self, data: FitData) -> None:
        """Learn from validated data."""

    # ------------------------------------------------------------------- score
    def score(self, X: object) -> np.ndarray:
        """One score per row of ``X`` (higher ranks first)."""
        if not hasattr(self, "n_features_in_"):
            raise ConfigError(f"This {type(self).__name__} is not fitted yet; call fit first.")
        rows = as_matrix(X, self.n_features_in_)
        scores = np.asarray(self._score(rows), dtype=np.float64)
        if scores.shape != (len(rows),) or not np.isfinite(scores).all():
            # user code: what a ranker gives is checked here, once for every caller (the
            # retrain's judging and the serving loop, which takes the ranker out on it)
            raise DataError(f"{type(self).__name__}.score must give one finite number per "
                            f"row: expected shape ({len(rows)},), got shape {scores.shape}"
                            f"{' with NaN or infinity' if scores.shape == (len(rows),) else ''}.")
        return scores

    @abc.abstractmethod
    def _score(self, X: np.ndarray) -> np.ndarray:
        """Scores of validated rows."""

