"""Acceptance: hostile messages interleaved with a valid stream through a real broker.

Two runs of the same valid stream, in lockstep (a block of instances is fully
decided before its feedback is sent, and fully joined before the next block),
so the learner's path does not depend on timing: one clean, one with more
than 1,000 hostile messages (hypothesis-generated and hand-written) mixed in.
The daemon must survive, put every hostile message on the dead-letter topic
with its reason, and end with the same weights as the clean run.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from daemon_harness import Caller, make_topics, producer, publish_instances, read_all, transport
from daemon_harness import wait_until as wait
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from loop_helpers import settings_of

from streamlearn.datasets.synthetic import synthetic_stream
from streamlearn.events import decode_feedback, decode_instances
from streamlearn.learners.banditron import Banditron
from streamlearn.learners.exploration import FixedGamma
from streamlearn.service.daemon import Daemon
from streamlearn.transport.protocol import Message

pytestmark = pytest.mark.integration

N, BLOCK, D, K = 6_000, 500, 400, 9
BIG = 16 * 1024 * 1024
X, Y = synthetic_stream(N, noise=0.05, seed=13)


def dense(n: int, bad: Any = None) -> list[Any]:
    row: list[Any] = [0.0] * n
    if bad is not None:
        row[n // 2] = bad
    return row


def hand_written() -> tuple[list[tuple[bytes, bytes, str]], list[tuple[bytes, bytes, str]]]:
    """(key, value, reason) of hostile instances and feedback, one of each kind at least."""
    inst = [
        (b"h", b"\xff\xfe\xfd", "invalid_utf8"),
        (b"h", b'{"id": "h", "x": [1, 2,', "invalid_json"),
        (b"h", b'{"id": "h", "x": [NaN]}', "invalid_json"),
        (b"h", b"[" * 100_000 + b"]" * 100_000, "nesting_too_deep"),
        (b"h", b'{"id": "big", "x": [], "pad": "' + b"A" * (10 * 1024 * 1024) + b'"}',
         "too_large"),
        (b"h", orjson.dumps({"id": "h1", "x": dense(D, "NaN")}), "non_finite"),
        (b"h", orjson.dumps({"id": "h2", "x": dense(D - 1)}), "wrong_dimension"),
        (b"h", orjson.dumps({"id": "h3", "x": dense(D), "actions": [-1, 2]}), "bad_actions"),
        (b"h", orjson.dumps({"id": "h4", "x": dense(D), "actions": [K]}), "bad_actions"),
        (b"h", orjson.dumps({"id": "h5", "x": dense(D), "label": -3}), "bad_label"),
        (b"h", orjson.dumps({"id": 12, "x": dense(D)}), "bad_id_type"),
        (b"h", orjson.dumps({"x": dense(D)}), "missing_id"),
        (b"h", orjson.dumps({"id": "i" * 1000, "x": dense(D)}), "id_too_long"),
        (b"h", b"42", "not_object"),
    ]
    fb = [
        (b"h", orjson.dumps({"id": "e1", "reward": -0.5}), "bad_reward"),
        (b"h", orjson.dumps({"id": "e1", "reward": 7}), "bad_reward"),
        (b"h", b'{"id": "e1", "reward": Infinity}', "invalid_json"),
        (b"h", orjson.dumps({"id": "nobody", "reward": 1.0}), "unknown_id"),
    ]
    return inst, fb


INT64 = st.integers(-(2**63), 2**63 - 1)
instance_candidates = st.one_of(
    st.binary(max_size=200),
    st.fixed_dictionaries(
        {"id": st.one_of(st.text(max_size=3).map(lambda s: f"g{s}"), INT64, st.none())},
        optional={"x": st.one_of(st.lists(st.floats(), max_size=5), st.text(max_size=5),
                                 st.fixed_dictionaries({"idx": st.lists(st.integers(-5, 500)),
                                                        "val": st.lists(st.floats())})),
                  "actions": st.lists(st.integers(-3, 12), max_size=3),
                  "label": st.integers(-3, 12), "ts": st.text(max_size=3)},
    ).map(orjson.dumps),  # orjson writes NaN and inf as null
)
feedback_candidates = st.one_of(
    st.binary(max_size=100),
    st.fixed_dictionaries({"id": st.text(min_size=1, max_size=4).map(lambda s: f"u{s}"),
                           "reward": st.one_of(st.floats(1.01, 1e9), st.floats(-1e9, -0.01),
                                               st.text(max_size=3), st.none(),
                                               st.floats(0, 1))}).map(orjson.dumps),
)


def expected_reason(topic: str, value: bytes) -> str:
    """What the decoder says, or the join's verdict for valid feedback with an unknown id."""
    msg = [Message(topic, 0, 0, None, value, 0)]
    if topic == "instances":
        _batch, rejected = decode_instances(msg, D, K)
        return rejected[0].reason if rejected else "accepted"
    _fb, rejected = decode_feedback(msg)
    return rejected[0].reason if rejected else "unknown_id"


def n_invalid(counters: Any) -> int:
    """Rejections counted so far (read from the test thread while the daemon runs)."""
    try:
        return sum(n for per in list(counters.invalid.values()) for n in list(per.values()))
    except RuntimeError:  # changed size during iteration: ask again
        return -1


