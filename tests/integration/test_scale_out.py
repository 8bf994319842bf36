"""Acceptance of scale-out: replicas in one consumer group, state that moves with its
partitions through the changelog topic (docs/operations.md).

Three ``streamlearn serve --kafka-membership group --checkpoint-changelog true``
processes share a group on 6-partition topics while 60,000 instances stream in,
with feedback delayed by an exponential 0.3 s. Each has a checkpoint directory of
its own, shared with nobody. One replica is SIGKILLed mid-stream and its directory
wiped (a machine that is gone: its partitions go to the others after the session
timeout, restored from the changelog alone); one is paused past its session
timeout (its partitions move; woken, it may publish nothing more for them); a
fourth joins later with an empty directory (the cooperative rebalance moves
partitions to it: their owners hand them over with a final checkpoint). At the
end every replica is stopped with SIGTERM and the six partitions' final
checkpoints are read from the changelog: every id was decided, every feedback
applied exactly once across the group (count and id checksum), nothing expired,
duplicated or lost in the moves, and every re-emitted decision is byte-identical
to the first. Every decision names the merged model it was made with, and after
the stream every live replica serves the newest merged model of the models topic.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from daemon_harness import (
    CLIENTS,
    REPO,
    STARTED,
    Caller,
    make_topics,
    read_all,
    start_publisher,
    wait_until,
)
from kafka import KafkaConsumer, TopicPartition

from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.durability.changelog import Changelog, ChangelogState
from streamlearn.service.counters import id_checksum
from streamlearn.sync.codec import parse
from streamlearn.transport.keyed_log import KafkaKeyedLog

pytestmark = pytest.mark.integration

N = 60_000
PARTITIONS = 6
RATE = 2_000
SYNC_S = 0.5


def replica(bootstrap: str, topics: dict[str, str], group: str, name: str, state: Path,
            log: Path, client: str = "kafka-python",
            changelog: str | None = None) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "streamlearn", "serve", "--bootstrap", bootstrap,
            "--topics-instances", topics["instances_topic"],
            "--topics-feedback", topics["feedback_topic"],
            "--topics-decisions", topics["decisions_topic"],
            "--topics-dead-letter", topics["dead_letter_topic"],
            "--kafka-membership", "group", "--kafka-group-id", group,
            "--kafka-group-instance-id", name, "--kafka-session-timeout-seconds", "6",
            "--checkpoint-dir", str(state), "--checkpoint-every-events", "3000",
            "--checkpoint-every-seconds", "2", "--metrics-port", "-1",
            "--progress-seconds", "0", "--learner", "banditron", "--exploration", "fixed",
            "--gamma", "0.05", "--seed", "5", "--join-window-seconds", "3600",
            "--topics-models", f"models-{group}", "--sync-every-seconds", str(SYNC_S),
            "--kafka-client", client]
    if changelog is not None:
        args += ["--checkpoint-changelog", "true", "--topics-changelog", changelog]
    with open(log, "ab") as out:
        # a session of its own: a replica the test pauses (SIGSTOP) is then alone in its
        # process group, which the kernel hangs up (SIGHUP) when a group it shares with
        # others is orphaned while it is stopped (a test run started detached, as CI may be;
        # one CI run saw a paused replica exit by SIGHUP)
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)},
                                start_new_session=True)
    STARTED.append(proc)  # killed after the test if it is still running (a failed test)
    return proc


def committed(bootstrap: str, topics: dict[str, str], group: str) -> bool:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        parts = [TopicPartition(topics[t], p) for t in ("instances_topic", "feedback_topic")
                 for p in range(PARTITIONS)]
        end = consumer.end_offsets(parts)
        return all((consumer.committed(tp) or 0) >= end[tp] for tp in parts)
    finally:
        consumer.close()


def final_state(bootstrap: str, changelog: str, partition: int) -> ChangelogState:
    """A partition's newest checkpoint in the changelog (read only: fences nobody)."""
    return Changelog(KafkaKeyedLog(bootstrap, changelog, partition, write=False)).restore()


