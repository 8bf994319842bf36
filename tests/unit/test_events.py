"""Decoding instance and feedback values: every form, every reason, hostile bytes."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.events import (
    REASONS,
    DecodeLimits,
    decode_feedback,
    decode_instances,
)
from streamlearn.features import SparseBatch, hash_names
from streamlearn.transport.protocol import Message

D, K = 4, 3


def msgs(*values: bytes | None, topic: str = "instances") -> list[Message]:
    return [Message(topic, 0, i, b"k", v, 5_000) for i, v in enumerate(values)]


def inst(**fields: object) -> bytes:
    return orjson.dumps({"id": "e", "x": [1.0, 0.0, 2.0, 0.0], **fields})


def test_dense_batch_with_mask_labels_and_timestamps() -> None:
    batch, rejected = decode_instances(
        msgs(inst(id="a", label=2, ts=12.5), inst(id="b", actions=[0, 2])), D, K)
    assert rejected == []
    assert batch.ids == ["a", "b"]
    assert isinstance(batch.X, np.ndarray) and batch.X.shape == (2, D)
    assert batch.labels.tolist() == [2, -1]
    assert batch.ts.tolist() == [12.5, 5.0]  # the message timestamp when "ts" is absent
    assert batch.mask is not None
    assert batch.mask.tolist() == [[True, True, True], [True, False, True]]
    assert batch.offsets.tolist() == [0, 1]


def test_sparse_named_and_dense_rows_in_one_batch() -> None:
    values = msgs(inst(id="d"), inst(id="s", x={"idx": [2, 0], "val": [2.0, 1.0]}),
                  inst(id="n", x={"colour=red": 1.0, "size": 2.5}))
    batch, rejected = decode_instances(values, D, K)
    assert rejected == []
    assert isinstance(batch.X, SparseBatch)
    dense = batch.X.to_dense()
    assert dense[0].tolist() == [1.0, 0.0, 2.0, 0.0]
    assert dense[1].tolist() == [1.0, 0.0, 2.0, 0.0]
    expected = hash_names([{"colour=red": 1.0, "size": 2.5}], D).to_dense()[0]
    assert dense[2].tolist() == expected.tolist()


@pytest.mark.parametrize(("value", "reason"), [
    (b"\xff\xfe{", "invalid_utf8"),
    (b'{"id": "a", "x": [1, 2', "invalid_json"),
    (b'{"id": "a", "x": [NaN, 0, 0, 0]}', "invalid_json"),
    (None, "invalid_json"),
    (b"[1, 2, 3]", "not_object"),
    (b"[" * 100 + b"]" * 100, "nesting_too_deep"),
    (inst(id=""), "missing_id"),
    (orjson.dumps({"x": [0, 0, 0, 0]}), "missing_id"),
    (inst(id=7), "bad_id_type"),
    (inst(id="a" * 300), "id_too_long"),
    (inst(ts="yesterday"), "bad_timestamp"),
    (inst(x="1,2,3,4"), "bad_features"),
    (inst(x=[1, 2, 3]), "wrong_dimension"),
    (inst(x=[1, "a", 3, 4]), "bad_features"),
    (b'{"id": "e", "x": [1e999, 0, 0, 0]}', "invalid_json"),
    (inst(x={"idx": [0, 9], "val": [1.0, 1.0]}), "wrong_dimension"),
    (inst(x={"idx": [0, 1], "val": [1.0]}), "bad_features"),
    (inst(x={"idx": [0.5], "val": [1.0]}), "bad_features"),  # a float index is no dimension
    (inst(x={"idx": [[1]], "val": [[1.0]]}), "bad_features"),  # a nested list is no number
    (inst(x={"idx": [0, 1], "val": [[1.0], 2.0]}), "bad_features"),
    (inst(x={"colour=red": [1.0]}), "bad_features"),
    (b"null", "not_object"),
    (inst(x=[1e308, 0, 0, 0]), "value_out_of_range"),
    (inst(x=[0, -1e13, 0, 0]), "value_out_of_range"),
    (inst(x={"idx": [1], "val": [-1.7e308]}), "value_out_of_range"),
    (inst(x={"price": 3e200}), "value_out_of_range"),
    (inst(x={"a": "b"}), "bad_features"),
    (inst(actions=[]), "bad_actions"),
    (inst(actions=[0, 3]), "bad_actions"),
    (inst(actions=[-1]), "bad_actions"),
    (inst(label=5), "bad_label"),
    (inst(label=True), "bad_label"),
])
def test_each_bad_instance_gets_its_reason(value: bytes | None, reason: str) -> None:
    good = inst(id="good")
    batch, rejected = decode_instances(msgs(good, value, good.replace(b"good", b"ok")), D, K)
    assert [r.reason for r in rejected] == [reason]
    assert rejected[0].offset == 1 and rejected[0].value == value
    assert batch.ids == ["good", "ok"]  # valid neighbours are never lost


@pytest.mark.parametrize("x", [[1, "NaN", 0, 0], [1, "-inf", 0, 0],
                               {"idx": [1], "val": ["nan"]}, {"f": "inf"}])
def test_non_finite_values_never_reach_the_batch(x: object) -> None:
    # JSON has no NaN literal; numeric strings are the way one gets through a JSON encoder
    batch, rejected = decode_instances(msgs(inst(id="ok"), inst(x=x)), D, K)
    assert [r.reason for r in rejected] == ["non_finite"]
    assert batch.ids == ["ok"]


def test_size_limit_is_checked_before_parsing() -> None:
    huge = b'{"id": "a", "pad": "' + b"x" * 2000 + b'", "x": [0, 0, 0, 0]}'
    _, rejected = decode_instances(msgs(huge), D, K, DecodeLimits(max_message_bytes=1000))
    assert [r.reason for r in rejected] == ["too_large"]


def test_extremely_deep_nesting_is_refused_without_parsing() -> None:
    # orjson itself segfaults on ~10⁶ nested arrays: the depth check must come first
    deep = b"[" * 1_000_000 + b"]" * 1_000_000
    _, rejected = decode_instances(msgs(deep), D, K, DecodeLimits(max_message_bytes=1 << 22))
    assert [r.reason for r in rejected] == ["nesting_too_deep"]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=400) | st.text(alphabet='[]{}"\\a,:1 ', max_size=400).map(str.encode),
       st.integers(min_value=0, max_value=12))
def test_the_depth_check_counts_brackets_outside_strings_as_a_naive_scan_does(
        value: bytes, limit: int) -> None:
    from streamlearn.events.raw import depth_exceeds

    depth = deepest = backslashes = 0
    in_string = False
    for byte in value:  # the reference: one step per byte
        if byte == ord('"') and backslashes % 2 == 0:  # a quote not escaped opens or closes
            in_string = not in_string
        elif not in_string:
            depth += (byte in b"[{") - (byte in b"]}")
            deepest = max(deepest, depth)
        # (a backslash outside a string is invalid JSON: orjson stops there, before any
        # nesting after it, so treating it as an escape there too only errs on the safe side)
        backslashes = backslashes + 1 if byte == ord("\\") else 0
    assert depth_exceeds(value, limit) == (deepest > limit)


@pytest.mark.parametrize(("value", "detail"), [
    (b"\xff\xfe{", "expected UTF-8, got byte 0xff at offset 0 (invalid start byte)"),
    (b'{"id": "a\xed\xa0\x80"}', "expected UTF-8, got byte 0xed at offset 9 (invalid continuation byte)"),
    (b'\xef\xbb\xbf{"id": "a"}', "UTF-8 byte order mark (BOM) is not supported"),
])
def test_invalid_utf8_says_where(value: bytes, detail: str) -> None:
    """orjson reports every bad byte as "surrogates not allowed" at char 0."""
    _, rejected = decode_instances(msgs(value), D, K)
    assert [r.reason for r in rejected] == ["invalid_utf8"]
    assert rejected[0].detail.startswith(detail)


@pytest.mark.parametrize("field", ["label", "ts", "actions", "x"])
def test_closing_brackets_in_a_string_do_not_hide_deep_nesting(field: str) -> None:
    """A string of ']' used to cancel the bracket count, letting 1,010 levels reach orjson (it
    accepts 1,024) and then overflow Python's recursion limit in the rejection's repr."""
    deep = b"[" * 1010 + b"]" * 1010
    value = b'{"pad": "' + b"]" * 1010 + b'", "id": "e1", "' + field.encode() + b'": ' + deep
    value += b', "x": [1, 1, 1, 1]}' if field != "x" else b"}"
    _, rejected = decode_instances(msgs(value), D, K)
    assert [r.reason for r in rejected] == ["nesting_too_deep"]


def test_brackets_inside_strings_are_no_nesting() -> None:
    value = orjson.dumps({"id": "[" * 40 + "{" * 40, "x": [1, 2, 3, 4], "note": '\\"[[[' * 20})
    batch, rejected = decode_instances(msgs(value), D, K)
    assert rejected == [] and batch.ids == ["[" * 40 + "{" * 40]


@pytest.mark.parametrize(("value", "reason"), [
    (orjson.dumps({"id": "a", "reward": 1.5}), "bad_reward"),
    (orjson.dumps({"id": "a", "reward": -0.1}), "bad_reward"),
    (orjson.dumps({"id": "a", "reward": "1"}), "bad_reward"),
    (orjson.dumps({"id": "a", "reward": True}), "bad_reward"),
    (orjson.dumps({"id": "a"}), "bad_reward"),
    (orjson.dumps({"reward": 1.0}), "missing_id"),
    (b"not json", "invalid_json"),
    (orjson.dumps({"id": "a", "reward": 1.0, "type": 3}), "bad_feedback_type"),
    (orjson.dumps({"id": "a", "reward": 1.0, "type": ["click"]}), "bad_feedback_type"),
    (orjson.dumps({"id": "a", "reward": 1.0, "type": ""}), "bad_feedback_type"),
    (orjson.dumps({"id": "a", "reward": 1.0, "type": "c" * 65}), "bad_feedback_type"),
])
def test_bad_feedback(value: bytes, reason: str) -> None:
    good = orjson.dumps({"id": "b", "reward": 1, "ts": 3.0})
    batch, rejected = decode_feedback(msgs(value, good, topic="feedback"))
    assert [r.reason for r in rejected] == [reason]
    assert batch.ids == ["b"] and batch.rewards.tolist() == [1.0] and batch.ts.tolist() == [3.0]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.sampled_from(["id", "x", "idx", "val", "actions", "label", "ts",
                                       "reward", "a"]), children, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()), max_size=8))
def test_arbitrary_input_is_accepted_or_rejected_never_raises(values: list[bytes]) -> None:
    messages = msgs(*values)
    batch, rejected = decode_instances(messages, D, K)
    assert len(batch) + len(rejected) == len(messages)
    assert {r.reason for r in rejected} <= set(REASONS)
    X = batch.X.to_dense() if isinstance(batch.X, SparseBatch) else batch.X
    assert X.shape == (len(batch), D) and np.isfinite(X).all()
    fb, fb_rejected = decode_feedback(messages)
    assert len(fb) + len(fb_rejected) == len(messages)
    assert np.all((fb.rewards >= 0) & (fb.rewards <= 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(-999999995904.0, 999999995904.0, width=32), min_size=D, max_size=D),
                min_size=1, max_size=6))
def test_valid_dense_rows_round_trip_exactly(rows: list[list[float]]) -> None:
    values = [orjson.dumps({"id": f"e{i}", "x": r}) for i, r in enumerate(rows)]
    batch, rejected = decode_instances(msgs(*values), D, K)
    assert rejected == []
    assert np.array_equal(np.asarray(batch.X), np.array(rows, dtype=np.float64))


@pytest.mark.parametrize(("x", "reason", "detail"), [
    ([1.0, 2.0, 1e308, 0.0], "value_out_of_range",
     "x[2] = 1e+308 is beyond ±1e+12 (limits.max_abs_feature)"),
    ({"idx": [3, 1], "val": [1.0, 5e15]}, "value_out_of_range",
     "x.val[1] (feature 1) = 5e+15 is beyond ±1e+12 (limits.max_abs_feature)"),
    ({"price": 1.0, "count": -2e13}, "value_out_of_range",
     'x["count"] = -2e+13 is beyond ±1e+12 (limits.max_abs_feature)'),
    ([9e11, 9e11, 0.0, 0.0], "value_out_of_range",
     "the squared norm of x, 1.62e+24, exceeds 1e+24 (limits.max_row_squared_norm)"),
    ({"idx": [1.5], "val": [1.0]}, "bad_features", "x.idx[0] = 1.5 is not an integer index"),
    ({"idx": [0, 7], "val": [1.0, 1.0]}, "wrong_dimension",
     "x.idx[1] = 7 is outside the 4 features [0, 4)"),
    ([1, 2, 3], "wrong_dimension", "expected 4 features in the dense 'x', got 3"),
    ([1, "a", 3, 4], "bad_features", 'x[1] is not a number: "a"'),
    ([1, "nan", 3, 4], "non_finite", 'x[1] is "nan": expected a finite number'),
    ([1, 2, "-Infinity", 4], "non_finite", 'x[2] is "-Infinity": expected a finite number'),
])
def test_dead_letter_details_say_what_was_wrong(x: object, reason: str, detail: str) -> None:
    limits = DecodeLimits(max_row_squared_norm=1e24)
    _, rejected = decode_instances(msgs(inst(x=x)), D, K, limits)
    assert [(r.reason, r.detail) for r in rejected] == [(reason, detail)]


extreme = st.sampled_from([1e308, -1e308, 1.7976931348623157e308, 5e-324, 1e-320, -0.0, 0.0,
                           1e12, -1e12, 1e12 * (1 + 1e-15), 3.0, 1e200])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(extreme | st.floats(allow_nan=False, allow_infinity=False),
                         min_size=D, max_size=D), min_size=1, max_size=6),
       st.sampled_from(["dense", "sparse", "named"]))
def test_accepted_rows_are_always_within_the_limits(rows: list[list[float]], form: str) -> None:
    def x_of(row: list[float]) -> object:
        if form == "dense":
            return row
        if form == "sparse":
            return {"idx": list(range(D)), "val": row}
        return {f"f{i}": v for i, v in enumerate(row)}
    limits = DecodeLimits()
    values = [orjson.dumps({"id": f"e{i}", "x": x_of(r)}) for i, r in enumerate(rows)]
    batch, rejected = decode_instances(msgs(*values), D, K, limits)
    X = batch.X.to_dense() if isinstance(batch.X, SparseBatch) else np.asarray(batch.X)
    assert np.all(np.abs(X) <= limits.max_abs_feature)
    assert np.all((X ** 2).sum(axis=1) <= limits.max_row_squared_norm * (1 + 1e-12))
    for r in rejected:
        assert r.reason == "value_out_of_range" and r.detail
    within = [all(abs(v) <= limits.max_abs_feature for v in r) and sum(v * v for v in r)
              <= limits.max_row_squared_norm for r in rows]
    assert len(batch) == sum(within)


# sums of these are exact in float64, so the oracle below and the decoder cannot round apart
summable = st.sampled_from([1e12, -1e12, 6e11, -6e11, 4e11, 3.0, 0.0, -2.0])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, D - 1), summable), min_size=1, max_size=12),
                min_size=1, max_size=6),
       st.sampled_from(["sparse", "named"]), st.sampled_from(["alone", "mixed"]))
def test_repeated_features_are_within_the_limits_once_added_up(
        rows: list[list[tuple[int, float]]], form: str, batch_form: str) -> None:
    """Entries at one index (repeated sparse indices, named features that hash into one bucket)
    add up in the row the learner sees: every entry within ±max_abs_feature must not let 30
    of 10¹² at index 0 through (found by an outside client). Accepted rows are within the
    limits as the learner sees them; a row is refused exactly when an entry or that row is
    not, always as value_out_of_range with a detail."""
    limits = DecodeLimits(max_row_squared_norm=1.5e24)

    def x_of(row: list[tuple[int, float]]) -> object:
        if form == "sparse":
            return {"idx": [i for i, _ in row], "val": [v for _, v in row]}
        return {f"name{n}:{i}": v for n, (i, v) in enumerate(row)}  # distinct names, 4 buckets

    def seen(row: list[tuple[int, float]]) -> np.ndarray:
        if form == "sparse":
            out = np.zeros(D)
            np.add.at(out, [i for i, _ in row], [v for _, v in row])
            return out
        return hash_names([x_of(row)], D).to_dense()[0]  # type: ignore[list-item]

    values = [orjson.dumps({"id": f"e{n}", "x": x_of(r)}) for n, r in enumerate(rows)]
    if batch_form == "mixed":  # a dense row takes the batch down the mixed path
        values.append(inst(id="dense"))
    batch, rejected = decode_instances(msgs(*values), D, K, limits)
    X = batch.X.to_dense() if isinstance(batch.X, SparseBatch) else np.asarray(batch.X)
    assert np.all(np.abs(X) <= limits.max_abs_feature)
    assert np.all((X ** 2).sum(axis=1) <= limits.max_row_squared_norm)
    for r in rejected:
        assert r.reason == "value_out_of_range" and r.detail
    within = [sum(v * v for _, v in r) <= limits.max_row_squared_norm
              and bool(np.all(np.abs(seen(r)) <= limits.max_abs_feature))
              and float((seen(r) ** 2).sum()) <= limits.max_row_squared_norm for r in rows]
    kept = [f"e{n}" for n, ok in enumerate(within) if ok] + (["dense"] if batch_form == "mixed"
                                                             else [])
    assert batch.ids == kept


@pytest.mark.parametrize(("x", "detail"), [
    ({"idx": [0] * 30, "val": [1e12] * 30},
     "x's 30 entries at feature 0 add up to 3e+13, beyond ±1e+12 (limits.max_abs_feature)"),
    ({"idx": [2, 2], "val": [1e12, 1e12]},
     "x's 2 entries at feature 2 add up to 2e+12, beyond ±1e+12 (limits.max_abs_feature)"),
    ({"idx": [0, 0, 1, 1], "val": [8e11, 8e11, 8e11, 8e11]}, "value_out_of_range"),
])
def test_repeated_features_beyond_the_limits_say_where(x: object, detail: str) -> None:
    limits = DecodeLimits(max_abs_feature=2e12, max_row_squared_norm=4e24) \
        if detail == "value_out_of_range" else DecodeLimits()
    _, rejected = decode_instances(msgs(inst(x=x)), D, K, limits)
    [r] = rejected
    assert r.reason == "value_out_of_range"
    if detail == "value_out_of_range":  # (1.6e12)² · 2 = 5.12e24 > 4e24, each feature within
        assert r.detail == ("the squared norm of x with its repeated features added up, 5.12e+24, "
                            "exceeds 4e+24 (limits.max_row_squared_norm)")
    else:
        assert r.detail == detail


def test_label_minus_one_is_no_label_as_documented() -> None:
    """docs/daemon.md: ``-1`` is a producer's "no label", like a missing one; -2 and K are not."""
    batch, rejected = decode_instances(msgs(inst(id="a", label=-1), inst(id="b"), inst(id="c", label=-2),
                                            inst(id="d", label=K)), D, K)
    assert batch.ids == ["a", "b"] and batch.labels.tolist() == [-1, -1]
    assert [(r.event_id, r.reason) for r in rejected] == [("c", "bad_label"), ("d", "bad_label")]


