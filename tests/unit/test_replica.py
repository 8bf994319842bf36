"""A replica's partition daemons follow the group's assignment; their state moves with them.

The group protocol is replaced by a fake membership whose handlers the test
calls (what kafka-python's rebalance listener does inside ``poll``); transports
are in-memory, restricted to one partition each, over one shared broker; the
checkpoint directory is shared, as on the shared storage of a deployment.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from loop_helpers import Clock, settings_of

from streamlearn.commands.inspect import run as run_inspect
from streamlearn.commands.inspect_group import describe_group
from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.errors import TransportError
from streamlearn.learners.banditron import Banditron
from streamlearn.learners.exploration import FixedGamma
from streamlearn.service import replica as replica_module
from streamlearn.service.claims import PartitionClaims
from streamlearn.service.counters import id_checksum
from streamlearn.service.daemon import Daemon
from streamlearn.service.metrics import Observer
from streamlearn.service.replica import Replica
from streamlearn.snapshot import read_snapshot
from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport, partition_for_key

P, N = 4, 2000
X, Y = synthetic_stream(N, noise=0.05, seed=4)


class FakeMembership:
    def __init__(self, **handlers: Any) -> None:
        self.handlers = handlers
        self.closed = False
        self.session_timeout_s = 0.0
        self.assignment: set[int] = set()  # what the group assigns, as the client heard

    def poll(self, timeout_s: float = 0.0) -> None:
        pass

    def assigned(self) -> set[int]:
        return set(self.assignment)

    def close(self) -> None:
        self.closed = True


class BrokerAway(InMemoryTransport):
    """Decisions go out but are never acknowledged: every flush waits its whole timeout, then
    fails, as with the broker away."""

    def flush(self, timeout_s: float) -> None:
        self._check_open()
        time.sleep(timeout_s)
        raise TransportError(f"not acknowledged within {timeout_s:.1f} s (test: broker away)")


def make_replica(broker: InMemoryBroker, state: Path, clock: Clock,
                 claims: PartitionClaims | None = None,
                 observer: Observer | None = None,
                 transport_class: type[InMemoryTransport] = InMemoryTransport,
                 flush_timeout_s: float = 10.0) -> Replica:
    """A replica over in-memory partitions; ``observer``: the one its partition daemons and
    the replica itself report to, as ``serve`` builds them."""
    def make_daemon(p: int) -> Daemon:
        settings = settings_of(checkpoint_dir=str(state / f"partition-{p}"),
                                  checkpoint_every_events=150, checkpoint_every_seconds=1e9,
                                  join_window_seconds=30.0, limits_poll_timeout_seconds=0.0,
                                  flush_timeout_seconds=flush_timeout_s)
        transport = transport_class(broker=broker, partitions=P, only=[p])
        return Daemon(settings, transport, Banditron(9, 400, FixedGamma(0.05), seed=1),
                      observer, wall_clock=clock)
    return Replica(make_daemon, FakeMembership, claims=claims, observer=observer)


def answer(broker: InMemoryBroker, writer: InMemoryTransport, answered: set[str],
           ts: float) -> list[str]:
    fed = []
    for m in broker.messages("decisions"):
        d = orjson.loads(m.value or b"")
        if d["id"] not in answered:
            answered.add(d["id"])
            reward = float(d["action"] == Y[int(d["id"][1:])])
            writer.append_feedback(m.key, orjson.dumps({"id": d["id"], "reward": reward,
                                                        "ts": ts}))
            fed.append(d["id"])
    return fed


def rounds(*replicas: Replica, n: int = 5) -> None:
    for _ in range(n):
        for r in replicas:
            r.step()


def test_partitions_move_between_replicas_and_every_feedback_is_applied_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broker, clock = InMemoryBroker(P), Clock()
    writer = InMemoryTransport(broker=broker, partitions=P, group_id="caller")
    a, b = make_replica(broker, tmp_path, clock), make_replica(broker, tmp_path, clock)
    a.membership.handlers["on_assigned"]([0, 1, 2, 3])  # type: ignore[attr-defined]
    answered: set[str] = set()
    fed: list[str] = []
    decisions: dict[str, bytes] = {}
    mismatches = []

    def block(lo: int, hi: int) -> None:
        clock.t += 1.0
        for i in range(lo, hi):
            nz = np.flatnonzero(X[i])
            writer.append_instance(f"e{i}".encode(), orjson.dumps(
                {"id": f"e{i}", "x": {"idx": nz.tolist(), "val": X[i, nz].tolist()}}))
        rounds(a, b)
        for m in broker.messages("decisions"):
            d = orjson.loads(m.value or b"")
            if decisions.setdefault(d["id"], m.value or b"") != m.value:
                mismatches.append(d["id"])
        fed.extend(answer(broker, writer, answered, clock.t))
        rounds(a, b)

    block(0, 500)
    # a rebalance moves 2 and 3 to b: a hands them over with a final checkpoint
    a.membership.handlers["on_revoked"]([2, 3])  # type: ignore[attr-defined]
    b.membership.handlers["on_assigned"]([2, 3])  # type: ignore[attr-defined]
    assert sorted(a.daemons) == [0, 1] and sorted(b.daemons) == [2, 3]
    block(500, 1000)
    # a is evicted (lost, no checkpoint: b owns 0 and 1 now) in the middle of its work
    clock.t += 1.0
    for i in range(1000, 1300):
        nz = np.flatnonzero(X[i])
        writer.append_instance(f"e{i}".encode(), orjson.dumps(
            {"id": f"e{i}", "x": {"idx": nz.tolist(), "val": X[i, nz].tolist()}}))
    rounds(a, b)  # decided and journaled by a, not checkpointed
    a.membership.handlers["on_lost"]([0, 1])  # type: ignore[attr-defined]
    b.membership.handlers["on_assigned"]([0, 1])  # type: ignore[attr-defined]
    assert not a.daemons and sorted(b.daemons) == [0, 1, 2, 3] and b.moves == 4
    rounds(b)
    fed.extend(answer(broker, writer, answered, clock.t))
    rounds(b)
    block(1300, N)
    clock.t += 60.0  # idle: nothing is pending any more
    rounds(b)
    for p in list(b.daemons):
        b._retire(p, checkpoint=True, how="stopped")

    assert sorted(decisions) == sorted(f"e{i}" for i in range(N)) and mismatches == []
    assert len(broker.messages("decisions")) > N  # b re-emitted a's unsaved decisions
    joined = checksum = instances = 0
    for p in range(P):
        _arrays, meta = read_snapshot(sorted((tmp_path / f"partition-{p}").glob("ckpt-*"))[-1])
        c = meta["counters"]
        joined += c["feedback"]["joined"]
        instances += c["instances"]
        checksum = (checksum + int(c["applied_checksum"])) % (1 << 64)
        assert c["feedback"]["duplicate"] == c["feedback"]["expired"] == 0
    assert joined == instances == len(fed) == N
    assert checksum == id_checksum(fed)

    # `streamlearn inspect STATE_DIR` sums the group the same way
    group = describe_group(tmp_path)
    assert [row["partition"] for row in group["partitions"]] == list(range(P))
    assert group["totals"]["joined"] == group["totals"]["instances"] == N
    assert int(group["totals"]["applied_checksum"]) == id_checksum(fed)
    assert group["totals"]["pending_joins"] == 0
    args = argparse.Namespace(path=str(tmp_path), json=False, all=False, changelog=None,
                              bootstrap=None)
    assert run_inspect(args) == 0
    text = capsys.readouterr().out
    assert f"instances {N:,}, joined {N:,}" in text and "partition" not in text.split("\n")[0][:5]


def test_a_stop_while_the_broker_is_away_waits_for_it_once_not_once_per_partition(
        tmp_path: Path) -> None:
    """Each partition's final checkpoint waited ``flush_timeout_seconds`` for the broker in
    turn: with it away, a replica of six partitions took over three minutes to stop. The final
    checkpoints of one stop share that bound; those past it are not written, and the
    partitions restore exactly from their last checkpoints and journals, as after a crash."""
    broker, clock = InMemoryBroker(P), Clock()
    writer = InMemoryTransport(broker=broker, partitions=P, group_id="caller")
    away = make_replica(broker, tmp_path, clock, transport_class=BrokerAway, flush_timeout_s=1.0)
    away.membership.handlers["on_assigned"](list(range(P)))  # type: ignore[attr-defined]
    for i in range(300):  # the periodic checkpoints at 150 messages fail too: journal only
        nz = np.flatnonzero(X[i])
        writer.append_instance(f"e{i}".encode(), orjson.dumps(
            {"id": f"e{i}", "x": {"idx": nz.tolist(), "val": X[i, nz].tolist()}}))
    rounds(away, n=3)
    first = {orjson.loads(m.value or b"")["id"]: m.value for m in broker.messages("decisions")}
    assert len(first) == 300
    away.request_stop()
    started = time.monotonic()
    away.run()
    took = time.monotonic() - started
    assert took < 2.0, took  # one bound of 1 s for the stop; P × 1 s before
    for p in range(P):  # no final checkpoint: the first failed, the rest were past the bound
        assert not list((tmp_path / f"partition-{p}").glob("ckpt-*")), p

    back = make_replica(broker, tmp_path, clock)  # the broker is back: a restart
    back.membership.handlers["on_assigned"](list(range(P)))  # type: ignore[attr-defined]
    rounds(back)
    answered: set[str] = set()
    fed = answer(broker, writer, answered, clock.t)
    clock.t += 1.0
    rounds(back)
    again = [orjson.loads(m.value or b"") for m in broker.messages("decisions")]
    assert len(again) > 300  # the journal's decisions were published again ...
    assert all(first[orjson.loads(m.value or b"")["id"]] == m.value
               for m in broker.messages("decisions"))  # ... byte for byte
    back._retire_with_checkpoints(list(back.daemons), how="stopped")
    joined = instances = 0
    for p in range(P):
        _arrays, meta = read_snapshot(sorted((tmp_path / f"partition-{p}").glob("ckpt-*"))[-1])
        joined += meta["counters"]["feedback"]["joined"]
        instances += meta["counters"]["instances"]
        assert meta["counters"]["feedback"]["duplicate"] == 0
    assert instances == 300 and joined == len(fed) == 300


def test_a_replica_that_leaves_takes_no_partition_the_group_assigns_meanwhile(
        tmp_path: Path) -> None:
    """Leaving the group applies its pending changes: after an outage during a stop the group
    assigned a librdkafka replica its six partitions again, and it restored each (4.6 s)
    only to hand it over (an outside test). Once its partitions are retired it takes none."""
    broker, clock = InMemoryBroker(P), Clock()
    replica = make_replica(broker, tmp_path, clock)
    replica.membership.handlers["on_assigned"]([0, 1])  # type: ignore[attr-defined]
    started: list[int] = []
    make_daemon = replica.make_daemon

    def make_and_count(p: int) -> Daemon:
        started.append(p)
        return make_daemon(p)

    replica.make_daemon = make_and_count

    def close() -> None:  # the group's last change, applied while leaving
        replica.membership.handlers["on_assigned"]([0, 1, 2, 3])  # type: ignore[attr-defined]

    replica.membership.close = close  # type: ignore[method-assign]
    replica.request_stop()
    replica.run()
    assert started == [] and replica.daemons == {}


def test_inspect_of_one_replicas_directory_leaves_out_partitions_another_replica_took(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the changelog each replica has a directory of its own, and one keeps its copy of
    a partition the group moved away: `inspect` summed those stale copies with the
    partitions it served (an outside test)."""
    broker, clock = InMemoryBroker(P), Clock()
    writer = InMemoryTransport(broker=broker, partitions=P, group_id="caller")
    a = make_replica(broker, tmp_path / "a", clock)
    a.membership.handlers["on_assigned"]([0, 1, 2, 3])  # type: ignore[attr-defined]
    clock.t += 1.0
    for i in range(400):
        nz = np.flatnonzero(X[i])
        writer.append_instance(f"e{i}".encode(), orjson.dumps(
            {"id": f"e{i}", "x": {"idx": nz.tolist(), "val": X[i, nz].tolist()}}))
    rounds(a)
    a.membership.handlers["on_revoked"]([2, 3])  # type: ignore[attr-defined]
    a.membership.handlers["on_lost"]([1])  # type: ignore[attr-defined]
    a.daemons[0].checkpoint(final=True)
    group = describe_group(tmp_path / "a")
    rows = {row["partition"]: row for row in group["partitions"]}
    assert [rows[p]["released"]["how"] for p in (1, 2, 3)] == ["dropped", "handed over",
                                                              "handed over"]
    assert "released" not in rows[0] and rows[0]["instances"] > 0
    assert group["totals"]["instances"] == rows[0]["instances"] < 400
    assert "another replica took" in group["note"]
    a.membership.handlers["on_assigned"]([2])  # type: ignore[attr-defined]
    a._retire(0, checkpoint=True, how="stopped")  # this replica stops: its copy stays counted
    again = {row["partition"]: row for row in describe_group(tmp_path / "a")["partitions"]}
    assert "released" not in again[2] and again[0]["released"]["how"] == "stopped"
    args = argparse.Namespace(path=str(tmp_path / "a"), json=False, all=False, changelog=None,
                              bootstrap=None)
    assert run_inspect(args) == 0
    text = capsys.readouterr().out
    assert "handed over" in text and "dropped" in text and "stopped" in text


