"""Replay a labelled dataset through a learner as a bandit stream.

Each micro-batch: ``decide`` (keys = round numbers, so the run is a pure
function of the seed) → reward 1[ỹ = y] → feedback is delivered after a
per-event delay (in rounds, drawn from an exponential distribution with the
given mean) unless dropped; dropped feedback expires to the default reward 0
when its delay has elapsed, as the daemon's join does → ``update`` with every
feedback due by the end of the batch. Optional drift: from a given round on,
labels are permuted (a fixed random permutation) or the class prior shifts.

Examples
--------
>>> from simulators.synthetic import synthetic_stream
>>> from streamlearn.learners.banditron import Banditron
>>> from streamlearn.learners.exploration import FixedGamma
>>> X, y = synthetic_stream(5_000, noise=0.0, seed=2)
>>> r = replay(Banditron(9, 400, FixedGamma(0.05)), X, y, batch_size=64)
>>> r.rounds, 0.0 < r.error_rate < 0.5
(5000, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from streamlearn.errors import ConfigError
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.features import Batch, SparseBatch, take_rows
from streamlearn.learners.base import Learner

__all__ = ["Drift", "ReplayResult", "apply_drift", "replay", "stream_order"]


@dataclass(frozen=True)
class Drift:
    """Concept drift from round ``at`` on: ``kind`` is 'permute' (labels permuted) or 'prior'."""

    at: int
    kind: str = "permute"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("permute", "prior"):
            raise ConfigError(f"Drift kind must be 'permute' or 'prior'. Got {self.kind!r} instead.")
        if self.at < 0:
            raise ConfigError(f"Drift round must be >= 0. Got {self.at}.")


@dataclass
class ReplayResult:
    """What a replay measured. ``curve`` holds (rounds, cumulative error) checkpoints."""

    rounds: int
    error_rate: float
    exploit_error_rate: float
    window_error_rate: float
    exploit_error_estimate: float
    regret_vs_oracle: float
    gamma_final: float
    seconds: float
    feedback_applied: int
    feedback_dropped: int
    curve: list[tuple[int, float]] = field(default_factory=list)

    @property
    def events_per_second(self) -> float:
        return self.rounds / self.seconds if self.seconds > 0 else float("inf")


def stream_order(n: int, passes: int, rounds: int | None, seed: int | None) -> np.ndarray:
    """Row indices of the stream: ``passes`` passes (each reshuffled when seed is given),
    cut or extended to ``rounds`` when given."""
    if passes < 1:
        raise ConfigError(f"--passes must be an int >= 1. Got {passes}.")
    rng = np.random.default_rng(seed) if seed is not None else None
    needed = passes if rounds is None else max(passes, -(-rounds // n))
    blocks = [rng.permutation(n) if rng is not None else np.arange(n) for _ in range(needed)]
    order = np.concatenate(blocks)
    return order if rounds is None else order[:rounds]


def apply_drift(y: np.ndarray, n_classes: int, drift: Drift | None,
                X: Batch | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Labels after drift; for 'prior' drift also the kept-row selection (class-prior shift)."""
    if drift is None or drift.at >= len(y):
        return y, None
    rng = np.random.default_rng(drift.seed)
    out = y.copy()
    if drift.kind == "permute":
        perm = rng.permutation(n_classes)
        out[drift.at:] = perm[y[drift.at:]]
        return out, None
    # prior shift: after the drift round, keep half of the classes at 4× the rate of the others
    favoured = rng.permutation(n_classes)[: max(1, n_classes // 2)]
    keep_prob = np.where(np.isin(y, favoured), 1.0, 0.25)
    keep = np.ones(len(y), dtype=bool)
    keep[drift.at:] = rng.random(len(y) - drift.at) < keep_prob[drift.at:]
    return out, keep


def _as_float(X: Batch) -> Batch:
    if isinstance(X, SparseBatch):
        return X
    return np.asarray(X, dtype=np.float64)


class _PendingFeedback:
    """Feedback in flight, as parallel arrays (struct of arrays); due = arrival round."""

    def __init__(self, n_actions: int) -> None:
        self.rows = np.zeros(0, dtype=np.int64)
        self.actions = np.zeros(0, dtype=np.int64)
        self.rewards = np.zeros(0)
        self.probs = np.zeros((0, n_actions))
        self.due = np.zeros(0, dtype=np.int64)

    def push(self, rows: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
             probs: np.ndarray, due: np.ndarray) -> None:
        self.rows = np.concatenate([self.rows, rows])
        self.actions = np.concatenate([self.actions, actions])
        self.rewards = np.concatenate([self.rewards, rewards])
        self.probs = np.concatenate([self.probs, probs])
        self.due = np.concatenate([self.due, due])

    def pop_due(self, before: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Remove and return (rows, actions, rewards, probs) of feedback arriving before ``before``."""
        due = self.due < before
        out = (self.rows[due], self.actions[due], self.rewards[due], self.probs[due])
        keep = ~due
        self.rows, self.actions, self.rewards = self.rows[keep], self.actions[keep], self.rewards[keep]
        self.probs, self.due = self.probs[keep], self.due[keep]
        return out


def replay(
    learner: Learner,
    X: Batch,
    y: np.ndarray,
    *,
    batch_size: int = 1,
    delay_mean: float = 0.0,
    drop: float = 0.0,
    default_reward: float = 0.0,
    seed: int = 0,
    curve_points: int = 60,
    progress: Callable[[int, int, float], None] | None = None,
) -> ReplayResult:
    """Run the stream ``(X, y)`` in order through ``learner`` and measure it.

    ``delay_mean`` is in rounds (0 = feedback right after its batch); ``drop`` is the
    probability that feedback never arrives (it then expires to ``default_reward``).
    Full-information learners (the Perceptron comparator) get the true label.
    """
    n = len(y)
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be an int >= 1. Got {batch_size}.")
    if not 0.0 <= drop < 1.0:
        raise ConfigError(f"--drop must be a probability in [0, 1). Got {drop}.")
    if delay_mean < 0:
        raise ConfigError(f"--delay must be >= 0. Got {delay_mean}.")
    rng = np.random.default_rng([seed, 7])
    delays = np.ceil(rng.exponential(delay_mean, size=n)).astype(np.int64) if delay_mean else (
        np.zeros(n, dtype=np.int64))
    dropped = rng.random(n) < drop if drop else np.zeros(n, dtype=bool)
    tracker = OnlineErrorTracker(window=max(1000, batch_size))
    # curve points, ascending; next_point indexes the first one not yet passed
    curve_rounds = np.unique(np.geomspace(1, n, curve_points).astype(np.int64)).tolist()
    next_point = 0
    curve: list[tuple[int, float]] = []

    pending = _PendingFeedback(learner.n_actions)
    applied = 0
    gamma_last = float("nan")
    start = time.perf_counter()
    last_report = start
    for lo in range(0, n, batch_size):
        hi = min(n, lo + batch_size)
        rows = np.arange(lo, hi)
        Xb = _as_float(take_rows(X, rows))
        labels = y[lo:hi]
        actions, probs = learner.decide(Xb, keys=rows)
        exploit = np.argmax(probs, axis=1)
        gamma_last = float(1.0 - probs[-1, exploit[-1]]) * learner.n_actions / max(
            1, learner.n_actions - 1)
        if learner.full_information:
            played, fb_actions = exploit, labels
            fb_rewards = np.ones(len(rows))
        else:
            played, fb_actions = actions, actions
            fb_rewards = (actions == labels).astype(float)
        tracker.observe(played, labels=labels, probs=probs)
        fb_rewards = np.where(dropped[lo:hi], default_reward, fb_rewards)
        if not delay_mean:  # no delay: this batch's feedback is applied right after it
            learner.update(Xb, fb_actions, fb_rewards, probs)
            applied += len(rows)
        else:
            pending.push(rows, fb_actions, fb_rewards, probs, rows + delays[lo:hi])
            due_rows, due_actions, due_rewards, due_probs = pending.pop_due(hi)
            if len(due_rows):
                learner.update(_as_float(take_rows(X, due_rows)), due_actions, due_rewards,
                               due_probs)
                applied += len(due_rows)
        if next_point < len(curve_rounds) and curve_rounds[next_point] <= hi:
            curve.append((hi, tracker.error_rate))
            while next_point < len(curve_rounds) and curve_rounds[next_point] <= hi:
                next_point += 1
        now = time.perf_counter()
        if progress is not None and now - last_report >= 2.0:
            progress(hi, n, tracker.error_rate)
            last_report = now
    seconds = time.perf_counter() - start
    return ReplayResult(
        rounds=n,
        error_rate=tracker.error_rate,
        exploit_error_rate=tracker.exploit_error_rate,
        window_error_rate=tracker.window_error_rate,
        exploit_error_estimate=tracker.exploit_error_estimate,
        regret_vs_oracle=tracker.regret_vs_oracle,
        gamma_final=gamma_last,
        seconds=seconds,
        feedback_applied=applied,
        feedback_dropped=int(dropped.sum()),
        curve=curve,
    )
