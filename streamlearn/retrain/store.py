"""The rankers on disk: immutable artifacts and ``state.json``, the record of what happened.

``state.json`` (beside the artifacts, written atomically: temporary file, fsync,
rename) holds

* ``live`` — the newest ranker trained (its ranking is published with decisions while
  the learner decides);
* ``promoted`` — the rankers that passed the promotion gate, oldest first; the last one
  is the one whose ranking decisions carry, and with ``retrain.policy = "ranker"`` the
  one that serves (its rollout state is in the daemon's checkpoint);
* ``challengers`` and ``challenger_index`` — the rankers still being judged and how many
  were judged since the live policy last changed (the promotion gate spends its miss
  probability over them, :mod:`streamlearn.retrain.promotion`);
* ``history`` — the last :data:`HISTORY_KEPT` retrains, promotions, rollout steps and
  rollbacks, each with its figures (``streamlearn inspect`` shows them; a retrain's
  entry is :func:`retrain_entry`, in candidate mode :func:`candidate_entry`);
* ``rollout`` — who serves (``retrain.policy = "ranker"``): the live ranker, the candidate
  and its stage, as of each write; a restore serves what it names when the checkpoint's
  rollout fell behind it;
* ``abandoned`` — retrains that never finished (the daemon stopped while one ran): their
  versions, when and why; their artifacts were removed;
* ``next_version``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from streamlearn.errors import StateError
from streamlearn.retrain.artifact import (
    RankerArtifact,
    list_artifacts,
    load_artifact,
    recorded_artifact,
)
from streamlearn.snapshot import replace_file

__all__ = ["HISTORY_KEPT", "STATE_FILE", "RankerStore", "candidate_entry", "read_ranker_state",
           "retrain_entry"]

log = logging.getLogger("streamlearn.retrain")

STATE_FILE = "state.json"
HISTORY_KEPT = 100


def read_ranker_state(artifact_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The persisted ranker state (``{}`` if none yet)."""
    path = Path(artifact_dir) / STATE_FILE
    if not path.exists():
        return {}
    try:
        state: dict[str, Any] = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise StateError(f"{path} is not valid JSON: {exc}") from exc
    return state


