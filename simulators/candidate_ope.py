"""Per-slot off-policy values of rankers on candidate sets, against the simulated truth.

A candidate ranker is judged the way candidate mode needs it (docs/rankers.md, "Candidate
sets"): **per slot, given the logged prefix** — what it would earn placing slot s after the
slots the logger placed — from logs of slates sampled slot by slot without replacement
(:mod:`streamlearn.candidates.slates`). This command checks those estimates and the
promotion gate built on them against a world whose every reward is known.

The world is ``synthetic-candidates`` (3–20 candidates per request, a known logistic reward
per candidate; the stream's own Bernoulli draws are the rewards). The **logger** is the
learner, ε-greedy (``--eps``) around a noisy scorer (the true logit plus N(0, 1.5²)); in
the ``mixture`` world a live ranker (logit plus N(0, 1)) places each slot with probability
``--share`` and the logged propensity is the mixture's (:func:`sample_mixed_slate`), as in a
guarded rollout. Two planted rankers are judged, each deployed with exploration ``--gamma``:
**better** (logit plus N(0, 0.3²)) and **worse** (minus the logit plus N(0, 1): it puts the
least rewarding candidates first, as a ranker trained on a broken label would).

Reported per world and ranker, over ``--seeds`` logs:

* ``covered``: the share of (seed, slot) pairs whose confidence sequence (each side at α/2)
  holds the simulated truth — the mean over requests of the ranker's expected reward at that
  slot given the logged prefix;
* ``mean error``: the estimate minus the truth, averaged over seeds and slots; ``mean
  width``: the intervals' mean width;
* ``true advantage``: the ranker's per-slot value minus the logger's (both given the logged
  prefix, from the known rewards), averaged over slots and seeds;
* ``promoted``: the share of seeds where the promotion gate
  (:func:`streamlearn.retrain.promotion.passes` on the paired advantage of
  :func:`~streamlearn.candidates.slates.slot_terms`) passes the ranker at α.

Usage::

    python -m simulators.candidate_ope --seeds 100
    python -m simulators.candidate_ope --seeds 100 --requests 4000 --json out.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.candidates.sets import segment_argmax
from streamlearn.candidates.slates import (
    RankerShare,
    deployed_distribution,
    deployed_slot_probs,
    sample_mixed_slate,
    slot_terms,
    slot_values,
)
from streamlearn.datasets.candidates import synthetic_candidates
from streamlearn.retrain.promotion import advantage_terms, passes

WORLDS = {"learner": 0.0, "mixture": None}  # the live ranker's share (None: --share)
RANKERS = {"better": (1.0, 0.3), "worse": (-1.0, 1.0)}  # (sign of the true logit, noise sd)
LOGGER_NOISE, LIVE_NOISE = 1.5, 1.0


def _conditional(probs: np.ndarray, offsets: np.ndarray, placed: np.ndarray) -> np.ndarray:
    """The learner's distribution over the candidates not yet placed (renormalised)."""
    free = np.where(placed, 0.0, probs)
    totals = np.add.reduceat(free, offsets[:-1])
    return np.asarray(free / np.repeat(np.where(totals > 0, totals, 1.0), np.diff(offsets)))


def _per_slot_truth(dist_at: Any, mu: np.ndarray, offsets: np.ndarray, logged: np.ndarray
                    ) -> np.ndarray:
    """(k,) the mean over requests of Σ_c dist_s(c | logged prefix)·μ_c, slot by slot."""
    placed = np.zeros(len(mu), dtype=bool)
    out = np.zeros(logged.shape[1])
    for s in range(logged.shape[1]):
        out[s] = np.add.reduceat(dist_at(placed) * mu, offsets[:-1]).mean()
        placed[logged[:, s]] = True
    return out


