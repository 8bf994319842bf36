"""Exploration strategies shared by every learner (ALGORITHMS.md §4).

A strategy returns one γ per event of a batch, computed from the round
numbers, the current scores and what feedback it has *already* observed —
never from the feedback of the round being decided (γ is fixed before the
action is sampled). ``observe`` is called by ``Learner.update`` with each
batch of feedback.

Strategies (CLI names in brackets):

* :class:`FixedGamma` [fixed] — the same γ every round.
* :class:`SqrtSchedule` [sqrt] — γ_t = min(½, c·√(K/t)).
* :class:`CubeRootSchedule` [cuberoot] — γ_t = min(½, c·(K/t)^{1/3}).
* :class:`Adaptive` [adaptive] — our reconstruction of Valizadegan, Jin & Wang
  (KDD 2011): an unbiased online estimate r̂ of the exploit error drives
  γ_t = clip(c·(K·r̂/t)^{1/3}, c′·√(K/t), ½).
* :class:`MarginAware` [margin] — per-instance γ: a base strategy's γ scaled by
  2·exp(−gap/ḡ), where gap is the top-two score gap of this x and ḡ a running
  mean of gaps (explores more on ambiguous contexts; mean γ ≈ the base γ).

>>> s = CubeRootSchedule(c=1.0)
>>> [round(float(g), 4) for g in s.gammas(np.zeros((2, 8)), np.zeros(2, int), np.array([8, 64]), None, 8)]
[0.5, 0.5]
>>> [round(float(g), 4) for g in s.gammas(np.zeros((1, 8)), np.zeros(1, int), np.array([10**6]), None, 8)]
[0.02]
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np

from streamlearn.errors import ConfigError

__all__ = [
    "STRATEGIES",
    "Adaptive",
    "CubeRootSchedule",
    "Exploration",
    "FixedGamma",
    "MarginAware",
    "SqrtSchedule",
    "exploration_from_name",
    "exploration_from_spec",
]

GAMMA_MAX = 0.5


def _check_positive(owner: str, name: str, value: object, high: float = math.inf) -> float:
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    if ok:
        ok = bool(np.isfinite(float(value))) and 0.0 < float(value) <= high  # type: ignore[arg-type]
    if not ok:
        bound = f"(0, {high}]" if math.isfinite(high) else "(0, inf)"
        raise ConfigError(
            f"The '{name}' parameter of {owner} must be a float in {bound}. Got {value!r} instead."
        )
    return float(value)  # type: ignore[arg-type]


class Exploration(abc.ABC):
    """How much to explore: one γ ∈ (0, ½] per event, decided before sampling."""

    name: ClassVar[str]

    def gammas(
        self,
        scores: np.ndarray,
        exploit: np.ndarray,
        rounds: np.ndarray,
        mask: np.ndarray | None,
        n_actions: int,
    ) -> np.ndarray:
        """γ for each event of a batch; ``rounds`` are the 1-based round numbers t.

        Strategies that depend only on t (and past feedback) implement ``rule``;
        per-instance strategies override this method.
        """
        return self.rule(np.asarray(rounds, dtype=float), n_actions)

    def rule(self, t: np.ndarray, n_actions: int) -> np.ndarray:
        """γ as a function of the round numbers t alone."""
        raise NotImplementedError(f"{type(self).__name__} must implement rule() or gammas().")

    def observe(self, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray) -> None:  # noqa: B027
        """Feedback of past rounds (only adaptive strategies use it)."""

    def params(self) -> dict[str, Any]:
        return {}

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, **self.params()}

    def clone(self) -> Exploration:
        return exploration_from_spec(self.spec())

    def arrays(self) -> dict[str, np.ndarray]:
        return {}

    def scalars(self) -> dict[str, float]:
        return {}

    def load(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:  # noqa: B027
        """Install state saved by ``arrays``/``scalars``."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


class FixedGamma(Exploration):
    """The same γ ∈ (0, ½] every round (the Banditron paper's setting)."""

    name = "fixed"

    def __init__(self, gamma: float = 0.05) -> None:
        self.gamma = _check_positive("FixedGamma", "gamma", gamma, GAMMA_MAX)

    def rule(self, t: np.ndarray, n_actions: int) -> np.ndarray:
        return np.full(len(t), self.gamma)

    def params(self) -> dict[str, Any]:
        return {"gamma": self.gamma}


