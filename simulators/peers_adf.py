"""Vowpal Wabbit ``--cb_explore_adf`` on a candidate-set stream: the candidate-set peer (docs/bench.md).

Each request becomes one VW multi-line example: a ``shared |s ...`` line with
the request's context (omitted when ``d_x = 0``) and one ``|c ...`` line per
candidate, features named ``f<column>`` (hashed by VW; zeros left out; 7
significant digits, as VW stores float32). Per request: ``predict`` gives the
PMF over the candidates, an action is sampled from it by inverse CDF with the
keyed uniform of the request (:func:`streamlearn.learners.randomness.uniforms`),
the chosen line gets the label ``0:<cost>:<prob>`` and ``learn`` is called.

Cost encoding: ``cost = −reward`` (VW minimises cost, so a relevant document or
a click costs −1 and a miss 0; graded rewards cost −0.5 / −1).

Timed: only the ``predict`` and ``learn`` calls. Text lines are built before
the run; parsing (in chunks), sampling, setting the label and finishing the
examples happen outside the timer.

Explorers (:data:`ADF_EXPLORERS`): ε-greedy 0.05, bagging 5, cover 3 and
SquareCB at VW's defaults; when the stream has a shared context each also runs
with ``-q sc`` (context × candidate quadratic features; the ``-q`` systems).

>>> from streamlearn.datasets.candidates import synthetic_candidates
>>> request = adf_lines(synthetic_candidates(1, d_x=2, d_c=2, min_candidates=2, max_candidates=2))[0]
>>> [line.split(" f0:")[0] for line in request], request[0].count(":")
(['shared |s', '|c', '|c'], 2)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import orjson

from simulators.peers import import_vw
from streamlearn.datasets.candidates import CANDIDATE_STREAMS, CandidateStream, load_candidate_stream
from streamlearn.errors import ConfigError
from streamlearn.learners.randomness import uniforms

__all__ = ["ADF_EXPLORERS", "adf_explorers", "adf_lines", "baselines", "main", "run_vw_adf"]

#: explorer name → VW arguments added to ``--cb_explore_adf``.
_BASE: dict[str, str] = {
    "vw-adf-epsilon": "--epsilon 0.05",
    "vw-adf-bag": "--bag 5",
    "vw-adf-cover": "--cover 3",
    "vw-adf-squarecb": "--squarecb",
}
INTERACTION = "-q sc"
ADF_EXPLORERS: dict[str, str] = {**_BASE, **{f"{k}-q": f"{v} {INTERACTION}" for k, v in _BASE.items()}}
_CHUNK = 2048  # requests parsed at a time (bounds the parsed examples held in memory)


def adf_explorers(d_x: int) -> list[str]:
    """The explorers that apply to a stream with shared context width ``d_x`` (``-q`` needs d_x > 0)."""
    return [name for name in ADF_EXPLORERS if d_x > 0 or not name.endswith("-q")]


def _feature_text(rows: np.ndarray) -> list[str]:
    return [" ".join(f"f{j}:{v:.7g}" for j, v in zip(np.flatnonzero(r).tolist(), r[r != 0].tolist(),
                                                       strict=True)) for r in rows]


def adf_lines(stream: CandidateStream) -> list[list[str]]:
    """One list of unlabelled VW text lines per request: the shared line (when d_x > 0), then candidates."""
    sets = stream.sets
    items = [f"|c {text}" for text in _feature_text(sets.items)]
    shared = (_feature_text(sets.context) if sets.context.shape[1] else [])
    offsets = sets.offsets.tolist()
    out = []
    for r in range(len(sets)):
        lines = items[offsets[r]:offsets[r + 1]]
        out.append([f"shared |s {shared[r]}", *lines] if shared else lines)
    return out


def _sample(pmf: Sequence[float], u: float) -> int:
    cdf = np.cumsum(pmf)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1))


def run_vw_adf(stream: CandidateStream, explorer: str, seed: int, pyvw: ModuleType | None = None,
               lines: list[list[str]] | None = None) -> dict[str, Any]:
    """Run ``--cb_explore_adf <explorer>`` over the stream once, in order; return its scores.

    Keys: ``system``, ``vw_args``, ``requests``, ``seconds`` (timed predict + learn),
    ``events_per_second`` (requests per timed second), ``candidates_per_second``,
    ``error_rate`` (mean 1 − reward of the played candidate: for 0/1 rewards the fraction of
    misses),
    ``regret_per_request`` (against the stream's ``best_reward``), ``mean_prob``
    (mean propensity of the played candidate) and ``parse_seconds`` (untimed).
    ``lines`` (from :func:`adf_lines`) may be passed to share them across explorers.
    """
    if explorer not in ADF_EXPLORERS:
        raise ConfigError(f"Expected a VW ADF explorer in {sorted(ADF_EXPLORERS)}. Got {explorer!r} instead.")
    if explorer.endswith("-q") and stream.sets.context.shape[1] == 0:
        raise ConfigError(f"Expected a stream with shared context for {explorer} (-q sc). "
                          f"Got d_x = 0 on {stream.name}.")
    pyvw = pyvw if pyvw is not None else import_vw()
    if pyvw is None:
        raise ConfigError("Expected vowpalwabbit to be installed for the VW peers. Got ImportError.")
    lines = lines if lines is not None else adf_lines(stream)
    shared = 1 if stream.sets.context.shape[1] else 0
    args = f"--cb_explore_adf {ADF_EXPLORERS[explorer]} --random_seed {seed} --quiet"
    B = len(stream)
    u = uniforms(seed, np.arange(B)).tolist()
    offsets, rewards = stream.sets.offsets.tolist(), stream.rewards.tolist()
    chosen = np.zeros(B, dtype=np.int64)
    probs = np.zeros(B)
    timed = parse_s = 0.0
    vw = pyvw.Workspace(args)
    try:
        for lo in range(0, B, _CHUNK):
            t0 = time.perf_counter()
            examples = [vw.parse(lines[r]) for r in range(lo, min(lo + _CHUNK, B))]
            parse_s += time.perf_counter() - t0
            for k, ex in enumerate(examples):
                r = lo + k
                t1 = time.perf_counter()
                pmf = vw.predict(ex)
                t2 = time.perf_counter()
                action = _sample(pmf, u[r])
                row = offsets[r] + action
                ex[shared + action].set_label_string(f"0:{-rewards[row]:g}:{pmf[action]:.9g}")
                t3 = time.perf_counter()
                vw.learn(ex)
                timed += (t2 - t1) + (time.perf_counter() - t3)
                chosen[r], probs[r] = row, pmf[action]
                vw.finish_example(ex)
    finally:
        vw.finish()
    return {
        "system": explorer, "vw_args": args, "requests": B, "seconds": timed,
        "events_per_second": B / timed if timed > 0 else float("nan"),
        "candidates_per_second": len(stream.sets.items) / timed if timed > 0 else float("nan"),
        "error_rate": stream.error(chosen),
        "regret_per_request": stream.regret(chosen) / B if B else float("nan"),
        "mean_prob": float(probs.mean()) if B else float("nan"), "parse_seconds": parse_s,
    }


def baselines(stream: CandidateStream) -> list[dict[str, Any]]:
    """Exact scores of the uniform random policy and the optimal policy (no timing)."""
    sets, B = stream.sets, len(stream)
    sizes = sets.sizes.astype(np.float64)
    uniform_reward = np.add.reduceat(stream.rewards, sets.offsets[:-1]) / sizes
    uniform_expected = np.add.reduceat(stream.expected, sets.offsets[:-1]) / sizes
    best = stream.best_rows()
    return [
        {"system": "uniform-random", "error_rate": float(np.mean(1.0 - uniform_reward)),
         "regret_per_request": float((stream.best_reward - uniform_expected).sum() / B)},
        {"system": "optimal", "error_rate": stream.error(best), "regret_per_request": 0.0},
    ]


def _fmt(value: object, spec: str) -> str:
    return format(value, spec) if isinstance(value, float) and np.isfinite(value) else "-"


def _table(stream: CandidateStream, rows: list[dict[str, Any]]) -> str:
    head = (f"{stream.name}: {len(stream):,} requests, {len(stream.sets.items):,} candidates, "
            f"d_x={stream.sets.context.shape[1]}, d_c={stream.sets.items.shape[1]}, passes={stream.n_passes}")
    lines = [head, f"{'system':<20} {'events/s':>10} {'cands/s':>11} {'error':>7} {'regret/req':>10} "
                   f"{'seconds':>8}"]
    for row in rows:
        lines.append(f"{row['system']:<20} {_fmt(row.get('events_per_second'), ',.0f'):>10} "
                     f"{_fmt(row.get('candidates_per_second'), ',.0f'):>11} "
                     f"{_fmt(row['error_rate'], '.4f'):>7} {_fmt(row['regret_per_request'], '.4f'):>10} "
                     f"{_fmt(row.get('seconds'), '.2f'):>8}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulators.peers_adf",
                                     description="VW --cb_explore_adf explorers on a candidate-set stream.")
    parser.add_argument("--dataset", default="synthetic-candidates", choices=sorted(CANDIDATE_STREAMS))
    parser.add_argument("--requests", type=int, default=None,
                        help="synthetic: distinct requests (default 10,000); ohsumed: cut the stream")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--explorers", default=None, help="comma list; default all that apply")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    stream = load_candidate_stream(args.dataset, passes=args.passes, seed=args.seed, rounds=args.requests,
                                   data_dir=args.data_dir)
    names = args.explorers.split(",") if args.explorers else adf_explorers(stream.sets.context.shape[1])
    lines = adf_lines(stream)
    rows = []
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows.append(run_vw_adf(stream, name, args.seed, lines=lines))
    rows += baselines(stream)
    if args.json:
        sys.stdout.write(orjson.dumps({"dataset": stream.name, "requests": len(stream),
                                       "passes": stream.n_passes, "systems": rows}).decode() + "\n")
    else:
        print(_table(stream, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
