"""Contextual-bandit learners behind one interface (see ``base.Learner``).

``LEARNERS`` maps the CLI/config names to classes; ``make_learner`` builds one
with validated hyperparameters; ``save_learner``/``load_learner`` persist one
as arrays + JSON (never pickle).
"""

from __future__ import annotations

import os
from typing import Any

from streamlearn.errors import ConfigError, StateError
from streamlearn.learners.bagging import Bagging
from streamlearn.learners.banditron import Banditron
from streamlearn.learners.base import Learner
from streamlearn.learners.epsilon_greedy import EpsilonGreedy
from streamlearn.learners.exp_gradient import ExpGradientBandit
from streamlearn.learners.exploration import (
    Adaptive,
    CubeRootSchedule,
    Exploration,
    FixedGamma,
    MarginAware,
    SqrtSchedule,
    default_exploration,
    exploration_from_name,
)
from streamlearn.learners.linear_posterior import LinTS, LinUCB
from streamlearn.learners.oracle import RegressionOracle
from streamlearn.learners.perceptron import Perceptron
from streamlearn.learners.potential import PNormBandit
from streamlearn.learners.second_order import SOBA, Newtron
from streamlearn.learners.squarecb import SquareCB
from streamlearn.snapshot import read_snapshot, write_snapshot

__all__ = [
    "LEARNERS",
    "SOBA",
    "Adaptive",
    "Bagging",
    "Banditron",
    "CubeRootSchedule",
    "EpsilonGreedy",
    "ExpGradientBandit",
    "Exploration",
    "FixedGamma",
    "Learner",
    "LinTS",
    "LinUCB",
    "MarginAware",
    "Newtron",
    "PNormBandit",
    "Perceptron",
    "RegressionOracle",
    "SqrtSchedule",
    "SquareCB",
    "default_exploration",
    "exploration_from_name",
    "load_learner",
    "make_learner",
    "save_learner",
]

LEARNERS: dict[str, type[Learner]] = {
    "banditron": Banditron,
    "pnorm": PNormBandit,
    "eg": ExpGradientBandit,
    "perceptron": Perceptron,
    "epsilon-greedy": EpsilonGreedy,
    "squarecb": SquareCB,
    "bag": Bagging,
    "linucb": LinUCB,
    "lints": LinTS,
    "newtron": Newtron,
    "soba": SOBA,
}

_CLASSES = {cls.__name__: cls for cls in LEARNERS.values()}


def make_learner(
    name: str,
    n_actions: int,
    n_features: int,
    exploration: Exploration | None = None,
    seed: int = 0,
    **hyperparameters: Any,
) -> Learner:
    """Build the learner ``name`` (a key of ``LEARNERS``); unknown names raise ConfigError."""
    if name not in LEARNERS:
        raise ConfigError(f"--learner must be one of {sorted(LEARNERS)}. Got {name!r} instead.")
    cls = LEARNERS[name]
    accepted = set(cls.__init__.__code__.co_varnames[: cls.__init__.__code__.co_argcount])
    unknown = sorted(set(hyperparameters) - accepted)
    if unknown:
        takes = sorted(accepted - {"self"})
        raise ConfigError(f"Learner {name!r} does not take {unknown}; it takes {takes}.")
    return cls(n_actions, n_features, exploration=exploration, seed=seed, **hyperparameters)


def save_learner(learner: Learner, path: str | os.PathLike[str]) -> None:
    """Write the learner's state atomically to the directory ``path`` (arrays.npz + meta.json)."""
    arrays, meta = learner.state()
    write_snapshot(path, arrays, {"kind": "learner", "learner": meta})


def load_learner(path: str | os.PathLike[str]) -> Learner:
    """Read a learner written by ``save_learner``; a wrong or corrupt file raises StateError."""
    arrays, meta = read_snapshot(path)
    learner_meta = meta.get("learner")
    if meta.get("kind") != "learner" or not isinstance(learner_meta, dict):
        raise StateError(f"{path} does not hold a learner (kind={meta.get('kind')!r}).")
    cls = _CLASSES.get(str(learner_meta.get("class")))
    if cls is None:
        raise StateError(f"{path} holds an unknown learner class {learner_meta.get('class')!r}.")
    return cls.from_state(arrays, learner_meta)
