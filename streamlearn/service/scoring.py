"""The retrained rankers in the hot path: their scores, and who serves a batch.

:class:`Scorer` reads the :class:`~streamlearn.service.ranker_state.RankerState` for the
decide step (:mod:`streamlearn.service.modes`): the scores of the ranker whose ranking
decisions carry (:meth:`Scorer.scores`), the policies that share a batch with
``retrain.policy = "ranker"`` (:meth:`Scorer.mixture`) and the name a decision served by
a ranker carries (:meth:`Scorer.policy_names`). It changes nothing.
"""

from __future__ import annotations

import numpy as np

from streamlearn.actions import best_first
from streamlearn.candidates.joint import joint_features
from streamlearn.candidates.sets import CandidateSets
from streamlearn.candidates.slates import SlateMixture
from streamlearn.durability.experience import dense_rows
from streamlearn.engine import Mixture
from streamlearn.errors import DataError
from streamlearn.features import Batch
from streamlearn.rankers.joint import action_scores
from streamlearn.retrain.artifact import RankerArtifact
from streamlearn.service.ranker_state import RankerState

__all__ = ["Scorer", "ranking_lists"]


def ranking_lists(scores: np.ndarray, mask: np.ndarray | None) -> list[list[int]]:
    """Per row, the allowed actions best first.

    >>> ranking_lists(np.array([[0.1, 0.9, 0.5]]), np.array([[True, False, True]]))
    [[2, 0]]
    """
    order: list[list[int]] = best_first(scores, mask).tolist()
    if mask is None:
        return order
    n_allowed = np.asarray(mask, dtype=bool).sum(axis=1).tolist()
    return [row[:n] for row, n in zip(order, n_allowed, strict=True)]


class Scorer:
    """The rankers' scores and the rollout's mixture for a batch (module doc)."""

    def __init__(self, rankers: RankerState, n_actions: int) -> None:
        self.rankers, self.n_actions = rankers, n_actions

    def scores(self, X: Batch) -> np.ndarray | None:
        """(B, K) scores of the ranker decisions are ranked by, or None when none is."""
        ranker = self.rankers.serving
        if ranker is None:
            return None
        scores = self._checked(ranker, dense_rows(X))
        if scores is None:  # it failed and was taken out: what ranks now, if any
            return None if self.rankers.serving is ranker else self.scores(X)
        return scores

    def _checked(self, artifact: RankerArtifact, rows: np.ndarray, joint: bool = False
                 ) -> np.ndarray | None:
        """A retrained ranker's scores (user code) of each action of dense ``rows`` (B, K),
        or with ``joint`` of each joint feature row (N,); None when they failed (it raised,
        or gave scores of another shape or not finite: ``Ranker.score`` checks): the ranker
        is then taken out of serving (:meth:`RankerState.failed_in_serving`) and the batch
        goes on without it."""
        try:
            scores = (artifact.ranker.score(rows) if joint else
                      action_scores(artifact.ranker, rows, self.n_actions))
            if not np.isfinite(scores).all():  # (the built-in linear ones skip score())
                raise DataError("its scores hold NaN or infinity")
            return scores
        except Exception as exc:  # user code: never fatal to the loop
            self.rankers.failed_in_serving(artifact, f"{type(exc).__name__}: {exc}")
            return None

    def mixture(self, X: Batch, ranking: np.ndarray | None) -> Mixture | None:
        """The policies that share this batch (``retrain.policy = "ranker"``), or None when
        the learner serves every event. ``ranking``: :meth:`scores` of the batch, reused
        for the arm it belongs to."""
        rankers = self.rankers
        rollout = rankers.rollout
        if rankers.policy != "ranker" or not rollout.serving():
            return None
        serving = rankers.serving
        dense: np.ndarray | None = None
        scores: dict[int, np.ndarray] = {}
        for arm in rollout.serving():
            artifact = rankers.arms[arm.version]
            if ranking is not None and artifact is serving:
                scores[arm.version] = ranking
                continue
            dense = dense_rows(X) if dense is None else dense
            checked = self._checked(artifact, dense)
            if checked is None:  # taken out of the rollout: the shares changed
                if arm in rollout.serving():
                    return None  # (cannot happen: not taken out; the learner serves)
                return self.mixture(X, ranking if rankers.serving is serving else None)
            scores[arm.version] = checked
        return rollout.mixture(scores)

    def slate_mixture(self, sets: CandidateSets) -> SlateMixture | None:
        """Candidate mode: the rankers that place their shares of the batch's slots
        (``retrain.policy = "ranker"``, each scoring φ of every candidate), or None when the
        learner places every slot."""
        rankers = self.rankers
        if rankers.policy != "ranker":
            return None
        shares = rankers.rollout.shares()
        arms = [arm for arm in rankers.rollout.serving()
                if shares.get(arm.version, 0.0) > 0 and arm.version in rankers.arms]
        if not arms:
            return None
        phi = joint_features(sets)
        scores = []
        for arm in arms:
            artifact = rankers.arms[arm.version]
            checked = self._checked(artifact, phi, joint=True)
            if checked is None:  # taken out of the rollout: the shares changed
                return None if arm in rankers.rollout.serving() else self.slate_mixture(sets)
            scores.append(checked)
        return SlateMixture(tuple(arm.version for arm in arms),
                            tuple(shares[arm.version] for arm in arms), tuple(scores))

    def policy_names(self) -> dict[int, str]:
        """Version → the name a decision served by that ranker carries (``"policy"``)."""
        return {arm.version: f"{arm.name}-v{arm.version}" for arm in self.rankers.rollout.serving()}

    @property
    def exploits(self) -> bool:
        """Whether a ranker serves some of the events."""
        return self.rankers.policy == "ranker" and bool(self.rankers.rollout.serving())
