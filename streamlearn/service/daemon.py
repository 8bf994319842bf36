"""The serving loop: poll → decode → decide → publish → join → learn → maybe checkpoint.

Each iteration works on one micro-batch (what one poll returns):

1. decode + validate the instances and the feedback (:mod:`streamlearn.events`);
   every rejection goes to the dead-letter topic with its reason;
2. decide all new instances with one ``learner.decide`` call (keys = event ids,
   so a decision is a pure function of seed, id and learner state), journal
   the decisions, publish them keyed by id, record them as pending joins;
3. join the feedback (:mod:`streamlearn.stream.join`), advance the join clocks
   (:mod:`streamlearn.stream.clock`), and apply every decision that closed with one ``learner.update`` call;
4. checkpoint every N input messages or T seconds (:mod:`streamlearn.stream.checkpoint`).

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

import base64
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from streamlearn.errors import StateError, TransportError
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.events import Rejection, decode_feedback, decode_instances
from streamlearn.features import take_rows
from streamlearn.learners.base import Learner
from streamlearn.service.counters import Counters, tracker_arrays, tracker_load
from streamlearn.service.metrics import Observer
from streamlearn.service.settings import DaemonSettings, blas_threads, dead_letter_value
from streamlearn.stream.align import InputAligner
from streamlearn.stream.checkpoint import Checkpointer, Offsets
from streamlearn.stream.join import EXPIRED, JOINED, SHED, PendingJoins
from streamlearn.stream.transport import Message, Transport

__all__ = ["Daemon", "DaemonSettings", "dead_letter_value"]

log = logging.getLogger("streamlearn.daemon")


class Daemon:
    """The streamlearn serving loop; see the module docstring for its invariants.

    Parameters
    ----------
    settings
        :class:`DaemonSettings` (``Config.to_daemon_settings()``).
    transport
        Any :class:`~streamlearn.stream.transport.Transport`.
    learner
        The learner to serve (replaced by the checkpointed one on restore).
    observer
        Metrics sink (no-op by default).
    wall_clock
        Unix seconds (injectable for tests).

    Examples
    --------
    >>> from streamlearn.learners.banditron import Banditron
    >>> from streamlearn.stream.memory import InMemoryTransport
    >>> transport = InMemoryTransport()
    >>> _ = transport.append_instance(b"ev-1", b'{"id": "ev-1", "x": [1.0, 0.0, 2.0]}')
    >>> settings = DaemonSettings(learner_n_actions=2, learner_n_features=3)
    >>> daemon = Daemon(settings, transport, Banditron(2, 3, seed=1))
    >>> daemon.run(max_events=1)
    >>> decision = orjson.loads(transport.broker.messages("decisions")[0].value)
    >>> sorted(decision), decision["id"], daemon.counters.decisions
    (['action', 'explored', 'id', 'model', 'prob', 'ts'], 'ev-1', 1)
    """

    def __init__(self, settings: DaemonSettings, transport: Transport, learner: Learner,
                 observer: Observer | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.transport = transport
        self.learner = learner
        self.observer = observer if observer is not None else Observer()
        self.wall_clock = wall_clock
        self.n_actions, self.n_features = settings.learner_n_actions, settings.learner_n_features
        self.join = PendingJoins(self.n_actions, self.n_features, settings.join_settings())
        self.tracker = OnlineErrorTracker(settings.metrics_window)
        self.counters = Counters()
        self.offsets: Offsets = {}
        self.model_name = settings.model_name or type(learner).__name__.lower()
        self.checkpointer = (Checkpointer(settings.checkpoint_dir, settings.checkpoint_keep,
                                          settings.checkpoint_every_events,
                                          settings.checkpoint_every_seconds,
                                          settings.checkpoint_fsync_journal)
                             if settings.checkpoint_dir else None)
        self._journaled: dict[str, Any] = {}
        self.aligner = InputAligner(transport, settings.limits_poll_order_wait_seconds)
        self._stop = threading.Event()
        self._retry_checkpoint_at = 0.0
        self.ready = False
        self.limits = settings.limits()

    # ------------------------------------------------------------------ control
    def request_stop(self) -> None:
        """Ask the loop to stop after the current batch (safe from a signal handler)."""
        self._stop.set()

    def run(self, max_events: int | None = None) -> None:
        """Serve until :meth:`request_stop` (or ``max_events`` input messages), then checkpoint."""
        self.restore()
        self.observer.on_start(type(self.learner).__name__, repr(self.learner.exploration),
                               type(self.transport).__name__)
        self.ready = True
        try:
            with blas_threads(self.settings.blas_threads):
                while not self._stop.is_set():
                    if max_events is not None and self.counters.messages >= max_events:
                        break
                    self.step()
            self.ready = False
            self.checkpoint(final=True)
        finally:
            self.ready = False
            if self.checkpointer is not None:
                self.checkpointer.close()

    def restore(self) -> None:
        """Load the newest good checkpoint, seek the transport to its offsets."""
        if self.checkpointer is None:
            return
        restored = self.checkpointer.restore()
        if restored is None:  # a crash before the first checkpoint still left its journal
            self._journaled = self.checkpointer.journal.load(0)
            return
        arrays, meta = restored.arrays, restored.meta
        try:
            self.learner = type(self.learner).from_state(
                {k: v for k, v in arrays.items() if k.startswith(("learner.", "exploration."))},
                meta["learner"])
            got = (self.learner.n_actions, self.learner.n_features)
            if got != (self.n_actions, self.n_features):
                raise ValueError(f"it holds a learner with (K, d) = {got}; "
                                 f"{(self.n_actions, self.n_features)} are configured")
            self.join = PendingJoins.restore(self.n_actions, self.n_features,
                                             self.settings.join_settings(), arrays, meta["join"])
            tracker_load(self.tracker, arrays, meta["tracker"])
            self.counters = Counters.from_json(meta["counters"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"checkpoint {restored.seq} in {self.settings.checkpoint_dir} does "
                             f"not fit this daemon: {exc!r}") from exc
        self.offsets = dict(restored.offsets)
        self._journaled = self.checkpointer.journal.load(restored.seq)
        assigned = self.transport.assignment()
        self.transport.seek({k: v for k, v in self.offsets.items() if k in assigned})
        log.info("restored checkpoint %d (%d pending joins, %d journaled decisions)",
                 restored.seq, len(self.join), len(self._journaled))

    # --------------------------------------------------------------------- loop
    def step(self) -> None:
        """One iteration on one micro-batch."""
        s = self.settings
        try:
            messages = self.aligner.poll(s.limits_poll_max_records, s.limits_poll_timeout_seconds)
        except TransportError as exc:
            log.warning("poll failed, retrying in %.1f s: %s", s.retry_seconds, exc)
            self._stop.wait(s.retry_seconds)
            messages = []
        wall = self.wall_clock()
        # The batch is in event-time order. Instances before its first feedback are decided
        # first; the feedback is learned before the later instances are decided, so no
        # instance is decided without the feedback that came before it (a replayed backlog).
        instances_topic = self.transport.instances_topic
        cut = next((i for i, m in enumerate(messages) if m.topic != instances_topic), len(messages))
        later = [m for m in messages[cut:] if m.topic == instances_topic]
        feedback = [m for m in messages[cut:] if m.topic == self.transport.feedback_topic]
        if cut:
            self._on_instances(messages[:cut], wall)
        if feedback:
            self._on_feedback(feedback, wall)
        self._mark_idle(messages, wall)
        clocks = self.counters.clocks
        for fb in self.join.advance(clocks.now("feedback", wall), clocks.now("instances", wall)):
            src = fb.source
            key, value = (None if src[k] is None else base64.b64decode(src[k])
                          for k in ("key_b64", "value_b64"))
            self._dead_letter(Rejection("unknown_id", "no decision with this id", src["topic"],
                                        src["partition"], src["offset"], key, value, fb.event_id))
            self.counters.feedback["unknown"] += 1
            self.observer.on_feedback("unknown", 1)
        self._learn()
        if later:
            self._on_instances(later, wall)
            self._learn()  # feedback held for these decisions (arrived first) joined on arrival
        self.offsets.update({(m.topic, m.partition): m.offset + 1 for m in messages})
        self.counters.messages += len(messages)
        self.observer.on_pending(len(self.join) + len(self.join.early))
        if self.checkpointer is not None and self.checkpointer.due(len(messages)):
            self.checkpoint()

    def _clamp(self, ts: np.ndarray, wall: float) -> np.ndarray:
        """Event times from the future (beyond the allowed clock skew) count as now + skew.

        One message with a wild timestamp must not move the join clock and expire
        every pending decision.
        """
        return np.minimum(ts, wall + self.settings.join_max_clock_skew_seconds)

    def _mark_idle(self, messages: list[Message], wall: float) -> None:
        """Input partitions caught up with nothing waiting: their clocks follow the wall."""
        seen = {(m.topic, m.partition) for m in messages}
        for topic, partition in self.aligner.idle - seen:
            stream = "instances" if topic == self.transport.instances_topic else "feedback"
            self.counters.clocks.mark_idle(stream, [partition], wall)

    def _on_instances(self, messages: list[Message], wall: float) -> None:
        batch, rejected = decode_instances(messages, self.n_features, self.n_actions, self.limits)
        self.observer.on_batch(len(messages), "instances")
        known = self.join.is_known(batch.ids)
        for i in np.flatnonzero(known):
            m = batch.messages[i]
            rejected.append(Rejection("duplicate_id", "an instance with this id is already known",
                                      m.topic, m.partition, m.offset, m.key, m.value, batch.ids[i]))
        self._reject_all(rejected)
        if known.any():
            keep = np.flatnonzero(~known)
            batch.X = take_rows(batch.X, keep)
            batch.mask = None if batch.mask is None else batch.mask[keep]
            batch.ids = [batch.ids[i] for i in keep]
            batch.messages = [batch.messages[i] for i in keep]
            batch.labels, batch.ts = batch.labels[keep], batch.ts[keep]
            batch.partitions, batch.offsets = batch.partitions[keep], batch.offsets[keep]
        B = len(batch)
        if B == 0:
            return
        self.observer.on_instances(B)
        actions, probs, records, fresh = self._decide(batch.ids, batch.X, batch.mask, wall)
        # a decision's window opens when it is made (journaled ones: when first made)
        decided_at = np.array([r["ts"] for r in records], dtype=np.float64)
        clocks = self.counters.clocks
        clocks.observe("instances", batch.partitions, decided_at)
        clocks.observe("feedback", batch.partitions, decided_at, floor_only=True)
        for event_id, record in zip(batch.ids, records, strict=True):
            self._produce(self.transport.decisions_topic, event_id.encode("utf-8"),
                          orjson.dumps(record))
        self.join.add_decisions(batch.ids, batch.X, actions, probs, batch.labels, decided_at,
                                batch.partitions, clocks.latest(wall))
        explored = actions != np.argmax(probs, axis=1)
        self.counters.instances += B
        self.counters.instance_batches += 1
        self.counters.decisions += B
        self.counters.explored += int(explored.sum())
        # latency of decisions made now; re-emitted (journaled) ones keep their first ts
        produced_at = np.array([batch.messages[i].timestamp_ms for i in fresh.tolist()],
                               dtype=np.float64) / 1e3
        self.observer.on_decisions(B, int(explored.sum()), self.wall_clock() - produced_at)
        if len(fresh) < B:
            self.observer.on_reemitted(B - len(fresh))
        self.observer.on_action_decisions(actions)
        allowed = probs.shape[1] if batch.mask is None else batch.mask.sum(axis=1)
        gammas = (1.0 - probs.max(axis=1)) * allowed / np.maximum(allowed - 1, 1)
        self.observer.on_gamma(float(gammas.mean()))

    def _decide(self, ids: list[str], X: Any, mask: np.ndarray | None,
                wall: float) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]], np.ndarray]:
        """Decide a batch: journaled decisions are reused, the rest decided in one call.

        Returns actions, probabilities, decision records and the rows decided now.
        """
        B = len(ids)
        actions = np.zeros(B, dtype=np.int64)
        probs = np.zeros((B, self.n_actions))
        records: list[dict[str, Any]] = [{}] * B
        old = [self._journaled.pop(i, None) for i in ids] if self._journaled else [None] * B
        fresh = np.array([j for j, o in enumerate(old) if o is None], dtype=np.int64)
        for j, o in enumerate(old):
            if o is not None:
                actions[j], probs[j], records[j] = o.action, o.probs, o.message
        self.learner.n_decided_ += B - len(fresh)  # journaled rounds count as decided
        if len(fresh):
            mask_f = None if mask is None else mask[fresh]
            a, p = self.learner.decide(take_rows(X, fresh), mask_f, keys=[ids[j] for j in fresh])
            actions[fresh], probs[fresh] = a, p
            exploit = np.argmax(p, axis=1)
            model = f"{self.model_name}-v{self.counters.model_version}"
            new = [{"id": ids[j], "action": int(a[n]), "prob": float(p[n, a[n]]),
                    "explored": bool(a[n] != exploit[n]), "model": model, "ts": wall}
                   for n, j in enumerate(fresh.tolist())]
            for n, j in enumerate(fresh.tolist()):
                records[j] = new[n]
            if self.checkpointer is not None:
                self.checkpointer.journal.append([ids[j] for j in fresh], p, new)
        return actions, probs, records, fresh

    def _on_feedback(self, messages: list[Message], wall: float) -> None:
        batch, rejected = decode_feedback(messages, self.limits)
        self.observer.on_batch(len(messages), "feedback")
        batch.ts = self._clamp(batch.ts, wall)
        partitions = np.array([m.partition for m in batch.messages], dtype=np.int64)
        self.counters.clocks.observe("feedback", partitions, batch.ts)
        self.counters.clocks.observe("instances", partitions, batch.ts, floor_only=True)
        now = self.counters.clocks.latest(wall)
        for i, outcome in self.join.add_feedback(batch.ids, batch.rewards, batch.ts,
                                                 batch.messages, now):
            if outcome in ("duplicate", "unknown"):
                m = batch.messages[i]
                rejected.append(Rejection(f"{outcome}_id", f"feedback for a {outcome} decision id",
                                          m.topic, m.partition, m.offset, m.key, m.value,
                                          batch.ids[i]))
            if outcome in ("duplicate", "aggregated", "unknown", "late"):
                name = "duplicate" if outcome == "aggregated" else outcome
                self.counters.feedback[name] += 1
                self.observer.on_feedback(name, 1)
        self._reject_all([r for r in rejected if r.reason not in ("duplicate_id", "unknown_id")])
        for r in rejected:
            if r.reason in ("duplicate_id", "unknown_id"):
                self._dead_letter(r)

    def _learn(self) -> None:
        """Apply every decision closed by this batch with one update call."""
        closed = self.join.drain()
        if not len(closed):
            return
        joined, expired = closed.outcome == JOINED, closed.outcome == EXPIRED
        shed = int((closed.outcome == SHED).sum())
        self.counters.record_closed(closed.ids, joined, expired, closed.learn, shed)
        self.observer.on_feedback("joined", int(joined.sum()), closed.delays[joined])
        self.observer.on_feedback("expired", int(expired.sum()))
        if shed:
            self.observer.on_shed(shed)
        rows = np.flatnonzero(closed.learn)
        if not len(rows):
            return
        a, r, p = closed.actions[rows], closed.rewards[rows], closed.probs[rows]
        skipped_before = self.learner.n_skipped_updates_
        self.learner.update(take_rows(closed.X, rows), a, r, p)
        skipped = self.learner.n_skipped_updates_ - skipped_before
        if skipped:
            log.warning("%d updates skipped: they would have made the model non-finite", skipped)
            self.observer.on_skipped_updates(skipped)
        self.counters.model_version += 1
        labels = closed.labels[rows]  # -1 where the instance carried no label
        labelled = labels >= 0
        self.tracker.observe(a, r, labels, p)
        self.observer.on_action_rewards(a, r)
        self.observer.on_rewards(float(r.sum()))
        self.observer.on_mistakes(float((1.0 - r).sum()))
        if labelled.any():
            self.observer.on_regret(float(((a != labels) & labelled).sum()))
        self.observer.on_error_rates(self.tracker.error_rate, self.tracker.window_error_rate,
                                     self.tracker.exploit_error_estimate)
        self.observer.on_model_version(self.counters.model_version)

    # -------------------------------------------------------------- dead letters
    def _reject_all(self, rejections: list[Rejection]) -> None:
        for rejection in rejections:
            self._dead_letter(rejection)

    def _dead_letter(self, rejection: Rejection) -> None:
        self._produce(self.transport.dead_letter_topic, rejection.key,
                      dead_letter_value(rejection, self.settings.limits_dead_letter_max_bytes))
        self.counters.count_invalid(rejection.topic, rejection.reason)
        self.observer.on_invalid(rejection.topic, rejection.reason)

    def _produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Queue one message; while the transport refuses, wait and retry (the batch is
        half-done, so giving up is only allowed on a stop request: nothing is committed)."""
        while True:
            try:
                self.transport.produce(topic, key, value)
                return
            except TransportError as exc:
                if self._stop.is_set():
                    raise
                log.warning("cannot queue a message for %s, retrying in %.1f s: %s", topic,
                            self.settings.retry_seconds, exc)
                self._stop.wait(self.settings.retry_seconds)

    # -------------------------------------------------------------- checkpoints
    def checkpoint(self, final: bool = False) -> int | None:
        """Freeze state → flush → write snapshot → commit offsets; None if skipped or failed."""
        if self.checkpointer is None:
            return None
        wall = self.wall_clock()
        if not final and wall < self._retry_checkpoint_at:
            return None
        started = time.perf_counter()
        learner_arrays, learner_meta = self.learner.state()
        join_arrays, join_meta = self.join.export()
        t_arrays, t_meta = tracker_arrays(self.tracker)
        arrays = {**learner_arrays, **join_arrays, **t_arrays}
        meta = {"learner": learner_meta, "join": join_meta, "tracker": t_meta,
                "counters": self.counters.to_json(),
                "settings": dataclasses.asdict(self.settings)}
        try:
            seq = self.checkpointer.save(self.transport, arrays, meta, dict(self.offsets),
                                         self.settings.flush_timeout_seconds,
                                         carry=self._journaled.values())
        except TransportError as exc:  # the flush failed: nothing written, nothing committed
            log.warning("checkpoint skipped (nothing committed), retrying later: %s", exc)
            self._retry_checkpoint_at = wall + self.settings.retry_seconds
            return None
        self.observer.on_checkpoint(time.perf_counter() - started, wall)
        return seq

