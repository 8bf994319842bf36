"""``streamlearn bench``: learners and peers (per-event Python loop, Vowpal Wabbit) on one stream.

Every system sees the same stream (same order, same passes) and is scored the
same way: events per second and the fraction of rounds whose played action was
wrong. The table relates every row to the VW row with the lowest error (or, when no
VW row ran, the row with the lowest error): its events/s ÷ that row's, and its error
rate − that row's. The harness is :mod:`simulators.bench`; see docs/bench.md for
what each system's timer covers. Progress goes to stderr.

The dataset and stream options are those of ``streamlearn replay`` (one
parser, streamlearn.commands.stream_options): a csv:PATH file with
--label-column, --delimiter, --header, a time-ordered file with --no-shuffle,
--standardise, and --gamma or --exploration for the streamlearn learners
(the per-event loop needs a fixed --gamma; VW uses its own explorers).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from simulators.bench import DEFAULT_SYSTEMS, SYSTEMS, parse_systems, run_bench
from streamlearn.commands.stream_options import (
    add_exploration_arguments,
    add_stream_arguments,
    check_dataset_arg,
    exploration_from_args,
    prepare_from_args,
)
from streamlearn.errors import ConfigError
from streamlearn.learners import FixedGamma

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="compare learners, a per-event Python loop and Vowpal Wabbit on one stream",
        description=(__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_stream_arguments(parser, batch_size=64)
    systems = parser.add_argument_group("systems")
    add_exploration_arguments(systems, unset="the Banditron family at a fixed γ = 0.05 (vw-epsilon's ε), "
                                      "every other learner at its own default")
    systems.add_argument("--systems", metavar="LIST", default=",".join(DEFAULT_SYSTEMS),
                         help="comma-separated systems or groups (all, streamlearn, vw); "
                              f"default all. Systems: {', '.join(SYSTEMS)}")
    systems.add_argument("--json", action="store_true",
                         help="print one JSON object instead of a table")
    parser.set_defaults(run=run)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from streamlearn.datasets.candidates import CANDIDATE_STREAMS

    check_dataset_arg(args)
    if args.dataset in CANDIDATE_STREAMS:  # candidate sets: their learners against VW's ADF
        from simulators import bench_candidates

        # every candidate system runs at its own defaults: options for the fixed-action systems
        # were ignored without a word (an outside test: --systems nosuch ran all twelve)
        ignored = [f"--{name.replace('_', '-')}" for name, given in (
            ("systems", args.systems != ",".join(DEFAULT_SYSTEMS)), ("gamma", args.gamma),
            ("exploration", args.exploration), ("no_shuffle", args.no_shuffle),
            ("standardise", args.standardise != "auto")) if given]
        if ignored:
            raise ConfigError(f"bench on a candidate-set stream runs every candidate system at "
                              f"its defaults, so it takes no {', '.join(ignored)}. Got "
                              f"{', '.join(ignored)} with --dataset {args.dataset}.")

        argv = ["--dataset", args.dataset, "--passes", str(args.passes or 1), "--seed",
                str(args.seed if args.seed is not None else 0), "--batch-size", str(args.batch_size)]
        if args.rounds is not None:
            argv += ["--requests", str(args.rounds)]
        if args.data_dir is not None:
            argv += ["--data-dir", args.data_dir]
        if args.fetch:
            argv.append("--fetch")
        return bench_candidates.main(argv + (["--json"] if args.json else []))
    systems = parse_systems(args.systems)
    exploration = exploration_from_args(args, unset=FixedGamma(0.05))
    stream = prepare_from_args(args)
    report = run_bench(stream, batch_size=args.batch_size, exploration=exploration,
                       systems=systems, seed=args.seed, progress=_say)
    if args.json:
        sys.stdout.write(orjson.dumps(report.to_json(), option=orjson.OPT_SERIALIZE_NUMPY).decode()
                         + "\n")
    else:
        explore = (f"gamma {report.gamma:g}" if report.gamma is not None
                   else f"exploration {report.exploration['name']}")
        print(f"{report.dataset}: {report.rounds:,} rounds ({report.passes} pass(es)), "
              f"{report.n_classes} classes, {report.n_features} features"
              f"{' (standardised)' if report.standardised else ''}, {explore}, seed {report.seed}\n")
        print(report.to_markdown())
    return 0