class SqrtSchedule(Exploration):
    """γ_t = min(½, c·√(K/t)) — the separable-case schedule."""

    name = "sqrt"

    def __init__(self, c: float = 0.1) -> None:
        self.c = _check_positive("SqrtSchedule", "c", c)

    def rule(self, t: np.ndarray, n_actions: int) -> np.ndarray:
        return np.minimum(GAMMA_MAX, self.c * np.sqrt(n_actions / t))

    def params(self) -> dict[str, Any]:
        return {"c": self.c}


class CubeRootSchedule(Exploration):
    """γ_t = min(½, c·(K/t)^{1/3}) — the noisy-case schedule."""

    name = "cuberoot"

    def __init__(self, c: float = 0.5) -> None:
        self.c = _check_positive("CubeRootSchedule", "c", c)

    def rule(self, t: np.ndarray, n_actions: int) -> np.ndarray:
        return np.minimum(GAMMA_MAX, self.c * np.cbrt(n_actions / t))

    def params(self) -> dict[str, Any]:
        return {"c": self.c}


class Adaptive(Exploration):
    """γ from an unbiased online estimate of the exploit error (reconstruction, see module doc).

    For each feedback event, c = r·1[ỹ=ŷ]/P(ŷ) has expectation 1[ŷ=y] (the
    exploit action's reward), so r̂ = 1 − mean(c) estimates the exploit error
    without bias. γ_t = clip(c·(K·r̂/t)^{1/3}, c′·√(K/t), ½): the minimiser of the
    dominant terms of the Banditron bound given the estimated loss. With
    ``window`` > 0 the mean runs over the last ``window`` feedback events (drift).
    """

    name = "adaptive"

    def __init__(self, c: float = 1.5, c_floor: float = 0.05, window: int = 0) -> None:
        self.c = _check_positive("Adaptive", "c", c)
        self.c_floor = _check_positive("Adaptive", "c_floor", c_floor)
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
            raise ConfigError(
                f"The 'window' parameter of Adaptive must be an int >= 0. Got {window!r} instead."
            )
        self.window = int(window)
        self._sum = 0.0
        self._count = 0
        self._ring = np.zeros(self.window)

    def exploit_error(self) -> float:
        """Current estimate r̂ ∈ [0, 1] (1 before any feedback)."""
        if self._count == 0:
            return 1.0
        if self.window:
            n = min(self._count, self.window)
            mean = float(self._ring[:n].sum()) / n if n < self.window else float(self._ring.mean())
        else:
            mean = self._sum / self._count
        return float(np.clip(1.0 - mean, 0.0, 1.0))

    def rule(self, t: np.ndarray, n_actions: int) -> np.ndarray:
        r_hat = self.exploit_error()
        target = self.c * np.cbrt(n_actions * r_hat / t)
        floor = self.c_floor * np.sqrt(n_actions / t)
        return np.clip(np.maximum(target, floor), 0.0, GAMMA_MAX)

    def observe(self, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray) -> None:
        exploit = np.argmax(probs, axis=1)
        rows = np.arange(len(actions))
        c = rewards * (actions == exploit) / probs[rows, exploit]
        self._sum += float(c.sum())
        if self.window:
            tail = c[-self.window:]
            positions = (self._count + len(c) - len(tail) + np.arange(len(tail))) % self.window
            self._ring[positions] = tail
        self._count += len(c)

    def params(self) -> dict[str, Any]:
        return {"c": self.c, "c_floor": self.c_floor, "window": self.window}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"ring": self._ring}

    def scalars(self) -> dict[str, float]:
        return {"sum": self._sum, "count": self._count}

    def load(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        ring = np.asarray(arrays["ring"], dtype=float)
        if ring.shape != (self.window,):
            raise ConfigError(f"Adaptive ring must have shape ({self.window},). Got {ring.shape}.")
        self._ring = ring.copy()
        self._sum = float(scalars["sum"])
        self._count = int(scalars["count"])


class MarginAware(Exploration):
    """Per-instance γ: base γ_t · 2·exp(−gap/ḡ), capped at ½ (reconstruction).

    ``gap`` is the difference between the best and the second-best allowed
    score of this x; ḡ is a running mean of past gaps (so the rule is scale
    free). It depends on W and x only, never on this round's feedback.
    """

    name = "margin"

    def __init__(self, base: Exploration | None = None, decay: float = 0.01) -> None:
        self.base = base if base is not None else Adaptive()
        if isinstance(self.base, MarginAware):
            raise ConfigError("The 'base' parameter of MarginAware cannot itself be MarginAware.")
        self.decay = _check_positive("MarginAware", "decay", decay, 1.0)
        self._mean_gap = 0.0

    def gammas(
        self,
        scores: np.ndarray,
        exploit: np.ndarray,
        rounds: np.ndarray,
        mask: np.ndarray | None,
        n_actions: int,
    ) -> np.ndarray:
        base = self.base.gammas(scores, exploit, rounds, mask, n_actions)
        masked = scores if mask is None else np.where(mask, scores, -np.inf)
        top2 = -np.partition(-masked, 1, axis=1)[:, :2] if masked.shape[1] > 1 else masked
        gap = np.nan_to_num(top2[:, 0] - top2[:, 1], posinf=0.0) if top2.shape[1] > 1 else (
            np.zeros(len(base)))
        if mask is not None:
            gap = np.where(mask.sum(axis=1) > 1, gap, np.inf)  # one allowed action: nothing to explore
        scale = self._mean_gap if self._mean_gap > 0 else 1.0
        factor = 2.0 * np.exp(-np.minimum(gap, 1e300) / scale) if self._mean_gap > 0 else (
            np.ones(len(base)))
        # the running mean only moves after this batch's γ are fixed
        finite = gap[np.isfinite(gap)]
        if finite.size:
            weight = 1.0 - (1.0 - self.decay) ** finite.size
            self._mean_gap += weight * (float(finite.mean()) - self._mean_gap)
        return np.clip(base * factor, 1e-6, GAMMA_MAX)

    def observe(self, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray) -> None:
        self.base.observe(actions, rewards, probs)

    def params(self) -> dict[str, Any]:
        return {"base": self.base.spec(), "decay": self.decay}

    def arrays(self) -> dict[str, np.ndarray]:
        return {f"base.{k}": v for k, v in self.base.arrays().items()}

    def scalars(self) -> dict[str, float]:
        return {"mean_gap": self._mean_gap, **{f"base.{k}": v for k, v in self.base.scalars().items()}}

    def load(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        self._mean_gap = float(scalars["mean_gap"])
        self.base.load(
            {k[5:]: v for k, v in arrays.items() if k.startswith("base.")},
            {k[5:]: v for k, v in scalars.items() if k.startswith("base.")},
        )


STRATEGIES: dict[str, type[Exploration]] = {
    cls.name: cls for cls in (FixedGamma, SqrtSchedule, CubeRootSchedule, Adaptive, MarginAware)
}


def exploration_from_spec(spec: dict[str, Any]) -> Exploration:
    """Rebuild a strategy from ``Exploration.spec()`` (used by state files and config)."""
    spec = dict(spec)
    name = spec.pop("name", None)
    if name not in STRATEGIES:
        raise ConfigError(
            f"Expected an exploration strategy in {sorted(STRATEGIES)}. Got {name!r} instead."
        )
    if name == "margin" and isinstance(spec.get("base"), dict):
        spec["base"] = exploration_from_spec(spec["base"])
    return STRATEGIES[name](**spec)


def exploration_from_name(name: str, gamma: float | None = None) -> Exploration:
    """The CLI mapping: a strategy name with its untuned defaults, or a fixed γ."""
    if name == "fixed" or (gamma is not None and name in ("", "fixed")):
        return FixedGamma(0.05 if gamma is None else gamma)
    if name not in STRATEGIES:
        raise ConfigError(
            f"--exploration must be one of {sorted(STRATEGIES)}. Got {name!r} instead."
        )
    return STRATEGIES[name]()
