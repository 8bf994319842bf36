"""Where a small micro-batch's time goes: the engine, the learner's own API, the bare loop.

The same Banditron (fixed γ) over the same stream three ways, per event:

* **replay** — :func:`streamlearn.replay.replay` at ``--batch-sizes`` (what
  ``streamlearn bench``'s ``streamlearn-banditron-b1`` row times): the daemon's engine
  (pending joins, decision columns, the join clock, error tracking) around the learner;
* **learner alone** — ``Learner.decide`` then ``Learner.update`` on each batch, keyed by
  the round numbers as the replay keys them (the public API with its validation, keyed
  randomness and non-finite guard, no engine);
* **bare loop** — :func:`simulators.peers.python_loop_banditron`, one event at a time with
  the same randomness and arithmetic and none of the contracts (batch 1 only).

At batch 1 the three end with identical weights, which the script checks, so the
difference in time is the cost of the layers and nothing else. Timings are medians of
``--repeats`` runs in this process; compare them within one run.

    python -m simulators.bench_small_batches --dataset letter --batch-sizes 1,8
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from simulators.peers import python_loop_banditron
from streamlearn.datasets.stream import prepare_stream
from streamlearn.features import Batch, batch_size, take_rows
from streamlearn.learners import make_learner
from streamlearn.learners.base import Learner
from streamlearn.learners.exploration import FixedGamma
from streamlearn.replay import replay

__all__ = ["api_seconds", "main"]


def _learner(n_classes: int, n_features: int, gamma: float) -> Learner:
    return make_learner("banditron", n_classes, n_features, FixedGamma(gamma), seed=0)


def api_seconds(learner: Learner, X: Batch, y: np.ndarray, batch: int) -> float:
    """decide, then update with the reward 1[action = label], a batch at a time, keyed by the
    round numbers as the replay keys them (the batches are sliced before the timer)."""
    batches = [(take_rows(X, np.arange(lo, min(lo + batch, len(y)))), lo)
               for lo in range(0, len(y), batch)]
    started = time.perf_counter()
    for xb, lo in batches:
        keys = np.arange(lo, lo + batch_size(xb))
        actions, probs = learner.decide(xb, keys=keys)
        learner.update(xb, actions, (actions == y[keys]).astype(np.float64), probs)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dataset", default="letter")
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--gamma", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    stream = prepare_stream(args.dataset, seed=0, passes=1)
    X_all, y_all = stream.materialise()
    n = min(args.rounds, len(y_all))
    X = np.asarray(take_rows(X_all, np.arange(n)), dtype=np.float64)
    y = y_all[:n]
    K, d = stream.n_classes, stream.n_features
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    print(f"{args.dataset}: {n:,} rounds, {K} actions, {d} features (with the bias); "
          f"Banditron, γ = {args.gamma}; µs per event, median of {args.repeats}", flush=True)
    loop = float(np.median([python_loop_banditron(X, y, K, args.gamma, 0).seconds
                            for _ in range(args.repeats)])) / n
    for batch in sizes:
        engine_s, api_s = [], []
        for _ in range(args.repeats):
            in_engine, alone = _learner(K, d, args.gamma), _learner(K, d, args.gamma)
            engine_s.append(replay(in_engine, X, y, batch_size=batch).seconds)
            api_s.append(api_seconds(alone, X, y, batch))
            if batch == 1:
                bare = python_loop_banditron(X, y, K, args.gamma, 0).weights
                weights = [learner.state()[0]["learner.weights"] for learner in (in_engine, alone)]
                if bare is None or not (np.array_equal(weights[0], weights[1])
                                        and np.array_equal(weights[1], bare)):
                    print("error: the three runs ended with different weights", file=sys.stderr)
                    return 1
        engine, api = float(np.median(engine_s)) / n, float(np.median(api_s)) / n
        print(f"batch {batch}: replay {engine * 1e6:.1f}, learner alone {api * 1e6:.1f}, "
              f"bare loop {loop * 1e6:.1f} (the loop decides one event at a time); "
              f"replay ÷ loop {engine / loop:.1f}×, learner alone ÷ loop {api / loop:.1f}×, "
              f"engine's share of the replay {100 * (engine - api) / engine:.0f} %", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
