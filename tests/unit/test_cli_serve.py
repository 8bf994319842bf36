"""``streamlearn serve``: flags, one-line errors, the embedded loop, signals, final checkpoint."""

from __future__ import annotations

import argparse
import io
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import orjson
import pytest
from prometheus_client import CollectorRegistry

from streamlearn.cli import build_parser, main
from streamlearn.commands.serve import Progress, serve, to_toml
from streamlearn.config import env_name, field_specs, flag_name, load_config

REPO = Path(__file__).resolve().parents[2]


def serve_help() -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    choices: dict[str, argparse.ArgumentParser] = sub.choices  # type: ignore[assignment]
    return choices["serve"].format_help()


def test_help_documents_every_config_field_in_groups() -> None:
    text = serve_help()
    for fs in field_specs():
        assert flag_name(fs.section, fs.name) in text, fs.key
        assert env_name(fs.section, fs.name) in re.sub(r"\s+", "", text), fs.key
    for section in {fs.section for fs in field_specs()}:
        assert f"[{section}]:" in text
    for extra in ("--config", "--max-events", "--bootstrap", "--metrics-port",
                  "--checkpoint-dir", "--linger-seconds"):
        assert extra in text


@pytest.mark.parametrize(("argv", "expected"), [
    (["--join-window-seconds", "abc"],
     "join.window_seconds must be a number > 0. Got 'abc' (from --join-window-seconds)."),
    (["--bootstrap", "nohost"], "kafka.bootstrap must be HOST:PORT"),
    (["--metrics-port", "-5"], "metrics.port must be an integer in [-1, 65535]"),
    (["--learner", "nope"], "learner.name must be one of 'banditron', 'pnorm', 'eg', "
                            "'epsilon-greedy', 'squarecb', 'bag', 'linucb', 'lints', 'newtron', "
                            "'soba'. Got 'nope' (from --learner-name or --learner)."),
    (["--learner", "banditron", "--learner-eta", "0.5", "--max-events", "1"],
     "Learner 'banditron' does not take ['eta']"),
    (["--max-events", "0"], "--max-events must be an integer >= 1. Got 0."),
    (["--checkpoint-dir", str(REPO / "README.md"), "--max-events", "1"],
     "checkpoint.dir must be a directory (existing, or one that can be created) (or unset). "
     f"Got '{REPO / 'README.md'}' (from --checkpoint-dir): it exists and is not a directory."),
    (["--join-reward-weights", "click=1,,conversion=2", "--max-events", "1"],
     "join.reward_weights must be names with a weight >= 0 each: a table {name = weight, ...} in "
     "the file, 'name=weight,...' anywhere (or unset). Got 'click=1,,conversion=2' (from "
     "--join-reward-weights): item 2 of 3 is empty (items are name=weight separated by one ',')."),
    (["--rollout-baseline", "constant:x", "--max-events", "1"],
     "rollout.baseline must be 'constant:A' with an action A (an integer >= 0) (or unset). Got "
     "'constant:x' (from --rollout-baseline): the action after ':' must be an integer >= 0"),
    (["--rollout-baseline", " CONSTANT:12", "--max-events", "1"],  # K known at serve: 9
     "rollout.baseline must be 'constant:A' with an action A in [0, 9) (the embedded dataset "
     "'synnonsep' has 9 actions). Got 'constant:12' (from --rollout-baseline)."),
    (["--retrain-every-events", "100", "--retrain-rankers", "rankboost,rankboost",
      "--max-events", "1"],
     "retrain.rankers: Expected rankers with distinct artifact names. Got rankboost more than "
     "once in rankboost, rankboost (from --retrain-rankers)."),
    (["--retrain-every-events", "100", "--retrain-rankers", "ndcg-boost", "--max-events", "1"],
     "did you mean 'ndcg_boost'? (from --retrain-rankers)."),
    (["--retrain-rankers", "rankboost,,logistic", "--max-events", "1"],
     "retrain.rankers: a name is empty (two commas, or one at either end). Got "
     "'rankboost,,logistic' (from --retrain-rankers)."),
    (["--retrain-rollout-stages", "0.5,0.2", "--max-events", "1"],
     "retrain.rollout_stages: expected increasing shares in (0, 1)"),
    (["--embedded-slots", "3", "--max-events", "1"],
     "embedded.slots applies to the candidate-set streams"),
    (["--rollout", "apprentic", "--max-events", "1"], "(from --rollout-mode or --rollout)."),
])
def test_bad_value_is_one_line_error_exit_2(argv: list[str], expected: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--metrics-port", "-1", "--progress-seconds", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert len(err.strip().splitlines()) == 1


def test_env_value_error_names_the_variable(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STREAMLEARN_LIMITS_POLL_MAX_RECORDS", "lots")
    assert main(["serve", "--print-config"]) == 2
    assert "(from STREAMLEARN_LIMITS_POLL_MAX_RECORDS)" in capsys.readouterr().err


@pytest.mark.parametrize("baseline", ["constant:x", "banana", "fixed:1"])
def test_print_config_refuses_a_bad_rollout_baseline(baseline: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """--print-config used to print any rollout.baseline; it now fails as for other settings."""
    assert main(["serve", "--print-config", "--rollout-baseline", baseline]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("streamlearn serve: error: rollout.baseline must be "
                                   "'constant:A'")
    assert f"Got {baseline!r} (from --rollout-baseline)" in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert main(["serve", "--print-config", "--rollout-baseline", "Constant: 2"]) == 0
    assert 'baseline = "constant:2"' in capsys.readouterr().out


def test_print_config_round_trips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STREAMLEARN_JOIN_WINDOW_SECONDS", "42")
    assert main(["serve", "--print-config", "--learner", "pnorm", "--gamma", "0.1"]) == 0
    printed = capsys.readouterr().out
    tomllib.loads(printed)  # valid TOML
    path = tmp_path / "effective.toml"
    path.write_text(printed)
    monkeypatch.delenv("STREAMLEARN_JOIN_WINDOW_SECONDS")
    again = load_config(path, environ={})
    assert again.join.window_seconds == 42.0
    assert again.learner.name == "pnorm" and again.exploration.gamma == 0.1
    assert to_toml(again) == printed


def test_embedded_serve_learns_and_stops_after_max_events() -> None:
    config = load_config(environ={}, cli={"metrics.port": "0", "embedded.delay_mean_seconds": "0",
                                          "embedded.seed": "5"})
    registry, out = CollectorRegistry(), io.StringIO()
    assert serve(config, max_events=8000, progress_s=0, registry=registry, out=out) == 0
    get = registry.get_sample_value
    assert get("streamlearn_instances_total") == 8000
    decided = sum(get("streamlearn_decisions_total", {"explored": e}) or 0
                  for e in ("true", "false"))
    assert decided == 8000
    joined = get("streamlearn_feedback_total", {"outcome": "joined"}) or 0
    assert 7000 < joined <= 8000
    # random guessing errs 8/9 of the time; after 8000 SynNonSep events it is far below
    assert (get("streamlearn_window_error_rate") or 1.0) < 0.4
    text = out.getvalue()
    assert "metrics on http://127.0.0.1:" in text
    assert "stopped after 8000 instances" in text and "daemon totals: instances 8000" in text


def test_embedded_dimension_mismatch_is_a_config_error() -> None:
    config = load_config(environ={}, cli={"learner.n_actions": "5", "metrics.port": "-1"})
    with pytest.raises(Exception, match=r"learner\.n_actions must be 9 for the embedded dataset"):
        serve(config, max_events=10, progress_s=0, out=io.StringIO())


def test_sigterm_stops_with_final_checkpoint_exit_0(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlearn", "serve", "--checkpoint-dir", str(ckpt),
         "--metrics-port", "0", "--progress-seconds", "0.5", "--checkpoint-every-seconds", "600",
         "--checkpoint-every-events", "100000000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in proc.stdout:  # wait until it is demonstrably learning
            if re.search(r"events\s+[1-9]", line) or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        code = proc.wait(timeout=10)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert took < 10
    done = subprocess.run([sys.executable, "-m", "streamlearn", "inspect", str(ckpt), "--json"],
                          capture_output=True, text=True, env=env, check=True)
    info = orjson.loads(done.stdout)
    offsets = {row["topic"]: row["next_offset"] for row in info["offsets"]}
    assert offsets["streamlearn.instances"] > 0  # the only checkpoint is the final one
    assert info["learner"]["counters"]["n_decided"] == offsets["streamlearn.instances"]


def test_a_sigterm_while_the_daemon_starts_stops_it_once_started_exit_0(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM that arrives before the daemon serves (here: while its transport is built)
    does not kill the process with the signal's default action: the daemon starts, decides
    nothing, and stops as if signalled while serving; the handler before it comes back."""
    import streamlearn.commands.serve as serve_command

    built = serve_command.build_transport

    def signalled_while_built(*args: object, **kwargs: object) -> object:
        os.kill(os.getpid(), signal.SIGTERM)  # handled before the next bytecode of this thread
        return built(*args, **kwargs)

    monkeypatch.setattr(serve_command, "build_transport", signalled_while_built)
    config = load_config(environ={}, cli={"metrics.port": "-1", "embedded.delay_mean_seconds": "0"})
    missed: list[int] = []  # the signal reaching the handler before serve's (not the default
    # action: that would end this test run)

    def before(signum: int, frame: object) -> None:
        missed.append(signum)

    previous, out = signal.signal(signal.SIGTERM, before), io.StringIO()
    try:
        assert serve(config, max_events=8000, progress_s=0, out=out) == 0
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert missed == []
    assert "daemon totals: instances 0," in out.getvalue(), out.getvalue()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("command", [["serve", "--metrics-port", "-1"],
                                     ["simulate", "--rate", "0", "--events", "1"]])
def test_no_broker_at_bootstrap_fails_fast_with_one_line(
        command: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import streamlearn.transport.kafka as kafka_transport

    monkeypatch.setattr(kafka_transport, "CONNECT_TIMEOUT_S", 0.5)
    port = _closed_port()
    started = time.monotonic()
    assert main([*command, "--bootstrap", f"127.0.0.1:{port}"]) == 2
    assert time.monotonic() - started < 3.0  # not kafka-python's 30 s bootstrap timeout
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        f"streamlearn {command[0]}: error: cannot reach Kafka at 127.0.0.1:{port}: expected a "
        f"broker accepting connections within 0.5 s, got 127.0.0.1:{port}: connection refused"]


def test_a_sigterm_while_no_broker_answers_stops_at_once_exit_0(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection check waits up to its bound for a broker that is still starting; a
    SIGTERM meanwhile ends that wait at once (exit 0, nothing restored or decided) instead of
    after the bound (exit 2, "cannot reach Kafka")."""
    import streamlearn.transport.kafka as kafka_transport

    monkeypatch.setattr(kafka_transport, "CONNECT_TIMEOUT_S", 30.0)
    port = _closed_port()
    config = load_config(environ={}, cli={"metrics.port": "-1",
                                          "kafka.bootstrap": f"127.0.0.1:{port}"})
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    out, started = io.StringIO(), time.monotonic()
    timer.start()
    try:
        assert serve(config, progress_s=0, out=out) == 0
    finally:
        timer.cancel()
    assert 0.5 <= time.monotonic() - started < 5.0  # not the check's 30 s
    assert out.getvalue() == (f"streamlearn serve: stopped while waiting for Kafka at "
                              f"127.0.0.1:{port}: nothing restored, decided or written\n")


def test_check_reachable_returns_once_a_server_listens() -> None:
    from streamlearn.transport.kafka import check_reachable

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert check_reachable(f"127.0.0.1:{_closed_port()},127.0.0.1:{port}", timeout_s=1.0)


def test_library_loggers_are_quiet_by_default_ours_follow_log_level() -> None:
    from streamlearn.commands.serve import configure_logging

    root, librdkafka = logging.getLogger(), logging.getLogger("streamlearn.librdkafka")
    saved = root.level, logging.getLogger("streamlearn").level, librdkafka.level
    try:
        configure_logging("DEBUG")
        assert logging.getLogger("kafka.net.manager").getEffectiveLevel() == logging.WARNING
        assert librdkafka.getEffectiveLevel() == logging.WARNING  # a library's lines
        assert logging.getLogger("streamlearn.daemon").getEffectiveLevel() == logging.DEBUG
        configure_logging("ERROR", "INFO")
        assert logging.getLogger("kafka.conn").getEffectiveLevel() == logging.INFO
        assert librdkafka.getEffectiveLevel() == logging.INFO
        assert logging.getLogger("streamlearn.checkpoint").getEffectiveLevel() == logging.ERROR
    finally:
        root.setLevel(saved[0])
        logging.getLogger("streamlearn").setLevel(saved[1])
        librdkafka.setLevel(saved[2])


def test_embedded_candidate_dataset_serves_slates_in_candidate_mode() -> None:
    config = load_config(environ={}, cli={"metrics.port": "-1", "embedded.delay_mean_seconds": "0",
                                          "embedded.dataset": "synthetic-candidates",
                                          "embedded.slots": "2"})
    registry, out = CollectorRegistry(), io.StringIO()
    assert serve(config, max_events=3000, progress_s=0, registry=registry, out=out) == 0
    get = registry.get_sample_value
    assert get("streamlearn_instances_total") == 3000
    joined = get("streamlearn_feedback_total", {"outcome": "joined"}) or 0
    assert 2 * 2800 < joined <= 2 * 3000  # two slots per request, each joined
    rewards = [get("streamlearn_action_rewards_total", {"action": str(s)}) for s in (0, 1)]
    assert all(r is not None and r > 0 for r in rewards)  # per-slot reward metrics
    assert (get("streamlearn_invalid_events_total", {"topic": "streamlearn.instances",
                                                     "reason": "bad_slots"}) or 0) == 0
    assert "CandidateLinUCB (candidate sets, d_x=5, d_c=5)" in out.getvalue()


def test_candidate_mode_config_errors_say_what_was_expected() -> None:
    config = load_config(environ={}, cli={"metrics.port": "-1", "candidates.enabled": "true"})
    with pytest.raises(Exception, match=r"embedded.dataset must be a candidate-set stream"):
        serve(config, max_events=10, progress_s=0, out=io.StringIO())
    config = load_config(environ={}, cli={"metrics.port": "-1", "candidates.enabled": "true",
                                          "embedded.dataset": "synthetic-candidates",
                                          "rollout.baseline": "constant:0"})
    with pytest.raises(Exception, match=r"rollout.baseline must be unset in candidate mode.*"
                                        r"Got 'constant:0'"):
        serve(config, max_events=10, progress_s=0, out=io.StringIO())


@pytest.mark.parametrize(("argv", "expected"), [
    (["--checkpoint-keep", "99999999999999999999999"], "beyond the 64-bit integer range"),
    (["--learner-seed", str(2**63)], "beyond the 64-bit integer range"),
    (["--metrics-window", str(2**62)], "metrics.window must be an integer in [1, 10000000]"),
    (["--linger-seconds", "nan"], "--linger-seconds must be a number of seconds in [0, 1e+09]"),
    (["--linger-seconds", "1e400"], "--linger-seconds must be a number of seconds"),
    (["--checkpoint-dir", "x" * 300], "it cannot be used: File name too long"),
])
def test_values_that_used_to_pass_and_crash_later_are_refused_at_start(
        argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    """An outside client's finds: these passed validation and then raised a traceback at the
    first checkpoint (ints beyond int64 in meta.json), in the seed mix, in an array allocation
    or in a wait."""
    assert main(["serve", "--print-config", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_a_symlink_loop_as_checkpoint_dir_is_refused(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    assert main(["serve", "--print-config", "--checkpoint-dir", str(tmp_path / "a")]) == 2
    assert "symbolic link to nothing (dangling, or a loop)" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "expected"), [
    ("x = " + "[" * 50_000 + "]" * 50_000 + "\n", "nest too deeply to read"),
    ("# padding\n" * 200_000, "must be at most 1048576 bytes"),
])
def test_a_config_file_that_is_no_config_is_a_clear_error(
        tmp_path: Path, content: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.toml"
    path.write_text(content)
    assert main(["serve", "--print-config", "--config", str(path)]) == 2
    assert expected in capsys.readouterr().err


def _summary(out: io.StringIO) -> str:
    return next(line for line in out.getvalue().splitlines() if "stopped after" in line)


def test_the_final_line_accounts_for_every_decision_and_reports_memory_and_busy_rate() -> None:
    """joined + expired + pending + shed = decided; the rate beside the wall clock's leaves out
    polling; the process's own memory is on the line and on /metrics."""
    config = load_config(environ={}, cli={"metrics.port": "-1", "embedded.seed": "5",
                                          "embedded.delay_mean_seconds": "0.5"})
    registry, out = CollectorRegistry(), io.StringIO()
    assert serve(config, max_events=3000, progress_s=0, registry=registry, out=out) == 0
    line = _summary(out)
    fates = re.search(r"feedback joined (\d+), expired (\d+), pending (\d+), shed (\d+) "
                      r"\(of (\d+) decisions\)", line)
    assert fates is not None, line
    joined, expired, pending, shed, decided = map(int, fates.groups())
    assert decided == 3000 and pending > 0
    assert joined + expired + pending + shed == decided
    assert re.search(r"\(\d[\d,]*/s; \d[\d,]*/s over the \d+\.\d s not spent polling\)", line), line
    assert re.search(r"peak RSS \d[\d,]* MB", line), line
    assert (registry.get_sample_value("process_resident_memory_bytes") or 0) > 10e6


def test_the_final_line_says_when_the_error_rests_on_few_rounds() -> None:
    config = load_config(environ={}, cli={"metrics.port": "-1",
                                          "embedded.delay_mean_seconds": "5"})
    out = io.StringIO()
    assert serve(config, max_events=500, progress_s=0, out=out) == 0
    assert re.search(r"over \d+ learned rounds only: too few to judge the learner",
                     _summary(out)), _summary(out)
    out = io.StringIO()
    config = load_config(environ={}, cli={"metrics.port": "-1",
                                          "embedded.delay_mean_seconds": "0"})
    assert serve(config, max_events=3000, progress_s=0, out=out) == 0
    assert "too few to judge" not in _summary(out)


def test_candidate_mode_says_it_counts_requests_and_placed_slots() -> None:
    config = load_config(environ={}, cli={"metrics.port": "-1", "embedded.delay_mean_seconds": "0.3",
                                          "embedded.dataset": "synthetic-candidates",
                                          "embedded.slots": "2"})
    registry, out = CollectorRegistry(), io.StringIO()
    assert serve(config, max_events=1000, progress_s=0, registry=registry, out=out) == 0
    line = _summary(out)
    assert "stopped after 1000 requests" in line and "daemon totals: requests 1000," in line
    fates = re.search(r"feedback per placed slot: joined (\d+), expired (\d+), pending (\d+), "
                      r"shed (\d+) \(of (\d+) slots placed\)", line)
    assert fates is not None, line
    joined, expired, pending, shed, placed = map(int, fates.groups())
    assert placed == 2 * 1000 == joined + expired + pending + shed  # every request has >= 2
    progress = Progress(registry, out=None, slots=True).line()
    assert "requests " in progress and "joined-slots " in progress and "pending-slots " in progress


def test_help_is_short_and_points_to_help_all(capsys: pytest.CaptureFixture[str]) -> None:
    """serve --help was 431 lines; it now shows the options of a first run."""
    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert len(text.splitlines()) < 120
    for flag in ("--max-events", "--bootstrap", "--learner", "--checkpoint-dir",
                 "--metrics-port", "--embedded-dataset", "--data-dir", "--fetch", "--config"):
        assert flag in text, flag
    assert "--kafka-sasl-password" not in text and "[limits]" not in text
    assert text.rstrip().splitlines()[-1].endswith("streamlearn serve --help-all")


def test_help_all_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help-all"])
    text = capsys.readouterr().out
    for fs in field_specs():
        assert flag_name(fs.section, fs.name) in text, fs.key
    assert "--linger-seconds" in text and "--library-log-level" in text
    # the short help changed nothing: the parser's full help is still whole
    assert serve_help() == text
