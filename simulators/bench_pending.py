"""The feedback join at its bound: a step's cost with many decisions pending, against another commit.

A daemon whose callers answer few decisions (an ad server: most impressions get no click)
holds its join full: either at ``join.max_pending`` (the oldest shed at every step) or,
below it, a window's worth of decisions (the oldest expiring at every step). Two regimes,
each on a store of ``--pending`` decisions made 2 ms apart (1,000 a second of event time):

* **shed**: ``max_pending`` = ``--pending``, no expiry: every step sheds what it adds;
* **expire**: the window is the store's span (``--pending`` × 2 ms), the bound ten times
  the store: every step expires the decisions its clock passes.

A step is what the daemon's join does at ordinary load: 2 new decisions (40 features,
30 % nonzero, 9 actions), feedback for one of the last 1,000 decisions with probability
``--answered`` × 2 (each decision answered with that probability; the rest wait), the
feedback clock moved 2 ms, ``advance``, ``drain``. The answered decisions' slots are
reused by later ones, so slot order is not time order, as in a daemon. Printed:
µs per step, median of ``--repeats`` fresh processes per checkout and regime, the
checkouts alternating (``--compare-with DIR``: a checkout of another commit, measured the
same way, A B A B), and this checkout ÷ the other.

Usage::

    python -m simulators.bench_pending [--pending 200000] [--steps 3000] [--repeats 3]
        [--answered 0.05] [--compare-with /tmp/old]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

K, D = 9, 40
STEP_S = 0.002  # event time between two steps' decisions (1,000 decisions a second)
PER_STEP = 2
REGIMES = ("shed", "expire")


def step_cost(pending: int, steps: int, regime: str, answered: float) -> float:
    """µs per step of the join of this process's checkout (see the module docstring)."""
    from streamlearn.join.pending import JoinSettings, PendingJoins

    span = pending / PER_STEP * STEP_S
    settings = (JoinSettings(window_s=1e9, max_pending=pending, early_window_s=0.0)
                if regime == "shed" else
                JoinSettings(window_s=span, max_pending=10 * pending, early_window_s=0.0))
    joins = PendingJoins(K, D, settings)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(PER_STEP, D)) * (rng.random((PER_STEP, D)) < 0.3)
    probs = np.full((PER_STEP, K), 1 / K)
    actions, labels = np.zeros(PER_STEP, np.int64), np.full(PER_STEP, -1)
    partitions, zero = np.zeros(PER_STEP, np.int64), np.zeros(1, np.int64)
    one = np.zeros(1, np.int64)
    made = 0

    def add(t: float) -> None:
        nonlocal made
        ids = [f"e{made + i}" for i in range(PER_STEP)]
        made += PER_STEP
        joins.add_decisions(ids, X, actions, probs, labels, np.full(PER_STEP, t), partitions,
                            wall=t)
        if rng.random() < answered * PER_STEP:
            answer = f"e{made - 1 - int(rng.integers(min(made, 1000)))}"
            joins.add_feedback([answer], np.ones(1), np.array([t]), one, wall=t)

    t = 0.0
    while len(joins) < pending:  # filled as a daemon fills it, untimed
        add(t)
        t += STEP_S
    joins.clocks.observe("feedback", zero, np.array([t]))
    joins.advance(wall=t)
    joins.drain()
    started = time.perf_counter()
    for _ in range(steps):
        t += STEP_S
        add(t)
        joins.clocks.observe("feedback", zero, np.array([t]))
        joins.advance(wall=t)
        joins.drain()
    return (time.perf_counter() - started) / steps * 1e6


THIS_CHECKOUT = str(Path(__file__).resolve().parents[1])


def _measured(directory: str, pending: int, steps: int, regime: str, answered: float) -> float:
    """:func:`step_cost` in a fresh process on ``directory``'s code."""
    env = {**os.environ, "PYTHONPATH": directory, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, __file__, "--pending", str(pending), "--steps",
                           str(steps), "--answered", str(answered), "--only", regime],
                          capture_output=True, text=True,
                          env=env, check=True, cwd=directory)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["us_per_step"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pending", type=int, default=200_000)
    parser.add_argument("--steps", type=int, default=3_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--answered", type=float, default=0.05,
                        help="the fraction of decisions answered with feedback (default 0.05)")
    parser.add_argument("--compare-with", metavar="DIR",
                        help="a checkout of another commit to measure the same steps on")
    parser.add_argument("--only", choices=REGIMES, help=argparse.SUPPRESS)  # one measuring process
    args = parser.parse_args(argv)
    for name in ("pending", "steps", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"argument --{name}: expected an integer >= 1, got {getattr(args, name)}")
    if not 0.0 <= args.answered <= 0.5:
        parser.error(f"argument --answered: expected a fraction in [0, 0.5], got {args.answered}")
    if args.only:
        print(json.dumps({"us_per_step": step_cost(args.pending, args.steps, args.only,
                                                   args.answered)}))
        return 0
    checkouts = {"this checkout": THIS_CHECKOUT}
    if args.compare_with:
        checkouts["--compare-with"] = args.compare_with
    cost: dict[tuple[str, str], list[float]] = {(r, c): [] for r in REGIMES for c in checkouts}
    for repeat in range(args.repeats):
        for regime in REGIMES:
            for label, directory in checkouts.items():
                cost[regime, label].append(_measured(directory, args.pending, args.steps, regime,
                                                     args.answered))
            print(f"repeat {repeat + 1}/{args.repeats}, {regime}: " + ", ".join(
                f"{label} {cost[regime, label][-1]:,.0f} µs" for label in checkouts),
                file=sys.stderr, flush=True)
    print(f"{args.pending:,} decisions pending, {args.answered:.0%} answered; µs per step "
          f"(2 decisions added, advance, drain), median of {args.repeats}")
    for regime in REGIMES:
        medians = {label: float(np.median(cost[regime, label])) for label in checkouts}
        line = f"{regime:<8}" + "".join(f"  {label} {v:,.0f}" for label, v in medians.items())
        if args.compare_with:
            line += (f"  (this checkout ÷ --compare-with: "
                     f"{medians['this checkout'] / medians['--compare-with']:.2f})")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
