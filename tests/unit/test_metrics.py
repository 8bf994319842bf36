"""PrometheusObserver: every metric of docs/metrics.md on a fresh registry."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from streamlearn.service.metrics import (
    FEEDBACK_OUTCOMES,
    ActionCollector,
    ArrayHistogram,
    Observer,
    PrometheusObserver,
)


@pytest.fixture()
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def test_every_observer_method_is_implemented_and_noop_on_base() -> None:
    base = Observer()
    for name, method in inspect.getmembers(Observer, inspect.isfunction):
        if name.startswith("on_") and name not in ("on_decided", "on_learned"):  # fan out
            assert name in PrometheusObserver.__dict__, name
            assert method.__doc__, name
    # the no-op base accepts the calls and does nothing
    base.on_decisions(3, 1, 0.1)
    base.on_feedback("joined", 2, np.array([1.0, 2.0]))


def test_counters(registry: CollectorRegistry) -> None:
    obs = PrometheusObserver(registry)
    obs.on_instances(5)
    obs.on_instances(2)
    obs.on_decisions(7, 2, np.full(7, 0.003))
    obs.on_feedback("joined", 4, np.array([0.2, 1.0, 3.0, 100.0]))
    obs.on_feedback("expired", 1)
    obs.on_invalid("instances", "bad_json", 3)
    obs.on_rewards(2.5)
    obs.on_mistakes(1.5)
    obs.on_regret(1.0)
    obs.on_shed(2)
    get = registry.get_sample_value
    assert get("streamlearn_instances_total") == 7
    assert get("streamlearn_decisions_total", {"explored": "true"}) == 2
    assert get("streamlearn_decisions_total", {"explored": "false"}) == 5
    assert get("streamlearn_feedback_total", {"outcome": "joined"}) == 4
    assert get("streamlearn_feedback_total", {"outcome": "expired"}) == 1
    assert get("streamlearn_feedback_total", {"outcome": "duplicate"}) == 0  # visible at 0
    invalid = {"topic": "instances", "reason": "bad_json"}
    assert get("streamlearn_invalid_events_total", invalid) == 3
    assert get("streamlearn_rewards_total") == 2.5
    assert get("streamlearn_mistakes_total") == 1.5
    assert get("streamlearn_regret_total") == 1.0
    assert get("streamlearn_pending_shed_total") == 2


def test_unknown_outcome_rejected(registry: CollectorRegistry) -> None:
    with pytest.raises(ValueError, match="outcome must be one of"):
        PrometheusObserver(registry).on_feedback("lost", 1)
    assert set(FEEDBACK_OUTCOMES) == {"joined", "late", "expired", "unknown", "duplicate"}


def test_gauges(registry: CollectorRegistry) -> None:
    obs = PrometheusObserver(registry)
    obs.on_error_rates(0.3, 0.1, 0.05)
    obs.on_gamma(0.02)
    obs.on_pending(11)
    obs.on_lag(4)
    obs.on_model_version(3)
    obs.on_ranker_metric("auc", 0.8)
    obs.on_policy_value("ranker-3", "snips", 0.7, 0.6, 0.8)
    obs.on_start("Banditron", "fixed", "embedded")
    get = registry.get_sample_value
    assert get("streamlearn_error_rate") == 0.3
    assert get("streamlearn_window_error_rate") == 0.1
    assert get("streamlearn_exploit_error_estimate") == 0.05
    assert get("streamlearn_exploration_gamma") == 0.02
    assert get("streamlearn_pending_joins") == 11
    assert get("streamlearn_consumer_lag") == 4
    assert get("streamlearn_model_version") == 3
    assert get("streamlearn_ranker_quality", {"metric": "auc"}) == 0.8
    assert get("streamlearn_policy_value", {"policy": "ranker-3", "estimator": "snips"}) == 0.7
    assert get("streamlearn_policy_value_lower", {"policy": "ranker-3", "estimator": "snips"}) == 0.6
    info = registry.get_sample_value(
        "streamlearn_info",
        {"version": __import__("streamlearn").__version__, "learner": "Banditron",
         "exploration": "fixed", "transport": "embedded"})
    assert info == 1
    with pytest.raises(ValueError, match="ranker metric"):
        obs.on_ranker_metric("f1", 0.5)


def test_offpolicy_policies_bounded(registry: CollectorRegistry) -> None:
    obs = PrometheusObserver(registry, max_policies=2)
    for i in range(5):
        obs.on_policy_value(f"p{i}", "dr", float(i), 0.0, 1.0)
    text = generate_latest(registry).decode()
    assert text.count("streamlearn_policy_value{") == 2
    obs.on_policy_value("p1", "dr", 9.0, 0.0, 10.0)  # known policies still update
    assert registry.get_sample_value("streamlearn_policy_value", {"policy": "p1", "estimator": "dr"}) == 9.0


def test_array_histogram_matches_naive_binning() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.exponential(0.01, 500), [0.001, 0.005, np.nan, np.inf]])
    hist = ArrayHistogram("h_seconds", "test", (0.001, 0.005, 0.01, 0.05))
    hist.observe(values[:200])
    hist.observe(values[200:])
    hist.observe(0.002)  # a scalar works too
    finite = np.append(values[np.isfinite(values)], 0.002)
    (family,) = list(hist.collect())
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    for le in (0.001, 0.005, 0.01, 0.05):
        assert samples[("h_seconds_bucket", repr(le))] == np.sum(finite <= le)  # inclusive
    assert samples[("h_seconds_bucket", "+Inf")] == len(finite)
    assert samples[("h_seconds_count", None)] == len(finite)
    assert samples[("h_seconds_sum", None)] == pytest.approx(finite.sum())


def test_histograms(registry: CollectorRegistry) -> None:
    obs = PrometheusObserver(registry)
    obs.on_decisions(3, 0, np.array([0.001, 0.002, 0.2]))
    obs.on_feedback("joined", 2, np.array([5.0, 7.0]))
    obs.on_batch(100)
    obs.on_batch(3, topic="feedback")
    obs.on_checkpoint(0.04)
    obs.on_retrain(2.0)
    get = registry.get_sample_value
    assert get("streamlearn_decision_latency_seconds_count") == 3
    assert get("streamlearn_decision_latency_seconds_bucket", {"le": "0.0025"}) == 2
    assert get("streamlearn_feedback_delay_seconds_sum") == 12.0
    assert get("streamlearn_batch_size_count", {"topic": "instances"}) == 1
    assert get("streamlearn_batch_size_sum", {"topic": "feedback"}) == 3
    assert get("streamlearn_checkpoint_duration_seconds_count") == 1
    assert get("streamlearn_retrain_duration_seconds_sum") == 2.0


def test_checkpoint_age_is_computed_at_scrape_time(registry: CollectorRegistry) -> None:
    now = [1000.0]
    obs = PrometheusObserver(registry, clock=lambda: now[0])
    now[0] = 1012.0
    assert registry.get_sample_value("streamlearn_checkpoint_age_seconds") == 12.0  # since start
    obs.on_checkpoint(0.1)
    now[0] = 1015.5
    assert registry.get_sample_value("streamlearn_checkpoint_age_seconds") == 3.5
    obs.on_checkpoint(0.1, written_at=1010.0)  # e.g. a restored snapshot's time
    assert registry.get_sample_value("streamlearn_checkpoint_age_seconds") == 5.5


def test_action_collector_is_bounded(registry: CollectorRegistry) -> None:
    obs = PrometheusObserver(registry, max_actions=4)
    actions = np.array([0, 1, 1, 3, 4, 7, 9])
    obs.on_action_decisions(actions)
    obs.on_action_rewards(actions, np.array([1.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0]))
    get = registry.get_sample_value
    assert get("streamlearn_action_decisions_total", {"action": "1"}) == 2
    assert get("streamlearn_action_decisions_total", {"action": "other"}) == 3
    assert get("streamlearn_action_rewards_total", {"action": "other"}) == 1.5
    assert get("streamlearn_action_decisions_total", {"action": "2"}) is None  # never chosen
    text = generate_latest(registry).decode()
    assert 'action="7"' not in text
    with pytest.raises(ValueError):
        ActionCollector(0)


def test_two_observers_on_two_registries_do_not_clash() -> None:
    a, b = CollectorRegistry(), CollectorRegistry()
    PrometheusObserver(a).on_instances(1)
    PrometheusObserver(b).on_instances(2)
    assert a.get_sample_value("streamlearn_instances_total") == 1
    assert b.get_sample_value("streamlearn_instances_total") == 2


REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _exported_names() -> set[str]:
    registry = CollectorRegistry()
    obs = PrometheusObserver(registry)
    obs.on_action_decisions(np.array([0]))
    obs.on_invalid("instances", "bad_json")
    obs.on_ranker_metric("auc", 0.5)
    obs.on_policy_value("p", "ips", 0.5, 0.4, 0.6)
    obs.on_start("L", "E", "T")
    obs.on_rollout({"learner": 1.0})
    obs.on_rollout_mode("online", 0.5, 0.0)
    obs.on_policy_live_value("learner", 0.5)
    return {s.name for family in registry.collect() for s in family.samples}


def test_rules_only_use_metrics_that_exist() -> None:
    import re

    rules = (REPO / "deploy" / "prometheus" / "streamlearn-rules.yml").read_text()
    exported = _exported_names()
    used = set(re.findall(r"\b(streamlearn_[a-z_]+)", rules))
    assert used, "no metric names found in the rules"
    assert used <= exported, sorted(used - exported)


def test_rules_pass_promtool() -> None:
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (deploy/prometheus/install.sh)")
    folder = REPO / "deploy" / "prometheus"
    for args in (["check", "rules", "streamlearn-rules.yml"],
                 ["test", "rules", "streamlearn-rules-test.yml"]):
        done = subprocess.run([promtool, *args], cwd=folder, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_docs_describe_every_metric() -> None:
    text = (REPO / "docs" / "metrics.md").read_text()
    families = set()
    for name in _exported_names():
        for suffix in ("_bucket", "_count", "_sum", "_created", "_total"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        families.add(name)
    missing = sorted(f for f in families if f not in text)
    assert not missing, missing


def test_docs_list_every_dead_letter_reason() -> None:
    """The reasons of ``streamlearn_invalid_events_total`` in docs/metrics.md are the
    decoders' (an outside test found ``bad_baseline`` exported but not listed)."""
    import re

    from streamlearn.events import REASONS

    text = (REPO / "docs" / "metrics.md").read_text()
    row = next(line for line in text.splitlines()
               if line.startswith("| `streamlearn_invalid_events_total`"))
    listed = re.search(r"`reason` is one of `([^`]*)`", row)
    assert listed is not None, row
    assert listed.group(1).split() == list(REASONS)


def test_grafana_dashboard_queries_use_existing_metrics_and_parse(tmp_path: Any) -> None:
    import json
    import re
    import shutil
    import subprocess

    dashboard = json.loads((REPO / "deploy" / "grafana" / "streamlearn-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    exported = _exported_names()
    for expr in exprs:
        used = set(re.findall(r"\b(streamlearn_[a-z_]+)", expr))
        assert used and used <= exported, (expr, sorted(used - exported))
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed; names checked, syntax not")
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": e.replace("$job", ".*").replace("$instance", ".*")}
        for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(json.dumps(rules))  # JSON is valid YAML
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
