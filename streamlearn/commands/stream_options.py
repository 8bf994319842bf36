"""The dataset, stream and exploration options ``replay`` and ``bench`` share — one parser.

Both commands build their stream with :func:`prepare_from_args`
(:func:`streamlearn.datasets.stream.prepare_stream`), so a file that replays also
benches: ``--label-column``, ``--categorical``, ``--delimiter``, ``--header``
for ``csv:PATH``; ``--passes`` or ``--rounds``; ``--no-shuffle`` for a
time-ordered file; ``--standardise``; ``--gamma`` or ``--exploration``.

Values are checked while parsing: a bad one stops the command with one line
naming the option, what was expected and what was got, and exit code 2.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from streamlearn.config_fields import DIGITS_ONLY, decimal_float, decimal_int
from streamlearn.errors import ConfigError
from streamlearn.learners.exploration import (
    LEARNER_DEFAULT,
    STRATEGIES,
    Exploration,
    exploration_from_name,
)

__all__ = [
    "add_exploration_arguments",
    "add_stream_arguments",
    "check_dataset_arg",
    "exploration_from_args",
    "int_at_least",
    "integer",
    "loader_options",
    "number",
    "number_in",
    "prepare_from_args",
]

def dataset_help() -> str:
    """What --dataset accepts: every registered name, then the file forms."""
    from streamlearn.datasets.catalogue import dataset_names

    return (f"{', '.join(dataset_names())}, csv:PATH or libsvm:PATH (PATH may end in .gz, "
            f".bz2 or .xz)")

_CSV_OPTIONS = ("label_column", "categorical", "delimiter", "header", "missing")


def integer(text: str) -> int:
    """argparse type: an integer written with the digits 0-9 (``int`` also takes ``1_0``)."""
    try:
        return decimal_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer ({DIGITS_ONLY}), "
                                         f"got {text!r}") from None


def number(text: str) -> float:
    """argparse type: a number written with the digits 0-9 (``float`` also takes ``1_0``)."""
    try:
        return decimal_float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number ({DIGITS_ONLY}), "
                                         f"got {text!r}") from None


def int_at_least(low: int, high: int = 2**63 - 1) -> Callable[[str], int]:
    """argparse type: an integer in [``low``, ``high``] (by default up to the int64 range)."""
    def parse(text: str) -> int:
        try:
            value = decimal_int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            wanted = f">= {low}" if high == 2**63 - 1 else f"in [{low}, {high:,}]"
            raise argparse.ArgumentTypeError(f"expected an integer {wanted}, got {text!r}")
        return value

    return parse


def number_in(low: float = -math.inf, high: float = math.inf, low_open: bool = False,
              high_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number in the given interval."""
    def parse(text: str) -> float:
        try:
            value = decimal_float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high)
        if not ok:
            lo, hi = "(" if low_open else "[", ")" if high_open else "]"
            raise argparse.ArgumentTypeError(
                f"expected a number in {lo}{low:g}, {high:g}{hi}, got {text!r}")
        return value

    return parse


