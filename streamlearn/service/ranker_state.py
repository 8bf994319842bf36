"""What the retrained rankers may change, kept across restarts: promotion, rollout, rollback.

:class:`RankerState` owns

* the :class:`~streamlearn.retrain.store.RankerStore` (artifacts, ``state.json`` and its
  history) and which ranker is the newest (``live``), the last promoted one and the
  artifacts the rollout's arms serve;
* the promotion: a finished retrain's result (:meth:`RankerState.apply`) — a challenger
  credibly better than what was live (:mod:`streamlearn.retrain.promotion`) is promoted.
  With ``retrain.policy = "ranker"`` it then takes traffic through a guarded
  :class:`~streamlearn.service.rollout.Rollout`, which watches the learned rewards
  (:meth:`RankerState.observe`); with ``"learner"`` its ranking is what decisions carry.
  In candidate mode the best ranker by NDCG becomes the live one
  (:meth:`RankerState.apply_candidates`);
* the rollback: :meth:`RankerState.rollback` (SIGUSR1 on ``serve``, through
  :meth:`RankerState.request_rollback`) reverts the newest change.

The hot path reads it through :class:`~streamlearn.service.scoring.Scorer`.
"""

from __future__ import annotations

import logging
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from streamlearn.retrain.artifact import RankerArtifact, same_artifact
from streamlearn.retrain.promotion import candidate_promotion, promotion_decision, still_judged
from streamlearn.retrain.store import HISTORY_KEPT, RankerStore, candidate_entry, retrain_entry
from streamlearn.service.metrics import Observer
from streamlearn.service.rollout import Arm, Rollout, RolloutEvent
from streamlearn.service.settings import DaemonSettings

__all__ = ["RankerState"]

log = logging.getLogger("streamlearn.retrain")

#: why a retrain that ran while what is live changed promotes nothing
STALE = ("what serves changed while this retrain ran, so its rankers were judged against "
         "what served before: none is promoted (the next retrain judges new ones against "
         "what serves now)")


