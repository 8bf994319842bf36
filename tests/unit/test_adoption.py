"""Next to an existing system (``streamlearn/service/adoption.py``): the fallback baseline,
who serves in each rollout mode and with which logged propensities, the conservative
share, automatic switches and steps back, and the state a checkpoint keeps — on the
:class:`Adoption` alone, through the engine's mixture, and through a daemon on the
in-memory transport."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from loop_helpers import Clock, decisions_by_id, drain, settings_of

from streamlearn.engine import BASELINE, Engine, Mixture
from streamlearn.errors import ConfigError
from streamlearn.learners.banditron import Banditron
from streamlearn.learners.exploration import FixedGamma
from streamlearn.service.adoption import Adoption, AdoptionSettings, parse_baseline
from streamlearn.service.daemon import Daemon
from streamlearn.snapshot import read_snapshot, write_snapshot
from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport

K, D = 4, 5


# ------------------------------------------------------------------ parse_baseline
@pytest.mark.parametrize("spec, expected", [(None, -1), ("", -1), ("constant:0", 0),
                                            ("constant:3", 3), ("CONSTANT:1", 1),
                                            (" constant : 2 ", 2)])
def test_the_fallback_baseline_parses(spec: str | None, expected: int) -> None:
    assert parse_baseline(spec, K) == expected


@pytest.mark.parametrize("spec", ["constant:4", "constant:-1", "constant:x", "constant:",
                                  "constant:1.0", "fixed:1", "1", "constant", "constant:1:2",
                                  "constant:1_0", "constant:\u0661"])
def test_a_bad_fallback_baseline_says_what_was_expected_and_what_came(spec: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_baseline(spec, K)
    message = str(raised.value)
    assert "'constant:A'" in message and f"[0, {K})" in message  # expected
    assert f"Got {spec!r}" in message  # got


@pytest.mark.parametrize("kw, words", [
    ({"mode": "shadow"}, ["apprentice, conservative, online", "'shadow'"]),
    ({"explore_budget": 1.5}, ["[0, 1]", "1.5"]),
    ({"explore_budget": -0.1}, ["[0, 1]", "-0.1"]),
    ({"alpha": 0.0}, ["(0, 1)", "0.0"]),
    ({"alpha": 1.0}, ["(0, 1)", "1.0"]),
])
def test_bad_rollout_settings_say_what_was_expected_and_what_came(kw: dict[str, Any],
                                                                 words: list[str]) -> None:
    with pytest.raises(ConfigError) as raised:
        AdoptionSettings(**kw)
    assert all(w in str(raised.value) for w in words), str(raised.value)


# ---------------------------------------------------- who serves: the engine's mixture
def learner(gamma: float = 0.3, seed: int = 7) -> Banditron:
    lr = Banditron(K, D, FixedGamma(gamma), seed=seed)
    rng = np.random.default_rng(seed)  # a learner with opinions that differ by row
    X = rng.normal(size=(400, D))
    actions = rng.integers(0, K, 400)
    lr.update(X, actions, (actions == np.argmax(X[:, :K], axis=1)).astype(float),
              np.full((400, K), 1.0 / K))
    return lr


def decide(adoption: Adoption, X: np.ndarray, baselines: np.ndarray,
           mask: np.ndarray | None = None, ids: list[str] | None = None,
           system: Mixture | None = None, lr: Banditron | None = None) -> Any:
    B = len(X)
    ids = ids if ids is not None else [f"e{i}" for i in range(B)]
    engine = Engine(lr if lr is not None else learner())
    b = adoption.baselines(baselines, mask)
    return engine.decide(ids, X, mask, labels=np.full(B, -1), ts=np.zeros(B),
                         partitions=np.zeros(B, np.int64), wall=0.0,
                         mixture=adoption.wrap(system, b, K), baselines=b), b


def test_apprentice_without_a_budget_serves_the_baseline_always_with_propensity_1() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2000, D))
    given = rng.integers(-1, K, 2000)  # -1: this event carries none
    decided, _ = decide(Adoption(AdoptionSettings("apprentice")), X, given)
    has = given >= 0
    assert (decided.actions[has] == given[has]).all()
    np.testing.assert_array_equal(decided.probs[has], np.eye(K)[given[has]])
    assert (decided.columns["served_by"][has] == BASELINE).all()
    assert (decided.columns["baseline"] == given).all()
    # an event without a baseline is the learner's, with the learner's own distribution
    alone = Engine(learner()).decide([f"e{i}" for i in np.flatnonzero(~has)], X[~has], None,
                                     labels=np.full((~has).sum(), -1), ts=np.zeros((~has).sum()),
                                     partitions=np.zeros((~has).sum(), np.int64), wall=0.0)
    assert (decided.columns["served_by"][~has] == 0).all()
    np.testing.assert_array_equal(decided.probs[~has], alone.probs)
    np.testing.assert_array_equal(decided.actions[~has], alone.actions)


def test_the_fallback_baseline_serves_events_without_their_own_where_allowed() -> None:
    """``rollout.baseline = constant:A`` serves an event that carries none — unless the
    event's ``actions`` rule A out: then the learner serves it (it used to serve A)."""
    adoption = Adoption(AdoptionSettings("apprentice", baseline=2))
    given = np.array([-1, 1, -1, -1])
    mask = np.array([[True] * K, [True] * K, [True, True, False, False], [False, False, True, True]])
    b = adoption.baselines(given, mask)
    assert b.tolist() == [2, 1, -1, 2]
    assert adoption.baselines(given).tolist() == [2, 1, 2, 2]
    decided, _ = decide(adoption, np.random.default_rng(0).normal(size=(4, D)), given, mask)
    assert decided.actions.tolist()[:2] == [2, 1] and decided.actions[3] == 2
    assert decided.columns["served_by"].tolist() == [BASELINE, BASELINE, 0, BASELINE]
    assert mask[2, decided.actions[2]] and decided.probs[2, ~mask[2]].sum() == 0


