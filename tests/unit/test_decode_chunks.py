"""Decoding a poll in chunks (streamlearn.events.chunks) gives the batch and the rejections of
decoding it whole: the same rows in the same order, the same features, masks and origins."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.events import chunks as chunking
from streamlearn.events.candidates import CandidateRequests, decode_candidate_requests
from streamlearn.events.instances import InstanceBatch, decode_instances
from streamlearn.features import SparseBatch, concat_rows
from streamlearn.transport.protocol import Message

D, K, D_X, D_C = 4, 3, 2, 3


def message(value: bytes | None, offset: int) -> Message:
    return Message("t", offset % 2, offset, f"k{offset}".encode(), value, 1_700_000_000_000 + offset)


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.one_of(st.none(), st.integers(0, 3000)), max_size=40),
       limit=st.integers(1, 5000))
def test_chunks_cover_the_messages_in_order_and_close_at_the_limit(
        lengths: list[int | None], limit: int) -> None:
    messages = [message(None if n is None else b"x" * n, i) for i, n in enumerate(lengths)]
    parts = chunking.chunks(messages, limit)
    assert [m for part in parts for m in part] == messages
    assert all(part for part in parts) or parts == [messages] == [[]]
    for part in parts:  # a chunk closes at the message that reaches its limit, not later
        assert sum(len(m.value or b"") for m in part[:-1]) < limit
    total = sum(n or 0 for n in lengths)
    assert len(parts) <= total // limit + 2


def _valid_x(d: int) -> st.SearchStrategy[Any]:
    """Dense, sparse or named features of dimension d that the decoders accept."""
    return st.one_of(
        st.lists(st.floats(-1e3, 1e3), min_size=d, max_size=d),
        st.lists(st.tuples(st.integers(0, d - 1), st.floats(-5, 5)), max_size=3).map(
            lambda pairs: {"idx": [i for i, _ in pairs], "val": [v for _, v in pairs]}),
        st.dictionaries(st.sampled_from(["a", "b=1", "ü", "😀"]), st.floats(-5, 5), max_size=3))


def _hostile_x(d: int) -> st.SearchStrategy[Any]:
    """Features the decoders reject (or accept at the edges)."""
    return st.one_of(
        st.lists(st.one_of(st.floats(-1e13, 1e13), st.integers(-3, 3)), min_size=d, max_size=d),
        st.lists(st.floats(-2, 2), max_size=d + 1),
        st.fixed_dictionaries({"idx": st.lists(st.integers(-1, d), max_size=3),
                               "val": st.lists(st.floats(-5, 5), max_size=3)}),
        st.just([0.0, -0.0, 1e300][:d] + [0.0] * max(0, d - 3)))


valid_instances = st.fixed_dictionaries(
    {"id": st.text(min_size=1, max_size=4), "x": _valid_x(D)},
    optional={"actions": st.lists(st.integers(0, K - 1), min_size=1, max_size=3),
              "label": st.integers(-1, K - 1), "ts": st.floats(0, 2e9)})
hostile_instances = st.fixed_dictionaries(
    {"id": st.one_of(st.text(max_size=4), st.integers(0, 3)), "x": _hostile_x(D)},
    optional={"actions": st.lists(st.integers(-1, K), max_size=3),
              "label": st.integers(-2, K), "ts": st.one_of(st.floats(0, 2e9), st.text(max_size=2))})
# valid instances three times out of six, so that most polls keep rows in several chunks
values = st.one_of(*[valid_instances.map(orjson.dumps)] * 3, hostile_instances.map(orjson.dumps),
                   st.binary(max_size=30), st.none())


def _instances_equal(a: InstanceBatch, b: InstanceBatch) -> None:
    assert a.ids == b.ids and a.messages == b.messages
    assert isinstance(a.X, SparseBatch) == isinstance(b.X, SparseBatch)
    if isinstance(a.X, SparseBatch) and isinstance(b.X, SparseBatch):
        for name in ("indptr", "indices", "values"):
            np.testing.assert_array_equal(getattr(a.X, name), getattr(b.X, name))
    else:
        np.testing.assert_array_equal(a.X, b.X)
    assert (a.mask is None) == (b.mask is None)
    if a.mask is not None:
        np.testing.assert_array_equal(a.mask, b.mask)  # type: ignore[arg-type]
    for name in ("labels", "ts", "partitions", "offsets"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def _whole_and_chunked(decode: Any, messages: list[Message], limit: int,
                       monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    monkeypatch.setattr(chunking, "CHUNK_BYTES", 10**12)
    whole = decode(messages)
    monkeypatch.setattr(chunking, "CHUNK_BYTES", limit)
    return whole, decode(messages)


def _origins(rejections: list[Any]) -> list[tuple[int, str, str]]:
    return sorted((r.offset, r.reason, r.detail) for r in rejections)


@settings(max_examples=300, deadline=None)
@given(raw=st.lists(values, max_size=12), limit=st.integers(1, 400))
def test_instances_decoded_in_chunks_equal_the_poll_decoded_whole(
        raw: list[bytes | None], limit: int) -> None:
    messages = [message(v, i) for i, v in enumerate(raw)]
    with pytest.MonkeyPatch.context() as patch:
        (whole, whole_bad), (chunked, chunked_bad) = _whole_and_chunked(
            lambda m: decode_instances(m, D, K), messages, limit, patch)
    _instances_equal(whole, chunked)
    assert _origins(whole_bad) == _origins(chunked_bad)


valid_candidates = st.fixed_dictionaries({"id": st.text(min_size=1, max_size=3),
                                          "x": _valid_x(D_C)})
hostile_candidates = st.fixed_dictionaries({"id": st.one_of(st.text(max_size=3), st.integers(0, 2)),
                                            "x": _hostile_x(D_C)})
valid_requests = st.fixed_dictionaries(
    {"id": st.text(min_size=1, max_size=4), "x": st.lists(st.floats(-3, 3), min_size=D_X,
                                                          max_size=D_X),
     "candidates": st.lists(valid_candidates, min_size=1, max_size=4,
                            unique_by=lambda c: c["id"])})
hostile_requests = st.fixed_dictionaries(
    {"id": st.text(max_size=4), "candidates": st.lists(
        st.one_of(valid_candidates, hostile_candidates), max_size=4)},
    optional={"x": st.lists(st.floats(-3, 3), max_size=D_X + 1), "slots": st.integers(0, 3)})
requests = st.one_of(*[valid_requests] * 3, hostile_requests)


@settings(max_examples=300, deadline=None)
@given(raw=st.lists(st.one_of(requests.map(orjson.dumps), st.binary(max_size=20)), max_size=10),
       limit=st.integers(1, 600))
def test_candidate_requests_decoded_in_chunks_equal_the_poll_decoded_whole(
        raw: list[bytes], limit: int) -> None:
    messages = [message(v, i) for i, v in enumerate(raw)]
    with pytest.MonkeyPatch.context() as patch:
        (whole, whole_bad), (chunked, chunked_bad) = _whole_and_chunked(
            lambda m: decode_candidate_requests(m, D_X, D_C), messages, limit, patch)
    assert isinstance(whole, CandidateRequests) and isinstance(chunked, CandidateRequests)
    assert (whole.ids, whole.candidate_ids, whole.messages) == \
        (chunked.ids, chunked.candidate_ids, chunked.messages)
    for name in ("context", "items", "offsets"):
        np.testing.assert_array_equal(getattr(whole.sets, name), getattr(chunked.sets, name))
    for name in ("slots", "ts", "partitions"):
        np.testing.assert_array_equal(getattr(whole, name), getattr(chunked, name))
    assert _origins(whole_bad) == _origins(chunked_bad)


def test_a_large_poll_is_decoded_in_several_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default chunk size splits a poll of 500 dense 400-feature instances (~1.6 MB)."""
    row = orjson.dumps({"id": "e", "x": [0.123456789] * 400})
    messages = [message(row, i) for i in range(500)]
    sizes: list[int] = []
    original = chunking.chunks
    monkeypatch.setattr(chunking, "chunks",
                        lambda m, limit: sizes.extend(map(len, original(m, limit))) or
                        original(m, limit))
    batch, bad = decode_instances(messages, 400, 2)
    assert bad == [] and len(batch) == 500 and batch.offsets.tolist() == list(range(500))
    assert len(sizes) >= 500 * len(row) // chunking.CHUNK_BYTES and sum(sizes) == 500
    # the chunks' rows were converted into one block: joined without a copy
    assert isinstance(batch.X, np.ndarray) and batch.X.base is not None
    assert batch.X.shape == (500, 400) and (batch.X == 0.123456789).all()


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=5),
       copy_one=st.booleans())
