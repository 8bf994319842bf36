"""Rankers for retraining, by name, and their immutable, versioned on-disk artifacts.

A ranker spec is a registered name (:data:`RANKERS`) or ``package.module:ClassName``
naming a user :class:`~streamlearn.rankers.base.Ranker` subclass (built with its
default constructor). Rankers that rank documents *within queries* (AdaRank,
NDCG_Boost) are refused: each logged event gives one (context, action) pair with
a reward, so a query per event holds one document and nothing to order.

An artifact is a directory ``<name>-v<version:08d>`` written once by
:func:`save_artifact` through :func:`streamlearn.snapshot.write_snapshot`
(temporary sibling directory, fsynced files, one ``os.rename``; sha256 of
``arrays.npz`` recorded in ``meta.json``) and never rewritten: saving over an
existing version is refused. :func:`load_artifact` verifies the checksum, rebuilds
the ranker from its class and constructor parameters and sets its fitted
attributes (those ending in ``_``). Fitted state is representable when each such
attribute is an ndarray of a plain dtype, a number, a string / bool / None, a list
of numbers, a list of ndarrays, a dict of JSON scalars, a fitted Ranker, or a list
of fitted Rankers (n'Roger keeps its runs); anything else is refused at save time
with the attribute's name. Loading imports the recorded class: an artifact
directory is trusted like code, and the class must subclass ``Ranker``.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamlearn.errors import ConfigError, StateError
from streamlearn.rankers.adarank import AdaRank
from streamlearn.rankers.base import Ranker
from streamlearn.rankers.ndcg_boost import NDCGBoost
from streamlearn.rankers.rankboost import RankBoost
from streamlearn.rankers.roger import NRoger, Roger
from streamlearn.rankers.routing import LDA, LogisticRegression, Network, Rocchio
from streamlearn.snapshot import read_snapshot, write_snapshot

__all__ = [
    "KIND",
    "RANKERS",
    "RankerArtifact",
    "artifact_name",
    "every_ranker_failed",
    "find_artifact",
    "list_artifacts",
    "load_artifact",
    "make_ranker",
    "resolve_artifact",
    "save_artifact",
]

KIND = "ranker-artifact"

# Defaults chosen to train in a few seconds on 20k rows x 442 joint features (letter-like,
# d=17, K=26, a shared machine, two runs): rankboost 2.5-4 s, logistic 1.3-4.8 s,
# rocchio 0.02 s, lda 0.1-0.7 s, roger 2.6-4.3 s, nroger 5-9 s, network 2.5-3.4 s.
RANKERS: dict[str, Callable[[], Ranker]] = {
    "rankboost": lambda: RankBoost(n_rounds=50, max_bins=32),
    "logistic": lambda: LogisticRegression(ridge=1.0, max_iter=25, tol=1e-6),
    "rocchio": lambda: Rocchio(),
    "lda": lambda: LDA(shrinkage=0.1),
    "roger": lambda: Roger(generations=20, offspring=20, seed=0),
    "nroger": lambda: NRoger(n_runs=3, generations=12, offspring=20, seed=0),
    "network": lambda: Network(hidden=0, max_epochs=100, patience=10),
}

_NEEDS_QID = {
    "adarank": "AdaRank",
    "ndcg_boost": "NDCGBoost",
}
# listwise rankers, for logged candidate sets (a request's placed candidates form a query)
_LISTWISE: dict[str, Callable[[], Ranker]] = {
    "adarank": lambda: AdaRank(n_rounds=50),
    "ndcg_boost": lambda: NDCGBoost(n_rounds=50, max_bins=32),
}
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_DIR = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)-v(?P<version>\d{8})$")


def _qid_error(what: str) -> ConfigError:
    return ConfigError(
        f"{what} ranks documents within queries (needs qid); the retrainer scores one "
        "(context, action) pair per logged event, so a query per event has a single document "
        f"and nothing to order. Expected one of {sorted(RANKERS)} or a package.module:Class "
        "ranker without requires_qid.")


def _import_class(spec: str) -> type[Ranker]:
    module_name, _, qualname = spec.partition(":")
    if not module_name or not qualname:
        names = sorted([*RANKERS, *_LISTWISE])
        close = difflib.get_close_matches(spec.lower().replace("-", "_"), names, n=1, cutoff=0.6)
        raise ConfigError(f"Expected a ranker name in {sorted(RANKERS)} (for any stream), "
                          f"{sorted(_LISTWISE)} (candidate sets only) or "
                          f"package.module:ClassName. Got {spec!r}"
                          + (f": did you mean {close[0]!r}?" if close else "."))
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"Expected an importable ranker class {spec!r}. Got: {exc}.") from exc
    if not (isinstance(obj, type) and issubclass(obj, Ranker)):
        raise ConfigError(f"Expected {spec!r} to be a subclass of streamlearn.rankers.base.Ranker. "
                          f"Got {obj!r}.")
    return obj


def make_ranker(spec: str, queries: bool = False) -> Ranker:
    """A fresh ranker for retraining from a registered name or ``package.module:ClassName``.

    ``queries``: the training data has multi-document queries (candidate sets), so
    the listwise rankers (``adarank``, ``ndcg_boost``) are available too.
    """
    if spec in RANKERS:
        return RANKERS[spec]()
    if spec.lower() in _NEEDS_QID:
        if not queries:
            raise _qid_error(_NEEDS_QID[spec.lower()])
        return _LISTWISE[spec.lower()]()
    cls = _import_class(spec)
    if cls.requires_qid and not queries:
        raise _qid_error(cls.__name__)
    return cls()


def every_ranker_failed(failed: dict[str, str], count: int) -> None:
    """Raise when all ``count`` rankers of a retrain failed (nothing to report: the retrain
    fails, a counted failure); one that fails among others is reported and counted."""
    if count and len(failed) == count:
        raise RuntimeError("every ranker failed: " + "; ".join(
            f"{name}: {why}" for name, why in failed.items()))


def artifact_name(spec: str) -> str:
    """The artifact name of a spec: the registered name, or the class name in lower case."""
    return spec if spec in RANKERS or spec.lower() in _LISTWISE else \
        spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1].lower()


def _class_path(obj: Ranker) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _encode(ranker: Ranker, prefix: str, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The ranker's class, params and fitted state; arrays go into ``arrays`` under ``prefix``."""
    try:
        params = ranker.get_params()
    except AttributeError as exc:
        raise ConfigError(f"Cannot save {type(ranker).__name__}: expected its constructor "
                          f"parameters stored under their own names. Got {exc}.") from exc
    for key, value in params.items():
        if not (_plain(value) or _number(value)):
            raise ConfigError(f"Cannot save {type(ranker).__name__}: constructor parameter {key!r} "
                              f"is a {type(value).__name__}; expected a number, string, bool or None.")
    state: dict[str, Any] = {}
    for key, value in sorted(vars(ranker).items()):
        if not key.endswith("_"):
            continue
        where = f"{prefix}{key}"
        if isinstance(value, np.ndarray) and not value.dtype.hasobject:
            arrays[where] = value
            state[key] = {"kind": "array"}
        elif _number(value):
            arrays[where] = np.asarray(value)
            state[key] = {"kind": "scalar", "int": isinstance(value, (int, np.integer))}
        elif _plain(value):
            state[key] = {"kind": "json", "value": value}
        elif isinstance(value, dict) and all(
                isinstance(k, str) and (_plain(v) or _number(v)) for k, v in value.items()):
            state[key] = {"kind": "json", "value": {k: v if _plain(v) else float(v)
                                                    for k, v in value.items()}}
        elif isinstance(value, Ranker):
            state[key] = {"kind": "ranker", "ranker": _encode(value, f"{where}/", arrays)}
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Ranker) for v in value):
            state[key] = {"kind": "rankers", "rankers": [
                _encode(v, f"{where}/{i}/", arrays) for i, v in enumerate(value)]}
        elif isinstance(value, (list, tuple)) and all(
                isinstance(v, np.ndarray) and not v.dtype.hasobject for v in value) and value:
            for i, v in enumerate(value):
                arrays[f"{where}/{i}"] = v
            state[key] = {"kind": "arrays", "count": len(value)}
        elif isinstance(value, (list, tuple)) and all(_number(v) for v in value):
            arrays[where] = np.asarray(value, dtype=np.float64)
            state[key] = {"kind": "list"}
        else:
            raise ConfigError(
                f"Cannot save {type(ranker).__name__}: fitted attribute {key!r} is a "
                f"{type(value).__name__}; expected an ndarray, number, string, list of numbers or "
                "ndarrays, dict of scalars, or (a list of) fitted Rankers.")
    return {"class": _class_path(ranker), "params": params, "state": state}


