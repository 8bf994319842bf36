"""The daemon's checkpointed state: learner, pending joins (with their clocks), tracker, counters.

:func:`freeze` turns it into plain arrays + JSON for a snapshot; :func:`thaw`
rebuilds it from a restored snapshot and refuses one that does not fit this
daemon (another learner shape) with a :class:`~streamlearn.errors.StateError`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from streamlearn.durability.checkpoint import CheckpointMismatch, Restored, is_count, short_repr
from streamlearn.engine import DECISION_COLUMNS, Engine
from streamlearn.engine.candidates import CandidateEngine
from streamlearn.errors import StateError
from streamlearn.evaluation.online import OnlineErrorTracker
from streamlearn.join.clock import PartitionClocks
from streamlearn.join.pending import PendingJoins
from streamlearn.learners import LEARNERS
from streamlearn.learners.base import Learner
from streamlearn.service.counters import Counters, tracker_arrays, tracker_load
from streamlearn.service.settings import DaemonSettings

log = logging.getLogger("streamlearn.daemon")

__all__ = ["freeze", "learner_settings", "restored_counters", "restored_tracker", "thaw",
           "warn_settings_kept"]


def freeze(engine: Engine | CandidateEngine, tracker: OnlineErrorTracker, counters: Counters,
           settings: DaemonSettings) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The state as arrays + JSON metadata (call between steps: nothing closed undrained)."""
    learner_arrays, learner_meta = engine.learner.state()
    join_arrays, join_meta = engine.joins.export()
    t_arrays, t_meta = tracker_arrays(tracker)
    arrays = {**learner_arrays, **join_arrays, **t_arrays}
    meta = {"learner": learner_meta, "join": join_meta, "tracker": t_meta,
            "counters": counters.to_json(), "settings": settings.as_json()}
    return arrays, meta


def thaw(restored: Restored, settings: DaemonSettings, learner_class: type[Learner],
         tracker: OnlineErrorTracker) -> tuple[Engine, Counters]:
    """The engine and counters of a restored snapshot (``tracker`` is loaded in place).

    Raises :class:`~streamlearn.durability.checkpoint.CheckpointMismatch` when the checkpoint
    holds another (known) learner class or shape than configured, and ``StateError`` when anything
    in it does not restore cleanly (a corrupt checkpoint: ``Checkpointer.restore`` then tries
    an older one). ``tracker`` is only changed when everything restored.
    """
    arrays, meta = restored.arrays, restored.meta
    where = f"checkpoint {restored.seq} in {settings.checkpoint.dir}"
    want = (settings.learner.n_actions, settings.learner.n_features)
    held = meta.get("learner", {}).get("class") if isinstance(meta.get("learner"), dict) else None
    if held != learner_class.__name__ and held in {c.__name__ for c in LEARNERS.values()}:
        raise CheckpointMismatch(f"{where} does not fit this daemon: it holds a {held} learner; "
                                 f"{learner_class.__name__} is configured (a fresh state needs an "
                                 f"empty checkpoint.dir).")
    try:
        learner_meta, join_meta, tracker_meta, counters_meta = (
            _section(meta, name) for name in ("learner", "join", "tracker", "counters"))
        learner = learner_class.from_state(
            {k: v for k, v in arrays.items() if k.startswith(("learner.", "exploration."))},
            learner_meta)
        got = (learner.n_actions, learner.n_features)
        if got != want:
            raise CheckpointMismatch(f"{where} does not fit this daemon: it holds a learner with "
                                     f"(K, d) = {got}; {want} are configured (a fresh state "
                                     f"needs an empty checkpoint.dir).")
        old_clocks = counters_meta.get("clocks")  # where checkpoints before 0.2 kept them
        # the decision columns too (who served, gamma, the learner's own choice, the
        # baseline): without them a restored daemon's rollouts and log lost track of them
        joins = PendingJoins.restore(*want, settings.join.join_settings(), arrays, join_meta,
                                     None if old_clocks is None
                                     else PartitionClocks.from_json(old_clocks),
                                     columns=DECISION_COLUMNS)
        if "pending.column.exploit" not in arrays:  # written before the column: every
            live = np.flatnonzero(joins.active)    # decision then was the learner's own
            joins.columns["exploit"][live] = joins.probs[live].argmax(axis=1)
        loaded = restored_tracker(arrays, tracker_meta, settings.metrics.window)
        counters = restored_counters(counters_meta)
    except CheckpointMismatch:
        raise
    except Exception as exc:  # whatever a damaged checkpoint makes fail: it is corrupt
        detail = str(exc) if isinstance(exc, StateError) else f"{type(exc).__name__}: {exc}"
        raise StateError(f"{where} does not restore: {detail}") from exc
    vars(tracker).clear()
    vars(tracker).update(vars(loaded))
    return Engine(learner, joins=joins), counters


