"""Coverage of the promotion gate under repeated looks, heavy weights and several challengers.

Simulated logs with known true values. The logger (what is live) is ε-greedy over K = 10
actions around action 0: it explores each other action with probability ε/K, so a
challenger's weight on an explored row is up to (1 − ε + ε/K)/(ε/K) (991 at ε = 0.01). Each
of three challengers departs from the logger on a share d of the contexts — chosen so
that its effective sample size per look, (Σw)²/Σw², is the one asked — and there plays its
own action, deployed with the same exploration. It departs where the logger does badly
(reward 0.2 there, 0.6 elsewhere), as a model retrained on the logger's mistakes would; its
own reward there makes its value differ from the logger's by exactly δ. (That is where
clipped weights mislead: the rows where a challenger departs are the heavy ones, and
clipping shrinks them, so its estimate drifts towards the logger's reward where they
agree.) Ten looks, each adding ``n_look`` logged rows; at every look the loop's own gate
(:func:`streamlearn.retrain.promotion.passes` with
:func:`~streamlearn.retrain.promotion.challenger_alpha`) judges every challenger on all rows
so far, the paired advantage of :func:`~streamlearn.retrain.promotion.paired_advantage`.

Reported per world, over ``--seeds`` logs:

* ``worse promoted``: seeds where a challenger with δ < 0 passed at some look (the gate's
  promise: at most α = 5 %);
* ``better promoted``: seeds where the challenger with δ = +0.05 passed within the ten looks;
* ``oracle``: the power of a one-sided z-test at α = 5 % at the last look that knows the
  true variance and ignores the repeated looks and the other challengers — no valid rule
  can do much better, so it shows what the log's information allows;
* ``old rule worse promoted``: the rule the loop used before (SNIPS with weights clipped at
  20, normal interval, promoted when its lower bound beats the logger's value), for
  comparison.

Usage::

    python -m simulators.ope_coverage --seeds 200
    python -m simulators.ope_coverage --seeds 200 --ess 20,50,100,200,400 --json out.json
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import orjson

from streamlearn.durability.experience import ExperienceRows
from streamlearn.retrain.promotion import challenger_alpha, paired_advantage, passes

K = 10
LOOKS = 10
MU = 0.6  # the logger's reward where it does well ...
MU_DEPARTED = 0.2  # ... and on the contexts where the challengers depart from it
WORLDS = {"null": (-0.01, -0.02, -0.03), "power": (0.05, -0.01, -0.03)}


def _rows(a: np.ndarray, probs: np.ndarray, rewards: np.ndarray) -> ExperienceRows:
    n = len(a)
    return ExperienceRows([str(i) for i in range(n)], np.zeros((n, 1), np.float32), a,
                          probs, rewards, np.full(n, -1), np.zeros(n, np.int64),
                          np.arange(n, dtype=np.float64), np.zeros(n, np.int64),
                          np.zeros(n))


def _disagreement(ess: float, n_look: int, eps: float) -> float:
    """The share of contexts on which a challenger departs from the logger, for ``ess``
    effective rows per look: ESS ≈ n / (1 − d + d·(1 − ε + ε/K)/(ε/K))."""
    heavy = (1 - eps + eps / K) / (eps / K)
    return (n_look / ess - 1.0) / (heavy - 1.0)


def one_log(seed: int, deltas: tuple[float, ...], ess: float, n_look: int, eps: float,
            alpha: float) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n = n_look * LOOKS
    d = _disagreement(ess, n_look, eps)
    explore = rng.random(n) < eps
    a = np.where(explore, rng.integers(0, K, n), 0)
    probs = np.full((n, K), eps / K)
    probs[:, 0] += 1 - eps
    # challenger j departs on its own contexts (u in [j·d, (j+1)·d)) and plays action j + 1 there
    u = rng.random(n)
    mu = np.full((n, K), MU)
    own = [(u >= j * d) & (u < (j + 1) * d) for j in range(len(deltas))]
    for j, delta in enumerate(deltas):  # the deployed challenger plays it with 1 − ε: V − V₀ = δ
        mu[own[j]] = MU_DEPARTED
        mu[own[j], j + 1] = MU_DEPARTED + delta / (d * (1 - eps))
    rewards = (rng.random(n) < mu[np.arange(n), a]).astype(np.float64)
    rows = _rows(a, probs, rewards)
    out: dict[str, Any] = {"passed_at": [], "old_rule": [], "ess": [], "max_weight": [],
                           "variance": []}
    for j in range(len(deltas)):
        choice = np.where(own[j], j + 1, 0)
        pi = np.full((n, K), eps / K)
        pi[np.arange(n), choice] += 1 - eps
        y = paired_advantage(rows, pi)
        w = pi[np.arange(n), a] / probs[np.arange(n), a]
        out["ess"].append(float(w[:n_look].sum() ** 2 / (w[:n_look] ** 2).sum()))
        out["max_weight"].append(float(w.max()))
        out["variance"].append(float(y.var()))
        alpha_j = challenger_alpha(alpha, j + 1)
        looks = [k for k in range(1, LOOKS + 1) if passes(y[: k * n_look], alpha_j)]
        out["passed_at"].append(looks[0] if looks else None)
        out["old_rule"].append(any(_old_rule(rewards[: k * n_look], w[: k * n_look])
                                   for k in range(1, LOOKS + 1)))
    return out


def _old_rule(rewards: np.ndarray, w: np.ndarray) -> bool:
    """Before: SNIPS with weights clipped at 20, its delta-method 95 % lower bound, promoted
    when above the logger's on-policy value (and at least 20 effective rows)."""
    wc = np.minimum(w, 20.0)
    total = float(wc.sum())
    if total == 0 or total**2 / float((wc * wc).sum()) < 20:
        return False
    value = float((wc * rewards).sum() / total)
    influence = wc * (rewards - value) / (total / len(rewards))
    low = value - 1.959963984540054 * float(influence.std(ddof=1)) / math.sqrt(len(rewards))
    return low > float(rewards.mean())