def _decode(encoded: dict[str, Any], prefix: str, arrays: dict[str, np.ndarray]) -> Ranker:
    cls = _import_class(str(encoded["class"]))
    try:
        ranker = cls(**encoded["params"])
        for key, entry in encoded["state"].items():
            where = f"{prefix}{key}"
            kind = entry["kind"]
            value: Any
            if kind == "array":
                value = arrays[where]
            elif kind == "scalar":
                (item,) = arrays[where].reshape(-1)  # stored as shape (1,)
                value = int(item) if entry["int"] else float(item)
            elif kind == "json":
                value = entry["value"]
            elif kind == "list":
                value = arrays[where].tolist()
            elif kind == "arrays":
                value = [arrays[f"{where}/{i}"] for i in range(int(entry["count"]))]
            elif kind == "ranker":
                value = _decode(entry["ranker"], f"{where}/", arrays)
            elif kind == "rankers":
                value = [_decode(e, f"{where}/{i}/", arrays) for i, e in enumerate(entry["rankers"])]
            else:
                raise StateError(f"Unknown fitted-state kind {kind!r} for {key!r}.")
            setattr(ranker, key, value)
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"Ranker state of {encoded.get('class')!r} is incomplete: {exc!r}.") from exc
    return ranker


@dataclass(frozen=True)
class RankerArtifact:
    """A loaded artifact: the fitted ranker and what it scores."""

    path: Path
    name: str
    version: int
    ranker: Ranker
    n_actions: int
    n_features: int  # d, the context dimension (the ranker sees d·n_actions joint features)
    created: float
    meta: dict[str, Any] = field(default_factory=dict)


