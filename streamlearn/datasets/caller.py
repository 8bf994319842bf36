"""The simulated caller: the application on the other side of the topics.

One implementation for the embedded default (:mod:`streamlearn.transport.embedded`),
``streamlearn simulate`` against Kafka and the tests. It is transport-free:

* :meth:`SimulatedCaller.instances` gives the next instance events of a
  dataset (id ``<prefix><n>``, features, and ``label`` for metrics only);
* :meth:`SimulatedCaller.answer` reads a batch of decisions and schedules, for
  each decision of one of its events, feedback ``{"id", "reward": 1[action ==
  label], "ts"}`` after an exponential delay of mean ``delay_mean_s`` — or
  none, with probability ``drop`` (or where ``dropped(n)`` says so);
* :meth:`SimulatedCaller.due` gives the feedback whose time has come.

Instance ``n``'s features and label are a pure function of ``(seed, n)``
(:class:`StreamSource`), so a stream can continue at any ``n`` after a restart.

>>> caller = SimulatedCaller(StreamSource("synnonsep", seed=3), delay_mean_s=0.0)
>>> [key for key, _ in caller.instances(2, now=0.0)]
[b'e0', b'e1']
>>> caller.answer([orjson.dumps({"id": "e0", "action": 1}), b"not json"], now=0.0)
>>> [orjson.loads(v)["id"] for _, v in caller.due(now=0.0)], caller.stats.unparsable_decisions
(['e0'], 1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from streamlearn.events.raw import own_copy
from streamlearn.features import SparseBatch

__all__ = ["CallerStats", "FeedbackQueue", "SimulatedCaller", "StreamSource", "encode_instances",
           "number_of", "restored_numbers"]

LABEL_RING = 1 << 20  # labels kept for decisions this many instances behind the newest
KEEP_OUTPUTS = 1000  # last decisions / dead letters kept for inspection


class StreamSource:
    """Instance ``n`` → (features, label), a pure function of ``(seed, n)``.

    ``synsep`` / ``synnonsep`` are generated block by block (infinite stream);
    any other name is loaded with ``streamlearn.datasets.load_dataset`` (``fetch``: missing
    files are downloaded first) and cycled through, each pass in a fresh seeded permutation.
    """

    def __init__(self, dataset: str = "synnonsep", data_dir: str | None = None, seed: int = 1,
                 block: int = 4096, drift_at: int | None = None, fetch: bool = False) -> None:
        self.dataset, self.seed, self.block = dataset.lower(), seed, block
        self.drift_at = drift_at  # from this instance on, labels are permuted (concept drift)
        self.shuffle = True
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if self.dataset == "arrays":  # filled by from_arrays
            return
        if self.dataset in ("synsep", "synnonsep"):
            from streamlearn.datasets.synthetic import N_CLASSES, N_FEATURES

            self.n_classes, self.n_features = N_CLASSES, N_FEATURES
            self._rows = 0
        else:
            from streamlearn.datasets import load_dataset

            data = load_dataset(self.dataset, data_dir, fetch=fetch)
            X = data.X.to_dense() if isinstance(data.X, SparseBatch) else np.asarray(data.X)
            self._X, self._y = np.asarray(X, dtype=np.float64), np.asarray(data.y)
            self.n_classes, self.n_features = int(data.n_classes), int(data.n_features)
            self._rows = len(self._y)

    @classmethod
    def from_arrays(cls, X: np.ndarray, y: np.ndarray, n_classes: int) -> StreamSource:
        """Instance ``n`` is row ``n mod len(y)`` of the given arrays, in order (tests)."""
        source = cls("arrays", block=1024)
        source._X, source._y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64)
        source.n_classes, source.n_features = n_classes, int(source._X.shape[1])
        source._rows, source.shuffle = len(source._y), False
        return source

    def _block(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        if k not in self._cache:
            if len(self._cache) > 4:
                self._cache.pop(min(self._cache))
            if self._rows == 0:
                from streamlearn.datasets.synthetic import synthetic_stream

                noise = 0.0 if self.dataset == "synsep" else 0.05
                self._cache[k] = synthetic_stream(self.block, noise=noise,
                                                  seed=self.seed * 1_000_003 + k,
                                                  topic_seed=self.seed)
            else:
                start = k * self.block
                n = np.arange(start, start + self.block)
                epochs, pos = np.divmod(n, self._rows)
                rows = np.empty(self.block, dtype=np.int64)
                for epoch in np.unique(epochs):  # at most two passes per block
                    perm = (np.random.default_rng([self.seed, int(epoch)]).permutation(self._rows)
                            if self.shuffle else np.arange(self._rows))
                    sel = epochs == epoch
                    rows[sel] = perm[pos[sel]]
                self._cache[k] = (self._X[rows], self._y[rows])
        return self._cache[k]

    def take(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Features ``(count, d)`` and labels of instances ``start .. start + count - 1``."""
        parts_X, parts_y = [], []
        n = start
        while n < start + count:
            k, off = divmod(n, self.block)
            X, y = self._block(k)
            stop = min(self.block, off + start + count - n)
            parts_X.append(X[off:stop])
            parts_y.append(y[off:stop])
            n += stop - off
        y = np.concatenate(parts_y)
        if self.drift_at is not None and start + count > self.drift_at:
            drifted = np.arange(start, start + count) >= self.drift_at
            permutation = np.random.default_rng([self.seed, 7]).permutation(self.n_classes)
            y = np.where(drifted, permutation[y], y)
        return np.concatenate(parts_X), y


