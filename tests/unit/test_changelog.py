"""The changelog: content-defined chunks, incremental checkpoints, fencing, restores from it alone."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_helpers import Clock, decisions_by_id, drain
from prometheus_client import CollectorRegistry
from test_daemon_fake import BLOCK, Caller, N, direct_weights, learner, lockstep, weights_of
from test_daemon_fake import settings as daemon_settings

from streamlearn.durability.changelog import MAX_CHUNK, MIN_CHUNK, Changelog, content_cuts
from streamlearn.errors import TransportError
from streamlearn.service.claims import OwnershipLost
from streamlearn.service.counters import id_checksum
from streamlearn.service.daemon import Daemon
from streamlearn.service.metrics import PrometheusObserver
from streamlearn.transport.keyed_log import Fenced, MemoryKeyedLogs
from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 1_500_000), st.integers(0, 5000))
def test_cuts_cover_the_bytes_in_bounded_chunks_placed_by_content(seed: int, n: int,
                                                                  shift: int) -> None:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, n, dtype=np.uint8)
    if n and seed % 3 == 0:  # long runs of one byte, as zero-filled arrays have
        data[rng.integers(0, n): rng.integers(0, n)] = 0
    cuts = content_cuts(data)
    sizes = np.diff(np.r_[0, cuts])
    assert (int(cuts[-1]) if len(cuts) else 0) == n
    assert (sizes > 0).all() and (sizes <= MAX_CHUNK).all()
    # a chunk under MIN_CHUNK is the last one, or the rest of one split every MAX_CHUNK
    small = np.flatnonzero(sizes[:-1] < MIN_CHUNK)
    assert all(i > 0 and sizes[i - 1] == MAX_CHUNK for i in small.tolist())
    # content decides: the same bytes after a prefix are cut at the same places but near
    # the start (and where a MAX_CHUNK split was needed)
    moved = content_cuts(np.r_[rng.integers(0, 256, shift, dtype=np.uint8), data]) - shift
    kept = len(set(cuts.tolist()) & set(moved.tolist()))
    forced = int((np.diff(np.r_[0, cuts]) == MAX_CHUNK).sum())
    assert kept >= len(cuts) - 2 - 2 * forced


ARRAY_SHAPES = st.sampled_from([(0,), (7,), (50_000,), (3000, 17), (20_000, 9)])
DTYPES = st.sampled_from(["<f8", "<i8", "|u1", "|b1", "<f4"])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(ARRAY_SHAPES, DTYPES), min_size=1, max_size=4),
       st.integers(0, 2**32 - 1), st.booleans())
def test_any_arrays_restore_bit_for_bit_after_compaction(specs: list[tuple[tuple[int, ...], str]],
                                                          seed: int, compact: bool) -> None:
    rng = np.random.default_rng(seed)
    logs = MemoryKeyedLogs()
    writer = Changelog(logs.open("state", 0))
    versions = []
    for seq in (1, 2, 3):
        arrays = {f"a{i}": (rng.random(shape) * 1000).astype(dtype)
                  for i, (shape, dtype) in enumerate(specs)}
        writer.publish(seq, arrays, {"seq": seq, "note": "ü" * seq})
        versions.append(arrays)
    if compact:
        logs.compact("state", 0)
    found = Changelog(logs.open("state", 0)).restore()
    assert found.seq == 3 and found.meta["note"] == "üüü"
    for name, array in versions[-1].items():
        assert found.arrays[name].dtype == array.dtype
        np.testing.assert_array_equal(found.arrays[name], array)


def test_a_checkpoint_writes_only_the_chunks_that_changed_and_compaction_keeps_one() -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, 10_000_000, dtype=np.uint8)  # ~ 400,000 closed ids' bytes
    rows = rng.standard_normal((20_000, 16))
    logs = MemoryKeyedLogs()
    writer = Changelog(logs.open("state", 0))
    writer.publish(1, {"ids": ids, "rows": rows}, {"seq": 1})
    first = writer.bytes_written
    assert first >= ids.nbytes + rows.nbytes
    # 2,000 ids closed since (appended), 100 rows closed and 100 added
    ids2 = np.r_[ids, rng.integers(0, 256, 50_000, dtype=np.uint8)]
    rows2 = np.r_[np.delete(rows, rng.choice(20_000, 100, replace=False), axis=0),
                  rng.standard_normal((100, 16))]
    writer.publish(2, {"ids": ids2, "rows": rows2}, {"seq": 2})
    second = writer.bytes_written - first
    # the ids: only their new tail (~50 KB, plus the chunk it joins); the rows: each removal
    # changes the chunk it was in, and 100 spread over 40 chunks change most of them
    assert second < rows2.nbytes + 300_000, second  # not the 12.6 MB of a full snapshot
    writer.publish(3, {"ids": np.r_[ids2, ids2[:1000]], "rows": rows2}, {"seq": 3})
    assert writer.bytes_written - first - second < 300_000
    logs.compact("state", 0)
    kept = sum(len(v or b"") for _, k, v in logs.partitions[("state", 0)] if k.startswith(b"c/"))
    assert kept < 1.1 * (ids2.nbytes + rows2.nbytes)  # the first checkpoint's chunks are gone


def test_a_manifest_with_missing_chunks_falls_back_to_the_one_before() -> None:
    logs = MemoryKeyedLogs()
    writer = Changelog(logs.open("state", 0))
    writer.publish(1, {"w": np.arange(10.0)}, {"seq": 1})
    writer.publish(2, {"w": np.arange(10.0) + 1}, {"seq": 2})
    # killed before checkpoint 2 committed (its tombstones never written), and the log
    # cleaner dropped one chunk of that aborted transaction
    records = logs.partitions[("state", 0)]
    manifest_2 = max(offset for offset, key, _ in records if key == b"m")
    new_chunk = next(k for o, k, v in reversed(records)
                     if o < manifest_2 and k.startswith(b"c/") and v is not None)
    logs.partitions[("state", 0)] = [r for r in records
                                     if r[1] != new_chunk and r[0] <= manifest_2]
    found = Changelog(logs.open("state", 0)).restore()
    assert found.seq == 1 and found.arrays["w"].tolist() == list(np.arange(10.0))


def test_a_fenced_writer_can_write_nothing() -> None:
    logs = MemoryKeyedLogs()
    old = Changelog(logs.open("state", 0))
    old.journal(1, b"line\n")
    new = Changelog(logs.open("state", 0))
    with pytest.raises(Fenced):
        old.journal(1, b"zombie\n")
    with pytest.raises(Fenced):
        old.publish(2, {"w": np.zeros(3)}, {"seq": 2})
    assert new.restore().journal == {1: [b"line\n"]}


def test_owners_that_journal_into_the_same_checkpoint_keep_each_others_records() -> None:
    """A new owner appends to the journal of the checkpoint it restored; a third, after both
    were killed, finds every record of both (and after compaction too)."""
    logs = MemoryKeyedLogs()
    first = Changelog(logs.open("state", 0))
    first.publish(5, {"w": np.zeros(3)}, {"seq": 5})
    first.journal(5, b"a1\n")
    first.journal(5, b"a2\n")
    second = Changelog(logs.open("state", 0))
    assert second.restore().journal == {5: [b"a1\n", b"a2\n"]}
    second.journal(5, b"b1\n")
    logs.compact("state", 0)
    assert Changelog(logs.open("state", 0)).restore().journal == {5: [b"a1\n", b"a2\n", b"b1\n"]}


# ------------------------------------------------------------------- the daemon on it
def make_daemon(broker: InMemoryBroker, logs: MemoryKeyedLogs, tmp: Path, clock: Clock,
                **kw: Any) -> Daemon:
    transport = InMemoryTransport(broker=broker, partitions=2)
    daemon = Daemon(daemon_settings(tmp, **kw), transport, learner(), wall_clock=clock,
                    changelog=Changelog(logs.open("changelog", 0)))
    daemon.restore()
    return daemon


@pytest.mark.parametrize("compact", [False, True])
def test_a_replacement_with_an_empty_disk_re_emits_identical_decisions_and_applies_feedback_once(
        tmp_path: Path, compact: bool) -> None:
    broker, clock, logs = InMemoryBroker(2), Clock(), MemoryKeyedLogs()
    caller = Caller(broker)
    daemon = make_daemon(broker, logs, tmp_path / "first", clock, checkpoint_every_events=300)

    def replacement() -> Daemon:  # a new machine: an empty disk, a while later
        clock.t += 5.0  # a decision made anew would differ (its ts): only the journal's match
        if compact:
            logs.compact("changelog", 0)
        return make_daemon(broker, logs, tmp_path / "second", clock, checkpoint_every_events=300)

    daemon = lockstep(broker, daemon, caller, clock, range(N // BLOCK), crash_at=8,
                      restart=replacement)
    assert daemon.checkpointer is not None and daemon.checkpointer.restored_from == "changelog"
    decisions = decisions_by_id(broker)
    assert sorted(decisions) == sorted(f"e{i}" for i in range(N))
    repeated = {k: v for k, v in decisions.items() if len(v) > 1}
    assert repeated  # the replacement re-read input the old one had decided
    assert all(all(d == v[0] for d in v) for v in repeated.values())
    daemon.checkpoint(final=True)
    restored = make_daemon(broker, logs, tmp_path / "third", clock)
    c = restored.counters
    assert c.feedback["joined"] == len(caller.feedback_ids) == N
    assert c.applied_checksum == id_checksum(caller.feedback_ids)
    weights, _ = direct_weights()
    np.testing.assert_allclose(weights_of(restored.learner), weights, rtol=0, atol=1e-9)


def test_a_restart_on_its_own_disk_reads_only_the_changelog_tail(tmp_path: Path) -> None:
    broker, clock, logs = InMemoryBroker(2), Clock(), MemoryKeyedLogs()
    caller = Caller(broker)
    daemon = make_daemon(broker, logs, tmp_path, clock, checkpoint_every_events=300)
    lockstep(broker, daemon, caller, clock, range(6))
    daemon.checkpoint(final=True)
    again = Daemon(daemon_settings(tmp_path), InMemoryTransport(broker=broker, partitions=2),
                   learner(), wall_clock=clock, changelog=Changelog(logs.open("changelog", 0)))
    again.restore()
    assert again.checkpointer is not None and again.checkpointer.restored_from == "local"
    assert again.counters.instances == daemon.counters.instances


def test_a_restart_from_its_own_disk_commits_its_local_journal_for_the_next_owner(
        tmp_path: Path) -> None:
    """A replica killed after journaling decisions restarts on its own disk and restores
    from it, with its local journal: the changelog's copy was in its killed transaction,
    aborted by the reopen, and the cleaner had removed it. It dies again before a
    checkpoint; the next owner, on another disk, must still re-emit those decisions
    identically (an outside test: 211 journaled decisions restored from disk, none by the
    next owner from the changelog, 800 ids decided again differently)."""
    broker, clock, logs = InMemoryBroker(2), Clock(), MemoryKeyedLogs()
    caller = Caller(broker)
    first = make_daemon(broker, logs, tmp_path / "a", clock, checkpoint_every_events=10**6,
                        checkpoint_every_seconds=1e9)
    lockstep(broker, first, caller, clock, range(2))
    first.checkpoint(final=True)  # the changelog's newest checkpoint is the disk's
    clock.t += 1.0
    caller.publish(2 * BLOCK, 3 * BLOCK, ts=clock.t)
    drain(first)  # decided and journaled (disk and changelog), not answered: then killed
    decided = {k: v[0] for k, v in decisions_by_id(broker).items()}
    again = Daemon(daemon_settings(tmp_path / "a", checkpoint_every_events=10**6,
                                   checkpoint_every_seconds=1e9),
                   InMemoryTransport(broker=broker, partitions=2), learner(), wall_clock=clock,
                   changelog=Changelog(logs.open("changelog", 0)))  # the open aborts the first's
    logs.compact("changelog", 0)  # the cleaner runs before the restore reads
    again.restore()
    assert again.checkpointer is not None and again.checkpointer.restored_from == "local"
    del again  # killed again, before any checkpoint
    logs.compact("changelog", 0)
    clock.t += 5.0  # a decision made anew would differ (its ts): only the journal's match
    third = make_daemon(broker, logs, tmp_path / "b", clock)
    assert third.checkpointer is not None and third.checkpointer.restored_from == "changelog"
    drain(third)
    for event_id, copies in decisions_by_id(broker).items():
        assert all(copy == decided.get(event_id, copies[0]) for copy in copies), event_id
    repeated = [k for k, v in decisions_by_id(broker).items() if len(v) > 1]
    assert len(repeated) >= BLOCK // 2  # the third re-read the killed run's input


def test_a_daemon_whose_changelog_was_taken_stops_before_publishing(tmp_path: Path) -> None:
    broker, clock, logs = InMemoryBroker(2), Clock(), MemoryKeyedLogs()
    caller = Caller(broker)
    daemon = make_daemon(broker, logs, tmp_path / "a", clock)
    caller.publish(0, 50, ts=1.0)
    daemon.step()
    published = len(broker.messages("decisions"))
    make_daemon(broker, logs, tmp_path / "b", clock)  # another replica takes the partition
    caller.publish(50, 100, ts=2.0)
    with pytest.raises(OwnershipLost):
        for _ in range(5):
            daemon.step()
    assert len(broker.messages("decisions")) == published
    assert {orjson.loads(m.value or b"")["id"] for m in broker.messages("decisions")} \
        == {f"e{i}" for i in range(50)}


def test_a_fenced_partition_is_taken_back_only_if_the_group_still_assigns_it(
        tmp_path: Path) -> None:
    """A replica fenced on a partition drops it; a session timeout later it takes it back if
    its client still hears the group assign it there (the fence came from elsewhere), and
    leaves it alone once the group moved it (it was a zombie)."""
    from test_replica import FakeMembership

    from streamlearn.service.replica import Replica

    for still_assigned in (True, False):
        broker, clock, logs = InMemoryBroker(2), Clock(), MemoryKeyedLogs()
        caller = Caller(broker)

        def make_daemon(p: int, broker: InMemoryBroker = broker, clock: Clock = clock,
                        logs: MemoryKeyedLogs = logs, name: str = str(still_assigned)) -> Daemon:
            transport = InMemoryTransport(broker=broker, partitions=2, only=[p])
            return Daemon(daemon_settings(tmp_path / name / f"partition-{p}"), transport,
                          learner(), wall_clock=clock,
                          changelog=Changelog(logs.open("changelog", p)))

        replica = Replica(make_daemon, FakeMembership)
        membership = replica.membership
        assert isinstance(membership, FakeMembership)
        membership.assignment, membership.session_timeout_s = {0, 1}, 0.05
        membership.handlers["on_assigned"]([0, 1])
        caller.publish(0, 40, ts=clock.t)
        replica.step()
        Changelog(logs.open("changelog", 0))  # another writer fences partition 0
        caller.publish(40, 80, ts=clock.t)
        replica.step()
        assert sorted(replica.daemons) == [1]
        if not still_assigned:
            membership.assignment = {1}  # the group moved it: this replica was the zombie
        replica.step()
        assert sorted(replica.daemons) == [1]  # not before twice the session timeout
        time.sleep(0.15)
        replica.step()
        assert sorted(replica.daemons) == ([0, 1] if still_assigned else [1])
        replica.request_stop()
        replica.run()


class _Killed(Exception):
    """The writer's process died here."""


