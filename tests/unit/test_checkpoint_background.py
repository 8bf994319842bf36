"""Snapshots written in the background (the loop's periodic checkpoints): the loop goes on
while the thread writes, the snapshot holds the state as it was when the checkpoint began,
its offsets are committed only once it is on disk, a failed write raises where it is
settled, and a crash during the write loses nothing and reuses no sequence number."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamlearn.durability import checkpoint as checkpoint_module
from streamlearn.durability.checkpoint import Checkpointer

TP = ("instances", 0)


class Recording:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.commits: list[tuple[dict[tuple[str, int], int], bool, list[str]]] = []

    def flush(self, timeout_s: float) -> None:
        pass

    def commit(self, offsets: dict[tuple[str, int], int], *, wait: bool = True) -> None:
        on_disk = sorted(p.name for p in self.directory.glob("ckpt-*"))
        self.commits.append((dict(offsets), wait, on_disk))


@pytest.fixture
def held_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Writes on the snapshot thread wait for this event (then write for real); the loop's
    own (synchronous) writes do not."""
    release = threading.Event()
    real = checkpoint_module.write_snapshot

    def held(path: Any, arrays: Any, meta: Any) -> None:
        if threading.current_thread().name.startswith("streamlearn-snapshot"):
            assert release.wait(10)
        real(path, arrays, meta)

    monkeypatch.setattr(checkpoint_module, "write_snapshot", held)
    return release


def test_the_loop_goes_on_while_the_snapshot_is_written(tmp_path: Path,
                                                        held_writes: threading.Event) -> None:
    ck, t = Checkpointer(tmp_path), Recording(tmp_path)
    live = np.array([1.0, 2.0])
    ck.offsets.consumed([(*TP, 9)])
    assert ck.save(t, {"w": live}, {"n": [1]}, background=True) == 1
    live[:] = -1.0  # the learner goes on updating its arrays in place
    ck.offsets.consumed([(*TP, 19)])
    assert ck.settle(t, block=False) is None and t.commits == []  # still being written
    held_writes.set()
    assert ck.settle(t) == 1
    assert t.commits == [({TP: 10}, False, ["ckpt-00000001"])]  # committed once on disk
    restored = Checkpointer(tmp_path).restore()
    assert restored is not None and restored.offsets == {TP: 10}
    assert restored.arrays["w"].tolist() == [1.0, 2.0] and restored.meta["n"] == [1]


