"""Datasets replayed through the serving engines as bandit streams.

:mod:`~streamlearn.replay.fixed` (fixed actions: delays, drops, drift, a comparator) and
:mod:`~streamlearn.replay.candidates` (candidate sets and slates).
"""

from __future__ import annotations

from streamlearn.replay.fixed import (
    ReplayResult,
    blocks_of,
    default_window,
    replay,
    replay_stream,
    run_with_comparator,
    stderr_progress,
)

__all__ = ["ReplayResult", "blocks_of", "default_window", "replay", "replay_stream",
           "run_with_comparator", "stderr_progress"]