@pytest.mark.parametrize("budget", [0.1, 0.5])
def test_the_logged_propensities_are_those_of_the_mixture_actually_sampled(budget: float) -> None:
    """Many events of one context: how often each action is published matches the logged
    distribution (1 − E on the baseline, E × the learner's) — a chi-square test — and the
    learner serves a share E of the events."""
    n = 40_000
    x = np.random.default_rng(3).normal(size=D)
    X = np.tile(x, (n, 1))
    decided, _ = decide(Adoption(AdoptionSettings("apprentice", explore_budget=budget)), X,
                        np.full(n, 1))
    probs = decided.probs
    assert np.allclose(probs, probs[0])  # one context: one distribution
    own = learner().decide(x[None, :], None, keys=["k"])[1][0]
    np.testing.assert_allclose(probs[0], (1 - budget) * np.eye(K)[1] + budget * own)
    counts = np.bincount(decided.actions, minlength=K)
    expected = probs.sum(axis=0)
    chi2 = float((((counts - expected) ** 2) / expected)[expected > 0].sum())
    assert chi2 < 18.5, (counts, expected)  # 3 degrees of freedom: p ≈ 0.0003
    served = float((decided.columns["served_by"] == 0).mean())
    assert abs(served - budget) < 4 * np.sqrt(budget * (1 - budget) / n)
    by_baseline = decided.columns["served_by"] == BASELINE
    assert (decided.actions[by_baseline] == 1).all()


def test_the_logged_propensities_match_over_varied_contexts_and_masks() -> None:
    """The same check over rows whose contexts, masks and baselines all differ: the expected
    count of each action is the sum of its logged probabilities."""
    n = 40_000
    rng = np.random.default_rng(5)
    X = rng.normal(size=(n, D))
    mask = rng.random((n, K)) < 0.7
    mask[np.arange(n), rng.integers(0, K, n)] = True
    given = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
    given[rng.random(n) < 0.2] = -1
    decided, _ = decide(Adoption(AdoptionSettings("apprentice", explore_budget=0.3)), X, given,
                        mask)
    counts = np.bincount(decided.actions, minlength=K)
    expected = decided.probs.sum(axis=0)
    chi2 = float((((counts - expected) ** 2) / expected).sum())
    assert chi2 < 18.5, (counts, expected)
    assert mask[np.arange(n), decided.actions].all()
    assert (decided.probs[~mask] == 0).all()


@settings(max_examples=150, deadline=None)
@given(mode=st.sampled_from(["apprentice", "conservative", "online"]),
       share=st.floats(0.0, 1.0), ranker_share=st.sampled_from([None, 0.0, 0.3, 1.0]),
       rows=st.integers(1, 12), seed=st.integers(0, 2**31 - 1),
       masked=st.booleans())
def test_the_mixture_is_a_distribution_with_the_baseline_at_least_1_minus_share(
        mode: str, share: float, ranker_share: float | None, rows: int, seed: int,
        masked: bool) -> None:
    rng = np.random.default_rng(seed)
    adoption = Adoption(AdoptionSettings(mode))
    adoption.share = share
    X = rng.normal(size=(rows, D))
    mask = None
    if masked:
        mask = rng.random((rows, K)) < 0.5
        mask[np.arange(rows), rng.integers(0, K, rows)] = True
    given = np.array([rng.choice(np.flatnonzero(mask[i]) if mask is not None else np.arange(K))
                      for i in range(rows)])
    given[rng.random(rows) < 0.3] = -1
    system = None if ranker_share is None else Mixture(
        (0, 3), np.array([1 - ranker_share, ranker_share]), (None, rng.normal(size=(rows, K))))
    decided, b = decide(adoption, X, given, mask, system=system)
    probs = decided.probs
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert (probs >= 0).all() and (probs <= 1 + 1e-12).all()
    chosen = probs[np.arange(rows), decided.actions]
    assert (chosen > 0).all() and (chosen <= 1 + 1e-12).all()  # a propensity in (0, 1]
    if mask is not None:
        assert mask[np.arange(rows), decided.actions].all()
    if mode != "online":
        has = b >= 0
        assert (probs[has, b[has]] >= 1 - share - 1e-12).all()
        wrapped = adoption.wrap(system, b, K)
        if wrapped is not None and wrapped.shares.ndim == 2:
            np.testing.assert_allclose(wrapped.shares.sum(axis=1), 1.0)
            assert (wrapped.shares[has, 0] == pytest.approx(1 - share))
            assert (wrapped.shares[~has, 0] == 0).all()