def one_log(seed: int, requests: int, slots: int, eps: float, gamma: float, share: float,
            alpha: float) -> dict[str, Any]:
    """One simulated log and the verdict on each planted ranker."""
    stream = synthetic_candidates(requests, min_candidates=max(slots, 3), max_candidates=20,
                                  seed=seed)
    sets, mu = stream.sets, np.asarray(stream.expected)
    offsets, sizes, N, B = sets.offsets, sets.sizes, len(mu), len(sets)
    assert sets.rewards is not None
    logit = np.log(mu) - np.log1p(-mu)
    rng = np.random.default_rng(100_000 + seed)
    probs = np.repeat(eps / sizes, sizes)
    probs[segment_argmax(logit + rng.normal(0.0, LOGGER_NOISE, N), offsets)] += 1.0 - eps
    gammas = np.full(B, gamma)
    live = logit + rng.normal(0.0, LIVE_NOISE, N)
    ranker = RankerShare(live, np.full(B, share), gammas, rng.random((B, slots))) if share else None
    logged, p, _ = sample_mixed_slate(probs, offsets, np.full(B, slots), rng.random((B, slots)),
                                      ranker)
    rewards = sets.rewards[logged]

    def logger_at(placed: np.ndarray) -> np.ndarray:
        own = _conditional(probs, offsets, placed)
        return own if not share else share * deployed_distribution(live, offsets, placed, gammas) \
            + (1.0 - share) * own

    logger_truth = _per_slot_truth(logger_at, mu, offsets, logged)
    out: dict[str, Any] = {"seed": seed, "logger": logger_truth.tolist(), "rankers": {}}
    for name, (sign, noise) in RANKERS.items():
        scores = sign * logit + rng.normal(0.0, noise, N)
        target = deployed_slot_probs(scores, offsets, logged, gammas)
        truth = _per_slot_truth(lambda placed, sc=scores: deployed_distribution(
            sc, offsets, placed, gammas), mu, offsets, logged)
        intervals = slot_values(rewards, logged, p, target, alpha)
        out["rankers"][name] = {
            "truth": truth.tolist(), "estimate": [iv.mean for iv in intervals],
            "covered": [bool(iv.low <= t <= iv.high) for iv, t in zip(intervals, truth, strict=True)],
            "width": [iv.high - iv.low for iv in intervals],
            "advantage": float((truth - logger_truth).mean()),
            "promoted": passes(advantage_terms(*slot_terms(rewards, logged, p, target)), alpha),
        }
    return out


def summarise(logs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per planted ranker: coverage, mean error, true advantage and promotion rate."""
    summary: dict[str, dict[str, float]] = {}
    for name in RANKERS:
        runs = [log["rankers"][name] for log in logs]
        covered = [c for r in runs for c in r["covered"]]
        errors = [e - t for r in runs for e, t in zip(r["estimate"], r["truth"], strict=True)]
        summary[name] = {
            "covered": float(np.mean(covered)), "mean_error": float(np.mean(errors)),
            "width": float(np.mean([w for r in runs for w in r["width"]])),
            "advantage": float(np.mean([r["advantage"] for r in runs])),
            "promoted": float(np.mean([r["promoted"] for r in runs])), "seeds": len(runs)}
    return summary


HEADER = ("| world | ranker | seeds | covered (seed × slot) | mean error | mean width | "
          "true advantage | promoted |\n|---|---|---:|---:|---:|---:|---:|---:|")


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [HEADER]
    for world, summary in results.items():
        for name, s in summary.items():
            lines.append(f"| {world} | {name} | {s['seeds']:.0f} | {100 * s['covered']:.1f} % | "
                         f"{s['mean_error']:+.4f} | {s['width']:.3f} | {s['advantage']:+.4f} | "
                         f"{100 * s['promoted']:.0f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--requests", type=int, default=4000, help="logged requests per seed")
    parser.add_argument("--slots", type=int, default=3)
    parser.add_argument("--eps", type=float, default=0.3, help="the learner's exploration")
    parser.add_argument("--gamma", type=float, default=0.05, help="a deployed ranker's exploration")
    parser.add_argument("--share", type=float, default=0.3, help="the live ranker's share (mixture)")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    for name in ("seeds", "requests", "slots"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1. Got {getattr(args, name)}.")
    for name in ("eps", "gamma", "share", "alpha"):
        if not 0.0 < getattr(args, name) < 1.0:
            parser.error(f"--{name} must be in (0, 1). Got {getattr(args, name)}.")
    started = time.perf_counter()
    results: dict[str, dict[str, dict[str, float]]] = {}
    raw: dict[str, list[dict[str, Any]]] = {}
    for world, share in WORLDS.items():
        logs = []
        for i, seed in enumerate(range(args.seeds)):
            logs.append(one_log(seed, args.requests, args.slots, args.eps, args.gamma,
                                args.share if share is None else share, args.alpha))
            print(f"\r{world}: seed {i + 1}/{args.seeds} ({time.perf_counter() - started:.0f} s)",
                  end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        raw[world], results[world] = logs, summarise(logs)
    print(table(results))
    if args.json:
        Path(args.json).write_bytes(orjson.dumps({"args": vars(args), "summary": results,
                                                  "logs": raw}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
