"""``streamlearn simulate`` without a broker: argument checks and the feedback rule."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest

import streamlearn.commands.simulate as simulate_module
from streamlearn.cli import build_parser, main
from streamlearn.commands.simulate import simulate
from streamlearn.config import load_config
from streamlearn.datasets.caller import SimulatedCaller, StreamSource


@pytest.mark.parametrize(("argv", "expected"), [
    (["--rate", "-1"], "--rate must be a finite number >= 0. Got -1.0."),
    (["--rate", "5", "--drop", "1.5"], "--drop must be a number in [0, 1]. Got 1.5."),
    (["--rate", "5", "--events", "0"], "--events must be an integer >= 1. Got 0."),
    (["--rate", "5", "--bootstrap", "bad"], "kafka.bootstrap must be HOST:PORT"),
    (["--rate", "5", "--progress-seconds", "-1"], "--progress-seconds must be a finite number >= 0."),
    # an outside test: --rate nan/inf ended in a traceback, --wait-seconds nan never ended,
    # --slots on a dataset without candidate sets ran as if not given
    (["--rate", "nan"], "--rate must be a finite number >= 0. Got nan."),
    (["--rate", "inf"], "--rate must be a finite number >= 0. Got inf."),
    (["--rate", "10", "--wait-seconds", "nan"], "--wait-seconds must be a finite number >= 0"),
    (["--rate", "10", "--delay-mean", "inf"], "--delay-mean must be a finite number >= 0"),
    (["--rate", "10", "--progress-seconds", "nan"], "--progress-seconds must be a finite number"),
    (["--rate", "10", "--slots", "3"], "--slots needs a candidate-set dataset"),
])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], expected: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_help_says_what_is_required() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    text = " ".join(sub.choices["simulate"].format_help().split())  # type: ignore[index]
    assert "--rate EV_PER_S required, no default" in text
    assert "--kafka-bootstrap HOST:PORT, --bootstrap HOST:PORT required" in text
    assert "embedded" not in text.split("[kafka]:")[1]  # simulate has no embedded mode


def caller_with_labels(labels: list[int], delay_mean_s: float = 0.0,
                       drop: float = 0.0) -> SimulatedCaller:
    """A caller whose instance i (id ``r-i``) has label ``labels[i]``, all sent at t = 0."""
    X = np.zeros((len(labels), 3))
    caller = SimulatedCaller(StreamSource.from_arrays(X, np.array(labels), 3), "r-",
                             delay_mean_s, drop, seed=1)
    caller.instances(len(labels), now=0.0)
    return caller


def test_decisions_are_answered_with_reward_one_iff_action_is_label() -> None:
    caller = caller_with_labels([i % 3 for i in range(6)])
    decisions = [orjson.dumps({"id": f"r-{i}", "action": i % 3 if i < 3 else (i + 1) % 3})
                 for i in range(6)]
    caller.answer([*decisions, orjson.dumps({"id": "other-1", "action": 0}), b"garbage"], 10.0)
    feedback = [orjson.loads(v) for _, v in caller.due(10.0)]
    assert {f["id"]: f["reward"] for f in feedback} == {
        "r-0": 1.0, "r-1": 1.0, "r-2": 1.0, "r-3": 0.0, "r-4": 0.0, "r-5": 0.0}
    assert all(f["ts"] == 10.0 for f in feedback)
    stats = caller.stats
    assert stats.decisions_received == 6
    assert stats.foreign_decisions + stats.unparsable_decisions == 2
    assert stats.foreign_decisions == 1 and stats.repeated_decisions == 0
    caller.answer(decisions[:1], 11.0)  # answered once: a re-published copy is not answered
    assert caller.due(11.0) == [] and stats.foreign_decisions == 1
    assert stats.repeated_decisions == 1  # ... and counted as ours, repeated, not foreign


def test_an_id_twice_in_one_batch_is_answered_once() -> None:
    """A restarted daemon re-publishes a decision it journaled (identical): both copies can
    arrive in one poll, and each was answered (feedback sent twice for one id)."""
    caller = caller_with_labels([0, 1, 2])
    copy = orjson.dumps({"id": "r-1", "action": 1})
    caller.answer([copy, orjson.dumps({"id": "r-0", "action": 2}), copy], 1.0)
    assert sorted(orjson.loads(v)["id"] for _, v in caller.due(1.0)) == ["r-0", "r-1"]
    assert caller.stats.decisions_received == 2 and caller.stats.repeated_decisions == 1
    assert caller.stats.foreign_decisions == 0


def test_drop_and_delay() -> None:
    n = 4000
    caller = caller_with_labels([0] * n, delay_mean_s=2.0, drop=0.1)
    caller.answer([orjson.dumps({"id": f"r-{i}", "action": 0}) for i in range(n)], now=0.0)
    assert caller.stats.dropped + caller.scheduled == n
    assert 330 < caller.stats.dropped < 470  # Binomial(4000, 0.1): mean 400, sd 19
    delays = caller._queue.due_at
    assert 1.8 < delays.mean() < 2.2  # Exp(mean 2): sd of the mean ≈ 0.033


class _FakeKafka:
    """Producer + consumer stand-ins: every instance sent gets a decision for action 0."""

    def __init__(self) -> None:
        self.unanswered: list[bytes] = []
        self.feedback: list[bytes] = []

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        if topic == "streamlearn.instances":
            self.unanswered.append(value)
        else:
            self.feedback.append(value)

    def poll(self, timeout_ms: int, max_records: int) -> dict[str, list[Any]]:
        batch, self.unanswered = self.unanswered, []
        return {"tp": [SimpleNamespace(value=orjson.dumps(
            {"id": orjson.loads(v)["id"], "action": 0})) for v in batch]}

    def flush(self, timeout: float) -> None:
        pass

    def close(self, timeout: float = 0.0) -> None:
        pass


def test_simulate_prints_the_serve_style_progress_line(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeKafka()
    monkeypatch.setattr(simulate_module, "_clients", lambda config: (fake, fake))
    config = load_config(environ={}, cli={"kafka.bootstrap": "127.0.0.1:9"})
    out = io.StringIO()
    summary = simulate(config, dataset="synsep", rate=0, events=600, delay_mean_s=0.0,
                       seed=1, run_id="t", chunk=100, progress_s=1e-9, progress_out=out)
    lines = out.getvalue().splitlines()
    assert summary.feedback_sent == 600 and len(lines) >= 2
    assert re.search(r"sent +0 .* cum-error –  ewma-error –  decisions 0  feedback 0", lines[0])
    error = 1 - summary.rewards / summary.feedback_sent  # action 0 is right for class 0 only
    last = lines[-1]
    assert re.search(r"\bsent +\d", last) and "awaiting-decision" in last
    assert 0.5 < error < 1.0 and "cum-error" in last


def test_the_summary_gives_the_sending_rate_beside_the_wall_clock_rate() -> None:
    """'(187/s)' counted the wait for the last decisions as sending time."""
    summary = simulate_module.SimulationSummary("r", instances_sent=10_000, seconds=40.0,
                                                sending_seconds=10.0)
    assert "in 40.0 s (250/s; 1,000/s over the 10.0 s of sending, the rest waiting for " \
           "decisions)" in summary.text()
    assert "of sending" not in simulate_module.SimulationSummary(
        "r", instances_sent=10, seconds=4.0, sending_seconds=4.0).text()


def test_the_candidate_caller_counts_a_repeated_decision_as_ours() -> None:
    from streamlearn.datasets.candidate_caller import CandidateCaller
    from streamlearn.datasets.candidates import synthetic_candidates

    caller = CandidateCaller(synthetic_candidates(10, d_x=2, d_c=3, seed=1), delay_mean_s=0.0)
    caller.instances(2, now=0.0)
    cid = caller.stream.candidate_ids[0]
    decision = orjson.dumps({"id": "e0", "candidates": [{"id": cid, "prob": 1.0}]})
    caller.answer([decision, decision, orjson.dumps({"id": "e7", "candidates": []})], now=0.0)
    assert len(caller.due(0.0)) == 1 and caller.stats.decisions_received == 1
    assert (caller.stats.repeated_decisions, caller.stats.foreign_decisions) == (1, 1)
