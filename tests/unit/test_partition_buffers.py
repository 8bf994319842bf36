"""The per-partition buffers of a shared consumer (``streamlearn/transport/buffers.py``):
what is put is taken in order, by the partitions asked for only, never for a partition
detached, and a fetch happens only when nothing asked for is buffered."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamlearn.errors import TransportError
from streamlearn.transport.buffers import PartitionBuffers
from streamlearn.transport.protocol import Message

PARTS = [("instances", 0), ("instances", 1), ("feedback", 0)]


def message(tp: tuple[str, int], offset: int) -> Message:
    return Message(tp[0], tp[1], offset, None, b"v%d" % offset, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(3)), st.booleans(), st.integers(1, 5)),
                min_size=1, max_size=40))
def test_each_partition_comes_out_in_order_and_only_to_those_asking(
        steps: list[tuple[int, bool, int]]) -> None:
    buffers = PartitionBuffers()
    buffers.attach({PARTS[0]: "h0", PARTS[1]: "h1"})  # PARTS[2] is never attached
    put = {tp: 0 for tp in PARTS}
    taken: dict[tuple[str, int], list[int]] = {tp: [] for tp in PARTS}
    fetches = []
    for which, take, n in steps:
        tp = PARTS[which]
        if not take:
            buffers.put(message(tp, put[tp] + i) for i in range(n))
            put[tp] += n
            continue
        asked = [tp, PARTS[2]]
        before = buffers.buffered(tp)
        out = buffers.take(asked, n, lambda: fetches.append(1))
        assert len(out) == min(n, before)
        for m in out:
            assert (m.topic, m.partition) == tp
            taken[tp].append(m.offset)
    for tp in PARTS[:2]:
        assert taken[tp] == list(range(len(taken[tp])))  # in order, none skipped
        assert buffers.buffered(tp) == put[tp] - len(taken[tp])
    assert buffers.buffered(PARTS[2]) == 0  # not attached: its records were dropped


def test_a_fetch_only_when_nothing_asked_for_is_buffered_and_detach_drops() -> None:
    buffers = PartitionBuffers()
    buffers.attach({PARTS[0]: "h0"})
    fetched: list[int] = []
    assert buffers.take([PARTS[0]], 10, lambda: fetched.append(1)) == [] and fetched == [1]
    buffers.put([message(PARTS[0], 0), message(PARTS[0], 1)])
    assert len(buffers.take([PARTS[0]], 1, lambda: fetched.append(2))) == 1 and fetched == [1]
    with pytest.raises(TransportError, match="read by another transport"):
        buffers.attach({PARTS[0]: "again"})
    assert buffers.detach([PARTS[0], PARTS[1]]) == ["h0"]  # only what was attached
    assert buffers.buffered(PARTS[0]) == 0 and buffers.assigned == {}
    buffers.attach({PARTS[0]: "h0"})  # attachable again, empty
    assert buffers.buffered(PARTS[0]) == 0
    buffers.put([message(PARTS[0], 5)])
    buffers.seek({PARTS[0]: 30})
    assert buffers.buffered(PARTS[0]) == 0


def test_after_a_seek_records_from_before_it_are_dropped_until_the_position_arrives() -> None:
    """A fetch made before a seek to 30 can still deliver offsets 6, 7, ... (librdkafka did,
    under load): they are dropped; from the first record at or past 30 on, all are kept
    (a later seek backwards is a new floor, not this one)."""
    buffers = PartitionBuffers()
    buffers.attach({PARTS[0]: "h0", PARTS[1]: "h1"})
    buffers.put([message(PARTS[0], i) for i in range(6)])
    buffers.seek({PARTS[0]: 30})
    buffers.put([message(PARTS[0], i) for i in range(6, 12)] + [message(PARTS[1], 0)])
    assert buffers.buffered(PARTS[0]) == 0 and buffers.buffered(PARTS[1]) == 1
    buffers.put([message(PARTS[0], i) for i in range(30, 33)])
    taken = buffers.take([PARTS[0]], 10, lambda: None)
    assert [m.offset for m in taken] == [30, 31, 32]
    buffers.seek({PARTS[0]: 0})  # backwards: everything from 0 is wanted again
    buffers.put([message(PARTS[0], i) for i in range(3)])
    assert [m.offset for m in buffers.take([PARTS[0]], 10, lambda: None)] == [0, 1, 2]
