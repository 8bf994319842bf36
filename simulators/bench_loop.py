"""The daemon's loop in memory against the least any daemon must do, and against another commit.

Three rates on the same pre-encoded stream (SynNonSep, dense ``x`` of d = 400,
K = 9; every instance followed by its feedback, stamped in event-time order,
all on an in-memory transport — no broker, no simulator in the timing):

* **bare relay**: for each message ``orjson.loads``; each instance into a numpy
  row; one decision per instance encoded with ``orjson.dumps`` — the least a
  daemon must do;
* **loop**: ``Daemon.step`` until every message is consumed (decode, decide,
  publish, join, learn; no checkpoints);
* **loop at another commit** (``--compare-with DIR``: a checkout of that
  commit): the same loop on that commit's code, alternating with this one
  (A B A B), so both see the same machine.

Every figure is measured the same way: one fresh process per checkout and repeat
(``PYTHONPATH`` = the checkout) builds the stream, runs the relay and the loop once
to warm up, then times each once. (Until 2026-12-01 late evening this checkout's
loop ran warm inside the benchmark's own process while the other commit's ran cold
in a subprocess, which favoured this checkout by 20-40 %: docs/performance.md.)

With ``--candidates N`` the same three rates are measured in candidate mode:
requests of N candidates with d_c = 45 dense features each (the shape of the
OHSUMED candidate stream), one reward per request; the bare relay decodes each
request's candidates into one (N, 45) array and encodes a decision naming one
candidate; the loop is the daemon's ``step`` in candidate mode with LinUCB, one slot.

Usage::

    python -m simulators.bench_loop [--events 50000] [--repeats 3] [--compare-with /tmp/old]
    python -m simulators.bench_loop --candidates 100 --events 5000   # requests of 100 candidates
    python -m simulators.bench_loop --events 6000 --arrivals 4   # micro-batches of 4 messages
    python -m simulators.bench_loop --events 6000 --arrivals 4 --pending 200000   # the join full
    python -m simulators.bench_loop --caller-only --events 200000   # serve's simulated caller alone
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

K, D = 9, 400


LAG = 1000  # feedback for event i comes with the instances of event i + LAG


def stream(n: int, seed: int = 0) -> tuple[list[tuple[str, bytes, bytes, int]], np.ndarray]:
    """(topic, key, value, timestamp_ms) in event-time order; each feedback ``LAG`` events after
    its instance (it can only follow the decision)."""
    try:
        from streamlearn.datasets.synthetic import synthetic_stream
    except ImportError:  # a commit from before the library stood alone
        from simulators.synthetic import synthetic_stream  # type: ignore[no-redef]

    X, y = synthetic_stream(n, noise=0.05, seed=seed)
    # stamped in the past, ending now: a time more than the join's clock skew ahead of the
    # wall clock is not believed, and a stream stamped from now on (2 ms an event) ran
    # ahead of it after ~2,500 events, sending most of the run down that rare path
    base = int(time.time() * 1000) - 2 * (n + LAG)
    out = []
    for i in range(n):
        key = f"e{i}".encode()
        out.append(("instances", key, orjson.dumps({"id": f"e{i}", "x": X[i].astype(float).tolist()}),
                    base + 2 * i))
        out.append(("feedback", key, orjson.dumps({"id": f"e{i}", "reward": float(y[i] == 0)}),
                    base + 2 * (i + LAG) + 1))
    out.sort(key=lambda m: m[3])
    return out, y


D_C = 45  # candidate mode: features per candidate


def candidate_stream(n: int, per_request: int,
                     seed: int = 0) -> list[tuple[str, bytes, bytes, int]]:
    """Candidate mode: n requests of ``per_request`` candidates and their feedback, in
    event-time order (each feedback ``LAG`` requests after its request)."""
    rng = np.random.default_rng(seed)
    base = int(time.time() * 1000) - 2 * (n + LAG)  # in the past, as in stream()
    out = []
    for i in range(n):
        key = f"r{i}".encode()
        items = np.round(rng.random((per_request, D_C)), 6).tolist()
        request = {"id": f"r{i}", "candidates": [{"id": f"doc-{i}-{k}", "x": x}
                                                 for k, x in enumerate(items)]}
        out.append(("instances", key, orjson.dumps(request), base + 2 * i))
        out.append(("feedback", key, orjson.dumps({"id": f"r{i}", "reward": float(i % 3 == 0)}),
                    base + 2 * (i + LAG) + 1))
    out.sort(key=lambda m: m[3])
    return out


def candidate_bare_relay(messages: list[tuple[str, bytes, bytes, int]]) -> float:
    """Requests/s of the least a candidate daemon must do: parse, one array per request,
    one decision naming a candidate."""
    started = time.perf_counter()
    decisions, sets = [], []
    for topic, _key, value, _ts in messages:
        obj = orjson.loads(value)
        if topic == "instances":
            candidates = obj["candidates"]
            sets.append(np.asarray([c["x"] for c in candidates], dtype=np.float64))
            decisions.append(orjson.dumps({"id": obj["id"], "candidates": [
                {"id": candidates[0]["id"], "prob": 1.0}]}))
    return len(decisions) / (time.perf_counter() - started)


def candidate_loop_rate(messages: list[tuple[str, bytes, bytes, int]]) -> float:
    """Requests/s of the daemon's ``step`` in candidate mode over the whole stream."""
    from streamlearn.candidates.learners import CandidateLinUCB
    from streamlearn.service.daemon import Daemon, DaemonSettings
    from streamlearn.service.settings import CandidatesConfig, JoinConfig, LearnerConfig, LimitsConfig

    settings = DaemonSettings(
        learner=LearnerConfig(n_actions=2, n_features=2 * D_C), join=JoinConfig(window_seconds=1e9),
        limits=LimitsConfig(poll_timeout_seconds=0.0),
        candidates=CandidatesConfig(enabled=True, shared_features=0, candidate_features=D_C))
    return _drained_rate(Daemon(settings, _in_memory(messages),
                                         CandidateLinUCB(0, D_C, seed=1)), len(messages))


