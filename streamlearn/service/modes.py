"""What the serving loop decides over: a fixed set of actions, or candidate sets.

The :class:`~streamlearn.service.daemon.Daemon` has one poll → decide → join → learn →
checkpoint loop; a **mode** supplies what differs between the two shapes of request:

* how instance messages decode (:meth:`ServingMode.decode_instances`) and feedback
  messages (:meth:`ServingMode.decode_feedback`);
* the decision core (:meth:`ServingMode.make_engine`: an
  :class:`~streamlearn.engine.fixed.Engine` or a
  :class:`~streamlearn.engine.candidates.CandidateEngine`, both a
  :class:`~streamlearn.engine.DecisionCore`);
* how a decoded batch is decided and what its decision records say
  (:meth:`ServingMode.decide`: the daemon journals and publishes them);
* the extra state of a checkpoint (:meth:`ServingMode.freeze` / :meth:`ServingMode.thaw`)
  and the width of a journaled decision's distribution (:attr:`ServingMode.journal_width`).

:class:`FixedActions` is the default; :class:`CandidateSets` serves requests that carry
their own candidates and slots (docs/kafka.md):

``{"id": "r1", "candidates": [{"id": "item-17", "prob": 0.93}, ...], "prob": 0.81,
"ranking": ["item-17", "item-3", ...], "explored": false, "model": "...", "ts": ...}``

In candidate mode the ``action`` label of the per-action metrics is the slot position,
and a feedback outcome is counted per placed candidate once it closes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import orjson

from streamlearn.actions import exploration_rates
from streamlearn.candidates.learners import CANDIDATE_LEARNERS, CandidateLearner
from streamlearn.candidates.slates import serving_scores
from streamlearn.durability.checkpoint import CheckpointMismatch, JournaledDecision, Restored
from streamlearn.engine import BASELINE, DecisionCore, Engine
from streamlearn.engine.candidates import SLOT_COLUMNS, CandidateEngine, Journaled
from streamlearn.errors import ConfigError, StateError
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.events import Rejection, decode_feedback, decode_instances
from streamlearn.events.candidate_feedback import decode_candidate_feedback
from streamlearn.events.candidates import decode_candidate_requests
from streamlearn.events.raw import DecodeLimits, Message
from streamlearn.join.pending import Closed, PendingJoins
from streamlearn.learners.base import Learner
from streamlearn.service.counters import Counters, tracker_load
from streamlearn.service.scoring import ranking_lists
from streamlearn.service.settings import DaemonSettings
from streamlearn.service.state import freeze, learner_settings, thaw, warn_settings_kept

if TYPE_CHECKING:
    from streamlearn.service.daemon import Daemon

__all__ = ["CandidateSets", "FixedActions", "Published", "ServingMode", "mode_for"]


@dataclass
class Published:
    """What :meth:`ServingMode.decide` made of a batch: the decision messages (journaled
    ones byte-identical), the rows decided now (``fresh``), and what the metrics count."""

    values: list[bytes]
    fresh: np.ndarray
    n_explored: int
    actions: np.ndarray  # the per-action metrics' labels (empty: none)
    gamma: float


class DecodedBatch(Protocol):
    """What the loop needs of a decoded instance batch (both modes' batches have it)."""

    ids: list[str]
    messages: list[Any]

    def __len__(self) -> int: ...

    def take(self, rows: np.ndarray) -> Any: ...


class ServingMode(Protocol):
    """The parts of the loop that differ between fixed actions and candidate sets."""

    journal_width: int  # probabilities per journaled decision

    def make_engine(self, learner: Any) -> DecisionCore: ...

    def decode_instances(self, messages: list[Message], limits: DecodeLimits
                         ) -> tuple[DecodedBatch, list[Rejection]]: ...

    def decode_feedback(self, messages: list[Message], limits: DecodeLimits
                        ) -> tuple[Any, list[Rejection]]: ...

    def decide(self, daemon: Daemon, batch: Any, wall: float,
               reused: dict[str, JournaledDecision]) -> Published: ...

    def freeze(self, engine: Any, tracker: OnlineErrorTracker, counters: Counters,
               settings: DaemonSettings) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...

    def thaw(self, restored: Restored, engine: Any, tracker: OnlineErrorTracker
             ) -> tuple[DecisionCore, Counters]: ...

    def track(self, tracker: OnlineErrorTracker, closed: Closed, rows: np.ndarray) -> None: ...

    def pending_decisions(self, engine: Any) -> list[bytes]: ...


def mode_for(settings: DaemonSettings) -> ServingMode:
    """The mode ``settings`` ask for (``candidates.enabled``)."""
    return CandidateSets(settings) if settings.candidates.enabled else FixedActions(settings)


def _placed(candidate: str, prob: float, names: dict[int, str], served_by: int
            ) -> dict[str, Any]:
    """A placed candidate of a decision: its id, its slot propensity and, when a ranker
    placed it, that ranker (``policy``)."""
    if not served_by:
        return {"id": candidate, "prob": prob}
    return {"id": candidate, "prob": prob,
            "policy": names.get(served_by, f"ranker-v{served_by}")}


def _journaled_servers(columns: dict[str, Any]) -> list[int] | None:
    """Who placed each slot of a journaled candidate decision (None: not journaled, or not a
    list of ints, as an older or damaged journal line has it: the slots count as the
    learner's)."""
    servers = columns.get("served_by")
    if isinstance(servers, list) and all(isinstance(v, int) for v in servers):
        return servers
    return None


def _reused_values(ids: list[str], reused: dict[str, JournaledDecision]) -> list[bytes]:
    """Journaled decisions as they were published (byte-identical); b'' for the others."""
    if not reused:
        return [b""] * len(ids)
    return [orjson.dumps(reused[i].message) if i in reused else b"" for i in ids]


class FixedActions:
    """Instances chosen among ``learner.n_actions`` actions (module doc)."""

    def __init__(self, settings: DaemonSettings) -> None:
        self.settings = settings
        self.n_actions, self.n_features = settings.learner.n_actions, settings.learner.n_features
        self.journal_width = self.n_actions

    def make_engine(self, learner: Learner) -> Engine:
        return Engine(learner, self.settings.join.join_settings())

    def decode_instances(self, messages: list[Message], limits: DecodeLimits) -> tuple[Any, list[Rejection]]:
        return decode_instances(messages, self.n_features, self.n_actions, limits)

    def decode_feedback(self, messages: list[Message], limits: DecodeLimits
                        ) -> tuple[Any, list[Rejection]]:
        return decode_feedback(messages, limits)

    def decide(self, daemon: Daemon, batch: Any, wall: float,
               reused: dict[str, JournaledDecision]) -> Published:
        """One ``learner.decide`` (the policies of a rollout sharing the batch: the caller's
        baseline, the learner, the rankers it rolls out), each fresh decision with the live
        ranker's ranking, the baseline and the policy that served it."""
        B = len(batch)
        adoption = daemon.adoption
        scorer = daemon.retraining.scorer if daemon.retraining is not None else None
        scores = scorer.scores(batch.X) if scorer is not None else None
        system = None if scorer is None else scorer.mixture(batch.X, scores)
        baselines = adoption.baselines(batch.baselines, batch.mask)
        decided = cast(Engine, daemon.engine).decide(
            batch.ids, batch.X, batch.mask, labels=batch.labels, ts=np.full(B, wall),
            event_ts=batch.ts, partitions=batch.partitions, wall=wall,
            known={i: (j.action, np.asarray(j.probs), float(j.message["ts"]), j.columns)
                   for i, j in reused.items()},
            model_version=daemon.counters.model_version,
            mixture=adoption.wrap(system, baselines, self.n_actions), baselines=baselines,
            epoch=adoption.epoch)
        values = _reused_values(batch.ids, reused)
        fresh, probs, actions = decided.fresh, decided.probs, decided.actions
        if len(fresh):
            model = f"{daemon.model_name}-v{daemon.counters.model_version}"
            # per-decision values as Python scalars in one pass each (indexing numpy arrays
            # element by element cost ~1 µs a decision)
            chosen, fresh_probs = actions[fresh], probs[fresh]
            chosen_probs = fresh_probs[np.arange(len(fresh)), chosen]
            explored = chosen != np.argmax(fresh_probs, axis=1)
            ids = batch.ids
            records = [{"id": ids[j], "action": a, "prob": p, "explored": e, "model": model,
                        "ts": wall}
                       for j, a, p, e in zip(fresh.tolist(), chosen.tolist(), chosen_probs.tolist(),
                                             explored.tolist(), strict=True)]
            if scores is not None:
                rankings = ranking_lists(scores[fresh],
                                         None if batch.mask is None else batch.mask[fresh])
                for record, ranking in zip(records, rankings, strict=True):
                    record["ranking"] = ranking
            kept = {k: v[fresh] for k, v in decided.columns.items()}
            if kept["served_by"].any():
                names = {BASELINE: "baseline"} | (
                    scorer.policy_names() if scorer is not None else {})
                for record, version in zip(records, kept["served_by"].tolist(), strict=True):
                    if version:
                        record["policy"] = names.get(version, f"ranker-v{version}")
            if (kept["baseline"] >= 0).any():
                for record, baseline in zip(records, kept["baseline"].tolist(), strict=True):
                    if baseline >= 0:
                        record["baseline"] = baseline
            adoption.note_decisions(kept["exploit"], kept["baseline"])
            daemon.journal_and_encode(values, fresh, records, fresh_probs, kept)
        # the learner's own γ, as decided: the logged rows are a mixture while a baseline or a
        # ranker shares the decisions, and their exploration rate is not the learner's (an
        # outside test saw a fixed γ of 0.3 reported as 0.34–0.52 during a rollout)
        own = decided.columns.get("gamma")
        rates = own if own is not None and len(own) == len(probs) \
            else exploration_rates(probs, batch.mask)
        return Published(values, fresh, int(decided.explored.sum()), actions,
                         float(np.sum(rates)) / max(len(probs), 1))

    def freeze(self, engine: Engine, tracker: OnlineErrorTracker, counters: Counters,
               settings: DaemonSettings) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return freeze(engine, tracker, counters, settings)

    def thaw(self, restored: Restored, engine: Engine, tracker: OnlineErrorTracker
             ) -> tuple[Engine, Counters]:
        configured = learner_settings(engine.learner)
        restored_engine, counters = thaw(restored, self.settings, type(engine.learner), tracker)
        warn_settings_kept(restored.seq, configured, learner_settings(restored_engine.learner))
        return restored_engine, counters

    def track(self, tracker: OnlineErrorTracker, closed: Closed, rows: np.ndarray) -> None:
        tracker.observe(closed.actions[rows], closed.rewards[rows], closed.labels[rows],
                        closed.probs[rows])

    def pending_decisions(self, engine: Engine) -> list[bytes]:
        """The decisions still awaiting feedback, as decision messages with what a caller
        needs to answer them (id and action)."""
        ids, actions = engine.joins.pending_decisions()
        return [orjson.dumps({"id": i, "action": a})
                for i, a in zip(ids, actions.tolist(), strict=True)]


class CandidateSets:
    """Requests that carry their own candidates and ask for ``slots`` of them (module doc)."""

    def __init__(self, settings: DaemonSettings) -> None:
        self.settings = settings
        self.journal_width = settings.candidates.max_slots

    def make_engine(self, learner: CandidateLearner) -> CandidateEngine:
        if not isinstance(learner, CandidateLearner):
            raise ConfigError(f"candidate mode needs a candidate-set learner. Got "
                              f"{type(learner).__name__}.")
        return CandidateEngine(learner, self.settings.join.join_settings(),
                               self.settings.candidates.max_slots)

    def decode_instances(self, messages: list[Message], limits: DecodeLimits) -> tuple[Any, list[Rejection]]:
        s = self.settings
        return decode_candidate_requests(messages, s.candidates.shared_features,
                                         s.candidates.candidate_features, limits,
                                         s.candidates.max_candidates, s.candidates.max_slots)

    def decode_feedback(self, messages: list[Message], limits: DecodeLimits
                        ) -> tuple[Any, list[Rejection]]:
        return decode_candidate_feedback(messages, limits)

    def decide(self, daemon: Daemon, batch: Any, wall: float,
               reused: dict[str, JournaledDecision]) -> Published:
        """Each request's slots filled; its decision ranks every candidate (the exploit one
        first, then by the model's estimate)."""
        known = {i: Journaled([c["id"] for c in j.message["candidates"]],
                              [c["prob"] for c in j.message["candidates"]],
                              j.message["ranking"][0], float(j.message["ts"]),
                              _journaled_servers(j.columns))
                 for i, j in reused.items()}
        engine = cast(CandidateEngine, daemon.engine)
        scorer = daemon.retraining.scorer if daemon.retraining is not None else None
        mixture = None if scorer is None else scorer.slate_mixture(batch.sets)
        decided = engine.decide(batch.ids, batch.sets, batch.candidate_ids, batch.slots,
                                batch.partitions, wall, known, daemon.counters.model_version,
                                event_ts=batch.ts, mixture=mixture)
        if daemon.retraining is not None:  # every candidate, for off-policy estimates
            daemon.retraining.experience.record_requests(
                batch.ids, batch.candidate_ids, batch.sets, decided.chosen, decided.slot_probs,
                decided.gamma, decided.decided_at, daemon.counters.model_version,
                self.journal_width)
        values = _reused_values(batch.ids, reused)
        fresh = decided.fresh
        # the ranking and `explored` describe what placed the first slot (learner or ranker)
        scores, best = serving_scores(decided.scores, decided.exploit, decided.served_by[:, 0],
                                      mixture, batch.sets.offsets)
        explored = decided.chosen[:, 0] != best
        if len(fresh):
            sets, cids = batch.sets, batch.candidate_ids
            key = np.where(np.isnan(scores), -np.inf, scores)
            key[best] = np.inf
            order = np.lexsort((-key, sets.request_of))
            ranked_ids = np.asarray(cids, dtype=object)[order]  # each request's slice, in order
            model = f"{daemon.model_name}-v{daemon.counters.model_version}"
            names = scorer.policy_names() if scorer is not None else {}
            records = []
            for j in fresh.tolist():
                start, stop = int(sets.offsets[j]), int(sets.offsets[j + 1])
                placed = decided.chosen[j][decided.chosen[j] >= 0].tolist()
                probs = decided.slot_probs[j, :len(placed)].tolist()
                servers = decided.served_by[j, :len(placed)].tolist()
                records.append({"id": batch.ids[j],
                                "candidates": [_placed(cids[r], p, names, v) for r, p, v
                                               in zip(placed, probs, servers, strict=True)],
                                "prob": math.prod(probs),  # (np.prod: the same, 30x slower)
                                "ranking": ranked_ids[start:stop].tolist(),
                                "explored": bool(explored[j]),
                                "model": model, "ts": wall})
                baseline = int(batch.baselines[j])
                if baseline >= 0:  # recorded as the caller gave it (candidates are not served by it)
                    records[-1]["baseline"] = cids[start + baseline]
            daemon.journal_and_encode(values, fresh, records, decided.slot_probs[fresh],
                                      {"served_by": decided.served_by[fresh]})
        # γ: the learner's exploration at each request (not 1 − the placed slot's propensity,
        # near 1 wherever a slot explored or a ranker placed it)
        return Published(values, fresh, int(explored.sum()), np.zeros(0, np.int64),
                         float(decided.gamma[fresh].mean()) if len(fresh) else 0.0)

    def pending_decisions(self, engine: CandidateEngine) -> list[bytes]:
        """The requests still awaiting feedback, as decision messages with what a caller
        needs to answer them (id and the placed candidates' ids)."""
        return [orjson.dumps({"id": request, "candidates": [{"id": c} for c in placed]})
                for request, placed in engine.pending_placements().items()]

    def freeze(self, engine: CandidateEngine, tracker: OnlineErrorTracker, counters: Counters,
               settings: DaemonSettings) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = freeze(engine, tracker, counters, settings)
        meta["candidates"] = {"early_rewards": engine.early_rewards}
        return arrays, meta

    def thaw(self, restored: Restored, engine: CandidateEngine, tracker: OnlineErrorTracker
             ) -> tuple[CandidateEngine, Counters]:
        arrays, meta, s = restored.arrays, restored.meta, self.settings
        try:
            learner = CANDIDATE_LEARNERS[s.candidates.learner].from_state(arrays, meta["learner"])
            if (learner.d_x, learner.d_c) != (s.candidates.shared_features,
                                              s.candidates.candidate_features):
                raise CheckpointMismatch(
                    f"checkpoint {restored.seq} in {s.checkpoint.dir} holds a candidate learner "
                    f"with (d_x, d_c) = {learner.d_x, learner.d_c}; this daemon is configured "
                    f"for {s.candidates.shared_features, s.candidates.candidate_features}")
            joins = PendingJoins.restore(s.candidates.max_slots, learner.d_x + 2 * learner.d_c,
                                         s.join.join_settings(), arrays, meta["join"],
                                         columns=SLOT_COLUMNS)
            tracker_load(tracker, arrays, meta["tracker"])
            counters = Counters.from_json(meta["counters"])
            restored_engine = CandidateEngine(learner, s.join.join_settings(), s.candidates.max_slots,
                                              joins, meta["candidates"]["early_rewards"])
        except CheckpointMismatch:
            raise
        except (KeyError, TypeError, ValueError, StateError) as exc:
            raise StateError(f"checkpoint {restored.seq} in {s.checkpoint.dir} does not fit this "
                             f"candidate-mode daemon: {exc!r}") from exc
        warn_settings_kept(restored.seq, engine.learner.hyperparameters(),
                           learner.hyperparameters())
        return restored_engine, counters

    def track(self, tracker: OnlineErrorTracker, closed: Closed, rows: np.ndarray) -> None:
        tracker.observe(closed.actions[rows], closed.rewards[rows])
