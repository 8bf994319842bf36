"""The models topic over Kafka: one partition, compacted, read from its beginning."""

from __future__ import annotations

from collections.abc import Mapping

from streamlearn.errors import TransportError

__all__ = ["KafkaModelLink", "ensure_models_topic"]


def ensure_models_topic(bootstrap: str, topic: str,
                        client_options: Mapping[str, object] | None = None) -> None:
    """Create the models topic (one partition, ``cleanup.policy=compact``) if it is missing."""
    from streamlearn.stream.kafka import ensure_topics

    ensure_topics(bootstrap, [topic], 1, client_options=client_options,
                  topic_configs={"cleanup.policy": "compact"})


class KafkaModelLink:
    """Chunks go out keyed ``<key>/<i>`` (compaction keeps the newest of each); every
    message of the topic is read, from its beginning."""

    def __init__(self, bootstrap: str, topic: str,
                 client_options: Mapping[str, object] | None = None) -> None:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition
        from kafka.errors import KafkaError

        options = dict(client_options or {})
        self.topic = topic
        self.tp = TopicPartition(topic, 0)
        try:
            self.consumer = KafkaConsumer(
                **{k: v for k, v in options.items() if k in KafkaConsumer.DEFAULT_CONFIG},
                bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                client_id="streamlearn-models")
            self.consumer.assign([self.tp])
            self.consumer.seek_to_beginning(self.tp)
            self.producer = KafkaProducer(
                **{k: v for k, v in options.items() if k in KafkaProducer.DEFAULT_CONFIG},
                bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                client_id="streamlearn-models")
        except KafkaError as exc:
            raise TransportError(f"cannot open the models topic {topic!r}: {exc}") from exc

    def send(self, key: bytes, values: list[bytes]) -> None:
        from kafka.errors import KafkaError

        try:
            for i, value in enumerate(values):
                self.producer.send(self.topic, key=key + b"/%d" % i, value=value)
            self.producer.flush(timeout=30)
        except KafkaError as exc:  # the next round publishes again
            raise TransportError(f"publishing to the models topic failed: {exc}") from exc

    def fetch(self) -> list[bytes]:
        from kafka.errors import KafkaError

        try:
            batches = self.consumer.poll(timeout_ms=0, max_records=1000)
        except KafkaError:
            return []
        return [r.value for records in batches.values() for r in records if r.value]

    def caught_up(self) -> bool:
        from kafka.errors import KafkaError

        try:
            end = self.consumer.end_offsets([self.tp])[self.tp]
            return bool(self.consumer.position(self.tp) >= end)
        except KafkaError:
            return True  # the broker is away: publish nothing newer than we know (see hub)

    def close(self) -> None:
        self.consumer.close()
        self.producer.close(timeout=10)
