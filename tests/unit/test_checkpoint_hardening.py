"""Damaged checkpoint directories and save targets: refused or fallen back from, never a traceback.

* ``write_snapshot`` (``replay --save``) replaces only a previous snapshot or an empty directory;
* ``meta.json`` carries its own sha256: any flipped bit is caught (older snapshots have none);
* a snapshot whose offsets, counters, tracker or sections do not restore is corrupt: the older
  one is restored (``Checkpointer.restore(accept=...)``), and when none restores nothing is moved;
* a journal line that is not a valid decision is skipped on its own, never re-published.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_helpers import settings_of

from streamlearn.cli import main
from streamlearn.durability.checkpoint import (
    Checkpointer,
    CheckpointMismatch,
    Restored,
    journal_record_problem,
)
from streamlearn.engine import Engine
from streamlearn.errors import StateError
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.learners import Banditron, FixedGamma, load_learner, save_learner
from streamlearn.service.counters import Counters
from streamlearn.service.settings import DaemonSettings
from streamlearn.service.state import freeze, thaw
from streamlearn.snapshot import META_FILE, meta_checksum, read_snapshot, write_snapshot

K, D = 3, 4
TOPICS = ("instances", "feedback")


class NullTransport:
    def flush(self, timeout_s: float) -> None:
        pass

    def commit(self, offsets: dict[tuple[str, int], int], *, wait: bool = True) -> None:
        pass


# ----------------------------------------------------------------- 1. save targets
def learner() -> Banditron:
    return Banditron(K, D, FixedGamma(0.1), seed=3)


@pytest.mark.parametrize("make", [
    lambda p: (p.mkdir(), (p / "notes.txt").write_text("mine")),
    lambda p: (p.mkdir(), (p / META_FILE).write_text("{}"), (p / "notes.txt").write_text("mine")),
    lambda p: (p.mkdir(), (p / "arrays.npz").mkdir(), (p / META_FILE).write_text("{}")),
    lambda p: p.write_text("a regular file"),
    lambda p: (p.with_name("elsewhere").mkdir(), p.symlink_to(p.with_name("elsewhere"))),
], ids=["dir-with-other-files", "snapshot-plus-a-file", "npz-is-a-dir", "regular-file", "symlink"])
def test_a_target_that_is_not_a_snapshot_is_refused_and_left_as_it_is(
        tmp_path: Path, make: Callable[[Path], Any]) -> None:
    target = tmp_path / "out"
    make(target)
    before = sorted((str(p.relative_to(tmp_path)), p.is_dir()) for p in tmp_path.rglob("*"))
    with pytest.raises(StateError, match=r"Refusing to replace .*out.*Expected a new path"):
        save_learner(learner(), target)
    after = sorted((str(p.relative_to(tmp_path)), p.is_dir()) for p in tmp_path.rglob("*"))
    assert after == before  # nothing renamed, deleted or left behind
    if (target / "notes.txt").exists():
        assert (target / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("existing", ["nothing", "empty-dir", "snapshot"])
def test_a_new_path_an_empty_dir_or_a_previous_snapshot_is_written(
        tmp_path: Path, existing: str) -> None:
    target = tmp_path / "out"
    if existing == "empty-dir":
        target.mkdir()
    if existing == "snapshot":
        save_learner(Banditron(K, D, FixedGamma(0.2), seed=1), target)
    save_learner(learner(), target)
    assert load_learner(target).get_params()["seed"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporaries left


def test_replay_save_refuses_a_user_directory_with_one_line_and_overwrites_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--dataset", "synsep", "--rounds", "300", "--learner", "banditron", "--json"]
    user = tmp_path / "user"
    user.mkdir()
    (user / "thesis.tex").write_text("precious")
    assert main([*argv, "--save", str(user)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Refusing to replace" in err
    assert "thesis.tex" in err and (user / "thesis.tex").read_text() == "precious"
    assert main([*argv, "--save", str(user / "model")]) == 0
    assert main([*argv, "--save", str(user / "model")]) == 0  # twice: its own snapshot
    assert isinstance(load_learner(user / "model"), Banditron)


# ------------------------------------------------------------ 3. meta.json checksum
def test_every_single_bit_flip_in_meta_json_is_caught(tmp_path: Path) -> None:
    write_snapshot(tmp_path / "s", {"w": np.arange(3.0)},
                   {"offsets": [["instances", 0, 3000]], "counters": {"instances": 3000},
                    "x": 0.1})
    path = tmp_path / "s" / META_FILE
    original = path.read_bytes()
    _, meta = read_snapshot(tmp_path / "s")
    key = original.index(b'"meta_sha256"')
    for byte in range(len(original)):
        for bit in range(8):
            flipped = bytearray(original)
            flipped[byte] ^= 1 << bit
            path.write_bytes(bytes(flipped))
            try:
                _, got = read_snapshot(tmp_path / "s")
            except StateError:
                continue
            # only a flip in the checksum's own key name reads back: the content is intact
            assert key < byte < key + len(b'"meta_sha256"') - 1, (byte, bit)
            assert {k: v for k, v in got.items() if k in meta} == meta


def test_a_snapshot_without_a_meta_checksum_is_read_as_before(tmp_path: Path) -> None:
    write_snapshot(tmp_path / "s", {"w": np.arange(3.0)}, {"v": 1})
    path = tmp_path / "s" / META_FILE
    meta = orjson.loads(path.read_bytes())
    del meta["meta_sha256"]
    path.write_bytes(orjson.dumps(meta))
    assert read_snapshot(tmp_path / "s")[1]["v"] == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=20)


@settings(max_examples=60, deadline=None)
@given(meta=st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_any_metadata_round_trips_with_a_matching_checksum(
        tmp_path_factory: pytest.TempPathFactory, meta: dict[str, Any]) -> None:
    target = tmp_path_factory.mktemp("rt") / "s"
    write_snapshot(target, {"w": np.zeros(1)}, meta)
    stored = orjson.loads((target / META_FILE).read_bytes())
    assert stored["meta_sha256"] == meta_checksum(stored)
    _, got = read_snapshot(target)
    reserved = {"format_version", "arrays_sha256", "meta_sha256", "package_version"}
    assert {k: v for k, v in got.items() if k in meta and k not in reserved} == {
        k: v for k, v in meta.items() if k not in reserved}


# --------------------------------------------- 2 + 3. a daemon checkpoint that does not restore
def daemon_settings(tmp: Path) -> DaemonSettings:
    return settings_of(learner_n_actions=K, learner_n_features=D, checkpoint_dir=str(tmp),
                          metrics_window=5)


def two_checkpoints(tmp: Path) -> Checkpointer:
    """ckpt-1 and ckpt-2 of a real daemon state (a learner that learned, counters, tracker)."""
    engine, tracker, counters = Engine(learner()), OnlineErrorTracker(5), Counters()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(8, D))
    a, p = engine.learner.decide(X)
    engine.learner.update(X, a, np.ones(8), p)
    tracker.observe(a, np.ones(8))
    ck = Checkpointer(tmp)
    for seq in (1, 2):
        counters.instances = 100 * seq
        ck.offsets.consumed([("instances", 0, 100 * seq - 1), ("feedback", 1, 50 * seq - 1)])
        arrays, meta = freeze(engine, tracker, counters, daemon_settings(tmp))
        ck.save(NullTransport(), arrays, meta)  # type: ignore[arg-type]
    return ck


def edit_newest_meta(tmp: Path, edit: Callable[[dict[str, Any]], Any], checksum: bool) -> None:
    """Change ckpt-2's meta.json; with ``checksum`` the sha256 is recomputed (a writer's bug),
    without it the snapshot looks like one written before meta checksums (none to catch it)."""
    path = tmp / "ckpt-00000002" / META_FILE
    meta = orjson.loads(path.read_bytes())
    edit(meta)
    meta.pop("meta_sha256")
    if checksum:
        meta["meta_sha256"] = meta_checksum(meta)
    path.write_text(json.dumps(meta))


def restore_like_the_daemon(tmp: Path) -> tuple[Restored | None, OnlineErrorTracker, list[Any]]:
    tracker, thawed = OnlineErrorTracker(7), []
    restored = Checkpointer(tmp).restore(
        accept=lambda r: thawed.append(thaw(r, daemon_settings(tmp), Banditron, tracker)),
        topics=TOPICS)
    return restored, tracker, thawed


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    *parents, last = path.split(".")

    def edit(meta: dict[str, Any]) -> None:
        node = meta
        for name in parents:
            node = node[name]
        node[last] = value
    return edit


def _drop(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda meta: meta.pop(name)


CORRUPTIONS = {
    "learner-list": _set("learner", []),
    "learner-missing": _drop("learner"),
    "counters-list": _set("counters", []),
    "counters-str": _set("counters.instances", "x"),
    "counters-negative": _set("counters.instances", -5),
    "counters-fraction": _set("counters.instances", 1.5),
    "counters-bool": _set("counters.decisions", True),
    "counters-unknown": _set("counters.bogus", 1),
    "checksum-not-a-number": _set("counters.applied_checksum", "12abc"),
    "feedback-negative": _set("counters.feedback", {"joined": -1}),
    "tracker-null": _set("tracker", None),
    "tracker-window-0": _set("tracker.window", 0),
    "tracker-window-negative": _set("tracker.window", -3),
    "tracker-window-not-the-ring": _set("tracker.window", 6),
    "tracker-unknown": _set("tracker.error_rate", 0.5),
    "join-null": _set("join", None),
    "offsets-negative": _set("offsets", [["instances", 0, -100]]),
    "offsets-fraction": _set("offsets", [["instances", 0, 1.7]]),
    "offsets-bool": _set("offsets", [["instances", 0, True]]),
    "offsets-unknown-topic": _set("offsets", [["nope", 0, 5]]),
    "offsets-twice": _set("offsets", [["instances", 0, 5], ["instances", 0, 6]]),
    "offsets-short-row": _set("offsets", [[1]]),
    "offsets-dict": _set("offsets", {}),
    "seq-str": _set("seq", "abc"),
    "learner-params-str": _set("learner.params.n_actions", "3"),
}


@pytest.mark.parametrize("checksum", [True, False], ids=["with-checksum", "legacy"])
@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_a_newest_checkpoint_that_does_not_restore_falls_back_to_the_older_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, checksum: bool) -> None:
    two_checkpoints(tmp_path)
    edit_newest_meta(tmp_path, CORRUPTIONS[name], checksum)
    with caplog.at_level(logging.ERROR, "streamlearn.checkpoint"):
        restored, tracker, thawed = restore_like_the_daemon(tmp_path)
    assert restored is not None and restored.seq == 1
    assert restored.offsets == {("instances", 0): 100, ("feedback", 1): 50}
    assert len(thawed) == 1 and thawed[0][1].instances == 100 and tracker.window == 5
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "ckpt-00000002 is unusable, falling back to an older one" in lines[0]
    assert [p.name for p in tmp_path.glob("ckpt-*")] == ["ckpt-00000001"]
    assert len(list(tmp_path.glob("corrupt-ckpt-00000002-*"))) == 1


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_reading_or_thawing_a_damaged_checkpoint_is_a_state_error_and_leaves_the_tracker(
        tmp_path: Path, name: str) -> None:
    two_checkpoints(tmp_path)
    edit_newest_meta(tmp_path, CORRUPTIONS[name], checksum=False)
    tracker, errors = OnlineErrorTracker(7), []
    try:  # the offsets and the seq are the checkpointer's to check
        restored = Checkpointer._read(2, tmp_path / "ckpt-00000002", TOPICS)
        thaw(restored, daemon_settings(tmp_path), Banditron, tracker)
    except StateError as exc:  # anything else fails the test with its traceback
        errors.append(exc)
    assert len(errors) == 1 and "\n" not in str(errors[0])
    assert vars(tracker)["window"] == 7 and tracker.rounds == 0


def test_a_checkpoint_of_another_learner_is_refused_without_moving_anything(
        tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    tracker = OnlineErrorTracker(5)
    other = settings_of(learner_n_actions=K + 2, learner_n_features=D,
                           checkpoint_dir=str(tmp_path))
    with pytest.raises(CheckpointMismatch, match=r"\(K, d\) = \(3, 4\); \(5, 4\) are configured"):
        Checkpointer(tmp_path).restore(accept=lambda r: thaw(r, other, Banditron, tracker))
    assert [p.name for p in sorted(tmp_path.glob("ckpt-*"))] == ["ckpt-00000001", "ckpt-00000002"]


def test_when_no_checkpoint_restores_it_is_one_clear_error_and_nothing_is_moved(
        tmp_path: Path) -> None:
    two_checkpoints(tmp_path)
    for seq in (1, 2):
        (tmp_path / f"ckpt-{seq:08d}" / "arrays.npz").write_bytes(b"garbage")
    with pytest.raises(StateError, match=r"no checkpoint in .* can be restored: ckpt-00000002: "
                                         r".*; ckpt-00000001: .*Nothing was moved") as exc:
        Checkpointer(tmp_path).restore()
    assert "\n" not in str(exc.value)
    assert [p.name for p in sorted(tmp_path.glob("ckpt-*"))] == ["ckpt-00000001", "ckpt-00000002"]


@pytest.mark.parametrize("error", [AttributeError("x"), ZeroDivisionError("y"), KeyError("z"),
                                   ValueError("w"), RuntimeError("v")])
def test_whatever_the_callers_restore_raises_the_older_checkpoint_is_tried(
        tmp_path: Path, error: Exception) -> None:
    two_checkpoints(tmp_path)

    def accept(restored: Restored) -> None:
        if restored.seq == 2:
            raise error

    restored = Checkpointer(tmp_path).restore(accept=accept)
    assert restored is not None and restored.seq == 1


# ------------------------------------------------------------------- 2. the journal
def record(event_id: str = "e1", action: int = 1, p: list[float] | None = None) -> dict[str, Any]:
    p = [0.1, 0.8, 0.1] if p is None else p
    return {"p": p, "d": {"id": event_id, "action": action, "prob": p[action], "explored": False,
                          "model": "banditron-v1", "ts": 1.5e9}}


def _with(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return _set(path, value)


BAD_LINES = {
    "action-str": _with("d.action", "abc"),
    "action-huge": _with("d.action", 10**6),
    "action-negative": _with("d.action", -7),
    "action-float": _with("d.action", 2.5),
    "action-bool": _with("d.action", True),
    "p-one-entry": _with("p", [1.0]),
    "p-str": _with("p", "x"),
    "p-nulls": _with("p", [None] * K),
    "p-null": _with("p", None),
    "p-not-summing-to-1": _with("p", [0.5, 0.8, 0.5]),
    "p-negative": _with("p", [-0.1, 0.8, 0.3]),
    "p-ragged": _with("p", [0.1, [0.8], 0.1]),
    "p-action-zero": _with("p", [0.5, 0.0, 0.5]),
    "prob-not-p-action": _with("d.prob", 0.3),
    "prob-missing": lambda r: r["d"].pop("prob"),
    "ts-str": _with("d.ts", "x"),
    "ts-missing": lambda r: r["d"].pop("ts"),
    "d-str": _with("d", "x"),
    "id-int": _with("d.id", 5),
    "explored-str": _with("d.explored", "no"),
    "ranking-out-of-range": _with("d.ranking", [1, 9]),
}


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_an_invalid_journal_line_is_skipped_on_its_own_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str) -> None:
    bad = record("bad")
    BAD_LINES[name](bad)
    good = [record(f"g{i}", i % K) for i in range(4)]
    lines = [orjson.dumps(r) for r in (good[0], good[1], bad, good[2], good[3])]
    (tmp_path / "journal-00000000.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with caplog.at_level(logging.WARNING, "streamlearn.checkpoint"):
        for n_actions in (K, None):
            loaded = Checkpointer(tmp_path).journal.load(0, n_actions)
            assert sorted(loaded) == ["g0", "g1", "g2", "g3"]  # the lines after it are kept
    assert any("1 damaged line(s) skipped" in r.getMessage() and "line 3" in r.getMessage()
               for r in caplog.records)


def test_a_row_of_another_width_is_skipped_even_when_k_is_not_known(tmp_path: Path) -> None:
    rows = [record(f"g{i}") for i in range(3)] + [record("odd", 0, [1.0])]
    (tmp_path / "journal-00000000.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n"
                                                               for r in rows))
    assert sorted(Checkpointer(tmp_path).journal.load(0)) == ["g0", "g1", "g2"]


def test_a_directory_named_like_a_segment_is_skipped_set_aside_and_not_pruned_by_force(
        tmp_path: Path) -> None:
    ck = two_checkpoints(tmp_path)
    (tmp_path / "journal-00000099.jsonl").mkdir()
    (tmp_path / "journal-00000000.jsonl").mkdir()  # older than every snapshot: pruned next
    assert Checkpointer(tmp_path).journal.load(0) == {}
    ck.save(NullTransport(), {"w": np.zeros(1)}, {})  # type: ignore[arg-type]  # prunes: no crash
    again = Checkpointer(tmp_path)
    (tmp_path / "journal-00000003.jsonl").unlink()
    (tmp_path / "journal-00000003.jsonl").mkdir()  # the segment restore appends to
    restored = again.restore()
    assert restored is not None and restored.seq == 3
    assert (tmp_path / "journal-00000003.jsonl").is_file()
    assert len(list(tmp_path.glob("corrupt-journal-00000003.jsonl-*"))) == 1
    again.close()


def test_a_torn_last_line_does_not_swallow_the_next_decision(tmp_path: Path) -> None:
    (tmp_path / "journal-00000000.jsonl").write_bytes(
        orjson.dumps(record("a")) + b'\n{"p": [0.1, 0.8, 0.1], "d": {"id": "torn", "act')
    ck = Checkpointer(tmp_path)
    assert ck.restore() is None
    ck.journal.append(["b"], np.array([[0.1, 0.8, 0.1]]), [record("b")["d"]])
    ck.close()
    assert sorted(Checkpointer(tmp_path).journal.load(0, K)) == ["a", "b"]


finite = st.floats(allow_nan=False, allow_infinity=False)
anything = st.none() | st.booleans() | st.integers(-(10**7), 10**7) | st.text(max_size=4) | finite \
    | st.lists(st.none() | finite | st.integers(-5, 5), max_size=5)


@settings(max_examples=150, deadline=None)
@given(edits=st.lists(st.tuples(st.sampled_from(["p", "d.action", "d.prob", "d.ts", "d.id",
                                                 "d.explored", "d.ranking"]), anything),
                      min_size=1, max_size=3))
def test_whatever_a_line_holds_load_returns_only_valid_decisions(
        tmp_path_factory: pytest.TempPathFactory, edits: list[tuple[str, Any]]) -> None:
    directory = tmp_path_factory.mktemp("j")
    rec = record("x")
    for path, value in edits:
        _set(path, value)(rec)
    (directory / "journal-00000000.jsonl").write_bytes(orjson.dumps(rec) + b"\n")
    for event_id, j in Checkpointer(directory).journal.load(0, K).items():
        assert isinstance(event_id, str) and journal_record_problem(
            {"p": j.probs, "d": j.message}, K) is None
        assert isinstance(j.action, int) and 0 <= j.action < K and len(j.probs) == K
        assert math.isclose(sum(j.probs), 1.0, abs_tol=1e-6) and j.probs[j.action] > 0
        assert math.isfinite(j.message["ts"]) and j.message["prob"] == j.probs[j.action]
    for j in Checkpointer(directory).journal.load(0).values():  # K unknown: its row's width
        assert journal_record_problem({"p": j.probs, "d": j.message}) is None
        assert 0 <= j.action < len(j.probs) and j.probs[j.action] > 0
