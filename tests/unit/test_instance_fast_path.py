"""The instance decoder's fast path (parse, convert each dense row as it is parsed, count
brackets only when needed) decides every message exactly as the full checks do: a plain
reference decodes each message through ``_row`` (size, depth, JSON, id, ts, form, actions,
label, baseline), converts the kept rows' lists in one batch and explains each refused row."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamlearn.events import instances
from streamlearn.events.payload import explain, feature_batch
from streamlearn.events.raw import DecodeLimits, Reject, Rejection, shown
from streamlearn.features import SparseBatch
from streamlearn.transport.protocol import Message

D, K = 4, 3


def reference_decode(messages: list[Message], limits: DecodeLimits
                     ) -> tuple[list[str], Any, list[int], list[tuple[int, str, str]], list[int]]:
    """(ids, features, labels, rejections, baselines) of the full checks alone, rows converted
    from lists."""
    kept, refused = [], []
    for msg in messages:
        try:
            kept.append(instances._row(msg, D, K, limits))
        except Reject as err:
            refused.append(err.of(msg))
    ok, X = feature_batch([(r.form, r.payload) for r in kept], D, limits)  # list payloads
    for r, good in zip(kept, ok.tolist(), strict=True):
        if not good:
            reason, detail = explain(r.form, r.payload, D, limits)
            refused.append(Reject(reason, detail, r.event_id).of(r.msg))
    rows = [r for r, good in zip(kept, ok.tolist(), strict=True) if good]
    return ([r.event_id for r in rows], X, [r.label for r in rows], _origins(refused),
            [r.baseline for r in rows])


def _origins(rejections: list[Rejection]) -> list[tuple[int, str, str]]:
    return sorted((r.offset, r.reason, r.detail) for r in rejections)


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"1" + b"]" * depth


scalars = st.one_of(st.floats(-1e13, 1e13), st.integers(-2**63, 2**64 - 1), st.booleans(), st.none(),
                    st.sampled_from(["1.5", "-2", "abc", "", "1e400", "NaN"]))
entries = st.one_of(scalars, scalars, scalars, st.lists(scalars, max_size=2),
                    st.dictionaries(st.sampled_from(["a"]), scalars, max_size=1))
ids = st.one_of(st.text(min_size=1, max_size=6),
                st.sampled_from(["[[[[", "]]]]", '"', "\\", "e\\\"[{", "{" * 40, "😀[]"]),
                st.integers(0, 3))
xs = st.one_of(
    st.lists(st.floats(-10, 10), min_size=D, max_size=D),  # the common case, often
    st.lists(st.floats(-10, 10), min_size=D, max_size=D),
    st.lists(entries, min_size=D, max_size=D),
    st.lists(entries, max_size=D + 1),
    st.fixed_dictionaries({"idx": st.lists(st.one_of(st.integers(-1, D), entries), max_size=3),
                           "val": st.lists(entries, max_size=3)}),
    st.dictionaries(st.sampled_from(["a", "b"]), entries, max_size=2))
objects = st.fixed_dictionaries(
    {"id": ids, "x": xs},
    optional={"ts": st.one_of(st.floats(0, 2e9), st.text(max_size=2), st.none()),
              "label": st.one_of(st.integers(-2, K), st.booleans(), st.just("1")),
              "actions": st.lists(st.integers(-1, K), max_size=2),
              "baseline": st.one_of(st.integers(-2, K + 1), st.integers(-1, K + 1),
                                    st.integers(-2**63, 2**64 - 1), st.booleans(), st.none(),
                                    st.floats(-2, K + 1), st.sampled_from(["1", "", "NaN"]),
                                    st.lists(st.integers(0, K), max_size=2),
                                    st.dictionaries(st.sampled_from(["a"]), scalars, max_size=1)),
              "meta": st.one_of(scalars, st.lists(st.lists(scalars, max_size=2), max_size=2))})


@st.composite
def values(draw: st.DrawFn) -> bytes | None:
    """A JSON instance, one with a deep entry inside ``x`` or in another key, or junk."""
    kind = draw(st.integers(0, 9))
    if kind <= 5:
        return orjson.dumps(draw(objects))
    depth = draw(st.sampled_from([2, 3, 31, 32, 33, 40, 1000, 1100]))
    if kind == 6:  # a deep entry among dense numbers
        return b'{"id":"deep","x":[' + _nested(depth) + b',0,0,0]}'
    if kind == 7:  # a deep sparse value
        return b'{"id":"deep","x":{"idx":[0],"val":[' + _nested(depth) + b']}}'
    if kind == 8:  # deep nesting in another key, valid features
        return b'{"id":"deep","meta":' + _nested(depth) + b',"x":[0,1,2,3]}'
    return draw(st.one_of(st.binary(max_size=20), st.none()))


@settings(max_examples=600, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.lists(values(), max_size=12), max_depth=st.sampled_from([1, 2, 3, 32]))
def test_the_fast_path_decides_every_message_as_the_full_checks_do(
        raw: list[bytes | None], max_depth: int) -> None:
    limits = DecodeLimits(max_depth=max_depth)
    messages = [Message("instances", 0, i, b"k", v, 1_700_000_000_000 + i) for i, v in enumerate(raw)]
    batch, refused = instances.decode_instances(messages, D, K, limits)
    ids, X, labels, reference_refused, baselines = reference_decode(messages, limits)
    assert batch.ids == ids
    assert batch.labels.tolist() == labels
    assert np.asarray(batch.baselines).tolist() == baselines
    assert _origins(refused) == reference_refused
    assert isinstance(batch.X, SparseBatch) == isinstance(X, SparseBatch)
    if isinstance(X, SparseBatch) and isinstance(batch.X, SparseBatch):
        for name in ("indptr", "indices", "values"):
            np.testing.assert_array_equal(getattr(batch.X, name), getattr(X, name))
    else:
        np.testing.assert_array_equal(batch.X, X)


def test_a_dense_row_of_the_wrong_length_is_a_caller_error_not_a_broadcast() -> None:
    from streamlearn.events.payload import DenseRows

    rows = DenseRows(capacity=1, width=3)
    try:
        rows.add([5.0])
    except ValueError as err:
        assert "3 entries, got 1" in str(err)
    else:
        raise AssertionError("a 1-entry row was broadcast over 3 features")


_ENTRY = st.one_of(
    st.floats(allow_nan=False), st.integers(), st.booleans(),
    st.integers(min_value=-(2 ** 80), max_value=2 ** 80),  # beyond int64: numpy's object route
    st.integers(min_value=-(2 ** 1100), max_value=2 ** 1100),  # beyond float64: refused
    st.sampled_from(["1.5", "-2e3", "x", "", None, [1.0], {"a": 1}]))


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.lists(_ENTRY, min_size=3, max_size=3), min_size=1, max_size=6))
def test_a_dense_row_converts_exactly_as_numpy_converts_the_list(rows: list[list[object]]) -> None:
    """DenseRows packs numbers with ``struct`` and leaves anything else to numpy: every row,
    numbers or not, ends as ``np.array(row, dtype=np.float64)`` makes it, or flagged."""
    from streamlearn.events.payload import DenseRows

    dense = DenseRows(capacity=len(rows), width=3)
    for i, row in enumerate(rows):
        assert dense.add(row) == i
    for i, row in enumerate(rows):
        try:
            expected = np.array(row, dtype=np.float64)
        except (ValueError, TypeError, OverflowError):
            assert not dense.numeric[i] and not dense.block[i].any()
            continue
        assert dense.numeric[i]
        np.testing.assert_array_equal(dense.block[i], expected)  # NaN (null) equal to NaN
        assert np.signbit(dense.block[i]).tolist() == np.signbit(expected).tolist()  # -0.0


def test_the_installed_orjson_refuses_deep_nesting_instead_of_crashing() -> None:
    """The fast path parses a plain dense instance before counting its brackets, which is
    safe only because orjson >= 3.9.15 refuses > 1,024 levels (3.9.0-3.9.14 segfault on
    10^6: the reason for the pin in pyproject.toml). In a subprocess: a crash fails here."""
    import subprocess
    import sys

    code = ("import orjson\n"
            "deep = b'{\"id\":\"a\",\"x\":' + b'[' * 10**6 + b']' * 10**6 + b'}'\n"
            "try:\n    orjson.loads(deep)\nexcept orjson.JSONDecodeError:\n    print('refused')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "refused", (done.returncode, done.stderr)


class Huge(str):
    """An integer literal too long for orjson to write (``orjson.dumps`` refuses > 64 bits)."""


#: baselines that are no action of a K-action deployment, and what the detail must show of each
bad_baselines = st.one_of(
    st.integers(K, 2**64 - 1), st.integers(-2**63, -1), st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
    st.lists(st.integers(0, K - 1), min_size=0, max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(0, K - 1), max_size=2),
    st.integers(2**64, 10**30).map(str).map(Huge))  # beyond 64 bits: read as a float



@settings(max_examples=300, deadline=None, derandomize=True)
@given(baseline=bad_baselines, sparse=st.booleans(), with_actions=st.booleans(),
       neighbours=st.integers(0, 3))
def test_every_bad_baseline_is_a_bad_baseline_rejection_that_keeps_the_whole_event(
        baseline: Any, sparse: bool, with_actions: bool, neighbours: int) -> None:
    """An otherwise valid instance with a baseline that is no action: a ``bad_baseline`` dead
    letter whose detail says what was expected and what came, carrying the event's id, key,
    place and bytes unchanged; the valid instances around it are decided as usual."""
    x: Any = {"idx": [0, 2], "val": [1.0, -2.0]} if sparse else [0.5, 1.0, -1.0, 2.0]
    obj = {"id": "bad", "x": x, "baseline": baseline, "label": 1}
    if with_actions:
        obj["actions"] = [0, 2]
    value = orjson.dumps(obj)
    if isinstance(baseline, Huge):  # the literal itself, not a string
        value = value.replace(orjson.dumps(str(baseline)), str(baseline).encode())
    good = [orjson.dumps({"id": f"g{i}", "x": [0.0, 1.0, 2.0, 3.0], "baseline": i % K})
            for i in range(neighbours)]
    messages = [Message("instances", 1, 10 + i, f"k{i}".encode(), v, 1_700_000_000_000)
                for i, v in enumerate([*good, value])]
    batch, refused = instances.decode_instances(messages, D, K)
    assert batch.ids == [f"g{i}" for i in range(neighbours)]
    assert np.asarray(batch.baselines).tolist() == [i % K for i in range(neighbours)]
    assert len(refused) == 1
    r = refused[0]
    assert r.reason == "bad_baseline", r
    assert r.detail.startswith(f"expected 'baseline' as an integer action in [0, {K}), got ")
    got = orjson.loads(value)["baseline"]  # as the daemon read it
    assert r.detail.endswith(f"got {shown(got, 40)}"), (r.detail, got)
    assert (r.event_id, r.value, r.key, r.topic, r.partition, r.offset) == (
        "bad", value, f"k{neighbours}".encode(), "instances", 1, 10 + neighbours)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(baseline=st.integers(0, K - 1), actions=st.lists(st.integers(0, K - 1), min_size=1,
                                                        max_size=3, unique=True))
def test_a_baseline_outside_the_events_actions_is_a_bad_baseline(baseline: int,
                                                                 actions: list[int]) -> None:
    value = orjson.dumps({"id": "a", "x": [1.0, 2.0, 3.0, 4.0], "actions": actions,
                          "baseline": baseline})
    batch, refused = instances.decode_instances(
        [Message("instances", 0, 0, b"a", value, 1_700_000_000_000)], D, K)
    if baseline in actions:
        assert refused == [] and np.asarray(batch.baselines).tolist() == [baseline]
        return
    assert [r.reason for r in refused] == ["bad_baseline"] and batch.ids == []
    assert refused[0].detail == (f"expected 'baseline' among the event's actions {shown(actions, 60)}, "
                                 f"got {baseline}")
    assert refused[0].event_id == "a" and refused[0].value == value


def test_a_baseline_of_null_is_no_baseline() -> None:
    values = [orjson.dumps({"id": "n", "x": [1.0, 2.0, 3.0, 4.0], "baseline": None}),
              orjson.dumps({"id": "m", "x": [1.0, 2.0, 3.0, 4.0]})]
    batch, refused = instances.decode_instances(
        [Message("instances", 0, i, None, v, 1_700_000_000_000) for i, v in enumerate(values)],
        D, K)
    assert refused == [] and np.asarray(batch.baselines).tolist() == [-1, -1]