@settings(max_examples=100, deadline=None)
@given(given=hnp.arrays(np.int64, st.integers(0, 20), elements=st.integers(-1, K - 1)),
       fallback=st.integers(-1, K - 1))
def test_an_event_keeps_its_own_baseline_and_the_fallback_fills_only_the_gaps(
        given: np.ndarray, fallback: int) -> None:
    b = Adoption(AdoptionSettings("apprentice", baseline=fallback)).baselines(given)
    assert (b[given >= 0] == given[given >= 0]).all()
    assert (b[given < 0] == fallback).all()


# ------------------------------------------------------------ the conservative share
def play(adoption: Adoption, rounds: int, p_baseline: float, p_learner: float,
         rng: np.random.Generator, batch: int = 100, in_flight: int = 1000) -> np.ndarray:
    """Rounds of ``batch`` events: each served by the learner with the current share, with
    Bernoulli rewards of each side's mean; the share after each round."""
    shares = []
    for _ in range(rounds):
        share = 1.0 if adoption.mode == "online" else adoption.share
        by_learner = rng.random(batch) < share
        served = np.where(by_learner, 0, BASELINE)
        rewards = np.where(by_learner, rng.random(batch) < p_learner,
                           rng.random(batch) < p_baseline).astype(float)
        adoption.observe(served, rewards, np.ones(batch, np.int64), in_flight)
        shares.append(adoption.share)
    return np.array(shares)


def test_the_conservative_share_is_0_without_evidence() -> None:
    adoption = Adoption(AdoptionSettings("conservative", alpha=0.1))
    assert adoption.share == 0.0 and adoption.conservative_share(100) == 0.0
    adoption.observe(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), 0)
    assert adoption.share == 0.0
    # events without a baseline are no evidence about it
    adoption.observe(np.zeros(50, np.int64), np.ones(50), np.full(50, -1), 0)
    assert adoption.share == 0.0 and adoption.events == 0


def test_the_conservative_share_grows_with_a_better_learner_and_not_with_a_worse_one() -> None:
    shares = {p: play(Adoption(AdoptionSettings("conservative", alpha=0.1)), 150, 0.5, p,
                      np.random.default_rng(5)) for p in (0.9, 0.1)}
    good, bad = shares[0.9], shares[0.1]
    assert good[0] < 0.2 and good[-30:].min() == 1.0  # it earned all the traffic
    assert bad[-30:].mean() < 0.3 and bad.max() < 0.5  # it never did
    assert (good[20:] >= bad[20:]).all()


def test_the_conservative_share_falls_back_when_the_learner_starts_losing() -> None:
    adoption = Adoption(AdoptionSettings("conservative", alpha=0.1))
    rng = np.random.default_rng(8)
    before = play(adoption, 20, 0.5, 0.9, rng)
    assert before[-1] == 1.0
    after = play(adoption, 300, 0.5, 0.0, rng)
    assert after[-50:].mean() < 0.2, after[::10]
    # the floor holds: what was earned stays above (1 - alpha) x the baseline's mean, about
    assert adoption.earned >= 0.9 * 0.5 * adoption.events - 3 * np.sqrt(adoption.events)


# -------------------------------------------------------------- switches and steps back
class Switches:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []

    def __call__(self, old: str, new: str, why: str) -> None:
        self.seen.append((old, new, why))


def test_auto_moves_apprentice_to_conservative_to_online_when_the_bounds_say_so(
        caplog: pytest.LogCaptureFixture) -> None:
    switches = Switches()
    adoption = Adoption(AdoptionSettings("apprentice", explore_budget=0.2, auto=True), switches)
    caplog.set_level(logging.INFO, "streamlearn.rollout")
    play(adoption, 400, 0.3, 0.9, np.random.default_rng(2))
    assert [(o, n) for o, n, _ in switches.seen] == [("apprentice", "conservative"),
                                                     ("conservative", "online")]
    assert adoption.mode == "online" and adoption.share == 1.0
    assert [(h["from"], h["to"]) for h in adoption.history] == [
        ("apprentice", "conservative"), ("conservative", "online")]
    assert "lower bound" in adoption.history[0]["why"]
    assert "rollout: apprentice -> conservative" in caplog.text
    assert "rollout: conservative -> online" in caplog.text


@pytest.mark.parametrize("mode, budget, p_baseline, p_learner", [
    ("apprentice", 0.2, 0.5, 0.5),  # as good: the learner's lower bound stays below
    ("apprentice", 0.2, 0.5, 0.3),  # worse
    ("apprentice", 0.0, 0.1, 0.9),  # no budget: nothing measures the learner
    ("conservative", 0.0, 0.5, 0.5),  # as good is not better: it stays conservative
])
def test_auto_does_not_move_on_otherwise(mode: str, budget: float, p_baseline: float,
                                         p_learner: float) -> None:
    switches = Switches()
    adoption = Adoption(AdoptionSettings(mode, explore_budget=budget, auto=True), switches)
    play(adoption, 300, p_baseline, p_learner, np.random.default_rng(4))
    assert adoption.mode == mode and switches.seen == [] and adoption.history == []


