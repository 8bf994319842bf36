"""Replay engine and ``streamlearn replay`` CLI."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from simulators.experiment import add_bias, prepare_stream
from simulators.replay import Drift, apply_drift, replay, stream_order
from simulators.synthetic import synthetic_stream
from streamlearn.cli import main
from streamlearn.features import SparseBatch
from streamlearn.learners import Banditron, FixedGamma, Perceptron


@pytest.fixture(scope="module")
def stream() -> tuple[np.ndarray, np.ndarray]:
    return synthetic_stream(6000, noise=0.0, seed=4)


def test_replay_counts_and_learns(stream: tuple[np.ndarray, np.ndarray]) -> None:
    X, y = stream
    result = replay(Banditron(9, 400, FixedGamma(0.05)), X, y, batch_size=16)
    assert result.rounds == 6000 and result.feedback_applied == 6000
    assert result.window_error_rate < result.error_rate < 0.6  # it learns
    assert result.regret_vs_oracle == pytest.approx(result.error_rate * 6000)
    assert result.gamma_final == pytest.approx(0.05)
    assert result.curve[-1] == (6000, pytest.approx(result.error_rate))


def test_drops_expire_to_default_reward_and_delays_defer_feedback(
        stream: tuple[np.ndarray, np.ndarray]) -> None:
    X, y = stream
    dropped = replay(Banditron(9, 400, FixedGamma(0.05)), X, y, drop=0.3, seed=1)
    assert 0.27 * 6000 < dropped.feedback_dropped < 0.33 * 6000
    delayed = replay(Banditron(9, 400, FixedGamma(0.05)), X, y, delay_mean=200, batch_size=8)
    # feedback still in flight at the end of the stream is not applied
    assert 5000 < delayed.feedback_applied < 6000
    prompt = replay(Banditron(9, 400, FixedGamma(0.05)), X, y, batch_size=8)
    assert delayed.error_rate > prompt.error_rate  # late feedback slows learning


def test_perceptron_comparator_reports_exploit_error(stream: tuple[np.ndarray, np.ndarray]) -> None:
    X, y = stream
    result = replay(Perceptron(9, 400), X, y)
    assert result.error_rate == result.exploit_error_rate < 0.05


def test_stream_order_passes_and_rounds() -> None:
    order = stream_order(10, passes=3, rounds=None, seed=1)
    assert len(order) == 30 and all(sorted(order[i:i + 10]) == list(range(10)) for i in (0, 10, 20))
    assert len(stream_order(10, passes=1, rounds=25, seed=None)) == 25


def test_drift_permutes_labels_after_the_given_round() -> None:
    y = np.arange(100) % 5
    drifted, keep = apply_drift(y, 5, Drift(at=50, kind="permute", seed=3))
    assert keep is None and (drifted[:50] == y[:50]).all()
    assert len(set(zip(y[50:].tolist(), drifted[50:].tolist(), strict=True))) == 5  # bijection
    _, keep = apply_drift(y, 5, Drift(at=50, kind="prior", seed=3))
    assert keep is not None and keep[:50].all() and 0 < keep[50:].sum() < 50


def test_add_bias_dense_and_sparse_agree() -> None:
    dense = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    sparse = SparseBatch.from_rows([[0], [1], []], [[1.0], [2.0], []], 2)
    np.testing.assert_array_equal(add_bias(sparse).to_dense(), add_bias(dense))


@pytest.mark.needs_data
def test_prepare_stream_standardises_dense_data_and_adds_bias() -> None:
    s = prepare_stream("letter", passes=2, seed=0)
    assert s.rounds == 40_000 and s.n_features == 17 and s.standardised
    assert np.allclose(np.asarray(s.X)[:, -1], 1.0)
    assert abs(float(np.asarray(s.X)[:, :-1].mean())) < 1e-6


def test_cli_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--dataset", "synnonsep", "--rounds", "3000", "--gamma", "0.05",
                 "--batch-size", "32", "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    for key in ("dataset", "learner", "exploration", "rounds", "error_rate", "exploit_error_rate",
                "regret_vs_oracle", "comparator_error_rate", "gamma_final", "events_per_second"):
        assert key in report
    assert report["rounds"] == 3000 and 0 < report["error_rate"] < 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--dataset", "nope"], "Expected a dataset in"),
    (["--dataset", "letter", "--learner", "foo"], "--learner must be one of"),
    (["--dataset", "letter", "--gamma", "0.7"], "--gamma expects a number in (0, 0.5], got '0.7'"),
    (["--dataset", "letter", "--data-dir", "/nonexistent"], "not found in /nonexistent"),
    (["--dataset", "letter", "--exploration", "boltzmann"], "--exploration must be one of"),
    (["--dataset", "letter", "--learner", "banditron", "--q", "3"], "--q does not apply"),
])
def test_bad_arguments_give_one_line_and_exit_2(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(main(["replay", *argv]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_plot_is_written(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    path = f"{tmp_path}/curve.png"
    assert main(["replay", "--dataset", "synsep", "--rounds", "2000", "--batch-size", "50",
                 "--plot", path]) == 0
    with open(path, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
