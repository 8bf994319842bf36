"""The results table of docs/results.md: every learner and exploration strategy on every dataset.

Runs the grid for the given datasets and seeds, one JSON line per run, then
(``--markdown FILE``) formats the mean error per configuration as tables.

    python -m simulators.results_table run --datasets letter --seeds 0 1 2 >> runs.jsonl
    python -m simulators.results_table markdown runs.jsonl
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

from streamlearn.datasets.stream import prepare_stream
from streamlearn.learners import make_learner
from streamlearn.learners.exploration import (
    Adaptive,
    CubeRootSchedule,
    Exploration,
    FixedGamma,
    MarginAware,
    SqrtSchedule,
)
from streamlearn.replay import replay

GAMMAS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
#: dataset → passes over it (synthetic sets: rounds of fresh examples instead)
PROTOCOL: dict[str, dict[str, Any]] = {
    "synnonsep": {"rounds": 100_000},
    "letter": {"passes": 5},
    "pendigits": {"passes": 5},
    "optdigits": {"passes": 10},
    "nursery": {"passes": 5},
    "mnist": {"passes": 3},
    "reuters4": {"passes": 5},
}


def configurations(batch_size: int) -> Iterator[tuple[str, str, dict[str, Any], Exploration, int]]:
    """(row label, learner, hyperparameters, exploration, batch size) of the grid."""
    yield "perceptron (full info)", "perceptron", {}, FixedGamma(0.05), batch_size
    for gamma in GAMMAS:
        yield f"banditron γ={gamma}", "banditron", {}, FixedGamma(gamma), batch_size
    yield "banditron sqrt", "banditron", {}, SqrtSchedule(), batch_size
    yield "banditron cuberoot", "banditron", {}, CubeRootSchedule(), batch_size
    yield "banditron adaptive", "banditron", {}, Adaptive(), batch_size
    yield "banditron adaptive c=1", "banditron", {}, Adaptive(c=1.0), batch_size
    yield "banditron adaptive c=2", "banditron", {}, Adaptive(c=2.0), batch_size
    yield "banditron margin", "banditron", {}, MarginAware(), batch_size
    yield "pnorm adaptive", "pnorm", {}, Adaptive(), batch_size
    yield "eg adaptive", "eg", {}, Adaptive(), batch_size
    yield "epsilon-greedy adaptive", "epsilon-greedy", {}, Adaptive(), batch_size
    for other in (1, 64, 512):
        if other != batch_size:
            yield f"banditron adaptive b={other}", "banditron", {}, Adaptive(), other


def run_grid(datasets: list[str], seeds: list[int], batch_size: int, data_dir: str | None,
             only: str | None) -> None:
    for dataset in datasets:
        protocol = PROTOCOL.get(dataset, {"passes": 1})
        for seed in seeds:
            stream = prepare_stream(dataset, data_dir=data_dir, seed=seed,
                                    passes=protocol.get("passes", 1), rounds=protocol.get("rounds"))
            X, y = stream.materialise()  # once for the whole grid
            for label, name, hyper, exploration, batch in configurations(batch_size):
                if only and only not in label:
                    continue
                learner = make_learner(name, stream.n_classes, stream.n_features,
                                       exploration.clone(), seed=seed, **hyper)
                start = time.perf_counter()
                result = replay(learner, X, y, batch_size=batch, seed=seed)
                error = (result.exploit_error_rate if learner.full_information
                         else result.error_rate)
                row = {"dataset": dataset, "seed": seed, "config": label, "learner": name,
                       "exploration": exploration.spec(), "batch_size": batch,
                       "rounds": result.rounds, "passes": stream.passes,
                       "standardised": stream.standardised, "error_rate": error,
                       "exploit_error_rate": result.exploit_error_rate,
                       "gamma_final": result.gamma_final,
                       "seconds": round(time.perf_counter() - start, 2)}
                print(orjson.dumps(row).decode(), flush=True)
                print(f"{dataset} seed {seed} {label}: {error:.4f} ({row['seconds']} s)",
                      file=sys.stderr, flush=True)


def to_markdown(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        rows = [orjson.loads(line) for line in fh if line.startswith("{")]
    errors: dict[tuple[str, str], list[float]] = defaultdict(list)
    meta: dict[str, dict[str, Any]] = {}
    for row in rows:
        errors[(row["config"], row["dataset"])].append(row["error_rate"])
        meta.setdefault(row["dataset"], row)
    datasets = [d for d in PROTOCOL if d in meta] + sorted(set(meta) - set(PROTOCOL))
    configs = list(dict.fromkeys(row["config"] for row in rows))
    lines = ["| configuration | " + " | ".join(datasets) + " |",
             "|---|" + "---:|" * len(datasets)]
    for config in configs:
        cells = []
        for d in datasets:
            vals = errors.get((config, d))
            cells.append(f"{np.mean(vals):.3f}" if vals else "")
        lines.append(f"| {config} | " + " | ".join(cells) + " |")
    best = []
    for d in datasets:
        fixed = {g: np.mean(errors[(f"banditron γ={g}", d)]) for g in GAMMAS
                 if (f"banditron γ={g}", d) in errors}
        adaptive = errors.get(("banditron adaptive", d))
        if fixed and adaptive:
            g_best = min(fixed, key=lambda g: fixed[g])
            gap = float(np.mean(adaptive)) - fixed[g_best]
            best.append(f"| {d} | {g_best} | {fixed[g_best]:.3f} | {np.mean(adaptive):.3f} | "
                        f"{gap:+.3f} | {'yes' if gap <= 0.02 else 'NO'} |")
    lines += ["", "| dataset | best fixed γ | its error | adaptive | gap | within 0.02 |",
              "|---|---:|---:|---:|---:|:---:|", *best]
    lines += ["", "| dataset | rounds | passes | standardised | seeds |", "|---|---:|---:|:---:|---:|"]
    for d in datasets:
        seeds = sorted({r["seed"] for r in rows if r["dataset"] == d})
        m = meta[d]
        lines.append(f"| {d} | {m['rounds']:,} | {m['passes']} | {m['standardised']} | "
                     f"{len(seeds)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run")
    run.add_argument("--datasets", nargs="+", default=list(PROTOCOL))
    run.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    run.add_argument("--batch-size", type=int, default=16)
    run.add_argument("--data-dir")
    run.add_argument("--only", help="run only configurations whose label contains this text")
    md = sub.add_parser("markdown")
    md.add_argument("path")
    args = parser.parse_args(argv)
    if args.cmd == "run":
        run_grid(args.datasets, args.seeds, args.batch_size, args.data_dir, args.only)
    else:
        print(to_markdown(args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