class _Dying:
    """A KeyedLog that dies (raises) at its ``after``-th write, like a writer killed mid-way."""

    writes = True

    def __init__(self, inner: Any, after: int) -> None:
        self.inner, self.left = inner, after
        self.manifest_sent = False  # in the open transaction
        self.manifest_committed = False

    def _tick(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _Killed

    def send(self, key: bytes, value: bytes | None, journal: bool = False) -> None:
        self._tick()
        self.inner.send(key, value, journal)

    def send_and_wait(self, key: bytes, value: bytes | None, journal: bool = False) -> int:
        self._tick()
        at = int(self.inner.send_and_wait(key, value, journal))
        self.manifest_sent |= key == b"m"
        return at

    def commit(self) -> None:
        self._tick()
        self.inner.commit()
        self.manifest_committed |= self.manifest_sent
        self.manifest_sent = False

    def records(self, start: int = 0, journal: bool = False, committed: bool = False) -> Any:
        return self.inner.records(start, journal, committed)

    def close(self) -> None:
        pass

    def stop_waiting_after(self, deadline: float) -> None:
        self.inner.stop_waiting_after(deadline)


OPS = st.lists(st.one_of(
    st.tuples(st.just("journal"), st.integers(1, 3)),
    st.tuples(st.just("publish"), st.integers(0, 2)),  # rows added (and one removed)
    st.tuples(st.just("takeover"), st.integers(0, 60)),  # the old writer dies after n writes
    st.tuples(st.just("compact"), st.just(0))), min_size=1, max_size=25)


@settings(max_examples=60, deadline=None)
@given(OPS, st.integers(0, 2**32 - 1))
def test_whoever_takes_over_restores_the_newest_checkpoint_and_every_journal_line_since(
        ops: list[tuple[str, int]], seed: int) -> None:
    """Owners publish, journal, die mid-way (at any write) and are replaced; the log is
    compacted now and then, which drops the records of aborted transactions (as Kafka's
    cleaner does: a dead owner's open transaction is aborted by the next owner's open).
    Every restore gives the newest committed checkpoint, bit for bit, and every journal line
    written since it by any owner — also after a second takeover and a compaction (an
    outside test: journal lines of an aborted transaction compacted away, and a later owner
    decided those events again)."""
    rng = np.random.default_rng(seed)
    logs = MemoryKeyedLogs()
    rows = rng.integers(0, 256, (2000, 40), dtype=np.uint8)
    published: dict[int, np.ndarray] = {}  # seq -> rows, for every manifest committed
    lines: list[tuple[int, bytes]] = []  # (tag, line) of every journal write that reached the log
    seq, written = 0, 0
    dying = _Dying(logs.open("state", 0), 10**9)
    owner = Changelog(dying)
    for op, arg in [*ops, ("takeover", 10**9)]:
        try:
            if op == "journal":
                for _ in range(arg):
                    written += 1
                    line = b"line %d\n" % written
                    owner.journal(seq, line)
                    lines.append((seq, line))
            elif op == "publish":
                rows = np.r_[rows[1:], rng.integers(0, 256, (arg, 40), dtype=np.uint8)]
                dying.manifest_committed = False
                try:
                    owner.publish(seq + 1, {"rows": rows}, {"seq": seq + 1})
                finally:
                    if dying.manifest_committed:  # a restore picks it from now on
                        seq += 1
                        published[seq] = rows.copy()
            elif op == "compact":
                logs.compact("state", 0)
        except _Killed:
            op, arg = "takeover", 10**9  # the owner died: the next one takes over now
        if op == "takeover":
            dying = _Dying(logs.open("state", 0), arg)
            owner = Changelog(dying)
            try:
                found = owner.restore()  # writes too: the journal it reuses, committed
            except _Killed:  # died restoring: the next owner takes over
                dying = _Dying(logs.open("state", 0), 10**9)
                owner = Changelog(dying)
                found = owner.restore()
            assert found.seq == seq
            if seq:
                assert np.array_equal(found.arrays["rows"], published[seq])
            want = sorted(line for tag, line in lines if tag >= seq)
            assert sorted(line for batch in found.journal.values() for line in batch) == want


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=60), st.integers(1, 4000))
def test_a_journal_batch_is_cut_between_lines_into_records_under_the_limit(
        lengths: list[int], limit: int) -> None:
    from streamlearn.durability.changelog import _record_parts

    lines = b"".join(b"x" * n + b"\n" for n in lengths)
    parts = _record_parts(lines, limit)
    assert b"".join(parts) == lines
    assert all(p.endswith(b"\n") for p in parts)
    assert all(len(p) <= limit or p.count(b"\n") == 1 for p in parts)


