"""Event contracts (DESIGN.md §3): decode raw Kafka values into typed batches or rejections.

Every raw value is either accepted into a batch or turned into a
:class:`Rejection` with a stable snake_case ``reason``; decoding never raises on
bad input and never lets NaN/inf through. The per-message work is one
``orjson.loads`` and a few type checks; the numeric arrays of a whole
micro-batch are then built in one shot.

Reasons: ``invalid_utf8``, ``invalid_json``, ``not_object``, ``too_large``,
``nesting_too_deep``, ``missing_id``, ``id_too_long``, ``bad_id_type``,
``bad_timestamp``, ``bad_features``, ``wrong_dimension``, ``non_finite``,
``bad_actions``, ``bad_label``, ``bad_reward``; the join adds ``unknown_id``
and ``duplicate_id``.

Feature forms: a dense list of ``d`` numbers; ``{"idx": [int], "val": [float]}``
(sparse; the only object with exactly these two keys); any other object is
named features ``{"name": value}`` hashed into ``d`` buckets. Numbers are
converted the way numpy converts them (booleans count as 0/1).

>>> from collections import namedtuple
>>> Message = namedtuple("Message", "topic partition offset key value timestamp_ms")
>>> msgs = [Message("in", 0, 0, b"a", b'{"id": "a", "x": [1, 0, 2]}', 1000),
...         Message("in", 0, 1, b"b", b'{"id": "b", "x": [1, 0]}', 1000)]
>>> batch, rejected = decode_instances(msgs, n_features=3, n_actions=2)
>>> batch.ids, batch.X.tolist(), [r.reason for r in rejected]
(['a'], [[1.0, 0.0, 2.0]], ['wrong_dimension'])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import orjson

from streamlearn.features import Batch, SparseBatch, hash_names

__all__ = ["REASONS", "DecodeLimits", "FeedbackBatch", "InstanceBatch", "RawMessage",
           "Rejection", "decode_feedback", "decode_instances"]

REASONS = (
    "invalid_utf8", "invalid_json", "not_object", "too_large", "nesting_too_deep",
    "missing_id", "id_too_long", "bad_id_type", "bad_timestamp", "bad_features",
    "wrong_dimension", "non_finite", "bad_actions", "bad_label", "bad_reward",
    "unknown_id", "duplicate_id",
)


class RawMessage(Protocol):
    """What decoding needs from a transport message (``stream.transport.Message``)."""

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
    """Input limits: a message beyond them is rejected, never parsed."""

    max_message_bytes: int = 1 << 20
    max_id_length: int = 256
    max_depth: int = 32  # brackets deeper than this are refused before parsing (orjson recursion)


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


@dataclass
class InstanceBatch:
    """Accepted instances of one micro-batch, in arrival order."""

    ids: list[str]
    X: Batch
    mask: np.ndarray | None  # (B, K) bool, None when no event restricted its actions
    labels: np.ndarray  # int64 (B,), -1 when absent
    ts: np.ndarray  # float64 (B,) event time in seconds
    partitions: np.ndarray  # int64 (B,)
    offsets: np.ndarray  # int64 (B,)
    messages: list[Any] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class FeedbackBatch:
    """Accepted feedback of one micro-batch, in arrival order."""

    ids: list[str]
    rewards: np.ndarray  # float64 (B,) in [0, 1]
    ts: np.ndarray  # float64 (B,)
    messages: list[Any] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.ids)


class _Reject(Exception):
    def __init__(self, reason: str, detail: str, event_id: str | None = None) -> None:
        self.reason, self.detail, self.event_id = reason, detail, event_id

    def of(self, msg: RawMessage) -> Rejection:
        return Rejection(self.reason, self.detail, msg.topic, msg.partition, msg.offset, msg.key,
                         msg.value, self.event_id)


def _depth_exceeds(value: bytes, limit: int) -> bool:
    """Whether bracket nesting (counted on raw bytes, strings included) exceeds ``limit``."""
    if value.count(b"[") + value.count(b"{") <= limit:
        return False
    b = np.frombuffer(value, dtype=np.uint8)
    step = ((b == 91) | (b == 123)).astype(np.int32) - ((b == 93) | (b == 125))
    return bool(np.cumsum(step).max() > limit)


def _parse(msg: RawMessage, limits: DecodeLimits) -> dict[str, Any]:
    value = msg.value
    if value is None:
        raise _Reject("invalid_json", "expected a JSON object, got an empty (null) value")
    if len(value) > limits.max_message_bytes:
        raise _Reject("too_large", f"expected at most {limits.max_message_bytes} bytes, "
                                   f"got {len(value)}")
    if _depth_exceeds(value, limits.max_depth):
        raise _Reject("nesting_too_deep", f"expected nesting depth <= {limits.max_depth}")
    try:
        obj = orjson.loads(value)
    except orjson.JSONDecodeError as exc:  # orjson names UTF-8 problems (also surrogates)
        reason = "invalid_utf8" if "UTF-8" in str(exc) else "invalid_json"
        raise _Reject(reason, str(exc)[:200]) from None
    if not isinstance(obj, dict):
        raise _Reject("not_object", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _event_id(obj: dict[str, Any], limits: DecodeLimits) -> str:
    event_id = obj.get("id")
    if event_id is None or event_id == "":
        raise _Reject("missing_id", "expected a non-empty string 'id'")
    if not isinstance(event_id, str):
        raise _Reject("bad_id_type", f"expected 'id' to be a string, got {type(event_id).__name__}")
    if len(event_id) > limits.max_id_length:
        raise _Reject("id_too_long", f"expected an id of at most {limits.max_id_length} "
                                     f"characters, got {len(event_id)}")
    return event_id


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _timestamp(obj: dict[str, Any], msg: RawMessage, event_id: str) -> float:
    ts = obj.get("ts")
    if ts is None:
        return msg.timestamp_ms / 1000.0
    if not _number(ts) or not np.isfinite(ts):
        raise _Reject("bad_timestamp", f"expected 'ts' to be a finite number, got {ts!r:.40}",
                      event_id)
    return float(ts)


def _check_features(x: object, n_features: int, event_id: str) -> tuple[str, Any]:
    """Classify ``x`` and check the cheap structural rules; numbers are checked in bulk."""
    if isinstance(x, list):
        if len(x) != n_features:
            raise _Reject("wrong_dimension", f"expected {n_features} features, got {len(x)}",
                          event_id)
        return "dense", x
    if isinstance(x, dict):
        if x.keys() == {"idx", "val"}:
            idx, val = x["idx"], x["val"]
            if not (isinstance(idx, list) and isinstance(val, list) and len(idx) == len(val)):
                raise _Reject("bad_features", "expected 'idx' and 'val' lists of equal length",
                              event_id)
            return "sparse", (idx, val)
        return "named", x
    raise _Reject("bad_features", f"expected 'x' as a list, an idx/val object or a name→value "
                                  f"object, got {type(x).__name__}", event_id)


def _as_float_rows(rows: list[Any], width: int) -> tuple[np.ndarray, np.ndarray]:
    """Convert equal-length rows in one shot (fall back per row to find the bad ones).

    Returns the (n, width) array and a per-row flag: numeric and finite.
    """
    try:
        out = np.array(rows, dtype=np.float64)
        if out.shape == (len(rows), width):
            return out, np.asarray(np.isfinite(out).all(axis=1))
    except (ValueError, TypeError, OverflowError):
        pass
    good = np.ones(len(rows), dtype=bool)
    out = np.zeros((len(rows), width))
    for i, row in enumerate(rows):  # only when a batch holds a non-numeric row
        try:
            out[i] = np.array(row, dtype=np.float64)
        except (ValueError, TypeError, OverflowError):
            good[i] = False
    return out, good & np.isfinite(out).all(axis=1)


def _flat_floats(values: list[Any], lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Flat entries of several rows → (float64 entries, per-row ok flag)."""
    n_rows = len(lengths)
    try:
        flat = np.array(values, dtype=np.float64).reshape(-1)
        if len(flat) == sum(lengths):
            row_of = np.repeat(np.arange(n_rows), lengths)
            bad = np.bincount(row_of, weights=~np.isfinite(flat), minlength=n_rows) > 0
            return flat, np.asarray(~bad)
    except (ValueError, TypeError, OverflowError):
        pass
    flat = np.zeros(sum(lengths))
    ok = np.ones(n_rows, dtype=bool)
    pos = 0
    for r, length in enumerate(lengths):  # only when a batch holds a non-numeric entry
        try:
            flat[pos:pos + length] = np.array(values[pos:pos + length], dtype=np.float64)
            ok[r] = bool(np.isfinite(flat[pos:pos + length]).all())
        except (ValueError, TypeError, OverflowError):
            ok[r] = False
        pos += length
    return flat, ok


