"""The progress line of serve and simulate: labels before numbers, an EWMA error, no fake zeros."""

from __future__ import annotations

import io
import re
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamlearn.commands.progress import ErrorEwma, ProgressLine
from streamlearn.commands.serve import Progress, serve
from streamlearn.config import load_config
from streamlearn.service.metrics import PrometheusObserver


def naive_ewma(errors: np.ndarray, half_life: float) -> float:
    """Σ λ^t e_{n-1-t} / Σ λ^t over every round, λ = 2^(-1/half_life)."""
    weights = 2.0 ** (-np.arange(len(errors))[::-1] / half_life)
    return float((weights * errors).sum() / weights.sum())


def test_ewma_fed_every_round_equals_the_naive_definition() -> None:
    errors = (np.random.default_rng(0).random(3000) < 0.2).astype(float)
    ewma = ErrorEwma(half_life=500)
    for t in range(len(errors)):
        ewma.update(rounds=t + 1, mistakes=float(errors[: t + 1].sum()))
    assert ewma.value == pytest.approx(naive_ewma(errors, 500), rel=1e-9)


def test_ewma_fed_in_blocks_follows_a_change_the_cumulative_rate_hides() -> None:
    ewma = ErrorEwma(half_life=1000)
    ewma.update(rounds=50_000, mistakes=25_000)  # error 0.5 for a long time
    value = ewma.update(rounds=60_000, mistakes=25_000 + 1_000)  # then 0.1
    cumulative = 26_000 / 60_000
    assert value < 0.11 < cumulative
    assert ErrorEwma().update(rounds=0, mistakes=0) != ErrorEwma().update(rounds=0, mistakes=0)  # NaN


def _value(line: str, label: str) -> str:
    """The text right after ``label`` (labels come first, then their number)."""
    found = re.search(rf"(?:^|\s){re.escape(label)}\s+(\S+)", line)
    assert found is not None, (label, line)
    return found.group(1)


def test_every_label_precedes_its_number() -> None:
    clock = iter([0.0, 5.0]).__next__
    line = ProgressLine(clock=clock).line(events=5000, rounds=4000, mistakes=800,
                                          extra=[("γ", "0.0500"), ("joined", "4,000")])
    assert _value(line, "events") == "5,000" and _value(line, "joined") == "4,000"
    assert _value(line, "cum-error") == "0.2000" and _value(line, "ewma-error") == "0.2000"
    assert _value(line, "γ") == "0.0500" and line.split()[-1] == "4,000"
    # never a number followed by its label (the old 'error 0.21 cum 0.09 window')
    assert not re.search(r"\d \w", line.replace("/s", ""))


def test_serve_progress_before_and_after_the_first_events() -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    progress = Progress(registry, out=None)
    before = progress.line()
    assert "cum-error –  ewma-error –" in before and "γ –" in before  # not 0.0000
    observer.on_instances(1000)
    observer.on_decisions(1000, n_explored=50, latencies_s=np.zeros(1000))
    observer.on_gamma(0.05)
    observer.on_rewards(750.0)
    observer.on_mistakes(250.0)
    observer.on_error_rates(0.25, 0.3, 0.2)
    after = progress.line()
    assert "cum-error 0.2500  ewma-error 0.2500  γ 0.0500" in after
    assert _value(after, "events") == "1,000"


# ------------------------------------------------- the final line is the last
class _Lines:
    """A stream that keeps what was written, as ``print`` writes it (text, then newline)."""

    def __init__(self) -> None:
        self.text = ""
        self.writes_after_stop = 0
        self.stopped = False

    def write(self, text: str) -> int:
        self.text += text
        self.writes_after_stop += self.stopped
        return len(text)

    def flush(self) -> None:
        pass


def test_once_stopped_the_progress_printer_prints_nothing_more() -> None:
    out = _Lines()
    progress = Progress(CollectorRegistry(), out)
    with progress.every(0.001) as stop:
        deadline = time.monotonic() + 5
        while out.text.count("\n") < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
        stop()
        out.stopped = True
        time.sleep(0.05)  # fifty intervals
    assert out.text.count("\n") >= 3 and out.writes_after_stop == 0