def oracle_power(delta: float, variance: float, rows: int) -> float:
    """A one-sided 5 % z-test at the last look that knows the paired advantage's variance."""
    return 1.0 - NormalDist().cdf(1.6448536269514722 - delta / math.sqrt(variance / rows))


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for ess in [float(e) for e in args.ess.split(",")]:
        n_look = max(args.min_rows, math.ceil(ess * 1.2 * (1 + 0.2 * (K / args.eps))))
        for world, deltas in WORLDS.items():
            started = time.monotonic()
            logs = [one_log(seed, deltas, ess, n_look, args.eps, args.alpha)
                    for seed in range(args.seeds)]
            worse = [j for j, delta in enumerate(deltas) if delta < 0]
            row = {"world": world, "deltas": list(deltas), "ess_per_look": ess,
                   "ess_measured": float(np.mean([g["ess"][j] for g in logs for j in worse])),
                   "max_weight": float(max(max(g["max_weight"]) for g in logs)),
                   "rows_per_look": n_look, "looks": LOOKS, "seeds": args.seeds,
                   "worse_promoted": float(np.mean([any(g["passed_at"][j] is not None
                                                        for j in worse) for g in logs])),
                   "old_rule_worse_promoted": float(np.mean(
                       [any(g["old_rule"][j] for j in worse) for g in logs]))}
            if deltas[0] > 0:
                row["better_promoted"] = float(np.mean([g["passed_at"][0] is not None for g in logs]))
                row["oracle"] = oracle_power(deltas[0], float(np.mean([g["variance"][0] for g in logs])),
                                             n_look * LOOKS)
            results.append(row)
            print(f"{world} ESS/look {ess:.0f}: worse promoted {row['worse_promoted']:.3f}"
                  + (f", better promoted {row['better_promoted']:.3f} (oracle {row['oracle']:.3f})"
                     if "better_promoted" in row else "")
                  + f"  [{time.monotonic() - started:.0f} s]", file=sys.stderr, flush=True)
    return results


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'world':<6} {'ESS/look':>8} {'max w':>6} {'rows/look':>9} {'worse promoted':>14} "
          f"{'better promoted':>15} {'oracle':>6} {'old rule: worse promoted':>24}")
    for r in results:
        better = f"{r['better_promoted']:.3f}" if "better_promoted" in r else "—"
        oracle = f"{r['oracle']:.3f}" if "oracle" in r else "—"
        print(f"{r['world']:<6} {r['ess_per_look']:>8.0f} {r['max_weight']:>6.0f} "
              f"{r['rows_per_look']:>9,} {r['worse_promoted']:>14.3f} {better:>15} {oracle:>6} "
              f"{r['old_rule_worse_promoted']:>24.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--ess", default="20,50,100", help="effective rows per look, per world")
    parser.add_argument("--eps", type=float, default=0.01, help="the logger's exploration")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--min-rows", type=int, default=2000, help="rows per look at least")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    results = run(args)
    print_table(results)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
