"""The retrain job on a real experience log, and the promotion gate (planted better and worse rankers)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from retrain_world import EPS, D, K, mean_reward, write_log

from streamlearn.durability.experience import read_experience
from streamlearn.errors import ConfigError, DataError
from streamlearn.retrain.artifact import load_artifact
from streamlearn.retrain.job import run_retrain
from streamlearn.retrain.promotion import challenger_alpha, promotion_decision

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
    assert set(result["estimates"]) == {"logged", "learner", "ranker:logistic",
                                        "ranker:plantedbest", "uniform", "best_constant"}
    assert all(set(e) == {"ips", "snips", "dr", "bound"} for e in result["estimates"].values())
    assert [c["name"] for c in result["challengers"]] == ["logistic", "plantedbest"]
    assert [c["index"] for c in result["challengers"]] == [1, 2]
    assert result["challenger_index"] == 2


def test_the_held_out_slice_is_the_newest_rows_in_time(logged: Path, tmp_path: Path) -> None:
    """The slice is every row decided at or after a cut; nothing before it is held out, and a
    watermark leaves out every row decided at or after it."""
    result = run_retrain(spec(logged, ["rocchio"], artifact_dir=str(tmp_path), watermark=5000.0))
    assert result["rows"] == 5000  # decided_at 0..4999 (write_log decides row i at time i)
    assert result["evidence_since"][0] == 3500.0 and result["heldout_rows"] == 1500
    challenger = result["challengers"][0]
    assert challenger["since"] == result["evidence_since"] and challenger["rows"] == 1500


def test_the_bounds_cover_the_true_values_of_the_simulated_world(logged: Path,
                                                                 tmp_path: Path) -> None:
    """Each policy as deployed (its best action, the logger's exploration γ = ε) against its
    value computed from the world's true reward function."""
    result = run_retrain(spec(logged, [BEST, WORST], artifact_dir=str(tmp_path)))
    X = np.random.default_rng(99).normal(size=(200_000, D))
    mu = mean_reward(X)
    explore = EPS * mu.mean(axis=1)
    truth = {"ranker:plantedbest": ((1 - EPS) * mu.max(axis=1) + explore).mean(),
             "ranker:plantedworst": ((1 - EPS) * mu.min(axis=1) + explore).mean(),
             "uniform": mu.mean()}
    for policy, value in truth.items():
        bound = result["estimates"][policy]["bound"]
        assert bound["low"] <= value <= bound["high"], (policy, bound, value)
        assert abs(result["estimates"][policy]["dr"]["value"] - value) < 0.05


def test_a_planted_better_ranker_is_promoted_and_a_worse_one_is_not(logged: Path,
                                                                    tmp_path: Path) -> None:
    better = promotion_decision(run_retrain(spec(logged, [WORST, BEST], artifact_dir=str(tmp_path))))
    assert better["promote"] and better["ranker"] == "plantedbest"
    assert better["advantage_lower"] > 0 and "advantage over what was live" in better["reason"]
    worse = promotion_decision(run_retrain(spec(logged, [WORST], version=2,
                                                artifact_dir=str(tmp_path))))
    assert not worse["promote"] and worse["ranker"] == "plantedworst"
    assert worse["advantage_lower"] < 0 and "no challenger" in worse["reason"]


def test_challengers_of_earlier_retrains_keep_gathering_evidence(tmp_path: Path) -> None:
    """A challenger judged again sees its own evidence from its own slice on, extended by
    what was logged since; its miss probability stays the one it was given."""
    write_log(tmp_path / "log", 6000, seed=1)
    first = run_retrain(spec(tmp_path, [BEST], watermark=3000.0))
    (judged,) = first["challengers"]
    assert judged["looks"] == 1 and judged["rows"] == 3000 - judged["since"][0]
    tracked = {k: judged[k] for k in ("name", "artifact", "version", "since", "first_segment",
                                      "index", "alpha", "looks")}
    second = run_retrain(spec(tmp_path, ["rocchio"], version=2, watermark=6000.0,
                              challengers=[tracked], challenger_index=1))
    again, new = second["challengers"]
    assert again["version"] == 1 and again["looks"] == 2 and again["alpha"] == judged["alpha"]
    assert again["rows"] == 6000 - judged["since"][0]
    assert new["index"] == 2 and new["alpha"] == pytest.approx(challenger_alpha(0.05, 2))
    assert again["advantage_lower"] >= judged["advantage_lower"] - 1e-9 or again["passed"]


def test_a_retrained_copy_of_the_current_ranker_is_estimated_like_it(logged: Path,
                                                                     tmp_path: Path) -> None:
    first = run_retrain(spec(logged, [BEST], artifact_dir=str(tmp_path)))
    current = first["rankers"]["plantedbest"]["artifact"]
    again = run_retrain(spec(logged, [BEST], version=2, artifact_dir=str(tmp_path), current=current))
    assert again["current"] == {"policy": "current", "artifact": current}
    assert again["estimates"]["current"] == again["estimates"]["ranker:plantedbest"]


def _challenger(name: str, advantage: float, passed: bool) -> dict[str, Any]:
    return {"name": name, "version": 3, "artifact": f"/a/{name}", "rows": 1000, "ess": 50.0,
            "alpha": 0.025, "passed": passed, "advantage_lower": advantage,
            "value": {"low": 0.4, "high": 0.6, "mean": 0.5, "n": 1000}}


def test_the_gate_promotes_the_best_challenger_that_passed_and_nothing_else() -> None:
    result = {"challengers": [_challenger("a", 0.02, True), _challenger("b", 0.05, True),
                              _challenger("c", 0.2, False)]}
    before = copy.deepcopy(result)
    decision = promotion_decision(result)
    assert decision["promote"] and decision["ranker"] == "b" and decision["artifact"] == "/a/b"
    assert result == before
    none = promotion_decision({"challengers": [_challenger("c", -0.01, False)]})
    assert not none["promote"] and none["ranker"] == "c"
    assert not promotion_decision({"challengers": []})["promote"]


def test_bad_specs_fail_before_any_training(logged: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs qid"):
        run_retrain(spec(logged, ["adarank"], artifact_dir=str(tmp_path)))
    with pytest.raises(ConfigError, match="'version'"):
        run_retrain({"log_dir": str(logged / "log"), "rankers": [], "artifact_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="held-out fraction"):
        run_retrain(spec(logged, ["lda"], artifact_dir=str(tmp_path), holdout_fraction=0.0))
    with pytest.raises(DataError, match="held-out"):
        run_retrain(spec(logged, ["lda"], artifact_dir=str(tmp_path), watermark=-1.0))
    assert not any(tmp_path.iterdir())
    assert K == 4  # the world the figures above assume