class RankerState:
    """The ranker store, the promotion, the rollout and the rollback (module doc)."""

    def __init__(self, settings: DaemonSettings, observer: Observer, artifact_dir: Path,
                 wall_clock: Callable[[], float]) -> None:
        self.settings, self.observer, self.wall_clock = settings, observer, wall_clock
        self.policy = settings.retrain.policy
        self.store = RankerStore(artifact_dir)
        self.rollout = Rollout(settings.rollout_settings(), self._on_rollout_event)
        self.live: RankerArtifact | None = None  # the newest ranker
        self.promoted: RankerArtifact | None = None  # the last one that passed the gate
        self.arms: dict[int, RankerArtifact] = {}  # the rollout's arms' artifacts by version
        self._rollbacks_requested = 0  # SIGUSR1s not yet acted on: each rolls one change back
        self._live_labels: dict[str, str | None] = {}  # role → its live-value label reported
        if self.policy == "ranker":  # each write of state.json says who serves (see open)
            self.store.before_save = self._record_serving

    @property
    def state(self) -> dict[str, Any]:
        return self.store.state

    # ----------------------------------------------------------------- restore
    def open(self, rollout: tuple[dict[str, np.ndarray], dict[str, Any]] | None = None) -> None:
        """Reload the rankers and the rollout (``rollout``: the checkpoint's rollout state,
        if it has one)."""
        self.store.open()
        running = self.state.get("running")
        if running is not None:  # the last run was killed while this retrain ran
            self.abandon(int(running["version"]), "the daemon was killed while it ran (found "
                         "at restart); its rankers were not judged")
        self.live = self.store.load(self.state.get("live"))
        stack = self.store.promoted
        self.promoted = self.store.load(stack[-1]) if stack else None
        if rollout is not None:
            self.rollout.restore(*rollout)
            self._reconcile()
        elif self.policy == "ranker" and self.promoted is not None:  # no rollout recorded
            self.rollout.restore_live(self._arm_of(self.promoted))
        self._load_serving()
        served = self.rollout.serving()
        self._report_version()
        self._report_shares()
        if served and self.policy == "ranker":
            log.info("serving %s", ", ".join(f"{a.name} v{a.version}" for a in served))
        elif served:  # the learner decides; the rankers only rank (an outside test read the
            # old "serving" line as the ranker taking the traffic)
            log.info("the checkpoint's rollout (%s) is kept but serves nothing: "
                     "retrain.policy = %s (the learner decides)",
                     ", ".join(f"{a.name} v{a.version}" for a in served), self.policy)

    def _record_serving(self) -> None:
        self.state["rollout"] = self.rollout.serving_record()

    def _reconcile(self) -> None:
        """Who serves, after a restore: ``state.json`` is written at every change of the
        rollout (a promotion, an advance, a rollback) and the checkpoint only after it, so a
        stop between the two writes left the checkpoint's rollout one change behind — a
        ranker the guardrail had rolled back served again after the restart. What
        ``state.json`` records serves; the checkpoint keeps the counts of the arms both
        name."""
        recorded = self.state.get("rollout")
        if self.policy != "ranker" or recorded is None:  # a state from before this record
            return
        before = self._serving_text()
        if self.rollout.set_serving(recorded):
            log.warning("the checkpoint's rollout (%s) was behind the rankers' state.json (a "
                        "stop between their writes): now serving %s", before,
                        self._serving_text())

    def _arm_of(self, artifact: RankerArtifact, interval: dict[str, Any] | None = None) -> Arm:
        return Arm(artifact.version, artifact.name, str(artifact.path), interval)

    def _load_serving(self) -> None:
        """The artifacts of the rollout's arms (an arm whose artifact does not load is dropped)."""
        self.arms = {}
        for arm in self.rollout.serving():
            artifact = self.store.load(arm.artifact)
            if artifact is None:  # logged by the store; this arm, not the newest change
                self.rollout.roll_back("unloadable", arm)
                continue
            self.arms[arm.version] = artifact

    # ------------------------------------------------------------------- loop
    def observe(self, served: np.ndarray, rewards: np.ndarray) -> None:
        """The rollout (while a ranker serves) watches the learned rewards of the policies
        that served them."""
        self.rollout.observe(served, rewards)
        self._report_live_values()
        learner = self.rollout.stats.get(0)
        if learner is not None and learner.n:
            self.observer.on_policy_live_value("learner", learner.mean)

    def _report_live_values(self) -> None:
        """What the live ranker and the candidate earned, by role: a retrained version of the
        live ranker rolls out under the same name, and one label for both showed the
        candidate's handful of events as the live one's value. A label whose arm left its
        role (a rollout completed, a rollback) reads NaN: it held its last value for good
        (an outside test)."""
        for role, arm in (("ranker", self.rollout.live), ("candidate", self.rollout.candidate)):
            label = None if arm is None else f"{role}:{arm.name}"
            before = self._live_labels.get(role)
            if before is not None and before != label:
                self.observer.on_policy_live_value(before, math.nan)
            self._live_labels[role] = label
            if arm is not None and label is not None:
                self.observer.on_policy_live_value(
                    label, arm.earned / arm.served if arm.served else math.nan)

    # ------------------------------------------------------- the retrain jobs
    def take_version(self) -> int:
        """The version of the next retrain's rankers."""
        return self.store.take_version()

    def current_artifact(self, candidates: bool) -> str | None:
        """The artifact a retrain compares its rankers with: in candidate mode the promoted
        one, else the rollout's live ranker (``retrain.policy = "ranker"``)."""
        if candidates:
            return str(self.promoted.path) if self.promoted is not None else None
        live = self.rollout.live
        return live.artifact if live is not None and self.policy == "ranker" else None

    def evidence_since(self) -> float | None:
        """When what serves last changed (None: never): candidate mode judges its rankers on
        the requests decided since, against what served them."""
        since = self.state.get("epoch_since")
        return None if since is None else float(since)

    def challengers(self) -> tuple[list[dict[str, Any]], int]:
        """The challengers still being judged, and how many were judged this epoch."""
        return (list(self.state.get("challengers") or []),
                int(self.state.get("challenger_index") or 0))

    # ------------------------------------------------------------ promotion
    def apply(self, result: dict[str, Any], started: float) -> None:
        """A finished retrain's result (``started``: when its job was handed to the worker)."""
        self._count_failed(result)
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
                self._report_version()
                info = result["rankers"].get(best["name"], {})
                for metric in ("auc", "ndcg"):
                    if info.get(metric) is not None:
                        self.observer.on_ranker_metric(metric, float(info[metric]))
        stale = self._changed_since(started)
        if stale:
            decision = {**decision, "promote": False, "reason": f"{STALE}: {decision['reason']}"}
        elif decision.get("promote") and self.rollout.candidate is not None:
            decision = {**decision, "promote": False,
                        "reason": f"{self._rolling_out()}: {decision['reason']}"}
        entry = retrain_entry(result, decision, started, self.wall_clock())
        if decision.get("promote"):
            self._promote(decision, entry)
        elif not stale:  # a stale retrain's challengers were dropped with the epoch it began in
            self.state["challengers"] = still_judged(judged)
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
            self.arms[artifact.version] = artifact
            self.rollout.promote(self._arm_of(artifact, decision.get("value")))
            self._report_shares()
        self._report_version()

    def _count_failed(self, result: dict[str, Any]) -> None:
        """Each ranker that failed in a retrain whose others were judged (its fit or its
        scores raised, or its scores were not finite) is a counted retrain failure: before,
        one NaN-scoring ranker skipped every retrain, uncounted (an outside test)."""
        for name, why in (result.get("failed_rankers") or {}).items():
            self.observer.on_retrain_failure()
            log.error("retrain %s: ranker %s failed (%s); the others were judged without it",
                      result.get("version"), name, why)

    def _rolling_out(self) -> str:
        """Why a challenger that passed is not promoted while a candidate rolls out: its
        evidence was logged by the rollout's mixture, mostly what served before, so it was
        hardly compared with the candidate it would replace (an outside test: 17 of 21 such
        replacements claimed an advantage above the true one over the candidate, one
        replaced a candidate worth 0.29 by a ranker worth 0.20)."""
        arm = self.rollout.candidate
        named = "a candidate" if arm is None else f"{arm.name} v{arm.version}"
        return (f"not promoted while {named} rolls out (its evidence is the rollout's "
                "mixture; the retrains after its completion or rollback judge theirs against "
                "what serves then)")

    def _changed_since(self, started: float) -> bool:
        """Whether what is live changed after a retrain's job started at ``started``: its
        challengers were then judged against what served before, and a promotion would
        replace a policy none of them was compared with (an outside test saw 6 of 9 such
        promotions claim an advantage above the true one, and a worse ranker complete its
        rollout)."""
        epoch = self.evidence_since()
        return epoch is not None and started < epoch

    def _new_epoch(self) -> None:
        """What is live changed: the challengers judged against the old one are dropped and
        the miss probability is spent afresh."""
        self.state["challengers"] = []
        self.state["challenger_index"] = 0
        self.state["epoch_since"] = self.wall_clock()

    def _on_rollout_event(self, event: RolloutEvent) -> None:
        arm = event.arm
        entry: dict[str, Any] = {"at": self.wall_clock(), "rollout": event.kind,
                                 "ranker": arm.name, "ranker_version": arm.version,
                                 "artifact": arm.artifact, "reason": event.reason or None,
                                 **event.detail}
        if event.kind == "advanced":
            log.info("rollout of %s v%d: now %.0f %% of the %s", arm.name, arm.version,
                     100 * event.detail["share"], self.rollout.settings.unit)
        elif event.kind == "completed":
            log.info("rollout of %s v%d complete: it serves %.0f %% (the learner keeps %.0f %%)",
                     arm.name, arm.version, 100 * (1 - self.settings.retrain.holdback),
                     100 * self.settings.retrain.holdback)
            self._new_epoch()
        elif event.kind == "rolled_back":
            if event.reason != "unloadable":  # a missing file says nothing of the ranker
                self._trial_rolled_back(arm)
            self.arms.pop(arm.version, None)
            stack = self._unstack(arm)
            entry.update(rolled_back=arm.artifact, promoted_now=stack[-1] if stack else None)
            self.observer.on_rollback(event.reason)
            self.observer.on_promotion("rolled_back")
            # a manual rollback puts an earlier promoted ranker back after this event
            # (rollback): it says what serves then, this would name the learner too early
            log.warning("rolled back %s v%d (%s) after %d %s served%s", arm.name, arm.version,
                        event.reason, arm.served, self.rollout.settings.unit,
                        "" if event.reason == "manual" else f"; now {self._serving_text()}")
            self._new_epoch()
        elif event.kind == "replaced":  # a newer promotion took the candidate's place
            # it never finished its rollout: not a ranker a rollback may put back to serve
            self._unstack(arm)
            self.observer.on_rollback("replaced")
            log.info("rollout of %s v%d ended after %d %s served: %s", arm.name, arm.version,
                     arm.served, self.rollout.settings.unit, event.reason)
        elif event.kind == "consistency":
            inside = event.reason == "inside"
            self.observer.on_ope_check(inside)
            (log.info if inside else log.warning)(
                "%s v%d earned %.4f on %d %s; its off-policy interval at promotion was "
                "[%.4f, %.4f]: %s", arm.name, arm.version, event.detail["realised"],
                event.detail["events"], self.rollout.settings.unit,
                arm.interval["low"] if arm.interval else math.nan,
                arm.interval["high"] if arm.interval else math.nan,
                "inside" if inside else "OUTSIDE (miscalibrated)")
        self._report_shares()
        self._report_version()
        self._report_live_values()
        self.store.record(entry)

    def _unstack(self, arm: Arm) -> list[str]:
        """Take ``arm`` off the promoted stack (the rankers a rollback may put back); the
        stack now."""
        # by name: a moved or copied directory's stack names the artifacts where they were
        # when promoted, its arms where they are now (an outside test: SIGUSR1 could not take
        # the live ranker of a copied directory out of service)
        stack = [a for a in self.store.promoted if not same_artifact(a, arm.artifact)]
        self.state["promoted"] = stack
        self.promoted = self.store.load(stack[-1]) if stack else None
        return stack

    def _serving_text(self) -> str:
        return ", ".join(f"{a.name} v{a.version}" for a in self.rollout.serving()) \
            or "the online learner"

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

    def _report_version(self) -> None:
        """streamlearn_ranker_version: the ranker whose ranking decisions carry (0: none)."""
        self.observer.on_ranker_version(self.serving.version if self.serving else 0)

    def _report_shares(self) -> None:
        if self.policy == "ranker":
            self.observer.on_rollout(self.roles())

    def apply_candidates(self, result: dict[str, Any], started: float) -> None:
        """Candidate mode: the rankers are measured on the held-out logged slates (NDCG, AUC)
        and the best by NDCG becomes the one decisions' rankings cite. With
        ``retrain.policy = "ranker"`` the retrain's per-slot verdicts go through
        :func:`~streamlearn.retrain.promotion.candidate_promotion`: a ranker promoted (or
        entering as a trial) takes its share of the slots through the same guarded
        :class:`~streamlearn.service.rollout.Rollout` as fixed actions."""
        self._count_failed(result)
        rankers = result.get("rankers", {})
        # the value per slot (every slot pooled, given the logged prefix): what was live, on
        # policy, and each ranker as deployed, with its confidence sequence
        pooled = {"logged": (result.get("offpolicy") or {}).get("logged")} | {
            f"ranker:{name}": (info.get("offpolicy") or {}).get("value")
            for name, info in rankers.items()}
        for policy, iv in pooled.items():
            if iv:
                self.observer.on_policy_value(policy, "bound", *(
                    math.nan if iv.get(k) is None else float(iv[k]) for k in ("mean", "low", "high")))
        scored = [(info["ndcg"], name) for name, info in rankers.items()
                  if info.get("ndcg") is not None]
        best = max(scored)[1] if scored else next(
            (name for name, info in rankers.items() if "artifact" in info), None)
        entry = candidate_entry(result, best, started, self.wall_clock())
        if best is not None:
            info = rankers[best]
            for metric in ("auc", "ndcg"):
                if info.get(metric) is not None:
                    self.observer.on_ranker_metric(metric, float(info[metric]))
            # measured, not serving: a ranker places slots only once promoted
            self.state["best_measured"] = entry["artifact"] = info["artifact"]
        log.info("retrain %s on %s logged slates: best ranker %s (held-out NDCG %s; the "
                 "learner's slot order %s)", result.get("version"), result.get("train_queries"),
                 best, None if best is None else rankers[best].get("ndcg"),
                 (result.get("learner") or {}).get("ndcg"))
        # the miss probability spent so far since what serves last changed (also when the
        # verdicts are only reported: each one is a look that must stay within level)
        stale = self._changed_since(started)
        if not stale:  # else the spending restarted with the epoch that began meanwhile
            self.state["challenger_index"] = int(result.get("challenger_index") or 0)
        if self.policy == "ranker":
            decision = candidate_promotion(result, trial=self._trial_allowed(result))
            if stale or (decision.get("promote") and self.rollout.candidate is not None):
                why = STALE if stale else self._rolling_out()
                decision = {**decision, "promote": False, "trial": False,
                            "reason": f"{why}: {decision['reason']}"}
            entry.update(promoted=bool(decision.get("promote")), reason=decision.get("reason"),
                         trial=bool(decision.get("trial")))
            if decision.get("trial"):
                self.state["trial_artifact"] = decision["artifact"]
            if decision.get("promote"):
                self._promote(decision, entry)  # a new epoch: the spending starts afresh
            outcome = "promoted" if entry["promoted"] else "rejected"
            self.observer.on_promotion(outcome)
            named = decision.get("ranker")
            log.info("retrain %s: %s (%s)", result.get("version"),
                     f"ranker {named} {outcome}" if named else "no ranker promoted",
                     decision.get("reason"))
        self._report_version()
        self.store.record(entry)

    def abandon(self, version: int, why: str) -> None:
        """Retrain ``version`` will not finish (the daemon stops while it runs): its
        artifacts, never judged, are removed, and ``abandoned`` in the state says why its
        number is skipped."""
        for path in self.store.directory.glob(f"*-v{version:08d}"):
            shutil.rmtree(path, ignore_errors=True)
        # beside the history, not in it: a history entry is a retrain that was applied
        kept = list(self.state.get("abandoned") or [])
        self.state["abandoned"] = [*kept, {"version": version, "at": self.wall_clock(),
                                           "reason": why}][-HISTORY_KEPT:]
        if (self.state.get("running") or {}).get("version") == version:
            del self.state["running"]
        self.store.save()
        log.info("retrain %d abandoned (%s)", version, why)

    def started(self, version: int) -> None:
        """Retrain ``version`` was handed to the worker: ``running`` in the state says so
        until it is harvested, so that a restart after a kill -9 abandons it by name (its
        number was skipped without a word before, an outside test)."""
        self.state["running"] = {"version": version, "started": self.wall_clock()}
        self.store.save()

    def finished(self) -> None:
        """The running retrain's job was harvested (applied, skipped or failed)."""
        if self.state.pop("running", None) is not None:
            self.store.save()

    def _trial_allowed(self, result: dict[str, Any]) -> bool:
        """A trial only replaces the learner (nothing else is rolled out or live: against a
        live ranker the gate decides on its logged slots), and after the n-th trial rolled
        back the next waits 2ⁿ retrains, so a ranker that keeps looking good on held-out
        NDCG but earns less costs a geometrically shrinking share."""
        if self.rollout.candidate is not None or self.rollout.live is not None:
            return False
        return int(result.get("version") or 0) >= int(self.state.get("trial_after") or 0)

    def _trial_rolled_back(self, arm: Arm) -> None:
        trial = self.state.get("trial_artifact")
        if trial is None or not same_artifact(str(trial), arm.artifact):
            return
        failed = int(self.state.get("failed_trials") or 0) + 1
        self.state["failed_trials"] = failed
        self.state["trial_after"] = int(self.state["next_version"]) + 2 ** failed
        log.info("trial of %s v%d rolled back (trial %d to fail): the next trial waits for "
                 "retrain %d", arm.name, arm.version, failed, self.state["trial_after"])

    def failed_in_serving(self, artifact: RankerArtifact, why: str) -> None:
        """A ranker whose scores failed in the decide step (it raised, or gave scores of
        another shape or not finite): it ranks and serves nothing from now on, which
        ``state.json`` records (a restart does not meet it again), and the failure counts
        as a retrain failure. Before, a user ranker that raised only in the serving process
        stopped the daemon, and every restart stopped again (an outside test)."""
        path = str(artifact.path)
        self.observer.on_retrain_failure()
        with self.store.one_write():
            for arm in list(self.rollout.serving()):
                if same_artifact(arm.artifact, path):  # the event unstacks it, a new epoch
                    self.rollout.roll_back("failing", arm)
            self.state["challengers"] = [  # not judged again (one passed the gate after it)
                c for c in self.state.get("challengers") or []
                if not same_artifact(str(c.get("artifact")), path)]
            stack = [a for a in self.store.promoted if not same_artifact(a, path)]
            if stack != self.store.promoted:
                self.state["promoted"] = stack
                self.promoted = self.store.load(stack[-1]) if stack else None
                self._new_epoch()
            if self.live is not None and same_artifact(str(self.live.path), path):
                self.live, self.state["live"] = None, None
            self.store.record({"at": self.wall_clock(), "failed_in_serving": path,
                               "reason": why})
        self._report_version()
        self._report_shares()
        log.error("ranker %s v%d failed in the serving loop (%s): it no longer ranks or "
                  "serves; now %s", artifact.name, artifact.version, why, self._serving_text())

    # ---------------------------------------------------------------- rollback
    def request_rollback(self) -> None:
        """Ask for one more :meth:`rollback` at the next :meth:`rollback_if_requested` (safe
        from a signal handler: several signals between two steps are several rollbacks, where
        an outside test saw four SIGUSR1s 0.4 s apart roll back three changes)."""
        self._rollbacks_requested += 1

    def rollback_if_requested(self) -> None:
        while self._rollbacks_requested:
            self._rollbacks_requested -= 1
            self.rollback()

    def rollback(self) -> None:
        """Revert the newest promotion: a candidate in rollout, else the serving ranker (an
        earlier promoted one serves again, else the learner)."""
        stack = self.store.promoted
        if self.policy == "ranker" and self.rollout.serving():
            # a candidate rolled back leaves what served beside it serving (the learner, or
            # the live ranker): only a live ranker rolled back puts an earlier one back. One
            # write of state.json for both steps: a kill -9 between two writes restored the
            # learner, not the earlier ranker (an outside test)
            live_rolled_back = self.rollout.candidate is None
            with self.store.one_write():
                self.rollout.roll_back("manual")  # the event updates the stack and the history
                stack = self.store.promoted
                if live_rolled_back and self.rollout.live is None and stack:
                    earlier = self.store.load(stack[-1])
                    if earlier is not None:
                        self.arms[earlier.version] = earlier
                        self.rollout.restore_live(self._arm_of(earlier))
                        self._report_shares()
            log.info("rolled back; now %s", self._serving_text())
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

    # ----------------------------------------------------------------- serving
    @property
    def serving(self) -> RankerArtifact | None:
        """The ranker whose ranking decisions carry: the live one of the rollout, else the
        promoted one, else the newest. In candidate mode each decision is ranked by what
        placed its first slot, so only the rollout's live ranker counts (None: the learner)."""
        live = self.rollout.live
        if live is not None and live.version in self.arms:
            return self.arms[live.version]
        if self.settings.candidates.enabled:
            return None
        return self.promoted if self.promoted is not None else self.live
