"""Save → load of learners and snapshots: corrupt, truncated or foreign files give clear errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from streamlearn.errors import StateError
from streamlearn.learners import Banditron, FixedGamma, load_learner, save_learner
from streamlearn.snapshot import meta_checksum, read_snapshot, write_snapshot


@pytest.fixture()
def saved(tmp_path: Path) -> Path:
    learner = Banditron(3, 4, FixedGamma(0.1), seed=2)
    X = np.random.default_rng(0).normal(size=(20, 4))
    a, p = learner.decide(X)
    learner.update(X, a, np.ones(20), p)
    save_learner(learner, tmp_path / "model")
    return tmp_path / "model"


def test_round_trip_restores_weights_and_counters(saved: Path) -> None:
    restored = load_learner(saved)
    assert isinstance(restored, Banditron)
    assert restored.n_decided_ == 20 and restored.n_updated_ == 20
    assert np.abs(restored.weights_).sum() > 0


def test_truncated_arrays_file(saved: Path) -> None:
    data = (saved / "arrays.npz").read_bytes()
    (saved / "arrays.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(StateError, match="corrupt or truncated"):
        load_learner(saved)


def test_flipped_byte_in_arrays_file(saved: Path) -> None:
    data = bytearray((saved / "arrays.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (saved / "arrays.npz").write_bytes(bytes(data))
    with pytest.raises(StateError, match="sha256"):
        load_learner(saved)


def test_corrupt_metadata(saved: Path) -> None:
    (saved / "meta.json").write_text("{not json")
    with pytest.raises(StateError, match="not valid JSON"):
        load_learner(saved)


def test_other_format_version(saved: Path) -> None:
    meta = json.loads((saved / "meta.json").read_text())
    meta["format_version"] = 99
    (saved / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StateError, match="format version 99"):
        load_learner(saved)


def test_missing_files(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="not a streamlearn snapshot"):
        load_learner(tmp_path)


def test_wrong_shapes_with_a_valid_checksum(tmp_path: Path, saved: Path) -> None:
    arrays, meta = read_snapshot(saved)
    arrays["learner.weights"] = np.zeros((2, 2))
    write_snapshot(tmp_path / "bad", arrays, {k: v for k, v in meta.items()
                                             if k not in ("format_version", "arrays_sha256")})
    with pytest.raises(StateError, match="must have shape"):
        load_learner(tmp_path / "bad")


def test_nan_weights_are_refused(tmp_path: Path, saved: Path) -> None:
    arrays, meta = read_snapshot(saved)
    arrays["learner.weights"] = np.full((3, 4), np.nan)
    write_snapshot(tmp_path / "nan", arrays, {k: v for k, v in meta.items()
                                             if k not in ("format_version", "arrays_sha256")})
    with pytest.raises(StateError, match="NaN"):
        load_learner(tmp_path / "nan")


def test_object_arrays_are_never_written_nor_loaded(tmp_path: Path, saved: Path) -> None:
    with pytest.raises(StateError, match="object arrays"):
        write_snapshot(tmp_path / "obj", {"w": np.array([{"a": 1}], dtype=object)}, {})
    # a hand-made file with a pickled object array and a matching checksum is still refused
    np.savez(saved / "arrays.npz", w=np.array([{"a": 1}], dtype=object))
    meta = json.loads((saved / "meta.json").read_text())
    meta["arrays_sha256"] = hashlib.sha256((saved / "arrays.npz").read_bytes()).hexdigest()
    meta["meta_sha256"] = meta_checksum(meta)
    (saved / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StateError, match="cannot be read"):
        read_snapshot(saved)


def test_rewrite_is_atomic_and_leaves_no_temporaries(tmp_path: Path) -> None:
    for i in range(3):
        write_snapshot(tmp_path / "s", {"w": np.full(2, i)}, {"i": i})
    arrays, meta = read_snapshot(tmp_path / "s")
    assert meta["i"] == 2 and arrays["w"].tolist() == [2, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_a_meta_json_without_the_arrays_checksum_says_so(tmp_path: Path) -> None:
    """A hand-edited meta.json without its checksums read 'does not match the recorded None'
    (an outside test)."""
    write_snapshot(tmp_path / "s", {"w": np.zeros(3)}, {"kind": "demo"})
    meta_path = tmp_path / "s" / "meta.json"
    meta = json.loads(meta_path.read_text())
    for key in ("arrays_sha256", "meta_sha256"):
        meta.pop(key, None)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(StateError, match=r"records no arrays_sha256: expected the sha256 of "
                                         r"arrays\.npz, got none"):
        read_snapshot(tmp_path / "s")
