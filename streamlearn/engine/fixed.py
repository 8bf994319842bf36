"""The one decide → join → learn core, shared by the daemon and the replay.

:class:`Engine` holds a learner and its :class:`~streamlearn.join.pending.PendingJoins`
and works on arrays only — no transport, no JSON, no metrics. The daemon
(:mod:`streamlearn.service.daemon`) feeds it decoded micro-batches from Kafka;
the replay (:mod:`streamlearn.replay`) feeds it a dataset with simulated
delays, drops and expiry. Both therefore measure the same code.

* :meth:`Engine.decide` decides a batch with one ``learner.decide`` call
  (decisions handed in as ``known`` — a journal's, after a restart — are reused
  and count as decided rounds) and records every decision as a pending join.
  Given a :class:`Mixture`, the traffic is shared between the learner and
  rankers (a guarded rollout): each event is served by one policy, drawn by its
  key, and the logged distribution is the mixture, so propensities stay exact.
  Every decision carries :data:`DECISION_COLUMNS`: the policy that served it
  and the exploration rate any policy deployed at that moment would use.
* :meth:`Engine.feedback` joins a feedback batch: one
  :class:`~streamlearn.join.pending.Outcome` per event.
* :meth:`Engine.advance` expires what is due by the join's clocks.
* :meth:`Engine.learn` applies every decision that closed since the last call
  with one ``learner.update`` call. A full-information learner (the
  Perceptron comparator) learns the decision's label with reward 1 instead.

>>> from streamlearn.learners import Banditron, FixedGamma
>>> from streamlearn.join.pending import JoinSettings, Outcome
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

from streamlearn.actions import exploit_around, exploration_rates
from streamlearn.features import Batch, row_starts, take_rows
from streamlearn.join.pending import Closed, EarlyFeedback, JoinSettings, Outcome, PendingJoins
from streamlearn.learners import randomness
from streamlearn.learners.base import Learner

__all__ = ["BASELINE", "DECISION_COLUMNS", "Decided", "Engine", "Learned", "Mixture", "Reused"]


RANKER_SEED = 0x52414E4B  # keeps the ranker policy's draws apart from the learner's
ARM_SEED = 0x41524D53  # ... and the draw of the policy that serves an event apart from both

#: Per-decision columns of the engine's pending joins (and of the experience log):
#: ``served_by`` — 0 when the learner served the decision, :data:`BASELINE` when the caller's
#: baseline did, else the version of the ranker that did; ``gamma`` — the learner's
#: exploration rate at that decision, the rate a ranker deployed then explores with
#: (:func:`exploit_around`), so a ranker can be evaluated later exactly as it would have
#: been deployed; ``exploit`` — the learner's own best action; ``baseline`` — what the
#: caller's own system would have done (-1: not given); ``epoch`` — how many times the
#: rollout mode had changed when it was decided (a mode's comparisons count only the
#: decisions made under it, not those still in flight from the one before).
DECISION_COLUMNS: dict[str, type] = {"served_by": np.int64, "gamma": np.float64,
                                     "exploit": np.int64, "baseline": np.int64,
                                     "epoch": np.int64}
BASELINE = -1  # ``served_by`` of a decision the caller's own baseline served


@dataclass(frozen=True)
class Mixture:
    """Policies sharing the traffic: the learner (version 0, scores None), rankers and the
    caller's baseline, each with its (B, K) scores for the batch and its share — one share per
    policy (``(A,)``), or per row and policy (``(B, A)``: a row the baseline cannot serve
    gives it none). The shares of a row sum to 1. A policy that ``explores`` plays its best
    allowed action with the learner's γ spread over the others (:func:`exploit_around`);
    one that does not (the baseline) plays its best action."""

    versions: tuple[int, ...]
    shares: np.ndarray
    scores: tuple[np.ndarray | None, ...]
    explores: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        shares = np.asarray(self.shares, dtype=np.float64)
        object.__setattr__(self, "shares", shares)
        if self.explores is None:
            object.__setattr__(self, "explores", (True,) * len(self.versions))
        if not (len(self.versions) == shares.shape[-1] == len(self.scores)
                == len(self.explores or ()) >= 1) or shares.ndim not in (1, 2):
            raise ValueError(f"Expected one share, one score matrix and one explores flag per "
                             f"policy. Got {len(self.versions)} policies, shares of shape "
                             f"{shares.shape} and {len(self.scores)} score matrices.")
        if shares.min() < 0 or np.abs(shares.sum(axis=-1) - 1.0).max() > 1e-9:
            raise ValueError(f"Expected shares >= 0 summing to 1 on every row. Got {shares}.")

    def rows(self, rows: np.ndarray) -> Mixture:
        """The same policies for a subset of the batch's rows."""
        return Mixture(self.versions, self.shares if self.shares.ndim == 1 else self.shares[rows],
                       tuple(None if s is None else s[rows] for s in self.scores), self.explores)


