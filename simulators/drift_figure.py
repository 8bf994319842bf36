"""The drift table and figure of docs/results.md §6: pendigits with labels permuted at the midpoint.

pendigits, 5 passes (seed 0, standardised, bias), labels permuted by a fixed random
permutation from event 27,480 on, micro-batches of 64. For each learner: its online
error, its error over the 1,000 events before the change, the number of events after
the change until the first 1,000-event window (scanned in steps of 100) whose error is
within 0.05 of that, its drift detections, and the γ the daemon exports,
(1 − max P)·K/(K − 1), averaged over the 1,000 events before and after the change.

    python -m simulators.drift_figure                         # the table
    python -m simulators.drift_figure --plot docs/img/drift-pendigits.png
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from streamlearn.datasets.stream import Drift, prepare_stream
from streamlearn.learners import FixedGamma, make_learner
from streamlearn.learners.exploration import Exploration

AT = 27_480  # the change: the midpoint of 5 passes over pendigits (54,960 events)
WINDOW = 1_000
BATCH = 64
GAMMAS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
PLOTTED = {"linucb": "linucb (default)", "squarecb": "squarecb",
           "banditron γ=0.1": "banditron γ=0.1 (best fixed γ)"}


@dataclass
class DriftRun:
    label: str
    wrong: np.ndarray  # 1 where the played action was wrong, per event
    gamma: np.ndarray  # the exported γ, per event
    detections: int

    def row(self) -> str:
        pre = self.wrong[AT - WINDOW:AT].mean()
        back = next((w + WINDOW - AT for w in range(AT, len(self.wrong) - WINDOW + 1, 100)
                     if self.wrong[w:w + WINDOW].mean() <= pre + 0.05), None)
        return (f"| {self.label} | {self.wrong.mean():.3f} | {pre:.3f} | "
                f"{'never' if back is None else f'{back:,}'} | {self.detections} | "
                f"{self.gamma[AT - WINDOW:AT].mean():.4f} → {self.gamma[AT:AT + WINDOW].mean():.4f} |")


def run(label: str, name: str, exploration: Exploration | None, X: np.ndarray,
        y: np.ndarray, n_classes: int) -> DriftRun:
    """One learner over the stream (X, y), decided and updated in batches of BATCH."""
    K, n = n_classes, len(y)
    learner = make_learner(name, K, X.shape[1], exploration, seed=0)
    wrong, gamma = np.zeros(n), np.zeros(n)
    for lo in range(0, n, BATCH):
        rows = np.arange(lo, min(n, lo + BATCH))
        actions, probs = learner.decide(X[rows], keys=rows)
        wrong[rows] = actions != y[rows]
        gamma[rows] = (1 - probs.max(axis=1)) * K / (K - 1)
        learner.update(X[rows], actions, (actions == y[rows]).astype(float), probs)
    return DriftRun(label, wrong, gamma, int(getattr(learner, "drift_detections_", 0)))


def plot(runs: list[DriftRun], path: str) -> None:
    from streamlearn.plotting import pyplot

    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.8, 6.6), sharex=True)
    styles = iter(["-", "--", ":"])
    for r in (r for r in runs if r.label in PLOTTED):
        ends = np.arange(WINDOW, len(r.wrong) + 1, 200)
        cum_w, cum_g = np.concatenate([[0], np.cumsum(r.wrong)]), np.concatenate([[0], np.cumsum(r.gamma)])
        style = next(styles)
        top.plot(ends, (cum_w[ends] - cum_w[ends - WINDOW]) / WINDOW, style, label=PLOTTED[r.label])
        bottom.plot(ends, (cum_g[ends] - cum_g[ends - WINDOW]) / WINDOW, style)
    for axis in (top, bottom):
        axis.axvline(AT, color="grey", linewidth=0.8)
    top.set_ylabel("error, last 1,000 events")
    top.legend()
    bottom.set_yscale("log")
    bottom.set_ylabel("exported γ (mean, last 1,000)")
    bottom.set_xlabel(f"events (pendigits, 5 passes; labels permuted at event {AT:,})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", metavar="PNG", help="write the figure (needs matplotlib)")
    args = parser.parse_args(argv)
    configs: list[tuple[str, str, Exploration | None]] = [
        (f"banditron γ={g}", "banditron", FixedGamma(g)) for g in GAMMAS]
    configs += [(n, n, None) for n in ("linucb", "squarecb", "lints", "epsilon-greedy")]
    print("| learner (defaults unless γ given) | error over the stream | pre-change error "
          "(last 1,000) | events to within 0.05 of it | detections | mean γ, 1,000 before → "
          "1,000 after |")
    print("|---|---:|---:|---:|---:|---|")
    stream = prepare_stream("pendigits", passes=5, seed=0, drift=Drift(AT, "permute", 0))
    features, y = stream.materialise()
    X = np.asarray(features)  # pendigits is dense
    runs = []
    for label, name, exploration in configs:
        runs.append(run(label, name, exploration, X, y, stream.n_classes))
        print(runs[-1].row(), flush=True)
    if args.plot:
        plot(runs, args.plot)
        print(f"figure: {args.plot}")


if __name__ == "__main__":
    main()
