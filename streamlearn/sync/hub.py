"""The models topic: replicas publish their learners, the merger merges, every replica adopts.

One :class:`ModelHub` per replica reads the compacted models topic from its
beginning. A replica has one learner, shared by the daemons of the partitions
it serves (so one replica learns exactly as the single daemon does). Every
:attr:`every_s` seconds (the sync interval):

Only the merger reads the replicas' states (the link follows them while this
replica serves partition 0, from the ``states_from`` offset the newest global
model names); every replica reads the global models.

1. **publish** — if the replica's learner learned since its last publish, its
   whole state goes out as ``replica/<id>`` with the global version it is based
   on and the examples it learned since adopting that version;
2. **merge** (the replica serving partition 0 only: one merger at a time, the
   group protocol moves the role with the partition) — the replica states
   based on the current global version ``v`` are merged
   (:func:`~streamlearn.sync.merge.merge`, weighted by examples) into version
   ``v + 1``, published as ``global``, with the list of ``(replica, seq)``
   it includes. States based on an older version are stale and ignored (a
   killed replica's last state included);
3. **adopt** — when a global version newer than the replica's base arrives, its
   learner becomes that model plus its own progress it does not hold
   (:func:`~streamlearn.sync.merge.rebase`: since its included publish, or since
   its base when that publish missed the round). Decisions then carry
   ``model = <learner>-g<version>-v<local updates>``.

**Fencing.** The merger reads the topic to its end before it merges (it asks
the link to catch up and merges at the first round the link has; the serving
thread never waits for it), reads what arrived once more right before it
publishes version ``v + 1``, and publishes nothing if a version ≥ ``v + 1`` is
there already. That check alone cannot stop a replica paused between it and its
send (and which lost partition 0 meanwhile); the link fences such a replica at
the broker: the Kafka link's catch-up opens the merger's transactional producer
first, which makes the broker refuse every publish of the previous merger
(:mod:`streamlearn.sync.kafka_link`). Global versions on the topic are unique
and increasing. Readers adopt only versions newer than their own.

**Sends off the serving thread** (``background_sends``): a send to Kafka can wait on the
broker, so it runs in a thread of its own, one at a time (:mod:`streamlearn.sync.outbox`). A
round that finds the previous send unfinished neither publishes nor merges, so a merge's
catch-up always follows the model the merger sent before it.

Bounded loss, no double counting: a replica's progress is counted in the
global model once (its included publish, or carried by the rebase); what a
*killed* replica learned after its last included publish is lost with it (its
partitions' new owners re-learn the feedback after the partitions' last
checkpoints, so feedback is not lost — at most one sync interval of model
progress is).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from streamlearn.errors import StateError
from streamlearn.learners.base import Learner
from streamlearn.sync.codec import Assembler, chunk, decode_state, encode_state
from streamlearn.sync.merge import (
    merge,
    merge_counters,
    merge_exploration,
    rebase,
    rebase_exploration,
)
from streamlearn.sync.outbox import Outbox

__all__ = ["ModelHub", "ModelLink", "Served"]

log = logging.getLogger("streamlearn.sync")

Arrays = dict[str, np.ndarray]

CATCH_UP_S = 2.0  # the merger skips a round rather than wait longer for the topic's end


class ModelLink(Protocol):
    """The models topic as the hub needs it."""

    def send(self, key: bytes, values: list[bytes]) -> None: ...
    def fetch(self) -> list[bytes]: ...
    def request_catch_up(self) -> None: ...
    def caught_up(self) -> bool: ...
    def follow_states(self, on: bool, from_offset: int | None = None) -> None: ...
    def states_position(self) -> int | None: ...


class Served(Protocol):
    """A partition daemon as the hub sees it (the daemons of a replica share one learner)."""

    model_name: str

    @property
    def learner(self) -> Learner: ...
    def replace_learner(self, learner: Learner) -> None: ...


@dataclass
class _Learner:
    base_version: int
    base: Arrays  # the global model adopted (or the state at start)
    base_meta: dict[str, Any]  # its metadata (the counters and exploration statistics count)
    # every state published since adopting the base, by seq: the merger includes one of them
    published: dict[int, tuple[Arrays, dict[str, Any]]] = field(default_factory=dict)
    updated_at_base: int = 0
    updated_at_publish: int = -1
    last_publish: float = -np.inf
    name: str = ""


class ModelHub:
    """See the module docstring. ``clock`` is monotonic seconds (injectable for tests).

    ``background_sends``: publishes run in a thread of their own (:mod:`streamlearn.sync.outbox`),
    so that a broker that is away never holds the serving thread; one send is in flight at a
    time, and a round that finds one still in flight neither publishes nor merges. Without it
    (the in-memory topic) each send runs in the round that makes it.
    """

    def __init__(self, link: ModelLink, replica: str, every_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_sync: Callable[[int, float, int], None] | None = None,
                 early_fraction: float = 0.0, background_sends: bool = False) -> None:
        self.link, self.replica, self.every_s, self.clock = link, replica, every_s, clock
        self.outbox = Outbox(link.send, threaded=background_sends)
        # what to do with the outcome of the send in flight (one at a time)
        self._on_sent: Callable[[str | None], None] | None = None
        self.early_fraction = early_fraction
        self.on_sync = on_sync or (lambda version, age, merges: None)
        self.assembler = Assembler()
        self.version = 0
        self.global_state: tuple[Arrays, dict[str, Any]] | None = None
        self.global_included: set[tuple[str, int]] = set()
        self.global_made_at = 0.0  # wall time the merger made it
        # where the states based on the newest global start in the topic (its merger read the
        # states up to there before publishing it): a new merger reads them from there
        self.states_from: int | None = None
        self.following = False  # reading the replicas' states (this replica is the merger)
        # each replica's newest state, still encoded: only the merger decodes them (every
        # replica decoding every state cost each replica CPU in proportion to the group's size)
        self.latest: dict[str, tuple[dict[str, Any], bytes]] = {}
        self.record: _Learner | None = None
        self.merges = 0
        self._seq = int(time.time() * 1000)  # a new run's publishes sort after an old run's
        self._last_merge = clock()
        self._catch_up_asked: float | None = None  # when the merger asked the link to catch up

    # --------------------------------------------------------------- reading
    def poll(self) -> None:
        """Take in every models-topic message that arrived."""
        fresh: list[tuple[dict[str, Any], bytes]] = []  # newer global models, still encoded
        for value in self.link.fetch():
            try:
                done = self.assembler.add_raw(value)
            except StateError as exc:
                log.warning("models topic: skipped a message (%s)", exc)
                continue
            if done is None:
                continue
            header = done[0]
            if header["kind"] == "global" and header["version"] > self.version:
                fresh.append(done)
            elif header["kind"] == "replica":
                old = self.latest.get(header["replica"])
                if old is None or header["seq"] > old[0]["seq"]:
                    self.latest[header["replica"]] = done
        # only the newest is decoded, unless it does not decode (then the next newest)
        for header, blob in sorted(fresh, key=lambda d: d[0]["version"], reverse=True):
            try:
                self.global_state = decode_state(blob)
            except StateError as exc:
                log.warning("models topic: global model %s skipped (%s)", header["version"], exc)
                continue
            self.version = int(header["version"])
            self.global_included = {(str(r), int(s)) for r, s in header["included"]}
            self.global_made_at = float(header.get("made_at", 0.0))
            states_from = header.get("states_from")
            self.states_from = None if states_from is None else int(states_from)
            return

    # ---------------------------------------------------------------- a round
    def tick(self, served: Mapping[int, Served]) -> None:
        """Adopt, publish and (as the merger) merge, as due; see the module docstring."""
        self._settle_sends()
        self.poll()
        merger = 0 in served
        if merger != self.following:  # only the merger reads the replicas' states
            self.link.follow_states(merger, self.states_from if merger else None)
            self.following = merger
            if not merger:
                self.latest.clear()
        if not served:
            return
        now = self.clock()
        daemons = list(served.values())
        learner = daemons[0].learner  # shared by every partition daemon of this replica
        record = self.record
        if record is None:
            record = self.record = self._start(daemons[0])
        adopted = False
        if self.global_state is not None and self.version > record.base_version:
            adopted = self._adopt(daemons, record)
            learner = daemons[0].learner
        # right after adopting, progress the new model lacks goes out at once: based on the
        # newest version, the next merge includes it (a state based on an older one is stale)
        new = learner.n_updated_ - max(record.updated_at_publish, record.updated_at_base)
        if new > 0 and not self.outbox.busy() and (
                adopted or now - record.last_publish >= self.every_s
                or new >= self.early_fraction * learner.n_updated_ > 0):
            self._publish(learner, record, now)
        # the merger: nothing read to merge, nothing to do (an idle merger used to ask the
        # broker for the topic's end every interval); otherwise read to the end, then merge
        pending = 0
        if 0 in served:
            self.poll()  # this round's publishes too, where the link has them already
            pending = self._pending_examples()
        # a merge waits for the send in flight: its catch-up must find that send's model
        if pending > 0 and not self.outbox.busy() and (
                now - self._last_merge >= self.every_s
                or pending >= self.early_fraction * learner.n_updated_ > 0):
            self._merge_when_caught_up(now, served[0])
        self.on_sync(self.version, max(time.time() - self.global_made_at, 0.0)
                     if self.global_state is not None else 0.0, self.merges)

    def close(self, timeout_s: float) -> None:
        """Stop sending; wait up to ``timeout_s`` for the send in flight."""
        self.outbox.close(timeout_s)

    def _send(self, key: bytes, values: list[bytes], on_sent: Callable[[str | None], None]) -> None:
        """Hand one message to the outbox; ``on_sent(error or None)`` runs in the round that
        finds it finished (at once without background sends)."""
        self.outbox.submit(key, values)
        self._on_sent = on_sent
        self._settle_sends()

    def _settle_sends(self) -> None:
        for _, error in self.outbox.finished():
            on_sent, self._on_sent = self._on_sent, None
            if on_sent is not None:
                on_sent(error)

    def _mergeable(self) -> list[tuple[dict[str, Any], bytes]]:
        """The replica states (still encoded) the next merge includes: those based on the
        current version, with examples learned since."""
        return [(h, blob) for h, blob in self.latest.values()
                if int(h["base_version"]) == self.version and int(h["examples"]) > 0]

    def _pending_examples(self) -> int:
        """Examples in the states the next merge would include (headers only)."""
        return sum(int(h["examples"]) for h, _ in self._mergeable())

    def _start(self, daemon: Served) -> _Learner:
        arrays, meta = daemon.learner.state()
        # with a global model out there, the first tick adopts it (base -1 < any version)
        return _Learner(-1 if self.global_state is not None else 0, arrays,
                        meta, updated_at_base=daemon.learner.n_updated_,
                        name=daemon.model_name.split("-g", 1)[0])

    def _publish(self, learner: Learner, record: _Learner, now: float) -> None:
        arrays, meta = learner.state()
        self._seq += 1
        seq = self._seq
        header = {"kind": "replica", "replica": self.replica, "base_version": record.base_version,
                  "seq": seq, "examples": learner.n_updated_ - record.updated_at_base}
        before = record.updated_at_publish, record.last_publish

        def sent(error: str | None) -> None:
            if error is None:
                log.debug("published seq %d (base %d, %d examples)", seq, header["base_version"],
                          header["examples"])
                return
            log.warning("model not published (next round again): %s", error)
            # not adopted since (an adoption forgets every publish): publish again when due
            if record.published.pop(seq, None) is not None:
                record.updated_at_publish, record.last_publish = before

        # recorded before it is sent: a merge including it can only be read after it is
        record.published[seq] = (arrays, meta)
        record.updated_at_publish, record.last_publish = learner.n_updated_, now
        self._send(f"replica/{self.replica}".encode(), chunk(header, encode_state(arrays, meta)),
                   sent)

    def _adopt(self, daemons: list[Served], record: _Learner) -> bool:
        assert self.global_state is not None
        g_arrays, g_meta = self.global_state
        current = daemons[0].learner
        now_arrays, now_meta = current.state()
        # the one state of ours this version includes (only the version after our base can)
        mine = [seq for who, seq in self.global_included if who == self.replica
                and seq in record.published]
        ref, ref_meta = record.published[mine[0]] if mine else (record.base, record.base_meta)
        try:
            arrays = rebase(g_arrays, ref, now_arrays, now_meta["class"])
            counters = {k: int(g_meta["counters"].get(k, 0)) + int(now_meta["counters"].get(k, 0))
                        - int(ref_meta["counters"].get(k, 0)) for k in now_meta["counters"]}
            exploration = rebase_exploration(g_meta, ref_meta, now_meta)
            learner = type(current).from_state(
                arrays, {**now_meta, "counters": counters, "exploration_state": exploration})
        except (StateError, KeyError, ValueError) as exc:
            log.error("cannot adopt global model %d: %s", self.version, exc)
            record.base_version = self.version  # do not retry this version
            return False
        for daemon in daemons:
            daemon.replace_learner(learner)
            daemon.model_name = f"{record.name}-g{self.version}"
        record.base, record.base_meta = g_arrays, g_meta
        # the progress carried over by the rebase counts as learned since this base
        record.base_version = self.version
        record.updated_at_base = int(g_meta["counters"].get("n_updated", 0))
        record.published, record.updated_at_publish = {}, -1
        return True

    # ------------------------------------------------------------- the merger
    def _merge_when_caught_up(self, now: float, daemon: Served) -> None:
        """Fencing: merge only once the topic has been read to its end (the newest model and
        states first); the catch-up runs in the link's reader while this replica serves."""
        if self._catch_up_asked is None:
            self.link.request_catch_up()
            self._catch_up_asked = now
        if self.link.caught_up():
            self._catch_up_asked = None
            self._merge(now, daemon)
        elif now - self._catch_up_asked > CATCH_UP_S:
            log.warning("models topic not read to its end in %.0f s: no merge this round",
                        CATCH_UP_S)
            self._catch_up_asked, self._last_merge = None, now

    def _merge(self, now: float, daemon: Served) -> None:
        self._last_merge = now
        self.poll()
        parts = []
        for h, blob in self._mergeable():
            try:
                parts.append((h, *decode_state(blob)))
            except StateError as exc:
                log.warning("models topic: state of %s skipped (%s)", h["replica"], exc)
        if not parts:
            return
        if self.global_state is not None:
            base, base_meta = self.global_state
        else:  # version 0: every replica started from a fresh learner
            base, base_meta = daemon.learner.clone().state()
        try:
            arrays = merge(base, [(a, float(h["examples"])) for h, a, _ in parts],
                           base_meta["class"])
            counters = merge_counters(base_meta["counters"], [m["counters"] for _, _, m in parts])
            exploration = merge_exploration(base_meta, [m for _, _, m in parts])
        except StateError as exc:
            log.error("model merge skipped: %s", exc)
            return
        seen = self.version
        self.poll()
        if self.version != seen:  # another merger published meanwhile: these are stale
            log.warning("not publishing model %d: version %d is out already", seen + 1,
                        self.version)
            return
        target = seen + 1
        header = {"kind": "global", "version": target, "replica": self.replica,
                  "included": [[str(h["replica"]), int(h["seq"])] for h, _, _ in parts],
                  "examples": int(sum(int(h["examples"]) for h, _, _ in parts)),
                  "made_at": time.time()}
        states_from = self.link.states_position()
        if states_from is not None:
            header["states_from"] = states_from
        meta = {**base_meta, "counters": counters, "exploration_state": exploration}
        seen_states = ", ".join(f"{w}@{int(h['base_version'])}" for w, (h, _) in
                                sorted(self.latest.items()))

        def sent(error: str | None) -> None:
            if error is not None:
                log.warning("model %d not published (next round again): %s", target, error)
                return
            self.merges += 1
            log.info("model %d merged from %d replica states (%d examples; states seen: %s)",
                     target, len(parts), header["examples"], seen_states)

        self._send(b"global", chunk(header, encode_state(arrays, meta)), sent)
