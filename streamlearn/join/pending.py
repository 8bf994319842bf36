"""Joining delayed feedback to pending decisions (docs/daemon.md §3).

A decision waits for feedback for an *experimental-unit window* (``window_s``).

* A feedback event's value is its reward times the weight of its ``type``
  (``reward_weights``; 1 without a type or for a type not listed).
* ``duplicate_policy="earliest"`` (default): the first feedback in the window
  closes the decision at once, so learning is never delayed by the window; any
  later feedback for the id is a ``DUPLICATE`` with no effect.
* Any other policy (``latest``, ``max``, ``min``, ``sum``, ``average``, ``median``:
  :mod:`streamlearn.join.aggregate`) aggregates the values that arrive within the
  window; the decision closes at the window's end with the aggregate, capped at 1.
* Feedback whose event time is at or past ``decided_at + window_s``, or that arrives
  after its decision closed by expiry or shedding — or, with an aggregating policy,
  after it closed at all — is ``LATE``: counted, no effect.
* Feedback that arrives before its decision is ``HELD`` for ``early_window_s``, both of
  its partition's instance clock from its arrival (that clock's time then, its own event
  time if later) and of the caller's wall clock (:class:`EarlyFeedback`); every value of
  the id is kept (an aggregating policy aggregates them as if they had come just after
  the decision, in their order); if the decision does not appear by then the feedback is
  ``UNKNOWN``; a held value whose own event time is at or past the window's end of the
  decision that then appears is late like any other (no effect; :meth:`take_held_late`).
* A decision that closes without feedback is ``EXPIRED``: with
  ``expiry="default_reward"`` it is learned with ``default_reward``, with ``"drop"``
  it is not learned from.
* At most ``max_pending`` decisions wait; beyond that the oldest are ``SHED``
  (closed, not learned from, counted), a batch larger than the bound included.

Every decision closes exactly once; closed decisions are collected by
:meth:`PendingJoins.drain` as one :class:`Closed` batch (one learner update).

Time is event time per ``(stream, partition)`` and the join owns its clocks
(:mod:`streamlearn.join.clock`): a decision expires by the clock of its
partition's feedback stream, early feedback by the clock of its partition's
instance stream; partitions the caller reports idle follow the wall clock, so
expiry never stalls. Event times are believed only up to ``max_clock_skew_s``
ahead of the wall clock (an instance's only up to half of ``early_window_s``
too): a time beyond that (a producer with a wrong clock) tells nothing about
time: it moves no clock and ends no idle period, and the join counts it at its
partition's clock (the wall clock's time when that clock has not started).
One wild timestamp can then neither expire everything nor, after a restart,
make the feedback re-read before its decision look overdue at once (it was
dead-lettered as unknown); when every producer's clock runs ahead, the clocks
move with the wall clock while their partitions are idle, and re-reading a
backlog after downtime counts none of it as late. Held feedback whose
decision is known to be coming (``awaited`` in :meth:`PendingJoins.advance`:
a decision journaled before a restart, its instance not yet re-read) is kept
whatever the clocks say.

Storage is a struct of arrays indexed by slot, with ``slot_of[id]``; adding,
joining, expiring and draining a batch are numpy operations plus one dict
operation per id. Besides what every join needs, a store carries the per-decision
``columns`` its owner declares (name → dtype, e.g. which policy served the
decision): given with each decision, returned with it in :attr:`Closed.columns`,
kept in checkpoints.

>>> joins = PendingJoins(n_actions=2, n_features=2, settings=JoinSettings(window_s=10.0))
>>> joins.add_decisions(["a", "b"], np.eye(2), np.array([0, 1]), np.full((2, 2), 0.5),
...                     labels=np.array([-1, -1]), decided_at=np.zeros(2),
...                     partitions=np.zeros(2, int), wall=0.0)
>>> joins.add_feedback(["a"], np.array([1.0]), np.array([3.0]), np.zeros(1, int), wall=3.0)
array([0], dtype=int8)
>>> closed = joins.drain(); closed.ids, closed.rewards.tolist()  # joined at once ("earliest")
(['a'], [1.0])
>>> _ = joins.advance(wall=3.0, idle=[("feedback", 0)])  # idle from now: the clock follows the wall
>>> _ = joins.advance(wall=10.0); closed = joins.drain()
>>> closed.ids, closed.rewards.tolist(), Outcome(closed.outcome[0]).name  # expired: reward 0
(['b'], [0.0], 'EXPIRED')
"""

from __future__ import annotations

import base64
import enum
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamlearn.errors import ConfigError, StateError
from streamlearn.events.raw import Message
from streamlearn.features import Batch, concat_rows
from streamlearn.join.aggregate import (
    POLICIES,
    MedianValues,
    aggregate,
    capped,
    fold,
    type_weights,
    weights_problem,
)
from streamlearn.join.clock import PartitionClocks
from streamlearn.join.order import OldestFirst
from streamlearn.join.recent import RecentlyClosed
from streamlearn.join.rows import RowStore
from streamlearn.snapshot import pack_strings, unpack_strings

__all__ = ["POLICIES", "REMEMBERED_AT_LEAST_S", "Closed", "EarlyFeedback", "JoinSettings", "Outcome",
           "PendingJoins"]

#: Closed ids are remembered for at least this long, also with a shorter window: feedback a
#: few seconds after a short window's end was forgotten and dead-lettered as ``unknown_id``
#: (its decision had existed), not counted late (an outside test: 142 with a 5 s window and
#: feedback up to 8 s). Memory stays bounded by ``max_pending`` ids a generation.
REMEMBERED_AT_LEAST_S = 60.0


