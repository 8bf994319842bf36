"""Guarded rollout: a promoted ranker takes traffic share by share, watched on-policy.

With ``retrain.policy = "ranker"`` a ranker that passes the promotion gate
(:mod:`streamlearn.retrain.promotion`) does not take over at once. It becomes the
**candidate** and serves a growing share of the events (``stages``, default 2 %,
10 %, 30 %, 60 %, then all but the holdback: a first share small enough that even a
ranker that earns nothing costs the live reward at most a few hundredths while the
guardrail gathers its evidence); the policy it would replace — the **live**
ranker, or the learner when none is live — serves the rest, and the **learner**
always keeps a holdback share (``holdback``, default 5 %) once a ranker serves. Which
policy serves an event is drawn from its key (:class:`~streamlearn.engine.Mixture`),
and the logged distribution is the mixture, so every propensity stays exact and the
learner keeps learning from everything logged.

Because the serving policy is drawn at random, what each policy earns on the events
it serves is an unbiased, on-policy estimate of its value over the same period — an
A/B test, not an off-policy estimate. Each policy's rewards feed a betting confidence
sequence for the running average of its conditional means
(:class:`~streamlearn.evaluation.bounds.RunningMeanBound`: valid at every look, and for a
policy whose value changes as it learns), and after every learned batch:

* **guardrail**: the candidate is rolled back as soon as its upper bound falls below
  the lower bound of the policy it would replace (it is credibly worse);
  ``streamlearn_rollbacks_total{reason="guardrail"}``;
* **stages**: after every ``stage_events`` learned events it served at this share, it
  moves to the next share if its mean is at least the replaced policy's minus
  ``tolerance`` (looked at once per block, so noise does not carry it through by being
  looked at after every batch); a candidate that has not earned the next share after
  ``STALL_STAGES`` blocks is rolled back (``reason="stalled"``). This is a lenient step:
  what reaches a rollout has passed the promotion gate, and the guardrail, which is
  anytime-valid, is what stops a worse one;
* **completion**: after the last stage the candidate becomes the live ranker;
* **holdback**: a live ranker is rolled back (to the learner) when its upper bound
  falls below the learner's lower bound on the holdback (``reason="holdback"``).

Every change of who serves restarts the comparisons, so two policies are always
compared over the same period.

**Self-consistency** of the off-policy estimates: when a candidate is promoted its
estimate and interval (the promotion gate's confidence sequence for its value) are
recorded; once it has served ``CONSISTENCY_EVENTS`` learned events (or when it is
rolled back after at least ``MIN_CONSISTENCY_EVENTS``), its realised mean reward is
compared with that interval, and a realised value outside it is counted as
miscalibrated (``streamlearn_ope_miscalibrated_total``). This is the check that
catches an off-policy estimate that does not predict what a policy then earns.

The state (who serves, the stage, every confidence sequence) is plain arrays + JSON
in the daemon's checkpoint, so a restart resumes the same rollout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamlearn.engine import Mixture
from streamlearn.evaluation.bounds import RunningMeanBound

__all__ = ["ArmStats", "Rollout", "RolloutEvent", "RolloutSettings"]

log = logging.getLogger("streamlearn.rollout")

LEARNER = 0  # the learner's version in ``served_by``
CONSISTENCY_EVENTS = 2000
MIN_CONSISTENCY_EVENTS = 200
STALL_STAGES = 10


@dataclass(frozen=True)
class RolloutSettings:
    """How a promoted ranker takes traffic (``retrain.rollout_*`` and ``retrain.holdback``)."""

    stages: tuple[float, ...] = (0.02, 0.1, 0.3, 0.6)
    stage_events: int = 500
    holdback: float = 0.05
    tolerance: float = 0.02
    alpha: float = 0.05  # the guardrail's miss probability per comparison
    unit: str = "events"  # what a share is of, in log lines (candidate mode: slots)

    def __post_init__(self) -> None:
        if not self.stages or any(not 0 < s < 1 for s in self.stages) or \
                list(self.stages) != sorted(self.stages):
            raise ValueError(f"Expected increasing rollout stages in (0, 1). Got {self.stages}.")
        if not 0 <= self.holdback < 1 or self.stage_events < 1:
            raise ValueError(f"Expected holdback in [0, 1) and stage_events >= 1. Got "
                             f"{self.holdback} and {self.stage_events}.")


class ArmStats:
    """What one policy earned on the events it served: the mean and a two-sided confidence
    sequence for the running average of its conditional means (each side at α/2)."""

    def __init__(self, alpha: float) -> None:
        self.bound = RunningMeanBound(alpha / 2)

    def observe(self, rewards: np.ndarray) -> None:
        self.bound.update(np.clip(np.asarray(rewards, dtype=np.float64), 0.0, 1.0))

    @property
    def n(self) -> int:
        return self.bound.n

    @property
    def total(self) -> float:
        """The sum of the rewards observed (clipped to [0, 1])."""
        return self.bound.total

    @property
    def mean(self) -> float:
        return self.bound.mean

    def lower(self) -> float:
        return self.bound.lower()

    def upper(self) -> float:
        return self.bound.upper()

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {}, self.bound.state()

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> ArmStats:
        if "low" in meta:  # written with a constant-mean sequence per side: its evidence
            # cannot be carried over (the squared prediction errors were not kept), so this
            # comparison starts afresh, which only delays what it decides
            log.info("a live comparison from an older checkpoint starts afresh")
            return cls(2 * float(meta["low"]["alpha"]))
        stats = cls(0.05)
        stats.bound = RunningMeanBound.from_state(meta)
        return stats


@dataclass
class Arm:
    """A ranker that serves (live) or is being rolled out (candidate)."""

    version: int
    name: str
    artifact: str
    interval: dict[str, Any] | None = None  # its off-policy value interval at promotion
    served: int = 0  # learned events served since promotion (for the consistency check)
    earned: float = 0.0
    checked: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"version": self.version, "name": self.name, "artifact": self.artifact,
                "interval": self.interval, "served": self.served, "earned": self.earned,
                "checked": self.checked}


@dataclass
class RolloutEvent:
    """Something the loop logs, counts and records in the ranker history."""

    kind: str  # "advanced", "completed", "rolled_back", "consistency"
    arm: Arm
    reason: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


class Rollout:
    """Who serves which share, and the live checks that move or revert it (module doc)."""

    def __init__(self, settings: RolloutSettings,
                 on_event: Callable[[RolloutEvent], None] | None = None) -> None:
        self.settings = settings
        self.on_event = on_event or (lambda event: None)
        self.live: Arm | None = None
        self.candidate: Arm | None = None
        self.stage = 0
        self.stage_start = 0  # the candidate's learned events when its current stage began
        self.stage_looks = 0  # blocks of stage_events at this stage already considered
        self.stats: dict[int, ArmStats] = {}

    # ------------------------------------------------------------ who serves
    @property
    def incumbent(self) -> int:
        """The version the candidate would replace (the learner's is 0)."""
        return self.live.version if self.live is not None else LEARNER

    def shares(self) -> dict[int, float]:
        """Version → share of the events (the learner's version is 0)."""
        s = self.settings
        if self.live is None and self.candidate is None:
            return {LEARNER: 1.0}
        holdback = s.holdback
        if self.candidate is None:
            assert self.live is not None
            return {self.live.version: 1.0 - holdback, LEARNER: holdback}
        share = min(s.stages[self.stage], 1.0 - holdback)
        if self.live is None:
            return {self.candidate.version: share, LEARNER: 1.0 - share}
        return {self.candidate.version: share, self.live.version: 1.0 - holdback - share,
                LEARNER: holdback}

    def serving(self) -> list[Arm]:
        return [a for a in (self.live, self.candidate) if a is not None]

    def mixture(self, scores: dict[int, np.ndarray]) -> Mixture | None:
        """The :class:`Mixture` of the batch, from each serving ranker's (B, K) scores;
        None when the learner serves everything."""
        shares = {v: p for v, p in self.shares().items() if p > 0}
        if list(shares) == [LEARNER]:
            return None
        versions = tuple(shares)
        return Mixture(versions, np.array([shares[v] for v in versions]),
                       tuple(None if v == LEARNER else scores[v] for v in versions))

    # ------------------------------------------------------------- changes
    def promote(self, arm: Arm) -> None:
        """Start rolling ``arm`` out (a candidate already in rollout is replaced)."""
        if self.candidate is not None:
            self._end_candidate("replaced", f"replaced by {arm.name} v{arm.version}")
        self.candidate = arm
        self.stage, self.stage_start, self.stage_looks = 0, 0, 0
        self._restart_comparisons()
        log.info("rollout of %s v%d: %.0f %% of the %s", arm.name, arm.version,
                 100 * self.shares()[arm.version], self.settings.unit)

    def roll_back(self, reason: str, arm: Arm | None = None) -> Arm | None:
        """Revert the newest change: the candidate if one is rolling out, else the live
        ranker (the learner then serves); with ``arm``, that arm (candidate or live). Returns
        the arm rolled back."""
        if self.candidate is not None and (arm is None or arm is self.candidate):
            return self._end_candidate("rolled_back", reason)
        if self.live is not None and (arm is None or arm is self.live):
            arm, self.live = self.live, None
            compared = self.compared()
            self._consistency(arm, final=True)
            self._restart_comparisons()
            self.on_event(RolloutEvent("rolled_back", arm, reason, {"compared": compared}))
            return arm
        return None

    def restore_live(self, arm: Arm | None) -> None:
        """Serve ``arm`` as the live ranker at once (a manual rollback to an earlier one)."""
        self.live = arm
        self._restart_comparisons()

    def serving_record(self) -> dict[str, Any]:
        """Who serves, as the rankers' state records it at each write (:meth:`set_serving`
        takes it back)."""
        return {"live": None if self.live is None else self.live.as_json(),
                "candidate": None if self.candidate is None else self.candidate.as_json(),
                "stage": self.stage}

    def set_serving(self, record: dict[str, Any]) -> bool:
        """Serve what ``record`` (:meth:`serving_record`) names, without an event: an arm
        serving already keeps its counts. The comparisons restart when anything changed.
        Whether anything did."""
        have = {arm.version: arm for arm in self.serving()}

        def arm_of(recorded: dict[str, Any] | None) -> Arm | None:
            if recorded is None:
                return None
            return have.get(int(recorded["version"])) or Arm(**recorded)

        live, candidate = arm_of(record.get("live")), arm_of(record.get("candidate"))
        # the stage only means something while a candidate rolls out
        stage = int(record.get("stage") or 0) if candidate is not None else 0
        current = self.stage if self.candidate is not None else 0
        if (live, candidate, stage) == (self.live, self.candidate, current):
            return False
        self.live, self.candidate, self.stage = live, candidate, stage
        self.stage_start, self.stage_looks = 0, 0
        self._restart_comparisons()
        return True

    def _end_candidate(self, kind: str, reason: str) -> Arm:
        assert self.candidate is not None
        arm, self.candidate = self.candidate, None
        compared = self.compared()
        self._consistency(arm, final=True)
        self._restart_comparisons()
        self.on_event(RolloutEvent(kind, arm, reason, {"compared": compared}))
        return arm

    def compared(self) -> dict[str, dict[str, float]]:
        """What each policy earned since the comparisons last restarted (version → mean, its
        confidence sequence, learned events)."""
        return {str(v): {"mean": s.mean, "low": s.lower(), "high": s.upper(), "events": s.n}
                for v, s in self.stats.items() if s.n}

    def _restart_comparisons(self) -> None:
        self.stats = {v: ArmStats(self.settings.alpha) for v in self.shares()}

    # ---------------------------------------------------------------- watch
    def observe(self, served_by: np.ndarray, rewards: np.ndarray) -> None:
        """Rewards of learned decisions, by the version that served each (rows served by a
        policy that no longer serves — decided before a change — are not counted)."""
        if self.live is None and self.candidate is None:
            return
        served = np.asarray(served_by)
        r = np.asarray(rewards, dtype=np.float64)
        for version, stats in self.stats.items():
            rows = served == version
            if rows.any():
                stats.observe(r[rows])
        for arm in self.serving():
            rows = served == arm.version
            arm.served += int(rows.sum())
            arm.earned += float(r[rows].sum())
            self._consistency(arm, final=False)
        self._check()

    def _check(self) -> None:
        s = self.settings
        if self.candidate is not None:
            cand = self.stats[self.candidate.version]
            inc = self.stats[self.incumbent]
            if cand.n and inc.n and cand.upper() < inc.lower():
                self._end_candidate("rolled_back", "guardrail")
                return
            at_stage = cand.n - self.stage_start  # learned at the current share
            looks = at_stage // s.stage_events  # the share is reconsidered once per block
            if looks > self.stage_looks:
                self.stage_looks = looks
                if cand.mean >= inc.mean - s.tolerance:
                    self._advance(cand.n)
                elif looks >= STALL_STAGES:
                    self._end_candidate("rolled_back", "stalled")
            return
        if self.live is not None:
            live, learner = self.stats[self.live.version], self.stats[LEARNER]
            if live.n and learner.n and live.upper() < learner.lower():
                self.roll_back("holdback")

    def _advance(self, learned: int) -> None:
        assert self.candidate is not None
        self.stage_start, self.stage_looks = learned, 0
        if self.stage + 1 < len(self.settings.stages):
            self.stage += 1
            arm = self.candidate
            self.on_event(RolloutEvent("advanced", arm, detail={"share": self.shares()[arm.version]}))
            return
        arm, previous = self.candidate, self.live
        self.live, self.candidate = arm, None
        self._restart_comparisons()
        self.on_event(RolloutEvent("completed", arm, detail={
            "replaced": None if previous is None else previous.as_json()}))

    def _consistency(self, arm: Arm, final: bool) -> None:
        if arm.checked or arm.interval is None:
            return
        enough = arm.served >= CONSISTENCY_EVENTS or (final and arm.served >= MIN_CONSISTENCY_EVENTS)
        if not enough:
            return
        arm.checked = True
        realised = arm.earned / arm.served
        inside = arm.interval["low"] <= realised <= arm.interval["high"]
        self.on_event(RolloutEvent("consistency", arm, "inside" if inside else "outside",
                                   {"realised": realised, "events": arm.served,
                                    "interval": arm.interval}))

    # ---------------------------------------------------------------- state
    def export(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays and JSON for the checkpoint."""
        arrays: dict[str, np.ndarray] = {}
        stats_meta: dict[str, Any] = {}
        for version, stats in self.stats.items():
            a, m = stats.state()
            arrays.update({f"rollout.{version}.{k}": v for k, v in a.items()})
            stats_meta[str(version)] = m
        meta = {"live": None if self.live is None else self.live.as_json(),
                "candidate": None if self.candidate is None else self.candidate.as_json(),
                "stage": self.stage, "stage_start": self.stage_start,
                "stage_looks": self.stage_looks, "stats": stats_meta,
                "shares": {str(v): p for v, p in self.shares().items()}}
        return arrays, meta

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        self.live = None if meta.get("live") is None else Arm(**meta["live"])
        self.candidate = None if meta.get("candidate") is None else Arm(**meta["candidate"])
        self.stage, self.stage_start = int(meta["stage"]), int(meta["stage_start"])
        self.stage_looks = int(meta["stage_looks"])
        self.stats = {}
        for version, m in meta["stats"].items():
            prefix = f"rollout.{version}."
            self.stats[int(version)] = ArmStats.from_state(
                {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}, m)
        for version in self.shares():
            self.stats.setdefault(version, ArmStats(self.settings.alpha))
