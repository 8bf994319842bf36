"""Candidate-set requests: every form accepted, every malformed part a specific rejection."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.events.candidates import decode_candidate_requests
from streamlearn.events.raw import DecodeLimits, shown
from streamlearn.transport.protocol import Message

D_X, D_C = 2, 3


def message(value: Any, offset: int = 0) -> Message:
    raw = value if isinstance(value, bytes) else orjson.dumps(value)
    return Message("requests", 0, offset, None, raw, 1_700_000_000_000)


def good(i: int, n: int = 3) -> dict[str, Any]:
    forms: list[Any] = [[0.5, -1.0, 2.0], {"idx": [0, 2], "val": [1.0, 3.0]},
                        {"price": 3.5, "brand=acme": 1}]
    return {"id": f"r{i}", "x": [1.0, float(i)], "slots": 1,
            "candidates": [{"id": f"item-{k}", "x": forms[k % 3]} for k in range(n)]}


def test_mixed_forms_and_sizes_decode_into_segments() -> None:
    values = [good(0, 1), good(1, 4), good(2, 2)]
    batch, bad = decode_candidate_requests([message(v, i) for i, v in enumerate(values)], D_X, D_C)
    assert bad == [] and batch.ids == ["r0", "r1", "r2"]
    assert batch.sets.offsets.tolist() == [0, 1, 5, 7]
    assert batch.candidate_ids[1:5] == ["item-0", "item-1", "item-2", "item-3"]
    assert batch.sets.items[0].tolist() == [0.5, -1.0, 2.0]
    assert batch.sets.items[2].tolist() == [1.0, 0.0, 3.0]
    assert batch.sets.context.tolist() == [[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]]
    assert batch.slots.tolist() == [1, 1, 1]


@pytest.mark.parametrize("change, reason, detail", [
    ({"candidates": []}, "bad_candidates", "non-empty list"),
    ({"candidates": None}, "bad_candidates", "got nothing"),
    ({"candidates": [1, 2]}, "bad_candidates", "objects"),
    ({"candidates": [{"id": "a", "x": [1, 2, 3]}] * 1001}, "too_many_candidates", "at most 1000"),
    ({"candidates": [{"id": "a", "x": [1, 2, 3]}, {"id": "a", "x": [1, 2, 3]}]},
     "duplicate_candidate_id", '"a" twice'),
    ({"candidates": [{"id": 7, "x": [1, 2, 3]}]}, "bad_candidate_id", "candidate 0"),
    ({"candidates": [{"id": "", "x": [1, 2, 3]}]}, "bad_candidate_id", "string 'id'"),
    ({"candidates": [{"id": "k" * 300, "x": [1, 2, 3]}]}, "bad_candidate_id",
     'got "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk… (300 characters)'),
    ({"candidates": [{"id": "a", "x": [1, 2]}]}, "wrong_dimension", 'candidate "a"'),
    ({"candidates": [{"id": "a"}]}, "bad_features", 'candidate "a"'),
    ({"candidates": [{"id": "a", "x": [1, 2, 1e300]}]}, "value_out_of_range", 'candidate "a"'),
    ({"candidates": [{"id": "é😀", "x": {"idx": [0, 1], "val": [1.0]}}]}, "bad_features",
     'candidate "é😀"'),
    ({"slots": 4}, "bad_slots", "[1, 3]"),
    ({"slots": 0}, "bad_slots", "[1, 3]"),
    ({"slots": True}, "bad_slots", "integer"),
    ({"x": [1.0]}, "wrong_dimension", "expected 2"),
    ({"x": [1.0, 1e300]}, "value_out_of_range", "x[1]"),
])
def test_each_malformed_part_has_its_reason(change: dict[str, Any], reason: str, detail: str) -> None:
    value = {**good(9), **change}
    batch, bad = decode_candidate_requests([message(good(1)), message(value, 1)], D_X, D_C)
    assert batch.ids == ["r1"]  # the valid neighbour is kept
    assert [b.reason for b in bad] == [reason], bad
    assert detail in bad[0].detail and bad[0].event_id == "r9" and bad[0].offset == 1


def test_null_slots_mean_one_slot_as_absent_ones_do() -> None:
    """As for 'ts' and 'baseline', a null 'slots' is the default (an outside test found it
    rejected as bad_slots)."""
    batch, bad = decode_candidate_requests([message({**good(1), "slots": None}),
                                            message({k: v for k, v in good(2).items()
                                                     if k != "slots"}, 1)], D_X, D_C)
    assert not bad and batch.ids == ["r1", "r2"] and batch.slots.tolist() == [1, 1]


def test_every_candidate_reason_is_a_known_dead_letter_reason() -> None:
    from streamlearn.events import REASONS
    from streamlearn.events.candidates import CANDIDATE_REASONS

    assert set(CANDIDATE_REASONS) <= set(REASONS)


def test_no_shared_context_when_the_deployment_has_none() -> None:
    value = {"id": "q", "candidates": [{"id": "d1", "x": [1.0, 2.0, 3.0]}]}
    batch, bad = decode_candidate_requests([message(value)], 0, D_C)
    assert bad == [] and batch.sets.context.shape == (1, 0)
    batch, bad = decode_candidate_requests([message({**value, "x": [1.0]})], 0, D_C)
    assert [b.reason for b in bad] == ["wrong_dimension"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["id", "x", "candidates", "slots", "idx", "val", "ts"]), inner, max_size=5),
    max_leaves=25)


@settings(max_examples=300, deadline=None)
@given(st.lists(json_values, max_size=6))
def test_arbitrary_json_only_ever_rejects_and_accepted_requests_are_sound(
        values: list[Any]) -> None:
    messages = [message(v, i) for i, v in enumerate(values)]
    batch, bad = decode_candidate_requests(messages, D_X, D_C)
    assert len(batch) + len(bad) == len(messages)
    sets = batch.sets
    assert len(sets) == len(batch.ids) and len(batch.candidate_ids) == len(sets.items)
    assert (sets.sizes >= 1).all() and (batch.slots >= 1).all() and (batch.slots <= sets.sizes).all()
    assert np.isfinite(sets.items).all() and np.isfinite(sets.context).all()
    assert (np.abs(sets.items) <= 1e12).all()


@pytest.mark.parametrize("change", [
    {"candidates": [{"id": "a", "x": [1, 2, 1e300]}, {"id": "b", "x": [1, 2, 3]}]},  # dense rows
    {"candidates": [{"id": "a", "x": {"idx": [0], "val": [1e300]}}]},  # a sparse row
    {"x": [1.0, 1e300]},  # the shared context
])
def test_a_rejected_request_does_not_shift_the_features_of_the_next_ones(
        change: dict[str, Any]) -> None:
    """The features of the requests kept are their own, whatever was rejected before them."""
    values = [{**good(9), **change}, good(1, 4), good(2, 2)]
    batch, bad = decode_candidate_requests([message(v, i) for i, v in enumerate(values)], D_X, D_C)
    assert [b.event_id for b in bad] == ["r9"] and batch.ids == ["r1", "r2"]
    alone = [decode_candidate_requests([message(v)], D_X, D_C)[0] for v in values[1:]]
    np.testing.assert_array_equal(batch.sets.items,
                                  np.concatenate([a.sets.items for a in alone]))
    np.testing.assert_array_equal(batch.sets.context,
                                  np.concatenate([a.sets.context for a in alone]))


dense_candidate = st.fixed_dictionaries({
    "id": st.one_of(st.text(max_size=3), st.integers(0, 3), st.none()),
    "x": st.one_of(
        st.lists(st.one_of(st.floats(-1e13, 1e13), st.integers(-5, 5), st.booleans()),
                 min_size=D_C, max_size=D_C),
        st.lists(st.floats(-2, 2), min_size=0, max_size=D_C + 1),
        st.lists(st.text(max_size=1), min_size=D_C, max_size=D_C))})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(dense_candidate, min_size=1, max_size=5), min_size=1, max_size=4))
def test_the_dense_fast_path_decodes_as_the_candidate_by_candidate_walk(
        requests: list[list[dict[str, Any]]]) -> None:
    """Requests whose candidates are (mostly) dense lists: what the few-pass check accepts,
    the walk over each candidate accepts identically, and both reject the same requests with
    the same reason and detail."""
    import streamlearn.events.candidates as decoder

    messages = [message({"id": f"r{i}", "x": [0.0, 1.0], "candidates": c}, i)
                for i, c in enumerate(requests)]
    fast, fast_bad = decode_candidate_requests(messages, D_X, D_C)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoder, "_dense_candidates", lambda *_: ([], None))
        walk, walk_bad = decode_candidate_requests(messages, D_X, D_C)
    assert fast.ids == walk.ids and fast.candidate_ids == walk.candidate_ids
    np.testing.assert_array_equal(fast.sets.items, walk.sets.items)
    np.testing.assert_array_equal(fast.sets.offsets, walk.sets.offsets)
    assert [(r.event_id, r.reason, r.detail) for r in fast_bad] == \
        [(r.event_id, r.reason, r.detail) for r in walk_bad]


@pytest.mark.parametrize(("candidates", "got"), [
    ([None], "got a list whose item 0 is null"),
    ([{"id": "a", "x": [1, 2, 3]}, 5], "got a list whose item 1 is int"),
    ("abc", "got str"), ([], "got an empty list"),
])
def test_a_bad_candidate_list_says_what_it_holds(candidates: Any, got: str) -> None:
    _, bad = decode_candidate_requests([message({"id": "r", "candidates": candidates})], 0, D_C)
    assert [b.reason for b in bad] == ["bad_candidates"] and bad[0].detail.endswith(got)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(dense_candidate, min_size=1, max_size=4),
                          st.one_of(st.none(), st.integers(0, 3), st.text(max_size=3),
                                    st.booleans(), st.floats(allow_nan=False),
                                    st.lists(st.text(max_size=2), max_size=2),
                                    st.dictionaries(st.just("id"), st.text(max_size=2)))),
                min_size=1, max_size=4))
def test_baselines_decode_alike_on_the_dense_fast_path_and_the_walk(
        requests: list[tuple[list[dict[str, Any]], Any]]) -> None:
    """Requests with a ``baseline`` of any kind (often one of their candidates' ids): the
    fast path and the walk keep the same requests with the same baseline index and reject
    the others alike; a baseline that is not one of the request's candidate ids is a
    ``bad_baseline`` that names what came."""
    import streamlearn.events.candidates as decoder

    values = []
    for i, (candidates, baseline) in enumerate(requests):
        value: dict[str, Any] = {"id": f"r{i}", "x": [0.0, 1.0], "candidates": candidates}
        if isinstance(baseline, int) and not isinstance(baseline, bool) and baseline < len(
                candidates):
            baseline = candidates[baseline]["id"]  # a candidate's id (when it is a string)
        if baseline is not None:
            value["baseline"] = baseline
        values.append(value)
    messages = [message(v, i) for i, v in enumerate(values)]
    fast, fast_bad = decode_candidate_requests(messages, D_X, D_C)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decoder, "_dense_candidates", lambda *_: ([], None))
        walk, walk_bad = decode_candidate_requests(messages, D_X, D_C)
    assert fast.ids == walk.ids
    assert np.asarray(fast.baselines).tolist() == np.asarray(walk.baselines).tolist()
    assert [(r.event_id, r.reason, r.detail) for r in fast_bad] == \
        [(r.event_id, r.reason, r.detail) for r in walk_bad]
    for event_id, index in zip(fast.ids, np.asarray(fast.baselines).tolist(), strict=True):
        value = values[int(event_id[1:])]
        ids = [c["id"] for c in value["candidates"]]
        assert index == (ids.index(value["baseline"]) if "baseline" in value else -1)
    for r in fast_bad:
        if r.reason == "bad_baseline":
            value = values[int(str(r.event_id)[1:])]
            assert value["baseline"] not in [c["id"] for c in value["candidates"]] or \
                not isinstance(value["baseline"], str)
            assert r.detail == ("expected 'baseline' as the id of one of the request's "
                                f"candidates, got {shown(value['baseline'], 40)}")
            assert r.value == orjson.dumps(value)


@pytest.mark.parametrize("baseline", ["item-9", "", 0, 1.5, True, None, ["item-0"],
                                      {"id": "item-0"}])
def test_a_candidate_baseline_must_be_one_of_the_requests_candidate_ids(baseline: Any) -> None:
    value = {**good(9), "baseline": baseline}
    batch, bad = decode_candidate_requests([message(good(1)), message(value, 1)], D_X, D_C)
    if baseline is None:  # as no baseline
        assert bad == [] and np.asarray(batch.baselines).tolist() == [-1, -1]
        return
    assert batch.ids == ["r1"] and [b.reason for b in bad] == ["bad_baseline"]
    assert bad[0].detail == ("expected 'baseline' as the id of one of the request's candidates, "
                             f"got {shown(baseline, 40)}")
    assert bad[0].event_id == "r9" and bad[0].value == orjson.dumps(value)
    ok, _ = decode_candidate_requests([message({**good(9), "baseline": "item-2"})], D_X, D_C)
    assert np.asarray(ok.baselines).tolist() == [2]


def plain(i: int, n: int = 3) -> dict[str, Any]:
    """A request of the shape recommenders send: every candidate dense."""
    return {"id": f"r{i}", "x": [1.0, float(i)], "slots": 1,
            "candidates": [{"id": f"item-{k}", "x": [0.5, float(k), 2.0]} for k in range(n)]}


def _deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize("where", ["candidate entry", "shared entry", "candidate extra key",
                                   "request extra key", "slots", "hidden by a string"])
def test_deep_nesting_anywhere_in_a_request_is_refused_and_the_others_decode(where: str) -> None:
    """A plain request is not counted bracket by bracket (the count cost a tenth of its
    decode): whatever makes it not plain, or an entry that does not convert, is counted
    before anything can repr it. 1,010 levels pass orjson (it accepts 1,024) and would
    overflow Python's recursion limit in a rejection's repr."""
    deep = _deep(1010)
    head, tail = b'{"id":"r1","slots":1,', b"}"
    cand = b'{"id":"a","x":[0.5,1.0,2.0]}'
    if where == "candidate entry":
        body = b'"x":[1.0,2.0],"candidates":[' + cand + b',{"id":"b","x":[0.5,' + deep + b',2.0]}]'
    elif where == "shared entry":
        body = b'"x":[1.0,' + deep + b'],"candidates":[' + cand + b"]"
    elif where == "candidate extra key":
        body = b'"x":[1.0,2.0],"candidates":[{"id":"a","x":[0.5,1.0,2.0],"m":' + deep + b"}]"
    elif where == "request extra key":
        body = b'"x":[1.0,2.0],"m":' + deep + b',"candidates":[' + cand + b"]"
    elif where == "slots":
        head = b'{"id":"r1","slots":' + deep + b","
        body = b'"x":[1.0,2.0],"candidates":[' + cand + b"]"
    else:  # closing brackets in the id cannot cancel the count
        head = b'{"id":"' + b"]" * 200 + b'","slots":1,'
        body = b'"x":[1.0,2.0],"candidates":[' + cand + b',{"id":"b","x":[0.5,' + deep + b',2.0]}]'
    batch, bad = decode_candidate_requests(
        [message(plain(0)), message(head + body + tail, 1), message(plain(2), 2)], D_X, D_C)
    assert [r.reason for r in bad] == ["nesting_too_deep"]
    assert batch.ids == ["r0", "r2"]
    assert batch.sets.items.tolist() == [[0.5, float(k), 2.0] for k in range(3)] * 2


def test_a_million_levels_are_refused() -> None:
    _, bad = decode_candidate_requests([message(_deep(1_000_000))], D_X, D_C,
                                       DecodeLimits(max_message_bytes=1 << 22))
    assert [r.reason for r in bad] == ["nesting_too_deep"]


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 40), st.integers(0, 40), st.sampled_from(["candidate", "shared", "key"]))
def test_the_depth_limit_holds_on_plain_and_counted_requests_alike(
        limit: int, levels: int, where: str) -> None:
    """Refused exactly when the request nests deeper than the limit, whichever path
    (uncounted plain request or bracket count) decodes it."""
    nested: Any = 1.0
    for _ in range(levels):
        nested = [nested]
    request = plain(0)
    if where == "candidate":
        request["candidates"][1]["x"][1] = nested
    elif where == "shared":
        request["x"][1] = nested
    else:
        request["meta"] = nested
    depth = max(4, {"candidate": 4, "shared": 2, "key": 1}[where] + levels)
    _, bad = decode_candidate_requests([message(request)], D_X, D_C, DecodeLimits(max_depth=limit))
    reasons = [r.reason for r in bad]
    if depth > limit:
        assert reasons == ["nesting_too_deep"], (depth, limit)
    elif levels == 0 or where == "key":  # an unknown key is not read
        assert reasons == []
    else:
        assert reasons == ["bad_features"]
