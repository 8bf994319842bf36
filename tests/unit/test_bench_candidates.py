"""`streamlearn bench` on a candidate-set stream: streamlearn's candidate learners beside VW's ADF."""

from __future__ import annotations

import orjson
import pytest

pytest.importorskip("vowpalwabbit")


def test_bench_reports_every_system_on_the_same_stream(capsys: pytest.CaptureFixture[str]) -> None:
    from streamlearn.cli import main

    assert main(["bench", "--dataset", "synthetic-candidates", "--rounds", "1500", "--seed", "2",
                 "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    systems = {r["system"]: r for r in report["results"]}
    assert {"streamlearn-cand-linucb", "streamlearn-cand-banditron", "vw-adf-bag-q"} <= set(systems)
    uniform = next(b for b in report["baselines"] if b["system"] == "uniform-random")
    assert report["reference"]["system"].startswith("vw-adf-")
    assert systems[report["reference"]["system"]]["speed_vs_reference"] == 1.0
    for name, row in systems.items():
        assert row["events_per_second"] > 0 and 0 <= row["error_rate"] <= 1, name
    # learning: the shared-model learners beat playing at random on the same 1,500 requests
    assert systems["streamlearn-cand-linucb"]["regret_per_request"] < 0.5 * uniform["regret_per_request"]
