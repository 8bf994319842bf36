"""Joining delayed feedback to pending decisions: the join's state and its clocks.

:mod:`~streamlearn.join.pending` (:class:`PendingJoins`: the decisions waiting for
feedback, the feedback waiting for its decision, the recently closed ids),
:mod:`~streamlearn.join.clock` (event time per stream and partition),
:mod:`~streamlearn.join.recent` (the ids closed in the last window) and
:mod:`~streamlearn.join.rows` (the contexts of pending decisions). docs/daemon.md §3
gives the semantics.
"""

from __future__ import annotations

from streamlearn.join.pending import Closed, EarlyFeedback, JoinSettings, Outcome, PendingJoins

__all__ = ["Closed", "EarlyFeedback", "JoinSettings", "Outcome", "PendingJoins"]
