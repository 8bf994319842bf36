"""Consumer lag for ``/readyz``: a transport wrapper that asks the end offsets beside the loop."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as NotYet

from streamlearn.transport.protocol import Message, Transport

__all__ = ["LagTracker"]

_log = logging.getLogger(__name__)

MAX_RETRY_S = 30.0


class LagTracker:
    """A transport wrapper that measures consumer lag for ``/readyz``.

    Kafka clients are not thread-safe, so the HTTP thread must not call the
    transport. Every ``refresh_s`` seconds, inside ``poll`` (the daemon's
    thread), this asks the end offsets and caches ``lag = Σ (end − next
    offset to read)`` over the assigned partitions; :meth:`readiness` only
    reads the cache. Positions come from the messages polled and from
    ``seek``; a partition not read yet counts from its committed offset (0
    when none).

    The end offsets are asked on a thread of their own (``streamlearn-lag``; the
    transports read them through a client that nothing else uses: an admin client,
    a consumer of its own, the in-memory broker's lock): ``poll`` waits for the
    answer at most ``wait_s`` (an idle broker answers in a few ms) and takes a later
    one at a later poll. Asked on the serving thread, a slow answer held the loop up
    to the transport's offsets timeout (3 s, seen on a loaded CI machine right after
    a restore, while the admin client connected).

    Parameters
    ----------
    inner : Transport
        The real transport; every call is delegated to it.
    max_lag : int
        ``/readyz`` fails while the lag exceeds this.
    is_serving : callable
        Whether the loop is up (e.g. ``lambda: daemon.ready``).
    on_lag : callable, optional
        Receives each measured lag (e.g. ``observer.on_lag``).
    """

    def __init__(self, inner: Transport, max_lag: int, is_serving: Callable[[], bool] = lambda: True,
                 on_lag: Callable[[int], None] | None = None, refresh_s: float = 1.0,
                 wait_s: float = 0.02) -> None:
        self.inner, self.max_lag, self.is_serving = inner, max_lag, is_serving
        self.on_lag, self.refresh_s, self.wait_s = on_lag, refresh_s, wait_s
        self._asker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamlearn-lag")
        self._asked: Future[dict[tuple[str, int], int]] | None = None  # the query in flight
        self.instances_topic: str = inner.instances_topic
        self.feedback_topic: str = inner.feedback_topic
        self.decisions_topic: str = inner.decisions_topic
        self.dead_letter_topic: str = inner.dead_letter_topic
        self.positions: dict[tuple[str, int], int] = {}
        self.lag: int | None = None
        self.lag_error = ""
        self._start: dict[tuple[str, int], int] | None = None
        self._next_refresh = 0.0
        self._retry_s = refresh_s  # grows while the offsets cannot be read (the broker is away)

    def poll(self, max_records: int, timeout_s: float) -> list[Message]:
        messages = self.inner.poll(max_records, timeout_s)
        for m in messages:
            self.positions[(m.topic, m.partition)] = m.offset + 1
        if self._asked is None and time.monotonic() >= self._next_refresh:
            self._ask()  # an idle broker answers within the short wait of this poll
            self._take(wait_s=self.wait_s)
        elif self._asked is not None and self._asked.done():
            self._take(wait_s=0.0)
        return messages

    def refresh(self) -> bool:
        """Measure the lag now, waiting for the answer (call from the polling thread only);
        False if it could not."""
        if self._asked is None:
            self._ask()
        return self._take(wait_s=None)

    def _ask(self) -> None:
        """Ask the end offsets (the committed offsets first, the first time, on this thread:
        they are the serving consumer's)."""
        from streamlearn.errors import TransportError

        if self._start is None:
            try:
                self._start = dict(self.inner.committed())
            except TransportError as exc:
                self._asked = Future()
                self._asked.set_exception(exc)  # taken as a failed query
                return
        self._asked = self._asker.submit(lambda: dict(self.inner.end_offsets()))

    def _take(self, wait_s: float | None) -> bool:
        """The answer in flight as the lag, waiting up to ``wait_s`` (None: until it comes);
        True if it was measured. Schedules the next question either way, once answered."""
        from streamlearn.errors import TransportError

        assert self._asked is not None
        try:
            ends = self._asked.result(timeout=wait_s)
        except NotYet:
            return False  # still asked: a later poll takes it
        except Exception as exc:  # a failed query never stops the loop
            self._asked = None
            detail = str(exc) if isinstance(exc, TransportError) else repr(exc)
            self.lag, self.lag_error = None, f"cannot read offsets: {detail}"
            # back off (2 s, doubling up to MAX_RETRY_S): a try may take the offsets timeout
            self._retry_s = min(max(2.0 * self._retry_s, 1.0), MAX_RETRY_S)
            self._next_refresh = time.monotonic() + self._retry_s
            _log.warning("consumer lag not measured (/readyz says not ready), next try in "
                         "%.0f s: %s", self._retry_s, self.lag_error)
            return False
        self._asked = None
        assert self._start is not None
        self.lag = int(sum(max(0, end - self.positions.get(tp, self._start.get(tp, 0)))
                           for tp, end in ends.items()))
        self.lag_error = ""
        self._retry_s = self.refresh_s
        self._next_refresh = time.monotonic() + self.refresh_s
        if self.on_lag is not None:
            self.on_lag(self.lag)
        return True

    def readiness(self) -> tuple[bool, str]:
        """``(ready, reason)``: serving, partitions assigned, lag measured and within bound."""
        if not self.is_serving():
            return False, "not serving (starting, restoring a checkpoint or stopping)"
        if not self.inner.assignment():
            return False, "no partitions assigned"
        if self.lag is None:
            return False, self.lag_error or "consumer lag not measured yet"
        if self.lag > self.max_lag:
            return False, f"consumer lag {self.lag} > bound {self.max_lag} (metrics.max_lag)"
        return True, f"lag {self.lag} <= {self.max_lag}"

    def produce(self, topic: str, key: bytes | None, value: bytes) -> None:
        self.inner.produce(topic, key, value)

    def flush(self, timeout_s: float) -> None:
        self.inner.flush(timeout_s)

    def commit(self, offsets: Mapping[tuple[str, int], int], *, wait: bool = True) -> None:
        self.inner.commit(offsets, wait=wait)

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.inner.seek(offsets)
        self.positions.update(offsets)

    def assignment(self) -> set[tuple[str, int]]:
        return set(self.inner.assignment())

    def committed(self) -> dict[tuple[str, int], int]:
        return dict(self.inner.committed())

    def end_offsets(self) -> dict[tuple[str, int], int]:
        return dict(self.inner.end_offsets())

    def unread(self) -> dict[tuple[str, int], int | None]:
        return dict(self.inner.unread())

    def produce_many(self, topic: str, keys: Sequence[bytes | None],
                     values: Sequence[bytes]) -> None:
        self.inner.produce_many(topic, keys, values)

    def stop_asking(self) -> None:
        """End the thread that asks the end offsets (a query in flight ends first: it uses
        the inner transport's client); before the inner transport closes."""
        self._asker.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        self.stop_asking()
        self.inner.close()