def test_without_auto_the_mode_stays_whatever_the_bounds_say() -> None:
    adoption = Adoption(AdoptionSettings("apprentice", explore_budget=0.2))
    play(adoption, 300, 0.1, 0.9, np.random.default_rng(4))
    assert adoption.mode == "apprentice" and adoption.history == []


def test_a_step_back_goes_online_conservative_apprentice_counted_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    switches = Switches()
    adoption = Adoption(AdoptionSettings("online", explore_budget=0.05), switches)
    caplog.set_level(logging.INFO, "streamlearn.rollout")
    adoption.step_back()
    assert adoption.mode == "conservative" and adoption.share == 0.0
    play(adoption, 30, 0.5, 0.9, np.random.default_rng(1))
    adoption.step_back()
    assert adoption.mode == "apprentice" and adoption.share == 0.05
    # the comparisons restart with each mode
    assert adoption.events == 0 and adoption.stats["baseline"].n == 0 and adoption.earned == 0
    adoption.step_back()  # already apprentice: nothing to step back to
    assert adoption.mode == "apprentice"
    assert [(o, n) for o, n, _ in switches.seen] == [("online", "conservative"),
                                                     ("conservative", "apprentice")]
    assert all(why == "asked for (SIGUSR2)" for _, _, why in switches.seen)
    assert [h["to"] for h in adoption.history] == ["conservative", "apprentice"]
    assert "rollout: online -> conservative (asked for (SIGUSR2))" in caplog.text
    assert "already apprentice" in caplog.text


def test_a_step_back_pauses_auto_until_a_restart_with_another_mode(tmp_path: Path) -> None:
    """With rollout.auto the mode went online again 3 s after an operator's step back, on the
    new mode's first evidence (an outside test). The step back now pauses the automatic
    switching, across a restart too, until the configured mode changes."""
    config = AdoptionSettings("apprentice", explore_budget=0.2, auto=True)
    switches = Switches()
    adoption = Adoption(config, switches)
    play(adoption, 400, 0.3, 0.9, np.random.default_rng(2))
    assert adoption.mode == "online"
    adoption.step_back()
    assert adoption.mode == "conservative" and adoption.auto_paused
    assert switches.seen[-1][2] == ("asked for (SIGUSR2); automatic switching paused until a "
                                    "restart with another rollout.mode")
    play(adoption, 400, 0.3, 0.9, np.random.default_rng(3))
    assert adoption.mode == "conservative"  # the evidence says online; the operator said no
    again = roundtrip(adoption, tmp_path, config)
    play(again, 400, 0.3, 0.9, np.random.default_rng(4))
    assert again.mode == "conservative" and again.auto_paused
    resumed = roundtrip(adoption, tmp_path, AdoptionSettings("conservative", auto=True))
    play(resumed, 400, 0.3, 0.9, np.random.default_rng(5))
    assert resumed.mode == "online" and not resumed.auto_paused


def test_the_served_share_restarts_with_each_mode() -> None:
    """The learner's served share is an average over recent decisions: after a step back to
    apprentice it read 0.37 while the baseline served everything (an outside test). A
    change of mode restarts it, so it reads the new mode's share from its first decisions."""
    adoption = Adoption(AdoptionSettings("conservative", explore_budget=0.0))
    adoption.share = 0.9
    adoption.note_decisions(np.zeros(500, dtype=np.int64), np.zeros(500, dtype=np.int64))
    assert adoption.served_share == pytest.approx(0.9)
    adoption.step_back()
    assert np.isnan(adoption.served_share)
    adoption.note_decisions(np.zeros(10, dtype=np.int64), np.zeros(10, dtype=np.int64))
    assert adoption.served_share == 0.0  # apprentice without a budget: the baseline's


def test_the_history_keeps_the_last_20_switches() -> None:
    adoption = Adoption(AdoptionSettings("online"))
    for _ in range(15):
        adoption._switch("conservative", "test")
        adoption._switch("online", "test")
    assert len(adoption.history) == 20 and adoption.history[-1]["to"] == "online"


# --------------------------------------------------------------------- state
def roundtrip(adoption: Adoption, tmp_path: Path, settings_: AdoptionSettings) -> Adoption:
    """Through a real snapshot, as a checkpoint keeps it (JSON meta, npz arrays)."""
    arrays, meta = adoption.export()
    path = tmp_path / f"snap-{len(list(tmp_path.iterdir()))}"
    write_snapshot(path, arrays, {"adoption": meta})
    read_arrays, read_meta = read_snapshot(path)
    fresh = Adoption(settings_)
    fresh.restore({k: v for k, v in read_arrays.items() if k.startswith("adoption.")},
                  read_meta["adoption"])
    return fresh


