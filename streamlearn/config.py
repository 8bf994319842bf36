"""The one frozen, typed configuration, built once from file + environment + CLI.

Precedence (highest first): CLI flags > ``STREAMLEARN_*`` environment > TOML
file > defaults. :func:`load_config` is the *only* place in streamlearn that
reads the environment. Every value is validated with a one-line error that
names the field, what was expected, what was got and where it came from::

    join.window_seconds must be a number > 0. Got 'abc' (from STREAMLEARN_JOIN_WINDOW_SECONDS).

Names: the TOML key ``[join] window_seconds`` is the environment variable
``STREAMLEARN_JOIN_WINDOW_SECONDS`` and the flag ``--join-window-seconds``
(the table in ``docs/configuration.md`` lists every one).

>>> cfg = load_config(environ={"STREAMLEARN_JOIN_WINDOW_SECONDS": "30"},
...                   cli={"join.window_seconds": "45"})
>>> cfg.join.window_seconds, cfg.kafka.bootstrap is None, cfg.metrics.host
(45.0, True, '127.0.0.1')
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamlearn.config_fields import FieldSpec, convert, spec
from streamlearn.errors import ConfigError
from streamlearn.service.settings import (
    CandidatesConfig,
    CheckpointConfig,
    DaemonSettings,
    ExperienceConfig,
    JoinConfig,
    LearnerConfig,
    LimitsConfig,
    MetricsConfig,
    RetrainConfig,
    RolloutConfig,
)
from streamlearn.transport.protocol import ClientTuning, kafka_client_installed

_log = logging.getLogger(__name__)

__all__ = [
    "SECTIONS",
    "CheckpointConfig",
    "Config",
    "EmbeddedConfig",
    "ExplorationConfig",
    "JoinConfig",
    "KafkaConfig",
    "LearnerConfig",
    "LimitsConfig",
    "MetricsConfig",
    "RetrainConfig",
    "RolloutConfig",
    "TopicsConfig",
    "check_baseline_action",
    "env_name",
    "field_specs",
    "flag_name",
    "installed_kafka_client",
    "load_config",
]

ENV_PREFIX = "STREAMLEARN_"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_CLIENTS = ("auto", "kafka-python", "confluent")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")


def installed_kafka_client() -> str:
    """What ``kafka.client = auto`` runs on: librdkafka (``confluent``) when confluent-kafka is
    installed — twice kafka-python's events/s and a quarter of its latency at ordinary load on
    the same machine (docs/performance.md) — else kafka-python, which installs wherever Python
    does."""
    return "confluent" if kafka_client_installed("confluent") else "kafka-python"


@dataclass(frozen=True)
class KafkaConfig:
    """Broker connection; no bootstrap servers → the embedded in-process transport."""

    bootstrap: str | None = spec(None, "Kafka bootstrap servers HOST:PORT[,HOST:PORT]; unset = "
                                 "embedded transport with a built-in simulator", kind="hostports")
    group_id: str = spec("streamlearn", "consumer group id (replicas share it)")
    membership: str = spec("assign", "assign: this process reads every input partition; group: "
                           "it joins group_id with the other replicas and serves the partitions "
                           "Kafka assigns it (scale-out, docs/operations.md)",
                           choices=("assign", "group"))
    group_instance_id: str | None = spec(None, "static group membership (KIP-345): a stable "
                                         "name per replica, e.g. the pod name, so a restart "
                                         "within the session timeout keeps its partitions")
    session_timeout_seconds: float = spec(10.0, "group membership: a replica silent this long "
                                          "loses its partitions", gt=0)
    round_seconds: float = spec(0.1, "group membership: a replica's round over its partitions "
                                "lasts at least this long unless a poll filled a micro-batch "
                                "(fuller batches: the CPU per event does not grow as replicas "
                                "are added; adds at most this much latency)", ge=0)
    client: str = spec("auto", "client library of the data path: confluent (librdkafka: pip "
                       "install 'streamlearn[confluent]'), kafka-python (pure Python), or auto: "
                       "confluent when confluent-kafka is installed, else kafka-python "
                       "(docs/kafka.md)", choices=KAFKA_CLIENTS)
    linger_seconds: float | None = spec(
        None, "the producer holds a batch of decisions this long before sending it (fewer, "
        "larger produce requests; adds up to this much before the caller can read a decision, "
        "at low rates all of it); unset: 0.001 on librdkafka, 0.005 on kafka-python "
        "(docs/kafka.md)", ge=0, le=1)
    fetch_wait_seconds: float = spec(0.05, "longest the broker holds a fetch that has less than "
                                     "fetch_min_bytes to return", ge=0, le=5)
    fetch_min_bytes: int = spec(1, "bytes the broker waits for (at most fetch_wait_seconds) "
                                "before it answers a fetch: 1 answers at once (lowest latency), "
                                "more means fewer, larger fetches", ge=1)
    security_protocol: str = spec("PLAINTEXT", "security protocol", choices=SECURITY_PROTOCOLS)
    sasl_mechanism: str | None = spec(None, "SASL mechanism", choices=SASL_MECHANISMS)
    sasl_username: str | None = spec(None, "SASL username")
    sasl_password: str | None = spec(None, "SASL password (prefer the environment variable)",
                                     repr=False)
    # spec() returns dataclasses.field(...): no shared mutable default (RUF009 cannot see that)
    ssl_cafile: Path | None = spec(None, "CA bundle (PEM) to verify the brokers", kind="file")  # noqa: RUF009
    ssl_certfile: Path | None = spec(None, "client certificate (PEM)", kind="file")  # noqa: RUF009
    ssl_keyfile: Path | None = spec(None, "client private key (PEM)", kind="file")  # noqa: RUF009

    def __post_init__(self) -> None:
        # ``auto`` is settled here, once: everything downstream sees the library it runs on
        if self.client == "auto":
            object.__setattr__(self, "client", installed_kafka_client())

    def tuning(self) -> ClientTuning:
        """The latency / throughput settings of the transport's clients."""
        return ClientTuning(self.linger_seconds, self.fetch_wait_seconds, self.fetch_min_bytes)

    def client_options(self) -> dict[str, Any]:
        """Security options as kafka-python keyword arguments (unset ones left out)."""
        options: dict[str, Any] = {"security_protocol": self.security_protocol}
        pairs = {"sasl_mechanism": self.sasl_mechanism,
                 "sasl_plain_username": self.sasl_username,
                 "sasl_plain_password": self.sasl_password,
                 "ssl_cafile": self.ssl_cafile, "ssl_certfile": self.ssl_certfile,
                 "ssl_keyfile": self.ssl_keyfile}
        options.update({k: str(v) for k, v in pairs.items() if v is not None})
        return options


