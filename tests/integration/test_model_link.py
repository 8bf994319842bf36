"""The models topic on a real broker, on both client libraries: global models for every reader,
replica states only for the merger, from the offset it is given; a one-partition topic (the
layout before) still carries both; a fenced merger publishes nothing anyone reads."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest

from streamlearn.errors import TransportError
from streamlearn.sync.codec import chunk, parse
from streamlearn.sync.kafka_link import KafkaModelLink, ensure_models_topic
from streamlearn.transport.kafka import ensure_topics
from tests.integration.daemon_harness import CLIENTS

pytestmark = pytest.mark.integration


def message(kind: str, n: int) -> list[bytes]:
    return chunk({"kind": kind, "replica": "r", "seq": n, "version": n}, b"x" * 64)


def read_until(link: KafkaModelLink, done: Callable[[list[dict[str, object]]], bool],
               timeout_s: float = 20.0) -> list[dict[str, object]]:
    """Headers fetched until ``done`` holds for them, after a caught-up catch-up."""
    link.request_catch_up()
    seen: list[dict[str, object]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen += [parse(v)[0] for v in link.fetch()]
        if link.caught_up() and done(seen):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"not read in {timeout_s} s; got {seen}")


@pytest.mark.parametrize("client", CLIENTS)
def test_only_a_follower_reads_the_states_and_from_the_offset_it_gives(
        kafka_bootstrap: str, client: str) -> None:
    topic = f"models-{uuid.uuid4().hex[:8]}"
    ensure_models_topic(kafka_bootstrap, topic)
    writer = KafkaModelLink(kafka_bootstrap, topic, client=client)
    reader = KafkaModelLink(kafka_bootstrap, topic, client=client)
    try:
        assert reader.states_partition is not None  # created with its two partitions
        writer.send(b"replica/r", message("replica", 1))
        writer.send(b"global", message("global", 1))
        writer.send(b"replica/r", message("replica", 2))
        seen = read_until(reader, lambda s: len(s) >= 1)
        assert [h["kind"] for h in seen] == ["global"]  # not following: no state
        assert reader.states_position() is None
        reader.follow_states(True, from_offset=1)  # the second state onwards
        seen = read_until(reader, lambda s: len(s) >= 1)
        assert [(h["kind"], h["seq"]) for h in seen] == [("replica", 2)]
        assert reader.states_position() == 2  # read to the states partition's end
        reader.follow_states(False)
        writer.send(b"replica/r", message("replica", 3))
        reader.send(b"global", message("global", 2))  # its catch-up made it the merger
        seen = read_until(reader, lambda s: any(h["kind"] == "global" for h in s))
        assert [h["kind"] for h in seen] == ["global"]
    finally:
        writer.close()
        reader.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_one_partition_models_topic_carries_models_and_states_to_every_reader(
        kafka_bootstrap: str, client: str) -> None:
    topic = f"models-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], 1, topic_configs={"cleanup.policy": "compact"})
    writer = KafkaModelLink(kafka_bootstrap, topic, client=client)
    reader = KafkaModelLink(kafka_bootstrap, topic, client=client)
    try:
        assert reader.states_partition is None
        writer.send(b"replica/r", message("replica", 1))
        writer.send(b"global", message("global", 1))
        seen = read_until(reader, lambda s: len(s) >= 2)
        assert [h["kind"] for h in seen] == ["replica", "global"]
    finally:
        writer.close()
        reader.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_merger_fenced_by_a_newer_one_publishes_nothing_anyone_reads(
        kafka_bootstrap: str, client: str) -> None:
    """The role moves while the old merger is paused: the new one's catch-up opens the
    merger's producer, which fences the old one at the broker. The old merger, resumed and
    still following, cannot publish (an error it can log), and readers never see its model."""
    topic = f"models-{uuid.uuid4().hex[:8]}"
    ensure_models_topic(kafka_bootstrap, topic)
    old, new, reader = (KafkaModelLink(kafka_bootstrap, topic, client=client) for _ in range(3))
    try:
        old.follow_states(True)
        read_until(old, lambda s: True)  # its catch-up opened the merger's producer
        old.send(b"global", message("global", 1))
        new.follow_states(True)
        seen = read_until(new, lambda s: len(s) >= 1)  # fenced the old one, then read to the end
        assert [(h["kind"], h["version"]) for h in seen] == [("global", 1)]
        with pytest.raises(TransportError, match="another replica is the merger"):
            old.send(b"global", message("global", 2))  # what the paused merger had merged
        with pytest.raises(TransportError, match="dropped since the last catch-up"):
            old.send(b"global", message("global", 2))  # and again, until it catches up
        new.send(b"global", message("global", 2))
        seen = read_until(reader, lambda s: len(s) >= 2)
        assert [h["version"] for h in seen] == [1, 2]  # once each, in order
    finally:
        for link in (old, new, reader):
            link.close()
