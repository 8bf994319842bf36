"""Scale-out on a real broker: CPU per event and online error, 1 replica against R replicas.

For each replica count it creates fresh 6-partition topics (``--partitions-per-replica
k``: k partitions per replica, so that every replica owns as many partitions
whatever the count), starts that many
``streamlearn serve --kafka-membership group`` processes, waits until every
partition is claimed, streams the dataset with ``streamlearn simulate`` (its
summary gives the online error: 1 − rewards / feedback), then reads each
replica's CPU time (``/proc/<pid>/stat``, user + system) since it was ready and
stops it with SIGTERM. Without ``--bootstrap`` a broker is started with
``deploy/kafka/kafka.sh`` and stopped at the end.

    python -m simulators.bench_scale_out --events 60000 --rate 2000 --replicas 1,3
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.config import SyncConfig
from streamlearn.transport.kafka_clients import CLIENTS

REPO = Path(__file__).resolve().parents[1]
PARTITIONS = 6


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch_totals(state: Path) -> tuple[int, int]:
    """(instances, instance batches) summed over the partitions' newest checkpoints (on the
    shared directory, or the newest of each partition over the replicas' own)."""
    newest: dict[str, tuple[int, Path]] = {}
    for part in [*state.glob("partition-*"), *state.glob("r*/partition-*")]:
        for ckpt in part.glob("ckpt-*"):
            seq = int(ckpt.name.split("-")[1])
            if seq > newest.get(part.name, (-1, ckpt))[0]:
                newest[part.name] = (seq, ckpt)
    instances = batches = 0
    for _, ckpt in newest.values():
        counters = orjson.loads((ckpt / "meta.json").read_bytes())["counters"]
        instances += int(counters["instances"])
        batches += int(counters["instance_batches"])
    return instances, batches


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)


