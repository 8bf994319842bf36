"""The VW ``--cb_explore_adf`` peer on candidate-set streams (skipped without vowpalwabbit)."""

from __future__ import annotations

import pytest

from simulators.peers_adf import ADF_EXPLORERS, adf_explorers, adf_lines, baselines, run_vw_adf
from streamlearn.datasets.candidates import synthetic_candidates
from streamlearn.errors import ConfigError

pytest.importorskip("vowpalwabbit")


def test_adf_lines_have_a_shared_line_only_with_context() -> None:
    with_x = synthetic_candidates(3, d_x=2, d_c=3, seed=0)
    without = synthetic_candidates(3, d_x=0, d_c=3, seed=0)
    assert [len(r) for r in adf_lines(with_x)] == (with_x.sets.sizes + 1).tolist()
    assert all(r[0].startswith("shared |s ") for r in adf_lines(with_x))
    assert all(line.startswith("|c ") for r in adf_lines(without) for line in r)
    assert adf_explorers(0) == [n for n in ADF_EXPLORERS if not n.endswith("-q")]


def test_vw_adf_beats_uniform_random_on_the_synthetic_stream() -> None:
    stream = synthetic_candidates(1500, d_x=3, d_c=3, seed=0)
    uniform = baselines(stream)[0]
    result = run_vw_adf(stream, "vw-adf-squarecb-q", seed=0)
    assert result["requests"] == 1500 and result["events_per_second"] > 0
    assert result["error_rate"] < uniform["error_rate"] - 0.05
    assert result["regret_per_request"] < uniform["regret_per_request"]
    assert run_vw_adf(stream, "vw-adf-squarecb-q", seed=0)["error_rate"] == result["error_rate"]  # seeded


def test_unknown_or_inapplicable_explorer_is_a_config_error() -> None:
    stream = synthetic_candidates(5, d_x=0, seed=0)
    with pytest.raises(ConfigError, match="Got 'vw-epsilon' instead"):
        run_vw_adf(stream, "vw-epsilon", seed=0)
    with pytest.raises(ConfigError, match="d_x = 0"):
        run_vw_adf(stream, "vw-adf-bag-q", seed=0)
