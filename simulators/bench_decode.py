"""Decoding instance messages alone: µs an instance of ``decode_instances`` by poll size.

The messages are the broker bench's (``simulators.bench_workloads.fixed_actions``: SynNonSep,
400 dense features, ~1.6 KB of JSON each). Each poll size is timed best of ``--repeats``
over enough polls for ~2,000 instances. With ``--compare-with DIR`` the same timing runs
in a fresh process on the ``streamlearn`` of another checkout (e.g. an older commit), in
turn with this one's, and the ratio (other ÷ this, above 1: this one is faster) is printed.

    python -m simulators.bench_decode --polls 1,8,500 --compare-with /tmp/base
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import timeit
from functools import partial
from pathlib import Path

__all__ = ["decode_microseconds", "main"]

REPO = Path(__file__).resolve().parent.parent


def decode_microseconds(polls: list[int], repeats: int, seed: int = 0) -> dict[int, float]:
    """µs an instance of ``decode_instances`` on polls of each size (best of ``repeats``)."""
    from simulators.bench_workloads import fixed_actions
    from streamlearn.events.instances import decode_instances
    from streamlearn.events.raw import Message

    largest = max(polls)
    load = fixed_actions(largest, "dense", seed)
    messages = [Message("instances", i % 2, i, load.keys[i], load.values[i],
                        1_700_000_000_000 + i) for i in range(largest)]
    out: dict[int, float] = {}
    for n in polls:
        number = max(1, 2000 // n)
        poll = messages[:n]
        best = min(timeit.repeat(partial(decode_instances, poll, 400, 9), number=number,
                                 repeat=repeats))
        out[n] = best / number / n * 1e6
    return out


def _in_checkout(tree: Path, polls: list[int], repeats: int) -> dict[int, float]:
    """:func:`decode_microseconds` in a fresh process whose ``streamlearn`` is ``tree``'s
    (this script is imported from here first; the library only once ``tree`` leads the path)."""
    code = ("import json, sys; from simulators.bench_decode import decode_microseconds; "
            "sys.path.insert(0, sys.argv[1]); "
            "print(json.dumps(decode_microseconds([int(p) for p in sys.argv[2].split(',')], "
            "int(sys.argv[3]))))")
    done = subprocess.run([sys.executable, "-c", code, str(tree), ",".join(map(str, polls)),
                           str(repeats)], capture_output=True, text=True, check=True, cwd=REPO)
    return {int(k): v for k, v in json.loads(done.stdout).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", default="1,8,500", help="comma-separated poll sizes")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compare-with", type=Path, default=None, metavar="DIR",
                        help="another checkout, timed in turn with this one")
    args = parser.parse_args(argv)
    polls = [int(p) for p in args.polls.split(",")]
    if any(p < 1 for p in polls) or args.repeats < 1:
        parser.error(f"expected poll sizes and --repeats >= 1, got {args.polls!r} and {args.repeats}")
    if args.compare_with is None:
        for n, us in decode_microseconds(polls, args.repeats).items():
            print(f"poll of {n:>4}: {us:6.1f} µs an instance")
        return 0
    runs = [_in_checkout(tree, polls, args.repeats)
            for tree in (REPO, args.compare_with, REPO, args.compare_with)]
    for n in polls:
        here, there = min(runs[0][n], runs[2][n]), min(runs[1][n], runs[3][n])
        print(f"poll of {n:>4}: this checkout {here:6.1f} µs an instance, {args.compare_with} "
              f"{there:6.1f} ({there / here:.2f}×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
