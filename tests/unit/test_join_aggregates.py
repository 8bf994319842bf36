"""Several feedback events per decision: every aggregation policy, type weights, early and late
feedback, and the aggregate's state across a checkpoint, against a naive per-id reference."""

from __future__ import annotations

import functools
import operator
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.errors import ConfigError
from streamlearn.join.aggregate import POLICIES
from streamlearn.join.pending import JoinSettings, Outcome, PendingJoins
from streamlearn.transport.protocol import Message

K, D = 2, 3
WINDOW, EARLY_WINDOW = 4.0, 2.0
WEIGHTS = {"click": 1.0, "conversion": 2.5, "dwell": 0.5}
CASES = [(policy, {}) for policy in POLICIES] + [(policy, WEIGHTS) for policy in POLICIES]
IDS = [f"case-{p}-{'weighted' if w else 'plain'}" for p, w in CASES]


@dataclass(frozen=True)
class Op:
    """One input: a decision (``value`` unused) or a feedback event, at time ``t``."""

    t: float
    kind: str  # "decide" or "feedback"
    event_id: str
    value: float = 0.0
    type: str | None = None


# ---------------------------------------------------------------- the naive reference
AGGREGATES: dict[str, Callable[[list[float]], float]] = {
    "earliest": lambda v: v[0], "latest": lambda v: v[-1], "max": max, "min": min,
    "sum": lambda v: functools.reduce(operator.add, v),
    "average": lambda v: functools.reduce(operator.add, v) / len(v),
    "median": statistics.median}


def reference(steps: list[list[Op]], policy: str, weights: Mapping[str, float]
              ) -> tuple[dict[str, tuple[str, float]], list[str], list[str]]:
    """id → (how it closed, reward); each feedback's outcome; ids whose held feedback expired."""
    decided: dict[str, float] = {}
    values: dict[str, list[float]] = {}  # the in-window values of each decision, in order
    held: dict[str, tuple[float, list[float]]] = {}  # early: first time, values
    closed: dict[str, tuple[str, float]] = {}
    outcomes, unknown = [], []

    def close(i: str) -> None:
        v = values.pop(i)
        closed[i] = ("JOINED", min(AGGREGATES[policy](v), 1.0)) if v else ("EXPIRED", 0.0)

    for step in steps:
        for op in step:
            i, t = op.event_id, op.t
            if op.kind == "decide":
                decided[i], values[i] = t, held.pop(i, (t, []))[1]
                if policy == "earliest" and values[i]:
                    close(i)
                continue
            value = op.value * weights.get(op.type or "", 1.0)
            if i in closed:
                earliest_duplicate = policy == "earliest" and closed[i][0] == "JOINED"
                outcomes.append("DUPLICATE" if earliest_duplicate else "LATE")
            elif i in decided and t >= decided[i] + WINDOW:
                outcomes.append("LATE")
                close(i)
            elif i in decided:
                outcomes.append("AGGREGATED" if values[i] else "JOINED")
                values[i].append(value)
                if policy == "earliest":
                    close(i)
            elif i in held:
                outcomes.append("DUPLICATE" if policy == "earliest" else "AGGREGATED")
                if policy != "earliest":
                    held[i][1].append(value)
            else:
                outcomes.append("HELD")
                held[i] = (t, [value])
        now = step[0].t  # the clocks reach the step's time: what is due closes
        for i in [i for i in values if decided[i] + WINDOW <= now]:
            close(i)
        for i in [i for i, (first, _) in held.items() if first + EARLY_WINDOW <= now]:
            unknown.append(i)
            del held[i]
    for i in list(values):
        close(i)
    return closed, outcomes, unknown


# ------------------------------------------------------------------------ the store
def make_store(policy: str, weights: Mapping[str, float]) -> PendingJoins:
    return remembering(PendingJoins(K, D, JoinSettings(
        window_s=WINDOW, early_window_s=EARLY_WINDOW, duplicate_policy=policy,
        reward_weights=dict(weights))))


def remembering(store: PendingJoins) -> PendingJoins:
    """The store, its closed ids remembered for the whole test (the reference remembers them
    all; how long the join remembers them is test_join's subject)."""
    store.recent.window_s = 1e9
    return store


def advance(store: PendingJoins, t: float) -> list[str]:
    for stream in ("feedback", "instances"):
        store.clocks.observe(stream, np.zeros(1, np.int64), np.array([t]))
    return [str(fb.event_id) for fb in store.advance(wall=t)]