@pytest.mark.parametrize("client", CLIENTS)
def test_replicas_share_the_partitions_and_lose_nothing_when_they_move(
        kafka_bootstrap: str, tmp_path: Path, client: str) -> None:
    X, y = synthetic_stream(N, noise=0.05, seed=12)
    topics = make_topics(kafka_bootstrap, partitions=PARTITIONS)
    group = f"scale-{uuid.uuid4().hex[:6]}"
    models, changelog = f"models-{group}", f"changelog-{group}"
    names = ("r1", "r2", "r3", "r4")
    logs = {name: tmp_path / f"{name}.log" for name in names}
    disks = {name: tmp_path / f"disk-{name}" for name in names}  # shared with nobody
    caller = Caller(kafka_bootstrap, topics, y, delay_mean_s=0.3)
    caller.start()

    def start(name: str) -> subprocess.Popen[bytes]:
        return replica(kafka_bootstrap, topics, group, name, disks[name], logs[name], client,
                       changelog)

    procs = {name: start(name) for name in ("r1", "r2", "r3")}

    def tails() -> str:
        return "\n".join(f"--- {n}\n{p.read_text()[-1500:]}" for n, p in logs.items()
                         if p.exists())

    def started() -> set[str]:
        return {d.name for d in tmp_path.glob("disk-*/partition-*")}

    try:  # from the first replica on: a failure anywhere stops them all
        wait_until(lambda: len(started()) == PARTITIONS, 60,
                   "the group to assign every partition", tails)
        publisher = start_publisher(kafka_bootstrap, topics["instances_topic"], X, y, RATE)
        wait_until(lambda: len(caller.first) >= 0.2 * N, 120, "the stream to progress", tails)
        procs["r2"].send_signal(signal.SIGKILL)  # mid-stream; its partitions move after 6 s
        procs["r2"].wait(30)
        shutil.rmtree(disks["r2"])  # the machine is gone: only the changelog has its state
        killed_at = len(caller.first)
        wait_until(lambda: len(caller.first) >= 0.35 * N, 180, "the stream to go on", tails)
        procs["r3"].send_signal(signal.SIGSTOP)  # past the 6 s session timeout: evicted
        time.sleep(10)
        procs["r3"].send_signal(signal.SIGCONT)
        paused_at = len(caller.first)
        wait_until(lambda: len(caller.first) >= paused_at + 1000, 180, "the stream to go on",
                   tails)
        procs["r4"] = start("r4")
        added_at = len(caller.first)
        publisher.join(120)
        wait_until(lambda: len(caller.first) == N, 300, "a decision for every id",
                   lambda: f"{len(caller.first)} decided\n{tails()}")
        wait_until(lambda: len(caller.feedback_ids) == N, 120, "feedback for every decision")
        wait_until(lambda: committed(kafka_bootstrap, topics, f"{group}.partitions"), 120,
                   "the replicas to commit all input", tails, interval_s=1.0)
        time.sleep(2 * SYNC_S)  # the stream has ended: one sync interval to adopt the last model
        moved = "partitions [" in logs["r4"].read_text()
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGCONT)  # a failure while one was paused
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = {name: proc.wait(60) for name, proc in procs.items()}
        caller.stop()
    assert codes == {"r1": 0, "r2": -signal.SIGKILL, "r3": 0, "r4": 0}, tails()
    assert caller.error is None
    print(f"killed r2 at {killed_at} decided ids, paused r3 until {paused_at}, added r4 at "
          f"{added_at}; {caller.n_decisions} decision messages for {N} ids")
    assert killed_at < paused_at < added_at < N and moved, tails()  # every move hit a live stream
    restored = sum(logs[n].read_text().count("restored checkpoint") for n in ("r1", "r3", "r4"))
    assert restored > 0, tails()

    assert sorted(caller.first) == sorted(f"e{i}" for i in range(N))
    assert caller.mismatches == []  # re-emitted decisions identical, wherever they were made

    # every feedback applied exactly once across the group: the partitions' final checkpoints,
    # as the changelog holds them
    feedback = [orjson.loads(r.value)["id"] for r in read_all(kafka_bootstrap,
                                                              topics["feedback_topic"])]
    assert len(feedback) == len(set(feedback)) == N
    joined = instances = 0
    checksum = 0
    for p in range(PARTITIONS):
        state = final_state(kafka_bootstrap, changelog, p)
        assert state.manifest is not None, p
        counters = state.meta["counters"]
        joined += counters["feedback"]["joined"]
        instances += counters["instances"]
        checksum = (checksum + int(counters["applied_checksum"])) % (1 << 64)
        for outcome in ("late", "expired", "unknown", "duplicate"):
            assert counters["feedback"][outcome] == 0, (p, counters)
        assert counters["invalid"] == {}
        assert state.meta["join"]["early"] == []
        assert state.arrays["pending.action"].size == 0  # nothing left pending
    assert joined == instances == N
    assert checksum == id_checksum(feedback)
    # ... and as an operator reads it
    shown = subprocess.run([sys.executable, "-m", "streamlearn", "inspect", "--changelog",
                            changelog, "--bootstrap", kafka_bootstrap, "--json"],
                           capture_output=True, text=True, check=True, cwd=REPO)
    totals = orjson.loads(shown.stdout)["totals"]
    assert (totals["instances"], totals["joined"], totals["pending_joins"]) == (N, N, 0)
    assert int(totals["applied_checksum"]) == id_checksum(feedback)
    for name in ("r1", "r3", "r4"):
        assert "Traceback" not in logs[name].read_text(), tails()

    # model synchronisation: every decision names the merged model it came from, and after the
    # stream every live replica serves the newest merged model
    versions = [int(orjson.loads(v)["model"].split("-g")[1].split("-")[0])
                for v in caller.first.values() if "-g" in orjson.loads(v)["model"]]
    assert len(versions) > 0.5 * N
    newest = max(parse(r.value)[0]["version"] for r in read_all(kafka_bootstrap, models)
                 if parse(r.value)[0]["kind"] == "global")
    print(f"decisions named merged models 1 to {max(versions)} "
          f"({len(set(versions))} distinct); the newest merged: {newest}")
    # the decisions followed the merged models as they advanced during the stream: on a busy
    # machine up to the 22nd-29th (26-33 merged), and in 1 of 15 runs beside an outside test
    # only up to the 10th (21 merged; the merger's pause and two rebalances cost merges)
    assert newest >= max(versions) > 5
    for name in ("r1", "r3", "r4"):
        summary = re.search(r"newest seen (\d+), adopted (\d+)", logs[name].read_text())
        assert summary and int(summary.group(1)) == int(summary.group(2)) == newest, tails()