def _in_memory(messages: list[tuple[str, bytes, bytes, int]]) -> Any:
    from streamlearn.transport.memory import InMemoryTransport

    transport = InMemoryTransport(partitions=1)
    for topic, key, value, ts in messages:
        transport.broker.append(topic, key, value, 0, ts)
    return transport


def _drained_rate(daemon: Any, n_messages: int) -> float:
    """Instances/s of ``daemon.step`` until every message is consumed; each instance's
    feedback must have joined."""
    started = time.perf_counter()
    while daemon.counters.messages < n_messages:
        daemon.step()
    elapsed = time.perf_counter() - started
    assert daemon.counters.feedback["joined"] == n_messages // 2, daemon.counters.feedback
    return float(daemon.counters.instances / elapsed)


def bare_relay(messages: list[tuple[str, bytes, bytes, int]]) -> float:
    started = time.perf_counter()
    decisions = []
    rows = []
    for topic, _key, value, _ts in messages:
        obj = orjson.loads(value)
        if topic == "instances":
            rows.append(np.asarray(obj["x"], dtype=np.float64))
            decisions.append(orjson.dumps({"id": obj["id"], "action": 0, "prob": 1.0}))
    return len(decisions) / (time.perf_counter() - started)


def loop_rate(messages: list[tuple[str, bytes, bytes, int]], arrivals: int = 0,
              pending: int = 0) -> float:
    """Events/s of ``Daemon.step`` over the whole stream (works on old and new commits alike).

    ``arrivals`` > 0: the messages reach the transport that many at a time and the loop
    steps until it has consumed them before the next arrive (only the steps are timed):
    the micro-batches of ordinary load, where each step's fixed costs count. ``pending``:
    that many decisions whose feedback never comes are made first (untimed)."""
    from streamlearn.learners.banditron import Banditron
    from streamlearn.learners.exploration import FixedGamma
    from streamlearn.service.daemon import Daemon, DaemonSettings
    from streamlearn.service.settings import JoinConfig, LearnerConfig, LimitsConfig
    from streamlearn.transport.memory import InMemoryTransport

    settings = DaemonSettings(learner=LearnerConfig(n_actions=K, n_features=D),
                              join=JoinConfig(window_seconds=1e9),
                              limits=LimitsConfig(poll_timeout_seconds=0.0))
    learner = Banditron(K, D, FixedGamma(0.05), seed=1)
    if not arrivals:
        return _drained_rate(Daemon(settings, _in_memory(messages), learner), len(messages))
    transport = InMemoryTransport(partitions=1)
    daemon = Daemon(settings, transport, learner)
    if pending:
        _fill(daemon, transport, messages, pending)
    spent = 0.0
    for at in range(0, len(messages), arrivals):
        for topic, key, value, ts in messages[at:at + arrivals]:
            transport.broker.append(topic, key, value, 0, ts)
        started = time.perf_counter()
        while daemon.counters.messages - pending < min(at + arrivals, len(messages)):
            daemon.step()
        spent += time.perf_counter() - started
    assert daemon.counters.feedback["joined"] == len(messages) // 2, daemon.counters.feedback
    return float((daemon.counters.instances - pending) / spent)


