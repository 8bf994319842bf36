"""``streamlearn evaluate``: reproduces run_retrain's held-out estimates; clear one-line errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from retrain_world import write_log

from streamlearn.cli import main
from streamlearn.commands.evaluate import parse_segments
from streamlearn.errors import ConfigError
from streamlearn.retrain.job import run_retrain


@pytest.fixture(scope="module")
def retrained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("evaluate")
    write_log(root / "log", 5000, seed=1)
    result = run_retrain({"log_dir": str(root / "log"), "rankers": ["logistic", "rankboost"],
                          "artifact_dir": str(root / "rankers"), "version": 3,
                          "segments": [1, 3], "estimators": ["ips", "snips", "dr"]})
    return root, result


def evaluate_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["evaluate", *args, "--json"]) == 0
    report: dict[str, Any] = orjson.loads(capsys.readouterr().out)
    return report


def test_holdout_only_reproduces_run_retrain_exactly(
        retrained: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    root, result = retrained
    policies = ["logged", "learner", "uniform", "best_constant", "ranker:logistic",
                "ranker:rankboost"]
    report = evaluate_json(capsys, str(root / "log"), *[f"--policy={p}" for p in policies],
                           "--estimator", "ips,snips,dr,bound", "--segments", "1:3",
                           "--holdout-only")
    assert report["rows"] == result["heldout_rows"] and report["segments"] == result["segments"]
    assert report["estimates"] == {p: result["estimates"][p] for p in policies}


def test_a_ranker_by_path_and_a_constant_action(
        retrained: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    root, result = retrained
    path = result["rankers"]["logistic"]["artifact"]
    constant = f"constant:{result['best_constant']}"
    report = evaluate_json(capsys, str(root / "log"), f"--policy=ranker:{path}",
                           f"--policy={constant}", "--estimator", "snips,dr", "--segments", "1:3",
                           "--holdout-only", "--artifacts", str(root / "elsewhere"))
    for policy, same in ((f"ranker:{path}", "ranker:logistic"), (constant, "best_constant")):
        assert report["estimates"][policy] == {e: result["estimates"][same][e] for e in ("snips", "dr")}


def test_all_rows_and_the_table(retrained: tuple[Path, dict[str, Any]],
                                capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = retrained
    report = evaluate_json(capsys, str(root / "log"))
    assert report["rows"] == 5000
    assert set(report["estimates"]) == {"logged", "learner", "uniform"}
    assert all(list(e) == ["bound", "ips", "snips", "dr"] for e in report["estimates"].values())
    logged = report["estimates"]["logged"]
    assert logged["bound"]["low"] <= logged["ips"]["value"] <= logged["bound"]["high"]
    assert main(["evaluate", str(root / "log"), "--policy", "learner",
                 "--estimator", "snips,bound"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("Read 'bound'")
    assert out[2].split()[:3] == ["policy", "estimator", "value"]
    assert out[3].split()[:2] == ["learner", "snips"] and len(out) == 5
    assert out[4].split()[:2] == ["learner", "bound"] and "read this" in out[4]


def test_an_estimate_on_few_effective_rows_is_flagged(
        retrained: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    """A constant action on the 200 newest rows: few effective rows; and a clipped estimate
    says how much of it was clipped."""
    root, _ = retrained
    assert main(["evaluate", str(root / "log"), "--policy", "constant:2", "--estimator",
                 "snips,ips", "--max-rows", "60", "--clip", "2"]) == 0
    out = capsys.readouterr().out
    assert "not to be trusted" in out and "% of weights clipped (biased)" in out


@pytest.mark.parametrize("args,message", [
    (["{root}/missing"], "not a directory"),
    (["{root}/log", "--policy", "greedy"], "Expected --policy"),
    (["{root}/log", "--policy", "constant:x"], "integer action"),
    (["{root}/log", "--policy", "constant:9"], "constant action in [0, 4)"),
    (["{root}/log", "--policy", "ranker:nosuch"], "Expected an artifact nosuch"),
    (["{root}/log", "--estimator", "ips,ipw"], "Expected --estimator"),
    (["{root}/log", "--segments", "3"], "Expected --segments"),
])
def test_bad_input_is_one_line_and_exit_2(retrained: tuple[Path, dict[str, Any]],
                                          capsys: pytest.CaptureFixture[str], args: list[str],
                                          message: str) -> None:
    root, _ = retrained
    assert main(["evaluate", *[a.format(root=root) for a in args]]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("streamlearn evaluate: error:")


def test_parse_segments() -> None:
    assert parse_segments("2:5") == (2, 5) and parse_segments(":5") == (None, 5)
    assert parse_segments("2:") == (2, None) and parse_segments(None) == (None, None)
    with pytest.raises(ConfigError):
        parse_segments("a:b")


def test_the_table_flags_a_contradicted_bound_and_a_zero_width_interval() -> None:
    """An outside test read 'read this' beside a bound whose high end (0.115) was below its low
    end (0.627), and no warning beside a SNIPS interval of zero width on 49 effective rows."""
    from streamlearn.commands.evaluate import _note

    assert _note("bound", {"value": 0.63, "low": 0.6267, "high": 0.1151}).startswith(
        "contradicted: low above high")
    assert _note("bound", {"value": 0.5, "low": 0.4, "high": 0.6}).startswith("read this")
    zero = _note("snips", {"value": 1.0, "low": 1.0, "high": 1.0, "ess": 49.0, "n": 49})
    assert zero.startswith("an interval of zero width")
    assert _note("snips", {"value": 0.5, "low": 0.4, "high": 0.6, "ess": 49.0, "n": 49}) == ""
