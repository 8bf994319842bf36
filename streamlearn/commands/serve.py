"""``streamlearn serve``: run the daemon (Kafka, or the embedded simulator when none is set).

Configuration comes from ``--config FILE`` (TOML), ``STREAMLEARN_*``
environment variables and the flags below (flags win, then the environment,
then the file). Every setting has all three names; docs/configuration.md
lists them. Without ``--bootstrap`` the daemon runs against the embedded
transport: an in-process simulator streams SynNonSep and answers every
decision with delayed feedback, so the progress lines show it learning.

SIGTERM / SIGINT stop the loop after the current batch and write a final
checkpoint (exit 0); a SIGTERM while the daemon starts stops it as soon as it
runs. ``--max-events N`` does the same after N instances.

``--help`` lists the options of a first run; ``--help-all`` every setting.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import logging
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector, disable_created_metrics

from streamlearn.commands.progress import ProgressLine, number_or_dash
from streamlearn.commands.stream_options import integer, number
from streamlearn.config import (
    Config,
    check_baseline_action,
    env_name,
    field_specs,
    flag_name,
    load_config,
)
from streamlearn.errors import ConfigError
from streamlearn.service.http import MetricsServer
from streamlearn.service.metrics import PrometheusObserver
from streamlearn.service.settings import (
    DAEMON_GC_THRESHOLDS,
    DaemonSettings,
    without_hugepage_advice,
)
from streamlearn.transport.lag import LagTracker
from streamlearn.transport.protocol import Transport

if TYPE_CHECKING:
    from streamlearn.durability.changelog import Changelog
    from streamlearn.learners.base import Learner
    from streamlearn.service.daemon import Daemon
    from streamlearn.service.metrics import Observer

__all__ = ["add_config_arguments", "add_logging_arguments", "add_parser", "cli_overrides",
           "cli_spellings", "configure_logging", "run", "serve"]

#: Short spellings for the most used settings (the long --<section>-<field> forms also work);
#: --data-dir is the spelling every command that reads a dataset shares.
ALIASES = {"kafka.bootstrap": ["--bootstrap"], "learner.name": ["--learner"],
           "exploration.name": ["--exploration"], "exploration.gamma": ["--gamma"],
           "learner.seed": ["--seed"], "embedded.data_dir": ["--data-dir"],
           "rollout.mode": ["--rollout"]}
def cli_spellings() -> dict[str, str]:
    """How the command line spells each setting that has an alias (for errors)."""
    return {key: " or ".join([flag_name(*key.split(".", 1)), *aliases])
            for key, aliases in ALIASES.items()}


#: Flags without a value that set a boolean setting to true (as replay's and bench's --fetch).
SWITCHES = {"embedded.fetch": "--fetch"}
#: What ``serve --help`` shows: the options a first run needs (``--help-all``: every one).
FIRST_RUN_OPTIONS = frozenset({
    "--help", "--help-all", "--config", "--max-events", "--progress-seconds", "--print-config",
    "--log-level", "--bootstrap", "--learner", "--exploration", "--gamma", "--seed",
    "--learner-n-actions", "--learner-n-features", "--checkpoint-dir", "--metrics-port",
    "--metrics-host", "--embedded-dataset", "--data-dir", "--fetch", "--candidates-enabled"})
_USAGE = ("%(prog)s [--config FILE] [--bootstrap HOST:PORT] [--checkpoint-dir DIR] "
          "[--max-events N] [OPTION ...]")
_DEST = "cfg__"


def _metavar(fs: Any) -> str:
    if fs.choices:
        return "{" + ",".join(fs.choices) + "}"
    if fs.kind == "hostports":
        return "HOST:PORT"
    if fs.kind == "file":
        return "FILE"
    if fs.kind in ("path", "dir"):
        return "DIR"
    if fs.kind == "weights":
        return "TYPE=WEIGHT,..."
    if fs.kind == "constant-action":
        return "constant:A"
    return {int: "N", float: "X", bool: "{true,false}"}.get(fs.base, "TEXT")


def add_config_arguments(parser: argparse.ArgumentParser,
                         sections: tuple[str, ...] | None = None,
                         help_overrides: dict[str, str] | None = None) -> None:
    """One flag per Config field, grouped by section; values are validated by load_config.

    ``help_overrides`` replaces the help of some fields (``{"section.field": text}``) for
    a command where the generic text is wrong (``simulate`` needs ``kafka.bootstrap``).
    """
    groups: dict[str, Any] = {}
    for fs in field_specs():
        if sections is not None and fs.section not in sections:
            continue
        if fs.section not in groups:
            groups[fs.section] = parser.add_argument_group(
                f"[{fs.section}]", f"config file table [{fs.section}]")
        default = shown_default(fs.default)
        override = (help_overrides or {}).get(fs.key)
        help_text = (f"{override} (env {env_name(fs.section, fs.name)})" if override else
                     f"{fs.help} (default {default}; env {env_name(fs.section, fs.name)})"
                     ).replace("%", "%%")
        dest = f"{_DEST}{fs.section}__{fs.name}"
        groups[fs.section].add_argument(
            flag_name(fs.section, fs.name), *ALIASES.get(fs.key, []), dest=dest,
            metavar=_metavar(fs), default=None, help=help_text)
        if fs.key in SWITCHES:
            groups[fs.section].add_argument(
                SWITCHES[fs.key], dest=dest, action="store_const", const="true",
                help=f"the same as {flag_name(fs.section, fs.name)} true")


def cli_overrides(args: argparse.Namespace) -> dict[str, str]:
    """``{"section.field": raw value}`` for every config flag given on the command line."""
    out = {}
    for dest, value in vars(args).items():
        if dest.startswith(_DEST) and value is not None:
            section, name = dest[len(_DEST):].split("__", 1)
            out[f"{section}.{name}"] = value
    return out


class _FirstRunHelp(argparse.Action):
    """``--help``: the help with only :data:`FIRST_RUN_OPTIONS`, then how to see the rest."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(first_run_help(parser), end="")
        parser.exit()


