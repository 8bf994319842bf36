"""Partition claims: a replica that lost a partition without noticing stops serving it.

The group protocol is the authority on who owns a partition, but a member
learns that it was evicted only when its client notices (a replica paused or
starved past the session timeout may go on serving meanwhile). Every partition
directory on the shared state storage therefore holds ``owner`` — ``{"replica",
"epoch"}``, written atomically (temporary file + rename) by the replica that
starts the partition, with the epoch one above the last. Before every step a
replica checks that the claim is still its own; a partition claimed by another
replica is dropped at once, without a checkpoint (its state belongs to the new
owner). Two claims in the same instant both write epoch e + 1: the last rename
wins and the other replica drops the partition at its next check.

>>> import tempfile
>>> root = tempfile.mkdtemp()
>>> a, b = PartitionClaims(root, "a"), PartitionClaims(root, "b")
>>> a.claim(3), a.holds(3), b.claim(3), a.holds(3), b.holds(3)
(1, True, 2, False, True)
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

__all__ = ["PartitionClaims"]


class PartitionClaims:
    """Claims of ``replica`` under ``state_dir/partition-<p>/owner``."""

    def __init__(self, state_dir: str | os.PathLike[str], replica: str) -> None:
        self.root, self.replica = Path(state_dir), replica
        self.epochs: dict[int, int] = {}

    def _path(self, partition: int) -> Path:
        return self.root / f"partition-{partition}" / "owner"

    def _read(self, partition: int) -> tuple[str | None, int]:
        try:
            data = orjson.loads(self._path(partition).read_bytes())
            return str(data["replica"]), int(data["epoch"])
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None, 0

    def claim(self, partition: int) -> int:
        """Claim ``partition`` (the new epoch); call before restoring its state."""
        _, epoch = self._read(partition)
        path = self._path(partition)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".owner-{self.replica}-{os.getpid()}")
        tmp.write_bytes(orjson.dumps({"replica": self.replica, "epoch": epoch + 1}))
        os.replace(tmp, path)
        self.epochs[partition] = epoch + 1
        return epoch + 1

    def holds(self, partition: int) -> bool:
        """Whether this replica's claim on ``partition`` is still the newest."""
        return self._read(partition) == (self.replica, self.epochs.get(partition, -1))