@dataclass(frozen=True)
class TopicsConfig:
    """Topic names. Instances and feedback must be co-partitioned (same count, same key)."""

    instances: str = spec("streamlearn.instances", "topic the caller publishes contexts to")
    feedback: str = spec("streamlearn.feedback", "topic the caller publishes rewards to")
    decisions: str = spec("streamlearn.decisions", "topic streamlearn publishes decisions to")
    dead_letter: str = spec("streamlearn.dead-letter", "topic for rejected events")
    models: str = spec("streamlearn.models", "compacted topic the replicas of a group merge "
                       "their models through (kafka.membership = group)")
    changelog: str = spec("streamlearn.changelog", "compacted topic holding each partition's "
                          "checkpoints and decision journal (checkpoint.changelog)")
    partitions: int = spec(1, "partitions per topic when streamlearn creates topics", ge=1)


@dataclass(frozen=True)
class ExplorationConfig:
    """How much to explore."""

    name: str = spec("default", "strategy: default is the learner's own, drift-aware "
                     "(docs/learners.md: an adaptive rule; for bag a small floor with a change "
                     "detector); adaptive follows an unbiased estimate of the exploit error at its "
                     "untuned defaults; fixed keeps γ = gamma", choices=(
                         "default", "fixed", "sqrt", "cuberoot", "adaptive", "margin"))
    gamma: float | None = spec(0.05, "γ of the fixed strategy (a gamma given without a "
                               "strategy selects fixed)", gt=0, le=0.5)


@dataclass(frozen=True)
class SyncConfig:
    """Model synchronisation of a scaled-out group (kafka.membership = group)."""

    every_seconds: float = spec(0.5, "each replica publishes its learner, and the merger "
                                "merges them, this often (shorter: closer to one learner, "
                                "more CPU per replica; docs/operations.md)", gt=0)
    early_fraction: float = spec(0.05, "also publish (and merge) as soon as the new examples "
                                 "reach this fraction of those the model holds: frequent syncs "
                                 "while a young model changes fast (0: on the interval only)",
                                 ge=0)


