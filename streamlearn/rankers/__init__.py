"""Batch rankers (RankBoost, AdaRank, NDCG_Boost, Roger/n'Roger, routing classifiers) and metrics.

Every ranker follows :class:`streamlearn.rankers.base.Ranker`:
``fit(X, y, qid=None, sample_weight=None) -> self`` and ``score(X) -> ndarray``.
Metrics live in :mod:`streamlearn.rankers.metrics`. Rankers are imported from
their modules (``from streamlearn.rankers.rankboost import RankBoost``); this
package only re-exports the shared interface.
"""

from __future__ import annotations

from streamlearn.rankers.base import Ranker

__all__ = ["Ranker"]
