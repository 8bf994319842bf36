"""Batch rankers and ranking metrics.

Every ranker follows :class:`streamlearn.rankers.base.Ranker`:
``fit(X, y, qid=None, sample_weight=None) -> self`` and ``score(X) -> ndarray``
(higher ranks first). Metrics (AUC, ROC, NDCG@k, AP/MAP, P@k) are in
:mod:`streamlearn.rankers.metrics`; the LETOR reader and protocol in
:mod:`streamlearn.datasets.letor` and :mod:`simulators.rankers.letor`.
Roger / n'Roger and the routing classifiers live in their own modules
(:mod:`streamlearn.rankers.roger`, :mod:`streamlearn.rankers.routing`).
"""

from __future__ import annotations

from streamlearn.rankers.adarank import AdaRank
from streamlearn.rankers.base import Ranker
from streamlearn.rankers.ndcg_boost import NDCGBoost
from streamlearn.rankers.rankboost import RankBoost

__all__ = ["AdaRank", "NDCGBoost", "RankBoost", "Ranker"]
