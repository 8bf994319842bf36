"""``streamlearn simulate`` against a real broker, with ``streamlearn serve`` deciding."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]


def test_simulate_feeds_serve_through_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = ["--topics-instances", f"in-{tag}", "--topics-feedback", f"fb-{tag}",
              "--topics-decisions", f"dec-{tag}", "--topics-dead-letter", f"dlq-{tag}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    n = 1500
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlearn", "serve", "--bootstrap", kafka_bootstrap, *topics,
         "--max-events", str(n), "--metrics-port", "-1", "--progress-seconds", "0",
         "--checkpoint-dir", str(tmp_path / "ckpt")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        sim = subprocess.run(
            [sys.executable, "-m", "streamlearn", "simulate", "--bootstrap", kafka_bootstrap,
             *topics, "--rate", "0", "--events", str(n), "--delay-mean", "0.05", "--drop", "0.2",
             "--seed", "3", "--wait-seconds", "60", "--json"],
            capture_output=True, text=True, env=env, timeout=180)
        out, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert sim.returncode == 0, sim.stderr
    summary = orjson.loads(sim.stdout)
    assert summary["instances_sent"] == n
    assert summary["decisions_received"] == n  # every instance got exactly one decision
    assert summary["missing_decisions"] == 0 and summary["foreign_decisions"] == 0
    assert summary["feedback_sent"] + summary["dropped"] == n
    assert 200 < summary["dropped"] < 400  # Binomial(1500, 0.2): mean 300, sd 15.5
    assert server.returncode == 0, err
    match = re.search(r"daemon totals: instances (\d+), feedback joined (\d+)", out)
    assert match, out
    assert int(match.group(1)) == n
    assert int(match.group(2)) <= summary["feedback_sent"]


def test_simulate_without_bootstrap_is_a_config_error() -> None:
    done = subprocess.run([sys.executable, "-m", "streamlearn", "simulate", "--rate", "10"],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "STREAMLEARN_KAFKA_BOOTSTRAP": ""})
    assert done.returncode == 2
    assert "kafka.bootstrap must be HOST:PORT" in done.stderr
