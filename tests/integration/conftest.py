"""Real services for integration tests: a Kafka 4.x broker and Prometheus.

The broker is started once per session by ``deploy/kafka/kafka.sh`` on a free
loopback port in a temporary directory, and stopped at the end. Prometheus
instances are started per test by ``deploy/prometheus/run.sh``.

When a service cannot start, its tests are skipped with the reason, unless
``STREAMLEARN_REQUIRE_KAFKA=1`` is set, as CI does: then they fail with the
tail of the service's log. ``STREAMLEARN_REQUIRE_KAFKA=1`` requires Prometheus
too; ``STREAMLEARN_REQUIRE_PROMETHEUS=1`` requires Prometheus alone.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]
KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"
PROMETHEUS_SH = REPO / "deploy" / "prometheus" / "run.sh"
HERE = Path(__file__).resolve().parent


#: set by deploy/test.sh: a file that exists once the tests running beside these are done
OTHERS_DONE = "STREAMLEARN_OTHER_TESTS_DONE"


#: set by deploy/test.sh to split these tests between its two pytest processes: "main" runs
#: every integration test but those in BESIDE_FILES, "beside" runs only those (beside the
#: CPU-bound tests, each process with its own broker); unset runs them all
SHARE = "STREAMLEARN_INTEGRATION_SHARE"
#: about a sixth of the integration tests' time, none of them marked cpu_share: the broker
#: outages (they stop and restart their process's broker), the end-to-end run, the
#: candidate-mode rollout (an embedded daemon, no broker: about a minute) and the apprentice
#: across a SIGKILL. The main process waits for the other one before its cpu_share tests, so
#: the two are even when the main one's other tests end with the other process (CI on 2
#: cores: beside 13:21 and main 15:25 with the hostile messages here, 128 s of it waiting;
#: moved back to even them out; the apprentice joined when the rollout test became ~40 s
#: shorter)
BESIDE_FILES = frozenset({"test_broker_outage.py", "test_candidate_rollout.py",
                          "test_end_to_end.py", "test_apprentice.py"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test in this folder is an integration test; those marked ``cpu_share`` (they
    measure what a share of the CPU gives: a retrain's cadence, a guardrail's timing) run
    last, after the tests deploy/test.sh runs beside these (see :func:`_cpu_share`)."""
    share = os.environ.get(SHARE)
    if share not in (None, "", "main", "beside"):
        raise pytest.UsageError(f"{SHARE} must be main or beside. Got {share!r}.")
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if HERE in path.parents:
            item.add_marker(pytest.mark.integration)
            beside = path.name in BESIDE_FILES
            if (share == "main" and beside) or (share == "beside" and not beside):
                dropped.append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    if share == "beside" and any(item.get_closest_marker("cpu_share") for item in kept):
        raise pytest.UsageError("a cpu_share test cannot run beside the CPU-bound tests")
    # stable; the broker outages (they stop and restart their process's broker) go after the
    # other tests of their process, the cpu_share ones last
    items.sort(key=lambda item: (item.get_closest_marker("cpu_share") is not None,
                                 Path(str(item.fspath)).name == "test_broker_outage.py"))


@pytest.fixture(autouse=True)
def _no_daemon_left() -> Iterator[None]:
    """Kill the crash harness's daemons still running when a test ends (it failed before it
    stopped them), so none keeps a CPU busy through the tests after it."""
    from daemon_harness import STARTED

    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.fixture(autouse=True)
def _cpu_share(request: pytest.FixtureRequest) -> None:
    """A ``cpu_share`` test waits for the CPU-bound tests beside it to end: each such test
    loads the machine on purpose (a spinning process, a saturated loop) and allows for one
    more CPU-heavy process, not for a whole second test suite."""
    done = os.environ.get(OTHERS_DONE)
    if done and request.node.get_closest_marker("cpu_share") is not None:
        deadline = time.monotonic() + 3600
        while not Path(done).exists() and time.monotonic() < deadline:
            time.sleep(1.0)


