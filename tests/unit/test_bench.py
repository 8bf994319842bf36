"""``streamlearn bench``: the per-event peer, the VW adapter, the harness and the CLI."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from simulators.bench import SYSTEMS, add_bias, parse_systems, standardise
from simulators.peers import VW_EXPLORERS, import_vw, python_loop_banditron, run_vw, vw_lines
from streamlearn.cli import main
from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.errors import ConfigError
from streamlearn.features import Batch, SparseBatch
from streamlearn.learners import Banditron, FixedGamma, make_learner


def _banditron_b1(X: Batch, y: np.ndarray, K: int, gamma: float, seed: int) -> tuple[np.ndarray, Banditron]:
    """streamlearn's Banditron driven one event at a time, keys = stream positions (as replay does)."""
    learner = Banditron(K, X.shape[1], FixedGamma(gamma), seed=seed)
    actions = np.zeros(len(y), dtype=np.int64)
    for t in range(len(y)):
        xt = X.take(np.array([t])) if isinstance(X, SparseBatch) else X[t:t + 1]
        a, p = learner.decide(xt, keys=[t])
        learner.update(xt, a, (a == y[t]).astype(float), p)
        actions[t] = a[0]
    return actions, learner


def _gaussian_stream(n: int, d: int, K: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.argmax(X @ rng.normal(size=(K, d)).T + 0.5 * rng.normal(size=(n, K)), axis=1)
    return add_bias(X), y  # type: ignore[return-value]


@pytest.mark.parametrize(("gamma", "seed"), [(0.05, 0), (0.3, 11)])
def test_python_loop_makes_the_same_decisions_and_weights_as_banditron_b1(gamma: float, seed: int) -> None:
    X, y = _gaussian_stream(1500, 12, 5, seed=3)
    ref_actions, ref = _banditron_b1(X, y, 5, gamma, seed)
    run = python_loop_banditron(X, y, 5, gamma, seed)
    np.testing.assert_array_equal(run.actions, ref_actions)
    np.testing.assert_array_equal(run.weights, ref.weights_)
    assert 0 < np.mean(run.actions != y) < 0.9  # it learned something and explored


def test_python_loop_matches_on_binary_synthetic_and_a_different_seed_changes_it() -> None:
    Xf, y = synthetic_stream(2000, noise=0.05, seed=4)
    X = add_bias(np.asarray(Xf, dtype=np.float64))
    ref_actions, ref = _banditron_b1(X, y, 9, 0.05, 2)
    run = python_loop_banditron(X, y, 9, 0.05, 2)
    np.testing.assert_array_equal(run.actions, ref_actions)
    np.testing.assert_array_equal(run.weights, ref.weights_)
    other = python_loop_banditron(X, y, 9, 0.05, 3)
    assert not np.array_equal(other.actions, ref_actions)


def test_python_loop_sparse_path_matches_banditron_b1() -> None:
    X, y = _gaussian_stream(800, 10, 4, seed=5)
    X[np.abs(X) < 0.7] = 0.0  # make it genuinely sparse (the bias column stays 1)
    sparse = SparseBatch.from_rows([np.flatnonzero(r).tolist() for r in X],
                                   [r[r != 0].tolist() for r in X], n_features=X.shape[1])
    ref_actions, ref = _banditron_b1(sparse, y, 4, 0.1, 1)
    run = python_loop_banditron(sparse, y, 4, 0.1, 1)
    np.testing.assert_array_equal(run.actions, ref_actions)
    assert run.weights is not None
    np.testing.assert_allclose(run.weights, ref.weights_, rtol=1e-12, atol=1e-12)


def test_add_bias_dense_and_sparse_agree() -> None:
    X = np.array([[0.0, 2.0, 0.0], [0.0, 0.0, 0.0], [1.5, 0.0, -1.0]])
    sparse = SparseBatch.from_rows([[1], [], [0, 2]], [[2.0], [], [1.5, -1.0]], n_features=3)
    dense = add_bias(X)
    assert isinstance(dense, np.ndarray)
    np.testing.assert_array_equal(dense[:, -1], 1.0)
    biased = add_bias(sparse)
    assert isinstance(biased, SparseBatch)
    np.testing.assert_array_equal(biased.to_dense(), dense)


def test_standardise_centres_and_scales_but_keeps_constant_columns_finite() -> None:
    X = np.column_stack([np.arange(10.0), np.full(10, 3.0)])
    Z = standardise(X)
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Z[:, 0].std(), 1.0)
    np.testing.assert_array_equal(Z[:, 1], 0.0)


