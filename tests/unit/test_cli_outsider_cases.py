"""Command-line inputs an outside tester found to end in a traceback or to fail only after the
work: each is now one clear line and exit 2 before anything runs (or a quiet exit on a closed
pipe)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from loop_helpers import Clock, drain

from streamlearn.cli import main
from streamlearn.learners import make_learner
from streamlearn.service.daemon import Daemon, DaemonSettings
from streamlearn.stream.memory import InMemoryTransport

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
    settings = DaemonSettings(learner_n_actions=3, learner_n_features=2, checkpoint_dir=str(tmp_path),
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
