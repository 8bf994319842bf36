"""One raw message → a JSON object, or a :class:`Rejection` naming what was wrong.

The checks here are the same for instances and feedback: size, nesting depth
(checked on the raw bytes, because a deep enough nesting crashes the JSON
parser itself), UTF-8, JSON, object, id and timestamp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson

__all__ = ["DEFAULT_LIMITS", "MAX_TYPE_LENGTH", "DecodeLimits", "Message", "RawMessage", "Reject",
           "Rejection", "check_depth", "depth_exceeds", "event_id_of", "feedback_type_of",
           "is_number", "own_copy", "parse_object", "shown", "shown_id", "timestamp_of"]

#: the longest feedback ``type`` accepted (a short name: click, conversion, dwell)
MAX_TYPE_LENGTH = 64


@dataclass(frozen=True, slots=True)
class Message:
    """One record read from a topic partition."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int



class RawMessage(Protocol):
    """What decoding needs from a transport message (:class:`Message` has it)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp_ms(self) -> int: ...


@dataclass(frozen=True)
class DecodeLimits:
    """Input limits: a message beyond them is rejected, never learned from.

    The feature limits keep one absurd value (``1e308`` is a valid JSON
    number) from poisoning a model: real features such as prices, counts or
    embeddings stay far below them.
    """

    max_message_bytes: int = 1 << 20
    max_id_length: int = 256
    max_depth: int = 32  # brackets deeper than this are refused before parsing (orjson recursion)
    max_abs_feature: float = 1e12
    max_row_squared_norm: float = 1e26


DEFAULT_LIMITS = DecodeLimits()


@dataclass(frozen=True)
class Rejection:
    """One refused message: the reason code, a human detail and where it came from."""

    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    event_id: str | None = None


class Reject(Exception):
    """Raised inside decoding; turned into a :class:`Rejection` with the message's origin."""

    def __init__(self, reason: str, detail: str, event_id: str | None = None) -> None:
        self.reason, self.detail, self.event_id = reason, detail, event_id

    def of(self, msg: RawMessage) -> Rejection:
        return Rejection(self.reason, self.detail, msg.topic, msg.partition, msg.offset, msg.key,
                         msg.value, self.event_id)


_NOT_MARKS = bytes(c for c in range(256) if c not in b'[]{}"')
_BRACKET_STEP = np.zeros(256, dtype=np.int32)
_BRACKET_STEP[list(b"[{")], _BRACKET_STEP[list(b"]}")] = 1, -1
_QUOTE = ord('"')


def depth_exceeds(value: bytes, limit: int) -> bool:
    """Whether bracket nesting outside JSON strings exceeds ``limit``.

    Brackets inside strings are not nesting: counting them would reject a valid event
    whose text holds many ``[``, and let ``]`` in a string hide real nesting from the
    count (orjson accepts up to 1,024 levels; Python's ``repr`` of a rejection detail
    then overflows the recursion limit).
    """
    # one C pass keeps the brackets and quotes: a few hundred bytes of a 60 KB request
    marks = value.translate(None, _NOT_MARKS)
    if marks.count(b"[") + marks.count(b"{") <= limit:  # fewer openers than the limit
        return False
    return _depth(value, marks) > limit


def _depth(value: bytes, marks: bytes) -> int:
    """The nesting depth of ``value`` (``marks``: its brackets and quotes)."""
    if b"\\" in value:
        # Escapes pair up from the left of each backslash run (JSON's reading inside a string;
        # outside one a backslash is invalid JSON, which orjson rejects right there): drop the
        # escaped backslashes, then the escaped quotes; every quote left opens or closes.
        marks = value.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_MARKS)
    return _nesting_depth(marks)


def _nesting_depth(marks: bytes) -> int:
    """The deepest nesting of brackets and quotes, counting brackets outside quote pairs only."""
    b = np.frombuffer(marks, dtype=np.uint8)
    toggles = (b == _QUOTE).view(np.int8)
    outside = (np.cumsum(toggles, dtype=np.int32) - toggles) % 2 == 0  # even quotes before
    return int(np.cumsum(_BRACKET_STEP[b] * outside).max(initial=0))


def check_depth(value: bytes, limits: DecodeLimits) -> None:
    """Refuse (``nesting_too_deep``) a value nested deeper than ``limits.max_depth``."""
    if depth_exceeds(value, limits.max_depth):
        raise Reject("nesting_too_deep", f"expected nesting depth <= {limits.max_depth}, got "
                                         f"{_depth(value, value.translate(None, _NOT_MARKS))}")


