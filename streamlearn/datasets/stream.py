"""A dataset as a replay stream: load → prepare (standardise, bias) → order (passes, drift).

Preprocessing protocol (stated in docs/results.md):

* dense datasets flagged ``standardise`` (letter, pendigits, optdigits, mnist)
  are z-scored per column (mean and standard deviation of the whole dataset —
  the replay's stream, as a fixed preprocessing step);
* every dataset gets a constant bias feature 1 appended (with W₀ = 0 the
  argmax is invariant to rescaling x, but not to a missing bias);
* binary, one-hot, pixel-scaled and hashed data are left as they are.

The synthetic streams are generated block by block as they are read, so a
long stream never has to be held in memory.

>>> stream = prepare_stream("synnonsep", rounds=1000, seed=1)
>>> stream.rounds, stream.n_features, [len(y) for _, y in stream.blocks(batch_size=64)]
(1000, 401, [1000])
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamlearn.datasets import Dataset, load_dataset
from streamlearn.datasets.synth import synthetic_rows
from streamlearn.datasets.synthetic import N_CLASSES, N_FEATURES, SyntheticRows
from streamlearn.errors import ConfigError
from streamlearn.features import Batch, SparseBatch, take_rows

__all__ = ["BLOCK_ROUNDS", "ROUND_BYTES", "Drift", "PreparedStream", "add_bias", "apply_drift",
           "available_memory", "check_fits_in_memory", "prepare_stream", "standardise",
           "stream_order"]

#: Rounds per block when a stream is generated or sliced block by block.
BLOCK_ROUNDS = 4096
#: Bytes a round of a stream holds whatever its rows: its row index and label (int64 each),
#: and while they are built the permutations of the passes (docs/datasets.md: ~30 a round).
ROUND_BYTES = 32


def available_memory() -> int | None:
    """Bytes this machine can still give (``MemAvailable``; else its physical memory; None
    when neither is known)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError, AttributeError):
        return None


def check_fits_in_memory(rounds: int, bytes_per_round: int, what: str) -> None:
    """Refuse, before allocating anything, ``rounds`` that would need more memory than the
    machine has (``what`` names the options that asked for them)."""
    available = available_memory()
    needed = rounds * bytes_per_round
    if available is None or needed <= available:
        return
    raise ConfigError(f"{what} is {rounds:,} rounds, which need about {needed / 1e9:,.1f} GB "
                      f"({bytes_per_round:,} bytes a round); this machine has "
                      f"{available / 1e9:,.1f} GB available. Expected at most "
                      f"{available // bytes_per_round:,} rounds: fewer --passes or --rounds.")


@dataclass(frozen=True)
class Drift:
    """Concept drift from round ``at`` on: ``kind`` is 'permute' (labels permuted) or 'prior'."""

    at: int
    kind: str = "permute"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("permute", "prior"):
            raise ConfigError(f"Drift kind must be 'permute' or 'prior'. Got {self.kind!r} instead.")
        if self.at < 0:
            raise ConfigError(f"Drift round must be >= 0. Got {self.at}.")


