"""Entries of a checkpoint directory whose number this daemon could never have written."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
from loop_helpers import Clock, drain, settings_of

from streamlearn.learners import make_learner
from streamlearn.service.daemon import Daemon
from streamlearn.transport.memory import InMemoryTransport

K, D = 3, 2


def daemon(transport: InMemoryTransport, directory: Path) -> Daemon:
    settings = settings_of(learner_n_actions=K, learner_n_features=D, checkpoint_dir=str(directory),
                              limits_poll_timeout_seconds=0.0)
    d = Daemon(settings, transport, make_learner("linucb", K, D, seed=0), wall_clock=Clock())
    d.restore()
    return d


def test_a_stray_huge_numbered_snapshot_is_ignored_and_restarts_keep_working(tmp_path: Path) -> None:
    transport = InMemoryTransport(partitions=1)
    for i in range(20):
        transport.broker.append("instances", f"e{i}".encode(),
                                orjson.dumps({"id": f"e{i}", "x": [1.0, float(i)]}), 0, 1000 + i)
    first = daemon(transport, tmp_path)
    drain(first)
    first.checkpoint(final=True)
    [snapshot] = [p for p in tmp_path.iterdir() if p.name.startswith("ckpt-")]
    shutil.copytree(snapshot, tmp_path / "ckpt-99999999999999999999")
    (tmp_path / ("ckpt-" + "9" * 200)).mkdir()  # a name too long to be worth an int()
    for _ in range(2):  # crashed at every restart: the next number overflowed the snapshot JSON
        again = daemon(transport, tmp_path)
        drain(again)
        again.checkpoint(final=True)
        assert again.counters.decisions == 20
    numbers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("ckpt-", "journal-")))
    assert all(len(n) < 30 for n in numbers if not n.startswith("ckpt-99999")), numbers