def test_serve_prints_its_final_line_last_also_while_metrics_linger() -> None:
    """A progress line used to follow the final line (or land inside it): the printer ran until
    serve returned, through the summary and the linger."""
    config = load_config(environ={}, cli={"metrics.port": "-1", "embedded.rate": "5000",
                                          "embedded.delay_mean_seconds": "0"})
    out = io.StringIO()
    assert serve(config, max_events=1000, progress_s=0.02, linger_s=0.3, out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("streamlearn serve: stopped after 1000 instances"), lines[-3:]
    progress = [line for line in lines if not line.startswith("streamlearn serve: ")]
    assert progress, lines  # 0.2 s at 5,000 events/s: lines every 0.02 s
    assert all(re.match(r" *\d+\.\ds  events +[\d,]+ ", line) for line in progress), progress
    assert sum("stopped after" in line for line in lines) == 1


def test_a_replica_stops_its_progress_lines_before_its_final_line() -> None:
    from streamlearn.commands.serve_group import serve_replica

    said: list[str] = []

    class Replica:
        instances_this_run, moves, hub = 5, 1, None

        def run(self, max_instances: int | None) -> None:
            said.append("run")

    class Out:
        def write(self, text: str) -> int:
            if text.strip():
                said.append("final line")
            return len(text)

        def flush(self) -> None:
            pass

    assert serve_replica(Replica(), 5, Out(),  # type: ignore[arg-type]
                         before_summary=lambda: said.append("progress stopped")) == 0
    assert said == ["run", "progress stopped", "final line"]


# ------------------------------------------------- next to a baseline
def _observed(mode: str) -> tuple[Progress, PrometheusObserver]:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    observer.on_instances(1000)
    observer.on_decisions(1000, n_explored=50, latencies_s=np.zeros(1000))
    observer.on_gamma(0.05)
    observer.on_rewards(750.0)
    observer.on_mistakes(250.0)
    observer.on_error_rates(0.25, 0.3, 0.2)
    observer.on_rollout({"learner": 0.1, "baseline": 0.9})
    observer.on_rollout_mode(mode, 0.05, float("nan"))
    return Progress(registry, out=None), observer


@pytest.mark.parametrize("mode", ["apprentice", "conservative"])
def test_next_to_a_baseline_the_line_says_its_errors_are_the_published_decisions(
        mode: str) -> None:
    """In apprentice mode cum-error was the baseline's error, unlabelled: the error rates are
    the published decisions', γ is the learner's own (labelled so: it was "published γ" while
    the gauge gave the learner's, an outside test), and the learner's side is shown beside."""
    progress, observer = _observed(mode)
    line = progress.line()
    assert ("published cum-error 0.2500  published ewma-error 0.2500  learner γ 0.0500  "
            "learner-share 0.1000  learner-error –  baseline-error –  agreement 0.0500  "
            "joined ") in line, line
    assert not re.search(r"(?<!published) (cum-error|ewma-error) ", line), line
    assert not re.search(r"(?<!learner) γ ", line), line
    observer.on_policy_live_value("learner", 0.7)
    observer.on_policy_live_value("baseline", 0.25)
    line = progress.line()
    assert _value(line, "learner-error") == "0.3000" and _value(line, "baseline-error") == "0.7500"


def test_online_the_line_is_unchanged() -> None:
    progress, _ = _observed("online")
    line = progress.line()
    assert "cum-error 0.2500  ewma-error 0.2500  γ 0.0500  joined " in line
    assert "published" not in line and "learner-share" not in line


def test_an_apprentice_run_labels_its_final_line_too() -> None:
    config = load_config(environ={}, cli={"metrics.port": "-1", "rollout.mode": "apprentice",
                                          "rollout.baseline": "constant:0",
                                          "embedded.delay_mean_seconds": "0"})
    out = io.StringIO()
    assert serve(config, max_events=2000, progress_s=0, out=out) == 0
    last = out.getvalue().splitlines()[-1]
    assert re.search(r"; published cum-error 0\.\d{4}, published ewma-error 0\.\d{4}, "
                     r"published window-error 0\.\d{4}; rollout apprentice: learner-share "
                     r"0\.0000, learner-error –, baseline-error 0\.\d{4}, agreement 0\.\d{4}; "
                     r"peak RSS", last), last
