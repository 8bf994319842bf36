"""The retrain job on a real experience log, and the promotion rule (planted better and worse rankers)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from retrain_world import D, mean_reward, write_log

from streamlearn.errors import ConfigError, DataError
from streamlearn.retrain.artifact import load_artifact
from streamlearn.retrain.job import promotion_decision, run_retrain
from streamlearn.stream.experience import read_experience

BEST, WORST = "retrain_world:PlantedBest", "retrain_world:PlantedWorst"


def spec(tmp_path: Path, rankers: list[str], version: int = 1, **extra: Any) -> dict[str, Any]:
    return {"log_dir": str(tmp_path / "log"), "rankers": rankers, "version": version,
            "artifact_dir": str(tmp_path / "rankers"), "holdout_fraction": 0.3, **extra}


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("retrain")
    write_log(root / "log", 6000, seed=0)
    return root


def test_the_report_is_json_and_counts_what_it_used(logged: Path, tmp_path: Path) -> None:
    result = run_retrain(spec(logged, ["logistic", BEST], artifact_dir=str(tmp_path),
                              segments=[1, 4], max_rows=3500))
    assert orjson.loads(orjson.dumps(result)) == result
    rows = read_experience(logged / "log", 1, 4, 3500)
    assert result["rows"] == len(rows) == 3500
    assert result["segments"] == list(rows.segments) and result["segments"][1] == 4
    assert result["train_rows"] + result["heldout_rows"] == 3500
    assert result["duration_seconds"] > 0
    for name in ("logistic", "plantedbest"):
        info = result["rankers"][name]
        assert Path(info["artifact"]).name == f"{name}-v00000001"
        assert load_artifact(info["artifact"]).version == 1
        assert 0.0 <= info["auc"] <= 1.0 and 0.0 <= info["ndcg"] <= 1.0
    assert set(result["estimates"]) == {"learner", "ranker:logistic", "ranker:plantedbest",
                                        "uniform", "best_constant"}
    assert all(set(e) == {"snips", "dr"} for e in result["estimates"].values())


def test_estimates_cover_the_true_values_of_the_simulated_world(logged: Path, tmp_path: Path) -> None:
    result = run_retrain(spec(logged, [BEST, WORST], artifact_dir=str(tmp_path)))
    X = np.random.default_rng(99).normal(size=(200_000, D))
    mu = mean_reward(X)
    truth = {"ranker:plantedbest": mu.max(axis=1).mean(), "ranker:plantedworst": mu.min(axis=1).mean(),
             "uniform": mu.mean()}
    for policy, value in truth.items():
        for est in result["estimates"][policy].values():
            assert est["low"] <= value <= est["high"], (policy, est, value)


def test_a_planted_better_ranker_is_promoted_and_a_worse_one_is_not(logged: Path,
                                                                    tmp_path: Path) -> None:
    better = promotion_decision(run_retrain(spec(logged, [WORST, BEST], artifact_dir=str(tmp_path))))
    assert better["promote"] and better["ranker"] == "plantedbest"
    assert better["lower"] > better["current_value"] and "lower bound" in better["reason"]
    worse = promotion_decision(run_retrain(spec(logged, [WORST], version=2,
                                                artifact_dir=str(tmp_path))), "dr")
    assert not worse["promote"] and worse["ranker"] == "plantedworst"
    assert worse["lower"] <= worse["current_value"]


def test_a_retrained_copy_of_the_current_ranker_is_not_promoted(logged: Path, tmp_path: Path) -> None:
    first = run_retrain(spec(logged, [BEST], artifact_dir=str(tmp_path)))
    current = first["rankers"]["plantedbest"]["artifact"]
    again = run_retrain(spec(logged, [BEST], version=2, artifact_dir=str(tmp_path), current=current))
    assert again["current"] == {"policy": "current", "artifact": current}
    assert again["estimates"]["current"] == again["estimates"]["ranker:plantedbest"]
    assert not promotion_decision(again)["promote"]  # its LCB is below its own point estimate


def _result(lower: float, current: float) -> dict[str, Any]:
    est = {"value": current, "low": current - 0.1, "high": current + 0.1}
    return {"current": {"policy": "learner"}, "rankers": {"r": {"policy": "ranker:r", "artifact": "x"}},
            "estimates": {"learner": {"snips": est},
                          "ranker:r": {"snips": {"value": lower + 0.1, "low": lower, "high": 1.0,
                                                 "stderr": 0.05}}}}


@pytest.mark.parametrize("lower,current,promote", [(0.5, 0.5, False), (0.4999, 0.5, False),
                                                    (0.5001, 0.5, True)])
def test_the_rule_promotes_only_when_the_lower_bound_is_strictly_above(
        lower: float, current: float, promote: bool) -> None:
    result = _result(lower, current)
    before = copy.deepcopy(result)
    decision = promotion_decision(result)
    assert decision["promote"] is promote and decision["lower"] == lower
    assert decision["current_value"] == current and result == before


def test_the_best_lower_bound_among_several_rankers_is_the_candidate() -> None:
    result = _result(0.3, 0.5)
    result["rankers"]["s"] = {"policy": "ranker:s", "artifact": "y"}
    result["estimates"]["ranker:s"] = {"snips": {"value": 0.7, "low": 0.6, "high": 0.8, "stderr": 0.05}}
    decision = promotion_decision(result)
    assert decision["promote"] and decision["ranker"] == "s" and decision["artifact"] == "y"
    with pytest.raises(ConfigError, match="'ips'"):
        promotion_decision(result, "ips")


@pytest.mark.parametrize("ess, current, promote", [(3.0, 0.5, False), (20.0, 0.5, True),
                                                    (20.0, 0.838, True), (20.0, 0.839, False),
                                                    (400.0, 0.98, True)])
def test_a_degenerate_interval_is_bounded_by_its_effective_sample_size(
        ess: float, current: float, promote: bool) -> None:
    """Matched held-out rows all rewarded: SNIPS 1.0 with stderr 0. Three rows are no
    evidence; twenty are worth the Wilson bound (0.8389), not certainty."""
    result = _result(0.3, current)
    result["estimates"]["ranker:r"]["snips"] = {"value": 1.0, "low": 1.0, "high": 1.0,
                                                "stderr": 0.0, "ess": ess}
    decision = promotion_decision(result)
    assert decision["promote"] is promote, decision
    if ess < 20:
        assert "effectively matched" in decision["reason"]


def test_bad_specs_fail_before_any_training(logged: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs qid"):
        run_retrain(spec(logged, ["adarank"], artifact_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="'version'"):
        run_retrain({"log_dir": str(logged / "log"), "rankers": [], "artifact_dir": str(tmp_path)})
    with pytest.raises(DataError, match="held-out"):
        run_retrain(spec(logged, ["lda"], artifact_dir=str(tmp_path), holdout_fraction=0.0))
    assert not any(tmp_path.iterdir())
