"""The one decide → join → learn core, shared by the daemon and the replay.

:class:`Engine` holds a learner and its :class:`~streamlearn.stream.join.PendingJoins`
and works on arrays only — no transport, no JSON, no metrics. The daemon
(:mod:`streamlearn.service.daemon`) feeds it decoded micro-batches from Kafka;
the replay (:mod:`streamlearn.replay`) feeds it a dataset with simulated
delays, drops and expiry. Both therefore measure the same code.

* :meth:`Engine.decide` decides a batch with one ``learner.decide`` call
  (decisions handed in as ``known`` — a journal's, after a restart — are reused
  and count as decided rounds) and records every decision as a pending join.
* :meth:`Engine.feedback` joins a feedback batch: one
  :class:`~streamlearn.stream.join.Outcome` per event.
* :meth:`Engine.advance` expires what is due by the join's clocks.
* :meth:`Engine.learn` applies every decision that closed since the last call
  with one ``learner.update`` call. A full-information learner (the
  Perceptron comparator) learns the decision's label with reward 1 instead.

>>> from streamlearn.learners import Banditron, FixedGamma
>>> from streamlearn.stream.join import JoinSettings, Outcome
>>> engine = Engine(Banditron(2, 3, FixedGamma(0.1), seed=1), JoinSettings(window_s=10.0))
>>> d = engine.decide(["a", "b"], np.eye(2, 3), None, labels=np.array([0, 1]),
...                   ts=np.zeros(2), partitions=np.zeros(2, int), wall=0.0)
>>> outcomes = engine.feedback(["a"], np.array([1.0]), np.ones(1), np.zeros(1, int), wall=1.0)
>>> [Outcome(o).name for o in outcomes], len(engine.learn().closed), len(engine.joins)
(['JOINED'], 1, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamlearn.features import Batch, take_rows
from streamlearn.learners import randomness
from streamlearn.learners.base import Learner
from streamlearn.stream.join import Closed, EarlyFeedback, JoinSettings, Outcome, PendingJoins

__all__ = ["Decided", "Engine", "Learned", "best_first", "exploit_around", "exploration_rates"]


RANKER_SEED = 0x52414E4B  # keeps the ranker policy's draws apart from the learner's


def best_first(scores: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """(B, K) action orders: allowed actions by score (NaN lowest, ties by index), then the
    disallowed ones.

    >>> best_first(np.array([[np.nan, 0.2, 0.9]]), np.array([[True, True, False]])).tolist()
    [[1, 0, 2]]
    """
    allowed = np.ones(scores.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    negated = -np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=-np.inf, posinf=np.inf,
                             neginf=-np.inf)
    return np.lexsort((negated, ~allowed), axis=-1)


def exploit_around(scores: np.ndarray, mask: np.ndarray | None, gamma: np.ndarray) -> np.ndarray:
    """Distributions that put 1 − γ on the best-scored allowed action and spread γ
    uniformly over the allowed actions (per row).

    >>> exploit_around(np.array([[0.1, 0.9, 0.5]]), np.array([[True, False, True]]), np.array([0.2]))
    array([[0.1, 0. , 0.9]])
    """
    allowed = np.ones(scores.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    top = best_first(scores, allowed)[:, 0]
    n = allowed.sum(axis=1, keepdims=True)
    gamma = np.clip(np.asarray(gamma, dtype=np.float64), 0.0, 1.0)[:, None]
    probs = np.where(allowed, gamma / np.maximum(n, 1), 0.0)
    probs[np.arange(len(top)), top] += 1.0 - gamma[:, 0]
    return probs


def exploration_rates(probs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """γ of each logged distribution: (1 − max p)·n/(n − 1) over its n allowed actions."""
    allowed = probs.shape[1] if mask is None else mask.sum(axis=1)
    return np.asarray((1.0 - probs.max(axis=1)) * allowed / np.maximum(allowed - 1, 1))


@dataclass
class Decided:
    """One decided batch."""

    actions: np.ndarray  # int64 (B,)
    probs: np.ndarray  # (B, K) full distributions
    fresh: np.ndarray  # rows decided now (the others were reused from ``known``)

    @property
    def explored(self) -> np.ndarray:
        """bool (B,): the sampled action is not the exploit action."""
        return np.asarray(self.actions != np.argmax(self.probs, axis=1))

    @property
    def gamma(self) -> float:
        return float(exploration_rates(self.probs, None).mean()) if len(self.probs) else 0.0


@dataclass
class Learned:
    """What one :meth:`Engine.learn` call closed and applied."""

    closed: Closed
    applied: np.ndarray  # rows of ``closed`` given to the learner
    skipped: int  # of those, rows the learner refused (they would make it non-finite)

    @property
    def joined(self) -> np.ndarray:
        return np.asarray(self.closed.outcome == Outcome.JOINED.value)

    @property
    def expired(self) -> np.ndarray:
        return np.asarray(self.closed.outcome == Outcome.EXPIRED.value)

    @property
    def shed(self) -> int:
        return int((self.closed.outcome == Outcome.SHED.value).sum())


class Engine:
    """A learner and its pending joins; see the module docstring."""

    def __init__(self, learner: Learner, settings: JoinSettings | None = None,
                 joins: PendingJoins | None = None) -> None:
        self.learner = learner
        self.joins = joins if joins is not None else PendingJoins(
            learner.n_actions, learner.n_features, settings)

    def decide(self, ids: Sequence[Any], X: Batch, mask: np.ndarray | None, *, labels: np.ndarray,
               ts: np.ndarray, partitions: np.ndarray, wall: float, keys: object = None,
               known: Mapping[Any, tuple[int, np.ndarray, float]] | None = None,
               answer: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
               model_version: int = 0, exploit_scores: np.ndarray | None = None,
               event_ts: np.ndarray | None = None) -> Decided:
        """Decide a batch of new ids and record the decisions as pending joins.

        ``keys`` seed the exploration randomness (default: the ids). ``known``
        maps ids to ``(action, probs, decided_at)`` already decided (a journal);
        they are reused as they are, with their first decision time. ``answer``
        (simulations that answer at once) maps the chosen actions to
        ``(rewards, feedback times)``, NaN rewards for decisions that get none;
        the answered ones join on arrival (:meth:`PendingJoins.add_joined`).
        ``exploit_scores`` (B, K) — a promoted ranker's — replace the learner's
        exploitation action by their best allowed action, exploring around it
        with the learner's own γ (:func:`exploit_around`). ``event_ts``: the
        instances' own event times when they are not ``ts`` (a daemon decides at
        the wall clock's time; :meth:`PendingJoins.add_decisions`).
        """
        B = len(ids)
        reused = [known.get(i) for i in ids] if known else []
        if reused and any(r is not None for r in reused):
            fresh = np.array([j for j, r in enumerate(reused) if r is None], dtype=np.int64)
            actions = np.zeros(B, dtype=np.int64)
            probs = np.zeros((B, self.learner.n_actions))
            decided_at = np.asarray(ts, dtype=np.float64).copy()
            for j, r in enumerate(reused):
                if r is not None:
                    actions[j], probs[j], decided_at[j] = r
            self.learner.count_decided(B - len(fresh))
            if len(fresh):
                sub_keys = None if keys is None else np.asarray(keys)[fresh]
                a, p = self._decide_fresh(take_rows(X, fresh), None if mask is None else mask[fresh],
                                          [ids[j] for j in fresh] if sub_keys is None else sub_keys,
                                          None if exploit_scores is None else exploit_scores[fresh])
                actions[fresh], probs[fresh] = a, p
        else:
            fresh = np.arange(B)
            actions, probs = self._decide_fresh(X, mask, ids if keys is None else keys,
                                                exploit_scores)
            decided_at = np.asarray(ts, dtype=np.float64)
        if answer is None:
            self.joins.add_decisions(ids, X, actions, probs, labels, decided_at, partitions, wall,
                                     model_version, event_ts)
        else:
            rewards, feedback_ts = answer(actions)
            if not np.isnan(rewards).any():
                self.joins.add_joined(ids, X, actions, probs, labels, decided_at, partitions,
                                      rewards, feedback_ts, wall, model_version)
                return Decided(actions, probs, fresh)
            answered = ~np.isnan(rewards)
            for rows, joined in ((np.flatnonzero(answered), True), (np.flatnonzero(~answered), False)):
                if not len(rows):
                    continue
                whole = len(rows) == B
                part = (ids if whole else [ids[j] for j in rows.tolist()],
                        X if whole else take_rows(X, rows), actions[rows], probs[rows],
                        labels[rows], decided_at[rows], partitions[rows])
                if joined:
                    self.joins.add_joined(*part, rewards[rows], feedback_ts[rows], wall,
                                          model_version)
                else:
                    self.joins.add_decisions(*part, wall, model_version)
        return Decided(actions, probs, fresh)

    def _decide_fresh(self, X: Batch, mask: np.ndarray | None, keys: object,
                      exploit_scores: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        actions, probs = self.learner.decide(X, mask, keys=keys)
        if exploit_scores is None:
            return actions, probs
        probs = exploit_around(exploit_scores, mask, exploration_rates(probs, mask))
        return randomness.sample(probs, randomness.uniforms(self.learner.seed + RANKER_SEED, keys)), probs

    def feedback(self, ids: Sequence[Any], rewards: np.ndarray, ts: np.ndarray,
                 partitions: np.ndarray, wall: float, sources: Sequence[Any] | None = None,
                 ) -> np.ndarray:
        """Join a feedback batch; one :class:`Outcome` code per event."""
        return self.joins.add_feedback(ids, rewards, ts, partitions, wall, sources)

    def advance(self, wall: float, idle: Iterable[tuple[str, int]] = (),
                event_time: float | None = None) -> list[EarlyFeedback]:
        """Expire what is due; return held feedback whose decision never came.

        ``event_time`` (simulations, where time is the round number): every
        clock has reached it.
        """
        if event_time is not None:
            self.joins.clocks.advance_all(event_time)
        return self.joins.advance(wall, idle)

    def learn(self) -> Learned:
        """Apply every decision closed since the last call with one update."""
        closed = self.joins.drain()
        rows = np.arange(len(closed)) if closed.learn.all() else np.flatnonzero(closed.learn)
        skipped = 0
        if self.learner.full_information:  # learns the label (reward 1) of what was answered
            rows = rows[(closed.labels[rows] >= 0) & (closed.outcome[rows] == Outcome.JOINED.value)]
        if len(rows):
            X, actions, rewards, probs = closed.X, closed.actions, closed.rewards, closed.probs
            if self.learner.full_information:
                actions, rewards = closed.labels, np.ones(len(closed))
            if len(rows) < len(closed):  # the usual case (every row) needs no gathers
                X, actions, rewards, probs = (take_rows(X, rows), actions[rows], rewards[rows],
                                              probs[rows])
            before = self.learner.n_skipped_updates_
            self.learner.update(X, actions, rewards, probs)
            skipped = self.learner.n_skipped_updates_ - before
        return Learned(closed, rows, skipped)
