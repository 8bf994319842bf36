"""A real Prometheus scrapes ``streamlearn serve`` and agrees with the daemon's own counts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _read_until(proc: subprocess.Popen[str], pattern: str, timeout_s: float) -> re.Match[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen = []
    for line in proc.stdout:
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no line matching {pattern!r}; got:\n{''.join(seen)}")


def _value(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_prometheus_scrapes_final_counts_exactly(prometheus: Callable[..., Any]) -> None:
    n = 6000
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlearn", "serve", "--max-events", str(n),
         "--metrics-port", "0", "--progress-seconds", "0", "--linger-seconds", "120",
         "--embedded-rate", "2000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        port = int(_read_until(proc, r"metrics on http://127\.0\.0\.1:(\d+)/metrics", 60).group(1))
        server = prometheus(f"127.0.0.1:{port}")
        stopped = _read_until(proc, r"daemon totals: instances (\d+), feedback joined (\d+)", 120)
        stopped_at = time.time()
        own_instances, own_joined = int(stopped.group(1)), int(stopped.group(2))
        assert own_instances == n
        # a scrape that started after the loop ended sees the final values, so equality is exact
        server.wait_for("timestamp(streamlearn_instances_total)",
                        lambda r: bool(r) and float(r[0]["value"][1]) > stopped_at, 30)
        assert _value(server.query("streamlearn_instances_total")) == own_instances
        assert _value(server.query("sum(streamlearn_decisions_total)")) == own_instances
        joined = 'streamlearn_feedback_total{outcome="joined"}'
        assert _value(server.query(joined)) == own_joined
        assert _value(server.query("up")) == 1
        # the histograms made it too: one latency observation per decision
        assert _value(server.query("streamlearn_decision_latency_seconds_count")) == own_instances
        assert 0 <= _value(server.query("streamlearn_window_error_rate")) < 1
        # lingering after the loop: alive, but no longer ready
        base = f"http://127.0.0.1:{port}"
        assert urllib.request.urlopen(base + "/healthz", timeout=5).status == 200
        try:
            urllib.request.urlopen(base + "/readyz", timeout=5)
            raise AssertionError("/readyz answered 200 after the loop stopped")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503 and b"not serving" in exc.read()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # ends the linger
        code = proc.wait(timeout=20)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