def first_run_help(parser: argparse.ArgumentParser) -> str:
    """``parser``'s help showing only the options of :data:`FIRST_RUN_OPTIONS` (the groups
    left empty are left out), and a last line pointing to ``--help-all``."""
    hidden = [a for a in parser._actions
              if a.option_strings and not FIRST_RUN_OPTIONS.intersection(a.option_strings)]
    groups = parser._action_groups
    saved = ([(a, a.help) for a in hidden], [(g, g.description) for g in groups])
    try:
        for action in hidden:
            action.help = argparse.SUPPRESS
        parser._action_groups = [g for g in groups if any(
            a.help is not argparse.SUPPRESS for a in g._group_actions)]
        for group in groups:
            group.description = None  # 'config file table [x]': the title says it
        text = parser.format_help()
    finally:
        parser._action_groups = groups
        for action, help_text in saved[0]:
            action.help = help_text
        for group, description in saved[1]:
            group.description = description
    return (f"{text}\nThese are the options of a first run; {len(hidden)} more (every setting "
            f"of docs/configuration.md, SASL/SSL included): {parser.prog} --help-all\n")


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the online-learning daemon (embedded simulator without --bootstrap)",
        description=(__doc__ or "").replace("``", ""), usage=_USAGE, add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("running")
    group.add_argument("-h", "--help", action=_FirstRunHelp,
                       help="show the options of a first run and exit")
    group.add_argument("--help-all", action="help", help="show every option and exit")
    group.add_argument("--config", metavar="FILE",
                       help="TOML config file (default: $STREAMLEARN_CONFIG, else none)")
    group.add_argument("--max-events", type=integer, metavar="N",
                       help="stop after N instances (final checkpoint, exit 0)")
    group.add_argument("--progress-seconds", type=number, default=5.0, metavar="S",
                       help="print a progress line every S seconds; 0 = never (default 5)")
    group.add_argument("--linger-seconds", type=number, default=0.0, metavar="S",
                       help="after stopping, keep /metrics up S more seconds so a scraper "
                            "reads the final values (a signal ends it early; default 0; the "
                            "producer's linger is --kafka-linger-seconds)")
    group.add_argument("--print-config", action="store_true",
                       help="print the effective configuration as TOML and exit")
    add_logging_arguments(group)
    add_config_arguments(parser)
    parser.set_defaults(run=run)


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_logging_arguments(group: Any) -> None:
    group.add_argument("--log-level", default="INFO", type=str.upper, choices=_LEVELS,
                       help="level of streamlearn's own log lines on stderr (default INFO)")
    group.add_argument("--library-log-level", default="WARNING", type=str.upper, choices=_LEVELS,
                       help="level of the libraries' log lines (kafka-python, ...) on stderr "
                            "(default WARNING)")


