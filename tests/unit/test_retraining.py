"""The daemon retrains rankers beside the loop: log, schedule, swap, ranking, restart, failures."""

from __future__ import annotations

import concurrent.futures as futures
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import test_daemon_fake as f
from test_daemon_fake import Caller, Clock, learner, settings

from streamlearn.durability.experience import read_experience
from streamlearn.errors import ConfigError, DataError
from streamlearn.learners import Banditron, FixedGamma
from streamlearn.rankers.base import FitData, Ranker
from streamlearn.service.daemon import Daemon
from streamlearn.service.metrics import Observer
from streamlearn.service.retraining import read_ranker_state
from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport


class Exploding(Ranker):
    """A ranker whose training always fails (the worker must survive it)."""

    def _fit(self, data: FitData) -> None:
        raise RuntimeError("planted failure")

    def _score(self, X: np.ndarray) -> np.ndarray:
        return np.zeros(len(X))


class NaNScoring(Ranker):
    """A ranker that fits, but scores NaN."""

    def _fit(self, data: FitData) -> None:
        pass

    def _score(self, X: np.ndarray) -> np.ndarray:
        return np.full(len(X), np.nan)


class Recorder(Observer):
    def __init__(self) -> None:
        self.retrains: list[float] = []
        self.failures = 0
        self.promotions: list[str] = []
        self.rollbacks: list[str] = []
        self.live_values: dict[str, float] = {}
        self.values: dict[tuple[str, str], tuple[float, float, float]] = {}

    def on_rollback(self, reason: str) -> None:
        self.rollbacks.append(reason)

    def on_policy_live_value(self, policy: str, value: float) -> None:
        self.live_values[policy] = value

    def on_retrain(self, duration_s: float) -> None:
        self.retrains.append(duration_s)

    def on_retrain_failure(self) -> None:
        self.failures += 1

    def on_promotion(self, outcome: str) -> None:
        self.promotions.append(outcome)

    def on_policy_value(self, policy: str, estimator: str, value: float, low: float,
                        high: float) -> None:
        self.values[policy, estimator] = (value, low, high)


def retrain_settings(tmp: Path | None, **kw: Any) -> Any:
    base = {"retrain_every_events": 300, "retrain_rankers": "rocchio",
            "retrain_worker": "thread", "retrain_window_rows": 1000,
            "experience_segment_rows": 200}
    return settings(tmp, **{**base, **kw})


def run(daemon: Daemon, caller: Caller, clock: Clock, lo: int, hi: int, block: int = 100,
        wait_for_retrain: bool = True) -> None:
    for start in range(lo, hi, block):
        caller.publish(start, min(hi, start + block), clock.t)
        daemon.step()
        caller.answer(clock.t)
        daemon.step()
        clock.t += 0.01
        job = daemon.retraining.worker.job if daemon.retraining is not None else None
        if wait_for_retrain and job is not None:
            futures.wait([job], timeout=60)  # the test waits; the daemon never does
            daemon.step()