class Outcome(enum.IntEnum):
    """What happened to a decision (first three) or to one feedback event (the others).

    Arrays of codes are compared with ``.value``: an enum operand makes numpy's comparison
    several times slower (≈ 1.5 µs per call on a hot path).
    """

    JOINED = 0  # a decision closed with feedback / the feedback that joined its decision
    EXPIRED = 1  # a decision closed without feedback at its window's end
    SHED = 2  # a decision closed because the pending store was full
    HELD = 3  # feedback waiting for its decision (early)
    AGGREGATED = 4  # another feedback folded into its decision's aggregate (not earliest)
    DUPLICATE = 5  # feedback for a decision already answered: no effect
    LATE = 6  # feedback after its window or after its decision closed: no effect
    UNKNOWN = 7  # feedback whose decision never appeared: no effect

    @property
    def metric(self) -> str:
        """The ``outcome`` label of ``streamlearn_feedback_total`` it counts under."""
        return "duplicate" if self is Outcome.AGGREGATED else self.name.lower()


@dataclass(frozen=True)
class JoinSettings:
    """Join configuration (seconds of event time); ``reward_weights``: feedback type → the
    weight its rewards are multiplied by (a type not listed: 1)."""

    window_s: float = 600.0
    early_window_s: float = 10.0
    duplicate_policy: str = "earliest"
    expiry: str = "default_reward"  # learn expired decisions with default_reward, or "drop"
    default_reward: float = 0.0
    max_pending: int = 200_000
    max_early: int = 100_000
    max_clock_skew_s: float = 5.0
    reward_weights: Mapping[str, float] = field(default_factory=dict)

    @property
    def remembered_s(self) -> float:
        """How long closed ids are remembered at least (one to two of these, see
        :class:`~streamlearn.join.recent.RecentlyClosed`): a window, but not under
        :data:`REMEMBERED_AT_LEAST_S`."""
        return max(self.window_s, REMEMBERED_AT_LEAST_S)

    def __post_init__(self) -> None:
        if self.duplicate_policy not in POLICIES:
            raise ConfigError(f"duplicate_policy must be one of {POLICIES}. "
                              f"Got {self.duplicate_policy!r}.")
        if self.expiry not in ("default_reward", "drop"):
            raise ConfigError(f"expiry must be 'default_reward' or 'drop'. Got {self.expiry!r}.")
        if not (self.window_s > 0 and self.early_window_s >= 0 and self.max_clock_skew_s >= 0):
            raise ConfigError(f"window_s must be > 0, early_window_s and max_clock_skew_s >= 0. "
                              f"Got {self.window_s}, {self.early_window_s}, {self.max_clock_skew_s}.")
        if not 0.0 <= self.default_reward <= 1.0:
            raise ConfigError(f"default_reward must be in [0, 1]. Got {self.default_reward}.")
        if self.max_pending < 1 or self.max_early < 0:
            raise ConfigError(f"max_pending must be >= 1 and max_early >= 0. "
                              f"Got {self.max_pending} and {self.max_early}.")
        problem = weights_problem(self.reward_weights)
        if problem:
            raise ConfigError(f"reward_weights must map feedback types to weights >= 0. "
                              f"Got {dict(self.reward_weights)!r:.200}: {problem}.")


@dataclass
class EarlyFeedback:
    """Feedback held because its decision has not been seen yet: every value of the id
    (weighted rewards, in arrival order; one with the ``earliest`` policy). It is held until
    both its partition's instance clock is ``early_window_s`` past :attr:`hold_start` (the
    later of the first one's event time ``ts`` and that clock's time when it arrived,
    ``held_from``) and ``early_window_s`` of the caller's wall clock have passed since it
    arrived (``arrived``).

    A lagging ``ts`` (a producer whose clock is behind, or ``ts`` 0) is believed for the
    join, but held by it alone the feedback was due at once on a caught-up partition, whose
    clock follows the wall clock (an outside test lost 8 of 12 such pairs), and, after a
    restart, as soon as the backlog's first instances moved a clock that was behind (one
    pair in 30, read as the backlog ended). In a backlog the instance clock is the backlog's
    own time, so feedback whose decision never comes is still dropped once the backlog is
    the window past it, and the window has passed on the wall clock."""

    event_id: Hashable
    rewards: list[float]
    ts: float
    partition: int
    source: Message | None = None  # the first message, for a dead letter if it becomes unknown
    held_from: float = -math.inf  # -inf: from ts (a checkpoint written before held_from)
    arrived: float = -math.inf  # the caller's wall time; -inf: a checkpoint written before it
    # each value's own event time (the first is ts), to judge each against the window when
    # the decision comes; empty: every value at ts (a checkpoint written before times)
    times: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.times:
            self.times = [self.ts] * len(self.rewards)

    @property
    def hold_start(self) -> float:
        return max(self.ts, self.held_from)


@dataclass
class Closed:
    """Decisions closed since the last drain, in closing order."""

    ids: list[Any]
    X: Batch
    actions: np.ndarray
    probs: np.ndarray
    rewards: np.ndarray
    labels: np.ndarray
    outcome: np.ndarray  # Outcome.JOINED / EXPIRED / SHED
    delays: np.ndarray  # feedback ts − decision ts (joined rows; NaN otherwise)
    learn: np.ndarray  # bool: rows to apply to the learner
    decided_at: np.ndarray  # decision event times
    model_version: np.ndarray  # int64: the model version that decided each row
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # the store's own columns

    def __len__(self) -> int:
        return len(self.ids)