def configure_logging(level: str, library_level: str = "WARNING") -> None:
    """streamlearn's loggers at ``level``; the client libraries' (kafka-python's, and
    librdkafka's lines, which come through ``streamlearn.librdkafka``) at ``library_level``.

    kafka-python logs ~70 INFO lines per start and one per reconnect attempt;
    they are noise unless a connection problem is being debugged.
    """
    logging.basicConfig(stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(library_level)
    logging.getLogger("streamlearn").setLevel(level)
    logging.getLogger("streamlearn.librdkafka").setLevel(library_level)


_MAX_SECONDS = 1e9  # ~32 years: beyond it a wait overflows the clock


def run(args: argparse.Namespace) -> int:
    if args.max_events is not None and args.max_events < 1:
        raise ConfigError(f"--max-events must be an integer >= 1. Got {args.max_events}.")
    for flag, seconds in (("--progress-seconds", args.progress_seconds),
                          ("--linger-seconds", args.linger_seconds)):
        if not 0 <= seconds <= _MAX_SECONDS:  # NaN fails too
            raise ConfigError(f"{flag} must be a number of seconds in [0, {_MAX_SECONDS:g}]. "
                              f"Got {seconds}.")
    config = load_config(args.config, cli=cli_overrides(args), cli_spellings=cli_spellings())
    if args.print_config:
        print(to_toml(config), end="")
        return 0
    configure_logging(args.log_level, args.library_log_level)
    gc.set_threshold(*DAEMON_GC_THRESHOLDS)  # the process is the daemon's: see there
    without_hugepage_advice()  # likewise
    return serve(config, max_events=args.max_events, progress_s=args.progress_seconds,
                 linger_s=args.linger_seconds)


def to_toml(config: Config) -> str:
    """The effective configuration as a TOML document (unset values commented out)."""
    lines = []
    for section, values in config.as_dict().items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if value is None:
                lines.append(f"# {key} =  (unset)")
            elif isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, str):
                escaped = value.replace("\\", "\\\\").replace('"', '\\"')
                lines.append(f'{key} = "{escaped}"')
            else:
                lines.append(f"{key} = {value!r}")
        lines.append("")
    return "\n".join(lines)


def build_transport(config: Config, max_instances: int | None = None) -> Transport:
    """The embedded transport without a bootstrap, else Kafka (creating missing topics)."""
    t = config.topics
    if config.embedded_mode:
        from streamlearn.transport.embedded import EmbeddedTransport

        e = config.embedded
        return EmbeddedTransport(t.instances, t.feedback, t.decisions, t.dead_letter,
                                 dataset=e.dataset, data_dir=None if e.data_dir is None
                                 else str(e.data_dir), rate=e.rate, chunk=e.chunk,
                                 delay_mean_s=e.delay_mean_seconds, drop=e.drop, seed=e.seed,
                                 max_instances=max_instances, drift_at=e.drift_at,
                                 slots=e.slots, fetch=e.fetch)
    from streamlearn.transport.kafka import ensure_topics
    from streamlearn.transport.kafka_clients import transport_class

    k = config.kafka
    assert k.bootstrap is not None
    options = k.client_options()
    ensure_topics(k.bootstrap, [t.instances, t.feedback, t.decisions, t.dead_letter],
                  t.partitions, client_options=options)
    return transport_class(k.client)(
        k.bootstrap, t.instances, t.feedback, t.decisions, t.dead_letter, k.group_id,
        client_options=options, tuning=k.tuning())


def _dimensions(config: Config, transport: Transport) -> tuple[int, int]:
    """(K, d): the config's, or in embedded mode the dataset's when the config kept defaults."""
    from streamlearn.transport.embedded import EmbeddedTransport

    k, d = config.learner.n_actions, config.learner.n_features
    if not isinstance(transport, EmbeddedTransport):
        return k, d
    defaults = type(config.learner)()
    for name, got, want, default in (("n_actions", k, transport.n_actions, defaults.n_actions),
                                     ("n_features", d, transport.n_features,
                                      defaults.n_features)):
        if got != want and got != default:
            raise ConfigError(f"learner.{name} must be {want} for the embedded dataset "
                              f"'{config.embedded.dataset}'. Got {got}.")
    return transport.n_actions, transport.n_features


def _candidate_dimensions(config: Config, transport: Transport) -> tuple[int, int] | None:
    """(d_x, d_c) in candidate mode (the embedded dataset's when the config kept defaults),
    None for fixed actions."""
    from streamlearn.datasets.candidates import CANDIDATE_STREAMS

    dims = getattr(transport, "candidate_dims", None)
    c = config.candidates
    if dims is None:
        if c.enabled and config.embedded_mode:
            raise ConfigError(f"embedded.dataset must be a candidate-set stream "
                              f"({', '.join(sorted(CANDIDATE_STREAMS))}) when candidates.enabled "
                              f"is true. Got '{config.embedded.dataset}'.")
        if config.embedded_mode and "embedded.slots" in config.origins:
            raise ConfigError(f"embedded.slots applies to the candidate-set streams "
                              f"({', '.join(sorted(CANDIDATE_STREAMS))}). Got "
                              f"{config.embedded.slots} with the fixed-action dataset "
                              f"'{config.embedded.dataset}' (from "
                              f"{config.origin('embedded.slots')}).")
        return (c.shared_features, c.candidate_features) if c.enabled else None
    if config.embedded.slots > c.max_slots:  # every request would be dead-lettered
        raise ConfigError(f"embedded.slots must be at most candidates.max_slots "
                          f"({c.max_slots}). Got {config.embedded.slots} (from "
                          f"{config.origin('embedded.slots')}).")
    defaults = type(c)()
    for name, got, want, default in (
            ("shared_features", c.shared_features, dims[0], defaults.shared_features),
            ("candidate_features", c.candidate_features, dims[1], defaults.candidate_features)):
        if got != want and got != default:
            raise ConfigError(f"candidates.{name} must be {want} for the embedded dataset "
                              f"'{config.embedded.dataset}'. Got {got}.")
    return int(dims[0]), int(dims[1])


