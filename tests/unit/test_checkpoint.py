"""Checkpoints: commit order, keep-2, fallback from a corrupt snapshot, forward offsets, journal."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.durability.checkpoint import Checkpointer
from streamlearn.errors import StateError, TransportError

TP = ("instances", 0)


class RecordingTransport:
    """Records the order of flush / commit and what was on disk at commit time."""

    def __init__(self, directory: Path, fail_flush: bool = False) -> None:
        self.directory = directory
        self.fail_flush = fail_flush
        self.calls: list[tuple[str, Any]] = []

    def flush(self, timeout_s: float) -> None:
        if self.fail_flush:
            raise TransportError("broker unreachable")
        self.calls.append(("flush", sorted(p.name for p in self.directory.glob("ckpt-*"))))

    def commit(self, offsets: dict[tuple[str, int], int], *, wait: bool = True) -> None:
        self.calls.append(("commit", sorted(p.name for p in self.directory.glob("ckpt-*"))))


def save(ck: Checkpointer, t: RecordingTransport, offset: int, value: float) -> int:
    """A snapshot whose input ends just before ``offset`` (the message at offset - 1 consumed)."""
    ck.offsets.consumed([(*TP, offset - 1)])
    return ck.save(t, {"w": np.full(3, value)}, {"value": value})


def test_order_is_flush_then_snapshot_then_commit(tmp_path: Path) -> None:
    ck, t = Checkpointer(tmp_path), RecordingTransport(tmp_path)
    assert save(ck, t, 10, 1.0) == 1
    # the flush saw no snapshot yet; the commit saw the new one already on disk
    assert t.calls == [("flush", []), ("commit", ["ckpt-00000001"])]


def test_flush_failure_writes_and_commits_nothing(tmp_path: Path) -> None:
    ck, t = Checkpointer(tmp_path), RecordingTransport(tmp_path, fail_flush=True)
    with pytest.raises(TransportError):
        save(ck, t, 10, 1.0)
    assert t.calls == [] and not list(tmp_path.glob("ckpt-*"))


def test_keeps_the_last_two_and_restores_the_newest(tmp_path: Path) -> None:
    ck, t = Checkpointer(tmp_path, keep=2), RecordingTransport(tmp_path)
    for i in range(1, 5):
        save(ck, t, 10 * i, float(i))
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-00000003", "ckpt-00000004"]
    restored = Checkpointer(tmp_path).restore()
    assert restored is not None and restored.seq == 4
    assert restored.offsets == {TP: 40} and restored.arrays["w"].tolist() == [4.0] * 3


def test_corrupt_newest_falls_back_with_a_clear_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ck, t = Checkpointer(tmp_path), RecordingTransport(tmp_path)
    save(ck, t, 10, 1.0)
    save(ck, t, 20, 2.0)
    npz = tmp_path / "ckpt-00000002" / "arrays.npz"
    npz.write_bytes(npz.read_bytes()[:-7])  # truncated
    with caplog.at_level(logging.ERROR):
        restored = Checkpointer(tmp_path).restore()
    assert restored is not None and restored.seq == 1 and restored.meta["value"] == 1.0
    assert any("ckpt-00000002" in r.getMessage() and "corrupt" in r.getMessage()
               for r in caplog.records)
    # set aside, so that it never counts as one of the kept snapshots
    assert [p.name for p in tmp_path.glob("ckpt-*")] == ["ckpt-00000001"]
    assert len(list(tmp_path.glob("corrupt-ckpt-00000002-*"))) == 1


def test_next_snapshot_after_a_fallback_gets_a_new_number(tmp_path: Path) -> None:
    ck, t = Checkpointer(tmp_path), RecordingTransport(tmp_path)
    save(ck, t, 10, 1.0)
    save(ck, t, 20, 2.0)
    (tmp_path / "ckpt-00000002" / "meta.json").write_text("{")
    again = Checkpointer(tmp_path)
    assert again.restore().seq == 1  # type: ignore[union-attr]
    assert save(again, t, 15, 3.0) == 3
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-00000001", "ckpt-00000003"]
    (tmp_path / "ckpt-00000003" / "meta.json").write_text("{")  # corrupt again: 1 is still there
    assert Checkpointer(tmp_path).restore().meta["value"] == 1.0  # type: ignore[union-attr]


def test_offsets_only_move_forward_refused_the_moment_they_are_stored(tmp_path: Path) -> None:
    ck, t = Checkpointer(tmp_path), RecordingTransport(tmp_path)
    save(ck, t, 10, 1.0)
    with pytest.raises(StateError, match=r"instances\[0\] is at 10, a message at offset 8"):
        ck.offsets.consumed([(*TP, 8)])  # before any snapshot: at once
    assert Checkpointer(tmp_path).restore().offsets == {TP: 10}  # type: ignore[union-attr]


def test_no_checkpoint_restores_none(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path / "new").restore() is None


def test_journal_survives_a_torn_line_and_is_pruned_with_snapshots(tmp_path: Path) -> None:
    ck, t = Checkpointer(tmp_path, keep=2), RecordingTransport(tmp_path)
    ck.restore()
    probs = np.array([[0.9, 0.1], [0.2, 0.8]])
    ck.journal.append(["a", "b"], probs, [{"id": "a", "action": 0, "prob": 0.9, "ts": 1.0},
                                          {"id": "b", "action": 1, "prob": 0.8, "ts": 1.0}])
    with open(tmp_path / "journal-00000000.jsonl", "ab") as fh:
        fh.write(b'{"p": [0.5, 0.5], "d": {"id": "c", "act')  # a crash mid-append
    loaded = ck.journal.load(0)
    assert sorted(loaded) == ["a", "b"]
    assert loaded["b"].action == 1 and loaded["b"].probs == [0.2, 0.8]
    for i in range(1, 4):
        save(ck, t, i, 0.0)
    names = sorted(p.name for p in tmp_path.glob("journal-*"))
    assert names == ["journal-00000002.jsonl", "journal-00000003.jsonl"]
    ck.close()


def test_due_by_count_or_time(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, every_events=100, every_s=3600)
    assert not ck.due(99)
    assert ck.due(1)
    with pytest.raises(StateError):
        Checkpointer(tmp_path, every_events=0)


def test_due_waits_for_as_many_messages_as_the_last_snapshot_had_pending_decisions(
        tmp_path: Path) -> None:
    ck, t = Checkpointer(tmp_path, every_events=100, every_s=3600), RecordingTransport(tmp_path)
    assert ck.due(100, pending=250)  # nothing saved yet: every_events
    save(ck, t, 1, 0.0)  # ... with 250 decisions pending
    assert not ck.due(100, pending=300) and not ck.due(149, pending=400)
    assert ck.due(1, pending=400)
    save(ck, t, 2, 0.0)
    ck.due(0, pending=40)
    save(ck, t, 3, 0.0)  # the backlog was answered: every_events as before
    assert ck.due(100, pending=40)


@settings(max_examples=60, deadline=None)
@given(every=st.integers(1, 50),
       steps=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1,
                      max_size=120))
def test_a_snapshot_writes_at_most_two_rows_per_message_since_the_last(
        tmp_path_factory: pytest.TempPathFactory, every: int,
        steps: list[tuple[int, int]]) -> None:
    """Whatever the feedback does, each message adding at most one pending decision: every
    snapshot due by count writes at most max(2 x the messages read since the last one,
    every_events + those messages) rows, and a backlog whose feedback never comes is still
    checkpointed by count (its intervals double; it was checkpointed only by time after its
    first snapshot)."""
    tmp = tmp_path_factory.mktemp("due")
    ck, t = Checkpointer(tmp, every_events=every, every_s=1e9), RecordingTransport(tmp)
    pending, since, offset = 0, 0, 0
    for messages, answered in steps:
        pending = max(0, pending + messages - answered)
        since += messages
        if ck.due(messages, pending):
            assert pending <= max(2 * since, every + since)
            offset += 1
            save(ck, t, offset, 0.0)
            since = 0
    ck2, t2 = Checkpointer(tmp / "backlog", every_events=every, every_s=1e9), \
        RecordingTransport(tmp / "backlog")
    saved_at, read = [], 0
    for _ in range(40):  # a backlog without feedback: 20 messages a step, all pending
        read += 20
        if ck2.due(20, pending=read):
            saved_at.append(read)
            save(ck2, t2, read, 0.0)
    assert len(saved_at) >= 2 and all(b - a >= a for a, b in itertools.pairwise(saved_at))


@pytest.mark.parametrize("every_events", [100, 1_000, 10_000])
def test_rows_written_under_a_backlog_grow_linearly(tmp_path: Path, every_events: int) -> None:
    """A backlog with no feedback: every decision stays pending, and each snapshot writes them
    all. The rows written over the backlog stay below twice its length plus one interval
    (at a fixed interval they would grow with its square: 5e6 rows at 100k, interval 1000),
    and the backlog is still checkpointed by count after its first snapshot."""
    ck, t = Checkpointer(tmp_path, every_events=every_events, every_s=3600), \
        RecordingTransport(tmp_path)
    n, batch, written, saved = 100_000, 500, 0, []
    for pending in range(batch, n + 1, batch):
        if ck.due(batch, pending):
            written += pending
            saved.append(pending)
            save(ck, t, pending, 0.0)
    assert written <= 2 * n + every_events
    assert saved[:2] == [max(every_events, batch), 2 * max(every_events, batch)]


def test_carried_decisions_of_mixed_widths_go_into_the_next_segment(tmp_path: Path) -> None:
    """A candidate batch's journaled width is its largest slot count, so a restored journal
    holds rows of several widths; carrying them into a checkpoint's new segment made one
    array of them and failed (seen in CI, a candidate daemon restarted after a kill)."""
    from streamlearn.durability.checkpoint import JournaledDecision

    ck, t = Checkpointer(tmp_path), RecordingTransport(tmp_path)
    def placed(event_id: str, ids: list[str]) -> dict[str, object]:
        return {"id": event_id, "candidates": [{"id": c, "prob": 0.5} for c in ids],
                "prob": 0.5 ** len(ids), "ranking": ids, "ts": 1.0}

    carried = [JournaledDecision(-1, [0.5], placed("r1", ["a"])),
               JournaledDecision(-1, [0.5, 0.5], placed("r2", ["a", "b"]))]
    ck.offsets.consumed([(*TP, 9)])
    seq = ck.save(t, {"w": np.zeros(3)}, {}, carry=carried)
    found = ck.journal.load(seq, 2)
    assert {i: d.probs for i, d in found.items()} == {"r1": [0.5], "r2": [0.5, 0.5]}
