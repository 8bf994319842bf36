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
  cumulative live reward at or above (1 − α) × what the baseline would have earned
  (``rollout.alpha``, default 0.05; Wu, Shariff, Lattimore & Szepesvári, "Conservative
  bandits", ICML 2016; Kazerouni et al., "Conservative contextual linear bandits", NeurIPS
  2017). The *slack* is the live reward so far minus (1 − α) × the events so far × an upper
  bound on the baseline's value. Over the next ``N`` decisions (those in flight: made and
  not yet learned, plus a batch), giving the learner a share s costs at most
  ``N·s·Δ`` where Δ is the baseline's upper bound minus the learner's lower bound, and
  earns at least ``N·α·`` the baseline's lower bound of margin, so the share is the largest
  s with ``slack + N·(α·LCB_baseline − s·Δ) ≥ 0``: it grows as the learner proves itself
  (its lower bound rises) and falls back when it does not;
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
``Daemon.step_back`` call) forces a step back. Every change of mode restarts the
comparisons.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamlearn.engine import BASELINE, Mixture
from streamlearn.errors import ConfigError
from streamlearn.service.rollout import ArmStats

__all__ = ["MODES", "Adoption", "AdoptionSettings", "parse_baseline"]

log = logging.getLogger("streamlearn.rollout")

MODES = ("apprentice", "conservative", "online")
AGREEMENT_WINDOW = 1000  # decisions the agreement gauge averages over (exponentially)
HISTORY_KEPT = 20


def parse_baseline(spec: str | None, n_actions: int) -> int:
    """The fallback baseline action of ``rollout.baseline`` (``constant:A``), -1 for none."""
    if spec is None or spec == "":
        return -1
    kind, _, arg = spec.partition(":")
    try:
        action = int(arg) if kind == "constant" else -1
    except ValueError:
        action = -1
    if not 0 <= action < n_actions:
        raise ConfigError(f"rollout.baseline must be 'constant:A' with an action A in [0, "
                          f"{n_actions}). Got {spec!r}.")
    return action


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
        self.history: list[dict[str, Any]] = []

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
        """How often the learner's own choice (``exploit``) is the baseline (exponential
        average over about :data:`AGREEMENT_WINDOW` decisions with a baseline)."""
        has = baselines >= 0
        n = int(has.sum())
        if not n:
            return
        rate = float((exploit[has] == baselines[has]).mean())
        weight = 1.0 - (1.0 - 1.0 / AGREEMENT_WINDOW) ** n
        self.agreement = rate if math.isnan(self.agreement) else \
            self.agreement + weight * (rate - self.agreement)

    # ------------------------------------------------------------- watching
    def observe(self, served_by: np.ndarray, rewards: np.ndarray, baselines: np.ndarray,
                in_flight: int) -> None:
        """Rewards of learned decisions; ``in_flight``: decisions made and not yet learned."""
        if self.mode == "online":
            return
        served = np.asarray(served_by)
        r = np.asarray(rewards, dtype=np.float64)
        has = np.asarray(baselines) >= 0
        by_baseline = served == BASELINE
        if by_baseline.any():
            self.stats["baseline"].observe(r[by_baseline])
        if (has & ~by_baseline).any():
            self.stats["learner"].observe(r[has & ~by_baseline])
        self.earned += float(r[has].sum())
        self.events += int(has.sum())
        if self.mode == "conservative":
            self.share = self.conservative_share(max(in_flight, 1) + len(r))
        if self.settings.auto:
            self._maybe_advance()

    @property
    def slack(self) -> float:
        """Live reward so far minus (1 − α) × events × the baseline's upper bound."""
        base = self.stats["baseline"]
        upper = base.upper() if base.n else 1.0
        return self.earned - (1.0 - self.settings.alpha) * self.events * upper

    def conservative_share(self, horizon: int) -> float:
        """The largest share s with slack + N·(α·LCB_baseline − s·Δ) ≥ 0 (module doc)."""
        base, learner = self.stats["baseline"], self.stats["learner"]
        if not base.n:
            return 0.0
        lower_base, upper_base = base.lower(), base.upper()
        lower_learner = learner.lower() if learner.n else 0.0
        margin = self.slack / horizon + self.settings.alpha * lower_base
        if margin <= 0:
            return 0.0
        gap = upper_base - lower_learner
        return 1.0 if gap <= margin else float(margin / gap)

    def _maybe_advance(self) -> None:
        base, learner = self.stats["baseline"], self.stats["learner"]
        if not (base.n and learner.n):
            return
        if self.mode == "apprentice" and \
                learner.lower() >= (1.0 - self.settings.alpha) * base.upper():
            self._switch("conservative", f"the learner's lower bound {learner.lower():.4f} >= "
                         f"(1 - alpha) x the baseline's upper bound {base.upper():.4f}")
        elif self.mode == "conservative" and learner.lower() > base.upper():
            self._switch("online", f"the learner's lower bound {learner.lower():.4f} > the "
                         f"baseline's upper bound {base.upper():.4f}")

    def step_back(self) -> None:
        """online → conservative → apprentice (a forced step back; no-op in apprentice)."""
        back = {"online": "conservative", "conservative": "apprentice"}.get(self.mode)
        if back is None:
            log.warning("rollout: a step back was asked for, but the mode is already apprentice")
            return
        self._switch(back, "asked for (SIGUSR2)")

    def _switch(self, mode: str, why: str) -> None:
        old = self.mode
        self.mode = mode
        self.share = self._initial_share()
        self.stats = {k: ArmStats(self.settings.confidence_miss) for k in self.stats}
        self.earned, self.events = 0.0, 0
        self.history = [*self.history, {"from": old, "to": mode, "why": why}][-HISTORY_KEPT:]
        log.info("rollout: %s -> %s (%s)", old, mode, why)
        self.on_switch(old, mode, why)

    # --------------------------------------------------------------- state
    def export(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays: dict[str, np.ndarray] = {}
        stats: dict[str, Any] = {}
        for name, arm in self.stats.items():
            a, m = arm.state()
            arrays.update({f"adoption.{name}.{k}": v for k, v in a.items()})
            stats[name] = m
        return arrays, {"mode": self.mode, "configured": self.settings.mode,
                        "share": self.share, "earned": self.earned,
                        "events": self.events, "agreement": None if math.isnan(self.agreement)
                        else self.agreement, "history": self.history, "stats": stats}

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """A checkpoint's state. Its mode wins while ``rollout.mode`` is configured as it was
        when the checkpoint was written (a restart does not undo an automatic switch or a
        step back); a newly configured mode starts afresh."""
        if meta.get("configured", meta["mode"]) != self.settings.mode:
            log.info("rollout: %s configured (was %s): the comparisons start afresh",
                     self.settings.mode, meta.get("configured"))
            return
        self.mode = str(meta["mode"])
        if self.mode not in MODES:
            raise ConfigError(f"Expected a rollout mode among {MODES}. Got {self.mode!r}.")
        self.share = float(meta["share"])
        self.earned, self.events = float(meta["earned"]), int(meta["events"])
        agreement = meta.get("agreement")
        self.agreement = math.nan if agreement is None else float(agreement)
        self.history = list(meta.get("history") or [])
        for name, m in meta["stats"].items():
            prefix = f"adoption.{name}."
            self.stats[name] = ArmStats.from_state(
                {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}, m)