def parse_object(msg: RawMessage, limits: DecodeLimits, count_depth: bool = True) -> dict[str, Any]:
    """The message's JSON object (a JSON ``null`` or any other non-object is ``not_object``).

    ``count_depth=False``: the caller counts the nesting (``check_depth``) itself unless it
    finds the object plain, before anything can ``repr`` a part of it; this function then
    counts only before it refuses the message, so that ``nesting_too_deep`` keeps its
    precedence over the other reasons.
    """
    value = msg.value
    if value is None:
        raise Reject("invalid_json", "expected a JSON object, got an empty (null) message value")
    if len(value) > limits.max_message_bytes:
        raise Reject("too_large", f"expected at most {limits.max_message_bytes} bytes, "
                                  f"got {len(value)}")
    if count_depth:
        check_depth(value, limits)
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:  # orjson names UTF-8 problems (also surrogates)
        check_depth(value, limits)
        if "UTF-8" not in str(exc):
            raise Reject("invalid_json", str(exc)[:200]) from None
        raise Reject("invalid_utf8", _utf8_problem(value) or str(exc)[:200]) from None
    if not isinstance(obj, dict):
        check_depth(value, limits)
        got = "null" if obj is None else type(obj).__name__
        raise Reject("not_object", f"expected a JSON object, got {got}")
    return obj


def _utf8_problem(value: bytes) -> str | None:
    """Where ``value`` stops being UTF-8 (orjson reports every bad byte as "surrogates not
    allowed" at char 0); None when it is UTF-8 (a BOM: orjson's own message says so)."""
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as err:
        return (f"expected UTF-8, got byte 0x{value[err.start]:02x} at offset {err.start} "
                f"({err.reason})")
    return None


def event_id_of(obj: dict[str, Any], limits: DecodeLimits) -> str:
    event_id = obj.get("id")
    if event_id is None or event_id == "":
        raise Reject("missing_id", "expected a non-empty string 'id'")
    if not isinstance(event_id, str):
        raise Reject("bad_id_type", f"expected 'id' to be a string, got {type(event_id).__name__}")
    if len(event_id) > limits.max_id_length:
        raise Reject("id_too_long", f"expected an id of at most {limits.max_id_length} "
                                    f"characters, got {len(event_id)}")
    return event_id


def shown(value: object, limit: int = 40) -> str:
    """A rejected value for a detail, as the JSON it came in (``null``, ``true``, ``"2"``:
    Python's ``None``, ``True``, ``'2'`` told a caller that writes JSON something else, an
    outside test), cut at ``limit`` characters.

    >>> shown(None), shown(True), shown("2"), shown([1.5, {"a": None}]), shown("x" * 50, 10)
    ('null', 'true', '"2"', '[1.5,{"a":null}]', '"xxxxxxxx…')
    """
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # not from JSON (a test's object): Python's own form
        text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 1]}…"


def shown_id(value: object, limit: int = 40) -> str:
    """A rejected id for a detail: :func:`shown`, and when a string was cut its length,
    which is what a too-long id is rejected for."""
    text = shown(value, limit + 1)
    if not text.endswith("…"):
        return text
    length = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text}{length}"


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def timestamp_of(obj: dict[str, Any], msg: RawMessage, event_id: str) -> float:
    ts = obj.get("ts")
    if ts is None:
        return msg.timestamp_ms / 1000.0
    if not is_number(ts) or not np.isfinite(ts):
        raise Reject("bad_timestamp", f"expected 'ts' to be a finite number, got {shown(ts)}",
                     event_id)
    return float(ts)


def feedback_type_of(obj: dict[str, Any], event_id: str) -> str | None:
    """A feedback event's ``type``: None when absent (or ``null``), else a string of 1 to
    :data:`MAX_TYPE_LENGTH` characters (``bad_feedback_type`` otherwise)."""
    kind = obj.get("type")
    if kind is None or (type(kind) is str and 0 < len(kind) <= MAX_TYPE_LENGTH):
        return kind
    got = (f"a string of {len(kind)} characters" if isinstance(kind, str)
           else f"{type(kind).__name__} {shown(kind, 40)}")
    raise Reject("bad_feedback_type", f"expected 'type' as a string of 1 to {MAX_TYPE_LENGTH} "
                                      f"characters, got {got}", event_id)


def own_copy(value: bytes) -> bytes:
    """A copy of ``value`` that allocates only its length.

    orjson returns bytes objects that keep its whole write buffer (4 KB and more) allocated
    however short the JSON is; whatever keeps thousands of messages (a log, the last
    decisions) keeps copies. 0.3 µs per message.
    """
    return bytes(memoryview(value))
