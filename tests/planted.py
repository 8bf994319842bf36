"""Planted rankers for the promotion test: one known better than the online learner, one worse.

They ignore the IPS-weighted pairs they are given and read the simulation's
labels from the experience log (``PLANTED_LOG_DIR``) instead — something no
real ranker can do — so their policy's quality is known in advance: the nearest
class centroid of the logged contexts (better than an online learner early in
a stream) and the farthest one (worse than anything sensible). They are loaded
by the daemon's retrainer as ``planted:CentroidOracle`` / ``planted:CentroidAntiOracle``
(``tests/`` on ``PYTHONPATH``). ``planted:NeverLogged`` is a policy no logged row can
measure.
"""

from __future__ import annotations

import os
from typing import ClassVar

import numpy as np

from streamlearn.durability.experience import read_experience
from streamlearn.rankers.base import FitData, Ranker


class CentroidOracle(Ranker):
    """Scores (x, a) by −‖x − c_a‖², c_a the mean logged context of label a."""

    sign: ClassVar[float] = 1.0

    def __init__(self) -> None:
        pass

    def _fit(self, data: FitData) -> None:
        rows = read_experience(os.environ["PLANTED_LOG_DIR"])
        known = rows.labels >= 0
        n_actions = rows.probs.shape[1]
        X, labels = rows.X[known].astype(np.float64), rows.labels[known]
        centroids = np.zeros((n_actions, X.shape[1]))
        counts = np.bincount(labels, minlength=n_actions)
        np.add.at(centroids, labels, X)
        self.centroids_ = centroids / np.maximum(counts, 1)[:, None]

    def _score(self, X: np.ndarray) -> np.ndarray:
        n_actions, d = self.centroids_.shape
        blocks = X.reshape(len(X), n_actions, d)
        action = np.argmax(np.abs(blocks).sum(axis=2), axis=1)  # φ(x, a) = x ⊗ e_a
        x = blocks[np.arange(len(X)), action]
        distance = ((x - self.centroids_[action]) ** 2).sum(axis=1)
        return np.asarray(-self.sign * distance)


class CentroidAntiOracle(CentroidOracle):
    """The farthest centroid first: a policy worse than any learner."""

    sign: ClassVar[float] = -1.0


class NeverLogged(Ranker):
    """First the action after the logged one (mod K) for every logged context: its policy
    never matches a logged action, so no held-out row can weigh its value (SNIPS is 0/0)."""

    def __init__(self) -> None:
        pass

    def _fit(self, data: FitData) -> None:
        rows = read_experience(os.environ["PLANTED_LOG_DIR"])
        self.n_actions_ = rows.probs.shape[1]
        self.logged_X_ = rows.X.astype(np.float64)
        self.logged_actions_ = rows.actions.astype(np.int64)

    def _score(self, X: np.ndarray) -> np.ndarray:
        blocks = X.reshape(len(X), self.n_actions_, -1)
        action = np.argmax(np.abs(blocks).sum(axis=2), axis=1)  # φ(x, a) = x ⊗ e_a
        x = blocks[np.arange(len(X)), action]
        same = (x[:, None, :] == self.logged_X_[None, :, :]).all(axis=2)
        logged = np.where(same.any(axis=1), self.logged_actions_[same.argmax(axis=1)], -1)
        return np.asarray(action == (logged + 1) % self.n_actions_, dtype=np.float64)


