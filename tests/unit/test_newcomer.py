"""What a new user trips over: the data directory, --fetch, suggestions for a mistaken name.

Each test here is one way a first run went wrong: a flag a command printed in its advice but
did not accept, a directory it ignored, a name it did not suggest.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

from streamlearn.cli import main

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
needs_data = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"real-data test: the shared data folder {SHARED} is absent")


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("command", [
    ["replay", "--dataset", "ohsumed-candidates", "--passes", "1"],
    ["bench", "--dataset", "ohsumed-candidates"],
])
def test_data_dir_is_used_for_the_candidate_streams(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--data-dir was ignored for ohsumed-candidates (only $STREAMLEARN_DATA_DIR worked), and
    the message said neither how to fix it nor where LETOR comes from."""
    monkeypatch.delenv("STREAMLEARN_DATA_DIR", raising=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*command, "--data-dir", str(empty)]) == 2
    err = _error(capsys)
    assert f"not found in {empty}:" in err and "letor3-ohsumed" in err
    assert "--data-dir DIR" in err and "STREAMLEARN_DATA_DIR" in err
    assert "OHSUMED.rar from https://www.microsoft.com/" in err
    assert main([*command, "--data-dir", str(empty), "--fetch"]) == 2
    assert "--fetch cannot download LETOR 3.0 OHSUMED" in _error(capsys)


@needs_data
def test_replay_reads_ohsumed_from_the_data_dir_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMLEARN_DATA_DIR", str(tmp_path / "not-here"))
    (tmp_path / "data").mkdir()
    os.symlink(SHARED / "letor3-ohsumed", tmp_path / "data" / "letor3-ohsumed")
    assert main(["replay", "--dataset", "ohsumed-candidates", "--rounds", "200", "--data-dir",
                 str(tmp_path / "data")]) == 0
    assert "200 requests" in capsys.readouterr().out


def test_serve_accepts_the_flags_its_missing_data_message_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """serve said 'pass --data-dir DIR ... or add --fetch' and then refused both flags."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["serve", "--embedded-dataset", "letter", "--data-dir", str(empty),
                 "--metrics-port", "-1", "--progress-seconds", "0", "--max-events", "10"]) == 2
    err = _error(capsys)
    assert f"Dataset 'letter' not found in {empty}" in err
    assert "pass --data-dir DIR" in err and "add --fetch" in err
    # both flags it names are serve's: --data-dir (alias of --embedded-data-dir) and --fetch
    assert main(["serve", "--data-dir", str(empty), "--fetch", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert f'data_dir = "{empty}"' in printed and "fetch = true" in printed
    assert main(["serve", "--embedded-data-dir", str(empty), "--print-config"]) == 0


def test_serve_fetches_missing_data_with_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """--fetch downloads the embedded dataset's files (here from a file:// address)."""
    from streamlearn.datasets import uci
    from streamlearn.datasets.base import DatasetFiles, RemoteFile

    letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    rows = "".join(f"{letters[i % 26]}," + ",".join(str((i * k) % 16) for k in range(1, 17))
                   + "\n" for i in range(20_000))
    source = tmp_path / "letter-recognition.data"
    source.write_text(rows)
    payload = source.read_bytes()
    remote = RemoteFile(uci.LETTER.files[0].path, source.as_uri(),
                        hashlib.sha256(payload).hexdigest(), len(payload))
    monkeypatch.setattr(uci, "LETTER", DatasetFiles("letter", (remote,)))
    data = tmp_path / "data"
    assert main(["serve", "--embedded-dataset", "letter", "--data-dir", str(data), "--fetch",
                 "--metrics-port", "-1", "--progress-seconds", "0", "--max-events", "50"]) == 0
    assert (data / remote.path).is_file()
    assert "stopped after 50 instances" in capsys.readouterr().out


def test_simulate_and_the_rank_experiments_take_data_dir_and_fetch() -> None:
    from streamlearn.cli import build_parser

    parser = build_parser()
    for argv in (["simulate", "--rate", "0"], ["rank", "roger", "--dataset", "letter"],
                 ["rank", "routing"], ["rank", "letor"]):
        args = parser.parse_args([*argv, "--data-dir", "/x", "--fetch"])
        assert args.data_dir == "/x" and args.fetch is True, argv


# ------------------------------------------------------------- a mistaken name or path

