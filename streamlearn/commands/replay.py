"""``streamlearn replay``: run a dataset through a learner as a bandit stream and measure it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from streamlearn.commands.readable import value_text
from streamlearn.commands.stream_options import (
    add_exploration_arguments,
    add_stream_arguments,
    check_dataset_arg,
    exploration_from_args,
    int_at_least,
    number_in,
    prepare_from_args,
)
from streamlearn.config import LearnerConfig
from streamlearn.errors import ConfigError
from streamlearn.learners import LEARNERS, make_learner
from streamlearn.plotting import pyplot
from streamlearn.snapshot import check_replaceable

DEFAULT_LEARNER = LearnerConfig().name  # serve's default learner

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "replay", help="replay a dataset through a learner as a bandit stream",
        description="Replay a labelled dataset as a contextual-bandit stream: the learner sees only "
                    "whether its chosen action was right. Reports error, exploit error, regret and "
                    "the full-information Perceptron on the same stream.")
    add_stream_arguments(parser, batch_size=1)
    learner = parser.add_argument_group("learner")
    learner.add_argument("--learner", default=DEFAULT_LEARNER,
                         help=f"one of {sorted(LEARNERS)} (default {DEFAULT_LEARNER}, as serve's)")
    add_exploration_arguments(learner, unset="the learner's own default exploration")
    learner.add_argument("--q", type=number_in(1.0, 1000.0, low_open=True),
                         help="pnorm: the norm exponent (default 2·ln(K·d))")
    learner.add_argument("--eta", type=number_in(0.0, low_open=True), help="eg/pnorm: step")
    learner.add_argument("--lr", type=number_in(0.0, 2.0, low_open=True, high_open=True),
                         help="epsilon-greedy: NLMS step")
    feedback = parser.add_argument_group("feedback")
    feedback.add_argument("--delay", type=number_in(0.0, 1e6), default=0.0,
                          help="mean feedback delay in seconds (exponential), at --rate events/s")
    feedback.add_argument("--rate", type=number_in(0.0, 1e9, low_open=True), default=100.0,
                          help="simulated arrival rate for --delay (default 100 events/s)")
    feedback.add_argument("--drop", type=number_in(0.0, 1.0, high_open=True), default=0.0,
                          help="probability that feedback never arrives (expires to reward 0)")
    feedback.add_argument("--window", type=number_in(0.0, 1e9, low_open=True),
                          help="join window in seconds at --rate, as the daemon's "
                               "join.window_seconds (default ten mean delays, at least one "
                               "event): a decision without feedback expires at its end")
    feedback.add_argument("--drift-at", type=int_at_least(1),
                          help="round at which the concept drifts")
    feedback.add_argument("--drift", choices=("permute", "prior"), default="permute",
                          help="drift kind: label permutation or class-prior shift")
    learner.add_argument("--slots", type=int_at_least(1), default=None,
                         help="candidate-set streams: fill this many slots per request (a slate)")
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
    from streamlearn.datasets.candidates import CANDIDATE_STREAMS
    from streamlearn.datasets.stream import Drift
    from streamlearn.replay import run_with_comparator

    check_dataset_arg(args)
    if args.dataset in CANDIDATE_STREAMS:
        from streamlearn.commands.replay_candidates import replay_candidate_stream

        return replay_candidate_stream(args)
    if args.slots is not None:
        raise ConfigError(f"--slots needs a candidate-set dataset ({', '.join(CANDIDATE_STREAMS)}). "
                          f"Got {args.dataset!r}.")
    if args.learner not in LEARNERS:
        raise ConfigError(f"--learner must be one of {sorted(LEARNERS)}. Got {args.learner!r}.")
    exploration = exploration_from_args(args, unset=None)
    hyper = hyperparameters(args)
    if args.plot:
        check_plot_file("--plot", args.plot)  # fail before the run, not after it
    if args.save:
        check_replaceable(args.save)  # never after the run, and never anything but a snapshot
        check_writable_place("--save", args.save)
    stream = prepare_from_args(
        args, drift=Drift(args.drift_at, args.drift, args.seed) if args.drift_at else None)
    learner = make_learner(args.learner, stream.n_classes, stream.n_features, exploration,
                           seed=args.seed, **hyper)
    result, comparator = run_with_comparator(
        learner, stream, batch_size=args.batch_size, delay_rounds=args.delay * args.rate,
        drop=args.drop, window=None if args.window is None else max(1, round(args.window * args.rate)),
        seed=args.seed, progress=stream.rounds > 50_000)  # stderr: --json keeps stdout
    report = {
        "dataset": args.dataset,
        "learner": args.learner,
        "exploration": learner.exploration.spec(),
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
    """One line per key; the exploration in words, numbers rounded (--json: exact)."""
    width = max(len(k) for k in report)
    for key, value in report.items():
        if isinstance(value, float) and key.endswith(("_rate", "_estimate", "gamma_final")):
            shown = f"{value:.4f}"  # a rate keeps its decimals, 1.0 included
        else:
            shown = f"{value:.2f}" if key == "seconds" else value_text(value)
        print(f"{key:<{width}}  {shown}")


def check_output_file(flag: str, path: str) -> None:
    """Refuse, before any work, a file the command could not write at the end."""
    try:
        problem = "it is a directory" if Path(path).is_dir() else ""
    except OSError as err:
        problem = err.strerror or str(err)
    if problem:
        raise ConfigError(f"{flag} must be a file that can be written. Got {path!r}: {problem}.")
    check_writable_place(flag, path)


def check_writable_place(flag: str, path: str) -> None:
    """Refuse, before any work, a ``path`` whose directory the command could not write in at
    the end (a snapshot directory may itself already exist)."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    try:
        problem = (f"{str(parent)!r} is not an existing directory" if not parent.is_dir() else
                   f"{str(parent)!r} is not writable" if not os.access(parent, os.W_OK) else "")
        if not problem:  # access() says yes to /proc as root: try, as the write at the end will
            probe = parent / f".{target.name}.probe-{os.getpid()}"
            os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
            os.unlink(probe)
    except OSError as err:
        problem = err.strerror or str(err)
    if problem:
        raise ConfigError(f"{flag} must be a file that can be written. Got {path!r}: {problem}.")


def check_plot_file(flag: str, path: str) -> None:
    """Refuse, before any work, a plot file matplotlib could not write (its place, its format)."""
    check_output_file(flag, path)
    plt = pyplot()
    figure = plt.figure()
    formats = figure.canvas.get_supported_filetypes()
    plt.close(figure)
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in formats:
        raise ConfigError(f"{flag} must name a file of an image format matplotlib writes "
                          f"({', '.join(sorted(formats))}). Got {path!r}.")


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