def add_stream_arguments(parser: argparse.ArgumentParser, *, batch_size: int) -> None:
    """The dataset and stream options; ``batch_size`` is the command's default micro-batch."""
    data = parser.add_argument_group("dataset")
    data.add_argument("--dataset", required=True, metavar="NAME", help=dataset_help())
    data.add_argument("--data-dir", metavar="DIR",
                      help="where the datasets live (default: $STREAMLEARN_DATA_DIR, "
                           "../shared/datasets, then the user cache)")
    data.add_argument("--fetch", action="store_true",
                      help="download missing built-in data (verified by sha256) into the data dir")
    data.add_argument("--label-column", metavar="COLUMN",
                      help="csv: label column name or 0-based index (default the last)")
    data.add_argument("--categorical", metavar="COLUMNS",
                      help="csv: comma-separated columns to one-hot encode")
    data.add_argument("--delimiter", metavar="CHAR",
                      help="csv: field delimiter, one character or tab, comma, semicolon, "
                           "space, pipe (default ,)")
    data.add_argument("--header", choices=("auto", "yes", "no"), default=None,
                      help="csv: is line 1 a header? auto (default) decides from the data and "
                           "stops when it cannot tell")
    data.add_argument("--missing", choices=("error", "skip", "impute"), default=None,
                      help="csv: a missing value (empty, ?, NA, NaN) stops the load (error, "
                           "default), drops its row (skip) or is filled with the column's mean "
                           "(impute; a row without a label is dropped)")
    stream = parser.add_argument_group("stream")
    length = stream.add_mutually_exclusive_group()
    length.add_argument("--passes", type=int_at_least(1, 1_000_000), metavar="N",
                        help="passes over the data, each reshuffled (default 1)")
    length.add_argument("--rounds", type=int_at_least(1, 1_000_000_000), metavar="N",
                        help="stream length in rounds (synthetic sets generate this many; "
                             "others pass over the data as often as needed)")
    stream.add_argument("--no-shuffle", action="store_true",
                        help="keep the file order (a time-ordered file); passes repeat it")
    stream.add_argument("--standardise", choices=("auto", "yes", "no"), default="auto",
                        help="z-score dense features (auto: as the dataset recommends)")
    stream.add_argument("--batch-size", type=int_at_least(1, 1_000_000), default=batch_size,
                        metavar="B",
                        help=f"micro-batch size (default {batch_size}"
                             f"{' = the exact per-event algorithm' if batch_size == 1 else ''})")
    stream.add_argument("--seed", type=int_at_least(0), default=0, metavar="S",
                        help="seed of the shuffling and the exploration (default 0)")


def add_exploration_arguments(group: Any, unset: str) -> None:
    """``--gamma G`` (fixed γ) or ``--exploration NAME``; neither: ``unset`` (the help says what)."""
    explore = group.add_mutually_exclusive_group()
    explore.add_argument("--gamma", type=number_in(0.0, 0.5, low_open=True), metavar="G",
                         help="fixed exploration rate γ in (0, 0.5]")
    explore.add_argument("--exploration", default=None, metavar="NAME",
                         help=f"one of {sorted([LEARNER_DEFAULT, *STRATEGIES])} ({LEARNER_DEFAULT}: "
                              f"the learner's own, docs/learners.md; the others at their untuned "
                              f"defaults). Neither option: {unset}")


def exploration_from_args(args: argparse.Namespace, unset: Exploration | None) -> Exploration | None:
    """The strategy the options name; ``unset`` when neither was given (``None``: the learner's
    own default exploration)."""
    if args.exploration is None and args.gamma is None:
        return unset
    return exploration_from_name(args.exploration or "fixed", args.gamma)


def loader_options(args: argparse.Namespace) -> dict[str, Any]:
    """The csv options given, as loader options; refused for other datasets."""
    options = {name: getattr(args, name) for name in _CSV_OPTIONS
               if getattr(args, name) is not None}
    if options and not args.dataset.startswith("csv:"):
        given = ", ".join("--" + name.replace("_", "-") for name in options)
        verb = "applies" if len(options) == 1 else "apply"
        raise ConfigError(f"{given} {verb} to csv:PATH datasets only. Got --dataset "
                          f"{args.dataset!r}.")
    return options


def check_dataset_arg(args: argparse.Namespace) -> None:
    """Refuse, before any work, a --dataset that names nothing (with the closest name)."""
    from streamlearn.datasets.catalogue import check_dataset_name

    check_dataset_name(args.dataset)


def prepare_from_args(args: argparse.Namespace, drift: Any = None) -> Any:
    """The stream the options describe (:class:`streamlearn.datasets.stream.PreparedStream`)."""
    from streamlearn.datasets.stream import prepare_stream

    return prepare_stream(
        args.dataset, data_dir=args.data_dir, passes=args.passes or 1, rounds=args.rounds,
        seed=args.seed, shuffle=not args.no_shuffle, standardise_mode=args.standardise,
        drift=drift, fetch=args.fetch, loader_options=loader_options(args))
