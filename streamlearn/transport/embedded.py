"""The embedded transport: an in-memory Kafka with the simulated caller on its other side.

``streamlearn serve`` without a Kafka bootstrap uses :class:`EmbeddedTransport`:
an :class:`~streamlearn.transport.memory.InMemoryTransport` (one partition, Kafka's
offset semantics: commit, seek, end offsets) whose instances and feedback are
written by a :class:`~streamlearn.datasets.caller.SimulatedCaller`:

* at every poll the caller publishes the feedback that is due and instance
  events of its dataset (SynNonSep by default: 9 actions, 400 sparse binary
  features) at ``rate`` events per second, or, with ``rate=0``, a chunk
  whenever the unread backlog runs low — as fast as the loop consumes;
* every decision the daemon produces goes to the caller, which schedules its
  feedback (exponential delay of mean ``delay_mean_s``, or none with
  probability ``drop``).

Instance number ``n`` has id ``"e<n>"`` and is the message at offset ``n`` of
the instances topic; its features and label are a pure function of
``(seed, n)``. After a restart that seeks to a checkpoint's offset ``N`` the
stream therefore continues with event ``N`` — no id collides with a restored
pending join. That seek is the only one the daemon makes, and it is made on a
new process's transport, whose topics start empty: so nothing consumed has to
stay in memory for it. Consumed messages are trimmed once committed, and the
uncommitted ones (all of them without checkpoints) are kept only up to
:data:`RETAIN_BYTES` behind the read position, for a seek back within the
process (as within a Kafka topic's retention; below it a seek is refused as
trimmed). Memory stays flat on a run of any length.

>>> import orjson
>>> t = EmbeddedTransport(chunk=4, delay_mean_s=0.0, seed=3)
>>> batch = t.poll(10, 0.0)
>>> [m.offset for m in batch], sorted(orjson.loads(batch[0].value))
([0, 1, 2, 3], ['id', 'label', 'ts', 'x'])
>>> t.produce("streamlearn.decisions", b"e0", orjson.dumps({"id": "e0", "action": 2}))
>>> [orjson.loads(m.value)["id"] for m in t.poll(10, 0.0) if m.topic == t.feedback_topic]
['e0']
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from streamlearn.datasets.caller import CallerStats, SimulatedCaller, StreamSource
from streamlearn.datasets.candidate_caller import CandidateCaller, make_caller
from streamlearn.errors import ConfigError, TransportError
from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport
from streamlearn.transport.protocol import Message, check_offsets

__all__ = ["CallerStats", "EmbeddedTransport", "StreamSource"]

#: Consumed but uncommitted messages kept per partition behind the read position, in bytes.
RETAIN_BYTES = 8 << 20


class EmbeddedTransport(InMemoryTransport):
    """A one-partition in-memory transport whose other end is a simulated caller.

    Parameters
    ----------
    instances_topic, feedback_topic, decisions_topic, dead_letter_topic : str
        Topic names (as in the Kafka configuration).
    dataset, data_dir : str
        What the simulated caller streams (see :class:`StreamSource`).
    fetch : bool
        Download missing files of a built-in dataset first (verified by sha256).
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
                 max_instances: int | None = None, drift_at: int | None = None,
                 clock: Callable[[], float] = time.time, slots: int = 1,
                 fetch: bool = False) -> None:
        if rate < 0 or chunk < 1 or delay_mean_s < 0 or not 0 <= drop <= 1:
            raise ConfigError(f"EmbeddedTransport expects rate >= 0, chunk >= 1, delay_mean_s >= "
                              f"0, 0 <= drop <= 1. Got {rate}, {chunk}, {delay_mean_s}, {drop}.")
        super().__init__(instances_topic, feedback_topic, decisions_topic, dead_letter_topic,
                         broker=InMemoryBroker(1))
        self.caller = make_caller(dataset, data_dir, "e", delay_mean_s, drop, seed, slots,
                                  drift_at, fetch)
        self.source = self.caller.source if isinstance(self.caller, SimulatedCaller) else None
        self.rate, self.chunk, self.max_instances = rate, chunk, max_instances
        self._clock = clock
        self._started = float(clock())
        self._rate_sent = 0

    @property
    def stats(self) -> CallerStats:
        return self.caller.stats

    @property
    def candidate_dims(self) -> tuple[int, int] | None:
        """(d_x, d_c) of a candidate-set dataset; None for a fixed-action one."""
        c = self.caller
        return (c.d_x, c.d_c) if isinstance(c, CandidateCaller) else None

    @property
    def n_actions(self) -> int:
        return 0 if self.source is None else int(self.source.n_classes)

    @property
    def n_features(self) -> int:
        return 0 if self.source is None else int(self.source.n_features)

    # ------------------------------------------------------------ simulation
    def _simulate(self, now: float) -> None:
        stamp = int(now * 1000)
        due = self.caller.due(now)
        self.broker.extend(self.feedback_topic, 0, [k for k, _ in due], [v for _, v in due], stamp)
        log = self.broker.log(self.instances_topic, 0)
        if self.rate > 0:
            count = min(int((now - self._started) * self.rate) - self._rate_sent, 10 * self.chunk)
        else:
            backlog = log.end - self._positions[(self.instances_topic, 0)]
            count = self.chunk if backlog < self.chunk else 0
        if self.max_instances is not None:
            count = min(count, self.max_instances - self.caller.stats.instances_sent)
        fresh = self.caller.instances(count, now)
        self.broker.extend(self.instances_topic, 0, [k for k, _ in fresh], [v for _, v in fresh],
                           stamp)
        self._rate_sent += max(count, 0)

    def _trim(self) -> None:
        """Forget consumed messages once committed, and uncommitted ones beyond
        :data:`RETAIN_BYTES` behind the read position (the module docstring says why)."""
        committed = self.committed()
        for tp in self._assigned:
            position, log = self._positions[tp], self.broker.log(*tp)
            kept_from = max(committed.get(tp, 0), log.offset_holding(position, RETAIN_BYTES))
            log.trim(min(position, kept_from))

    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        """Advance the simulation, then return up to ``max_records`` input messages."""
        self._check_open()
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            with self.broker.changed:
                self._simulate(float(self._clock()))
                taken = super().poll(max_records, 0.0)
                self._trim()
            if taken or time.monotonic() >= deadline:
                return taken
            time.sleep(min(0.002, max(deadline - time.monotonic(), 0.0)))

    def answer_restored(self, decisions: Sequence[bytes]) -> None:
        """The restored daemon still awaits these decisions (messages with their ids and
        actions or placed candidates), made before its restart: the caller answers them as if
        it had read them from the decisions topic."""
        with self.broker.changed:
            self.caller.answer_restored(decisions, float(self._clock()))

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Decisions are answered by the simulated caller; dead letters are kept (bounded)."""
        self.produce_many(topic, [key], [value])

    def produce_many(self, topic: str, keys: Sequence[bytes | None], values: Sequence[bytes]) -> None:
        self._check_open()
        if topic == self.decisions_topic:
            with self.broker.changed:
                self.caller.answer(values, float(self._clock()))
        elif topic == self.dead_letter_topic:
            self.caller.stats.dead_letters.extend(values)
        elif topic in (self.instances_topic, self.feedback_topic):
            for key, value in zip(keys, values, strict=True):
                super().produce(topic, key, value)
        else:
            raise TransportError(f"the embedded transport has no topic {topic!r}")

    def commit(self, offsets: Mapping[tuple[str, int], int], *, wait: bool = True) -> None:
        super().commit(offsets, wait=wait)
        with self.broker.changed:
            self._trim()

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Set read positions; seeking past the end fast-forwards the stream to that offset."""
        self._check_open()
        check_offsets(offsets, self.assignment(), "seek")
        with self.broker.changed:
            for (topic, partition), offset in offsets.items():
                log = self.broker.log(topic, partition)
                if offset > log.end:
                    log.skip_to(offset)
                    if topic == self.instances_topic:  # the stream (and the rate) go on from here
                        self.caller.skip_to(offset)
                        self._rate_sent = 0
                        self._started = float(self._clock())
            super().seek(offsets)