def encode_instances(start: int, X: np.ndarray, y: np.ndarray, now: float,
                     prefix: str = "e") -> list[tuple[bytes, bytes]]:
    """(key, JSON value) per row, ids ``<prefix><n>``; sparse ``{"idx", "val"}`` under 30 % dense.

    orjson writes the numpy slices itself (the same text as their lists, without building one
    Python number per feature).
    """
    labels = y.astype(np.int64).tolist()
    numpy = orjson.OPT_SERIALIZE_NUMPY
    out = []
    if np.count_nonzero(X) < 0.3 * X.size:  # the non-zeros of the whole block at once
        rows, cols = np.nonzero(X)
        idx = np.ascontiguousarray(cols, dtype=np.int64)
        val = np.ascontiguousarray(X[rows, cols], dtype=np.float64)
        cuts = np.searchsorted(rows, np.arange(len(y) + 1)).tolist()
        for i, label in enumerate(labels):
            a, b = cuts[i], cuts[i + 1]
            event_id = f"{prefix}{start + i}"
            out.append((event_id.encode(), orjson.dumps(
                {"id": event_id, "ts": now, "x": {"idx": idx[a:b], "val": val[a:b]},
                 "label": label}, option=numpy)))
        return out
    dense = np.ascontiguousarray(X, dtype=np.float64)
    for i, label in enumerate(labels):
        event_id = f"{prefix}{start + i}"
        out.append((event_id.encode(), orjson.dumps(
            {"id": event_id, "ts": now, "x": dense[i], "label": label}, option=numpy)))
    return out


@dataclass
class CallerStats:
    """What the simulated caller did."""

    instances_sent: int = 0
    decisions_received: int = 0
    foreign_decisions: int = 0  # decisions for ids this caller did not send
    repeated_decisions: int = 0  # copies of decisions for its own ids, answered already
    unparsable_decisions: int = 0
    feedback_sent: int = 0
    dropped: int = 0
    rewards_sent: float = 0.0
    recent_decisions: deque[bytes] = field(default_factory=lambda: deque(maxlen=KEEP_OUTPUTS))
    dead_letters: deque[bytes] = field(default_factory=lambda: deque(maxlen=KEEP_OUTPUTS))

    def count_others(self, others: np.ndarray, numbers: np.ndarray, sent: int) -> None:
        """Count the decisions ``others`` (a mask over ``numbers``, their instance numbers, −1
        for an id of another shape) that were not answered: a number below ``sent`` is a
        repeated copy of one of ours, any other foreign."""
        own = others & (numbers >= 0) & (numbers < sent)
        self.repeated_decisions += int(own.sum())
        self.foreign_decisions += int(others.sum()) - int(own.sum())


