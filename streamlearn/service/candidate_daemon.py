"""The serving loop in candidate mode: requests carry their own candidate sets and slots.

:class:`CandidateDaemon` is the :class:`~streamlearn.service.daemon.Daemon`
(same poll → decide → join → learn → checkpoint loop, same invariants: the
decision journal, checkpoints, dead letters) with the candidate-set parts:
requests are decoded by :func:`~streamlearn.events.candidates.decode_candidate_requests`,
decided by a :class:`~streamlearn.candidates.engine.CandidateEngine`, and feedback
carries one reward per request or a reward per placed candidate
(:mod:`streamlearn.events.candidate_feedback`). A decision names the placed
candidates with their slot propensities and the probability of the whole slate,
and ranks every candidate of the request:

``{"id": "r1", "candidates": [{"id": "item-17", "prob": 0.93}, ...], "prob": 0.81,
"ranking": ["item-17", "item-3", ...], "explored": false, "model": "...", "ts": ...}``

In this mode the ``action`` label of the per-action metrics is the slot position,
and a feedback outcome is counted per placed candidate once it closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from streamlearn.candidates.command import CANDIDATE_LEARNERS
from streamlearn.candidates.engine import CandidateDecided, CandidateEngine, Journaled
from streamlearn.candidates.learners import CandidateLearner
from streamlearn.errors import ConfigError, StateError
from streamlearn.events import Rejection
from streamlearn.events.candidate_feedback import decode_candidate_feedback
from streamlearn.events.candidates import CandidateRequests, decode_candidate_requests
from streamlearn.service.counters import Counters, tracker_load
from streamlearn.service.daemon import Daemon
from streamlearn.service.metrics import Observer
from streamlearn.service.settings import DaemonSettings
from streamlearn.service.state import freeze, warn_settings_kept
from streamlearn.stream.checkpoint import CheckpointMismatch, Restored
from streamlearn.stream.join import Closed, PendingJoins
from streamlearn.stream.transport import Message, Transport

__all__ = ["CandidateDaemon"]


class CandidateDaemon(Daemon):
    """The daemon for candidate-set requests (module docstring); ``learner`` is a
    :class:`~streamlearn.candidates.learners.CandidateLearner`."""

    engine: CandidateEngine  # type: ignore[assignment]

    def __init__(self, settings: DaemonSettings, transport: Transport, learner: CandidateLearner,
                 observer: Observer | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        super().__init__(settings, transport, learner, observer,  # type: ignore[arg-type]
                         wall_clock)

    def _make_engine(self, learner: Any) -> Any:
        s = self.settings
        if s.retrain_enabled and s.retrain_policy == "ranker":
            raise ConfigError("retrain.policy must be 'learner' in candidate mode (rankers are "
                              "retrained and measured on the logged slates, not promoted to "
                              "serve). Got 'ranker'.")
        if not isinstance(learner, CandidateLearner):
            raise ConfigError(f"candidate mode needs a candidate-set learner. Got "
                              f"{type(learner).__name__}.")
        return CandidateEngine(learner, s.join_settings(), s.candidates_max_slots)

    # ------------------------------------------------------------------ state
    def _freeze(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, meta = freeze(self.engine, self.tracker, self.counters, self.settings)
        meta["candidates"] = {"early_rewards": self.engine.early_rewards}
        return arrays, meta

    def _thaw(self, restored: Restored) -> None:
        arrays, meta, s = restored.arrays, restored.meta, self.settings
        try:
            learner = CANDIDATE_LEARNERS[s.candidates_learner].from_state(arrays, meta["learner"])
            if (learner.d_x, learner.d_c) != (s.candidates_shared_features,
                                              s.candidates_candidate_features):
                raise CheckpointMismatch(
                    f"checkpoint {restored.seq} in {s.checkpoint_dir} holds a candidate learner "
                    f"with (d_x, d_c) = {learner.d_x, learner.d_c}; this daemon is configured "
                    f"for {s.candidates_shared_features, s.candidates_candidate_features}")
            joins = PendingJoins.restore(s.candidates_max_slots, learner.d_x + 2 * learner.d_c,
                                         s.join_settings(), arrays, meta["join"])
            tracker_load(self.tracker, arrays, meta["tracker"])
            counters = Counters.from_json(meta["counters"])
            early = meta["candidates"]["early_rewards"]
        except CheckpointMismatch:
            raise
        except (KeyError, TypeError, ValueError, StateError) as exc:
            raise StateError(f"checkpoint {restored.seq} in {s.checkpoint_dir} does not fit this "
                             f"candidate-mode daemon: {exc!r}") from exc
        warn_settings_kept(restored.seq, self.engine.learner.hyperparameters(),
                           learner.hyperparameters())
        self.engine = CandidateEngine(learner, s.join_settings(), s.candidates_max_slots, joins,
                                      early)
        self.counters = counters

    # ------------------------------------------------------------------ phases
    def _decide(self, messages: list[Message], wall: float) -> None:
        if not messages:
            return
        s = self.settings
        batch, rejected = decode_candidate_requests(
            messages, s.candidates_shared_features, s.candidates_candidate_features, self.limits,
            s.candidates_max_candidates, s.candidates_max_slots)
        self.observer.on_batch(len(messages), "instances")
        known = self.engine.is_known(batch.ids)
        self._reject_with_known(rejected, known, batch.ids, batch.messages)
        if known.any():
            batch = _take(batch, np.flatnonzero(~known))
        B = len(batch)
        if B == 0:
            return
        self.observer.on_instances(B)
        journaled = {i: j for i in batch.ids if (j := self._journaled.pop(i, None)) is not None} \
            if self._journaled else {}
        known_decisions = {i: Journaled([c["id"] for c in j.message["candidates"]],
                                        [c["prob"] for c in j.message["candidates"]],
                                        j.message["ranking"][0], float(j.message["ts"]))
                           for i, j in journaled.items()}
        decided = self.engine.decide(batch.ids, batch.sets, batch.candidate_ids, batch.slots,
                                     batch.partitions, wall, known_decisions,
                                     self.counters.model_version, event_ts=batch.ts)
        values = self._values(batch, decided, journaled, wall)
        self.outputs.decisions([i.encode("utf-8") for i in batch.ids], values)
        first = decided.slot_probs[decided.fresh, 0]
        self._count_decided(batch.messages, decided.fresh, int(decided.explored.sum()),
                            np.zeros(0, np.int64),
                            float(np.mean(1.0 - first)) if len(first) else 0.0)

    def _values(self, batch: CandidateRequests, decided: CandidateDecided,
                journaled: dict[str, Any], wall: float) -> list[bytes]:
        """The decision messages: new ones journaled before they are published, journaled
        ones as they were (byte-identical)."""
        values = [orjson.dumps(journaled[i].message) if i in journaled else b"" for i in batch.ids]
        fresh = decided.fresh
        if not len(fresh):
            return values
        sets, cids = batch.sets, batch.candidate_ids
        # ranking: the exploit candidate first, then the rest by the model's estimate
        key = np.where(np.isnan(decided.scores), -np.inf, decided.scores)
        key[decided.exploit] = np.inf
        order = np.lexsort((-key, sets.request_of))
        ranked_ids = np.asarray(cids, dtype=object)[order]  # each request's slice, in order
        model = f"{self.model_name}-v{self.counters.model_version}"
        records = []
        for j in fresh.tolist():
            start, stop = int(sets.offsets[j]), int(sets.offsets[j + 1])
            placed = decided.chosen[j][decided.chosen[j] >= 0].tolist()
            probs = decided.slot_probs[j, :len(placed)].tolist()
            records.append({"id": batch.ids[j],
                            "candidates": [{"id": cids[r], "prob": p}
                                           for r, p in zip(placed, probs, strict=True)],
                            "prob": float(np.prod(probs)),
                            "ranking": ranked_ids[start:stop].tolist(),
                            "explored": bool(placed[0] != decided.exploit[j]),
                            "model": model, "ts": wall})
        return self._journal_and_encode(values, fresh, records, decided.slot_probs[fresh])

    def _decode_feedback(self, messages: list[Message]) -> tuple[Any, list[Rejection]]:
        return decode_candidate_feedback(messages, self.limits)

    def _track(self, closed: Closed, rows: np.ndarray) -> None:
        self.tracker.observe(closed.actions[rows], closed.rewards[rows])


def _take(batch: CandidateRequests, rows: np.ndarray) -> CandidateRequests:
    offsets, items = batch.sets.offsets, rows.tolist()
    return CandidateRequests(
        ids=[batch.ids[i] for i in items], sets=batch.sets.take(rows),
        candidate_ids=[c for i in items for c in batch.candidate_ids[offsets[i]:offsets[i + 1]]],
        slots=batch.slots[rows], ts=batch.ts[rows], partitions=batch.partitions[rows],
        messages=[batch.messages[i] for i in items])
