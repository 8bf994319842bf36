"""The changelog's decision journal on a real broker: what a dead writer journaled stays.

A writer journals each batch before its decisions go out, in a transaction committed only
with its next checkpoint. When it dies, the next writer's open aborts that transaction,
and Kafka's log cleaner removes an aborted transaction's records once it compacts their
segment: an outside test saw a partition move twice within a checkpoint interval, the
cleaner run in between, and the third owner decide 1,437 events again, differently. The
restoring writer therefore commits the journal it reuses once more (what the cleaner
keeps is what a ``read_committed`` reader sees).
"""

from __future__ import annotations

import time
import uuid

from streamlearn.durability.changelog import Changelog
from streamlearn.transport.kafka import ensure_topics
from streamlearn.transport.keyed_log import CHANGELOG_TOPIC_CONFIGS, LANES, KafkaKeyedLog


def _committed_journal(bootstrap: str, topic: str) -> list[bytes | None]:
    reader = KafkaKeyedLog(bootstrap, topic, 0, write=False)
    return [value for _, _, value in reader.records(journal=True, committed=True)]


def test_a_dead_writers_journal_is_committed_again_by_the_writer_that_restores_it(
        kafka_bootstrap: str) -> None:
    topic = f"journal-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], LANES, topic_configs=CHANGELOG_TOPIC_CONFIGS)
    first = Changelog(KafkaKeyedLog(kafka_bootstrap, topic, 0))
    first.journal(0, b'{"id": "e1"}\n')
    first.journal(0, b'{"id": "e2"}\n')
    first.log.close()  # dies: its transaction stays open, nothing committed
    assert _committed_journal(kafka_bootstrap, topic) == []
    second = Changelog(KafkaKeyedLog(kafka_bootstrap, topic, 0))  # aborts the first's
    try:
        found = second.restore()
        assert found.journal == {0: [b'{"id": "e1"}\n', b'{"id": "e2"}\n']}
        # the copies are committed: the cleaner keeps them when it drops the aborted ones
        assert sorted(_committed_journal(kafka_bootstrap, topic)) == [b'{"id": "e1"}\n',
                                                                       b'{"id": "e2"}\n']
        third = Changelog(KafkaKeyedLog(kafka_bootstrap, topic, 0))  # the second dies too
        assert third.restore().journal == found.journal
        third.log.close()
    finally:
        second.log.close()


def _dead_writers_journal(kafka_bootstrap: str, topic_configs: dict[str, str]) -> str:
    """A topic whose writer journaled 20 records and died (its transaction left open), and
    the next writer, which opened (aborting it): the topic's name."""
    topic = f"journal-lag-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [topic], LANES, topic_configs=topic_configs)
    first = KafkaKeyedLog(kafka_bootstrap, topic, 0)
    for i in range(20):
        first.send_and_wait(f"j/1/dead-{i}".encode(), b"decision", journal=True)
    first.close()
    return topic


def _journal_left(kafka_bootstrap: str, topic: str) -> int:
    reader = KafkaKeyedLog(kafka_bootstrap, topic, 0, write=False)
    try:
        return sum(key.startswith(b"j/1/dead-") for _, key, _ in reader.records(journal=True))
    finally:
        reader.close()


def test_the_changelog_topic_keeps_a_dead_writers_journal_from_the_cleaner(
        kafka_bootstrap: str) -> None:
    """Kafka's cleaner removes an aborted transaction's records: an outside test saw it do so
    between the next owner's open (which aborts the dead writer's transaction) and its read,
    with a fast-compacting changelog, and ids decided again differently. The changelog topic
    is created with min.compaction.lag.ms (MIN_COMPACTION_LAG_MS), which keeps records that
    young from the cleaner. Both topics here roll segments every second; the one without the
    lag shows the cleaner ran (this broker cleans every second: deploy/kafka/kafka.sh)."""
    fast = {"segment.ms": "1000", "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "1000"}
    kept = _dead_writers_journal(kafka_bootstrap, {**CHANGELOG_TOPIC_CONFIGS, **fast})
    control = _dead_writers_journal(kafka_bootstrap, {**CHANGELOG_TOPIC_CONFIGS, **fast,
                                                      "min.compaction.lag.ms": "0"})
    writers = [KafkaKeyedLog(kafka_bootstrap, t, 0) for t in (kept, control)]  # abort them
    try:
        deadline = time.monotonic() + 60
        while _journal_left(kafka_bootstrap, control) and time.monotonic() < deadline:
            for n, writer in enumerate(writers):  # appends roll the journal's segments
                writer.send_and_wait(b"j/2/next-%d" % n, b"x", journal=True)
                writer.commit()
            time.sleep(1.0)
        assert _journal_left(kafka_bootstrap, control) == 0, "the cleaner never ran"
        assert _journal_left(kafka_bootstrap, kept) == 20
    finally:
        for writer in writers:
            writer.close()


def test_serve_refuses_a_changelog_topic_that_lets_the_cleaner_at_young_records(
        kafka_bootstrap: str) -> None:
    """An outside test ran on past the warning this used to be and saw 1,585 ids decided
    again differently: the refusal names the setting and the command that fixes it."""
    import pytest

    from streamlearn.commands.serve import _check_changelog_topic
    from streamlearn.config import load_config
    from streamlearn.errors import ConfigError

    name = f"lagless-{uuid.uuid4().hex[:8]}"
    ensure_topics(kafka_bootstrap, [name], 2 * 2, topic_configs={
        **CHANGELOG_TOPIC_CONFIGS, "min.compaction.lag.ms": "60000"})
    config = load_config(environ={}, cli={
        "kafka.bootstrap": kafka_bootstrap, "topics.changelog": name,
        "topics.instances": f"{name}-in", "topics.partitions": "2"})
    with pytest.raises(ConfigError, match=r"min.compaction.lag.ms = 60000; set it with "
                                          r"kafka-configs.sh --alter"):
        _check_changelog_topic(config)