def play(store: PendingJoins, step: list[Op]) -> list[str]:
    """One step (ops of one kind at one time) as one batch; the feedback's outcomes."""
    n, t = len(step), step[0].t
    ids = [op.event_id for op in step]
    if step[0].kind == "decide":
        store.add_decisions(ids, np.arange(n * D, dtype=float).reshape(n, D), np.zeros(n, np.int64),
                            np.full((n, K), 0.5), np.full(n, -1), np.full(n, t),
                            np.zeros(n, np.int64), wall=t)
        return []
    sources = [Message("feedback", 0, k, None, b"{}", 0) for k in range(n)]
    out = store.add_feedback(ids, np.array([op.value for op in step]), np.full(n, t),
                             np.zeros(n, np.int64), wall=t, sources=sources,
                             types=[op.type for op in step])
    return [Outcome(int(o)).name for o in out]


def collect(store: PendingJoins, into: dict[str, tuple[str, float]]) -> None:
    closed = store.drain()
    for i, how, reward in zip(closed.ids, closed.outcome.tolist(), closed.rewards.tolist(),
                              strict=True):
        assert i not in into, f"{i} closed twice"
        into[i] = (Outcome(how).name, reward)


def run(steps: list[list[Op]], policy: str, weights: Mapping[str, float],
        checkpoint_at: int | None = None) -> tuple[dict[str, tuple[str, float]], list[str],
                                                      list[str]]:
    store = make_store(policy, weights)
    closed: dict[str, tuple[str, float]] = {}
    outcomes: list[str] = []
    unknown: list[str] = []
    for k, step in enumerate(steps):
        if k == checkpoint_at:  # a restart from a snapshot taken here (JSON round trip)
            arrays, meta = store.export()
            store = remembering(PendingJoins.restore(
                K, D, store.settings, {a: v.copy() for a, v in arrays.items()},
                orjson.loads(orjson.dumps(meta))))
        outcomes += play(store, step)
        unknown += advance(store, step[0].t)
        collect(store, closed)
    advance(store, 1e6)
    collect(store, closed)
    return closed, outcomes, unknown


# ------------------------------------------------------------------------ the input
VALUES = st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 1.0]) | st.floats(0.0, 1.0)
#: feedback times relative to the decision: held (some long enough to expire), inside the
#: window, exactly at its end and past it (late)
OFFSETS = st.sampled_from([-3.0, -2.0, -1.5, -0.5, 0.0, 0.5, 1.0, 2.5, 3.5, 3.9, 4.0, 4.5, 6.0])
TYPES = st.sampled_from([None, "click", "conversion", "dwell", "unlisted"])


