"""``streamlearn replay --dataset ohsumed-candidates|synthetic-candidates``: the candidate path.

The learner names map to the candidate-set learners of
:mod:`streamlearn.candidates.learners` (``linucb``, ``epsilon-greedy``,
``squarecb``, ``banditron``), each at its defaults; ``--slots k`` fills k slots
per request. Prints error, regret and speed (per slot with slates), or ``--json``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from streamlearn.candidates.learners import CANDIDATE_LEARNERS
from streamlearn.datasets.candidates import load_candidate_stream
from streamlearn.errors import ConfigError
from streamlearn.replay.candidates import replay_candidates

__all__ = ["replay_candidate_stream"]


def replay_candidate_stream(args: argparse.Namespace) -> int:
    if args.learner not in CANDIDATE_LEARNERS:
        raise ConfigError(f"--learner must be one of {sorted(CANDIDATE_LEARNERS)} on a "
                          f"candidate-set stream. Got {args.learner!r}.")
    stream = load_candidate_stream(args.dataset, passes=args.passes or 1,
                                   seed=args.seed if args.seed is not None else 0,
                                   rounds=args.rounds, data_dir=args.data_dir, fetch=args.fetch)
    largest = int(stream.sets.sizes.max()) if len(stream.sets) else 0
    if args.slots is not None and args.slots > largest:  # each impossible slot printed nan
        raise ConfigError(f"--slots must be at most the largest request's candidates ({largest} "
                          f"on this stream). Got {args.slots}.")
    d_x, d_c = stream.sets.context.shape[1], stream.sets.items.shape[1]
    learner = CANDIDATE_LEARNERS[args.learner](d_x, d_c, seed=args.seed or 0)
    result = replay_candidates(learner, stream.sets, args.batch_size, expected=stream.expected,
                               slots=args.slots)
    report: dict[str, Any] = {
        "dataset": args.dataset, "learner": args.learner, "requests": result.requests,
        "candidates": len(stream.sets.items), "batch_size": args.batch_size, "slots": args.slots,
        "error_rate": result.error_rate, "mean_regret": result.mean_regret,
        "requests_per_second": result.requests_per_second,
        "slot_error_rates": result.slot_error_rates, "slot_regrets": result.slot_regrets}
    if args.json:
        sys.stdout.write(orjson.dumps(report).decode() + "\n")
        return 0
    print(f"{args.dataset}: {result.requests:,} requests, {len(stream.sets.items):,} candidates; "
          f"{args.learner} (candidate sets), batch {args.batch_size}: error {result.error_rate:.4f}, "
          f"regret per request {result.mean_regret:.4f}, {result.requests_per_second:,.0f} "
          f"requests/s")
    if result.slot_error_rates is not None and result.slot_regrets is not None:
        for s, (e, r) in enumerate(zip(result.slot_error_rates, result.slot_regrets, strict=True)):
            print(f"  slot {s + 1}: error {e:.4f}, regret {r:.4f}")
    return 0