def decode_instances(
    messages: Sequence[RawMessage], n_features: int, n_actions: int,
    limits: DecodeLimits = DecodeLimits(),
) -> tuple[InstanceBatch, list[Rejection]]:
    """Decode instance values into an :class:`InstanceBatch` plus rejections."""
    rejections: list[Rejection] = []
    kept: list[tuple[RawMessage, str, float, str, Any, Any, int]] = []
    for msg in messages:
        try:
            obj = _parse(msg, limits)
            event_id = _event_id(obj, limits)
            ts = _timestamp(obj, msg, event_id)
            kind, payload = _check_features(obj.get("x"), n_features, event_id)
            actions = obj.get("actions")
            if actions is not None and not (
                isinstance(actions, list) and actions
                and all(type(a) is int and 0 <= a < n_actions for a in actions)
            ):
                raise _Reject("bad_actions", f"expected a non-empty list of actions in "
                                             f"[0, {n_actions}), got {actions!r:.60}", event_id)
            label = obj.get("label", -1)
            if label != -1 and not (isinstance(label, int) and not isinstance(label, bool)
                                    and 0 <= label < n_actions):
                raise _Reject("bad_label", f"expected 'label' in [0, {n_actions}), "
                                           f"got {label!r:.40}", event_id)
            kept.append((msg, event_id, ts, kind, payload, actions, int(label)))
        except _Reject as err:
            rejections.append(err.of(msg))
    ok, X = _feature_batch(kept, n_features)
    for row in np.flatnonzero(~ok):
        msg, event_id, _ts, kind, payload, _a, _l = kept[row]
        reason = _feature_reason(kind, payload, n_features)
        rejections.append(_Reject(reason, f"features of {event_id!r}: {reason}", event_id).of(msg))
    rows = [k for k, good in zip(kept, ok, strict=True) if good]
    mask = None
    if any(k[5] is not None for k in rows):
        mask = np.ones((len(rows), n_actions), dtype=bool)
        for i, k in enumerate(rows):
            if k[5] is not None:
                mask[i] = False
                mask[i, np.asarray(k[5], dtype=np.int64)] = True
    batch = InstanceBatch(
        ids=[k[1] for k in rows], X=X, mask=mask,
        labels=np.array([k[6] for k in rows], dtype=np.int64),
        ts=np.array([k[2] for k in rows], dtype=np.float64),
        partitions=np.array([k[0].partition for k in rows], dtype=np.int64),
        offsets=np.array([k[0].offset for k in rows], dtype=np.int64),
        messages=[k[0] for k in rows],
    )
    return batch, rejections


