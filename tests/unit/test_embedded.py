"""EmbeddedTransport: Kafka-like offsets plus a simulated caller answering decisions."""

from __future__ import annotations

import tracemalloc

import numpy as np
import orjson
import pytest

from streamlearn.errors import ConfigError, TransportError
from streamlearn.transport.embedded import RETAIN_BYTES, EmbeddedTransport, StreamSource
from streamlearn.transport.protocol import Transport

INST, FEED, DEC, DLQ = ("streamlearn.instances", "streamlearn.feedback",
                        "streamlearn.decisions", "streamlearn.dead-letter")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def decide(t: EmbeddedTransport, messages: list, action_of: object) -> None:
    for m in messages:
        if m.topic == INST:
            event = orjson.loads(m.value or b"")
            action = action_of(event)  # type: ignore[operator]
            t.produce(DEC, m.key, orjson.dumps({"id": event["id"], "action": action}))


def test_satisfies_the_transport_protocol() -> None:
    assert isinstance(EmbeddedTransport(), Transport)


def test_instances_have_offset_ids_sparse_features_and_labels() -> None:
    t = EmbeddedTransport(chunk=8, seed=2)
    batch = t.poll(100, 0.0)
    assert [m.offset for m in batch] == list(range(8))
    events = [orjson.loads(m.value or b"") for m in batch]
    assert [e["id"] for e in events] == [f"e{i}" for i in range(8)]
    assert [m.key for m in batch] == [f"e{i}".encode() for i in range(8)]
    assert all(set(e["x"]) == {"idx", "val"} and 0 <= e["label"] < 9 for e in events)
    assert t.n_actions == 9 and t.n_features == 400


def test_feedback_reward_is_one_iff_action_equals_label() -> None:
    clock = FakeClock()
    t = EmbeddedTransport(chunk=50, delay_mean_s=0.0, seed=3, clock=clock)
    labels = {}
    for m in t.poll(100, 0.0):
        event = orjson.loads(m.value or b"")
        labels[event["id"]] = event["label"]
        action = event["label"] if int(event["id"][1:]) % 2 == 0 else (event["label"] + 1) % 9
        t.produce(DEC, m.key, orjson.dumps({"id": event["id"], "action": action}))
    feedback = [orjson.loads(m.value or b"") for m in t.poll(1000, 0.0) if m.topic == FEED]
    assert len(feedback) == 50
    for fb in feedback:
        assert fb["reward"] == (1.0 if int(fb["id"][1:]) % 2 == 0 else 0.0)
    assert t.stats.decisions_received == 50 and t.stats.feedback_sent == 50
    assert t.stats.rewards_sent == 25


def test_feedback_waits_for_its_delay() -> None:
    clock = FakeClock()
    t = EmbeddedTransport(chunk=200, delay_mean_s=5.0, seed=4, max_instances=200, clock=clock)
    decide(t, t.poll(200, 0.0), lambda e: 0)
    assert t.stats.decisions_received == 200
    sent = []
    for step in range(1, 200):
        clock.now = 1000.0 + step * 0.5
        sent.append(t.stats.feedback_sent)
        t.poll(1000, 0.0)
    assert sent[0] < 40  # few of Exp(5 s) delays are below 0.5 s
    assert t.stats.feedback_sent == 200  # all within 100 s
    assert np.all(np.diff(sent) >= 0)


def test_drop_probability() -> None:
    t = EmbeddedTransport(chunk=2000, delay_mean_s=0.0, drop=0.25, seed=5)
    decide(t, t.poll(2000, 0.0), lambda e: 0)
    assert 400 < t.stats.dropped < 600  # Binomial(2000, 0.25): mean 500, sd 19
    t.poll(10_000, 0.0)
    assert t.stats.feedback_sent == 2000 - t.stats.dropped


def test_rate_limits_instances() -> None:
    clock = FakeClock()
    t = EmbeddedTransport(rate=100.0, chunk=10, clock=clock)
    assert t.poll(1000, 0.0) == []
    clock.now += 0.5
    assert len(t.poll(1000, 0.0)) == 50
    clock.now += 100.0  # a long pause releases at most 10 chunks at once
    assert len(t.poll(1000, 0.0)) == 100


