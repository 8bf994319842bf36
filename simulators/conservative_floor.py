"""Does the conservative rollout's floor hold? The daemon's rollout code on worlds with known rewards.

``rollout.mode = conservative`` promises that the live reward stays at or above (1 − α) ×
what the caller's baseline would have earned on the same events, with high probability,
while the learner takes as much of the traffic as that allows
(:class:`streamlearn.service.adoption.Adoption`). This simulator runs exactly the daemon's
code for it, in-process and without Kafka: per micro-batch, the
:class:`~streamlearn.service.adoption.Adoption` resolves each event's baseline and wraps the
learner into a :class:`~streamlearn.engine.Mixture` (:meth:`Adoption.wrap`), the
:class:`~streamlearn.engine.Engine` decides (each event served by the baseline or the
learner, drawn by its key) and the agreement is noted (:meth:`Adoption.note_decisions`); the
rewards come back ``--delay-batches`` batches later and are joined
(:meth:`Engine.feedback`), what closed is learned (:meth:`Engine.learn`) and observed
(:meth:`Adoption.observe`, with the decisions in flight) — the order of the daemon's
decide → publish → join → learn loop (``streamlearn.service.daemon``).

Every action's reward is known here (1 when the action is the label), so each checkpoint
compares the **truth**: the cumulative live reward against (1 − α) × the baseline's own
cumulative reward on the same events. Worlds, each on the ``letter`` data (26 actions):

* ``good-baseline``: the baseline is a multinomial logistic model trained on a held-out
  5 % of the data rows (drawn by the seed, never streamed); the learner starts from zero;
* ``poor-baseline``: the baseline is the constant most frequent label (of the held-out 5 %);
* ``drift``: the ``good-baseline`` world whose labels are permuted at the midpoint (the
  replays' ``--drift-at`` permutation, :func:`streamlearn.datasets.stream.apply_drift`):
  from then on the baseline and what the learner had learned are both wrong.

The seed changes the held-out rows, the stream's order, the drift's permutation and the
learner's and the mixture's randomness. Each seed is run in ``conservative`` and in
``online`` mode (the learner alone) on the same stream.

Reported per world: the share of seeds whose floor was ever violated at a checkpoint
(target ≤ α), the share of seeds where the learner reached ≥ 90 % of the traffic, the
median final share, and the mean cumulative reward per event of the conservative rollout,
the learner alone and the baseline.

Usage::

    python -m simulators.conservative_floor --seeds 100 --events 15000 --jobs 2 --json floor.json
    python -m simulators.conservative_floor --world poor-baseline --seeds 10 --plot floor.png
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.datasets.stream import Drift, add_bias, apply_drift, prepare_stream
from streamlearn.engine import BASELINE, Engine
from streamlearn.join.pending import JoinSettings
from streamlearn.learners import exploration_from_name, make_learner
from streamlearn.service.adoption import Adoption, AdoptionSettings

WORLDS = ("good-baseline", "poor-baseline", "drift")
HELD_OUT = 0.05  # the share of the data rows the baseline is trained on (never streamed)
FULL_SHARE = 0.9  # "the learner took the traffic": its share reached this


# ---------------------------------------------------------------------------- worlds
@dataclass(frozen=True)
class World:
    """A stream with a known reward: features, labels, the baseline's action per event."""

    name: str
    X: np.ndarray  # (T, d), bias included
    labels: np.ndarray  # (T,)
    baseline: np.ndarray  # (T,) the caller's own system's action per event
    n_actions: int


def fit_logistic(X: np.ndarray, y: np.ndarray, n_classes: int, l2: float = 1e-3,
                 steps: int = 300, rate: float = 0.5) -> np.ndarray:
    """A multinomial logistic regression (numpy, full-batch gradient descent with a little
    L2): the (d, K) weights."""
    W = np.zeros((X.shape[1], n_classes))
    onehot = np.eye(n_classes)[y]
    for _ in range(steps):
        z = X @ W
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        W -= rate * (X.T @ (p - onehot) / len(y) + l2 * W)
    return W


