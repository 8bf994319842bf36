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
    messages = chunk({"kind": "global", "version": 1}, encode_state(arrays, meta), max_bytes=500)
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
    with pytest.raises(StateError, match="object"):
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
