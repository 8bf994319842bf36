"""Group vs single replica, in process: does model synchronisation keep the online error?

Event ``i`` belongs to partition ``i mod P``; partition ``p`` is served by
replica ``p mod R``, whose one learner decides and learns its partitions'
events in micro-batches (as a partition daemon does per poll). Every replica
runs a real :class:`~streamlearn.sync.hub.ModelHub` over an in-memory models
topic, ticked on an event clock (``rate`` events per second, sync every
``every_s`` seconds, sooner while the model is young: ``early_fraction``), so
the merge, the adoption and the rebase are the
daemon's code. The single replica is the same loop with R = 1.

    python -m simulators.scale_out --dataset synnonsep --events 60000 --seeds 3
"""

from __future__ import annotations

import argparse
from collections import deque
from typing import Any

import numpy as np

from streamlearn.learners import exploration_from_name, make_learner
from streamlearn.learners.base import Learner
from streamlearn.sync.hub import ModelHub
from streamlearn.sync.memory import InMemoryModelLink, ModelLog

__all__ = ["online_error", "stream"]


class _Served:
    def __init__(self, learner: Learner) -> None:
        self.learner, self.model_name = learner, "learner"

    def replace_learner(self, learner: Learner) -> None:
        self.learner = learner


def stream(dataset: str, events: int, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(X, y, K): SynNonSep, or a dataset cycled in seeded shuffled passes."""
    if dataset == "synnonsep":
        from streamlearn.datasets.synthetic import N_CLASSES, synthetic_stream

        X, y = synthetic_stream(events, noise=0.05, seed=seed)
        return X, y, N_CLASSES
    from streamlearn.datasets import load_dataset

    data = load_dataset(dataset)
    Xa, ya = np.asarray(data.X, dtype=np.float64), np.asarray(data.y)
    passes = -(-events // len(ya))
    order = np.concatenate([np.random.default_rng([seed, k]).permutation(len(ya))
                            for k in range(passes)])[:events]
    return Xa[order], ya[order], int(data.n_classes)


def online_error(dataset: str, replicas: int, events: int = 60_000, seed: int = 0,
                 learner: str = "linucb", partitions: int = 6, batch: int = 32,
                 rate: float = 2000.0, every_s: float = 0.25,
                 early_fraction: float = 0.05, delay_rounds: int = 0,
                 exploration: str = "default", gamma: float | None = None) -> float:
    """The online error of ``replicas`` replicas (1 = the single daemon) on one stream; a
    decision's feedback is learned ``delay_rounds`` rounds after it (0: at once)."""
    X, y, K = stream(dataset, events, seed)

    def fresh() -> Learner:
        return make_learner(learner, K, X.shape[1], exploration_from_name(exploration, gamma),
                            seed)

    clock = {"t": 0.0}
    topic = ModelLog()
    hubs = [ModelHub(InMemoryModelLink(topic), f"r{r}", every_s, clock=lambda: clock["t"],
                     early_fraction=early_fraction) for r in range(replicas)]
    shared = [fresh() for _ in range(replicas)]
    served: list[dict[int, Any]] = [
        {p: _Served(shared[r]) for p in range(partitions) if p % replicas == r}
        for r in range(replicas)]
    part = np.arange(events) % partitions
    mistakes = 0.0
    step = batch * partitions  # one poll round: a micro-batch per partition
    waiting: list[deque[tuple[int, Any]]] = [deque() for _ in range(replicas)]  # (due, feedback)
    for lo in range(0, events, step):
        clock["t"] = lo / rate
        for r in range(replicas):
            hubs[r].tick(served[r])
            while waiting[r] and waiting[r][0][0] <= lo:
                shared_learner = next(iter(served[r].values())).learner
                shared_learner.update(*waiting[r].popleft()[1])
            for p, daemon in served[r].items():
                rows = lo + np.flatnonzero(part[lo:lo + step] == p)
                if not len(rows):
                    continue
                lr = daemon.learner
                a, probs = lr.decide(X[rows], keys=rows)
                reward = (a == y[rows]).astype(np.float64)
                mistakes += float((1.0 - reward).sum())
                if delay_rounds:
                    waiting[r].append((lo + delay_rounds * step, (X[rows], a, reward, probs)))
                else:
                    lr.update(X[rows], a, reward, probs)
    return mistakes / events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--dataset", default="synnonsep")
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--learner", default="linucb")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--delay-rounds", type=int, default=0,
                        help="feedback learned this many rounds (~0.1 s each) after its decision")
    parser.add_argument("--exploration", default="default",
                        help="default: the learner's own (as serve); or a strategy name")
    parser.add_argument("--gamma", type=float, default=None)
    args = parser.parse_args(argv)
    options = {"delay_rounds": args.delay_rounds, "exploration": args.exploration,
               "gamma": args.gamma}
    singles, groups = [], []
    for seed in range(args.seeds):
        singles.append(online_error(args.dataset, 1, args.events, seed, args.learner, **options))
        groups.append(online_error(args.dataset, args.replicas, args.events, seed, args.learner,
                                   **options))
        print(f"seed {seed}: single {singles[-1]:.4f}, {args.replicas} replicas "
              f"{groups[-1]:.4f}", flush=True)
    print(f"{args.dataset} ({args.learner}, {args.events} events, {args.seeds} seeds): single "
          f"{np.mean(singles):.4f}, {args.replicas} replicas {np.mean(groups):.4f}, difference "
          f"{np.mean(groups) - np.mean(singles):+.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
