"""Every learner is a ``streamlearn bench`` system; VW also runs with the --loss0 -1 --loss1 0 costs."""

from __future__ import annotations

import orjson
import pytest

from simulators.bench import OWN_EXPLORATION, SYSTEMS, parse_systems, run_bench
from simulators.peers import VW_EXPLORERS, VW_NEG_COSTS, import_vw
from streamlearn.cli import main
from streamlearn.datasets.stream import prepare_stream
from streamlearn.learners import LEARNERS


def test_every_bandit_learner_is_a_bench_system() -> None:
    benched = {algo for kind, algo, _ in SYSTEMS.values() if kind == "streamlearn"}
    assert benched == {name for name, cls in LEARNERS.items() if not cls.full_information}
    assert set(parse_systems("streamlearn")) >= {f"streamlearn-{n}" for n in OWN_EXPLORATION}


def test_vw_explorers_run_with_both_cost_encodings() -> None:
    for name, args in VW_EXPLORERS.items():
        if not name.endswith("-neg"):
            assert VW_EXPLORERS[f"{name}-neg"] == f"{args} {VW_NEG_COSTS}"
    assert VW_EXPLORERS["vw-cover"] == "--cover 3"


def test_new_learners_run_in_the_bench_with_their_own_exploration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    systems = ",".join(f"streamlearn-{n}" for n in sorted(OWN_EXPLORATION))
    assert main(["bench", "--dataset", "synsep", "--rounds", "2000", "--systems", systems,
                 "--json"]) == 0
    rows = orjson.loads(capsys.readouterr().out)["results"]
    assert len(rows) == len(OWN_EXPLORATION)
    for row in rows:
        assert row["skipped"] is None and 0.0 <= row["error_rate"] < 0.5, row


def test_vw_neg_cost_rows_count_the_played_errors() -> None:
    if import_vw() is None:
        pytest.skip("vowpalwabbit not installed")
    report = run_bench(prepare_stream("synsep", rounds=600),
                       systems=["vw-epsilon-neg", "vw-squarecb-neg"])
    for row in report.results:
        assert row.details["vw_error_matches"], row
