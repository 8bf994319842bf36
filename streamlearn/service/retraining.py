"""Periodic retraining of batch rankers beside the serving loop (DESIGN.md §8).

:class:`Retraining` is the daemon's part of it:

* every learned decision goes to the :class:`~streamlearn.stream.experience.ExperienceLog`
  (:meth:`Retraining.record`), flushed with every checkpoint, whose metadata
  records the log position (:meth:`Retraining.position`);
* every ``retrain.every_events`` learned decisions or ``retrain.every_seconds``,
  :meth:`Retraining.tick` flushes the log and hands the window to a background
  worker — a separate process by default (measured in docs/performance.md: a
  thread shares the interpreter lock with the loop) — that trains the rankers
  with clipped inverse-propensity weights, writes each as an immutable artifact
  and evaluates them off-policy on a held-out slice
  (:func:`streamlearn.retrain.job.run_retrain`);
* when the job is done the loop swaps the best new ranker in by one reference
  assignment (:attr:`Retraining.live`; decisions carry its ``ranking``) and
  promotes it only if the lower bound of its estimated value beats the current
  policy's estimate (:func:`streamlearn.retrain.job.promotion_decision`); with
  ``retrain.policy = "ranker"`` the promoted ranker is the exploitation policy.
  :meth:`Retraining.rollback` (SIGUSR1 on ``serve``) returns to the previous one.

A failed or crashed job is logged and counted, the worker is replaced, and the
loop never waits for it. The ranker state (live and promoted artifacts, the
promotion history) is ``state.json`` beside the artifacts, written atomically,
so a restart serves the last good ranker again.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import logging
import math
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.engine import best_first
from streamlearn.errors import DataError, StateError
from streamlearn.features import Batch, take_rows
from streamlearn.retrain.artifact import RankerArtifact, list_artifacts, load_artifact
from streamlearn.retrain.joint import action_scores
from streamlearn.service.metrics import Observer
from streamlearn.service.settings import DaemonSettings
from streamlearn.stream.experience import ExperienceLog, dense_rows
from streamlearn.stream.join import Closed

__all__ = ["Retraining", "ranking_lists", "read_ranker_state"]

log = logging.getLogger("streamlearn.retrain")

STATE_FILE = "state.json"
HISTORY_KEPT = 100


def _worker_init() -> None:
    """A training process yields the CPU to the serving loop: it runs only when a core is
    otherwise idle (Linux ``SCHED_IDLE``; elsewhere the lowest nice level) and with one
    BLAS thread (docs/performance.md: at nice 10 and the BLAS default, p99 decision latency
    tripled on two cores)."""
    with contextlib.suppress(OSError, AttributeError):
        os.nice(19)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    _die_with_parent()
    with contextlib.suppress(ImportError):
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)


def _die_with_parent() -> None:
    """Linux: the worker gets SIGKILL when the daemon dies, even by ``kill -9`` (a pool
    worker otherwise waits for work forever)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        if os.getppid() == 1:  # the parent died before the call
            os._exit(1)


def _warm_up() -> None:
    """The first task of a new worker: it imports what a retrain needs."""
    import streamlearn.retrain.job  # noqa: F401