class RecordingMembership(FakeMembership):
    def __init__(self, **handlers: Any) -> None:
        super().__init__(**handlers)
        self.waits: list[float] = []

    def poll(self, timeout_s: float = 0.0) -> None:
        self.waits.append(timeout_s)


@pytest.mark.parametrize("backlog, waits", [(5, True), (50, False)])
def test_a_round_that_filled_no_batch_waits_out_the_shortest_round(
        tmp_path: Path, backlog: int, waits: bool) -> None:
    """Pacing (kafka.round_seconds): small batches → the replica waits the rest of the round
    (for group changes) before polling again; a full micro-batch → the next round at once."""
    broker = InMemoryBroker(P)

    def make_daemon(p: int) -> Daemon:
        settings = settings_of(checkpoint_dir=str(tmp_path / f"partition-{p}"),
                                  limits_poll_timeout_seconds=0.0, limits_poll_max_records=20)
        return Daemon(settings, InMemoryTransport(broker=broker, partitions=P, only=[p]),
                      Banditron(9, 400, FixedGamma(0.05), seed=1))

    replica = Replica(make_daemon, RecordingMembership, round_s=0.05)
    membership = replica.membership
    assert isinstance(membership, RecordingMembership)
    membership.handlers["on_assigned"]([0])
    writer = InMemoryTransport(broker=broker, partitions=P)
    for i in range(backlog * P):  # keys spread the events over the partitions
        writer.append_instance(f"e{i}".encode(), orjson.dumps(
            {"id": f"e{i}", "x": X[i].tolist(), "label": int(Y[i])}))
    replica.step()
    first, *rest = membership.waits
    assert first == 0.0  # with partitions owned, the group is polled without waiting first
    assert bool(rest) is waits
    assert all(0.0 < w <= 0.05 for w in rest)


