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

**Release.** A check before every step leaves a window: a replica that checked
just before the new claim finishes that step, and would journal and publish
decisions after the new owner had read the journal (the new owner then decides
those ids again, differently; seen in CI when a replica starved of CPU was
evicted at start-up). So a replica that stops serving a partition, however it
learned it must, writes ``released-<epoch>`` once its daemon is closed; the new
owner, after claiming, waits for the previous epoch's release (:meth:`wait_released`,
up to a grace period: a killed replica never writes one) before it restores; and a
replica checks its claim again right before it journals new decisions
(:class:`OwnershipLost`). A replica paused between that check and its journal
append, past the grace period, still gets through: only fencing by the broker
closes that.

>>> import tempfile
>>> root = tempfile.mkdtemp()
>>> a, b = PartitionClaims(root, "a"), PartitionClaims(root, "b")
>>> a.claim(3), a.holds(3), b.claim(3), a.holds(3), b.holds(3)
(1, True, 2, False, True)
>>> b.wait_released([3], grace_s=0.0)  # a holds epoch 1 and has not released it
[3]
>>> a.release(3); b.wait_released([3], grace_s=0.0)
[]
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

import orjson

from streamlearn.errors import OwnershipLost

__all__ = ["OwnershipLost", "PartitionClaims"]

RELEASE_POLL_S = 0.02


class PartitionClaims:
    """Claims of ``replica`` under ``state_dir/partition-<p>/owner``."""

    def __init__(self, state_dir: str | os.PathLike[str], replica: str) -> None:
        self.root, self.replica = Path(state_dir), replica
        self.epochs: dict[int, int] = {}
        # the claim each of ours replaced: (replica, epoch), whose release we wait for
        self.previous: dict[int, tuple[str | None, int]] = {}

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
        holder, epoch = self._read(partition)
        self.previous[partition] = (holder, epoch)
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

    def _released_path(self, partition: int, epoch: int) -> Path:
        return self.root / f"partition-{partition}" / f"released-{epoch}"

    def release(self, partition: int) -> None:
        """Say that this replica serves ``partition`` no more (its daemon is closed: nothing
        more of it is journaled or published); older release marks are removed."""
        epoch = self.epochs.pop(partition, None)
        if epoch is None:
            return
        mark = self._released_path(partition, epoch)
        try:
            mark.touch()
            for old in mark.parent.glob("released-*"):
                if old.name != mark.name and old.name.removeprefix("released-").isdigit() \
                        and int(old.name.removeprefix("released-")) < epoch:
                    old.unlink(missing_ok=True)
        except OSError:  # the new owner waits out its grace period instead
            pass

    def wait_released(self, partitions: Iterable[int], grace_s: float) -> list[int]:
        """Wait (up to ``grace_s`` in all) until the claims ours replaced are released; the
        partitions whose previous holder did not release them in time (killed, or still
        busy) are returned. A partition with no previous holder, or held by this replica
        before, needs no wait."""
        waiting = [p for p in partitions
                   if self.previous.get(p, (None, 0))[0] not in (None, self.replica)]
        deadline = time.monotonic() + grace_s
        while True:
            waiting = [p for p in waiting
                       if not self._released_path(p, self.previous[p][1]).exists()]
            if not waiting or time.monotonic() >= deadline:
                return waiting
            time.sleep(RELEASE_POLL_S)
