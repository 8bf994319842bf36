"""Guarded rollout: stages, guardrail, holdback, bounded harm, state; and the self-consistency
check of the promotion-time off-policy interval, with the clipping bug planted back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.durability.experience import ExperienceRows
from streamlearn.evaluation.offpolicy import snips
from streamlearn.retrain.promotion import judge
from streamlearn.service.rollout import Arm, Rollout, RolloutEvent, RolloutSettings

LEARNER = 0


def serve(rollout: Rollout, values: dict[int, float], events: int, seed: int,
          batch: int = 50) -> list[tuple[int, float]]:
    """Events drawn by the rollout's shares, each rewarded by its policy's true value; the
    rollout watches each learned batch. Returns (version, reward) of every event."""
    rng = np.random.default_rng(seed)
    served: list[tuple[int, float]] = []
    for _ in range(events // batch):
        shares = rollout.shares()
        versions = np.array(list(shares))
        drawn = rng.choice(versions, size=batch, p=np.array(list(shares.values())))
        rewards = (rng.random(batch) < np.array([values[v] for v in drawn])).astype(float)
        rollout.observe(drawn, rewards)
        served += list(zip(drawn.tolist(), rewards.tolist(), strict=True))
    return served


def recorder() -> tuple[list[RolloutEvent], Rollout]:
    events: list[RolloutEvent] = []
    return events, Rollout(RolloutSettings(stages=(0.05, 0.2, 0.5), stage_events=400),
                           events.append)


@pytest.mark.parametrize("seed", range(5))
def test_a_better_candidate_grows_share_by_share_and_goes_live(seed: int) -> None:
    events, rollout = recorder()
    rollout.promote(Arm(3, "better", "/a/better-v3", {"low": 0.6, "high": 0.8}))
    assert rollout.shares() == {3: 0.05, LEARNER: 0.95}
    serve(rollout, {LEARNER: 0.55, 3: 0.7}, 60_000, seed)
    kinds = [e.kind for e in events]
    assert kinds[:3] == ["advanced", "advanced", "completed"], kinds
    assert rollout.live is not None and rollout.live.version == 3 and rollout.candidate is None
    assert rollout.shares() == {3: 0.95, LEARNER: 0.05}
    assert "rolled_back" not in kinds


def test_a_worse_candidate_is_rolled_back_and_its_harm_is_bounded() -> None:
    """A candidate far worse live (0.25 against 0.55), over 40 seeds: the guardrail rolls it
    back every time, and over the events of its rollout the live reward fell short of what
    the learner alone would have earned by at most 0.02 on average."""
    shortfalls = []
    for seed in range(40):
        events, rollout = recorder()
        rollout.promote(Arm(4, "leaky", "/a/leaky-v4", {"low": 0.7, "high": 0.9}))
        served = serve(rollout, {LEARNER: 0.55, 4: 0.25}, 20_000, seed)
        assert [e.reason for e in events if e.kind == "rolled_back"] == ["guardrail"], seed
        last = max(i for i, (v, _) in enumerate(served) if v == 4)
        during = served[:last + 1]
        shortfalls.append(0.55 - np.mean([0.55 if v == LEARNER else 0.25 for v, _ in during]))
        assert rollout.candidate is None and rollout.shares() == {LEARNER: 1.0}
    assert np.mean(shortfalls) <= 0.02, shortfalls


def test_a_candidate_that_never_earns_its_next_share_is_stopped_before_it_goes_live() -> None:
    for seed in range(5):
        events, rollout = recorder()
        rollout.promote(Arm(5, "worse", "/a/worse-v5", None))
        serve(rollout, {LEARNER: 0.6, 5: 0.52}, 120_000, seed)
        kinds = [(e.kind, e.reason) for e in events]
        assert ("completed", "") not in kinds and kinds[-1][0] == "rolled_back", kinds
        assert kinds[-1][1] in ("stalled", "guardrail")


def test_the_holdback_rolls_back_a_live_ranker_the_learner_has_overtaken() -> None:
    events, rollout = recorder()
    rollout.restore_live(Arm(6, "stale", "/a/stale-v6"))
    assert rollout.shares() == {6: 0.95, LEARNER: 0.05}
    serve(rollout, {LEARNER: 0.8, 6: 0.5}, 40_000, 1)
    assert [e.reason for e in events if e.kind == "rolled_back"] == ["holdback"]
    assert rollout.live is None and rollout.shares() == {LEARNER: 1.0}


def test_the_state_round_trips_and_the_restored_rollout_goes_on_alike() -> None:
    _, rollout = recorder()
    rollout.promote(Arm(3, "better", "/a/better-v3", {"low": 0.6, "high": 0.8}))
    serve(rollout, {LEARNER: 0.55, 3: 0.7}, 1500, 2)
    arrays, meta = rollout.export()
    events_a, events_b = [], []
    again = Rollout(rollout.settings, events_b.append)
    again.restore(arrays, meta)
    rollout.on_event = events_a.append
    assert again.shares() == rollout.shares() and again.stage == rollout.stage
    serve(rollout, {LEARNER: 0.55, 3: 0.7}, 20_000, 3)
    serve(again, {LEARNER: 0.55, 3: 0.7}, 20_000, 3)
    assert [e.kind for e in events_a] == [e.kind for e in events_b]
    assert again.shares() == rollout.shares()


def _rollout_after(steps: list[tuple[str, int]], seed: int) -> Rollout:
    """A rollout taken through promotions, served events and rollbacks."""
    _, rollout = recorder()
    for kind, version in steps:
        if kind == "promote":
            rollout.promote(Arm(version, f"r{version}", f"/a/r-v{version}", None))
        elif kind == "serve":
            serve(rollout, {v: 0.3 + 0.1 * (v % 5) for v in range(9)}, 400 * version, seed)
        else:
            rollout.roll_back("manual")
    return rollout


_STEPS = st.lists(st.tuples(st.sampled_from(["promote", "serve", "rollback"]),
                            st.integers(1, 8)), max_size=8)


@settings(max_examples=60, deadline=None)
@given(ours=_STEPS, theirs=_STEPS, seed=st.integers(0, 2**16))
def test_set_serving_takes_the_recorded_arms_and_keeps_what_both_name(
        ours: list[tuple[str, int]], theirs: list[tuple[str, int]], seed: int) -> None:
    """A restore makes the checkpoint's rollout serve what rankers/state.json recorded:
    afterwards it records the same arms and stage; a record of itself changes nothing; an
    arm both name keeps the checkpoint's counts."""
    rollout, recorded = _rollout_after(ours, seed), _rollout_after(theirs, seed + 1)
    record = recorded.serving_record()
    assert not rollout.set_serving(rollout.serving_record())
    kept = {a.version: (a.served, a.earned) for a in rollout.serving()}
    rollout.set_serving(record)
    mine = rollout.serving_record()
    for role in ("live", "candidate"):
        assert (mine[role] or {}).get("version") == (record[role] or {}).get("version")
    if record["candidate"] is not None:
        assert mine["stage"] == record["stage"]
    for arm in rollout.serving():
        if arm.version in kept:
            assert (arm.served, arm.earned) == kept[arm.version]
    assert sum(rollout.shares().values()) == pytest.approx(1.0)
    assert not rollout.set_serving(rollout.serving_record())


