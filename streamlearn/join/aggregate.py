"""How the feedback events of one decision become the reward it is learned with.

Each feedback event brings a reward in [0, 1] and, optionally, a ``type`` (a click, a
conversion, a dwell time). Its *value* is the reward times its type's weight
(``reward_weights``; a type not listed, or no type, weighs 1). A decision's values, in
the order they arrived, are aggregated by the join's ``duplicate_policy``:

============  ====================================================================
``earliest``  the first value (the decision closes on it at once)
``latest``    the last value to arrive within the window
``max``       the largest value
``min``       the smallest value
``sum``       the sum of the values (added in arrival order)
``average``   their sum divided by their count
``median``    the middle value of the sorted values; the mean of the two middle
              ones for an even count
============  ====================================================================

The aggregate is **capped at 1**: the learners and the off-policy bounds need rewards in
[0, 1], and a sum or a weight can exceed it. The cap applies to the aggregate, not to each
value (a median of 0.8 and 1.6 is min(1.2, 1) = 1).

Per pending decision the join keeps an accumulator and a count (arrays: a batch of
feedback folds in with one numpy operation per policy, :func:`fold`). ``median`` alone
needs every value: :class:`MedianValues` keeps them, 8 bytes each, per slot and only while
the policy is ``median``.

>>> acc = fold("sum", np.array([0.0, 0.25]), np.array([True, False]), np.array([0.5, 0.5]))
>>> acc.tolist(), aggregate("average", acc, np.array([1, 2])).tolist()
([0.5, 0.75], [0.5, 0.375])
>>> median([0.2, 0.9, 0.4, 1.0]), capped(np.array([0.3, 1.7])).tolist()
(0.65, [0.3, 1.0])
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from streamlearn.events.raw import MAX_TYPE_LENGTH

__all__ = ["POLICIES", "TYPE_LABELS", "MedianValues", "aggregate", "capped", "fold", "median",
           "type_label", "type_weights", "weights_problem"]

POLICIES = ("earliest", "latest", "max", "sum", "average", "min", "median")

#: the ``type`` labels of feedback without a type, and with a type not in ``reward_weights``
#: (with the configured types, the whole label set of the per-type counts)
TYPE_LABELS = ("none", "other")


def fold(policy: str, acc: np.ndarray, first: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The accumulators of decisions after one more value each (``first``: the decision had
    none yet; its accumulator is then the value itself)."""
    if policy in ("sum", "average"):
        combined = acc + values
    elif policy == "max":
        combined = np.maximum(acc, values)
    elif policy == "min":
        combined = np.minimum(acc, values)
    elif policy == "latest":
        combined = values
    else:  # earliest (the first value stays) and median (values kept by MedianValues)
        combined = acc
    return np.where(first, values, combined)


def aggregate(policy: str, acc: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The uncapped aggregates of accumulators (every policy but ``median``)."""
    if policy == "average":
        return np.asarray(acc / np.maximum(counts, 1))
    return acc


def capped(rewards: np.ndarray) -> np.ndarray:
    """Aggregates as rewards in [0, 1] (values are >= 0: only the top needs a cap)."""
    return np.asarray(np.minimum(rewards, 1.0))


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN for none): the middle one, or the mean of the two
    middle ones."""
    n = len(values)
    if not n:
        return math.nan
    ordered = sorted(values)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class MedianValues:
    """Every value of the pending decisions that have feedback, by slot (median policy)."""

    def __init__(self) -> None:
        self._of: dict[int, array[float]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._of.values())

    def add(self, slots: np.ndarray, values: np.ndarray) -> None:
        """One more value for each of ``slots`` (distinct)."""
        of = self._of
        for slot, value in zip(slots.tolist(), values.tolist(), strict=True):
            kept = of.get(slot)
            if kept is None:
                of[slot] = array("d", (value,))
            else:
                kept.append(value)

    def pop_medians(self, slots: Iterable[int]) -> np.ndarray:
        """The median of each slot's values (NaN for a slot without any); forgets them."""
        pop = self._of.pop
        return np.array([median(pop(slot, ())) for slot in slots], dtype=np.float64)

    def export(self, slots: Iterable[int]) -> np.ndarray:
        """The values of ``slots``, one slot after another, in arrival order."""
        kept = [self._of.get(slot, array("d")) for slot in slots]
        return np.frombuffer(b"".join(v.tobytes() for v in kept), dtype=np.float64).copy()

    def load(self, slots: Sequence[int], flat: np.ndarray, counts: np.ndarray) -> None:
        """Values of :meth:`export`, ``counts[i]`` of them for ``slots[i]``."""
        ends = np.cumsum(counts)
        if len(flat) != (int(ends[-1]) if len(ends) else 0):
            raise ValueError(f"expected {int(ends[-1]) if len(ends) else 0} kept values (the "
                             f"pending decisions' feedback counts), got {len(flat)}")
        for slot, start, stop in zip(slots, (ends - counts).tolist(), ends.tolist(), strict=True):
            if stop > start:
                self._of[int(slot)] = array("d", flat[start:stop].tolist())


def type_weights(types: Sequence[str | None], weights: Mapping[str, float]) -> np.ndarray:
    """The weight of each event's type (1 for no type or a type not in ``weights``)."""
    get = weights.get
    return np.fromiter((1.0 if t is None else get(t, 1.0) for t in types), dtype=np.float64,
                       count=len(types))


def type_label(event_type: str | None, weights: Mapping[str, float]) -> str:
    """The ``type`` label an event is counted under: its type when configured, ``none``
    without one, ``other`` otherwise (a bounded label set)."""
    if event_type is None:
        return "none"
    return event_type if event_type in weights else "other"


def weights_problem(weights: Mapping[str, float]) -> str:
    """Why ``weights`` cannot be reward weights ('' when they can): each type a non-empty
    string of at most :data:`~streamlearn.events.raw.MAX_TYPE_LENGTH` characters, none of
    :data:`TYPE_LABELS`, each weight a finite number >= 0."""
    for name, weight in weights.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_TYPE_LENGTH:
            return (f"a type must be a string of 1 to {MAX_TYPE_LENGTH} characters, got "
                    f"{name!r:.80}")
        if name in TYPE_LABELS:
            what = "without a type" if name == "none" else "with a type not listed"
            return f"{name!r} is the label of feedback {what} and cannot be configured"
        if (isinstance(weight, bool) or not isinstance(weight, (int, float))
                or not math.isfinite(weight) or weight < 0):
            return f"the weight of {name!r} must be a finite number >= 0, got {weight!r:.40}"
    return ""
