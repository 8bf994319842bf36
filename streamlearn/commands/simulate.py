"""``streamlearn simulate``: the stand-in for the ad server, against a real Kafka.

It publishes instance events from a dataset (with ``label``, used only for
metrics) at ``--rate`` events per second, reads the decisions streamlearn
publishes, and answers each one of its own events with feedback
``reward = 1[action == label]`` after an exponential delay of mean
``--delay-mean`` seconds — or never, with probability ``--drop``. Event ids are
``<run-id>-<n>`` so several runs against one daemon never collide. At the end
it prints a summary: instances sent, decisions received, feedback sent,
dropped, and the reward rate of the played actions; while it runs, a progress
line every ``--progress-seconds`` (on stderr with ``--json``).

Required: ``--rate``, and the broker — ``--bootstrap`` (or
STREAMLEARN_KAFKA_BOOTSTRAP, or ``bootstrap`` in the ``[kafka]`` table of
``--config``). ``simulate`` has no embedded mode.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from streamlearn.commands.progress import ProgressLine
from streamlearn.commands.serve import (
    add_config_arguments,
    add_logging_arguments,
    cli_overrides,
    cli_spellings,
    configure_logging,
)
from streamlearn.commands.stream_options import integer, number
from streamlearn.config import load_config
from streamlearn.errors import ConfigError, TransportError

__all__ = ["SimulationSummary", "add_parser", "run", "simulate"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "simulate", help="publish a dataset as instances and answer decisions with feedback",
        description=(__doc__ or "").replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("simulation")
    group.add_argument("--config", metavar="FILE", help="TOML file for [kafka] and [topics]")
    group.add_argument("--dataset", default="synnonsep", metavar="NAME",
                       help="dataset to stream (synsep, synnonsep, letter, pendigits, ...; "
                            "candidate-set requests: ohsumed-candidates, synthetic-candidates; "
                            "default synnonsep)")
    group.add_argument("--slots", type=integer, default=1, metavar="K",
                       help="slots per candidate-set request (default 1)")
    group.add_argument("--data-dir", metavar="DIR",
                       help="where the datasets live (default: $STREAMLEARN_DATA_DIR, "
                            "../shared/datasets, then the user cache)")
    group.add_argument("--fetch", action="store_true",
                       help="download missing built-in data (verified by sha256) into the "
                            "data dir")
    group.add_argument("--rate", type=number, required=True, metavar="EV_PER_S",
                       help="required, no default: instances per second; 0 = as fast as "
                            "possible")
    group.add_argument("--events", type=integer, default=10_000, metavar="N",
                       help="instances to send (default 10000)")
    group.add_argument("--delay-mean", type=number, default=1.0, metavar="S",
                       help="mean feedback delay in seconds, exponential (default 1)")
    group.add_argument("--drop", type=number, default=0.0, metavar="P",
                       help="probability that a decision gets no feedback (default 0)")
    group.add_argument("--seed", type=integer, default=1, metavar="S", help="seed (default 1)")
    group.add_argument("--run-id", metavar="TEXT",
                       help="event id prefix (default: a fresh random one)")
    group.add_argument("--wait-seconds", type=number, default=30.0, metavar="S",
                       help="after the last instance, wait this long for missing decisions "
                            "(default 30)")
    group.add_argument("--json", action="store_true",
                       help="print the summary as JSON (progress lines then go to stderr)")
    group.add_argument("--progress-seconds", type=number, default=5.0, metavar="S",
                       help="print a progress line every S seconds; 0 = never (default 5)")
    add_logging_arguments(group)
    add_config_arguments(parser, sections=("kafka", "topics"), help_overrides={
        "kafka.bootstrap": "required (here, in STREAMLEARN_KAFKA_BOOTSTRAP or in the config "
                           "file): Kafka bootstrap servers HOST:PORT[,HOST:PORT]"})
    parser.set_defaults(run=run)


@dataclass
class SimulationSummary:
    """What one simulation run did."""

    run_id: str
    instances_sent: int = 0
    decisions_received: int = 0
    foreign_decisions: int = 0  # decisions for ids this run did not send
    repeated_decisions: int = 0  # copies of decisions answered already (a daemon re-publishing)
    feedback_sent: int = 0
    dropped: int = 0
    rewards: float = 0.0
    missing_decisions: int = 0
    seconds: float = 0.0
    sending_seconds: float = 0.0  # until the last instance was sent (then: waiting)

    def text(self) -> str:
        rate = self.instances_sent / self.seconds if self.seconds > 0 else 0.0
        answered = self.feedback_sent
        reward_rate = self.rewards / answered if answered else float("nan")
        sending = (f"; {self.instances_sent / self.sending_seconds:,.0f}/s over the "
                   f"{self.sending_seconds:.1f} s of sending, the rest waiting for decisions"
                   if 0 < self.sending_seconds < self.seconds else "")
        repeated = (f" (and {self.repeated_decisions} repeated copies, not answered again)"
                    if self.repeated_decisions else "")
        return (f"streamlearn simulate: run {self.run_id}: sent {self.instances_sent} instances "
                f"in {self.seconds:.1f} s ({rate:,.0f}/s{sending}); decisions received "
                f"{self.decisions_received}{repeated}; feedback sent {self.feedback_sent}; dropped "
                f"{self.dropped}; missing decisions {self.missing_decisions}; reward rate "
                f"{reward_rate:.4f}")


def _check(args: argparse.Namespace) -> None:
    from streamlearn.datasets.candidates import CANDIDATE_STREAMS

    def finite_at_least_0(x: float) -> bool:  # NaN and inf fail (an outside test: a traceback)
        return math.isfinite(x) and x >= 0

    problems = [
        (not finite_at_least_0(args.rate), f"--rate must be a finite number >= 0. Got {args.rate}."),
        (args.events < 1, f"--events must be an integer >= 1. Got {args.events}."),
        (not finite_at_least_0(args.delay_mean),
         f"--delay-mean must be a finite number >= 0. Got {args.delay_mean}."),
        (not 0 <= args.drop <= 1, f"--drop must be a number in [0, 1]. Got {args.drop}."),
        (args.slots < 1, f"--slots must be an integer >= 1. Got {args.slots}."),
        (args.slots > 1 and args.dataset not in CANDIDATE_STREAMS,
         f"--slots needs a candidate-set dataset ({', '.join(CANDIDATE_STREAMS)}). "
         f"Got {args.dataset!r}."),
        (not finite_at_least_0(args.wait_seconds),
         f"--wait-seconds must be a finite number >= 0. Got {args.wait_seconds}."),
        (not finite_at_least_0(args.progress_seconds),
         f"--progress-seconds must be a finite number >= 0. Got {args.progress_seconds}.")]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)


def run(args: argparse.Namespace) -> int:
    _check(args)
    config = load_config(args.config, cli=cli_overrides(args), cli_spellings=cli_spellings())
    if config.kafka.bootstrap is None:
        raise ConfigError("kafka.bootstrap must be HOST:PORT[,HOST:PORT...] for simulate. Got "
                          "nothing (use --bootstrap or STREAMLEARN_KAFKA_BOOTSTRAP).")
    configure_logging(args.log_level, args.library_log_level)
    summary = simulate(config, dataset=args.dataset, data_dir=args.data_dir, fetch=args.fetch,
                       rate=args.rate,
                       events=args.events, delay_mean_s=args.delay_mean, drop=args.drop,
                       seed=args.seed, run_id=args.run_id, wait_s=args.wait_seconds,
                       progress_s=args.progress_seconds, slots=args.slots,
                       progress_out=sys.stderr if args.json else sys.stdout)
    print(orjson.dumps(asdict(summary)).decode() if args.json else summary.text())
    return 0


def _clients(config: Any) -> tuple[Any, Any]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from streamlearn.transport.kafka import RECONNECT_BACKOFF_MAX_MS, ensure_topics

    k, t = config.kafka, config.topics
    options = {"reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS, **k.client_options()}
    ensure_topics(k.bootstrap, [t.instances, t.feedback, t.decisions, t.dead_letter],
                  t.partitions, client_options=options)
    producer = KafkaProducer(bootstrap_servers=k.bootstrap, acks="all", enable_idempotence=True,
                             linger_ms=5, client_id="streamlearn-simulate",
                             **{o: v for o, v in options.items()
                                if o in KafkaProducer.DEFAULT_CONFIG})
    consumer = KafkaConsumer(bootstrap_servers=k.bootstrap, group_id=None,
                             enable_auto_commit=False, client_id="streamlearn-simulate",
                             **{o: v for o, v in options.items()
                                if o in KafkaConsumer.DEFAULT_CONFIG})
    partitions = consumer.partitions_for_topic(t.decisions) or {0}
    assigned = [TopicPartition(t.decisions, p) for p in sorted(partitions)]
    consumer.assign(assigned)
    consumer.seek_to_end(*assigned)
    for tp in assigned:  # resolve the lazy seek now: only decisions made from here on count
        consumer.position(tp)
    return producer, consumer


def simulate(config: Any, dataset: str = "synnonsep", data_dir: str | None = None,
             rate: float = 0.0, events: int = 10_000, delay_mean_s: float = 1.0,
             drop: float = 0.0, seed: int = 1, run_id: str | None = None,
             wait_s: float = 30.0, chunk: int = 500, progress_s: float = 0.0,
             progress_out: Any = None, slots: int = 1, fetch: bool = False,
             ) -> SimulationSummary:
    """Run one simulation against ``config.kafka.bootstrap``; see the module docstring.

    The caller is the shared :class:`~streamlearn.datasets.caller.SimulatedCaller`
    (the embedded default runs the same one in process), or for a candidate-set
    dataset the :class:`~streamlearn.datasets.candidate_caller.CandidateCaller`
    (``slots`` per request). With ``progress_s > 0``
    a progress line goes to ``progress_out`` (default stdout) every
    ``progress_s`` seconds.
    """
    from kafka.errors import KafkaError

    from streamlearn.datasets.candidate_caller import make_caller

    summary = SimulationSummary(run_id or uuid.uuid4().hex[:8])
    caller = make_caller(dataset, data_dir, f"{summary.run_id}-", delay_mean_s, drop, seed, slots,
                         fetch=fetch)
    topics = config.topics
    try:
        producer, consumer = _clients(config)
    except KafkaError as exc:
        raise TransportError(f"cannot reach Kafka at {config.kafka.bootstrap}: {exc}") from exc
    started = time.monotonic()
    last_sent_at = None
    progress = ProgressLine("sent")
    next_progress = started + progress_s
    stats = caller.stats
    try:
        while True:
            now = time.monotonic()
            if progress_s > 0 and now >= next_progress:
                print(_progress_line(progress, caller), file=progress_out or sys.stdout,
                      flush=True)
                next_progress = now + progress_s
            if stats.instances_sent < events:
                owed = events - stats.instances_sent if rate == 0 else (
                    int((now - started) * rate) - stats.instances_sent)
                for key, value in caller.instances(min(owed, chunk, events - stats.instances_sent),
                                                   time.time()):
                    producer.send(topics.instances, key=key, value=value)
                if stats.instances_sent == events and last_sent_at is None:
                    last_sent_at = now
            decisions = [r.value for records in consumer.poll(timeout_ms=20, max_records=5000)
                         .values() for r in records]
            wall = time.time()  # the caller stamps feedback with it (event time)
            if decisions:
                caller.answer(decisions, wall)
            for key, value in caller.due(wall):
                producer.send(topics.feedback, key=key, value=value)
            awaiting = stats.instances_sent - stats.decisions_received
            if last_sent_at is not None and not caller.scheduled and (
                    not awaiting or now - last_sent_at > wait_s):
                break
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
        consumer.close()
    summary.instances_sent, summary.decisions_received = stats.instances_sent, stats.decisions_received
    summary.foreign_decisions = stats.foreign_decisions + stats.unparsable_decisions
    summary.repeated_decisions = stats.repeated_decisions
    summary.feedback_sent, summary.dropped = stats.feedback_sent, stats.dropped
    summary.rewards = stats.rewards_sent
    summary.missing_decisions = stats.instances_sent - stats.decisions_received
    summary.seconds = time.monotonic() - started
    summary.sending_seconds = (last_sent_at if last_sent_at is not None else time.monotonic()
                               ) - started
    return summary


def _progress_line(progress: ProgressLine, caller: Any) -> str:
    """The serve-style progress line; the error is that of the decisions answered so far."""
    stats = caller.stats
    answered = stats.feedback_sent
    return progress.line(stats.instances_sent, answered, answered - stats.rewards_sent, extra=[
        ("decisions", f"{stats.decisions_received:,}"), ("feedback", f"{answered:,}"),
        ("dropped", f"{stats.dropped:,}"),
        ("awaiting-decision", f"{stats.instances_sent - stats.decisions_received:,}"),
        ("awaiting-feedback", f"{caller.scheduled:,}")])