def test_retrains_on_schedule_and_decisions_carry_the_live_ranking(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    transport = InMemoryTransport(broker=broker, partitions=2)
    observer = Recorder()
    daemon = Daemon(retrain_settings(tmp_path), transport, learner(), observer, clock)
    daemon.restore()
    caller = Caller(broker)
    run(daemon, caller, clock, 0, 1200)
    daemon.checkpoint(final=True)
    assert len(observer.retrains) >= 3 and observer.failures == 0
    assert {"learner", "uniform", "best_constant"} <= {p for p, _ in observer.values}
    assert len(observer.promotions) == len(observer.retrains)
    state = read_ranker_state(tmp_path / "rankers")
    assert state["live"] and Path(state["live"]).is_dir()
    assert len(state["history"]) == len(observer.retrains)
    for entry in state["history"]:  # the rule: promoted exactly when a challenger passed
        assert entry["promoted"] == any(c["passed"] for c in entry["challengers"]), entry
    decisions = [orjson.loads(m.value or b"") for m in broker.messages("decisions")]
    ranked = [d for d in decisions if "ranking" in d]
    assert ranked and "ranking" not in decisions[0]  # no ranking before the first retrain
    assert all(sorted(d["ranking"]) == list(range(9)) for d in ranked)
    # every learned decision is in the log once, with what was decided and answered
    rows = read_experience(tmp_path / "experience")
    assert len(rows.ids) == len(set(rows.ids)) == daemon.counters.feedback["joined"]
    by_id = {d["id"]: d for d in decisions}
    assert all(by_id[i]["action"] == a for i, a in zip(rows.ids, rows.actions.tolist(), strict=True))
    assert np.allclose(rows.propensities, [by_id[i]["prob"] for i in rows.ids], rtol=1e-6)
    # `streamlearn evaluate --retrain V` reproduces what the loop estimated in retrain V
    from streamlearn.cli import main

    entry = state["history"][1]
    assert main(["evaluate", str(tmp_path / "experience"), "--retrain", str(entry["version"]),
                 "--policy", "learner", "--policy", "best_constant", "--estimator", "snips,dr",
                 "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    for policy in ("learner", "best_constant"):
        for estimator in ("snips", "dr"):
            assert report["estimates"][policy][estimator] == entry["estimates"][policy][estimator]
    assert main(["evaluate", str(tmp_path / "experience"), "--retrain", "999"]) == 2
    assert "one of" in capsys.readouterr().err


def test_a_restart_neither_loses_nor_duplicates_log_rows(tmp_path: Path) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    caller = Caller(broker)
    first = Daemon(retrain_settings(tmp_path), InMemoryTransport(broker=broker, partitions=2),
                   learner(), Observer(), clock)
    first.restore()
    run(first, caller, clock, 0, 700)
    # a crash: the log was flushed past the last checkpoint (rows the restart joins again)
    assert first.retraining is not None
    first.retraining.log.flush()
    assert first.checkpointer is not None
    first.checkpointer.close()
    second = Daemon(retrain_settings(tmp_path), InMemoryTransport(broker=broker, partitions=2),
                    learner(), Observer(), clock)
    second.restore()
    run(second, caller, clock, 700, 1200)
    second.checkpoint(final=True)
    rows = read_experience(tmp_path / "experience")
    assert len(rows.ids) == len(set(rows.ids))  # nothing twice
    pending = set(second.join.slot_of)
    assert set(rows.ids) | pending == set(caller.feedback_ids)  # nothing lost


def test_a_moved_checkpoint_directory_keeps_its_rankers_and_refuses_a_partial_window(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rankers' state records absolute artifact paths; a checkpoint directory copied
    elsewhere (a restore onto another volume) used them, and read another store's artifacts
    or none (an outside test). Artifacts are found by name in the directory's own store, and
    `evaluate --retrain V` refuses a window that retention has cut instead of quietly
    judging fewer rows."""
    import shutil

    from streamlearn.cli import main

    broker, clock = InMemoryBroker(2), Clock()
    first = tmp_path / "first"
    daemon = Daemon(retrain_settings(first), InMemoryTransport(broker=broker, partitions=2),
                    learner(), Recorder(), clock)
    daemon.restore()
    run(daemon, Caller(broker), clock, 0, 900)
    daemon.checkpoint(final=True)
    history = read_ranker_state(first / "rankers")["history"]
    entry = next(e for e in history if any(c["version"] == e["version"]
                                           for c in e["challengers"]))
    policy = f"ranker:{entry['challengers'][0]['name']}"
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    shutil.move(first / "rankers", tmp_path / "elsewhere")  # the old paths lead nowhere now
    assert main(["evaluate", str(moved / "experience"), "--retrain", str(entry["version"]),
                 "--policy", policy, "--estimator", "snips", "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert report["estimates"][policy]["snips"] == entry["estimates"][policy]["snips"]
    again = Daemon(retrain_settings(moved), InMemoryTransport(broker=broker, partitions=2),
                   learner(), Recorder(), clock)
    again.restore()
    assert again.retraining is not None and again.retraining.rankers.live is not None
    assert str(again.retraining.rankers.live.path).startswith(str(moved))
    from streamlearn.commands.inspect import describe_rankers

    shown = describe_rankers(moved / "rankers")  # inspect names the copy's own artifacts
    assert shown is not None and str(shown["live"]).startswith(str(moved / "rankers"))
    lo, hi = entry["segments"]
    (moved / "experience" / f"segment-{lo:08d}.npz").unlink()  # it holds rows of the window
    assert main(["evaluate", str(moved / "experience"), "--retrain", str(entry["version"])]) == 2
    err = capsys.readouterr().err
    assert f"segments {lo}..{hi} with {entry['rows']:,} rows" in err, err
    assert f"no longer holds segment(s) {lo} (removed by experience retention" in err, err
    # a missing segment that held none of the window's rows changes nothing, unless the
    # window was cut at its row cap (older rows could then have taken their place)
    from streamlearn.durability.experience import require_window

    left = read_experience(moved / "experience", lo + 1, hi)
    same = {"version": 9, "segments": [lo, hi], "rows": len(left), "max_rows": None}
    require_window(same, left, moved / "experience")
    with pytest.raises(DataError, match=f"no longer holds segment.s. {lo} "):
        require_window({**same, "max_rows": len(left)}, left, moved / "experience")


def test_a_failing_retrain_is_counted_and_the_loop_goes_on(tmp_path: Path) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    observer = Recorder()
    daemon = Daemon(retrain_settings(tmp_path, retrain_rankers="test_retraining:Exploding"),
                    InMemoryTransport(broker=broker, partitions=2), learner(), observer, clock)
    daemon.restore()
    caller = Caller(broker)
    run(daemon, caller, clock, 0, 800)
    assert observer.failures >= 2 and observer.retrains == []
    assert daemon.counters.instances == 800


def test_a_ranker_that_fails_among_others_is_counted_and_the_others_are_judged(
        tmp_path: Path) -> None:
    """One NaN-scoring ranker skipped every retrain ("y_score must be finite"), uncounted, so
    the good ranker beside it was never judged and no alert fired (an outside test)."""
    broker, clock = InMemoryBroker(2), Clock()
    observer = Recorder()
    daemon = Daemon(retrain_settings(tmp_path, retrain_rankers="rocchio,test_retraining:NaNScoring"),
                    InMemoryTransport(broker=broker, partitions=2), learner(), observer, clock)
    daemon.restore()
    run(daemon, Caller(broker), clock, 0, 800)
    assert len(observer.retrains) >= 2 and observer.failures == len(observer.retrains)
    history = read_ranker_state(tmp_path / "rankers")["history"]
    assert history and all(c["name"] == "rocchio" for h in history for c in h["challengers"])
    assert all(h["challengers"] for h in history)
    assert not list((tmp_path / "rankers").glob("nanscoring-*"))  # no artifact of it
    from streamlearn.commands.inspect import _history_line

    assert all("nanscoring" in h["failed_rankers"] for h in history)  # and inspect says so
    assert "; ranker nanscoring FAILED (DataError: " in _history_line(history[-1])


def test_a_window_without_rewards_is_skipped_not_failed(tmp_path: Path) -> None:
    """Nothing rewarded yet (every decision answered 0): no ranker can learn; the retrain is
    skipped, which is not a failure (it would page someone)."""
    broker, clock = InMemoryBroker(2), Clock()
    observer = Recorder()
    daemon = Daemon(retrain_settings(tmp_path), InMemoryTransport(broker=broker, partitions=2),
                    learner(), observer, clock)
    daemon.restore()
    caller = Caller(broker)
    original = f.Y.copy()
    f.Y[:] = -1  # no action is ever the label: every reward is 0
    try:
        run(daemon, caller, clock, 0, 700)
    finally:
        f.Y[:] = original
    assert daemon.retraining is not None and daemon.retraining.skipped >= 1
    assert observer.failures == 0 and observer.retrains == []


def test_the_gauges_hold_what_the_history_records_and_inspect_reads_it_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ranker that never picks what the logger picked is still evaluated, as deployed (its
    exploration overlaps the logger's): every estimate of the last retrain is on the real
    Prometheus gauges exactly as in the history (a null one as NaN), and inspect reads it."""
    from prometheus_client import CollectorRegistry

    from streamlearn.service.metrics import PrometheusObserver

    monkeypatch.setenv("PLANTED_LOG_DIR", str(tmp_path / "experience"))
    broker, clock = InMemoryBroker(2), Clock()
    registry = CollectorRegistry()
    daemon = Daemon(retrain_settings(tmp_path, retrain_rankers="planted:NeverLogged"),
                    InMemoryTransport(broker=broker, partitions=2), learner(),
                    PrometheusObserver(registry), clock)
    daemon.restore()
    run(daemon, Caller(broker), clock, 0, 700)
    assert daemon.retraining is not None and daemon.retraining.retrains >= 1
    assert daemon.retraining.failures == 0
    history = read_ranker_state(tmp_path / "rankers")["history"]
    assert not history[-1]["promoted"]
    for policy, by_estimator in history[-1]["estimates"].items():
        for estimator, recorded in by_estimator.items():
            labels = {"policy": policy, "estimator": estimator}
            for name, key in (("streamlearn_policy_value", "value"),
                              ("streamlearn_policy_value_lower", "low"),
                              ("streamlearn_policy_value_upper", "high")):
                value = registry.get_sample_value(name, labels)
                assert value is not None, (name, labels)
                if recorded[key] is None:
                    assert np.isnan(value), (name, labels)
                else:
                    assert value == pytest.approx(recorded[key]), (name, labels)
    never = history[-1]["estimates"]["ranker:neverlogged"]["bound"]
    assert 0.0 <= never["low"] <= never["value"] <= never["high"] <= 1.0
    from streamlearn.cli import main

    assert main(["inspect", str(tmp_path)]) == 0  # the history reads back


class BrokenGauge(Recorder):
    """An observer whose off-policy gauge fails once (a bug in applying a retrain result)."""

    def __init__(self) -> None:
        super().__init__()
        self.broken = True

    def on_policy_value(self, policy: str, estimator: str, value: float, low: float,
                        high: float) -> None:
        if self.broken:
            self.broken = False
            raise TypeError("planted failure while applying a retrain result")
        super().on_policy_value(policy, estimator, value, low, high)


def test_a_result_that_cannot_be_applied_is_a_counted_failure_not_a_crash(
        tmp_path: Path) -> None:
    """A restarted daemon would meet the same logged data and the same failure again: applying
    a retrain result never stops serving; the failure is counted and the next retrain applies."""
    broker, clock = InMemoryBroker(2), Clock()
    observer = BrokenGauge()
    daemon = Daemon(retrain_settings(tmp_path), InMemoryTransport(broker=broker, partitions=2),
                    learner(), observer, clock)
    daemon.restore()
    run(daemon, Caller(broker), clock, 0, 1200)
    assert daemon.retraining is not None
    assert observer.failures == daemon.retraining.failures == 1
    assert len(observer.retrains) >= 3 and len(observer.promotions) == len(observer.retrains) - 1
    assert len(read_ranker_state(tmp_path / "rankers")["history"]) == len(observer.retrains) - 1
    decisions = [orjson.loads(m.value or b"") for m in broker.messages("decisions")]
    assert len({d["id"] for d in decisions}) == 1200  # every instance was decided


def test_an_unknown_ranker_is_a_config_error_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no_such_module:Nothing"):
        Daemon(retrain_settings(tmp_path, retrain_rankers="no_such_module:Nothing"),
               InMemoryTransport(), learner())


def test_a_dead_worker_process_is_replaced(tmp_path: Path) -> None:
    broker, clock = InMemoryBroker(2), Clock()
    observer = Recorder()
    daemon = Daemon(retrain_settings(tmp_path, retrain_worker="process"),
                    InMemoryTransport(broker=broker, partitions=2), learner(), observer, clock)
    daemon.restore()
    caller = Caller(broker)
    run(daemon, caller, clock, 0, 400, wait_for_retrain=False)
    retraining = daemon.retraining
    assert retraining is not None and retraining.worker._executor is not None
    for pid in list(retraining.worker._executor._processes):  # type: ignore[attr-defined]
        import os
        import signal

        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while observer.failures == 0 and time.monotonic() < deadline:
        daemon.step()
        time.sleep(0.05)
    assert observer.failures == 1
    run(daemon, caller, clock, 400, 1000)
    assert observer.retrains, "a new worker retrained after the crash"


def until_promoted(daemon: Daemon, caller: Caller, clock: Clock, observer: Recorder,
                   limit: int) -> int:
    """Serve blocks of 100 events until a ranker is promoted (or ``limit`` events): the next
    event number."""
    start = 0
    while "promoted" not in observer.promotions and start < limit:
        run(daemon, caller, clock, start, start + 100)
        start += 100
    return start


def planted_ranker_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage: float = 0.5
                          ) -> tuple[InMemoryBroker, Clock, Recorder, Daemon]:
    """A Banditron daemon retraining the planted nearest-centroid ranker every 300 events,
    policy = ranker, its rollout held at its first stage (``stage`` of the events)."""
    monkeypatch.setenv("PLANTED_LOG_DIR", str(tmp_path / "experience"))
    broker, clock = InMemoryBroker(2), Clock()
    observer = Recorder()
    daemon = Daemon(retrain_settings(tmp_path, retrain_rankers="planted:CentroidOracle",
                                     retrain_policy="ranker", retrain_every_events=300,
                                     retrain_holdout_fraction=0.5, retrain_rollout_stages=str(stage),
                                     retrain_rollout_stage_events=100_000),
                    InMemoryTransport(broker=broker, partitions=2),
                    Banditron(9, 400, FixedGamma(0.3), seed=11), observer, clock)
    daemon.restore()
    return broker, clock, observer, daemon


def test_a_better_ranker_is_promoted_rolled_out_and_rolled_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The planted nearest-centroid ranker beats a barely trained Banditron: once its
    evidence is enough it is promoted, then (policy = ranker) it serves its rollout share —
    each decision it serves names it and picks its top action unless exploring; a rollback
    returns to the learner."""
    broker, clock, observer, daemon = planted_ranker_daemon(tmp_path, monkeypatch)
    caller = Caller(broker)
    retraining = daemon.retraining
    assert retraining is not None
    start = until_promoted(daemon, caller, clock, observer, 1000)
    history = read_ranker_state(tmp_path / "rankers")["history"]
    assert "promoted" in observer.promotions, history[-1]["reason"]
    assert retraining.exploits and retraining.promoted is not None
    assert retraining.rollout.candidate is not None
    run(daemon, caller, clock, start, start + 400, wait_for_retrain=False)
    decisions = [orjson.loads(m.value or b"") for m in broker.messages("decisions")]
    late = [d for d in decisions if int(d["id"][1:]) >= start + 100]
    assert len(late) == 300
    served = [d for d in late if "policy" in d]
    assert 100 < len(served) < 200  # half of them, drawn by key
    assert all(d["policy"] == f"centroidoracle-v{retraining.promoted.version}" for d in served)
    top = sum(d["action"] == d["ranking"][0] for d in served) / len(served)
    assert top > 0.6  # 1 − γ + γ/9 = 0.73 of them
    retraining.request_rollback()  # what SIGUSR1 does in serve
    daemon.step()
    assert not retraining.exploits and observer.promotions[-1] == "rolled_back"
    assert observer.rollbacks == ["manual"]
    state = read_ranker_state(tmp_path / "rankers")
    assert state["history"][-1]["promoted_now"] is None and state["promoted"] == []


def test_no_challenger_replaces_a_candidate_while_it_rolls_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A challenger that passed while a candidate served 10 % had been judged against the
    rollout's mixture, 90 % what served before, and replaced the candidate it was hardly
    compared with (an outside test: 17 of 21 such replacements claimed an advantage above
    the true one; one replaced a candidate worth 0.29 by a ranker worth 0.20). While a
    candidate rolls out nothing is promoted; the history says why. A rollback (SIGUSR1)
    then leaves the learner, and the candidate's live value reads NaN."""
    from streamlearn.retrain.promotion import promotion_decision

    broker, clock, observer, daemon = planted_ranker_daemon(tmp_path, monkeypatch, stage=0.1)
    caller = Caller(broker)
    retraining = daemon.retraining
    assert retraining is not None
    start, passed_meanwhile = 0, 0
    while start < 4000 and not passed_meanwhile:
        run(daemon, caller, clock, start, start + 100)
        start += 100
        history = read_ranker_state(tmp_path / "rankers").get("history", [])
        passed_meanwhile = sum(
            1 for h in history if "rolls out" in (h.get("reason") or "")
            and promotion_decision({"challengers": h["challengers"]})["promote"])
    assert observer.promotions.count("promoted") == 1, history[-1]
    assert passed_meanwhile >= 1, "a challenger passed while the candidate rolled out"
    assert "replaced" not in observer.rollbacks
    assert retraining.rollout.candidate is not None and retraining.rollout.live is None
    assert "candidate:centroidoracle" in observer.live_values
    retraining.request_rollback()
    daemon.step()
    assert retraining.rollout.serving() == [] and retraining.rollout.shares() == {0: 1.0}
    # a role nobody holds any more reads NaN (it kept its last value for good)
    assert np.isnan(observer.live_values["candidate:centroidoracle"])
    state = read_ranker_state(tmp_path / "rankers")
    assert state["promoted"] == [] and state["history"][-1]["promoted_now"] is None
    # checkpointed at once: a kill -9 now restores the rollback, not the candidate
    daemon._settle_checkpoint(block=True)
    crashed = Daemon(daemon.settings, InMemoryTransport(broker=broker, partitions=2),
                     Banditron(9, 400, FixedGamma(0.3), seed=11), Recorder(), clock)
    crashed.restore()
    assert crashed.retraining is not None and crashed.retraining.rollout.serving() == []


def test_a_rollback_that_state_json_holds_and_the_checkpoint_missed_stays_rolled_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rankers/state.json is written at each change of the rollout and the checkpoint after
    it: a kill -9 between the two left a rolled-back candidate in the checkpoint's rollout,
    and it served again after the restart."""
    broker, clock, observer, daemon = planted_ranker_daemon(tmp_path, monkeypatch)
    caller = Caller(broker)
    until_promoted(daemon, caller, clock, observer, 1000)
    retraining = daemon.retraining
    assert retraining is not None and retraining.rollout.candidate is not None
    candidate = retraining.rollout.candidate.version
    daemon._settle_checkpoint(block=True)
    checkpointed = daemon.checkpoint()  # the candidate at its share, on disk
    assert checkpointed is not None
    monkeypatch.setattr(daemon, "checkpoint", lambda *a, **k: None)  # no checkpoint after this
    retraining.request_rollback()
    daemon.step()
    assert retraining.rollout.serving() == []
    assert read_ranker_state(tmp_path / "rankers")["rollout"]["candidate"] is None

    def restored() -> Daemon:
        again = Daemon(daemon.settings, InMemoryTransport(broker=broker, partitions=2),
                       Banditron(9, 400, FixedGamma(0.3), seed=11), Recorder(), clock)
        again.restore()
        assert again.retraining is not None
        return again

    again = restored()
    assert again.retraining is not None and again.retraining.rollout.serving() == []
    assert again.retraining.rollout.shares() == {0: 1.0}
    # a state.json from before this record (no "rollout"): the checkpoint's rollout stands
    state = read_ranker_state(tmp_path / "rankers")
    del state["rollout"]
    (tmp_path / "rankers" / "state.json").write_bytes(orjson.dumps(state))
    older = restored()
    assert older.retraining is not None
    assert [a.version for a in older.retraining.rollout.serving()] == [candidate]


def _two_promoted(directory: Path) -> tuple[Any, list[Path]]:
    """A RankerState (policy = ranker) whose live ranker v2 was promoted after v1."""
    from loop_helpers import settings_of

    from streamlearn.retrain.artifact import make_ranker, save_artifact
    from streamlearn.service.ranker_state import RankerState
    from streamlearn.service.rollout import Arm

    state = RankerState(settings_of(retrain_every_events=300, retrain_policy="ranker",
                                    retrain_rankers="rocchio"),
                        Observer(), directory, lambda: 0.0)
    state.open()
    ranker = make_ranker("rocchio")
    ranker.fit(np.eye(4), np.array([1.0, 0.0, 1.0, 0.0]))
    paths = [save_artifact(directory, "rocchio", state.take_version(), ranker, 1, 4)
             for _ in range(2)]
    state.state["promoted"] = [str(p) for p in paths]
    state.rollout.restore_live(Arm(2, "rocchio", str(paths[1])))
    state.store.save()
    return state, paths


def test_a_rollback_of_the_live_ranker_is_one_write_of_state_json(tmp_path: Path) -> None:
    """SIGUSR1 on a live ranker puts the one promoted before it back: state.json was written
    with nobody live, then again ~10 ms later with the earlier ranker, and a kill -9 between
    the two restored the learner (an outside test)."""
    state, paths = _two_promoted(tmp_path / "rankers")
    writes: list[dict[str, Any]] = []
    state.store.on_saved = lambda: writes.append(read_ranker_state(tmp_path / "rankers"))
    state.rollback()
    assert len(writes) == 1
    assert writes[0]["rollout"]["live"]["version"] == 1 and writes[0]["promoted"] == [str(paths[0])]
    assert writes[0]["history"][-1]["rolled_back"] == str(paths[1])


def test_each_sigusr1_between_two_steps_rolls_one_change_back(tmp_path: Path) -> None:
    """Four SIGUSR1s 0.4 s apart rolled back three changes: requests made between two steps
    were one (an outside test)."""
    state, _ = _two_promoted(tmp_path / "rankers")
    state.request_rollback()
    state.request_rollback()  # both before the loop looks
    state.rollback_if_requested()
    assert state.rollout.serving() == [] and state.store.promoted == []
    state.rollback_if_requested()  # nothing more asked: nothing more done
    assert len([h for h in state.state["history"] if "rolled_back" in h]) == 2


def test_a_rollback_in_a_moved_directory_takes_the_live_ranker_out(tmp_path: Path) -> None:
    """state.json names artifacts where they were when promoted; in a copied or moved
    directory the rollout's arms name them where they are now, and SIGUSR1 left the live
    ranker on the promoted stack: it went on serving (an outside test)."""
    import shutil

    state, _ = _two_promoted(tmp_path / "old" / "rankers")
    rollout = state.rollout.export()
    shutil.copytree(tmp_path / "old", tmp_path / "new")
    shutil.rmtree(tmp_path / "old")
    from loop_helpers import settings_of

    from streamlearn.service.ranker_state import RankerState

    moved = RankerState(settings_of(retrain_every_events=300, retrain_policy="ranker",
                                    retrain_rankers="rocchio"),
                        Observer(), tmp_path / "new" / "rankers", lambda: 0.0)
    moved.open(rollout)
    assert [a.version for a in moved.rollout.serving()] == [2]
    moved.rollback()
    assert [a.version for a in moved.rollout.serving()] == [1]
    assert [Path(a).name for a in moved.store.promoted] == ["rocchio-v00000001"]
    moved.rollback()
    assert moved.rollout.serving() == [] and moved.store.promoted == []


def test_a_retrain_killed_while_it_ran_is_abandoned_by_name_at_the_restart(tmp_path: Path) -> None:
    """A graceful stop records the retrain it interrupts as abandoned; after a kill -9 its
    version was skipped without a word (an outside test)."""
    from loop_helpers import settings_of

    from streamlearn.retrain.artifact import make_ranker, save_artifact
    from streamlearn.service.ranker_state import RankerState

    def opened() -> RankerState:
        state = RankerState(settings_of(retrain_every_events=300, retrain_rankers="rocchio"),
                            Observer(), tmp_path / "rankers", lambda: 7.0)
        state.open()
        return state

    state = opened()
    version = state.take_version()
    state.started(version)
    ranker = make_ranker("rocchio")
    ranker.fit(np.eye(4), np.array([1.0, 0.0, 1.0, 0.0]))
    save_artifact(tmp_path / "rankers", "rocchio", version, ranker, 1, 4)  # then killed
    assert read_ranker_state(tmp_path / "rankers")["running"]["version"] == version
    again = opened()
    assert again.state["abandoned"][-1]["version"] == version
    assert "killed" in again.state["abandoned"][-1]["reason"]
    assert "running" not in read_ranker_state(tmp_path / "rankers")
    assert not list((tmp_path / "rankers").glob(f"*-v{version:08d}"))
    assert again.take_version() == version + 1  # its number stays skipped
    again.started(version + 1)
    again.finished()  # harvested: nothing to abandon at the next start
    assert len(opened().state["abandoned"]) == 1


def test_an_unloadable_artifact_is_reported_once(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A restore asks for the same artifact as the newest ranker and as a rollout's arm: an
    outside test saw its error logged twice."""
    import logging

    from streamlearn.retrain.store import RankerStore

    store = RankerStore(tmp_path / "rankers")
    store.open()
    (tmp_path / "rankers" / "logistic-v00000003").mkdir()  # no snapshot inside
    with caplog.at_level(logging.ERROR):
        assert store.load("/elsewhere/rankers/logistic-v00000003") is None
        assert store.load(str(tmp_path / "rankers" / "logistic-v00000003")) is None
    errors = [r for r in caplog.records if "cannot be loaded" in r.getMessage()]
    assert len(errors) == 1 and str(tmp_path / "rankers") in errors[0].getMessage()


def test_challengers_are_judged_only_against_what_serves_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retrains ran back to back: the next one's rows all predated a promotion, its
    challengers were judged against the learner and replaced the ranker just promoted, which
    none was compared with (an outside test: 6 of 9 such promotions claimed an advantage
    above the true one). A challenger's evidence starts when what is live last changed, and
    a retrain that started before that change promotes nothing."""
    from streamlearn.service.ranker_state import STALE

    broker, clock, observer, daemon = planted_ranker_daemon(tmp_path, monkeypatch, stage=0.1)
    caller = Caller(broker)
    rankers = daemon.retraining.rankers  # type: ignore[union-attr]
    start = until_promoted(daemon, caller, clock, observer, 1500)
    epoch = rankers.evidence_since()
    assert epoch is not None, "promoted"
    run(daemon, caller, clock, start, start + 900)
    later = [h for h in read_ranker_state(tmp_path / "rankers")["history"]
             if h.get("started", 0) >= epoch and h.get("challengers")]
    assert later
    for entry in later:  # every row of their evidence was decided by what serves now
        assert all(c["since"][0] >= epoch for c in entry["challengers"]), entry["challengers"]
    # a retrain that started before the last change: its verdicts are not acted on
    passed = {"name": "centroidoracle", "version": 99, "artifact": "nowhere", "passed": True,
              "advantage_lower": 0.5, "rows": 500, "ess": 400.0, "alpha": 0.025,
              "value": {"low": 0.5, "high": 0.9, "mean": 0.7}, "looks": 1, "since": [0.0, 0],
              "first_segment": 0, "index": 1}
    kept = list(rankers.state.get("challengers") or [])
    before = observer.promotions.count("promoted")
    rankers.apply({"version": 99, "challengers": [passed], "rankers": {}}, started=epoch - 1.0)
    entry = read_ranker_state(tmp_path / "rankers")["history"][-1]
    assert not entry["promoted"] and entry["reason"].startswith(STALE)
    assert observer.promotions.count("promoted") == before
    assert rankers.state.get("challengers") == kept  # the stale ones are not carried


@pytest.mark.parametrize("failure", ["raises", "nan"])
def test_a_ranker_whose_scores_fail_in_the_serving_loop_is_taken_out_not_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    """A user ranker that raised only in the serving process stopped the daemon, and every
    restart stopped again (an outside test). Its scores failing (raising, or not finite)
    take it out of serving and ranking, a counted retrain failure; the restart serves the
    learner."""
    import planted

    broker, clock, observer, daemon = planted_ranker_daemon(tmp_path, monkeypatch)
    caller = Caller(broker)
    retraining = daemon.retraining
    assert retraining is not None
    start = until_promoted(daemon, caller, clock, observer, 1500)
    assert retraining.exploits and observer.failures == 0

    def broken(self: Any, X: np.ndarray) -> np.ndarray:
        if failure == "raises":
            raise ZeroDivisionError("planted in the serving process")
        return np.full(len(X), np.nan)

    monkeypatch.setattr(planted.CentroidOracle, "_score", broken)
    published = len(broker.messages("decisions"))
    run(daemon, caller, clock, start, start + 200, wait_for_retrain=False)
    assert daemon.counters.instances == start + 200  # every event decided
    assert len(broker.messages("decisions")) == published + 200
    assert observer.failures >= 1 and not retraining.exploits
    assert observer.rollbacks == ["failing"]
    from prometheus_client import CollectorRegistry

    from streamlearn.service.metrics import PrometheusObserver

    PrometheusObserver(CollectorRegistry()).on_rollback("failing")  # a known reason (it raised)
    assert retraining.rankers.serving is None  # nothing ranks with it either
    late = [orjson.loads(m.value or b"") for m in broker.messages("decisions")][published:]
    assert not any("policy" in d or "ranking" in d for d in late[-100:])
    state = read_ranker_state(tmp_path / "rankers")
    assert state["promoted"] == [] and state["live"] is None
    failed = [h for h in state["history"] if "failed_in_serving" in h]
    from streamlearn.commands.inspect import _history_line

    assert failed and _history_line(failed[0]).startswith("FAILED IN SERVING centroidoracle-v")
    daemon.checkpoint(final=True)
    again = Daemon(daemon.settings, InMemoryTransport(broker=broker, partitions=2),
                   Banditron(9, 400, FixedGamma(0.3), seed=11), Recorder(), clock)
    again.restore()  # the restart meets the ranker no more
    assert again.retraining is not None and again.retraining.rollout.serving() == []
    run(again, caller, clock, start + 200, start + 300, wait_for_retrain=False)
    assert again.counters.instances == start + 300