def test_joined_rows_are_the_blocks_rows_in_order_whether_or_not_they_adjoin(
        cuts: list[tuple[int, int]], copy_one: bool) -> None:
    """A view over one array when the blocks are its consecutive row ranges, a copy
    otherwise (gaps, overlaps, another array): the same rows either way."""
    from streamlearn.events.instances import _joined_rows

    base = np.arange(18.0).reshape(6, 3).copy()  # an array that owns its rows, as a block does
    blocks = [base[min(a, b):max(a, b)] for a, b in cuts]
    if copy_one:
        blocks[-1] = blocks[-1].copy()
    joined = _joined_rows(list(blocks), 3)
    np.testing.assert_array_equal(joined, np.concatenate(blocks))
    ranges = [(min(a, b), max(a, b)) for a, b in cuts if a != b]  # empty blocks add no rows
    adjoin = bool(ranges) and all(r[0] == q[1] for q, r in pairwise(ranges))
    if adjoin and not (copy_one and cuts[-1][0] != cuts[-1][1]):
        assert isinstance(joined, np.ndarray) and joined.base is base


def test_concatenated_rows_are_dense_only_when_every_part_is() -> None:
    dense = np.array([[0.0, 2.0, -0.0], [1.0, 0.0, 3.0]])
    sparse = SparseBatch.from_rows([[2, 2]], [[1.0, 4.0]], 3)
    np.testing.assert_array_equal(concat_rows([dense, dense[:1]], 3), np.vstack([dense, dense[:1]]))
    mixed = concat_rows([dense, sparse], 3)
    assert isinstance(mixed, SparseBatch)
    assert mixed.indptr.tolist() == [0, 1, 3, 5] and mixed.indices.tolist() == [1, 0, 2, 2, 2]
    np.testing.assert_array_equal(mixed.to_dense(), [[0, 2, 0], [1, 0, 3], [0, 0, 5]])
    assert concat_rows([], 3).shape == (0, 3)
