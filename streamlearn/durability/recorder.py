"""The owner of the experience log: closed decisions in, the log's position out.

:class:`ExperienceRecorder` wraps the :class:`~streamlearn.durability.experience.ExperienceLog`
(the format) for the serving loop: it recovers the log to a checkpoint's position
(:meth:`~ExperienceRecorder.open`), appends the learned rows of every closed batch
(:meth:`~ExperienceRecorder.record`) and flushes the log for a checkpoint, whose
metadata records the position (:meth:`~ExperienceRecorder.position`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streamlearn.durability.experience import ExperienceLog
from streamlearn.features import take_rows
from streamlearn.join.pending import Closed

__all__ = ["ExperienceRecorder", "learned_part"]


def learned_part(a: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """``a`` (one value per row of a batch of ``n``) at the learned ``rows`` (``a`` itself
    when every row is learned)."""
    return a if len(rows) == n else a[rows]


class ExperienceRecorder:
    """The experience log of the serving loop (see the module doc)."""

    def __init__(self, log: ExperienceLog) -> None:
        self.log = log

    def open(self, position: dict[str, Any] | None, restored: bool) -> None:
        """Recover the log to the checkpoint's position.

        ``restored``: a checkpoint was restored (``position`` is its log position; one
        written before the log existed has none: the segments are kept)."""
        kept = self.log.segments() if self.log.directory.is_dir() else []
        next_segment = None if not restored else (
            int(position["next_segment"]) if position else max((s + 1 for s in kept), default=0))
        self.log.open(next_segment)

    def record(self, closed: Closed) -> np.ndarray:
        """Append the learned rows of a closed batch to the log; their indices in it."""
        rows = np.flatnonzero(closed.learn)
        if not len(rows):
            return rows
        n = len(closed)
        whole = len(rows) == n

        def pick(a: np.ndarray) -> np.ndarray:
            return learned_part(a, rows, n)

        served = closed.columns.get("served_by")
        gamma = closed.columns.get("gamma")
        baseline = closed.columns.get("baseline")
        self.log.append(closed.ids if whole else [closed.ids[i] for i in rows.tolist()],
                        closed.X if whole else take_rows(closed.X, rows), pick(closed.actions),
                        pick(closed.probs), pick(closed.rewards), pick(closed.labels),
                        pick(closed.model_version), pick(closed.decided_at),
                        None if served is None else pick(served),
                        None if gamma is None else pick(gamma),
                        None if baseline is None else pick(baseline))
        return rows

    def position(self) -> dict[str, Any]:
        """Flush the log; its position for the checkpoint's metadata."""
        self.log.flush()
        return {"next_segment": self.log.next_segment}
