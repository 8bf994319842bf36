"""Next to an existing system: apprentice, conservative and online rollout of the learner.

A caller with a working ad server or recommender sends, with each instance, what its own
system would do (``"baseline": <action>``; or ``rollout.baseline = "constant:A"`` for
callers that cannot). The **rollout mode** (``rollout.mode``) decides who serves:

* ``apprentice`` — the baseline, on every event; with ``rollout.explore_budget`` E > 0 the
  learner serves a share E of them (drawn by the event's key), so what it would earn is
  measured on-policy and the logged propensities (the mixture's) make off-policy estimates
  of it possible. The learner learns from everything logged either way, and how often its
  own choice agrees with the baseline is exported;
* ``conservative`` — the learner gets the share of traffic that keeps a lower bound on the
  cumulative live reward at or above (1 − α) × what the baseline would have earned on the
  same events (``rollout.alpha``, default 0.05; Wu, Shariff, Lattimore & Szepesvári,
  "Conservative bandits", ICML 2016; Kazerouni et al., "Conservative contextual linear
  bandits", NeurIPS 2017). What the baseline would have earned is *known* on the events it
  served (it earned it) and unknown only on the learner's, so the *slack* is

      α × (the baseline's reward on its events) + (the learner's reward on its events)
        − (1 − α) × n_learner × UCB_baseline − spread(n_learner),

  where ``spread(n) = sqrt(2·ln(1/δ)·UCB_baseline·(1 − LCB_baseline)·n)`` covers how far
  the baseline's n unseen rewards can sum above n × their mean (δ =
  ``confidence_miss``; not scaled by 1 − α, which also leaves a little room for the noise
  of the learner's own rewards still in flight): a lower bound on live − (1 − α) ×
  baseline, the *realised* sums, which is what a caller compares. Over the next ``N``
  decisions (those in flight: made and not yet learned, plus a batch) a share s earns at
  least ``N·(1 − s)·α·LCB_baseline`` on the baseline's events and
  ``N·s·(LCB_learner − (1 − α)·UCB_baseline)`` on the learner's, so the share is the largest s (to 0.01) with

      slack + N·(α·LCB_baseline − s·Δ) − (spread(n_learner + s·N) − spread(n_learner)) ≥ 0,

  ``Δ = α·LCB_baseline + (1 − α)·UCB_baseline − LCB_learner``: it grows as the learner
  proves itself (its lower bound rises; with Δ < 0 it is credibly above the floor and
  takes everything) and falls back to 0 when the slack runs out. (Two earlier forms
  failed the acceptance of docs/results.md, "Conservative rollout: the floor holds":
  charging every event, the baseline's own included, (1 − α) × the baseline's upper
  bound kept the slack negative on a baseline with a low value — its upper bound stays
  more than α × its mean above it for tens of thousands of events — so the learner never
  got any traffic; and without the spread the rule spends the slack down to the expected
  floor, which the realised sums then cross on most seeds);
* ``online`` — the learner (and the rankers it rolls out) serve everything: the daemon's
  behaviour without a baseline.

Both values come from what each side earns on the events it serves (served by a draw:
an on-policy A/B measurement), each with a betting confidence sequence on each side
(:class:`~streamlearn.service.rollout.ArmStats`, valid at every look). Events without a
baseline are served by the learner and left out of the floor's accounting.

With ``rollout.auto`` the mode moves on when the bounds say so — apprentice to
conservative once the learner's lower bound reaches (1 − α) × the baseline's upper bound
(which needs an exploration budget: without one nothing measures the learner), and
conservative to online once the learner's lower bound is above the baseline's upper
bound — each switch logged, counted and kept in the checkpoint; ``kill -USR2`` (or the
``Daemon.step_back`` call) forces a step back, which also pauses ``rollout.auto`` until a
restart with another configured mode (kept in the checkpoint too). Every change of mode restarts the
comparisons, and only decisions made under the new mode count in them: each decision
carries the mode's ``epoch`` (:data:`~streamlearn.engine.DECISION_COLUMNS`), so those
still in flight at the change, served under the old mode, are learned from but not
credited to the new one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamlearn.config_fields import parse_constant_action
from streamlearn.engine import BASELINE, Mixture
from streamlearn.errors import ConfigError
from streamlearn.service.rollout import ArmStats

__all__ = ["MODES", "Adoption", "AdoptionSettings", "parse_baseline"]

log = logging.getLogger("streamlearn.rollout")

MODES = ("apprentice", "conservative", "online")
AGREEMENT_WINDOW = 1000  # decisions the agreement gauge averages over (exponentially)
HISTORY_KEPT = 20
_SHARES = np.linspace(0.0, 1.0, 101)  # the conservative shares tried


def parse_baseline(spec: str | None, n_actions: int) -> int:
    """The fallback baseline action of ``rollout.baseline`` (``constant:A``, read as the
    configuration reads it: :func:`~streamlearn.config_fields.parse_constant_action`),
    -1 for none."""
    if spec is None or spec == "":
        return -1
    try:
        action = int(parse_constant_action(spec).partition(":")[2])
    except ValueError as exc:
        raise ConfigError(f"rollout.baseline must be 'constant:A' with an action A in [0, "
                          f"{n_actions}). Got {spec!r}: {exc}.") from None
    if not 0 <= action < n_actions:
        raise ConfigError(f"rollout.baseline must be 'constant:A' with an action A in [0, "
                          f"{n_actions}). Got {spec!r}.")
    return action


def _averaged(average: float, rate: float, n: int) -> float:
    """An exponential average over about :data:`AGREEMENT_WINDOW` values moved by ``n`` values
    of mean ``rate`` (the first ones set it)."""
    if math.isnan(average):
        return rate
    return average + (1.0 - (1.0 - 1.0 / AGREEMENT_WINDOW) ** n) * (rate - average)


@dataclass(frozen=True)
class AdoptionSettings:
    """``rollout.*``: the mode, the fallback baseline, the budget, the floor, auto switching."""

    mode: str = "online"
    baseline: int = -1  # the fallback baseline action (-1: none)
    explore_budget: float = 0.0
    alpha: float = 0.05
    auto: bool = False
    confidence_miss: float = 0.05  # the confidence sequences' miss probability

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"rollout.mode must be one of {', '.join(MODES)}. Got {self.mode!r}.")
        if not 0.0 <= self.explore_budget <= 1.0 or not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"rollout.explore_budget must be in [0, 1] and rollout.alpha in "
                              f"(0, 1). Got {self.explore_budget} and {self.alpha}.")


class Adoption:
    """Who serves, baseline or learner, and the measurements that move it (module doc)."""

    def __init__(self, settings: AdoptionSettings,
                 on_switch: Callable[[str, str, str], None] | None = None) -> None:
        self.settings = settings
        self.on_switch = on_switch or (lambda old, new, why: None)
        self.mode = settings.mode
        self.share = self._initial_share()
        self.stats = {"baseline": ArmStats(settings.confidence_miss),
                      "learner": ArmStats(settings.confidence_miss)}
        self.earned = 0.0  # live reward on events with a baseline, since the mode began
        self.events = 0
        self.agreement = math.nan
        self.served_share = math.nan  # the learner's expected share of recent decisions
        # a step back asked for by the operator pauses rollout.auto, which would otherwise
        # move on again on the new mode's first evidence (an outside test: 3 s later)
        self.auto_paused = False
        self.history: list[dict[str, Any]] = []
        self.epoch = 0  # mode changes so far: decisions carry it, and only the current
        # epoch's count in the comparisons (those in flight at a change are the old mode's)

    def _initial_share(self) -> float:
        return {"apprentice": self.settings.explore_budget, "conservative": 0.0,
                "online": 1.0}[self.mode]

    # ------------------------------------------------------------ deciding
    def baselines(self, given: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Each event's baseline: its own, else the configured fallback (-1: none) where the
        event's ``actions`` (``mask``, (B, K) bool) allow it — an event that rules the
        fallback out is the learner's, as one without a baseline."""
        b = np.asarray(given, dtype=np.int64)
        fallback = self.settings.baseline
        if fallback >= 0:
            allowed = True if mask is None else np.asarray(mask)[:, fallback]
            b = np.where(b >= 0, b, np.where(allowed, fallback, -1))
        return b

    def wrap(self, system: Mixture | None, baselines: np.ndarray, n_actions: int) -> Mixture | None:
        """The batch's policies: on an event with a baseline, the baseline takes 1 − share
        and the learner's own policies (``system``: the learner, and rankers it rolls out)
        share the rest as they would; an event without one is the system's alone."""
        if self.mode == "online" or not (baselines >= 0).any():
            return system
        B = len(baselines)
        if system is None:
            system = Mixture((0,), np.ones(1), (None,))
        has = baselines >= 0
        inner = np.broadcast_to(system.shares, (B, len(system.versions)))
        shares = np.concatenate([np.where(has, 1.0 - self.share, 0.0)[:, None],
                                 inner * np.where(has, self.share, 1.0)[:, None]], axis=1)
        onehot = np.zeros((B, n_actions))
        onehot[np.flatnonzero(has), baselines[has]] = 1.0
        return Mixture((BASELINE, *system.versions), shares, (onehot, *system.scores),
                       (False, *(system.explores or (True,) * len(system.versions))))

    def note_decisions(self, exploit: np.ndarray, baselines: np.ndarray) -> None:
        """How often the learner's own choice (``exploit``) is the baseline, and the share of
        the decisions the learner's side was given (the rule's share on events with a
        baseline, all of an event without one): exponential averages over about
        :data:`AGREEMENT_WINDOW` decisions (with a baseline, for the agreement)."""
        if not len(baselines):
            return
        has = baselines >= 0
        self.served_share = 1.0 if self.mode == "online" else _averaged(
            self.served_share, float(np.where(has, self.share, 1.0).mean()), len(baselines))
        n = int(has.sum())
        if n:
            self.agreement = _averaged(self.agreement,
                                       float((exploit[has] == baselines[has]).mean()), n)

    # ------------------------------------------------------------- watching
    def observe(self, served_by: np.ndarray, rewards: np.ndarray, baselines: np.ndarray,
                in_flight: int, epochs: np.ndarray | None = None) -> None:
        """Rewards of learned decisions; ``in_flight``: decisions made and not yet learned;
        ``epochs``: the decisions' ``epoch`` column (those of an earlier epoch, decided
        under the mode before the last change, are left out)."""
        if self.mode == "online":
            return
        served = np.asarray(served_by)
        r = np.asarray(rewards, dtype=np.float64)
        has = np.asarray(baselines) >= 0
        if epochs is not None:
            has &= np.asarray(epochs) == self.epoch
            served = np.where(has, served, 0)  # an old epoch's baseline rows are not counted
        by_baseline = served == BASELINE
        if by_baseline.any():
            self.stats["baseline"].observe(r[by_baseline])
        if (has & ~by_baseline).any():
            self.stats["learner"].observe(r[has & ~by_baseline])
        self.earned += float(r[has].sum())
        self.events += int(has.sum())
        if self.mode == "conservative":
            self.share = self.conservative_share(max(in_flight, 1) + len(r))
        if self.settings.auto and not self.auto_paused:
            self._maybe_advance()

    @property
    def slack(self) -> float:
        """A lower bound on the live reward minus (1 − α) × what the baseline would have
        earned on the same events, so far (module doc)."""
        return float(self._margin(np.zeros(1), 0)[0])

    def _margin(self, shares: np.ndarray, horizon: int) -> np.ndarray:
        """Per share s: the lower bound on live − (1 − α) × baseline after ``horizon`` more
        decisions at share s — α × the baseline's reward on its events + the learner's on
        its events − (1 − α) × its events × the baseline's upper bound, plus the expected
        ``horizon·(α·LCB_baseline − s·Δ)``, less the spread of the baseline's unseen rewards
        (those of the learner's events, done and to come) around their mean."""
        base, learner = self.stats["baseline"], self.stats["learner"]
        alpha = self.settings.alpha
        upper_base = base.upper() if base.n else 1.0
        lower_base = base.lower() if base.n else 0.0
        lower_learner = learner.lower() if learner.n else 0.0
        so_far = alpha * base.total + learner.total - (1.0 - alpha) * learner.n * upper_base
        gap = alpha * lower_base + (1.0 - alpha) * upper_base - lower_learner
        unseen = learner.n + shares * horizon
        variance = upper_base * (1.0 - lower_base)  # of a reward with mean in [lower, upper]
        spread = np.sqrt(2.0 * math.log(1.0 / self.settings.confidence_miss) * variance * unseen)
        return np.asarray(so_far + horizon * (alpha * lower_base - shares * gap) - spread)

    def conservative_share(self, horizon: int) -> float:
        """The largest share (to 0.01) whose lower bound on live − (1 − α) × baseline stays
        ≥ 0 over the next ``horizon`` decisions (module doc); 0 before the baseline has
        been measured."""
        if not self.stats["baseline"].n:
            return 0.0
        ok = np.flatnonzero(self._margin(_SHARES, horizon) >= 0)
        return float(_SHARES[ok[-1]]) if len(ok) else 0.0

    def _maybe_advance(self) -> None:
        base, learner = self.stats["baseline"], self.stats["learner"]
        if not (base.n and learner.n):
            return
        if self.mode == "apprentice" and \
                learner.lower() >= (1.0 - self.settings.alpha) * base.upper():
            alpha = self.settings.alpha
            self._switch("conservative", f"the learner's lower bound {learner.lower():.4f} >= "
                         f"(1 - alpha) x the baseline's upper bound = {1.0 - alpha:g} x "
                         f"{base.upper():.4f} = {(1.0 - alpha) * base.upper():.4f}")
        elif self.mode == "conservative" and learner.lower() > base.upper():
            self._switch("online", f"the learner's lower bound {learner.lower():.4f} > the "
                         f"baseline's upper bound {base.upper():.4f}")

    def step_back(self) -> None:
        """online → conservative → apprentice (a forced step back; no-op in apprentice)."""
        back = {"online": "conservative", "conservative": "apprentice"}.get(self.mode)
        if back is None:
            log.warning("rollout: a step back was asked for, but the mode is already apprentice")
            return
        pausing = self.settings.auto and not self.auto_paused
        self.auto_paused = self.auto_paused or self.settings.auto
        self._switch(back, "asked for (SIGUSR2)" + (
            "; automatic switching paused until a restart with another rollout.mode"
            if pausing else ""))

    def _begin(self, mode: str) -> None:
        """Serve ``mode`` from its start: its share, and the comparisons afresh."""
        self.mode = mode
        self.share = self._initial_share()
        self.stats = {k: ArmStats(self.settings.confidence_miss) for k in self.stats}
        self.earned, self.events = 0.0, 0
        self.served_share = math.nan  # the new mode's decisions set it afresh

    def _switch(self, mode: str, why: str) -> None:
        old = self.mode
        self._begin(mode)
        self.epoch += 1
        self.history = [*self.history, {"from": old, "to": mode, "why": why}][-HISTORY_KEPT:]
        log.info("rollout: %s -> %s (%s)", old, mode, why)
        self.on_switch(old, mode, why)

    # --------------------------------------------------------------- state
    def mode_record(self) -> dict[str, Any]:
        """The mode as of the last switch, for a record written at the switch itself (the
        checkpoint follows at the end of the step): :meth:`catch_up` takes it back."""
        return {"mode": self.mode, "configured": self.settings.mode, "epoch": self.epoch,
                "history": self.history, "auto_paused": self.auto_paused}

    def catch_up(self, record: dict[str, Any]) -> bool:
        """After :meth:`restore`: a record of a switch the restored checkpoint does not hold
        (a crash between the switch and its checkpoint) — its mode serves, the comparisons
        start afresh as at the switch. Whether it applied."""
        mode = record.get("mode")
        if record.get("configured") != self.settings.mode or mode not in MODES or \
                int(record.get("epoch", -1)) <= self.epoch:
            return False
        self._begin(str(mode))
        self.epoch = int(record["epoch"])
        self.history = list(record.get("history") or [])[-HISTORY_KEPT:]
        self.auto_paused = bool(record.get("auto_paused", False))
        return True

    def export(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays: dict[str, np.ndarray] = {}
        stats: dict[str, Any] = {}
        for name, arm in self.stats.items():
            a, m = arm.state()
            arrays.update({f"adoption.{name}.{k}": v for k, v in a.items()})
            stats[name] = m
        return arrays, {"mode": self.mode, "configured": self.settings.mode,
                        "share": self.share, "earned": self.earned, "epoch": self.epoch,
                        "events": self.events, "agreement": None if math.isnan(self.agreement)
                        else self.agreement, "history": self.history, "stats": stats,
                        "auto_paused": self.auto_paused}

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """A checkpoint's state. Its mode wins while ``rollout.mode`` is configured as it was
        when the checkpoint was written (a restart does not undo an automatic switch or a
        step back); a newly configured mode starts afresh."""
        self.epoch = int(meta.get("epoch", 0))
        if meta.get("configured", meta["mode"]) != self.settings.mode:
            log.info("rollout: %s configured (was %s): the comparisons start afresh",
                     self.settings.mode, meta.get("configured"))
            self.epoch += 1  # the decisions in flight were the old mode's
            return
        self.mode = str(meta["mode"])
        if self.mode not in MODES:
            raise ConfigError(f"Expected a rollout mode among {MODES}. Got {self.mode!r}.")
        self.share = float(meta["share"])
        self.earned, self.events = float(meta["earned"]), int(meta["events"])
        agreement = meta.get("agreement")
        self.agreement = math.nan if agreement is None else float(agreement)
        self.history = list(meta.get("history") or [])
        self.auto_paused = bool(meta.get("auto_paused", False))
        if self.mode != self.settings.mode or self.auto_paused:  # the banner says the configured
            log.info("rollout: %s, restored from the checkpoint (configured %s%s)", self.mode,
                     self.settings.mode, "; automatic switching paused by a step back"
                     if self.auto_paused else "")
        for name, m in meta["stats"].items():
            prefix = f"adoption.{name}."
            self.stats[name] = ArmStats.from_state(
                {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}, m)