def _feature_batch(kept: list[Any], n_features: int) -> tuple[np.ndarray, Batch]:
    """Build the feature batch of the kept rows; return (row ok flags, batch of the ok rows)."""
    n = len(kept)
    kinds = [k[3] for k in kept]
    if all(kind == "dense" for kind in kinds):
        dense, ok = _as_float_rows([k[4] for k in kept], n_features)
        return ok, dense[ok]
    ok = np.ones(n, dtype=bool)
    idx_rows: list[np.ndarray] = [np.zeros(0, np.int64)] * n
    val_rows: list[np.ndarray] = [np.zeros(0)] * n
    for kind in ("dense", "sparse", "named"):
        members = [i for i, k in enumerate(kinds) if k == kind]
        if not members:
            continue
        if kind == "dense":
            dense, good = _as_float_rows([kept[i][4] for i in members], n_features)
            for j, i in enumerate(members):
                nz = np.flatnonzero(dense[j])
                idx_rows[i], val_rows[i], ok[i] = nz, dense[j, nz], bool(good[j])
            continue
        if kind == "sparse":
            lengths = [len(kept[i][4][0]) for i in members]
            idx, idx_ok = _flat_floats([v for i in members for v in kept[i][4][0]], lengths)
            val, val_ok = _flat_floats([v for i in members for v in kept[i][4][1]], lengths)
            in_range = (idx >= 0) & (idx < n_features) & (idx == np.floor(idx))
            row_of = np.repeat(np.arange(len(members)), lengths)
            idx_ok &= np.bincount(row_of, weights=~in_range, minlength=len(members)) == 0
            good = idx_ok & val_ok
            hashed = None
        else:
            lengths = [len(kept[i][4]) for i in members]
            names = [list(kept[i][4].keys()) for i in members]
            val, good = _flat_floats([v for i in members for v in kept[i][4].values()], lengths)
            hashed = hash_names(names, n_features,
                                values=np.split(val, np.cumsum(lengths)[:-1]))  # type: ignore[arg-type]
            idx = hashed.indices.astype(np.float64)
            val = hashed.values
        starts = np.concatenate([[0], np.cumsum(lengths)])
        for j, i in enumerate(members):
            ok[i] = bool(good[j])
            idx_rows[i] = idx[starts[j]:starts[j + 1]].astype(np.int64)
            val_rows[i] = val[starts[j]:starts[j + 1]]
    keep = np.flatnonzero(ok)
    indptr = np.zeros(len(keep) + 1, dtype=np.int64)
    np.cumsum([len(idx_rows[i]) for i in keep], out=indptr[1:])
    if len(keep) == 0:
        return ok, SparseBatch(indptr, np.zeros(0, np.int64), np.zeros(0), n_features)
    indices = np.concatenate([idx_rows[i] for i in keep]).astype(np.int64)
    values = np.concatenate([val_rows[i] for i in keep]).astype(np.float64)
    return ok, SparseBatch(indptr, indices, values, n_features)


