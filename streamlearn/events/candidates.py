"""Candidate-set request values → a :class:`CandidateRequests` batch, plus rejections.

A request (docs/kafka.md, "Event shapes") is
``{"id": str, "ts"?, "x"?: <shared context>, "candidates": [{"id": str, "x": <features>}, ...],
"slots"?: k}``: the shared context in any of the three feature forms (absent when
the deployment has no shared features, ``d_x = 0``), each candidate with its own id
and features (dense, ``{"idx", "val"}`` or named, hashed into ``d_c`` buckets),
and the number of slots to fill (default 1). Every malformed part is a rejection
with its own reason: ``bad_candidates`` (not a non-empty list of objects),
``too_many_candidates``, ``bad_candidate_id``, ``duplicate_candidate_id``,
``bad_slots``, and the feature reasons of the instance decoder
(``wrong_dimension``, ``bad_features``, ``non_finite``, ``value_out_of_range``)
with a detail naming the candidate.

>>> from streamlearn.transport.protocol import Message
>>> value = (b'{"id": "r1", "x": [1.0], "candidates": [{"id": "a", "x": [0.5, 1.0]}, '
...          b'{"id": "b", "x": {"idx": [1], "val": [2.0]}}]}')
>>> batch, bad = decode_candidate_requests([Message("req", 0, 0, b"r1", value, 0)], d_x=1, d_c=2)
>>> batch.ids, batch.candidate_ids, batch.sets.items.tolist(), bad
(['r1'], ['a', 'b'], [[0.5, 1.0], [0.0, 2.0]], [])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from streamlearn.candidates.sets import CandidateSets
from streamlearn.events.chunks import decode_in_chunks
from streamlearn.events.payload import classify, dense_feature_batch, explain, feature_batch
from streamlearn.events.raw import (
    DEFAULT_LIMITS,
    DecodeLimits,
    RawMessage,
    Reject,
    Rejection,
    check_depth,
    event_id_of,
    parse_object,
    shown,
    shown_id,
    timestamp_of,
)
from streamlearn.features import Batch, SparseBatch

__all__ = ["CANDIDATE_REASONS", "MAX_CANDIDATES", "MAX_SLOTS", "CandidateRequests",
           "decode_candidate_requests"]

CANDIDATE_REASONS = ("bad_candidates", "too_many_candidates", "bad_candidate_id",
                     "duplicate_candidate_id", "bad_slots", "bad_baseline")
MAX_CANDIDATES = 1000
MAX_SLOTS = 10


@dataclass
class CandidateRequests:
    """Accepted requests of one micro-batch, in arrival order."""

    ids: list[str]
    sets: CandidateSets
    candidate_ids: list[str]  # one per candidate row of ``sets.items``
    slots: np.ndarray  # int64 (B,)
    ts: np.ndarray  # float64 (B,)
    partitions: np.ndarray  # int64 (B,)
    messages: list[Any] = field(default_factory=list, repr=False)
    # int64 (B,): the caller's own choice, as the candidate's index in its request; -1: none
    baselines: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.baselines is None:
            self.baselines = np.full(len(self.ids), -1, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, rows: np.ndarray) -> CandidateRequests:
        """The sub-batch of ``rows``, every field alike."""
        offsets, items = self.sets.offsets, rows.tolist()
        return CandidateRequests(
            ids=[self.ids[i] for i in items], sets=self.sets.take(rows),
            candidate_ids=[c for i in items
                           for c in self.candidate_ids[offsets[i]:offsets[i + 1]]],
            slots=self.slots[rows], ts=self.ts[rows], partitions=self.partitions[rows],
            messages=[self.messages[i] for i in items],
            baselines=None if self.baselines is None else self.baselines[rows])

    @classmethod
    def concatenate(cls, parts: list[CandidateRequests]) -> CandidateRequests:
        """The batches' requests in order."""
        sizes = np.concatenate([np.diff(b.sets.offsets) for b in parts])
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return CandidateRequests(
            ids=[i for b in parts for i in b.ids],
            sets=CandidateSets(np.concatenate([b.sets.context for b in parts]),
                               np.concatenate([b.sets.items for b in parts]), offsets),
            candidate_ids=[c for b in parts for c in b.candidate_ids],
            slots=np.concatenate([b.slots for b in parts]),
            ts=np.concatenate([b.ts for b in parts]),
            partitions=np.concatenate([b.partitions for b in parts]),
            messages=[m for b in parts for m in b.messages],
            baselines=np.concatenate([np.asarray(b.baselines) for b in parts]))