@dataclass(frozen=True)
class EmbeddedConfig:
    """The in-process simulator used when no Kafka bootstrap is configured."""

    dataset: str = spec("synnonsep", "dataset streamed (synsep, synnonsep, letter, ...)")
    data_dir: Path | None = spec(None, "where the datasets live (default: "  # noqa: RUF009
                                 "$STREAMLEARN_DATA_DIR, ../shared/datasets, then the user "
                                 "cache; docs/datasets.md)", kind="path")
    fetch: bool = spec(False, "download missing built-in data (verified by sha256) into the "
                       "data directory before serving")
    rate: float = spec(0.0, "instances per second; 0 = as fast as the loop consumes", ge=0)
    chunk: int = spec(256, "instances produced per step", ge=1)
    delay_mean_seconds: float = spec(0.2, "mean feedback delay (exponential)", ge=0)
    drop: float = spec(0.0, "probability that a decision never gets feedback", ge=0, le=1)
    seed: int = spec(1, "simulator seed", ge=0)
    drift_at: int | None = spec(None, "from this instance on the labels are permuted (an "
                                "abrupt concept drift)", ge=0)
    slots: int = spec(1, "slots per request of a candidate-set dataset (ohsumed-candidates, "
                      "synthetic-candidates)", ge=1)


SECTIONS: dict[str, type] = {
    "kafka": KafkaConfig, "topics": TopicsConfig, "learner": LearnerConfig,
    "exploration": ExplorationConfig, "join": JoinConfig, "checkpoint": CheckpointConfig,
    "metrics": MetricsConfig, "limits": LimitsConfig, "experience": ExperienceConfig,
    "retrain": RetrainConfig, "rollout": RolloutConfig, "sync": SyncConfig,
    "candidates": CandidatesConfig, "embedded": EmbeddedConfig,
}


@dataclass(frozen=True)
class Config:
    """Everything a daemon needs; build it with :func:`load_config`."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    join: JoinConfig = field(default_factory=JoinConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    experience: ExperienceConfig = field(default_factory=ExperienceConfig)
    retrain: RetrainConfig = field(default_factory=RetrainConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    candidates: CandidatesConfig = field(default_factory=CandidatesConfig)
    embedded: EmbeddedConfig = field(default_factory=EmbeddedConfig)
    source: str | None = None  # the config file it was read from, if any
    #: where each setting given came from ("section.key" -> flag, variable or file), for
    #: errors found once the daemon is built (a setting absent here has its default)
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def origin(self, key: str) -> str:
        """Where setting ``key`` ("section.name") came from: a flag, a variable, the file,
        or 'the default'."""
        return self.origins.get(key, "the default")

    @property
    def embedded_mode(self) -> bool:
        """True when no broker is configured: serve runs the built-in simulator."""
        return self.kafka.bootstrap is None

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """Plain values per section (the password masked), e.g. for ``--print-config``."""
        out: dict[str, dict[str, Any]] = {}
        for section in SECTIONS:
            values = dataclasses.asdict(getattr(self, section))
            if section == "kafka" and values.get("sasl_password") is not None:
                values["sasl_password"] = "***"
            out[section] = {k: (str(v) if isinstance(v, Path) else v) for k, v in values.items()}
        return out

    def to_daemon_settings(self) -> DaemonSettings:
        """The daemon's settings: its sections of this configuration, as they are."""
        return DaemonSettings(self.learner, self.join, self.checkpoint, self.metrics,
                              self.limits, self.experience, self.retrain, self.rollout,
                              self.candidates)


def env_name(section: str, name: str) -> str:
    return f"{ENV_PREFIX}{section}_{name}".upper()


def flag_name(section: str, name: str) -> str:
    return f"--{section}-{name}".replace("_", "-")