def test_a_replica_that_loses_its_claim_during_a_step_publishes_nothing_of_that_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race CI caught: replica a checked its claim, and while it decided the batch it had
    polled, replica b claimed the partition and restored its state (journal included). a
    must not journal and publish that batch: b decides those ids, and every id has one
    decision. Without the check before journaling, a's decisions went out as well, and b's
    differed."""
    monkeypatch.setattr(replica_module, "RELEASE_GRACE_S", 0.05)  # a cannot release meanwhile
    broker, clock = InMemoryBroker(P), Clock()
    writer = InMemoryTransport(broker=broker, partitions=P, group_id="caller")
    a = make_replica(broker, tmp_path, clock, PartitionClaims(tmp_path, "a"))
    b = make_replica(broker, tmp_path, clock, PartitionClaims(tmp_path, "b"))
    a.membership.handlers["on_assigned"]([0])  # type: ignore[attr-defined]
    daemon = a.daemons[0]
    polled = daemon._poll

    def poll_then_lose() -> list[Any]:
        messages = polled()
        if messages:  # b takes the partition over in the middle of a's step
            b.membership.handlers["on_assigned"]([0])  # type: ignore[attr-defined]
        return messages

    daemon._poll = poll_then_lose  # type: ignore[method-assign]
    ids = [i for i in range(400) if partition_for_key(f"e{i}".encode(), P, 0) == 0][:40]
    for i in ids:
        nz = np.flatnonzero(X[i])
        writer.append_instance(f"e{i}".encode(), orjson.dumps(
            {"id": f"e{i}", "x": {"idx": nz.tolist(), "val": X[i, nz].tolist()}}))
    a.step()
    assert not a.daemons and list(b.daemons) == [0]  # a dropped the partition
    assert broker.messages("decisions") == []  # ... before publishing anything of that step
    rounds(b)
    decided = [orjson.loads(m.value or b"")["id"] for m in broker.messages("decisions")]
    assert sorted(decided) == sorted(f"e{i}" for i in ids)  # each once, by b
    assert (tmp_path / "partition-0" / "released-1").exists()  # a's release, for the next one


def test_readiness_names_a_partition_whose_journal_the_changelog_refuses(tmp_path: Path) -> None:
    replica = make_replica(InMemoryBroker(P), tmp_path, Clock())
    assert replica.readiness() == (False, "0 partitions owned")
    replica.membership.handlers["on_assigned"]([0, 1])  # type: ignore[attr-defined]
    replica.ready = True
    assert replica.readiness() == (True, "2 partitions owned")
    # the serving thread retries a refused journal record, holding that batch's decisions
    replica.daemons[1].journal_refused_since = time.monotonic() - 3.2
    ready, reason = replica.readiness()
    assert not ready and reason == ("partition 1: the changelog has refused the decision "
                                    "journal for 3 s: decisions held"), reason
    replica.daemons[1].journal_refused_since = None  # written at last
    assert replica.readiness() == (True, "2 partitions owned")


def test_readiness_is_not_ready_while_a_partition_restores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica restoring a partition it was just given decides nothing meanwhile, for any
    of its partitions; it answered ready through a restore after a broker outage (an outside
    test) until the round had run ROUND_STALL_S."""
    replica = make_replica(InMemoryBroker(P), tmp_path, Clock())
    replica.membership.handlers["on_assigned"]([0])  # type: ignore[attr-defined]
    replica.ready = True
    assert replica.readiness() == (True, "1 partitions owned")
    seen: list[tuple[bool, str]] = []
    restore = Daemon.restore

    def probed_restore(daemon: Daemon) -> None:
        seen.append(replica.readiness())  # what /readyz answers from another thread now
        restore(daemon)

    monkeypatch.setattr(Daemon, "restore", probed_restore)
    replica.membership.handlers["on_assigned"]([0, 1])  # type: ignore[attr-defined]
    assert seen == [(False, "partition 1: restoring its state: decisions held")]
    assert replica.readiness() == (True, "2 partitions owned")
    monkeypatch.setattr(Daemon, "restore", lambda daemon: (_ for _ in ()).throw(OSError("x")))
    with pytest.raises(OSError):  # a failed restore does not leave the replica "restoring"
        replica.membership.handlers["on_assigned"]([0, 1, 2])  # type: ignore[attr-defined]
    assert replica.restoring is None


