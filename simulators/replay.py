"""Replay a labelled dataset through a learner as a bandit stream.

Each micro-batch: ``decide`` (keys = round numbers, so the run is a pure
function of the seed) → reward 1[ỹ = y] → feedback is delivered after a
per-event delay (in rounds, drawn from an exponential distribution with the
given mean) unless dropped; dropped feedback expires to the default reward 0
when its delay has elapsed, as the daemon's join does → ``update`` with every
feedback due by the end of the batch. Optional drift: from a given round on,
labels are permuted (a fixed random permutation) or the class prior shifts.

:func:`replay_stream` consumes the stream as a sequence of ``(X, y)`` blocks
and runs several learners on it in lockstep (a learner and its comparator see
every block once), so a stream never has to be held in memory: only the
blocks that delayed feedback still refers to are kept. :func:`replay` is the
one-learner, in-memory form. Both give the same numbers for the same stream,
whatever the block size (a multiple of the batch size).

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

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from streamlearn.errors import ConfigError
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.features import Batch, SparseBatch, take_rows
from streamlearn.learners.base import Learner

__all__ = ["BLOCK_ROUNDS", "Drift", "ReplayResult", "apply_drift", "replay", "replay_stream",
           "stream_order"]

#: Rounds per block when a stream is generated or sliced block by block.
BLOCK_ROUNDS = 4096


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


def _concat_rows(parts: Sequence[Batch]) -> Batch:
    """The rows of ``parts``, one after the other."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], SparseBatch):
        sparse = [p for p in parts if isinstance(p, SparseBatch)]
        offsets = np.cumsum([0] + [len(p.indices) for p in sparse[:-1]])
        indptr = np.concatenate([sparse[0].indptr[:1]]
                                + [p.indptr[1:] + o for p, o in zip(sparse, offsets, strict=True)])
        return SparseBatch(indptr, np.concatenate([p.indices for p in sparse]),
                           np.concatenate([p.values for p in sparse]), sparse[0].n_features)
    return np.concatenate([np.asarray(p) for p in parts])