class RankerStore:
    """The artifact directory and its ``state.json`` (see the module doc)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # called after each write of the state: what serves changed, or a verdict was
        # recorded, and the daemon's checkpoint should follow before a crash can part them
        self.on_saved: Callable[[], None] = lambda: None
        # called before each write: the owner adds what it keeps in the state (the rollout's
        # serving arms, so that a restore can tell a checkpoint that fell behind)
        self.before_save: Callable[[], None] = lambda: None
        self._held = 0  # inside one_write: saves wait for its end
        self._save_held = False
        self._unloadable: set[str] = set()  # artifacts found unloadable (logged once each)
        self.state: dict[str, Any] = {"live": None, "promoted": [], "history": [],
                                      "next_version": 1, "challengers": [],
                                      "challenger_index": 0}

    def open(self) -> None:
        """Create the directory, drop interrupted artifact writes, read the state."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.iterdir():
            if path.name.startswith(".") and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
        state = read_ranker_state(self.directory)
        if state:
            self.state = {**self.state, **state}
        newest = max((int(p.name.rsplit("-v", 1)[1]) for p in list_artifacts(self.directory)),
                     default=0)  # a job the last run did not harvest left artifacts no state names
        self.state["next_version"] = max(int(self.state.get("next_version", 1)), newest + 1)

    def load(self, path: str | None) -> RankerArtifact | None:
        """The artifact at ``path``, or None (logged) when there is none or it cannot load."""
        if not path:
            return None
        path = recorded_artifact(path, self.directory)  # the store may have moved since
        try:
            return load_artifact(path)
        except (StateError, OSError, ValueError) as exc:
            if path not in self._unloadable:  # said once: a restore may ask twice (live, arm)
                self._unloadable.add(path)
                log.error("ranker artifact %s cannot be loaded (%s); serving without it",
                          path, exc)
            return None

    def take_version(self) -> int:
        version = int(self.state["next_version"])
        self.state["next_version"] = version + 1
        return version

    @property
    def promoted(self) -> list[str]:
        return list(self.state.get("promoted") or [])

    def record(self, entry: dict[str, Any]) -> None:
        """Append ``entry`` to the history and write the state."""
        self.state["history"] = [*self.state.get("history", []), entry][-HISTORY_KEPT:]
        self.save()

    @contextlib.contextmanager
    def one_write(self) -> Iterator[None]:
        """The saves made inside are one write, at the end: a change made of several steps
        (a rollback that puts an earlier ranker back) is never on disk half-made."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held and self._save_held:
                self._save_held = False
                self.save()

    def save(self) -> None:
        if self._held:
            self._save_held = True
            return
        self.before_save()
        self.directory.mkdir(parents=True, exist_ok=True)
        replace_file(self.directory / STATE_FILE, orjson.dumps(
            self.state, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        self.on_saved()


def retrain_entry(result: dict[str, Any], decision: dict[str, Any], started: float,
                  at: float) -> dict[str, Any]:
    """The history entry of a retrain: its report ``result`` (:func:`streamlearn.retrain.job.run_retrain`),
    the promotion ``decision`` on it, when its job started and when it was applied."""
    judged = result.get("challengers") or []
    return {
        "version": result.get("version"), "started": started, "at": at,
        "duration_seconds": result.get("duration_seconds"), "segments": result.get("segments"),
        "rows": result.get("rows"), "max_rows": result.get("max_rows"),
        "watermark": result.get("watermark"), "evidence_since": result.get("evidence_since"),
        "holdout_fraction": result.get("holdout_fraction"), "clip": result.get("clip"),
        "level": result.get("level"), "estimates": result.get("estimates"),
        "held_out": result.get("heldout_rows"), "ranker": decision.get("ranker"),
        "promoted": bool(decision.get("promote")), "reason": decision.get("reason"),
        "advantage_lower": decision.get("advantage_lower"),
        "max_evidence": result.get("max_evidence"),
        "failed_rankers": result.get("failed_rankers") or {},
        "challengers": [{k: c.get(k) for k in (
            "name", "version", "artifact", "since", "first_segment", "last_segment", "index",
            "alpha", "looks", "rows", "passed", "advantage_lower", "value", "ess",
            "max_weight", "mean_weight", "exhausted")} for c in judged]}


def candidate_entry(result: dict[str, Any], best: str | None, started: float,
                    at: float) -> dict[str, Any]:
    """The history entry of a candidate-mode retrain (its report ``result``,
    :func:`streamlearn.retrain.candidates.run_candidate_retrain`; ``best``: its best ranker)."""
    rankers = result.get("rankers", {})
    return {"version": result.get("version"), "started": started,
            "at": at, "duration_seconds": result.get("duration_seconds"),
            "segments": result.get("segments"), "rows": result.get("rows"),
            "queries": result.get("train_queries"),
            "documents_per_query": result.get("documents_per_query"),
            "held_out": result.get("heldout_rows"), "ranker": best, "promoted": False,
            "reason": "measured on the logged slates (retrain.policy = learner: not served)",
            "learner": result.get("learner"), "offpolicy": result.get("offpolicy"),
            # the window, so that `streamlearn evaluate --retrain V` reads it again
            "candidates": result.get("candidates"), "max_rows": result.get("max_rows"),
            "watermark": result.get("watermark"), "since": result.get("since"),
            "holdout_fraction": result.get("holdout_fraction"), "level": result.get("level"),
            "failed_rankers": result.get("failed_rankers") or {},
            "rankers": {n: {k: i.get(k) for k in ("ndcg", "auc", "fit_seconds", "offpolicy",
                                                  "artifact", "degenerate", "failed")}
                        for n, i in rankers.items()}}