@pytest.mark.parametrize(("given", "suggested"), [
    ("lettre", "(did you mean 'letter'?)"),
    ("ohsumed", "(did you mean 'ohsumed-candidates'?)"),
    ("my.csv", "a file is given as csv:PATH (did you mean 'csv:my.csv'?)"),
    ("data/train.svm", "a file is given as libsvm:PATH (did you mean 'libsvm:data/train.svm'?)"),
])
@pytest.mark.parametrize("command", ["replay", "bench"])
def test_a_mistaken_dataset_gets_a_suggestion_and_the_full_list(
        command: str, given: str, suggested: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--dataset", given]) == 2
    err = _error(capsys)
    assert suggested in err
    for name in ("letter", "ohsumed-candidates", "ohsumed-candidates-graded",
                 "synthetic-candidates", "synnonsep"):
        assert f"'{name}'" in err, name


def test_an_existing_file_given_as_a_dataset_suggests_csv(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "events"
    path.write_text("a,b\n1,0\n2,1\n")
    assert main(["replay", "--dataset", str(path)]) == 2
    assert f"(did you mean 'csv:{path}'?)" in _error(capsys)


def test_serve_suggests_the_embedded_dataset_meant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--embedded-dataset", "lettre", "--metrics-port", "-1",
                 "--progress-seconds", "0", "--max-events", "10"]) == 2
    assert "(did you mean 'letter'?)" in _error(capsys)


def test_the_dataset_help_lists_every_name() -> None:
    from streamlearn.commands.stream_options import dataset_help
    from streamlearn.datasets.catalogue import dataset_names

    assert all(name in dataset_help() for name in dataset_names())


def test_a_second_serve_on_a_port_in_use_says_how_to_get_a_free_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--metrics-port", str(port), "--progress-seconds", "0",
                     "--max-events", "10"]) == 2
    err = _error(capsys)
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in err
    assert "pass --metrics-port 0 for a free one" in err


# ------------------------------------------------------------- csv files as they come

MISSING = "f1,f2,f3,y\n1,2,3,a\n4,,6,b\n7,8,9,a\n1,2,?,b\n3,3,3,b\n5,NA,5,a\n"


def test_a_missing_csv_value_names_the_option_that_handles_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.csv"
    path.write_text(MISSING)
    assert main(["replay", "--dataset", f"csv:{path}"]) == 2
    err = _error(capsys)
    assert "column 'f2', line 3: expected a number. Got ''" in err
    assert "--missing skip drops its row, --missing impute fills the column's mean" in err


def test_missing_csv_values_skipped_or_imputed(tmp_path: Path) -> None:
    from streamlearn.datasets import load_dataset

    path = tmp_path / "m.csv"
    path.write_text(MISSING + "2,2,2,\n")  # the last row has no label
    skipped = load_dataset(f"csv:{path}", missing="skip")
    assert skipped.X.tolist() == [[1, 2, 3], [7, 8, 9], [3, 3, 3]]  # type: ignore[union-attr]
    imputed = load_dataset(f"csv:{path}", missing="impute")
    assert imputed.n_rows == 6  # the row without a label is dropped, the others filled
    X = imputed.X
    assert X[1].tolist() == [4, (2 + 8 + 2 + 3) / 4, 6]  # type: ignore[index]
    assert X[3].tolist() == [1, 2, (3 + 6 + 9 + 3 + 5) / 5]  # type: ignore[index]
    assert X[5].tolist() == [5, (2 + 8 + 2 + 3) / 4, 5]  # type: ignore[index]
    with pytest.raises(Exception, match="must be one of error, skip, impute"):
        load_dataset(f"csv:{path}", missing="drop")


def test_a_wrong_delimiter_is_named_not_the_header(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.csv"
    path.write_text("x1,x2,label\n0.5,1,3\n0.7,2,4\n")
    assert main(["replay", "--dataset", f"csv:{path}", "--delimiter", ";"]) == 2
    err = _error(capsys)
    assert "every line is one field when split at ';', but the lines hold ','" in err
    assert "expected --delimiter ','" in err and "--header" not in err


def test_replay_prints_the_exploration_in_words_and_numbers_rounded(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--dataset", "synsep", "--rounds", "3000", "--batch-size", "16"]) == 0
    lines = {line.split()[0]: line.split(None, 1)[1] for line in
             capsys.readouterr().out.splitlines()}
    assert lines["exploration"].startswith("adaptive (c 0.35, ")  # not {'name': 'adaptive', ...}
    assert "{" not in lines["exploration"] and "True" not in lines["exploration"]
    assert lines["rounds"] == "3,000" and lines["standardised"] == "no"
    assert re.fullmatch(r"0\.\d{4}", lines["error_rate"])
    assert re.fullmatch(r"[\d,]+", lines["events_per_second"])  # not 102939.1754


@needs_data
def test_rank_letor_says_what_validation_selected_in_words(
        capsys: pytest.CaptureFixture[str]) -> None:
    """It printed "selected {'rounds': 1, ..., 'vali_MAP': 0.4720462920637005}"."""
    assert main(["rank", "letor", "--algo", "rankboost", "--folds", "1", "--rounds", "5",
                 "--peers", "none", "--data-dir", str(SHARED)]) == 0
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if "selected" in line)
    assert "selected by validation MAP (rounds " in line and "{" not in line
    assert re.search(r"vali_MAP 0\.\d{1,4}\)", line), line
