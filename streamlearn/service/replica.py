"""One replica of a scaled-out deployment: a daemon per owned partition, following the group.

``streamlearn serve --kafka-membership group`` runs a :class:`Replica`. Kafka's
group protocol (:class:`~streamlearn.service.group.GroupMembership`) decides
which instances partitions this replica owns; for each owned partition ``p``
the replica runs a :class:`~streamlearn.service.daemon.Daemon` that reads
partition ``p`` of both input topics and keeps *all* its state — learner,
pending joins, journal, offsets, counters — in its own checkpoint directory
``<checkpoint.dir>/partition-<p>``: with ``checkpoint.changelog`` a local cache of
the partition's changelog (:mod:`streamlearn.durability.changelog`, which also
fences a replica that lost the partition), else on storage every replica can
reach (fenced by :mod:`streamlearn.service.claims`).

**State moves with its partition.** When ``p`` is revoked (a rebalance moves
it), its daemon writes a final checkpoint and closes before the revocation
completes; the replica that gets ``p`` restores that checkpoint (from the
changelog when its own copy is not the newest) and seeks to
its offsets before it reads any record of ``p``. When the owner is killed, the
new owner restores the last periodic checkpoint and the journal, so the
daemon's crash guarantees hold across the move: every feedback is applied
exactly once (the per-partition counters and checksums add up over the group),
re-emitted decisions are byte-identical, and a pending join's expiry runs on
its decision's event time wherever the partition goes. A partition lost by
eviction (this replica paused past the session timeout) is closed *without* a
checkpoint: another replica owns it already.

The replica has one learner, shared by its partition daemons (the first
partition restored brings it; a partition moving in keeps its pending joins and
counters, and is learned by this replica's learner): one replica learns
exactly as the single daemon does. The :class:`~streamlearn.sync.hub.ModelHub`
merges the replicas' learners through the models topic every sync interval.

Offsets are committed (for lag tools) to the group ``<group_id>.partitions``:
the serving group itself has active members, and Kafka refuses commits from a
consumer outside the group's generation.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.learners.base import Learner
from streamlearn.service.claims import OwnershipLost, PartitionClaims
from streamlearn.service.daemon import Daemon
from streamlearn.service.group import GroupMembership
from streamlearn.service.metrics import Observer
from streamlearn.snapshot import replace_file
from streamlearn.sync.hub import ModelHub

__all__ = ["Replica", "partition_dirs", "read_released"]

log = logging.getLogger("streamlearn.replica")

#: how long a replica taking partitions waits for their previous holders to release them
#: (service/claims.py); only a killed holder makes it wait that long
RELEASE_GRACE_S = 2.0

#: a round of the serving loop running this long makes ``/readyz`` answer 503: something in
#: it waits (an outside test: the merged model's publish, then on this thread, waited 30 s on
#: a broker away, and the replica said ready with partitions the group had already taken)
ROUND_STALL_S = 5.0
#: with the changelog (no claim files), a partition this replica stopped serving is marked
#: ``partition-<p>/released`` — ``{"at": unix time, "how": "handed over" | "dropped" |
#: "stopped"}`` — until it serves it again: ``streamlearn inspect`` of the replica's
#: directory then tells a copy of a partition another replica took from one it served last
RELEASED_FILE = "released"
#: the ``how`` of a partition another replica took (the others: this replica stopped)
TAKEN_BY_ANOTHER = frozenset({"handed over", "dropped", "not reassigned"})
#: the ``how`` of a partition a killed run of this replica served and the group did not give
#: back at its restart (a kill -9 marks nothing: its copies were counted by ``inspect``)
NOT_REASSIGNED = "not reassigned"


class Replica:
    """The partition daemons of this replica; see the module docstring.

    Parameters
    ----------
    make_daemon
        Builds the (not yet restored) daemon of one partition.
    make_membership
        Builds the group membership with the replica's three handlers.
    poll_timeout_s
        How long a round with no partition owned waits for an assignment.
    on_close
        Called once the replica stopped (closes what its partition daemons shared).
    round_s
        The shortest round: the partition daemons poll without waiting, and a round that
        filled no micro-batch waits out the rest of ``round_s`` (for group changes) before
        the next one. The batches then hold what arrived in one round whatever the number
        of partitions this replica owns, so the CPU spent per event (the per-poll cost is
        paid per batch) stays the same as replicas are added, at the price of at most
        ``round_s`` of added latency (docs/performance.md).
    """

    def __init__(self, make_daemon: Callable[[int], Daemon],
                 make_membership: Callable[..., GroupMembership],
                 poll_timeout_s: float = 0.1, round_s: float = 0.0,
                 on_owned: Callable[[int, int], None] | None = None,
                 hub: ModelHub | None = None, claims: PartitionClaims | None = None,
                 on_close: Callable[[], None] | None = None,
                 observer: Observer | None = None, state_dir: Path | None = None) -> None:
        self.hub, self.claims = hub, claims
        # with the changelog: the directory of this replica's partition copies, whose copies
        # of a killed run the first assignment marks (_mark_left_behind)
        self.state_dir = state_dir
        self.observer = observer or Observer()
        self.on_close = on_close or (lambda: None)
        self.make_daemon, self.poll_timeout_s = make_daemon, poll_timeout_s
        self.round_s = round_s
        self.daemons: dict[int, Daemon] = {}
        self.on_owned = on_owned or (lambda n, moves: None)
        self._retired = 0  # instances decided by partition daemons this replica has stopped
        # partitions dropped because another replica fenced them (OwnershipLost), and when:
        # one the group still assigns here a session timeout later is taken back (_recover)
        self._fenced: dict[int, float] = {}
        self.learner: Learner | None = None
        self._stop = threading.Event()
        self._stop_deadline: float | None = None  # request_stop
        self._closing = False  # every partition retired: the group's last changes are not taken
        self.moves = 0  # partitions started here after the first assignment
        self.ready = False
        self.round_began = time.monotonic()  # the serving thread's current round (readiness)
        self.restoring: int | None = None  # the partition whose state is being restored
        self.membership = make_membership(on_assigned=self._assigned, on_revoked=self._revoked,
                                          on_lost=self._lost)

    @property
    def instances_this_run(self) -> int:
        return sum(d.instances_this_run for d in self.daemons.values()) + self._retired

    def request_stop(self) -> None:
        """Stop after the current round (safe from a signal handler). The partitions' final
        checkpoints and any snapshot being written in the background (the round may wait
        for one) share ``flush_timeout_seconds`` from now as their bound on waiting for the
        broker (:meth:`_retire_with_checkpoints`)."""
        daemons = list(self.daemons.values())
        if daemons and self._stop_deadline is None:
            self._stop_deadline = daemons[0].stop_deadline()
            for daemon in daemons:
                daemon.stop_waiting_after(self._stop_deadline)
        self._stop.set()

    def readiness(self) -> tuple[bool, str]:
        """``(ready, reason)`` for ``/readyz`` (any thread): serving partitions, none of them
        held by a changelog that refuses its journal."""
        owned = list(self.daemons.items())  # one step: the serving thread may change the dict
        restoring = self.restoring
        if restoring is not None:  # the serving thread decides nothing until it is done
            return False, f"partition {restoring}: restoring its state: decisions held"
        for partition, daemon in owned:
            held = daemon.held_by_journal()
            if held is not None:
                return False, f"partition {partition}: {held}"
        busy = time.monotonic() - self.round_began
        if self.ready and busy >= ROUND_STALL_S:  # e.g. a rebalance waiting on a broker away
            return False, (f"the serving loop has spent {busy:.0f} s in one round: decisions "
                           "held")
        return self.ready and bool(owned), f"{len(owned)} partitions owned"

    # --------------------------------------------------------------- the group
    def _assigned(self, partitions: list[int]) -> None:
        if self._closing:  # stopped: the group gives them to another replica, or to this
            log.info("partitions %s assigned while this replica leaves: not taken", partitions)
            return  # one when it starts again (an outside test saw a stop restore six first)
        new = [p for p in partitions if p not in self.daemons]
        if self.claims is not None and new:
            claims = self.claims
            for p in new:
                claims.claim(p)  # a replica that still serves p stops at its next check
            # ... and releases it once it journals nothing more: restore only then
            for p in claims.wait_released(new, RELEASE_GRACE_S):
                log.warning("partition %d: its previous holder did not release it within "
                            "%.0f s (killed?); restoring its state", p, RELEASE_GRACE_S)
        for p in new:
            daemon = self.make_daemon(p)
            _mark_released(daemon, None)  # serving it again: no longer a cached copy
            if self.claims is not None:
                daemon.owner_check = lambda p=p, claims=self.claims: claims.holds(p)
            daemon.still_assigned = lambda p=p: p in self.membership.assigned()
            self.restoring = p
            try:
                daemon.restore()  # before any record of p is read: the moved state comes first
            finally:
                self.restoring = None
            if self.learner is None:  # the replica's one learner, shared by its partitions
                self.learner = daemon.learner
            else:
                daemon.replace_learner(self.learner)
                daemon.model_name = next(iter(self.daemons.values())).model_name \
                    if self.daemons else daemon.model_name
            daemon.started_at_instances = daemon.instance_messages
            daemon.reports_totals = False  # the replica reports its partitions' (_report)
            daemon.ready = True
            self.daemons[p] = daemon
            self.moves += 1
            self.on_owned(len(self.daemons), self.moves)  # as /readyz counts them
        self.on_owned(len(self.daemons), self.moves)
        if self.state_dir is not None:
            self._mark_left_behind(self.state_dir)
            self.state_dir = None  # once: the copies of this run are marked as they go
        self._report()

    def _mark_left_behind(self, state_dir: Path) -> None:
        """At the first assignment of this run: a partition directory the group did not give
        back, left unmarked by a killed run (or ``stopped`` by a clean one), is marked
        :data:`NOT_REASSIGNED` (another
        replica took it; ``inspect`` leaves the copy out of the total, an outside test
        summed 98,132 instances over three replicas for 80,500 served). Serving it again
        later removes the mark."""
        # what it serves now counts too: a client may not list a partition in its own callback
        assigned = set(self.membership.assigned()) | set(self.daemons)
        for partition, directory in partition_dirs(state_dir):
            marked = read_released(directory)  # "stopped" by the last run, or none (killed)
            if partition not in assigned and (marked or {}).get("how") not in TAKEN_BY_ANOTHER:
                _write_released(directory, NOT_REASSIGNED)

    def _revoked(self, partitions: list[int]) -> None:
        self._retire_with_checkpoints(partitions, how="handed over")
        self.on_owned(len(self.daemons), self.moves)
        self._report()

    def _lost(self, partitions: list[int]) -> None:
        for p in partitions:
            self._retire(p, checkpoint=False, how="dropped")
        self.on_owned(len(self.daemons), self.moves)
        self._report()

    def _report(self) -> None:
        """The gauges that describe the replica, over the partitions it serves now: pending
        joins summed, error rates over their events together."""
        daemons = list(self.daemons.values())
        self.observer.on_pending(sum(d.pending for d in daemons))
        if daemons:
            self.observer.on_error_rates(*OnlineErrorTracker.combined([d.tracker for d in daemons]))

    def _retire_with_checkpoints(self, partitions: list[int], how: str,
                                 deadline: float | None = None) -> None:
        """Retire ``partitions`` one after another, each with its final checkpoint, which
        share one bound on waiting for the broker: ``deadline``, by default
        ``flush_timeout_seconds`` from now, set on every one of them first (a snapshot
        still being written in the background included). A partition reached once it is
        past gets no final checkpoint: it is restored from its last checkpoint and journal,
        as after a crash. With the broker away each waited for it in turn: a replica of six
        partitions took over three minutes to stop (docs/kafka.md)."""
        daemons = [self.daemons[p] for p in partitions if p in self.daemons]
        if not daemons:
            return
        if deadline is None:
            deadline = daemons[0].stop_deadline()
        for daemon in daemons:
            daemon.stop_waiting_after(deadline)
        for p in partitions:
            in_time = time.monotonic() < deadline
            if not in_time and p in self.daemons:
                log.warning("partition %d: no final checkpoint: the %.0f s its stop waits for "
                            "the broker are spent (it restores from its last checkpoint and "
                            "journal)", p, daemons[0].settings.flush_timeout_seconds)
            self._retire(p, checkpoint=in_time, how=how)

    def _retire(self, partition: int, checkpoint: bool, how: str) -> None:
        """Stop serving ``partition`` (its final checkpoint first with ``checkpoint``); ``how``
        — "handed over", "dropped" (another replica has it now) or "stopped" (this replica
        stops) — is marked in its directory under the changelog (:data:`RELEASED_FILE`)."""
        daemon = self.daemons.pop(partition, None)
        if daemon is None:
            return
        self._retired += daemon.instances_this_run
        try:
            if checkpoint and (self.claims is None or self.claims.holds(partition)):
                daemon.checkpoint(final=True)
        except OwnershipLost as exc:  # fenced by the changelog: the state is another's now
            log.warning("partition %d: no final checkpoint (%s)", partition, exc)
        finally:
            daemon.close()
            daemon.transport.close()
            if self.claims is not None:
                self.claims.release(partition)  # nothing more of it is journaled here
            else:
                _mark_released(daemon, how)
        log.info("partition %d %s", partition, how)

    # -------------------------------------------------------------------- loop
    def step(self) -> None:
        """One round: take part in the group (rebalances happen here), then one step of
        every partition daemon."""
        started = self.round_began = time.monotonic()
        self.membership.poll(0.0 if self.daemons else self.poll_timeout_s)
        filled = False
        for p, daemon in list(self.daemons.items()):
            if self._stop.is_set():  # the rest of the round would only hold the stop up
                break
            if self.claims is not None and not self.claims.holds(p):
                log.warning("partition %d is claimed by another replica: dropped (this replica "
                            "was evicted from the group without noticing)", p)
                self._lost([p])
                continue
            before = daemon.counters.messages
            try:
                daemon.step()
            except OwnershipLost as exc:
                log.warning("partition %d was claimed by another replica during a step, or its "
                            "changelog refused this replica's writes: dropped before journaling "
                            "its decisions (%s)", p, exc)
                self._lost([p])
                self._fenced[p] = time.monotonic()
                continue
            filled |= daemon.counters.messages - before >= daemon.settings.limits.poll_max_records
        self._report()
        if self._fenced:
            self._recover()
        if self.hub is not None:
            self.hub.tick(self.daemons)
            if self.daemons:  # an adopted model replaced the shared learner
                self.learner = next(iter(self.daemons.values())).learner
        rest = self.round_s - (time.monotonic() - started)
        if self.daemons and not filled and rest > 0:
            self.membership.poll(rest)  # a rebalance during the wait is applied at once

    def _recover(self) -> None:
        """A partition dropped because another writer fenced it is normally another replica's
        by then, and this one's client hears of it within a session timeout (the partition
        leaves its assignment). One the group still assigns here after twice that was fenced
        by something else (an error the changelog's producer cannot recover from): take it
        back, restoring it as a moved partition is."""
        wait = 2 * self.membership.session_timeout_s
        assigned = self.membership.assigned()
        now = time.monotonic()
        for p, since in list(self._fenced.items()):
            if p not in assigned or p in self.daemons:
                del self._fenced[p]
            elif now - since > wait:
                del self._fenced[p]
                log.warning("partition %d is still assigned to this replica %.0f s after it was "
                            "fenced: taking it back", p, now - since)
                self._assigned([p])

    def run(self, max_instances: int | None = None) -> None:
        """Serve the owned partitions until :meth:`request_stop` (or ``max_instances``)."""
        self.round_began = time.monotonic()
        self.ready = True
        try:
            while not self._stop.is_set():
                if max_instances is not None and self.instances_this_run >= max_instances:
                    break
                self.step()
            self._retire_with_checkpoints(list(self.daemons), how="stopped",
                                          deadline=self._stop_deadline)
        finally:
            self.ready = False
            for p in list(self.daemons):  # after a failure: no checkpoint of unknown state
                self._retire(p, checkpoint=False, how="stopped")
            self._closing = True
            self.membership.close()  # applies the changes pending (kafka-python, librdkafka)
            self.on_close()  # clients shared by the partition daemons, after every daemon


def _mark_released(daemon: Daemon, how: str | None) -> None:
    """Write (``how``) or remove (None) the partition directory's :data:`RELEASED_FILE`; a
    failure is logged: the marker only informs ``inspect``."""
    directory = daemon.settings.checkpoint.dir
    if not directory:
        return
    _write_released(Path(directory), how)


_PARTITION_DIR = re.compile(r"^partition-(\d+)$")


def partition_dirs(path: Path) -> list[tuple[int, Path]]:
    """The ``partition-<p>`` directories under a replica's ``checkpoint.dir``, by partition."""
    return sorted((int(m.group(1)), p) for p in path.iterdir()
                  if (m := _PARTITION_DIR.match(p.name)) and p.is_dir())


def read_released(directory: Path) -> dict[str, Any] | None:
    """A partition directory's :data:`RELEASED_FILE` (None when it has none; an unreadable one
    says only that it was released)."""
    path = directory / RELEASED_FILE
    if not path.is_file():
        return None
    try:
        marked = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        marked = None
    return marked if isinstance(marked, dict) else {"at": None, "how": "released"}


def _write_released(directory: Path, how: str | None) -> None:
    path = directory / RELEASED_FILE
    try:
        if how is None:
            path.unlink(missing_ok=True)
        elif path.parent.is_dir():
            replace_file(path, orjson.dumps({"at": time.time(), "how": how}))
    except OSError as exc:
        log.warning("cannot update %s: %s", path, exc)
