"""The daemon's checkpointed state: learner, pending joins (with their clocks), tracker, counters.

:func:`freeze` turns it into plain arrays + JSON for a snapshot; :func:`thaw`
rebuilds it from a restored snapshot and refuses one that does not fit this
daemon (another learner shape) with a :class:`~streamlearn.errors.StateError`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from streamlearn.candidates.engine import CandidateEngine
from streamlearn.engine import Engine
from streamlearn.errors import StateError
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.learners.base import Learner
from streamlearn.service.counters import Counters, tracker_arrays, tracker_load
from streamlearn.service.settings import DaemonSettings
from streamlearn.stream.checkpoint import Restored
from streamlearn.stream.clock import PartitionClocks
from streamlearn.stream.join import PendingJoins

log = logging.getLogger("streamlearn.daemon")

__all__ = ["freeze", "learner_settings", "thaw", "warn_settings_kept"]


def freeze(engine: Engine | CandidateEngine, tracker: OnlineErrorTracker, counters: Counters,
           settings: DaemonSettings) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The state as arrays + JSON metadata (call between steps: nothing closed undrained)."""
    learner_arrays, learner_meta = engine.learner.state()
    join_arrays, join_meta = engine.joins.export()
    t_arrays, t_meta = tracker_arrays(tracker)
    arrays = {**learner_arrays, **join_arrays, **t_arrays}
    meta = {"learner": learner_meta, "join": join_meta, "tracker": t_meta,
            "counters": counters.to_json(), "settings": dataclasses.asdict(settings)}
    return arrays, meta


def thaw(restored: Restored, settings: DaemonSettings, learner_class: type[Learner],
         tracker: OnlineErrorTracker) -> tuple[Engine, Counters]:
    """The engine and counters of a restored snapshot (``tracker`` is loaded in place)."""
    arrays, meta = restored.arrays, restored.meta
    want = (settings.learner_n_actions, settings.learner_n_features)
    try:
        learner = learner_class.from_state(
            {k: v for k, v in arrays.items() if k.startswith(("learner.", "exploration."))},
            meta["learner"])
        got = (learner.n_actions, learner.n_features)
        if got != want:
            raise ValueError(f"it holds a learner with (K, d) = {got}; {want} are configured")
        old_clocks = meta["counters"].get("clocks")  # where checkpoints before 0.2 kept them
        joins = PendingJoins.restore(*want, settings.join_settings(), arrays, meta["join"],
                                     None if old_clocks is None
                                     else PartitionClocks.from_json(old_clocks))
        tracker_load(tracker, arrays, meta["tracker"])
        counters = Counters.from_json(meta["counters"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"checkpoint {restored.seq} in {settings.checkpoint_dir} does not fit "
                         f"this daemon: {exc!r}") from exc
    return Engine(learner, joins=joins), counters


def learner_settings(learner: Learner) -> dict[str, Any]:
    """What a learner was configured with: its hyperparameters and its exploration's spec."""
    params = {k: v for k, v in learner.get_params().items() if k not in ("exploration", "seed")}
    return {**params, "exploration": learner.exploration.spec()}


def warn_settings_kept(seq: int, configured: Mapping[str, Any], restored: Mapping[str, Any]) -> None:
    """Log one WARNING naming every configured learner setting a restored checkpoint overrides.

    The restored learner keeps its hyperparameters and its exploration with the state it
    learned (its estimates, its drift detector): changing them belongs to a fresh state.
    """
    kept = [f"{name}: {restored.get(name)!r} (configured: {configured.get(name)!r})"
            for name in sorted(set(configured) | set(restored))
            if configured.get(name) != restored.get(name)]
    if kept:
        log.warning("checkpoint %d keeps its learner's own settings, not the configured ones: "
                    "%s; they apply to a fresh state (an empty checkpoint.dir)", seq,
                    "; ".join(kept))