def test_a_checkpoint_of_the_constant_mean_sequences_starts_the_comparison_afresh() -> None:
    """A checkpoint written when each side was a constant-mean betting sequence (``low`` and
    ``high`` states) cannot carry its evidence over to the running-average sequence (the
    squared prediction errors were not kept): the comparison starts afresh, at its level."""
    from streamlearn.service.rollout import ArmStats

    old = {"low": {"alpha": 0.025, "n": 400, "total": 100.0},
           "high": {"alpha": 0.025, "n": 400, "total": 300.0}}
    arm = ArmStats.from_state({"low.log_wealth": np.zeros((101, 8))}, old)
    assert arm.n == 0 and (arm.lower(), arm.upper()) == (0.0, 1.0)
    assert arm.bound.alpha == 0.025
    arm.observe(np.ones(50))
    assert arm.n == 50 and arm.lower() > 0.5


# ------------------------------------------------------------------ self-consistency
K, EPS = 10, 0.01


def departing_world(seed: int, n: int) -> tuple[ExperienceRows, np.ndarray, float]:
    """The logger is ε-greedy on action 0 (reward 0.6, but 0.2 on a quarter of the contexts);
    the challenger departs exactly there and plays action 1, whose reward there is 0.15:
    worse than the logger. Returns the log, the challenger as deployed, its true value."""
    rng = np.random.default_rng(seed)
    departs = rng.random(n) < 0.25
    a = np.where(rng.random(n) < EPS, rng.integers(0, K, n), 0)
    probs = np.full((n, K), EPS / K)
    probs[:, 0] += 1 - EPS
    mu = np.where(departs[:, None], 0.2, 0.6) * np.ones((n, K))
    mu[departs, 1] = 0.15
    rewards = (rng.random(n) < mu[np.arange(n), a]).astype(float)
    pi = np.full((n, K), EPS / K)
    pi[np.arange(n), np.where(departs, 1, 0)] += 1 - EPS
    truth = float((pi * mu).sum(axis=1).mean())
    rows = ExperienceRows([str(i) for i in range(n)], np.zeros((n, 1), np.float32), a, probs,
                          rewards, np.full(n, -1), np.zeros(n, np.int64),
                          np.arange(n, dtype=np.float64), np.zeros(n, np.int64),
                          np.full(n, EPS * K / (K - 1)))
    return rows, pi, truth