def run(bootstrap: str, ckpt: Path, hostile_inst: list[tuple[bytes, bytes, str]],
        hostile_fb: list[tuple[bytes, bytes, str]]) -> tuple[Daemon, dict[str, Any]]:
    topics = make_topics(bootstrap, configs={"max.message.bytes": str(BIG)})
    settings_ = settings_of(checkpoint_dir=str(ckpt), join_window_seconds=600.0,
                               join_backward_window_seconds=1.0, limits_poll_max_records=200)
    daemon = Daemon(settings_, transport(bootstrap, topics),
                    Banditron(K, D, FixedGamma(0.05), seed=3))
    caller = Caller(bootstrap, topics, Y)
    caller.hold.set()
    caller.start()
    runner = threading.Thread(target=daemon.run, name="daemon")
    runner.start()
    prod = producer(bootstrap, max_request_size=BIG)
    sent: dict[tuple[str, int, int], str] = {}  # (topic, partition, offset) → expected reason
    inst_chunks = np.array_split(np.arange(len(hostile_inst)), N // BLOCK)
    fb_chunks = np.array_split(np.arange(len(hostile_fb)), N // BLOCK)
    c = daemon.counters
    try:
        for b in range(N // BLOCK):
            block = range(b * BLOCK, (b + 1) * BLOCK)
            publish_instances(prod, topics["instances_topic"], X, Y, block)
            futures = [(prod.send(topics["instances_topic"], key=k, value=v), r)
                       for k, v, r in (hostile_inst[i] for i in inst_chunks[b])]
            # a repeated instance id (of the previous block) is a duplicate
            if b:
                i = (b - 1) * BLOCK + 7
                futures.append((prod.send(topics["instances_topic"], key=f"e{i}".encode(),
                                          value=orjson.dumps({"id": f"e{i}", "x": dense(D)})),
                                "duplicate_id"))
            prod.flush()
            wait(lambda block=block: all(f"e{i}" in caller.first for i in block), 120,
                 f"decisions of block {b}")
            caller.hold.clear()
            wait(lambda b=b: c.feedback["joined"] == (b + 1) * BLOCK, 120, f"joins of block {b}",
                 lambda: f"counters {c.to_json()}")
            caller.hold.set()
            futures += [(prod.send(topics["feedback_topic"], key=k, value=v), r)
                        for k, v, r in (hostile_fb[i] for i in fb_chunks[b])]
            # the same feedback again for an id of this block: a duplicate, no effect
            i = b * BLOCK + 3
            futures.append((prod.send(topics["feedback_topic"], key=f"e{i}".encode(),
                                      value=orjson.dumps({"id": f"e{i}", "reward": 1.0})),
                            "duplicate_id"))
            prod.flush()
            for future, reason in futures:
                meta = future.get(timeout=30)
                sent[(meta.topic, meta.partition, meta.offset)] = reason
            total = len(sent)
            wait(lambda total=total: n_invalid(c) == total, 60, f"dead letters of block {b}",
                 lambda: f"counters {c.to_json()}")
        assert runner.is_alive()  # the daemon never exited
    finally:
        prod.close()
        daemon.request_stop()
        runner.join(60)
        caller.stop()
        daemon.transport.close()
    assert caller.error is None and caller.mismatches == []
    letters = [orjson.loads(r.value) for r in read_all(bootstrap, topics["dead_letter_topic"])]
    return daemon, {"letters": letters, "sent": sent, "topics": topics}


def generate(strategy: st.SearchStrategy[bytes], n: int, seed_value: int) -> list[bytes]:
    """``n`` seeded hypothesis examples of ``strategy`` (hypothesis as a generator)."""
    out: list[bytes] = []

    @seed(seed_value)
    @settings(max_examples=n, phases=[Phase.generate], database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value: bytes) -> None:
        out.append(value)

    collect()
    return out


def test_hostile_messages_are_dead_lettered_and_change_nothing(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    gen_inst = generate(instance_candidates, 600, 1)
    gen_fb = generate(feedback_candidates, 400, 2)
    inst, fb = hand_written()
    inst += [(b"g", v, expected_reason("instances", v)) for v in gen_inst]
    for n, v in enumerate(gen_fb):
        reason = expected_reason("feedback", v)
        if reason == "unknown_id":  # valid feedback: give it a unique id nobody decided
            v = orjson.dumps({**orjson.loads(v), "id": f"unknown-{n}"})
        fb.append((b"g", v, reason))
    inst = [m for m in inst if m[2] != "accepted"]  # a generated value can be a valid instance
    assert all(r == expected_reason("instances", v) for _, v, r in inst)  # hand-written agree
    assert len(inst) + len(fb) + 2 * (N // BLOCK) >= 1000

    clean, _ = run(kafka_bootstrap, tmp_path / "clean", [], [])
    dirty, out = run(kafka_bootstrap, tmp_path / "dirty", inst, fb)

    letters, sent, topics = out["letters"], out["sent"], out["topics"]
    got = {(d["topic"], d["partition"], d["offset"]): d["reason"] for d in letters}
    names = {"instances": topics["instances_topic"], "feedback": topics["feedback_topic"]}
    assert len(letters) == len(got) == len(sent)  # one dead letter per hostile message
    assert got == sent, Counter(sent.values()) - Counter(got.values())
    print(f"{len(sent)} hostile messages, reasons {sorted(Counter(sent.values()).items())}")
    assert set(names.values()) == {t for t, _, _ in got}
    big = next(d for d in letters if d["reason"] == "too_large")
    assert big["truncated"] and big["size"] > 10 * 1024 * 1024
    np.testing.assert_allclose(dirty.learner.state()[0]["learner.weights"],
                               clean.learner.state()[0]["learner.weights"], rtol=0, atol=1e-9)
    assert dirty.counters.feedback["joined"] == clean.counters.feedback["joined"] == N
    assert dirty.counters.instances == clean.counters.instances == N
