"""The embedded transport: an in-process stand-in for Kafka *and* the ad server.

``streamlearn serve`` without a Kafka bootstrap uses :class:`EmbeddedTransport`.
It behaves like a one-partition Kafka (offsets, commit, seek, end offsets) and
simulates the caller on the other side of the topics:

* it publishes instance events from a dataset (SynNonSep by default: 9
  actions, 400 sparse binary features) at ``rate`` events per second, or,
  with ``rate=0``, a chunk whenever the unread backlog runs low — as fast as
  the loop consumes;
* it reads each decision the daemon produces and answers it with feedback
  ``{"id", "reward": 1[action == label], "ts"}`` after an exponential delay of
  mean ``delay_mean_s`` seconds, or never, with probability ``drop``.

Instance number ``n`` has id ``"e<n>"`` and is the message at offset ``n`` of
the instances topic; its features and label are a pure function of
``(seed, n)``. After a restart that seeks to a checkpoint's offset ``N`` the
stream therefore continues with event ``N`` — no id collides with a restored
pending join. Messages below the consumer's read position (and below the last
commit) are discarded, so memory stays bounded on a long run.

>>> t = EmbeddedTransport(chunk=4, delay_mean_s=0.0, seed=3)
>>> batch = t.poll(10, 0.0)
>>> [m.offset for m in batch], sorted(orjson.loads(batch[0].value))
([0, 1, 2, 3], ['id', 'label', 'ts', 'x'])
>>> t.produce("streamlearn.decisions", b"e0", orjson.dumps({"id": "e0", "action": 2}))
>>> [orjson.loads(m.value)["id"] for m in t.poll(10, 0.0) if m.topic == t.feedback_topic]
['e0']
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson

from streamlearn.errors import ConfigError, TransportError
from streamlearn.features import SparseBatch
from streamlearn.stream.transport import Message, Offsets, check_offsets, produce_each

__all__ = ["EmbeddedTransport", "SimulatorStats", "StreamSource", "encode_instances"]

LABEL_RING = 1 << 20  # labels kept for decisions this many instances behind the newest
KEEP_OUTPUTS = 1000  # last decisions / dead letters kept for inspection


class StreamSource:
    """Instance ``n`` → (features, label), a pure function of ``(seed, n)``.

    ``synsep`` / ``synnonsep`` are generated block by block (infinite stream);
    any other name is loaded with ``streamlearn.datasets.load_dataset`` and
    cycled through, each pass in a fresh seeded permutation.
    """

    def __init__(self, dataset: str = "synnonsep", data_dir: str | None = None, seed: int = 1,
                 block: int = 4096) -> None:
        self.dataset, self.seed, self.block = dataset.lower(), seed, block
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if self.dataset in ("synsep", "synnonsep"):
            from streamlearn.datasets.synthetic import N_CLASSES, N_FEATURES

            self.n_classes, self.n_features = N_CLASSES, N_FEATURES
            self._rows = 0
        else:
            from streamlearn.datasets import load_dataset

            data = load_dataset(self.dataset, data_dir)
            X = data.X.to_dense() if isinstance(data.X, SparseBatch) else np.asarray(data.X)
            self._X, self._y = np.asarray(X, dtype=np.float64), np.asarray(data.y)
            self.n_classes, self.n_features = int(data.n_classes), int(data.n_features)
            self._rows = len(self._y)

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
                    perm = np.random.default_rng([self.seed, int(epoch)]).permutation(self._rows)
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
        return np.concatenate(parts_X), np.concatenate(parts_y)


def encode_instances(start: int, X: np.ndarray, y: np.ndarray, now: float,
                     prefix: str = "e") -> list[tuple[bytes, bytes]]:
    """(key, JSON value) per row, ids ``<prefix><n>``; sparse ``{"idx", "val"}`` under 30 % dense."""
    sparse = np.count_nonzero(X) < 0.3 * X.size
    out = []
    for i in range(len(y)):
        row = X[i]
        if sparse:
            idx = np.flatnonzero(row)
            x: object = {"idx": idx.tolist(), "val": row[idx].astype(float).tolist()}
        else:
            x = row.astype(float).tolist()
        event_id = f"{prefix}{start + i}"
        out.append((event_id.encode(),
                    orjson.dumps({"id": event_id, "ts": now, "x": x, "label": int(y[i])})))
    return out


@dataclass
class SimulatorStats:
    """What the simulated caller did (read by ``serve`` for its progress line)."""

    instances_sent: int = 0
    decisions_received: int = 0
    feedback_sent: int = 0
    dropped: int = 0
    rewards_sent: float = 0.0
    unparsable_decisions: int = 0
    recent_decisions: deque[bytes] = field(default_factory=lambda: deque(maxlen=KEEP_OUTPUTS))
    dead_letters: deque[bytes] = field(default_factory=lambda: deque(maxlen=KEEP_OUTPUTS))


class _Log:
    """One partition: messages from ``base`` on (older ones discarded)."""

    def __init__(self, topic: str) -> None:
        self.topic, self.base, self.messages = topic, 0, deque[Message]()

    @property
    def end(self) -> int:
        return self.base + len(self.messages)

    def append(self, key: bytes | None, value: bytes, now: float) -> None:
        self.messages.append(Message(self.topic, 0, self.end, key, value, int(now * 1000)))

    def read(self, start: int, count: int) -> list[Message]:
        first = max(start - self.base, 0)
        return [self.messages[i] for i in range(first, min(first + count, len(self.messages)))]

    def trim(self, below: int) -> None:
        while self.messages and self.base < below:
            self.messages.popleft()
            self.base += 1


class EmbeddedTransport:
    """A one-partition in-process transport whose other end is a simulated caller.

    Parameters
    ----------
    instances_topic, feedback_topic, decisions_topic, dead_letter_topic : str
        Topic names (as in the Kafka configuration).
    dataset, data_dir : str
        What the simulated caller streams (see :class:`StreamSource`).
    rate : float
        Instances per second; 0 = a chunk whenever the backlog is below one chunk.
    chunk : int
        Instances produced per step.
    delay_mean_s : float
        Mean of the exponential feedback delay (0 = answered on the next poll).
    drop : float
        Probability that a decision is never answered.
    seed : int
        Seeds the stream, the delays and the drops.
    max_instances : int, optional
        Stop publishing instances after this many (feedback still flows).
    clock : callable
        Wall clock in seconds (injectable for tests).
    """

    def __init__(self, instances_topic: str = "streamlearn.instances",
                 feedback_topic: str = "streamlearn.feedback",
                 decisions_topic: str = "streamlearn.decisions",
                 dead_letter_topic: str = "streamlearn.dead-letter",
                 dataset: str = "synnonsep", data_dir: str | None = None, rate: float = 0.0,
                 chunk: int = 256, delay_mean_s: float = 0.2, drop: float = 0.0, seed: int = 1,
                 max_instances: int | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if rate < 0 or chunk < 1 or delay_mean_s < 0 or not 0 <= drop <= 1:
            raise ConfigError(f"EmbeddedTransport expects rate >= 0, chunk >= 1, delay_mean_s >= "
                              f"0, 0 <= drop <= 1. Got {rate}, {chunk}, {delay_mean_s}, {drop}.")
        self.instances_topic, self.feedback_topic = instances_topic, feedback_topic
        self.decisions_topic, self.dead_letter_topic = decisions_topic, dead_letter_topic
        self.source = StreamSource(dataset, data_dir, seed)
        self.rate, self.chunk, self.delay_mean_s, self.drop = rate, chunk, delay_mean_s, drop
        self.max_instances = max_instances
        self.stats = SimulatorStats()
        self._clock = clock
        self._rng = np.random.default_rng([seed, 2])
        self._logs = {instances_topic: _Log(instances_topic), feedback_topic: _Log(feedback_topic)}
        self._assigned = {(instances_topic, 0), (feedback_topic, 0)}
        self._positions: Offsets = dict.fromkeys(self._assigned, 0)
        self._committed: Offsets = {}
        self._labels = np.full(LABEL_RING, -1, dtype=np.int64)
        self._due = np.empty(0)  # scheduled feedback: due time, instance number, reward
        self._due_n = np.empty(0, dtype=np.int64)
        self._due_reward = np.empty(0)
        self._started = float(self._clock())
        self._rate_sent = 0
        self._lock = threading.RLock()
        self._closed = False
        self._next_turn = 0

    @property
    def n_actions(self) -> int:
        return self.source.n_classes

    @property
    def n_features(self) -> int:
        return self.source.n_features

    # ------------------------------------------------------------ simulation
    def _publish_instances(self, now: float) -> None:
        log = self._logs[self.instances_topic]
        if self.rate > 0:
            owed = int((now - self._started) * self.rate) - self._rate_sent
            count = min(owed, 10 * self.chunk)
        else:
            backlog = log.end - self._positions[(self.instances_topic, 0)]
            count = self.chunk if backlog < self.chunk else 0
        if self.max_instances is not None:
            count = min(count, self.max_instances - self.stats.instances_sent)
        if count <= 0:
            return
        start = log.end
        X, y = self.source.take(start, count)
        self._labels[np.arange(start, start + count) % LABEL_RING] = y
        for key, value in encode_instances(start, X, y, now):
            log.append(key, value, now)
        self.stats.instances_sent += count
        self._rate_sent += count

    def _publish_feedback(self, now: float) -> None:
        ready = self._due <= now
        if not ready.any():
            return
        log = self._logs[self.feedback_topic]
        for n, reward in zip(self._due_n[ready].tolist(), self._due_reward[ready].tolist(),
                             strict=True):
            key = f"e{n}".encode()
            log.append(key, orjson.dumps({"id": key.decode(), "reward": reward, "ts": now}), now)
        self.stats.feedback_sent += int(ready.sum())
        self.stats.rewards_sent += float(self._due_reward[ready].sum())
        keep = ~ready
        self._due, self._due_n, self._due_reward = (
            self._due[keep], self._due_n[keep], self._due_reward[keep])

    def _answer(self, value: bytes, now: float) -> None:
        """Schedule the feedback of one decision (or drop it)."""
        self.stats.decisions_received += 1
        self.stats.recent_decisions.append(value)
        try:
            decision = orjson.loads(value)
            n, action = int(decision["id"][1:]), int(decision["action"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            self.stats.unparsable_decisions += 1
            return
        end = self._logs[self.instances_topic].end
        label = self._labels[n % LABEL_RING] if end - LABEL_RING <= n < end and n >= 0 else -1
        if label < 0 or self._rng.random() < self.drop:
            self.stats.dropped += 1
            return
        delay = self._rng.exponential(self.delay_mean_s) if self.delay_mean_s > 0 else 0.0
        self._due = np.append(self._due, now + delay)
        self._due_n = np.append(self._due_n, n)
        self._due_reward = np.append(self._due_reward, float(action == label))

    # ------------------------------------------------------------- Transport
    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("the embedded transport is closed")

    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        """Advance the simulation, then return up to ``max_records`` input messages."""
        self._check_open()
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            with self._lock:
                now = float(self._clock())
                self._publish_feedback(now)
                self._publish_instances(now)
                taken = self._take(max_records)
            if taken or time.monotonic() >= deadline:
                return taken
            time.sleep(min(0.002, max(deadline - time.monotonic(), 0.0)))

    def _take(self, max_records: int) -> list[Message]:
        topics = [self.feedback_topic, self.instances_topic]
        if self._next_turn:
            topics.reverse()
        self._next_turn ^= 1
        taken: list[Message] = []
        for topic in topics:
            tp = (topic, 0)
            batch = self._logs[topic].read(self._positions[tp], max_records - len(taken))
            if batch:
                taken.extend(batch)
                self._positions[tp] = batch[-1].offset + 1
                self._logs[topic].trim(min(self._positions[tp], self._committed.get(tp, 1 << 62)))
        return taken

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Decisions are answered by the simulated caller; dead letters are kept (bounded)."""
        self._check_open()
        with self._lock:
            if topic == self.decisions_topic:
                self._answer(value, float(self._clock()))
            elif topic == self.dead_letter_topic:
                self.stats.dead_letters.append(value)
            elif topic in self._logs:
                self._logs[topic].append(key, value, float(self._clock()))
            else:
                raise TransportError(f"the embedded transport has no topic {topic!r}")

    def produce_many(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        """Queue several messages in order (see ``Transport.produce_many``)."""
        produce_each(self.produce, topic, keys, values)

    def flush(self, timeout_s: float) -> None:
        """Every produce is applied at once; nothing is ever in flight."""
        self._check_open()

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self._check_open()
        check_offsets(offsets, self._assigned, "commit")
        with self._lock:
            self._committed.update(offsets)

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Set read positions; seeking past the end fast-forwards the stream to that offset."""
        self._check_open()
        check_offsets(offsets, self._assigned, "seek")
        with self._lock:
            for tp, offset in offsets.items():
                log = self._logs[tp[0]]
                if offset > log.end:
                    log.messages.clear()
                    log.base = offset
                    if tp[0] == self.instances_topic:  # the rate restarts from here
                        self._rate_sent = 0
                        self._started = float(self._clock())
                elif offset < log.base:
                    raise TransportError(f"cannot seek {tp[0]}[0] to {offset}: messages before "
                                         f"{log.base} were discarded")
                self._positions[tp] = offset

    def assignment(self) -> set[tuple[str, int]]:
        return set(self._assigned)

    def committed(self) -> Offsets:
        with self._lock:
            return dict(self._committed)

    def end_offsets(self) -> Offsets:
        with self._lock:
            return {(t, 0): log.end for t, log in self._logs.items()}

    def unread(self) -> dict[tuple[str, int], int | None]:
        with self._lock:
            return {(t, 0): max(0, log.end - self._positions[(t, 0)]) for t, log in self._logs.items()}

    def positions(self) -> Offsets:
        with self._lock:
            return dict(self._positions)

    def close(self) -> None:
        self._closed = True