def test_a_restart_marks_the_copies_its_killed_run_left_and_the_group_did_not_give_back(
        tmp_path: Path) -> None:
    """A kill -9 marks nothing: inspect of the replica's directory counted its copies of the
    partitions the group had given others (an outside test: 98,132 instances over three
    replicas for 80,500 served). The first assignment after the restart marks them."""
    from streamlearn.commands.inspect_group import describe_group

    for p in (0, 1, 2):  # a killed run's copies, unmarked
        (tmp_path / f"partition-{p}").mkdir()
    (tmp_path / "partition-2" / "released").write_bytes(b'{"at": 1, "how": "stopped"}')
    replica = make_replica(InMemoryBroker(P), tmp_path, Clock())
    replica.state_dir = tmp_path
    # the client lists nothing yet in its callback: what the replica serves counts
    replica.membership.handlers["on_assigned"]([0])  # type: ignore[attr-defined]
    kinds = {p: orjson.loads((tmp_path / f"partition-{p}" / "released").read_bytes())["how"]
             for p in (1, 2)}
    assert kinds == {1: "not reassigned", 2: "not reassigned"}
    assert not (tmp_path / "partition-0" / "released").exists()  # served here
    replica.membership.handlers["on_assigned"]([1])  # type: ignore[attr-defined]
    assert not (tmp_path / "partition-1" / "released").exists()  # served again: unmarked
    assert "not reassigned" in describe_group(tmp_path).get("note", "")


