"""The models topic in memory (tests and in-process simulations), as :class:`ModelLink`.

Like the Kafka link, a reader gets the global models always and the replicas'
states only while it follows them (:meth:`InMemoryModelLink.follow_states`, the
merger), from the position it is given; offsets are indices into the log.

>>> log = ModelLog()
>>> a, b = InMemoryModelLink(log), InMemoryModelLink(log)
>>> a.send(b"global", [b"x", b"y"]); a.send(b"replica/a", [b"s"])
>>> b.fetch(), b.fetch(), b.caught_up()
([b'x', b'y'], [], True)
>>> b.follow_states(True); b.fetch(), b.states_position()
([b's'], 3)
"""

from __future__ import annotations

__all__ = ["InMemoryModelLink", "ModelLog"]


class ModelLog:
    """One in-memory topic: (key, value) pairs in send order."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bytes]] = []


def _is_global(key: bytes) -> bool:
    return key.startswith(b"global/")


class InMemoryModelLink:
    """A reader/writer of a :class:`ModelLog` with its own read position."""

    def __init__(self, log: ModelLog) -> None:
        self.log, self.position = log, 0
        self.following = False
        self._states_from: int | None = None  # where a new follow starts reading states

    def send(self, key: bytes, values: list[bytes]) -> None:
        self.log.messages += [(key + b"/%d" % i, v) for i, v in enumerate(values)]

    def fetch(self) -> list[bytes]:
        start = self.position
        new = [v for k, v in self.log.messages[start:] if self.following or _is_global(k)]
        if self._states_from is not None:  # states before the position, from where asked
            new = [v for k, v in self.log.messages[self._states_from:start]
                   if not _is_global(k)] + new
            self._states_from = None
        self.position = len(self.log.messages)
        return new

    def follow_states(self, on: bool, from_offset: int | None = None) -> None:
        if on and not self.following:
            self._states_from = from_offset or 0
        self.following = on

    def states_position(self) -> int | None:
        return self.position if self.following else None

    def request_catch_up(self) -> None:  # everything sent is readable at once
        pass

    def caught_up(self) -> bool:
        return True
