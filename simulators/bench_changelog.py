"""How long a partition takes to restore from the changelog alone, and what a checkpoint writes.

Builds the state of one busy partition — ``--pending`` decisions awaiting feedback
(``--features`` features, ``--actions`` actions each) and ``--closed`` recently closed
ids — exactly as the daemon checkpoints it, writes it to a changelog topic on a real
broker as the daemon does (a first, full checkpoint; then ``--checkpoints`` more, each
after ``--turnover`` decisions closed and as many added), and restores it the way a
replica with an empty disk does: open the changelog partition (fencing its writer),
read it to the end, check every chunk, rebuild the pending joins. The floor beside it:
reading the same state from a local snapshot.

    python -m simulators.bench_changelog [--bootstrap HOST:PORT] [--pending 100000]
        [--closed 400000] [--features 16] [--actions 26]

Without ``--bootstrap`` a broker is started with deploy/kafka/kafka.sh and stopped after.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from simulators.bench_daemon import start_broker
from streamlearn.durability.changelog import Changelog
from streamlearn.join.pending import JoinSettings, PendingJoins
from streamlearn.service.settings import without_hugepage_advice
from streamlearn.snapshot import read_snapshot, write_snapshot
from streamlearn.transport.kafka import ensure_topics
from streamlearn.transport.keyed_log import CHANGELOG_TOPIC_CONFIGS, LANES, KafkaKeyedLog


def build_state(pending: int, closed: int, d: int, k: int, seed: int = 0) -> PendingJoins:
    """A join store holding ``pending`` open decisions and ``closed`` recently closed ids."""
    rng = np.random.default_rng(seed)
    # closed ids are remembered in two generations of max_pending each (join/recent.py)
    store = PendingJoins(k, d, JoinSettings(window_s=3600.0, max_pending=max(2 * pending, closed)))
    add(store, rng, 0, pending, d, k)
    ids = [f"req-{uuid.UUID(int=int(rng.integers(0, 2**63))).hex}" for _ in range(closed)]
    for lo in range(0, closed, 10_000):  # closed a batch at a time, as the loop closes them
        store.recent.add_all(ids[lo:lo + 10_000], 1, now=0.0, wall=0.0)
    return store


def add(store: PendingJoins, rng: np.random.Generator, lo: int, n: int, d: int, k: int) -> None:
    probs = rng.dirichlet(np.ones(k), n)
    decided_at = 1.0 + np.arange(lo, lo + n) * 1e-3  # one decision a millisecond
    store.add_decisions([f"ev-{i:012d}" for i in range(lo, lo + n)], rng.standard_normal((n, d)),
                        probs.argmax(axis=1), probs, np.full(n, -1), decided_at,
                        np.zeros(n, np.int64), wall=float(decided_at[-1]))


def close_some(store: PendingJoins, rng: np.random.Generator, n: int, order: str) -> None:
    """Close ``n`` pending decisions: the oldest (feedback after about the same delay for
    all, the usual case), or any (``random``: the worst case for an incremental checkpoint)."""
    live = np.flatnonzero(store.active)
    if order == "fifo":
        live = live[np.argsort(store.decided_at[live], kind="stable")]
        ids = [str(i) for i in store.ids[live[:n]].tolist()]
    else:
        ids = [str(i) for i in store.ids[rng.choice(live, n, replace=False)].tolist()]
    now = float(store.decided_at[live].max())
    store.add_feedback(ids, np.ones(n), np.full(n, now), np.zeros(n, np.int64), wall=now)
    store.drain()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap")
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--closed", type=int, default=400_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--actions", type=int, default=26)
    parser.add_argument("--checkpoints", type=int, default=3)
    parser.add_argument("--turnover", type=int, default=5_000,
                        help="decisions closed (and as many added) between two checkpoints")
    parser.add_argument("--close-order", choices=("fifo", "random"), default="fifo",
                        help="which pending decisions close: the oldest, or any")
    args = parser.parse_args(argv)
    without_hugepage_advice()  # as serve runs (docs/daemon.md §7)
    with ExitStack() as stack:
        bootstrap = args.bootstrap or start_broker(stack)
        topic = f"bench-changelog-{uuid.uuid4().hex[:8]}"
        ensure_topics(bootstrap, [topic], LANES, topic_configs=CHANGELOG_TOPIC_CONFIGS)
        print(f"building {args.pending:,} pending decisions (d={args.features}, "
              f"K={args.actions}) and {args.closed:,} recently closed ids ...", flush=True)
        store = build_state(args.pending, args.closed, args.features, args.actions)
        rng = np.random.default_rng(1)
        arrays, meta = store.export()
        size = sum(a.nbytes for a in arrays.values())
        meta = {"join": meta, "seq": 1, "offsets": []}
        writer = Changelog(KafkaKeyedLog(bootstrap, topic, 0, "bench"))
        began = time.perf_counter()
        writer.publish(1, arrays, meta)
        full_s = time.perf_counter() - began
        print(f"state: {size / 1e6:.1f} MB in {len(arrays)} arrays; first checkpoint "
              f"{writer.bytes_written / 1e6:.1f} MB in {writer.chunks_written} chunks, "
              f"{full_s:.2f} s", flush=True)
        next_id = args.pending
        for seq in range(2, 2 + args.checkpoints):
            close_some(store, rng, args.turnover, args.close_order)
            add(store, rng, next_id, args.turnover, args.features, args.actions)
            next_id += args.turnover
            arrays, join_meta = store.export()
            before, began = writer.bytes_written, time.perf_counter()
            writer.publish(seq, arrays, {"join": join_meta, "seq": seq, "offsets": []})
            print(f"checkpoint {seq} ({args.turnover:,} closed, {args.turnover:,} added): wrote "
                  f"{(writer.bytes_written - before) / 1e6:.1f} MB of "
                  f"{sum(a.nbytes for a in arrays.values()) / 1e6:.1f} MB in "
                  f"{time.perf_counter() - began:.2f} s", flush=True)
        writer.close()

        began = time.perf_counter()
        reader = Changelog(KafkaKeyedLog(bootstrap, topic, 0, "bench"))  # fences the writer
        opened = time.perf_counter() - began
        found = reader.restore()
        read_s = time.perf_counter() - began
        restored = PendingJoins.restore(args.actions, args.features, store.settings,
                                        found.arrays, found.meta["join"])
        total_s = time.perf_counter() - began
        reader.close()
        assert len(restored) == len(store) and len(restored.recent) == len(store.recent)

        with tempfile.TemporaryDirectory() as local:
            write_snapshot(Path(local) / "s", arrays, {"join": join_meta})
            began = time.perf_counter()
            local_arrays, local_meta = read_snapshot(Path(local) / "s")
            PendingJoins.restore(args.actions, args.features, store.settings, local_arrays,
                                 local_meta["join"])
            local_s = time.perf_counter() - began
        print(f"restore from the changelog alone: {total_s:.2f} s (open + fence "
              f"{opened:.2f} s, read {found.records:,} records / {found.bytes_read / 1e6:.1f} MB "
              f"and check them {read_s - opened:.2f} s, rebuild the joins "
              f"{total_s - read_s:.2f} s) for {len(restored):,} pending and "
              f"{len(restored.recent):,} closed ids")
        print(f"the same state from a local snapshot: {local_s:.2f} s "
              f"(changelog / local = {total_s / local_s:.1f}x)")


if __name__ == "__main__":
    main()