def run(bootstrap: str, replicas: int, args: argparse.Namespace) -> dict[str, Any]:
    # the same offered load for every replica count, or (--per-replica-rate) the same per replica
    rate, events = args.rate, args.events
    if args.per_replica_rate:
        most = max(int(r) for r in args.replicas.split(","))
        rate, events = args.per_replica_rate * replicas, args.events * replicas // most
    partitions = args.partitions_per_replica * replicas or PARTITIONS
    tag = uuid.uuid4().hex[:6]
    topics = ["--topics-instances", f"i-{tag}", "--topics-feedback", f"f-{tag}",
              "--topics-decisions", f"d-{tag}", "--topics-dead-letter", f"x-{tag}",
              "--topics-models", f"m-{tag}", "--topics-partitions", str(partitions)]
    state = Path(tempfile.mkdtemp(prefix="sl-scale-"))
    from streamlearn.datasets.caller import StreamSource

    source = StreamSource(args.dataset)
    dims = ["--learner-n-actions", str(source.n_classes),
            "--learner-n-features", str(source.n_features)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = []
    for r in range(replicas):
        log = open(state / f"r{r}.log", "wb")  # noqa: SIM115
        # --changelog: each replica's own directory, the state on the changelog topic
        own = (["--checkpoint-dir", str(state / f"r{r}"), "--checkpoint-changelog", "true",
                "--topics-changelog", f"c-{tag}"] if args.changelog
               else ["--checkpoint-dir", str(state)])
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "streamlearn", "serve", "--bootstrap", bootstrap, *topics,
             "--kafka-membership", "group", "--kafka-group-id", f"g-{tag}",
             "--kafka-group-instance-id", f"r{r}", *own,
             "--metrics-port", "-1", "--progress-seconds", "0", "--learner", args.learner,
             "--join-window-seconds", "3600", "--sync-every-seconds", str(args.sync_seconds),
             "--kafka-round-seconds", str(args.round_seconds),
             "--kafka-client", args.kafka_client, *dims],
            stdout=log, stderr=subprocess.STDOUT, env=env))
    deadline = time.monotonic() + 120
    while len({p.name for p in [*state.glob("partition-*/owner"), *state.glob("r*/partition-*")]}
              ) < partitions:
        if time.monotonic() > deadline:
            raise SystemExit(f"the group did not assign every partition; see {state}")
        time.sleep(0.2)
    time.sleep(2.0)  # the last restores and the first merges
    before = [cpu_seconds(p.pid) for p in procs]
    started = time.monotonic()
    if args.idle_seconds:  # no traffic: what the replicas cost by just being there
        time.sleep(args.idle_seconds)
        cpu = [cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True)]
        stop(procs)
        return {"replicas": replicas, "cpu_ms_per_second": 1000 * sum(cpu) / args.idle_seconds,
                "cpu_s_per_replica": [round(c, 2) for c in cpu]}
    done = subprocess.run(
        [sys.executable, "-m", "streamlearn", "simulate", "--bootstrap", bootstrap, *topics,
         "--dataset", args.dataset, "--rate", str(rate), "--events", str(events),
         "--delay-mean", str(args.delay_mean), "--seed", "3", "--json",
         "--progress-seconds", "0", "--wait-seconds", "120"], capture_output=True, text=True,
        env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"simulate failed: {done.stderr[-2000:]}")
    elapsed = time.monotonic() - started
    cpu = [cpu_seconds(p.pid) - b for p, b in zip(procs, before, strict=True)]
    stop(procs)
    summary = orjson.loads(done.stdout)
    answered = summary["feedback_sent"]
    instances, batches = batch_totals(state)
    return {"events_per_batch": instances / max(batches, 1), "replicas": replicas,
            "events": summary["decisions_received"],
            "error": 1.0 - summary["rewards"] / max(answered, 1), "seconds": elapsed,
            "cpu_s": sum(cpu), "cpu_ms_per_event": 1000 * sum(cpu) / max(events, 1),
            "rate": rate,
            "cpu_s_per_replica": [round(c, 2) for c in cpu]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bootstrap")
    parser.add_argument("--dataset", default="synnonsep")
    parser.add_argument("--learner", default="linucb")
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--delay-mean", type=float, default=0.3)
    parser.add_argument("--replicas", default="1,3")
    parser.add_argument("--sync-seconds", type=float, default=SyncConfig().every_seconds,
                        help="serve --sync-every-seconds (default: serve's own)")
    parser.add_argument("--round-seconds", type=float, default=0.1,
                        help="serve --kafka-round-seconds (the shortest round of a replica)")
    parser.add_argument("--per-replica-rate", type=float, default=0.0,
                        help="weak scaling: offer each replica count this rate per replica (and "
                        "--events x R / max R events), instead of --rate to every count")
    parser.add_argument("--partitions-per-replica", type=int, default=0,
                        help="topics with this many partitions per replica (instead of 6 for "
                        "every count): with --per-replica-rate, each replica then has the same "
                        "load, partitions and batch sizes whatever the count")
    parser.add_argument("--changelog", action="store_true",
                        help="each replica with a directory of its own and the partitions' state "
                        "on a changelog topic (checkpoint.changelog), as on Kubernetes")
    parser.add_argument("--kafka-client", default="kafka-python", choices=sorted(CLIENTS),
                        help="the replicas' Kafka client (serve --kafka-client): kafka-python or "
                        "confluent, for the data, the models topic and the membership (the "
                        "changelog uses kafka-python either way)")
    parser.add_argument("--idle-seconds", type=float, default=0.0,
                        help="instead of a stream: the replicas' CPU over this many idle seconds")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the replica counts this many times, alternating (1 3 1 3 ...), "
                        "and report each run and the means")
    args = parser.parse_args(argv)
    broker_dir = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        broker_dir = tempfile.mkdtemp(prefix="sl-kafka-")
        started = subprocess.run([str(REPO / "deploy" / "kafka" / "kafka.sh"), "start", "--dir",
                                  broker_dir], capture_output=True, text=True, check=True)
        bootstrap = started.stdout.strip().splitlines()[-1]
    try:
        rows = []
        for k in range(args.repeats):
            for r in args.replicas.split(","):
                rows.append(run(bootstrap, int(r), args))
                print(f"run {k + 1}/{args.repeats}, {r} replicas: " + ", ".join(
                    f"{key} {value}" for key, value in rows[-1].items()
                    if key in ("error", "cpu_ms_per_event", "cpu_ms_per_second")),
                    file=sys.stderr, flush=True)
    finally:
        if broker_dir is not None:
            subprocess.run([str(REPO / "deploy" / "kafka" / "kafka.sh"), "stop", "--dir",
                            broker_dir], capture_output=True, check=False)
    if args.idle_seconds:
        print(f"idle replicas over {args.idle_seconds:.0f} s (6 partitions, sync every "
              f"{args.sync_seconds} s, shortest round {args.round_seconds} s):")
        for row in rows:
            print(f"  {row['replicas']} replica(s): {row['cpu_ms_per_second']:.1f} CPU-ms per second "
                  f"(per replica, CPU-s: {row['cpu_s_per_replica']})")
        return 0
    counts = [int(r) for r in args.replicas.split(",")]
    means = {n: {key: float(np.mean([row[key] for row in rows if row["replicas"] == n]))
                 for key in ("error", "cpu_ms_per_event", "events_per_batch")} for n in counts}
    base = rows[0]
    load = (f"{args.per_replica_rate:.0f} events/s per replica" if args.per_replica_rate
            else f"{args.events} events at {args.rate:.0f}/s")
    layout = (f"{args.partitions_per_replica} partitions per replica"
              if args.partitions_per_replica else f"{PARTITIONS} partitions")
    print(f"{args.dataset}, {args.learner}, {load}, feedback "
          f"delay {args.delay_mean} s (exponential), {layout}, sync every "
          f"{args.sync_seconds} s, shortest round {args.round_seconds} s, "
          f"Kafka client {args.kafka_client}:")
    print("| replicas | online error | Δ vs 1 | events / batch | CPU-s (all replicas) | "
          "CPU-ms / event | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['replicas']} | {row['error']:.4f} | {row['error'] - base['error']:+.4f} | "
              f"{row['events_per_batch']:.1f} | "
              f"{row['cpu_s']:.1f} {row['cpu_s_per_replica']} | {row['cpu_ms_per_event']:.3f} | "
              f"{row['cpu_ms_per_event'] / base['cpu_ms_per_event']:.2f} |")
    if args.repeats > 1:
        first = means[counts[0]]
        print(f"\nmeans over {args.repeats} runs each:")
        print("| replicas | online error | Δ vs 1 | events / batch | CPU-ms / event | ratio |")
        print("|---:|---:|---:|---:|---:|---:|")
        for n, m in means.items():
            print(f"| {n} | {m['error']:.4f} | {m['error'] - first['error']:+.4f} | "
                  f"{m['events_per_batch']:.1f} | {m['cpu_ms_per_event']:.3f} | "
                  f"{m['cpu_ms_per_event'] / first['cpu_ms_per_event']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