def number_of(event_id: str, prefix: str) -> int:
    """The instance number of ``<prefix><n>``, -1 for an id of another shape."""
    digits = event_id[len(prefix):]
    return int(digits) if event_id.startswith(prefix) and digits.isdigit() else -1


def restored_numbers(decisions: Sequence[bytes], prefix: str) -> list[int]:
    """The numbers of a caller's own requests among restored decision messages."""
    numbers = []
    for value in decisions:
        try:
            n = number_of(str(orjson.loads(value)["id"]), prefix)
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
        if n >= 0:
            numbers.append(n)
    return numbers


class FeedbackQueue:
    """Feedback a simulated caller has scheduled: each message's due time, event id, fields
    (``{"reward": r}``, ``{"rewards": {...}}``) and reward total, in scheduling order. One
    queue for both callers (fixed actions and candidate sets)."""

    def __init__(self) -> None:
        self._at = np.empty(0)
        self._reward = np.empty(0)
        self._ids: list[str] = []
        self._fields: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def due_at(self) -> np.ndarray:
        """Each scheduled message's due time (a copy)."""
        return self._at.copy()

    @property
    def scheduled_ids(self) -> list[str]:
        """Each scheduled message's event id, in scheduling order (a copy)."""
        return list(self._ids)

    def schedule(self, now: float, ids: list[str], fields: list[dict[str, Any]],
                 rewards: np.ndarray, dropped: np.ndarray, delay_mean_s: float,
                 rng: np.random.Generator, stats: CallerStats) -> None:
        """Schedule the messages not ``dropped``, each after an exponential delay of mean
        ``delay_mean_s`` (drawn in one call, in order)."""
        stats.dropped += int(dropped.sum())
        keep = np.flatnonzero(~dropped)
        delays = (rng.exponential(delay_mean_s, size=len(keep)) if delay_mean_s > 0
                  else np.zeros(len(keep)))
        self._at = np.concatenate([self._at, now + delays])
        self._reward = np.concatenate([self._reward, np.asarray(rewards, np.float64)[keep]])
        self._ids.extend(ids[i] for i in keep.tolist())
        self._fields.extend(fields[i] for i in keep.tolist())

    def due(self, now: float, stats: CallerStats) -> list[tuple[bytes, bytes]]:
        """The messages whose time has come, as (key, value), in scheduling order."""
        ready = self._at <= now
        if not ready.any():
            return []
        out = [(self._ids[i].encode(),
                orjson.dumps({"id": self._ids[i], **self._fields[i], "ts": now}))
               for i in np.flatnonzero(ready).tolist()]
        stats.feedback_sent += len(out)
        stats.rewards_sent += float(self._reward[ready].sum())
        later = np.flatnonzero(~ready).tolist()
        self._at, self._reward = self._at[~ready], self._reward[~ready]
        self._ids = [self._ids[i] for i in later]
        self._fields = [self._fields[i] for i in later]
        return out


