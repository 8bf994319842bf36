"""The hub's sends to the models topic, one at a time, off the serving thread.

A send to the Kafka models topic can wait on the broker: a replica's state waits
for the previous state's acknowledgement (up to 30 s), and the merger's model is
a transaction whose commit waits for the broker. On the serving thread such a
wait stopped every partition of the replica for as long as the broker was away,
and held its rebalance callbacks. An :class:`Outbox` runs the send in a thread of
its own, one send at a time; the hub asks :meth:`Outbox.busy` before it hands
over the next and reads each finished send's outcome with :meth:`Outbox.finished`.

``threaded=False`` runs each send at once in the caller (the in-memory topic of
tests and simulations, whose sends never wait): the outcomes are then the same,
only earlier.

>>> sent = []
>>> box = Outbox(lambda key, values: sent.append((key, values)), threaded=False)
>>> box.submit(b"global", [b"x"]); box.busy(), box.finished(), sent
(False, [(b'global', None)], [(b'global', [b'x'])])
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from streamlearn.errors import TransportError

__all__ = ["Outbox"]

log = logging.getLogger("streamlearn.sync")

Send = Callable[[bytes, list[bytes]], None]


class Outbox:
    """Runs ``send(key, values)`` for each submitted message, one at a time; a
    ``TransportError`` is that send's outcome (its message), any other exception is logged
    with its traceback and reported the same way."""

    def __init__(self, send: Send, threaded: bool) -> None:
        self._send, self._threaded = send, threaded
        self._lock = threading.Condition()
        self._queued: tuple[bytes, list[bytes]] | None = None
        self._running = False  # the thread has taken the queued send and not finished it
        self._outcomes: list[tuple[bytes, str | None]] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    def busy(self) -> bool:
        """Whether a submitted send has not finished yet."""
        with self._lock:
            return self._queued is not None or self._running

    def submit(self, key: bytes, values: list[bytes]) -> None:
        """Hand over one send; the caller checks :meth:`busy` first (one at a time)."""
        if not self._threaded:
            self._outcomes.append((key, self._run(key, values)))
            return
        with self._lock:
            if self._queued is not None or self._running:
                raise RuntimeError("Outbox.submit while a send is still in flight")
            self._queued = (key, values)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="streamlearn-models-send",
                                                daemon=True)
                self._thread.start()
            self._lock.notify()

    def finished(self) -> list[tuple[bytes, str | None]]:
        """(key, error message or None when sent) of each send finished since the last call."""
        with self._lock:
            done, self._outcomes = self._outcomes, []
        return done

    def close(self, timeout_s: float) -> None:
        """Stop taking sends; wait up to ``timeout_s`` for the one in flight."""
        with self._lock:
            self._closed = True
            self._lock.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _work(self) -> None:
        while True:
            with self._lock:
                while self._queued is None and not self._closed:
                    self._lock.wait()
                if self._queued is None:  # closed, nothing left to send
                    return
                (key, values), self._queued, self._running = self._queued, None, True
            error = self._run(key, values)
            with self._lock:
                self._outcomes.append((key, error))
                self._running = False

    def _run(self, key: bytes, values: list[bytes]) -> str | None:
        try:
            self._send(key, values)
        except TransportError as exc:
            return str(exc)
        except Exception as exc:  # never lose the thread: the replica would stop syncing
            log.exception("models topic: a send failed")
            return f"{type(exc).__name__}: {exc}"
        return None