def test_a_journal_batch_larger_than_a_record_is_written_in_several() -> None:
    from streamlearn.durability.changelog import JOURNAL_RECORD_BYTES

    logs = MemoryKeyedLogs()
    writer = Changelog(logs.open("state", 0))
    batch = b"".join(b'{"d": %d, "p": [%s]}\n' % (i, b"0.0005," * 2000) for i in range(500))
    assert len(batch) > 5 * JOURNAL_RECORD_BYTES
    writer.journal(1, batch)
    records = list(logs.open("state", 0).records(journal=True))
    assert len(records) >= 6 and max(len(v or b"") for _, _, v in records) <= JOURNAL_RECORD_BYTES
    assert b"".join(Changelog(logs.open("state", 0)).restore().journal[1]) == batch


class _Unreachable:
    """A KeyedLog whose broker refuses the next ``journal`` / ``state`` writes (as many as
    given) with a TransportError, then accepts them again."""

    writes = True

    def __init__(self, inner: Any, journal: int = 0, state: int = 0,
                 on_refuse: Callable[[], None] = lambda: None) -> None:
        self.inner, self.refuse = inner, {True: journal, False: state}
        self.on_refuse = on_refuse

    def _gate(self, journal: bool) -> None:
        if self.refuse[journal] > 0:
            self.refuse[journal] -= 1
            self.on_refuse()
            raise TransportError("the changelog's broker is away (test)")

    def send(self, key: bytes, value: bytes | None, journal: bool = False) -> None:
        self._gate(journal)
        self.inner.send(key, value, journal)

    def send_and_wait(self, key: bytes, value: bytes | None, journal: bool = False) -> int:
        self._gate(journal)
        return int(self.inner.send_and_wait(key, value, journal))

    def commit(self) -> None:
        self.inner.commit()

    def records(self, start: int = 0, journal: bool = False, committed: bool = False) -> Any:
        return self.inner.records(start, journal, committed)

    def close(self) -> None:
        pass

    def stop_waiting_after(self, deadline: float) -> None:
        self.inner.stop_waiting_after(deadline)


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_the_metrics_count_restores_by_source_and_every_changelog_write_refused(
        tmp_path: Path) -> None:
    broker, clock, logs = InMemoryBroker(2), Clock(), MemoryKeyedLogs()
    caller = Caller(broker)
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    held: list[str | None] = []  # what /readyz heard at each refusal
    unreachable = _Unreachable(logs.open("changelog", 0), journal=2, state=1,
                               on_refuse=lambda: held.append(daemon.held_by_journal()))
    daemon = Daemon(daemon_settings(tmp_path / "first", retry_seconds=0.01),
                    InMemoryTransport(broker=broker, partitions=2), learner(), observer,
                    wall_clock=clock, changelog=Changelog(unreachable))
    daemon.restore()
    assert _sample(registry, "streamlearn_restore_duration_seconds_count", source="none") == 1
    lockstep(broker, daemon, caller, clock, range(2))
    # the first two journal records were refused and retried: every decision still went out
    assert _sample(registry, "streamlearn_changelog_failures_total", kind="journal_retry") == 2
    # held from the first refusal until a journal record is written (a stall /readyz shows)
    assert held[0] is None and "refused the decision journal" in str(held[1]), held
    assert daemon.held_by_journal() is None
    assert sorted(decisions_by_id(broker)) == sorted(f"e{i}" for i in range(2 * BLOCK))
    assert daemon.checkpoint(final=True) is not None  # on disk; the changelog refused it
    assert _sample(registry, "streamlearn_changelog_failures_total",
                   kind="checkpoint_local_only") == 1
    assert daemon.checkpoint(final=True) is not None  # the broker is back: written to both
    assert _sample(registry, "streamlearn_changelog_failures_total",
                   kind="checkpoint_local_only") == 1
    # a replacement machine: an empty disk, the state from the changelog alone
    again = Daemon(daemon_settings(tmp_path / "second"),
                   InMemoryTransport(broker=broker, partitions=2), learner(), observer,
                   wall_clock=clock, changelog=Changelog(logs.open("changelog", 0)))
    again.restore()
    assert _sample(registry, "streamlearn_restore_duration_seconds_count",
                   source="changelog") == 1
    assert again.counters.instances == daemon.counters.instances