@pytest.mark.parametrize("background", [True, False])
def test_finish_runs_where_the_snapshot_is_written_and_its_arrays_are_saved(
        tmp_path: Path, background: bool) -> None:
    """``finish`` (what only makes a snapshot smaller: the pending rows' packing) runs on the
    writer thread of a background snapshot, not on the loop's, and on the loop's thread for
    any other; what it returns is what the snapshot holds."""
    ck, t = Checkpointer(tmp_path), Recording(tmp_path)
    ran_on: list[str] = []

    def finish(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ran_on.append(threading.current_thread().name)
        return {**arrays, "w": arrays["w"] * 2}

    ck.save(t, {"w": np.array([1.0, 2.0])}, {}, background=background, finish=finish)
    ck.settle(t)
    assert len(ran_on) == 1
    assert ran_on[0].startswith("streamlearn-snapshot") == background
    restored = Checkpointer(tmp_path).restore()
    assert restored is not None and restored.arrays["w"].tolist() == [2.0, 4.0]


def test_the_next_checkpoint_waits_for_the_write_in_flight(tmp_path: Path,
                                                           held_writes: threading.Event) -> None:
    ck, t = Checkpointer(tmp_path), Recording(tmp_path)
    ck.offsets.consumed([(*TP, 9)])
    ck.save(t, {"w": np.zeros(1)}, {}, background=True)
    threading.Timer(0.05, held_writes.set).start()
    ck.offsets.consumed([(*TP, 19)])
    assert ck.save(t, {"w": np.ones(1)}, {}) == 2  # synchronous: settles 1 first
    assert [(offsets, on_disk) for offsets, _, on_disk in t.commits] == [
        ({TP: 10}, ["ckpt-00000001"]), ({TP: 20}, ["ckpt-00000001", "ckpt-00000002"])]


def test_a_failed_background_write_raises_where_it_is_settled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full_disk(path: Any, arrays: Any, meta: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "write_snapshot", full_disk)
    ck, t = Checkpointer(tmp_path), Recording(tmp_path)
    ck.offsets.consumed([(*TP, 9)])
    ck.save(t, {"w": np.zeros(1)}, {}, background=True)
    with pytest.raises(OSError, match="No space left"):
        ck.settle(t)
    assert t.commits == []


def test_a_crash_during_the_write_replays_its_decisions_and_reuses_no_number(
        tmp_path: Path, held_writes: threading.Event) -> None:
    ck, t = Checkpointer(tmp_path), Recording(tmp_path)
    ck.restore()
    ck.offsets.consumed([(*TP, 9)])
    ck.save(t, {"w": np.zeros(1)}, {})  # snapshot 1
    ck.offsets.consumed([(*TP, 19)])
    ck.save(t, {"w": np.ones(1)}, {}, background=True)  # snapshot 2: never written
    probs = np.array([[0.5, 0.5]])
    decision = {"id": "during", "action": 1, "prob": 0.5, "explored": True, "model": "m-v1",
                "ts": 1.0}
    ck.journal.append(["during"], probs, [decision])
    ck.journal.close()  # the process dies here: ckpt-2 absent, journal-2 holds "during"
    assert not (tmp_path / "ckpt-00000002").exists()

    again = Checkpointer(tmp_path)
    restored = again.restore()
    assert restored is not None and restored.seq == 1 and restored.offsets == {TP: 10}
    assert "during" in again.journal.load(restored.seq)  # re-read input gets its decision back
    again.offsets.consumed([(*TP, 29)])
    assert again.save(t, {"w": np.ones(1)}, {}) == 3  # not 2: journal-2 is not appended to
    held_writes.set()


@pytest.mark.parametrize("array", [
    np.array(3.0), np.zeros((0, 401)), np.arange(20.0).reshape(4, 5)[:, ::2],
    np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.array([True, False]),
    np.array([b"ab", b"c"]), np.arange(5, dtype=np.int64),
    np.zeros(3, dtype=[("a", "i4"), ("b", "f8")])], ids=repr)
def test_a_background_snapshots_copies_are_equal_and_detached(array: np.ndarray) -> None:
    """The copies a background snapshot takes (through ``tobytes``, holding the interpreter's
    lock) have the live array's dtype, shape and values, and do not change with it."""
    copy = checkpoint_module.copy_holding_the_lock(array)
    assert copy.dtype == array.dtype and copy.shape == array.shape
    assert np.array_equal(copy, array)
    before = copy.copy()
    if array.size:
        array[...] = array.flat[-1]  # the live array changes in place
    assert np.array_equal(copy, before)


def test_arrays_handed_over_are_written_without_a_copy(tmp_path: Path) -> None:
    """A background snapshot copies the caller's live arrays, but not those it hands over (its
    own fresh copies: the pending rows' 32 MB under a backlog cost 10-30 ms to copy again)."""
    ck, t = Checkpointer(tmp_path), Recording(tmp_path)
    live, fresh = np.array([1.0, 2.0]), np.array([3.0, 4.0])
    seen: dict[str, np.ndarray] = {}

    def finish(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.update(arrays)
        return arrays

    ck.save(t, {"live": live, "fresh": fresh}, {}, background=True, finish=finish,
            handed_over=["fresh"])
    ck.settle(t)
    assert seen["fresh"] is fresh and seen["live"] is not live
    restored = Checkpointer(tmp_path).restore()
    assert restored is not None and restored.arrays["fresh"].tolist() == [3.0, 4.0]


def test_every_pending_array_of_an_export_is_a_copy_nothing_else_holds() -> None:
    """What the daemon hands over to a background snapshot uncopied (``exported_copy``) shares
    no memory with the live store, and changing the store does not change it."""
    from streamlearn.join.pending import JoinSettings, PendingJoins

    rng = np.random.default_rng(5)
    store = PendingJoins(3, 6, JoinSettings())
    n = 40
    X = np.where(rng.random((n, 6)) < 0.3, rng.random((n, 6)), 0.0)
    store.add_decisions([f"e{i}" for i in range(n)], X, rng.integers(0, 3, n),
                        np.full((n, 3), 1 / 3), np.full(n, -1), np.zeros(n),
                        np.zeros(n, np.int64), wall=0.0)
    arrays, _ = store.export()
    handed = {name: a for name, a in arrays.items() if PendingJoins.exported_copy(name)}
    assert "pending.x.dense" in handed and "pending.action" in handed
    before = {name: a.copy() for name, a in handed.items()}
    live = [v for v in vars(store).values() if isinstance(v, np.ndarray)]
    live += [v for v in vars(store.rows).values() if isinstance(v, np.ndarray)]
    for name, a in handed.items():
        assert not any(np.shares_memory(a, other) for other in live), name
    store.action[:] = 2
    store.rows.dense[...] = 7.0  # type: ignore[index]
    assert all(np.array_equal(a, before[name], equal_nan=a.dtype.kind == "f")
               for name, a in handed.items())