def test_max_instances_caps_the_stream() -> None:
    t = EmbeddedTransport(chunk=64, max_instances=100)
    total = sum(len(t.poll(1000, 0.0)) for _ in range(10))
    assert total == 100


def test_backlog_mode_produces_as_fast_as_consumed() -> None:
    t = EmbeddedTransport(chunk=16)
    first = t.poll(10, 0.0)
    assert len(first) == 10
    assert t.end_offsets()[(INST, 0)] == 16  # no new chunk while a chunk is unread
    t.poll(10, 0.0)
    assert t.end_offsets()[(INST, 0)] == 32


def test_same_seed_same_stream_and_offset_determines_event() -> None:
    a, b = StreamSource(seed=9, block=100), StreamSource(seed=9, block=100)
    Xa, ya = a.take(50, 120)
    Xb, yb = b.take(0, 300)
    assert np.array_equal(Xa, Xb[50:170]) and np.array_equal(ya, yb[50:170])
    Xc, _ = StreamSource(seed=10, block=100).take(50, 120)
    assert not np.array_equal(Xa, Xc)


def test_commit_seek_and_trimming() -> None:
    t = EmbeddedTransport(chunk=10)
    t.poll(10, 0.0)
    t.commit({(INST, 0): 10})
    assert t.committed() == {(INST, 0): 10}
    with pytest.raises(TransportError, match="discarded"):
        t.seek({(INST, 0): 3})
    with pytest.raises(TransportError, match="not an assigned partition"):
        t.commit({("other", 0): 1})
    # seeking past the end fast-forwards: a restored checkpoint continues at its offset
    t2 = EmbeddedTransport(chunk=5)
    t2.seek({(INST, 0): 1000, (FEED, 0): 700})
    batch = t2.poll(100, 0.0)
    assert [orjson.loads(m.value or b"")["id"] for m in batch] == [f"e{i}" for i in range(1000, 1005)]


def test_dead_letters_kept_bounded_and_unknown_topic_rejected() -> None:
    t = EmbeddedTransport()
    for i in range(1500):
        t.produce(DLQ, None, str(i).encode())
    assert len(t.stats.dead_letters) == 1000 and t.stats.dead_letters[-1] == b"1499"
    with pytest.raises(TransportError, match="no topic"):
        t.produce("elsewhere", None, b"x")
    t.produce(DEC, b"e0", b"not json")
    assert t.stats.unparsable_decisions == 1
    t.close()
    with pytest.raises(TransportError, match="closed"):
        t.poll(1, 0.0)


def test_bad_parameters() -> None:
    with pytest.raises(ConfigError, match="drop"):
        EmbeddedTransport(drop=2.0)


@pytest.mark.needs_data
def test_real_dataset_source_cycles_with_fresh_permutations() -> None:
    source = StreamSource("optdigits", seed=1, block=1000)
    n = source._rows
    X, y = source.take(0, 2 * n)
    assert source.n_classes == 10 and X.shape == (2 * n, 64)
    assert np.array_equal(np.sort(y[:n]), np.sort(y[n:]))  # each pass covers every row once
    assert not np.array_equal(y[:n], y[n:])


def test_consumed_messages_do_not_accumulate_without_commits() -> None:
    """A long run without checkpoints keeps only RETAIN_BYTES of consumed messages per topic
    (plus what is unread), whatever its length: memory stays flat."""
    t = EmbeddedTransport(chunk=500, delay_mean_s=0.0, seed=6)
    polled = 0
    while polled < 40_000:
        batch = t.poll(500, 0.0)
        polled += sum(m.topic == INST for m in batch)
        ids = [m.key or b"" for m in batch if m.topic == INST]
        t.produce_many(DEC, ids, [b'{"id": "%s", "action": 0}' % k for k in ids])
    assert t.broker.log(INST, 0).base > 0  # the oldest consumed instances are gone
    for topic in (INST, FEED):
        log = t.broker.log(topic, 0)
        assert log.nbytes <= 2 * RETAIN_BYTES + 2 * 500 * 2_000, (topic, log.nbytes)
    t.seek({(INST, 0): t.positions()[(INST, 0)] - 100})  # a short seek back still works
    assert [m.offset for m in t.poll(1, 0.0) if m.topic == INST][:1] in ([], [polled - 100])


