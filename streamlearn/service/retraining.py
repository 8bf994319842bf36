"""Periodic retraining of batch rankers beside the serving loop: the daemon's part of it.

:class:`Retraining` is a thin composition of four parts, each in its own module:

* :class:`~streamlearn.durability.recorder.ExperienceRecorder` — the experience log
  (:mod:`streamlearn.durability.experience`): every learned decision
  (:meth:`Retraining.record`), flushed with every checkpoint, whose metadata records the
  log position (:meth:`Retraining.position`);
* :class:`~streamlearn.service.retrain_scheduler.RetrainScheduler` — the schedule and the
  worker process (:mod:`streamlearn.service.retrain_worker`): when a retrain is due
  (:meth:`Retraining.tick`), its harvest, timeouts, overruns and failures;
* :class:`~streamlearn.service.ranker_state.RankerState` — the ranker store
  (:mod:`streamlearn.retrain.store`), the promotion, the guarded rollout
  (:mod:`streamlearn.service.rollout`), the rollback (:meth:`Retraining.rollback`,
  SIGUSR1 on ``serve``) and the history;
* :class:`~streamlearn.service.scoring.Scorer` — the hot path: the rankers' scores and
  the policies that share a batch, read by the decide step (:attr:`Retraining.scorer`).

Here: where the log and the artifacts live (``<checkpoint.dir>/experience`` and
``<checkpoint.dir>/rankers``, or a temporary directory removed on close) and the order in
which the parts open, tick and close.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from streamlearn.durability.experience import ExperienceLog
from streamlearn.durability.recorder import REQUESTS_DIR, ExperienceRecorder, learned_part
from streamlearn.join.pending import Closed
from streamlearn.retrain.artifact import RankerArtifact
from streamlearn.retrain.store import RankerStore, read_ranker_state
from streamlearn.service.metrics import Observer
from streamlearn.service.ranker_state import RankerState
from streamlearn.service.retrain_scheduler import RetrainScheduler, check_rankers
from streamlearn.service.retrain_worker import RetrainWorker
from streamlearn.service.rollout import Rollout
from streamlearn.service.scoring import Scorer, ranking_lists
from streamlearn.service.settings import DaemonSettings

__all__ = ["Retraining", "ranking_lists", "read_ranker_state"]


class Retraining:
    """The experience log, the schedule, the ranker state and the scorer (module doc)."""

    def __init__(self, settings: DaemonSettings, observer: Observer,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._temporary: Path | None = None
        # absolute: artifact paths in rankers/state.json must not depend on the directory
        # serve (or evaluate) was started in
        if settings.checkpoint.dir:
            base = Path(settings.checkpoint.dir).absolute()
        elif settings.experience.dir:
            base = Path(settings.experience.dir).absolute().parent
        else:  # nothing is kept across runs: a temporary directory, removed on close
            base = self._temporary = Path(tempfile.mkdtemp(prefix="streamlearn-experience-"))
        log_dir = Path(settings.experience.dir).absolute() if settings.experience.dir \
            else base / "experience"
        def experience_log(directory: Path) -> ExperienceLog:
            e = settings.experience
            return ExperienceLog(directory, e.segment_rows, e.segment_seconds, e.retention_bytes,
                                 e.retention_seconds, wall_clock)

        self.experience = ExperienceRecorder(
            experience_log(log_dir),
            experience_log(log_dir / REQUESTS_DIR) if settings.candidates.enabled else None,
            settings.retrain.holdout_fraction)
        if settings.retrain_enabled:
            check_rankers(settings)
        self.rankers = RankerState(settings, observer, base / "rankers", wall_clock)
        self.scheduler = RetrainScheduler(settings, observer, self.experience.log, self.rankers,
                                          wall_clock, flush=self.experience.flush)
        self.scorer = Scorer(self.rankers, settings.learner.n_actions)

    # the parts' state, as the daemon, ``serve`` and the tests read it
    @property
    def enabled(self) -> bool:
        return self.scheduler.enabled

    @property
    def policy(self) -> str:
        return self.rankers.policy

    @property
    def log(self) -> ExperienceLog:
        return self.experience.log

    @property
    def worker(self) -> RetrainWorker:
        return self.scheduler.worker

    @property
    def failures(self) -> int:
        return self.scheduler.failures

    @property
    def retrains(self) -> int:
        return self.scheduler.retrains

    @property
    def skipped(self) -> int:
        return self.scheduler.skipped

    @property
    def store(self) -> RankerStore:
        return self.rankers.store

    @property
    def state(self) -> dict[str, Any]:
        return self.rankers.state

    @property
    def rollout(self) -> Rollout:
        return self.rankers.rollout

    @property
    def live(self) -> RankerArtifact | None:
        return self.rankers.live

    @property
    def promoted(self) -> RankerArtifact | None:
        return self.rankers.promoted

    @property
    def serving(self) -> RankerArtifact | None:
        return self.rankers.serving

    @property
    def exploits(self) -> bool:
        return self.scorer.exploits

    # ------------------------------------------------------------------ calls
    def open(self, position: dict[str, Any] | None, restored: bool,
             rollout: tuple[dict[str, np.ndarray], dict[str, Any]] | None = None) -> None:
        """Recover the log to the checkpoint's position, reload the rankers and the rollout,
        start the worker.

        ``restored``: a checkpoint was restored (``position`` is its log position; one
        written before the log existed has none: the segments are kept). ``rollout``: the
        checkpoint's rollout state, if it has one.
        """
        self.experience.open(position, restored)
        self.rankers.open(rollout)
        self.scheduler.start()  # its imports run while the loop serves

    def record(self, closed: Closed) -> None:
        """Append the learned rows of a closed batch to the log; the rollout watches them."""
        rows = self.experience.record(closed)
        if not len(rows):
            return
        self.scheduler.since_last += len(rows)
        served = closed.columns.get("served_by")
        if served is not None and self.rankers.rollout.serving():
            n = len(closed)
            self.rankers.observe(learned_part(served, rows, n),
                                 learned_part(closed.rewards, rows, n))

    def tick(self, watermark: Callable[[], float] = lambda: math.inf) -> None:
        """A requested rollback, then the scheduler's tick (never waits for the worker)."""
        self.rankers.rollback_if_requested()
        self.scheduler.tick(watermark)

    def request_rollback(self) -> None:
        """Ask for :meth:`rollback` at the next tick (safe from a signal handler)."""
        self.rankers.request_rollback()

    def rollback(self) -> None:
        """Revert the newest promotion (:meth:`RankerState.rollback`)."""
        self.rankers.rollback()

    def roles(self) -> dict[str, float]:
        """The share of the learner's traffic each role serves."""
        return self.rankers.roles()

    def position(self) -> dict[str, Any]:
        """Flush the log; its position for the checkpoint's metadata."""
        return self.experience.position()

    def close(self) -> None:
        self.scheduler.close()
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