def _changelog_note(config: Config) -> str:
    """How the startup line names the changelog (nothing when it is off)."""
    return (f" (a cache of the changelog {config.topics.changelog!r})"
            if config.checkpoint.changelog else "")


def open_changelog(config: Config, partition: int) -> Changelog | None:
    """The changelog of one partition's state (``checkpoint.changelog``; None: off), its
    topic created if missing (compacted, two partitions per input partition: the state's and
    the journal's). Opening it fences the partition's previous writer."""
    if not config.checkpoint.changelog:
        return None
    from streamlearn.durability.changelog import Changelog
    from streamlearn.transport.keyed_log import KafkaKeyedLog

    k, t = config.kafka, config.topics
    assert k.bootstrap is not None  # checked by load_config
    options = k.client_options()
    if (k.bootstrap, t.changelog) not in _CHECKED_CHANGELOGS:
        _check_changelog_topic(config)
        _CHECKED_CHANGELOGS.add((k.bootstrap, t.changelog))
    return Changelog(KafkaKeyedLog(k.bootstrap, t.changelog, partition, k.group_id, options))


#: (bootstrap, topic) of the changelog topics this process has created or checked: a replica
#: opens one changelog per partition it takes, the topic needs checking once
_CHECKED_CHANGELOGS: set[tuple[str, str]] = set()


def _check_changelog_topic(config: Config) -> None:
    """Create the changelog topic if missing; refuse one of another partition count, one that
    is not compacted, or one that lets the cleaner at records younger than
    ``MIN_COMPACTION_LAG_MS``."""
    from streamlearn.transport.kafka import ensure_topics
    from streamlearn.transport.keyed_log import (
        CHANGELOG_TOPIC_CONFIGS,
        LANES,
        MIN_COMPACTION_LAG_MS,
        topic_settings,
    )

    k, t = config.kafka, config.topics
    assert k.bootstrap is not None  # checked by load_config
    options = k.client_options()
    counts = ensure_topics(k.bootstrap, [t.instances], t.partitions, client_options=options)
    want = LANES * counts[t.instances]  # a state and a journal partition per input partition
    have = ensure_topics(k.bootstrap, [t.changelog], want, client_options=options,
                         topic_configs=CHANGELOG_TOPIC_CONFIGS)[t.changelog]
    if have < want:
        raise ConfigError(f"topics.changelog {t.changelog!r} must have {want} partitions (two "
                          f"per partition of {t.instances!r}). Got {have}; create it anew, or "
                          f"name another (it is created when missing).")
    found = topic_settings(k.bootstrap, t.changelog, ("cleanup.policy", "min.compaction.lag.ms"),
                           options)
    policy, lag = found.get("cleanup.policy"), found.get("min.compaction.lag.ms")
    if lag is not None and lag.isdigit() and int(lag) < MIN_COMPACTION_LAG_MS:
        # refused, not warned: an outside test ran on past the warning and saw 1,585 ids
        # decided again differently, some with another action
        raise ConfigError(
            f"topics.changelog {t.changelog!r} must keep records for at least "
            f"{MIN_COMPACTION_LAG_MS} ms from the log cleaner (min.compaction.lag.ms): with "
            f"less, a killed replica's last journal records can be compacted away before the "
            f"next owner reads them, and those events are decided again differently. Got "
            f"min.compaction.lag.ms = {lag}; set it with kafka-configs.sh --alter "
            f"--entity-type topics --entity-name {t.changelog} --add-config "
            f"min.compaction.lag.ms={MIN_COMPACTION_LAG_MS}, or name another topic (it is "
            f"created when missing).")
    if policy is not None and "compact" not in policy.split(","):
        raise ConfigError(f"topics.changelog {t.changelog!r} must be compacted (cleanup.policy "
                          f"= compact: time-based retention would delete chunks the newest "
                          f"checkpoint still needs). Got cleanup.policy = {policy}; create it "
                          f"anew, or name another (it is created when missing).")


def build_daemon(config: Config, transport: Transport, wrapped: Transport,
                 observer: Observer, partition: int = 0) -> Daemon:
    """The fixed-action daemon, or the candidate-mode one (``candidates.enabled``, or an
    embedded candidate-set dataset); with ``checkpoint.changelog``, its state is mirrored to
    partition ``partition`` of the changelog topic."""
    from streamlearn.service.daemon import Daemon

    dims = _candidate_dimensions(config, transport)
    if dims is None:
        n_actions, n_features = _dimensions(config, transport)
        if config.embedded_mode:  # with Kafka load_config has checked it against K
            check_baseline_action(config, n_actions, f"the embedded dataset "
                                  f"'{config.embedded.dataset}' has {n_actions} actions")
        learner = build_learner(config, n_actions, n_features)
        settings = dataclasses.replace(config.to_daemon_settings(), learner=dataclasses.replace(
            config.learner, n_actions=n_actions, n_features=n_features))
        _check_with_sources(config, settings)
        return Daemon(settings, wrapped, learner, observer,
                      changelog=open_changelog(config, partition))
    from streamlearn.candidates.learners import CANDIDATE_LEARNERS

    d_x, d_c = dims
    if config.embedded_mode:  # the daemon parses it against learner.n_actions here too
        check_baseline_action(config, config.learner.n_actions,
                              f"learner.n_actions = {config.learner.n_actions}")
    learner_class = CANDIDATE_LEARNERS[config.candidates.learner]
    settings = dataclasses.replace(config.to_daemon_settings(), candidates=dataclasses.replace(
        config.candidates, enabled=True, shared_features=d_x, candidate_features=d_c))
    _check_with_sources(config, settings)
    return Daemon(settings, wrapped, learner_class(d_x, d_c, seed=config.learner.seed), observer,
                  changelog=open_changelog(config, partition))