class _FeedbackDraws:
    """Per-round feedback delays (in rounds) and drops, drawn a block at a time.

    The same numbers as one draw of ``n`` exponentials followed by ``n``
    uniforms from ``default_rng([seed, 7])``: the drop generator first skips
    the ``n`` exponentials (both draws are element by element, so drawing in
    blocks changes nothing).
    """

    _SKIP = 1 << 16

    def __init__(self, n: int, delay_mean: float, drop: float, seed: int) -> None:
        self.delay_mean, self.drop = delay_mean, drop
        self._delays = np.random.default_rng([seed, 7])
        self._drops = np.random.default_rng([seed, 7])
        if delay_mean and drop:
            for done in range(0, n, self._SKIP):
                self._drops.exponential(delay_mean, size=min(self._SKIP, n - done))

    def take(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        delays = (np.ceil(self._delays.exponential(self.delay_mean, size=m)).astype(np.int64)
                  if self.delay_mean else np.zeros(m, dtype=np.int64))
        dropped = self._drops.random(m) < self.drop if self.drop else np.zeros(m, dtype=bool)
        return delays, dropped


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
        """Remove and return (rows, actions, rewards, probs) of feedback arriving before ``before``.

        Rows come out in increasing order (they are pushed in stream order and
        the kept ones keep theirs).
        """
        due = self.due < before
        out = (self.rows[due], self.actions[due], self.rewards[due], self.probs[due])
        keep = ~due
        self.rows, self.actions, self.rewards = self.rows[keep], self.actions[keep], self.rewards[keep]
        self.probs, self.due = self.probs[keep], self.due[keep]
        return out


class _RecentBlocks:
    """The blocks that feedback still in flight refers to, by first round."""

    def __init__(self) -> None:
        self.blocks: dict[int, Batch] = {}

    def add(self, start: int, X: Batch) -> None:
        self.blocks[start] = X

    def rows(self, rows: np.ndarray) -> Batch:
        """Feature rows of the (increasing) stream rounds ``rows``."""
        parts = []
        starts = sorted(self.blocks)
        for start, stop in zip(starts, [*starts[1:], None], strict=True):
            inside = rows[(rows >= start) & (rows < stop if stop is not None else True)]
            if len(inside):
                parts.append(take_rows(self.blocks[start], inside - start))
        return _concat_rows(parts)

    def forget_before(self, first_needed: int) -> None:
        """Drop every block that ends at or before round ``first_needed``."""
        starts = sorted(self.blocks)
        for start, following in itertools.pairwise(starts):
            if following <= first_needed:
                del self.blocks[start]


@dataclass
class _Run:
    """One learner's side of a replay."""

    learner: Learner
    tracker: OnlineErrorTracker
    pending: _PendingFeedback
    curve_rounds: list[int]
    next_point: int = 0
    curve: list[tuple[int, float]] = field(default_factory=list)
    applied: int = 0
    gamma_last: float = float("nan")
    seconds: float = 0.0

    def step(self, Xb: Batch, lo: int, labels: np.ndarray, delays: np.ndarray,
             dropped: np.ndarray, default_reward: float, recent: _RecentBlocks | None) -> None:
        """One micro-batch: rounds ``lo .. lo + len(labels)`` with features ``Xb``."""
        learner = self.learner
        rows = np.arange(lo, lo + len(labels))
        actions, probs = learner.decide(Xb, keys=rows)
        exploit = np.argmax(probs, axis=1)
        self.gamma_last = float(1.0 - probs[-1, exploit[-1]]) * learner.n_actions / max(
            1, learner.n_actions - 1)
        if learner.full_information:
            played, fb_actions = exploit, labels
            fb_rewards = np.ones(len(rows))
        else:
            played, fb_actions = actions, actions
            fb_rewards = (actions == labels).astype(float)
        self.tracker.observe(played, labels=labels, probs=probs)
        fb_rewards = np.where(dropped, default_reward, fb_rewards)
        if recent is None:  # no delay: this batch's feedback is applied right after it
            learner.update(Xb, fb_actions, fb_rewards, probs)
            self.applied += len(rows)
        else:
            hi = lo + len(rows)
            self.pending.push(rows, fb_actions, fb_rewards, probs, rows + delays)
            due_rows, due_actions, due_rewards, due_probs = self.pending.pop_due(hi)
            if len(due_rows):
                learner.update(_as_float(recent.rows(due_rows)), due_actions, due_rewards,
                               due_probs)
                self.applied += len(due_rows)
        hi = lo + len(rows)
        if self.next_point < len(self.curve_rounds) and self.curve_rounds[self.next_point] <= hi:
            self.curve.append((hi, self.tracker.error_rate))
            while self.next_point < len(self.curve_rounds) and self.curve_rounds[self.next_point] <= hi:
                self.next_point += 1

    def result(self, n: int, dropped: int) -> ReplayResult:
        t = self.tracker
        return ReplayResult(
            rounds=n, error_rate=t.error_rate, exploit_error_rate=t.exploit_error_rate,
            window_error_rate=t.window_error_rate, exploit_error_estimate=t.exploit_error_estimate,
            regret_vs_oracle=t.regret_vs_oracle, gamma_final=self.gamma_last, seconds=self.seconds,
            feedback_applied=self.applied, feedback_dropped=dropped, curve=self.curve)


def replay_stream(
    learners: Sequence[Learner],
    blocks: Iterable[tuple[Batch, np.ndarray]],
    n: int,
    *,
    batch_size: int = 1,
    delay_mean: float = 0.0,
    drop: float = 0.0,
    default_reward: float = 0.0,
    seed: int = 0,
    curve_points: int = 60,
    progress: Callable[[int, int, list[float]], None] | None = None,
) -> list[ReplayResult]:
    """Run every learner over the stream of ``n`` rounds given as ``(X, y)`` blocks.

    Every block but the last must hold a multiple of ``batch_size`` rounds (so
    the micro-batches are those of the whole stream). Each learner's
    ``seconds`` cover its own work on the stream (slicing its micro-batches,
    ``decide``, reward, error tracking, ``update``), not producing the blocks.
    ``progress(done, n, error rates)`` is called about every 2 s.
    """
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be an int >= 1. Got {batch_size}.")
    if not 0.0 <= drop < 1.0:
        raise ConfigError(f"--drop must be a probability in [0, 1). Got {drop}.")
    if delay_mean < 0:
        raise ConfigError(f"--delay must be >= 0. Got {delay_mean}.")
    draws = _FeedbackDraws(n, delay_mean, drop, seed)
    # curve points, ascending; each run's next_point indexes the first one not yet passed
    curve_rounds = np.unique(np.geomspace(1, max(n, 1), curve_points).astype(np.int64)).tolist()
    runs = [_Run(learner, OnlineErrorTracker(window=max(1000, batch_size)),
                 _PendingFeedback(learner.n_actions), curve_rounds) for learner in learners]
    recent = _RecentBlocks() if delay_mean else None
    dropped_total = 0
    start = 0
    last_report = time.perf_counter()
    for X_block, y_block in blocks:
        size = len(y_block)
        if size % batch_size and start + size < n:
            raise ValueError(f"blocks must hold a multiple of batch_size={batch_size} rounds "
                             f"(but the last). Got {size} at round {start}.")
        delays, dropped = draws.take(size)
        dropped_total += int(dropped.sum())
        if recent is not None:
            recent.add(start, X_block)
        for run in runs:
            began = time.perf_counter()
            for lo in range(0, size, batch_size):
                hi = min(size, lo + batch_size)
                Xb = _as_float(take_rows(X_block, np.arange(lo, hi)))
                run.step(Xb, start + lo, y_block[lo:hi], delays[lo:hi], dropped[lo:hi],
                         default_reward, recent)
            run.seconds += time.perf_counter() - began
        start += size
        if recent is not None:
            in_flight = [int(r.pending.rows[0]) for r in runs if len(r.pending.rows)]
            recent.forget_before(min(in_flight, default=start))
        now = time.perf_counter()
        if progress is not None and now - last_report >= 2.0:
            progress(start, n, [r.tracker.error_rate for r in runs])
            last_report = now
    if start != n:
        raise ValueError(f"the blocks held {start} rounds, expected n = {n}")
    return [run.result(n, dropped_total) for run in runs]


def blocks_of(X: Batch, y: np.ndarray, rounds: int) -> Iterator[tuple[Batch, np.ndarray]]:
    """``(X, y)`` in blocks of ``rounds`` rows."""
    for lo in range(0, len(y), rounds):
        hi = min(len(y), lo + rounds)
        yield take_rows(X, np.arange(lo, hi)), y[lo:hi]


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
    block = batch_size * max(1, -(-BLOCK_ROUNDS // max(batch_size, 1)))
    report = None if progress is None else (
        lambda done, total, errors: progress(done, total, errors[0]))
    return replay_stream([learner], blocks_of(X, y, block), len(y), batch_size=batch_size,
                         delay_mean=delay_mean, drop=drop, default_reward=default_reward,
                         seed=seed, curve_points=curve_points, progress=report)[0]
