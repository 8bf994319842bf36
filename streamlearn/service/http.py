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
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

import orjson
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from streamlearn.errors import ConfigError

__all__ = ["MetricsServer", "Readiness"]

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