def test_parse_systems_groups_order_and_errors() -> None:
    assert parse_systems("vw-bag,streamlearn-banditron") == ["vw-bag", "streamlearn-banditron"]
    assert parse_systems("vw") == list(VW_EXPLORERS)
    assert parse_systems("all") == list(SYSTEMS)
    with pytest.raises(ConfigError, match=r"--systems .* Got 'nope' instead"):
        parse_systems("streamlearn-banditron,nope")


def test_vw_lines_hold_only_nonzero_features_and_one_based_labels() -> None:
    lines = vw_lines(np.array([[0.0, 0.25, 0.0, -3.0]]), np.array([2]))
    assert lines == ["3 | f1:0.25 f3:-3"]


@pytest.mark.skipif(import_vw() is None, reason="vowpalwabbit not installed (the 'bench' extra)")
@pytest.mark.parametrize("explorer", sorted(VW_EXPLORERS))
def test_vw_adapter_counts_the_same_error_as_vw_reports(explorer: str) -> None:
    pyvw = import_vw()
    assert pyvw is not None
    rng = np.random.default_rng(8)
    y = rng.integers(0, 3, size=500)
    X = 2.0 * np.eye(3)[y] + 0.3 * rng.normal(size=(500, 3))  # an easy, learnable stream
    lines = vw_lines(X, y)
    order = np.concatenate([np.arange(500), np.arange(500)])  # two passes, chunks cross the pass
    run = run_vw(pyvw, explorer, 3, lines, order, seed=0, chunk=128)
    assert run.actions.shape == (1000,)
    assert set(np.unique(run.actions)) <= {0, 1, 2}
    np.testing.assert_array_equal(run.extra["labels"], y[order])
    error = float(np.mean(run.actions != y[order]))
    assert error == pytest.approx(run.extra["vw_reported_error"], abs=1e-12)
    assert error < 0.4  # uniform guessing would be wrong 2/3 of the time
    assert run.seconds > 0


def test_bench_json_has_the_required_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--dataset", "synnonsep", "--rounds", "2000", "--json"])
    assert code == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["dataset"] == "synnonsep"
    assert out["rounds"] == 2000
    rows = {r["system"]: r for r in out["results"]}
    assert list(rows) == list(SYSTEMS)
    for r in out["results"]:
        assert {"system", "batch_size", "events_per_second", "error_rate", "seconds"} <= set(r)
        if r["skipped"]:
            continue
        assert r["events_per_second"] > 0 and r["seconds"] > 0
        assert 0.0 <= r["error_rate"] <= 1.0
    assert rows["streamlearn-banditron"]["batch_size"] == 64
    assert rows["streamlearn-banditron-b1"]["batch_size"] == 1
    reference = out["reference"]
    assert reference["system"] in rows and reference["why"]
    assert rows[reference["system"]]["speed_vs_reference"] == pytest.approx(1.0)
    assert rows[reference["system"]]["error_vs_reference"] == 0.0
    # same stream, same keyed randomness: the per-event loop makes streamlearn's b1 decisions
    assert rows["python-loop-banditron"]["error_rate"] == rows["streamlearn-banditron-b1"]["error_rate"]
    if import_vw() is not None:
        for name in VW_EXPLORERS:
            assert rows[name]["details"]["vw_error_matches"] is True


def test_bench_table_lists_the_chosen_systems(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "--dataset", "synsep", "--rounds", "500", "--systems",
                 "streamlearn-banditron,python-loop-banditron", "--batch-size", "32"])
    assert code == 0
    captured = capsys.readouterr()
    table = [line for line in captured.out.splitlines() if line.startswith("| ")]
    # no VW row: relative to the row with the lowest error, and the line above says so
    best = min(("streamlearn-banditron", "python-loop-banditron"),
               key=lambda name: float(next(line for line in table if f"| {name} |" in line)
                                      .split(" | ")[3]))
    assert table[0] == (f"| system | batch | events/s | error rate | speed ÷ {best} | "
                        f"error − {best} |")
    assert f"Relative to {best}, the row with the lowest error (no VW row ran)" in captured.out
    assert [line.split(" | ")[0] for line in table[1:]] == [
        "| streamlearn-banditron", "| python-loop-banditron"]
    assert table[1].split(" | ")[1] == "32"
    assert "bench: synsep" in captured.err  # progress on stderr, not stdout


