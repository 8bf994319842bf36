"""The decide → join → learn cores, shared by the daemon and the replays.

:mod:`~streamlearn.engine.fixed` (:class:`Engine`: a learner over a fixed set of actions)
and :mod:`~streamlearn.engine.candidates` (:class:`~streamlearn.engine.candidates.CandidateEngine`:
requests that carry their own candidates, and slates). Both work on arrays only — no
transport, no JSON, no metrics — and both are a :class:`DecisionCore`: what the serving
loop asks of a core besides deciding, which each mode does with its own batch shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from streamlearn.engine.fixed import (
    BASELINE,
    DECISION_COLUMNS,
    Decided,
    Engine,
    Learned,
    Mixture,
    Reused,
)
from streamlearn.join.pending import EarlyFeedback, PendingJoins

__all__ = ["BASELINE", "DECISION_COLUMNS", "Decided", "DecisionCore", "Engine", "Learned",
           "Mixture", "Reused"]


class DecisionCore(Protocol):
    """A learner and its pending joins: what the loop needs of either engine."""

    learner: Any
    joins: PendingJoins

    def is_known(self, ids: Sequence[str]) -> np.ndarray:
        """Per id: already pending, recently closed, or repeated earlier in ``ids``."""
        ...

    def feedback(self, ids: Sequence[Any], rewards: Any, ts: np.ndarray, partitions: np.ndarray,
                 wall: float, sources: Sequence[Any] | None = None,
                 types: Sequence[str | None] | None = None) -> np.ndarray:
        """Join a feedback batch; one :class:`~streamlearn.join.pending.Outcome` code per event;
        ``types`` (each event's ``type`` or None) weigh the rewards."""
        ...

    def advance(self, wall: float, idle: Iterable[tuple[str, int]] = (),
                awaited: Callable[[str], bool] | None = None) -> list[EarlyFeedback]:
        """Expire what is due; return held feedback whose decision never came (``awaited``:
        the ids whose decisions are known to be coming, whose feedback stays held)."""
        ...

    def learn(self) -> Learned:
        """Apply every decision closed since the last call with one update."""
        ...