#: a journaled decision: (action, distribution, decision time, its DECISION_COLUMNS)
Reused = tuple[int, np.ndarray, float, Mapping[str, float]]


@dataclass
class Decided:
    """One decided batch."""

    actions: np.ndarray  # int64 (B,)
    probs: np.ndarray  # (B, K) full distributions
    fresh: np.ndarray  # rows decided now (the others were reused from ``known``)
    columns: dict[str, np.ndarray]  # DECISION_COLUMNS of every row

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


#: rows per learner update. A batch step can cost more than linearly in its rows (the
#: regression oracle's exact flow decomposes one block per action: cubic in the rows an
#: action gets), and a join policy that aggregates (sum, average, ...) closes a whole
#: window's decisions at once: 12,000 rows in one update stalled the loop for minutes while
#: the input piled up. Updates of this size cost about as much per row as small ones.
LEARN_CHUNK = 1024


def own_choices(probs: np.ndarray, exploit: np.ndarray) -> np.ndarray:
    """What the learner learns as its own choice of each logged decision.

    Under a mixture (a baseline, a ranker in rollout) the logged distribution's maximum
    may be another policy's: the learner's own best action (the decision's ``exploit``
    column) is its choice wherever the logged distribution gave it a chance. Where it had
    none (apprentice mode without an exploration budget: the baseline's action with
    probability 1), the decision was not the learner's at all, and it learns from the
    logged action as from a deterministic log (the maximum, as the learners read a
    distribution they did not get). Measured with the Banditron next to a baseline right
    2/3 of the time: with a 10 % budget the learner's accuracy reached 0.97 this way and
    0.44 taking the maximum everywhere; without a budget 0.996 this way and 0.73 taking
    the learner's choice everywhere.
    """
    logged_max = probs.argmax(axis=1)
    had_a_chance = probs.take(row_starts(*probs.shape) + exploit) > 0.0
    return np.where(had_a_chance, exploit, logged_max)


