"""Inputs an outside client found crashing the commands with a traceback: each is now one
clear line and a non-zero exit, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamlearn.cli import main


@pytest.mark.parametrize(("argv", "expected"), [
    (["--rounds", "99999999999999999999999"], "--rounds: expected an integer in [1, 1,000,000,000]"),
    (["--rounds", "100", "--batch-size", str(10**20)], "--batch-size: expected an integer in"),
    (["--rounds", "100", "--delay", "1e308", "--rate", "1e308"], "--delay: expected a number in"),
    (["--rounds", "100", "--window", "1e308"], "--window: expected a number in"),
])
def test_replay_bounds(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", "--dataset", "synnonsep", *argv])
    assert exit_info.value.code == 2 and expected in capsys.readouterr().err


def test_a_plot_that_could_not_be_written_is_refused_before_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "missing" / "x.png"
    assert main(["replay", "--dataset", "synnonsep", "--rounds", "100",
                 "--plot", str(target)]) == 2
    err = capsys.readouterr().err
    assert "--plot must be a file that can be written" in err and "seconds" not in err


def test_a_libsvm_index_beyond_the_dense_limit_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "big.svm"
    path.write_text("0 99999999999:1\n1 3:1\n")  # used to ask numpy for 1.46 TiB
    assert main(["replay", "--dataset", f"libsvm:{path}"]) == 2
    err = capsys.readouterr().err
    assert "line 1: expected feature indices below 4,194,304" in err


def test_a_path_the_file_system_refuses_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "x" * 300]) == 1
    err = capsys.readouterr().err
    assert "cannot use 'xxx" in err and "File name too long" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("option", "value"), [("--clip", "nan"), ("--max-rows", "0"),
                                               ("--level", "1.5"), ("--holdout-fraction", "0")])
def test_evaluate_refuses_values_it_cannot_use(option: str, value: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", str(tmp_path), option, value])
    assert exit_info.value.code == 2 and f"argument {option}: expected" in capsys.readouterr().err
