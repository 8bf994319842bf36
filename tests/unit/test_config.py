"""Config: precedence CLI > env > file > defaults, one-line field-naming errors."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from streamlearn.commands.serve import shown_default
from streamlearn.config import (
    SECTIONS,
    Config,
    env_name,
    field_specs,
    flag_name,
    load_config,
)
from streamlearn.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "streamlearn.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_any_source() -> None:
    cfg = load_config(environ={})
    assert cfg == dataclasses.replace(Config(), source=None)
    assert cfg.embedded_mode
    assert cfg.metrics.host == "127.0.0.1"
    assert cfg.checkpoint.keep == 2
    assert cfg.join.expiry_policy == "default_reward"


def test_precedence_cli_over_env_over_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[join]\nwindow_seconds = 10\nmax_pending = 7\n"
                           "[learner]\nname = 'pnorm'\neta = 0.5\n")
    env = {"STREAMLEARN_JOIN_WINDOW_SECONDS": "20", "STREAMLEARN_LEARNER_ETA": "0.25"}
    cfg = load_config(path, environ=env, cli={"join.window_seconds": "30"})
    assert cfg.join.window_seconds == 30.0  # CLI
    assert cfg.learner.eta == 0.25  # env beats file
    assert cfg.join.max_pending == 7  # file beats default
    assert cfg.learner.name == "pnorm"
    assert cfg.learner.hyperparameters() == {"eta": 0.25}
    assert cfg.source == str(path)


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "[kafka]\nbootstrap = 'localhost:9092'\n")
    cfg = load_config(environ={"STREAMLEARN_CONFIG": str(path)})
    assert cfg.kafka.bootstrap == "localhost:9092"
    assert not cfg.embedded_mode


def test_error_names_field_value_and_source() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(environ={"STREAMLEARN_JOIN_WINDOW_SECONDS": "abc"})
    assert str(exc.value) == ("join.window_seconds must be a number > 0. Got 'abc' "
                              "(from STREAMLEARN_JOIN_WINDOW_SECONDS).")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("join.window_seconds", "0", "join.window_seconds must be a number > 0. Got '0'"),
    ("join.window_seconds", "nan", "a number > 0"),
    ("limits.poll_max_records", "1.5", "limits.poll_max_records must be an integer >= 1"),
    ("metrics.port", "70000", "metrics.port must be an integer in [-1, 65535]"),
    ("join.expiry_policy", "keep", "join.expiry_policy must be one of 'default_reward', 'drop'"),
    ("exploration.gamma", "0.7", "exploration.gamma must be a number in (0, 0.5] (or unset)"),
    ("join.default_reward", "2", "join.default_reward must be a number in [0, 1]"),
    ("kafka.bootstrap", "localhost", "kafka.bootstrap must be HOST:PORT"),
    ("kafka.bootstrap", "h:1,h:x", "kafka.bootstrap must be HOST:PORT"),
    ("kafka.ssl_cafile", "/nonexistent/ca.pem", "the path of an existing file"),
    ("learner.n_actions", "1", "learner.n_actions must be an integer >= 2"),
    ("topics.instances", "", "topics.instances must be a non-empty string"),
])
def test_cli_values_validated(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=None) as exc:
        load_config(environ={}, cli={key: value})
    assert expected in str(exc.value)
    assert f"(from {flag_name(*key.split('.'))})" in str(exc.value)


def test_file_values_are_type_checked(tmp_path: Path) -> None:
    path = write(tmp_path, "[limits]\npoll_max_records = '10'\n")
    with pytest.raises(ConfigError, match=r"limits.poll_max_records must be an integer >= 1. "
                                          r"Got '10' \(from .*streamlearn.toml\): a TOML "
                                          r"string, not a number: write it without the quotes\.$"):
        load_config(path, environ={})
    path = write(tmp_path, "[checkpoint]\nfsync_journal = 'true'\n")
    with pytest.raises(ConfigError, match=r"Got 'true' \(from .*\): a TOML string, not a "
                                          r"boolean: write it without the quotes\.$"):
        load_config(path, environ={})
    path = write(tmp_path, "[join]\nwindow_seconds = 'abc'\n")  # not a number even unquoted
    with pytest.raises(ConfigError, match=r"Got 'abc' \(from .*streamlearn.toml\)\.$"):
        load_config(path, environ={})
    path = write(tmp_path, "[metrics]\nport = true\n")
    with pytest.raises(ConfigError, match=r"metrics\.port must be .* Got True \(from .*\)\.$"):
        load_config(path, environ={})


def test_unknown_keys_and_sections_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Unknown key 'join.windw_seconds' in .*window_seconds"):
        load_config(write(tmp_path, "[join]\nwindw_seconds = 3\n"), environ={})
    with pytest.raises(ConfigError, match=r"Unknown section \[jion\]"):
        load_config(write(tmp_path, "[jion]\nwindow_seconds = 3\n"), environ={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[join\n"), environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", environ={})


def test_optional_fields_unset_from_env() -> None:
    cfg = load_config(environ={"STREAMLEARN_KAFKA_BOOTSTRAP": "",
                               "STREAMLEARN_CHECKPOINT_DIR": "none"})
    assert cfg.kafka.bootstrap is None and cfg.checkpoint.dir is None


def test_choices_are_case_insensitive_and_normalised() -> None:
    cfg = load_config(environ={"STREAMLEARN_KAFKA_SECURITY_PROTOCOL": "ssl"})
    assert cfg.kafka.security_protocol == "SSL"


def test_sasl_needs_mechanism_and_credentials() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.sasl_mechanism must be set"):
        load_config(environ={}, cli={"kafka.security_protocol": "SASL_SSL"})
    with pytest.raises(ConfigError, match="no password"):
        load_config(environ={}, cli={"kafka.security_protocol": "SASL_SSL",
                                     "kafka.sasl_mechanism": "PLAIN",
                                     "kafka.sasl_username": "u"})
    cfg = load_config(environ={"STREAMLEARN_KAFKA_SASL_PASSWORD": "s3cret"},
                      cli={"kafka.security_protocol": "SASL_SSL",
                           "kafka.sasl_mechanism": "SCRAM-SHA-512", "kafka.sasl_username": "u"})
    assert cfg.kafka.client_options() == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "u", "sasl_plain_password": "s3cret"}
    assert "s3cret" not in repr(cfg)
    assert cfg.as_dict()["kafka"]["sasl_password"] == "***"


def test_ssl_files_are_checked_and_paired(tmp_path: Path) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError, match="given together"):
        load_config(environ={}, cli={"kafka.ssl_certfile": str(cert)})
    cfg = load_config(environ={}, cli={"kafka.ssl_certfile": str(cert),
                                       "kafka.ssl_keyfile": str(cert)})
    assert cfg.kafka.client_options()["ssl_keyfile"] == str(cert)


def test_topics_must_differ() -> None:
    with pytest.raises(ConfigError, match="six different topics"):
        load_config(environ={}, cli={"topics.feedback": "streamlearn.instances"})


def test_config_is_frozen() -> None:
    cfg = load_config(environ={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.join.window_seconds = 1.0  # type: ignore[misc]


def test_every_field_has_help_env_and_flag_names() -> None:
    specs = field_specs()
    assert len(specs) == sum(len(dataclasses.fields(c)) for c in SECTIONS.values())
    for fs in specs:
        assert fs.help, fs.key
        assert env_name(fs.section, fs.name).startswith("STREAMLEARN_")
        assert flag_name(fs.section, fs.name).startswith("--")
    assert env_name("join", "window_seconds") == "STREAMLEARN_JOIN_WINDOW_SECONDS"
    assert flag_name("join", "window_seconds") == "--join-window-seconds"


def test_unrelated_environment_is_ignored() -> None:
    cfg = load_config(environ={"STREAMLEARN_UNKNOWN_THING": "1", "PATH": "/bin"})
    assert cfg.kafka.bootstrap is None


def test_unknown_cli_setting_rejected() -> None:
    with pytest.raises(ConfigError, match="Unknown setting"):
        load_config(environ={}, cli={"join.nope": "1"})


def test_booleans_from_env_file_and_cli(tmp_path: Path) -> None:
    assert load_config(environ={}).checkpoint.fsync_journal is False
    assert load_config(environ={"STREAMLEARN_CHECKPOINT_FSYNC_JOURNAL": "yes"}
                       ).checkpoint.fsync_journal is True
    path = write(tmp_path, "[checkpoint]\nfsync_journal = true\n")
    assert load_config(path, environ={}).checkpoint.fsync_journal is True
    assert load_config(path, environ={}, cli={"checkpoint.fsync_journal": "off"}
                       ).checkpoint.fsync_journal is False
    with pytest.raises(ConfigError, match=r"checkpoint\.fsync_journal must be true or false"):
        load_config(environ={}, cli={"checkpoint.fsync_journal": "maybe"})
    with pytest.raises(ConfigError, match="true or false"):
        load_config(write(tmp_path, "[checkpoint]\nfsync_journal = 'true'\n"), environ={})


def test_group_and_changelog_need_a_bootstrap_and_quote_the_directory_plainly(
        tmp_path: Path) -> None:
    for cli in ({"kafka.membership": "group"}, {"checkpoint.changelog": "true"}):
        with pytest.raises(ConfigError) as exc:
            load_config(environ={}, cli={**cli, "checkpoint.dir": str(tmp_path)})
        message = str(exc.value)
        assert "needs kafka.bootstrap and checkpoint.dir" in message
        assert f"checkpoint.dir {str(tmp_path)!r}." in message and "PosixPath" not in message


def test_daemon_settings_carry_the_config() -> None:
    cfg = load_config(environ={}, cli={"join.window_seconds": "30", "checkpoint.dir": "/tmp/x",
                                       "limits.poll_max_records": "64",
                                       "checkpoint.fsync_journal": "true"})
    settings = cfg.to_daemon_settings()
    assert settings.join.window_seconds == 30.0
    assert str(settings.checkpoint.dir) == "/tmp/x"
    assert settings.limits.poll_max_records == 64
    assert settings.checkpoint.fsync_journal is True
    assert settings.join.expiry_policy == "default_reward"
    # one shape: the daemon holds the configuration's own sections, not copies by name
    assert settings.join is cfg.join and settings.retrain is cfg.retrain
    assert settings.join.join_settings().window_s == 30.0


def test_docs_list_every_setting_with_env_and_flag() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for fs in field_specs():
        row = next((line for line in text.splitlines()
                    if line.startswith(f"| `{fs.name}` |") and env_name(fs.section, fs.name)
                    in line), None)
        assert row is not None, fs.key
        assert f"`{flag_name(fs.section, fs.name)}`" in row, fs.key
        # the default as `serve --help-all` shows it (false, 1e12: as a file writes them)
        assert row.split(" | ")[2].strip().strip("`") == shown_default(fs.default), fs.key


def test_k8s_configmap_holds_a_valid_config(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    manifest = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "streamlearn.yaml"
    docs = list(yaml.safe_load_all(manifest.read_text()))
    text = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["streamlearn.toml"]
    ca = tmp_path / "ca.crt"
    ca.write_text("x")
    path = write(tmp_path, text.replace("/etc/streamlearn/tls/ca.crt", str(ca)))
    cfg = load_config(path, environ={"STREAMLEARN_KAFKA_SASL_PASSWORD": "secret"})
    assert cfg.kafka.security_protocol == "SASL_SSL" and not cfg.embedded_mode
    assert cfg.metrics.host == "0.0.0.0"


def test_checkpoint_dir_must_be_usable_as_a_directory(tmp_path: Path) -> None:
    a_file = tmp_path / "state"
    a_file.write_text("not a directory")
    for given, why in ((a_file, "it exists and is not a directory"),
                       (a_file / "sub", f"{str(a_file)!r} is not a directory")):
        with pytest.raises(ConfigError) as exc:
            load_config(environ={}, cli={"checkpoint.dir": str(given)})
        assert str(exc.value) == (
            "checkpoint.dir must be a directory (existing, or one that can be created) (or "
            f"unset). Got {str(given)!r} (from --checkpoint-dir): {why}.")
    fresh = tmp_path / "new" / "state"  # created later by the checkpointer
    assert load_config(environ={}, cli={"checkpoint.dir": str(fresh)}).checkpoint.dir == fresh
    assert not (tmp_path / "new").exists()  # the check created it and removed what it made


def test_a_checkpoint_dir_the_system_refuses_to_create_is_a_config_error() -> None:
    """Writable by its permission bits (as root), refused by mkdir: a pseudo file system. It
    passed the check and stopped serve with a bare OSError line and exit code 1."""
    with pytest.raises(ConfigError) as exc:
        load_config(environ={}, cli={"checkpoint.dir": "/proc/streamlearn-test/state"})
    assert str(exc.value).startswith(
        "checkpoint.dir must be a directory (existing, or one that can be created) (or unset). "
        "Got '/proc/streamlearn-test/state' (from --checkpoint-dir): cannot create it: ")


def test_exploration_defaults_to_the_learners_own_and_a_lone_gamma_means_fixed(
        tmp_path: Path) -> None:
    from streamlearn.commands.serve import build_learner
    from streamlearn.learners import Adaptive, default_exploration

    default = load_config(environ={})
    assert default.exploration.name == "default"
    # the exploration every measurement of the default learner used (docs/bench.md), not the
    # adaptive rule's untuned defaults
    assert build_learner(default, 9, 400).exploration.spec() == default_exploration().spec()
    assert default_exploration().spec() != Adaptive().spec()
    banditron = load_config(environ={"STREAMLEARN_LEARNER_NAME": "banditron"})
    assert build_learner(banditron, 9, 400).exploration.spec() == Adaptive().spec()
    bag = load_config(environ={"STREAMLEARN_LEARNER_NAME": "bag"})
    assert build_learner(bag, 9, 400).exploration.spec() == {
        "name": "fixed", "gamma": 0.0001, "detect_drift": True, "drift_delta": 0.2,
        "drift_threshold": 100.0}
    untuned = load_config(environ={"STREAMLEARN_EXPLORATION_NAME": "adaptive"})
    assert build_learner(untuned, 9, 400).exploration.spec() == Adaptive().spec()
    lone = load_config(environ={"STREAMLEARN_EXPLORATION_GAMMA": "0.1"})
    assert (lone.exploration.name, lone.exploration.gamma) == ("fixed", 0.1)
    assert build_learner(lone, 9, 400).exploration.spec() == {"name": "fixed", "gamma": 0.1}
    both = load_config(write(tmp_path, "[exploration]\nname = 'margin'\ngamma = 0.2\n"),
                       environ={})
    assert both.exploration.name == "margin"


def test_a_near_miss_in_the_environment_is_said(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="streamlearn.config"):
        cfg = load_config(environ={"STREAMLEARN_JOIN_WINDW_SECONDS": "5",
                                   "STREAMLEARN_UNKNOWN_THING": "1"})
    assert cfg.join.window_seconds == 600.0  # ignored, as any unrelated variable
    said = [r.getMessage() for r in caplog.records]
    assert said == ["ignoring the environment variable STREAMLEARN_JOIN_WINDW_SECONDS: no such "
                    "setting (did you mean STREAMLEARN_JOIN_WINDOW_SECONDS?)"]


def test_reward_weights_from_a_table_the_environment_or_a_flag(tmp_path: Path) -> None:
    path = write(tmp_path, "[join]\nduplicate_policy = 'median'\n"
                           "reward_weights = {click = 1, conversion = 10, \"add to cart\" = 0.5}\n")
    cfg = load_config(path, environ={})
    assert cfg.join.duplicate_policy == "median"
    settings = cfg.to_daemon_settings().join.join_settings()
    assert settings.duplicate_policy == "median"
    assert settings.reward_weights == {"click": 1.0, "conversion": 10.0, "add to cart": 0.5}
    env = {"STREAMLEARN_JOIN_REWARD_WEIGHTS": "click=2, dwell=0.25",
           "STREAMLEARN_JOIN_DUPLICATE_POLICY": "sum"}
    cfg = load_config(path, environ=env)
    assert cfg.join.duplicate_policy == "sum"
    assert cfg.to_daemon_settings().join.join_settings().reward_weights == {"click": 2.0, "dwell": 0.25}
    cfg = load_config(path, environ=env, cli={"join.reward_weights": "view=0",
                                                "join.duplicate_policy": "average"})
    assert cfg.to_daemon_settings().join.join_settings().reward_weights == {"view": 0.0}
    assert load_config(environ={}).to_daemon_settings().join.join_settings().reward_weights == {}
    for policy in ("latest", "max", "sum", "average", "min", "median"):
        assert load_config(environ={}, cli={"join.duplicate_policy": policy}).join.duplicate_policy == policy
    # what --print-config writes (the compact text) reads back in a file
    again = write(tmp_path, f"[join]\nreward_weights = {cfg.join.reward_weights!r}\n".replace("'", '"'))
    assert load_config(again, environ={}).join.reward_weights == cfg.join.reward_weights


@pytest.mark.parametrize(("raw", "why"), [
    ("click", "expected name=weight, got 'click'"),
    ("click=-1", "the weight of 'click' must be finite and >= 0"),
    ("click=inf", "the weight of 'click' must be finite and >= 0"),
    ("click=-1", "the weight of 'click' must be finite and >= 0, got -1"),
    ("click=ten", "the weight of 'click' must be a number written with the digits 0-9, got 'ten'"),
    ("click=1_0", "the weight of 'click' must be a number written with the digits 0-9, got '1_0'"),
    ("click=1,click=2", "'click' is given twice"),
    ("click = 1, click=2", "'click' is given twice"),
    # an empty item is a typo, not nothing (it used to be skipped)
    ("click=1,,conversion=2", "item 2 of 3 is empty (items are name=weight separated by one ',')"),
    ("click=1,", "item 2 of 2 is empty"),
    (",click=1", "item 1 of 2 is empty"),
    (",", "item 1 of 2 is empty"),
    ("=1", "expected a name before '=', got '=1'"),
    ("click=", "expected a weight after '=', got 'click='"),
    ("none=1", "'none' is the label of feedback without a type and cannot be configured"),
    ("other=1", "'other' is the label of feedback with a type not listed"),
    ("x" * 65 + "=1", "a type must be a string of 1 to 64 characters"),
])
def test_bad_reward_weights_say_what_was_expected_and_got(raw: str, why: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(environ={"STREAMLEARN_JOIN_REWARD_WEIGHTS": raw})
    text = str(exc.value)
    assert text.startswith("join.reward_weights must be names with a weight >= 0 each")
    assert f"(from STREAMLEARN_JOIN_REWARD_WEIGHTS): {why}" in text


def test_bad_reward_weights_in_a_table_name_the_file(tmp_path: Path) -> None:
    for table, why in (("{click = 'x'}", "the weight of 'click' is not a number"),
                       ("{click = -2}", "must be finite and >= 0"),
                       ("{'a,b' = 1}", "is not a name")):
        path = write(tmp_path, f"[join]\nreward_weights = {table}\n")
        with pytest.raises(ConfigError, match=f"from {path}.*{why}"):
            load_config(path, environ={})


# ---------------------------------------------------------------- rollout.baseline
@pytest.mark.parametrize(("raw", "why"), [
    ("banana", "no ':' in it (a constant action is written constant:A, e.g. constant:0)"),
    ("constant:x", "the action after ':' must be an integer >= 0 written with the digits 0-9, "
                   "got 'x'"),
    ("constant:", "the action after ':' must be an integer >= 0"),
    ("constant:-1", "got '-1'"),
    ("constant:1.0", "got '1.0'"),
    ("constant:1_0", "got '1_0'"),  # int() would take it
    ("constant:\u0661", "the digits 0-9"),  # and this
    ("constant:1:2", "got '1:2'"),
    ("fixed:1", "the kind before ':' must be 'constant', got 'fixed'"),
    ("constant:" + "9" * 19, "more than 18 digits"),
])
def test_a_bad_rollout_baseline_is_refused_at_load_naming_its_source(raw: str, why: str,
                                                                     tmp_path: Path) -> None:
    """The syntax is checked with the other settings (``--print-config`` included), from every
    source, saying what was expected, what was got, where from and why."""
    expected = "rollout.baseline must be 'constant:A' with an action A (an integer >= 0) (or unset)."
    for kwargs, origin in (({"cli": {"rollout.baseline": raw}}, "--rollout-baseline"),
                           ({"environ": {"STREAMLEARN_ROLLOUT_BASELINE": raw}},
                            "STREAMLEARN_ROLLOUT_BASELINE")):
        with pytest.raises(ConfigError) as exc:
            load_config(**{"environ": {}, **kwargs})  # type: ignore[arg-type]
        assert str(exc.value).startswith(f"{expected} Got {raw!r} (from {origin}): "), exc.value
        assert why in str(exc.value)
    path = write(tmp_path, f"[rollout]\nbaseline = {raw!r}\n".replace("'", '"'))
    with pytest.raises(ConfigError, match=f"Got .* \\(from {re.escape(str(path))}\\): "):
        load_config(path, environ={})


def test_a_bad_rollout_baseline_in_the_file_is_refused_when_a_flag_overrides_it(
        tmp_path: Path) -> None:
    path = write(tmp_path, "[rollout]\nbaseline = 'banana'\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path, environ={}, cli={"rollout.baseline": "constant:1"})
    assert f"Got 'banana' (from {path}): no ':'" in str(exc.value)
    with pytest.raises(ConfigError, match=r'Got 3 \(from .*\): write it as a string: "constant:3"'):
        load_config(write(tmp_path, "[rollout]\nbaseline = 3\n"), environ={},
                    cli={"rollout.baseline": "constant:1"})


@pytest.mark.parametrize(("raw", "normalised"), [
    ("constant:2", "constant:2"), ("constant: 2", "constant:2"), ("CONSTANT:1", "constant:1"),
    (" Constant : 3 ", "constant:3"), ("constant:007", "constant:7"), ("", None), ("none", None),
])
def test_rollout_baseline_takes_any_case_and_blanks_and_keeps_constant_a(
        raw: str, normalised: str | None) -> None:
    """``constant`` is case-insensitive (as choices are) and blanks are ignored, consistently:
    ``"constant: 2"`` used to pass and ``CONSTANT:1`` to fail; the config keeps the normalised
    ``constant:A``, which is what the daemon parses."""
    from streamlearn.service.adoption import parse_baseline

    cfg = load_config(environ={"STREAMLEARN_ROLLOUT_BASELINE": raw})
    assert cfg.rollout.baseline == normalised
    expected = -1 if normalised is None else int(normalised.partition(":")[2])
    assert cfg.to_daemon_settings().adoption_settings().baseline == expected
    assert parse_baseline(cfg.rollout.baseline, 9) == expected


def test_a_rollout_baseline_beyond_the_actions_names_its_source() -> None:
    """With Kafka, K is learner.n_actions: checked at load (in embedded mode the dataset's K
    is known only when serving, where the same check runs: test_cli_serve)."""
    kafka = {"kafka.bootstrap": "localhost:9092", "learner.n_actions": "4"}
    assert load_config(environ={}, cli={**kafka, "rollout.baseline": "constant:3"}
                       ).rollout.baseline == "constant:3"
    with pytest.raises(ConfigError) as exc:
        load_config(environ={"STREAMLEARN_ROLLOUT_BASELINE": "Constant:4"}, cli=kafka)
    assert str(exc.value) == ("rollout.baseline must be 'constant:A' with an action A in [0, 4) "
                              "(learner.n_actions = 4). Got 'constant:4' "
                              "(from STREAMLEARN_ROLLOUT_BASELINE).")
    # embedded: the syntax only, at load
    assert load_config(environ={}, cli={"rollout.baseline": "constant:30"}
                       ).rollout.baseline == "constant:30"
