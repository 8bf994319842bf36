"""The experience log: segments, rotation, retention, recovery to a checkpoint's position."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.durability.experience import ExperienceLog, list_segments, read_experience
from streamlearn.errors import ConfigError, StateError
from streamlearn.features import SparseBatch


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _append(log: ExperienceLog, ids: list[str], d: int = 3, K: int = 4, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    n = len(ids)
    probs = rng.dirichlet(np.ones(K), size=n)
    log.append(ids, rng.normal(size=(n, d)), rng.integers(0, K, n), probs,
               rng.integers(0, 2, n).astype(float), np.full(n, -1), np.arange(n), np.arange(n) * 1.0)


def test_rows_round_trip_in_order(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path, segment_rows=3)
    log.open(None)
    for lo, hi in ((0, 3), (3, 6), (6, 7)):
        _append(log, [f"id-{i}" for i in range(lo, hi)], seed=lo)
    log.flush()
    assert log.segments() == [0, 1, 2]  # 3 + 3 + 1 rows
    rows = read_experience(tmp_path)
    assert rows.ids == [f"id-{i}" for i in range(7)]
    assert rows.X.dtype == np.float32 and rows.X.shape == (7, 3) and rows.probs.shape == (7, 4)
    assert rows.segments == (0, 2)
    newest = read_experience(tmp_path, max_rows=4)
    assert newest.ids == [f"id-{i}" for i in range(3, 7)]
    assert read_experience(tmp_path, first_segment=1, last_segment=1).ids == ["id-3", "id-4", "id-5"]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=8), min_size=1, max_size=20, unique=True))
def test_any_unicode_id_round_trips(tmp_path_factory: pytest.TempPathFactory, ids: list[str]) -> None:
    directory = tmp_path_factory.mktemp("log")
    log = ExperienceLog(directory)
    log.open(None)
    _append(log, ids)
    log.flush()
    assert read_experience(directory).ids == ids


def test_sparse_and_dense_rows_mix_and_come_back_dense(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path)
    log.open(None)
    columns = (np.array([0, 1]), np.full((2, 2), 0.5), np.ones(2), np.full(2, -1),
               np.zeros(2, int), np.zeros(2))
    X = SparseBatch.from_rows([[0, 2], [1, 1]], [[1.5, -2.0], [3.0, 1.0]], n_features=3)
    sparse_dense = np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 7.0]])  # stored as CSR too
    log.append(["a", "b"], X, *columns)
    log.append(["c", "d"], sparse_dense, *columns)
    log.flush()
    assert "X.indptr" in np.load(tmp_path / "segment-00000000.npz").files
    log.append(["e", "f"], np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), *columns)  # dense
    log.append(["g", "h"], X, *columns)
    log.flush()
    assert read_experience(tmp_path).X.tolist() == [
        [1.5, 0.0, -2.0], [0.0, 4.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 7.0],
        [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [1.5, 0.0, -2.0], [0.0, 4.0, 0.0]]


def test_age_rotation_and_retention(tmp_path: Path) -> None:
    clock = Clock()
    log = ExperienceLog(tmp_path, segment_rows=1000, segment_seconds=10.0,
                        retention_seconds=100.0, wall_clock=clock)
    log.open(None)
    _append(log, ["a"])
    assert log.segments() == [] and log.buffered == 1
    clock.t += 11
    _append(log, ["b"])  # the buffer's oldest row is 11 s old: it becomes a segment
    assert log.segments() == [0] and log.buffered == 0
    for i in range(3):
        clock.t += 60
        _append(log, [f"c{i}"])
        log.flush()
    # segments written more than 100 s ago are gone; the newest is always kept
    assert log.segments() == [2, 3]
    assert read_experience(tmp_path).ids == ["c1", "c2"]


def test_size_retention_keeps_the_newest(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path, segment_rows=10, retention_bytes=1)
    log.open(None)
    for i in range(4):
        _append(log, [f"{i}-{j}" for j in range(10)])
    log.flush()
    assert log.segments() == [3]


def test_open_drops_segments_after_the_checkpoint_and_temporary_files(tmp_path: Path) -> None:
    log = ExperienceLog(tmp_path, segment_rows=2)
    log.open(None)
    for lo in range(0, 6, 2):
        _append(log, [str(lo), str(lo + 1)], seed=lo)
    assert log.segments() == [0, 1, 2]
    (tmp_path / ".segment-00000003-deadbeef.tmp").write_bytes(b"half a segment")
    reopened = ExperienceLog(tmp_path, segment_rows=2)
    reopened.open(2)  # the checkpoint was taken when segments 0 and 1 existed
    assert reopened.segments() == [0, 1] and reopened.next_segment == 2
    assert not list(tmp_path.glob("*.tmp"))
    _append(reopened, ["4", "5"])
    reopened.flush()
    assert read_experience(tmp_path).ids == [str(i) for i in range(6)]
    fresh = ExperienceLog(tmp_path)
    fresh.open(None)  # no checkpoint: every row will be joined again
    assert fresh.segments() == [] and fresh.next_segment == 0


def test_bad_settings_and_directories_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be positive"):
        ExperienceLog(tmp_path, segment_rows=0)
    with pytest.raises(ConfigError, match="not a directory"):
        list_segments(tmp_path / "missing")
    (tmp_path / "segment-00000000.npz").write_bytes(b"not a zip")
    with pytest.raises(StateError, match="not a readable experience segment"):
        read_experience(tmp_path)
