"""Model synchronisation through the models topic: merge rules, adoption, fencing."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.errors import TransportError
from streamlearn.learners import exploration_from_name, make_learner
from streamlearn.learners.base import Learner
from streamlearn.learners.exploration import Adaptive
from streamlearn.sync.codec import Assembler, parse
from streamlearn.sync.hub import ModelHub
from streamlearn.sync.memory import InMemoryModelLink, ModelLog
from streamlearn.sync.merge import merge, rebase, rule_of

K, D = 3, 6


class Served:
    def __init__(self, learner: Learner) -> None:
        self.learner, self.model_name = learner, "linucb"

    def replace_learner(self, learner: Learner) -> None:
        self.learner = learner


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def learner(name: str = "linucb") -> Learner:
    return make_learner(name, K, D, exploration_from_name("fixed", 0.05), 0)


def data(n: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, D)), rng.integers(0, K, n), rng.random(n),
            np.full((n, K), 1.0 / K))


def globals_in(topic: ModelLog) -> list[dict[str, Any]]:
    return [h for h, _ in (parse(v) for _, v in topic.messages) if h["kind"] == "global"]


@pytest.mark.parametrize("name", ["linucb", "lints"])
def test_merging_ridge_statistics_equals_one_learner_that_saw_everything(name: str) -> None:
    X, a, r, p = data(900, 1)
    base = learner(name).state()[0]
    parts = []
    for lo in (0, 300, 600):
        part = learner(name)
        part.update(X[lo:lo + 300], a[lo:lo + 300], r[lo:lo + 300], p[lo:lo + 300])
        parts.append((part.state()[0], 300.0))
    merged = merge(base, parts)
    one = learner(name)
    one.update(X, a, r, p)
    for key in ("learner.cov", "learner.xty", "learner.mean"):
        np.testing.assert_allclose(merged[key], one.state()[0][key], atol=1e-10)


def test_averaged_arrays_are_weighted_by_examples_and_rebase_keeps_local_progress() -> None:
    base = {"learner.weights": np.zeros(2), "exploration.ring": np.zeros(1)}
    a = {"learner.weights": np.array([4.0, 0.0]), "exploration.ring": np.ones(1)}
    b = {"learner.weights": np.array([0.0, 4.0]), "exploration.ring": np.full(1, 2.0)}
    merged = merge(base, [(a, 3.0), (b, 1.0)])
    assert merged["learner.weights"].tolist() == [3.0, 1.0]
    assert rule_of("exploration.ring") == "local" and rule_of("learner.oracle.scale") == "max"
    now = {"learner.weights": np.array([5.0, 1.0]), "exploration.ring": np.full(1, 7.0)}
    moved = rebase(merged, a, now)  # a published [4, 0], learned [1, 1] more since
    assert moved["learner.weights"].tolist() == [4.0, 2.0] and moved["exploration.ring"][0] == 7


def test_replicas_adopt_the_merged_model_which_pools_everything_they_learned() -> None:
    topic, clock = ModelLog(), Clock()
    hubs = [ModelHub(InMemoryModelLink(topic), f"r{i}", every_s=1.0, clock=clock) for i in range(2)]
    shared = learner()  # replica 0 serves partitions 0 and 1 with one learner
    served = [{0: Served(shared), 1: Served(shared)}, {2: Served(learner())}]
    X, a, r, p = data(600, 2)
    for hub, parts in zip(hubs, served, strict=True):
        hub.tick(parts)  # start records
    shared.update(X[:400], a[:400], r[:400], p[:400])
    served[1][2].learner.update(X[400:], a[400:], r[400:], p[400:])
    clock.t += 1.0
    hubs[1].tick(served[1])  # publishes replica 1
    hubs[0].tick(served[0])  # publishes replica 0, then merges (it serves partition 0)
    assert [g["version"] for g in globals_in(topic)] == [1]
    for hub, parts in zip(hubs, served, strict=True):
        hub.tick(parts)
    one = learner()
    one.update(X, a, r, p)
    for parts in served:
        for daemon in parts.values():
            assert daemon.model_name == "linucb-g1"
            np.testing.assert_allclose(daemon.learner.state()[0]["learner.xty"],
                                       one.state()[0]["learner.xty"], atol=1e-10)
            assert daemon.learner.n_updated_ == 600
    assert served[0][0].learner is served[0][1].learner  # still one learner per replica
    # nothing new learned: no publish, no merge, the version stays
    clock.t += 5.0
    for hub, parts in zip(hubs, served, strict=True):
        hub.tick(parts)
    assert [g["version"] for g in globals_in(topic)] == [1]


def test_progress_made_after_a_publish_is_kept_when_the_merge_arrives() -> None:
    topic, clock = ModelLog(), Clock()
    merger, other = (ModelHub(InMemoryModelLink(topic), n, every_s=1.0, clock=clock) for n in ("m", "o"))
    mine, theirs = {0: Served(learner())}, {1: Served(learner())}
    X, a, r, p = data(900, 5)
    merger.tick(mine)
    other.tick(theirs)
    mine[0].learner.update(X[:300], a[:300], r[:300], p[:300])
    theirs[1].learner.update(X[300:600], a[300:600], r[300:600], p[300:600])
    clock.t += 1.0
    other.tick(theirs)  # publishes 300 examples
    theirs[1].learner.update(X[600:], a[600:], r[600:], p[600:])  # learned after publishing
    merger.tick(mine)  # publishes, merges version 1 (600 examples)
    other.tick(theirs)  # adopts: version 1 plus its 300 newer examples
    one = learner()
    one.update(X, a, r, p)
    np.testing.assert_allclose(theirs[1].learner.state()[0]["learner.xty"],
                               one.state()[0]["learner.xty"], atol=1e-10)
    assert theirs[1].learner.n_updated_ == 900


def test_only_the_merger_reads_the_states_and_a_new_merger_starts_where_the_model_says() -> None:
    topic, clock = ModelLog(), Clock()

    class Recording(InMemoryModelLink):
        def __init__(self, log: ModelLog) -> None:
            super().__init__(log)
            self.read: list[dict[str, Any]] = []  # the headers of every message fetched

        def fetch(self) -> list[bytes]:
            values = super().fetch()
            self.read += [parse(v)[0] for v in values]
            return values

    links = [Recording(topic) for _ in range(2)]
    hubs = [ModelHub(link, f"r{i}", every_s=1.0, clock=clock) for i, link in enumerate(links)]
    parts = [{0: Served(learner())}, {1: Served(learner())}]
    X, a, r, p = data(1200, 7)

    def sync_round(lo: int, hi: int) -> None:
        half = (lo + hi) // 2
        for (lo_, hi_), served in zip([(lo, half), (half, hi)], parts, strict=True):
            next(iter(served.values())).learner.update(X[lo_:hi_], a[lo_:hi_], r[lo_:hi_],
                                                       p[lo_:hi_])
        clock.t += 1.0
        for hub, served in sorted(zip(hubs, parts, strict=True), key=lambda h: 0 in h[1]):
            hub.tick(served)  # the merger last: it merges both states of this round
        for hub, served in zip(hubs, parts, strict=True):
            hub.tick(served)  # both adopt

    for hub, served in zip(hubs, parts, strict=True):
        hub.tick(served)
    sync_round(0, 400)
    assert [links[0].following, links[1].following] == [True, False]
    assert hubs[1].latest == {} and {h["kind"] for h in links[1].read} == {"global"}
    first = globals_in(topic)[-1]
    assert first["version"] == 1 and first["states_from"] > 0
    parts.reverse()  # partition 0 moves: replica 1 merges from now on
    sync_round(400, 800)
    assert [links[0].following, links[1].following] == [False, True]
    assert hubs[0].latest == {}  # dropped with the role
    second = globals_in(topic)[-1]
    assert second["version"] == 2 and second["replica"] == "r1"
    assert {r for r, _ in second["included"]} == {"r0", "r1"}
    # replica 1 read no state older than the model it merged from
    assert {h["base_version"] for h in links[1].read if h["kind"] == "replica"} == {1}
    sync_round(800, 1200)
    one = learner()
    one.update(X, a, r, p)  # the pooled statistics still equal one learner on everything
    for served in parts:
        np.testing.assert_allclose(next(iter(served.values())).learner.state()[0]["learner.xty"],
                                   one.state()[0]["learner.xty"], atol=1e-10)


def test_a_paused_merger_never_overwrites_a_newer_model() -> None:
    topic, clock = ModelLog(), Clock()
    live = ModelHub(InMemoryModelLink(topic), "live", every_s=1.0, clock=clock)
    zombie = ModelHub(InMemoryModelLink(topic), "zombie", every_s=1.0, clock=clock)
    mine, theirs = {0: Served(learner())}, {0: Served(learner())}
    X, a, r, p = data(300, 3)
    zombie.tick(theirs)
    live.tick(mine)
    for parts in (mine, theirs):
        parts[0].learner.update(X, a, r, p)
    clock.t += 1.0
    zombie.tick(theirs)  # publishes its partition state, merges: version 1
    for _ in range(3):  # the zombie is paused; the live replica (partition 0's new owner) goes on
        mine[0].learner.update(X, a, r, p)
        clock.t += 1.0
        live.tick(mine)
    versions = [g["version"] for g in globals_in(topic)]
    assert versions == [1, 2, 3, 4]
    # the zombie wakes up believing version 1 is the newest, holding a partition state based on
    # it (one the live replica merged into version 2 long ago), and merges: it must first read
    # the topic to its end, see version 4, and publish nothing
    stale = next(v for _, v in topic.messages if parse(v)[0]["kind"] == "replica"
                 and parse(v)[0]["base_version"] == 1)
    state = Assembler().add_raw(stale)
    assert state is not None
    zombie.latest = {0: state}
    zombie.link.position = next(i for i, (_, v) in enumerate(topic.messages)
                                if parse(v)[0].get("version") == 1) + 1
    zombie.version = 1
    clock.t += 1.0
    zombie._merge(clock.t, theirs[0])
    assert [g["version"] for g in globals_in(topic)] == [1, 2, 3, 4]  # nothing over 4

    class Blind(InMemoryModelLink):  # a merger that cannot read the topic would overwrite version 2
        def fetch(self) -> list[bytes]:
            return []

        def caught_up(self) -> bool:
            return True

    blind = ModelHub(Blind(topic), "blind", every_s=1.0, clock=clock)
    blind.latest, blind.version, blind.global_state = {0: state}, 1, zombie.global_state
    blind._merge(clock.t, theirs[0])
    assert [g["version"] for g in globals_in(topic)] == [1, 2, 3, 4, 2]


def test_a_young_model_is_published_and_merged_before_the_interval() -> None:
    X, a, r, p = data(400, 9)

    def versions_after(early_fraction: float) -> int:
        topic, clock = ModelLog(), Clock()
        hub = ModelHub(InMemoryModelLink(topic), "m", every_s=10.0, clock=clock,
                       early_fraction=early_fraction)
        mine = {0: Served(learner())}
        hub.tick(mine)
        for lo in range(0, 400, 40):  # ten rounds of 40 examples, 0.1 s apart
            mine[0].learner.update(X[lo:lo + 40], a[lo:lo + 40], r[lo:lo + 40], p[lo:lo + 40])
            clock.t += 0.1
            hub.tick(mine)
        return len(globals_in(topic))

    assert versions_after(0.0) == 0  # the 10 s interval has not passed
    # 40 new examples are >= 5 % of what the model holds until it holds 800: every round
    # publishes, and merges (the in-memory topic has the state at once)
    assert versions_after(0.05) == 10
    assert 0 < versions_after(0.2) < 10  # fewer once 40 examples are < 20 % of the model


def test_an_idle_merger_does_not_ask_for_the_topic_end() -> None:
    class Counting(InMemoryModelLink):
        asked = 0

        def request_catch_up(self) -> None:
            self.asked += 1

    topic, clock = ModelLog(), Clock()
    link = Counting(topic)
    hub = ModelHub(link, "m", every_s=0.25, clock=clock, early_fraction=0.05)
    mine = {0: Served(learner())}
    X, a, r, p = data(64, 4)
    hub.tick(mine)
    mine[0].learner.update(X, a, r, p)
    clock.t += 0.3
    hub.tick(mine)  # something to merge: read to the end, merge
    assert link.asked == 1 and len(globals_in(topic)) == 1
    for _ in range(20):  # nothing learned since: no request, no merge
        clock.t += 0.3
        hub.tick(mine)
    assert link.asked == 1 and len(globals_in(topic)) == 1


class GatedLink(InMemoryModelLink):
    """A models topic whose sends wait until ``gate`` opens, as on a broker that is away."""

    def __init__(self, topic: ModelLog) -> None:
        super().__init__(topic)
        self.gate = threading.Event()
        self.sends = 0

    def send(self, key: bytes, values: list[bytes]) -> None:
        self.sends += 1
        assert self.gate.wait(60), "the test never opened the gate"
        super().send(key, values)


def _until(condition: Any) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.005)


def _until_sent(hub: ModelHub) -> None:
    _until(lambda: not hub.outbox.busy())


def test_a_send_waiting_on_the_broker_holds_no_round_and_no_merge_overtakes_it() -> None:
    topic, clock = ModelLog(), Clock()
    link = GatedLink(topic)
    hub = ModelHub(link, "m", every_s=1.0, clock=clock, background_sends=True)
    try:
        mine = {0: Served(learner())}
        X, a, r, p = data(200, 6)
        hub.tick(mine)
        mine[0].learner.update(X[:100], a[:100], r[:100], p[:100])
        clock.t += 1.0
        hub.tick(mine)  # publishes its state: the send waits on the gate, the round does not
        _until(lambda: link.sends == 1)
        assert hub.outbox.busy() and not topic.messages
        mine[0].learner.update(X[100:], a[100:], r[100:], p[100:])
        for _ in range(5):  # due again, and a merger: nothing more while the send waits
            clock.t += 1.0
            hub.tick(mine)
        assert link.sends == 1 and hub.merges == 0
        link.gate.set()
        _until_sent(hub)
        hub.tick(mine)  # the state is out: publish the newer one
        _until_sent(hub)
        hub.tick(mine)  # then merge both
        _until_sent(hub)
        hub.tick(mine)
        assert [g["version"] for g in globals_in(topic)] == [1] and hub.merges == 1
        hub.tick(mine)
        assert mine[0].model_name == "linucb-g1" and mine[0].learner.n_updated_ == 200
    finally:
        link.gate.set()
        hub.close(5)


def test_a_state_whose_send_failed_is_published_again_at_the_next_round() -> None:
    class FailsOnce(InMemoryModelLink):
        sends = 0

        def send(self, key: bytes, values: list[bytes]) -> None:
            self.sends += 1
            if self.sends == 1:
                raise TransportError("broker away")
            super().send(key, values)

    topic, clock = ModelLog(), Clock()
    link = FailsOnce(topic)
    hub = ModelHub(link, "o", every_s=10.0, clock=clock)
    theirs = {1: Served(learner())}
    X, a, r, p = data(50, 7)
    hub.tick(theirs)
    theirs[1].learner.update(X, a, r, p)
    clock.t += 10.0
    hub.tick(theirs)  # fails
    assert link.sends == 1 and not topic.messages
    clock.t += 0.1  # long before the interval: the failed publish does not count as one
    hub.tick(theirs)
    assert link.sends == 2 and [parse(v)[0]["examples"] for _, v in topic.messages] == [50]


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["letter", "synnonsep"])
def test_three_replicas_in_process_err_within_0_02_of_one(dataset: str) -> None:
    """Immediate feedback, so a replica's staleness between syncs is all that differs (the
    real-broker comparison, with delayed feedback, is docs/performance.md's)."""
    from simulators.scale_out import online_error

    gaps = [online_error(dataset, 3, 60_000, seed) - online_error(dataset, 1, 60_000, seed)
            for seed in range(2)]
    assert float(np.mean(gaps)) <= 0.02, gaps


