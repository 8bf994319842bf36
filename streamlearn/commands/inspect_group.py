"""``streamlearn inspect STATE_DIR`` of a scaled-out group (``kafka.membership = group``),
or ``streamlearn inspect --changelog TOPIC --bootstrap HOST:PORT``.

The state directory holds ``partition-<p>`` checkpoint directories; the changelog topic
holds each partition's checkpoints (``checkpoint.changelog``). For each
partition: who claims it (replica, epoch; on the changelog: when its newest checkpoint
was written), its newest checkpoint, the offsets it has consumed, its pending joins and
its exact counters; then the group's totals (instances, joined feedback, and the id
checksum of applied feedback, summed over the partitions as the crash tests compare them).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from streamlearn.errors import StateError
from streamlearn.service.replica import TAKEN_BY_ANOTHER, partition_dirs, read_released

__all__ = ["describe_group", "is_group_state", "print_group"]

def is_group_state(path: Path) -> bool:
    """A directory of ``partition-<p>`` checkpoint directories."""
    return path.is_dir() and bool(partition_dirs(path))


def describe_group(path: Path) -> dict[str, Any]:
    """A JSON-ready summary of every partition's newest checkpoint, and the totals."""
    from streamlearn.commands.inspect import describe, snapshots_in

    rows = []
    for partition, directory in partition_dirs(path):
        row: dict[str, Any] = {"partition": partition}
        owner = directory / "owner"
        if owner.is_file():
            try:
                row["owner"] = orjson.loads(owner.read_bytes())
            except orjson.JSONDecodeError:
                row["owner"] = None
        released = read_released(directory)
        if released is not None and not owner.is_file():  # the changelog (no claim files)
            row["released"] = released
        try:
            snapshot = snapshots_in(directory)[-1]
        except StateError:
            rows.append({**row, "checkpoint": None})
            continue
        rows.append(_row(row, describe(snapshot)))
    info = {"path": str(path), "partitions": rows, "totals": _totals(rows)}
    if any(_taken(row) for row in rows):
        info["note"] = ("partitions marked handed over, dropped or not reassigned (after a "
                        "kill) are this replica's copies of partitions another replica took: "
                        "shown, not in the total; "
                        "`inspect --changelog TOPIC` gives the whole group")
    return info


def describe_changelog(bootstrap: str, topic: str) -> dict[str, Any]:
    """:func:`describe_group` of the newest checkpoint of each partition of a changelog topic
    (read only: no writer is fenced)."""
    from kafka import KafkaConsumer

    from streamlearn.commands.inspect import describe_state
    from streamlearn.durability.changelog import Changelog
    from streamlearn.transport.kafka import check_reachable
    from streamlearn.transport.keyed_log import LANES, KafkaKeyedLog

    check_reachable(bootstrap)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, allow_auto_create_topics=False)
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or [])
    finally:
        consumer.close()
    if not partitions:
        raise StateError(f"there is no topic {topic!r} on {bootstrap}.")
    if len(partitions) % LANES:
        raise StateError(f"{topic!r} is not a changelog topic: a changelog has {LANES} "
                         f"partitions per input partition (an even count). Got "
                         f"{len(partitions)}.")
    rows = []
    for partition in range(len(partitions) // LANES):  # the input partition of each slot
        found = Changelog(KafkaKeyedLog(bootstrap, topic, partition, write=False)).restore()
        row: dict[str, Any] = {"partition": partition}
        if found.manifest is None:
            rows.append({**row, "checkpoint": None})
            continue
        row["written_at"] = found.manifest.get("written_at")
        rows.append(_row(row, describe_state(f"{topic}[{partition}]", found.arrays, found.meta)))
    info = {"path": f"changelog {topic} on {bootstrap}", "partitions": rows,
            "totals": _totals(rows)}
    if all(row.get("checkpoint") is None for row in rows):
        info["note"] = (f"no partition of {topic!r} holds a checkpoint: a changelog no daemon "
                        "has checkpointed to yet, or not a changelog topic")
    return info


def _row(row: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """One partition's row from its newest checkpoint's summary."""
    counters = info.get("other", {}).get("counters", {})
    feedback = counters.get("feedback", {})
    row.update(checkpoint=info.get("seq"), offsets=info.get("offsets"),
               pending_joins=info.get("pending_joins", 0),
               instances=counters.get("instances", 0), joined=feedback.get("joined", 0),
               expired=feedback.get("expired", 0),
               applied_checksum=counters.get("applied_checksum", "0"))
    return row


def _totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    totals = {"instances": 0, "joined": 0, "expired": 0, "pending_joins": 0}
    checksum = 0
    for row in rows:
        if row.get("checkpoint") is None or _taken(row):
            continue
        for key in totals:
            totals[key] += int(row.get(key) or 0)
        checksum = (checksum + int(row["applied_checksum"])) % (1 << 64)
    return {**totals, "applied_checksum": str(checksum)}


def print_group(info: dict[str, Any]) -> None:
    print(f"group state     {info['path']} ({len(info['partitions'])} partitions)")
    owner_head = "written (UTC)" if any("written_at" in r for r in info["partitions"]) else "owner"
    print(f"  {'p':>3}  {owner_head:<20}{'ckpt':>6}{'instances':>11}{'joined':>9}{'expired':>9}"
          f"{'pending':>9}  offsets (next to read)")
    for row in info["partitions"]:
        owner = row.get("owner")  # a claim file: shared storage; the changelog writes none
        who = f"{owner.get('replica', '-')}@{owner.get('epoch', '-')}" if owner else "-"
        if row.get("written_at") is not None:  # the changelog: when, not who
            who = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["written_at"]))
        if "released" in row:  # how and when this replica let it go
            who = f"{row['released'].get('how', 'released')} {_clock(row['released'].get('at'))}"
        offsets = ", ".join(f"{o['topic']}[{o['partition']}] {o['next_offset']:,}"
                            for o in row.get("offsets") or [])
        print(f"  {row['partition']:>3}  {who:<20}{row.get('checkpoint') or '-':>6}"
              f"{row.get('instances', 0):>11,}{row.get('joined', 0):>9,}"
              f"{row.get('expired', 0):>9,}{row.get('pending_joins', 0):>9,}  {offsets}")
    if "note" in info:
        print(f"  note: {info['note']}")
    t = info["totals"]
    print(f"  total: instances {t['instances']:,}, joined {t['joined']:,}, expired "
          f"{t['expired']:,}, pending {t['pending_joins']:,}, applied checksum "
          f"{t['applied_checksum']}")


def _clock(at: object) -> str:
    """A unix time as UTC hours:minutes:seconds ("?" when it is not a number)."""
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        return "?"
    return time.strftime("%H:%M:%S", time.gmtime(at))


def _taken(row: dict[str, Any]) -> bool:
    """A row of a partition another replica took from this one (not one it stopped with)."""
    return row.get("released", {}).get("how") in TAKEN_BY_ANOTHER
