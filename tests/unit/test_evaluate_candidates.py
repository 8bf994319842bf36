"""``streamlearn evaluate`` on a candidate-mode log: the per-slot values the retrain loop
judges rankers on, reproduced from ``--retrain V``; the truth inside the intervals;
clear one-line errors for what does not apply to candidate sets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from candidate_world import D_C, D_X, SLOTS, logged_world
from retrain_world import write_log

from streamlearn.candidates.slates import deployed_distribution
from streamlearn.cli import main
from streamlearn.durability.experience import read_experience
from streamlearn.retrain.artifact import load_artifact
from streamlearn.retrain.candidates import heldout_requests, run_candidate_retrain
from streamlearn.retrain.store import RankerStore, candidate_entry


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, Any]]:
    """2,000 logged requests, one retrain (version 1) recorded as the daemon records it."""
    root = tmp_path_factory.mktemp("evaluate-candidates")
    stream, _, _, _ = logged_world(root / "experience", 2000, seed=11)
    result = run_candidate_retrain({
        "log_dir": str(root / "experience"), "artifact_dir": str(root / "rankers"),
        "rankers": ["logistic", "rankboost"], "version": 1, "max_rows": 5000,
        "candidates": {"d_x": D_X, "d_c": D_C}, "holdout_fraction": 0.3, "watermark": 1800.0,
        "challenger_index": 2})
    store = RankerStore(root / "rankers")
    store.open()
    store.record(candidate_entry(result, "logistic", 0.0, 0.0))
    return root, stream, result


def evaluate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["evaluate", *args, "--json"]) == 0
    report: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    return report


def test_retrain_v_reproduces_the_loops_per_slot_values_and_verdicts(
        world: tuple[Path, Any, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    root, _, result = world
    report = evaluate_json(capsys, str(root / "experience"), "--retrain", "1")
    assert report["mode"] == "candidates" and report["retrain"] == 1
    assert report["requests"] == result["offpolicy"]["requests"] and report["slots"] == SLOTS
    assert (report["d_x"], report["d_c"]) == (D_X, D_C)
    for name in ("logistic", "rankboost"):
        recorded = result["rankers"][name]["offpolicy"]
        got = report["estimates"][f"ranker:{name}"]
        assert got["slots"] == recorded["slots"]  # the same numbers, not merely close
        assert {k: got["verdict"][k] for k in ("passed", "advantage_lower", "rows", "ess")} == \
            {k: recorded[k] for k in ("passed", "advantage_lower", "rows", "ess")}
        assert got["verdict"]["alpha"] == recorded["alpha"]  # what the loop spent on it
    logged = [s["mean"] for s in report["estimates"]["logged"]["slots"]]
    assert logged == pytest.approx(result["offpolicy"]["learner_slots"], abs=1e-12)


def test_uniform_and_a_ranker_by_path_hold_their_truth(
        world: tuple[Path, Any, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    """Without --retrain every request of the request log is judged; each policy's interval
    at slot s holds its true value there given the logged prefix."""
    root, stream, result = world
    path = result["rankers"]["logistic"]["artifact"]
    report = evaluate_json(capsys, str(root / "experience"), "--policy", "logged",
                           "--policy", "uniform", "--policy", f"ranker:{path}")
    assert report["requests"] > result["offpolicy"]["requests"]  # no watermark here
    mu = np.asarray(stream.expected)
    offsets = stream.sets.offsets
    judged = heldout_requests(root / "experience", read_experience(root / "experience"), D_X,
                              D_C, 1.0, None, None, None)
    assert not isinstance(judged, str) and len(judged) == report["requests"]
    order = [stream.request_ids.index(r) for r in judged.request_ids]
    rows = np.concatenate([np.arange(offsets[q], offsets[q + 1]) for q in order])
    truth_mu = mu[rows]
    scores = load_artifact(path).ranker.score(judged.phi)
    for policy, score, gamma in (("uniform", np.zeros(len(rows)), np.ones(len(judged))),
                                 (f"ranker:{path}", scores, judged.gamma)):
        placed = np.zeros(len(rows), dtype=bool)
        for s, interval in enumerate(report["estimates"][policy]["slots"]):
            dist = deployed_distribution(score, judged.offsets, placed, gamma)
            value = np.add.reduceat(dist * truth_mu, judged.offsets[:-1]).mean()
            assert interval["low"] <= value <= interval["high"], (policy, s, value, interval)
            placed[judged.logged[:, s]] = True
    for interval in report["estimates"]["logged"]["slots"]:
        assert interval["low"] <= interval["mean"] <= interval["high"]


def test_the_table(world: tuple[Path, Any, dict[str, Any]],
                   capsys: pytest.CaptureFixture[str]) -> None:
    root, _, _ = world
    assert main(["evaluate", str(root / "experience"), "--retrain", "1"]) == 0
    out = capsys.readouterr().out
    assert "3 slots" in out and "ranker:logistic" in out and "against what placed" in out


@pytest.mark.parametrize("args, message", [
    (["--policy", "learner"], "learner's own scores are not logged"),
    (["--policy", "constant:1"], "Expected --policy logged, uniform, ranker:NAME"),
    (["--estimator", "dr"], "Expected --estimator among bound, ips on a candidate-mode log"),
    (["--clip", "20"], "Expected no --clip on a candidate-mode log"),
    (["--policy", "ranker:nosuch"], "Expected an artifact nosuch"),
    (["--retrain", "7"], "one of [1]"),
    (["--holdout-only"], "Expected no --holdout-only or --holdout-fraction"),
    (["--holdout-fraction", "0.5"], "Expected no --holdout-only or --holdout-fraction"),
    (["--retrain", "1", "--level", "0.8"], "Expected no --level with --retrain"),
    (["--estimator", "bogus"], "Expected --estimator among bound, ips on a candidate-mode"),
])
def test_what_does_not_apply_to_candidate_sets_is_one_line_and_exit_2(
        world: tuple[Path, Any, dict[str, Any]], capsys: pytest.CaptureFixture[str],
        args: list[str], message: str) -> None:
    root, _, _ = world
    assert main(["evaluate", str(root / "experience"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_artifacts_of_the_other_shape_and_old_entries_are_refused(
        world: tuple[Path, Any, dict[str, Any]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, _, result = world
    write_log(tmp_path / "fixed", 3000, seed=2)
    candidate_ranker = result["rankers"]["logistic"]["artifact"]
    assert main(["evaluate", str(tmp_path / "fixed"), "--policy", f"ranker:{candidate_ranker}"]) == 2
    assert "retrained on candidate sets" in capsys.readouterr().err
    old = {k: v for k, v in candidate_entry(result, "logistic", 0.0, 0.0).items()
           if k not in ("max_rows", "watermark", "candidates")}
    store = RankerStore(tmp_path / "older")
    store.open()
    store.record(old)
    assert main(["evaluate", str(root / "experience"), "--retrain", "1",
                 "--artifacts", str(tmp_path / "older")]) == 2
    assert "to record its window" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "nosuch")]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_a_retrain_that_is_no_number_is_argparses_error(
        world: tuple[Path, Any, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    root, _, _ = world
    with pytest.raises(SystemExit) as exited:
        main(["evaluate", str(root / "experience"), "--retrain", "x"])
    assert exited.value.code == 2
    assert "argument --retrain: expected an integer >= 1, got 'x'" in capsys.readouterr().err