def field_specs() -> list[FieldSpec]:
    """Every configurable field, in declaration order (used by the CLI and the docs)."""
    return [FieldSpec.of(section, cls, f)
            for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


_MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; /dev/zero or a log file is not one


def _read_file(path: Path) -> dict[str, dict[str, Any]]:
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_CONFIG_BYTES + 1)
        if len(data) > _MAX_CONFIG_BYTES:
            raise ConfigError(f"Config file {path} must be at most {_MAX_CONFIG_BYTES} bytes. "
                              f"Got more.")
        raw = tomllib.loads(data.decode("utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"Config file {path} does not exist.") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Config file {path} cannot be read: {exc}.") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"Config file {path} is not valid TOML: {exc}.") from exc
    except RecursionError:
        raise ConfigError(f"Config file {path} is not a config: its arrays or tables nest "
                          f"too deeply to read.") from None
    known = {s: {f.name for f in dataclasses.fields(c)} for s, c in SECTIONS.items()}
    for section, table in raw.items():
        if section not in known:
            raise ConfigError(f"Unknown section [{section}] in {path}. Expected one of "
                              f"{', '.join(known)}.")
        if not isinstance(table, dict):
            raise ConfigError(f"'{section}' in {path} must be a table [{section}]. "
                              f"Got {table!r}.")
        for key in table:
            if key not in known[section]:
                raise ConfigError(f"Unknown key '{section}.{key}' in {path}. Known keys of "
                                  f"[{section}]: {', '.join(sorted(known[section]))}.")
    return raw


def load_config(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
    cli_spellings: Mapping[str, str] | None = None,
) -> Config:
    """Build and validate the configuration.

    Parameters
    ----------
    path : path, optional
        TOML file; when ``None``, ``STREAMLEARN_CONFIG`` names it (if set).
    environ : mapping, optional
        The environment; ``None`` reads ``os.environ`` (the only place that does).
    cli : mapping, optional
        ``"section.field" -> value`` given on the command line (strings or typed values).
    cli_spellings : mapping, optional
        ``"section.field" -> how the command line spells it`` where that is more than
        ``--section-field`` (an alias: ``"--rollout-mode or --rollout"``), for errors.
    """
    env = dict(os.environ if environ is None else environ)
    cli = dict(cli or {})
    unknown_cli = set(cli) - {f"{s.section}.{s.name}" for s in field_specs()}
    if unknown_cli:
        raise ConfigError(f"Unknown setting(s) {sorted(unknown_cli)}.")
    file_path = Path(path) if path is not None else (
        Path(env["STREAMLEARN_CONFIG"]) if env.get("STREAMLEARN_CONFIG") else None)
    file_values = _read_file(file_path) if file_path is not None else {}
    sections: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    origins: dict[str, str] = {}  # keys set by the CLI, the environment or the file
    for fs in field_specs():
        key, env_key = f"{fs.section}.{fs.name}", env_name(fs.section, fs.name)
        # every value given is checked, also one a higher source overrides (a bad value in
        # the file is an error the day the flag that hides it is dropped); the last wins
        sources = [
            *(((file_values[fs.section][fs.name], str(file_path), False),)
              if fs.name in file_values.get(fs.section, {}) else ()),
            *(((env[env_key], env_key, True),) if env_key in env else ()),
            *(((cli[key], (cli_spellings or {}).get(key, flag_name(fs.section, fs.name)),
                True),)
              if key in cli and cli[key] is not None else ())]
        values = [convert(fs, raw, origin, text) for raw, origin, text in sources]
        sections[fs.section][fs.name] = values[-1] if values else fs.default
        if sources:
            origins[key] = sources[-1][1]
    if sections["kafka"]["client"] == "auto":  # asked for by name, it is still the default's
        origins.pop("kafka.client", None)  # choice, and `serve` says why it chose
    given = set(origins)
    _warn_near_misses(env)
    if "exploration.gamma" in given and "exploration.name" not in given:
        # `--gamma 0.1` alone means a fixed γ of 0.1 (as in replay), not an ignored value
        sections["exploration"]["name"] = "fixed"
    config = Config(**{s: SECTIONS[s](**v) for s, v in sections.items()},
                    source=str(file_path) if file_path is not None else None, origins=origins)
    _check_consistency(config)
    return config


def _warn_near_misses(env: Mapping[str, str]) -> None:
    """A ``STREAMLEARN_*`` variable that is no setting is ignored like any other unrelated
    variable — but said when it was meant as one, since that setting keeps its default: when
    it is named after a section (``STREAMLEARN_LEARNER_GAMMA``), or one typo away from a
    setting."""
    for key in sorted(env):
        if key.startswith(ENV_PREFIX) and key != "STREAMLEARN_CONFIG":
            meant = _meant_setting(key)
            if meant:
                _log.warning("ignoring the environment variable %s: %s", key, meant)


