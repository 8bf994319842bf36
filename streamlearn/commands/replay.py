"""``streamlearn replay``: run a dataset through a learner as a bandit stream and measure it."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import orjson

from streamlearn.errors import ConfigError
from streamlearn.learners import LEARNERS, make_learner
from streamlearn.learners.exploration import STRATEGIES, exploration_from_name
from streamlearn.plotting import pyplot

__all__ = ["add_parser", "run"]


def _positive_int(option: str) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 1:
            raise argparse.ArgumentTypeError(f"{option} expects an integer >= 1, got {text!r}")
        return value

    return parse


def _number(option: str, low: float = -math.inf, high: float = math.inf,
            low_open: bool = False, high_open: bool = False) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high)
        if not ok:
            lo, hi = "(" if low_open else "[", ")" if high_open else "]"
            bounds = f"{lo}{low:g}, {high:g}{hi}"
            raise argparse.ArgumentTypeError(f"{option} expects a number in {bounds}, got {text!r}")
        return value

    return parse


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by replay and bench: which stream, how long, how prepared."""
    group = parser.add_argument_group("stream")
    group.add_argument("--dataset", required=True,
                       help="synnonsep, synsep, letter, pendigits, optdigits, nursery, mnist, "
                            "reuters4, csv:PATH or libsvm:PATH")
    group.add_argument("--data-dir", help="where the datasets live (default: $STREAMLEARN_DATA_DIR, "
                                          "../shared/datasets, then the user cache)")
    group.add_argument("--fetch", action="store_true",
                       help="download missing built-in data (verified by sha256) into the data dir")
    group.add_argument("--label-column", help="csv: label column name or 0-based index (default last)")
    group.add_argument("--categorical", help="csv: comma-separated columns to one-hot encode")
    length = group.add_mutually_exclusive_group()
    length.add_argument("--passes", type=_positive_int("--passes"), default=None,
                        help="passes over the data, each reshuffled (default 1)")
    length.add_argument("--rounds", type=_positive_int("--rounds"), default=None,
                        help="stream length in rounds (synthetic sets generate this many)")
    group.add_argument("--batch-size", type=_positive_int("--batch-size"), default=1,
                       help="micro-batch size (default 1 = the exact per-event algorithm)")
    group.add_argument("--standardise", choices=("auto", "yes", "no"), default="auto",
                       help="z-score dense features (auto: as the dataset recommends)")
    group.add_argument("--no-shuffle", action="store_true", help="keep the file order")
    group.add_argument("--seed", type=int, default=0, help="seed of shuffling and exploration")


def loader_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.label_column is not None:
        options["label_column"] = args.label_column
    if args.categorical is not None:
        options["categorical"] = args.categorical
    if (options and not args.dataset.startswith("csv:")):
        raise ConfigError(f"--label-column/--categorical apply to csv:PATH datasets only. "
                          f"Got --dataset {args.dataset!r}.")
    return options


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "replay", help="replay a dataset through a learner as a bandit stream",
        description="Replay a labelled dataset as a contextual-bandit stream: the learner sees only "
                    "whether its chosen action was right. Reports error, exploit error, regret and "
                    "the full-information Perceptron on the same stream.")
    add_dataset_arguments(parser)
    learner = parser.add_argument_group("learner")
    learner.add_argument("--learner", default="banditron", help=f"one of {sorted(LEARNERS)}")
    explore = learner.add_mutually_exclusive_group()
    explore.add_argument("--gamma", type=_number("--gamma", 0.0, 0.5, low_open=True),
                         help="fixed exploration rate γ in (0, 0.5]")
    explore.add_argument("--exploration", default=None,
                         help=f"one of {sorted(STRATEGIES)} (untuned defaults)")
    learner.add_argument("--q", type=_number("--q", 1.0, 1000.0, low_open=True),
                         help="pnorm: the norm exponent (default 2·ln(K·d))")
    learner.add_argument("--eta", type=_number("--eta", 0.0, low_open=True), help="eg/pnorm: step")
    learner.add_argument("--lr", type=_number("--lr", 0.0, 2.0, low_open=True, high_open=True),
                         help="epsilon-greedy: NLMS step")
    feedback = parser.add_argument_group("feedback")
    feedback.add_argument("--delay", type=_number("--delay", 0.0), default=0.0,
                          help="mean feedback delay in seconds (exponential), at --rate events/s")
    feedback.add_argument("--rate", type=_number("--rate", 0.0, low_open=True), default=100.0,
                          help="simulated arrival rate for --delay (default 100 events/s)")
    feedback.add_argument("--drop", type=_number("--drop", 0.0, 1.0, high_open=True), default=0.0,
                          help="probability that feedback never arrives (expires to reward 0)")
    feedback.add_argument("--drift-at", type=_positive_int("--drift-at"),
                          help="round at which the concept drifts")
    feedback.add_argument("--drift", choices=("permute", "prior"), default="permute",
                          help="drift kind: label permutation or class-prior shift")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print one JSON object")
    out.add_argument("--plot", metavar="FILE.png", help="error rate vs rounds (needs the plot extra)")
    out.add_argument("--save", metavar="DIR", help="save the learner's final state to DIR")
    parser.set_defaults(run=run)


