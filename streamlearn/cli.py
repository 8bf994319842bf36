"""The ``streamlearn`` console script: ``serve | replay | simulate | inspect | evaluate`` and plug-ins.

Each core subcommand lives in ``streamlearn/commands/<name>.py`` and provides
``add_parser(subparsers)`` and ``run(args) -> int``. Further subcommands come
from modules registered under the entry-point group ``streamlearn.commands``
(the experiment harness in ``simulators/`` registers ``bench`` and ``rank``),
so the library never imports the harness. Errors a user can fix
(``StreamlearnError``) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any, NoReturn

from streamlearn import __version__
from streamlearn.errors import StreamlearnError

__all__ = ["main"]

SUBCOMMANDS = ("serve", "replay", "simulate", "inspect", "evaluate")
PLUGIN_GROUP = "streamlearn.commands"


_REQUIRED = "the following arguments are required"


class _MissingRequired(Exception):
    """Raised instead of exiting, so that an unknown option can be reported first."""


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors as one line + exit 2 (argparse's own convention).

    Options must be spelled in full (``allow_abbrev=False``: ``--max-event``
    is not ``--max-events``), and an unknown option is named — with the
    closest known spelling — even when a required option is also missing,
    since a typo (``--datset``) is the likelier cause of the missing one.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if message.startswith(_REQUIRED):
            raise _MissingRequired(message)  # reported by parse_known_args, after unknown options
        self._fail(message)

    def _fail(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        tokens = list(sys.argv[1:] if args is None else args)
        try:
            parsed, extras = super().parse_known_args(tokens, namespace)
        except _MissingRequired as missing:
            unknown = self._unknown_options(tokens)
            self._fail(self._unrecognized(unknown) if unknown else str(missing))
        unknown = [t for t in extras if t.startswith("-")]
        if unknown:
            self._fail(self._unrecognized(unknown))
        return parsed, extras

    def _unknown_options(self, tokens: list[str]) -> list[str]:
        """Option-like tokens this parser does not know (``--opt=value`` counts as ``--opt``)."""
        unknown = []
        for token in tokens:
            if token == "--":
                break
            if (token.startswith("-") and token != "-"
                    and not self._negative_number_matcher.match(token)
                    and token.split("=", 1)[0] not in self._option_string_actions):
                unknown.append(token.split("=", 1)[0])
        return unknown

    def _unrecognized(self, options: list[str]) -> str:
        first = options[0].split("=", 1)[0]
        known = [o for o in self._option_string_actions if o.startswith("--")]
        close = difflib.get_close_matches(first, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        more = f"; also {', '.join(options[1:])}" if len(options) > 1 else ""
        return (f"unrecognized option {first}{hint}{more}; expected an option listed by "
                f"{self.prog} --help")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="streamlearn", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"streamlearn {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in command_modules():
        module.add_parser(subparsers)
    return parser


def command_modules() -> list[ModuleType]:
    """The core subcommands, then the plug-ins (in name order; a core name cannot be taken)."""
    modules = [importlib.import_module(f"streamlearn.commands.{name}") for name in SUBCOMMANDS]
    for plugin in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
        if plugin.name not in SUBCOMMANDS:
            modules.append(importlib.import_module(plugin.value))
    return modules


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except StreamlearnError as exc:
        print(f"streamlearn {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`streamlearn inspect DIR | head -1`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except OSError as exc:
        if exc.filename is None:
            raise
        # a path the file system refuses (too long, a loop, no permission, a full disk …)
        print(f"streamlearn {args.command}: error: cannot use {str(exc.filename)[:200]!r}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    except MemoryError as exc:  # e.g. a stream or a model larger than this machine
        print(f"streamlearn {args.command}: error: not enough memory for what was asked "
              f"(a smaller --rounds, --passes, --batch-size or feature dimension?): {exc}",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