def test_the_group_simulator_learns_with_three_replicas() -> None:
    """A smoke test of the in-process group (the measured comparison with one replica is in
    docs/operations.md, over 60,000 events and 3 seeds)."""
    from simulators.scale_out import online_error

    single = online_error("synnonsep", 1, events=6000, seed=1)
    group = online_error("synnonsep", 3, events=6000, seed=1)
    uniform = 8 / 9  # SynNonSep has 9 actions
    assert single < 0.5 * uniform and group < 0.5 * uniform


def adaptive_learner(detect_drift: bool = False) -> Learner:
    return make_learner("linucb", K, D, Adaptive(detect_drift=detect_drift, drift_threshold=2.0), 0)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 2), min_size=30, max_size=120), st.integers(0, 10_000))
def test_the_group_pools_the_exploration_statistics_as_one_learner_would(
        owners: list[int], seed: int) -> None:
    """Events dealt to three replicas in any order, with syncs in between: after the last
    merge is adopted every replica estimates the exploit error (and holds Σ c and the event
    count) exactly as one learner that observed every event."""
    topic, clock = ModelLog(), Clock()
    hubs = [ModelHub(InMemoryModelLink(topic), f"r{i}", every_s=1.0, clock=clock)
            for i in range(3)]
    served = [{i: Served(adaptive_learner())} for i in range(3)]
    X, a, r, _ = data(len(owners), seed)
    p = np.random.default_rng(seed).dirichlet(np.ones(K), len(owners))
    for hub, parts in zip(hubs, served, strict=True):
        hub.tick(parts)
    for t, owner in enumerate(owners):
        served[owner][owner].learner.update(X[t:t + 1], a[t:t + 1], r[t:t + 1], p[t:t + 1])
        if t % 7 == 6:  # a sync round now and then, the merger (partition 0) last
            clock.t += 1.0
            for i in (2, 1, 0):
                hubs[i].tick(served[i])
    for _ in range(2):  # publish what is left, merge it, adopt it
        clock.t += 1.0
        for i in (2, 1, 0):
            hubs[i].tick(served[i])
    for i in (2, 1):
        hubs[i].tick(served[i])
    one = adaptive_learner()
    one.update(X, a, r, p)
    want = one.exploration.scalars()
    for i, parts in enumerate(served):
        got = parts[i].learner.exploration.scalars()
        assert got["sum"] == pytest.approx(want["sum"], abs=1e-9), i
        assert got["count"] == want["count"], i


