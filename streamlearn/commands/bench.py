"""``streamlearn bench``: learners and peers (per-event Python loop, Vowpal Wabbit) on one stream.

Every system sees the same stream (same order, same passes) and is scored the
same way: events per second and the fraction of rounds whose played action was
wrong. The table's ratio column is streamlearn-banditron's events/s divided by
each system's. The harness is :mod:`simulators.bench`; see docs/bench.md for
what each system's timer covers. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import orjson

from simulators.bench import DEFAULT_SYSTEMS, parse_systems, run_bench
from streamlearn.errors import ConfigError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="compare learners, a per-event Python loop and Vowpal Wabbit on one stream",
        description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dataset", required=True, metavar="NAME",
                        help="letter, mnist, synnonsep, ..., csv:PATH or libsvm:PATH")
    parser.add_argument("--data-dir", metavar="DIR", default=None, help="where the data files are")
    stream = parser.add_mutually_exclusive_group()
    stream.add_argument("--passes", metavar="N", default=None,
                        help="passes over the data, each reshuffled (default 1)")
    stream.add_argument("--rounds", metavar="N", default=None,
                        help="stream length in events (passes as needed)")
    parser.add_argument("--batch-size", metavar="B", default="64",
                        help="micro-batch size of the vectorised learners (default 64)")
    parser.add_argument("--gamma", metavar="G", default="0.05",
                        help="fixed exploration rate of the Banditron-family learners, in (0, 0.5] "
                             "(default 0.05); the other learners use their own defaults")
    parser.add_argument("--systems", metavar="LIST", default=",".join(DEFAULT_SYSTEMS),
                        help="comma-separated systems or groups (all, streamlearn, vw); default all")
    parser.add_argument("--seed", metavar="S", default="0", help="stream order and exploration seed")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(run=run)


def _int(option: str, text: object, low: int) -> int:
    try:
        value = int(str(text))
    except ValueError:
        value = None
    if value is None or value < low:
        raise ConfigError(f"{option} must be an int >= {low}. Got {text!r} instead.")
    return value


def _gamma(text: object) -> float:
    try:
        value = float(str(text))
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0.0 < value <= 0.5):
        raise ConfigError(f"--gamma must be a float in (0, 0.5]. Got {text!r} instead.")
    return value


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    passes = None if args.passes is None else _int("--passes", args.passes, 1)
    rounds = None if args.rounds is None else _int("--rounds", args.rounds, 1)
    batch_size = _int("--batch-size", args.batch_size, 1)
    gamma = _gamma(args.gamma)
    seed = _int("--seed", args.seed, 0)
    systems = parse_systems(args.systems)
    report = run_bench(args.dataset, args.data_dir, passes=passes, rounds=rounds,
                       batch_size=batch_size, gamma=gamma, systems=systems, seed=seed, progress=_say)
    if args.json:
        sys.stdout.write(orjson.dumps(report.to_json(), option=orjson.OPT_SERIALIZE_NUMPY).decode()
                         + "\n")
    else:
        stream = f"{report.passes} pass(es)" if report.passes else "--rounds"
        print(f"{report.dataset}: {report.rounds:,} rounds ({stream}), {report.n_classes} classes, "
              f"{report.n_features} features{' (standardised)' if report.standardised else ''}, "
              f"gamma {report.gamma:g}, seed {report.seed}\n")
        print(report.to_markdown())
    return 0
