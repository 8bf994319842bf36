"""Feedback for candidate-set requests → a :class:`CandidateFeedback` batch, plus rejections.

A request's feedback (docs/kafka.md, "Event shapes") is either one reward for the
request, ``{"id": "r1", "reward": 1.0}`` — every slot of the request gets it —
or a reward per placed candidate, ``{"id": "r1", "rewards": {"item-17": 1.0}}``
— slots whose candidate is not named get the join's default reward (0). Rewards
are numbers in [0, 1]; exactly one of ``reward`` and ``rewards`` is given, and
``rewards`` names at most :data:`MAX_NAMED` candidates. Anything else is a
``bad_reward`` rejection naming what is wrong. An event may carry a ``type``, as
fixed-action feedback does (:mod:`streamlearn.events.feedback`): the join weighs
each placed candidate's reward by it.

>>> from streamlearn.transport.protocol import Message
>>> values = [b'{"id": "r1", "rewards": {"a": 1.0}}', b'{"id": "r2", "reward": 0.5}',
...           b'{"id": "r3", "rewards": {"a": 2}}']
>>> batch, bad = decode_candidate_feedback([Message("fb", 0, i, None, v, 0)
...                                         for i, v in enumerate(values)])
>>> batch.ids, batch.rewards, [r.reason for r in bad]
(['r1', 'r2'], [{'a': 1.0}, 0.5], ['bad_reward'])
"""

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
    feedback_type_of,
    is_number,
    parse_object,
    shown,
    shown_id,
    timestamp_of,
)

__all__ = ["MAX_NAMED", "CandidateFeedback", "RewardSpec", "decode_candidate_feedback",
           "reward_spec"]

MAX_NAMED = 1000  # candidates one feedback event may name (the request's limit)

#: one reward for the request, or a reward per named candidate
RewardSpec = float | dict[str, float]


@dataclass
class CandidateFeedback:
    """Accepted feedback of one micro-batch, in arrival order."""

    ids: list[str]
    rewards: list[RewardSpec]
    ts: np.ndarray  # float64 (B,)
    messages: list[Any] = field(default_factory=list, repr=False)
    types: list[str | None] = field(default_factory=list)  # each event's type (None: none)

    def __len__(self) -> int:
        return len(self.ids)


def _reward(value: Any) -> bool:
    return is_number(value) and 0.0 <= value <= 1.0


def reward_spec(obj: dict[str, Any], event_id: str | None = None,
                limits: DecodeLimits = DEFAULT_LIMITS) -> RewardSpec:
    """The checked reward of a feedback object (a :class:`Reject` says what is wrong)."""
    has_one, has_many = "reward" in obj, "rewards" in obj
    if has_one == has_many:
        raise Reject("bad_reward", "expected exactly one of 'reward' (a number in [0, 1]) and "
                                   "'rewards' ({candidate id: number in [0, 1]}), got "
                                   f"{'both' if has_one else 'neither'}", event_id)
    if has_one:
        reward = obj["reward"]
        if not _reward(reward):
            raise Reject("bad_reward", f"expected 'reward' as a number in [0, 1], got "
                                       f"{shown(reward, 40)}", event_id)
        return float(reward)
    rewards = obj["rewards"]
    if not (isinstance(rewards, dict) and 0 < len(rewards) <= MAX_NAMED):
        raise Reject("bad_reward", f"expected 'rewards' as an object of 1 to {MAX_NAMED} "
                                   f"candidate ids, got {type(rewards).__name__} "
                                   f"{shown(rewards, 40)}", event_id)
    for cid, reward in rewards.items():
        if not 0 < len(cid) <= limits.max_id_length or not _reward(reward):
            raise Reject("bad_reward", f"expected 'rewards' to map candidate ids of 1 to "
                                       f"{limits.max_id_length} characters to numbers in [0, 1], "
                                       f"got {shown_id(cid)}: {shown(reward, 40)}", event_id)
    return {cid: float(r) for cid, r in rewards.items()}


def decode_candidate_feedback(
    messages: Sequence[RawMessage], limits: DecodeLimits = DEFAULT_LIMITS,
) -> tuple[CandidateFeedback, list[Rejection]]:
    """Decode candidate-set feedback values (module docstring)."""
    rejections: list[Rejection] = []
    batch = CandidateFeedback([], [], np.zeros(0))
    stamps: list[float] = []
    for msg in messages:
        try:
            obj = parse_object(msg, limits)
            event_id = event_id_of(obj, limits)
            ts = timestamp_of(obj, msg, event_id)
            spec = reward_spec(obj, event_id, limits)
            event_type = feedback_type_of(obj, event_id)
        except Reject as err:
            rejections.append(err.of(msg))
            continue
        batch.ids.append(event_id)
        batch.types.append(event_type)
        batch.rewards.append(spec)
        batch.messages.append(msg)
        stamps.append(ts)
    batch.ts = np.array(stamps, dtype=np.float64)
    return batch, rejections
