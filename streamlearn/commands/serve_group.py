"""``streamlearn serve --kafka-membership group``: this process is one replica of a group.

It joins ``kafka.group_id``; Kafka assigns it instances partitions, and for each
it runs a daemon on partition ``p`` of both input topics, with its state in
``<checkpoint.dir>/partition-<p>`` (:mod:`streamlearn.service.replica`).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamlearn.config import Config
from streamlearn.service.claims import PartitionClaims
from streamlearn.service.metrics import PrometheusObserver
from streamlearn.service.replica import Replica
from streamlearn.sync.hub import ModelHub
from streamlearn.sync.kafka_link import KafkaModelLink, ensure_models_topic

__all__ = ["build_replica", "serve_replica"]

HUB_CLOSE_S = 5.0  # at shutdown: the longest wait for a models-topic send in flight


def build_replica(config: Config, observer: PrometheusObserver) -> Replica:
    """The replica of ``config`` (kafka.membership = group), not yet serving."""
    from streamlearn.commands.serve import build_daemon
    from streamlearn.service.daemon import Daemon
    from streamlearn.service.group import GroupMembership
    from streamlearn.transport.kafka import ensure_topics
    from streamlearn.transport.kafka_clients import shared_clients_class, transport_class

    k, t = config.kafka, config.topics
    assert k.bootstrap is not None and config.checkpoint.dir is not None  # checked by load_config
    bootstrap, state_dir = k.bootstrap, Path(config.checkpoint.dir)
    options = k.client_options()
    ensure_topics(bootstrap, [t.instances, t.feedback, t.decisions, t.dead_letter], t.partitions,
                  client_options=options)
    # the partition daemons take what has arrived; the replica paces the rounds (round_seconds)
    poll_s = 0.0

    # one consumer and one producer for every partition this replica serves (docs/operations.md);
    # kafka.client picks their library, the models link's and the group membership's
    # (docs/kafka.md)
    clients = shared_clients_class(k.client)(bootstrap, f"{k.group_id}.partitions", options,
                     fetch_max_records=4 * config.limits.poll_max_records, tuning=k.tuning())

    def make_daemon(partition: int) -> Daemon:
        transport = transport_class(k.client)(
            bootstrap, t.instances, t.feedback, t.decisions, t.dead_letter,
            f"{k.group_id}.partitions", partitions=[partition], shared=clients)  # type: ignore[arg-type]
        own = dataclasses.replace(
            config, checkpoint=dataclasses.replace(
                config.checkpoint, dir=state_dir / f"partition-{partition}"),
            limits=dataclasses.replace(config.limits, poll_timeout_seconds=poll_s))
        return build_daemon(own, transport, transport, observer, partition)

    def make_membership(**handlers: Any) -> GroupMembership:
        return GroupMembership(bootstrap, t.instances, k.group_id, **handlers,
                               group_instance_id=k.group_instance_id, client_options=options,
                               session_timeout_ms=int(k.session_timeout_seconds * 1000),
                               client=k.client)

    replica_id = k.group_instance_id or f"{socket.gethostname()}-{os.getpid()}"
    ensure_models_topic(bootstrap, t.models, options)
    link = KafkaModelLink(bootstrap, t.models, options, client=k.client)
    hub = ModelHub(link, replica_id,
                   config.sync.every_seconds, on_sync=observer.on_model_sync,
                   early_fraction=config.sync.early_fraction, background_sends=True)

    def close_clients() -> None:  # after every partition daemon: they share these clients
        try:
            clients.close()
        finally:
            hub.close(HUB_CLOSE_S)  # a send in flight, then the link it sends on
            link.close()

    return Replica(make_daemon, make_membership, poll_timeout_s=config.limits.poll_timeout_seconds,
                   round_s=k.round_seconds, on_owned=observer.on_owned_partitions, hub=hub,
                   # the changelog fences by Kafka; claims need one directory every replica sees
                   claims=None if config.checkpoint.changelog
                   else PartitionClaims(state_dir, replica_id), on_close=close_clients,
                   observer=observer, state_dir=state_dir if config.checkpoint.changelog else None)


def serve_replica(replica: Replica, max_events: int | None, out: Any,
                  before_summary: Callable[[], None] | None = None) -> int:
    """Run the replica until a signal (or ``max_events``); print its summary; exit code.

    ``before_summary`` is called between the two (it stops the progress lines, so the
    summary is the last line)."""
    started = time.monotonic()
    replica.run(max_instances=max_events)
    elapsed = time.monotonic() - started
    if before_summary is not None:
        before_summary()
    seen = replica.instances_this_run
    hub = replica.hub
    adopted = hub.record.base_version if hub is not None and hub.record is not None else 0
    print(f"streamlearn serve: replica stopped after {seen} instances in {elapsed:.1f} s "
          f"({seen / max(elapsed, 1e-9):,.0f}/s); partitions started here: {replica.moves}; "
          f"global model: newest seen {hub.version if hub is not None else 0}, adopted "
          f"{adopted}", file=out, flush=True)
    return 0