def _fill(daemon: Any, transport: Any, messages: list[tuple[str, bytes, bytes, int]],
          pending: int) -> None:
    """``pending`` decisions whose feedback never comes, made before the stream (their
    instances stamped 1 ms apart before its first): an ad server's unanswered impressions."""
    rows = [orjson.loads(value)["x"] for topic, _k, value, _t in messages[:200]
            if topic == "instances"]
    first = min(ts for _t, _k, _v, ts in messages)
    for i in range(pending):
        transport.broker.append("instances", f"p{i}".encode(),
                                orjson.dumps({"id": f"p{i}", "x": rows[i % len(rows)]}), 0,
                                first - pending + i)
    while daemon.counters.messages < pending:
        daemon.step()


def caller_rate(n: int) -> float:
    """Events/s of the embedded default's simulated caller alone: SynNonSep instances
    generated and encoded, one decision per instance read back, its feedback written."""
    from streamlearn.datasets.caller import SimulatedCaller, StreamSource

    caller = SimulatedCaller(StreamSource("synnonsep", seed=1), delay_mean_s=0.0)
    chunk, now = 256, 0.0
    started = time.perf_counter()
    for _ in range(0, n, chunk):
        fresh = caller.instances(chunk, now)
        caller.answer([orjson.dumps({"id": key.decode(), "action": 0, "prob": 0.9})
                       for key, _ in fresh], now)
        caller.due(now)
        now += 0.01
    return caller.stats.instances_sent / (time.perf_counter() - started)


THIS_CHECKOUT = str(Path(__file__).resolve().parents[1])


