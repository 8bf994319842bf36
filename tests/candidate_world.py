"""A candidate-mode experience log with a known truth, written by the daemon's own writers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from streamlearn.candidates.joint import joint_features
from streamlearn.candidates.sets import segment_argmax
from streamlearn.candidates.slates import sample_slate
from streamlearn.datasets.candidates import synthetic_candidates
from streamlearn.durability.experience import ExperienceLog
from streamlearn.durability.recorder import REQUESTS_DIR, ExperienceRecorder
from streamlearn.engine.candidates import pair_id

D_X, D_C, SLOTS = 2, 3, 3


def logged_world(directory: Path, n_requests: int, seed: int
                 ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    """synthetic-candidates logged by an ε-greedy learner (ε = 0.3 around a noisy scorer),
    3 slots, through the daemon's own writers: the request log (every candidate) and the
    experience log (the placed ones with their rewards). Returns the stream, the true
    weights on φ, each request's logged slate and its slot propensities."""
    stream = synthetic_candidates(n_requests, d_x=D_X, d_c=D_C, min_candidates=3,
                                  max_candidates=12, seed=seed)
    sets, mu = stream.sets, np.asarray(stream.expected)
    logit = np.log(mu) - np.log1p(-mu)
    phi = joint_features(sets)
    truth = np.linalg.lstsq(phi, logit, rcond=None)[0]  # the logit is linear in φ
    rng = np.random.default_rng(seed + 7)
    probs = np.repeat(0.3 / sets.sizes, sets.sizes)
    probs[segment_argmax(logit + rng.normal(0, 1.5, len(mu)), sets.offsets)] += 0.7
    chosen, slot_p = sample_slate(probs, sets.offsets, np.full(len(sets), SLOTS),
                                  rng.random((len(sets), SLOTS)))
    exploit = segment_argmax(probs, sets.offsets)
    decided_at = np.arange(len(sets), dtype=np.float64)
    recorder = ExperienceRecorder(ExperienceLog(directory, segment_rows=5000),
                                  ExperienceLog(directory / REQUESTS_DIR, segment_rows=20_000))
    recorder.open(None, restored=False)
    recorder.record_requests(stream.request_ids, stream.candidate_ids, sets, chosen, slot_p,
                             np.full(len(sets), 0.3), decided_at, 0, SLOTS)  # γ = ε
    r, s = np.nonzero(chosen >= 0)
    rows = chosen[r, s]
    X = np.hstack([sets.context[r], sets.items[rows], sets.items[exploit[r]]])
    p = np.zeros((len(rows), SLOTS))
    p[np.arange(len(rows)), s] = slot_p[r, s]
    assert sets.rewards is not None
    recorder.log.append([pair_id(stream.request_ids[q], stream.candidate_ids[c])
                         for q, c in zip(r.tolist(), rows.tolist(), strict=True)],
                        X, s, p, sets.rewards[rows], np.full(len(rows), -1),
                        np.zeros(len(rows), int), decided_at[r])
    recorder.position()
    return stream, truth, chosen, slot_p