def _feature_reason(kind: str, payload: Any, n_features: int) -> str:
    """Name why a row failed the bulk check (cold path: rejected rows only)."""
    if kind == "sparse":
        try:
            idx = np.array(payload[0], dtype=np.float64)
            if ((idx < 0) | (idx >= n_features) | (idx != np.floor(idx))).any():
                return "wrong_dimension"
            values = np.array(payload[1], dtype=np.float64)
        except (ValueError, TypeError, OverflowError):
            return "bad_features"
    else:
        raw = payload if kind == "dense" else list(payload.values())
        try:
            values = np.array(raw, dtype=np.float64)
        except (ValueError, TypeError, OverflowError):
            return "bad_features"
    return "non_finite" if not np.isfinite(values).all() else "bad_features"


def decode_feedback(
    messages: Sequence[RawMessage],
    limits: DecodeLimits = DecodeLimits(),
) -> tuple[FeedbackBatch, list[Rejection]]:
    """Decode feedback values ``{"id", "reward" in [0, 1], "ts"?}``."""
    rejections: list[Rejection] = []
    ids: list[str] = []
    rewards: list[float] = []
    stamps: list[float] = []
    kept: list[RawMessage] = []
    for msg in messages:
        try:
            obj = _parse(msg, limits)
            event_id = _event_id(obj, limits)
            ts = _timestamp(obj, msg, event_id)
            reward = obj.get("reward")
            if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not (
                    0.0 <= reward <= 1.0):
                raise _Reject("bad_reward", f"expected 'reward' as a number in [0, 1], "
                                            f"got {reward!r:.40}", event_id)
            ids.append(event_id)
            rewards.append(float(reward))
            stamps.append(ts)
            kept.append(msg)
        except _Reject as err:
            rejections.append(err.of(msg))
    return FeedbackBatch(ids, np.array(rewards, dtype=np.float64),
                         np.array(stamps, dtype=np.float64), kept), rejections
