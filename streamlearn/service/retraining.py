"""Periodic retraining of batch rankers beside the serving loop, and what it may change.

:class:`Retraining` is the daemon's part of it. It owns

* the :class:`~streamlearn.durability.experience.ExperienceLog` — every learned decision
  (:meth:`Retraining.record`), flushed with every checkpoint, whose metadata records
  the log position (:meth:`Retraining.position`);
* the schedule: every ``retrain.every_events`` learned decisions or
  ``retrain.every_seconds``, :meth:`Retraining.tick` hands the newest window to the
  :class:`~streamlearn.service.retrain_worker.RetrainWorker`, which trains the rankers
  with clipped inverse-propensity weights, writes each as an immutable artifact and
  evaluates them off-policy (:func:`streamlearn.retrain.job.run_retrain`). A retrain
  due while the previous one runs is counted as an overrun and starts when the worker
  is free; one that outlives ``retrain.timeout_seconds`` is a failure (the worker is
  replaced). The loop never waits for the worker;
* the :class:`~streamlearn.retrain.store.RankerStore` (artifacts, ``state.json``);
* the promotion: a challenger credibly better than what was live
  (:mod:`streamlearn.retrain.promotion`) is promoted. With ``retrain.policy = "ranker"``
  it then takes traffic through a guarded :class:`~streamlearn.service.rollout.Rollout`
  (:meth:`Retraining.mixture` gives the decide step the policies that share each
  batch); with ``"learner"`` its ranking is what decisions carry.
  :meth:`Retraining.rollback` (SIGUSR1 on ``serve``) reverts the newest change.

A failed or crashed job is logged and counted, the worker is replaced, and the
loop goes on.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np

from streamlearn.actions import best_first
from streamlearn.durability.experience import ExperienceLog, dense_rows
from streamlearn.engine import Mixture
from streamlearn.errors import DataError
from streamlearn.features import Batch, take_rows
from streamlearn.join.pending import Closed
from streamlearn.rankers.joint import action_scores
from streamlearn.retrain.artifact import RankerArtifact
from streamlearn.retrain.promotion import (
    MAX_CHALLENGERS,
    MAX_EVIDENCE_WINDOWS,
    MAX_LOOKS,
    promotion_decision,
)
from streamlearn.retrain.store import RankerStore, read_ranker_state
from streamlearn.service.metrics import Observer
from streamlearn.service.retrain_worker import RetrainWorker
from streamlearn.service.rollout import Arm, Rollout, RolloutEvent
from streamlearn.service.settings import DaemonSettings

__all__ = ["Retraining", "ranking_lists", "read_ranker_state"]

log = logging.getLogger("streamlearn.retrain")


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
    """The experience log, the schedule, the ranker store and the rollout (module doc)."""

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
        self.store = RankerStore(self.artifact_dir)
        self.worker = RetrainWorker(settings.retrain_worker, settings.retrain_worker_nice)
        self.rollout = Rollout(settings.rollout_settings(), self._on_rollout_event)
        self.live: RankerArtifact | None = None  # the newest ranker
        self.promoted: RankerArtifact | None = None  # the last one that passed the gate
        self._serving: dict[int, RankerArtifact] = {}  # rollout arms by version
        self._since_last = 0
        self._last_start = wall_clock()
        self._overrun_reported = False
        self.failures = 0
        self.retrains = 0
        self.skipped = 0
        self._rollback_requested = False

    @property
    def state(self) -> dict[str, Any]:
        return self.store.state

    # ----------------------------------------------------------------- restore
    def open(self, position: dict[str, Any] | None, restored: bool,
             rollout: tuple[dict[str, np.ndarray], dict[str, Any]] | None = None) -> None:
        """Recover the log to the checkpoint's position, reload the rankers and the rollout.

        ``restored``: a checkpoint was restored (``position`` is its log position; one
        written before the log existed has none: the segments are kept). ``rollout``: the
        checkpoint's rollout state, if it has one.
        """
        kept = self.log.segments() if self.log.directory.is_dir() else []
        next_segment = None if not restored else (
            int(position["next_segment"]) if position else max((s + 1 for s in kept), default=0))
        self.log.open(next_segment)
        self.store.open()
        self.live = self.store.load(self.state.get("live"))
        stack = self.store.promoted
        self.promoted = self.store.load(stack[-1]) if stack else None
        if rollout is not None:
            self.rollout.restore(*rollout)
        elif self.policy == "ranker" and self.promoted is not None:  # no rollout recorded
            self.rollout.restore_live(self._arm_of(self.promoted))
        self._load_serving()
        served = self.rollout.serving()
        self.observer.on_ranker_version(self.serving.version if self.serving else 0)
        self._report_shares()
        if served:
            log.info("serving %s", ", ".join(f"{a.name} v{a.version}" for a in served))
        if self.enabled:
            self.worker.start()  # its imports run while the loop serves

    def _arm_of(self, artifact: RankerArtifact, interval: dict[str, Any] | None = None) -> Arm:
        return Arm(artifact.version, artifact.name, str(artifact.path), interval)

    def _load_serving(self) -> None:
        """The artifacts of the rollout's arms (an arm whose artifact does not load is dropped)."""
        self._serving = {}
        for arm in self.rollout.serving():
            artifact = self.store.load(arm.artifact)
            if artifact is None:
                self.rollout.roll_back("manual")
                continue
            self._serving[arm.version] = artifact

    # ------------------------------------------------------------------- loop
    def record(self, closed: Closed) -> None:
        """Append the learned rows of a closed batch to the log; the rollout watches them."""
        rows = np.flatnonzero(closed.learn)
        if not len(rows):
            return
        whole = len(rows) == len(closed)

        def pick(a: np.ndarray) -> np.ndarray:
            return a if whole else a[rows]

        served = closed.columns.get("served_by")
        gamma = closed.columns.get("gamma")
        baseline = closed.columns.get("baseline")
        self.log.append(closed.ids if whole else [closed.ids[i] for i in rows.tolist()],
                        closed.X if whole else take_rows(closed.X, rows), pick(closed.actions),
                        pick(closed.probs), pick(closed.rewards), pick(closed.labels),
                        pick(closed.model_version), pick(closed.decided_at),
                        None if served is None else pick(served),
                        None if gamma is None else pick(gamma),
                        None if baseline is None else pick(baseline))
        self._since_last += len(rows)
        if served is not None and self.rollout.serving():
            self.rollout.observe(pick(served), pick(closed.rewards))
            for arm in self.rollout.serving():
                if arm.served:
                    self.observer.on_policy_live_value(arm.label, arm.earned / arm.served)
            learner = self.rollout.stats.get(0)
            if learner is not None and learner.n:
                self.observer.on_policy_live_value("learner", learner.mean)

    def tick(self, watermark: Callable[[], float] = lambda: math.inf) -> None:
        """Harvest a finished job; start one when due (never waits for the worker).

        ``watermark``: when the oldest decision still waiting for feedback was made (asked
        only when a retrain starts) — every decision before it is closed and in the log, so
        retrains judge only those."""
        if self._rollback_requested:
            self._rollback_requested = False
            self.rollback()
        job = self.worker.take()
        if job is not None:
            self._harvest(job)
        if not self.enabled:
            return
        now = self.wall_clock()
        s = self.settings
        due = ((s.retrain_every_events is not None and self._since_last >= s.retrain_every_events)
               or (s.retrain_every_seconds is not None
                   and now - self._last_start >= s.retrain_every_seconds and self._since_last > 0))
        if self.worker.busy:
            running = self.worker.running_for
            if running > s.retrain_timeout_seconds:
                self._failed(f"retrain ran for {running:.0f} s, beyond retrain.timeout_seconds "
                             f"= {s.retrain_timeout_seconds:g}; the worker is replaced")
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
        self.log.flush()
        if not self.log.segments():
            return
        s = self.settings
        version = self.store.take_version()
        spec: dict[str, Any] = {
            "log_dir": str(self.log.directory), "segments": None, "max_rows": s.retrain_window(),
            "rankers": list(s.retrain_ranker_names()), "artifact_dir": str(self.artifact_dir),
            "version": version, "clip": s.retrain_clip,
            "holdout_fraction": s.retrain_holdout_fraction, "level": s.retrain_level,
            "current": None, "watermark": watermark}
        if s.candidates_enabled:
            from streamlearn.retrain.candidates import run_candidate_retrain

            spec["current"] = str(self.promoted.path) if self.promoted is not None else None
            spec["candidates"] = {"d_x": s.candidates_shared_features,
                                  "d_c": s.candidates_candidate_features}
            self.worker.submit(run_candidate_retrain, spec)
        else:
            from streamlearn.retrain.job import run_retrain  # the worker's side

            live = self.rollout.live
            spec["current"] = live.artifact if live is not None and self.policy == "ranker" else None
            spec["challengers"] = list(self.state.get("challengers") or [])
            spec["max_evidence"] = MAX_EVIDENCE_WINDOWS * s.retrain_window()
            spec["challenger_index"] = int(self.state.get("challenger_index") or 0)
            self.worker.submit(run_retrain, spec)
        self._last_start, self._since_last, self._overrun_reported = now, 0, False
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
                self._apply_candidates(result)
            else:
                self._apply(result)
        except Exception as exc:  # counted, never fatal: a restart would meet the same result
            log.exception("retrain %s could not be applied", result.get("version"))
            self._failed(f"applying retrain {result.get('version')}: {type(exc).__name__}: {exc}")

    def _failed(self, why: str) -> None:
        self.failures += 1
        self.observer.on_retrain_failure()
        log.error("retrain failed: %s", why)

    # ------------------------------------------------------------ promotion
    def _apply(self, result: dict[str, Any]) -> None:
        for policy, by_estimator in result.get("estimates", {}).items():
            for estimator, e in by_estimator.items():
                # an estimate with no matched held-out row is null in the JSON: NaN on the gauge
                self.observer.on_policy_value(policy, estimator, *(
                    math.nan if e.get(k) is None else float(e[k]) for k in ("value", "low", "high")))
        decision = promotion_decision(result)
        judged = result.get("challengers") or []
        new = [c for c in judged if c.get("version") == result.get("version")]
        if new:  # the newest ranker decisions are ranked by: this retrain's best challenger
            best = max(new, key=lambda c: -math.inf if c.get("advantage_lower") is None
                       else c["advantage_lower"])
            artifact = self.store.load(best["artifact"])
            if artifact is not None:
                self.live = artifact  # the swap: one reference assignment
                self.state["live"] = best["artifact"]
                if self.serving is not None:
                    self.observer.on_ranker_version(self.serving.version)
                info = result["rankers"].get(best["name"], {})
                for metric in ("auc", "ndcg"):
                    if info.get(metric) is not None:
                        self.observer.on_ranker_metric(metric, float(info[metric]))
        entry: dict[str, Any] = {
            "version": result.get("version"), "started": self._last_start, "at": self.wall_clock(),
            "duration_seconds": result.get("duration_seconds"), "segments": result.get("segments"),
            "rows": result.get("rows"), "max_rows": result.get("max_rows"),
            "watermark": result.get("watermark"), "evidence_since": result.get("evidence_since"),
            "holdout_fraction": result.get("holdout_fraction"), "clip": result.get("clip"),
            "level": result.get("level"), "estimates": result.get("estimates"),
            "held_out": result.get("heldout_rows"), "ranker": decision.get("ranker"),
            "promoted": bool(decision.get("promote")), "reason": decision.get("reason"),
            "advantage_lower": decision.get("advantage_lower"),
            "max_evidence": result.get("max_evidence"),
            "challengers": [{k: c.get(k) for k in (
                "name", "version", "artifact", "since", "first_segment", "last_segment", "index",
                "alpha", "looks", "rows", "passed", "advantage_lower", "value", "ess",
                "max_weight", "exhausted")} for c in judged]}
        if decision.get("promote"):
            self._promote(decision, entry)
        else:
            kept = [c for c in judged if not c.get("passed") and not c.get("exhausted")
                    and c["looks"] < MAX_LOOKS]
            self.state["challengers"] = [
                {k: c[k] for k in ("name", "artifact", "version", "since", "first_segment",
                                   "index", "alpha", "looks")} for c in kept[-MAX_CHALLENGERS:]]
            self.state["challenger_index"] = int(result.get("challenger_index") or 0)
        outcome = "promoted" if entry["promoted"] else "rejected"
        self.observer.on_promotion(outcome)
        log.info("retrain %s: ranker %s %s (%s)", result.get("version"), decision.get("ranker"),
                 outcome, decision.get("reason"))
        self.store.record(entry)

    def _promote(self, decision: dict[str, Any], entry: dict[str, Any]) -> None:
        artifact = self.store.load(decision["artifact"])
        if artifact is None:
            entry["promoted"] = False
            entry["reason"] = f"{decision['reason']}; its artifact does not load"
            return
        entry["artifact"] = decision["artifact"]
        self.promoted = artifact
        self.state["promoted"] = [*self.store.promoted, decision["artifact"]]
        self._new_epoch()
        if self.policy == "ranker":
            self._serving[artifact.version] = artifact
            self.rollout.promote(self._arm_of(artifact, decision.get("value")))
            self._report_shares()
        self.observer.on_ranker_version(artifact.version)

    def _new_epoch(self) -> None:
        """What is live changed: the challengers judged against the old one are dropped and
        the miss probability is spent afresh."""
        self.state["challengers"] = []
        self.state["challenger_index"] = 0

    def _on_rollout_event(self, event: RolloutEvent) -> None:
        arm = event.arm
        entry: dict[str, Any] = {"at": self.wall_clock(), "rollout": event.kind,
                                 "ranker": arm.name, "ranker_version": arm.version,
                                 "artifact": arm.artifact, "reason": event.reason or None,
                                 **event.detail}
        if event.kind == "advanced":
            log.info("rollout of %s v%d: now %.0f %% of the events", arm.name, arm.version,
                     100 * event.detail["share"])
        elif event.kind == "completed":
            log.info("rollout of %s v%d complete: it serves %.0f %% (the learner keeps %.0f %%)",
                     arm.name, arm.version, 100 * (1 - self.settings.retrain_holdback),
                     100 * self.settings.retrain_holdback)
            self._new_epoch()
        elif event.kind == "rolled_back":
            self._serving.pop(arm.version, None)
            stack = self.store.promoted
            if arm.artifact in stack:
                stack.remove(arm.artifact)
                self.state["promoted"] = stack
            self.promoted = self.store.load(stack[-1]) if stack else None
            entry.update(rolled_back=arm.artifact, promoted_now=stack[-1] if stack else None)
            self.observer.on_rollback(event.reason)
            self.observer.on_promotion("rolled_back")
            log.warning("rolled back %s v%d (%s) after %d events served; now %s", arm.name,
                        arm.version, event.reason, arm.served,
                        ", ".join(f"{a.name} v{a.version}" for a in self.rollout.serving())
                        or "the online learner")
            self._new_epoch()
        elif event.kind == "consistency":
            inside = event.reason == "inside"
            self.observer.on_ope_check(inside)
            (log.info if inside else log.warning)(
                "%s v%d earned %.4f on %d events; its off-policy interval at promotion was "
                "[%.4f, %.4f]: %s", arm.name, arm.version, event.detail["realised"],
                event.detail["events"], arm.interval["low"] if arm.interval else math.nan,
                arm.interval["high"] if arm.interval else math.nan,
                "inside" if inside else "OUTSIDE (miscalibrated)")
        self._report_shares()
        self.store.record(entry)

    def roles(self) -> dict[str, float]:
        """The share of the learner's traffic each role serves: the learner, the live ranker,
        the candidate in rollout."""
        shares = self.rollout.shares()
        roles: dict[str, float] = {"learner": shares.get(0, 0.0)}
        if self.rollout.live is not None:
            roles["live"] = shares.get(self.rollout.live.version, 0.0)
        if self.rollout.candidate is not None:
            roles["candidate"] = shares.get(self.rollout.candidate.version, 0.0)
        return roles

    def _report_shares(self) -> None:
        if self.policy == "ranker":
            self.observer.on_rollout(self.roles())

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
        self.store.record(entry)

    # ---------------------------------------------------------------- rollback
    def request_rollback(self) -> None:
        """Ask for :meth:`rollback` at the next tick (safe from a signal handler)."""
        self._rollback_requested = True

    def rollback(self) -> None:
        """Revert the newest promotion: a candidate in rollout, else the serving ranker (an
        earlier promoted one serves again, else the learner)."""
        stack = self.store.promoted
        if self.policy == "ranker" and self.rollout.serving():
            self.rollout.roll_back("manual")  # the event updates the stack and the history
            stack = self.store.promoted
            if self.rollout.live is None and self.rollout.candidate is None and stack:
                earlier = self.store.load(stack[-1])
                if earlier is not None:
                    self._serving[earlier.version] = earlier
                    self.rollout.restore_live(self._arm_of(earlier))
                    self._report_shares()
            log.info("rolled back; now %s", stack[-1] if stack else "the online learner")
            return
        if not stack:
            log.warning("rollback requested but no ranker is promoted")
            return
        dropped = stack.pop()
        self.state["promoted"] = stack
        self.promoted = self.store.load(stack[-1]) if stack else None
        self.observer.on_promotion("rolled_back")
        self.observer.on_rollback("manual")
        log.info("rolled back ranker %s; now %s", dropped,
                 stack[-1] if stack else "the online learner")
        self._new_epoch()
        self.store.record({"at": self.wall_clock(), "rolled_back": dropped,
                           "promoted_now": stack[-1] if stack else None})

    # --------------------------------------------------------------- decisions
    @property
    def serving(self) -> RankerArtifact | None:
        """The ranker whose ranking decisions carry: the live one of the rollout, else the
        promoted one, else the newest."""
        live = self.rollout.live
        if live is not None and live.version in self._serving:
            return self._serving[live.version]
        return self.promoted if self.promoted is not None else self.live

    def scores(self, X: Batch) -> np.ndarray | None:
        """(B, K) scores of the ranker decisions are ranked by, or None when none is."""
        ranker = self.serving
        if ranker is None:
            return None
        return action_scores(ranker.ranker, dense_rows(X), self.n_actions)

    def mixture(self, X: Batch, ranking: np.ndarray | None) -> Mixture | None:
        """The policies that share this batch (``retrain.policy = "ranker"``), or None when
        the learner serves every event. ``ranking``: :meth:`scores` of the batch, reused
        for the arm it belongs to."""
        if self.policy != "ranker" or not self.rollout.serving():
            return None
        dense: np.ndarray | None = None
        scores: dict[int, np.ndarray] = {}
        for arm in self.rollout.serving():
            artifact = self._serving[arm.version]
            if ranking is not None and artifact is self.serving:
                scores[arm.version] = ranking
                continue
            dense = dense_rows(X) if dense is None else dense
            scores[arm.version] = action_scores(artifact.ranker, dense, self.n_actions)
        return self.rollout.mixture(scores)

    def policy_names(self) -> dict[int, str]:
        """Version → the name a decision served by that ranker carries (``"policy"``)."""
        return {arm.version: f"{arm.name}-v{arm.version}" for arm in self.rollout.serving()}

    @property
    def exploits(self) -> bool:
        """Whether a ranker serves some of the events."""
        return self.policy == "ranker" and bool(self.rollout.serving())

    # ------------------------------------------------------------ checkpoints
    def position(self) -> dict[str, Any]:
        """Flush the log; its position for the checkpoint's metadata."""
        self.log.flush()
        return {"next_segment": self.log.next_segment}

    def close(self) -> None:
        self.worker.stop()
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
