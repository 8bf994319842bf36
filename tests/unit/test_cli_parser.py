"""The top-level parser: no abbreviations, unknown options named, one line and exit 2."""

from __future__ import annotations

import pytest

from streamlearn.cli import main


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("argv", "option"), [
    (["serve", "--max-event", "3"], "--max-event"),
    (["replay", "--dataset", "synsep", "--round", "10"], "--round"),
    (["bench", "--dataset", "synsep", "--batch", "4"], "--batch"),
    (["simulate", "--rate", "1", "--event", "5"], "--event"),
])
def test_abbreviations_are_not_accepted(argv: list[str], option: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(argv, capsys)
    assert f"unrecognized option {option} (did you mean" in err


def test_a_typo_is_named_before_the_missing_required_option(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["replay", "--datset", "letter"], capsys)
    assert err.startswith("streamlearn replay: error: unrecognized option --datset "
                          "(did you mean --dataset?)")
    assert "required" not in err


def test_equals_form_and_several_unknown_options(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["replay", "--dataset=synsep", "--passs=2", "--sed", "1"], capsys)
    assert "unrecognized option --passs (did you mean --passes?); also --sed" in err


def test_missing_required_option_alone_is_still_reported(
        capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["replay", "--rounds", "10"], capsys)
    assert "the following arguments are required: --dataset" in err


def test_negative_numbers_are_values_not_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--metrics-port", "-5"]) == 2  # a config error, not a parse error
    assert "metrics.port must be an integer in [-1, 65535]" in capsys.readouterr().err