def _section(meta: dict[str, Any], name: str) -> dict[str, Any]:
    value = meta.get(name)
    if not isinstance(value, dict):
        raise StateError(f"its meta.json must have a {name!r} object. Got {short_repr(value)}.")
    return value


def restored_counters(data: dict[str, Any]) -> Counters:
    """:class:`Counters` from a checkpoint's JSON, validated: every count an int >= 0, the
    checksum an int in [0, 2⁶⁴) (counts missing in older checkpoints start at 0).

    >>> restored_counters({"instances": 5, "applied_checksum": "7"}).instances
    5
    >>> restored_counters({"instances": -5})
    Traceback (most recent call last):
    ...
    streamlearn.errors.StateError: counters.instances must be an int >= 0. Got -5.
    """
    defaults = vars(Counters())
    unknown = sorted(set(data) - set(defaults) - {"clocks"})
    if unknown:
        raise StateError(f"counters hold unknown names {unknown}; expected some of "
                         f"{sorted(defaults)}.")
    out: dict[str, Any] = {}
    for name, default in defaults.items():
        value = data.get(name, default)
        if name == "applied_checksum":
            text = str(value) if is_count(value) else value
            if not (isinstance(text, str) and text.isascii() and text.isdigit()
                    and int(text) < 1 << 64):
                raise StateError(f"counters.applied_checksum must be an int in [0, 2**64). "
                                 f"Got {short_repr(value)}.")
            out[name] = str(int(text))
        elif name == "feedback":
            out[name] = {**default, **_counts(value, f"counters.{name}", set(default))}
        elif name == "feedback_types":
            out[name] = _counts(value, f"counters.{name}")
        elif name == "invalid":
            if not isinstance(value, dict):
                raise StateError(f"counters.invalid must be an object. Got {short_repr(value)}.")
            out[name] = {str(topic): _counts(reasons, f"counters.invalid[{topic!r}]")
                         for topic, reasons in value.items()}
        elif not is_count(value):
            raise StateError(f"counters.{name} must be an int >= 0. Got {short_repr(value)}.")
        else:
            out[name] = value
    return Counters.from_json(out)


def _counts(value: Any, what: str, names: set[str] | None = None) -> dict[str, int]:
    if not isinstance(value, dict) or not all(is_count(v) for v in value.values()):
        raise StateError(f"{what} must map names to ints >= 0. Got {short_repr(value)}.")
    if names is not None and not set(value) <= names:
        raise StateError(f"{what} holds unknown names {sorted(set(value) - names)}; expected "
                         f"some of {sorted(names)}.")
    return dict(value)


def restored_tracker(arrays: dict[str, np.ndarray], scalars: dict[str, Any],
                     window: int) -> OnlineErrorTracker:
    """A new error tracker with a checkpoint's state, validated: known attributes only, of
    their type (counts ints >= 0, the window >= 1, sums finite), the ring as long as the
    window and finite.
    """
    tracker = OnlineErrorTracker(window)
    defaults = vars(tracker)
    for key, value in scalars.items():
        default = defaults.get(key)
        if key not in defaults or isinstance(default, np.ndarray):
            raise StateError(f"tracker.{key} is not a tracker setting; expected some of "
                             f"{sorted(k for k, v in defaults.items() if not isinstance(v, np.ndarray))}.")
        if isinstance(default, int) and not (is_count(value) and (key != "window" or value >= 1)):
            raise StateError(f"tracker.{key} must be an int >= {1 if key == 'window' else 0}. "
                             f"Got {short_repr(value)}.")
        if isinstance(default, float) and not (isinstance(value, int | float)
                                               and not isinstance(value, bool)
                                               and np.isfinite(value)):
            raise StateError(f"tracker.{key} must be a finite number. Got {short_repr(value)}.")
    for key, value in arrays.items():
        name = key[len("tracker."):]
        if not key.startswith("tracker."):
            continue
        default = defaults.get(name)
        if not isinstance(default, np.ndarray):
            raise StateError(f"{key} is not a tracker array.")
        if value.ndim != default.ndim or value.dtype.kind not in "biuf" or not np.isfinite(value).all():
            raise StateError(f"{key} must be a finite {default.ndim}-d numeric array. Got "
                             f"{value.dtype} of shape {value.shape}.")
    tracker_load(tracker, arrays, scalars)
    ring = vars(tracker).get("_ring")
    if isinstance(ring, np.ndarray) and ring.shape != (tracker.window,):
        raise StateError(f"tracker._ring must hold tracker.window = {tracker.window} losses. "
                         f"Got shape {ring.shape}.")
    return tracker


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
