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

>>> probs = np.array([0.5, 0.3, 0.2]); offsets = np.array([0, 3])
>>> chosen, p = sample_slate(probs, offsets, np.array([2]), np.array([[0.1, 0.9]]))
>>> chosen.tolist(), np.round(p, 4).tolist()  # slot 2 renormalised over {1, 2}: 0.3/0.5, 0.2/0.5
([[0, 2]], [[0.5, 0.4]])
"""

from __future__ import annotations

import math

import numpy as np

from streamlearn.candidates.sets import segment_sample
from streamlearn.errors import DataError
from streamlearn.evaluation.offpolicy import _Z, Estimate

__all__ = ["sample_slate", "slate_ips"]


def sample_slate(probs: np.ndarray, offsets: np.ndarray, slots: np.ndarray,
                 uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fill ``slots[r]`` slots of each request (uniforms (B, max k)): chosen global rows
    (B, max k) and their conditional propensities, −1 / 0 beyond a request's slots."""
    sizes = np.diff(offsets)
    slots = np.asarray(slots, dtype=np.int64)
    if (slots < 1).any() or (slots > sizes).any():
        raise DataError("Expected 1 <= slots <= candidates for every request. Got "
                        f"slots {slots[(slots < 1) | (slots > sizes)][:3].tolist()}...")
    B, k = len(sizes), int(slots.max()) if len(slots) else 0
    remaining = np.asarray(probs, dtype=np.float64).copy()
    chosen = np.full((B, k), -1, dtype=np.int64)
    slot_probs = np.zeros((B, k))
    request = np.repeat(np.arange(B), sizes)
    for s in range(k):  # a loop over slot positions, each vectorised over every request
        active = slots > s
        mass = np.add.reduceat(remaining, offsets[:-1]) if len(remaining) else np.zeros(0)
        # a request whose remaining candidates all have probability 0 places them uniformly
        empty = mass <= 0
        weights = np.where(empty[request], 1.0, remaining)
        placed = chosen[:, :s][chosen[:, :s] >= 0]
        weights[placed] = 0.0
        totals = np.add.reduceat(weights, offsets[:-1])
        rows = segment_sample(weights, offsets, uniforms[:, s])
        p = weights[rows] / np.where(totals > 0, totals, 1.0)
        chosen[active, s] = rows[active]
        slot_probs[active, s] = p[active]
        remaining[rows[active]] = 0.0
    return chosen, slot_probs


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
