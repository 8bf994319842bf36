"""The daemon's exact counters (checkpointed with the state they describe).

``applied_checksum`` is the sum (mod 2⁶⁴) of the key hashes of every event id
whose feedback was applied to the learner. Together with ``feedback["joined"]``
it lets a test prove, from the checkpoint alone, that each feedback on the
topic was applied exactly once (a lost id and a doubly applied one cannot
cancel out in both numbers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.learners.randomness import hash_keys

__all__ = ["Counters", "id_checksum", "tracker_arrays", "tracker_load"]

OUTCOMES = ("joined", "late", "expired", "unknown", "duplicate")


def id_checksum(ids: list[str]) -> int:
    """Sum mod 2⁶⁴ of the 64-bit hashes of ``ids`` (order-independent)."""
    if not ids:
        return 0
    with np.errstate(over="ignore"):
        return int(np.sum(hash_keys(list(ids)), dtype=np.uint64))


@dataclass
class Counters:
    """Counts since the very first start (restored from each checkpoint)."""

    messages: int = 0  # input messages consumed (both topics, valid or not)
    instances: int = 0  # instances decided
    instance_batches: int = 0  # micro-batches that decided at least one instance
    decisions: int = 0
    explored: int = 0
    learned: int = 0  # rows applied to the learner (joined + expired with default reward)
    shed: int = 0
    model_version: int = 0  # learner updates applied
    applied_checksum: int = 0
    feedback: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    feedback_types: dict[str, int] = field(default_factory=dict)  # type label → events accepted
    invalid: dict[str, dict[str, int]] = field(default_factory=dict)  # topic → reason → n
    reemitted: int = 0  # journaled decisions published again after a restart
    skipped_updates: int = 0  # feedback the learner refused (it would make the model non-finite)

    def count_invalid(self, topic: str, reason: str) -> None:
        per_topic = self.invalid.setdefault(topic, {})
        per_topic[reason] = per_topic.get(reason, 0) + 1

    def record_closed(self, ids: list[str], joined: np.ndarray, expired: np.ndarray,
                      learn: np.ndarray, shed: int) -> None:
        self.feedback["joined"] += int(joined.sum())
        self.feedback["expired"] += int(expired.sum())
        self.learned += int(learn.sum())
        self.shed += shed
        applied = [ids[i] for i in np.flatnonzero(joined & learn)]
        self.applied_checksum = (self.applied_checksum + id_checksum(applied)) % (1 << 64)

    def to_json(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["applied_checksum"] = str(self.applied_checksum)  # JSON numbers are not uint64-safe
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counters:
        """Counters saved by :meth:`to_json` (older checkpoints kept the join clocks here too:
        the join reads those itself)."""
        data = {k: v for k, v in data.items() if k != "clocks"}
        data["applied_checksum"] = int(data["applied_checksum"])
        return cls(**data)


def tracker_arrays(tracker: OnlineErrorTracker) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The error tracker's state as arrays + JSON scalars."""
    scalars = {k: v for k, v in vars(tracker).items() if not isinstance(v, np.ndarray)}
    arrays = {f"tracker.{k}": np.array(v) for k, v in vars(tracker).items()
              if isinstance(v, np.ndarray)}
    return arrays, scalars


def tracker_load(tracker: OnlineErrorTracker, arrays: dict[str, np.ndarray],
                 scalars: dict[str, Any]) -> None:
    for key, value in scalars.items():
        setattr(tracker, key, value)
    for key, value in arrays.items():
        if key.startswith("tracker."):
            setattr(tracker, key[len("tracker."):], np.array(value))