def exported(adoption: Adoption) -> tuple[dict[str, list[float]], bytes]:
    arrays, meta = adoption.export()
    return {k: v.tolist() for k, v in arrays.items()}, orjson.dumps(meta)


@pytest.mark.parametrize("mode, auto", [("apprentice", True), ("conservative", False),
                                        ("conservative", True)])
def test_export_restore_round_trip_continues_as_if_uninterrupted(
        tmp_path: Path, mode: str, auto: bool) -> None:
    config = AdoptionSettings(mode, explore_budget=0.2, alpha=0.1, auto=auto)
    straight = Adoption(config)
    play(straight, 60, 0.4, 0.8, np.random.default_rng(9))
    restored = roundtrip(straight, tmp_path, config)
    assert exported(restored) == exported(straight)
    assert (restored.mode, restored.share, restored.slack) == (straight.mode, straight.share,
                                                               straight.slack)
    # the same rewards from here on: the same shares, switches, bounds and mixtures
    a = play(straight, 200, 0.4, 0.8, np.random.default_rng(10))
    b = play(restored, 200, 0.4, 0.8, np.random.default_rng(10))
    np.testing.assert_array_equal(a, b)
    assert exported(restored) == exported(straight)
    assert restored.history == straight.history
    baselines = np.array([0, -1, 2, 3])
    if straight.mode != "online":
        w1, w2 = straight.wrap(None, baselines, K), restored.wrap(None, baselines, K)
        assert w1 is not None and w2 is not None
        np.testing.assert_array_equal(w1.shares, w2.shares)


def test_a_restore_keeps_a_switched_mode_but_a_newly_configured_one_starts_afresh(
        tmp_path: Path) -> None:
    config = AdoptionSettings("apprentice", explore_budget=0.2, auto=True)
    adoption = Adoption(config)
    play(adoption, 400, 0.3, 0.9, np.random.default_rng(2))
    assert adoption.mode == "online" and len(adoption.history) == 2
    again = roundtrip(adoption, tmp_path, config)
    assert again.mode == "online" and again.history == adoption.history  # the switch holds
    other = roundtrip(adoption, tmp_path, AdoptionSettings("conservative"))
    assert other.mode == "conservative" and other.history == [] and other.events == 0


def test_a_restored_agreement_of_none_is_nan(tmp_path: Path) -> None:
    config = AdoptionSettings("apprentice")
    adoption = Adoption(config)
    assert adoption.export()[1]["agreement"] is None
    assert np.isnan(roundtrip(adoption, tmp_path, config).agreement)
    adoption.note_decisions(np.array([1, 2, 3]), np.array([1, 0, -1]))
    assert adoption.agreement == 0.5
    assert roundtrip(adoption, tmp_path, config).agreement == 0.5


# ------------------------------------------------------------- through the daemon
def daemon(broker: InMemoryBroker, tmp: Path, clock: Clock, **kw: Any) -> Daemon:
    s = settings_of(checkpoint_dir=str(tmp), checkpoint_every_events=10**9,
                       checkpoint_every_seconds=1e9, join_window_seconds=5.0,
                       limits_poll_timeout_seconds=0.0, learner_n_actions=K,
                       learner_n_features=D, **kw)
    d = Daemon(s, InMemoryTransport(broker=broker, partitions=2), learner(0.1), wall_clock=clock)
    d.restore()
    return d


class Caller:
    def __init__(self, broker: InMemoryBroker, clock: Clock) -> None:
        self.broker, self.clock = broker, clock
        self.writer = InMemoryTransport(broker=broker, partitions=2, group_id="caller")
        self.rng = np.random.default_rng(0)
        self.answered: set[str] = set()

    def publish(self, lo: int, hi: int, **extra: Any) -> None:
        self.clock.t += 1.0
        for i in range(lo, hi):
            value = {"id": f"e{i}", "x": self.rng.normal(size=D).tolist(), "ts": self.clock.t,
                     "baseline": i % K, **extra}
            if value["baseline"] is None:  # an event without one
                del value["baseline"]
            self.writer.append_instance(f"e{i}".encode(), orjson.dumps(value))

    def answer(self) -> None:
        for m in self.broker.messages("decisions"):
            d = orjson.loads(m.value or b"")
            if d["id"] not in self.answered:
                self.answered.add(d["id"])
                self.writer.append_feedback(m.key, orjson.dumps(
                    {"id": d["id"], "reward": float(d["action"] == 0), "ts": self.clock.t}))