def test_a_journal_write_refused_then_taken_asks_for_a_checkpoint_at_once(tmp_path: Path) -> None:
    """The refused write aborted the changelog's transaction, and with it the journal since
    the last checkpoint; Kafka's cleaner removes an aborted transaction's records, so the
    state they held is checkpointed at the end of that step, not a checkpoint interval later."""
    broker, clock, logs = InMemoryBroker(2), Clock(), MemoryKeyedLogs()
    caller = Caller(broker)
    daemon = Daemon(daemon_settings(tmp_path, retry_seconds=0.01),
                    InMemoryTransport(broker=broker, partitions=2), learner(),
                    wall_clock=clock, changelog=Changelog(_Unreachable(logs.open("changelog", 0))))
    daemon.restore()
    assert daemon.checkpointer is not None
    asked: list[int] = []
    daemon.checkpointer.request = lambda: asked.append(1)  # type: ignore[method-assign]
    lockstep(broker, daemon, caller, clock, range(1))
    assert asked == []  # nothing refused: the periodic checkpoints suffice
    refusing = Daemon(daemon_settings(tmp_path / "second", retry_seconds=0.01),
                      InMemoryTransport(broker=broker, partitions=2), learner(), wall_clock=clock,
                      changelog=Changelog(_Unreachable(logs.open("changelog", 1), journal=1)))
    refusing.restore()
    assert refusing.checkpointer is not None
    refusing.checkpointer.request = lambda: asked.append(2)  # type: ignore[method-assign]
    lockstep(broker, refusing, caller, clock, range(1, 2))
    assert asked == [2]


