"""Field declarations and value conversion for :mod:`streamlearn.config`.

A config field is a dataclass field whose metadata says what it accepts
(type, bounds, choices, kind). :func:`convert` turns a raw value — a string
from the environment or a flag, or a typed TOML value — into the field's type,
or raises a one-line :class:`~streamlearn.errors.ConfigError` naming the field,
what was expected, what was got and where it came from.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Demo:
...     rate: float = spec(1.0, "events per second", gt=0)
>>> import dataclasses
>>> fs = FieldSpec.of("demo", Demo, dataclasses.fields(Demo)[0])
>>> convert(fs, "2.5", "--demo-rate")
2.5
>>> convert(fs, "-1", "--demo-rate")
Traceback (most recent call last):
...
streamlearn.errors.ConfigError: demo.rate must be a number > 0. Got '-1' (from --demo-rate).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamlearn.errors import ConfigError

__all__ = ["FieldSpec", "convert", "decimal_float", "decimal_int", "format_weights",
           "parse_constant_action", "parse_weights", "spec"]

_NONE_WORDS = ("", "none", "null")
_INT64 = 2**63
# what a person types for a number: ASCII digits only (Python's int() and float() also take
# '1_0' and other scripts' digits, which no setting should be given as)
_INT_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
                         re.ASCII | re.IGNORECASE)
DIGITS_ONLY = "only the digits 0-9 (no '_' separators, no other scripts' digits)"


def decimal_int(text: str) -> int:
    """``text`` as an integer written with the ASCII digits 0-9 (and a sign); ValueError
    otherwise (``1_0``, ``١٠``, ``1.0``)."""
    stripped = text.strip()
    if not _INT_TEXT.fullmatch(stripped):
        raise ValueError(f"not a decimal integer: {text!r}")
    return int(stripped)


def decimal_float(text: str) -> float:
    """``text`` as a number written with the ASCII digits 0-9, a point and an exponent;
    ValueError otherwise (``1_0.5``, ``١.٥``)."""
    stripped = text.strip()
    if not _FLOAT_TEXT.fullmatch(stripped):
        raise ValueError(f"not a decimal number: {text!r}")
    return float(stripped)


def spec(default: Any, help: str, *, gt: float | None = None, ge: float | None = None,
         le: float | None = None, choices: tuple[str, ...] | None = None,
         kind: str | None = None, repr: bool = True,
         check: Callable[[Any], str] | None = None) -> Any:
    """Declare a config field: default, one-line help, and what values are valid.

    ``kind`` refines a string/path field: ``"hostports"`` (HOST:PORT list),
    ``"file"`` (an existing file), ``"dir"`` (a directory, or a path where one
    can be created), ``"path"`` (any path), ``"weights"`` (names with a weight
    >= 0 each: a TOML table ``{click = 1, conversion = 10}``, or in any source the
    text ``click=1,conversion=10``; kept as that text, :func:`parse_weights` reads
    it), ``"constant-action"`` (``constant:A``, an action A >= 0; kept as that text,
    :func:`parse_constant_action` normalises it). ``check`` says why a converted value is
    invalid ('' when it is valid; for ``"weights"`` it is given the mapping).
    """
    meta = {"help": help, "gt": gt, "ge": ge, "le": le, "choices": choices, "kind": kind,
            "check": check}
    return dataclasses.field(default=default, repr=repr, metadata=meta)


def parse_weights(text: str | None) -> dict[str, float]:
    """The mapping of a ``"weights"`` field's text (``'a=1,b=2.5'``; None or '': empty).

    Items are ``name=weight`` separated by one ``,`` (blanks around a part are ignored); an
    empty item (``a=1,,b=2``, a ``,`` at either end), a name or a weight missing, a weight
    that is no number written with the digits 0-9, or a name given twice is a ValueError
    saying which.

    >>> parse_weights("click=1, conversion=10")
    {'click': 1.0, 'conversion': 10.0}
    >>> parse_weights("click=1,,conversion=10")
    Traceback (most recent call last):
    ...
    ValueError: item 2 of 3 is empty (items are name=weight separated by one ',')
    """
    out: dict[str, float] = {}
    if text is None or not text.strip():
        return out
    parts = text.split(",")
    for i, part in enumerate(parts, 1):
        item = part.strip()
        if not item:
            raise ValueError(f"item {i} of {len(parts)} is empty (items are name=weight "
                             f"separated by one ',')")
        name, sep, number = (p.strip() for p in item.partition("="))
        if not sep:
            raise ValueError(f"expected name=weight, got {item!r:.60}")
        if not name:
            raise ValueError(f"expected a name before '=', got {item!r:.60}")
        if not number:
            raise ValueError(f"expected a weight after '=', got {item!r:.60}")
        if name in out:
            raise ValueError(f"{name!r:.60} is given twice")
        try:
            out[name] = decimal_float(number)
        except ValueError:
            raise ValueError(f"the weight of {name!r:.60} must be a number written with the "
                             f"digits 0-9, got {number!r:.40}") from None
    return out


#: Digits an action of ``constant:A`` may have (more is no action: K is far smaller)
_MAX_ACTION_DIGITS = 18


def parse_constant_action(text: str) -> str:
    """A ``"constant-action"`` field's text as ``constant:A``, or ValueError saying why not.

    ``constant`` is case-insensitive and blanks around either part are ignored (as choices
    are case-insensitive and values stripped elsewhere); the action is written with the
    digits 0-9. Whether A is below the number of actions is checked once that is known.

    >>> parse_constant_action(" Constant : 2 ")
    'constant:2'
    >>> parse_constant_action("constant:x")
    Traceback (most recent call last):
    ...
    ValueError: the action after ':' must be an integer >= 0 written with the digits 0-9, got 'x'
    """
    kind, sep, action = text.strip().partition(":")
    if not sep:
        raise ValueError("no ':' in it (a constant action is written constant:A, e.g. "
                         "constant:0)")
    if kind.strip().lower() != "constant":
        raise ValueError(f"the kind before ':' must be 'constant', got {kind.strip()!r:.40}")
    number = action.strip()
    if not re.fullmatch(r"[0-9]+", number, re.ASCII):
        raise ValueError(f"the action after ':' must be an integer >= 0 written with the digits "
                         f"0-9, got {number!r:.40}")
    if len(number.lstrip("0")) > _MAX_ACTION_DIGITS:
        raise ValueError(f"the action after ':' has more than {_MAX_ACTION_DIGITS} digits")
    return f"constant:{int(number.lstrip('0') or '0')}"


def format_weights(weights: Mapping[str, float]) -> str:
    """The text of a ``"weights"`` field (what :func:`parse_weights` reads back exactly)."""
    return ",".join(f"{name}={float(weight)!r}" for name, weight in weights.items())


@dataclass(frozen=True)
class FieldSpec:
    """Everything known about one configurable field."""

    section: str
    name: str
    base: type  # bool, int, float, str or Path
    optional: bool
    default: Any
    help: str
    gt: float | None
    ge: float | None
    le: float | None
    choices: tuple[str, ...] | None
    kind: str | None
    check: Callable[[Any], str] | None = None

    @property
    def key(self) -> str:
        return f"{self.section}.{self.name}"

    @classmethod
    def of(cls, section: str, owner: type, f: dataclasses.Field[Any]) -> FieldSpec:
        hint = typing.get_type_hints(owner)[f.name]
        args = typing.get_args(hint)
        optional = isinstance(hint, types.UnionType) and type(None) in args
        base = next(a for a in args if a is not type(None)) if optional else hint
        m = f.metadata
        return cls(section, f.name, base, optional, f.default, m.get("help", ""), m.get("gt"),
                   m.get("ge"), m.get("le"), m.get("choices"), m.get("kind"), m.get("check"))

    def expectation(self) -> str:
        """What a valid value looks like, e.g. 'a number > 0'."""
        if self.choices:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind == "hostports":
            text = "HOST:PORT[,HOST:PORT...]"
        elif self.kind == "file":
            text = "the path of an existing file"
        elif self.kind == "dir":
            text = "a directory (existing, or one that can be created)"
        elif self.kind == "constant-action":
            text = "'constant:A' with an action A (an integer >= 0)"
        elif self.kind == "weights":
            text = ("names with a weight >= 0 each: a table {name = weight, ...} in the file, "
                    "'name=weight,...' anywhere")
        elif self.base is bool:
            text = "true or false"
        elif self.base is Path:
            text = "a path"
        elif self.base is str:
            text = "a non-empty string"
        else:
            noun = "an integer" if self.base is int else "a number"
            low = f"> {_fmt(self.gt)}" if self.gt is not None else (
                f">= {_fmt(self.ge)}" if self.ge is not None else None)
            if low and self.le is not None:
                lo_br = "(" if self.gt is not None else "["
                lo_v = self.gt if self.gt is not None else self.ge
                text = f"{noun} in {lo_br}{_fmt(lo_v)}, {_fmt(self.le)}]"
            elif low:
                text = f"{noun} {low}"
            elif self.le is not None:
                text = f"{noun} <= {_fmt(self.le)}"
            else:
                text = noun
        return text + (" (or unset)" if self.optional else "")


def _fmt(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


def _fail(fs: FieldSpec, raw: Any, origin: str, why: str = "") -> ConfigError:
    because = f": {why}" if why else ""
    return ConfigError(f"{fs.key} must be {fs.expectation()}. Got {raw!r} (from {origin})"
                       f"{because}.")


def _directory_problem(path: Path) -> str:
    """Why ``path`` cannot be used (or created) as a directory; '' when it can."""
    try:
        return _directory_problem_of(path)
    except OSError as err:  # e.g. a name too long for the file system
        return f"it cannot be used: {err.strerror or err}"


def _directory_problem_of(path: Path) -> str:
    if path.is_symlink() and not path.exists():
        return "it is a symbolic link to nothing (dangling, or a loop)"
    if path.exists():
        if not path.is_dir():
            return "it exists and is not a directory"
        return "" if os.access(path, os.W_OK | os.X_OK) else "the directory is not writable"
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        return f"{str(parent)!r} is not a directory"
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot create it: {str(parent)!r} is not writable"
    return _creation_problem(path)


def _creation_problem(path: Path) -> str:
    """Why ``path`` (missing) cannot be created, found by creating it and removing what was
    created: the permission bits say yes for root under /proc or /sys, where mkdir fails."""
    missing = [p for p in (path, *path.parents) if not p.exists()]  # the deepest first
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        return ""  # created meanwhile by someone else: usable
    except OSError as err:
        return f"cannot create it: {err.strerror or err}"
    for created in missing:
        try:
            created.rmdir()
        except OSError:  # no longer empty or gone: someone else's now
            break
    return ""


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a name too long for the file system
        return False


#: Why a quoted TOML value is refused where a number or a boolean is expected (the text
#: alone, '0.01', reads like the number it holds).
QUOTED = "a TOML string, not a {}: write it without the quotes"


def _parse_number(fs: FieldSpec, raw: Any, origin: str, parse: bool) -> int | float:
    if isinstance(raw, str) and not parse:  # the hint only where the quotes are all that is wrong
        try:
            decimal_int(raw) if fs.base is int else decimal_float(raw)
            hint = QUOTED.format("number")
        except ValueError:
            hint = ""
        raise _fail(fs, raw, origin, hint)
    if isinstance(raw, bool):
        raise _fail(fs, raw, origin)
    if isinstance(raw, str):
        try:
            value: int | float = decimal_int(raw) if fs.base is int else decimal_float(raw)
        except ValueError:
            odd = raw.strip() and (not raw.strip().isascii() or "_" in raw)
            raise _fail(fs, raw, origin, DIGITS_ONLY if odd else "") from None
    elif fs.base is int and isinstance(raw, int):
        value = raw
    elif fs.base is float and isinstance(raw, (int, float)):
        try:
            value = float(raw)
        except OverflowError:  # a TOML integer of 400 digits
            raise _fail(fs, raw, origin) from None
    else:
        raise _fail(fs, raw, origin)
    if isinstance(value, float) and not math.isfinite(value):  # ints are finite (isfinite of
        raise _fail(fs, raw, origin)  # a 400-digit int overflows)
    if fs.base is int and not -_INT64 <= value < _INT64:  # state files keep int64 counters
        raise _fail(fs, raw, origin, "beyond the 64-bit integer range")
    if ((fs.gt is not None and not value > fs.gt) or (fs.ge is not None and not value >= fs.ge)
            or (fs.le is not None and not value <= fs.le)):
        raise _fail(fs, raw, origin)
    return value


def _parse_bool(fs: FieldSpec, raw: Any, origin: str, parse: bool) -> bool:
    if isinstance(raw, bool):
        return raw
    word = raw.strip().lower() if isinstance(raw, str) and parse else None
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    quoted_word = isinstance(raw, str) and not parse and raw.strip().lower() in ("true", "false")
    raise _fail(fs, raw, origin, QUOTED.format("boolean") if quoted_word else "")


def _check_hostports(fs: FieldSpec, raw: Any, origin: str, text: str) -> str:
    for part in text.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise _fail(fs, raw, origin)
    return ",".join(p.strip() for p in text.split(","))


def _weights(fs: FieldSpec, raw: Any, origin: str) -> str | None:
    """A ``"weights"`` field's value as its canonical text (None for an empty table)."""
    try:
        if isinstance(raw, dict):
            weights = {}
            for name, weight in raw.items():
                if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                    raise ValueError(f"the weight of {name!r:.60} is not a number")
                if "," in name or "=" in name or name != name.strip() or not name:
                    raise ValueError(f"{name!r:.60} is not a name (no ',', '=' or "
                                     f"surrounding blanks)")
                weights[name] = float(weight)
        elif isinstance(raw, str):
            weights = parse_weights(raw)
        else:
            raise ValueError(f"a {type(raw).__name__} is neither")
    except (ValueError, OverflowError) as exc:
        raise _fail(fs, raw, origin, str(exc)) from None
    for name, weight in weights.items():
        if not math.isfinite(weight) or weight < 0:
            raise _fail(fs, raw, origin, f"the weight of {name!r:.60} must be finite and >= 0, "
                                         f"got {weight:g}")
    why = fs.check(weights) if fs.check is not None else ""
    if why:
        raise _fail(fs, raw, origin, why)
    return format_weights(weights) or None