class Engine:
    """A learner and its pending joins; see the module docstring."""

    def __init__(self, learner: Learner, settings: JoinSettings | None = None,
                 joins: PendingJoins | None = None) -> None:
        self.learner = learner
        self.joins = joins if joins is not None else PendingJoins(
            learner.n_actions, learner.n_features, settings, columns=DECISION_COLUMNS)
        self._nothing_learned: Learned | None = None  # what learn() returns when nothing closed

    def decide(self, ids: Sequence[Any], X: Batch, mask: np.ndarray | None, *, labels: np.ndarray,
               ts: np.ndarray, partitions: np.ndarray, wall: float, keys: object = None,
               known: Mapping[Any, Reused] | None = None,
               answer: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
               model_version: int = 0, mixture: Mixture | None = None,
               event_ts: np.ndarray | None = None,
               baselines: np.ndarray | None = None, epoch: int = 0) -> Decided:
        """Decide a batch of new ids and record the decisions as pending joins.

        ``keys`` seed the exploration randomness (default: the ids). ``known``
        maps ids to decisions already made (a journal's :data:`Reused`); they are
        reused as they are, with their first decision time. ``answer``
        (simulations that answer at once) maps the chosen actions to
        ``(rewards, feedback times)``, NaN rewards for decisions that get none;
        the answered ones join on arrival (:meth:`PendingJoins.add_joined`).
        ``mixture``: the policies sharing the traffic (:meth:`_decide_fresh`);
        without one the learner serves every event. ``baselines``: the caller's own
        choice per event (-1: none), kept with each decision; ``epoch``: the rollout
        mode's (its ``epoch`` column for the fresh rows). ``event_ts``: the
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
            columns: dict[str, np.ndarray] = {
                name: np.zeros(B, dtype=dtype) for name, dtype in DECISION_COLUMNS.items()}
            for j, r in enumerate(reused):
                if r is not None:
                    actions[j], probs[j], decided_at[j], kept = r
                    for name, column in columns.items():  # a journal written before a
                        # column lacks it: then every decision was the learner's own
                        column[j] = kept.get(name, int(probs[j].argmax()) if name == "exploit"
                                             else 0)
            self.learner.count_decided(B - len(fresh))
            if len(fresh):
                sub_keys = None if keys is None else np.asarray(keys)[fresh]
                a, p, c = self._decide_fresh(
                    take_rows(X, fresh), None if mask is None else mask[fresh],
                    [ids[j] for j in fresh] if sub_keys is None else sub_keys,
                    None if mixture is None else mixture.rows(fresh))
                actions[fresh], probs[fresh] = a, p
                for name, column in c.items():
                    columns[name][fresh] = column
        else:
            fresh = np.arange(B)
            actions, probs, columns = self._decide_fresh(X, mask, ids if keys is None else keys,
                                                         mixture)
            decided_at = np.asarray(ts, dtype=np.float64)
        columns["baseline"] = (np.full(B, -1, dtype=np.int64) if baselines is None
                               else np.asarray(baselines, dtype=np.int64))
        epochs = columns.get("epoch")
        if epochs is None:
            epochs = columns["epoch"] = np.zeros(B, dtype=np.int64)
        epochs[fresh] = epoch
        decided = Decided(actions, probs, fresh, columns)
        if answer is None:
            self.joins.add_decisions(ids, X, actions, probs, labels, decided_at, partitions, wall,
                                     model_version, event_ts, columns)
            return decided
        rewards, feedback_ts = answer(actions)
        if not np.isnan(rewards).any():
            self.joins.add_joined(ids, X, actions, probs, labels, decided_at, partitions,
                                  rewards, feedback_ts, wall, model_version, columns)
            return decided
        answered = ~np.isnan(rewards)
        for rows, joined in ((np.flatnonzero(answered), True), (np.flatnonzero(~answered), False)):
            if not len(rows):
                continue
            whole = len(rows) == B
            part = (ids if whole else [ids[j] for j in rows.tolist()],
                    X if whole else take_rows(X, rows), actions[rows], probs[rows],
                    labels[rows], decided_at[rows], partitions[rows])
            part_columns = {name: column[rows] for name, column in columns.items()}
            if joined:
                self.joins.add_joined(*part, rewards[rows], feedback_ts[rows], wall,
                                      model_version, part_columns)
            else:
                self.joins.add_decisions(*part, wall, model_version, columns=part_columns)
        return decided

    def _decide_fresh(self, X: Batch, mask: np.ndarray | None, keys: object,
                      mixture: Mixture | None
                      ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """The learner decides; with a :class:`Mixture` each row is then served by the policy
        its key draws (share by share): the learner keeps its own draw, a ranker samples
        from :func:`exploit_around` its scores with the learner's γ. The logged
        distribution is the mixture Σ share·π, the probability of every action under the
        whole sampling procedure."""
        actions, probs = self.learner.decide(X, mask, keys=keys)
        exploit = np.asarray(np.argmax(probs, axis=1), dtype=np.int64)
        gamma = exploration_rates(probs, mask, exploit)
        served = np.zeros(len(actions), dtype=np.int64)
        columns = {"served_by": served, "gamma": gamma, "exploit": exploit}
        if mixture is None or (mixture.versions == (0,)):
            return actions, probs, columns
        seed = self.learner.seed
        B = len(actions)
        shares = np.broadcast_to(mixture.shares, (B, len(mixture.versions)))
        # the policy of each row: the first whose cumulative share exceeds the row's draw
        # (the last takes what rounding leaves)
        cumulative = np.cumsum(shares, axis=1)[:, :-1]
        draws = randomness.uniforms(seed + ARM_SEED, keys)
        arm = (cumulative <= draws[:, None]).sum(axis=1)
        mixed = np.zeros_like(probs)
        ranker_draws: np.ndarray | None = None
        for index, (version, scores, explores) in enumerate(
                zip(mixture.versions, mixture.scores, mixture.explores or (), strict=True)):
            dist = probs if scores is None else exploit_around(
                scores, mask, gamma if explores else np.zeros(B))
            mixed += shares[:, index, None] * dist
            rows = np.flatnonzero(arm == index)
            served[rows] = version
            if scores is not None and len(rows):
                if ranker_draws is None:
                    ranker_draws = randomness.uniforms(seed + RANKER_SEED, keys)
                actions[rows] = randomness.sample(dist[rows], ranker_draws[rows])
        return actions, mixed, columns

    def is_known(self, ids: Sequence[Any]) -> np.ndarray:
        """Per id: already pending, recently closed, or repeated earlier in ``ids``."""
        return self.joins.is_known(ids)

    def feedback(self, ids: Sequence[Any], rewards: np.ndarray, ts: np.ndarray,
                 partitions: np.ndarray, wall: float, sources: Sequence[Any] | None = None,
                 types: Sequence[str | None] | None = None) -> np.ndarray:
        """Join a feedback batch; one :class:`Outcome` code per event (``types`` weigh the
        rewards: ``JoinSettings.reward_weights``)."""
        return self.joins.add_feedback(ids, rewards, ts, partitions, wall, sources, types)

    def advance(self, wall: float, idle: Iterable[tuple[str, int]] = (),
                awaited: Callable[[str], bool] | None = None,
                event_time: float | None = None) -> list[EarlyFeedback]:
        """Expire what is due; return held feedback whose decision never came.

        ``awaited(id)``: that decision is known to be coming (journaled before a restart),
        so its held feedback stays held. ``event_time`` (simulations, where time is the
        round number): every clock has reached it.
        """
        if event_time is not None:
            self.joins.clocks.advance_all(event_time)
        return self.joins.advance(wall, idle, awaited)

    def learn(self) -> Learned:
        """Apply every decision closed since the last call, in updates of at most
        :data:`LEARN_CHUNK` rows."""
        if not self.joins.anything_closed:  # the common case of a small batch: one cheap check
            if self._nothing_learned is None:
                self._nothing_learned = Learned(self.joins.drain(), np.zeros(0, np.int64), 0)
            return self._nothing_learned
        closed = self.joins.drain()
        rows = np.arange(len(closed)) if closed.learn.all() else np.flatnonzero(closed.learn)
        skipped = 0
        if self.learner.full_information:  # learns the label (reward 1) of what was answered
            rows = rows[(closed.labels[rows] >= 0) & (closed.outcome[rows] == Outcome.JOINED.value)]
        if len(rows):
            X, actions, rewards, probs = closed.X, closed.actions, closed.rewards, closed.probs
            decided = closed.columns["exploit"]  # the learner's own best action, as it decided
            exploit = own_choices(closed.probs, decided)
            if self.learner.full_information:
                actions, rewards = closed.labels, np.ones(len(closed))
            if len(rows) < len(closed):  # the usual case (every row) needs no gathers
                X, actions, rewards, probs, exploit, decided = (
                    take_rows(X, rows), actions[rows], rewards[rows], probs[rows], exploit[rows],
                    decided[rows])
            before = self.learner.n_skipped_updates_
            # what closed was decided here and joined from checked feedback: the learner takes
            # it without checking it again (Learner.learn_checked)
            if len(rows) <= LEARN_CHUNK:
                self.learner.learn_checked(X, actions, rewards, probs, exploit, decided)
            else:
                for lo in range(0, len(rows), LEARN_CHUNK):
                    part = np.arange(lo, min(lo + LEARN_CHUNK, len(rows)))
                    self.learner.learn_checked(take_rows(X, part), actions[part], rewards[part],
                                               probs[part], exploit[part], decided[part])
            skipped = self.learner.n_skipped_updates_ - before
        return Learned(closed, rows, skipped)