class _SlowJournal(_Unreachable):
    """A log whose first journal write takes ``stall_s`` before the broker has it (a
    changelog broker just back from an outage), calling ``during`` near the end of it."""

    def __init__(self, inner: Any, stall_s: float, during: Callable[[], None]) -> None:
        super().__init__(inner)
        self.stall_s, self.during = stall_s, during

    def send_and_wait(self, key: bytes, value: bytes | None, journal: bool = False) -> int:
        if journal and self.stall_s:
            time.sleep(self.stall_s)
            self.during()
            self.stall_s = 0.0
        return int(self.inner.send_and_wait(key, value, journal))


def test_a_journal_write_that_waits_long_makes_the_partition_not_ready(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first journal write that hangs (not yet refused) holds the partition's decisions as
    a refusal does, so /readyz says so once it has waited JOURNAL_SLOW_S (an outside test
    saw a replica answer 200 for 30 s while its write waited on a broker just back)."""
    import streamlearn.service.daemon as daemon_module

    monkeypatch.setattr(daemon_module, "JOURNAL_SLOW_S", 0.05)
    broker, clock, logs = InMemoryBroker(2), Clock(), MemoryKeyedLogs()
    held: list[str | None] = []
    slow = _SlowJournal(logs.open("changelog", 0), 0.2,
                        during=lambda: held.append(daemon.held_by_journal()))
    daemon = Daemon(daemon_settings(tmp_path), InMemoryTransport(broker=broker, partitions=2),
                    learner(), PrometheusObserver(CollectorRegistry()), wall_clock=clock,
                    changelog=Changelog(slow))
    daemon.restore()
    assert daemon.held_by_journal() is None
    lockstep(broker, daemon, Caller(broker), clock, range(1))
    assert len(held) == 1 and "a decision journal write has waited 0 s" in str(held[0]), held
    assert daemon.held_by_journal() is None  # written: ready again
    assert sorted(decisions_by_id(broker)) == sorted(f"e{i}" for i in range(BLOCK))


class _PendingFuture:
    """A kafka-python send future that never completes (a write stuck on the coordinator)."""

    is_done = False

    def get(self, timeout: float | None = None) -> Any:
        from kafka.errors import KafkaTimeoutError

        time.sleep(timeout or 0.0)
        raise KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.")


class _StuckProducer:
    """A transactional producer whose sends hang; its transaction manager turns fatal (fenced)
    ``fatal_after_s`` after the first send, or never (None)."""

    def __init__(self, fatal_after_s: float | None, abort_takes_s: float = 0.0) -> None:
        self.fatal_after_s, self.sent_at = fatal_after_s, 0.0
        self.aborted, self.begun = 0, 0
        self.abort_takes_s = abort_takes_s  # inf: an abort that waits on a broker still away
        producer = self

        class State:
            @property
            def name(self) -> str:
                fatal = producer.fatal_after_s
                late = fatal is not None and time.monotonic() - producer.sent_at >= fatal
                return "FATAL_ERROR" if late else "IN_TRANSACTION"

        class Result:  # kafka-python's TransactionalRequestResult
            def __init__(self) -> None:
                self.done_at = time.monotonic() + producer.abort_takes_s

            @property
            def is_done(self) -> bool:
                return time.monotonic() >= self.done_at

            def wait(self, timeout_ms: float | None = None) -> bool:
                time.sleep(max(0.0, min(self.done_at - time.monotonic(), (timeout_ms or 0) / 1e3)))
                return self.is_done

        class Manager:
            _current_state = State()
            last_error = "InvalidProducerEpochError(None)"

            def begin_abort(self) -> Result:
                producer.aborted += 1
                return Result()

        class Sender:
            def wakeup(self) -> None:
                pass

        self._transaction_manager, self._sender = Manager(), Sender()

    def send(self, *args: Any, **kwargs: Any) -> _PendingFuture:
        self.sent_at = time.monotonic()
        return _PendingFuture()

    def begin_transaction(self) -> None:
        self.begun += 1


@pytest.mark.parametrize("fatal_after_s", [0.3, None])
def test_a_kafka_journal_write_fails_as_soon_as_its_writer_turns_fatal(
        fatal_after_s: float | None) -> None:
    """A write waits in slices: a writer fenced while the write waited fails it at once
    (Fenced) rather than at the end of the timeout; one that stays usable is waited for the
    whole timeout and then refused (TransportError, the transaction aborted for a retry)."""
    from streamlearn.transport.keyed_log import WAIT_SLICE_S, KafkaKeyedLog

    log = KafkaKeyedLog("127.0.0.1:1", "changelog", 0, write=False, timeout_s=1.5)
    log._producer = producer = _StuckProducer(fatal_after_s)
    started = time.monotonic()
    with pytest.raises(TransportError if fatal_after_s is None else Fenced) as raised:
        log.send_and_wait(b"k", b"v", journal=True)
    took = time.monotonic() - started
    if fatal_after_s is None:
        assert took >= 1.5 and producer.aborted == 1
        assert "Timeout after waiting" in str(raised.value)
    else:
        assert fatal_after_s <= took < fatal_after_s + 2 * WAIT_SLICE_S + 0.3, took
        assert "failed for good" in str(raised.value) and "InvalidProducerEpochError" in str(raised.value)


def test_a_failed_kafka_write_does_not_wait_out_the_abort_of_its_transaction() -> None:
    """kafka-python's abort_transaction waits without a bound, and with the broker away the
    serving thread waited with it (an outside test: 78 s). The abort is started and the next
    write waits for it at most the timeout, then goes on once it is done."""
    from streamlearn.transport.keyed_log import WAIT_SLICE_S, KafkaKeyedLog

    log = KafkaKeyedLog("127.0.0.1:1", "changelog", 0, write=False, timeout_s=0.6)
    log._producer = producer = _StuckProducer(None, abort_takes_s=2.0)
    started = time.monotonic()
    with pytest.raises(TransportError, match="Timeout after waiting"):
        log.send_and_wait(b"k", b"v", journal=True)
    assert time.monotonic() - started < 0.6 + 2 * WAIT_SLICE_S + 0.3  # not the abort's 2 s
    assert producer.aborted == 1 and producer.begun == 0
    with pytest.raises(TransportError, match="still being aborted"):
        log.send(b"k", b"v")  # the abort runs on: this write waits 0.6 s for it, then fails
    assert producer.aborted == 1  # no second abort of the same transaction
    time.sleep(max(0.0, producer.sent_at + 2.6 - time.monotonic()))
    log.send(b"k", b"v")  # the abort is done: the next transaction opens and takes the write
    assert producer.begun == 1


def test_a_writer_whose_abort_does_not_end_starts_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """kafka-python's abort of a transaction begun while the broker was away did not end
    minutes after the broker came back (an outside test's outage): past RESTART_AFTER_S the
    next write opens a new producer of the slot (its init aborts the transaction on the
    broker) and goes on with it."""
    from streamlearn.transport import keyed_log
    from streamlearn.transport.keyed_log import KafkaKeyedLog

    monkeypatch.setattr(keyed_log, "RESTART_AFTER_S", 0.9)
    log = KafkaKeyedLog("127.0.0.1:1", "changelog", 0, write=False, timeout_s=0.3)
    log._producer = stuck = _StuckProducer(None, abort_takes_s=math.inf)
    stuck.close = lambda timeout=None: None  # type: ignore[attr-defined]
    fresh = _StuckProducer(None)
    opened: list[Any] = []
    inits: list[Any] = [TransportError("cannot open the changelog (test: broker away)"), fresh]

    def open_producer(wait_s: float) -> Any:  # the first init fails: the broker is still away
        got = inits.pop(0)
        if isinstance(got, Exception):
            raise got
        opened.append(got)
        return got

    monkeypatch.setattr(log, "_open_producer", open_producer)
    with pytest.raises(TransportError):
        log.send_and_wait(b"k", b"v", journal=True)  # the write fails; its abort never ends
    with pytest.raises(TransportError, match="still being aborted"):
        log.send(b"k", b"v")  # 0.3 s more of the abort: not yet the restart
    time.sleep(0.3)
    with pytest.raises(TransportError, match="broker away"):
        log.send(b"k", b"v")  # past 0.9 s: the writer starts again, its init fails
    assert log._producer is None and not opened
    log.send(b"k", b"v")  # the next write opens it again, and it takes the write
    assert opened == [fresh] and log._producer is fresh and fresh.sent_at > 0


def test_a_stopping_writer_gives_up_a_wait_already_under_way() -> None:
    """A replica stopping while the broker is away gives its partitions' writers a deadline:
    a write already waiting its 30 s (a snapshot written in the background, which the stop
    waits for) gives up at that deadline, as a write begun after it does."""
    import threading

    from streamlearn.transport.keyed_log import WAIT_SLICE_S, KafkaKeyedLog

    log = KafkaKeyedLog("127.0.0.1:1", "changelog", 0, write=False, timeout_s=30.0)
    log._producer = _StuckProducer(None)
    started = time.monotonic()
    threading.Timer(0.2, log.stop_waiting_after, [started + 0.6]).start()
    with pytest.raises(TransportError, match="its partition is stopping"):
        log.send_and_wait(b"k", b"v", journal=True)
    took = time.monotonic() - started
    assert 0.6 <= took < 0.6 + 2 * WAIT_SLICE_S + 0.3, took
    began = time.monotonic()
    with pytest.raises(TransportError):  # past the deadline: no wait at all
        log.send_and_wait(b"k", b"v")
    assert time.monotonic() - began < 2 * WAIT_SLICE_S + 0.3
    log.stop_waiting_after(time.monotonic() + 60.0)  # a later deadline does not extend it
    assert log._give_up_at is not None and log._give_up_at < time.monotonic()


def test_a_writer_opened_again_waits_for_the_broker_briefly(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening the writer again (after a failed abort or open) during an outage waited the
    producer's 30 s bootstrap each time, and a stop waited for it partition after partition:
    an open again waits REOPEN_WAIT_S at most, and no longer than the writer's deadline."""
    import kafka
    from kafka.errors import KafkaTimeoutError

    from streamlearn.transport.keyed_log import REOPEN_WAIT_S, KafkaKeyedLog

    configs: list[dict[str, Any]] = []

    class Unreachable:
        def __init__(self, **config: Any) -> None:
            configs.append(config)
            raise KafkaTimeoutError("Unable to bootstrap from 127.0.0.1:1 (test)")

    monkeypatch.setattr(kafka, "KafkaProducer", Unreachable)
    log = KafkaKeyedLog("127.0.0.1:1", "changelog", 0, write=False, timeout_s=30.0)
    log._producer_config = {}
    log._producer = None  # a restart whose open failed: the next write opens it again
    with pytest.raises(TransportError, match="Unable to bootstrap"):
        log.send(b"k", b"v")
    assert configs[-1]["bootstrap_timeout_ms"] == configs[-1]["max_block_ms"]
    assert REOPEN_WAIT_S * 1000 - 50 <= configs[-1]["max_block_ms"] <= REOPEN_WAIT_S * 1000
    log.stop_waiting_after(time.monotonic() + 1.0)
    with pytest.raises(TransportError, match="Unable to bootstrap"):
        log.send(b"k", b"v")
    assert 0 < configs[-1]["bootstrap_timeout_ms"] <= 1000
    assert configs[-1]["max_block_ms"] == configs[-1]["bootstrap_timeout_ms"]


@pytest.mark.parametrize("flush_fails", [False, True])
def test_a_producer_with_records_in_flight_is_closed_at_once(flush_fails: bool) -> None:
    """kafka-python's close flushes first: with records the broker never acknowledged it
    raised from that flush and left the producer open (its thread trying the broker; the
    garbage collector's close waited 1 s more and printed a traceback, once per writer
    started again during an outage). Its records fail, and it is closed."""
    from kafka.errors import KafkaTimeoutError

    from streamlearn.transport.kafka import close_producer

    class Sender:
        forced = False

        def force_close(self) -> None:
            self.forced = True

        def join(self, timeout: float | None = None) -> None:
            pass

    class Producer:
        _closed = False  # kafka-python's own flag: its __del__ closes nothing more

        def __init__(self) -> None:
            self._sender = Sender()

        def close(self, timeout: float | None = None) -> None:
            if flush_fails and not self._sender.forced:
                raise KafkaTimeoutError("Timeout waiting for future")
            self._closed = True

    producer = Producer()
    close_producer(producer, 0.0)  # as the changelog's writer closes one it replaces
    assert producer._closed and producer._sender.forced == flush_fails


class _Recording(_Unreachable):
    """A log that records the order of reads and commits."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.calls: list[str] = []

    def commit(self) -> None:
        self.calls.append("commit")
        super().commit()

    def records(self, start: int = 0, journal: bool = False, committed: bool = False) -> Any:
        self.calls.append("read journal" if journal else "read state")
        return super().records(start, journal, committed)


def test_a_restore_commits_the_journal_before_it_reads_the_state_lane() -> None:
    """An outside re-test killed the restoring replica while it read the state lane: the dead
    writer's journal, aborted by the restorer's open and committed again only after that
    read, was then compacted away and a third owner decided 998 events again."""
    logs = MemoryKeyedLogs()
    first = Changelog(logs.open("changelog", 0))
    first.publish(1, {"w": np.arange(4.0)}, {"seq": 1})
    first.journal(1, b'{"id": "e1"}\n')  # then it dies
    recording = _Recording(logs.open("changelog", 0))
    found = Changelog(recording).restore()
    assert found.journal == {1: [b'{"id": "e1"}\n']}
    assert recording.calls[:3] == ["read journal", "commit", "read state"], recording.calls
    logs.compact("changelog", 0)
    third = Changelog(logs.open("changelog", 0)).restore()  # the second died after that
    assert third.journal == found.journal and third.seq == 1


def test_the_journal_is_committed_between_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Committed only with each checkpoint, a journal transaction outlived the broker's
    transaction timeout (600 s) under a longer checkpoint interval: the broker aborted it,
    the writer was fenced, and the cleaner removed the journal (an outside re-test)."""
    import streamlearn.durability.changelog as changelog_module

    logs = MemoryKeyedLogs()
    recording = _Recording(logs.open("changelog", 0))
    writer = Changelog(recording)
    writer.journal(0, b"a\n")
    assert "commit" not in recording.calls  # not yet 30 s
    monkeypatch.setattr(changelog_module, "JOURNAL_COMMIT_S", 0.0)
    writer.journal(0, b"b\n")
    assert recording.calls.count("commit") == 1
    writer._publishing = True  # a checkpoint is being written: its own commit comes
    writer.journal(0, b"c\n")
    assert recording.calls.count("commit") == 1
