"""Consumer-group membership: Kafka decides which replica owns which input partitions.

:class:`GroupMembership` is one ``KafkaConsumer`` subscribed to the *instances*
topic only, in the group ``kafka.group_id``, with kafka-python's KIP-429
``CooperativeStickyAssignor`` (incremental rebalancing: a rebalance revokes only
the partitions that move, the others keep being served) and, when
``group_instance_id`` is set, static membership (KIP-345: a restart within the
session timeout keeps the member's partitions without a rebalance). Its
partitions are paused, so it fetches nothing: it only takes part in the group
protocol, and reports assignment changes for :class:`~streamlearn.service.replica.Replica`
to act on.

**Co-partitioning by construction.** Owning instances partition ``p`` means
serving partition ``p`` of *both* input topics: the replica reads feedback
partition ``p`` itself (assign mode), so the join always sees an event's
instance and feedback together. The alternative — subscribing to both topics
and relying on an assignor that co-partitions — holds for the (eager) range
assignor only; the cooperative one makes no such promise.

kafka-python calls the rebalance listener inside ``poll``; the callbacks only
queue the change, and :meth:`GroupMembership.changes` hands them over, so a
revoked partition is stopped (final checkpoint) before this member rejoins —
kafka-python completes the revocation round only after ``on_partitions_revoked``
returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from streamlearn.errors import TransportError

__all__ = ["GroupMembership"]

log = logging.getLogger("streamlearn.group")

Handler = Callable[[list[int]], None]


class GroupMembership:
    """One member of the serving group; see the module docstring.

    ``on_revoked`` / ``on_assigned`` / ``on_lost`` receive instance partition
    numbers and run inside :meth:`poll`. The revocation handler must finish what
    it does with those partitions before it returns; lost partitions (this member
    was evicted, e.g. after a pause longer than the session timeout) belong to
    another member already, so their handler must not write their state.
    """

    def __init__(self, bootstrap_servers: str, instances_topic: str, group_id: str,
                 on_assigned: Handler, on_revoked: Handler, on_lost: Handler,
                 group_instance_id: str | None = None,
                 client_options: Mapping[str, object] | None = None,
                 session_timeout_ms: int = 10_000) -> None:
        from kafka import KafkaConsumer
        from kafka.consumer.subscription_state import ConsumerRebalanceListener
        from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
        from kafka.errors import KafkaError

        self.topic = instances_topic
        self.owned: set[int] = set()
        member = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                parts = sorted(tp.partition for tp in revoked if tp.topic == member.topic)
                if parts:
                    log.info("partitions %s revoked", parts)
                    on_revoked(parts)
                    member.owned -= set(parts)

            def on_partitions_assigned(self, assigned: Any) -> None:
                tps = [tp for tp in assigned if tp.topic == member.topic]
                member.consumer.pause(*tps)  # membership only: the replica fetches itself
                parts = sorted(tp.partition for tp in tps)
                if parts:
                    log.info("partitions %s assigned", parts)
                    member.owned |= set(parts)
                    on_assigned(parts)

            def on_partitions_lost(self, lost: Any) -> None:  # evicted: another owns them now
                parts = sorted(tp.partition for tp in lost if tp.topic == member.topic)
                if parts:
                    log.warning("partitions %s lost (this member was evicted)", parts)
                    on_lost(parts)
                    member.owned -= set(parts)

        options = {k: v for k, v in (client_options or {}).items()
                   if k in KafkaConsumer.DEFAULT_CONFIG}
        try:
            self.consumer = KafkaConsumer(
                **options, bootstrap_servers=bootstrap_servers, group_id=group_id,
                group_instance_id=group_instance_id, enable_auto_commit=False,
                partition_assignment_strategy=(CooperativeStickyAssignor,),
                session_timeout_ms=session_timeout_ms,
                heartbeat_interval_ms=max(session_timeout_ms // 5, 500),
                client_id="streamlearn-member")
            self.consumer.subscribe([instances_topic], listener=Listener())
        except KafkaError as exc:
            raise TransportError(f"cannot join the group {group_id!r}: {exc}") from exc

    def poll(self, timeout_s: float = 0.0) -> None:
        """Heartbeat and take part in rebalances (the listener runs in here)."""
        from kafka.errors import KafkaError

        try:
            self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=1)
        except KafkaError as exc:  # a broker outage: the member rejoins when it is back
            log.warning("group poll failed: %s", exc)

    def close(self) -> None:
        """Leave the group (a static member keeps its slot for the session timeout)."""
        self.consumer.close(autocommit=False)