@dataclass
class _Request:
    msg: RawMessage
    event_id: str
    ts: float
    shared: tuple[str, Any] | None
    candidates: list[tuple[str, Any]]  # (form, payload) per candidate; empty when ``dense`` is set
    candidate_ids: list[str]
    slots: int
    dense: list[Any] | None = None  # every candidate's dense 'x' list (the fast path)
    baseline: int = -1  # the caller's own choice: its candidate's index, -1 when absent

    def forms(self) -> list[tuple[str, Any]]:
        return self.candidates if self.dense is None else [("dense", x) for x in self.dense]


def _candidate_list(obj: dict[str, Any], event_id: str, max_candidates: int) -> list[Any]:
    candidates = obj.get("candidates")
    if not (isinstance(candidates, list) and candidates
            and set(map(type, candidates)) == {dict}):  # parsed JSON: exact dicts, no subclasses
        if isinstance(candidates, list) and candidates:
            k, item = next((k, c) for k, c in enumerate(candidates) if type(c) is not dict)
            got = f"a list whose item {k} is {'null' if item is None else type(item).__name__}"
        else:
            got = "nothing" if candidates is None else (
                "an empty list" if candidates == [] else f"{type(candidates).__name__}")
        raise Reject("bad_candidates", "expected 'candidates' as a non-empty list of "
                                       f"{{\"id\", \"x\"}} objects, got {got}", event_id)
    if len(candidates) > max_candidates:
        raise Reject("too_many_candidates", f"expected at most {max_candidates} candidates, got "
                                            f"{len(candidates)}", event_id)
    return candidates


_PLAIN_REQUEST_KEYS = frozenset({"id", "ts", "x", "candidates", "slots", "baseline"})
_PLAIN_CANDIDATE_KEYS = frozenset({"id", "x"})
_CANDIDATE_ID, _CANDIDATE_X = itemgetter("id"), itemgetter("x")
_PLAIN_DEPTH = 4  # request {"candidates": [{"x": [numbers]}]}
_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})


def _plain_candidates(obj: dict[str, Any], d_c: int,
                      limits: DecodeLimits) -> tuple[list[Any], list[Any]] | None:
    """:func:`_dense_candidates` of a request that nests at most ``_PLAIN_DEPTH`` deep once
    its feature lists convert to numbers — only the known keys, scalars where scalars
    belong, dense feature lists, candidate objects of ``{"id", "x"}`` — else None. Counting
    the brackets of a 60 KB request (``check_depth``) cost ~50-120 µs, a tenth of its whole
    decode; these checks cost a few. A request whose features do not convert is counted
    before it is explained."""
    candidates = obj.get("candidates")
    if limits.max_depth < _PLAIN_DEPTH or not obj.keys() <= _PLAIN_REQUEST_KEYS or \
            type(candidates) is not list or set(map(type, candidates)) != {dict}:
        return None
    scalars = (obj.get("id"), obj.get("ts"), obj.get("slots"), obj.get("baseline"))
    # two keys each, and _dense_candidates finds "id" and "x" in every one: no other key
    if not (set(map(type, scalars)) <= _SCALAR_TYPES and type(obj.get("x", [])) is list
            and set(map(len, candidates)) == {len(_PLAIN_CANDIDATE_KEYS)}):
        return None
    ids, dense = _dense_candidates(candidates, d_c, limits.max_id_length)
    return None if dense is None else (ids, dense)


