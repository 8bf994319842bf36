"""The serving loop: poll → decode → decide → publish → join → learn → checkpoint.

The daemon is wiring around a decision core (:class:`~streamlearn.engine.DecisionCore`:
the decide → join → learn core the replays run too) and a serving mode
(:mod:`streamlearn.service.modes`: fixed actions, or candidate sets) that supplies what
differs between the two: decoding, deciding and the decision records, the extra state.
Each :meth:`Daemon.step` works on one micro-batch — what the input aligner releases, in event-time
order (:mod:`streamlearn.transport.align`):

1. the instances before the batch's first feedback are decoded, decided
   (one ``learner.decide``), journaled and published;
2. the feedback is decoded and joined, the join's clocks advance and expire
   what is due, and every decision that closed is learned (one ``learner.update``);
3. the instances after the first feedback are decided and published (so no
   instance is decided before feedback that came before it), and what closed
   on their arrival is learned;
4. the consumed offsets move forward, and a checkpoint is written when due.

Every rejection goes to the dead-letter topic with its reason.

Invariants (what makes ``kill -9`` at any moment lose nothing and apply
nothing twice):

* A checkpoint's state (learner, pending joins, counters) contains the effect
  of exactly the input before its offsets, and the offsets are committed to
  Kafka only after the snapshot is durable and every decision / dead letter of
  that input is acknowledged. After a crash the daemon restores the snapshot
  and re-reads the input after its offsets: feedback not in the snapshot is
  applied once more, feedback in it is not re-read.
* A re-read instance whose decision was journaled before the crash gets that
  same decision (action, probabilities, message bytes), so re-emitted
  decisions are identical and the learner learns from what was published.
* After an unhandled failure nothing is committed; a graceful stop
  (:meth:`Daemon.request_stop`) ends with a final checkpoint.
* Transport errors (a broker outage) never stop the loop: polling is retried
  and a checkpoint whose flush fails is retried later, committing nothing.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn.durability.changelog import Changelog
from streamlearn.durability.checkpoint import (
    Checkpointer,
    ConsumedOffsets,
    JournaledDecision,
    Restored,
)
from streamlearn.engine import DecisionCore
from streamlearn.errors import TransportError
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.events import Rejection
from streamlearn.join.aggregate import TYPE_LABELS, type_label
from streamlearn.join.pending import Outcome, PendingJoins
from streamlearn.service.adoption import Adoption
from streamlearn.service.claims import OwnershipLost
from streamlearn.service.counters import Counters
from streamlearn.service.metrics import CHECKPOINT_LOCAL_ONLY, JOURNAL_RETRY, Observer
from streamlearn.service.modes import ServingMode, mode_for
from streamlearn.service.outputs import Outputs, dead_letter_value
from streamlearn.service.retraining import Retraining
from streamlearn.service.settings import DaemonSettings, blas_threads
from streamlearn.snapshot import replace_file
from streamlearn.transport.align import InputAligner
from streamlearn.transport.embedded import EmbeddedTransport
from streamlearn.transport.protocol import Message, Transport

__all__ = ["Daemon", "DaemonSettings", "dead_letter_value"]

log = logging.getLogger("streamlearn.daemon")

#: a decision journal write waiting this long for the changelog makes ``/readyz`` answer 503
#: (its first try may wait up to the changelog's timeout before it counts as refused)
JOURNAL_SLOW_S = 5.0

#: the adoption mode as of its last switch, written at the switch (``<checkpoint.dir>/``):
#: a restore whose checkpoint missed the switch takes it from here
MODE_FILE = "rollout-mode.json"

_DEAD_LETTERED = {Outcome.DUPLICATE: "duplicate_id", Outcome.UNKNOWN: "unknown_id"}


class Daemon:
    """The streamlearn serving loop; see the module docstring for its invariants.

    Parameters
    ----------
    settings
        :class:`DaemonSettings` (``Config.to_daemon_settings()``).
    transport
        Any :class:`~streamlearn.transport.protocol.Transport`.
    learner
        The learner to serve (replaced by the checkpointed one on restore).
    observer
        Metrics sink (no-op by default).
    wall_clock
        Unix seconds (injectable for tests).

    Examples
    --------
    >>> from streamlearn.learners.banditron import Banditron
    >>> from streamlearn.transport.memory import InMemoryTransport
    >>> transport = InMemoryTransport()
    >>> _ = transport.append_instance(b"ev-1", b'{"id": "ev-1", "x": [1.0, 0.0, 2.0]}')
    >>> from streamlearn.service.settings import LearnerConfig
    >>> settings = DaemonSettings(learner=LearnerConfig(n_actions=2, n_features=3))
    >>> daemon = Daemon(settings, transport, Banditron(2, 3, seed=1))
    >>> daemon.run(max_instances=1)
    >>> decision = orjson.loads(transport.broker.messages("decisions")[0].value)
    >>> sorted(decision), decision["id"], daemon.counters.decisions
    (['action', 'explored', 'id', 'model', 'prob', 'ts'], 'ev-1', 1)
    """

    def __init__(self, settings: DaemonSettings, transport: Transport, learner: Any,
                 observer: Observer | None = None,
                 wall_clock: Callable[[], float] = time.time,
                 mode: ServingMode | None = None, changelog: Changelog | None = None) -> None:
        self.settings = settings
        self.transport = transport
        self.observer = observer if observer is not None else Observer()
        self.wall_clock = wall_clock
        self.mode = mode if mode is not None else mode_for(settings)
        self.engine: DecisionCore = self.mode.make_engine(learner)
        self.tracker = OnlineErrorTracker(settings.metrics.window)
        self.counters = Counters()
        self.model_name = settings.model_name or type(learner).__name__.lower()
        self.checkpointer = (Checkpointer(settings.checkpoint.dir, settings.checkpoint.keep,
                                          settings.checkpoint.every_events,
                                          settings.checkpoint.every_seconds,
                                          settings.checkpoint.fsync_journal, changelog)
                             if settings.checkpoint.dir else None)
        self.offsets = (self.checkpointer.offsets if self.checkpointer is not None
                        else ConsumedOffsets())
        self._journaled: dict[str, JournaledDecision] = {}
        self.aligner = InputAligner(transport, settings.limits.poll_order_wait_seconds)
        self._stop = threading.Event()
        self.outputs = Outputs(transport, self._stop, settings.retry_seconds,
                               settings.limits.dead_letter_max_bytes)
        self._retry_checkpoint_at = 0.0
        self._written_at: dict[int, tuple[float, float]] = {}  # background snapshots: when begun
        self._local_only_seen = 0  # checkpoints kept off the changelog, counted in the metrics
        self.started_at_instances = 0
        self.polling_seconds = 0.0  # spent in poll: waiting for input (and, embedded, making it)
        self._drifts_seen = learner.drift_detections_
        # a replica's check that it still owns this partition (service/claims.py), run right
        # before new decisions are journaled; None: this daemon owns its input alone
        self.owner_check: Callable[[], bool] | None = None
        # a replica's view of whether the group still assigns it this partition, asked
        # while the changelog refuses the journal: a partition moved meanwhile is dropped
        # rather than retried (its new owner writes the changelog now)
        self.still_assigned: Callable[[], bool] | None = None
        self.ready = False
        # when the changelog began refusing this partition's journal (monotonic s; None while
        # it accepts): the loop holds the batch's decisions meanwhile (see held_by_journal)
        self.journal_refused_since: float | None = None
        self.journal_waiting_since: float | None = None  # a journal write under way, since
        # the daemon reports its pending joins and error rates; a replica's partition daemons
        # leave them to the replica, which reports its partitions' together
        self.reports_totals = True
        self.limits = settings.limits.decode_limits()
        self.retraining = (Retraining(settings, self.observer, wall_clock)
                           if settings.retrain_enabled or settings.experience.dir else None)
        if self.retraining is not None:  # each change of the rankers' state: checkpoint it
            self.retraining.store.on_saved = self._checkpoint_soon
        self.adoption = Adoption(settings.adoption_settings(), self._on_rollout_switch)
        self._step_back_requested = False
        self._reward_weights = self.engine.joins.settings.reward_weights
        # every type label visible from the start (at 0)
        self.observer.on_feedback_types(dict.fromkeys((*self._reward_weights, *TYPE_LABELS), 0))

    @property
    def instance_messages(self) -> int:
        """Instance messages handled so far: decided, or dead-lettered (the counters span every
        restart)."""
        rejected = self.counters.invalid.get(self.transport.instances_topic, {})
        return self.counters.instances + sum(rejected.values())

    @property
    def instances_this_run(self) -> int:
        """Instance messages handled since :meth:`run` started, decided or dead-lettered (so
        ``run(max_instances=N)`` stops after N messages even when some are rejected)."""
        return self.instance_messages - self.started_at_instances

    @property
    def learner(self) -> Any:
        """The engine's learner (a :class:`~streamlearn.learners.base.Learner`, or a candidate-set
        learner in candidate mode)."""
        return self.engine.learner

    def replace_learner(self, learner: Any) -> None:
        """Serve ``learner`` from the next batch on (a replica adopting the model its group
        merged, :mod:`streamlearn.sync`)."""
        self.engine.learner = learner
        self._drifts_seen = learner.drift_detections_

    @property
    def join(self) -> PendingJoins:
        return self.engine.joins

    # ------------------------------------------------------------------ control
    @property
    def pending(self) -> int:
        """Decisions waiting for feedback plus early feedback held."""
        return len(self.join) + len(self.join.early)

    def held_by_journal(self) -> str | None:
        """Why this partition publishes no decisions, when its changelog refuses the journal
        (the loop retries the batch until it is written); None otherwise. For ``/readyz``."""
        since, waiting = self.journal_refused_since, self.journal_waiting_since
        now = time.monotonic()
        if since is not None:
            return (f"the changelog has refused the decision journal for {now - since:.0f} s: "
                    "decisions held")
        if waiting is not None and now - waiting >= JOURNAL_SLOW_S:
            return (f"a decision journal write has waited {now - waiting:.0f} s for the "
                    "changelog: decisions held")
        return None

    def request_stop(self) -> None:
        """Ask the loop to stop after the current batch (safe from a signal handler). From
        now on its checkpoints wait for the broker ``flush_timeout_seconds`` at most in all,
        the final one's and one being written in the background (which the current batch
        may be waiting for) alike."""
        self.stop_waiting_after(self.stop_deadline())
        self._stop.set()

    def run(self, max_instances: int | None = None) -> None:
        """Serve until :meth:`request_stop` (or ``max_instances`` decided by this run), then
        checkpoint."""
        self.restore()
        self.started_at_instances = self.instance_messages
        exploration = self.learner.exploration
        transport = getattr(self.transport, "inner", self.transport)  # past the lag tracker
        self.observer.on_start(type(self.learner).__name__,
                               exploration if isinstance(exploration, str) else repr(exploration),
                               type(transport).__name__)
        self.ready = True
        try:
            with blas_threads(self.settings.blas_threads):
                while not self._stop.is_set():
                    if max_instances is not None and self.instances_this_run >= max_instances:
                        break
                    self.step()
            self.ready = False
            self.checkpoint(final=True)
        finally:
            self.close()

    def close(self) -> None:
        """Release the checkpointer and the retraining worker (no checkpoint: see :meth:`run`)."""
        self.ready = False
        if self.checkpointer is not None:
            self.checkpointer.close()
        if self.retraining is not None:
            self.retraining.close()

    def restore(self) -> None:
        """Load the newest good checkpoint, seek the transport to its offsets."""
        topics = (self.transport.instances_topic, self.transport.feedback_topic)
        restored = None
        if self.checkpointer is not None:
            started = time.perf_counter()
            restored = self.checkpointer.restore(accept=self._thaw, topics=topics)
            self.observer.on_restore(self.checkpointer.restored_from,
                                     time.perf_counter() - started)
        if self.retraining is not None:
            self.retraining.open(restored.meta.get("experience") if restored else None,
                                 restored is not None, _rollout_state(restored))
        if restored is not None and restored.meta.get("adoption") is not None:
            self.adoption.restore({k: v for k, v in restored.arrays.items()
                                   if k.startswith("adoption.")}, restored.meta["adoption"])
        self._recorded_mode()
        self._report_rollout()
        if self.checkpointer is None:
            return
        if restored is None:  # a crash before the first checkpoint still left its journal
            self._journaled = self.checkpointer.journal.load(0, self.mode.journal_width)
            return
        self._drifts_seen = self.learner.drift_detections_
        self.offsets = self.checkpointer.offsets
        self._journaled = self.checkpointer.journal.load(restored.seq, self.mode.journal_width)
        assigned = self.transport.assignment()
        self.transport.seek({k: v for k, v in self.offsets.snapshot().items() if k in assigned})
        # the directory names the partition of a group replica (partition-<p>)
        log.info("restored checkpoint %d from %s (%d pending joins, %d journaled decisions) "
                 "into %s", restored.seq,
                 "the changelog" if self.checkpointer.restored_from == "changelog" else "disk",
                 len(self.join), len(self._journaled), self.checkpointer.directory)
        if isinstance(self.transport, EmbeddedTransport) and len(self.join):
            # the embedded caller is new with this process: it answers what the restored
            # daemon still awaits, as a real caller's feedback topic would hold it
            decisions = self.mode.pending_decisions(self.engine)
            self.transport.answer_restored(decisions)
            log.info("the embedded caller answers the %d restored pending decisions",
                     len(decisions))

    def _thaw(self, restored: Restored) -> None:
        """Replace the engine and counters by the restored snapshot's."""
        self.engine, self.counters = self.mode.thaw(restored, self.engine, self.tracker)

    def _freeze(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return self.mode.freeze(self.engine, self.tracker, self.counters, self.settings)

    # --------------------------------------------------------------------- loop
    def step(self) -> None:
        """One iteration on one micro-batch (see the module docstring)."""
        if self._step_back_requested:
            self._step_back_requested = False
            self.adoption.step_back()
        messages = self._poll()
        wall = self.wall_clock()
        before, feedback, after = self._split(messages)
        self._decide(before, wall)
        self._join(feedback, wall)
        self._expire(messages, wall)
        self._learn()
        self._decide(after, wall)
        self._learn()
        self.offsets.consumed(messages)
        self.counters.messages += len(messages)
        pending = self.pending
        if self.reports_totals:
            self.observer.on_pending(pending)
        if self.retraining is not None:
            self.retraining.tick(self.join.oldest_pending)
        if self.checkpointer is not None:
            self._settle_checkpoint(block=False)
            if self.checkpointer.due(len(messages), pending):
                self.checkpoint(background=True)

    def _poll(self) -> list[Message]:
        s = self.settings
        began = time.perf_counter()
        try:
            return self.aligner.poll(s.limits.poll_max_records, s.limits.poll_timeout_seconds)
        except TransportError as exc:
            log.warning("poll failed, retrying in %.1f s: %s", s.retry_seconds, exc)
            self._stop.wait(s.retry_seconds)
            return []
        finally:
            self.polling_seconds += time.perf_counter() - began

    def _split(self, messages: list[Message]) -> tuple[list[Message], list[Message], list[Message]]:
        """(instances before the first feedback, the feedback, the instances after it)."""
        instances_topic = self.transport.instances_topic
        cut = next((i for i, m in enumerate(messages) if m.topic != instances_topic), len(messages))
        rest = messages[cut:]
        return (messages[:cut], [m for m in rest if m.topic == self.transport.feedback_topic],
                [m for m in rest if m.topic == instances_topic])

    # ------------------------------------------------------------------ phases
    def _decide(self, messages: list[Message], wall: float) -> None:
        """Decode, decide (journaled decisions reused), journal, publish."""
        if not messages:
            return
        batch, rejected = self.mode.decode_instances(messages, self.limits)
        self.observer.on_batch(len(messages), "instances")
        known = self.engine.is_known(batch.ids)
        self._reject_with_known(rejected, known, batch.ids, batch.messages)
        if known.any():
            batch = batch.take(np.flatnonzero(~known))
        if len(batch) == 0:
            return
        self.observer.on_instances(len(batch))
        reused = ({i: j for i in batch.ids if (j := self._journaled.pop(i, None)) is not None}
                  if self._journaled else {})
        published = self.mode.decide(self, batch, wall, reused)
        late = self.join.take_held_late()
        if late:
            self.counters.feedback["late"] += late
            self.observer.on_feedback("late", late)
        self.outputs.decisions([i.encode("utf-8") for i in batch.ids], published.values)
        self._count_decided(batch.messages, published.fresh, published.n_explored,
                            published.actions, published.gamma)

    def _count_decided(self, messages: list[Message], fresh: np.ndarray, n_explored: int,
                       actions: np.ndarray, gamma: float) -> None:
        """Counters and metrics of a published batch (``fresh``: the rows decided now)."""
        B = len(messages)
        self.counters.instances += B
        self.counters.instance_batches += 1
        self.counters.decisions += B
        self.counters.explored += n_explored
        self.counters.reemitted += B - len(fresh)
        # latency of decisions made now; re-emitted (journaled) ones keep their first ts
        produced_at = np.array([messages[i].timestamp_ms for i in fresh.tolist()],
                               dtype=np.float64) / 1e3
        self.observer.on_decided(B, n_explored, self.wall_clock() - produced_at, B - len(fresh),
                                 actions, gamma)

    def _reject_with_known(self, rejected: list[Rejection], known: np.ndarray, ids: list[str],
                           messages: list[Message]) -> None:
        """Dead-letter the decoder's rejections and the instances whose id is already known."""
        for i in np.flatnonzero(known).tolist():
            m = messages[i]
            rejected.append(Rejection(
                "duplicate_id", f"expected an id not decided recently, got {ids[i]!r:.80}, which "
                                "is pending, recently closed or earlier in this batch",
                m.topic, m.partition, m.offset, m.key, m.value, ids[i]))
        self._reject(rejected)

    def journal_and_encode(self, values: list[bytes], fresh: np.ndarray,
                           records: list[dict[str, Any]], probs: np.ndarray,
                           columns: dict[str, np.ndarray] | None = None) -> list[bytes]:
        """Journal the new decisions (before they are produced), then encode them in place:
        ``values[j]`` for each row ``j`` of ``fresh``; ``columns``: the engine's per-decision
        columns, journaled with each decision."""
        if self.owner_check is not None and not self.owner_check():
            raise OwnershipLost(f"{self.transport.instances_topic}: another replica claimed "
                                "this partition; its decisions are not journaled here")
        if self.checkpointer is not None:
            self._append_journal([r["id"] for r in records], probs, records, columns)
        for j, record in zip(fresh.tolist(), records, strict=True):
            values[j] = orjson.dumps(record)
        return values

    def _append_journal(self, ids: list[str], probs: np.ndarray, records: list[dict[str, Any]],
                        columns: dict[str, np.ndarray] | None) -> None:
        """Journal a batch; while the changelog's broker is away, wait and retry (nothing of
        the batch is published before it is journaled)."""
        assert self.checkpointer is not None
        while True:
            self.journal_waiting_since = time.monotonic()
            try:
                self.checkpointer.journal.append(ids, probs, records, columns)
                if self.journal_refused_since is not None:
                    # the refused write aborted the changelog's transaction, and with it the
                    # journal written since the last checkpoint: Kafka's log cleaner removes
                    # an aborted transaction's records, so checkpoint what they held soon
                    self._checkpoint_soon()
                self.journal_refused_since = None
                return
            except TransportError as exc:  # not Fenced, an OwnershipLost: that propagates
                if self._stop.is_set():
                    raise
                if self.still_assigned is not None and not self.still_assigned():
                    raise OwnershipLost(f"the group no longer assigns this partition here "
                                        f"while its journal was refused ({exc})") from exc
                if self.journal_refused_since is None:
                    self.journal_refused_since = time.monotonic()
                log.warning("cannot journal decisions in the changelog, retrying in %.1f s: %s",
                            self.settings.retry_seconds, exc)
                self.observer.on_changelog_failure(JOURNAL_RETRY)
                self._stop.wait(self.settings.retry_seconds)
            finally:
                self.journal_waiting_since = None

    def _join(self, messages: list[Message], wall: float) -> None:
        """Decode and join the feedback; duplicates and unknown ids are dead-lettered."""
        if not messages:
            return
        batch, rejected = self.mode.decode_feedback(messages, self.limits)
        self.observer.on_batch(len(messages), "feedback")
        self._reject(rejected)
        outcomes = self.engine.feedback(batch.ids, batch.rewards, batch.ts,
                                        np.array([m.partition for m in batch.messages], np.int64),
                                        wall, batch.messages, batch.types)
        self._count_types(batch.types)
        self._count_outcomes(outcomes, batch.ids, batch.messages)

    def _count_types(self, types: list[str | None]) -> None:
        """Count the accepted feedback events by type: a configured one, ``other`` or ``none``."""
        if not types:
            return
        counted: dict[str, int] = {}
        for event_type, n in Counter(types).items():
            label = type_label(event_type, self._reward_weights)
            counted[label] = counted.get(label, 0) + n
        for label, n in counted.items():
            self.counters.feedback_types[label] = self.counters.feedback_types.get(label, 0) + n
        self.observer.on_feedback_types(counted)

    def _count_outcomes(self, outcomes: np.ndarray, ids: list[str],
                        messages: list[Message]) -> None:
        """Count the feedback outcomes; duplicates and unknown ids are dead-lettered."""
        counted: dict[str, int] = {}
        counts = np.bincount(outcomes, minlength=len(Outcome))  # the few small codes: no sort
        for code in np.flatnonzero(counts).tolist():
            outcome = Outcome(code)
            if outcome not in (Outcome.JOINED, Outcome.HELD):  # joined is counted when it closes
                counted[outcome.metric] = counted.get(outcome.metric, 0) + int(counts[code])
        for i in np.flatnonzero((outcomes == Outcome.DUPLICATE.value) | (outcomes == Outcome.UNKNOWN.value)
                                ).tolist():
            m, outcome = messages[i], Outcome(outcomes[i])
            detail = (f"expected one feedback per decision id (duplicate policy 'earliest'), got "
                      f"another for {ids[i]!r:.80}: its first has joined or is held for its "
                      f"decision" if outcome == Outcome.DUPLICATE else
                      f"expected feedback for a decided id, got {ids[i]!r:.80}: no such decision "
                      f"is pending or recently closed, and it cannot be held for one")
            self._reject([Rejection(_DEAD_LETTERED[outcome], detail, m.topic, m.partition,
                                    m.offset, m.key, m.value, ids[i])])
        for name, n in counted.items():
            self.counters.feedback[name] += n
            self.observer.on_feedback(name, n)

    def _expire(self, messages: list[Message], wall: float) -> None:
        """Advance the join's clocks (idle partitions follow the wall) and expire what is due."""
        seen = {(m.topic, m.partition) for m in messages}
        stream = {self.transport.instances_topic: "instances",
                  self.transport.feedback_topic: "feedback"}
        idle = [(stream[topic], partition) for topic, partition in self.aligner.idle - seen]
        journaled = self._journaled  # decided before a restart, instances not re-read yet
        settings = self.join.settings
        for fb in self.engine.advance(wall, idle, journaled.__contains__ if journaled else None):
            src = fb.source
            self._reject([Rejection("unknown_id", f"expected a decision with id "
                                                  f"{str(fb.event_id)!r:.80} within the backward "
                                                  f"window ({settings.early_window_s:g} s), got "
                                                  f"none, nor one closed recently (closed ids "
                                                  f"are remembered for one to two windows of "
                                                  f"{settings.remembered_s:g} s, or for the "
                                                  f"last {settings.max_pending:,} to "
                                                  f"{2 * settings.max_pending:,} closed when "
                                                  f"more close per window)",
                                    src.topic if src else self.transport.feedback_topic,
                                    src.partition if src else fb.partition,
                                    src.offset if src else -1, src.key if src else None,
                                    src.value if src else None, str(fb.event_id))])
            self.counters.feedback["unknown"] += 1
            self.observer.on_feedback("unknown", 1)

    def _learn(self) -> None:
        """Apply every decision closed so far with one update call."""
        learned = self.engine.learn()
        closed = learned.closed
        if not len(closed):
            return
        self.counters.record_closed(closed.ids, learned.joined, learned.expired, closed.learn,
                                    learned.shed)
        if self.retraining is not None:
            self.retraining.record(closed)
        adoption = self.adoption
        if "served_by" in closed.columns and adoption.mode != "online":
            kept = closed.learn
            adoption.observe(closed.columns["served_by"][kept], closed.rewards[kept],
                             closed.columns["baseline"][kept], len(self.join),
                             closed.columns["epoch"][kept])
            self._report_rollout()
        elif adoption.history or not math.isnan(adoption.agreement):
            self._report_rollout()  # online next to a baseline: the agreement goes on
        rows = learned.applied
        if len(rows):
            drifts = self.learner.drift_detections_ - self._drifts_seen
            if drifts > 0:
                log.info("the exploration detected a change (%d so far): exploring more",
                         self.learner.drift_detections_)
                self.observer.on_drift(drifts)
            self._drifts_seen = self.learner.drift_detections_
            self.counters.model_version += 1
            self.counters.skipped_updates += learned.skipped
            if learned.skipped:
                log.warning("%d updates skipped: they would have made the model non-finite",
                            learned.skipped)
            self.mode.track(self.tracker, closed, rows)
        self.observer.on_learned(learned, self.tracker if self.reports_totals else None,
                                 self.counters.model_version)

    # ------------------------------------------------------------------ rollout
    def request_step_back(self) -> None:
        """Ask the rollout to step back at the next step (SIGUSR2; safe from a signal handler):
        online → conservative → apprentice."""
        self._step_back_requested = True

    def _on_rollout_switch(self, old: str, new: str, why: str) -> None:
        self.observer.on_rollout_switch(new)
        self._report_rollout()
        self._record_mode()
        self._checkpoint_soon()

    def _record_mode(self) -> None:
        """Write the adoption mode to :data:`MODE_FILE` at the switch (atomically, fsync): the
        checkpoint that follows at the end of the step was lost to a kill -9 within ~50 ms of
        a SIGUSR2 step back, which the restart then undid (an outside test)."""
        path = self._mode_path()
        if path is None or not path.parent.is_dir():
            return
        try:
            replace_file(path, orjson.dumps(self.adoption.mode_record()))
        except OSError as exc:  # the checkpoint at the end of the step still records it
            log.warning("cannot write %s: %s", path, exc)

    def _mode_path(self) -> Path | None:
        directory = self.settings.checkpoint.dir
        return Path(directory) / MODE_FILE if directory else None

    def _recorded_mode(self) -> None:
        """After a restore: a switch :data:`MODE_FILE` holds and the checkpoint missed."""
        path = self._mode_path()
        if path is None or not path.is_file():
            return
        try:
            record = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("ignoring %s: %s", path, exc)
            return
        before = self.adoption.mode
        if isinstance(record, dict) and self.adoption.catch_up(record):
            log.warning("rollout: the checkpoint's mode (%s) was behind %s (a stop between "
                        "the switch and its checkpoint): %s", before, MODE_FILE,
                        self.adoption.mode)

    def _checkpoint_soon(self) -> None:
        """Checkpoint at the end of this step: what serves changed (an adoption mode switch,
        a step back, a promotion, a rollout step or rollback, each logged and in the rankers'
        history at once), and a crash before the periodic checkpoint would undo it (an
        outside test: a SIGUSR2 step back lost to a kill -9 8,400 messages later)."""
        if self.checkpointer is not None:
            self.checkpointer.request()

    def _report_rollout(self) -> None:
        """Who serves which share (the baseline, the learner, rankers it rolls out), the mode,
        the agreement and what each side earned."""
        a = self.adoption
        share = 1.0 if a.mode == "online" else a.share
        if not math.isnan(a.served_share):  # events without a baseline are the learner's
            share = a.served_share
        roles = {"learner": share}
        if self.retraining is not None and self.retraining.policy == "ranker":
            roles = {role: value * share for role, value in self.retraining.roles().items()}
        roles["baseline"] = 1.0 - share
        self.observer.on_rollout(roles)
        self.observer.on_rollout_mode(a.mode, a.agreement, a.slack if a.mode == "conservative"
                                      else float("nan"))
        for name, arm in a.stats.items():
            if arm.n or a.history:  # after a switch the comparisons start afresh: NaN, not
                # the last mode's values, until this mode has measured something
                self.observer.on_policy_value(name, "live", arm.mean, arm.lower(), arm.upper())
                self.observer.on_policy_live_value(name, arm.mean)

    # -------------------------------------------------------------- dead letters
    def _reject(self, rejections: list[Rejection]) -> None:
        for rejection in rejections:
            self.outputs.dead_letter(rejection)
            self.counters.count_invalid(rejection.topic, rejection.reason)
            self.observer.on_invalid(rejection.topic, rejection.reason)

    # -------------------------------------------------------------- checkpoints
    def stop_deadline(self) -> float:
        """When a stop beginning now stops waiting for the broker: ``flush_timeout_seconds``
        from now (a ``time.monotonic()``)."""
        return time.monotonic() + self.settings.flush_timeout_seconds

    def stop_waiting_after(self, deadline: float) -> None:
        """Stopping: the waits of this daemon's checkpoints on the broker (the final one's
        flush and changelog write, a snapshot still being written in the background) end by
        ``deadline`` (a ``time.monotonic()``; an earlier one set before stands)."""
        if self.checkpointer is not None:
            self.checkpointer.stop_waiting_after(deadline)

    def checkpoint(self, final: bool = False, background: bool = False) -> int | None:
        """Freeze state → flush → write snapshot → commit offsets; None if skipped or failed.

        The loop's periodic checkpoints are ``background`` ones: the snapshot is written on
        a thread of its own and its offsets committed, without waiting, once it is
        (:meth:`_settle_checkpoint`, every step) — writing and committing while the loop
        waits held every queued event for up to 200 ms (docs/performance.md); restore reads
        the snapshot's offsets, not the group's. Any other checkpoint is on disk and
        committed when this returns. A ``final`` one waits for the broker at most
        ``flush_timeout_seconds`` in all, or until the deadline the caller set
        (:meth:`stop_waiting_after`: the final checkpoints of a replica's stop share one)."""
        if self.checkpointer is None:
            return None
        if final:
            self.stop_waiting_after(self.stop_deadline())
        wall = self.wall_clock()
        if not final and wall < self._retry_checkpoint_at:
            return None
        self._settle_checkpoint(block=True)  # the one written in the background, if any
        started = time.perf_counter()
        arrays, meta = self._freeze()
        if self.retraining is not None:  # the log is flushed first: durable with the checkpoint
            meta["experience"] = self.retraining.position()
            rollout_arrays, meta["rollout"] = self.retraining.rollout.export()
            arrays.update(rollout_arrays)
        adoption_arrays, meta["adoption"] = self.adoption.export()
        arrays.update(adoption_arrays)
        try:
            seq = self.checkpointer.save(self.transport, arrays, meta,
                                         self.settings.flush_timeout_seconds,
                                         carry=self._journaled.values(), background=background,
                                         finish=PendingJoins.packed,
                                         handed_over=[name for name in arrays
                                                      if PendingJoins.exported_copy(name)])
        except TransportError as exc:  # the flush failed: nothing written, nothing committed
            log.warning("checkpoint skipped (nothing committed), retrying later: %s", exc)
            self._retry_checkpoint_at = wall + self.settings.retry_seconds
            return None
        if background:
            self._written_at[seq] = (started, wall)
        else:
            self._checkpointed(started, wall)
        return seq

    def _checkpointed(self, started: float, wall: float) -> None:
        """Count a checkpoint written (and the changelog writes that failed meanwhile)."""
        assert self.checkpointer is not None
        self.observer.on_checkpoint(time.perf_counter() - started, wall)
        local_only = self.checkpointer.local_only - self._local_only_seen
        if local_only:
            self.observer.on_changelog_failure(CHECKPOINT_LOCAL_ONLY, local_only)
            self._local_only_seen += local_only

    def _settle_checkpoint(self, block: bool) -> None:
        """Commit and count the snapshot written in the background once it is written."""
        assert self.checkpointer is not None
        seq = self.checkpointer.settle(self.transport, block=block)  # Fenced: OwnershipLost
        if seq is not None:
            started, wall = self._written_at.pop(seq)
            self._checkpointed(started, wall)


def _rollout_state(restored: Restored | None) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The rollout's arrays and JSON in a restored checkpoint (None: none recorded)."""
    if restored is None or restored.meta.get("rollout") is None:
        return None
    return ({k: v for k, v in restored.arrays.items() if k.startswith("rollout.")},
            restored.meta["rollout"])
