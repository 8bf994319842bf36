"""Command-line inputs an outside tester found to end in a traceback or to fail only after the
work: each is now one clear line and exit 2 before anything runs (or a quiet exit on a closed
pipe)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from loop_helpers import Clock, drain, settings_of

from streamlearn.cli import main
from streamlearn.learners import make_learner
from streamlearn.service.daemon import Daemon
from streamlearn.transport.memory import InMemoryTransport

HUGE = "9" * 400


@pytest.mark.parametrize(("section", "key"), [("learner", "n_actions"), ("join", "window_seconds")])
def test_a_400_digit_toml_number_is_a_clear_error(tmp_path: Path, section: str, key: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f"[{section}]\n{key} = {HUGE}\n")
    assert main(["serve", "--config", str(config), "--max-events", "10", "--metrics-port", "-1"]) == 2
    err = capsys.readouterr().err
    assert f"{section}.{key} must be" in err and "Traceback" not in err


def small_csv(tmp_path: Path) -> Path:
    path = tmp_path / "ok.csv"
    path.write_text("f0,f1,label\n" + "".join(f"{i % 3},{i % 5},{i % 2}\n" for i in range(40)))
    return path


def test_a_csv_path_that_is_a_symlink_loop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.csv").symlink_to(tmp_path / "b.csv")
    (tmp_path / "b.csv").symlink_to(tmp_path / "a.csv")
    assert main(["replay", "--dataset", f"csv:{tmp_path / 'a.csv'}"]) == 2
    assert "a symbolic link that never ends in one" in capsys.readouterr().err


def test_a_label_column_by_name_on_a_file_the_delimiter_does_not_split(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = small_csv(tmp_path)
    assert main(["replay", "--dataset", f"csv:{csv}", "--delimiter", "tab",
                 "--label-column", "label"]) == 2
    err = capsys.readouterr().err  # the delimiter is what is wrong, not the header
    assert "every line is one field when split at '\\t', but the lines hold ','" in err
    assert "expected --delimiter ','" in err


def test_outputs_the_run_could_not_write_are_refused_before_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    csv = small_csv(tmp_path)
    assert main(["replay", "--dataset", f"csv:{csv}", "--plot", str(tmp_path / "x.txt")]) == 2
    assert "--plot must name a file of an image format" in capsys.readouterr().err
    assert main(["replay", "--dataset", f"csv:{csv}", "--save", "/proc/streamlearn-x"]) == 2
    assert "--save must be a file that can be written" in capsys.readouterr().err
    assert not (tmp_path / "x.txt").exists()


def test_inspect_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    transport = InMemoryTransport(partitions=1)
    transport.broker.append("instances", b"e", orjson.dumps({"id": "e", "x": [1.0, 2.0]}), 0, 1000)
    settings = settings_of(learner_n_actions=3, learner_n_features=2, checkpoint_dir=str(tmp_path),
                              limits_poll_timeout_seconds=0.0)
    daemon = Daemon(settings, transport, make_learner("linucb", 3, 2, seed=0), wall_clock=Clock())
    drain(daemon)
    daemon.checkpoint(final=True)
    proc = subprocess.Popen([sys.executable, "-m", "streamlearn", "inspect", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line, as `| head -0` would be
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err


def test_a_reversed_segment_range_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    from streamlearn.commands.evaluate import parse_segments
    from streamlearn.errors import ConfigError

    with pytest.raises(ConfigError, match=r"Got '5:2', a reversed range: did you mean 2:5\?"):
        parse_segments("5:2")
    assert parse_segments("2:2") == (2, 2)


# ------------------------------------------------------- the open list reported by an outsider

@pytest.mark.parametrize("value", ["1_0", "\u0661\u0660", "\u0967\u0966", "1_000"])
def test_integer_settings_take_only_the_digits_0_to_9(
        value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """int() takes '1_0' and other scripts' digits ('١٠' is 10); a setting must not."""
    assert main(["serve", "--print-config", "--checkpoint-every-events", value]) == 2
    err = capsys.readouterr().err
    assert "checkpoint.every_events must be an integer >= 1" in err
    assert "only the digits 0-9" in err and "(from --checkpoint-every-events)" in err
    monkeypatch.setenv("STREAMLEARN_LEARNER_SEED", value)
    assert main(["serve", "--print-config"]) == 2
    assert "(from STREAMLEARN_LEARNER_SEED)" in capsys.readouterr().err
    monkeypatch.delenv("STREAMLEARN_LEARNER_SEED")
    for argv in (["serve", "--max-events", value], ["replay", "--dataset", "synsep",
                                                      "--rounds", value]):
        with pytest.raises(SystemExit):
            main(argv)
        assert "got " + repr(value) in capsys.readouterr().err