def make_world(name: str, seed: int, events: int, data_dir: str | None = None) -> World:
    """The world ``name`` for ``seed``: ``events`` events of ``letter`` after 5 % of its rows
    are held out (in the seed's order) to build the baseline."""
    if name not in WORLDS:
        raise SystemExit(f"--world must be one of {', '.join(WORLDS)}. Got {name!r}.")
    stream = prepare_stream("letter", data_dir=data_dir, seed=seed)  # one shuffled pass
    rows = np.asarray(stream.data_rows(), dtype=np.float64)
    X_all = np.asarray(add_bias(rows))
    y_all = stream.row_labels
    K = stream.n_classes
    held = round(HELD_OUT * len(y_all))
    if events > len(y_all) - held:
        raise SystemExit(f"--events must be at most {len(y_all) - held:,} (one pass over the "
                         f"rows not held out). Got {events:,}.")
    train, streamed = stream.order[:held], stream.order[held:held + events]
    drift = Drift(events // 2, "permute", seed) if name == "drift" else None
    labels, _ = apply_drift(y_all[streamed], K, drift)
    X = X_all[streamed]
    if name == "poor-baseline":
        baseline = np.full(events, int(np.bincount(y_all[train], minlength=K).argmax()))
    else:
        W = fit_logistic(X_all[train], y_all[train], K)
        baseline = np.argmax(X @ W, axis=1)
    return World(name, X, np.asarray(labels, dtype=np.int64),
                 np.asarray(baseline, dtype=np.int64), K)


# ---------------------------------------------------------------------------- one run
@dataclass
class Run:
    """One (world, seed, mode) run: the truth at every checkpoint."""

    at: list[int]  # events decided at each checkpoint
    live: list[float]  # cumulative live reward
    baseline: list[float]  # the baseline's cumulative reward on the same events
    share: list[float]  # the rollout's learner share after the checkpoint's batch
    served: list[float]  # the share the learner actually served since the last checkpoint
    batch_violations: int  # batch ends (not only checkpoints) where the floor was broken
    seconds: float

    def violated(self, alpha: float) -> bool:
        return any(v < (1.0 - alpha) * b for v, b in zip(self.live, self.baseline, strict=True))

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at, "live": self.live, "baseline": self.baseline, "share": self.share,
                "served": self.served, "batch_violations": self.batch_violations,
                "seconds": round(self.seconds, 3)}


def run(world: World, mode: str, seed: int, *, alpha: float = 0.05, batch: int = 32,
        delay_batches: int = 4, checkpoint: int = 500, learner: str = "linucb") -> Run:
    """The daemon's decide → mixture → publish → feedback → learn/observe loop over ``world``
    in rollout ``mode`` (see the module doc)."""
    started = time.monotonic()
    T, d = world.X.shape
    K = world.n_actions
    engine = Engine(make_learner(learner, K, d, exploration_from_name("default"), seed),
                    JoinSettings(window_s=1e12, max_pending=max(200_000, T)))
    adoption = Adoption(AdoptionSettings(mode=mode, alpha=alpha))
    mailbox: deque[tuple[list[int], np.ndarray, float]] = deque()
    live = base = 0.0
    served_learner = served_total = 0
    out = Run([], [], [], [], [], 0, 0.0)
    next_checkpoint = checkpoint
    for lo in range(0, T, batch):
        hi = min(T, lo + batch)
        rows = np.arange(lo, hi)
        ids = rows.tolist()
        labels = world.labels[lo:hi]
        wall = float(hi)
        # decide: the rollout wraps the learner with the baseline (the daemon's modes.decide)
        baselines = adoption.baselines(world.baseline[lo:hi])
        decided = engine.decide(ids, world.X[lo:hi], None, labels=labels,
                                ts=rows.astype(np.float64), partitions=np.zeros(hi - lo, np.int64),
                                wall=wall, keys=rows, mixture=adoption.wrap(None, baselines, K),
                                baselines=baselines, epoch=adoption.epoch)
        adoption.note_decisions(decided.columns["exploit"], decided.columns["baseline"])
        # publish: the caller acts; the truth is known for every action
        rewards = (decided.actions == labels).astype(np.float64)
        live += float(rewards.sum())
        base += float((baselines == labels).sum())
        served_learner += int((decided.columns["served_by"] != BASELINE).sum())
        served_total += hi - lo
        if live < (1.0 - alpha) * base:
            out.batch_violations += 1
        mailbox.append((ids, rewards, wall))
        # feedback: what was published delay_batches batches ago comes back now
        if len(mailbox) > delay_batches:
            fb_ids, fb_rewards, fb_ts = mailbox.popleft()
            engine.feedback(fb_ids, fb_rewards, np.full(len(fb_ids), fb_ts),
                            np.zeros(len(fb_ids), np.int64), wall)
        # learn what closed; the rollout observes it (the daemon's _learn)
        closed = engine.learn().closed
        if len(closed) and adoption.mode != "online":
            kept = closed.learn
            adoption.observe(closed.columns["served_by"][kept], closed.rewards[kept],
                             closed.columns["baseline"][kept], len(engine.joins),
                             closed.columns["epoch"][kept])
        if hi >= next_checkpoint or hi == T:
            out.at.append(hi)
            out.live.append(live)
            out.baseline.append(base)
            out.share.append(1.0 if adoption.mode == "online" else adoption.share)
            out.served.append(served_learner / max(served_total, 1))
            served_learner = served_total = 0
            while next_checkpoint <= hi:
                next_checkpoint += checkpoint
    out.seconds = time.monotonic() - started
    return out


