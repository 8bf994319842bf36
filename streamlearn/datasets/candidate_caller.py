"""The simulated caller for candidate-set streams (``ohsumed-candidates``, ``synthetic-candidates``).

The same part :class:`~streamlearn.datasets.caller.SimulatedCaller` plays for
fixed actions, with the same interface (``instances``, ``answer``, ``due``,
``skip_to``, ``stats``): request ``n`` (id ``<prefix><n>``) is request
``order[n mod len(order)]`` of a :class:`~streamlearn.datasets.candidates.CandidateStream`
(by default ``n mod B``), with its candidates (id and features) and ``slots``; a
decision is answered, after an exponential delay (or never, with probability
``drop``), with the realised reward of every candidate it placed:
``{"id": "e7", "rewards": {"<candidate id>": 1.0, ...}, "ts": ...}``.

>>> from streamlearn.datasets.candidates import synthetic_candidates
>>> caller = CandidateCaller(synthetic_candidates(10, d_x=2, d_c=3, seed=1), delay_mean_s=0.0)
>>> [(key, sorted(orjson.loads(value))) for key, value in caller.instances(1, now=0.0)]
[(b'e0', ['candidates', 'id', 'slots', 'ts', 'x'])]
>>> cid = caller.stream.candidate_ids[0]
>>> caller.answer([orjson.dumps({"id": "e0", "candidates": [{"id": cid, "prob": 1.0}]})], now=0.0)
>>> [sorted(orjson.loads(v)["rewards"]) == [cid] for _, v in caller.due(now=0.0)]
[True]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import orjson

from streamlearn.datasets.caller import (
    CallerStats,
    FeedbackQueue,
    SimulatedCaller,
    StreamSource,
    number_of,
    restored_numbers,
)
from streamlearn.datasets.candidates import CANDIDATE_STREAMS, CandidateStream, request_cycle
from streamlearn.datasets.catalogue import check_dataset_name
from streamlearn.events.raw import own_copy

__all__ = ["CandidateCaller", "make_caller"]

AWAIT_RING = 1 << 20  # requests this many behind the newest are forgotten


class CandidateCaller:
    """Publishes a candidate-set stream's requests and answers their decisions."""

    def __init__(self, stream: CandidateStream, prefix: str = "e", delay_mean_s: float = 0.2,
                 drop: float = 0.0, seed: int = 1, slots: int = 1,
                 order: np.ndarray | None = None) -> None:
        self.stream, self.prefix, self.slots = stream, prefix, int(slots)
        self.order = np.arange(len(stream)) if order is None else np.asarray(order, np.int64)
        self.delay_mean_s, self.drop = delay_mean_s, drop
        self.stats = CallerStats()
        self.next_instance = 0
        self._rng = np.random.default_rng([seed, 3])
        self._awaiting = np.zeros(AWAIT_RING, dtype=bool)
        self._queue = FeedbackQueue()

    @property
    def d_x(self) -> int:
        return int(self.stream.sets.context.shape[1])

    @property
    def d_c(self) -> int:
        return int(self.stream.sets.items.shape[1])

    @property
    def scheduled(self) -> int:
        """Feedback waiting for its time."""
        return len(self._queue)

    def skip_to(self, n: int) -> None:
        """Continue at request ``n`` (decisions of earlier requests are no longer answered)."""
        self.next_instance = n
        self._awaiting[:] = False

    def _request(self, n: int) -> int:
        return int(self.order[n % len(self.order)])

    def _rows(self, n: int) -> tuple[int, int]:
        r = self._request(n)
        offsets = self.stream.sets.offsets
        return int(offsets[r]), int(offsets[r + 1])

    def instances(self, count: int, now: float) -> list[tuple[bytes, bytes]]:
        """The next ``count`` requests as (key, value)."""
        out = []
        sets, cids = self.stream.sets, self.stream.candidate_ids
        for n in range(self.next_instance, self.next_instance + max(count, 0)):
            start, stop = self._rows(n)
            request: dict[str, object] = {
                "id": f"{self.prefix}{n}", "ts": now,
                "candidates": [{"id": cids[row], "x": sets.items[row].tolist()}
                               for row in range(start, stop)],
                "slots": min(self.slots, stop - start)}
            if self.d_x:
                request["x"] = sets.context[self._request(n)].tolist()
            out.append((request["id"].encode(), orjson.dumps(request)))  # type: ignore[attr-defined]
            self._awaiting[n % AWAIT_RING] = True
        self.next_instance += max(count, 0)
        self.stats.instances_sent += max(count, 0)
        return out

    def answer_restored(self, decisions: Sequence[bytes], now: float) -> None:
        """Answer decisions made before a restart that the restored daemon still awaits (its
        requests are behind this new caller's first: it awaits them now), as the caller of a
        real deployment would read them from its feedback topic."""
        for n in restored_numbers(decisions, self.prefix):
            if self.next_instance - AWAIT_RING <= n < self.next_instance:
                self._awaiting[n % AWAIT_RING] = True
        self.answer(decisions, now)

    def answer(self, values: Sequence[bytes | None], now: float) -> None:
        """Read decisions; schedule (or drop) the per-candidate rewards of each of ours: the
        message is ``{"rewards": {<placed candidate>: r, ...}}``, or ``{"reward": 0.0}`` when
        none of the placed candidates is one of the request's."""
        ids: list[str] = []
        fields: list[dict[str, object]] = []
        totals: list[float] = []
        all_rewards = self.stream.rewards
        for value in values:
            try:
                decision = orjson.loads(value or b"")
                event_id = str(decision["id"])
                placed = [str(c["id"]) for c in decision["candidates"]]
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                self.stats.unparsable_decisions += 1
                continue
            self.stats.recent_decisions.append(own_copy(value or b""))
            n = number_of(event_id, self.prefix)
            if not (0 <= n < self.next_instance and n >= self.next_instance - AWAIT_RING
                    and self._awaiting[n % AWAIT_RING]):
                self.stats.count_others(np.ones(1, dtype=bool), np.array([n]), self.next_instance)
                continue
            self._awaiting[n % AWAIT_RING] = False
            self.stats.decisions_received += 1
            start, stop = self._rows(n)
            reward_of = dict(zip(self.stream.candidate_ids[start:stop],
                                 all_rewards[start:stop].tolist(), strict=True))
            rewards = {c: reward_of[c] for c in placed if c in reward_of}
            ids.append(event_id)
            fields.append({"rewards": rewards} if rewards else {"reward": 0.0})
            totals.append(float(sum(rewards.values())))
        if ids:
            self._queue.schedule(now, ids, fields, np.array(totals),
                                 self._rng.random(len(ids)) < self.drop, self.delay_mean_s,
                                 self._rng, self.stats)

    def due(self, now: float) -> list[tuple[bytes, bytes]]:
        """The feedback messages whose time has come, as (key, value)."""
        return self._queue.due(now, self.stats)


def make_caller(dataset: str, data_dir: str | None, prefix: str, delay_mean_s: float,
                drop: float, seed: int, slots: int = 1, drift_at: int | None = None,
                fetch: bool = False) -> SimulatedCaller | CandidateCaller:
    """The simulated caller of a dataset: a :class:`CandidateCaller` for a candidate-set
    stream (:func:`~streamlearn.datasets.candidates.request_cycle`: OHSUMED in 20 shuffled
    passes, then cycled), else a :class:`~streamlearn.datasets.caller.SimulatedCaller`."""
    name = dataset.lower()
    check_dataset_name(dataset, ignore_case=True)
    if name in CANDIDATE_STREAMS:
        stream, order = request_cycle(name, seed, data_dir, fetch)
        return CandidateCaller(stream, prefix, delay_mean_s, drop, seed, slots, order)
    return SimulatedCaller(StreamSource(dataset, data_dir, seed, drift_at=drift_at, fetch=fetch),
                           prefix, delay_mean_s, drop, seed)