class SimulatedCaller:
    """Publishes a dataset's instances, answers their decisions; see the module docstring."""

    def __init__(self, source: StreamSource, prefix: str = "e", delay_mean_s: float = 0.2,
                 drop: float = 0.0, seed: int = 1,
                 dropped: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        self.source, self.prefix = source, prefix
        self.delay_mean_s, self.drop, self.dropped = delay_mean_s, drop, dropped
        self.stats = CallerStats()
        self.next_instance = 0
        self._rng = np.random.default_rng([seed, 2])
        self._labels = np.full(LABEL_RING, -1, dtype=np.int64)
        # labels of decisions made before a restart that the restored daemon still awaits
        # (answer_restored): instance n's label is a pure function of (seed, n)
        self._restored: dict[int, int] = {}
        self._queue = FeedbackQueue()

    @property
    def scheduled(self) -> int:
        """Feedback waiting for its time."""
        return len(self._queue)

    def skip_to(self, n: int) -> None:
        """Continue the stream at instance ``n`` (earlier labels are forgotten)."""
        self.next_instance = n
        self._labels[:] = -1

    def instances(self, count: int, now: float) -> list[tuple[bytes, bytes]]:
        """The next ``count`` instance events as (key, value)."""
        if count <= 0:
            return []
        start = self.next_instance
        X, y = self.source.take(start, count)
        self._labels[np.arange(start, start + count) % LABEL_RING] = y
        self.next_instance += count
        self.stats.instances_sent += count
        return encode_instances(start, X, y, now, self.prefix)

    def remember(self, start: int, labels: np.ndarray) -> None:
        """Instances ``start ..`` were published by someone else (a test): answer their
        decisions with these labels."""
        labels = np.asarray(labels, dtype=np.int64)
        self._labels[np.arange(start, start + len(labels)) % LABEL_RING] = labels
        self.next_instance = max(self.next_instance, start + len(labels))

    def label_of(self, n: int) -> int:
        """The label of instance ``n`` (-1 when unknown: not sent, or too long ago)."""
        if n in self._restored:  # answered once
            return self._restored.pop(n)
        if 0 <= n < self.next_instance and n >= self.next_instance - LABEL_RING:
            return int(self._labels[n % LABEL_RING])
        return -1

    def answer_restored(self, decisions: Sequence[bytes], now: float) -> None:
        """Answer decisions made before a restart that the restored daemon still awaits, as
        the caller of a real deployment would: feedback read from its topic after the restart
        (a new process's caller never saw those decisions, and every one expired at the
        default reward, which counted against a ranker in rollout, an outside test)."""
        for n in restored_numbers(decisions, self.prefix):
            self._restored[n] = int(self.source.take(n, 1)[1][0])
        self.answer(decisions, now)

    def answer(self, values: Sequence[bytes | None], now: float) -> None:
        """Read a batch of decision messages; schedule (or drop) the feedback of each of ours."""
        numbers, actions = [], []
        for value in values:
            try:
                decision = orjson.loads(value or b"")
                event_id, action = str(decision["id"]), int(decision["action"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                self.stats.unparsable_decisions += 1
                continue
            self.stats.recent_decisions.append(own_copy(value or b""))
            numbers.append(number_of(event_id, self.prefix))
            actions.append(action)
        if not numbers:
            return
        n_arr, a_arr = np.array(numbers, dtype=np.int64), np.array(actions, dtype=np.int64)
        labels = np.array([self.label_of(n) for n in numbers], dtype=np.int64)
        first = np.zeros(len(n_arr), dtype=bool)
        first[np.unique(n_arr, return_index=True)[1]] = True
        ours = (labels >= 0) & first  # an id twice in one batch is answered once
        self.stats.count_others(~ours, n_arr, self.next_instance)
        self.stats.decisions_received += int(ours.sum())
        n_arr, a_arr, labels = n_arr[ours], a_arr[ours], labels[ours]
        self._labels[n_arr % LABEL_RING] = -1  # answered once: a repeated decision is foreign
        dropped = (self.dropped(n_arr) if self.dropped is not None
                   else self._rng.random(len(n_arr)) < self.drop)
        rewards = (a_arr == labels).astype(np.float64)
        self._queue.schedule(now, [f"{self.prefix}{n}" for n in n_arr.tolist()],
                             [{"reward": r} for r in rewards.tolist()], rewards,
                             np.asarray(dropped, dtype=bool), self.delay_mean_s, self._rng,
                             self.stats)

    def due(self, now: float) -> list[tuple[bytes, bytes]]:
        """The feedback messages whose time has come, as (key, value)."""
        return self._queue.due(now, self.stats)