def unavailable(reason: str, *require_envs: str) -> NoReturn:
    """Skip, or fail when any of ``require_envs`` is set to 1."""
    for name in require_envs:
        if os.environ.get(name) == "1":
            pytest.fail(f"{reason}\n({name}=1, so this is a failure)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


class KafkaBroker:
    """One broker process with a fixed port and log dir, so that it can restart in place."""

    def __init__(self, workdir: Path, port: int) -> None:
        self.workdir = workdir
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        self.startup_seconds = float("nan")

    def _run(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KAFKA_SH), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def start(self) -> None:
        """Start (or restart) the broker; raise RuntimeError with the log tail on failure."""
        began = time.monotonic()
        try:
            done = self._run("start", "--port", str(self.port), "--dir", str(self.workdir), timeout=150)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"kafka.sh start failed: {exc}") from exc
        if done.returncode != 0 or done.stdout.strip() != self.bootstrap:
            raise RuntimeError(
                f"kafka.sh start exited {done.returncode}: {done.stderr.strip()}\n"
                f"--- {self.workdir / 'kafka.log'} ---\n{_tail(self.workdir / 'kafka.log')}"
            )
        self.startup_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Stop the broker (SIGTERM, then SIGKILL); its data stays for a restart."""
        self._run("stop", "--dir", str(self.workdir), timeout=60)

    def running(self) -> bool:
        return self._run("status", "--dir", str(self.workdir), timeout=30).returncode == 0


def _ensure_jars() -> str | None:
    """Fetch the broker's jars if missing; return an error text, or None when present."""
    lib = KAFKA_SH.parent / "lib"
    if any(lib.glob("kafka_2.13-*.jar")):
        return None
    try:
        done = subprocess.run(
            [str(KAFKA_SH), "fetch"], capture_output=True, text=True, timeout=900, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"kafka.sh fetch failed: {exc}"
    if done.returncode != 0:
        return f"kafka.sh fetch exited {done.returncode}: {done.stderr.strip()[-2000:]}"
    return None


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A fresh single-node KRaft broker for the whole session."""
    problem = _ensure_jars()
    if problem:
        unavailable(f"no Kafka broker: {problem}", "STREAMLEARN_REQUIRE_KAFKA")
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"), free_port())
    try:
        broker.start()
    except RuntimeError as exc:
        problem = str(exc)
    if problem:
        broker.stop()
        unavailable(f"no Kafka broker: {problem}", "STREAMLEARN_REQUIRE_KAFKA")
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """``host:port`` of the session's broker."""
    return kafka_broker.bootstrap


@pytest.fixture
def kafka_control(kafka_broker: KafkaBroker) -> Iterator[KafkaBroker]:
    """The session broker, for tests that stop and restart it (same port and log dir).

    Whatever the test does, the broker is running again afterwards.
    """
    yield kafka_broker
    if not kafka_broker.running():
        kafka_broker.start()


class PrometheusServer:
    """A running Prometheus and a small client for its HTTP API."""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir

    def query(self, expr: str) -> list[dict[str, object]]:
        """Run an instant query; return ``data.result`` (a list of samples)."""
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(address, timeout=5) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise AssertionError(f"query {expr!r} failed: {body}")
        result: list[dict[str, object]] = body["data"]["result"]
        return result

    def wait_for(
        self,
        expr: str,
        predicate: Callable[[list[dict[str, object]]], bool] = bool,
        timeout_s: float = 30.0,
    ) -> list[dict[str, object]]:
        """Query ``expr`` until ``predicate(result)`` holds; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        result: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            result = self.query(expr)
            if predicate(result):
                return result
            time.sleep(0.5)
        raise AssertionError(
            f"{expr!r} did not satisfy the predicate within {timeout_s} s; last result {result}\n"
            f"--- {self.workdir / 'prometheus.log'} ---\n{_tail(self.workdir / 'prometheus.log')}"
        )

    def stop(self) -> None:
        subprocess.run(
            [str(PROMETHEUS_SH), "stop", "--dir", str(self.workdir)],
            capture_output=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory: ``prometheus("127.0.0.1:PORT")`` starts one scraping that target every 1 s."""
    started: list[PrometheusServer] = []

    def start(target: str, metrics_path: str = "/metrics") -> PrometheusServer:
        workdir = tmp_path / f"prometheus-{len(started)}"
        try:
            done = subprocess.run(
                [
                    str(PROMETHEUS_SH),
                    "start",
                    "--target",
                    target,
                    "--dir",
                    str(workdir),
                    "--metrics-path",
                    metrics_path,
                ],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            unavailable(
                f"no Prometheus: {exc}", "STREAMLEARN_REQUIRE_PROMETHEUS", "STREAMLEARN_REQUIRE_KAFKA"
            )
        if done.returncode != 0:
            unavailable(
                f"no Prometheus: run.sh exited {done.returncode}: {done.stderr.strip()}",
                "STREAMLEARN_REQUIRE_PROMETHEUS",
                "STREAMLEARN_REQUIRE_KAFKA",
            )
        server = PrometheusServer(done.stdout.strip(), workdir)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