def _request(msg: RawMessage, d_x: int, d_c: int, limits: DecodeLimits,
             max_candidates: int, max_slots: int) -> _Request:
    obj = parse_object(msg, limits, count_depth=False)
    plain = _plain_candidates(obj, d_c, limits)
    if plain is None:
        check_depth(msg.value or b"", limits)
    event_id = event_id_of(obj, limits)
    ts = timestamp_of(obj, msg, event_id)
    shared = None
    if d_x > 0:
        shared = classify(obj.get("x"), d_x, event_id)
    elif obj.get("x") not in (None, [], {}):
        raise Reject("wrong_dimension", "expected no shared 'x' (this deployment has no shared "
                                        "context features), got one", event_id)
    candidates = _candidate_list(obj, event_id, max_candidates)
    ids, dense = plain if plain is not None else _dense_candidates(candidates, d_c,
                                                                   limits.max_id_length)
    forms: list[tuple[str, Any]] = []
    # one candidate at a time only off the fast path: other forms, or a bad candidate to name
    for k, candidate in enumerate(candidates if dense is None else ()):
        cid = candidate.get("id")
        if not isinstance(cid, str) or not cid or len(cid) > limits.max_id_length:
            raise Reject("bad_candidate_id", f"expected candidate {k} to have a string 'id' of 1 "
                                             f"to {limits.max_id_length} characters, got "
                                             f"{shown_id(cid)}", event_id)
        try:
            forms.append(classify(candidate.get("x"), d_c, event_id))
        except Reject as err:
            raise Reject(err.reason, f"candidate {shown(cid, 40)}: {err.detail}", event_id) from err
        ids.append(cid)
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        twice = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise Reject("duplicate_candidate_id", f"expected distinct candidate ids, got {shown(twice, 40)} "
                                               "twice", event_id)
    slots = obj.get("slots")
    if slots is None:  # absent or null: one slot, as null means absent for 'ts' and 'baseline'
        slots = 1
    most = min(len(ids), max_slots)
    if not (type(slots) is int and 1 <= slots <= most):
        raise Reject("bad_slots", f"expected 'slots' an integer in [1, {most}] (at most the "
                                  f"number of candidates, {len(ids)}, and the deployment's "
                                  f"{max_slots}), got {shown(slots, 20)}", event_id)
    baseline = obj.get("baseline")
    index = -1
    if baseline is not None:
        if type(baseline) is not str or baseline not in ids:
            raise Reject("bad_baseline", "expected 'baseline' as the id of one of the request's "
                                         f"candidates, got {shown(baseline, 40)}", event_id)
        index = ids.index(baseline)
    return _Request(msg, event_id, ts, shared, forms, ids, slots, dense, index)


def _dense_candidates(candidates: list[Any], d_c: int,
                      max_id_length: int) -> tuple[list[Any], list[Any] | None]:
    """(ids, dense 'x' lists) when every candidate has a valid string id and a dense 'x' of
    ``d_c`` entries — the shape recommenders send — checked in a few C-level passes instead
    of one Python step per candidate; ``([], None)`` otherwise (the caller then walks the
    candidates one by one to name the first bad one, or to classify mixed forms)."""
    try:  # (the candidates are exact dicts: _candidate_list or _plain_candidates checked)
        ids, xs = list(map(_CANDIDATE_ID, candidates)), list(map(_CANDIDATE_X, candidates))
    except KeyError:
        return [], None
    if set(map(type, ids)) == {str} and set(map(type, xs)) == {list}:
        id_lengths = set(map(len, ids))
        if min(id_lengths) >= 1 and max(id_lengths) <= max_id_length and \
                set(map(len, xs)) == {d_c}:
            return ids, xs
    return [], None


def _dense(X: Any) -> np.ndarray:
    return X.to_dense() if isinstance(X, SparseBatch) else np.asarray(X, dtype=np.float64)


