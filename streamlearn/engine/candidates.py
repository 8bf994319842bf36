"""The decide → join → learn core for candidate-set requests (the daemon's candidate mode).

:class:`CandidateEngine` plays the part :class:`~streamlearn.engine.Engine` plays
for fixed actions, on the same :class:`~streamlearn.join.pending.PendingJoins`:

* every *placed candidate* (a slot of a request) is one pending join, with the
  id ``["<request id>", "<candidate id>"]`` (JSON, so no separator can be
  forged), action = its slot position, its conditional slot propensity, and
  as its row the shared context, the candidate's features and the features
  of the request's exploit candidate (what the learners' updates need);
* a request's feedback is spread over its pending slots: one ``reward`` goes
  to every slot, ``rewards`` by candidate id (unnamed slots: the default
  reward); each slot's reward is then weighted by the event's ``type``
  (``reward_weights``) and aggregated per slot by the join's policy. With the
  ``earliest`` policy the request's slots therefore close together; the
  request id itself (``["<id>", null]``) is then remembered as closed, so a
  second feedback for it is a duplicate (or late);
* feedback that comes before its request is held under the request id (every
  event: its rewards, weight and time, in :attr:`CandidateEngine.early_rewards`)
  and spread over the slots, event after event, when the request is decided;
  held feedback whose request never comes becomes unknown, as for fixed actions.

Everything is arrays except one dict operation per id — no per-request Python
loop in deciding or learning beyond building the id strings.

>>> from streamlearn.candidates.learners import CandidateEpsilonGreedy
>>> from streamlearn.candidates.sets import CandidateSets
>>> from streamlearn.join.pending import JoinSettings
>>> engine = CandidateEngine(CandidateEpsilonGreedy(0, 2, seed=1), JoinSettings(window_s=10.0),
...                          max_slots=2)
>>> sets = CandidateSets(np.zeros((1, 0)), np.eye(3, 2), np.array([0, 3]))
>>> d = engine.decide(["r1"], sets, ["a", "b", "c"], np.array([2]), np.zeros(1, int), wall=0.0)
>>> (d.chosen >= 0).sum(), len(engine.joins)
(np.int64(2), 2)
>>> engine.feedback(["r1"], [{"a": 1.0}], np.ones(1), np.zeros(1, int), wall=1.0).tolist()
[0]
>>> learned = engine.learn(); len(learned.closed), len(engine.joins), engine.slates
(2, 0, {})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from streamlearn.candidates.joint import stored_joint_features
from streamlearn.candidates.learners import CandidateLearner
from streamlearn.candidates.sets import CandidateSets
from streamlearn.candidates.slates import SlateMixture, slot_exploration
from streamlearn.engine import Learned
from streamlearn.events.candidate_feedback import RewardSpec
from streamlearn.join.aggregate import type_weights
from streamlearn.join.pending import EarlyFeedback, JoinSettings, Outcome, PendingJoins

__all__ = ["SLOT_COLUMNS", "CandidateDecided", "CandidateEngine", "HeldReward", "Journaled",
           "pair_id", "request_key"]

#: one held feedback event of a request not decided yet: its rewards, its type's weight and
#: its event time (None in checkpoints that did not keep it: the held feedback's time)
HeldReward = tuple[RewardSpec, float, float | None]


def _rows_of(sets: CandidateSets, requests: np.ndarray) -> np.ndarray:
    """The global candidate rows of the given requests, in order."""
    if len(requests) == len(sets):
        return np.arange(len(sets.items))
    return np.flatnonzero(np.isin(sets.request_of, requests))


def pair_id(request: str, candidate: str) -> str:
    """The pending-join id of a placed candidate."""
    return orjson.dumps([request, candidate]).decode()


def request_key(request: str) -> str:
    """The id held feedback and closed requests are known by."""
    return orjson.dumps([request, None]).decode()


@dataclass
class Journaled:
    """A decision made before a restart: placed candidate ids, their slot propensities,
    the exploit candidate's id, the decision time and who placed each slot (0: the
    learner, else a ranker's version; all 0 when not journaled)."""

    candidates: list[str]
    probs: list[float]
    exploit: str
    decided_at: float
    served_by: list[int] | None = None


