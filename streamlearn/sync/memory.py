"""The models topic in memory (tests and in-process simulations), as :class:`ModelLink`.

>>> log = ModelLog()
>>> a, b = InMemoryModelLink(log), InMemoryModelLink(log)
>>> a.send(b"global", [b"x", b"y"]); b.fetch(), b.fetch(), b.caught_up()
([b'x', b'y'], [], True)
"""

from __future__ import annotations

__all__ = ["InMemoryModelLink", "ModelLog"]


class ModelLog:
    """One in-memory topic: (key, value) pairs in send order."""

    def __init__(self) -> None:
        self.messages: list[tuple[bytes, bytes]] = []


class InMemoryModelLink:
    """A reader/writer of a :class:`ModelLog` with its own read position."""

    def __init__(self, log: ModelLog) -> None:
        self.log, self.position = log, 0

    def send(self, key: bytes, values: list[bytes]) -> None:
        self.log.messages += [(key + b"/%d" % i, v) for i, v in enumerate(values)]

    def fetch(self) -> list[bytes]:
        new = [v for _, v in self.log.messages[self.position:]]
        self.position = len(self.log.messages)
        return new

    def request_catch_up(self) -> None:  # everything sent is readable at once
        pass

    def caught_up(self) -> bool:
        return True
