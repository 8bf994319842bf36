"""``streamlearn rank``: batch-ranker experiments — ``letor``, ``routing``, ``roger``.

``rank letor`` is :mod:`simulators.rankers.letor`; ``rank routing`` and
``rank roger`` are :mod:`simulators.rankers.routing` and
:mod:`simulators.rankers.roger`. Each experiment module provides
``add_arguments(parser)`` and ``run(args) -> int``; modules are imported only
when the parser is built, and a missing one simply has no sub-subcommand.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType
from typing import Any

__all__ = ["add_parser", "run"]

EXPERIMENTS = (
    ("letor", "simulators.rankers.letor",
     "LETOR 3.0 5-fold protocol: train, select on vali, report test NDCG@k / MAP"),
    ("routing", "simulators.rankers.routing",
     "Reuters-21578 routing classifiers: average precision and P@100"),
    ("roger", "simulators.rankers.roger", "Roger / n'Roger against an SVM"),
)


def _load(module_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return None


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("rank", help="batch-ranker experiments (letor, routing, roger)",
                                   description="Batch-ranker experiments: letor, routing, roger.")
    experiments = parser.add_subparsers(dest="rank_command", required=True,
                                        parser_class=type(parser))
    for name, module_name, summary in EXPERIMENTS:
        module = _load(module_name)
        if module is None:
            continue  # experiment not built here
        sub = experiments.add_parser(name, help=summary, description=summary)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Fallback (argparse requires a sub-subcommand, so this is not reached normally)."""
    return 2