def run_seed(world_name: str, seed: int, events: int, options: dict[str, Any]
             ) -> dict[str, Any]:
    """Both modes of one seed of one world."""
    world = make_world(world_name, seed, events, options.pop("data_dir", None))
    return {"world": world_name, "seed": seed,
            "conservative": run(world, "conservative", seed, **options).as_dict(),
            "online": run(world, "online", seed, **options).as_dict()}


# ---------------------------------------------------------------------------- summary
def summarise(runs: Sequence[dict[str, Any]], alpha: float) -> dict[str, Any]:
    """Per world: the floor's violations, how far the learner got, the rewards."""
    cons = [r["conservative"] for r in runs]
    onl = [r["online"] for r in runs]
    events = cons[0]["at"][-1]

    def violated(r: dict[str, Any]) -> bool:
        return any(v < (1.0 - alpha) * b for v, b in zip(r["live"], r["baseline"], strict=True))

    final_share = [r["share"][-1] for r in cons]
    reached = [next((at for at, s in zip(r["at"], r["share"], strict=True) if s >= FULL_SHARE),
                    None) for r in cons]
    hit = [a for a in reached if a is not None]
    return {
        "seeds": len(runs), "events": events,
        "violated": float(np.mean([violated(r) for r in cons])),
        "violated_online": float(np.mean([violated(r) for r in onl])),
        "violated_any_batch": float(np.mean([r["batch_violations"] > 0 for r in cons])),
        "reached_full": float(np.mean([a is not None for a in reached])),
        "median_reached_at": float(np.median(hit)) if hit else None,
        "median_final_share": float(np.median(final_share)),
        "median_served_last": float(np.median([r["served"][-1] for r in cons])),
        "reward_conservative": float(np.mean([r["live"][-1] for r in cons])) / events,
        "reward_online": float(np.mean([r["live"][-1] for r in onl])) / events,
        "reward_baseline": float(np.mean([r["baseline"][-1] for r in cons])) / events,
        "min_margin": float(min(min(v / b - 1.0 for v, b in zip(r["live"], r["baseline"],
                                                               strict=True) if b > 0)
                                for r in cons)),
        "seconds_per_run": float(np.mean([r["seconds"] for r in cons + onl])),
    }


HEADER = ("| world | seeds | events | floor violated | learner reached ≥ 90 % | median final "
          "share | reward: conservative | online | baseline | worst live/baseline − 1 |")


def table(summaries: dict[str, dict[str, Any]]) -> str:
    lines = [HEADER, "| --- |" + " ---: |" * (HEADER.count("|") - 2)]
    for world, s in summaries.items():
        lines.append(
            f"| {world} | {s['seeds']} | {s['events']:,} | {100 * s['violated']:.1f} % | "
            f"{100 * s['reached_full']:.1f} % | {s['median_final_share']:.2f} | "
            f"{s['reward_conservative']:.3f} | {s['reward_online']:.3f} | "
            f"{s['reward_baseline']:.3f} | {s['min_margin']:+.3f} |")
    return "\n".join(lines)


