"""MetricsServer: /metrics, /healthz, /readyz on a free loopback port."""

from __future__ import annotations

import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from streamlearn.errors import ConfigError
from streamlearn.service.http import MetricsServer
from streamlearn.service.metrics import PrometheusObserver


def get(url: str, accept: str | None = None) -> tuple[int, bytes, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers["Content-Type"]


@pytest.fixture()
def served() -> Iterator[tuple[MetricsServer, PrometheusObserver, list[tuple[bool, str]]]]:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    state = [(False, "no partitions assigned")]
    server = MetricsServer(registry, port=0, readiness=lambda: state[0])
    server.start()
    try:
        yield server, observer, state
    finally:
        server.stop()


def test_binds_loopback_free_port(served: tuple[MetricsServer, PrometheusObserver, list]) -> None:
    server = served[0]
    assert server.host == "127.0.0.1"
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"


def test_metrics_exposes_registry(served: tuple[MetricsServer, PrometheusObserver, list]) -> None:
    server, observer, _ = served
    observer.on_instances(42)
    status, body, content_type = get(server.url + "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["streamlearn_instances"].samples[0].value == 42
    status, body, content_type = get(server.url + "/metrics",
                                     accept="application/openmetrics-text; version=1.0.0")
    assert status == 200 and content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")


def test_healthz_and_readyz(served: tuple[MetricsServer, PrometheusObserver, list]) -> None:
    server, _, state = served
    assert get(server.url + "/healthz")[0] == 200
    status, body, content_type = get(server.url + "/readyz")
    assert status == 503 and content_type == "application/json"
    assert orjson.loads(body) == {"ready": False, "reason": "no partitions assigned"}
    state[0] = (True, "")
    status, body, _ = get(server.url + "/readyz")
    assert status == 200 and orjson.loads(body)["ready"] is True


def test_broken_readiness_is_not_ready_and_server_survives() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    with MetricsServer(CollectorRegistry(), port=0, readiness=broken) as server:
        status, body, _ = get(server.url + "/readyz")
        assert status == 503 and "boom" in orjson.loads(body)["reason"]
        assert get(server.url + "/healthz")[0] == 200


def test_no_readiness_callback_means_ready_and_it_can_be_set_later() -> None:
    with MetricsServer(CollectorRegistry(), port=0) as server:
        assert get(server.url + "/readyz")[0] == 200
        server.set_readiness(lambda: (False, "lag 50 > 10"))
        assert get(server.url + "/readyz")[0] == 503


def test_unknown_path_is_404(served: tuple[MetricsServer, PrometheusObserver, list]) -> None:
    status, body, _ = get(served[0].url + "/nope")
    assert status == 404 and b"/metrics" in body


def test_port_in_use_is_a_config_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        server = MetricsServer(CollectorRegistry(), port=port)
        with pytest.raises(ConfigError, match=rf"cannot listen on 127\.0\.0\.1:{port}"):
            server.start()
    with pytest.raises(ConfigError, match=r"metrics\.port"):
        MetricsServer(CollectorRegistry(), port=70000)


def test_stop_is_idempotent_and_frees_the_port() -> None:
    server = MetricsServer(CollectorRegistry(), port=0)
    server.start()
    port = server.port
    server.stop()
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_lag_tracker_measures_lag_in_the_polling_thread() -> None:
    from streamlearn.transport.lag import LagTracker
    from streamlearn.transport.memory import InMemoryTransport

    inner = InMemoryTransport(partitions=2)
    for i in range(30):
        inner.append_instance(f"k{i}".encode(), b"{}")
    serving = [False]
    lags: list[int] = []
    # each poll asks anew and (wait_s) waits for the answer: the in-memory broker's comes in µs
    tracker = LagTracker(inner, max_lag=10, is_serving=lambda: serving[0], on_lag=lags.append,
                         refresh_s=0.0, wait_s=30.0)
    assert tracker.readiness() == (False, "not serving (starting, restoring a checkpoint or "
                                          "stopping)")
    serving[0] = True
    assert tracker.readiness()[0] is False  # not measured yet
    got = tracker.poll(12, 0.0)
    assert len(got) == 12
    assert tracker.lag == 18 and lags == [18]
    ready, reason = tracker.readiness()
    assert not ready and "consumer lag 18 > bound 10" in reason
    tracker.poll(100, 0.0)
    assert tracker.lag == 0 and tracker.readiness()[0] is True
    tracker.seek({(inner.instances_topic, 0): 0})  # seeking back shows up as lag at once
    tracker.refresh()
    assert tracker.lag is not None and tracker.lag > 0


def test_lag_tracker_counts_unread_partitions_from_committed_offsets() -> None:
    from streamlearn.transport.lag import LagTracker
    from streamlearn.transport.memory import InMemoryBroker, InMemoryTransport

    broker = InMemoryBroker()
    first = InMemoryTransport(broker=broker)
    for i in range(8):
        first.append_instance(f"k{i}".encode(), b"{}")
    first.commit({(first.instances_topic, 0): 5})
    tracker = LagTracker(InMemoryTransport(broker=broker), max_lag=100, refresh_s=0.0)
    tracker.refresh()
    assert tracker.lag == 3
    assert tracker.assignment() == first.assignment()


def test_lag_tracker_backs_off_while_the_offsets_cannot_be_read(monkeypatch: Any) -> None:
    """Each try may block the serving loop (up to the transport's request timeout): while the
    broker is away the tracker tries again after 2, 4, 8, ... 30 s (polls come every 0.1 s
    here), and once a second again after it answers."""
    from streamlearn.errors import TransportError
    from streamlearn.transport import lag as http
    from streamlearn.transport.memory import InMemoryTransport

    now = [1000.0]
    monkeypatch.setattr(http.time, "monotonic", lambda: now[0])
    inner = InMemoryTransport()
    tries: list[float] = []
    broker_up = [False]
    real_end_offsets = inner.end_offsets

    def end_offsets() -> Any:
        tries.append(now[0])
        if not broker_up[0]:
            raise TransportError("could not read end offsets: KafkaTimeoutError")
        return real_end_offsets()

    monkeypatch.setattr(inner, "end_offsets", end_offsets)
    # (the poll that asks waits for the answer: the fake clock moves on only after it)
    tracker = http.LagTracker(inner, max_lag=10, refresh_s=1.0, wait_s=30.0)
    for _ in range(1200):  # two minutes of polls, ten a second
        tracker.poll(10, 0.0)
        now[0] += 0.1
    gaps = np.diff(tries)
    assert np.allclose(gaps[:6], [2.0, 4.0, 8.0, 16.0, 30.0, 30.0], atol=0.15), gaps
    assert len(tries) <= 9 and tracker.lag is None and "cannot read offsets" in tracker.lag_error
    broker_up[0] = True
    while tracker.lag is None:
        tracker.poll(10, 0.0)
        now[0] += 0.1
    count = len(tries)
    for _ in range(50):
        tracker.poll(10, 0.0)
        now[0] += 0.1
    assert 4 <= len(tries) - count <= 5 and tracker.lag == 0  # once a second again


def test_a_slow_end_offsets_answer_does_not_hold_the_polling_thread() -> None:
    """The end offsets are asked beside the loop: while the broker takes its time (3 s, the
    offsets timeout, seen in CI), polls go on after the short wait and the answer is taken
    at a poll after it came; close() waits for a query in flight before the transport
    closes."""
    import threading

    from streamlearn.transport.lag import LagTracker
    from streamlearn.transport.memory import InMemoryTransport

    inner = InMemoryTransport()
    for i in range(7):
        inner.append_instance(f"k{i}".encode(), b"{}")
    answer = threading.Event()
    real_end_offsets = inner.end_offsets
    asked_on: list[str] = []

    def slow_end_offsets() -> Any:
        asked_on.append(threading.current_thread().name)
        assert answer.wait(30)
        return real_end_offsets()

    inner.end_offsets = slow_end_offsets  # type: ignore[method-assign]
    lags: list[int] = []
    tracker = LagTracker(inner, max_lag=100, on_lag=lags.append, refresh_s=0.0, wait_s=0.05)
    began = time.monotonic()
    for _ in range(20):
        tracker.poll(2, 0.0)
    assert time.monotonic() - began < 5.0  # 20 polls, the first waiting 0.05 s, none 30
    assert tracker.lag is None and lags == [] and len(asked_on) == 1  # one query in flight
    assert asked_on[0].startswith("streamlearn-lag")
    answer.set()
    wait_until = time.monotonic() + 30
    while tracker.lag is None and time.monotonic() < wait_until:
        tracker.poll(2, 0.0)
        time.sleep(0.01)
    assert tracker.lag == 0 and lags[0] == 0  # every message was read by then
    answer.clear()
    tracker.poll(1, 0.0)  # refresh_s 0: asks again, and that one hangs until released
    closing = threading.Timer(0.2, answer.set)
    closing.start()
    tracker.close()  # waits for the query, then closes the transport
    closing.join()
    assert len(asked_on) >= 2


def test_clients_that_go_away_mid_request_print_no_traceback(
        capfd: pytest.CaptureFixture[str]) -> None:
    """A scrape that times out, or a half-open connection closed with a reset, used to print
    a BrokenPipeError / ConnectionResetError traceback on stderr per connection."""
    with MetricsServer(CollectorRegistry(), port=0) as server:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-a: ")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # a reset, mid-request
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # gone before the answer is written
        time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as r:
            assert r.status == 200
    assert "Traceback" not in capfd.readouterr().err


def test_idle_and_half_sent_connections_are_closed_and_many_clients_are_served(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An outside tester held a server thread per idle connection for good, and 10 concurrent
    clients overflowed socketserver's listen backlog of 5 (dropped SYNs, seconds of retries)."""
    from concurrent.futures import ThreadPoolExecutor

    from streamlearn.service import http
    assert http._Handler.timeout is not None and 0 < http._Handler.timeout <= 30  # the default
    assert http._Server.request_queue_size >= 64
    monkeypatch.setattr(http._Handler, "timeout", 0.5)  # the mechanism, without a 10 s wait
    server = MetricsServer(CollectorRegistry(), port=0)
    server.start()
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(20)]
        idle[0].sendall(b"GET /metr")  # half a request
        time.sleep(1.5)
        for conn in idle:  # the server has hung up on each: a read returns at once, empty
            assert conn.recv(1024) == b""
            conn.close()
        with ThreadPoolExecutor(64) as pool:
            codes = list(pool.map(lambda _: get(f"{server.url}/healthz")[0], range(256)))
        assert codes == [200] * 256
    finally:
        server.stop()
