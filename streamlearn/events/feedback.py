"""Feedback values ``{"id", "reward" in [0, 1], "ts"?}`` → a :class:`FeedbackBatch` plus rejections."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

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
        value = msg.value
        if value is not None and len(value) <= limits.max_message_bytes:  # the common case
            try:
                parsed: Any = orjson.loads(value)
            except orjson.JSONDecodeError:
                parsed = None
            if type(parsed) is dict:
                fid: Any = parsed.get("id")
                frw: Any = parsed.get("reward")
                fts: Any = parsed.get("ts")
                if (type(fid) is str and 0 < len(fid) <= limits.max_id_length
                        and type(frw) in (int, float) and 0.0 <= frw <= 1.0
                        and (fts is None or (type(fts) in (int, float) and math.isfinite(fts)))):
                    ids.append(fid)
                    rewards.append(float(frw))
                    stamps.append(msg.timestamp_ms / 1000.0 if fts is None else float(fts))
                    kept.append(msg)
                    continue
        try:  # anything else: the full checks name what is wrong
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