def read_ranker_state(artifact_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The persisted ranker state (``{}`` if none yet)."""
    path = Path(artifact_dir) / STATE_FILE
    if not path.exists():
        return {}
    try:
        state: dict[str, Any] = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise StateError(f"{path} is not valid JSON: {exc}") from exc
    return state


def ranking_lists(scores: np.ndarray, mask: np.ndarray | None) -> list[list[int]]:
    """Per row, the allowed actions best first.

    >>> ranking_lists(np.array([[0.1, 0.9, 0.5]]), np.array([[True, False, True]]))
    [[2, 0]]
    """
    order: list[list[int]] = best_first(scores, mask).tolist()
    if mask is None:
        return order
    n_allowed = np.asarray(mask, dtype=bool).sum(axis=1).tolist()
    return [row[:n] for row, n in zip(order, n_allowed, strict=True)]


class Retraining:
    """The experience log, the retraining worker and the live / promoted rankers."""

    def __init__(self, settings: DaemonSettings, observer: Observer,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.settings, self.observer, self.wall_clock = settings, observer, wall_clock
        self.n_actions = settings.learner_n_actions
        self._temporary: Path | None = None
        if settings.checkpoint_dir:
            base = Path(settings.checkpoint_dir)
        elif settings.experience_dir:
            base = Path(settings.experience_dir).parent
        else:  # nothing is kept across runs: a temporary directory, removed on close
            base = self._temporary = Path(tempfile.mkdtemp(prefix="streamlearn-experience-"))
        log_dir = Path(settings.experience_dir) if settings.experience_dir else base / "experience"
        self.artifact_dir = base / "rankers"
        self.log = ExperienceLog(log_dir, settings.experience_segment_rows,
                                 settings.experience_segment_seconds,
                                 settings.experience_retention_bytes,
                                 settings.experience_retention_seconds, wall_clock)
        self.enabled = settings.retrain_enabled
        if self.enabled:
            from streamlearn.retrain.artifact import make_ranker

            for spec in settings.retrain_ranker_names():  # a bad name is a config error at start
                make_ranker(spec, queries=settings.candidates_enabled)
        self.policy = settings.retrain_policy
        self.live: RankerArtifact | None = None
        self.promoted: RankerArtifact | None = None
        self.state: dict[str, Any] = {"live": None, "promoted": [], "history": [],
                                      "next_version": 1}
        self._executor: futures.Executor | None = None
        self._job: futures.Future[dict[str, Any]] | None = None
        self._job_started = 0.0
        self._since_last = 0
        self._last_start = wall_clock()
        self.failures = 0
        self.retrains = 0
        self.skipped = 0
        self._rollback_requested = False

    # ----------------------------------------------------------------- restore
    def open(self, position: dict[str, Any] | None, restored: bool) -> None:
        """Recover the log to the checkpoint's position and reload the ranker state.

        ``restored``: a checkpoint was restored (``position`` is its log position;
        one written before the log existed has none: the segments are kept).
        """
        kept = self.log.segments() if self.log.directory.is_dir() else []
        next_segment = None if not restored else (
            int(position["next_segment"]) if position else max((s + 1 for s in kept), default=0))
        self.log.open(next_segment)
        self.artifact_dir.mkdir(parents=True, exist_ok=True)
        for path in self.artifact_dir.iterdir():  # interrupted artifact writes
            if path.name.startswith(".") and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
        state = read_ranker_state(self.artifact_dir)
        if state:
            self.state = state
            self.live = self._load(state.get("live"))
            stack = state.get("promoted") or []
            self.promoted = self._load(stack[-1]) if stack else None
            self.observer.on_ranker_version(self.live.version if self.live else 0)
        self.state["next_version"] = max(int(self.state.get("next_version", 1)),
                                         self._newest_artifact_version() + 1)
        if self.enabled:  # the worker's start-up (imports) happens before serving, not during
            self._worker().submit(_warm_up).result(timeout=120)

    def _newest_artifact_version(self) -> int:
        """Artifacts of a job the last run did not harvest exist but are named in no state."""
        return max((int(p.name.rsplit("-v", 1)[1]) for p in list_artifacts(self.artifact_dir)),
                   default=0)

    def _load(self, path: str | None) -> RankerArtifact | None:
        if not path:
            return None
        try:
            return load_artifact(path)
        except (StateError, OSError, ValueError) as exc:
            log.error("ranker artifact %s cannot be loaded (%s); serving without it", path, exc)
            return None

    # ------------------------------------------------------------------- loop
    def record(self, closed: Closed) -> None:
        """Append the learned rows of a closed batch to the log."""
        rows = np.flatnonzero(closed.learn)
        if not len(rows):
            return
        whole = len(rows) == len(closed)

        def pick(a: np.ndarray) -> np.ndarray:
            return a if whole else a[rows]

        self.log.append(closed.ids if whole else [closed.ids[i] for i in rows.tolist()],
                        closed.X if whole else take_rows(closed.X, rows), pick(closed.actions),
                        pick(closed.probs), pick(closed.rewards), pick(closed.labels),
                        pick(closed.model_version), pick(closed.decided_at))
        self._since_last += len(rows)

    def tick(self) -> None:
        """Harvest a finished job; start one when due (never waits for the worker)."""
        if self._rollback_requested:
            self._rollback_requested = False
            self._rollback()
        if self._job is not None:
            if not self._job.done():
                return
            self._harvest(self._job)
            self._job = None
        if not self.enabled:
            return
        now = self.wall_clock()
        s = self.settings
        due = ((s.retrain_every_events is not None and self._since_last >= s.retrain_every_events)
               or (s.retrain_every_seconds is not None
                   and now - self._last_start >= s.retrain_every_seconds and self._since_last > 0))
        if due:
            self._start(now)

    def _start(self, now: float) -> None:
        self.log.flush()
        if not self.log.segments():
            return
        s = self.settings
        version = int(self.state["next_version"])
        self.state["next_version"] = version + 1
        spec: dict[str, Any] = {"log_dir": str(self.log.directory), "segments": None,
                "max_rows": s.retrain_window(), "rankers": list(s.retrain_ranker_names()),
                "artifact_dir": str(self.artifact_dir), "version": version, "clip": s.retrain_clip,
                "holdout_fraction": s.retrain_holdout_fraction,
                "current": str(self.promoted.path) if self.promoted is not None else None,
                "level": 0.95}
        if s.candidates_enabled:
            from streamlearn.retrain.candidates import run_candidate_retrain

            spec["candidates"] = {"d_x": s.candidates_shared_features,
                                  "d_c": s.candidates_candidate_features}
            self._job = self._worker().submit(run_candidate_retrain, spec)
        else:
            from streamlearn.retrain.job import run_retrain  # the worker's side

            self._job = self._worker().submit(run_retrain, spec)
        self._job_started, self._last_start, self._since_last = time.perf_counter(), now, 0
        log.info("retrain %d started on up to %d logged decisions (%s)", version,
                 s.retrain_window(), ", ".join(s.retrain_ranker_names()))

    def _worker(self) -> futures.Executor:
        if self._executor is None:
            self._executor = (futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init)
                if self.settings.retrain_worker == "process" else futures.ThreadPoolExecutor(
                    1, thread_name_prefix="streamlearn-retrain"))
        return self._executor

    def _harvest(self, job: futures.Future[dict[str, Any]]) -> None:
        try:
            result = job.result()
        except BrokenProcessPool as exc:
            self._failed(f"the worker process died ({exc}); starting a new one")
            self._restart_worker()
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
        self.observer.on_retrain(time.perf_counter() - self._job_started)
        try:
            self._apply(result)
        except Exception as exc:  # counted, never fatal: a restart would meet the same result
            log.exception("retrain %s could not be applied", result.get("version"))
            self._failed(f"applying retrain {result.get('version')}: {type(exc).__name__}: {exc}")

    def _failed(self, why: str) -> None:
        self.failures += 1
        self.observer.on_retrain_failure()
        log.error("retrain failed: %s", why)

    def _restart_worker(self) -> None:
        self._stop_worker()
        self._worker().submit(_warm_up)  # the new worker's imports start now, not at the next job

    def _stop_worker(self) -> None:
        """Stop the worker without waiting for a job (its process is terminated)."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        processes = list(getattr(executor, "_processes", {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            with contextlib.suppress(Exception):
                process.terminate()

    def _apply(self, result: dict[str, Any]) -> None:
        if "candidates" in result:
            self._apply_candidates(result)
            return
        for policy, by_estimator in result.get("estimates", {}).items():
            for estimator, e in by_estimator.items():
                # an estimate with no matched held-out row is null in the JSON: NaN on the gauge
                self.observer.on_policy_value(policy, estimator, *(
                    math.nan if e.get(k) is None else float(e[k]) for k in ("value", "low", "high")))
        from streamlearn.retrain.job import promotion_decision

        decision = promotion_decision(result)
        best = decision.get("ranker")
        entry = {"version": result.get("version"), "started": self._last_start,
                 "at": self.wall_clock(), "duration_seconds": result.get("duration_seconds"),
                 "segments": result.get("segments"), "rows": result.get("rows"),
                 "holdout_fraction": result.get("holdout_fraction"), "clip": result.get("clip"),
                 "level": result.get("level"),
                 "estimates": result.get("estimates"),
                 "held_out": result.get("heldout_rows"), "ranker": best,
                 "promoted": bool(decision.get("promote")), "reason": decision.get("reason"),
                 "lower": decision.get("lower"), "current_value": decision.get("current_value")}
        if best is not None:
            info = result["rankers"][best]
            for metric in ("auc", "ndcg"):
                if metric in info and info[metric] is not None:
                    self.observer.on_ranker_metric(metric, float(info[metric]))
            artifact = self._load(info["artifact"])
            if artifact is not None:
                self.live = artifact  # the swap: one reference assignment
                self.state["live"] = info["artifact"]
                self.observer.on_ranker_version(artifact.version)
                if decision.get("promote"):
                    self.promoted = artifact
                    self.state["promoted"] = [*self.state.get("promoted", []), info["artifact"]]
                entry["artifact"] = info["artifact"]
        outcome = "promoted" if entry["promoted"] else "rejected"
        self.observer.on_promotion(outcome)
        log.info("retrain %s: ranker %s %s (%s)", result.get("version"), best, outcome,
                 decision.get("reason"))
        self._record_history(entry)

    def _apply_candidates(self, result: dict[str, Any]) -> None:
        """Candidate mode: the rankers are measured on the held-out logged slates (NDCG, AUC)
        and the best by NDCG becomes the live one; none is promoted to serve
        (:mod:`streamlearn.retrain.candidates` says why)."""
        rankers = result.get("rankers", {})
        scored = [(info["ndcg"], name) for name, info in rankers.items()
                  if info.get("ndcg") is not None]
        best = max(scored)[1] if scored else next(iter(rankers), None)
        entry = {"version": result.get("version"), "started": self._last_start,
                 "at": self.wall_clock(), "duration_seconds": result.get("duration_seconds"),
                 "segments": result.get("segments"), "rows": result.get("rows"),
                 "queries": result.get("train_queries"),
                 "documents_per_query": result.get("documents_per_query"),
                 "held_out": result.get("heldout_rows"), "ranker": best, "promoted": False,
                 "reason": "candidate mode: measured on the logged slates, not promoted",
                 "learner": result.get("learner"),
                 "rankers": {n: {k: i.get(k) for k in ("ndcg", "auc", "fit_seconds")}
                             for n, i in rankers.items()}}
        if best is not None:
            info = rankers[best]
            for metric in ("auc", "ndcg"):
                if info.get(metric) is not None:
                    self.observer.on_ranker_metric(metric, float(info[metric]))
            self.state["live"] = entry["artifact"] = info["artifact"]
            self.observer.on_ranker_version(int(result.get("version", 0)))
        log.info("retrain %s on %s logged slates: best ranker %s (held-out NDCG %s; the "
                 "learner's slot order %s)", result.get("version"), result.get("train_queries"),
                 best, None if best is None else rankers[best].get("ndcg"),
                 (result.get("learner") or {}).get("ndcg"))
        self._record_history(entry)

    def _record_history(self, entry: dict[str, Any]) -> None:
        self.state["history"] = [*self.state.get("history", []), entry][-HISTORY_KEPT:]
        path = self.artifact_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(orjson.dumps(self.state, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    # ---------------------------------------------------------------- rollback
    def request_rollback(self) -> None:
        """Ask for :meth:`_rollback` at the next tick (safe from a signal handler)."""
        self._rollback_requested = True

    def _rollback(self) -> None:
        stack = list(self.state.get("promoted", []))
        if not stack:
            log.warning("rollback requested but no ranker is promoted")
            return
        dropped = stack.pop()
        self.state["promoted"] = stack
        self.promoted = self._load(stack[-1]) if stack else None
        self.observer.on_promotion("rolled_back")
        log.info("rolled back ranker %s; now %s", dropped,
                 stack[-1] if stack else "the online learner")
        self._record_history({"at": self.wall_clock(), "rolled_back": dropped,
                              "promoted_now": stack[-1] if stack else None})

    # --------------------------------------------------------------- decisions
    @property
    def serving(self) -> RankerArtifact | None:
        """The ranker whose ranking decisions carry: the promoted one when it is the
        exploitation policy, else the newest."""
        if self.policy == "ranker" and self.promoted is not None:
            return self.promoted
        return self.live

    def scores(self, X: Batch) -> np.ndarray | None:
        """(B, K) scores of the serving ranker, or None when none is live."""
        ranker = self.serving
        if ranker is None:
            return None
        return action_scores(ranker.ranker, dense_rows(X), self.n_actions)

    @property
    def exploits(self) -> bool:
        """Whether the promoted ranker picks the exploitation action."""
        return self.policy == "ranker" and self.promoted is not None

    # ------------------------------------------------------------ checkpoints
    def position(self) -> dict[str, Any]:
        """Flush the log; its position for the checkpoint's metadata."""
        self.log.flush()
        return {"next_segment": self.log.next_segment}

    def close(self) -> None:
        self._stop_worker()
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
