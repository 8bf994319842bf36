"""One replay experiment: load → prepare (standardise, bias) → order (passes) → run with comparator.

Shared by ``streamlearn replay``, the results-table script and the benchmark.

Preprocessing protocol (stated in docs/results.md):

* dense datasets flagged ``standardise`` (letter, pendigits, optdigits) are
  z-scored per column (mean and standard deviation of the whole dataset — the
  replay's stream, as a fixed preprocessing step) ;
* every dataset gets a constant bias feature 1 appended (with W₀ = 0 the
  argmax is invariant to rescaling x, but not to a missing bias);
* binary, one-hot, pixel-scaled and hashed data are left as they are.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulators.datasets import Dataset, load_dataset
from simulators.replay import Drift, ReplayResult, apply_drift, replay, stream_order
from streamlearn.errors import ConfigError
from streamlearn.features import Batch, SparseBatch, take_rows
from streamlearn.learners import Learner, Perceptron

__all__ = ["PreparedStream", "add_bias", "prepare_stream", "run_with_comparator", "standardise"]


@dataclass
class PreparedStream:
    """The stream a replay runs: features, labels, and how they were prepared."""

    dataset: str
    X: Batch
    y: np.ndarray
    n_classes: int
    n_features: int
    standardised: bool
    passes: int

    @property
    def rounds(self) -> int:
        return len(self.y)


def standardise(X: np.ndarray) -> np.ndarray:
    """Column z-scores; constant columns become 0."""
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    return (X - mean) / np.where(std > 0, std, 1.0)


def add_bias(X: Batch) -> Batch:
    """Append a constant feature 1 (last column)."""
    if isinstance(X, SparseBatch):
        n, d = X.shape
        lengths = np.diff(X.indptr) + 1
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        indices = np.empty(int(indptr[-1]), dtype=np.int64)
        values = np.empty(int(indptr[-1]))
        bias_pos = indptr[1:] - 1
        is_bias = np.zeros(len(indices), dtype=bool)
        is_bias[bias_pos] = True
        indices[~is_bias], values[~is_bias] = X.indices, X.values
        indices[is_bias], values[is_bias] = d, 1.0
        return SparseBatch(indptr, indices, values, d + 1)
    ones = np.ones((X.shape[0], 1), dtype=X.dtype)
    return np.hstack([X, ones])


def prepare_stream(
    dataset: str,
    *,
    data_dir: str | None = None,
    passes: int = 1,
    rounds: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
    standardise_mode: str = "auto",
    drift: Drift | None = None,
    fetch: bool = False,
    loader_options: dict[str, Any] | None = None,
) -> PreparedStream:
    """Load ``dataset`` and build the replay stream (see the module doc for the protocol)."""
    options = dict(loader_options or {})
    if dataset in ("synsep", "synnonsep"):
        # synthetic streams are generated to length: one pass of fresh examples
        options.setdefault("n_rows", rounds if rounds is not None else 100_000)
        options.setdefault("seed", seed)
    ds: Dataset = load_dataset(dataset, data_dir, fetch=fetch, **options)
    if standardise_mode not in ("auto", "yes", "no"):
        raise ConfigError(f"--standardise must be auto, yes or no. Got {standardise_mode!r}.")
    do_standardise = ds.standardise if standardise_mode == "auto" else standardise_mode == "yes"
    X: Batch = ds.X
    if do_standardise:
        if isinstance(X, SparseBatch):
            raise ConfigError(f"Dataset {dataset!r} is sparse; --standardise yes needs dense data.")
        X = standardise(np.asarray(X, dtype=np.float64))
    X = add_bias(X)
    order = stream_order(ds.n_rows, passes, rounds, seed if shuffle else None)
    X, y = take_rows(X, order), ds.y[order]
    y, keep = apply_drift(y, ds.n_classes, drift)
    if keep is not None:
        X, y = take_rows(X, np.flatnonzero(keep)), y[keep]
    return PreparedStream(dataset, X, y, ds.n_classes, X.shape[1], do_standardise,
                          max(passes, -(-len(order) // ds.n_rows)))


def stderr_progress(label: str) -> Callable[[int, int, float], None]:
    """A progress callback printing a periodic line on stderr."""

    def report(done: int, total: int, error_rate: float) -> None:
        print(f"{label}: {done:,}/{total:,} rounds ({100 * done / total:.0f}%), "
              f"error {error_rate:.4f}", file=sys.stderr, flush=True)

    return report


def run_with_comparator(
    learner: Learner,
    stream: PreparedStream,
    *,
    batch_size: int,
    delay_rounds: float = 0.0,
    drop: float = 0.0,
    seed: int = 0,
    progress: bool = False,
) -> tuple[ReplayResult, ReplayResult]:
    """Replay the learner and the full-information Perceptron on the same stream."""
    kwargs: dict[str, Any] = {"batch_size": batch_size, "delay_mean": delay_rounds, "drop": drop,
                              "seed": seed}
    result = replay(learner, stream.X, stream.y,
                    progress=stderr_progress(type(learner).__name__) if progress else None,
                    **kwargs)
    comparator = replay(Perceptron(stream.n_classes, stream.n_features, seed=seed),
                        stream.X, stream.y,
                        progress=stderr_progress("Perceptron") if progress else None, **kwargs)
    return result, comparator
