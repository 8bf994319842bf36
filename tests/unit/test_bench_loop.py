"""The loop benchmark runs in both modes and its loops join every feedback they are given."""

from __future__ import annotations

import pytest

from simulators import bench_loop


@pytest.mark.parametrize("candidates", [0, 7])
def test_the_loop_benchmark_prints_both_rates_and_their_ratio(
        candidates: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_loop.main(["--events", "300", "--repeats", "1",
                            "--candidates", str(candidates)]) == 0
    out = capsys.readouterr().out
    assert ("requests/s" if candidates else "events/s") in out
    assert "loop / bare relay = " in out


def test_the_loop_can_read_its_messages_a_few_at_a_time(capsys: pytest.CaptureFixture[str]) -> None:
    """--arrivals: the loop steps until it has read each arrival (and joins every feedback)."""
    assert bench_loop.loop_rate(bench_loop.stream(300)[0], arrivals=3) > 0
    with pytest.raises(SystemExit):
        bench_loop.main(["--arrivals", "4", "--candidates", "5"])
    assert "with --candidates" in capsys.readouterr().err


def test_a_negative_candidate_count_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_loop.main(["--candidates", "-1"])
    assert exit_info.value.code == 2
    assert "expected an integer >= 0, got -1" in capsys.readouterr().err


def test_the_loop_can_start_with_a_full_join(capsys: pytest.CaptureFixture[str]) -> None:
    """--pending: decisions that never get feedback are made first (untimed), and every
    feedback of the timed stream still joins (loop_rate asserts it)."""
    from streamlearn.service.settings import JoinConfig

    assert JoinConfig().max_pending == 200_000  # what the option's help promises
    assert bench_loop.loop_rate(bench_loop.stream(200)[0], arrivals=4, pending=50) > 0
    with pytest.raises(SystemExit):
        bench_loop.main(["--pending", "10"])
    assert "without --arrivals" in capsys.readouterr().err


def test_the_pending_benchmark_times_both_regimes(capsys: pytest.CaptureFixture[str]) -> None:
    """simulators.bench_pending: µs a step with the join full, shedding and expiring."""
    from simulators import bench_pending

    for regime in bench_pending.REGIMES:
        assert bench_pending.step_cost(300, 20, regime, 0.05) > 0
    assert bench_pending.main(["--pending", "300", "--steps", "10", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "300 decisions pending, 5% answered" in out and "shed" in out and "expire" in out
