"""``streamlearn simulate`` without a broker: argument checks and the feedback rule."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from streamlearn.cli import main
from streamlearn.commands.simulate import SimulationSummary, _on_decision


@pytest.mark.parametrize(("argv", "expected"), [
    (["--rate", "-1"], "--rate must be a number >= 0. Got -1.0."),
    (["--rate", "5", "--drop", "1.5"], "--drop must be a number in [0, 1]. Got 1.5."),
    (["--rate", "5", "--events", "0"], "--events must be an integer >= 1. Got 0."),
    (["--rate", "5", "--bootstrap", "bad"], "kafka.bootstrap must be HOST:PORT"),
])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], expected: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1


def test_decisions_are_answered_with_reward_one_iff_action_is_label() -> None:
    rng = np.random.default_rng(0)
    summary = SimulationSummary("r")
    labels = {f"r-{i}": i % 3 for i in range(6)}
    scheduled: list[tuple[float, str, float]] = []
    for i in range(6):
        action = i % 3 if i < 3 else (i + 1) % 3
        _on_decision(orjson.dumps({"id": f"r-{i}", "action": action}), labels, scheduled,
                     summary, rng, delay_mean_s=0.0, drop=0.0, now=10.0)
    _on_decision(orjson.dumps({"id": "other-1", "action": 0}), labels, scheduled, summary,
                 rng, 0.0, 0.0, 10.0)
    _on_decision(b"garbage", labels, scheduled, summary, rng, 0.0, 0.0, 10.0)
    rewards = {event_id: reward for _, event_id, reward in scheduled}
    assert rewards == {"r-0": 1.0, "r-1": 1.0, "r-2": 1.0, "r-3": 0.0, "r-4": 0.0, "r-5": 0.0}
    assert all(due == 10.0 for due, _, _ in scheduled)
    assert summary.decisions_received == 6 and summary.foreign_decisions == 2
    assert labels == {}  # answered ids are forgotten: a repeated decision counts as foreign


def test_drop_and_delay() -> None:
    rng = np.random.default_rng(1)
    summary = SimulationSummary("r")
    n = 4000
    labels = {f"r-{i}": 0 for i in range(n)}
    scheduled: list[tuple[float, str, float]] = []
    for i in range(n):
        _on_decision(orjson.dumps({"id": f"r-{i}", "action": 0}), labels, scheduled, summary,
                     rng, delay_mean_s=2.0, drop=0.1, now=0.0)
    assert summary.dropped + len(scheduled) == n
    assert 330 < summary.dropped < 470  # Binomial(4000, 0.1): mean 400, sd 19
    delays = np.array([due for due, _, _ in scheduled])
    assert 1.8 < delays.mean() < 2.2  # Exp(mean 2): sd of the mean ≈ 0.033