def stream_order(n: int, passes: int, rounds: int | None, seed: int | None) -> np.ndarray:
    """Row indices of the stream: ``passes`` passes (each reshuffled when seed is given),
    cut or extended to ``rounds`` when given. A stream larger than the memory is refused
    before anything is allocated (:func:`check_fits_in_memory`)."""
    if passes < 1:
        raise ConfigError(f"--passes must be an int >= 1. Got {passes}.")
    needed = passes if rounds is None else max(passes, -(-rounds // n))
    check_fits_in_memory(needed * n, ROUND_BYTES,
                         f"--passes {passes} over {n:,} rows" if rounds is None else
                         f"--rounds {rounds:,} (with --passes {passes} over {n:,} rows)")
    rng = np.random.default_rng(seed) if seed is not None else None
    blocks = [rng.permutation(n) if rng is not None else np.arange(n) for _ in range(needed)]
    order = np.concatenate(blocks)
    return order if rounds is None else order[:rounds]


def apply_drift(y: np.ndarray, n_classes: int, drift: Drift | None,
                X: Batch | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Labels after drift; for 'prior' drift also the kept-row selection (class-prior shift)."""
    if drift is None or drift.at >= len(y):
        return y, None
    rng = np.random.default_rng(drift.seed)
    out = y.copy()
    if drift.kind == "permute":
        perm = rng.permutation(n_classes)
        out[drift.at:] = perm[y[drift.at:]]
        return out, None
    # prior shift: after the drift round, keep half of the classes at 4× the rate of the others
    favoured = rng.permutation(n_classes)[: max(1, n_classes // 2)]
    keep_prob = np.where(np.isin(y, favoured), 1.0, 0.25)
    keep = np.ones(len(y), dtype=bool)
    keep[drift.at:] = rng.random(len(y) - drift.at) < keep_prob[drift.at:]
    return out, keep


@dataclass
class PreparedStream:
    """The stream a replay runs: round ``t`` is row ``order[t]`` of the data, with label ``labels[t]``.

    The rows are either held (``features``: the dataset's rows, standardised
    when asked, without the bias) or generated on demand (``generated``: the
    synthetic streams, whose rows are never all in memory). :meth:`blocks`
    yields the stream a block of rounds at a time, with the bias feature.
    """

    dataset: str
    n_classes: int
    n_features: int  # with the bias
    standardised: bool
    passes: int
    order: np.ndarray  # int64 (rounds,): the data row of each round
    labels: np.ndarray  # int64 (rounds,): the label of each round (after drift)
    row_labels: np.ndarray  # int64 (n_rows,): the label of each data row (before drift)
    features: Batch | None = None
    generated: SyntheticRows | None = None

    @property
    def rounds(self) -> int:
        return len(self.labels)

    def rows(self, rounds: np.ndarray) -> Batch:
        """The feature rows (bias included) of the given rounds."""
        data_rows = self.order[rounds]
        if self.generated is not None:
            return add_bias(self.generated.features(data_rows))
        assert self.features is not None
        return add_bias(take_rows(self.features, data_rows))

    def blocks(self, batch_size: int = 1) -> Iterator[tuple[Batch, np.ndarray]]:
        """``(X, y)`` blocks of about :data:`BLOCK_ROUNDS` rounds, a multiple of ``batch_size``."""
        size = batch_size * max(1, -(-BLOCK_ROUNDS // max(batch_size, 1)))
        for lo in range(0, self.rounds, size):
            hi = min(self.rounds, lo + size)
            yield self.rows(np.arange(lo, hi)), self.labels[lo:hi]

    def materialise(self) -> tuple[Batch, np.ndarray]:
        """The whole stream in memory, ``(X, y)``."""
        return self.rows(np.arange(self.rounds)), self.labels

    def data_rows(self) -> Batch:
        """Every data row (without the bias), in data order (generated ones are generated now)."""
        if self.generated is not None:
            return self.generated.features(np.arange(self.generated.n))
        assert self.features is not None
        return self.features


#: Columns whose largest magnitude reaches 2**this are scaled down before their mean and
#: variance are taken: their squares would overflow a float64 (1e308 values, say).
_HUGE_EXPONENT = 400


def standardise(X: np.ndarray) -> np.ndarray:
    """Column z-scores; constant columns become 0.

    A column with values beyond 2**400 (~1e120) is first divided by a power of two, which
    is exact: its z-scores are the same, and its mean and variance cannot overflow.
    """
    if X.size:
        _, exponent = np.frexp(np.max(np.abs(X), axis=0))
        X = np.ldexp(X, -np.where(exponent >= _HUGE_EXPONENT, exponent, 0))
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    return np.asarray((X - mean) / np.where(std > 0, std, 1.0))


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
    """Load ``dataset`` and build the replay stream (see the module doc for the protocol).

    The synthetic streams are not generated here: their rows are generated
    block by block while the stream is read (unless ``standardise_mode`` is
    "yes", which needs every row first), so memory does not grow with the
    number of rounds beyond a few index arrays.
    """
    options = dict(loader_options or {})
    if standardise_mode not in ("auto", "yes", "no"):
        raise ConfigError(f"--standardise must be auto, yes or no. Got {standardise_mode!r}.")
    if dataset in ("synsep", "synnonsep"):
        # synthetic streams are generated to length: one pass of fresh examples
        options.setdefault("n_rows", rounds if rounds is not None else 100_000)
        options.setdefault("seed", seed)
        if standardise_mode != "yes":
            return _order_stream(dataset, synthetic_rows(dataset, **options), None, N_CLASSES,
                                 False, passes, rounds, seed if shuffle else None, drift)
    ds: Dataset = load_dataset(dataset, data_dir, fetch=fetch, **options)
    do_standardise = ds.standardise if standardise_mode == "auto" else standardise_mode == "yes"
    X: Batch = ds.X
    if do_standardise:
        if isinstance(X, SparseBatch):
            raise ConfigError(f"Dataset {dataset!r} is sparse; --standardise yes needs dense data.")
        X = standardise(np.asarray(X, dtype=np.float64))
    return _order_stream(dataset, X, ds.y, ds.n_classes, do_standardise, passes, rounds,
                         seed if shuffle else None, drift)


def _order_stream(dataset: str, data: Batch | SyntheticRows, y: np.ndarray | None,
                  n_classes: int, standardised: bool, passes: int, rounds: int | None,
                  seed: int | None, drift: Drift | None) -> PreparedStream:
    """Order the data rows into rounds (passes, shuffling, length) and apply the drift."""
    if isinstance(data, SyntheticRows):
        generated, features, row_labels, width = data, None, data.labels, N_FEATURES
    else:
        assert y is not None
        generated, features, row_labels, width = None, data, y, data.shape[1]
    order = stream_order(len(row_labels), passes, rounds, seed)
    passes_made = max(passes, -(-len(order) // len(row_labels)))
    labels, keep = apply_drift(row_labels[order], n_classes, drift)
    if keep is not None:
        order, labels = order[keep], labels[keep]
    return PreparedStream(dataset, n_classes, width + 1, standardised, passes_made, order, labels,
                          row_labels, features=features, generated=generated)


