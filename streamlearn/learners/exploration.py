"""Exploration strategies shared by every learner (docs/algorithms.md §4).

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
from streamlearn.features import row_starts

__all__ = [
    "LEARNER_DEFAULT",
    "STRATEGIES",
    "Adaptive",
    "CubeRootSchedule",
    "Exploration",
    "FixedGamma",
    "MarginAware",
    "PageHinkley",
    "SqrtSchedule",
    "default_exploration",
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
    #: changes detected by the strategy's drift detector (strategies without one keep 0)
    drift_detections_: int = 0

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

    def observe(self, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,  # noqa: B027
                exploit: np.ndarray | None = None) -> None:
        """Feedback of past rounds (only adaptive strategies use it); ``exploit``: the
        learner's own best action of decision time (default: the logged row's maximum)."""

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

    def pooled_scalars(self) -> tuple[str, ...]:
        """The :meth:`scalars` that are sums over the feedback observed since the last
        detected change: learners that observed disjoint feedback hold, together, the sum of
        what each added. A scaled-out group pools them (:mod:`streamlearn.sync.merge`); the
        other scalars stay each learner's own."""
        return ()

    def restarts_scalar(self) -> str | None:
        """The scalar counting the detected changes (a change empties the pooled ones)."""
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


class FixedGamma(Exploration):
    """The same γ ∈ (0, ½] every round (the Banditron paper's setting).

    ``detect_drift=True`` adds :class:`Adaptive`'s Page–Hinkley change detector on the
    exploit action's error (``drift_delta``, ``drift_threshold``): γ stays fixed, but
    ``drift_detections_`` counts the changes so that a learner can restart its statistics
    (bagging's default, whose exploration is its bootstrap votes).
    """

    name = "fixed"

    def __init__(self, gamma: float = 0.05, detect_drift: bool = False,
                 drift_delta: float = 0.2, drift_threshold: float = 100.0) -> None:
        self.gamma = _check_positive("FixedGamma", "gamma", gamma, GAMMA_MAX)
        on, delta, threshold = _detector_params("FixedGamma", detect_drift, drift_delta,
                                                drift_threshold)
        self._detector = PageHinkley(delta, threshold) if on else None
        self.drift_detections_ = 0

    def rule(self, t: np.ndarray, n_actions: int) -> np.ndarray:
        return np.full(len(t), self.gamma)

    def gammas(self, scores: np.ndarray, exploit: np.ndarray, rounds: np.ndarray,
               mask: np.ndarray | None, n_actions: int) -> np.ndarray:
        return np.full(len(rounds), self.gamma)  # the rounds need no conversion

    def observe(self, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray | None = None) -> None:
        if self._detector is not None:
            watched = _learner_played(actions, probs, exploit)
            self.drift_detections_ += self._detector.update(1.0 - rewards[watched])[0]

    def params(self) -> dict[str, Any]:
        if self._detector is None:  # the spec of a plain fixed γ stays {"name", "gamma"}
            return {"gamma": self.gamma}
        return {"gamma": self.gamma, "detect_drift": True,
                "drift_delta": self._detector.delta, "drift_threshold": self._detector.threshold}

    def arrays(self) -> dict[str, np.ndarray]:
        return {} if self._detector is None else {"detector": self._detector.state}

    def scalars(self) -> dict[str, float]:
        return {} if self._detector is None else {"drift_detections": self.drift_detections_}

    def load(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        if self._detector is not None:
            self._detector.state = _detector_state(arrays)
            self.drift_detections_ = int(scalars.get("drift_detections", 0))


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


def _learner_played(actions: np.ndarray, probs: np.ndarray,
                    exploit: np.ndarray | None) -> np.ndarray:
    """The events a drift detector watches: those whose played action was the learner's own
    best action. The logged row's maximum is that action whenever the learner decided alone;
    when a baseline or a ranker shared the decision it is theirs, and a step back to a
    baseline-served mode then read as the learner's error rising to the baseline's — the
    detector reported a change and the exploration restarted (an outside test: the learner's
    error went from 0.32 to 0.92 after a SIGUSR2 on stationary data)."""
    return np.asarray(actions == (probs.argmax(axis=1) if exploit is None else exploit))


class PageHinkley:
    """Page–Hinkley test for an increase in the mean of a signal (Page 1954; Hinkley 1971).

    m_t = Σ_{i≤t} (e_i − ē_i − δ) with ē_i the mean of e_1..e_i, M_t = min_{i≤t} m_i;
    a change is signalled when m_t − M_t > λ, and the test then restarts from scratch.
    Vectorised over a batch; several changes in one batch are handled in order, so a
    batch gives exactly the per-event result.

    >>> ph = PageHinkley(delta=0.05, threshold=5.0)
    >>> ph.update(np.zeros(500)), ph.update(np.ones(20))
    ((0, -1), (1, 5))
    """

    def __init__(self, delta: float, threshold: float) -> None:
        self.delta = delta
        self.threshold = threshold
        self.state = np.zeros(4)  # [count, sum of e, m, min m] since the last restart

    def update(self, signal: np.ndarray) -> tuple[int, int]:
        """Feed a batch; return (changes signalled, index of the last alarm in it or −1)."""
        changes, last, offset = 0, -1, 0
        e = np.asarray(signal, dtype=np.float64)
        while len(e):
            # Python floats: the same float64 arithmetic as on the array's scalars, without
            # numpy's per-scalar overhead (about half of this call on a batch of 64)
            count, total, m, m_min = self.state.tolist()
            n = np.arange(1, len(e) + 1, dtype=np.float64)
            n += count  # whole numbers: exact, as count + arange was
            mean = np.cumsum(e)
            mean += total
            mean /= n
            steps = e - mean
            steps -= self.delta
            m_path = np.cumsum(steps)
            m_path += m
            m_min_path = np.minimum.accumulate(m_path)
            np.minimum(m_min_path, m_min, out=m_min_path)
            alarms = np.flatnonzero(m_path - m_min_path > self.threshold)
            if not len(alarms):
                self.state = np.array([count + len(e), total + float(e.sum()),
                                       float(m_path[-1]), float(m_min_path[-1])])
                break
            changes += 1
            last = offset + int(alarms[0])
            offset = last + 1
            self.state = np.zeros(4)
            e = e[alarms[0] + 1:]
        return changes, last


def _detector_params(owner: str, detect_drift: object, delta: object,
                     threshold: object) -> tuple[bool, float, float]:
    """The validated ``detect_drift``, ``drift_delta``, ``drift_threshold`` of a strategy."""
    if not isinstance(detect_drift, bool):
        raise ConfigError(f"The 'detect_drift' parameter of {owner} must be a bool. "
                          f"Got {detect_drift!r} instead.")
    return (detect_drift, _check_positive(owner, "drift_delta", delta, 1.0),
            _check_positive(owner, "drift_threshold", threshold))


def _detector_state(arrays: dict[str, np.ndarray]) -> np.ndarray:
    state = np.asarray(arrays.get("detector", np.zeros(4)), dtype=float)
    if state.shape != (4,):
        raise ConfigError(f"A drift detector's state must have shape (4,). Got {state.shape}.")
    return state.copy()


class Adaptive(Exploration):
    """γ from an online estimate of the exploit error, restarted when a change is detected.

    For each feedback event, c = r·1[ỹ=ŷ]/P(ŷ) has expectation 1[ŷ=y] (the
    exploit action's reward), so r̂ = 1 − mean(c) estimates the exploit error
    without bias. γ_t = clip(c·(K·r̂/τ)^p, c′·√(K/τ), ½) with p = ``power``: p = ⅓
    minimises the dominant terms of the Banditron bound given the estimated loss
    (our reconstruction); p = ½ gives SquareCB its √t schedule scaled by √r̂.

    Drift: τ counts the rounds since the last detected change (τ = t on a
    stationary stream). A Page–Hinkley test (tolerance ``drift_delta``, threshold
    ``drift_threshold``) watches e = 1 − r on the events whose played action was
    the exploit action; when the exploit action's error rises, the clock τ and the
    estimate r̂ restart, so γ jumps back to its early-stream level
    (``drift_detections_`` counts the changes). r̂ is the mean since the last
    change; ``window`` > 0 uses the last ``window`` events instead, ``half_life``
    > 0 an exponentially discounted mean with that half-life in events.
    """

    name = "adaptive"

    def __init__(self, c: float = 1.5, c_floor: float = 0.05, window: int = 0,
                 power: float = 1.0 / 3.0, half_life: float = 0.0, detect_drift: bool = True,
                 drift_delta: float = 0.2, drift_threshold: float = 100.0) -> None:
        self.c = _check_positive("Adaptive", "c", c)
        self.c_floor = _check_positive("Adaptive", "c_floor", c_floor)
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
            raise ConfigError(
                f"The 'window' parameter of Adaptive must be an int >= 0. Got {window!r} instead."
            )
        self.window = int(window)
        self.power = _check_positive("Adaptive", "power", power, 1.0)
        if not isinstance(half_life, (int, float, np.floating)) or isinstance(half_life, bool) or not (
                math.isfinite(float(half_life)) and float(half_life) >= 0.0):
            raise ConfigError(f"The 'half_life' parameter of Adaptive must be a float >= 0. "
                              f"Got {half_life!r} instead.")
        self.half_life = float(half_life)
        if self.window and self.half_life:
            raise ConfigError("Adaptive takes a 'window' or a 'half_life', not both. "
                              f"Got window={window!r}, half_life={half_life!r}.")
        self.detect_drift, self.drift_delta, self.drift_threshold = _detector_params(
            "Adaptive", detect_drift, drift_delta, drift_threshold)
        # the detector's state is kept (and saved) even when it is switched off
        self._detector = PageHinkley(self.drift_delta, self.drift_threshold)
        self._sum = 0.0  # Σ c since the last change (discounted when half_life > 0)
        self._count = 0.0  # events since the last change (discounted likewise)
        self._ring = np.zeros(self.window)
        self._clock_start = 0  # τ = t − clock_start
        self._restart_pending = False  # a change was seen: the clock restarts at the next round
        self.drift_detections_ = 0

    def exploit_error(self) -> float:
        """Current estimate r̂ ∈ [0, 1] (1 before any feedback since the last change)."""
        if self._count <= 0:
            return 1.0
        if self.window:
            n = int(min(self._count, self.window))
            mean = float(self._ring[:n].sum()) / n if n < self.window else float(self._ring.mean())
        else:
            mean = self._sum / self._count
        error = 1.0 - float(mean)
        return error if math.isnan(error) else min(max(error, 0.0), 1.0)  # as np.clip

    def clock(self, t: np.ndarray) -> np.ndarray:
        """τ: the rounds since the last detected change (t itself before any change)."""
        if self._restart_pending:
            self._clock_start = int(t[0]) - 1
            self._restart_pending = False
        return np.asarray(np.maximum(np.asarray(t, dtype=float) - self._clock_start, 1.0))

    def rule(self, t: np.ndarray, n_actions: int) -> np.ndarray:
        tau = self.clock(t)
        r_hat = self.exploit_error()
        target = self.c * (n_actions * r_hat / tau) ** self.power
        floor = self.c_floor * np.sqrt(n_actions / tau)
        # clip to [0, ½] (NaN stays NaN, as with np.clip)
        return np.minimum(np.maximum(np.maximum(target, floor), 0.0), GAMMA_MAX)

    def observe(self, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray | None = None) -> None:
        logged_exploit = probs.argmax(axis=1)
        played_exploit = actions == logged_exploit
        at_exploit = row_starts(*probs.shape) + logged_exploit
        c = rewards * played_exploit / probs.take(at_exploit)
        if self.detect_drift:
            watched = _learner_played(actions, probs, exploit)
            changes, last = self._detector.update(1.0 - rewards[watched])
            if changes:
                self.drift_detections_ += changes
                self._sum, self._count, self._ring = 0.0, 0.0, np.zeros(self.window)
                self._restart_pending = True
                c = c[int(np.flatnonzero(watched)[last]) + 1:]  # only events after the change
        self._accumulate(c)

    def _accumulate(self, c: np.ndarray) -> None:
        n = len(c)
        if self.half_life > 0:
            keep = 0.5 ** (1.0 / self.half_life)
            weights = keep ** np.arange(n - 1, -1, -1)
            self._sum = self._sum * keep**n + float(np.dot(weights, c))
            self._count = self._count * keep**n + float(weights.sum())
            return
        self._sum += float(c.sum())
        if self.window:
            tail = c[-self.window:]
            positions = (int(self._count) + n - len(tail) + np.arange(len(tail))) % self.window
            self._ring[positions] = tail
        self._count += n

    def params(self) -> dict[str, Any]:
        return {"c": self.c, "c_floor": self.c_floor, "window": self.window, "power": self.power,
                "half_life": self.half_life, "detect_drift": self.detect_drift,
                "drift_delta": self.drift_delta, "drift_threshold": self.drift_threshold}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"ring": self._ring, "detector": self._detector.state}

    def scalars(self) -> dict[str, float]:
        return {"sum": self._sum, "count": self._count, "clock_start": self._clock_start,
                "restart_pending": int(self._restart_pending),
                "drift_detections": self.drift_detections_}

    def pooled_scalars(self) -> tuple[str, ...]:
        # Σ c and the event count (discounted alike with a half-life, which pooling keeps
        # approximately); a window's mean lives in its ring, which is each learner's own
        return () if self.window else ("sum", "count")

    def restarts_scalar(self) -> str | None:
        return "drift_detections"

    def load(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        ring = np.asarray(arrays["ring"], dtype=float)
        if ring.shape != (self.window,):
            raise ConfigError(f"Adaptive ring must have shape ({self.window},). Got {ring.shape}.")
        self._ring = ring.copy()
        self._detector.state = _detector_state(arrays)
        self._sum = float(scalars["sum"])
        self._count = float(scalars["count"])
        self._clock_start = int(scalars.get("clock_start", 0))
        self._restart_pending = bool(scalars.get("restart_pending", 0))
        self.drift_detections_ = int(scalars.get("drift_detections", 0))


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

    def observe(self, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray | None = None) -> None:
        self.base.observe(actions, rewards, probs, exploit)
        self.drift_detections_ = self.base.drift_detections_  # the margin rule has no detector

    def params(self) -> dict[str, Any]:
        return {"base": self.base.spec(), "decay": self.decay}

    def arrays(self) -> dict[str, np.ndarray]:
        return {f"base.{k}": v for k, v in self.base.arrays().items()}

    def scalars(self) -> dict[str, float]:
        return {"mean_gap": self._mean_gap, **{f"base.{k}": v for k, v in self.base.scalars().items()}}

    def pooled_scalars(self) -> tuple[str, ...]:
        return tuple(f"base.{name}" for name in self.base.pooled_scalars())

    def restarts_scalar(self) -> str | None:
        name = self.base.restarts_scalar()
        return None if name is None else f"base.{name}"

    def load(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        self._mean_gap = float(scalars["mean_gap"])
        self.base.load(
            {k[5:]: v for k, v in arrays.items() if k.startswith("base.")},
            {k[5:]: v for k, v in scalars.items() if k.startswith("base.")},
        )
        self.drift_detections_ = self.base.drift_detections_


STRATEGIES: dict[str, type[Exploration]] = {
    cls.name: cls for cls in (FixedGamma, SqrtSchedule, CubeRootSchedule, Adaptive, MarginAware)
}


def default_exploration() -> Exploration:
    """The exploration of the regression-oracle learners: drift-aware ``Adaptive`` on the √t scale.

    γ_t = 0.35·√(K·r̂/τ) (floor 0.05·√(K/τ)), τ restarting at each detected change. One
    setting for every data set (docs/learners.md says how it was chosen).
    """
    return Adaptive(c=0.35, power=0.5)


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


#: The name (CLI and config) of "the learner's own default exploration".
LEARNER_DEFAULT = "default"


def exploration_from_name(name: str, gamma: float | None = None) -> Exploration | None:
    """The CLI mapping: a strategy name with its untuned defaults, or a fixed γ.

    ``"default"`` gives ``None``: the learner's own default exploration, the one its
    constructor picks (docs/learners.md).
    """
    if name == "fixed" or (gamma is not None and name in ("", "fixed")):
        return FixedGamma(0.05 if gamma is None else gamma)
    if name == LEARNER_DEFAULT:
        return None
    if name not in STRATEGIES:
        raise ConfigError(
            f"--exploration must be one of {sorted([LEARNER_DEFAULT, *STRATEGIES])}. "
            f"Got {name!r} instead."
        )
    return STRATEGIES[name]()