def test_readiness_says_when_one_round_of_the_serving_loop_waits_long(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merged model's publish waited 30 s on a broker that was away, in the serving thread:
    the replica answered ready while the group had already taken its partitions (an outside
    test). A round running past ROUND_STALL_S makes it not ready, whatever waits in it."""
    import threading

    monkeypatch.setattr(replica_module, "ROUND_STALL_S", 0.1)
    replica = make_replica(InMemoryBroker(P), tmp_path, Clock())
    replica.membership.handlers["on_assigned"]([0, 1])  # type: ignore[attr-defined]
    replica.ready = True
    seen: list[tuple[bool, str]] = []
    daemon = replica.daemons[1]
    inner = daemon.step

    def slow_step() -> None:  # something in the round waits on the broker
        time.sleep(0.3)
        inner()

    monkeypatch.setattr(daemon, "step", slow_step)
    probe = threading.Timer(0.2, lambda: seen.append(replica.readiness()))
    probe.start()
    replica.step()
    probe.join()
    assert seen and not seen[0][0] and "spent 0 s in one round: decisions held" in seen[0][1]
    monkeypatch.setattr(daemon, "step", inner)
    replica.step()
    assert replica.readiness() == (True, "2 partitions owned")


def test_the_replica_reports_pending_joins_and_error_rates_over_all_its_partitions(
        tmp_path: Path) -> None:
    """An outside test read one partition's pending joins on the gauge of a replica of three
    (each partition daemon set it in turn): the replica reports its partitions' together."""
    from prometheus_client import CollectorRegistry

    from streamlearn.evaluation.online import OnlineErrorTracker
    from streamlearn.service.metrics import PrometheusObserver

    broker, clock = InMemoryBroker(P), Clock()
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    writer = InMemoryTransport(broker=broker, partitions=P, group_id="caller")
    replica = make_replica(broker, tmp_path, clock, observer=observer)
    replica.membership.handlers["on_assigned"]([0, 1, 2])  # type: ignore[attr-defined]
    clock.t += 1.0
    for i in range(400):
        writer.append_instance(f"e{i}".encode(), orjson.dumps({"id": f"e{i}", "x": X[i].tolist()}))
    rounds(replica)
    # half the decisions answered: some of every partition's learned, the rest pending
    answered = {f"e{i}" for i in range(400) if i % 2}
    fed = answer(broker, writer, set(f"e{i}" for i in range(400)) - answered, clock.t)
    assert fed
    rounds(replica)
    pendings = [d.pending for d in replica.daemons.values()]
    assert min(pendings) > 0 and len(pendings) == 3
    assert registry.get_sample_value("streamlearn_pending_joins") == sum(pendings)
    replica.daemons[0].step()  # a partition's own step leaves the replica's gauges alone
    assert registry.get_sample_value("streamlearn_pending_joins") == sum(pendings)
    expected = OnlineErrorTracker.combined([d.tracker for d in replica.daemons.values()])
    rates = [registry.get_sample_value(f"streamlearn_{name}") for name in
             ("error_rate", "window_error_rate", "exploit_error_estimate")]
    assert rates == pytest.approx(expected) and sum(d.tracker.rounds
                                                    for d in replica.daemons.values()) == len(fed)
    one = replica.daemons[0].tracker
    assert rates[0] == pytest.approx(
        sum(d.tracker.mistakes for d in replica.daemons.values()) / len(fed))
    assert one.rounds < len(fed)
    replica.membership.handlers["on_revoked"]([2])  # type: ignore[attr-defined]
    assert registry.get_sample_value("streamlearn_pending_joins") == sum(
        d.pending for d in replica.daemons.values())
