"""Slates: k slots filled by per-slot sampling without replacement, and their IPS value.

Vowpal Wabbit's conditional-contextual-bandit semantics: slot 1 is sampled from
the request's exploration distribution p; slot s from p restricted to the
candidates not yet placed and renormalised. The logged propensity of slot s is
that conditional probability, p_s = p(c_s) / (1 − Σ_{j<s} p(c_j)).

:func:`slate_ips` estimates a deterministic slate policy's value — the expected
sum of its slots' rewards — from such logs. Slot s of the target counts only
when the target's slots 1..s all equal the logged ones, weighted by
Π_{j≤s} 1/p_j: the probability of the logged prefix is exactly that product, so
each slot's term is unbiased for the target's slot-s reward (the cascade
estimator; tested against the true value of a synthetic stream).

A retrained ranker takes part of the traffic **slot by slot** (:func:`sample_mixed_slate`
with a :class:`RankerShare`): each slot is placed by the ranker with probability ``share``
(deployed: 1 − γ on its best candidate not yet placed, γ spread over those), by the learner
otherwise, and the logged propensity is the mixture's. Off-policy, a ranker is judged **per
slot, given the logged prefix** (:func:`deployed_slot_probs`, :func:`slot_values`,
:func:`slot_terms`): one weight π(c_s | prefix)/p_s per term instead of the cascade's
product, so the terms are as light-tailed as a fixed-action log's, and each has conditional
mean the target's expected reward at slot s after the slots the logger placed. Both need
every candidate's score, so the log must keep the whole request, not only its placed
candidates.

>>> probs = np.array([0.5, 0.3, 0.2]); offsets = np.array([0, 3])
>>> chosen, p = sample_slate(probs, offsets, np.array([2]), np.array([[0.1, 0.9]]))
>>> chosen.tolist(), np.round(p, 4).tolist()  # slot 2 renormalised over {1, 2}: 0.3/0.5, 0.2/0.5
([[0, 2]], [[0.5, 0.4]])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamlearn.candidates.sets import segment_argmax, segment_sample
from streamlearn.errors import DataError
from streamlearn.evaluation.bounds import Interval, value_interval
from streamlearn.evaluation.offpolicy import _Z, Estimate

__all__ = ["RankerShare", "SlateMixture", "deployed_distribution", "deployed_slot_probs", "mix_slot",
           "sample_mixed_slate",
           "sample_slate", "serving_scores", "slate_ips", "slot_exploration", "slot_terms", "slot_values",
           "slot_weights"]


@dataclass(frozen=True)
class RankerShare:
    """A ranker that places part of every slate, slot by slot (the per-slot mixture).

    At each slot of request r the ranker places the candidate with probability
    ``share[r]`` (where ``uniforms[r, s] < share[r]``), the learner otherwise. The ranker
    is *deployed* (:func:`deployed_slot_probs`): 1 − γ on its best-scored candidate not
    yet placed, γ spread uniformly over those, with ``gamma[r]``.
    """

    scores: np.ndarray  # (N,) the ranker's score of every candidate
    share: np.ndarray  # (B,) probability that the ranker places a slot
    gamma: np.ndarray  # (B,) the deployed ranker's exploration
    uniforms: np.ndarray  # (B, max k) who places each slot


@dataclass(frozen=True)
class SlateMixture:
    """The retrained rankers that serve part of every slot (a rollout's arms) beside the
    learner: their versions (what a slot they place records as its server), each one's
    share of the slots (together at most 1; the learner the rest) and its (N,) scores of
    the batch's candidates."""

    versions: tuple[int, ...]
    shares: tuple[float, ...]
    scores: tuple[np.ndarray, ...]


def serving_scores(scores: np.ndarray, exploit: np.ndarray, first_server: np.ndarray,
                   mixture: SlateMixture | None, offsets: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Each request's candidates scored by the policy that placed its first slot, and that
    policy's best candidate: the learner's ``scores`` (N,) and ``exploit`` (B,) global rows
    where it placed it (``first_server`` 0), else the ranker's of that version in
    ``mixture`` (its best-scored candidate). A decision's ranking and its ``explored``
    flag describe what served it.

    >>> mix = SlateMixture((4,), (0.5,), (np.array([0.0, 9.0, 1.0, 5.0, 2.0]),))
    >>> s, e = serving_scores(np.array([3.0, 2.0, 1.0, 1.0, 2.0]), np.array([0, 4]),
    ...                       np.array([0, 4]), mix, np.array([0, 3, 5]))
    >>> s.tolist(), e.tolist()  # request 2 was served by ranker v4: its order, its best
    ([3.0, 2.0, 1.0, 5.0, 2.0], [0, 3])
    """
    served = np.asarray(first_server, dtype=np.int64)
    if mixture is None or not served.any():
        return scores, exploit
    sizes = np.diff(offsets)
    out_scores, out_exploit = np.array(scores, dtype=np.float64), np.array(exploit, dtype=np.int64)
    for version, ranker_scores in zip(mixture.versions, mixture.scores, strict=True):
        mine = served == version
        if mine.any():
            rows = np.repeat(mine, sizes)
            ranker = np.asarray(ranker_scores, dtype=np.float64)
            out_scores[rows] = ranker[rows]
            out_exploit[mine] = segment_argmax(ranker, offsets)[mine]
    return out_scores, out_exploit


def deployed_distribution(scores: np.ndarray, offsets: np.ndarray, placed: np.ndarray,
              gamma: np.ndarray) -> np.ndarray:
    """(N,) the deployed ranker's distribution over each request's candidates not yet
    ``placed``: 1 − γ on the best-scored, γ uniform over all of them (0 on placed rows).

    >>> deployed_distribution(np.array([3.0, 2.0, 1.0]), np.array([0, 3]),
    ...                       np.array([True, False, False]), np.array([0.2])).tolist()
    [0.0, 0.9, 0.1]
    """
    sizes = np.diff(offsets)
    free = ~placed
    n_free = np.add.reduceat(free.astype(np.int64), offsets[:-1]) if len(free) else sizes
    best = segment_argmax(np.where(free, scores, -np.inf), offsets)
    g = np.clip(np.asarray(gamma, dtype=np.float64), 0.0, 1.0)
    probs = np.where(free, np.repeat(g / np.maximum(n_free, 1), sizes), 0.0)
    some = n_free > 0
    probs[best[some]] += 1.0 - g[some]
    return probs


def slot_exploration(first_prob: np.ndarray, exploit_first: np.ndarray, sizes: np.ndarray
                     ) -> np.ndarray:
    """γ of each request, read from its first slot as if the learner were ε-greedy around its
    exploit candidate (1 − γ + γ/n on it, γ/n on the others): the exploration a ranker
    deployed on that request keeps. Any γ in [0, 1] defines a valid target, so an
    approximate γ for learners of another shape biases nothing.

    >>> slot_exploration(np.array([0.9, 0.05]), np.array([True, False]), np.array([5, 4])).round(3)
    array([0.125, 0.2  ])
    """
    n = np.maximum(np.asarray(sizes, dtype=np.float64), 1.0)
    p = np.asarray(first_prob, dtype=np.float64)
    gamma = np.where(exploit_first, (1.0 - p) * n / np.maximum(n - 1.0, 1.0), p * n)
    return np.asarray(np.clip(gamma, 0.0, 1.0))


def sample_slate(probs: np.ndarray, offsets: np.ndarray, slots: np.ndarray,
                 uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fill ``slots[r]`` slots of each request (uniforms (B, max k)): chosen global rows
    (B, max k) and their conditional propensities, −1 / 0 beyond a request's slots."""
    chosen, slot_probs, _ = sample_mixed_slate(probs, offsets, slots, uniforms)
    return chosen, slot_probs


def sample_mixed_slate(probs: np.ndarray, offsets: np.ndarray, slots: np.ndarray,
                       uniforms: np.ndarray, ranker: RankerShare | None = None,
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`sample_slate` with slots placed by a ``ranker`` at its share: chosen rows,
    their conditional propensities under the mixture, share·π_ranker + (1 − share)·q_learner
    over the candidates not yet placed, and (B, max k) whether the ranker placed each slot.

    The propensity is the mixture's, whoever placed the slot, so the logged propensities
    stay exact for the learner and for every off-policy estimate.
    """
    sizes = np.diff(offsets)
    slots = np.asarray(slots, dtype=np.int64)
    if (slots < 1).any() or (slots > sizes).any():
        raise DataError("Expected 1 <= slots <= candidates for every request. Got "
                        f"slots {slots[(slots < 1) | (slots > sizes)][:3].tolist()}...")
    B, k = len(sizes), int(slots.max()) if len(slots) else 0
    remaining = np.asarray(probs, dtype=np.float64).copy()
    placed = np.zeros(len(remaining), dtype=bool)
    chosen = np.full((B, k), -1, dtype=np.int64)
    slot_probs = np.zeros((B, k))
    by_ranker = np.zeros((B, k), dtype=bool)
    request = np.repeat(np.arange(B), sizes)
    for s in range(k):  # a loop over slot positions, each vectorised over every request
        active = slots > s
        mass = np.add.reduceat(remaining, offsets[:-1]) if len(remaining) else np.zeros(0)
        # a request whose remaining candidates all have probability 0 places them uniformly
        weights = np.where((mass <= 0)[request], 1.0, remaining)
        weights[placed] = 0.0
        totals = np.add.reduceat(weights, offsets[:-1]) if len(weights) else np.zeros(0)
        learner = weights / np.repeat(np.where(totals > 0, totals, 1.0), sizes)
        draw, mixed = learner, learner
        if ranker is not None:
            draw, mixed, who = mix_slot(learner, offsets, placed, (ranker.scores,),
                                        np.asarray(ranker.share, dtype=np.float64)[:, None],
                                        ranker.gamma, np.asarray(ranker.uniforms)[:, s])
            by_ranker[:, s] = active & (who == 0)
        rows = segment_sample(draw, offsets, uniforms[:, s])
        chosen[active, s] = rows[active]
        slot_probs[active, s] = mixed[rows[active]]
        remaining[rows[active]] = 0.0
        placed[rows[active]] = True
    return chosen, slot_probs, by_ranker


def mix_slot(learner: np.ndarray, offsets: np.ndarray, placed: np.ndarray,
             scores: Sequence[np.ndarray], shares: np.ndarray, gamma: np.ndarray,
             who_uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One slot of a slate that rankers share with the learner: the distribution each
    request's slot is drawn from, the mixture's distribution (its logged propensities) and
    who places it.

    ``learner`` (N,) is the learner's distribution over the candidates not yet ``placed``;
    ranker j (``scores[j]``, (N,)) places the slot of request r with probability
    ``shares[r, j]`` (``shares`` (B, R), rows summing to at most 1; the learner the rest),
    deployed with ``gamma[r]`` (:func:`deployed_distribution`); ``who_uniforms`` (B,)
    choose who places it: ``who`` (B,) is j, or −1 for the learner. The mixture,
    Σ_j share_j·π_j + (1 − Σ_j share_j)·q, is the same whoever placed the slot.
    """
    sizes = np.diff(offsets)
    shares = np.clip(np.asarray(shares, dtype=np.float64), 0.0, 1.0)
    if shares.ndim != 2 or shares.shape[1] != len(scores) or not len(scores):
        raise ValueError(f"Expected shares (B, R) for R = {len(scores)} >= 1 rankers. Got shape "
                         f"{shares.shape}.")
    # ranker j places the slot where u falls in [Σ_{i<j} share_i, Σ_{i<=j} share_i)
    below = np.asarray(who_uniforms, dtype=np.float64)[:, None] < np.cumsum(shares, axis=1)
    who = np.where(below.any(axis=1), below.argmax(axis=1), -1)
    learner_share = 1.0 - shares.sum(axis=1)
    request_who = np.repeat(who, sizes)
    draw = np.asarray(learner, dtype=np.float64).copy()
    mixed = np.repeat(learner_share, sizes) * learner
    for j, ranker_scores in enumerate(scores):
        deployed = deployed_distribution(np.asarray(ranker_scores, dtype=np.float64), offsets,
                                         placed, gamma)
        mixed = mixed + np.repeat(shares[:, j], sizes) * deployed
        draw = np.where(request_who == j, deployed, draw)
    return draw, mixed, who


def deployed_slot_probs(scores: np.ndarray, offsets: np.ndarray, logged: np.ndarray,
                        gamma: np.ndarray) -> np.ndarray:
    """(B, k) the probability that a ranker, deployed slot by slot (1 − γ on its best-scored
    candidate not yet placed, γ uniform over those), would place each logged candidate
    given the **logged** prefix of its slate; 0 where ``logged`` is −1.

    >>> deployed_slot_probs(np.array([3.0, 2.0, 1.0]), np.array([0, 3]), np.array([[1, 0]]),
    ...                     np.array([0.3])).round(3).tolist()  # slot 2: best of {0, 2} is 0
    [[0.1, 0.85]]
    """
    logged = np.asarray(logged, dtype=np.int64)
    out = np.zeros(logged.shape)
    placed = np.zeros(len(scores), dtype=bool)
    for s in range(logged.shape[1]):
        used = logged[:, s] >= 0
        deployed = deployed_distribution(np.asarray(scores, dtype=np.float64), offsets, placed, gamma)
        out[used, s] = deployed[logged[used, s]]
        placed[logged[used, s]] = True
    return out


def slot_weights(logged: np.ndarray, slot_probs: np.ndarray, target_probs: np.ndarray,
                 ) -> np.ndarray:
    """(B, k) importance weights π(c_s | logged prefix) / p_s of every logged slot; 0 where
    a request has no slot s."""
    used = np.asarray(logged) >= 0
    return np.where(used, target_probs / np.where(used & (slot_probs > 0), slot_probs, 1.0), 0.0)


def slot_values(rewards: np.ndarray, logged: np.ndarray, slot_probs: np.ndarray,
                target_probs: np.ndarray, alpha: float) -> list[Interval]:
    """Per slot s, a confidence sequence (each side at α/2) for the target's expected reward
    at slot s **given the logged prefix** — what it would earn placing slot s after the
    slots the logger placed — over the requests with a slot s, in the order given.

    One weight per term, π(c_s | prefix)/p_s (the cascade estimator of :func:`slate_ips`
    multiplies s of them), so the per-slot values have far lighter tails than the whole
    slate's. Rewards in [0, 1].
    """
    w = slot_weights(logged, slot_probs, target_probs)
    used = np.asarray(logged) >= 0
    return [value_interval(np.asarray(rewards)[used[:, s], s], w[used[:, s], s], alpha)
            for s in range(used.shape[1])]


def slot_terms(rewards: np.ndarray, logged: np.ndarray, slot_probs: np.ndarray,
               target_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reward and the weight π(c_s | logged prefix)/p_s of every logged slot, request
    after request and slot after slot within one: the terms of the promotion gate's paired
    advantage per slot (:func:`streamlearn.retrain.promotion.judge_weighted`), each with
    conditional mean the target's value at that slot given the logged prefix, as the
    logger's reward has the logger's."""
    used = np.asarray(logged) >= 0
    w = slot_weights(logged, slot_probs, target_probs)
    return np.asarray(rewards, dtype=np.float64)[used], w[used]


def slate_ips(rewards: np.ndarray, logged: np.ndarray, slot_probs: np.ndarray,
              target: np.ndarray, level: float = 0.95) -> Estimate:
    """Cascade IPS of a deterministic slate policy's value (Σ over slots of its rewards).

    All arrays (B, k); ``target`` the target's global rows, −1 where a request has
    fewer slots (those slots count for nothing).
    """
    used = (logged >= 0) & (target >= 0)
    match = (logged == target) & used
    safe = np.where(used & (slot_probs > 0), slot_probs, 1.0)
    prefix = np.cumprod(np.where(match, 1.0 / safe, 0.0), axis=1)
    terms = (prefix * np.where(used, rewards, 0.0)).sum(axis=1)
    n = len(terms)
    value = float(terms.mean()) if n else math.nan
    stderr = float(terms.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    half = _Z[level] * stderr
    return Estimate(value, stderr, value - half, value + half, n, 0)
