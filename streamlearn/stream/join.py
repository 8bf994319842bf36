"""Joining delayed feedback to pending decisions (DESIGN.md §5).

A decision waits for feedback for an *experimental-unit window* (``window_s``).

* ``duplicate_policy="earliest"`` (default): the first feedback in the window
  closes the decision at once, so learning is never delayed by the window; any
  later feedback for the id is a ``duplicate`` with no effect.
* ``"latest"`` / ``"max"``: feedback in the window is aggregated (last value /
  maximum) and the decision closes at the window's end with the aggregate.
* Feedback whose event time is at or past ``decided_at + window_s``, or that arrives
  after its decision closed by expiry or shedding, is ``late``: counted, no effect.
* Feedback that arrives before its decision is held for ``early_window_s``; if
  the decision does not appear by then the feedback is ``unknown``.
* A decision that closes without feedback is ``expired``: with
  ``expiry="default_reward"`` it is learned with ``default_reward``, with ``"drop"``
  it is not learned from.
* At most ``max_pending`` decisions wait; beyond that the oldest are *shed*
  (closed, not learned from, counted).

Every decision closes exactly once; closed decisions are collected by
:meth:`PendingJoins.drain` as one :class:`Closed` batch (one learner update).
Time is event time per partition (:mod:`streamlearn.stream.clock`): a decision
expires by the clock of its partition's feedback stream, early feedback by
the clock of its partition's instance stream; idle streams follow the wall
clock, so expiry never stalls.

Storage is a struct of arrays indexed by slot, with ``slot_of[id]``; expiry and
the gathers of closed rows are numpy operations.

>>> joins = PendingJoins(n_actions=2, n_features=2, settings=JoinSettings(window_s=10.0))
>>> joins.add_decisions(["a", "b"], np.eye(2), np.array([0, 1]), np.full((2, 2), 0.5),
...                     labels=np.array([-1, -1]), ts=np.zeros(2), partitions=np.zeros(2, int),
...                     now=0.0)
>>> joins.add_feedback(["a"], np.array([1.0]), np.array([3.0]), [None], now=3.0)
[]
>>> closed = joins.drain(); closed.ids, closed.rewards.tolist()  # joined at once ("earliest")
(['a'], [1.0])
>>> _ = joins.advance(10.0); closed = joins.drain()  # "b" expired: default reward 0
>>> closed.ids, closed.rewards.tolist(), bool(closed.outcome[0] == EXPIRED)
(['b'], [0.0], True)
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamlearn.errors import ConfigError, StateError
from streamlearn.features import Batch
from streamlearn.snapshot import pack_strings, unpack_strings
from streamlearn.stream.rows import RowStore

__all__ = ["Closed", "EarlyFeedback", "JoinSettings", "PendingJoins"]

JOINED, EXPIRED, SHED = 0, 1, 2
POLICIES = ("earliest", "latest", "max")


@dataclass(frozen=True)
class JoinSettings:
    """Join configuration (seconds of event time)."""

    window_s: float = 600.0
    early_window_s: float = 10.0
    duplicate_policy: str = "earliest"
    expiry: str = "default_reward"  # learn expired decisions with default_reward, or "drop"
    default_reward: float = 0.0
    max_pending: int = 200_000
    max_early: int = 100_000

    def __post_init__(self) -> None:
        if self.duplicate_policy not in POLICIES:
            raise ConfigError(f"duplicate_policy must be one of {POLICIES}. "
                              f"Got {self.duplicate_policy!r}.")
        if self.expiry not in ("default_reward", "drop"):
            raise ConfigError(f"expiry must be 'default_reward' or 'drop'. Got {self.expiry!r}.")
        if not (self.window_s > 0 and self.early_window_s >= 0):
            raise ConfigError(f"window_s must be > 0 and early_window_s >= 0. "
                              f"Got {self.window_s} and {self.early_window_s}.")
        if not 0.0 <= self.default_reward <= 1.0:
            raise ConfigError(f"default_reward must be in [0, 1]. Got {self.default_reward}.")
        if self.max_pending < 1 or self.max_early < 0:
            raise ConfigError(f"max_pending must be >= 1 and max_early >= 0. "
                              f"Got {self.max_pending} and {self.max_early}.")


@dataclass
class EarlyFeedback:
    """Feedback held because its decision has not been seen yet."""

    event_id: str
    reward: float
    ts: float
    held_at: float
    source: dict[str, Any]  # topic, partition, offset, key_b64, value_b64 (for the dead letter)


@dataclass
class Closed:
    """Decisions closed since the last drain, in closing order."""

    ids: list[str]
    X: Batch
    actions: np.ndarray
    probs: np.ndarray
    rewards: np.ndarray
    labels: np.ndarray
    outcome: np.ndarray  # JOINED / EXPIRED / SHED
    delays: np.ndarray  # feedback ts − decision ts (joined rows; NaN otherwise)
    learn: np.ndarray  # bool: rows to apply to the learner

    def __len__(self) -> int:
        return len(self.ids)


def source_of(msg: Any) -> dict[str, Any]:
    """A JSON-safe copy of a message's origin and bytes (kept for a later dead letter)."""
    def b64(b: bytes | None) -> str | None:
        return None if b is None else base64.b64encode(b).decode("ascii")
    return {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset,
            "key_b64": b64(msg.key), "value_b64": b64(msg.value)}


