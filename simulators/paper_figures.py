"""Reproduce the Banditron paper's SynNonSep figures: Perceptron ≈ 10 %, Banditron(γ=0.006) ≈ 13 %.

10⁶ rounds per run (fresh examples, no repetition), batch size 1 (the exact
per-event algorithm), several seeds (each seed draws its own topic vectors and
stream). Prints one JSON line per run and a summary (mean ± std over seeds).

    python -m simulators.paper_figures --rounds 1000000 --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import orjson

from streamlearn.datasets.synthetic import N_CLASSES, N_FEATURES, synthetic_stream
from streamlearn.learners import Banditron, FixedGamma, Perceptron
from streamlearn.replay import replay, stderr_progress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=1_000_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--gamma", type=float, default=0.006)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--noise", type=float, default=0.05, help="0.05 = SynNonSep, 0 = SynSep")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="with --from: draw mean error vs rounds of a finished run's JSON lines")
    parser.add_argument("--from", dest="source", metavar="RUNS.jsonl")
    args = parser.parse_args(argv)
    if args.source:
        return plot_from(args.source, args.plot)
    errors: dict[str, list[float]] = {"perceptron": [], "banditron": []}
    for seed in args.seeds:
        X, y = synthetic_stream(args.rounds, noise=args.noise, seed=seed)
        # the 1.6 GB float32 stream is cast per batch inside replay; no float64 copy here
        for name, learner in (
            ("perceptron", Perceptron(N_CLASSES, N_FEATURES, seed=seed)),
            ("banditron", Banditron(N_CLASSES, N_FEATURES, FixedGamma(args.gamma), seed=seed)),
        ):
            start = time.perf_counter()
            result = replay(learner, X, y, batch_size=args.batch_size, seed=seed,
                            progress=stderr_progress(f"{name} seed {seed}"))
            error = result.exploit_error_rate if learner.full_information else result.error_rate
            errors[name].append(error)
            print(orjson.dumps({"seed": seed, "learner": name, "gamma": args.gamma,
                                "rounds": args.rounds, "batch_size": args.batch_size,
                                "error_rate": error, "curve": result.curve,
                                "seconds": time.perf_counter() - start}).decode(), flush=True)
        del X, y
    for name, values in errors.items():
        print(f"# {name}: mean error {np.mean(values):.4f} ± {np.std(values):.4f} over "
              f"{len(values)} seeds", flush=True)
    return 0


def plot_from(source: str, path: str | None) -> int:
    """Summarise (and optionally plot) the JSON lines of an earlier run."""
    from streamlearn.commands.replay import plot_curves

    with open(source, encoding="utf-8") as fh:
        runs = [orjson.loads(line) for line in fh if line.startswith("{")]
    curves: dict[str, list[tuple[int, float]]] = {}
    for name in sorted({r["learner"] for r in runs}):
        mine = [r for r in runs if r["learner"] == name]
        errors = [r["error_rate"] for r in mine]
        print(f"{name}: mean error {np.mean(errors):.4f} ± {np.std(errors):.4f} over {len(mine)} "
              f"seeds ({', '.join(f'{e:.4f}' for e in errors)})")
        points = np.array([[x for x, _ in r["curve"]] for r in mine])
        values = np.array([[y for _, y in r["curve"]] for r in mine]).mean(axis=0)
        curves[f"{name} (mean of {len(mine)} seeds)"] = list(zip(points[0].tolist(),
                                                                 values.tolist(), strict=True))
    if path:
        plot_curves(path, "SynNonSep, 10⁶ rounds, batch size 1", curves)
    return 0


if __name__ == "__main__":
    sys.exit(main())