def plot(results: dict[str, list[dict[str, Any]]], alpha: float, path: str) -> None:
    """Per world, over the seeds (median, 5–95 % band, and the worst seed): the live reward's
    margin over the floor, (live − (1 − α)·baseline) / events, and the learner's share."""
    try:
        import matplotlib
    except ImportError:
        print("--plot: matplotlib is not installed (pip install matplotlib); no figure written",
              file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(4 * len(results), 5.5), squeeze=False,
                             sharex=True)
    for col, (world, runs) in enumerate(results.items()):
        at = np.asarray(runs[0]["conservative"]["at"], dtype=float)
        live = np.array([r["conservative"]["live"] for r in runs])
        base = np.array([r["conservative"]["baseline"] for r in runs])
        share = np.array([r["conservative"]["share"] for r in runs])
        for row, values, label in ((0, (live - (1 - alpha) * base) / at, "margin over the floor"),
                                   (1, share, "learner share")):
            ax = axes[row, col]
            low, mid, high = np.quantile(values, [0.05, 0.5, 0.95], axis=0)
            ax.fill_between(at, low, high, color=f"C{row}", alpha=0.25, lw=0, label="5–95 %")
            ax.plot(at, mid, color=f"C{row}", lw=1.5, label="median")
            ax.plot(at, values.min(axis=0), color=f"C{row}", lw=0.8, ls=":", label="lowest")
            ax.set_ylabel(label)
        axes[0, col].axhline(0.0, color="k", lw=0.8)
        axes[0, col].set_title(f"{world} ({len(runs)} seeds)")
        axes[1, col].set_ylim(-0.02, 1.02)
        axes[1, col].set_xlabel("events")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print(f"figure: {path}", file=sys.stderr)


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--world", action="append", choices=WORLDS,
                        help="a world (repeatable; default: all three)")
    parser.add_argument("--seeds", type=int, default=100, help="seeds 0 .. N-1 per world")
    parser.add_argument("--events", type=int, default=15_000, help="events per run")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=32, help="events per micro-batch")
    parser.add_argument("--delay-batches", type=int, default=4,
                        help="feedback arrives this many batches after its decision")
    parser.add_argument("--checkpoint", type=int, default=500, help="events between checkpoints")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--json", default=None, metavar="FILE")
    parser.add_argument("--plot", default=None, metavar="FILE.png")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.events < args.batch or args.jobs < 1 or args.batch < 1 \
            or args.delay_batches < 0 or args.checkpoint < 1:
        parser.error("--seeds, --jobs, --batch, --checkpoint must be >= 1, --delay-batches >= 0 "
                     "and --events >= --batch")
    worlds = args.world or list(WORLDS)
    options = {"alpha": args.alpha, "batch": args.batch, "delay_batches": args.delay_batches,
               "checkpoint": args.checkpoint, "data_dir": args.data_dir}
    started = time.monotonic()
    results: dict[str, list[dict[str, Any]]] = {}
    summaries: dict[str, dict[str, Any]] = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for world in worlds:
            futures = [pool.submit(run_seed, world, seed, args.events, dict(options))
                       for seed in range(args.seeds)]
            runs = []
            for n, future in enumerate(futures, 1):
                runs.append(future.result())
                c = runs[-1]["conservative"]
                bad = any(v < (1 - args.alpha) * b
                          for v, b in zip(c["live"], c["baseline"], strict=True))
                print(f"{world} seed {runs[-1]['seed']} ({n}/{args.seeds}): final share "
                      f"{c['share'][-1]:.2f}, live {c['live'][-1] / args.events:.3f} vs "
                      f"baseline {c['baseline'][-1] / args.events:.3f}"
                      f"{', FLOOR VIOLATED' if bad else ''}  "
                      f"[{time.monotonic() - started:.0f} s]", file=sys.stderr, flush=True)
            results[world] = runs
            summaries[world] = summarise(runs, args.alpha)
    print(table(summaries))
    for world, s in summaries.items():
        reached = ("-" if s["median_reached_at"] is None
                   else f"{s['median_reached_at']:,.0f}")
        print(f"{world}: floor violated at some batch end {100 * s['violated_any_batch']:.1f} % "
              f"(online alone {100 * s['violated_online']:.1f} %), median event at which the "
              f"learner reached 90 % {reached}, {s['seconds_per_run']:.1f} s a run")
    print(f"total {time.monotonic() - started:.0f} s", file=sys.stderr)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(
            {"settings": {**options, "seeds": args.seeds, "events": args.events},
             "summary": summaries, "runs": results}, option=orjson.OPT_INDENT_2))
    if args.plot:
        plot(results, args.alpha, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["WORLDS", "Run", "World", "fit_logistic", "main", "make_world", "run", "run_seed",
           "summarise", "table"]
