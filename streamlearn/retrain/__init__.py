"""Retraining batch rankers on the experience log (docs/daemon.md §8).

Pure building blocks, no daemon wiring: :mod:`~streamlearn.rankers.joint` (joint
features and per-action scores), :mod:`~streamlearn.retrain.artifact` (rankers by
name, immutable versioned artifacts) and :mod:`~streamlearn.retrain.job` (the
retrain job run in a worker process, and the promotion rule).
"""

from __future__ import annotations

from streamlearn.rankers.joint import action_scores, greedy, joint_features, rankings
from streamlearn.retrain.artifact import (
    RANKERS,
    RankerArtifact,
    find_artifact,
    load_artifact,
    make_ranker,
    save_artifact,
)

__all__ = ["RANKERS", "RankerArtifact", "action_scores", "find_artifact", "greedy",
           "joint_features", "load_artifact", "make_ranker", "rankings", "save_artifact"]
