"""The models-topic state codec: arrays + JSON, exact round trips, damaged blobs refused."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from streamlearn.errors import StateError
from streamlearn.learners import exploration_from_name, make_learner
from streamlearn.sync.codec import META, Assembler, chunk, decode_state, encode_state

DTYPES = st.sampled_from(["<f8", "<f4", "<i8", "<i4", "|u1", "|b1", ">f8", "<U3"])


@st.composite
def named_arrays(draw: st.DrawFn) -> dict[str, np.ndarray]:
    names = draw(st.lists(st.text(min_size=1, max_size=12), unique=True, max_size=5))
    out = {}
    for name in names:
        dtype = np.dtype(draw(DTYPES))
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
        out[name] = draw(hnp.arrays(dtype, shape))
    return out


@settings(max_examples=200, deadline=None)
@given(arrays=named_arrays(), meta=st.dictionaries(st.text(max_size=8), st.integers(-5, 5)))
def test_every_array_comes_back_bit_for_bit_with_its_dtype_and_shape(
        arrays: dict[str, np.ndarray], meta: dict[str, int]) -> None:
    back, meta_back = decode_state(encode_state(arrays, meta))
    assert meta_back == meta
    assert list(back) == list(arrays)
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        assert back[name].tobytes() == array.tobytes()  # NaNs and -0.0 included
        assert back[name].flags.writeable  # a learner may update its arrays in place


def test_a_non_contiguous_array_is_encoded_as_its_values() -> None:
    strided = np.arange(20.0).reshape(4, 5)[:, ::2]
    back, _ = decode_state(encode_state({"w": strided}, {}))
    np.testing.assert_array_equal(back["w"], strided)


def test_a_learner_state_survives_chunking_and_reassembly() -> None:
    learner = make_learner("linucb", 4, 7, exploration_from_name("fixed", 0.05), 0)
    arrays, meta = learner.state()
    messages = chunk({"kind": "global", "version": 1, "included": []}, encode_state(arrays, meta),
                     max_bytes=500)
    assembler = Assembler()
    done = [assembler.add(m) for m in messages][-1]
    assert done is not None and len(messages) > 1
    for name, array in arrays.items():
        np.testing.assert_array_equal(done[1][name], array)
    assert done[2] == orjson.loads(orjson.dumps(meta))


def test_states_published_as_npz_before_this_format_still_decode() -> None:
    buffer = io.BytesIO()
    np.savez(buffer, w=np.arange(3.0), **{META: np.frombuffer(b'{"class": "X"}', np.uint8)})
    arrays, meta = decode_state(buffer.getvalue())
    assert arrays["w"].tolist() == [0.0, 1.0, 2.0] and meta == {"class": "X"}


def test_object_arrays_are_refused_on_both_sides() -> None:
    with pytest.raises(StateError, match="no objects"):
        encode_state({"o": np.array([{}], dtype=object)}, {})
    blob = encode_state({"w": np.zeros(2)}, {})
    forged = blob.replace(b'"<f8"', b'"|O" ')
    with pytest.raises(StateError):
        decode_state(forged)


@pytest.mark.parametrize("damage", [
    lambda b: b[:-3],  # truncated arrays
    lambda b: b"XXXX" + b[4:],  # not a state
    lambda b: b[:8] + b"]" + b[9:],  # layout JSON broken
    lambda b: b[:4] + (10**6).to_bytes(4, "big") + b[8:],  # layout length past the end
    lambda b: b"",
])
def test_a_damaged_state_is_a_state_error_not_a_crash(damage: object) -> None:
    blob = encode_state({"w": np.arange(6.0).reshape(2, 3), "n": np.arange(2)}, {"k": 1})
    with pytest.raises(StateError):
        decode_state(damage(blob))  # type: ignore[operator]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_forged_or_corrupted_state_decodes_or_is_a_state_error(data: st.DataObject) -> None:
    blob = bytearray(encode_state({"w": np.arange(6.0).reshape(2, 3), "t": np.array(["ab"])},
                                  {"k": 1}))
    layout_end = 8 + int.from_bytes(blob[4:8], "big")
    # forged layouts (negative, huge or non-integer shapes and offsets, odd dtypes) and flips
    forged = data.draw(st.sampled_from([b"[-2, 3]", b"[99999999, 3]", b"[2.5, 3]", b'"x"',
                                        b"[2, -3]", b"[]", b"[0, 0]"]))
    text = bytes(blob[8:layout_end]).replace(b"[2, 3]", forged, 1)
    for i in data.draw(st.lists(st.integers(0, len(text) - 1), max_size=3)):
        text = text[:i] + bytes([data.draw(st.integers(0, 255))]) + text[i + 1:]
    candidate = bytes(blob[:4]) + len(text).to_bytes(4, "big") + text + bytes(blob[layout_end:])
    try:
        arrays, _ = decode_state(candidate)
    except StateError:
        return
    for array in arrays.values():  # what does decode is a well-formed, writable array
        assert array.flags.writeable and array.size >= 0


@pytest.mark.parametrize("header", [
    {"kind": "global", "version": "7", "included": []},  # a version that is not a number
    {"kind": "global", "version": 7, "included": [["r", "x"]]},
    {"kind": "global", "version": True, "included": []},
    {"kind": "replica", "replica": "r", "seq": 1, "base_version": 0},  # no examples
    {"kind": "replica", "replica": 3, "seq": 1, "base_version": 0, "examples": 5},
    {"kind": "global", "version": 7, "included": [], "states_from": "x"},
    {"kind": "global", "version": 7, "included": [], "made_at": "noon"},
    {"kind": "mystery"},
    {},
])
def test_a_malformed_chunk_header_is_a_state_error_for_the_reader(header: dict[str, object]) -> None:
    message = chunk(header, encode_state({"w": np.zeros(2)}, {}))[0]
    with pytest.raises(StateError):
        Assembler().add_raw(message)


def test_a_hub_skips_hostile_messages_on_the_models_topic_and_goes_on() -> None:
    from streamlearn.sync.hub import ModelHub
    from streamlearn.sync.memory import InMemoryModelLink, ModelLog

    topic = ModelLog()
    link = InMemoryModelLink(topic)
    link.follow_states(True)
    hostile = [b"", b"SLM1", b"SLM1\x00\x00\x00\x02{}", b"not a chunk at all",
               *chunk({"kind": "replica", "replica": "x", "seq": "1"}, b"xx"),
               *chunk({"kind": "global", "version": 9, "included": []}, b"not a state")]
    topic.messages += [(b"evil/0", m) for m in hostile]
    good = encode_state({"w": np.arange(3.0)}, {"class": "X", "counters": {}})
    topic.messages += [(b"global/0", m) for m in chunk(
        {"kind": "global", "version": 2, "included": []}, good)]
    hub = ModelHub(link, "r0")
    hub.poll()  # no exception: every hostile message is logged and skipped
    assert hub.version == 2 and hub.global_state is not None