def save_artifact(directory: str | os.PathLike[str], name: str, version: int, ranker: Ranker,
                  n_actions: int, n_features: int, meta: dict[str, Any] | None = None) -> Path:
    """Write ``ranker`` as the immutable artifact ``directory/<name>-v<version:08d>``; its path."""
    if not _NAME.match(name):
        raise ConfigError(f"Expected an artifact name of letters, digits, '_', '.', '-'. Got {name!r}.")
    if not isinstance(version, int) or version < 0:
        raise ConfigError(f"Expected an artifact version int >= 0. Got {version!r}.")
    if not hasattr(ranker, "n_features_in_"):
        raise ConfigError(f"Expected a fitted ranker. Got an unfitted {type(ranker).__name__}.")
    target = Path(directory) / f"{name}-v{version:08d}"
    if target.exists():
        raise StateError(f"Artifact {target} exists already; artifacts are immutable "
                         "(expected a new version).")
    arrays: dict[str, np.ndarray] = {}
    encoded = _encode(ranker, "ranker/", arrays)
    write_snapshot(target, arrays, {
        "kind": KIND, "name": name, "version": version, "created": time.time(),
        "n_actions": int(n_actions), "n_features": int(n_features), "ranker": encoded,
        "extra": meta or {}})
    return target


def load_artifact(path: str | os.PathLike[str]) -> RankerArtifact:
    """Read, verify (sha256 of the arrays) and rebuild an artifact written by :func:`save_artifact`."""
    arrays, meta = read_snapshot(path)
    if meta.get("kind") != KIND:
        raise StateError(f"{path} is not a ranker artifact: expected kind {KIND!r}, "
                         f"got {meta.get('kind')!r}.")
    try:
        ranker = _decode(meta["ranker"], "ranker/", arrays)
        return RankerArtifact(Path(path), str(meta["name"]), int(meta["version"]), ranker,
                              int(meta["n_actions"]), int(meta["n_features"]),
                              float(meta["created"]), dict(meta.get("extra") or {}))
    except (KeyError, ConfigError) as exc:
        raise StateError(f"{path} is not a usable ranker artifact: {exc}") from exc


def list_artifacts(directory: str | os.PathLike[str], name: str | None = None) -> list[Path]:
    """Artifact directories under ``directory`` (of ``name`` if given), oldest version first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = sorted((int(m["version"]), m["name"], p) for p in root.iterdir()
                   if (m := _DIR.match(p.name)) and p.is_dir() and (name is None or m["name"] == name))
    return [p for _, _, p in found]


def recorded_artifact(recorded: str, directory: str | os.PathLike[str]) -> str:
    """Where an artifact that the rankers' state recorded is now: the one of that name in
    ``directory``, the store the state belongs to. The state records the absolute path the
    store had then; a checkpoint directory copied or moved elsewhere holds its artifacts
    under the same names, so the name, not the old path, says which (an artifact still at
    the old place is another store's)."""
    return str(Path(directory) / Path(recorded).name)


def same_artifact(recorded: str, other: str) -> bool:
    """Whether two recorded artifact paths name the same artifact: by name, as
    :func:`recorded_artifact` finds one (a store copied or moved records old paths beside new
    ones)."""
    return Path(recorded).name == Path(other).name


def resolve_artifact(target: str, directory: str | os.PathLike[str]) -> RankerArtifact:
    """The artifact ``target`` names: a directory of one, else the newest of that name in
    ``directory``."""
    if Path(target).is_dir():
        return load_artifact(target)
    if "/" in target or "\\" in target:
        here = Path(directory) / Path(target).name
        if not Path(target).is_absolute() and here.is_dir():
            return load_artifact(here)  # recorded relative to where serve once started
        raise ConfigError(f"Expected an artifact NAME or PATH. {target!r} is not a directory.")
    return load_artifact(find_artifact(directory, target))


def find_artifact(directory: str | os.PathLike[str], name: str) -> Path:
    """The newest artifact of ``name`` in ``directory``."""
    found = list_artifacts(directory, name)
    if not found:
        raise ConfigError(f"Expected an artifact {name}-v<version> in {directory}. Got none.")
    return found[-1]
