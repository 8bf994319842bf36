"""Acceptance of candidate mode: candidate-set requests end to end through the real broker.

An outside client, written from docs/kafka.md only (no streamlearn code on its
side), publishes 20,000 requests — 1 to 50 candidates each, 1 to 3 slots, the
shared context and candidate features in the dense, sparse and named forms
(every fourth request all dense), odd Unicode ids, large finite values — with
malformed requests mixed in (one of each kind). It answers every decision once,
with a reward per placed candidate or one reward for the request.
``streamlearn serve --candidates-enabled true`` is SIGKILLed twice mid-stream and
restarted, then stopped with SIGTERM.

Checked: every valid request got a decision whose placed candidates are among
those it sent (as many as its slots, distinct), re-emitted decisions are
byte-identical, the final checkpoint applied every answered slot exactly once
(count and id checksum over the (request, candidate) pairs), and each malformed
request reached the dead-letter topic with its specific reason; the experience
log holds every answered slot once and the rankers retrained on it.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from daemon_harness import make_topics, producer, read_all, serve_crashable, wait_until
from kafka import KafkaConsumer, TopicPartition
from test_crash_safety import committed_everything

from streamlearn.durability.experience import read_experience
from streamlearn.service.counters import id_checksum
from streamlearn.service.retraining import read_ranker_state
from streamlearn.snapshot import read_snapshot

pytestmark = pytest.mark.integration

N = 20_000
D_X, D_C = 4, 6
RATE = 2_000  # requests per second offered
KILLS = 2
MALFORMED = {  # id → (request body without its id, the reason it must be dead-lettered with)
    "bad-empty": ({"x": [0.0] * D_X, "candidates": []}, "bad_candidates"),
    "bad-dup": ({"x": [0.0] * D_X, "candidates": [{"id": "a", "x": [1.0] * D_C},
                                                  {"id": "a", "x": [2.0] * D_C}]},
                "duplicate_candidate_id"),
    "bad-dim": ({"x": [0.0] * D_X, "candidates": [{"id": "a", "x": [1.0] * (D_C - 1)}]},
                "wrong_dimension"),
    "bad-many": ({"x": [0.0] * D_X, "candidates": [{"id": f"c{i}", "x": [1.0] * D_C}
                                                   for i in range(61)]}, "too_many_candidates"),
    "bad-slots": ({"x": [0.0] * D_X, "candidates": [{"id": "a", "x": [1.0] * D_C}], "slots": 2},
                  "bad_slots"),
    "bad-cid": ({"x": [0.0] * D_X, "candidates": [{"id": "", "x": [1.0] * D_C}]},
                "bad_candidate_id"),
}


def pair(request: str, candidate: str) -> str:
    return orjson.dumps([request, candidate]).decode()  # docs/kafka.md: how slots are counted


def form(x: np.ndarray, kind: int) -> Any:
    if kind == 0:
        return x.tolist()
    nz = np.flatnonzero(x)
    if kind == 1:
        return {"idx": nz.tolist(), "val": x[nz].tolist()}
    return {f"f\u00e9{j}": float(x[j]) for j in nz.tolist()}  # named, hashed by the daemon


def make_requests(seed: int = 11) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for n in range(N):
        k = int(rng.integers(1, 51))
        scale = 1e9 if n % 997 == 0 else 1.0  # large, finite, inside the limits
        items = rng.normal(size=(k, D_C)) * (rng.random((k, D_C)) < 0.6) * scale
        out.append({"id": f"req-{n}-\u00fc\U0001f642",
                    "x": form(rng.normal(size=D_X), n % 3),
                    # every fourth request all dense (the decoder's fast path), the rest mixed
                    "candidates": [{"id": f"it\u00e9m-{n}-{j}",
                                    "x": form(items[j], 0 if n % 4 == 1 else (n + j) % 3)}
                                   for j in range(k)],
                    "slots": int(rng.integers(1, min(k, 3) + 1))})
    return out


class Client(threading.Thread):
    """Reads decisions, answers each request once: per-candidate rewards or one reward."""

    def __init__(self, bootstrap: str, topics: dict[str, str],
                 requests: dict[str, dict[str, Any]]) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topics, self.requests = bootstrap, topics, requests
        self.first: dict[str, bytes] = {}
        self.mismatches: list[str] = []
        self.applied_pairs: list[str] = []
        self.answered = 0
        self.n_decisions = 0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:
            self.error = exc

    def _run(self) -> None:
        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                 group_id=None)
        topic = self.topics["decisions_topic"]
        while not consumer.partitions_for_topic(topic):
            time.sleep(0.2)
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or []]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        prod = producer(self.bootstrap)
        rng = np.random.default_rng(3)
        while not self.stop_event.is_set():
            for records in consumer.poll(timeout_ms=50, max_records=2000).values():
                for r in records:
                    self.n_decisions += 1
                    decision = orjson.loads(r.value)
                    rid = decision["id"]
                    if rid in self.first:
                        if self.first[rid] != r.value:
                            self.mismatches.append(rid)
                        continue
                    self.first[rid] = r.value
                    placed = [c["id"] for c in decision["candidates"]]
                    if self.answered % 4 == 0:
                        value: dict[str, Any] = {"id": rid, "reward": float(rng.random() < 0.5)}
                    else:
                        value = {"id": rid, "rewards": {c: float(rng.random() < 0.3)
                                                        for c in placed}}
                    prod.send(self.topics["feedback_topic"], key=r.key, value=orjson.dumps(value))
                    self.applied_pairs += [pair(rid, c) for c in placed]
                    self.answered += 1
            prod.flush()
        prod.close()
        consumer.close()


def test_candidate_requests_end_to_end_with_kills(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = make_topics(kafka_bootstrap)
    ckpt, log = tmp_path / "ckpt", tmp_path / "serve.log"
    requests = make_requests()
    by_id = {r["id"]: r for r in requests}
    client = Client(kafka_bootstrap, topics, by_id)
    client.start()

    def publish() -> None:
        prod = producer(kafka_bootstrap)
        bad = iter(MALFORMED.items())
        for lo in range(0, N, RATE // 10):
            for r in requests[lo:lo + RATE // 10]:
                prod.send(topics["instances_topic"], key=r["id"].encode(), value=orjson.dumps(r))
            item = next(bad, None)
            if item is not None:
                bid, (body, _) = item
                prod.send(topics["instances_topic"], key=bid.encode(),
                          value=orjson.dumps({"id": bid, **body}))
            time.sleep(0.1)
        prod.flush()
        prod.close()

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    extra = ("--candidates-enabled", "true", "--candidates-shared-features", str(D_X),
             "--candidates-candidate-features", str(D_C), "--candidates-max-candidates", "60",
             "--candidates-max-slots", "3", "--retrain-every-events", "8000")
    proc = serve_crashable(kafka_bootstrap, topics, ckpt, log, *extra)
    rng = np.random.default_rng(20261201)
    kills = []
    for mark in np.sort(rng.uniform(0.2, 0.8, size=KILLS)) * N:
        wait_until(lambda mark=mark: len(client.first) >= mark, 180, "the stream to progress",
                   lambda: log.read_text()[-2000:])
        time.sleep(float(rng.uniform(0.0, 1.0)))
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        kills.append(len(client.first))
        proc = serve_crashable(kafka_bootstrap, topics, ckpt, log, *extra)
    publisher.join(120)
    try:
        wait_until(lambda: len(client.first) == N, 300, "a decision for every request",
                   lambda: f"{len(client.first)} decided; {log.read_text()[-2000:]}")
        wait_until(lambda: committed_everything(kafka_bootstrap, topics), 120,
                   "the daemon to commit all input", interval_s=1.0)
        wait_until(lambda: read_ranker_state(ckpt / "rankers").get("history"), 120,
                   "a retrain on the logged slates", interval_s=0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        client.stop_event.set()
        client.join(30)
    assert code == 0, log.read_text()[-3000:]
    assert client.error is None
    print(f"decided requests at each kill: {kills}; {client.n_decisions} decision messages")
    assert max(kills) < N

    # every request one decision, inside the set it sent; re-emitted ones identical
    assert sorted(client.first) == sorted(by_id)
    assert client.mismatches == [] and client.n_decisions > N
    for rid, value in client.first.items():
        d, sent = orjson.loads(value), by_id[rid]
        placed = [c["id"] for c in d["candidates"]]
        assert len(placed) == sent["slots"] == len(set(placed))
        assert set(placed) <= {c["id"] for c in sent["candidates"]}
        assert sorted(d["ranking"]) == sorted(c["id"] for c in sent["candidates"])

    # every answered slot applied exactly once (the final checkpoint's exact counters)
    _arrays, meta = read_snapshot(sorted(ckpt.glob("ckpt-*"))[-1])
    counters = meta["counters"]
    assert counters["feedback"]["joined"] == len(client.applied_pairs)
    assert int(counters["applied_checksum"]) == id_checksum(client.applied_pairs)
    for outcome in ("late", "expired", "unknown", "duplicate"):
        assert counters["feedback"][outcome] == 0, counters
    assert counters["instances"] == counters["decisions"] == N

    # each malformed request on the dead-letter topic with its reason
    letters = {orjson.loads(r.value)["id"]: orjson.loads(r.value)["reason"]
               for r in read_all(kafka_bootstrap, topics["dead_letter_topic"])}
    assert letters == {bid: reason for bid, (_, reason) in MALFORMED.items()}

    # the experience log holds every answered slot exactly once, across the kills, and the
    # rankers were retrained on its requests as multi-document queries
    logged = read_experience(ckpt / "experience").ids
    assert len(logged) == len(set(logged)) and sorted(logged) == sorted(client.applied_pairs)
    history = read_ranker_state(ckpt / "rankers")["history"]
    assert history and history[-1]["documents_per_query"] > 1.5
    assert {"adarank", "ndcg_boost"} <= set(history[-1]["rankers"])
    assert "Traceback" not in log.read_text()
