"""Replay engine and ``streamlearn replay`` CLI."""

from __future__ import annotations

import tracemalloc

import numpy as np
import orjson
import pytest

from streamlearn.cli import main
from streamlearn.datasets.stream import Drift, add_bias, apply_drift, prepare_stream, stream_order
from streamlearn.datasets.synthetic import SyntheticRows, synthetic_stream
from streamlearn.features import Batch, SparseBatch, take_rows
from streamlearn.learners import Banditron, FixedGamma, Perceptron
from streamlearn.replay.fixed import _FeedbackDraws, replay, replay_stream, run_with_comparator


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
    X, _ = s.materialise()
    assert np.allclose(np.asarray(X)[:, -1], 1.0)
    assert abs(float(np.asarray(X)[:, :-1].mean())) < 1e-6


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
    (["--dataset", "letter", "--gamma", "0.7"], "--gamma: expected a number in (0, 0.5], got '0.7'"),
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


# ---------------------------------------------------------------- streaming (blocks)

@pytest.mark.parametrize(("n", "chunk", "noise"), [(2500, 1000, 0.05), (2501, 1000, 0.5),
                                                   (700, 100_000, 0.0)])
def test_generated_rows_equal_the_generated_matrix_in_any_order(n: int, chunk: int,
                                                                noise: float) -> None:
    X, y = synthetic_stream(n, noise=noise, seed=5, chunk=chunk)
    rows = SyntheticRows(n, noise=noise, seed=5, chunk=chunk)
    assert rows.labels.tolist() == y.tolist()
    shuffled = np.random.default_rng(0).permutation(n)
    for part in (shuffled[:1], shuffled[:300], shuffled, np.arange(n), np.array([n - 1, 0, 0])):
        np.testing.assert_array_equal(rows.features(part), X[part])


def test_feedback_draws_in_blocks_equal_one_draw() -> None:
    n = 5000
    rng = np.random.default_rng([3, 7])
    delays = np.ceil(rng.exponential(4.0, size=n)).astype(np.int64)
    dropped = rng.random(n) < 0.2
    draws = _FeedbackDraws(n, 4.0, 0.2, seed=3)
    parts = [draws.take(m) for m in (1, 999, 3000, 1000)]
    np.testing.assert_array_equal(np.concatenate([d for d, _ in parts]), delays)
    np.testing.assert_array_equal(np.concatenate([k for _, k in parts]), dropped)


@pytest.mark.parametrize("sparse", [False, True])
def test_lockstep_block_replay_equals_separate_in_memory_replays(
        stream: tuple[np.ndarray, np.ndarray], sparse: bool) -> None:
    X, y = stream
    data: Batch = SparseBatch.from_rows([np.flatnonzero(r) for r in X],
                                        [r[r != 0] for r in X], 400) if sparse else X
    kwargs = {"batch_size": 8, "delay_mean": 30.0, "drop": 0.1, "seed": 2}
    alone = [replay(Banditron(9, 400, FixedGamma(0.05), seed=1), data, y, **kwargs),
             replay(Perceptron(9, 400), data, y, **kwargs)]
    blocks = ((take_rows(data, np.arange(lo, min(6000, lo + 24))), y[lo:lo + 24])
              for lo in range(0, 6000, 24))
    together = replay_stream([Banditron(9, 400, FixedGamma(0.05), seed=1), Perceptron(9, 400)],
                             blocks, 6000, **kwargs)  # type: ignore[arg-type]
    for a, b in zip(alone, together, strict=True):
        assert (a.error_rate, a.exploit_error_rate, a.window_error_rate, a.feedback_applied,
                a.feedback_dropped, a.curve) == (b.error_rate, b.exploit_error_rate,
                                                 b.window_error_rate, b.feedback_applied,
                                                 b.feedback_dropped, b.curve)


def test_synthetic_replay_stream_is_generated_not_held_and_is_the_old_stream() -> None:
    s = prepare_stream("synnonsep", rounds=3000, seed=4,
                       drift=Drift(at=1000, kind="prior", seed=4))
    assert s.features is None and s.generated is not None
    X, y = synthetic_stream(3000, noise=0.05, seed=4)  # what prepare_stream used to hold
    order = stream_order(3000, 1, 3000, 4)
    labels, keep = apply_drift(y[order], 9, Drift(at=1000, kind="prior", seed=4))
    assert keep is not None
    X_stream, y_stream = s.materialise()
    np.testing.assert_array_equal(X_stream, add_bias(X[order][keep]))
    np.testing.assert_array_equal(y_stream, labels[keep])
    blocks = list(s.blocks(batch_size=7))
    assert all(len(b) % 7 == 0 for _, b in blocks[:-1])
    np.testing.assert_array_equal(np.concatenate([np.asarray(b) for b, _ in blocks]), X_stream)


def _peak_bytes(rounds: int) -> int:
    tracemalloc.start()
    try:
        stream = prepare_stream("synnonsep", rounds=rounds, seed=0)
        run_with_comparator(Banditron(9, 401, FixedGamma(0.05)), stream, batch_size=512)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_replay_memory_does_not_grow_with_the_features_of_every_round() -> None:
    small, large = _peak_bytes(10_000), _peak_bytes(40_000)
    # holding the stream would add 30,000 × 401 float32 = 48 MB (and more in copies); the
    # index arrays of the stream (order, labels: ~40 bytes a round) add ~1.2 MB
    assert large - small < 8_000_000, (small, large)