def _check_with_sources(config: Config, settings: DaemonSettings) -> None:
    """What only the daemon's shape can judge (the rankers to retrain, the rollout mode in
    candidate mode), refused with the setting and where it came from."""
    from streamlearn.service.retrain_scheduler import check_rankers

    def rankers() -> None:
        if settings.retrain_enabled:
            check_rankers(settings)

    def rollout() -> None:
        settings.adoption_settings()

    checks: list[tuple[str, Callable[[], None]]] = [("retrain.rankers", rankers),
                                                    ("rollout.mode", rollout)]
    for key, check in checks:
        try:
            check()
        except ConfigError as exc:
            text = str(exc).rstrip(".")
            named = next((k for k in (key, "rollout.baseline") if text.startswith(k)), None)
            raise ConfigError(f"{text if named else f'{key}: {text}'} (from "
                              f"{config.origin(named or key)}).") from None


def build_learner(config: Config, n_actions: int, n_features: int) -> Learner:
    from streamlearn.learners import exploration_from_name, make_learner

    exploration = exploration_from_name(config.exploration.name, config.exploration.gamma
                                        if config.exploration.name == "fixed" else None)
    return make_learner(config.learner.name, n_actions, n_features, exploration,
                        config.learner.seed, **config.learner.hyperparameters())


#: Fewer learned rounds than this: the final line says its error rates are too early to judge.
EARLY_ROUNDS = 1000


