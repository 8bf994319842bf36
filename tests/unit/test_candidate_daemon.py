"""The daemon in candidate mode, over the in-memory transport: decisions inside the sets sent,
per-slot feedback applied once across a crash, every malformed part dead-lettered."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_helpers import Clock, decisions_by_id, drain, settings_of

from streamlearn.candidates.learners import CandidateLinUCB
from streamlearn.candidates.sets import CandidateSets
from streamlearn.candidates.slates import SlateMixture
from streamlearn.engine.candidates import SLOT_COLUMNS, CandidateEngine, Journaled, pair_id
from streamlearn.join.aggregate import capped, median
from streamlearn.join.pending import JoinSettings, Outcome, PendingJoins
from streamlearn.service.counters import id_checksum
from streamlearn.service.daemon import Daemon
from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport

D_X, D_C = 3, 4
THETA = np.random.default_rng(5).normal(size=(D_X, D_C))



def features(x: np.ndarray, form: int) -> Any:
    """The same vector in the dense, sparse or named form."""
    if form == 0:
        return x.tolist()
    nz = np.flatnonzero(x)
    if form == 1:
        return {"idx": nz.tolist(), "val": x[nz].tolist()}
    return {"idx": nz.tolist(), "val": x[nz].tolist()}  # named features hash: keep exact here


class Caller:
    """Publishes requests (1–12 candidates, 1–3 slots, mixed forms), answers per slot."""

    def __init__(self, broker: InMemoryBroker, seed: int = 1) -> None:
        self.writer = InMemoryTransport(broker=broker, partitions=2, group_id="caller")
        self.broker, self.rng = broker, np.random.default_rng(seed)
        self.sent: dict[str, dict[str, Any]] = {}
        self.answered: set[str] = set()
        self.applied_pairs: list[str] = []

    def publish(self, lo: int, hi: int, ts: float) -> None:
        for n in range(lo, hi):
            k = int(self.rng.integers(1, 13))
            x = self.rng.normal(size=D_X)
            items = self.rng.normal(size=(k, D_C)) * (self.rng.random((k, D_C)) < 0.7)
            cands = [{"id": f"item-{n}-{j}\u00e9", "x": features(items[j], j % 2)}
                     for j in range(k)]
            request = {"id": f"r{n}", "x": x.tolist(), "candidates": cands, "ts": ts,
                       "slots": int(self.rng.integers(1, min(k, 3) + 1))}
            p = 1 / (1 + np.exp(-(x @ THETA @ items.T)))
            self.sent[request["id"]] = {"request": request, "p": dict(
                zip([c["id"] for c in cands], p.tolist(), strict=True))}
            self.writer.append_instance(request["id"].encode(), orjson.dumps(request))

    def answer(self, ts: float, drop_every: int = 0) -> None:
        for m in self.broker.messages("decisions"):
            d = orjson.loads(m.value or b"")
            if d["id"] in self.answered:
                continue
            self.answered.add(d["id"])
            n = int(d["id"][1:])
            if drop_every and n % drop_every == 0:
                continue
            p = self.sent[d["id"]]["p"]
            placed = [c["id"] for c in d["candidates"]]
            rewards = {c: float(self.rng.random() < p[c]) for c in placed}
            if n % 3 == 0:  # one reward for the whole request
                value: dict[str, Any] = {"id": d["id"], "reward": rewards[placed[0]], "ts": ts}
                rewards = dict.fromkeys(placed, rewards[placed[0]])
            else:  # a reward per slot; zero rewards left out (they are the default)
                value = {"id": d["id"], "rewards": {c: r for c, r in rewards.items() if r} or
                         {placed[0]: 0.0}, "ts": ts}
            self.writer.append_feedback(m.key, orjson.dumps(value))
            self.applied_pairs += [pair_id(d["id"], c) for c in placed]


def make_daemon(broker: InMemoryBroker, tmp: Path | None, clock: Clock,
                **kw: Any) -> Daemon:
    base: dict[str, Any] = {
        "checkpoint_dir": None if tmp is None else str(tmp), "checkpoint_every_events": 250,
        "checkpoint_every_seconds": 1e9, "join_window_seconds": 5.0,
        "limits_poll_timeout_seconds": 0.0, "candidates_enabled": True,
        "candidates_shared_features": D_X, "candidates_candidate_features": D_C,
        "candidates_max_candidates": 20, "candidates_max_slots": 3,
        "learner_n_actions": 3, "learner_n_features": D_X + 2 * D_C}
    daemon = Daemon(settings_of(**{**base, **kw}),
                             InMemoryTransport(broker=broker, partitions=2),
                             CandidateLinUCB(D_X, D_C, seed=3), wall_clock=clock)
    daemon.restore()
    return daemon




def run(broker: InMemoryBroker, daemon: Daemon, caller: Caller, clock: Clock,
        blocks: int, crash_at: int | None = None, restart: Any = None,
        drop_every: int = 0) -> Daemon:
    for b in range(blocks):
        clock.t += 1.0
        caller.publish(b * 100, (b + 1) * 100, clock.t)
        drain(daemon)
        if b == crash_at:  # decided (and journaled), not yet answered: the process dies
            daemon = restart()  # dropped without a final checkpoint
            drain(daemon)
        caller.answer(clock.t, drop_every)
        drain(daemon)
    daemon.step()
    clock.t += 10.0
    daemon.step()
    return daemon


def check_decision(d: dict[str, Any], request: dict[str, Any]) -> None:
    sent = [c["id"] for c in request["candidates"]]
    placed = [c["id"] for c in d["candidates"]]
    assert len(placed) == request["slots"] and len(set(placed)) == len(placed)
    assert set(placed) <= set(sent)
    assert sorted(d["ranking"]) == sorted(sent)
    probs = [c["prob"] for c in d["candidates"]]
    assert all(0 < p <= 1 for p in probs)
    assert d["prob"] == pytest.approx(float(np.prod(probs)))


def test_every_request_gets_one_decision_inside_its_set_and_feedback_is_applied_per_slot(
        tmp_path: Path) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    caller = Caller(broker)
    daemon = run(broker, make_daemon(broker, tmp_path, clock), caller, clock, 12, drop_every=7)
    decisions = decisions_by_id(broker)
    assert sorted(decisions) == sorted(caller.sent)
    assert all(len(v) == 1 for v in decisions.values())
    for rid, (d,) in decisions.items():
        check_decision(d, caller.sent[rid]["request"])
    c = daemon.counters
    placed = sum(len(d[0]["candidates"]) for d in decisions.values())
    assert c.feedback["joined"] == len(caller.applied_pairs)
    assert c.feedback["joined"] + c.feedback["expired"] == placed  # dropped ones expire
    assert c.applied_checksum == id_checksum(caller.applied_pairs)
    assert broker.messages("dead-letter") == []
    assert len(daemon.engine.slates) == 0 and len(daemon.join) == 0


def test_learning_from_the_loop_beats_playing_at_random(tmp_path: Path) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    caller = Caller(broker, seed=2)
    run(broker, make_daemon(broker, None, clock), caller, clock, 30)
    decisions = decisions_by_id(broker)
    late = [(rid, d[0]) for rid, d in decisions.items() if int(rid[1:]) >= 2000]
    chosen = np.mean([caller.sent[r]["p"][d["candidates"][0]["id"]] for r, d in late])
    uniform = np.mean([np.mean(list(caller.sent[r]["p"].values())) for r, _ in late])
    best = np.mean([max(caller.sent[r]["p"].values()) for r, _ in late])
    assert chosen > uniform + 0.5 * (best - uniform)  # most of the way to the best candidate


@pytest.mark.parametrize("crash_at", [3, 6])
def test_a_crash_re_emits_identical_decisions_and_applies_each_slot_feedback_once(
        tmp_path: Path, crash_at: int) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    caller = Caller(broker)
    daemon = make_daemon(broker, tmp_path, clock)
    daemon = run(broker, daemon, caller, clock, 12, crash_at=crash_at,
                 restart=lambda: make_daemon(broker, tmp_path, clock))
    decisions = decisions_by_id(broker)
    assert sorted(decisions) == sorted(caller.sent)
    repeated = {k: v for k, v in decisions.items() if len(v) > 1}
    assert repeated  # the crash made the daemon re-read requests
    assert all(all(d == v[0] for d in v) for v in repeated.values())
    daemon.checkpoint(final=True)
    restored = make_daemon(broker, tmp_path, clock)
    c = restored.counters
    assert c.feedback["joined"] == len(caller.applied_pairs)
    assert c.applied_checksum == id_checksum(caller.applied_pairs)
    assert restored.learner.n_requests_ == len(caller.sent)
    assert np.isfinite(restored.learner.A_inv_).all()



@pytest.mark.parametrize("crash_at", [None, 4])
def test_the_request_log_holds_every_candidate_of_every_request_once_across_a_crash(
        tmp_path: Path, crash_at: int | None) -> None:
    """Candidate mode logs whole requests for off-policy estimates: after a run (and a crash
    that re-reads requests), every candidate of every held-out request (the id-hash share
    ``retrain.holdout_fraction`` a retrain judges on) is in the request log exactly once, the
    placed ones at their slot with the published propensity."""
    from streamlearn.durability.experience import read_experience
    from streamlearn.evaluation.policies import holdout_mask

    broker, clock = InMemoryBroker(2), Clock()
    caller = Caller(broker)
    experience = str(tmp_path / "experience")
    daemon = make_daemon(broker, tmp_path, clock, experience_dir=experience)
    daemon = run(broker, daemon, caller, clock, 8, crash_at=crash_at,
                 restart=lambda: make_daemon(broker, tmp_path, clock, experience_dir=experience))
    daemon.checkpoint(final=True)
    logged = read_experience(tmp_path / "experience" / "requests")
    assert len(set(logged.ids)) == len(logged.ids)  # once each
    held = [r for r, h in zip(caller.sent, holdout_mask(list(caller.sent), 0.2), strict=True)
            if h]
    assert 0.1 * len(caller.sent) < len(held) < 0.3 * len(caller.sent)
    expected = {pair_id(r, c["id"]) for r in held for c in caller.sent[r]["request"]["candidates"]}
    assert set(logged.ids) == expected
    placed = {pair_id(d["id"], c["id"]): (slot, c["prob"])
              for d in (v[0] for v in decisions_by_id(broker).values()) if d["id"] in set(held)
              for slot, c in enumerate(d["candidates"])}
    at = {i: j for j, i in enumerate(logged.ids)}
    for pid, (slot, prob) in placed.items():
        assert logged.actions[at[pid]] == slot
        assert logged.probs[at[pid], slot] == pytest.approx(prob, rel=1e-6)
    assert int((logged.actions >= 0).sum()) == len(placed)
    assert logged.gamma.min() >= 0 and logged.gamma.max() <= 1


HOSTILE_REQUESTS = [
    ({"candidates": []}, "bad_candidates"),
    ({"candidates": "abc"}, "bad_candidates"),
    ({"candidates": [{"id": "a", "x": [0.0] * D_C}, {"id": "a", "x": [1.0] * D_C}]},
     "duplicate_candidate_id"),
    ({"candidates": [{"id": "a", "x": [0.0] * (D_C + 1)}]}, "wrong_dimension"),
    ({"candidates": [{"id": f"c{i}", "x": [0.0] * D_C} for i in range(21)]},
     "too_many_candidates"),
    ({"candidates": [{"id": 7, "x": [0.0] * D_C}]}, "bad_candidate_id"),
    ({"candidates": [{"id": "a", "x": [0.0] * D_C}], "slots": 2}, "bad_slots"),
    ({"candidates": [{"id": "a", "x": [1e300] * D_C}]}, "value_out_of_range"),
    ({"x": [0.0, 0.0], "candidates": [{"id": "a", "x": [0.0] * D_C}]}, "wrong_dimension"),
]


def test_malformed_candidate_sets_and_feedback_reach_the_dead_letter_topic(
        tmp_path: Path) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    caller = Caller(broker)
    daemon = run(broker, make_daemon(broker, tmp_path, clock), caller, clock, 2)
    before = daemon.learner.A_inv_.copy()
    for n, (change, _) in enumerate(HOSTILE_REQUESTS):
        value = {"id": f"bad{n}", "x": [0.0] * D_X, **change}
        caller.writer.append_instance(None, orjson.dumps(value))
    hostile_feedback = [({"id": "r1", "reward": 2}, "bad_reward"),
                        ({"id": "r1", "rewards": {"x": -1}}, "bad_reward"),
                        ({"id": "r1", "reward": 1, "rewards": {"x": 1}}, "bad_reward"),
                        ({"id": "r2", "rewards": []}, "bad_reward"),
                        ({"id": "r4", "reward": 1.0}, "duplicate_id")]
    for value, _ in hostile_feedback:
        caller.writer.append_feedback(None, orjson.dumps(value))
    caller.writer.append_instance(b"r5", orjson.dumps(caller.sent["r5"]["request"]))
    drain(daemon)
    clock.t += 20  # held feedback for a request that never comes becomes unknown
    caller.writer.append_feedback(None, orjson.dumps({"id": "never", "rewards": {"a": 1.0},
                                                      "ts": clock.t}))
    drain(daemon)
    clock.t += 20
    daemon.step()
    daemon.step()
    reasons = [orjson.loads(m.value or b"")["reason"] for m in broker.messages("dead-letter")]
    expected = [r for _, r in HOSTILE_REQUESTS] + [r for _, r in hostile_feedback]
    assert sorted(reasons) == sorted([*expected, "duplicate_id", "unknown_id"])
    np.testing.assert_array_equal(daemon.learner.A_inv_, before)


def test_feedback_before_its_request_is_held_and_applied_when_it_comes(tmp_path: Path) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    daemon = make_daemon(broker, tmp_path, clock)
    writer = InMemoryTransport(broker=broker, partitions=2, group_id="caller")
    cands = [{"id": c, "x": [1.0, 0.0, 0.0, float(i)]} for i, c in enumerate("abc")]
    writer.append_feedback(b"q", orjson.dumps({"id": "q", "rewards": {"a": 1.0, "b": 1.0,
                                                                      "c": 1.0},
                                               "ts": clock.t}))
    drain(daemon)
    assert len(daemon.join.early) == 1
    daemon.checkpoint(final=True)
    daemon = make_daemon(broker, tmp_path, clock)  # held feedback survives a restart
    writer.append_instance(b"q", orjson.dumps({"id": "q", "x": [0.0] * D_X, "candidates": cands,
                                               "slots": 2, "ts": clock.t}))
    drain(daemon)
    assert daemon.counters.feedback["joined"] == 2 and len(daemon.join) == 0
    assert daemon.tracker.rounds == 2 and daemon.tracker.error_rate == 0.0


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=20),
       slots=st.lists(st.integers(1, 5), min_size=20, max_size=20),
       scale=st.sampled_from([1.0, 1e6, 1e11]), seed=st.integers(0, 2**16))
def test_engine_decisions_stay_inside_their_sets_and_the_model_finite(
        sizes: list[int], slots: list[int], scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    sets = CandidateSets(rng.normal(size=(len(sizes), 2)) * scale,
                         rng.normal(size=(offsets[-1], 3)) * scale, offsets)
    engine = CandidateEngine(CandidateLinUCB(2, 3, seed=seed), JoinSettings(window_s=10.0), 5)
    ids = [f"r{i}" for i in range(len(sizes))]
    cids = [f"c{j}" for j in range(offsets[-1])]
    for round_ in range(2):
        rids = [f"{i}.{round_}" for i in ids]
        d = engine.decide(rids, sets, cids, np.array(slots[:len(sizes)]),
                          np.zeros(len(sizes), int), wall=float(round_))
        request = sets.request_of
        for r in range(len(sizes)):
            placed = d.chosen[r][d.chosen[r] >= 0]
            assert len(placed) == min(slots[r], sizes[r]) == len(set(placed.tolist()))
            assert (request[placed] == r).all() and request[d.exploit[r]] == r
            assert ((d.slot_probs[r, :len(placed)] > 0) & (d.slot_probs[r, :len(placed)] <= 1)
                    ).all()
        outcomes = engine.feedback(rids, [1.0] * len(rids), np.full(len(rids), float(round_)),
                                   np.zeros(len(rids), int), wall=float(round_))
        assert (outcomes == Outcome.JOINED).all()
        engine.learn()
        assert np.isfinite(engine.learner.A_inv_).all() and np.isfinite(engine.learner.b_).all()
    assert len(engine.joins) == 0 and not engine.slates


def test_the_loop_retrains_listwise_rankers_on_its_logged_slates(tmp_path: Path) -> None:
    from streamlearn.durability.experience import read_experience
    from streamlearn.service.retraining import read_ranker_state

    broker, clock = InMemoryBroker(2), Clock()
    caller = Caller(broker)
    daemon = make_daemon(broker, tmp_path, clock, retrain_every_events=400,
                         retrain_worker="thread")
    daemon = run(broker, daemon, caller, clock, 10)
    while daemon.retraining is not None and daemon.retraining.worker.job is not None:
        time.sleep(0.05)
        daemon.retraining.tick()
    daemon.checkpoint(final=True)
    assert daemon.retraining is not None and daemon.retraining.failures == 0
    history = read_ranker_state(tmp_path / "rankers")["history"]
    assert history and all(not h["promoted"] for h in history)
    assert {"rankboost", "adarank", "ndcg_boost"} <= set(history[-1]["rankers"])
    assert history[-1]["documents_per_query"] > 1.5  # multi-document queries from the loop
    logged = read_experience(tmp_path / "experience").ids
    assert sorted(logged) == sorted(caller.applied_pairs)  # every answered slot, once
    # judged off-policy per slot on whole held-out requests from the request log
    judged = history[-1]["offpolicy"]
    assert judged["requests"] > 20 and len(judged["learner_slots"]) == 3, judged
    for name in ("rankboost", "adarank", "ndcg_boost"):
        verdict = history[-1]["rankers"][name]["offpolicy"]
        assert verdict["rows"] >= judged["requests"] and len(verdict["slots"]) == 3
        assert all(s["low"] <= s["mean"] <= s["high"] for s in verdict["slots"]), verdict
        assert isinstance(verdict["passed"], bool)


def test_a_restore_names_the_configured_hyperparameters_the_checkpoint_overrides(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    caller = Caller(broker)
    daemon = run(broker, make_daemon(broker, tmp_path, clock), caller, clock, 2)
    daemon.checkpoint(final=True)
    other = Daemon(daemon.settings, InMemoryTransport(broker=broker, partitions=2),
                            CandidateLinUCB(D_X, D_C, alpha=0.9, seed=3), wall_clock=clock)
    with caplog.at_level("WARNING", logger="streamlearn.daemon"):
        other.restore()
    assert other.learner.hyperparameters()["alpha"] == 0.5  # the checkpoint's learner
    warned = [r.getMessage() for r in caplog.records
              if "keeps its learner's own settings" in r.getMessage()]
    assert len(warned) == 1 and "alpha: 0.5 (configured: 0.9)" in warned[0], warned


@pytest.mark.parametrize("policy", ["sum", "average", "median", "max", "latest"])
def test_typed_events_are_weighted_and_aggregated_per_placed_candidate_across_a_restart(
        policy: str) -> None:
    """Two events before the request (held across a checkpoint), one in its window and one
    late: each placed candidate's reward is the policy's aggregate of its weighted values."""
    weights = {"click": 1.0, "conversion": 2.0}
    join = JoinSettings(window_s=10.0, duplicate_policy=policy, reward_weights=weights)
    engine = CandidateEngine(CandidateLinUCB(0, 2, seed=1), join, max_slots=2)
    events: list[tuple[Any, str | None]] = [({"a": 0.2, "c": 0.4}, "click"), (0.1, "conversion"),
                                            ({"b": 0.3}, "dwell")]
    outcomes = [engine.feedback(["r1"], [spec], np.array([t]), np.zeros(1, int), wall=t,
                                types=[kind])[0] for t, (spec, kind) in enumerate(events[:2])]
    assert outcomes == [Outcome.HELD, Outcome.AGGREGATED]
    arrays, meta = engine.joins.export()
    early = orjson.loads(orjson.dumps(engine.early_rewards))
    engine = CandidateEngine(engine.learner, join, 2, PendingJoins.restore(
        2, engine.width, join, arrays, orjson.loads(orjson.dumps(meta))), early)
    sets = CandidateSets(np.zeros((1, 0)), np.eye(3, 2), np.array([0, 3]))
    d = engine.decide(["r1"], sets, ["a", "b", "c"], np.array([2]), np.zeros(1, int), wall=2.0)
    placed = ["abc"[j] for j in d.chosen[0].tolist()]
    spec, kind = events[2]
    engine.feedback(["r1"], [spec], np.array([3.0]), np.zeros(1, int), wall=3.0, types=[kind])
    late = engine.feedback(["r1"], [1.0], np.array([12.0]), np.zeros(1, int), wall=12.0,
                           types=["click"])
    assert late.tolist() == [Outcome.LATE]
    engine.advance(wall=20.0, idle=[("feedback", 0), ("instances", 0)])
    engine.advance(wall=30.0)
    closed = engine.learn().closed
    got = {orjson.loads(i)[1]: r for i, r in zip(closed.ids, closed.rewards.tolist(), strict=True)}
    fold = {"sum": sum, "average": lambda v: sum(v) / len(v), "median": median, "max": max,
            "latest": lambda v: v[-1]}[policy]
    expected = {}
    for candidate in placed:  # a slot not named by a rewards object gets the default, 0
        values = [weights.get(kind or "", 1.0) * (spec.get(candidate, 0.0) if isinstance(spec, dict)
                                                  else spec) for spec, kind in events]
        expected[candidate] = float(capped(np.array([fold(values)]))[0])
    assert got == expected and len(got) == 2


def test_who_placed_each_slot_reaches_the_closed_slots_and_survives_a_restart() -> None:
    """A ranker at share 1 places every slot: each pending slot carries its version through a
    checkpoint's export and restore into the closed batch; a journaled decision reused
    after a restart keeps the servers it was journaled with."""
    join = JoinSettings(window_s=10.0)
    engine = CandidateEngine(CandidateLinUCB(0, 2, seed=1), join, max_slots=2)
    sets = CandidateSets(np.zeros((2, 0)), np.eye(6, 2), np.array([0, 3, 6]))
    scores = np.arange(6, dtype=np.float64)
    d = engine.decide(["r1", "r2"], sets, list("abcdef"), np.array([2, 2]), np.zeros(2, int),
                      wall=0.0, mixture=SlateMixture((9,), (1.0,), (scores,)))
    assert (d.served_by == 9).all()
    arrays, meta = engine.joins.export()
    engine = CandidateEngine(engine.learner, join, 2, PendingJoins.restore(
        2, engine.width, join, arrays, orjson.loads(orjson.dumps(meta)), columns=SLOT_COLUMNS))
    engine.feedback(["r1", "r2"], [1.0, 0.0], np.ones(2), np.zeros(2, int), wall=1.0)
    closed = engine.learn().closed
    assert len(closed) == 4 and (closed.columns["served_by"] == 9).all()

    fresh = CandidateEngine(CandidateLinUCB(0, 2, seed=1), join, max_slots=2)
    placed = [list("abcdef")[j] for j in d.chosen[0].tolist()]
    known = {"r1": Journaled(placed, d.slot_probs[0].tolist(), placed[0], 0.0, [9, 0])}
    again = fresh.decide(["r1"], sets.take(np.array([0])), list("abc"), np.array([2]),
                         np.zeros(1, int), wall=5.0, known=known)
    assert again.served_by[0].tolist() == [9, 0] and again.chosen[0].tolist() == d.chosen[0].tolist()


def test_held_request_feedback_past_its_window_is_counted_late_once() -> None:
    """Feedback held for a request whose decision then comes is judged by the window as on
    the fixed-action path: a value at or past the window's end has no effect, and each event
    counts one outcome — a request none of whose held events is on time counts its first one
    late (the others were duplicates as they came); one with an on-time event joins."""
    settings_ = JoinSettings(window_s=5.0, early_window_s=30.0, duplicate_policy="sum")
    engine = CandidateEngine(CandidateLinUCB(2, 3, seed=0), settings_, 2)
    ids = ["late", "ok", "late-first"]
    first = engine.feedback(ids, [1.0, 1.0, 0.5], np.array([107.0, 103.0, 106.0]),
                            np.zeros(3, np.int64), wall=99.0)
    later = engine.feedback(["late-first"], [0.125], np.array([104.0]), np.zeros(1, np.int64),
                            wall=99.5)
    assert first.tolist() == [Outcome.HELD] * 3 and later.tolist() == [Outcome.AGGREGATED]
    rng = np.random.default_rng(0)
    sets = CandidateSets(rng.normal(size=(3, 2)), rng.normal(size=(6, 3)), np.array([0, 2, 4, 6]))
    cids = [f"c{j}" for j in range(6)]
    decided = engine.decide(ids, sets, cids, np.ones(3, np.int64), np.zeros(3, np.int64),
                            wall=100.0)  # the window ends at 105
    assert engine.joins.take_held_late() == 1 and engine.joins.take_held_late() == 0
    pending = {request: pair_id(request, cids[int(decided.chosen[r, 0])])
               for r, request in enumerate(ids)}
    slot = {request: engine.joins.slot_of[pid] for request, pid in pending.items()}
    assert {r: int(engine.joins.n_feedback[s]) for r, s in slot.items()} == {
        "late": 0, "ok": 1, "late-first": 1}
    assert {r: float(engine.joins.reward[s]) for r, s in slot.items()} == {
        "late": 0.0, "ok": 1.0, "late-first": 0.125}
