"""``streamlearn simulate`` against a real broker, with ``streamlearn serve`` deciding."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import orjson
import pytest

REPO = Path(__file__).resolve().parents[2]


def _becomes_ready(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200 and orjson.loads(response.read())["ready"]:
                    return True
        except urllib.error.HTTPError as exc:
            assert exc.code == 503, exc.code
        except (urllib.error.URLError, OSError):
            pass  # the loop stopped and the server is gone (refused, or reset mid-answer)
        time.sleep(0.2)
    return False


CANDIDATES = (["--candidates-enabled", "true", "--candidates-shared-features", "5",
               "--candidates-candidate-features", "5"],
              ["--dataset", "synthetic-candidates", "--slots", "2"], 2)


@pytest.mark.parametrize(("serve_args", "simulate_args", "slots"),
                         [([], [], 1), CANDIDATES], ids=["fixed-actions", "candidate-sets"])
def test_simulate_feeds_serve_through_kafka(kafka_bootstrap: str, tmp_path: Path,
                                            serve_args: list[str], simulate_args: list[str],
                                            slots: int) -> None:
    tag = uuid.uuid4().hex[:8]
    topics = ["--topics-instances", f"in-{tag}", "--topics-feedback", f"fb-{tag}",
              "--topics-decisions", f"dec-{tag}", "--topics-dead-letter", f"dlq-{tag}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    n = 1500
    server = subprocess.Popen(
        [sys.executable, "-m", "streamlearn", "serve", "--bootstrap", kafka_bootstrap, *topics,
         "--max-events", str(n), "--metrics-port", "0", "--progress-seconds", "0",
         "--checkpoint-dir", str(tmp_path / "ckpt"), *serve_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    simulator: subprocess.Popen[str] | None = None
    try:
        assert server.stdout is not None
        head = [server.stdout.readline() for _ in range(2)]
        port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", "".join(head))
        assert port, head
        # on a real broker the lag, measured from the poll thread, makes it ready; before the
        # load starts, so that a loaded machine's slow first answer cannot outlast the ~3 s
        # the daemon then serves (CI: never ready while it served, twice)
        if not _becomes_ready(f"http://127.0.0.1:{port.group(1)}/readyz", timeout_s=60):
            server.kill()  # why it never was: its log (the lag query's errors are logged)
            _, err = server.communicate(timeout=30)
            pytest.fail(f"/readyz never said ready while serving; serve's log:\n{err[-4000:]}")
        simulator = subprocess.Popen(
            [sys.executable, "-m", "streamlearn", "simulate", "--bootstrap", kafka_bootstrap,
             *topics, "--rate", "500", "--events", str(n), "--delay-mean", "0.05", "--drop", "0.2",
             "--seed", "3", "--wait-seconds", "60", "--json", *simulate_args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        sim_out, sim_err = simulator.communicate(timeout=180)
        out, err = server.communicate(timeout=60)
    finally:
        for proc in (server, simulator):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert simulator is not None and simulator.returncode == 0, sim_err
    summary = orjson.loads(sim_out)
    assert summary["instances_sent"] == n
    assert summary["decisions_received"] == n  # every instance got exactly one decision
    assert summary["missing_decisions"] == 0 and summary["foreign_decisions"] == 0
    assert summary["feedback_sent"] + summary["dropped"] == n
    assert 200 < summary["dropped"] < 400  # Binomial(1500, 0.2): mean 300, sd 15.5
    assert server.returncode == 0, err
    # candidate mode counts requests, and feedback per placed slot
    match = re.search(r"daemon totals: (?:instances|requests) (\d+), feedback (?:per placed slot: )?"
                      r"joined (\d+)", out)
    assert match, out
    assert int(match.group(1)) == n
    assert int(match.group(2)) <= slots * summary["feedback_sent"]  # joins count slots


def test_simulate_without_bootstrap_is_a_config_error() -> None:
    done = subprocess.run([sys.executable, "-m", "streamlearn", "simulate", "--rate", "10"],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO),
                               "STREAMLEARN_KAFKA_BOOTSTRAP": ""})
    assert done.returncode == 2
    assert "kafka.bootstrap must be HOST:PORT" in done.stderr
