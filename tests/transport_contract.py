"""The Transport contract, written once and run against every transport.

``tests/unit/test_transport_contract.py`` runs it on the in-memory and the
embedded transports, ``tests/integration/test_kafka_transport.py`` on the Kafka
transport against a real broker. A harness gives each check what it needs
from outside the transport: writing input the way an upstream producer does,
reading what the transport produced, and a second transport of the same
consumer group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import pytest

from streamlearn.errors import TransportError
from streamlearn.transport.protocol import Message, Transport


class Harness(Protocol):
    partitions: int
    shares_cluster: bool  # a second transport of the group sees the same topics

    def transport(self, group: str) -> Transport: ...
    def write(self, role: str, key: bytes, value: bytes) -> None: ...  # "instances" / "feedback"
    def outputs(self, role: str) -> list[bytes]: ...  # "decisions" / "dead_letter"


def poll_all(t: Transport, count: int, max_records: int = 500, timeout_s: float = 30.0
             ) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"polled {len(out)} of {count} messages in {timeout_s} s")
        batch = t.poll(max_records, 0.2)
        assert len(batch) <= max_records
        out.extend(batch)
    return out


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def check_poll_returns_each_partition_in_offset_order(h: Harness) -> None:
    t = h.transport("order")
    for i in range(30):
        h.write("instances", f"k{i}".encode(), f"i{i}".encode())
    for i in range(20):
        h.write("feedback", f"k{i}".encode(), f"f{i}".encode())
    got = poll_all(t, 50, max_records=7)
    assert len({(m.topic, m.partition, m.offset) for m in got}) == 50  # never twice
    for tp in {(m.topic, m.partition) for m in got}:
        offsets = [m.offset for m in got if (m.topic, m.partition) == tp]
        assert offsets == list(range(len(offsets)))
    partition_of = {}
    for m in got:  # co-partitioning: a key lands on the same partition number in both topics
        assert partition_of.setdefault(m.key, m.partition) == m.partition
    assert t.poll(10, 0.1) == []
    assert all(n == 0 for n in t.unread().values())  # caught up
    ends = t.end_offsets()
    assert sum(ends.values()) == 50 and set(ends) == t.assignment()
    t.close()


def check_commit_then_a_new_transport_resumes_there(h: Harness) -> None:
    if not h.shares_cluster:
        pytest.skip("one transport per process: its restart is covered by seek")
    first = h.transport("resume")
    for i in range(12):
        h.write("instances", f"r{i}".encode(), b"x")
    got = poll_all(first, 12)
    ends = {(m.topic, m.partition): m.offset + 1 for m in got}
    first.commit(ends)
    assert first.committed() == ends
    first.close()
    second = h.transport("resume")
    h.write("instances", b"r-late", b"late")
    assert [m.value for m in poll_all(second, 1)] == [b"late"]
    second.close()


def check_commits_not_waited_for_arrive_in_order(h: Harness) -> None:
    """``commit(wait=False)`` returns at once; the commits complete in the order made, so the
    group ends at the last one (the transport keeps polling, as the daemon's loop does)."""
    t = h.transport("async-commit")
    for i in range(8):
        h.write("instances", b"one-key", f"{i}".encode())
    got = poll_all(t, 8)
    tp = (got[0].topic, got[0].partition)
    for offset in range(1, 9):
        t.commit({tp: offset}, wait=False)

    def arrived() -> bool:
        t.poll(1, 0.05)
        return t.committed().get(tp) == 8

    wait_for(arrived, "the last commit not waited for")
    t.close()


def check_seek_rereads_and_skips(h: Harness) -> None:
    t = h.transport("seek")
    for i in range(10):
        h.write("instances", b"same-key", f"{i}".encode())
    got = poll_all(t, 10)
    tp = (got[0].topic, got[0].partition)
    t.seek({tp: 4})
    assert [m.value for m in poll_all(t, 6)] == [f"{i}".encode() for i in range(4, 10)]
    t.seek({tp: 9})
    assert [m.offset for m in poll_all(t, 1)] == [9]
    t.close()


def check_commit_and_seek_refuse_unassigned_partitions_and_bad_offsets(h: Harness) -> None:
    t = h.transport("refuse")
    tp = sorted(t.assignment())[0]
    for offsets in ({("not-a-topic", 0): 1}, {(tp[0], h.partitions): 1}, {tp: -1}):
        with pytest.raises(TransportError):
            t.commit(offsets)
        with pytest.raises(TransportError):
            t.seek(offsets)
    t.close()


def check_produce_and_produce_many_keep_their_order(h: Harness) -> None:
    t = h.transport("produce")
    t.produce(t.decisions_topic, b"d", b'{"id": "d0", "action": 0}')
    t.produce_many(t.decisions_topic, [b"d"] * 3,
                   [b'{"id": "d%d", "action": 0}' % i for i in range(1, 4)])
    t.produce_many(t.dead_letter_topic, [None, b"x"], [b"dl0", b"dl1"])
    t.flush(30.0)
    wait_for(lambda: len(h.outputs("decisions")) >= 4 and len(h.outputs("dead_letter")) >= 2,
             "the produced messages")
    assert h.outputs("decisions")[-4:] == [b'{"id": "d%d", "action": 0}' % i for i in range(4)]
    # different keys may land on different partitions: order holds per partition only
    assert sorted(h.outputs("dead_letter")[-2:]) == [b"dl0", b"dl1"]
    t.close()


def check_a_closed_transport_refuses_to_work(h: Harness) -> None:
    t = h.transport("closed")
    t.close()
    t.close()  # idempotent
    with pytest.raises(TransportError):
        t.poll(1, 0.0)


CHECKS = [check_poll_returns_each_partition_in_offset_order,
          check_commit_then_a_new_transport_resumes_there,
          check_commits_not_waited_for_arrive_in_order,
          check_seek_rereads_and_skips,
          check_commit_and_seek_refuse_unassigned_partitions_and_bad_offsets,
          check_produce_and_produce_many_keep_their_order,
          check_a_closed_transport_refuses_to_work]