def _measured(directory: str, events: int, candidates: int, arrivals: int,
              pending: int) -> dict[str, float]:
    """{"relay", "loop"} rates of a fresh process on ``directory``'s code (see the module doc)."""
    env = {**os.environ, "PYTHONPATH": directory, "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, __file__, "--events", str(events), "--loop-only",
                           "--candidates", str(candidates), "--arrivals", str(arrivals),
                           "--pending", str(pending)],
                          capture_output=True, text=True, env=env, check=True, cwd=directory)
    rates = json.loads(done.stdout.strip().splitlines()[-1])
    return {"relay": float(rates["relay"]), "loop": float(rates["loop"])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-with", metavar="DIR",
                        help="a checkout of another commit to measure the same loop on")
    parser.add_argument("--candidates", type=int, default=0, metavar="N",
                        help="candidate mode: requests of N candidates (0: fixed actions)")
    parser.add_argument("--arrivals", type=int, default=0, metavar="N",
                        help="fixed actions: messages reach the loop N at a time (instances "
                             "and feedback alike) and it steps until it has read them: the "
                             "micro-batches of ordinary load (0: the whole stream at once)")
    parser.add_argument("--pending", type=int, default=0, metavar="N",
                        help="with --arrivals: N decisions whose feedback never comes are made "
                             "first, untimed (an ad server's unanswered impressions; at the "
                             "join's default bound of 200,000 every step then sheds)")
    parser.add_argument("--loop-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--caller-only", action="store_true",
                        help="time only the simulated caller of `serve`'s embedded default "
                             "(no daemon): the ceiling of that default's events/s")
    args = parser.parse_args(argv)
    if args.caller_only:
        for r in range(args.repeats):
            rate = caller_rate(args.events)
            print(f"simulated caller alone, repeat {r + 1}/{args.repeats}: {rate:,.0f} events/s "
                  f"({1e6 / rate:.1f} µs per event)")
        return 0
    if args.candidates < 0:
        parser.error(f"argument --candidates: expected an integer >= 0, got {args.candidates}")
    if args.pending < 0 or (args.pending and not args.arrivals):
        parser.error(f"argument --pending: expected an integer >= 0 with --arrivals, got "
                     f"{args.pending}" + ("" if args.arrivals else " without --arrivals"))
    if args.arrivals < 0 or (args.arrivals and args.candidates):
        parser.error(f"argument --arrivals: expected an integer >= 0 with fixed actions, got "
                     f"{args.arrivals}" + (" with --candidates" if args.candidates else ""))
    relay: Callable[[list[tuple[str, bytes, bytes, int]]], float]
    loop: Callable[[list[tuple[str, bytes, bytes, int]]], float]
    if args.candidates:
        messages = candidate_stream(args.events, args.candidates)
        relay, loop = candidate_bare_relay, candidate_loop_rate
    else:
        messages = stream(args.events)[0]
        relay, loop = bare_relay, functools.partial(loop_rate, arrivals=args.arrivals,
                                                    pending=args.pending)
    if args.loop_only:  # one measuring process: warm up, then time each once
        try:  # as `serve` runs (a checkout from before it had this runs without it, as it did)
            from streamlearn.service.settings import without_hugepage_advice
            without_hugepage_advice()
        except ImportError:
            pass
        relay(messages)
        loop(messages)
        print(json.dumps({"relay": relay(messages), "loop": loop(messages)}))
        return 0
    rows: dict[str, list[float]] = {"bare relay": [], "loop": []}
    if args.compare_with:
        rows["loop at --compare-with"] = []
    for r in range(args.repeats):
        here = _measured(THIS_CHECKOUT, args.events, args.candidates, args.arrivals, args.pending)
        rows["bare relay"].append(here["relay"])
        rows["loop"].append(here["loop"])
        if args.compare_with:
            rows["loop at --compare-with"].append(
                _measured(args.compare_with, args.events, args.candidates, args.arrivals,
                          args.pending)["loop"])
        print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(
            f"{k} {v[-1]:,.0f}/s" for k, v in rows.items()), file=sys.stderr, flush=True)
    med: dict[str, Any] = {k: float(np.median(v)) for k, v in rows.items()}
    unit = "requests/s" if args.candidates else "events/s"
    print(f"{'system':<28}{unit + ' (median of ' + str(args.repeats) + ')':>28}")
    for k, v in med.items():
        print(f"{k:<28}{v:>28,.0f}")
    print(f"loop / bare relay = {med['loop'] / med['bare relay']:.2f}")
    if args.compare_with:
        print(f"loop / loop at --compare-with = {med['loop'] / med['loop at --compare-with']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