class LeakyOracle(Ranker):
    """Knows the label of every context in the experience log when it is first used (a
    leak: it reads the log, the rows it is judged on included, since every evidence row is
    logged before a look) and plays action 0 on any context it has not seen. Judged
    off-policy it looks perfect at every look; live, on fresh contexts (logged only once
    served), it is right one time in K. The guardrail must catch what the gate cannot."""

    def __init__(self) -> None:
        pass

    def _fit(self, data: FitData) -> None:
        self.n_actions_ = read_experience(os.environ["PLANTED_LOG_DIR"]).probs.shape[1]

    def _lookup_table(self) -> dict[bytes, int]:
        """Context bytes → label of every logged row, read at first use (not part of the
        artifact: a loaded ranker reads the log as it is then)."""
        lookup: dict[bytes, int] | None = getattr(self, "_lookup", None)
        if lookup is None:
            rows = read_experience(os.environ["PLANTED_LOG_DIR"])
            known = rows.labels >= 0
            contexts = np.ascontiguousarray(rows.X[known], dtype=np.float32)
            lookup = self._lookup = {row.tobytes(): int(label) for row, label in
                                     zip(contexts, rows.labels[known].tolist(), strict=True)}
        return lookup

    def _contexts(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's action a and its context x, from φ(x, a) = x ⊗ e_a."""
        blocks = X.reshape(len(X), self.n_actions_, -1)
        action = np.argmax(np.abs(blocks).sum(axis=2), axis=1)
        return action, np.ascontiguousarray(blocks[np.arange(len(X)), action], dtype=np.float32)

    def _score(self, X: np.ndarray) -> np.ndarray:
        lookup = self._lookup_table()
        action, x = self._contexts(X)
        label = np.array([lookup.get(row.tobytes(), 0) for row in x])
        return np.asarray(action == label, dtype=np.float64)


class MemoryOracle(LeakyOracle):
    """Like :class:`LeakyOracle`, but on a context it has not seen it ranks by the nearest
    class centroid (of the rows it was trained on). On a replayed dataset (pendigits: 10,992
    rows over and over) every context comes again, so it is right live as well: truly better
    than any learner."""

    def _fit(self, data: FitData) -> None:
        super()._fit(data)
        centroid = CentroidOracle()
        centroid._fit(data)
        self.centroids_ = centroid.centroids_

    def _score(self, X: np.ndarray) -> np.ndarray:
        known = super()._score(X)
        lookup = self._lookup_table()
        action, x = self._contexts(X)
        seen = np.array([row.tobytes() in lookup for row in x])
        distance = ((x.astype(np.float64) - self.centroids_[action]) ** 2).sum(axis=1)
        return np.where(seen, 2.0 * known, -distance / (1.0 + distance))  # seen rows first


class RelevanceOracle(Ranker):
    """OHSUMED candidate sets (``ohsumed-candidates``): scores each candidate by its true
    reward (relevance ≥ 1), read from the LETOR files — something no real ranker can do —
    found by its 45 features (φ's first columns; no shared context), so its policy is the
    best there is. Candidates it does not know score 0."""

    sign: ClassVar[float] = 1.0

    def __init__(self) -> None:
        pass

    def _fit(self, data: FitData) -> None:
        from streamlearn.datasets.candidates import OHSUMED_FEATURES, load_candidate_stream

        stream = load_candidate_stream("ohsumed-candidates", passes=1, seed=0)
        self.projection_ = np.random.default_rng(0).normal(size=OHSUMED_FEATURES)
        keys = self._keys(stream.sets.items)
        order = np.argsort(keys)
        self.keys_, self.rewards_ = keys[order], np.asarray(stream.rewards, np.float64)[order]

    def _keys(self, items: np.ndarray) -> np.ndarray:
        """One number per candidate: its features (rounded, so a JSON round trip or float32
        storage does not change it) projected on a fixed random direction."""
        rounded = np.round(np.asarray(items, dtype=np.float64)[:, :len(self.projection_)], 4)
        return np.asarray(rounded @ self.projection_)

    def _score(self, X: np.ndarray) -> np.ndarray:
        keys = self._keys(X)
        at = np.clip(np.searchsorted(self.keys_, keys), 0, len(self.keys_) - 1)
        known = np.isclose(self.keys_[at], keys, rtol=0.0, atol=1e-6)
        return np.asarray(self.sign * np.where(known, self.rewards_[at], 0.0))


class RelevanceAntiOracle(RelevanceOracle):
    """The irrelevant candidates first: a policy worse than any learner."""

    sign: ClassVar[float] = -1.0


class KeepsNothing(Ranker):
    """A fit that kept nothing (AdaRank with no eligible round): the same score for every
    candidate."""

    def __init__(self) -> None:
        pass

    def _fit(self, data: FitData) -> None:
        self.level_ = np.zeros(1)

    def _score(self, X: np.ndarray) -> np.ndarray:
        return np.zeros(len(X))
