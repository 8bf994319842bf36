"""An outside client of the daemon, written only from the documented event format.

It uses nothing of streamlearn: kafka-python to produce instances and feedback
and to read decisions and dead letters, ``urllib`` to read ``/metrics``, and
``subprocess`` to run, SIGKILL and restart ``python -m streamlearn serve`` the
way an operator would (README: "Running against a real Kafka").

The stream is a seeded linear problem: K actions, d dense features, the label
is the argmax of a hidden linear score plus noise. The client plays in
lockstep blocks — publish a block of instances, wait for a decision for each,
answer each with ``reward = 1[action == label]``, wait until ``/metrics`` shows
the feedback joined — so the learner's path does not depend on timing and two
runs of the same seed can be compared window by window.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Problem:
    """``n`` events of a seeded linear K-action problem with ``d`` features."""

    n: int = 20_000
    k: int = 5
    d: int = 12
    noise: float = 0.5
    seed: int = 11
    X: np.ndarray = field(init=False, repr=False)
    y: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        hidden = rng.normal(size=(self.k, self.d))
        self.X = rng.normal(size=(self.n, self.d))
        self.X[:, -1] = 1.0
        self.y = np.argmax(self.X @ hidden.T + self.noise * rng.gumbel(size=(self.n, self.k)), axis=1)

    def instance(self, i: int, baseline: int | None = None) -> bytes:
        """Event ``i`` in the dense form, or every third one in the sparse idx/val form; with
        ``baseline``, what the client's own system would do for it."""
        x = self.X[i]
        extra = {} if baseline is None else {"baseline": baseline}
        if i % 3:
            return orjson.dumps({"id": f"o{i}", "x": x.tolist(), **extra})
        nz = np.flatnonzero(x)
        return orjson.dumps({"id": f"o{i}", "x": {"idx": nz.tolist(), "val": x[nz].tolist()},
                             **extra})

    def baseline(self, i: int) -> int:
        """The client's own system: right on three events in four, one action off otherwise."""
        return int(self.y[i]) if i % 4 else int((self.y[i] + 1) % self.k)


def hostile_instances(d: int, k: int, count: int, seed: int) -> list[tuple[str | None, bytes, bool]]:
    """``count`` odd messages: ``(id or None, value, valid)``.

    Valid ones (subnormal values, −0.0, NUL-ended and non-BMP ids) must be
    decided like any other event; invalid ones (huge or non-finite values,
    wrong shapes, broken JSON) must land on the dead-letter topic.
    """
    rng = np.random.default_rng(seed)
    makers: list[Callable[[int], tuple[str | None, bytes, bool]]] = [
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": [1e308] * d}), False),
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": [-1e308] * d}), False),
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": [1.7e308, -1.7e308] * (d // 2)}), False),
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": {"idx": [0, d - 1], "val": [1e300, 1.0]}}),
                   False),
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": {"price": 3e200}}), False),
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": [1e-320] * d}), True),
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": [-0.0] * d, "actions": [1, 2]}), True),
        lambda j: (f"h{j}\u0000", orjson.dumps({"id": f"h{j}\u0000", "x": [0.5] * d}), True),
        lambda j: ("\u0000" * (1 + j % 3) + f"{j}",
                   orjson.dumps({"id": "\u0000" * (1 + j % 3) + f"{j}", "x": [0.1] * d}), True),
        lambda j: (f"\U0001f600{j}\U00010348", orjson.dumps({"id": f"\U0001f600{j}\U00010348",
                                                             "x": [0.2] * d}), True),
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": [1.0] * (d + 1)}), False),
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": {"idx": [1.5], "val": [1.0]}}), False),
        lambda j: (f"h{j}", b'{"id": "h%d", "x": [NaN]}' % j, False),
        lambda j: (None, b'{"id": ', False),
        lambda j: (f"h{j}", orjson.dumps({"id": f"h{j}", "x": [1.0] * d, "actions": [k]}), False),
    ]
    return [makers[int(rng.integers(len(makers)))](j) for j in range(count)]