def test_the_daemon_keeps_measuring_after_a_restore(tmp_path: Path) -> None:
    """The rollout goes on counting after a restart: the restored pending decisions keep who
    served them and their baseline (a restored daemon used to lose those columns, so the
    rollout, the ranker rollout and the experience log stopped seeing them)."""
    broker, clock = InMemoryBroker(), Clock()
    caller = Caller(broker, clock)
    first = daemon(broker, tmp_path, clock, rollout_mode="apprentice")
    caller.publish(0, 200)
    drain(first)
    caller.answer()
    caller.publish(200, 300)  # decided, not answered before the checkpoint
    drain(first)
    assert first.adoption.events == 200
    first.checkpoint(final=True)
    second = daemon(broker, tmp_path, clock, rollout_mode="apprentice")
    assert second.adoption.events == 200
    assert set(second.engine.joins.columns) == {"served_by", "gamma", "exploit", "baseline",
                                                "epoch"}
    caller.answer()
    drain(second)
    assert second.adoption.events == 300 == second.adoption.stats["baseline"].n
    decisions = decisions_by_id(broker)
    assert len(decisions) == 300
    for event_id, (d, *_) in decisions.items():
        i = int(event_id[1:])
        assert d["action"] == d["baseline"] == i % K and d["prob"] == 1.0
        assert d["policy"] == "baseline"


def test_the_daemon_serves_the_fallback_only_inside_an_events_actions(tmp_path: Path) -> None:
    broker, clock = InMemoryBroker(), Clock()
    caller = Caller(broker, clock)
    d = daemon(broker, tmp_path, clock, rollout_mode="apprentice", rollout_baseline="constant:0")
    writer = caller.writer
    for i, actions in enumerate([[1, 2], [0, 3], None]):
        value: dict[str, Any] = {"id": f"f{i}", "x": [0.5] * D, "ts": clock.t}
        if actions is not None:
            value["actions"] = actions
        writer.append_instance(f"f{i}".encode(), orjson.dumps(value))
    drain(d)
    decided = {k: v[0] for k, v in decisions_by_id(broker).items()}
    assert decided["f0"]["action"] in (1, 2) and "policy" not in decided["f0"]
    assert "baseline" not in decided["f0"]
    assert decided["f1"]["action"] == 0 and decided["f1"]["policy"] == "baseline"
    assert decided["f2"]["action"] == 0 and decided["f2"]["prob"] == 1.0


def test_a_step_back_to_the_baseline_is_no_change_the_learners_drift_detector_sees(
        tmp_path: Path) -> None:
    """After SIGUSR2 (online -> conservative: the baseline serves nearly everything) the
    drift detector read the baseline's rows as the learner's — the engine learns them with
    the logged action as the learner's choice where the learner had no chance — reported a
    change 0.45 s later and the learner explored at near-random error (an outside test)."""
    from streamlearn.learners import make_learner

    broker, clock = InMemoryBroker(), Clock()
    s = settings_of(checkpoint_dir=str(tmp_path), limits_poll_timeout_seconds=0.0,
                    learner_n_actions=K, learner_n_features=D, rollout_baseline="constant:1")
    lr = make_learner("linucb", K, D, None, seed=3)  # the default drift-aware exploration
    d = Daemon(s, InMemoryTransport(broker=broker, partitions=2), lr, wall_clock=clock)
    d.restore()
    writer = InMemoryTransport(broker=broker, partitions=2, group_id="caller")
    rng = np.random.default_rng(8)
    answered: set[str] = set()
    labels: dict[str, int] = {}

    def rounds(lo: int, hi: int) -> None:
        for start in range(lo, hi, 100):
            for i in range(start, start + 100):
                x = rng.normal(size=D)
                x[1] -= 3.0  # action 1, the baseline's, is rarely right
                labels[f"e{i}"] = int(np.argmax(x[:K]))
                writer.append_instance(f"e{i}".encode(), orjson.dumps(
                    {"id": f"e{i}", "x": x.tolist()}))
            d.step()
            for event_id, decision in decisions_by_id(broker).items():
                if event_id not in answered:
                    answered.add(event_id)
                    writer.append_feedback(event_id.encode(), orjson.dumps(
                        {"id": event_id, "reward": float(decision[0]["action"] == labels[event_id])}))
            clock.t += 0.1
            d.step()

    rounds(0, 3000)
    before = d.learner.drift_detections_
    d.request_step_back()
    rounds(3000, 3600)  # the conservative share starts at 0: the baseline serves everything
    assert d.adoption.mode == "conservative"
    assert d.learner.drift_detections_ == before


def test_the_reported_gamma_is_the_learners_own_beside_a_baseline(tmp_path: Path) -> None:
    """With a fixed γ of 0.3 the exploration gauge read 0.34-0.52 while a baseline or a
    ranker shared the decisions: it was inferred from the logged mixture (an outside test)."""
    from streamlearn.service.metrics import Observer

    class Gammas(Observer):
        def __init__(self) -> None:
            self.seen: list[float] = []

        def on_gamma(self, gamma: float) -> None:
            self.seen.append(gamma)

    broker, clock, observer = InMemoryBroker(), Clock(), Gammas()
    s = settings_of(checkpoint_dir=str(tmp_path), limits_poll_timeout_seconds=0.0,
                    learner_n_actions=K, learner_n_features=D, rollout_mode="conservative",
                    rollout_baseline="constant:1")
    d = Daemon(s, InMemoryTransport(broker=broker, partitions=2), learner(0.3),
               observer=observer, wall_clock=clock)
    d.restore()
    rng = np.random.default_rng(5)
    writer = InMemoryTransport(broker=broker, partitions=2, group_id="caller")
    for i in range(200):
        writer.append_instance(f"e{i}".encode(), orjson.dumps(
            {"id": f"e{i}", "x": rng.normal(size=D).tolist()}))
    for _ in range(5):
        d.step()
    assert observer.seen and all(g == pytest.approx(0.3) for g in observer.seen), observer.seen