def peak_rss_bytes() -> int:
    """This process's peak resident memory (``ru_maxrss``: kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


class Progress:
    """Periodic one-line progress reports read from the metrics registry (thread-safe).

    In candidate mode (``slots=True``) an event is a request, and feedback is counted per
    placed slot: the labels say so. Next to a baseline (rollout mode apprentice or
    conservative, read from the mode gauge: it may change while serving) what is published
    is the baseline's choice on most events, so the error rates, which are those of the
    published decisions, say so (``published cum-error``), γ is the learner's own
    (``learner γ``: ``streamlearn_exploration_gamma``), and the line adds the learner's
    side: the share it serves, the error (1 − mean reward) each side
    made on the events it served since the mode began, and how often the learner's own
    choice is the baseline.
    """

    def __init__(self, registry: CollectorRegistry, out: Any, stats: Any = None,
                 slots: bool = False) -> None:
        self.registry, self.out, self.stats, self.slots = registry, out, stats, slots
        self.progress = ProgressLine("requests" if slots else "events")

    def _get(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels)
        return float("nan") if value is None else value

    def line(self) -> str:
        mistakes = self._get("streamlearn_mistakes_total")
        rounds = self._get("streamlearn_rewards_total") + mistakes  # each round: r + (1 - r)
        decided = sum(self._get("streamlearn_decisions_total", {"explored": e})
                      for e in ("true", "false"))
        gamma = self._get("streamlearn_exploration_gamma") if decided > 0 else None
        per = "-slots" if self.slots else ""
        beside = self.rollout_mode() is not None
        extra = [("learner γ" if beside else "γ", number_or_dash(gamma)),
                 *(self._learner_side() if beside else ()),
                 (f"joined{per}",
                  f"{self._get('streamlearn_feedback_total', {'outcome': 'joined'}):,.0f}"),
                 (f"pending{per}", f"{self._get('streamlearn_pending_joins'):,.0f}")]
        if self.stats is not None and self.stats.dropped:
            extra.append(("dropped", f"{self.stats.dropped:,}"))
        rss = self.registry.get_sample_value("process_resident_memory_bytes")
        if rss is not None:
            extra.append(("rss", f"{rss / 1e6:,.0f}MB"))
        # cum: the tracker's rate, which a restored checkpoint carries over (NaN before any round)
        cumulative = self._get("streamlearn_error_rate") if rounds > 0 else None
        return self.progress.line(self._get("streamlearn_instances_total"), rounds, mistakes,
                                  extra, cumulative=cumulative, of="published" if beside else "")

    def rollout_mode(self) -> str | None:
        """'apprentice' or 'conservative' when the daemon serves next to a baseline, else
        None (online, or no rollout gauge yet)."""
        return next((mode for mode in ("apprentice", "conservative") if self.registry
                     .get_sample_value("streamlearn_rollout_mode", {"mode": mode}) == 1.0), None)

    def _learner_side(self) -> list[tuple[str, str]]:
        """Next to a baseline: the share of the events the learner serves (with the rankers
        it rolls out), the error (1 − mean reward) of each side on the events it served since
        the mode began (– before it served any), how often the learner's choice is the
        baseline."""
        pairs = [("learner-share", number_or_dash(
            1.0 - self._get("streamlearn_rollout_share", {"role": "baseline"})))]
        for side in ("learner", "baseline"):
            value = self._get("streamlearn_policy_live_value", {"policy": side})
            pairs.append((f"{side}-error", number_or_dash(1.0 - value)))
        pairs.append(("agreement", number_or_dash(self._get("streamlearn_baseline_agreement"))))
        return pairs

    @contextmanager
    def every(self, seconds: float) -> Iterator[Callable[[], None]]:
        """Print :meth:`line` every ``seconds`` from a background thread while inside.

        Yields ``stop``: once it returns no progress line is printed any more (a line being
        written is finished first), so a final line printed after it is the last line —
        printed while the thread ran, a progress line could follow it, or land inside it
        (``print`` writes the text and the newline separately).
        """
        done = threading.Event()
        lock = threading.Lock()  # a line is made and printed whole, or not at all after stop

        def loop() -> None:
            while not done.wait(seconds):
                with lock:
                    if done.is_set():
                        return
                    print(self.line(), file=self.out, flush=True)

        def stop() -> None:
            with lock:
                done.set()
            thread.join(timeout=2)

        thread = threading.Thread(target=loop, name="streamlearn-progress", daemon=True)
        thread.start()
        try:
            yield stop
        finally:
            stop()

    def summary(self, daemon: Any, seen: int, elapsed: float) -> str:
        """The final line: rates, the fate of every decision, the error rates, memory."""
        seq = daemon.checkpointer.seq if daemon.checkpointer is not None else None
        noun = "requests" if self.slots else "instances"
        return (f"streamlearn serve: stopped after {seen} {noun} in {elapsed:.1f} s "
                f"({_rates(seen, elapsed, daemon.polling_seconds)}); daemon totals: "
                f"{_totals(daemon)}; {self._errors(daemon.tracker)}; peak RSS "
                f"{peak_rss_bytes() / 1e6:,.0f} MB; last checkpoint {seq or 'none'}")

    def _errors(self, tracker: Any) -> str:
        mistakes = self._get("streamlearn_mistakes_total")
        ewma = self.progress.ewma.update(self._get("streamlearn_rewards_total") + mistakes,
                                         mistakes)
        learned = tracker.rounds > 0  # before the first round the tracker's rates read 0
        mode = self.rollout_mode()
        of = "published " if mode else ""
        text = (f"{of}cum-error {number_or_dash(tracker.error_rate if learned else None)}, "
                f"{of}ewma-error {number_or_dash(ewma)}, {of}window-error "
                f"{number_or_dash(tracker.window_error_rate if learned else None)}")
        if tracker.rounds < EARLY_ROUNDS:
            text += (f" (over {tracker.rounds} learned {'slots' if self.slots else 'rounds'} "
                     f"only: too few to judge the learner, which has barely started)")
        if mode:
            text += f"; rollout {mode}: " + ", ".join(
                f"{label} {value}" for label, value in self._learner_side())
        return text


def _rates(seen: int, elapsed: float, polling: float) -> str:
    """Instances per second of the wall clock, and of the time not spent polling (the
    daemon's own work: the wall-clock rate also counts the waits for input)."""
    wall = f"{seen / max(elapsed, 1e-9):,.0f}/s"
    busy = elapsed - polling
    if busy <= 0:
        return wall
    return f"{wall}; {seen / busy:,.0f}/s over the {busy:.1f} s not spent polling"


def _totals(daemon: Any) -> str:
    """What became of every decision: joined + expired + pending + shed = decided (in
    candidate mode per placed slot: each slot of a request is joined on its own)."""
    c, pending = daemon.counters, len(daemon.join)
    joined, expired = c.feedback["joined"], c.feedback["expired"]
    fates = f"joined {joined}, expired {expired}, pending {pending}, shed {c.shed}"
    if daemon.settings.candidates.enabled:
        return (f"requests {c.instances}{_rejected_note(daemon)}, feedback per placed slot: "
                f"{fates} (of {joined + expired + pending + c.shed} slots placed)")
    return (f"instances {c.instances}{_rejected_note(daemon)}, feedback {fates} (of "
            f"{c.decisions} decisions)")


def _rejected_note(daemon: Any) -> str:
    """' (+N dead-lettered)' when instance messages were rejected, else ''."""
    rejected = daemon.instance_messages - daemon.counters.instances
    return f" (+{rejected} dead-lettered)" if rejected else ""


@contextmanager
def _stop_on_signals(stop: Any, rollback: Any = None, step_back: Any = None,
                     interrupt: bool = True) -> Iterator[None]:
    """SIGTERM/SIGINT only call ``stop`` (SIGUSR1 ``rollback``, SIGUSR2 ``step_back``, when
    given; SIGINT only with ``interrupt``); the previous handlers come back afterwards."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGUSR1:
            rollback()
        elif signum == signal.SIGUSR2:
            step_back()
        else:
            stop()

    previous = {}
    try:
        for sig in (signal.SIGTERM,) + ((signal.SIGINT,) if interrupt else ()) \
                + ((signal.SIGUSR1,) if rollback else ()) + ((signal.SIGUSR2,) if step_back else ()):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread (embedded in a test or an application)
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def serve(config: Config, max_events: int | None = None, progress_s: float = 5.0,
          linger_s: float = 0.0, registry: CollectorRegistry | None = None,
          out: Any = None) -> int:
    """Run the daemon until a signal or ``max_events`` instances; return the exit code."""
    out = out if out is not None else sys.stdout
    disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created series double the count and carry nothing we use
    registry = registry if registry is not None else CollectorRegistry()
    _add_process_metrics(registry)
    observer = PrometheusObserver(registry)
    stopping = threading.Event()
    # a SIGTERM while the transport and the daemon are built stops the daemon as soon as it
    # runs (its restore, a final checkpoint, exit 0) instead of killing the process with the
    # signal's default action (exit -15: a test stopped a daemon it had just started). Ctrl-C
    # (SIGINT) still interrupts the start-up at once.
    with _stop_on_signals(stopping.set, interrupt=False):
        if not _broker_awaited(config, stopping):
            print(f"streamlearn serve: stopped while waiting for Kafka at "
                  f"{config.kafka.bootstrap}: nothing restored, decided or written", file=out,
                  flush=True)
            return 0
        if config.kafka.membership == "group":
            return _serve_group(config, max_events, progress_s, registry, observer, out, stopping)
        return _serve_one(config, max_events, progress_s, linger_s, registry, observer, out,
                          stopping)


def _broker_awaited(config: Config, stopping: threading.Event) -> bool:
    """Wait (as the transport would, up to its connection check's bound) until a bootstrap
    server accepts connections, and say whether to go on: False when a stop was asked for
    meanwhile (a SIGTERM while the broker is away stops at once instead of after the check).
    Raises TransportError when no server answers in time; embedded mode has nothing to
    await."""
    if config.embedded_mode:
        return True
    from streamlearn.transport.kafka import check_reachable

    assert config.kafka.bootstrap is not None
    return check_reachable(config.kafka.bootstrap, abandon=stopping)


def _serve_one(config: Config, max_events: int | None, progress_s: float, linger_s: float,
               registry: CollectorRegistry, observer: PrometheusObserver, out: Any,
               stopping: threading.Event) -> int:
    """The daemon alone on its input (``kafka.membership = static``, or embedded)."""
    with ExitStack() as stack:
        transport = build_transport(config, max_instances=max_events)
        stack.callback(transport.close)
        tracker = LagTracker(transport, config.metrics.max_lag, on_lag=observer.on_lag)
        stack.callback(tracker.stop_asking)  # before the transport closes
        daemon = build_daemon(config, transport, tracker, observer)
        settings = daemon.settings
        if settings.candidates.enabled:
            shape = (f"candidate sets, d_x={settings.candidates.shared_features}, "
                     f"d_c={settings.candidates.candidate_features}")
        else:
            shape = f"K={settings.learner.n_actions}, d={settings.learner.n_features}"
        tracker.is_serving = lambda: bool(daemon.ready)

        def stop() -> None:
            daemon.request_stop()
            stopping.set()

        mode = ("embedded simulator (" + config.embedded.dataset + ")" if config.embedded_mode
                else f"Kafka {config.kafka.bootstrap}{_client_note(config)}")
        print(f"streamlearn serve: {type(daemon.learner).__name__} ({shape}) on "
              f"{mode}; checkpoints: {config.checkpoint.dir or 'off'}{_changelog_note(config)}",
              file=out, flush=True)
        if config.metrics.port >= 0:
            def readiness() -> tuple[bool, str]:
                held = daemon.held_by_journal()
                return (False, held) if held is not None else tracker.readiness()

            server = MetricsServer(registry, config.metrics.host, config.metrics.port,
                                   readiness=readiness)
            server.start()
            stack.callback(server.stop)
            print(f"streamlearn serve: metrics on {server.url}/metrics (also /healthz /readyz)",
                  file=out, flush=True)
        if settings.rollout.mode != "online":
            print(f"streamlearn serve: rollout {settings.rollout.mode} as configured (a "
                  f"checkpoint written with this rollout.mode keeps its own mode, logged when "
                  f"restored) next to the caller's "
                  f"baseline (explore budget {settings.rollout.explore_budget:g}, alpha "
                  f"{settings.rollout.alpha:g}{', automatic' if settings.rollout.auto else ''}); "
                  f"SIGUSR2 steps back", file=out, flush=True)
            if not settings.rollout.baseline:
                print("streamlearn serve: warning: no rollout.baseline (--rollout-baseline "
                      "constant:A): events that carry no \"baseline\" of their own are served "
                      "by the learner alone, whatever the mode", file=out, flush=True)
        retraining = daemon.retraining
        idle = [key for key in ("retrain.policy", "retrain.rankers", "retrain.rollout_stages")
                if key in config.origins]
        if idle and (retraining is None or not retraining.enabled):
            verb = "has" if len(idle) == 1 else "have"
            print(f"streamlearn serve: warning: {', '.join(idle)} (from "
                  f"{', '.join(config.origin(k) for k in idle)}) {verb} no effect: retraining is "
                  f"off (--retrain-every-events N or --retrain-every-seconds S turns it on)",
                  file=out, flush=True)
        if retraining is not None and retraining.enabled:
            print(f"streamlearn serve: retraining {', '.join(settings.retrain_ranker_names())} "
                  f"(experience log {retraining.log.directory}); SIGUSR1 rolls the promoted "
                  f"ranker back", file=out, flush=True)
        stack.enter_context(_stop_on_signals(
            stop, retraining.request_rollback if retraining is not None else None,
            daemon.request_step_back))
        if stopping.is_set():  # asked while it was built
            stop()
        progress = Progress(registry, out, getattr(transport, "stats", None),
                            slots=settings.candidates.enabled)
        stop_progress = (stack.enter_context(progress.every(progress_s)) if progress_s > 0
                         else _nothing)
        started = time.monotonic()
        daemon.run(max_instances=max_events)
        elapsed = time.monotonic() - started
        stop_progress()  # the final line is the last (also while /metrics lingers)
        print(progress.summary(daemon, daemon.instances_this_run, elapsed), file=out, flush=True)
        if linger_s > 0 and not stopping.is_set():
            stopping.wait(linger_s)
    return 0


def shown_default(value: object) -> str:
    """A setting's default as the configuration file writes it (docs/configuration.md): true
    and false, 1e12 rather than 1000000000000.0 or 1e+12; None is "unset"."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    if isinstance(value, float) and text.endswith(".0") and len(text) > 8:
        digits = text[:-2].lstrip("-").rstrip("0")
        exponent = len(text[:-2].lstrip("-")) - 1
        mantissa = digits[0] + (f".{digits[1:]}" if len(digits) > 1 else "")
        text = ("-" if value < 0 else "") + f"{mantissa}e{exponent}"
    return text.replace("e+", "e")


def _nothing() -> None:
    """What stops the progress lines when there are none."""


def _add_process_metrics(registry: CollectorRegistry) -> None:
    """The process's own memory, CPU and file descriptors (``process_resident_memory_bytes``,
    ...) on this registry: the daemon's registry is the process's. Once per registry."""
    with contextlib.suppress(ValueError):  # already there (a registry reused, the global one)
        ProcessCollector(registry=registry)


def _client_note(config: Config) -> str:
    """The client library the Kafka transport runs on, and why when it was not asked for."""
    library = {"confluent": "librdkafka", "kafka-python": "kafka-python"}[config.kafka.client]
    chosen = ("" if "kafka.client" in config.origins else
              ", the default: confluent-kafka is installed" if config.kafka.client == "confluent"
              else ", the default: confluent-kafka is not installed")
    return f" via {library}{chosen}"


def _serve_group(config: Config, max_events: int | None, progress_s: float,
                 registry: CollectorRegistry, observer: PrometheusObserver, out: Any,
                 stopping: threading.Event) -> int:
    """One replica of a consumer group (kafka.membership = group)."""
    from streamlearn.commands.serve_group import build_replica, serve_replica

    with ExitStack() as stack:
        replica = build_replica(config, observer)
        print(f"streamlearn serve: replica of group {config.kafka.group_id!r} on Kafka "
              f"{config.kafka.bootstrap}{_client_note(config)} (learner {config.learner.name}); "
              "partition state in "
              f"{config.checkpoint.dir}/partition-<p>{_changelog_note(config)}", file=out,
              flush=True)
        if config.metrics.port >= 0:
            server = MetricsServer(registry, config.metrics.host, config.metrics.port,
                                   readiness=replica.readiness)
            server.start()
            stack.callback(server.stop)
            print(f"streamlearn serve: metrics on {server.url}/metrics (also /healthz /readyz)",
                  file=out, flush=True)
        stop_progress = (stack.enter_context(Progress(registry, out).every(progress_s))
                         if progress_s > 0 else _nothing)
        stack.enter_context(_stop_on_signals(replica.request_stop))
        if stopping.is_set():  # asked while it was built
            replica.request_stop()
        return serve_replica(replica, max_events, out, before_summary=stop_progress)