@pytest.mark.parametrize("command", ["bench", "replay"])
@pytest.mark.parametrize(("argv", "message"), [
    (["--batch-size", "0"], "argument --batch-size: expected an integer in [1, 1,000,000], got '0'"),
    (["--passes", "two"], "argument --passes: expected an integer in [1, 1,000,000], got 'two'"),
    (["--rounds", "-5"], "argument --rounds: expected an integer in [1, 1,000,000,000], got '-5'"),
    (["--gamma", "0.7"], "argument --gamma: expected a number in (0, 0.5], got '0.7'"),
    (["--seed", "-1"], "argument --seed: expected an integer >= 0, got '-1'"),
    (["--header", "maybe"], "argument --header: invalid choice: 'maybe'"),
    (["--gamma", "0.1", "--exploration", "adaptive"], "not allowed with argument --gamma"),
])
def test_bad_stream_options_exit_2_with_one_line_in_bench_and_replay(
    command: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main([command, "--dataset", "synsep", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"streamlearn {command}: error: ")
    assert message in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("command", ["bench", "replay"])
@pytest.mark.parametrize(("argv", "message"), [
    (["--delimiter", ";"], "--delimiter applies to csv:PATH datasets only. Got --dataset 'synsep'."),
    (["--label-column", "y", "--header", "no"],
     "--label-column, --header apply to csv:PATH datasets only."),
])
def test_csv_options_on_another_dataset_exit_2(command: str, argv: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--dataset", "synsep", "--rounds", "100", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_systems_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--dataset", "synsep", "--systems", "vw-softmax"]) == 2
    err = capsys.readouterr().err
    assert "Got 'vw-softmax' instead." in err and err.count("\n") == 1


def _time_ordered_csv(tmp_path: Any) -> str:
    """A ;-separated file with a header, whose label depends on time (so order matters)."""
    rng = np.random.default_rng(0)
    rows = ["t;a;b;label"]
    for t in range(600):
        a, b = rng.normal(size=2)
        label = ("up" if a > 0 else "down") if t < 300 else ("down" if a > 0 else "up")
        rows.append(f"{t};{a:.3f};{b:.3f};{label}")
    path = tmp_path / "events.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_bench_runs_a_time_ordered_user_file_like_replay(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = _time_ordered_csv(tmp_path)
    options = ["--dataset", f"csv:{path}", "--label-column", "label", "--delimiter", "semicolon",
               "--header", "yes", "--no-shuffle", "--standardise", "yes", "--seed", "3"]
    assert main(["bench", *options, "--exploration", "adaptive", "--batch-size", "1",
                 "--systems", "streamlearn-banditron,python-loop-banditron", "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["rounds"] == 600 and report["standardised"] and report["n_features"] == 3
    assert report["exploration"]["name"] == "adaptive" and report["gamma"] is None
    banditron, loop = report["results"]
    assert loop["skipped"].startswith("explores with a fixed γ only")
    assert main(["replay", *options, "--learner", "banditron", "--exploration", "adaptive",
                 "--json"]) == 0
    replayed = orjson.loads(capsys.readouterr().out)
    assert replayed["rounds"] == 600 and replayed["standardised"]
    # the same stream and learner: bench's streamlearn-banditron is replay's learner
    assert banditron["error_rate"] == replayed["error_rate"]


def test_replay_runs_a_learner_at_the_defaults_bench_measures(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without --gamma/--exploration, replay's learner explores as its constructor chooses,
    so its error is bench's row (before, replay forced a fixed γ = 0.05 on every learner)."""
    options = ["--dataset", "synsep", "--rounds", "3000", "--seed", "2", "--batch-size", "16"]
    for learner in ("linucb", "bag", "banditron"):
        assert main(["bench", *options, "--exploration", "default",
                     "--systems", f"streamlearn-{learner}", "--json"]) == 0
        benched = orjson.loads(capsys.readouterr().out)["results"][0]
        assert main(["replay", *options, "--learner", learner, "--json"]) == 0
        replayed = orjson.loads(capsys.readouterr().out)
        assert replayed["exploration"] == make_learner(learner, 9, 401).exploration.spec()
        assert replayed["exploration"]["name"] != "fixed" or learner == "bag"
        assert benched["error_rate"] == replayed["error_rate"], learner


def test_unknown_dataset_and_exclusive_stream_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--dataset", "nosuch", "--rounds", "10"]) == 2
    assert "Got 'nosuch' instead" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--dataset", "synsep", "--passes", "1", "--rounds", "10"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_without_vowpalwabbit_the_vw_rows_say_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("simulators.bench.import_vw", lambda: None)
    assert main(["bench", "--dataset", "synsep", "--rounds", "300", "--systems",
                 "streamlearn-banditron,vw-bag"]) == 0
    table = capsys.readouterr().out
    assert "- skipped, vowpalwabbit not installed (pip install 'streamlearn[bench]'): vw-bag" in table
    assert "| vw-bag |" not in table
    assert main(["bench", "--dataset", "synsep", "--rounds", "300", "--systems", "vw-cover",
                 "--json"]) == 0
    (row,) = orjson.loads(capsys.readouterr().out)["results"]
    assert row["skipped"].startswith("vowpalwabbit not installed")
    assert row["events_per_second"] is None and row["error_rate"] is None
    assert row["speed_vs_reference"] is None and row["error_vs_reference"] is None


def test_without_vowpalwabbit_one_line_names_every_vw_system(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Eight 'skipped: vowpalwabbit not installed' rows were one reason said eight times."""
    monkeypatch.setattr("simulators.bench.import_vw", lambda: None)
    assert main(["bench", "--dataset", "synsep", "--rounds", "300", "--systems",
                 "streamlearn-banditron,vw"]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "vowpalwabbit not installed" in line]
    assert said == ["- skipped, vowpalwabbit not installed (pip install 'streamlearn[bench]'): "
                    + ", ".join(VW_EXPLORERS)]


def test_rows_relate_to_the_vw_row_with_the_lowest_error() -> None:
    """The ratio was relative to streamlearn-banditron (error 0.84 on letter): a weak row."""
    from simulators.bench import BenchReport, BenchResult

    results = [BenchResult("streamlearn-banditron", 64, 600_000.0, 0.84, 1.0),
               BenchResult("streamlearn-linucb", 64, 200_000.0, 0.30, 1.0),
               BenchResult("vw-epsilon", 1, 150_000.0, 0.58, 1.0),
               BenchResult("vw-bag", 1, 50_000.0, 0.35, 1.0),
               BenchResult("vw-cover", 1, None, None, None, skipped="vowpalwabbit not installed")]
    report = BenchReport("letter", 20_000, 1, 16, 26, True, 0.05, {"name": "fixed"}, 0, results)
    assert report.reference() == (results[3], "the VW row with the lowest error")
    assert report.speed_vs_reference(results[1]) == pytest.approx(4.0)
    assert report.error_vs_reference(results[1]) == pytest.approx(-0.05)
    table = report.to_markdown()
    assert "| streamlearn-banditron | 64 | 600,000 | 0.8400 | 12.00 | +0.4900 |" in table
    assert "| vw-bag | 1 | 50,000 | 0.3500 | 1.00 | +0.0000 |" in table


def test_bench_help_lists_the_systems() -> None:
    from streamlearn.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    # argparse wraps the help at hyphens too: compare without any white space
    text = "".join(sub.choices["bench"].format_help().split())  # type: ignore[attr-defined]
    for name in SYSTEMS:
        assert name in text, name


def test_small_batch_bench_times_the_three_layers_on_the_same_weights(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The replay, the learner alone and the bare loop end with the same weights at batch 1
    (the script exits 1 otherwise), and each batch size gets one line with its ratios."""
    from simulators.bench_small_batches import main as small_batches

    assert small_batches(["--dataset", "synnonsep", "--rounds", "600", "--batch-sizes", "1,4",
                          "--repeats", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("synnonsep: 600 rounds")
    assert [line.split(":")[0] for line in lines[1:]] == ["batch 1", "batch 4"]
    assert all("replay ÷ loop" in line for line in lines[1:])


@pytest.mark.parametrize("full_max_features", [128, 8])  # the full A⁻¹, then the diagonal
def test_linucb_parts_posterior_alone_is_the_learners_own_arithmetic(full_max_features: int) -> None:
    """The 'posterior alone' of bench_linucb_parts plays LinUCB's exploit action and updates as
    the learner does: exploring with a negligible γ (never taken on these 600 events), both
    end in the same posterior, so its timing is the cost of LinUCB's maths and nothing else."""
    from simulators.bench_linucb_parts import posterior_seconds
    from simulators.bench_small_batches import api_seconds
    from streamlearn.datasets.synthetic import synthetic_stream
    from streamlearn.learners.exploration import FixedGamma
    from streamlearn.learners.linear_posterior import LinUCB

    X, y = synthetic_stream(600, noise=0.05, seed=4)
    X = X[:, :20]
    alone, learner = (LinUCB(9, 20, FixedGamma(1e-9), full_max_features=full_max_features, seed=1)
                      for _ in range(2))
    assert posterior_seconds(alone, X, y, 16) > 0 and api_seconds(learner, X, y, 16) > 0
    assert alone.posterior_.full == (full_max_features == 128)
    for name, value in learner.posterior_.arrays().items():  # the same up to rounding: the
        # learner's guard works on copies, and BLAS may round a copy's sums differently
        assert np.allclose(alone.posterior_.arrays()[name], value, rtol=1e-12, atol=1e-14), name


def test_linucb_parts_refuses_no_repeats(capsys: pytest.CaptureFixture[str]) -> None:
    """Every figure of bench_linucb_parts is a median over --repeats (the VW reference's too):
    zero repeats are refused with the reason instead of printing medians of nothing."""
    from simulators.bench_linucb_parts import main

    with pytest.raises(SystemExit) as raised:
        main(["--repeats", "0", "--datasets", "nursery"])
    assert raised.value.code == 2
    assert "--repeats must be an int >= 1. Got 0." in capsys.readouterr().err
