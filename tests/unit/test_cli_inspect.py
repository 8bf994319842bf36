"""``streamlearn inspect``: checkpoints, learner save dirs, corrupt files."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
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


def test_long_names_and_values_stay_readable(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A 32-character array name ran into its shape ('learner.oracle.intercept_sq_grad9'), and
    a long JSON value was cut at '…' with no word of the rest."""
    learner = make_learner("banditron", 3, 5)
    arrays, meta = learner.state()
    arrays = {**arrays, "learner.oracle.intercept_sq_grad": np.zeros(9)}
    settings = {f"setting_{i}": i * 1.5 for i in range(40)}
    write_snapshot(tmp_path / "ckpt-00000001", arrays,
                   {"learner": meta, "seq": 1, "offsets": [], "settings": settings})
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"learner\.oracle\.intercept_sq_grad +9 +float64", out), out
    line = next(line for line in out.splitlines() if line.startswith("settings"))
    assert line.endswith("characters: --json shows all)")
    assert "exploration" in out and "{" not in next(
        line for line in out.splitlines() if line.strip().startswith("exploration"))


def test_ranker_history_rounds_ndcg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rankers = tmp_path / "rankers"
    rankers.mkdir()
    entry = {"version": 3, "ranker": "rankboost", "promoted": False,
             "reason": "candidate mode: measured on the logged slates, not promoted",
             "rankers": {"rankboost": {"ndcg": 0.7234234234234234, "auc": 0.61234123412},
                         "rocchio": {"ndcg": 0.6999999999999999, "auc": None}},
             "learner": {"ndcg": 0.6123412341234123}}
    (rankers / "state.json").write_bytes(orjson.dumps({"live": None, "promoted": [],
                                                       "history": [entry]}))
    assert main(["inspect", str(rankers)]) == 0
    out = capsys.readouterr().out
    assert ("held-out NDCG rankboost 0.7234, rocchio 0.7000, the learner's slot order 0.6123"
            in out)
    assert "0.72342" not in out


def test_the_rollout_mode_and_its_switches_from_the_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``inspect`` shows the rollout mode next to an existing system (``rollout.mode``), the
    learner's share, the agreement, each side's live value and every switch with its reason."""
    from streamlearn.service.adoption import Adoption, AdoptionSettings

    adoption = Adoption(AdoptionSettings("apprentice", explore_budget=0.2))
    adoption.note_decisions(np.array([1, 2, 3, 0]), np.array([1, 2, 0, 0]))
    adoption.observe(np.array([-1, -1, 0, -1]), np.array([1.0, 0.0, 1.0, 1.0]),
                     np.array([1, 2, 0, 0]), 0)
    adoption.step_back()  # already apprentice: no switch
    learner = make_learner("banditron", 3, 5)
    arrays, meta = learner.state()
    a_arrays, meta_adoption = adoption.export()
    write_snapshot(tmp_path / "ckpt-00000001", {**arrays, **a_arrays},
                   {"learner": meta, "seq": 1, "adoption": meta_adoption})
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("rollout mode    apprentice; the learner serves 20 % (the baseline the rest); "
            "agreement with the baseline 0.750") in out
    assert "  earned        baseline 0.6667 [0.0000, 1.0000] on 3; learner 1.0000 [0.0000, " \
        "1.0000] on 1" in out  # each side's interval: three events say little
    assert "  switches      0\n" in out
    assert "adoption" not in out.split("arrays")[0]  # not dumped as raw JSON

    adoption._switch("conservative", "the learner's lower bound 0.6 >= ...")
    adoption._switch("online", "the learner's lower bound 0.7 > ...")
    adoption.step_back()
    a_arrays, meta_adoption = adoption.export()
    write_snapshot(tmp_path / "ckpt-00000002", {**arrays, **a_arrays},
                   {"learner": meta, "seq": 2, "adoption": meta_adoption})
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rollout mode    conservative (configured apprentice); the learner serves 0 %" in out
    assert "  earned        - (nothing learned in this mode yet)" in out
    assert "  switches      3, newest last" in out
    assert re.search(r"apprentice -> conservative: the learner's lower bound 0\.6 >= \.\.\.\n"
                     r" +conservative -> online: .*\n +online -> conservative: asked for "
                     r"\(SIGUSR2\)", out), out
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    info = orjson.loads(capsys.readouterr().out)
    assert info["adoption"]["mode"] == "conservative"
    assert info["adoption"]["configured"] == "apprentice"
    assert [h["to"] for h in info["adoption"]["history"]] == ["conservative", "online",
                                                               "conservative"]
    assert "adoption" not in info.get("other", {})


@pytest.mark.parametrize("argv", [[], ["--changelog", "t"], ["--bootstrap", "h:1"],
                                  ["some/dir", "--changelog", "t", "--bootstrap", "h:1"]])
def test_a_path_or_a_changelog_with_its_broker(argv: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", *argv]) == 2
    err = capsys.readouterr().err
    assert "needs a PATH, or --changelog TOPIC with --bootstrap" in err
    assert len(err.strip().splitlines()) == 1
