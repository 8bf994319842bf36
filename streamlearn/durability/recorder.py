"""The owner of the experience log: closed decisions in, the log's position out.

:class:`ExperienceRecorder` wraps the :class:`~streamlearn.durability.experience.ExperienceLog`
(the format) for the serving loop: it recovers the log to a checkpoint's position
(:meth:`~ExperienceRecorder.open`), appends the learned rows of every closed batch
(:meth:`~ExperienceRecorder.record`) and flushes the log for a checkpoint, whose
metadata records the position (:meth:`~ExperienceRecorder.position`).

In candidate mode the log holds only the *placed* candidates (they are what is learned),
and an unbiased estimate of another ranker needs every candidate of a request: its choice
depends on them all. So the recorder keeps a second log of the same format beside it, the
**request log** (``<experience dir>/requests``): at decision time, one row per candidate
of every request the retrain holds out (:meth:`~ExperienceRecorder.record_requests`; the
same id-hash rule as the retrain's split, ``retrain.holdout_fraction``, so it keeps only
the requests a ranker is judged on, never those it trains on) — id ``["<request>",
"<candidate>"]``, row ``[context, candidate]``, action its slot (−1 if not placed), ``probs``
its conditional slot propensity at that slot, ``gamma`` the learner's exploration at that
request and no reward (the experience log has it, under the same id). It is flushed and
recovered with the experience log: a restarted daemon re-decides (or reuses from its
journal) every request after the checkpoint, so it writes their rows again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streamlearn.candidates.sets import CandidateSets, gather_segments
from streamlearn.durability.experience import ExperienceLog
from streamlearn.engine.candidates import pair_id
from streamlearn.evaluation.policies import holdout_mask
from streamlearn.features import take_rows
from streamlearn.join.pending import Closed

__all__ = ["REQUESTS_DIR", "ExperienceRecorder", "learned_part"]

REQUESTS_DIR = "requests"  # the request log's directory, inside the experience log's


def learned_part(a: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """``a`` (one value per row of a batch of ``n``) at the learned ``rows`` (``a`` itself
    when every row is learned)."""
    return a if len(rows) == n else a[rows]


class ExperienceRecorder:
    """The experience log of the serving loop (see the module doc)."""

    def __init__(self, log: ExperienceLog, requests: ExperienceLog | None = None,
                 held_out: float = 1.0) -> None:
        self.log = log
        self.requests = requests  # candidate mode's request log (module doc)
        self.held_out = held_out  # the share of requests it keeps (by id hash)

    def open(self, position: dict[str, Any] | None, restored: bool) -> None:
        """Recover the logs to the checkpoint's position.

        ``restored``: a checkpoint was restored (``position`` is its log position; one
        written before a log existed has none for it: its segments are kept)."""
        for log, key in ((self.log, "next_segment"), (self.requests, "requests_next_segment")):
            if log is None:
                continue
            kept = log.segments() if log.directory.is_dir() else []
            next_segment = None if not restored else (
                int(position[key]) if position and key in position
                else max((s + 1 for s in kept), default=0))
            log.open(next_segment)

    def record_requests(self, request_ids: list[str], candidate_ids: list[str],
                        sets: CandidateSets, chosen: np.ndarray, slot_probs: np.ndarray,
                        gamma: np.ndarray, decided_at: np.ndarray, model_version: int,
                        width: int) -> None:
        """Append every candidate of the decided requests to the request log (module doc):
        ``chosen`` / ``slot_probs`` (B, k) the placed global rows and their conditional
        propensities, ``gamma`` (B,) the learner's exploration at each request (what a ranker
        deployed on it keeps); ``width`` the probs columns (the most slots)."""
        if self.requests is None or not len(request_ids):
            return
        keep = np.flatnonzero(holdout_mask(request_ids, self.held_out))
        if len(keep) < len(request_ids):  # only the held-out requests are ever judged on
            if not len(keep):
                return
            rows = gather_segments(sets.offsets, keep)[1]
            to_kept = np.full(len(sets.items) + 1, -1, dtype=np.int64)  # [-1] stays -1
            to_kept[rows] = np.arange(len(rows))
            request_ids = [request_ids[i] for i in keep.tolist()]
            candidate_ids = [candidate_ids[i] for i in rows.tolist()]
            chosen, gamma = to_kept[chosen[keep]], gamma[keep]
            slot_probs, decided_at, sets = slot_probs[keep], decided_at[keep], sets.take(keep)
        request_of = sets.request_of
        N = len(request_of)
        slot = np.full(N, -1, dtype=np.int64)
        probs = np.zeros((N, width))
        r, s = np.nonzero(chosen >= 0)
        slot[chosen[r, s]] = s
        probs[chosen[r, s], s] = slot_probs[r, s]
        ids = [pair_id(request_ids[q], c)
               for q, c in zip(request_of.tolist(), candidate_ids, strict=True)]
        self.requests.append(ids, np.hstack([sets.context[request_of], sets.items]), slot, probs,
                             np.full(N, np.nan), np.full(N, -1, np.int64),
                             np.full(N, model_version, np.int64), decided_at[request_of],
                             None, gamma[request_of])

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

    def flush(self) -> None:
        """Write what both logs buffer (a retrain is about to read them)."""
        self.log.flush()
        if self.requests is not None:
            self.requests.flush()

    def position(self) -> dict[str, Any]:
        """Flush the logs; their position for the checkpoint's metadata."""
        self.log.flush()
        if self.requests is None:
            return {"next_segment": self.log.next_segment}
        self.requests.flush()
        return {"next_segment": self.log.next_segment,
                "requests_next_segment": self.requests.next_segment}
