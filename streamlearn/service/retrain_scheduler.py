"""When a retrain runs, and what becomes of it: the schedule and the worker's supervisor.

Every ``retrain.every_events`` learned decisions or ``retrain.every_seconds``,
:meth:`RetrainScheduler.tick` hands the newest window of the experience log to the
:class:`~streamlearn.service.retrain_worker.RetrainWorker`, which trains the rankers with
clipped inverse-propensity weights, writes each as an immutable artifact and evaluates
them off-policy (:func:`streamlearn.retrain.job.run_retrain`;
:func:`streamlearn.retrain.candidates.run_candidate_retrain` in candidate mode). A
retrain due while the previous one runs is counted as an overrun and starts when the
worker is free; one that outlives ``retrain.timeout_seconds`` is a failure (the worker
is replaced). The loop never waits for the worker.

A finished job is harvested at the next tick and its result handed to the
:class:`~streamlearn.service.ranker_state.RankerState`. A failed or crashed job is
logged and counted, the worker is replaced, and the loop goes on.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from streamlearn.durability.experience import ExperienceLog
from streamlearn.errors import ConfigError, DataError
from streamlearn.retrain.promotion import MAX_EVIDENCE_WINDOWS
from streamlearn.service.metrics import Observer
from streamlearn.service.ranker_state import RankerState
from streamlearn.service.retrain_worker import RetrainWorker
from streamlearn.service.settings import DaemonSettings

__all__ = ["RetrainScheduler", "check_rankers"]

log = logging.getLogger("streamlearn.retrain")


def check_rankers(settings: DaemonSettings) -> None:
    """Make each ranker to retrain once: a bad name is a config error at start, and so are
    two that would write the same artifact (each retrain's ``<name>-v<version>``)."""
    from streamlearn.retrain.artifact import artifact_name, make_ranker

    names = settings.retrain_ranker_names()
    for spec in names:
        make_ranker(spec, queries=settings.candidates.enabled)
    artifacts = [artifact_name(spec) for spec in names]
    twice = sorted({a for a in artifacts if artifacts.count(a) > 1})
    if twice:
        raise ConfigError(f"Expected rankers with distinct artifact names. Got "
                          f"{', '.join(twice)} more than once in {', '.join(names)}.")


class RetrainScheduler:
    """The schedule of the retrain jobs and the worker that runs them (module doc)."""

    def __init__(self, settings: DaemonSettings, observer: Observer, log: ExperienceLog,
                 rankers: RankerState, wall_clock: Callable[[], float] = time.time,
                 flush: Callable[[], None] | None = None) -> None:
        """``flush`` writes what the logs buffer before a job reads them (default: ``log``'s
        flush; in candidate mode the request log's too)."""
        self.settings, self.observer, self.wall_clock = settings, observer, wall_clock
        self.log, self.rankers = log, rankers
        self.flush = flush or log.flush
        self.enabled = settings.retrain_enabled
        self.worker = RetrainWorker(settings.retrain.worker, settings.retrain.worker_nice)
        self.since_last = 0  # learned decisions since the last retrain started
        self._last_start = wall_clock()
        self._overrun_reported = False
        self.failures = 0
        self.running_version: int | None = None  # the newest job's (running while busy)
        self.retrains = 0
        self.skipped = 0

    def close(self) -> None:
        """Stop the worker; a retrain it was running is abandoned (its files removed, the
        history says so)."""
        running = self.worker.job is not None  # running, or finished and not yet harvested
        self.worker.stop()
        if running and self.running_version is not None:
            self.rankers.abandon(self.running_version, "the daemon stopped while it ran; its "
                                 "rankers were not judged")

    def start(self) -> None:
        """Start the worker (when retraining is on); its imports run while the loop serves."""
        if self.enabled:
            self.worker.start()

    def tick(self, watermark: Callable[[], float] = lambda: math.inf) -> None:
        """Harvest a finished job; start one when due (never waits for the worker).

        ``watermark``: when the oldest decision still waiting for feedback was made (asked
        only when a retrain starts) — every decision before it is closed and in the log, so
        retrains judge only those."""
        job = self.worker.take()
        if job is not None:
            self.rankers.finished()
            self._harvest(job)
        if not self.enabled:
            return
        now = self.wall_clock()
        s = self.settings
        due = ((s.retrain.every_events is not None and self.since_last >= s.retrain.every_events)
               or (s.retrain.every_seconds is not None
                   and now - self._last_start >= s.retrain.every_seconds and self.since_last > 0))
        if self.worker.busy:
            running = self.worker.running_for
            if running > s.retrain.timeout_seconds:
                self._failed(f"retrain ran for {running:.0f} s, beyond retrain.timeout_seconds "
                             f"= {s.retrain.timeout_seconds:g}; the worker is replaced")
                self.worker.restart()
            elif due and not self._overrun_reported:
                self._overrun_reported = True
                self.observer.on_retrain_overrun()
                log.warning("a retrain is due but the previous one is still running after %.1f s; "
                            "the next starts when it ends (retrain less often, or give the "
                            "worker more CPU: retrain.worker_nice)", running)
            return
        if due:  # nothing pending: every decision until now is in the log, none after it
            self._start(now, min(watermark(), now))

    def _start(self, now: float, watermark: float) -> None:
        self.flush()  # every log the job reads: the request log too, in candidate mode
        if not self.log.segments():
            return
        s = self.settings
        version = self.running_version = self.rankers.take_version()
        self.rankers.started(version)
        spec: dict[str, Any] = {
            "log_dir": str(self.log.directory), "segments": None, "max_rows": s.retrain_window(),
            "rankers": list(s.retrain_ranker_names()),
            "artifact_dir": str(self.rankers.store.directory),
            "version": version, "clip": s.retrain.clip,
            "holdout_fraction": s.retrain.holdout_fraction, "level": s.retrain.level,
            "current": self.rankers.current_artifact(s.candidates.enabled),
            "watermark": watermark}
        if s.candidates.enabled:
            from streamlearn.retrain.candidates import run_candidate_retrain

            spec["candidates"] = {"d_x": s.candidates.shared_features,
                                  "d_c": s.candidates.candidate_features}
            spec["challenger_index"] = self.rankers.challengers()[1]
            spec["since"] = self.rankers.evidence_since()
            self.worker.submit(run_candidate_retrain, spec)
        else:
            from streamlearn.retrain.job import run_retrain  # the worker's side

            challengers, index = self.rankers.challengers()
            spec["challengers"] = challengers
            spec["max_evidence"] = MAX_EVIDENCE_WINDOWS * s.retrain_window()
            spec["challenger_index"] = index
            spec["since"] = self.rankers.evidence_since()  # judged on what serves now
            self.worker.submit(run_retrain, spec)
        self._last_start, self.since_last, self._overrun_reported = now, 0, False
        log.info("retrain %d started on up to %d logged decisions (%s)", version,
                 s.retrain_window(), ", ".join(s.retrain_ranker_names()))

    def _harvest(self, job: Future[dict[str, Any]]) -> None:
        try:
            result = job.result()
        except BrokenProcessPool as exc:
            self._failed(f"the worker process died ({exc}); starting a new one")
            self.worker.restart()
            return
        except DataError as exc:  # e.g. no rewarded row yet: nothing to learn, not a failure
            self.skipped += 1
            log.warning("retrain skipped: %s", exc)
            return
        except Exception as exc:  # a bug or bad data in a ranker: counted, the loop goes on
            log.exception("retrain failed")
            self._failed(f"{type(exc).__name__}: {exc}")
            return
        self.retrains += 1
        self.observer.on_retrain(time.perf_counter() - self.worker.started)
        try:
            if "candidates" in result:
                self.rankers.apply_candidates(result, self._last_start)
            else:
                self.rankers.apply(result, self._last_start)
        except Exception as exc:  # counted, never fatal: a restart would meet the same result
            log.exception("retrain %s could not be applied", result.get("version"))
            self._failed(f"applying retrain {result.get('version')}: {type(exc).__name__}: {exc}")

    def _failed(self, why: str) -> None:
        self.failures += 1
        self.observer.on_retrain_failure()
        log.error("retrain failed: %s", why)