def test_a_change_one_replica_detects_restarts_the_groups_estimate() -> None:
    """A replica whose detector saw a change brings the group to its restarted estimate
    (what it observed since), where the other replica's pre-change feedback would have kept
    the estimate low; the detections count is the group's."""
    topic, clock = ModelLog(), Clock()
    hubs = [ModelHub(InMemoryModelLink(topic), f"r{i}", every_s=1.0, clock=clock)
            for i in range(2)]
    served = [{i: Served(adaptive_learner(detect_drift=True))} for i in range(2)]
    for hub, parts in zip(hubs, served, strict=True):
        hub.tick(parts)
    n = 400
    X = np.random.default_rng(3).normal(size=(n, D))
    exploit = np.zeros(n, dtype=np.int64)  # the played action is the exploit one, p = 0.9
    p = np.full((n, K), 0.05)
    p[:, 0] = 0.9
    served[0][0].learner.update(X, exploit, np.ones(n), p)  # all well
    served[1][1].learner.update(X[:100], exploit[:100], np.ones(100), p[:100])
    served[1][1].learner.update(X[100:], exploit[100:], np.zeros(n - 100), p[100:])  # a change
    assert served[1][1].learner.drift_detections_ >= 1
    assert served[0][0].learner.drift_detections_ == 0
    clock.t += 1.0
    for i in (1, 0, 1, 0):  # publish, publish and merge, adopt
        hubs[i].tick(served[i])
    restarted = served[1][1].learner.exploration
    for i in range(2):
        pooled = served[i][i].learner.exploration
        assert pooled.exploit_error() == pytest.approx(restarted.exploit_error()), i
        assert pooled.exploit_error() > 0.5  # not the 0 the first replica alone had
        assert served[i][i].learner.drift_detections_ == restarted.drift_detections_


def test_a_fenced_librdkafka_merger_closes_without_raising() -> None:
    """A merger fenced by a newer one is dropped; librdkafka then refuses even a flush of the
    fatal producer (KafkaException _FENCED): closing it must not end the replica."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from streamlearn.sync.link_clients import _ConfluentMerger

    fenced = confluent_kafka.KafkaError(confluent_kafka.KafkaError._FENCED, "fenced", fatal=True)
    calls: list[str] = []

    class FencedProducer:
        def purge(self) -> None:
            calls.append("purge")

        def flush(self, timeout: float) -> int:
            calls.append("flush")
            raise confluent_kafka.KafkaException(fenced)

    _ConfluentMerger(FencedProducer(), "models").close()
    assert calls == ["purge", "flush"]