#: the per-slot column of the candidate engine's pending joins (and of the experience log):
#: who placed the slot, 0 for the learner, else the version of the ranker that did
SLOT_COLUMNS: dict[str, type] = {"served_by": np.int64, "gamma": np.float64}


@dataclass
class CandidateDecided:
    """One decided batch: ``chosen`` (B, S) global candidate rows (−1 past a request's
    slots), ``slot_probs`` (B, S), ``exploit`` (B,) global rows, ``scores`` (N,) the
    model's estimated reward of every candidate, ``fresh`` rows decided now,
    ``decided_at`` (B,) each request's decision time (a reused one's, as journaled),
    ``gamma`` (B,) the learner's exploration at each request and ``served_by`` (B, S) who
    placed each slot (:class:`~streamlearn.candidates.learners.SlateDecision`)."""

    chosen: np.ndarray
    slot_probs: np.ndarray
    exploit: np.ndarray
    scores: np.ndarray
    fresh: np.ndarray
    decided_at: np.ndarray
    gamma: np.ndarray
    served_by: np.ndarray


class CandidateEngine:
    """A candidate learner and its pending joins; see the module docstring."""

    def __init__(self, learner: CandidateLearner, settings: JoinSettings | None = None,
                 max_slots: int = 10, joins: PendingJoins | None = None,
                 early_rewards: Mapping[str, Any] | None = None) -> None:
        self.learner, self.max_slots = learner, int(max_slots)
        self.width = learner.d_x + 2 * learner.d_c  # context, candidate, exploit candidate
        self.joins = joins if joins is not None else PendingJoins(
            self.max_slots, self.width, settings, columns=SLOT_COLUMNS)
        self.slates: dict[str, list[str]] = {}  # request id → its pending pair ids
        self._request_of: dict[str, tuple[str, str]] = {}  # pair id → (request, candidate)
        for pid in list(self.joins.slot_of):  # after a restore: rebuilt from the pair ids
            request, candidate = orjson.loads(pid)
            self._remember(pid, request, candidate)
        self.early_rewards: dict[str, list[HeldReward]] = {
            key: _held_rewards(value) for key, value in (early_rewards or {}).items()}

    def _remember(self, pid: str, request: str, candidate: str) -> None:
        self._request_of[pid] = (request, candidate)
        self.slates.setdefault(request, []).append(pid)

    def pending_placements(self) -> dict[str, list[str]]:
        """Per request awaiting feedback, the ids of its placed candidates still pending."""
        return {request: [self._request_of[pid][1] for pid in pids if pid in self._request_of]
                for request, pids in self.slates.items()}

    def is_known(self, ids: Sequence[str]) -> np.ndarray:
        """Per request id: pending, recently closed, or repeated earlier in ``ids``."""
        seen: set[str] = set()
        out = np.zeros(len(ids), dtype=bool)
        recent = self.joins.recent
        for i, request in enumerate(ids):
            out[i] = request in self.slates or request in seen or request_key(request) in recent
            seen.add(request)
        return out

    # --------------------------------------------------------------- deciding
    def decide(self, ids: Sequence[str], sets: CandidateSets, candidate_ids: Sequence[str],
               slots: np.ndarray, partitions: np.ndarray, wall: float,
               known: Mapping[str, Journaled] | None = None, model_version: int = 0,
               event_ts: np.ndarray | None = None, mixture: SlateMixture | None = None,
               ) -> CandidateDecided:
        """Decide a batch of new request ids (journaled ones reused) and record every placed
        candidate as a pending join, decided at ``wall``; ``event_ts`` (the requests' own
        event times) move the join's instance clock (:meth:`PendingJoins.add_decisions`);
        ``mixture``: the rankers that place their shares of the slots."""
        B = len(ids)
        slots = np.minimum(np.asarray(slots, dtype=np.int64), sets.sizes)
        k = max(int(slots.max()) if B else 1, 1)
        chosen = np.full((B, k), -1, dtype=np.int64)
        slot_probs = np.zeros((B, k))
        exploit = np.zeros(B, dtype=np.int64)
        decided_at = np.full(B, float(wall))
        served_by = np.zeros((B, k), dtype=np.int64)
        reused = self._reuse(ids, sets, candidate_ids, known or {}, chosen, slot_probs, exploit,
                             decided_at, served_by)
        gamma = slot_exploration(slot_probs[:, 0], chosen[:, 0] == exploit, sets.sizes)
        fresh = np.flatnonzero(~reused)
        scores = np.full(len(sets.items), np.nan)  # of the fresh requests' candidates
        if len(fresh):
            sub = sets if len(fresh) == B else sets.take(fresh)
            decision = self.learner.decide_slate(
                sub, slots[fresh], keys=[ids[j] for j in fresh.tolist()],
                mixture=None if mixture is None else SlateMixture(
                    mixture.versions, mixture.shares,
                    tuple(np.asarray(s)[_rows_of(sets, fresh)] for s in mixture.scores)))
            base = sets.offsets[fresh] - (sub.offsets[:-1])  # local row + base = global row
            to_global = np.repeat(base, sub.sizes) + np.arange(len(sub.items))
            scores[to_global] = self.learner.scores(decision.phi)
            width = decision.chosen.shape[1]
            rows = np.where(decision.chosen >= 0, to_global[np.maximum(decision.chosen, 0)], -1)
            chosen[fresh, :width] = rows
            slot_probs[fresh, :width] = decision.slot_probs
            exploit[fresh] = to_global[decision.exploit]
            gamma[fresh], served_by[fresh, :width] = decision.gamma, decision.served_by
        self.learner.n_requests_ += int(reused.sum())
        self._add_pending(ids, sets, candidate_ids, chosen, slot_probs, exploit, partitions,
                          decided_at, wall, model_version, event_ts, served_by, gamma)
        return CandidateDecided(chosen, slot_probs, exploit, scores, fresh, decided_at, gamma,
                                served_by)

    def _reuse(self, ids: Sequence[str], sets: CandidateSets, candidate_ids: Sequence[str],
               known: Mapping[str, Journaled], chosen: np.ndarray, slot_probs: np.ndarray,
               exploit: np.ndarray, decided_at: np.ndarray, served_by: np.ndarray) -> np.ndarray:
        """Fill the journaled decisions in; bool (B,) of the rows reused."""
        reused = np.zeros(len(ids), dtype=bool)
        if not known:
            return reused
        for j, request in enumerate(ids):
            journaled = known.get(request)
            if journaled is None:
                continue
            start, stop = int(sets.offsets[j]), int(sets.offsets[j + 1])
            row_of = {cid: start + n for n, cid in enumerate(candidate_ids[start:stop])}
            rows = [row_of.get(c, -1) for c in journaled.candidates]
            if -1 in rows or journaled.exploit not in row_of or len(rows) > chosen.shape[1]:
                continue  # not the request it was decided for: decide it anew
            chosen[j, :len(rows)] = rows
            slot_probs[j, :len(rows)] = journaled.probs
            exploit[j], decided_at[j] = row_of[journaled.exploit], journaled.decided_at
            if journaled.served_by is not None:
                served_by[j, :len(rows)] = journaled.served_by[:len(rows)]
            reused[j] = True
        return reused

    def _add_pending(self, ids: Sequence[str], sets: CandidateSets,
                     candidate_ids: Sequence[str], chosen: np.ndarray, slot_probs: np.ndarray,
                     exploit: np.ndarray, partitions: np.ndarray, decided_at: np.ndarray,
                     wall: float, model_version: int, event_ts: np.ndarray | None,
                     served_by: np.ndarray, gamma: np.ndarray) -> None:
        request, slot = np.nonzero(chosen >= 0)  # by request, then slot
        rows = chosen[request, slot]
        pids = [pair_id(ids[r], candidate_ids[c])
                for r, c in zip(request.tolist(), rows.tolist(), strict=True)]
        X = np.hstack([sets.context[request], sets.items[rows], sets.items[exploit[request]]])
        probs = np.zeros((len(rows), self.max_slots))
        probs[np.arange(len(rows)), slot] = slot_probs[request, slot]
        self.joins.add_decisions(pids, X, slot, probs, np.full(len(rows), -1, np.int64),
                                 decided_at[request], np.asarray(partitions)[request], wall,
                                 model_version,
                                 None if event_ts is None else np.asarray(event_ts)[request],
                                 columns={"served_by": served_by[request, slot],
                                          "gamma": gamma[request]})  # the learner's, per request
        for pid, r, c in zip(pids, request.tolist(), rows.tolist(), strict=True):
            self._remember(pid, ids[r], candidate_ids[c])
        if self.joins.early:  # feedback that came before its request: event after event
            requests: list[str] = []
            events: list[HeldReward] = []
            parts: list[int] = []
            due = np.asarray(decided_at) + self.joins.settings.window_s
            for r, rid in enumerate(ids):
                key = request_key(rid)
                if key not in self.joins.early:
                    continue
                fb = self.joins.pop_early(key)
                held = [(spec, weight, fb.ts if ts is None else ts) for spec, weight, ts in
                        self.early_rewards.pop(key, None) or [
                            (v, 1.0, t) for v, t in zip(fb.rewards, fb.times, strict=True)]]
                # each held event is judged by the window as feedback arriving after its
                # decision is (PendingJoins.add_decisions does so for fixed actions): one at or
                # past the window's end has no effect. One outcome per event: the others were
                # counted as they came (held, then duplicates); the first is counted late here
                # when none is on time, else the request's joined slots stand for it
                on_time = [event for event in held if event[2] < due[r]]
                self.joins.held_late += int(not on_time)
                requests += [rid] * len(on_time)
                events += on_time
                parts += [fb.partition] * len(on_time)
            if requests:
                self._spread(requests, [e[0] for e in events], np.array([e[1] for e in events]),
                             np.array([e[2] for e in events]), np.array(parts, dtype=np.int64),
                             wall)

    # --------------------------------------------------------------- feedback
    def feedback(self, ids: Sequence[str], rewards: Sequence[RewardSpec], ts: np.ndarray,
                 partitions: np.ndarray, wall: float, sources: Sequence[Any] | None = None,
                 types: Sequence[str | None] | None = None) -> np.ndarray:
        """Join a feedback batch; one :class:`Outcome` code per feedback event (that of the
        first slot it reached). ``types`` weigh each event's rewards (``reward_weights``)."""
        weights = self.joins.settings.reward_weights
        return self._spread(ids, rewards, type_weights(types, weights) if types is not None
                            and weights else np.ones(len(ids)), ts, partitions, wall, sources)

    def _spread(self, ids: Sequence[str], rewards: Sequence[RewardSpec], weights: np.ndarray,
                ts: np.ndarray, partitions: np.ndarray, wall: float,
                sources: Sequence[Any] | None = None) -> np.ndarray:
        """Each event's rewards times its weight, one per pending slot of its request (or the
        event held under the request id: :meth:`_add_pending` spreads it later)."""
        default = self.joins.settings.default_reward
        event_ids: list[str] = []
        values: list[float] = []
        first = np.zeros(len(ids), dtype=np.int64)
        owner: list[int] = []
        offered: list[int] = []  # events the join may hold: their rewards are kept here
        for i, (request, spec, weight) in enumerate(zip(ids, rewards, weights.tolist(),
                                                        strict=True)):
            first[i] = len(event_ids)
            owner.append(i)
            pids = [p for p in self.slates.get(request, ()) if p in self.joins.slot_of]
            if not pids:  # closed, not decided yet, or unknown: the join says which
                event_ids.append(request_key(request))
                # the join holds a value; the event itself (its rewards) is kept here
                values.append(0.0 if isinstance(spec, dict) else weight * spec)
                offered.append(i)
                continue
            for pid in pids:
                event_ids.append(pid)
                values.append(weight * (spec.get(self._request_of[pid][1], default)
                                        if isinstance(spec, dict) else spec))
            owner += [i] * (len(pids) - 1)
        own = np.array(owner, dtype=np.int64)
        outcomes = self.joins.add_feedback(
            event_ids, np.array(values, dtype=np.float64), np.asarray(ts)[own],
            np.asarray(partitions)[own], wall,
            None if sources is None else [sources[i] for i in owner])
        for i in offered:
            how = outcomes[first[i]]
            if how == Outcome.HELD.value or how == Outcome.AGGREGATED.value:
                held = self.early_rewards.setdefault(request_key(ids[i]), [])
                if how == Outcome.HELD.value:
                    held.clear()
                held.append((rewards[i], float(weights[i]), float(np.asarray(ts)[i])))
        return outcomes[first] if len(ids) else np.zeros(0, dtype=np.int8)

    def advance(self, wall: float, idle: Iterable[tuple[str, int]] = (),
                awaited: Callable[[str], bool] | None = None) -> list[EarlyFeedback]:
        """Expire what is due; held feedback whose request never came, by request id
        (``awaited(request id)``: that request's decision is known to be coming)."""
        unknown = self.joins.advance(wall, idle, None if awaited is None else (
            lambda key: awaited(orjson.loads(str(key))[0])))  # held by request_key(request)
        for fb in unknown:
            self.early_rewards.pop(str(fb.event_id), None)
            fb.event_id = orjson.loads(str(fb.event_id))[0]
        return unknown

    # --------------------------------------------------------------- learning
    def learn(self) -> Learned:
        """Apply every placed candidate closed so far with one update."""
        closed = self.joins.drain()
        n = len(closed)
        if not n:
            return Learned(closed, np.zeros(0, np.int64), 0)
        X = np.asarray(closed.X)
        d_x, d_c = self.learner.d_x, self.learner.d_c
        rows = np.flatnonzero(closed.learn)
        skipped = 0
        if len(rows):
            X = X[rows]
            phi = stored_joint_features(X, d_x, d_c)
            exploit_phi = stored_joint_features(X, d_x, d_c, column=1)
            propensities = closed.probs[rows, closed.actions[rows]]
            before = self.learner.n_skipped_updates_
            self.learner.update(phi, closed.rewards[rows], propensities, exploit_phi)
            skipped = self.learner.n_skipped_updates_ - before
        self._forget(closed.ids, closed.outcome)
        return Learned(closed, rows, skipped)

    def _forget(self, pids: list[str], outcome: np.ndarray) -> None:
        """Drop closed pairs; a request whose slots all closed is remembered as closed."""
        done: dict[str, int] = {}
        for pid, how in zip(pids, outcome.tolist(), strict=True):
            request, _ = self._request_of.pop(pid)
            if how == Outcome.JOINED or request not in done:
                done[request] = how
        keys, hows = [], []
        for request, how in done.items():
            remaining = [p for p in self.slates.get(request, ()) if p in self._request_of]
            if remaining:
                self.slates[request] = remaining
                continue
            self.slates.pop(request, None)
            keys.append(request_key(request))
            hows.append(how)
        if keys:
            self.joins.recent.add_unaged(keys, hows)


def _held_rewards(value: Any) -> list[HeldReward]:
    """Held events of one request as checkpointed: ``[[rewards, weight, ts], ...]``, or
    (older checkpoints) one ``rewards`` object."""
    if not isinstance(value, list):
        return [(value, 1.0, None)]
    return [(spec, float(weight), None if ts is None else float(ts)) for spec, weight, ts in value]
