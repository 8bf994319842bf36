"""LinUCB against Vowpal Wabbit's best explorer, and how much of LinUCB's time is its maths.

For each stream, in one process, on the stream ``streamlearn bench`` builds:

* **VW** — every VW ``--cbify`` explorer, timed as ``streamlearn bench`` times it; the
  reference is the one with the lowest error (``BenchReport.reference``), timed again in
  every repeat;
* **replay** — ``streamlearn-linucb`` as ``streamlearn bench`` runs it: the daemon's engine
  around the learner (the figure the bench reports);
* **learner API** — ``LinUCB.decide`` then ``LinUCB.update`` on each batch (validation, keyed
  randomness, the exploration schedule, the non-finite guard; no engine);
* **posterior alone** — the ridge posterior's ``predict``, the UCB argmax and its ``update``
  over the same batches: the arithmetic LinUCB cannot do without (full A⁻¹ by
  Woodbury when d + 1 ≤ ``full_max_features``, else the diagonal widths and the regression
  oracle's means).

A stream whose *posterior alone* runs below 1× the reference is bound by the maths: no
trimming of the API or the engine brings the replay to VW's speed there (on dense streams
the full posterior costs O(K·D²) per event to VW's O(K·D)). Every figure is a median of
``--repeats`` (the reference's range is printed: it moves more than LinUCB's); compare
within one run. ``--passes`` sets the passes over each dataset (default 1; the stream
bench's table in docs/bench.md runs letter, pendigits and optdigits 5 times, nursery 3).

    python -m simulators.bench_linucb_parts --datasets nursery,optdigits,reuters4
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from simulators.bench import run_bench
from simulators.bench_small_batches import api_seconds
from simulators.peers import VW_EXPLORERS, import_vw
from streamlearn.datasets.stream import prepare_stream
from streamlearn.features import Batch, SparseBatch, take_rows
from streamlearn.learners import make_learner
from streamlearn.learners.linear_posterior import LinUCB

__all__ = ["main", "posterior_seconds"]


def _linucb(n_actions: int, n_features: int) -> LinUCB:
    learner = make_learner("linucb", n_actions, n_features, None, seed=0)
    assert isinstance(learner, LinUCB)
    return learner


def posterior_seconds(learner: LinUCB, X: Batch, y: np.ndarray, batch: int) -> float:
    """The ridge posterior alone: predict, play the UCB argmax, update with 1[action = label]
    (the batches are sliced before the timer)."""
    posterior, alpha = learner.posterior_, learner.alpha
    batches = [(take_rows(X, np.arange(lo, min(lo + batch, len(y)))), y[lo:lo + batch])
               for lo in range(0, len(y), batch)]
    started = time.perf_counter()
    for xb, yb in batches:
        means, widths = posterior.predict(xb)
        actions = np.argmax(means + alpha * widths, axis=1)
        posterior.update(xb, actions, (actions == yb).astype(np.float64))
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--datasets", default="nursery,synnonsep,pendigits,optdigits,reuters4,"
                                               "letter,mnist", help="comma-separated bench streams")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3,
                        help="every timing (the VW reference's too): median of this many")
    parser.add_argument("--passes", type=int, default=1, help="passes over each dataset")
    args = parser.parse_args(argv)
    if args.repeats < 1:  # the medians need a timing (prepare_stream checks --passes)
        parser.error(f"--repeats must be an int >= 1. Got {args.repeats}.")
    if import_vw() is None:
        print("error: vowpalwabbit is not installed (pip install 'streamlearn[bench]')",
              file=sys.stderr)
        return 1
    print(f"LinUCB at batch {args.batch_size} against the best VW explorer (lowest error); "
          f"events/s, each the median of {args.repeats} (the VW reference timed again in each "
          f"repeat, beside LinUCB's three)", flush=True)
    for dataset in args.datasets.split(","):
        stream = prepare_stream(dataset, seed=0, passes=args.passes)
        report = run_bench(stream, batch_size=args.batch_size, systems=list(VW_EXPLORERS))
        reference = report.reference()  # the lowest error: the same explorer in every repeat
        if reference is None:
            print(f"{dataset}: no VW explorer ran", flush=True)
            continue
        vw = reference[0]
        X, y = stream.materialise()
        if not isinstance(X, SparseBatch):
            X = np.asarray(X, dtype=np.float64)
        K, d, n = stream.n_classes, stream.n_features, len(y)
        rates: dict[str, list[float]] = {"replay": [], "learner API": [], "posterior alone": []}
        vw_rates: list[float] = []
        for _ in range(args.repeats):
            # one VW timing moved the ratios by up to 2× (an outside test: vw-bag on nursery
            # at 95,564 and 155,901 events/s in two runs), so it is repeated like LinUCB's
            timed = run_bench(stream, batch_size=args.batch_size, systems=[vw.system])
            vw_rates.append(float(timed.results[0].events_per_second or 0.0))
            replayed = run_bench(stream, batch_size=args.batch_size, systems=["streamlearn-linucb"])
            rates["replay"].append(float(replayed.results[0].events_per_second or 0.0))
            rates["learner API"].append(n / api_seconds(_linucb(K, d), X, y, args.batch_size))
            rates["posterior alone"].append(
                n / posterior_seconds(_linucb(K, d), X, y, args.batch_size))
        vw_rate = float(np.median(vw_rates))
        mode = "full A⁻¹" if _linucb(K, d).posterior_.full else "diagonal"
        parts = ", ".join(f"{name} {np.median(r):,.0f} ({np.median(r) / vw_rate:.2f}×)"
                          for name, r in rates.items())
        bound = np.median(rates["posterior alone"]) < vw_rate
        print(f"{dataset} ({n:,} rounds, K = {K}, d = {d - 1}, {mode}): {vw.system} "
              f"{vw_rate:,.0f} events/s ({min(vw_rates):,.0f}–{max(vw_rates):,.0f}; error "
              f"{vw.error_rate:.4f}); LinUCB {parts}"
              f"{'; the maths alone is slower than VW' if bound else ''}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