def check_after_promotion(interval: dict[str, float], truth: float, seed: int) -> RolloutEvent:
    """The challenger goes live with ``interval`` and earns its true value on 2,000 events."""
    events: list[RolloutEvent] = []
    rollout = Rollout(RolloutSettings(stages=(0.5,), stage_events=10**9), events.append)
    rollout.promote(Arm(7, "challenger", "/a/c-v7", interval))
    serve(rollout, {LEARNER: 0.5, 7: truth}, 6000, seed)
    (check,) = [e for e in events if e.kind == "consistency"]
    return check


@pytest.mark.parametrize("seed", range(3))
def test_the_check_fires_when_the_old_estimate_is_planted_back(seed: int) -> None:
    """The interval the loop recorded before — SNIPS with weights clipped at 20 and its
    normal interval — sits near the logger's reward where the two agree, far above what the
    challenger then earns live: the check says 'outside'. The promotion gate's interval
    holds the challenger's realised value."""
    rows, pi, truth = departing_world(seed, 40_000)
    right = judge(rows, pi, 0.05)["value"]
    assert right["low"] <= truth <= right["high"]
    assert check_after_promotion(right, truth, seed).reason == "inside"
    old = snips(rows.rewards, rows.actions, rows.propensities, clip=20.0, target_probs=pi)
    assert old.low > truth + 0.05, (old, truth)
    event = check_after_promotion({"low": old.low, "high": old.high}, truth, seed)
    assert event.reason == "outside" and event.detail["events"] >= 2000


def test_a_stage_the_holdback_leaves_no_room_for_is_said_at_the_start(
        caplog: pytest.LogCaptureFixture) -> None:
    """--retrain-rollout-stages 0.3,0.8 with --retrain-holdback 0.5 started without a word and
    the rollout completed at 50 %: the 0.8 stage never happened (an outside test). A stage
    exactly at the limit (0.93 with a holdback of 0.07, 1 - 0.07 rounding below it) is no
    such stage."""
    import logging

    from loop_helpers import settings_of

    with caplog.at_level(logging.WARNING, logger="streamlearn.retrain"):
        settings_of(retrain_rollout_stages="0.3,0.8", retrain_holdback=0.5).rollout_settings()
    assert any("above 1 - retrain.holdback = 0.5" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streamlearn.retrain"):
        for stages, holdback in (("0.3,0.5", 0.5), ("0.1,0.93", 0.07), ("0.67", 0.33)):
            settings_of(retrain_rollout_stages=stages,
                        retrain_holdback=holdback).rollout_settings()
    assert not caplog.records


def test_inspect_gives_a_rollout_next_to_a_baseline_as_shares_of_all_the_events(
        capsys: pytest.CaptureFixture[str]) -> None:
    """In apprentice mode the rollout's shares divide the learner's 10 %: inspect said
    "candidate 10 %, learner 90 %" where /metrics said candidate 0.01, learner 0.09,
    baseline 0.9 (an outside test)."""
    from streamlearn.commands.inspect import _print_rollout

    rollout = {"candidate": {"ranker": "memoryoracle", "version": 7, "share": 0.1, "served": 14},
               "live": None, "stage": 0, "learner_share": 0.9}
    _print_rollout(rollout, of_learner=0.1)
    line = capsys.readouterr().out
    assert "candidate memoryoracle v7 1.0 %" in line and "learner 9.0 %" in line
    assert "baseline 90 %" in line
    _print_rollout(rollout)  # online: the rollout's shares are the events'
    line = capsys.readouterr().out
    assert "candidate memoryoracle v7 10 %" in line and "baseline" not in line