def test_committed_messages_are_trimmed_at_once() -> None:
    t = EmbeddedTransport(chunk=100, delay_mean_s=0.0)
    t.poll(100, 0.0)
    t.commit({(INST, 0): 100})
    assert t.broker.log(INST, 0).base == 100


def test_kept_messages_allocate_only_their_length() -> None:
    """orjson's bytes keep its 4 KB write buffer; the log keeps right-sized copies."""
    t = EmbeddedTransport(chunk=10, max_instances=0)
    tracemalloc.start()
    try:
        values = [orjson.dumps({"id": f"e{i}", "reward": 1.0, "ts": 1.0}) for i in range(2000)]
        t.broker.extend(FEED, 0, [None] * len(values), values, 0)
        del values
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 2000 * 400, held  # 60-byte messages: ~4 KB each when orjson's are kept


@pytest.mark.needs_data
def test_ohsumed_caller_holds_one_copy_and_plays_twenty_shuffled_passes() -> None:
    """The embedded OHSUMED requests are those of the 20-pass stream, in its order, from one
    copy of the queries."""
    from streamlearn.datasets.candidate_caller import CandidateCaller, make_caller
    from streamlearn.datasets.candidates import load_candidate_stream

    twenty = CandidateCaller(load_candidate_stream("ohsumed-candidates", passes=20, seed=4),
                             slots=2)
    caller = make_caller("ohsumed-candidates", None, "e", 0.2, 0.0, 4, 2)
    assert isinstance(caller, CandidateCaller) and len(caller.stream) == 106
    assert caller.instances(2200, 0.0) == twenty.instances(2200, 0.0)


@pytest.mark.parametrize("candidates", [False, True], ids=["fixed-actions", "candidate-sets"])
def test_a_restarted_embedded_daemon_gets_the_feedback_of_its_restored_pending_decisions(
        tmp_path: object, candidates: bool) -> None:
    """A new process's caller never saw the decisions the restored daemon awaits: all of them
    expired at the default reward (and counted against a ranker in rollout, an outside
    test). It answers them now, with the labels (or the placed candidates' rewards) the
    stream gives those requests."""
    from pathlib import Path

    from loop_helpers import settings_of

    from streamlearn.candidates.learners import CandidateLinUCB
    from streamlearn.learners import Banditron, FixedGamma
    from streamlearn.service.daemon import Daemon

    clock = FakeClock()
    shape = ({"candidates_enabled": True, "candidates_shared_features": 5,
              "candidates_candidate_features": 5, "learner_n_actions": 2,
              "learner_n_features": 10} if candidates
             else {"learner_n_actions": 9, "learner_n_features": 400})
    settings = settings_of(checkpoint_dir=str(Path(str(tmp_path))), limits_poll_timeout_seconds=0.0,
                           **shape)

    def daemon() -> Daemon:
        transport = EmbeddedTransport(
            chunk=100, delay_mean_s=30.0, seed=5, clock=clock, max_instances=600,
            dataset="synthetic-candidates" if candidates else "synnonsep", slots=2)
        learner = (CandidateLinUCB(5, 5, seed=1) if candidates
                   else Banditron(9, 400, FixedGamma(0.1), seed=1))
        d = Daemon(settings, transport, learner, wall_clock=clock)
        d.restore()
        return d

    first = daemon()
    for _ in range(10):
        first.step()
    pending = first.pending
    assert pending > 100  # 30 s of delay: nothing answered yet
    first.checkpoint(final=True)
    first.close()
    again = daemon()
    assert again.pending == pending
    for _ in range(80):  # 400 s: past (nearly) every delay, inside the 600 s join window
        clock.now += 5.0
        again.step()
    feedback = again.counters.feedback
    assert feedback["expired"] == 0 and feedback["late"] == 0
    # the first process's pending decisions got their feedback from the new caller (they
    # waited, to expire 600 s on at the default reward), and so did the new ones
    assert again.pending == 0
    assert feedback["joined"] == 2 * 600 * (2 if candidates else 1)  # one join per slot
    assert again.transport.stats.foreign_decisions == 0  # type: ignore[attr-defined]
