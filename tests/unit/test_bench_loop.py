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
