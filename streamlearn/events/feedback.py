"""Feedback values ``{"id", "reward" in [0, 1], "ts"?, "type"?}`` → a :class:`FeedbackBatch`
plus rejections.

``type`` names what the feedback is (``"click"``, ``"conversion"``): a string of 1 to
:data:`~streamlearn.events.raw.MAX_TYPE_LENGTH` characters, or absent (``null`` counts as
absent); the join weighs each reward by its type (``join.reward_weights``).

>>> from streamlearn.events.raw import Message
>>> values = [b'{"id": "a", "reward": 1, "type": "click"}', b'{"id": "a", "reward": 0.5}',
...           b'{"id": "a", "reward": 1, "type": 7}']
>>> batch, bad = decode_feedback([Message("fb", 0, i, None, v, 0) for i, v in enumerate(values)])
>>> batch.types, [(r.reason, r.detail) for r in bad]
(['click', None], [('bad_feedback_type', "expected 'type' as a string of 1 to 64 characters, got int 7")])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from streamlearn.events.raw import (
    DEFAULT_LIMITS,
    MAX_TYPE_LENGTH,
    DecodeLimits,
    RawMessage,
    Reject,
    Rejection,
    depth_exceeds,
    event_id_of,
    feedback_type_of,
    is_number,
    parse_object,
    shown,
    timestamp_of,
)

__all__ = ["FeedbackBatch", "decode_feedback"]

_PLAIN_KEYS = frozenset({"id", "reward", "ts", "type"})


@dataclass
class FeedbackBatch:
    """Accepted feedback of one micro-batch, in arrival order."""

    ids: list[str]
    rewards: np.ndarray  # float64 (B,) in [0, 1]
    ts: np.ndarray  # float64 (B,)
    messages: list[Any] = field(default_factory=list, repr=False)
    types: list[str | None] = field(default_factory=list)  # each event's type (None: none)

    def __len__(self) -> int:
        return len(self.ids)


def decode_feedback(
    messages: Sequence[RawMessage],
    limits: DecodeLimits = DEFAULT_LIMITS,
) -> tuple[FeedbackBatch, list[Rejection]]:
    """Decode feedback values ``{"id", "reward" in [0, 1], "ts"?, "type"?}``."""
    rejections: list[Rejection] = []
    ids: list[str] = []
    rewards: list[float] = []
    stamps: list[float] = []
    types: list[str | None] = []
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
                ftype: Any = parsed.get("type")
                # only the keys above hold scalars (one level); another key's value may nest
                # deeper than the limit, which the full checks refuse (nesting_too_deep)
                if ((parsed.keys() <= _PLAIN_KEYS or not depth_exceeds(value, limits.max_depth))
                        and type(fid) is str and 0 < len(fid) <= limits.max_id_length
                        and type(frw) in (int, float) and 0.0 <= frw <= 1.0
                        and (fts is None or (type(fts) in (int, float) and math.isfinite(fts)))
                        and (ftype is None or (type(ftype) is str
                                               and 0 < len(ftype) <= MAX_TYPE_LENGTH))):
                    ids.append(fid)
                    rewards.append(float(frw))
                    stamps.append(msg.timestamp_ms / 1000.0 if fts is None else float(fts))
                    types.append(ftype)
                    kept.append(msg)
                    continue
        try:  # anything else: the full checks name what is wrong
            obj = parse_object(msg, limits)
            event_id = event_id_of(obj, limits)
            ts = timestamp_of(obj, msg, event_id)
            reward = obj.get("reward")
            if not (is_number(reward) and 0.0 <= reward <= 1.0):  # type: ignore[operator]
                raise Reject("bad_reward", f"expected 'reward' as a number in [0, 1], "
                                           f"got {shown(reward, 40)}", event_id)
            event_type = feedback_type_of(obj, event_id)
            ids.append(event_id)
            rewards.append(float(reward))  # type: ignore[arg-type]
            stamps.append(ts)
            types.append(event_type)
            kept.append(msg)
        except Reject as err:
            rejections.append(err.of(msg))
    return FeedbackBatch(ids, np.array(rewards, dtype=np.float64),
                         np.array(stamps, dtype=np.float64), kept, types), rejections
