"""``streamlearn inspect``: checkpoints, learner save dirs, corrupt files."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from streamlearn.cli import main
from streamlearn.learners import make_learner, save_learner
from streamlearn.snapshot import pack_strings, write_snapshot


def fake_checkpoint(directory: Path, seq: int, n_pending: int) -> Path:
    learner = make_learner("banditron", 3, 5)
    arrays, meta = learner.state()
    utf8, ends = pack_strings([f"e{i}" for i in range(n_pending)])
    arrays = {**arrays, "pending.ids.utf8": utf8, "pending.ids.ends": ends}
    path = directory / f"ckpt-{seq:08d}"
    write_snapshot(path, arrays, {"learner": meta, "seq": seq,
                                  "offsets": [["in", 0, 10 * seq], ["fb", 0, 7 * seq]],
                                  "counters": {"instances": 10 * seq}})
    return path


def test_learner_save_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_learner(make_learner("banditron", 4, 6, seed=3), tmp_path / "model")
    assert main(["inspect", str(tmp_path / "model")]) == 0
    out = capsys.readouterr().out
    assert "learner         Banditron" in out
    assert "checksum        ok" in out
    assert "learner.weights" in out and "4×6" in out


def test_checkpoint_dir_shows_newest_and_json(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    fake_checkpoint(tmp_path, 1, 2)
    fake_checkpoint(tmp_path, 2, 5)
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    info = orjson.loads(capsys.readouterr().out)
    assert info["seq"] == 2 and info["pending_joins"] == 5
    assert info["offsets"] == [{"topic": "in", "partition": 0, "next_offset": 20},
                               {"topic": "fb", "partition": 0, "next_offset": 14}]
    assert info["learner"]["class"] == "Banditron"
    assert info["learner"]["params"]["n_actions"] == 3
    assert info["other"] == {"counters": {"instances": 20}}
    assert info["checksum_ok"] is True
    assert main(["inspect", str(tmp_path), "--all", "--json"]) == 0
    assert [i["seq"] for i in orjson.loads(capsys.readouterr().out)] == [1, 2]


def test_corrupt_snapshot_is_a_one_line_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = fake_checkpoint(tmp_path, 1, 0)
    arrays = path / "arrays.npz"
    data = bytearray(arrays.read_bytes())
    data[-10] ^= 0xFF
    arrays.write_bytes(bytes(data))
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and len(err.strip().splitlines()) == 1


def test_not_a_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path)]) == 2
    assert "neither a streamlearn snapshot" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_corrupt_newest_checkpoint_shows_the_one_serve_restores(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """serve falls back past a corrupt newest snapshot; inspect used to stop at it (exit 2)."""
    fake_checkpoint(tmp_path, 1, 2)
    newest = fake_checkpoint(tmp_path, 2, 5)
    arrays = newest / "arrays.npz"
    arrays.write_bytes(arrays.read_bytes()[:100])  # truncated
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    info = orjson.loads(capsys.readouterr().out)
    assert info["seq"] == 1 and [s["path"] for s in info["skipped"]] == [str(newest)]
    assert "corrupt or truncated" in info["skipped"][0]["error"]
    assert main(["inspect", str(tmp_path), "--all", "--json"]) == 0
    listed = orjson.loads(capsys.readouterr().out)
    assert [("error" in s) for s in listed] == [False, True]
    assert main(["inspect", str(tmp_path)]) == 0
    assert "passed over" in capsys.readouterr().out
    (tmp_path / "ckpt-00000001" / "meta.json").write_text("{")  # none reads: an error
    assert main(["inspect", str(tmp_path)]) == 2
    assert "ckpt-00000002" in capsys.readouterr().err
