"""Replay a labelled stream through learners as a bandit stream — on the daemon's own engine.

Every learner runs inside an :class:`~streamlearn.engine.Engine`, the
decide → join → learn core the daemon serves with: decisions wait in the same
:class:`~streamlearn.join.pending.PendingJoins`, feedback joins by the same
window rules, dropped feedback expires to the default reward by the same
clock, and the learner is updated with what closed. So a replayed figure
measures the serving code.

Time is measured in rounds: round ``t`` is decided at time ``t``; its feedback
(reward ``1[ỹ = y]``) reaches the engine ``delay`` rounds later (0 = right
after its micro-batch; otherwise drawn from an exponential with mean
``delay_mean``, rounded up), or never, with probability ``drop`` — then the
decision expires to ``default_reward`` when its window of ``window`` rounds
ends. Exploration is keyed by the round number (or by string ids, see
``id_format``), so a run is a pure function of the seed.

A stream is a sequence of ``(X, y)`` blocks (every block but the last a
multiple of the batch size), so it never has to be held in memory; several
learners (a learner and the full-information Perceptron comparator) see every
block once, in lockstep.

Examples
--------
>>> from streamlearn.datasets.synthetic import synthetic_stream
>>> from streamlearn.learners.banditron import Banditron
>>> from streamlearn.learners.exploration import FixedGamma
>>> X, y = synthetic_stream(5_000, noise=0.0, seed=2)
>>> r = replay(Banditron(9, 400, FixedGamma(0.05)), X, y, batch_size=64)
>>> r.rounds, 0.0 < r.error_rate < 0.5
(5000, True)
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamlearn.actions import exploration_rates
from streamlearn.datasets.stream import BLOCK_ROUNDS, PreparedStream
from streamlearn.engine import Engine
from streamlearn.errors import ConfigError
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.features import Batch, SparseBatch, take_rows
from streamlearn.join.pending import JoinSettings, Outcome
from streamlearn.learners import Learner, Perceptron

__all__ = ["ReplayResult", "blocks_of", "default_window", "replay", "replay_stream",
           "run_with_comparator", "stderr_progress"]


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
    expired: int = 0  # decisions that closed without feedback (dropped feedback, or too late)

    @property
    def events_per_second(self) -> float:
        return self.rounds / self.seconds if self.seconds > 0 else float("inf")


TRACK_ROUNDS = 4096  # rounds the error tracker is fed at once (see _Run.unobserved)


@functools.lru_cache(maxsize=8)
def _zeros(n: int) -> np.ndarray:
    """Partition 0 for n events (read-only, shared)."""
    zeros = np.zeros(n, dtype=np.int64)
    zeros.flags.writeable = False
    return zeros


def default_window(delay_mean: float) -> int:
    """The join window (rounds) a replay uses unless told: ten mean delays, at least one round."""
    return max(1, math.ceil(10 * delay_mean))


def _rows(X: Batch, lo: int, hi: int) -> Batch:
    """Rows ``lo:hi`` as a float64 batch: a view of a dense float64 block (nothing in the
    engine writes into a batch), a copy otherwise."""
    if isinstance(X, SparseBatch):
        return X.take(np.arange(lo, hi))
    return np.asarray(X[lo:hi], dtype=np.float64)


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


class _Mailbox:
    """The simulated caller's feedback in flight: (round, reward, arrival round), by arrival."""

    def __init__(self) -> None:
        self.rows = np.zeros(0, dtype=np.int64)
        self.rewards = np.zeros(0)
        self.due = np.zeros(0, dtype=np.int64)

    def post(self, rows: np.ndarray, rewards: np.ndarray, due: np.ndarray) -> None:
        self.rows = np.concatenate([self.rows, rows])
        self.rewards = np.concatenate([self.rewards, rewards])
        self.due = np.concatenate([self.due, due])

    def deliver(self, before: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rounds, rewards, arrival rounds) arriving before ``before``, in round order."""
        ready = self.due < before
        out = self.rows[ready], self.rewards[ready], self.due[ready]
        keep = ~ready
        self.rows, self.rewards, self.due = self.rows[keep], self.rewards[keep], self.due[keep]
        return out


@dataclass
class _Run:
    """One learner's side of a replay: its engine, its tracker, its caller's mailbox."""

    engine: Engine
    tracker: OnlineErrorTracker
    curve_rounds: list[int]
    id_format: str | None
    mailbox: _Mailbox = field(default_factory=_Mailbox)
    next_point: int = 0
    curve: list[tuple[int, float]] = field(default_factory=list)
    applied: int = 0
    expired: int = 0
    last_probs: np.ndarray | None = None
    seconds: float = 0.0
    # (played, labels, probs) of batches not yet given to the tracker: it is fed blocks of
    # about TRACK_ROUNDS rounds (one vectorised call instead of one per micro-batch) and
    # flushed before anything reads it
    unobserved: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    unobserved_rounds: int = 0

    def ids(self, rows: np.ndarray) -> list[Any]:
        return rows.tolist() if self.id_format is None else [self.id_format.format(r)
                                                               for r in rows.tolist()]

    def step(self, Xb: Batch, lo: int, labels: np.ndarray, delays: np.ndarray,
             dropped: np.ndarray) -> None:
        """One micro-batch: rounds ``lo .. lo + len(labels)`` with features ``Xb``."""
        engine, B = self.engine, len(labels)
        rows = np.arange(lo, lo + B)
        hi = lo + B
        ids = self.ids(rows)
        times = rows.astype(np.float64)  # a round is decided at its own number
        # every answer comes right after this batch and none is still on its way
        at_once = not delays.any() and not len(self.mailbox.rows)

        def answer(actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            rewards = (actions == labels).astype(np.float64)
            if dropped.any():
                rewards[dropped] = np.nan
            return rewards, times

        decided = engine.decide(ids, Xb, None, labels=labels, ts=times, partitions=_zeros(B),
                                wall=float(hi), keys=rows if self.id_format is None else None,
                                answer=answer if at_once else None)
        self.last_probs = decided.probs[-1:]
        played = (decided.probs.argmax(axis=1) if engine.learner.full_information
                  else decided.actions)
        self.unobserved.append((played, labels, decided.probs))
        self.unobserved_rounds += B
        if self.unobserved_rounds >= TRACK_ROUNDS:
            self.flush()
        if not at_once:
            sent = ~dropped
            self.mailbox.post(rows[sent], (decided.actions == labels)[sent].astype(np.float64),
                              rows[sent] + delays[sent])
            due_rows, rewards, arrival = self.mailbox.deliver(hi)
            if len(due_rows):
                engine.feedback(self.ids(due_rows), rewards, arrival.astype(np.float64),
                                _zeros(len(due_rows)), float(hi))
        engine.advance(float(hi), event_time=float(hi))
        learned = engine.learn()
        self.applied += len(learned.applied)
        self.expired += int(np.count_nonzero(learned.closed.outcome == Outcome.EXPIRED.value))
        if self.next_point < len(self.curve_rounds) and self.curve_rounds[self.next_point] <= hi:
            self.flush()
            self.curve.append((hi, self.tracker.error_rate))
            while self.next_point < len(self.curve_rounds) and self.curve_rounds[self.next_point] <= hi:
                self.next_point += 1

    def flush(self) -> None:
        """Give the tracker every batch it has not seen yet, as one block."""
        if not self.unobserved:
            return
        played, labels, probs = zip(*self.unobserved, strict=True)
        self.unobserved, self.unobserved_rounds = [], 0
        self.tracker.observe(np.concatenate(played), labels=np.concatenate(labels),
                             probs=np.concatenate(probs))

    def result(self, n: int, dropped: int) -> ReplayResult:
        self.flush()
        t = self.tracker
        return ReplayResult(
            rounds=n, error_rate=t.error_rate, exploit_error_rate=t.exploit_error_rate,
            window_error_rate=t.window_error_rate, exploit_error_estimate=t.exploit_error_estimate,
            regret_vs_oracle=t.regret_vs_oracle,
            gamma_final=(float("nan") if self.last_probs is None
                         else float(exploration_rates(self.last_probs, None)[0])),
            seconds=self.seconds,
            feedback_applied=self.applied, feedback_dropped=dropped, curve=self.curve,
            expired=self.expired)


def replay_stream(
    learners: Sequence[Learner],
    blocks: Iterable[tuple[Batch, np.ndarray]],
    n: int,
    *,
    batch_size: int = 1,
    delay_mean: float = 0.0,
    drop: float = 0.0,
    default_reward: float = 0.0,
    window: int | None = None,
    seed: int = 0,
    curve_points: int = 60,
    id_format: str | None = None,
    progress: Callable[[int, int, list[float]], None] | None = None,
) -> list[ReplayResult]:
    """Run every learner over the stream of ``n`` rounds given as ``(X, y)`` blocks.

    ``window`` is the join window in rounds (default :func:`default_window`).
    ``id_format`` (e.g. ``"e{}"``) gives events string ids, which then also key
    the exploration randomness (as the daemon's event ids do); by default the
    round numbers are both. Each learner's ``seconds`` cover its own work
    (decide, join, learn, error tracking), not producing the blocks.
    ``progress(done, n, error rates)`` is called about every 2 s.
    """
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be an int >= 1. Got {batch_size}.")
    if not 0.0 <= drop < 1.0:
        raise ConfigError(f"--drop must be a probability in [0, 1). Got {drop}.")
    if delay_mean < 0:
        raise ConfigError(f"--delay must be >= 0. Got {delay_mean}.")
    window = default_window(delay_mean) if window is None else window
    if window < 1:
        raise ConfigError(f"--window must be an int >= 1 (rounds). Got {window}.")
    settings = JoinSettings(window_s=float(window), early_window_s=0.0,
                            default_reward=default_reward, max_pending=1 << 40)
    draws = _FeedbackDraws(n, delay_mean, drop, seed)
    # curve points, ascending; each run's next_point indexes the first one not yet passed
    curve_rounds = np.unique(np.geomspace(1, max(n, 1), curve_points).astype(np.int64)).tolist()
    runs = [_Run(Engine(learner, settings), OnlineErrorTracker(window=max(1000, batch_size)),
                 curve_rounds, id_format) for learner in learners]
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
        for run in runs:
            began = time.perf_counter()
            for lo in range(0, size, batch_size):
                hi = min(size, lo + batch_size)
                run.step(_rows(X_block, lo, hi), start + lo, y_block[lo:hi], delays[lo:hi],
                         dropped[lo:hi])
            run.seconds += time.perf_counter() - began
        start += size
        now = time.perf_counter()
        if progress is not None and now - last_report >= 2.0:
            for run in runs:
                run.flush()
            progress(start, n, [r.tracker.error_rate for r in runs])
            last_report = now
    if start != n:
        raise ValueError(f"the blocks held {start} rounds, expected n = {n}")
    for run in runs:  # the tracker's last block, timed like the others
        began = time.perf_counter()
        run.flush()
        run.seconds += time.perf_counter() - began
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
    window: int | None = None,
    seed: int = 0,
    curve_points: int = 60,
    id_format: str | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> ReplayResult:
    """Run the stream ``(X, y)`` in order through ``learner`` and measure it (see :func:`replay_stream`)."""
    block = batch_size * max(1, -(-BLOCK_ROUNDS // max(batch_size, 1)))
    report = None if progress is None else (
        lambda done, total, errors: progress(done, total, errors[0]))
    return replay_stream([learner], blocks_of(X, y, block), len(y), batch_size=batch_size,
                         delay_mean=delay_mean, drop=drop, default_reward=default_reward,
                         window=window, seed=seed, curve_points=curve_points,
                         id_format=id_format, progress=report)[0]


def stderr_progress(label: str) -> Callable[[int, int, float], None]:
    """A progress callback printing a periodic line on stderr."""

    def report(done: int, total: int, error_rate: float) -> None:
        print(f"{label}: {done:,}/{total:,} rounds ({100 * done / total:.0f}%), "
              f"error {error_rate:.4f}", file=sys.stderr, flush=True)

    return report


def run_with_comparator(
    learner: Learner,
    stream: PreparedStream,
    *,
    batch_size: int,
    delay_rounds: float = 0.0,
    drop: float = 0.0,
    window: int | None = None,
    seed: int = 0,
    progress: bool = False,
) -> tuple[ReplayResult, ReplayResult]:
    """Replay the learner and the full-information Perceptron on the same stream, in lockstep."""
    comparator = Perceptron(stream.n_classes, stream.n_features, seed=seed)
    names = [type(learner).__name__, "Perceptron"]

    def report(done: int, total: int, errors: list[float]) -> None:
        rates = ", ".join(f"{name} {error:.4f}" for name, error in zip(names, errors, strict=True))
        print(f"replay: {done:,}/{total:,} rounds ({100 * done / total:.0f}%), error {rates}",
              file=sys.stderr, flush=True)

    result, reference = replay_stream(
        [learner, comparator], stream.blocks(batch_size), stream.rounds, batch_size=batch_size,
        delay_mean=delay_rounds, drop=drop, window=window, seed=seed,
        progress=report if progress else None)
    return result, reference