def decode_candidate_requests(
    messages: Sequence[RawMessage], d_x: int, d_c: int, limits: DecodeLimits = DEFAULT_LIMITS,
    max_candidates: int = MAX_CANDIDATES, max_slots: int = MAX_SLOTS,
) -> tuple[CandidateRequests, list[Rejection]]:
    """Decode request values into :class:`CandidateRequests` plus rejections (in chunks:
    :mod:`streamlearn.events.chunks`)."""
    return decode_in_chunks(
        lambda chunk: _decode_chunk(chunk, d_x, d_c, limits, max_candidates, max_slots),
        CandidateRequests.concatenate, messages)


def _decode_chunk(
    messages: Sequence[RawMessage], d_x: int, d_c: int, limits: DecodeLimits,
    max_candidates: int, max_slots: int,
) -> tuple[CandidateRequests, list[Rejection]]:
    rejections: list[Rejection] = []
    kept: list[_Request] = []
    for msg in messages:
        try:
            kept.append(_request(msg, d_x, d_c, limits, max_candidates, max_slots))
        except Reject as err:
            rejections.append(err.of(msg))
    # features of every candidate of every request in one pass, then of the shared contexts
    items: Batch
    if all(r.dense is not None for r in kept):
        ok_items, items = dense_feature_batch(
            list(chain.from_iterable(r.dense for r in kept if r.dense is not None)), d_c, limits)
    else:
        ok_items, items = feature_batch([form for r in kept for form in r.forms()], d_c, limits)
    sizes = np.array([len(r.candidate_ids) for r in kept], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ok = np.logical_and.reduceat(ok_items, starts[:-1]) if len(kept) else np.zeros(0, bool)
    if d_x > 0:
        ok_shared, shared = feature_batch([r.shared for r in kept if r.shared is not None], d_x,
                                          limits)
        context = _dense(shared)
        ok &= ok_shared
    else:
        context = np.zeros((len(kept), 0))
    for i in np.flatnonzero(~ok).tolist():
        r = kept[i]
        try:  # a plain request was not counted: a non-number entry may nest deep (repr below)
            check_depth(r.msg.value or b"", limits)
        except Reject as err:
            rejections.append(Reject(err.reason, err.detail, r.event_id).of(r.msg))
            continue
        bad = [k for k in range(sizes[i]) if not ok_items[starts[i] + k]]
        if bad:
            reason, detail = explain(*r.forms()[bad[0]], d_c, limits)
            detail = f"candidate {shown(r.candidate_ids[bad[0]], 40)}: {detail}"
        else:
            assert r.shared is not None
            reason, detail = explain(*r.shared, d_x, limits)
        rejections.append(Reject(reason, detail, r.event_id).of(r.msg))
    good = np.flatnonzero(ok)
    rows = (np.concatenate([np.arange(starts[i], starts[i + 1]) for i in good.tolist()])
            if len(good) else np.zeros(0, np.int64))
    # feature_batch returns the rows it accepted only: flat position p is row "accepted
    # before p" of its result (every row of a good request was accepted)
    dense_items = _dense(items)[(np.cumsum(ok_items) - 1)[rows]] if len(rows) else \
        np.zeros((0, d_c))
    if d_x > 0 and len(good):
        context = context[(np.cumsum(ok_shared) - 1)[good]]
    else:
        context = context[good] if len(kept) else np.zeros((0, d_x))
    offsets = np.concatenate([[0], np.cumsum(sizes[good])]).astype(np.int64)
    requests = [kept[i] for i in good.tolist()]
    batch = CandidateRequests(
        ids=[r.event_id for r in requests],
        sets=CandidateSets(context, dense_items, offsets),
        candidate_ids=[cid for r in requests for cid in r.candidate_ids],
        slots=np.array([r.slots for r in requests], dtype=np.int64),
        ts=np.array([r.ts for r in requests], dtype=np.float64),
        partitions=np.array([r.msg.partition for r in requests], dtype=np.int64),
        messages=[r.msg for r in requests],
        baselines=np.array([r.baseline for r in requests], dtype=np.int64))
    return batch, rejections
