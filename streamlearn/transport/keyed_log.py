"""One partition of a compacted, keyed log written by one fenced writer: a changelog's storage.

:class:`KeyedLog` is what :mod:`streamlearn.durability.changelog` needs from Kafka:

* **one writer at a time.** Opening a log for ``(topic, partition)`` fences the
  previous writer of that partition: from then on every write of the old one fails
  with :class:`Fenced`, whatever it believes. On Kafka this is a transactional
  producer whose ``transactional.id`` names the partition: ``init_transactions``
  bumps the producer epoch, the broker refuses the old epoch, and the old writer's
  open transaction is aborted.
* **writes in transactions.** :meth:`KeyedLog.send` queues a record in the open
  transaction, :meth:`KeyedLog.send_and_wait` also waits until the broker has it
  (it is in the log, not yet committed), :meth:`KeyedLog.commit` commits the
  transaction and opens the next one.
* **reads of everything in the log**, committed or not (``read_uncommitted``):
  a writer that was killed leaves its last transaction aborted, and the records in
  it (the decisions it journaled and may have published) are still what the next
  owner must know. Reading starts after the open has fenced the previous writer,
  so nothing is written behind the reader's back.
* **compaction** (``cleanup.policy=compact``) keeps the newest record per key and
  drops keys whose newest record is a tombstone (value ``None``).

:class:`MemoryKeyedLog` is the same contract in memory, for tests (with
:meth:`MemoryKeyedLogs.compact` to play the log cleaner), :class:`KafkaKeyedLog`
the Kafka one (kafka-python, whichever client serves the input).

>>> logs = MemoryKeyedLogs()
>>> old = logs.open("changelog", 0)
>>> old.send_and_wait(b"k", b"v1")
0
>>> new = logs.open("changelog", 0)  # fences the old writer
>>> try:
...     old.send(b"k", b"zombie")
... except Fenced as exc:
...     print("fenced")
fenced
>>> [(offset, key, value) for offset, key, value in new.records()]
[(0, b'k', b'v1')]
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from streamlearn.errors import StreamlearnError, TransportError

__all__ = ["CHANGELOG_TOPIC_CONFIGS", "Fenced", "KafkaKeyedLog", "KeyedLog", "MemoryKeyedLog",
           "MemoryKeyedLogs", "Record"]

log = logging.getLogger("streamlearn.changelog")

Record = tuple[int, bytes, bytes | None]
"""(offset, key, value); value ``None`` is a tombstone."""

#: Topic settings of a changelog topic created by streamlearn: compacted, segments small and
#: young enough that the cleaner gets to them within minutes (the active segment is never
#: cleaned), and records up to 2 MB (a chunk is at most 256 KiB, a manifest a few hundred KiB).
CHANGELOG_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": str(16 * 2**20),
    "segment.ms": str(5 * 60_000),
    "min.cleanable.dirty.ratio": "0.2",
    "max.message.bytes": str(2 * 2**20),
}


class Fenced(StreamlearnError):
    """Another writer opened this log partition: this one may write nothing more to it (not a
    TransportError: retrying cannot help, the partition is another replica's now)."""


class KeyedLog(Protocol):
    """One partition of a compacted log, written in transactions by a fenced writer."""

    def send(self, key: bytes, value: bytes | None) -> None:
        """Queue a record (``None``: a tombstone) in the open transaction."""

    def send_and_wait(self, key: bytes, value: bytes | None) -> int:
        """Write a record and wait until the broker has it; its offset."""

    def commit(self) -> None:
        """Commit the open transaction (every record sent is in the log) and open the next."""

    def records(self, start: int = 0) -> Iterator[Record]:
        """Every record from offset ``start`` to the end of the log as of this call."""

    def close(self) -> None:
        """Abort nothing, commit nothing: the next writer's open aborts an open transaction."""


# --------------------------------------------------------------------------- memory
class MemoryKeyedLogs:
    """The topics of an in-memory "broker" for :class:`MemoryKeyedLog` writers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.partitions: dict[tuple[str, int], list[Record]] = {}
        self.epochs: dict[tuple[str, int], int] = {}

    def open(self, topic: str, partition: int) -> MemoryKeyedLog:
        """The writer of ``topic[partition]``; every earlier writer is fenced."""
        with self.lock:
            where = (topic, partition)
            self.epochs[where] = self.epochs.get(where, 0) + 1
            self.partitions.setdefault(where, [])
            return MemoryKeyedLog(self, where, self.epochs[where])

    def compact(self, topic: str, partition: int) -> None:
        """What the log cleaner does: keep the newest record per key, drop tombstoned keys
        (offsets are kept)."""
        with self.lock:
            records = self.partitions[(topic, partition)]
            newest = {key: offset for offset, key, _ in records}
            self.partitions[(topic, partition)] = [
                r for r in records if newest[r[1]] == r[0] and r[2] is not None]


class MemoryKeyedLog:
    """A :class:`KeyedLog` in memory (every record is in the log as soon as it is sent)."""

    def __init__(self, logs: MemoryKeyedLogs, where: tuple[str, int], epoch: int) -> None:
        self.logs, self.where, self.epoch = logs, where, epoch
        self.commits = 0

    def _check(self) -> None:
        if self.logs.epochs[self.where] != self.epoch:
            raise Fenced(f"{self.where[0]}[{self.where[1]}]: another writer opened this "
                         "changelog partition")

    def send(self, key: bytes, value: bytes | None) -> None:
        self.send_and_wait(key, value)

    def send_and_wait(self, key: bytes, value: bytes | None) -> int:
        with self.logs.lock:
            self._check()
            records = self.logs.partitions[self.where]
            offset = records[-1][0] + 1 if records else 0
            records.append((offset, key, value))
            return offset

    def commit(self) -> None:
        with self.logs.lock:
            self._check()
        self.commits += 1

    def records(self, start: int = 0) -> Iterator[Record]:
        with self.logs.lock:
            records = list(self.logs.partitions[self.where])
        return (r for r in records if r[0] >= start)

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------- Kafka
def _fenced(exc: BaseException) -> bool:
    names = {type(exc).__name__, type(getattr(exc, "__cause__", None)).__name__}
    return bool(names & {"ProducerFencedError", "InvalidProducerEpochError"}) \
        or "fenced" in str(exc).lower()


class KafkaKeyedLog:
    """A :class:`KeyedLog` on Kafka: a transactional kafka-python producer whose
    ``transactional.id`` is ``<transactional_prefix>.<topic>.<partition>``, and a consumer
    reading ``read_uncommitted`` (see the module docstring)."""

    def __init__(self, bootstrap_servers: str, topic: str, partition: int,
                 transactional_prefix: str = "streamlearn",
                 client_options: Mapping[str, object] | None = None,
                 transaction_timeout_s: float = 600.0, timeout_s: float = 30.0,
                 write: bool = True) -> None:
        from kafka import KafkaConsumer, KafkaProducer
        from kafka.errors import KafkaError

        self.topic, self.partition, self.timeout_s = topic, partition, timeout_s
        self._bootstrap = bootstrap_servers
        options = dict(client_options or {})
        self._consumer_options = {k: v for k, v in options.items()
                                  if k in KafkaConsumer.DEFAULT_CONFIG
                                  and k not in ("group_id", "enable_auto_commit")}
        producer_options = {k: v for k, v in options.items() if k in KafkaProducer.DEFAULT_CONFIG
                            and k not in ("transactional_id", "acks", "enable_idempotence",
                                          "max_request_size", "linger_ms")}
        self._lock = threading.Lock()  # commit excludes sends: Kafka refuses a send while committing
        self._producer: Any = None
        if not write:  # a reader (inspection, tests): fences nobody, writes nothing
            return
        try:
            self._producer = KafkaProducer(
                **{"client_id": "streamlearn-changelog", **producer_options},
                bootstrap_servers=bootstrap_servers,
                transactional_id=f"{transactional_prefix}.{topic}.{partition}",
                transaction_timeout_ms=round(transaction_timeout_s * 1000),
                enable_idempotence=True, acks="all", linger_ms=0,
                max_request_size=4 * 2**20)
            self._producer.init_transactions()  # fences every earlier writer of the partition
            self._producer.begin_transaction()
        except KafkaError as exc:
            raise TransportError(f"cannot open the changelog {topic}[{partition}] for writing: "
                                 f"{exc}") from exc

    def _failed(self, exc: BaseException, what: str) -> Fenced | TransportError:
        where = f"{self.topic}[{self.partition}]"
        if _fenced(exc):
            return Fenced(f"{where}: another writer opened this changelog partition; {what} "
                          f"refused ({type(exc).__name__})")
        self._abort()
        return TransportError(f"{where}: {what} failed: {exc!r}")

    def _abort(self) -> None:
        """After a failed write the transaction cannot commit: abort it and open the next (the
        caller publishes its state again)."""
        try:
            self._producer.abort_transaction()
            self._producer.begin_transaction()
        except Exception as exc:  # the next send fails again and says why
            log.warning("changelog %s[%d]: could not abort the failed transaction: %r",
                        self.topic, self.partition, exc)

    def send(self, key: bytes, value: bytes | None) -> None:
        try:
            with self._lock:
                self._producer.send(self.topic, key=key, value=value, partition=self.partition)
        except Exception as exc:
            raise self._failed(exc, "a write") from exc

    def send_and_wait(self, key: bytes, value: bytes | None) -> int:
        try:
            with self._lock:
                future = self._producer.send(self.topic, key=key, value=value,
                                             partition=self.partition)
            return int(future.get(timeout=self.timeout_s).offset)
        except Exception as exc:
            raise self._failed(exc, "a write") from exc

    def commit(self) -> None:
        try:
            with self._lock:
                self._producer.commit_transaction()
                self._producer.begin_transaction()
        except Exception as exc:
            raise self._failed(exc, "a commit") from exc

    def records(self, start: int = 0) -> Iterator[Record]:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            **{"client_id": "streamlearn-restore", **self._consumer_options},
            bootstrap_servers=self._bootstrap, group_id=None, enable_auto_commit=False,
            isolation_level="read_uncommitted",
            check_crcs=False,  # every chunk is checked against its BLAKE2 digest instead
            fetch_max_bytes=64 * 2**20, max_partition_fetch_bytes=32 * 2**20)
        try:
            tp = TopicPartition(self.topic, self.partition)
            consumer.assign([tp])
            end = consumer.end_offsets([tp])[tp]
            consumer.seek(tp, start)
            deadline = time.monotonic() + self.timeout_s
            while consumer.position(tp) < end:
                got = consumer.poll(timeout_ms=500, max_records=100_000).get(tp, [])
                if got:
                    deadline = time.monotonic() + self.timeout_s
                elif time.monotonic() > deadline:
                    raise TransportError(f"reading the changelog {self.topic}[{self.partition}] "
                                         f"stalled at offset {consumer.position(tp)} of {end}")
                for r in got:
                    if r.offset < end:
                        yield r.offset, r.key, r.value
        finally:
            consumer.close(autocommit=False)

    def close(self) -> None:
        if self._producer is None:
            return
        try:
            self._producer.close(timeout=5)
        except Exception as exc:  # closing a fenced producer may complain; nothing is lost
            log.debug("closing the changelog producer: %r", exc)


def changelog_log_opener(bootstrap_servers: str, topic: str, transactional_prefix: str,
                         client_options: Mapping[str, Any] | None = None
                         ) -> Any:
    """A function ``partition -> KafkaKeyedLog`` for ``topic``."""
    def open_log(partition: int) -> KafkaKeyedLog:
        return KafkaKeyedLog(bootstrap_servers, topic, partition, transactional_prefix,
                             client_options)
    return open_log