@st.composite
def interleavings(draw: Any) -> list[list[Op]]:
    """Several feedback events per id (duplicates included), in a random interleaving,
    grouped into steps: consecutive ops of one kind at one time are one batch."""
    keyed: list[tuple[float, int, Op]] = []
    for k in range(draw(st.integers(1, 5))):
        event_id = f"e{k}"
        decided = float(draw(st.integers(0, 8)))
        if draw(st.integers(0, 5)):  # some ids are never decided: their feedback is unknown
            keyed.append((decided, draw(st.integers(0, 99)), Op(decided, "decide", event_id)))
        for _ in range(draw(st.integers(0, 6))):
            op = Op(decided + draw(OFFSETS), "feedback", event_id, draw(VALUES), draw(TYPES))
            for _ in range(1 + draw(st.integers(0, 3)) // 3):  # a duplicate now and then
                keyed.append((op.t, draw(st.integers(0, 99)), op))
    steps: list[list[Op]] = []
    for _, _, op in sorted(keyed, key=lambda x: (x[0], x[1])):
        if steps and (steps[-1][0].t, steps[-1][0].kind) == (op.t, op.kind):
            steps[-1].append(op)
        else:
            steps.append([op])
    return steps


# ------------------------------------------------------------------------ the tests
@pytest.mark.parametrize(("policy", "weights"), CASES, ids=IDS)
@settings(max_examples=120, deadline=None)
@given(steps=interleavings())
def test_each_policy_closes_every_decision_once_with_the_reference_aggregate(
        policy: str, weights: Mapping[str, float], steps: list[list[Op]]) -> None:
    assert run(steps, policy, weights) == reference(steps, policy, weights)


@pytest.mark.parametrize(("policy", "weights"), CASES, ids=IDS)
@settings(max_examples=60, deadline=None)
@given(steps=interleavings(), cut=st.floats(0.0, 1.0))
def test_a_restart_from_a_checkpoint_ends_with_the_uninterrupted_aggregates(
        policy: str, weights: Mapping[str, float], steps: list[list[Op]], cut: float) -> None:
    """Sums, counts, minima, a median's values and the held values are all in the snapshot."""
    at = int(cut * len(steps))
    assert run(steps, policy, weights, checkpoint_at=at) == reference(steps, policy, weights)


def test_the_documented_example_click_conversion_dwell() -> None:
    """A click, a conversion and a dwell time for one decision, weighted, one of them early
    and one late; each policy's reward (capped at 1)."""
    steps = [[Op(0.0, "feedback", "a", 0.2, "dwell")], [Op(1.0, "decide", "a")],
             [Op(2.0, "feedback", "a", 1.0, "click")],
             [Op(3.0, "feedback", "a", 0.3, "conversion")],
             [Op(5.0, "feedback", "a", 1.0, "click")]]  # at 1 + 4: late, no effect
    expected = {"earliest": 0.1, "latest": 0.75, "max": 1.0, "min": 0.1, "sum": 1.0,
                "average": (0.1 + 1.0 + 0.75) / 3, "median": 0.75}
    for policy, reward in expected.items():
        closed, outcomes, _ = run(steps, policy, WEIGHTS)
        assert closed == {"a": ("JOINED", reward)}, policy
        assert outcomes[-1] == ("DUPLICATE" if policy == "earliest" else "LATE"), policy
    closed, _, _ = run(steps[:3], "sum", WEIGHTS)  # dwell 0.1 + click 1.0: capped
    assert closed == {"a": ("JOINED", 1.0)}


def test_a_checkpoint_without_the_new_fields_still_restores() -> None:
    """A snapshot written before the policy, a median's values and every held value were
    kept: its accumulators are the aggregates, one value per held id."""
    store = make_store("max", {})
    play(store, [Op(0.0, "decide", "a"), Op(0.0, "decide", "b")])
    play(store, [Op(1.0, "feedback", "a", 0.4), Op(1.0, "feedback", "early", 0.9)])
    play(store, [Op(1.5, "feedback", "a", 0.6)])
    arrays, meta = store.export()
    del meta["policy"]
    meta["early"] = [{**{k: v for k, v in fb.items() if k != "rewards"}, "reward": fb["rewards"][0]}
                     for fb in meta["early"]]
    for policy, a_reward in (("max", 0.6), ("median", 0.6), ("average", 0.6), ("sum", 0.6)):
        restored = PendingJoins.restore(K, D, make_store(policy, {}).settings, dict(arrays), meta)
        play(restored, [Op(2.0, "decide", "early")])
        play(restored, [Op(2.5, "feedback", "a", 0.2), Op(2.5, "feedback", "early", 0.1)])
        advance(restored, 100.0)
        closed: dict[str, tuple[str, float]] = {}
        collect(restored, closed)
        fold = {"max": max, "median": statistics.median, "sum": sum,
                "average": lambda v: sum(v) / len(v)}[policy]
        assert closed == {"a": ("JOINED", fold([a_reward, 0.2])),
                          "b": ("EXPIRED", 0.0),
                          "early": ("JOINED", fold([0.9, 0.1]))}, policy


def test_a_checkpoint_of_another_policy_gives_each_decision_its_aggregate_as_one_value() -> None:
    store = make_store("median", {})
    play(store, [Op(0.0, "decide", "a")])
    play(store, [Op(1.0, "feedback", "a", v) for v in (0.1, 0.9, 0.2)][:1])
    play(store, [Op(1.1, "feedback", "a", 0.9)])
    play(store, [Op(1.2, "feedback", "a", 0.2)])
    arrays, meta = store.export()
    assert arrays["pending.values"].tolist() == [0.1, 0.9, 0.2]
    restored = PendingJoins.restore(K, D, make_store("average", {}).settings, arrays, meta)
    play(restored, [Op(2.0, "feedback", "a", 0.4)])
    advance(restored, 100.0)
    closed: dict[str, tuple[str, float]] = {}
    collect(restored, closed)
    assert closed == {"a": ("JOINED", (0.2 + 0.4) / 2)}  # the median so far, then 0.4


def test_held_values_count_against_max_early() -> None:
    store = PendingJoins(K, D, JoinSettings(window_s=WINDOW, early_window_s=EARLY_WINDOW,
                                            duplicate_policy="sum", max_early=2))
    assert play(store, [Op(0.0, "feedback", "a", 0.1)]) == ["HELD"]
    assert play(store, [Op(0.1, "feedback", "a", 0.2)]) == ["AGGREGATED"]
    assert play(store, [Op(0.2, "feedback", "a", 0.3), Op(0.2, "feedback", "b", 0.3)]) == [
        "UNKNOWN", "UNKNOWN"]  # no room: neither a third value nor a new id is held


def test_reward_weights_are_validated() -> None:
    for weights, why in (({"click": -1.0}, "finite number >= 0"), ({"none": 1.0}, "'none'"),
                         ({"x" * 65: 1.0}, "1 to 64 characters"),
                         ({"click": float("inf")}, "finite")):
        with pytest.raises(ConfigError, match=why):
            JoinSettings(reward_weights=weights)
    with pytest.raises(ConfigError, match="duplicate_policy must be one of"):
        JoinSettings(duplicate_policy="mode")
