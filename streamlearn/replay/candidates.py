"""Replay a candidate-set stream through a candidate learner: online error, regret, speed.

Requests are decided in micro-batches of ``batch_size`` and every decision is
answered at once with the chosen candidate's reward from the stream (the
candidate-set counterpart of :func:`streamlearn.replay.replay` with immediate
feedback). Error is the mean of 1 − reward of the played candidates; regret is
Σ (best expected reward of the request − expected reward of the played
candidate), exact when the stream knows its expected rewards (synthetic), and
against the realised rewards otherwise.

>>> from streamlearn.candidates.learners import CandidateSquareCB
>>> rng = np.random.default_rng(0)
>>> sizes = rng.integers(2, 6, 2000); offsets = np.concatenate([[0], np.cumsum(sizes)])
>>> items = rng.normal(size=(offsets[-1], 3)); rewards = (items[:, 0] > 0).astype(float)
>>> sets = CandidateSets(np.zeros((2000, 0)), items, offsets, rewards)
>>> result = replay_candidates(CandidateSquareCB(0, 3), sets, batch_size=32)
>>> bool(result.error_rate < 0.5 * (1 - rewards.mean()))  # far better than picking at random
True
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from streamlearn.candidates.learners import CandidateLearner
from streamlearn.candidates.sets import CandidateSets, segment_argmax
from streamlearn.errors import ConfigError

__all__ = ["CandidateReplay", "replay_candidates"]


@dataclass
class CandidateReplay:
    """What one replay measured (with slates: per slot position, slot 1 first)."""

    requests: int
    error_rate: float
    mean_regret: float
    seconds: float
    chosen: np.ndarray  # (B,) global candidate rows played; (B, k) with slates
    propensities: np.ndarray  # (B,) their logged probabilities; (B, k) with slates
    slot_error_rates: list[float] | None = None
    slot_regrets: list[float] | None = None

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else float("inf")


def replay_candidates(learner: CandidateLearner, stream: CandidateSets, batch_size: int = 32,
                      expected: np.ndarray | None = None, slots: int | None = None,
                      ) -> CandidateReplay:
    """Decide every request of ``stream`` (which carries rewards), learning as it goes.

    ``expected`` (N,): expected rewards when known, for exact regret. ``slots``: fill
    that many slots per request (at most its candidates) and learn from every slot's
    reward with its conditional propensity; error and regret are then reported per
    slot position (regret of slot s against the s-th best candidate).
    """
    if stream.rewards is None:
        raise ConfigError("Expected a stream with a reward per candidate. Got none.")
    if batch_size < 1:
        raise ConfigError(f"Expected batch_size >= 1. Got {batch_size}.")
    value = stream.rewards if expected is None else np.asarray(expected, dtype=np.float64)
    B = len(stream)
    chosen = np.empty(B, dtype=np.int64)
    propensities = np.empty(B)
    k = 0 if slots is None else int(slots)
    chosen_slates = np.full((B, k), -1, dtype=np.int64)
    slate_probs = np.zeros((B, k))
    started = time.perf_counter()
    for lo in range(0, B, batch_size):
        hi = min(B, lo + batch_size)
        first, last = stream.offsets[lo], stream.offsets[hi]
        batch = CandidateSets(stream.context[lo:hi], stream.items[first:last],
                              stream.offsets[lo:hi + 1] - first)
        if slots is not None:
            slate = learner.decide_slate(batch, np.minimum(batch.sizes, k))
            filled = slate.chosen >= 0
            rows, per_slot = slate.chosen[filled], slate.slot_probs[filled]
            learner.update(slate.phi[rows], stream.rewards[first + rows], per_slot,
                           slate.phi[np.broadcast_to(slate.exploit[:, None], filled.shape)[filled]])
            width = slate.chosen.shape[1]  # fewer when no request of the batch has k candidates
            chosen_slates[lo:hi, :width] = np.where(filled, first + slate.chosen, -1)
            slate_probs[lo:hi, :width] = slate.slot_probs
            continue
        decision = learner.decide(batch)
        rows = decision.chosen
        learner.update(decision.phi[rows], stream.rewards[first + rows], decision.propensities,
                       decision.phi[decision.exploit])
        chosen[lo:hi], propensities[lo:hi] = first + rows, decision.propensities
    seconds = time.perf_counter() - started
    best = value[segment_argmax(value, stream.offsets)]
    if slots is not None:
        return _slate_result(stream, value, chosen_slates, slate_probs, seconds, slots)
    return CandidateReplay(B, float(np.mean(1.0 - stream.rewards[chosen])),
                           float(np.mean(best - value[chosen])), seconds, chosen, propensities)


def _slate_result(stream: CandidateSets, value: np.ndarray, chosen: np.ndarray,
                  probs: np.ndarray, seconds: float, slots: int) -> CandidateReplay:
    """Error and regret per slot position: slot s against the request's s-th best candidate."""
    assert stream.rewards is not None
    ranked = value.copy()
    errors, regrets = [], []
    for s in range(slots):  # a loop over positions, each vectorised over requests
        best = segment_argmax(ranked, stream.offsets)
        filled = chosen[:, s] >= 0
        rows = chosen[filled, s]
        errors.append(float(np.mean(1.0 - stream.rewards[rows])) if len(rows) else float("nan"))
        regrets.append(float(np.mean(value[best[filled]] - value[rows])) if len(rows)
                       else float("nan"))
        ranked[best] = -np.inf
    return CandidateReplay(len(stream), errors[0], regrets[0], seconds, chosen, probs,
                           errors, regrets)
