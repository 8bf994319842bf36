"""Feedback values ``{"id", "reward" in [0, 1], "ts"?}`` → a :class:`FeedbackBatch` plus rejections."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamlearn.events.raw import (
    DEFAULT_LIMITS,
    DecodeLimits,
    RawMessage,
    Reject,
    Rejection,
    event_id_of,
    is_number,
    parse_object,
    timestamp_of,
)

__all__ = ["FeedbackBatch", "decode_feedback"]


@dataclass
class FeedbackBatch:
    """Accepted feedback of one micro-batch, in arrival order."""

    ids: list[str]
    rewards: np.ndarray  # float64 (B,) in [0, 1]
    ts: np.ndarray  # float64 (B,)
    messages: list[Any] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.ids)


def decode_feedback(
    messages: Sequence[RawMessage],
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> tuple[FeedbackBatch, list[Rejection]]:
    """Decode feedback values ``{"id", "reward" in [0, 1], "ts"?}``."""
    rejections: list[Rejection] = []
    ids: list[str] = []
    rewards: list[float] = []
    stamps: list[float] = []
    kept: list[RawMessage] = []
    for msg in messages:
        try:
            obj = parse_object(msg, limits)
            event_id = event_id_of(obj, limits)
            ts = timestamp_of(obj, msg, event_id)
            reward = obj.get("reward")
            if not (is_number(reward) and 0.0 <= reward <= 1.0):  # type: ignore[operator]
                raise Reject("bad_reward", f"expected 'reward' as a number in [0, 1], "
                                           f"got {reward!r:.40}", event_id)
            ids.append(event_id)
            rewards.append(float(reward))  # type: ignore[arg-type]
            stamps.append(ts)
            kept.append(msg)
        except Reject as err:
            rejections.append(err.of(msg))
    return FeedbackBatch(ids, np.array(rewards, dtype=np.float64),
                         np.array(stamps, dtype=np.float64), kept), rejections