def test_numbers_in_flags_take_only_the_digits_0_to_9(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--print-config", "--join-window-seconds", "1_0.5"]) == 2
    assert "only the digits 0-9" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["replay", "--dataset", "synsep", "--gamma", "0.\u0661"])
    assert "expected a number in (0, 0.5]" in capsys.readouterr().err


def test_a_bad_config_file_value_is_refused_even_when_a_flag_overrides_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[join]\nwindow_seconds = -5\n")
    assert main(["serve", "--print-config", "--config", str(config),
                 "--join-window-seconds", "30"]) == 2
    err = capsys.readouterr().err
    assert f"join.window_seconds must be a number > 0. Got -5 (from {config})" in err


def test_unknown_learner_variables_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    from streamlearn.config import load_config

    with caplog.at_level("WARNING", logger="streamlearn.config"):
        load_config(environ={"STREAMLEARN_LEARNER_GAMMA": "0.1",
                             "STREAMLEARN_LEARNER_WHATEVER": "1",
                             "STREAMLEARN_DATA_DIR": "/data"})  # the datasets' variable
    said = sorted(r.getMessage() for r in caplog.records)
    assert said[0] == ("ignoring the environment variable STREAMLEARN_LEARNER_GAMMA: [learner] "
                       "has no setting 'gamma' (did you mean STREAMLEARN_EXPLORATION_GAMMA?)")
    assert said[1].startswith("ignoring the environment variable STREAMLEARN_LEARNER_WHATEVER: "
                              "[learner] has no setting 'whatever' (its settings: "
                              "STREAMLEARN_LEARNER_NAME, ")
    assert len(said) == 2


def test_huge_csv_values_are_standardised_without_a_numpy_warning(tmp_path: Path) -> None:
    import warnings

    import numpy as np

    from streamlearn.datasets.stream import standardise

    X = np.array([[1e308, 1.0], [-1e308, 2.0], [1.5e308, 3.0], [1e308, 5.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Z = standardise(X)
    assert np.isfinite(Z).all()
    small = X / 1e300  # the same data in a range numpy handles: the same z-scores
    assert np.allclose(Z[:, 0], standardise(small)[:, 0])
    assert np.array_equal(Z[:, 1], standardise(X[:, 1:])[:, 0])  # ordinary columns unchanged
    path = tmp_path / "big.csv"
    path.write_text("a,b,y\n1e308,1,0\n-1e308,2,1\n1.5e308,3,0\n1e308,4,1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["replay", "--dataset", f"csv:{path}", "--json"]) == 0


def test_passes_beyond_the_memory_are_refused_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """--passes 1000000 on letter allocated 18 GB before it failed."""
    import time

    from streamlearn.datasets import stream

    monkeypatch.setattr(stream, "available_memory", lambda: 1 << 30)
    csv = small_csv(tmp_path)  # 40 rows: 40,000,000 rounds, 1.3 GB of index arrays
    started = time.monotonic()
    assert main(["replay", "--dataset", f"csv:{csv}", "--passes", "1000000"]) == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert "--passes 1000000 over 40 rows is 40,000,000 rounds, which need about 1.3 GB" in err
    assert "this machine has 1.1 GB available" in err and "fewer --passes or --rounds" in err
    assert main(["bench", "--dataset", f"csv:{csv}", "--passes", "1000000",
                 "--systems", "streamlearn-banditron"]) == 2
    assert "fewer --passes or --rounds" in capsys.readouterr().err
    # bench also holds every row: 80,000 rounds fit as indices (2.6 MB) but not with rows
    monkeypatch.setattr(stream, "available_memory", lambda: 3_000_000)
    assert main(["bench", "--dataset", f"csv:{csv}", "--passes", "2000",
                 "--systems", "streamlearn-banditron"]) == 2
    assert "the stream bench holds (3 features a round) is 80,000 rounds" in (
        capsys.readouterr().err)


def test_candidate_replay_and_bench_refuse_options_they_would_not_honour(
        capsys: pytest.CaptureFixture[str]) -> None:
    """replay --slots 100000 printed 100,000 lines of nan; bench --systems nosuch on a
    candidate-set stream ran all twelve systems."""
    assert main(["replay", "--dataset", "synthetic-candidates", "--rounds", "100",
                 "--slots", "100000"]) == 2
    assert ("--slots must be at most the largest request's candidates (20 on this stream). "
            "Got 100000.") in capsys.readouterr().err
    assert main(["bench", "--dataset", "synthetic-candidates", "--rounds", "100",
                 "--systems", "nosuch", "--gamma", "0.1"]) == 2
    assert "so it takes no --systems, --gamma. Got --systems, --gamma" in capsys.readouterr().err