class PendingJoins:
    """Pending decisions, early feedback and recently closed ids; see the module docstring."""

    # struct of arrays, one entry per slot (grown by doubling)
    ids: np.ndarray
    action: np.ndarray
    probs: np.ndarray
    label: np.ndarray
    decided_at: np.ndarray
    partition: np.ndarray
    reward: np.ndarray
    n_feedback: np.ndarray
    feedback_ts: np.ndarray
    active: np.ndarray
    capacity: int

    def __init__(self, n_actions: int, n_features: int, settings: JoinSettings | None = None) -> None:
        self.settings = settings or JoinSettings()
        self.n_actions, self.n_features = n_actions, n_features
        self.rows = RowStore(n_features)
        self.slot_of: dict[str, int] = {}
        self._free: list[int] = []
        self.early: OrderedDict[str, EarlyFeedback] = OrderedDict()
        self.recent: OrderedDict[str, tuple[float, int]] = OrderedDict()  # id → (closed at, how)
        self._closing: list[tuple[np.ndarray, np.ndarray]] = []  # (slots, outcome codes)
        self.shed_total = 0
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
        grown("partition", (capacity,), np.int64)
        grown("reward", (capacity,), np.float64)
        grown("n_feedback", (capacity,), np.int64)
        grown("feedback_ts", (capacity,), np.float64, np.nan)
        grown("active", (capacity,), bool, False)
        self.rows.grow(capacity)
        self._free.extend(range(capacity - 1, old - 1, -1))

    def __len__(self) -> int:
        return len(self.slot_of)

    def is_known(self, ids: list[str]) -> np.ndarray:
        """Per id: already pending, recently closed, or repeated earlier in ``ids``."""
        seen: set[str] = set()
        out = np.zeros(len(ids), dtype=bool)
        for i, event_id in enumerate(ids):
            out[i] = event_id in self.slot_of or event_id in self.recent or event_id in seen
            seen.add(event_id)
        return out

    # --------------------------------------------------------------- decisions
    def add_decisions(self, ids: list[str], X: Batch, actions: np.ndarray, probs: np.ndarray,
                      labels: np.ndarray, ts: np.ndarray, partitions: np.ndarray,
                      now: float) -> None:
        """Record new decisions (ids must be new: check with :meth:`is_known`)."""
        B = len(ids)
        if B == 0:
            return
        overflow = len(self.slot_of) + B - self.settings.max_pending
        if overflow > 0:
            self._shed(min(overflow, len(self.slot_of)), now)
        while len(self._free) < B:
            self._grow(self.capacity * 2)
        slots = np.array(self._free[-B:][::-1], dtype=np.int64)
        del self._free[-B:]
        self.ids[slots] = ids
        self.action[slots], self.probs[slots], self.label[slots] = actions, probs, labels
        self.decided_at[slots], self.partition[slots] = ts, partitions
        self.reward[slots], self.n_feedback[slots], self.feedback_ts[slots] = 0.0, 0, np.nan
        self.active[slots] = True
        self.rows.put(slots, X)
        self.slot_of.update(zip(ids, slots.tolist(), strict=True))
        held = [i for i, event_id in enumerate(ids) if event_id in self.early] if self.early else []
        for i in held:
            fb = self.early.pop(ids[i])
            self._apply_feedback(int(slots[i]), fb.reward, fb.ts)

    def _shed(self, n: int, now: float) -> None:
        live = np.flatnonzero(self.active)
        oldest = live[np.argsort(self.decided_at[live], kind="stable")[:n]]
        self._close(oldest, np.full(len(oldest), SHED), now)
        self.shed_total += len(oldest)

    # ---------------------------------------------------------------- feedback
    def add_feedback(self, ids: list[str], rewards: np.ndarray, ts: np.ndarray,
                     messages: list[Any], now: float) -> list[tuple[int, str]]:
        """Join a feedback batch; return ``(index, outcome)`` of feedback that did not join.

        Outcomes returned: ``duplicate`` (no effect), ``aggregated`` (a duplicate
        that was folded into the aggregate), ``late``, ``held`` (waiting for its
        decision) and ``unknown`` (no decision and no early window).
        """
        out: list[tuple[int, str]] = []
        window = self.settings.window_s
        for i, event_id in enumerate(ids):
            slot = self.slot_of.get(event_id)
            if slot is not None:
                if ts[i] >= self.decided_at[slot] + window:  # the window is [t, t + w)
                    how = JOINED if self.n_feedback[slot] else EXPIRED
                    self._close(np.array([slot]), np.array([how]), now)
                    out.append((i, "late"))
                    continue
                if self.n_feedback[slot] and self.settings.duplicate_policy != "earliest":
                    out.append((i, "aggregated"))
                self._apply_feedback(slot, float(rewards[i]), float(ts[i]))
                continue
            closed = self.recent.get(event_id)
            if closed is not None:
                out.append((i, "duplicate" if closed[1] == JOINED else "late"))
            elif event_id in self.early:
                fb = self.early[event_id]
                if self.settings.duplicate_policy == "earliest":
                    out.append((i, "duplicate"))
                    continue
                fb.reward = _aggregate(self.settings.duplicate_policy, fb.reward, float(rewards[i]))
                out.append((i, "aggregated"))
            elif self.settings.early_window_s > 0 and len(self.early) < self.settings.max_early:
                self.early[event_id] = EarlyFeedback(event_id, float(rewards[i]), float(ts[i]),
                                                     now, source_of(messages[i]))
                out.append((i, "held"))
            else:
                out.append((i, "unknown"))
        return out

    def _apply_feedback(self, slot: int, reward: float, ts: float) -> None:
        policy = self.settings.duplicate_policy
        first = self.n_feedback[slot] == 0
        self.reward[slot] = reward if first else _aggregate(policy, self.reward[slot], reward)
        if first:
            self.feedback_ts[slot] = ts
        self.n_feedback[slot] += 1
        if policy == "earliest":
            self._close(np.array([slot]), np.array([JOINED]), ts)

    # ------------------------------------------------------------------ expiry
    def advance(self, feedback_now: float | Mapping[int, float],
                instance_now: float | Mapping[int, float] | None = None) -> list[EarlyFeedback]:
        """Expire what is due; return early feedback that became ``unknown``.

        ``feedback_now`` (per partition, or one time for all) closes the decisions
        whose window ended; ``instance_now`` (default: the same) ends the wait of
        early feedback.
        """
        instance_now = feedback_now if instance_now is None else instance_now
        live = np.flatnonzero(self.active)
        if len(live):
            due = live[self.decided_at[live] + self.settings.window_s
                       <= _per_partition(feedback_now, self.partition[live])]
            if len(due):
                now = _latest(feedback_now)
                self._close(due, np.where(self.n_feedback[due] > 0, JOINED, EXPIRED), now)
        unknown: list[EarlyFeedback] = []
        if self.early:
            parts = np.array([fb.source["partition"] for fb in self.early.values()], np.int64)
            ts = np.array([fb.ts for fb in self.early.values()])
            gone = ts + self.settings.early_window_s <= _per_partition(instance_now, parts)
            for event_id in [k for k, g in zip(self.early, gone.tolist(), strict=True) if g]:
                unknown.append(self.early.pop(event_id))
        horizon = _latest(feedback_now) - self.settings.window_s
        while self.recent and next(iter(self.recent.values()))[0] < horizon:
            self.recent.popitem(last=False)
        return unknown

    def _close(self, slots: np.ndarray, outcome: np.ndarray, now: float) -> None:
        self.active[slots] = False
        for slot, how in zip(slots.tolist(), outcome.tolist(), strict=True):
            event_id = self.ids[slot]
            del self.slot_of[event_id]
            self.recent[event_id] = (now, how)
        while len(self.recent) > self.settings.max_pending:
            self.recent.popitem(last=False)
        self._closing.append((slots, outcome))

    def drain(self) -> Closed:
        """Collect every decision closed since the last drain and free their slots."""
        if self._closing:
            slots = np.concatenate([s for s, _ in self._closing])
            outcome = np.concatenate([o for _, o in self._closing])
        else:
            slots, outcome = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self._closing = []
        rewards = np.where(outcome == JOINED, self.reward[slots], self.settings.default_reward)
        learn = (outcome == JOINED) | ((outcome == EXPIRED) & (self.settings.expiry == "default_reward"))
        closed = Closed(
            ids=self.ids[slots].tolist(), X=self.rows.take(slots), actions=self.action[slots],
            probs=self.probs[slots], rewards=rewards, labels=self.label[slots], outcome=outcome,
            delays=np.where(outcome == JOINED, self.feedback_ts[slots] - self.decided_at[slots],
                            np.nan),
            learn=learn,
        )
        self.ids[slots] = None
        self.rows.clear(slots)
        self._free.extend(slots.tolist())
        return closed

    # ------------------------------------------------------------------- state
    def export(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays + JSON of the whole store (call after :meth:`drain`)."""
        if self._closing:
            raise StateError("export() needs every closed decision drained first.")
        live = np.flatnonzero(self.active)
        arrays = {
            "pending.action": self.action[live], "pending.probs": self.probs[live],
            "pending.label": self.label[live], "pending.decided_at": self.decided_at[live],
            "pending.partition": self.partition[live], "pending.reward": self.reward[live],
            "pending.n_feedback": self.n_feedback[live],
            "pending.feedback_ts": self.feedback_ts[live],
            "recent.closed_at": np.array([v[0] for v in self.recent.values()], dtype=np.float64),
            "recent.how": np.array([v[1] for v in self.recent.values()], dtype=np.int64),
        }
        # ids as UTF-8 bytes + offsets: numpy string dtypes would drop trailing NULs
        for name, ids in (("pending.ids", self.ids[live].tolist()), ("recent.ids", list(self.recent))):
            arrays[f"{name}.utf8"], arrays[f"{name}.ends"] = pack_strings(ids)
        arrays.update({f"pending.x.{k}": v for k, v in self.rows.export(live).items()})
        meta = {"early": [vars(fb) for fb in self.early.values()], "shed_total": self.shed_total}
        return arrays, meta

    @classmethod
    def restore(cls, n_actions: int, n_features: int, settings: JoinSettings,
                arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> PendingJoins:
        """Rebuild a store from :meth:`export` output; raise StateError if it does not fit."""
        store = cls(n_actions, n_features, settings)
        try:
            ids = _stored_ids(arrays, "pending.ids")
            X = RowStore.imported({k[len("pending.x."):]: v for k, v in arrays.items()
                                   if k.startswith("pending.x.")}, n_features)
            store.add_decisions(ids, X, arrays["pending.action"], arrays["pending.probs"],
                                arrays["pending.label"], arrays["pending.decided_at"],
                                arrays["pending.partition"], now=-np.inf)
            slots = np.array([store.slot_of[i] for i in ids], dtype=np.int64)
            store.reward[slots] = arrays["pending.reward"]
            store.n_feedback[slots] = arrays["pending.n_feedback"]
            store.feedback_ts[slots] = arrays["pending.feedback_ts"]
            store.recent = OrderedDict(zip(
                _stored_ids(arrays, "recent.ids"),
                zip(arrays["recent.closed_at"].tolist(), arrays["recent.how"].tolist(),
                    strict=True), strict=True))
            store.early = OrderedDict((fb["event_id"], EarlyFeedback(**fb)) for fb in meta["early"])
            store.shed_total = int(meta["shed_total"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"Pending joins in the checkpoint are invalid: {exc!r}") from exc
        return store


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


def _latest(now: float | Mapping[int, float]) -> float:
    if not isinstance(now, Mapping):
        return float(now)
    return max(now.values(), default=-np.inf)


def _aggregate(policy: str, old: float, new: float) -> float:
    return max(old, new) if policy == "max" else new if policy == "latest" else old