def test_a_step_back_whose_checkpoint_a_crash_prevented_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint a switch asks for is written at the end of the step, in the
    background: a kill -9 within ~50 ms of a SIGUSR2 step back lost it, and the restart
    served the old mode (an outside test). The switch is also recorded at once."""
    from streamlearn.service.daemon import MODE_FILE

    broker, clock = InMemoryBroker(), Clock()
    s = settings_of(checkpoint_dir=str(tmp_path), checkpoint_every_events=10**9,
                    checkpoint_every_seconds=1e9, limits_poll_timeout_seconds=0.0,
                    learner_n_actions=K, learner_n_features=D)
    d = Daemon(s, InMemoryTransport(broker=broker, partitions=2), learner(0.1), wall_clock=clock)
    d.restore()
    d.checkpoint(final=True)  # online, on disk
    monkeypatch.setattr(d, "checkpoint", lambda *a, **k: None)  # killed before the next one
    d.request_step_back()
    d.step()
    assert d.adoption.mode == "conservative" and (tmp_path / MODE_FILE).is_file()

    def restarted(settings: Any) -> Daemon:
        again = Daemon(settings, InMemoryTransport(broker=broker, partitions=2), learner(0.1),
                       wall_clock=clock)
        again.restore()
        return again

    again = restarted(s)
    assert again.adoption.mode == "conservative" and again.adoption.epoch == d.adoption.epoch
    assert [h["to"] for h in again.adoption.history] == ["conservative"]
    # another configured mode starts afresh, as with the checkpoint's own record
    fresh = settings_of(checkpoint_dir=str(tmp_path), checkpoint_every_events=10**9,
                        checkpoint_every_seconds=1e9, limits_poll_timeout_seconds=0.0,
                        learner_n_actions=K, learner_n_features=D, rollout_mode="apprentice")
    assert restarted(fresh).adoption.mode == "apprentice"


def test_sigusr2_steps_the_daemon_back_and_the_checkpoint_keeps_it(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from streamlearn.service.metrics import PrometheusObserver

    broker, clock = InMemoryBroker(), Clock()
    registry = CollectorRegistry()
    s = settings_of(checkpoint_dir=str(tmp_path), checkpoint_every_events=10**9,
                       checkpoint_every_seconds=1e9, limits_poll_timeout_seconds=0.0,
                       learner_n_actions=K, learner_n_features=D)
    d = Daemon(s, InMemoryTransport(broker=broker, partitions=2), learner(0.1),
               observer=PrometheusObserver(registry), wall_clock=clock)
    d.restore()
    d.request_step_back()
    assert d.adoption.mode == "online"  # at the next step, not inside the signal handler
    d.step()
    assert d.adoption.mode == "conservative"
    # checkpointed at once, not at the next every_events: a kill -9 now keeps the step back
    # (an outside test lost one 8,400 messages later)
    d._settle_checkpoint(block=True)
    _arrays, meta = read_snapshot(sorted(tmp_path.glob("ckpt-*"))[-1])
    assert meta["adoption"]["mode"] == "conservative"
    crashed = Daemon(s, InMemoryTransport(broker=broker, partitions=2), learner(0.1),
                     wall_clock=clock)
    crashed.restore()
    assert crashed.adoption.mode == "conservative"
    get = registry.get_sample_value
    assert get("streamlearn_rollout_switches_total", {"mode": "conservative"}) == 1.0
    assert get("streamlearn_rollout_mode", {"mode": "conservative"}) == 1.0
    assert get("streamlearn_rollout_mode", {"mode": "online"}) == 0.0
    # the comparisons start afresh: each side's live value is NaN (not the last mode's)
    for side in ("learner", "baseline"):
        live = get("streamlearn_policy_live_value", {"policy": side})
        assert live is not None and np.isnan(live), (side, live)
    d.request_step_back()
    d.step()
    assert get("streamlearn_rollout_switches_total", {"mode": "apprentice"}) == 1.0
    d.checkpoint(final=True)
    _arrays, meta = read_snapshot(sorted(tmp_path.glob("ckpt-*"))[-1])
    assert meta["adoption"]["mode"] == "apprentice"
    assert meta["adoption"]["configured"] == "online"
    assert [h["to"] for h in meta["adoption"]["history"]] == ["conservative", "apprentice"]
    restarted = Daemon(s, InMemoryTransport(broker=broker, partitions=2), learner(0.1),
                       wall_clock=clock)
    restarted.restore()
    assert restarted.adoption.mode == "apprentice"  # a restart does not undo the step back


def test_decisions_in_flight_at_a_mode_change_are_not_credited_to_the_new_mode(
        tmp_path: Path) -> None:
    """An outside tester saw conservative become online 68 ms after it began, on rows served
    under apprentice: the decisions still in flight at a change were counted as the new
    mode's evidence. They carry the epoch they were decided in; the learner still learns
    from them, and once restored from a checkpoint they are still left out."""
    broker, clock = InMemoryBroker(), Clock()
    caller = Caller(broker, clock)
    d = daemon(broker, tmp_path, clock, rollout_mode="conservative")
    caller.publish(0, 100)
    drain(d)  # decided under conservative (epoch 0), not yet answered
    d.request_step_back()
    d.step()
    assert d.adoption.mode == "apprentice" and d.adoption.epoch == 1
    caller.publish(100, 130)
    drain(d)  # decided under apprentice
    d.checkpoint(final=True)
    d = daemon(broker, tmp_path, clock, rollout_mode="conservative")  # restored mid-flight
    assert d.adoption.mode == "apprentice" and d.adoption.epoch == 1
    joins = d.engine.joins
    epochs = [int(joins.columns["epoch"][slot]) for slot in joins.slot_of.values()]
    assert sorted(epochs) == [0] * 100 + [1] * 30
    caller.answer()
    drain(d)
    assert d.adoption.events == 30 == d.adoption.stats["baseline"].n  # not 130
    assert d.counters.learned == 130  # the learner learns from all of them


def test_the_rollout_gauges_show_what_served_and_keep_going_once_online(tmp_path: Path) -> None:
    """Two gauges an outside tester found wrong: ``streamlearn_rollout_share`` showed the
    configured share though events without a baseline are all the learner's, and the
    agreement gauge froze once the mode was online."""
    from prometheus_client import CollectorRegistry

    from streamlearn.service.metrics import PrometheusObserver

    broker, clock = InMemoryBroker(), Clock()
    caller = Caller(broker, clock)
    registry = CollectorRegistry()
    s = settings_of(checkpoint_dir=str(tmp_path), checkpoint_every_events=10**9,
                       checkpoint_every_seconds=1e9, limits_poll_timeout_seconds=0.0,
                       learner_n_actions=K, learner_n_features=D, rollout_mode="apprentice",
                       rollout_explore_budget=0.2)
    d = Daemon(s, InMemoryTransport(broker=broker, partitions=2), learner(0.1),
               observer=PrometheusObserver(registry), wall_clock=clock)
    d.restore()
    get = registry.get_sample_value
    for lo in range(0, 400, 40):  # every other batch without a baseline
        caller.publish(lo, lo + 20)
        caller.publish(lo + 20, lo + 40, baseline=None)
        drain(d)
        caller.answer()
        drain(d)
    # half the events at 0.2, half (no baseline) at 1: about 0.6, not the configured 0.2
    assert get("streamlearn_rollout_share", {"role": "learner"}) == pytest.approx(0.6, abs=0.05)
    assert get("streamlearn_rollout_share", {"role": "baseline"}) == pytest.approx(0.4, abs=0.05)
    d.adoption._switch("online", "for the test")
    before = d.adoption.agreement
    for lo in range(400, 2000, 100):
        caller.publish(lo, lo + 100)
        drain(d)
        caller.answer()
        drain(d)
    assert d.adoption.agreement != before  # it goes on measuring online ...
    assert get("streamlearn_baseline_agreement") == d.adoption.agreement  # ... and shows it
    assert get("streamlearn_rollout_share", {"role": "learner"}) == 1.0


# ------------------------------------- the learner learns its own lesson next to a baseline
@pytest.mark.parametrize("budget", [0.0, 0.1])
def test_a_banditron_next_to_a_baseline_learns_from_its_own_choices(budget: float) -> None:
    """In apprentice mode the logged distribution's maximum is the baseline's action; the
    Banditron corrects its *own* prediction, so the engine must give it its own choice (where
    it had a chance to be logged): taking the maximum, it learned the baseline's mistakes
    (0.44 accuracy with a 10 % budget); taking its choice where it had none, 0.73 without."""
    from streamlearn.datasets.synthetic import synthetic_stream

    n, b, k = 12_000, 32, 9
    X, y = synthetic_stream(n, noise=0.0, seed=3)
    rng = np.random.default_rng(0)
    baseline = np.where(rng.random(n) < 2 / 3, y, rng.integers(0, k, n))  # right 2/3 of the time
    engine = Engine(Banditron(k, X.shape[1], seed=1))
    adoption = Adoption(AdoptionSettings("apprentice", explore_budget=budget))
    own_right = []
    for start in range(0, n, b):
        rows = slice(start, start + b)
        ids = [f"e{i}" for i in range(start, start + b)]
        given = adoption.baselines(baseline[rows], None)
        decided = engine.decide(ids, X[rows], None, labels=y[rows], ts=np.full(b, float(start)),
                                partitions=np.zeros(b, np.int64), wall=float(start),
                                mixture=adoption.wrap(None, given, k), baselines=given)
        own_right.append(decided.columns["exploit"] == y[rows])
        engine.feedback(ids, (decided.actions == y[rows]).astype(float),
                        np.full(b, float(start)), np.zeros(b, np.int64), float(start))
        engine.learn()
    assert np.concatenate(own_right)[-2000:].mean() >= 0.9