def test_a_paused_replica_never_publishes_over_a_newer_model(kafka_bootstrap: str,
                                                             tmp_path: Path) -> None:
    """The merger (the owner of partition 0) is paused past the session timeout while the
    stream flows; the other replica takes its partitions and merges on. Woken up, the paused
    one must not publish a model older than the newest, and must stop serving what it lost."""
    X, y = synthetic_stream(20_000, noise=0.05, seed=13)
    topics = make_topics(kafka_bootstrap, partitions=2)
    group, state = f"pause-{uuid.uuid4().hex[:6]}", tmp_path / "state"
    models = f"models-{group}"
    logs = {name: tmp_path / f"{name}.log" for name in ("p1", "p2")}
    caller = Caller(kafka_bootstrap, topics, y, delay_mean_s=0.1)
    caller.start()
    procs = {name: replica(kafka_bootstrap, topics, group, name, state, logs[name])
             for name in logs}

    def tails() -> str:
        return "\n".join(f"--- {n}\n{p.read_text()[-1500:]}" for n, p in logs.items())

    try:  # from the first replica on: a failure anywhere stops them all
        wait_until(lambda: len(list(state.glob("partition-*/owner"))) == 2, 60,
                   "the group to assign both partitions", tails)
        publisher = start_publisher(kafka_bootstrap, topics["instances_topic"], X, y, 1000)
        wait_until(lambda: len(caller.first) >= 4000, 120, "the stream to progress", tails)
        owner = orjson.loads((state / "partition-0" / "owner").read_bytes())["replica"]
        paused = procs[owner]
        paused.send_signal(signal.SIGSTOP)
        time.sleep(15)  # past the 6 s session timeout: the other replica takes partition 0
        paused.send_signal(signal.SIGCONT)
        publisher.join(120)
        wait_until(lambda: len(caller.first) == 20_000, 300, "a decision for every id", tails)
        time.sleep(3)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGCONT)  # a failure while one was paused
            proc.send_signal(signal.SIGTERM)
        codes = [proc.wait(60) for proc in procs.values()]
        caller.stop()
    assert codes == [0, 0], tails()
    order = [(parse(r.value)[0]["version"], parse(r.value)[0]["replica"])
             for r in read_all(kafka_bootstrap, models) if parse(r.value)[0]["kind"] == "global"
             and parse(r.value)[0]["i"] == 0]
    mergers = [who for _, who in order]
    assert owner in mergers and len(set(mergers)) == 2, order  # the role moved, and back
    versions = [v for v, _ in order]
    assert versions == sorted(versions) and len(set(versions)) == len(versions), order
    assert "claimed by another replica" in logs[owner].read_text() or \
        "lost" in logs[owner].read_text(), tails()
