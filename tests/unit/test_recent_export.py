"""The recently closed ids export exactly what packing their dicts gives (the snapshot's
arrays), although each generation packs only what was added since the last export."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.join.recent import RecentlyClosed
from streamlearn.snapshot import pack_strings, unpack_strings

ids = st.sampled_from(["a", "b", "c", "é", "😀", "x\x00", "", "[", "long-" * 5]) | st.text(max_size=3)
steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(ids, max_size=5), st.integers(0, 6), st.floats(0, 5)),
    st.tuples(st.just("add_all"), st.lists(ids, max_size=5), st.integers(0, 6), st.floats(0, 5)),
    st.tuples(st.just("age"), st.just([]), st.just(0), st.floats(0, 30)),
    st.tuples(st.just("export"), st.just([]), st.just(0), st.just(0.0))), max_size=30)


def reference(recent: RecentlyClosed) -> tuple[np.ndarray, ...]:
    """The arrays of packing both dicts, old generation first."""
    utf8, ends = pack_strings([str(i) for i in [*recent.old, *recent.young]])
    how = np.array([*recent.old.values(), *recent.young.values()], dtype=np.int64)
    young = np.r_[np.zeros(len(recent.old), bool), np.ones(len(recent.young), bool)]
    return utf8, ends, how, young


@settings(max_examples=400, deadline=None, derandomize=True)
@given(steps=steps, capacity=st.integers(1, 6))
def test_every_export_equals_packing_the_dicts(steps: list[tuple[str, list[str], int, float]],
                                               capacity: int) -> None:
    recent, now = RecentlyClosed(window_s=10.0, capacity=capacity), 0.0
    for op, batch, code, dt in steps:
        now += dt
        if op == "add":
            recent.add(batch, [code] * len(batch), now, now)
        elif op == "add_all":
            recent.add_all(batch, code, now, now)
        elif op == "age":
            recent.age(now, now)
        utf8, ends, how, young, since = recent.export()
        for got, want in zip((utf8, ends, how, young), reference(recent), strict=True):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype
        assert since == recent.young_since
    utf8, ends, how, young, since = recent.export()
    restored = RecentlyClosed.restore(10.0, capacity, unpack_strings(utf8, ends), how, young, since)
    assert restored.old == recent.old and restored.young == recent.young
    for got, want in zip(restored.export()[:4], reference(recent), strict=True):
        np.testing.assert_array_equal(got, want)


def test_an_export_packs_only_the_ids_added_since_the_last_one() -> None:
    recent = RecentlyClosed(window_s=1e9, capacity=10**6)
    recent.add_all([f"e{i}" for i in range(1000)], 0, now=0.0, wall=0.0)
    recent.export()
    recent.add_all(["new"], 0, now=1.0, wall=1.0)
    packed = recent._young_packed
    assert [len(ids) for ids, _ in packed.unpacked] == [1]  # the 1,000 are packed already
    assert unpack_strings(*recent.export()[:2])[-2:] == ["e999", "new"]
