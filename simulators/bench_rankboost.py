"""Scale benchmark of RankBoost.B: time per round against the number of rows.

Synthetic bipartite data (n rows × d Gaussian features, label = sign of a
noisy linear score), ``RankBoost(n_rounds, max_bins=256)`` without qid. The
one-off work (binning every feature: a sort per feature) is timed apart from
the rounds (``RankBoost.timings_``); a round is one O(n) pair-potential pass plus one ``bincount`` per
feature, so seconds per round should grow linearly with n.

Usage::

    python -m simulators.bench_rankboost --sizes 10000,100000,1000000 --features 50 --rounds 100
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from streamlearn.rankers.metrics import auc
from streamlearn.rankers.rankboost import RankBoost

__all__ = ["bench", "main"]


def bench(n: int, d: int, rounds: int, seed: int = 0) -> dict[str, float]:
    """Fit RankBoost.B on synthetic data; returns timings and training AUC."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    w = rng.normal(size=d)
    y = (X @ w + 2.0 * rng.normal(size=n) > 0).astype(np.float64)
    t0 = time.perf_counter()
    model = RankBoost(n_rounds=rounds, max_bins=256).fit(X, y)
    total = time.perf_counter() - t0
    t = model.timings_
    done = max(len(model.alphas_), 1)
    per_round_cpu = t["rounds_cpu_s"] / done
    return {
        "n": n, "d": d, "rounds": len(model.alphas_), "fit_s": total,
        "binning_s": t["binning_s"], "per_round_s": t["rounds_s"] / done,
        "binning_cpu_s": t["binning_cpu_s"], "per_round_cpu_s": per_round_cpu,
        "cpu_ns_per_row_feature_round": 1e9 * per_round_cpu / (n * d),
        "train_auc": float(auc(y, model.score(X))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--features", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [bench(int(n), args.features, args.rounds) for n in args.sizes.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"# {platform.processor() or platform.machine()}, numpy {np.__version__}, "
          f"python {platform.python_version()}")
    print("# wall = elapsed seconds; cpu = this process's CPU seconds (the machine may be shared)")
    print(f"{'n':>9} {'d':>4} {'rounds':>6} {'fit wall s':>10} {'binning wall/cpu s':>19} "
          f"{'round wall/cpu s':>17} {'cpu ns/(row*feat*round)':>24} {'train AUC':>9}")
    for r in rows:
        print(f"{r['n']:>9} {r['d']:>4} {r['rounds']:>6} {r['fit_s']:>10.2f} "
              f"{r['binning_s']:>9.2f}/{r['binning_cpu_s']:<9.2f} "
              f"{r['per_round_s']:>8.4f}/{r['per_round_cpu_s']:<8.4f} "
              f"{r['cpu_ns_per_row_feature_round']:>24.2f} {r['train_auc']:>9.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
