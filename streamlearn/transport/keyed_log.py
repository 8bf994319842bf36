"""One slot of a compacted, keyed log written by one fenced writer: a changelog's storage.

:class:`KeyedLog` is what :mod:`streamlearn.durability.changelog` needs from Kafka. A
slot has two **lanes**: the *state* lane (large records: checkpoint chunks and
manifests) and the *journal* lane (small records the serving loop waits for). On
Kafka, slot ``p`` is partitions ``2p`` (state) and ``2p + 1`` (journal) of the
topic, so that a journal record's acknowledgement never queues behind megabytes of
chunks bound for the same partition. What the log offers:

* **one writer at a time.** Opening a log for ``(topic, slot)`` fences the
  previous writer of that slot: from then on every write of the old one fails
  with :class:`Fenced`, whatever it believes. On Kafka this is a transactional
  producer whose ``transactional.id`` names the slot: ``init_transactions``
  bumps the producer epoch, the broker refuses the old epoch, and the old writer's
  open transaction is aborted.
* **writes in transactions.** :meth:`KeyedLog.send` queues a record in the open
  transaction, :meth:`KeyedLog.send_and_wait` also waits until the broker has it
  (it is in the log, not yet committed), :meth:`KeyedLog.commit` commits the
  transaction and opens the next one. Both lanes are written in the same
  transactions by the same (fenced) writer.
* **reads of everything in the log**, committed or not (``read_uncommitted``), or
  of the committed transactions only (``committed=True``, ``read_committed``: up to
  the last stable offset). A writer that was killed leaves its last transaction
  aborted, and the records in it (the decisions it journaled and may have published)
  are still what the next owner must know: the journal lane is read uncommitted, the
  state lane committed (a checkpoint whose commit never came is not one). Reading
  starts after the open has fenced the previous writer, so nothing is written behind
  the reader's back.
* **compaction** (``cleanup.policy=compact``) keeps the newest record per key and
  drops keys whose newest record is a tombstone (value ``None``); it also **removes
  the records of aborted transactions** (below the last stable offset), so what must
  outlive a dead writer is committed again by the next one
  (:meth:`~streamlearn.durability.changelog.Changelog.restore`).

:class:`MemoryKeyedLog` is the same contract in memory, for tests (with
:meth:`MemoryKeyedLogs.compact` to play the log cleaner), :class:`KafkaKeyedLog`
the Kafka one (kafka-python, whichever client serves the input).

>>> logs = MemoryKeyedLogs()
>>> old = logs.open("changelog", 0)
>>> old.send_and_wait(b"k", b"v1")
0
>>> old.send_and_wait(b"j", b"line", journal=True)
0
>>> new = logs.open("changelog", 0)  # fences the old writer
>>> try:
...     old.send(b"k", b"zombie")
... except Fenced as exc:
...     print("fenced")
fenced
>>> list(new.records()), list(new.records(journal=True))
([(0, b'k', b'v1')], [(0, b'j', b'line')])
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from streamlearn.errors import OwnershipLost, TransportError
from streamlearn.transport.kafka import RECONNECT_BACKOFF_MAX_MS, close_producer

__all__ = ["CHANGELOG_TOPIC_CONFIGS", "LANES", "Fenced", "KafkaKeyedLog", "KeyedLog",
           "MemoryKeyedLog", "MemoryKeyedLogs", "Record", "topic_settings"]

log = logging.getLogger("streamlearn.changelog")

Record = tuple[int, bytes, bytes | None]
"""(offset, key, value); value ``None`` is a tombstone."""

#: Kafka partitions per slot: the state lane, then the journal lane.
LANES = 2

#: Records younger than this are never compacted, the records of aborted transactions
#: included: a dead writer's last journal records stay readable this long for the owners
#: that follow, even when one of them dies while it restores. Without it an outside test saw
#: the cleaner remove them between the next owner's open (which aborts the dead writer's
#: transaction) and its read, and ids decided again differently.
MIN_COMPACTION_LAG_MS = 5 * 60_000

#: Topic settings of a changelog topic created by streamlearn: compacted, segments small and
#: young enough that the cleaner gets to them within minutes (the active segment is never
#: cleaned), and records up to 2 MB (a chunk is at most 256 KiB, a manifest a few hundred KiB).
CHANGELOG_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": str(16 * 2**20),
    "segment.ms": str(5 * 60_000),
    "min.cleanable.dirty.ratio": "0.2",
    "max.message.bytes": str(2 * 2**20),
    "min.compaction.lag.ms": str(MIN_COMPACTION_LAG_MS),
}


#: A write waited on is checked this often for a writer that turned fatal meanwhile.
WAIT_SLICE_S = 0.25

#: An abort of a failed transaction still running after this long: the writer starts anew
#: (its init aborts the transaction on the broker as the abort would have, and waits for a
#: broker still away, so during an outage this retries every ~30 s). kafka-python's abort
#: of a transaction failed by an outage does not end once the broker is back (seen: not 3
#: minutes after), so this bound is the journal's resume: at 20 s it was the outage's start
#: + 15 s (the records' delivery timeout) + 20 s, however soon the broker came back (an
#: outside test: decisions resumed 13-18 s after 17-20 s outages had ended).
RESTART_AFTER_S = 3.0

#: Opening the writer again (after an abort that did not end, or an open that failed) waits
#: this long at most for the broker, where the first open waits ``timeout_s``: during an
#: outage each try held its caller 30 s (kafka-python's bootstrap), the snapshot writer's
#: too, which a stop then waited for, partition after partition.
REOPEN_WAIT_S = 5.0

#: What a write or commit that gave up at :meth:`KafkaKeyedLog.stop_waiting_after` says
GAVE_UP = ("not acknowledged before the writer's deadline: its partition is stopping and its "
           "time to wait for the broker is spent")

#: The changelog producer's bound on a record's delivery (kafka-python's default is 120 s):
#: after a broker outage, the abort of a failed transaction waits for its records to fail.
DELIVERY_TIMEOUT_MS = 15_000


class Fenced(OwnershipLost):
    """Another writer opened this log slot: this one may write nothing more to it (not a
    TransportError: retrying cannot help, the partition is another replica's now)."""


class KeyedLog(Protocol):
    """One slot (two lanes) of a compacted log, written in transactions by a fenced writer.

    A record sent is readable at once (``records``), committed or not; the transaction it
    is in is either committed or aborted (``commit``; the next writer's open aborts an open
    one). Kafka's log cleaner removes the records of aborted transactions when it compacts
    their segment: what a writer must keep has to be in a committed transaction.
    """

    #: False for a reader that fences nobody and writes nothing (inspection)
    writes: bool

    def send(self, key: bytes, value: bytes | None, journal: bool = False) -> None:
        """Queue a record (``None``: a tombstone) on a lane, in the open transaction."""

    def send_and_wait(self, key: bytes, value: bytes | None, journal: bool = False) -> int:
        """Write a record on a lane and wait until the broker has it; its offset there."""

    def commit(self) -> None:
        """Commit the open transaction (every record sent is in the log) and open the next."""

    def records(self, start: int = 0, journal: bool = False,
                committed: bool = False) -> Iterator[Record]:
        """Every record of a lane from offset ``start`` to its end as of this call (with
        ``committed``, only those of committed transactions)."""

    def close(self) -> None:
        """Abort nothing, commit nothing: the next writer's open aborts an open transaction."""

    def stop_waiting_after(self, deadline: float) -> None:
        """From now on no wait on the broker (a write, a commit, an abort, opening the writer
        again, closing) goes past ``deadline`` (a ``time.monotonic()``), those already
        under way included: the writer's partition is stopping."""


# --------------------------------------------------------------------------- memory
class MemoryKeyedLogs:
    """The topics of an in-memory "broker" for :class:`MemoryKeyedLog` writers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.partitions: dict[tuple[str, int], list[Record]] = {}  # (topic, Kafka partition)
        self.epochs: dict[tuple[str, int], int] = {}  # (topic, slot)
        # (topic, Kafka partition, offset) of records in a writer's open transaction, by slot,
        # and of records in aborted ones (which compact removes, as Kafka's cleaner does)
        self.open_records: dict[tuple[str, int], set[tuple[str, int, int]]] = {}
        self.aborted: set[tuple[str, int, int]] = set()
        self.next_offsets: dict[tuple[str, int], int] = {}  # offsets are never reused

    def open(self, topic: str, slot: int) -> MemoryKeyedLog:
        """The writer of ``topic``'s slot ``slot``; every earlier writer is fenced."""
        with self.lock:
            where = (topic, slot)
            self.epochs[where] = self.epochs.get(where, 0) + 1
            self.aborted |= self.open_records.pop(where, set())  # the previous writer's
            for lane in range(LANES):
                self.partitions.setdefault((topic, LANES * slot + lane), [])
            return MemoryKeyedLog(self, where, self.epochs[where])

    def compact(self, topic: str, slot: int) -> None:
        """What the log cleaner does to both lanes, below the first record of an open
        transaction (Kafka's cleaner stops at the last stable offset): drop the records of
        aborted transactions, keep the newest record per key, drop tombstoned keys (offsets
        are kept)."""
        with self.lock:
            open_records = set().union(*self.open_records.values())
            for lane in range(LANES):
                partition = LANES * slot + lane
                records = self.partitions[(topic, partition)]
                stable = min((o for t, p, o in open_records if (t, p) == (topic, partition)),
                             default=None)
                cleaned = [r for r in records if stable is None or r[0] < stable]
                kept = [r for r in cleaned if (topic, partition, r[0]) not in self.aborted]
                newest = {key: offset for offset, key, _ in kept}
                self.partitions[(topic, partition)] = [
                    r for r in kept if newest[r[1]] == r[0] and r[2] is not None
                ] + records[len(cleaned):]


class MemoryKeyedLog:
    """A :class:`KeyedLog` in memory (every record is in the log as soon as it is sent)."""

    writes = True

    def __init__(self, logs: MemoryKeyedLogs, where: tuple[str, int], epoch: int) -> None:
        self.logs, self.where, self.epoch = logs, where, epoch
        self.commits = 0

    def _check(self) -> None:
        if self.logs.epochs[self.where] != self.epoch:
            raise Fenced(f"{self.where[0]}[{self.where[1]}]: another writer opened this "
                         "changelog slot")

    def _lane(self, journal: bool) -> list[Record]:
        return self.logs.partitions[(self.where[0], LANES * self.where[1] + int(journal))]

    def send(self, key: bytes, value: bytes | None, journal: bool = False) -> None:
        self.send_and_wait(key, value, journal)

    def send_and_wait(self, key: bytes, value: bytes | None, journal: bool = False) -> int:
        with self.logs.lock:
            self._check()
            records = self._lane(journal)
            lane = (self.where[0], LANES * self.where[1] + int(journal))
            offset = self.logs.next_offsets.get(lane, 0)
            self.logs.next_offsets[lane] = offset + 1
            records.append((offset, key, value))
            self.logs.open_records.setdefault(self.where, set()).add((*lane, offset))
            return offset

    def commit(self) -> None:
        with self.logs.lock:
            self._check()
            self.logs.open_records.pop(self.where, None)
        self.commits += 1

    def records(self, start: int = 0, journal: bool = False,
                committed: bool = False) -> Iterator[Record]:
        topic, partition = self.where[0], LANES * self.where[1] + int(journal)
        with self.logs.lock:
            records = list(self._lane(journal))
            # read committed: nothing from an open transaction's first record on (Kafka's
            # last stable offset), and an aborted transaction's records never
            aborted = {o for t, p, o in self.logs.aborted if (t, p) == (topic, partition)}
            first_open = min((o for t, p, o in set().union(*self.logs.open_records.values())
                              if (t, p) == (topic, partition)), default=None)
        if not committed:
            return (r for r in records if r[0] >= start)
        return (r for r in records if r[0] >= start and r[0] not in aborted
                and (first_open is None or r[0] < first_open))

    def close(self) -> None:
        pass

    def stop_waiting_after(self, deadline: float) -> None:
        pass  # nothing here waits


# ---------------------------------------------------------------------------- Kafka
def _fenced(exc: BaseException) -> bool:
    names = {type(exc).__name__, type(getattr(exc, "__cause__", None)).__name__}
    return bool(names & {"ProducerFencedError", "InvalidProducerEpochError"}) \
        or "fenced" in str(exc).lower()


def topic_settings(bootstrap_servers: str, topic: str, names: tuple[str, ...],
                   client_options: Mapping[str, object] | None = None) -> dict[str, str]:
    """The values of the settings ``names`` of an existing topic (those the broker says)."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    options = {k: v for k, v in (client_options or {}).items()
               if k in KafkaAdminClient.DEFAULT_CONFIG}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **options)
    try:
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic,
                            configs=dict.fromkeys(names))], config_filter="all")
    finally:
        admin.close()
    found: dict[str, str] = {}
    for by_name in (described or {}).values():
        entries = by_name.get(topic) or {} if isinstance(by_name, dict) else {}
        for name in names:
            entry = entries.get(name)
            if isinstance(entry, dict) and entry.get("value") is not None:
                found[name] = str(entry["value"])
    return found


def _no_epoch_bump(producer: Any) -> None:
    """Make a refused producer epoch fatal, as the Java client does for a transactional
    producer. kafka-python 3.0.12 treats a produce refused with INVALID_PRODUCER_EPOCH as
    recoverable (KIP-360): it asks the coordinator for a new epoch of the same
    ``transactional.id`` — and so fences the replica that fenced it, which then gets the same
    error: two replicas taking one partition from each other (seen in the scale-out test when
    a paused replica came back). Without the bump the error is fatal and the writer stops."""
    manager = getattr(producer, "_transaction_manager", None)
    if manager is not None and hasattr(manager, "_supports_epoch_bump"):
        manager._supports_epoch_bump = lambda: False


def _unusable(producer: Any) -> bool:
    """Whether the producer is in its fatal state (fenced, or an error it cannot recover
    from): it writes nothing more, so the slot is another writer's now."""
    manager = getattr(producer, "_transaction_manager", None)
    state = getattr(manager, "_current_state", None)
    return getattr(state, "name", "") == "FATAL_ERROR"


class KafkaKeyedLog:
    """A :class:`KeyedLog` on Kafka: slot ``slot`` is partitions ``2 slot`` (state) and
    ``2 slot + 1`` (journal), written by a transactional kafka-python producer whose
    ``transactional.id`` is ``<transactional_prefix>.<topic>.<slot>``, read by a consumer
    ``read_uncommitted`` (see the module docstring)."""

    def __init__(self, bootstrap_servers: str, topic: str, slot: int,
                 transactional_prefix: str = "streamlearn",
                 client_options: Mapping[str, object] | None = None,
                 transaction_timeout_s: float = 600.0, timeout_s: float = 30.0,
                 write: bool = True) -> None:
        from kafka import KafkaConsumer, KafkaProducer

        self.topic, self.slot, self.timeout_s = topic, slot, timeout_s
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
        self._aborting: Any = None  # the abort of a failed transaction, while it runs (_abort)
        self._abort_began = 0.0
        self._give_up_at: float | None = None  # stop_waiting_after
        self.writes = write
        if not write:  # a reader (inspection, tests): fences nobody, writes nothing
            return
        # a record the broker has not taken fails within delivery_timeout_ms: the abort of its
        # transaction waits for it (kafka-python's default, 120 s, kept the journal held that
        # long after a broker outage had ended)
        request_ms = int(float(str(producer_options.pop("request_timeout_ms", 10_000))))
        delivery_ms = max(int(float(str(producer_options.pop("delivery_timeout_ms",
                                                             DELIVERY_TIMEOUT_MS)))), request_ms)
        self._producer_config = {
            **{"client_id": "streamlearn-changelog",
               "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS, **producer_options},
            "request_timeout_ms": request_ms, "delivery_timeout_ms": delivery_ms,
            "bootstrap_servers": bootstrap_servers,
            "transactional_id": f"{transactional_prefix}.{topic}.{slot}",
            "transaction_timeout_ms": round(transaction_timeout_s * 1000),
            "enable_idempotence": True, "acks": "all", "linger_ms": 0,
            "max_request_size": 4 * 2**20}
        self._producer = self._open_producer(self.timeout_s)

    def stop_waiting_after(self, deadline: float) -> None:
        self._give_up_at = deadline if self._give_up_at is None else min(deadline,
                                                                          self._give_up_at)

    def _deadline(self, wait_s: float) -> float:
        """When a wait of ``wait_s`` starting now ends: sooner if the writer gives up sooner."""
        deadline = time.monotonic() + wait_s
        return deadline if self._give_up_at is None else min(deadline, self._give_up_at)

    def _gave_up(self) -> bool:
        """Whether the deadline of :meth:`stop_waiting_after` has passed."""
        return self._give_up_at is not None and time.monotonic() >= self._give_up_at

    def _past(self, deadline: float) -> bool:
        """Whether a wait until ``deadline`` is over (or the writer gave up meanwhile)."""
        return time.monotonic() >= deadline or self._gave_up()

    def _open_producer(self, wait_s: float) -> Any:
        """A transactional producer of this slot, its transaction open, waiting at most
        ``wait_s`` for the broker (its bootstrap, ``init_transactions``). Its init fences
        every earlier writer of the slot (this one's earlier producer too)."""
        from kafka import KafkaProducer
        from kafka.errors import KafkaError

        producer: Any = None
        wait_ms = max(round((self._deadline(wait_s) - time.monotonic()) * 1000), 1)
        try:
            producer = KafkaProducer(**self._producer_config, max_block_ms=wait_ms,
                                     bootstrap_timeout_ms=wait_ms)
            producer.init_transactions()
            _no_epoch_bump(producer)
            producer.begin_transaction()
            return producer
        except KafkaError as exc:
            if producer is not None:
                close_producer(producer, 0.0)
            raise TransportError(f"cannot open the changelog {self.topic} slot {self.slot} for "
                                 f"writing: {exc}") from exc

    def _partition(self, journal: bool) -> int:
        return LANES * self.slot + int(journal)

    def _failed(self, exc: BaseException, what: str) -> Fenced | TransportError:
        where = f"{self.topic} slot {self.slot}"
        if _fenced(exc):
            return Fenced(f"{where}: another writer opened this changelog slot; {what} "
                          f"refused ({type(exc).__name__})")
        if _unusable(self._producer):  # e.g. sequence errors after a refused record
            last = getattr(self._producer._transaction_manager, "last_error", None)
            return Fenced(f"{where}: the changelog's writer failed for good ({last!r}); {what} "
                          f"refused ({type(exc).__name__}), and no other write is possible")
        self._abort()
        return TransportError(f"{where}: {what} failed: {exc!r}")

    def _abort(self) -> None:
        """After a failed write the transaction cannot commit: abort it (the caller publishes
        its state again). kafka-python's ``abort_transaction`` waits for the abort without a
        bound, and with the broker away that is as long as it is away (an outside test saw
        the serving thread held 78 s): the abort is started here, waited for a moment, and
        the next write waits for the rest of it (at most ``timeout_s``, see ``_queue``)."""
        wait_s = max(self._deadline(self.timeout_s) - time.monotonic(), 0.0)
        if not self._lock.acquire(timeout=wait_s):  # a commit holds it: it fails too
            return
        try:
            if self._aborting is not None:  # an earlier failure's abort is still running
                return
            manager = self._producer._transaction_manager
            self._aborting = manager.begin_abort()  # abort_transaction, but for its wait
            self._abort_began = time.monotonic()
            self._producer._sender.wakeup()
            self._abort_done(WAIT_SLICE_S)
        except Exception as exc:  # the next send fails again and says why
            self._aborting = None
            log.warning("changelog %s slot %d: could not abort the failed transaction: %r",
                        self.topic, self.slot, exc)
        finally:
            self._lock.release()

    def _abort_done(self, wait_s: float) -> bool:
        """Whether no abort is pending, waiting at most ``wait_s`` for one that is; once it is
        done the next transaction is opened. Raises what failed the abort. With the lock."""
        result = self._aborting
        if result is None:
            return True
        deadline = self._deadline(wait_s)
        try:
            while not result.wait(timeout_ms=min(WAIT_SLICE_S, max(
                    deadline - time.monotonic(), 0.0)) * 1000):
                if self._past(deadline):
                    return False
                if time.monotonic() - self._abort_began >= RESTART_AFTER_S:
                    self._restart()
                    return True
        finally:
            if result.is_done:
                self._aborting = None
        self._producer.begin_transaction()
        return True

    def _restart(self) -> None:
        """A new producer in place of one whose abort does not end: kafka-python's can wait
        on a broker back from an outage for minutes (seen: no end 3 minutes after). Its init
        aborts the open transaction on the broker and fences the old producer, which is
        closed without waiting. The records of the aborted transaction stay readable (reads
        are read_uncommitted), as after a crash. With the lock."""
        old, self._producer = self._producer, None
        log.warning("changelog %s slot %d: the abort of a failed transaction has not ended "
                    "after %.0f s: starting the writer again", self.topic, self.slot,
                    time.monotonic() - self._abort_began)
        try:  # with records the broker never took (kafka-python's close raised, left it open)
            close_producer(old, 0.0)
        except Exception as exc:  # closing a stuck producer may complain; it writes no more
            log.debug("closing the changelog producer: %r", exc)
        self._aborting = None
        self._producer = self._open_producer(min(self.timeout_s, REOPEN_WAIT_S))

    def _queue(self, key: bytes, value: bytes | None, journal: bool) -> Any:
        """Queue a record on its lane (not while a commit or an abort runs); its future. A
        commit, or the abort of a failed transaction, can wait on a broker that is away for as
        long as it is away: the write waits for them at most ``timeout_s``, and not at all
        once the writer turned fatal (fenced)."""
        from kafka.errors import KafkaTimeoutError

        deadline = self._deadline(self.timeout_s)
        while not self._lock.acquire(timeout=WAIT_SLICE_S):
            if _unusable(self._producer):
                raise KafkaTimeoutError("the writer failed while a commit held its writes")
            if self._past(deadline):
                raise KafkaTimeoutError("a commit held the changelog's writes until the "
                                        "write gave up")
        try:
            if self._producer is None:  # a restart whose init failed (the broker still away)
                self._producer = self._open_producer(min(max(deadline - time.monotonic(), 0.0),
                                                         REOPEN_WAIT_S))
            if not self._abort_done(max(deadline - time.monotonic(), 0.0)):
                raise KafkaTimeoutError("the transaction of an earlier failed write was still "
                                        "being aborted when the write gave up")
            return self._producer.send(self.topic, key=key, value=value,
                                       partition=self._partition(journal))
        finally:
            self._lock.release()

    def send(self, key: bytes, value: bytes | None, journal: bool = False) -> None:
        try:
            self._queue(key, value, journal)
        except Exception as exc:
            raise self._failed(exc, "a write") from exc

    def send_and_wait(self, key: bytes, value: bytes | None, journal: bool = False) -> int:
        """Queue the record and wait until the broker has it (at most ``timeout_s``), in
        slices of ``WAIT_SLICE_S``: a producer that turned fatal meanwhile (fenced while its
        write waited on the transaction coordinator, as after a broker outage) fails the
        write at once instead of holding the serving loop for the whole timeout."""
        from kafka.errors import KafkaTimeoutError

        try:
            future = self._queue(key, value, journal)
            deadline = self._deadline(self.timeout_s)
            while True:
                try:
                    return int(future.get(timeout=min(
                        WAIT_SLICE_S, max(deadline - time.monotonic(), 0.0))).offset)
                except KafkaTimeoutError as exc:
                    if not future.is_done and self._gave_up():  # not a 2 µs "Timeout after"
                        raise KafkaTimeoutError(GAVE_UP) from exc
                    if future.is_done or self._past(deadline) or _unusable(self._producer):
                        raise  # the write's own failure, the whole wait, or a dead writer
        except Exception as exc:
            raise self._failed(exc, "a write") from exc

    def commit(self) -> None:
        from kafka.errors import KafkaTimeoutError

        try:
            # everything sent is acknowledged first, with the lock free: the serving thread's
            # journal writes go on meanwhile; the commit itself is then short. In slices: a
            # writer that gives up meanwhile (its partition stopping) stops waiting
            deadline = self._deadline(self.timeout_s)
            while True:
                try:
                    self._producer.flush(timeout=min(
                        WAIT_SLICE_S, max(deadline - time.monotonic(), 0.0)))
                    break
                except KafkaTimeoutError as exc:
                    if self._gave_up():
                        raise KafkaTimeoutError(GAVE_UP) from exc
                    if self._past(deadline):
                        raise
            with self._lock:
                if self._producer is None:
                    raise KafkaTimeoutError("the changelog's writer is starting again")
                if not self._abort_done(max(deadline - time.monotonic(), 0.0)):
                    raise KafkaTimeoutError("the transaction of a failed write was still being "
                                            "aborted when the commit gave up")
                self._producer.commit_transaction()
                self._producer.begin_transaction()
        except Exception as exc:
            raise self._failed(exc, "a commit") from exc

    def records(self, start: int = 0, journal: bool = False,
                committed: bool = False) -> Iterator[Record]:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            **{"client_id": "streamlearn-restore",
               "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS, **self._consumer_options},
            bootstrap_servers=self._bootstrap, group_id=None, enable_auto_commit=False,
            # read_committed: up to the last stable offset (the end an open transaction
            # leaves readable), aborted transactions left out
            isolation_level="read_committed" if committed else "read_uncommitted",
            check_crcs=False,  # every chunk is checked against its BLAKE2 digest instead
            fetch_max_bytes=64 * 2**20, max_partition_fetch_bytes=32 * 2**20)
        try:
            tp = TopicPartition(self.topic, self._partition(journal))
            consumer.assign([tp])
            end = consumer.end_offsets([tp])[tp]
            consumer.seek(tp, start)
            deadline = time.monotonic() + self.timeout_s
            while consumer.position(tp) < end:
                got = consumer.poll(timeout_ms=500, max_records=100_000).get(tp, [])
                if got:
                    deadline = time.monotonic() + self.timeout_s
                elif time.monotonic() > deadline:
                    raise TransportError(f"reading the changelog {self.topic}[{tp.partition}] "
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
            close_producer(self._producer, max(self._deadline(5.0) - time.monotonic(), 0.0))
        except Exception as exc:  # closing a fenced producer may complain; nothing is lost
            log.debug("closing the changelog producer: %r", exc)