def _meant_setting(key: str) -> str:
    """Why ``key`` is no setting and what was meant; '' for a setting or an unrelated name
    (``STREAMLEARN_DATA_DIR`` is the datasets')."""
    specs = field_specs()
    known = {env_name(fs.section, fs.name): fs for fs in specs}
    if key in known:
        return ""
    section = next((s for s in SECTIONS if key.startswith(env_name(s, ""))), None)
    if section is None:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.9)
        return f"no such setting (did you mean {close[0]}?)" if close else ""
    name = key[len(env_name(section, "")):].lower()
    own = [fs.name for fs in specs if fs.section == section]
    close = difflib.get_close_matches(name, own, n=1, cutoff=0.6)
    if close:
        return f"no such setting (did you mean {env_name(section, close[0])}?)"
    elsewhere = [env_name(fs.section, fs.name) for fs in specs if fs.name == name]
    if elsewhere:
        return f"[{section}] has no setting {name!r} (did you mean {elsewhere[0]}?)"
    return (f"[{section}] has no setting {name!r} (its settings: "
            f"{', '.join(env_name(section, n) for n in own)})")


def _shown(path: Path | None) -> str:
    """A path as messages quote it ('/var/lib/x', not PosixPath('/var/lib/x'))."""
    return repr(None if path is None else str(path))


def _check_consistency(config: Config) -> None:
    """Rules that involve more than one field."""
    kafka = config.kafka
    if kafka.security_protocol.startswith("SASL_"):
        if kafka.sasl_mechanism is None:
            raise ConfigError(f"kafka.sasl_mechanism must be set when kafka.security_protocol is "
                              f"{kafka.security_protocol}. Got nothing.")
        if kafka.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and (
                kafka.sasl_username is None or kafka.sasl_password is None):
            raise ConfigError(f"kafka.sasl_username and kafka.sasl_password must be set for SASL "
                              f"mechanism {kafka.sasl_mechanism}. Got "
                              f"{'no username' if kafka.sasl_username is None else 'no password'}.")
    if (kafka.ssl_certfile is None) != (kafka.ssl_keyfile is None):
        raise ConfigError("kafka.ssl_certfile and kafka.ssl_keyfile must be given together. "
                          "Got only one of them.")
    names = [config.topics.instances, config.topics.feedback, config.topics.decisions,
             config.topics.dead_letter, config.topics.models, config.topics.changelog]
    if len(set(names)) != len(names):
        raise ConfigError(f"topics.instances, feedback, decisions, dead_letter, models and "
                          f"changelog must be six different topics. Got {names}.")
    if config.kafka.membership == "group" and (config.checkpoint.dir is None
                                               or config.kafka.bootstrap is None):
        raise ConfigError("kafka.membership = group needs kafka.bootstrap and checkpoint.dir (the "
                          "partitions' state: a local cache of the changelog with "
                          "checkpoint.changelog, else storage every replica reaches). Got "
                          f"bootstrap {config.kafka.bootstrap!r}, checkpoint.dir "
                          f"{_shown(config.checkpoint.dir)}.")
    if config.checkpoint.changelog and (config.checkpoint.dir is None
                                        or config.kafka.bootstrap is None):
        raise ConfigError("checkpoint.changelog needs kafka.bootstrap and checkpoint.dir (the "
                          "changelog mirrors the checkpoints of that directory). Got "
                          f"bootstrap {config.kafka.bootstrap!r}, checkpoint.dir "
                          f"{_shown(config.checkpoint.dir)}.")
    if config.exploration.name == "fixed" and config.exploration.gamma is None:
        raise ConfigError("exploration.gamma must be set for the fixed strategy. Got nothing.")
    if not config.embedded_mode:  # K is learner.n_actions (embedded: the dataset's, at serve)
        check_baseline_action(config, config.learner.n_actions,
                              f"learner.n_actions = {config.learner.n_actions}")


def check_baseline_action(config: Config, n_actions: int, why: str) -> None:
    """Refuse a ``rollout.baseline`` (``constant:A``, its syntax checked by :func:`load_config`)
    whose action is not among the ``n_actions`` actions, naming where it came from; ``why``
    says where K came from."""
    spec_text = config.rollout.baseline
    if spec_text is None:
        return
    action = int(spec_text.partition(":")[2])
    if not 0 <= action < n_actions:
        raise ConfigError(f"rollout.baseline must be 'constant:A' with an action A in [0, "
                          f"{n_actions}) ({why}). Got {spec_text!r} (from "
                          f"{config.origin('rollout.baseline')}).")