def _constant_action(fs: FieldSpec, raw: Any, origin: str) -> str:
    """A ``"constant-action"`` field's value as ``constant:A``."""
    if not isinstance(raw, str):  # a TOML number or table
        number = isinstance(raw, int) and not isinstance(raw, bool)
        raise _fail(fs, raw, origin, f'write it as a string: "constant:{raw}"' if number else "")
    try:
        return parse_constant_action(raw)
    except ValueError as exc:
        raise _fail(fs, raw, origin, str(exc)) from None


def convert(fs: FieldSpec, raw: Any, origin: str, text: bool = True) -> Any:
    """``raw`` as the field's type, validated.

    ``text=True``: ``raw`` is a string from the environment or a flag and is
    parsed; ``text=False``: a typed TOML value, whose type must already fit.
    """
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in _NONE_WORDS):
        if fs.optional:
            return None
        raise _fail(fs, raw, origin)
    if fs.base is bool:
        return _parse_bool(fs, raw, origin, text)
    if fs.base in (int, float):
        return _parse_number(fs, raw, origin, text)
    if fs.kind == "weights":
        return _weights(fs, raw, origin)
    if fs.kind == "constant-action":
        return _constant_action(fs, raw, origin)
    if not isinstance(raw, (str, Path)):
        raise _fail(fs, raw, origin)
    value = str(raw).strip()
    if fs.choices:
        match = next((c for c in fs.choices if c.lower() == value.lower()), None)
        if match is None:
            raise _fail(fs, raw, origin)
        return match
    if fs.kind == "hostports":
        return _check_hostports(fs, raw, origin, value)
    if fs.base is Path:
        path = Path(value).expanduser()
        if fs.kind == "file" and not _is_file(path):
            raise _fail(fs, raw, origin)
        if fs.kind == "dir" and (why := _directory_problem(path)):
            raise _fail(fs, raw, origin, why)
        return path
    why = fs.check(value) if fs.check is not None else ""
    if why:  # the check says what was expected: "a non-empty string" would mislead
        raise ConfigError(f"{fs.key}: {why}. Got {raw!r} (from {origin}).")
    return value