class PendingJoins:
    """Pending decisions, early feedback and recently closed ids; see the module docstring."""

    # struct of arrays, one entry per slot (grown by doubling)
    ids: np.ndarray
    action: np.ndarray
    probs: np.ndarray
    label: np.ndarray
    decided_at: np.ndarray
    model: np.ndarray
    partition: np.ndarray
    reward: np.ndarray  # the accumulator of the values so far (aggregate.fold)
    n_feedback: np.ndarray
    feedback_ts: np.ndarray
    active: np.ndarray
    capacity: int

    def __init__(self, n_actions: int, n_features: int, settings: JoinSettings | None = None,
                 clocks: PartitionClocks | None = None,
                 columns: Mapping[str, Any] | None = None) -> None:
        self.settings = settings or JoinSettings()
        self.column_types: dict[str, np.dtype[Any]] = {
            name: np.dtype(dtype) for name, dtype in (columns or {}).items()}
        self.columns: dict[str, np.ndarray] = {}
        self.n_actions, self.n_features = n_actions, n_features
        self.clocks = clocks if clocks is not None else PartitionClocks()
        self.rows = RowStore(n_features)
        self.order = OldestFirst()  # the pending slots oldest first (shedding, expiry)
        self.slot_of: dict[Any, int] = {}
        self._free: list[int] = []
        self.early: OrderedDict[Any, EarlyFeedback] = OrderedDict()
        self._held_values = 0  # values in self.early (bounded by max_early)
        # every value of each pending decision, only where the aggregate needs them all
        self.values = MedianValues() if self.settings.duplicate_policy == "median" else None
        self.recent = RecentlyClosed(self.settings.remembered_s, self.settings.max_pending)
        self._closing: list[tuple[np.ndarray, np.ndarray]] = []  # (slots, outcome codes)
        self._joined_on_arrival: list[Closed] = []  # decisions that came with their feedback
        self._oldest = np.inf  # a lower bound of the pending decisions' decision times
        self._early_oldest = np.inf  # a lower bound of the held feedback's event times
        self._early_first_arrival = np.inf  # a lower bound of their wall times of arrival
        self.shed_total = 0
        self.held_late = 0  # held feedback found late when its decision came: taken by the caller
        self._grow(1024)

    # ----------------------------------------------------------------- storage
    def _grow(self, capacity: int) -> None:
        old = self.capacity if hasattr(self, "capacity") else 0
        self.capacity = capacity

        def grown(name: str, shape: tuple[int, ...], dtype: Any, fill: Any = 0) -> None:
            arr = np.full(shape, fill, dtype=dtype)
            if old:
                arr[:old] = getattr(self, name)
            setattr(self, name, arr)
        grown("ids", (capacity,), object, None)
        grown("action", (capacity,), np.int64)
        grown("probs", (capacity, self.n_actions), np.float64)
        grown("label", (capacity,), np.int64, -1)
        grown("decided_at", (capacity,), np.float64)
        grown("model", (capacity,), np.int64)
        grown("partition", (capacity,), np.int64)
        grown("reward", (capacity,), np.float64)
        grown("n_feedback", (capacity,), np.int64)
        grown("feedback_ts", (capacity,), np.float64, np.nan)
        grown("active", (capacity,), bool, False)
        for name, dtype in self.column_types.items():
            column = np.zeros(capacity, dtype=dtype)
            if old:
                column[:old] = self.columns[name]
            self.columns[name] = column
        self.rows.grow(capacity)
        self.order.grow(capacity)
        self._free.extend(range(capacity - 1, old - 1, -1))

    def __len__(self) -> int:
        return len(self.slot_of)

    def is_known(self, ids: Sequence[Any]) -> np.ndarray:
        """Per id: already pending, recently closed, or repeated earlier in ``ids``."""
        seen: set[Any] = set()
        out = np.zeros(len(ids), dtype=bool)
        for i, event_id in enumerate(ids):
            out[i] = event_id in self.slot_of or event_id in self.recent or event_id in seen
            seen.add(event_id)
        return out

    def pending_decisions(self) -> tuple[list[Any], np.ndarray]:
        """The ids of the decisions waiting for feedback and their actions (in no order)."""
        slots = np.fromiter(self.slot_of.values(), dtype=np.int64, count=len(self.slot_of))
        return list(self.slot_of), np.asarray(self.action[slots], dtype=np.int64)

    def oldest_pending(self) -> float:
        """When the oldest pending decision was made (inf when none waits): every decision
        made earlier is closed. One scan of the store: for occasional use."""
        return float(self.decided_at[self.active].min()) if self.slot_of else np.inf

    def now(self, wall: float) -> float:
        """The newest time of any of the join's clocks."""
        return self.clocks.latest(wall)

    def _observe_believed(self, stream: str, ts: np.ndarray, partitions: np.ndarray,
                          wall: float, ahead_s: float, floor_only: bool = False) -> np.ndarray:
        """Observe a batch's event times on ``stream``'s clocks and return them as the join
        uses them. A time more than ``ahead_s`` ahead of ``wall`` is not believed: it moves
        no clock (nor ends an idle period) and counts as its partition's clock after the
        batch (``wall`` if that clock has not started). Capping it at ``wall + ahead_s``
        instead moved its partition's clock that far ahead, where after a restart it found
        the re-read feedback overdue at once; counting it as ``wall`` made a backlog re-read
        after downtime late by the downtime."""
        ts = np.asarray(ts, dtype=np.float64)
        if not len(ts) or ts.max() <= wall + ahead_s:  # the normal case: one reduction
            self.clocks.observe(stream, partitions, ts, floor_only)
            return ts
        wild = ts > wall + ahead_s
        self.clocks.observe(stream, partitions, np.where(wild, -np.inf, ts), floor_only)
        now = self.clocks.now(stream, wall)
        stand_in = np.array([now.get(p, -np.inf) for p in np.asarray(partitions)[wild].tolist()])
        out = ts.copy()
        out[wild] = np.where(np.isfinite(stand_in), stand_in, wall)
        return out

    @property
    def _instance_ahead_s(self) -> float:
        """How far ahead of the wall clock an instance's time is believed. Early feedback is
        dropped once its partition's instance clock is ``early_window_s`` past it, so that
        clock must never run as far ahead of the instances really read."""
        return min(self.settings.max_clock_skew_s, self.settings.early_window_s / 2)

    # --------------------------------------------------------------- decisions
    def add_decisions(self, ids: Sequence[Any], X: Batch, actions: np.ndarray, probs: np.ndarray,
                      labels: np.ndarray, decided_at: np.ndarray, partitions: np.ndarray,
                      wall: float, model_version: int | np.ndarray = 0,
                      event_ts: np.ndarray | None = None,
                      columns: Mapping[str, np.ndarray] | None = None) -> None:
        """Record new decisions (ids must be new: check with :meth:`is_known`).

        A decision's window opens at ``decided_at``. The instance clock of its partition
        moves to the instances' event times ``event_ts`` (default: ``decided_at``, where
        they are one, as in a replay): a daemon decides a backlog read long after it was
        written at the wall clock's time, and early feedback, held on that clock, must be
        held in the backlog's own time. ``model_version`` names the model that decided;
        ``columns`` give the store's own columns (an absent one is 0).
        """
        B = len(ids)
        if B == 0:
            return
        if event_ts is None:
            self.clocks.observe("instances", partitions, decided_at)
        else:
            self._observe_believed("instances", event_ts, partitions, wall, self._instance_ahead_s)
        self.clocks.observe("feedback", partitions, decided_at, floor_only=True)
        overflow = len(self.slot_of) + B - self.settings.max_pending
        if overflow > 0:
            self._shed(min(overflow, len(self.slot_of)), wall)
        while len(self._free) < B:
            self._grow(self.capacity * 2)
        slots = np.array(self._free[-B:][::-1], dtype=np.int64)
        del self._free[-B:]
        self.ids[slots] = ids if not isinstance(ids, np.ndarray) else ids.tolist()
        self.action[slots], self.probs[slots], self.label[slots] = actions, probs, labels
        self.decided_at[slots], self.partition[slots] = decided_at, partitions
        self.model[slots] = model_version
        for name, column in self.columns.items():
            column[slots] = 0 if columns is None or name not in columns else columns[name]
        self.reward[slots], self.n_feedback[slots], self.feedback_ts[slots] = 0.0, 0, np.nan
        self.active[slots] = True
        self.order.append(slots, self.decided_at[slots])
        self.order.compact(self.active, len(self.slot_of) + B)
        self._oldest = min(self._oldest, float(np.asarray(decided_at).min()))
        self.rows.put(slots, X)
        self.slot_of.update(zip(ids, slots.tolist(), strict=True))
        if self.early:
            matched = [i for i, event_id in enumerate(ids) if event_id in self.early]
            if matched:
                held = [self.pop_early(ids[i]) for i in matched]
                # each held value is judged by the window as feedback arriving after its
                # decision is: a restart that re-reads feedback before its instance (journaled,
                # so held however late) joined feedback 0.1-2.9 s past a 5 s window (outside
                # tests; the second one found the later values of an id, judged by its first)
                due = self.decided_at[slots[matched]] + self.settings.window_s
                on_time = []
                for k, fb in enumerate(held):
                    kept = [j for j, t in enumerate(fb.times) if t < due[k]]
                    if len(kept) < len(fb.times):
                        # an id's values count one outcome each: the others were counted as
                        # they came (duplicates); the first is counted here when none is on
                        # time, else the decision's one `joined` stands for it
                        self.held_late += int(not kept)
                        fb.rewards = [fb.rewards[j] for j in kept]
                        fb.times = [fb.times[j] for j in kept]
                    if kept:
                        on_time.append(k)
                if on_time:
                    self._apply_held(slots[[matched[k] for k in on_time]],
                                     [held[k] for k in on_time], wall)
        excess = len(self.slot_of) - self.settings.max_pending
        if excess > 0:  # the batch alone holds more than the bound: its first ones go too
            waiting = slots[self.active[slots]]
            self._shed_slots(waiting[:excess], wall)

    def take_held_late(self) -> int:
        """How many held feedback events were found late when their decisions came, since
        the last call: the first value of an id none of whose values was on time (its later
        values, late or not, were counted as duplicates as they arrived; with one on time the
        decision joins, and its `joined` counts the first value)."""
        late, self.held_late = self.held_late, 0
        return late

    def pop_early(self, event_id: Any) -> EarlyFeedback:
        """Stop holding the feedback of ``event_id`` (KeyError when none is held)."""
        held = self.early.pop(event_id)
        self._held_values -= len(held.rewards)
        return held

    def _apply_held(self, slots: np.ndarray, held: list[EarlyFeedback], wall: float) -> None:
        """Held feedback for the new decisions ``slots``: each one's values in their order,
        the k-th values of every decision in one batch."""
        for k in range(max(len(fb.rewards) for fb in held)):
            rows = [i for i, fb in enumerate(held) if len(fb.rewards) > k]
            self._apply(slots[rows], np.array([held[i].rewards[k] for i in rows]),
                        np.array([held[i].times[k] for i in rows]), wall)

    def add_joined(self, ids: Sequence[Any], X: Batch, actions: np.ndarray, probs: np.ndarray,
                   labels: np.ndarray, decided_at: np.ndarray, partitions: np.ndarray,
                   rewards: np.ndarray, feedback_ts: np.ndarray, wall: float,
                   model_version: int | np.ndarray = 0,
                   columns: Mapping[str, np.ndarray] | None = None) -> None:
        """Decisions that arrive together with their feedback (new ids; a simulation that
        answers at once): with the ``earliest`` policy and the feedback inside the window
        they join on arrival — the same outcome as :meth:`add_decisions` followed by
        :meth:`add_feedback`, without storing them. Otherwise they take that path."""
        feedback_ts = np.asarray(feedback_ts, dtype=np.float64)
        newest = float(feedback_ts.max()) if len(feedback_ts) else -np.inf  # reduced once here
        if self.settings.duplicate_policy != "earliest" or self.early or not (
                feedback_ts < decided_at + self.settings.window_s).all() or (
                newest > wall + self.settings.max_clock_skew_s):
            self.add_decisions(ids, X, actions, probs, labels, decided_at, partitions, wall,
                               model_version, columns=columns)
            self.add_feedback(ids, rewards, feedback_ts, partitions, wall)
            return
        self.clocks.observe_pair(partitions, decided_at, feedback_ts, newest)
        B = len(ids)
        versions = _column(model_version, np.int64, B)
        self._joined_on_arrival.append(Closed(
            ids=list(ids), X=X, actions=np.asarray(actions), probs=np.asarray(probs),
            rewards=np.asarray(rewards, dtype=np.float64), labels=np.asarray(labels),
            outcome=np.zeros(B, dtype=np.int8), delays=feedback_ts - decided_at,
            learn=np.ones(B, dtype=bool), decided_at=np.asarray(decided_at, dtype=np.float64),
            model_version=versions, columns=self._given_columns(columns, B)))
        self.recent.add_all(ids, int(Outcome.JOINED), newest, wall)

    def _given_columns(self, columns: Mapping[str, np.ndarray] | None, n: int
                       ) -> dict[str, np.ndarray]:
        """The store's columns for ``n`` rows from those given (an absent one is 0)."""
        out = {}
        for name, dtype in self.column_types.items():
            given = None if columns is None else columns.get(name)
            out[name] = np.zeros(n, dtype=dtype) if given is None else _column(given, dtype, n)
        return out

    def _shed(self, n: int, wall: float) -> None:
        self._shed_slots(self.order.oldest(n, self.active, self.decided_at), wall)

    def _shed_slots(self, slots: np.ndarray, wall: float) -> None:
        self._close(slots, np.full(len(slots), Outcome.SHED, dtype=np.int8), wall)
        self.shed_total += len(slots)

    # ---------------------------------------------------------------- feedback
    def add_feedback(self, ids: Sequence[Any], rewards: np.ndarray, ts: np.ndarray,
                     partitions: np.ndarray, wall: float,
                     sources: Sequence[Message | None] | None = None,
                     types: Sequence[str | None] | None = None) -> np.ndarray:
        """Join a feedback batch; return one :class:`Outcome` code per feedback event.

        ``sources`` (the messages) are kept with held feedback, for a dead letter
        should it become unknown. ``types`` (None: none) weigh the rewards by
        ``settings.reward_weights``.
        """
        n = len(ids)
        if types is not None and self.settings.reward_weights:
            rewards = np.asarray(rewards, dtype=np.float64) * type_weights(
                types, self.settings.reward_weights)
        given_ts = np.asarray(ts, dtype=np.float64)
        ts = self._observe_believed("feedback", given_ts, partitions, wall,
                                    self.settings.max_clock_skew_s)
        self._observe_believed("instances", given_ts, partitions, wall, self._instance_ahead_s,
                               floor_only=True)
        if n == 0:
            return np.zeros(0, dtype=np.int8)
        if len(set(ids)) < n:  # the same id twice in one batch (rare): one at a time, in order
            return np.concatenate([
                self.add_feedback(ids[i:i + 1], rewards[i:i + 1], given_ts[i:i + 1],
                                  partitions[i:i + 1], wall,
                                  None if sources is None else sources[i:i + 1])
                for i in range(n)])
        out = np.full(n, Outcome.UNKNOWN, dtype=np.int8)
        get = self.slot_of.get
        slots = np.fromiter((get(i, -1) for i in ids), dtype=np.int64, count=n)
        pending = np.flatnonzero(slots >= 0)
        if len(pending):
            s = slots[pending]
            late = ts[pending] >= self.decided_at[s] + self.settings.window_s  # [t, t + w)
            if late.any():
                ls = s[late]
                self._close(ls, np.where(self.n_feedback[ls] > 0, Outcome.JOINED,
                                         Outcome.EXPIRED).astype(np.int8), wall)
                out[pending[late]] = Outcome.LATE
            joining, s = pending[~late], s[~late]
            first = self.n_feedback[s] == 0
            out[joining] = np.where(first, Outcome.JOINED, Outcome.AGGREGATED)
            self._apply(s, rewards[joining], ts[joining], wall)
        for i in np.flatnonzero(slots < 0).tolist():  # not pending: recent, early or unknown
            out[i] = self._not_pending(ids[i], float(rewards[i]), float(ts[i]),
                                       int(partitions[i]), None if sources is None else sources[i],
                                       wall)
        return out

    def _not_pending(self, event_id: Any, reward: float, ts: float, partition: int,
                     source: Message | None, wall: float) -> Outcome:
        how = self.recent.get(event_id)
        if how is not None:  # closed; an aggregating policy closes at (or past) the window's end
            aggregating = self.settings.duplicate_policy != "earliest"
            return Outcome.LATE if how != Outcome.JOINED or aggregating else Outcome.DUPLICATE
        held = self.early.get(event_id)
        room = self._held_values < self.settings.max_early
        if held is not None:
            if self.settings.duplicate_policy == "earliest":
                return Outcome.DUPLICATE
            if not room:
                return Outcome.UNKNOWN
            held.rewards.append(reward)
            held.times.append(ts)
            self._held_values += 1
            return Outcome.AGGREGATED
        if self.settings.early_window_s > 0 and room:
            held = EarlyFeedback(event_id, [reward], ts, partition, source,
                                 self.clocks.now_of("instances", partition, wall), wall)
            self.early[event_id] = held
            self._held_values += 1
            self._early_oldest = min(self._early_oldest, held.hold_start)
            self._early_first_arrival = min(self._early_first_arrival, wall)
            return Outcome.HELD
        return Outcome.UNKNOWN

    def _apply(self, slots: np.ndarray, rewards: np.ndarray, ts: np.ndarray, wall: float) -> None:
        """Feedback for pending decisions ``slots`` (distinct), inside their windows (``wall``:
        when the earliest policy closes them: recently closed ids are remembered from then)."""
        if not len(slots):
            return
        policy = self.settings.duplicate_policy
        first = self.n_feedback[slots] == 0
        self.reward[slots] = fold(policy, self.reward[slots], first, rewards)
        if self.values is not None:
            self.values.add(slots, rewards)
        self.feedback_ts[slots] = np.where(first, ts, self.feedback_ts[slots])
        self.n_feedback[slots] += 1
        if policy == "earliest":
            self._close(slots, np.full(len(slots), Outcome.JOINED, dtype=np.int8), wall)

    # ------------------------------------------------------------------ expiry
    def advance(self, wall: float, idle: Iterable[tuple[str, int]] = (),
                awaited: Callable[[Any], bool] | None = None) -> list[EarlyFeedback]:
        """Expire what is due; return early feedback that became unknown.

        ``idle`` ``(stream, partition)`` pairs have nothing unread: their clocks
        follow ``wall`` from now until data comes again. ``awaited(id)``: the id's decision
        is known to be coming (journaled before a restart, its instance not re-read yet),
        so its held feedback stays held however late the clocks say it is — a feedback
        producer whose clock lags, or one re-read ahead of its instance, would otherwise
        lose it.
        """
        for stream, partition in idle:
            self.clocks.mark_idle(stream, [partition], wall)
        if not self.slot_of and not self.early:  # nothing pending: only the clocks move
            self.recent.age(self.now(wall), wall)
            return []
        feedback_now = self.clocks.now("feedback", wall)
        newest = max(feedback_now.values(), default=-np.inf)
        window = self.settings.window_s
        if self.slot_of and self._oldest + window <= newest:  # the oldest one may be due
            # the decisions old enough for the newest clock (a rounding's margin more: the
            # exact test below decides), oldest first: not a scan of the whole store
            margin = 8 * float(np.spacing(max(abs(newest), window)))
            candidates = self.order.up_to(newest - window + margin, self.active, self.decided_at)
            due = np.sort(candidates[self.decided_at[candidates] + window  # in slot order
                                     <= _per_partition(feedback_now, self.partition[candidates])])
            if len(due):
                self._close(due, np.where(self.n_feedback[due] > 0, Outcome.JOINED,
                                          Outcome.EXPIRED).astype(np.int8), wall)
            self._oldest = self.order.first_time(self.active, self.decided_at)
        unknown: list[EarlyFeedback] = []
        instance_now = self.clocks.now("instances", wall) if self.early else {}
        window = self.settings.early_window_s
        if self.early and self._early_oldest + window <= max(instance_now.values(), default=-np.inf) \
                and self._early_first_arrival + window <= wall:  # only when the oldest may be due
            held = list(self.early.values())
            parts = np.fromiter((fb.partition for fb in held), np.int64, count=len(held))
            ts = np.fromiter((fb.hold_start for fb in held), np.float64, count=len(held))
            arrived = np.fromiter((fb.arrived for fb in held), np.float64, count=len(held))
            gone = (ts + window <= _per_partition(instance_now, parts)) & (arrived + window <= wall)
            for n in np.flatnonzero(gone).tolist():  # only the due ones
                if awaited is not None and awaited(held[n].event_id):
                    gone[n] = False  # stays held; due, so looked at again at the next step
                else:
                    unknown.append(self.pop_early(held[n].event_id))
            self._early_oldest = float(ts[~gone].min()) if (~gone).any() else np.inf
            self._early_first_arrival = float(arrived[~gone].min()) if (~gone).any() else np.inf
        self.recent.age(self.now(wall), wall)
        return unknown

    def _close(self, slots: np.ndarray, outcome: np.ndarray, wall: float) -> None:
        if not len(slots):
            return
        self.active[slots] = False
        ids = self.ids[slots].tolist()
        pop = self.slot_of.pop
        for event_id in ids:
            pop(event_id)
        self.recent.add(ids, outcome.tolist(), self.now(wall), wall)
        self._closing.append((slots, outcome))

    @property
    def anything_closed(self) -> bool:
        """Whether a :meth:`drain` now would return any decision."""
        return bool(self._closing or self._joined_on_arrival)

    def drain(self) -> Closed:
        """Collect every decision closed since the last drain and free their slots."""
        parts = self._joined_on_arrival
        self._joined_on_arrival = []
        if self._closing or not parts:
            parts = [self._drain_slots(), *parts]
        return parts[0] if len(parts) == 1 else _concat_closed(parts)

    def _drain_slots(self) -> Closed:
        if len(self._closing) == 1:
            slots, outcome = self._closing[0]
        elif self._closing:
            slots = np.concatenate([s for s, _ in self._closing])
            outcome = np.concatenate([o for _, o in self._closing])
        else:
            slots, outcome = np.zeros(0, np.int64), np.zeros(0, np.int8)
        self._closing = []
        joined = outcome == Outcome.JOINED.value
        rewards = np.where(joined, self._aggregates(slots), self.settings.default_reward)
        learn = joined | ((outcome == Outcome.EXPIRED.value)
                          & (self.settings.expiry == "default_reward"))
        closed = Closed(
            ids=self.ids[slots].tolist(), X=self.rows.take(slots), actions=self.action[slots],
            probs=self.probs[slots], rewards=rewards, labels=self.label[slots], outcome=outcome,
            delays=np.where(joined, self.feedback_ts[slots] - self.decided_at[slots], np.nan),
            learn=learn, decided_at=self.decided_at[slots], model_version=self.model[slots],
            columns={name: column[slots] for name, column in self.columns.items()},
        )
        self.ids[slots] = None
        self.rows.clear(slots)
        self._free.extend(slots.tolist())
        return closed

    def _aggregates(self, slots: np.ndarray) -> np.ndarray:
        """The capped aggregate of each closing decision's values (NaN for one without);
        the values a median kept are freed."""
        if self.values is not None:
            return capped(self.values.pop_medians(slots.tolist()))
        return capped(aggregate(self.settings.duplicate_policy, self.reward[slots],
                                self.n_feedback[slots]))

    # ------------------------------------------------------------------- state
    def export(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays + JSON of the whole store (call after :meth:`drain`)."""
        if self._closing or self._joined_on_arrival:
            raise StateError("export() needs every closed decision drained first.")
        live = np.flatnonzero(self.active)
        recent_utf8, recent_ends, recent_how, recent_young, young_since = self.recent.export()
        arrays = {
            "pending.action": self.action[live], "pending.probs": self.probs[live],
            "pending.label": self.label[live], "pending.decided_at": self.decided_at[live],
            "pending.partition": self.partition[live], "pending.reward": self.reward[live],
            "pending.n_feedback": self.n_feedback[live],
            "pending.feedback_ts": self.feedback_ts[live], "pending.model": self.model[live],
            "recent.how": recent_how, "recent.young": recent_young,
            "recent.ids.utf8": recent_utf8, "recent.ids.ends": recent_ends,
        }
        # ids as UTF-8 bytes + offsets: numpy string dtypes would drop trailing NULs
        arrays["pending.ids.utf8"], arrays["pending.ids.ends"] = pack_strings(
            [str(i) for i in self.ids[live].tolist()])
        arrays.update({f"pending.x.{k}": v for k, v in self.rows.export(live).items()})
        arrays.update({f"pending.column.{name}": column[live]
                       for name, column in self.columns.items()})
        if self.values is not None:
            arrays["pending.values"] = self.values.export(live.tolist())
        meta = {"policy": self.settings.duplicate_policy,
                "early": [_early_json(fb) for fb in self.early.values()],
                "shed_total": self.shed_total, "clocks": self.clocks.to_json(),
                "recent_young_since": young_since if np.isfinite(young_since) else None}
        return arrays, meta

    @staticmethod
    def exported_copy(name: str) -> bool:
        """Whether :meth:`export`'s array ``name`` is a copy that nothing else holds: every
        ``pending.*`` one is gathered from the live arrays (fancy indexing, new arrays); the
        recently closed ids' generations are kept and shared."""
        return name.startswith("pending.")

    @staticmethod
    def packed(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A snapshot's arrays with :meth:`export`'s rows made smaller (:meth:`RowStore.packed`;
        the other arrays as they are): for the snapshot's writer thread, so that the serving
        thread only copies the rows."""
        prefix = "pending.x."
        rows = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
        if not rows:
            return arrays
        kept = {k: v for k, v in arrays.items() if not k.startswith(prefix)}
        return {**kept, **{prefix + k: v for k, v in RowStore.packed(rows).items()}}

    @classmethod
    def restore(cls, n_actions: int, n_features: int, settings: JoinSettings,
                arrays: dict[str, np.ndarray], meta: dict[str, Any],
                clocks: PartitionClocks | None = None,
                columns: Mapping[str, Any] | None = None) -> PendingJoins:
        """Rebuild a store from :meth:`export` output; raise StateError if it does not fit.

        ``clocks`` are used when ``meta`` has none (checkpoints written before the
        join owned its clocks kept them with the counters).
        """
        try:
            clocks = PartitionClocks.from_json(meta["clocks"]) if "clocks" in meta else clocks
            store = cls(n_actions, n_features, settings, clocks, columns)
            ids = _stored_ids(arrays, "pending.ids")
            X = RowStore.imported({k[len("pending.x."):]: v for k, v in arrays.items()
                                   if k.startswith("pending.x.")}, n_features)
            saved_clocks = store.clocks
            store.clocks = PartitionClocks()  # adding the saved decisions must not move the clocks
            store.add_decisions(ids, X, arrays["pending.action"], arrays["pending.probs"],
                                arrays["pending.label"], arrays["pending.decided_at"],
                                arrays["pending.partition"], wall=-np.inf,
                                model_version=arrays.get("pending.model", 0),  # older: absent
                                columns={name: arrays[f"pending.column.{name}"]
                                         for name in store.column_types
                                         if f"pending.column.{name}" in arrays})
            store.clocks = saved_clocks
            slots = np.array([store.slot_of[i] for i in ids], dtype=np.int64)
            store._restore_values(slots, arrays, meta.get("policy"))
            store.feedback_ts[slots] = arrays["pending.feedback_ts"]
            recent_ids = _stored_ids(arrays, "recent.ids")
            since = meta.get("recent_young_since")
            store.recent = RecentlyClosed.restore(
                settings.remembered_s, settings.max_pending, recent_ids, arrays["recent.how"],
                arrays.get("recent.young", np.ones(len(recent_ids), bool)),  # older checkpoints
                -np.inf if since is None else float(since))
            store.early = OrderedDict((fb["event_id"], _early_from_json(fb)) for fb in meta["early"])
            store._held_values = sum(len(fb.rewards) for fb in store.early.values())
            store._early_oldest = min((fb.hold_start for fb in store.early.values()),
                                      default=np.inf)
            store._early_first_arrival = min((fb.arrived for fb in store.early.values()),
                                             default=np.inf)
            store.shed_total = int(meta["shed_total"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"Pending joins in the checkpoint are invalid: {exc!r}") from exc
        return store

    def _restore_values(self, slots: np.ndarray, arrays: dict[str, np.ndarray],
                        saved_policy: str | None) -> None:
        """The accumulators, counts and kept values of the restored decisions ``slots``.

        A checkpoint written under another policy (or before the policy was recorded:
        ``earliest``, ``latest`` or ``max``, whose accumulator is the aggregate) gives each
        decision with feedback its aggregate so far as one value.
        """
        acc = np.asarray(arrays["pending.reward"], dtype=np.float64)
        counts = np.asarray(arrays["pending.n_feedback"], dtype=np.int64)
        if len(acc) != len(slots) or len(counts) != len(slots) or (counts < 0).any():
            raise ValueError(f"expected {len(slots)} accumulators and counts >= 0, got "
                             f"{len(acc)} and {len(counts)}")
        kept = "pending.values" in arrays
        policy = self.settings.duplicate_policy
        if saved_policy == policy and (policy != "median" or kept):
            self.reward[slots], self.n_feedback[slots] = acc, counts
            if self.values is not None:
                self.values.load(slots.tolist(), np.asarray(arrays["pending.values"],
                                                            dtype=np.float64), counts)
            return
        if saved_policy == "median" and kept:
            held = MedianValues()
            held.load(slots.tolist(), np.asarray(arrays["pending.values"], np.float64), counts)
            acc = held.pop_medians(slots.tolist())
        elif saved_policy is not None:
            acc = aggregate(saved_policy, acc, counts)
        counts = np.minimum(counts, 1)
        self.reward[slots], self.n_feedback[slots] = acc, counts
        if self.values is not None:
            with_value = counts > 0
            self.values.add(slots[with_value], acc[with_value])


def _concat_closed(parts: list[Closed]) -> Closed:
    parts = [p for p in parts if len(p)] or parts[:1]
    if len(parts) == 1:
        return parts[0]
    return Closed(ids=[i for p in parts for i in p.ids],
                  X=concat_rows([p.X for p in parts], int(parts[0].X.shape[1])),
                  columns={name: np.concatenate([p.columns[name] for p in parts])
                           for name in parts[0].columns},
                  **{name: np.concatenate([getattr(p, name) for p in parts])
                     for name in ("actions", "probs", "rewards", "labels", "outcome", "delays",
                                  "learn", "decided_at", "model_version")})


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode("ascii")


def _early_json(fb: EarlyFeedback) -> dict[str, Any]:
    src = fb.source
    source = None if src is None else {
        "topic": src.topic, "partition": src.partition, "offset": src.offset,
        "key_b64": _b64(src.key), "value_b64": _b64(src.value), "timestamp_ms": src.timestamp_ms}
    return {"event_id": fb.event_id, "rewards": fb.rewards, "ts": fb.ts, "times": fb.times,
            "partition": fb.partition, "source": source,
            **{name: time for name, time in (("held_from", fb.held_from), ("arrived", fb.arrived))
               if math.isfinite(time)}}


def _early_from_json(data: dict[str, Any]) -> EarlyFeedback:
    src = data.get("source")
    partition = data.get("partition", (src or {}).get("partition", 0))
    message = None
    if src is not None:
        key, value = (None if src.get(k) is None else base64.b64decode(src[k])
                      for k in ("key_b64", "value_b64"))
        message = Message(src["topic"], int(src["partition"]), int(src["offset"]), key, value,
                          int(src.get("timestamp_ms", 0)))
    rewards = [float(r) for r in data["rewards"]] if "rewards" in data else [
        float(data["reward"])]  # older checkpoints held one folded value
    if not rewards or not all(math.isfinite(r) and r >= 0 for r in rewards):
        raise ValueError(f"held feedback of {data['event_id']!r:.80} must have finite values "
                         f">= 0, got {rewards!r:.80}")
    held_from, arrived = (float(data.get(name, -math.inf)) for name in ("held_from", "arrived"))
    if math.isnan(held_from) or math.isnan(arrived):
        raise ValueError(f"held feedback of {data['event_id']!r:.80} must have times, got "
                         f"held_from {held_from!r}, arrived {arrived!r}")
    held = EarlyFeedback(data["event_id"], rewards, float(data["ts"]), int(partition), message,
                         held_from, arrived, [float(t) for t in data.get("times", [])])
    if len(held.times) != len(rewards) or not all(math.isfinite(t) for t in held.times):
        raise ValueError(f"held feedback of {data['event_id']!r:.80} must have one finite time "
                         f"per value, got {held.times!r:.80} for {len(rewards)} values")
    return held


def _stored_ids(arrays: dict[str, np.ndarray], name: str) -> list[str]:
    """Ids written by :meth:`PendingJoins.export` (or, from older checkpoints, a string array)."""
    if f"{name}.utf8" in arrays:
        return unpack_strings(arrays[f"{name}.utf8"], arrays[f"{name}.ends"])
    return [str(i) for i in arrays[name].tolist()]


def _per_partition(now: float | Mapping[int, float], partitions: np.ndarray) -> np.ndarray:
    """The time of each row's partition (-inf for a partition without a clock)."""
    if not isinstance(now, Mapping):
        return np.full(len(partitions), float(now))
    uniq, inverse = np.unique(partitions, return_inverse=True)
    return np.array([now.get(int(p), -np.inf) for p in uniq], dtype=np.float64)[inverse]


def _column(given: Any, dtype: Any, n: int) -> np.ndarray:
    """A fresh ``n``-row column of ``dtype`` from one value or ``n`` values (a micro-batch of
    one to eight pays ~5 µs per ``np.broadcast_to``: it is only the fallback here)."""
    values = np.asarray(given, dtype=dtype)
    if values.shape == (n,):
        return values.copy()
    if not values.ndim:  # one value (a model version): np.full is ~4× cheaper than broadcasting
        return np.full(n, values, dtype=dtype)
    return np.broadcast_to(values, (n,)).copy()