def test_a_null_ts_is_the_message_timestamp_as_documented() -> None:
    """docs/daemon.md: ``"ts": null`` is as a missing ``ts`` (instances and feedback alike)."""
    batch, rejected = decode_instances(msgs(inst(id="a", ts=None)), D, K)
    assert rejected == [] and batch.ts.tolist() == [5.0]
    feedback, bad = decode_feedback(msgs(orjson.dumps({"id": "a", "reward": 1.0, "ts": None}),
                                         topic="feedback"))
    assert bad == [] and feedback.ts.tolist() == [5.0]


def test_a_feedback_type_is_kept_and_a_bad_one_says_what_was_expected() -> None:
    from streamlearn.events.candidate_feedback import decode_candidate_feedback

    values = [orjson.dumps({"id": "a", "reward": 1, "type": "click"}),
              orjson.dumps({"id": "b", "reward": 0.5, "type": None}),
              orjson.dumps({"id": "c", "reward": 0.5}),
              orjson.dumps({"id": "d", "reward": 0.5, "type": "c" * 64, "pad": [[1]]}),  # slow path
              orjson.dumps({"id": "e", "reward": 0.5, "type": "c" * 65}),
              orjson.dumps({"id": "f", "reward": 0.5, "type": 7.5})]
    batch, rejected = decode_feedback(msgs(*values, topic="feedback"))
    assert batch.ids == ["a", "b", "c", "d"]
    assert batch.types == ["click", None, None, "c" * 64]
    expected = "expected 'type' as a string of 1 to 64 characters, got "
    assert [(r.reason, r.detail, r.event_id) for r in rejected] == [
        ("bad_feedback_type", expected + "a string of 65 characters", "e"),
        ("bad_feedback_type", expected + "float 7.5", "f")]
    requests, bad = decode_candidate_feedback(msgs(
        orjson.dumps({"id": "r", "rewards": {"x": 1.0}, "type": "conversion"}),
        orjson.dumps({"id": "s", "reward": 1.0}),
        orjson.dumps({"id": "t", "reward": 1.0, "type": {"a": 1}}), topic="feedback"))
    assert requests.ids == ["r", "s"] and requests.types == ["conversion", None]
    assert [(r.reason, r.detail) for r in bad] == [("bad_feedback_type", expected + 'dict {"a":1}')]
    _, bad = decode_candidate_feedback(msgs(orjson.dumps({"id": "u", "rewards": {"k" * 300: 1.0}}),
                                            topic="feedback"))
    assert [r.reason for r in bad] == ["bad_reward"]
    assert 'got "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk… (300 characters): 1.0' in bad[0].detail


@pytest.mark.parametrize("levels", [33, 100, 1010])
def test_feedback_nested_past_the_limit_is_refused_with_its_depth(levels: int) -> None:
    """Another key's value on a feedback event is counted too: its fast path used to accept
    any depth orjson parses (an outside test: 100 levels joined)."""
    from streamlearn.events.feedback import decode_feedback

    deep = b'{"id": "v1", "reward": 1, "meta": ' + b"[" * levels + b"]" * levels + b"}"
    plain = b'{"id": "v2", "reward": 1, "ts": 3, "type": "click", "meta": [[1]]}'
    batch, rejected = decode_feedback(msgs(deep, plain))
    assert batch.ids == ["v2"]
    assert [(r.reason, r.detail) for r in rejected] == [
        ("nesting_too_deep", f"expected nesting depth <= 32, got {levels + 1}")]