def hostile_baselines(d: int, k: int, count: int, seed: int) -> list[tuple[str | None, bytes, bool]]:
    """``count`` instances valid but for their ``baseline`` (docs/kafka.md: an integer action
    in [0, K), among the event's ``actions`` when it has some), as ``(id, value, valid)``:
    each invalid one must be a ``bad_baseline`` dead letter; a ``null`` baseline is none, and
    a baseline among the event's actions is fine."""
    rng = np.random.default_rng(seed)
    bad: list[Any] = [-1, -(2**63), k, k + 1, 2**63 - 1, 2**64 - 1, "1", "", "NaN", "Infinity",
                      1.0, 0.5, 1e308, -0.0, True, False, [1], [], {"action": 1}, {"": {"a": [1]}},
                      [[0]]]

    def make(j: int) -> tuple[str | None, bytes, bool]:
        event_id = f"b{j}"
        x = [0.25] * d
        kind = int(rng.integers(len(bad) + 4))
        if kind < len(bad):
            return event_id, orjson.dumps({"id": event_id, "x": x, "baseline": bad[kind]}), False
        if kind == len(bad):  # a 30-digit integer literal (orjson cannot write one)
            return event_id, b'{"id": "%s", "x": %s, "baseline": 1%s}' % (
                event_id.encode(), orjson.dumps(x), b"0" * 29), False
        if kind == len(bad) + 1:  # not among the event's actions
            return event_id, orjson.dumps({"id": event_id, "x": x, "actions": [1, 2],
                                           "baseline": 0}), False
        if kind == len(bad) + 2:  # null: no baseline
            return event_id, orjson.dumps({"id": event_id, "x": x, "baseline": None}), True
        return event_id, orjson.dumps({"id": event_id, "x": x, "actions": [0, k - 1],
                                       "baseline": k - 1}), True

    return [make(j) for j in range(count)]


class Daemon:
    """``python -m streamlearn serve`` as a child process with its own metrics port."""

    def __init__(self, bootstrap: str, topics: dict[str, str], checkpoint_dir: Path, log: Path,
                 metrics_port: int, problem: Problem, extra: tuple[str, ...] = ()) -> None:
        self.args = [sys.executable, "-m", "streamlearn", "serve", "--bootstrap", bootstrap,
                     "--topics-instances", topics["instances"], "--topics-feedback", topics["feedback"],
                     "--topics-decisions", topics["decisions"],
                     "--topics-dead-letter", topics["dead_letter"],
                     "--learner-n-actions", str(problem.k), "--learner-n-features", str(problem.d),
                     "--checkpoint-dir", str(checkpoint_dir), "--checkpoint-every-events", "10000",
                     "--metrics-port", str(metrics_port), "--progress-seconds", "0",
                     "--learner", "banditron", "--seed", "3",
                     # a fixed γ: the adaptive γ_t depends on the global round number t, hence on
                     # how the two partitions interleave, which timing decides (runs would differ)
                     "--exploration", "fixed", "--gamma", "0.05", *extra]
        self.log, self.metrics_port = log, metrics_port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                         env=env)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of ``/metrics`` (NaN when the daemon is not answering yet)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                        timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return math.nan
        wanted = f"{name}{{{labels}}}" if labels else name
        for line in text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.rsplit(" ", 1)[1])
        return math.nan

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


class Client:
    """Publishes, reads decisions and dead letters, answers with feedback."""

    def __init__(self, bootstrap: str, topics: dict[str, str]) -> None:
        self.topics = topics
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
        self.decisions = self._reader(bootstrap, topics["decisions"])
        self.dead = self._reader(bootstrap, topics["dead_letter"])
        self.first: dict[str, dict[str, Any]] = {}  # id → first decision seen
        self.n_decisions = 0
        self.dead_letters: list[dict[str, Any]] = []
        self.feedback_sent = 0

    @staticmethod
    def _reader(bootstrap: str, topic: str) -> KafkaConsumer:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
        deadline = time.monotonic() + 60
        while not consumer.partitions_for_topic(topic):
            if time.monotonic() > deadline:
                raise AssertionError(f"topic {topic} never appeared")
            time.sleep(0.2)
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        return consumer

    def send_instance(self, event_id: str | None, value: bytes) -> None:
        self.producer.send(self.topics["instances"], key=None if event_id is None else
                           event_id.encode("utf-8"), value=value)

    def send_feedback(self, event_id: str, reward: float, kind: str | None = None) -> None:
        value: dict[str, Any] = {"id": event_id, "reward": reward}
        if kind is not None:
            value["type"] = kind
        self.producer.send(self.topics["feedback"], key=event_id.encode("utf-8"),
                           value=orjson.dumps(value))
        self.feedback_sent += 1

    def flush(self) -> None:
        self.producer.flush()

    def read(self) -> None:
        for records in self.decisions.poll(timeout_ms=100, max_records=5000).values():
            for r in records:
                self.n_decisions += 1
                d = orjson.loads(r.value)
                self.first.setdefault(d["id"], d)
        for records in self.dead.poll(timeout_ms=0, max_records=5000).values():
            self.dead_letters.extend(orjson.loads(r.value) for r in records)

    def drain_dead_letters(self, timeout_s: float = 60.0) -> None:
        """Read the dead-letter topic up to its end offsets (a poll with no wait may return
        before the last fetch completes)."""
        parts = list(self.dead.assignment())
        end = self.dead.end_offsets(parts)
        deadline = time.monotonic() + timeout_s
        while any(self.dead.position(tp) < end[tp] for tp in parts):
            if time.monotonic() > deadline:
                raise AssertionError("the dead-letter topic was not read to its end")
            for records in self.dead.poll(timeout_ms=200, max_records=5000).values():
                self.dead_letters.extend(orjson.loads(r.value) for r in records)

    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str,
             detail: Callable[[], str] = lambda: "") -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; {detail()}")
            self.read()

    def close(self) -> None:
        self.producer.close()
        self.decisions.close()
        self.dead.close()


