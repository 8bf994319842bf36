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
