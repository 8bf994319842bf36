"""streamlearn's candidate-set learners against VW ``--cb_explore_adf`` on one stream.

    python -m simulators.bench_candidates --dataset synthetic-candidates --requests 20000
    python -m simulators.bench_candidates --dataset ohsumed-candidates --passes 5

Every system plays the same stream (same requests, same candidate order, same
rewards). streamlearn learners run through
:func:`streamlearn.replay.candidates.replay_candidates` at micro-batch
``--batch-size`` (their defaults; timed: the whole decide → learn loop, joint
features included); VW runs as in :mod:`simulators.peers_adf` (timed: predict +
learn only, text built outside the timer). Printed per system: requests/s, online
error (mean 1 − reward of the played candidate), regret per request against the
optimal policy (exact on the synthetic stream), and the ratios to the best VW
explorer (by error).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from simulators.peers_adf import adf_explorers, adf_lines, baselines, run_vw_adf
from streamlearn.candidates.learners import CANDIDATE_LEARNERS, CandidateLearner
from streamlearn.datasets.candidates import CandidateStream, load_candidate_stream
from streamlearn.replay.candidates import replay_candidates

LEARNERS = {f"streamlearn-cand-{name}": cls for name, cls in CANDIDATE_LEARNERS.items()}


def run_streamlearn(stream: CandidateStream, name: str, batch_size: int, seed: int) -> dict[str, Any]:
    d_x, d_c = stream.sets.context.shape[1], stream.sets.items.shape[1]
    learner: CandidateLearner = LEARNERS[name](d_x, d_c, seed=seed)
    result = replay_candidates(learner, stream.sets, batch_size, expected=stream.expected)
    return {"system": name, "batch_size": batch_size,
            "events_per_second": result.requests_per_second,
            "error_rate": stream.error(result.chosen),
            "regret_per_request": stream.regret(result.chosen) / len(stream)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dataset", default="synthetic-candidates")
    parser.add_argument("--requests", type=int, default=None, help="requests (synthetic) / rounds")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--data-dir", default=None, help="where the datasets live")
    parser.add_argument("--fetch", action="store_true",
                        help="download missing built-in data (OHSUMED cannot be: see the error)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    stream = load_candidate_stream(args.dataset, passes=args.passes, seed=args.seed,
                                   rounds=args.requests, data_dir=args.data_dir, fetch=args.fetch)
    rows = [run_streamlearn(stream, name, args.batch_size, args.seed) for name in LEARNERS]
    lines = adf_lines(stream)
    for explorer in adf_explorers(stream.sets.context.shape[1]):
        vw = run_vw_adf(stream, explorer, args.seed, lines=lines)
        rows.append({"system": f"vw-adf-{explorer}", "batch_size": 1, **vw})
    best_vw = min((r for r in rows if r["system"].startswith("vw-")), key=lambda r: r["error_rate"])
    for r in rows:
        r["speed_vs_reference"] = r["events_per_second"] / best_vw["events_per_second"]
        r["error_vs_reference"] = r["error_rate"] - best_vw["error_rate"]
    if args.json:
        print(orjson.dumps({"dataset": args.dataset, "requests": len(stream),
                            "reference": {"system": best_vw["system"],
                                          "why": "the VW explorer with the lowest error"},
                            "results": rows, "baselines": baselines(stream)},
                           option=orjson.OPT_INDENT_2).decode())
        return 0
    print(f"{args.dataset}: {len(stream):,} requests, {len(stream.sets.items):,} candidates; "
          f"best VW: {best_vw['system']}")
    print(f"{'system':<34}{'batch':>6}{'requests/s':>12}{'error':>8}{'regret/req':>11}"
          f"{'× VW speed':>11}{'Δ error':>9}")
    for r in rows:
        print(f"{r['system']:<34}{r['batch_size']:>6}{r['events_per_second']:>12,.0f}"
              f"{r['error_rate']:>8.4f}{r['regret_per_request']:>11.4f}"
              f"{r['speed_vs_reference']:>11.2f}{r['error_vs_reference']:>+9.4f}")
    for b in baselines(stream):
        print(f"{b['system']:<34}{'':>6}{'':>12}{b['error_rate']:>8.4f}"
              f"{b['regret_per_request']:>11.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