@dataclass
class RunResult:
    errors: list[float]  # error rate per window of the stream's own events
    first: dict[str, dict[str, Any]]
    dead_letters: list[dict[str, Any]]
    hostile: list[tuple[str | None, bytes, bool]]
    feedback_sent: int
    killed_at: int | None
    log: str


def play(bootstrap: str, topics: dict[str, str], workdir: Path, metrics_port: int, problem: Problem,
         *, block: int = 500, window: int = 2000, backlog_at: int = 14_000, backlog: int = 4000,
         kill: bool = False, hostile: int = 0, extra: tuple[str, ...] = (),
         baselines: bool = False, hostile_baseline: int = 0,
         feedback_types: tuple[tuple[str, float], ...] = ()) -> RunResult:
    """Run the whole stream in lockstep blocks; optionally SIGKILL the daemon once.

    At event ``backlog_at`` (a block boundary, every earlier feedback joined)
    the next ``backlog`` instances are published as one block — with ``kill``,
    while the daemon is down (killed just before, started just after) — so a
    run with and a run without the kill can be compared event by event.

    ``baselines``: every event carries the client's own choice (:meth:`Problem.baseline`);
    ``hostile_baseline``: that many instances valid but for their baseline are mixed in
    (:func:`hostile_baselines`); ``feedback_types``: each decision is answered with one
    feedback event per ``(type, factor)``, reward ``factor × 1[action == label]``.
    """
    kill_at = backlog_at if kill else None
    daemon = Daemon(bootstrap, topics, workdir / "ckpt", workdir / "serve.log", metrics_port,
                    problem, extra)
    client = Client(bootstrap, topics)
    odd = hostile_instances(problem.d, problem.k, hostile, seed=problem.seed) if hostile else []
    odd += hostile_baselines(problem.d, problem.k, hostile_baseline, seed=problem.seed + 2)
    positions = np.sort(np.random.default_rng(problem.seed + 1).choice(problem.n, len(odd),
                                                                       replace=False))
    bounds = sorted({*range(0, backlog_at, block), backlog_at,
                     *range(backlog_at + backlog, problem.n, block), problem.n})
    daemon.start()
    try:
        for lo, hi in itertools.pairwise(bounds):
            ids = [f"o{i}" for i in range(lo, hi)]
            if kill_at == lo:
                daemon.kill()
            valid_odd = []
            for i in range(lo, hi):
                for j in np.flatnonzero(positions == i):
                    event_id, value, valid = odd[j]
                    client.send_instance(event_id, value)
                    if valid and event_id is not None:
                        valid_odd.append(event_id)
                client.send_instance(ids[i - lo], problem.instance(
                    i, problem.baseline(i) if baselines else None))
            client.flush()
            if kill_at == lo:
                daemon.start()
            expect = ids + valid_odd
            client.wait(lambda expect=expect: all(e in client.first for e in expect), 180,
                        f"decisions for events {lo}..{hi}", daemon.tail)
            for i, event_id in zip(range(lo, hi), ids, strict=True):
                reward = float(client.first[event_id]["action"] == problem.y[i])
                for kind, factor in feedback_types or ((None, 1.0),):
                    client.send_feedback(event_id, factor * reward, kind)
            for event_id in valid_odd:
                for kind, _ in feedback_types or ((None, 1.0),):
                    client.send_feedback(event_id, 0.0, kind)
            client.flush()
            # joined when nothing waits any more (counters restart with the process; the gauge
            # of pending joins does not depend on it)
            client.wait(lambda: daemon.metric("streamlearn_pending_joins") == 0, 180,
                        f"feedback of events {lo}..{hi} joined", daemon.tail)
        code = daemon.stop()
        assert code == 0, daemon.tail()
        client.read()
        client.drain_dead_letters()
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.proc.kill()
        client.close()
    actions = np.array([client.first[f"o{i}"]["action"] for i in range(problem.n)])
    wrong = actions != problem.y
    errors = [float(wrong[lo:lo + window].mean()) for lo in range(0, problem.n, window)]
    return RunResult(errors, client.first, client.dead_letters, odd, client.feedback_sent,
                     kill_at, daemon.tail())