def hyperparameters(args: argparse.Namespace) -> dict[str, float]:
    names = {"pnorm": ("q", "eta"), "eg": ("eta",), "epsilon-greedy": ("lr",)}.get(args.learner, ())
    given = {k: getattr(args, k) for k in ("q", "eta", "lr") if getattr(args, k) is not None}
    wrong = sorted(set(given) - set(names))
    if wrong:
        raise ConfigError(f"--{wrong[0]} does not apply to --learner {args.learner}; "
                          f"it takes {['--' + n for n in names] or 'no hyperparameter'}.")
    return given


def run(args: argparse.Namespace) -> int:
    from simulators.experiment import prepare_stream, run_with_comparator
    from simulators.replay import Drift

    if args.learner not in LEARNERS:
        raise ConfigError(f"--learner must be one of {sorted(LEARNERS)}. Got {args.learner!r}.")
    exploration = exploration_from_name(args.exploration or "fixed", args.gamma)
    hyper = hyperparameters(args)
    if args.plot:
        pyplot()  # fail before the run, not after it
    stream = prepare_stream(
        args.dataset, data_dir=args.data_dir, passes=args.passes or 1, rounds=args.rounds,
        seed=args.seed, shuffle=not args.no_shuffle, standardise_mode=args.standardise,
        drift=Drift(args.drift_at, args.drift, args.seed) if args.drift_at else None,
        fetch=args.fetch, loader_options=loader_options(args))
    learner = make_learner(args.learner, stream.n_classes, stream.n_features, exploration,
                           seed=args.seed, **hyper)
    result, comparator = run_with_comparator(
        learner, stream, batch_size=args.batch_size, delay_rounds=args.delay * args.rate,
        drop=args.drop, seed=args.seed, progress=not args.json and stream.rounds > 50_000)
    report = {
        "dataset": args.dataset,
        "learner": args.learner,
        "exploration": exploration.spec(),
        "rounds": result.rounds,
        "passes": stream.passes,
        "batch_size": args.batch_size,
        "standardised": stream.standardised,
        "error_rate": result.error_rate,
        "exploit_error_rate": result.exploit_error_rate,
        "window_error_rate": result.window_error_rate,
        "exploit_error_estimate": result.exploit_error_estimate,
        "regret_vs_oracle": result.regret_vs_oracle,
        "comparator": "perceptron (full information)",
        "comparator_error_rate": comparator.exploit_error_rate,
        "regret_vs_comparator": result.regret_vs_oracle - comparator.exploit_error_rate * result.rounds,
        "gamma_final": result.gamma_final,
        "feedback_applied": result.feedback_applied,
        "feedback_dropped": result.feedback_dropped,
        "events_per_second": result.events_per_second,
        "seconds": result.seconds,
    }
    if args.save:
        from streamlearn.learners import save_learner

        save_learner(learner, args.save)
    if args.plot:
        plot_curves(args.plot, f"{args.learner} on {args.dataset}",
                    {args.learner: result.curve, "perceptron (full info)": comparator.curve})
    if args.json:
        sys.stdout.write(orjson.dumps(report).decode() + "\n")
    else:
        print_table(report)
    return 0


def print_table(report: dict[str, Any]) -> None:
    width = max(len(k) for k in report)
    for key, value in report.items():
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")


def plot_curves(path: str, title: str, curves: dict[str, list[tuple[int, float]]]) -> None:
    """Cumulative error rate vs rounds (log x), one line per run."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, curve in curves.items():
        if curve:
            xs, ys = zip(*curve, strict=True)
            ax.plot(xs, ys, label=label)
    ax.set_xscale("log")
    ax.set_xlabel("rounds")
    ax.set_ylabel("cumulative error rate")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot written to {path}", file=sys.stderr)
