"""The daemon's small HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``.

* ``/metrics`` — the injected registry in the Prometheus text format (or
  OpenMetrics when the scraper asks for it).
* ``/healthz`` — 200 while the process can answer at all (liveness).
* ``/readyz`` — 200 only when the readiness callback says ready (partitions
  assigned and consumer lag within the bound); otherwise 503 with a JSON
  ``{"ready": false, "reason": ...}``. A failing callback is "not ready",
  never a crash of the server.

The server runs in daemon threads (one per request) so a slow scrape never
blocks the loop; it binds ``127.0.0.1`` by default and port 0 picks a free port
(read it back from :attr:`MetricsServer.port`).

>>> from prometheus_client import CollectorRegistry
>>> import urllib.request
>>> server = MetricsServer(CollectorRegistry(), port=0, readiness=lambda: (False, "no partitions"))
>>> server.start()
>>> urllib.request.urlopen(server.url + "/healthz").status
200
>>> server.stop()
"""

from __future__ import annotations

import errno
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from streamlearn.errors import ConfigError
from streamlearn.stream.transport import Message, Transport

__all__ = ["LagTracker", "MetricsServer", "Readiness"]

_log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]
"""Returns ``(ready, reason)``; ``reason`` explains a ``False``."""

IDLE_TIMEOUT_S = 10.0
LISTEN_BACKLOG = 128


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    # a connection that sends nothing (or half a request) for this long is closed: without it
    # each idle client held a thread for good (an outside tester opened 1,000)
    timeout = IDLE_TIMEOUT_S

    def do_GET(self) -> None:
        path = urlparse(self.path).path.rstrip("/") or "/"
        if path == "/metrics":
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(self.server.registry), content_type)
        elif path == "/healthz":
            self._json(200, {"status": "ok"})
        elif path == "/readyz":
            ready, reason = self.server.check_ready()
            self._json(200 if ready else 503, {"ready": ready, "reason": reason})
        elif path == "/":
            body = b"streamlearn: /metrics /healthz /readyz\n"
            self._send(200, body, "text/plain; charset=utf-8")
        else:
            self._json(404, {"error": f"no such path {path!r}; try /metrics, /healthz, /readyz"})

    def do_HEAD(self) -> None:
        self.do_GET()

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, orjson.dumps(payload) + b"\n", "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood stderr; stay quiet."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG  # socketserver's 5 dropped SYNs under 10 concurrent clients

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry,
                 readiness: Readiness | None) -> None:
        self.registry = registry
        self.readiness = readiness
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-request (a scrape timeout, a half-open connection) is
        its own business: a debug line, not a traceback on stderr per connection."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            _log.debug("HTTP client %s went away: %r", client_address, exc)
            return
        _log.warning("HTTP request from %s failed", client_address, exc_info=True)

    def check_ready(self) -> tuple[bool, str]:
        if self.readiness is None:
            return True, ""
        try:
            ready, reason = self.readiness()
        except Exception as exc:  # a broken check means "not ready", never a dead server
            return False, f"readiness check failed: {exc!r}"
        return bool(ready), str(reason)


class MetricsServer:
    """Serve ``registry`` and the health endpoints on ``host:port`` in a background thread.

    Parameters
    ----------
    registry : CollectorRegistry
        What ``/metrics`` exposes.
    host : str
        Bind address; ``127.0.0.1`` keeps it local, ``0.0.0.0`` exposes it.
    port : int
        TCP port; 0 picks a free one.
    readiness : callable, optional
        ``() -> (ready, reason)`` for ``/readyz``; always ready when omitted.
    """

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0,
                 readiness: Readiness | None = None) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"metrics.port must be an integer in [0, 65535]. Got {port}.")
        self.registry, self.host, self.requested_port = registry, host, port
        self.readiness = readiness
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and start serving; raises ConfigError when the address is unusable."""
        try:
            self._server = _Server((self.host, self.requested_port), self.registry, self.readiness)
        except OSError as exc:
            advice = ("; another process (a second serve?) holds that port: pass "
                      "--metrics-port 0 for a free one (printed on start), or -1 for none"
                      if exc.errno == errno.EADDRINUSE else "")
            raise ConfigError(f"metrics endpoint cannot listen on {self.host}:"
                              f"{self.requested_port}: {exc.strerror or exc}{advice}.") from exc
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="streamlearn-http", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        """The bound port (the free one chosen when 0 was requested)."""
        if self._server is None:
            raise RuntimeError("MetricsServer.start() has not been called")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        return f"http://{host}:{self.port}"

    def set_readiness(self, readiness: Readiness | None) -> None:
        """Install (or replace) the readiness callback, e.g. once the daemon exists."""
        self.readiness = readiness
        if self._server is not None:
            self._server.readiness = readiness

    def stop(self) -> None:
        """Stop serving and close the socket; idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: Longest wait between two tries to read the end offsets while they cannot be read.
MAX_RETRY_S = 30.0


class LagTracker:
    """A transport wrapper that measures consumer lag in the polling thread, for ``/readyz``.

    Kafka clients are not thread-safe, so the HTTP thread must not call the
    transport. Every ``refresh_s`` seconds, inside ``poll`` (the daemon's
    thread), this reads the end offsets and caches ``lag = Σ (end − next
    offset to read)`` over the assigned partitions; :meth:`readiness` only
    reads the cache. Positions come from the messages polled and from
    ``seek``; a partition not read yet counts from its committed offset (0
    when none).

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
                 on_lag: Callable[[int], None] | None = None, refresh_s: float = 1.0) -> None:
        self.inner, self.max_lag, self.is_serving = inner, max_lag, is_serving
        self.on_lag, self.refresh_s = on_lag, refresh_s
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
        now = time.monotonic()
        if now >= self._next_refresh:
            if self.refresh():
                self._retry_s = self.refresh_s
                self._next_refresh = now + self.refresh_s
            else:  # back off (2 s, doubling up to MAX_RETRY_S): a try may block
                self._retry_s = min(max(2.0 * self._retry_s, 1.0), MAX_RETRY_S)
                self._next_refresh = time.monotonic() + self._retry_s
        return messages

    def refresh(self) -> bool:
        """Measure the lag now (call from the polling thread only); False if it could not."""
        from streamlearn.errors import TransportError

        try:
            if self._start is None:
                self._start = dict(self.inner.committed())
            ends = self.inner.end_offsets()
        except TransportError as exc:
            self.lag, self.lag_error = None, f"cannot read offsets: {exc}"
            return False
        self.lag = int(sum(max(0, end - self.positions.get(tp, self._start.get(tp, 0)))
                           for tp, end in ends.items()))
        self.lag_error = ""
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

    def close(self) -> None:
        self.inner.close()
