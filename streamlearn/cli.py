"""The ``streamlearn`` console script: ``serve | replay | simulate | bench | rank | inspect``.

Each subcommand lives in ``streamlearn/commands/<name>.py`` and provides
``add_parser(subparsers)`` and ``run(args) -> int``. Errors a user can fix
(``StreamlearnError``) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from streamlearn import __version__
from streamlearn.errors import StreamlearnError

__all__ = ["main"]

SUBCOMMANDS = ("serve", "replay", "simulate", "bench", "rank", "inspect")


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors as one line + exit 2 (argparse's own convention)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="streamlearn", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"streamlearn {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"streamlearn.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"streamlearn.commands.{name}":
                raise
            continue  # subcommand not built yet
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except StreamlearnError as exc:
        print(f"streamlearn {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
