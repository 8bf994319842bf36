"""The observer interface the daemon calls, and the Prometheus implementation of it.

The core never imports prometheus_client: it calls an :class:`Observer`, whose
methods are all no-ops. :class:`PrometheusObserver` owns every metric of
docs/metrics.md, registered on an injected ``CollectorRegistry`` (tests use a fresh
one; ``serve`` uses its own, never the process-global default).

Conventions: seconds for durations, ``_total`` counters, low-cardinality labels.
Values that arrive as arrays (decision latencies, feedback delays) are binned
with one ``np.searchsorted`` + ``np.bincount`` per batch, not a Python loop.
Per-action detail goes through a bounded collector read at scrape time: actions
``>= max_actions`` are folded into ``action="other"``.

Every observer method may be called from the daemon thread while the HTTP
thread scrapes; the custom collectors hold a lock for that.

>>> from prometheus_client import CollectorRegistry
>>> registry = CollectorRegistry()
>>> obs = PrometheusObserver(registry)
>>> obs.on_instances(3)
>>> obs.on_decisions(3, n_explored=1, latencies_s=np.array([0.001, 0.002, 0.002]))
>>> registry.get_sample_value("streamlearn_decisions_total", {"explored": "true"})
1.0
>>> registry.get_sample_value("streamlearn_decision_latency_seconds_count")
3.0
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streamlearn import __version__
from streamlearn.join.aggregate import TYPE_LABELS
from streamlearn.service.collectors import ActionCollector, ArrayHistogram, CheckpointAge

if TYPE_CHECKING:
    from streamlearn.engine import Learned
    from streamlearn.evaluation.online import OnlineErrorTracker

__all__ = [
    "CHANGELOG_FAILURES",
    "CHECKPOINT_LOCAL_ONLY",
    "FEEDBACK_OUTCOMES",
    "JOURNAL_RETRY",
    "RANKER_METRICS",
    "ActionCollector",
    "ArrayHistogram",
    "Observer",
    "PrometheusObserver",
]

FEEDBACK_OUTCOMES = ("joined", "late", "expired", "unknown", "duplicate")
RANKER_METRICS = ("auc", "ndcg", "map", "precision")
PROMOTION_OUTCOMES = ("promoted", "rejected", "rolled_back")
# the changelog writes that can fail: a batch's journal record (the loop waits and retries
# it) and a checkpoint (kept on the local disk only)
JOURNAL_RETRY, CHECKPOINT_LOCAL_ONLY = "journal_retry", "checkpoint_local_only"
CHANGELOG_FAILURES = (JOURNAL_RETRY, CHECKPOINT_LOCAL_ONLY)
#: why a promoted ranker stopped serving: credibly worse than the policy it would replace
#: (guardrail), than the learner's holdback (holdback), no better after ten stages' worth of
#: events (stalled), replaced by a newer promotion (replaced), asked for (manual), or whose
#: artifact no longer loads at a restart (unloadable)
ROLLBACK_REASONS = ("guardrail", "holdback", "stalled", "replaced", "manual", "unloadable",
                    "failing")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
DELAY_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Observer:
    """What the daemon reports; every method is a no-op here (subclass what you need).

    Counts are per call (increments), gauges are the current value. ``*_s``
    arguments are seconds; arrays may be numpy arrays or a single float.
    """

    # -- one call per phase of the loop; by default each fans out to the detailed calls below
    def on_decided(self, n: int, n_explored: int, latencies_s: np.ndarray | float, reemitted: int,
                   actions: np.ndarray, gamma: float) -> None:
        """One decided batch: ``n`` decisions published (``reemitted`` of them re-emitted from
        the journal, not in ``latencies_s``), their actions and mean exploration rate."""
        self.on_decisions(n, n_explored, latencies_s)
        if reemitted:
            self.on_reemitted(reemitted)
        self.on_action_decisions(actions)
        self.on_gamma(gamma)

    def on_learned(self, learned: Learned, tracker: OnlineErrorTracker | None,
                   model_version: int) -> None:
        """One learn phase: what closed (joined, expired, shed) and what the learner applied;
        the error rates of ``tracker`` (None: reported elsewhere, as a replica reports its
        partitions' together)."""
        closed, joined = learned.closed, learned.joined
        self.on_feedback("joined", int(joined.sum()), closed.delays[joined])
        self.on_feedback("expired", int(learned.expired.sum()))
        if learned.shed:
            self.on_shed(learned.shed)
        rows = learned.applied
        if not len(rows):
            return
        if learned.skipped:
            self.on_skipped_updates(learned.skipped)
        actions, rewards, labels = closed.actions[rows], closed.rewards[rows], closed.labels[rows]
        self.on_action_rewards(actions, rewards)
        self.on_rewards(float(rewards.sum()))
        self.on_mistakes(float((1.0 - rewards).sum()))
        labelled = labels >= 0
        if labelled.any():
            self.on_regret(float(((actions != labels) & labelled).sum()))
        if tracker is not None:
            self.on_error_rates(tracker.error_rate, tracker.window_error_rate,
                                tracker.exploit_error_estimate)
        self.on_model_version(model_version)

    # -- detailed calls
    def on_start(self, learner: str, exploration: str, transport: str) -> None:
        """The daemon starts serving with this learner class, strategy and transport."""

    def on_batch(self, size: int, topic: str = "instances") -> None:
        """One poll returned ``size`` messages of ``topic`` ("instances" or "feedback")."""

    def on_instances(self, n: int) -> None:
        """``n`` valid instance events were accepted (before deciding)."""

    def on_decisions(self, n: int, n_explored: int, latencies_s: np.ndarray | float) -> None:
        """``n`` decisions published, ``n_explored`` of them not the exploit action."""

    def on_action_decisions(self, actions: np.ndarray) -> None:
        """The chosen actions of a batch (per-action detail, bounded)."""

    def on_feedback(self, outcome: str, n: int, delays_s: np.ndarray | float | None = None) -> None:
        """``n`` feedback events with ``outcome`` in :data:`FEEDBACK_OUTCOMES`.

        ``delays_s`` (joined only) is the time from decision to feedback.
        """

    def on_feedback_types(self, counts: Mapping[str, int]) -> None:
        """Accepted feedback events by ``type`` label: a configured type (``join.reward_weights``),
        ``other`` (a type not configured) or ``none`` (no type) — a bounded label set."""

    def on_action_rewards(self, actions: np.ndarray, rewards: np.ndarray) -> None:
        """Joined rewards per chosen action (per-action detail, bounded)."""

    def on_invalid(self, topic: str, reason: str, n: int = 1) -> None:
        """``n`` events of ``topic`` rejected with the short stable code ``reason``."""

    def on_rewards(self, total: float) -> None:
        """Sum of the rewards applied to the learner in one batch."""

    def on_mistakes(self, n: float) -> None:
        """Mistakes (1 − reward of the played action) in one batch."""

    def on_regret(self, x: float) -> None:
        """Regret against the labels (simulators only) accrued in one batch."""

    def on_error_rates(self, cumulative: float, window: float, exploit_estimate: float) -> None:
        """Current played-action error rates and the unbiased exploit-error estimate."""

    def on_gamma(self, gamma: float) -> None:
        """Current exploration rate γ (mean over the last batch)."""

    def on_pending(self, n: int) -> None:
        """Decisions currently waiting for feedback (plus early feedback held)."""

    def on_shed(self, n: int) -> None:
        """``n`` pending joins were shed because the pending store was full."""

    def on_skipped_updates(self, n: int) -> None:
        """``n`` feedback events were not learned: they would have made the model non-finite."""

    def on_reemitted(self, n: int) -> None:
        """``n`` journaled decisions were published again for input re-read after a restart."""

    def on_drift(self, n: int) -> None:
        """The exploration's change detector fired ``n`` times (exploration was raised)."""

    def on_lag(self, lag: int) -> None:
        """Total consumer lag (messages) over the assigned partitions."""

    def on_owned_partitions(self, n: int, moves: int) -> None:
        """Group membership: partitions this replica serves now, partitions started here."""

    def on_model_sync(self, version: int, age_s: float, merges: int) -> None:
        """Model sync: the global version adopted, its age, merges this replica made."""

    def on_checkpoint(self, duration_s: float, written_at: float | None = None) -> None:
        """A checkpoint was written in ``duration_s``; ``written_at`` is its Unix time."""

    def on_model_version(self, version: int) -> None:
        """The serving model's version number changed."""

    def on_restore(self, source: str, duration_s: float) -> None:
        """A partition's state was restored (``source``: local, changelog or none) in
        ``duration_s``."""

    def on_changelog_failure(self, kind: str, n: int = 1) -> None:
        """The changelog refused a write: ``journal_retry`` (the loop waits and retries a
        batch's journal record) or ``checkpoint_local_only`` (a checkpoint kept on disk only)."""

    def on_retrain(self, duration_s: float) -> None:
        """A background retrain finished."""

    def on_policy_value(self, policy: str, estimator: str, value: float, low: float,
                        high: float) -> None:
        """Off-policy estimate (and confidence bounds) of ``policy``'s value on held-out logs."""

    def on_retrain_failure(self) -> None:
        """A retrain failed or its worker died (the worker is replaced)."""

    def on_promotion(self, outcome: str) -> None:
        """A retrained ranker was ``promoted`` or ``rejected``, or one was ``rolled_back``."""

    def on_ranker_version(self, version: int) -> None:
        """The version of the ranker decisions are ranked by (0: none)."""

    def on_ranker_metric(self, name: str, value: float) -> None:
        """Quality of the current ranker; ``name`` in :data:`RANKER_METRICS`."""

    def on_retrain_overrun(self) -> None:
        """A retrain was due while the previous one was still running."""

    def on_rollback(self, reason: str) -> None:
        """A promoted ranker was rolled back; ``reason`` in :data:`ROLLBACK_REASONS`."""

    def on_rollout(self, shares: dict[str, float]) -> None:
        """Who serves which share of the events (``learner``, ``live``, ``candidate``,
        ``baseline``)."""

    def on_policy_live_value(self, policy: str, value: float) -> None:
        """What ``policy`` earned on the events it served (mean reward), on-policy."""

    def on_ope_check(self, inside: bool) -> None:
        """A promoted policy's realised value fell inside (or outside) its off-policy interval."""

    def on_rollout_mode(self, mode: str, agreement: float, slack: float) -> None:
        """The rollout mode, how often the learner agrees with the baseline, the conservative
        slack (NaN outside conservative mode)."""

    def on_rollout_switch(self, mode: str) -> None:
        """The rollout mode changed to ``mode`` (automatically or asked for)."""


class PrometheusObserver(Observer):
    """Owns every streamlearn metric, registered on ``registry``.

    Parameters
    ----------
    registry : CollectorRegistry
        Where the metrics live (inject a fresh one per daemon / per test).
    max_actions : int
        Bound on the ``action`` label values of the per-action collector.
    max_policies : int
        Bound on the ``policy`` label values of the off-policy gauge; further
        policies are ignored (a warning metric counts them).
    clock : callable
        Wall clock (Unix seconds) for the checkpoint age; injectable for tests.
    """

    def __init__(self, registry: CollectorRegistry, max_actions: int = 64, max_policies: int = 16,
                 clock: Callable[[], float] = time.time) -> None:
        r = registry
        self.registry = registry
        self.max_policies = max_policies
        self._policies: set[str] = set()
        self.info = Gauge("streamlearn_info", "Constant 1; labels describe the running daemon.",
                          ["version", "learner", "exploration", "transport"], registry=r)
        self.instances = Counter("streamlearn_instances", "Valid instance events accepted.",
                                 registry=r)
        self.decisions = Counter("streamlearn_decisions", "Decisions published.", ["explored"],
                                 registry=r)
        self.feedback = Counter("streamlearn_feedback", "Feedback events by join outcome.",
                                ["outcome"], registry=r)
        self.feedback_events = Counter(
            "streamlearn_feedback_events", "Accepted feedback events by type: a configured one "
            "(join.reward_weights), other (not configured) or none (no type).", ["type"],
            registry=r)
        self.invalid = Counter("streamlearn_invalid_events",
                               "Events rejected (and sent to the dead-letter topic).",
                               ["topic", "reason"], registry=r)
        self.rewards = Counter("streamlearn_rewards", "Sum of rewards applied to the learner.",
                               registry=r)
        self.mistakes = Counter("streamlearn_mistakes",
                                "Sum of (1 - reward) of the played actions.", registry=r)
        self.regret = Counter("streamlearn_regret",
                              "Regret against the labels (only when labels are known).", registry=r)
        self.skipped_updates = Counter(
            "streamlearn_learner_updates_skipped",
            "Feedback events not learned because they would have made the model non-finite.",
            registry=r)
        self.drift = Counter(
            "streamlearn_drift_detected",
            "Changes detected by the adaptive exploration (each raises exploration again).",
            registry=r)
        self.reemitted = Counter(
            "streamlearn_decisions_reemitted",
            "Journaled decisions published again after a restart (not in the latency histogram).",
            registry=r)
        self.shed = Counter("streamlearn_pending_shed", "Pending joins shed (store full).",
                            registry=r)
        self.error_rate = Gauge("streamlearn_error_rate",
                                "Cumulative played-action error rate (mistakes / rounds).",
                                registry=r)
        self.window_error_rate = Gauge("streamlearn_window_error_rate",
                                       "Played-action error rate over the sliding window.",
                                       registry=r)
        self.exploit_error = Gauge("streamlearn_exploit_error_estimate",
                                   "Unbiased estimate of the exploit action's error rate.",
                                   registry=r)
        self.gamma = Gauge("streamlearn_exploration_gamma", "Current exploration rate gamma.",
                           registry=r)
        self.pending = Gauge("streamlearn_pending_joins",
                             "Decisions waiting for feedback plus early feedback held.",
                             registry=r)
        self.lag = Gauge("streamlearn_consumer_lag", "Consumer lag (messages) over assigned "
                         "partitions.", registry=r)
        self.owned = Gauge("streamlearn_owned_partitions", "Input partitions this replica serves "
                           "(group membership).", registry=r)
        self.global_version = Gauge("streamlearn_global_model_version", "Version of the "
                                    "group's merged model this replica serves.", registry=r)
        self.global_age = Gauge("streamlearn_global_model_age_seconds", "Seconds since the "
                                "merged model this replica serves was made.", registry=r)
        self.merges = Gauge("streamlearn_model_merges", "Merged models this replica published "
                            "(as the merger) since it started.", registry=r)
        self.partition_starts = Gauge("streamlearn_partition_starts", "Partitions started on this "
                                      "replica since it started (moves in).", registry=r)
        self.model_version = Gauge("streamlearn_model_version", "Serving model version.",
                                   registry=r)
        self.ranker = Gauge("streamlearn_ranker_quality", "Current ranker quality metric.",
                            ["metric"], registry=r)
        value_labels = ["policy", "estimator"]
        self.policy_value = Gauge("streamlearn_policy_value",
                                  "Off-policy estimate of a policy's value on held-out logs.",
                                  value_labels, registry=r)
        self.policy_value_lower = Gauge("streamlearn_policy_value_lower",
                                        "Lower 95% confidence bound of streamlearn_policy_value.",
                                        value_labels, registry=r)
        self.policy_value_upper = Gauge("streamlearn_policy_value_upper",
                                        "Upper 95% confidence bound of streamlearn_policy_value.",
                                        value_labels, registry=r)
        self.retrain_failures = Counter("streamlearn_retrain_failures_total",
                                        "Retrains that failed or whose worker died.", registry=r)
        self.promotions = Counter("streamlearn_ranker_promotions_total",
                                  "Retrained rankers promoted / rejected, and rollbacks.",
                                  ["outcome"], registry=r)
        for outcome in PROMOTION_OUTCOMES:
            self.promotions.labels(outcome=outcome)
        self.retrain_overruns = Counter(
            "streamlearn_retrain_overruns_total",
            "Retrains that were due while the previous one was still running.", registry=r)
        self.rollbacks = Counter("streamlearn_rollbacks_total",
                                 "Promoted rankers rolled back, by reason.", ["reason"], registry=r)
        for reason in ROLLBACK_REASONS:
            self.rollbacks.labels(reason=reason)
        self.rollout_share = Gauge("streamlearn_rollout_share",
                                   "Share of the events each role serves (learner, live ranker, "
                                   "candidate in rollout, the caller's baseline).", ["role"],
                                   registry=r)
        self.policy_live_value = Gauge(
            "streamlearn_policy_live_value",
            "Mean reward a policy earned on the events it served since it went live (on-policy).",
            ["policy"], registry=r)
        self.ope_checks = Counter(
            "streamlearn_ope_checks", "Promoted policies whose realised value was compared with "
            "their promotion-time off-policy interval, by result.", ["result"], registry=r)
        self.ope_miscalibrated = Counter(
            "streamlearn_ope_miscalibrated",
            "Promoted policies whose realised value fell outside their off-policy interval.",
            registry=r)
        for result in ("inside", "outside"):
            self.ope_checks.labels(result=result)
        self.rollout_mode = Gauge("streamlearn_rollout_mode", "1 for the current rollout mode "
                                  "(apprentice, conservative, online), 0 for the others.",
                                  ["mode"], registry=r)
        self.rollout_switches = Counter("streamlearn_rollout_switches",
                                        "Changes of the rollout mode, by the mode switched to.",
                                        ["mode"], registry=r)
        for mode in ("apprentice", "conservative", "online"):
            self.rollout_switches.labels(mode=mode)
        self.baseline_agreement = Gauge(
            "streamlearn_baseline_agreement", "How often the learner's own choice is the "
            "baseline (exponential average over about 1,000 decisions with a baseline).",
            registry=r)
        self.conservative_slack = Gauge(
            "streamlearn_conservative_slack", "Conservative mode: the live reward so far minus "
            "(1 - alpha) x the events so far x the baseline's upper bound (NaN otherwise).",
            registry=r)
        self.ranker_version = Gauge("streamlearn_ranker_version",
                                    "Version of the ranker decisions are ranked by (0: none).",
                                    registry=r)
        self.checkpoint_duration = Histogram(
            "streamlearn_checkpoint_duration_seconds", "Time to write a checkpoint.",
            buckets=DURATION_BUCKETS, registry=r)
        self.restore_duration = Histogram(
            "streamlearn_restore_duration_seconds", "Time to restore a partition's state, by "
            "where it came from (local, changelog, none).", ["source"],
            buckets=DURATION_BUCKETS, registry=r)
        self.changelog_failures = Counter(
            "streamlearn_changelog_failures", "Changelog writes that failed: journal_retry (the "
            "serving loop waits and retries), checkpoint_local_only (kept on disk only).",
            ["kind"], registry=r)
        self.retrain_duration = Histogram(
            "streamlearn_retrain_duration_seconds", "Time of a background retrain.",
            buckets=DURATION_BUCKETS, registry=r)
        self.batch_size = Histogram("streamlearn_batch_size", "Messages per poll.", ["topic"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.decision_latency = ArrayHistogram(
            "streamlearn_decision_latency_seconds",
            "Time from the instance message's timestamp (when it was produced) to publishing its "
            "decision; re-emitted decisions are not included.", LATENCY_BUCKETS)
        self.feedback_delay = ArrayHistogram(
            "streamlearn_feedback_delay_seconds",
            "Time from a decision to its joined feedback.", DELAY_BUCKETS)
        self.actions = ActionCollector(max_actions)
        self._clock = clock
        self.checkpoint_age = CheckpointAge(clock)
        for collector in (self.decision_latency, self.feedback_delay, self.actions,
                          self.checkpoint_age):
            r.register(collector)
        for explored in ("true", "false"):
            self.decisions.labels(explored=explored)
        for outcome in FEEDBACK_OUTCOMES:  # every outcome visible at 0 from the start
            self.feedback.labels(outcome=outcome)
        for kind in CHANGELOG_FAILURES:
            self.changelog_failures.labels(kind=kind)
        for label in TYPE_LABELS:  # the configured types appear as the daemon starts
            self.feedback_events.labels(type=label)

    def on_start(self, learner: str, exploration: str, transport: str) -> None:
        self.info.labels(version=__version__, learner=learner, exploration=exploration,
                         transport=transport).set(1)

    def on_batch(self, size: int, topic: str = "instances") -> None:
        self.batch_size.labels(topic=topic).observe(size)

    def on_instances(self, n: int) -> None:
        self.instances.inc(n)

    def on_decisions(self, n: int, n_explored: int, latencies_s: np.ndarray | float) -> None:
        self.decisions.labels(explored="true").inc(n_explored)
        self.decisions.labels(explored="false").inc(n - n_explored)
        self.decision_latency.observe(latencies_s)

    def on_action_decisions(self, actions: np.ndarray) -> None:
        self.actions.add_decisions(actions)

    def on_skipped_updates(self, n: int) -> None:
        self.skipped_updates.inc(n)

    def on_reemitted(self, n: int) -> None:
        self.reemitted.inc(n)

    def on_drift(self, n: int) -> None:
        self.drift.inc(n)

    def on_feedback(self, outcome: str, n: int, delays_s: np.ndarray | float | None = None) -> None:
        if outcome not in FEEDBACK_OUTCOMES:
            raise ValueError(f"outcome must be one of {FEEDBACK_OUTCOMES}. Got {outcome!r}.")
        self.feedback.labels(outcome=outcome).inc(n)
        if delays_s is not None:
            self.feedback_delay.observe(delays_s)

    def on_feedback_types(self, counts: Mapping[str, int]) -> None:
        for label, n in counts.items():
            self.feedback_events.labels(type=label).inc(n)

    def on_action_rewards(self, actions: np.ndarray, rewards: np.ndarray) -> None:
        self.actions.add_rewards(actions, rewards)

    def on_invalid(self, topic: str, reason: str, n: int = 1) -> None:
        self.invalid.labels(topic=topic, reason=reason).inc(n)

    def on_rewards(self, total: float) -> None:
        self.rewards.inc(total)

    def on_mistakes(self, n: float) -> None:
        self.mistakes.inc(n)

    def on_regret(self, x: float) -> None:
        self.regret.inc(x)

    def on_error_rates(self, cumulative: float, window: float, exploit_estimate: float) -> None:
        self.error_rate.set(cumulative)
        self.window_error_rate.set(window)
        self.exploit_error.set(exploit_estimate)

    def on_gamma(self, gamma: float) -> None:
        self.gamma.set(gamma)

    def on_pending(self, n: int) -> None:
        self.pending.set(n)

    def on_shed(self, n: int) -> None:
        self.shed.inc(n)

    def on_lag(self, lag: int) -> None:
        self.lag.set(lag)

    def on_owned_partitions(self, n: int, moves: int) -> None:
        self.owned.set(n)
        self.partition_starts.set(moves)

    def on_model_sync(self, version: int, age_s: float, merges: int) -> None:
        self.global_version.set(version)
        self.global_age.set(age_s)
        self.merges.set(merges)

    def on_checkpoint(self, duration_s: float, written_at: float | None = None) -> None:
        self.checkpoint_duration.observe(duration_s)
        self.checkpoint_age.last = float(self._clock() if written_at is None else written_at)

    def on_model_version(self, version: int) -> None:
        self.model_version.set(version)

    def on_restore(self, source: str, duration_s: float) -> None:
        self.restore_duration.labels(source=source).observe(duration_s)

    def on_changelog_failure(self, kind: str, n: int = 1) -> None:
        self.changelog_failures.labels(kind=kind).inc(n)

    def on_retrain(self, duration_s: float) -> None:
        self.retrain_duration.observe(duration_s)

    def on_policy_value(self, policy: str, estimator: str, value: float, low: float,
                        high: float) -> None:
        # bound the label set: only the first max_policies distinct policies are exported
        if policy not in self._policies:
            if len(self._policies) >= self.max_policies:
                return
            self._policies.add(policy)
        for gauge, v in ((self.policy_value, value), (self.policy_value_lower, low),
                         (self.policy_value_upper, high)):
            gauge.labels(policy=policy, estimator=estimator).set(v)

    def on_retrain_failure(self) -> None:
        self.retrain_failures.inc()

    def on_promotion(self, outcome: str) -> None:
        if outcome not in PROMOTION_OUTCOMES:
            raise ValueError(f"outcome must be one of {PROMOTION_OUTCOMES}. Got {outcome!r}.")
        self.promotions.labels(outcome=outcome).inc()

    def on_ranker_version(self, version: int) -> None:
        self.ranker_version.set(version)

    def on_ranker_metric(self, name: str, value: float) -> None:
        if name not in RANKER_METRICS:
            raise ValueError(f"ranker metric must be one of {RANKER_METRICS}. Got {name!r}.")
        self.ranker.labels(metric=name).set(value)

    def on_retrain_overrun(self) -> None:
        self.retrain_overruns.inc()

    def on_rollback(self, reason: str) -> None:
        if reason not in ROLLBACK_REASONS:
            raise ValueError(f"reason must be one of {ROLLBACK_REASONS}. Got {reason!r}.")
        self.rollbacks.labels(reason=reason).inc()

    def on_rollout(self, shares: dict[str, float]) -> None:
        for role in ("learner", "live", "candidate", "baseline"):
            self.rollout_share.labels(role=role).set(shares.get(role, 0.0))

    def on_policy_live_value(self, policy: str, value: float) -> None:
        if policy not in self._policies:  # the same bound on policy labels as the estimates
            if len(self._policies) >= self.max_policies:
                return
            self._policies.add(policy)
        self.policy_live_value.labels(policy=policy).set(value)

    def on_ope_check(self, inside: bool) -> None:
        self.ope_checks.labels(result="inside" if inside else "outside").inc()
        if not inside:
            self.ope_miscalibrated.inc()

    def on_rollout_mode(self, mode: str, agreement: float, slack: float) -> None:
        for name in ("apprentice", "conservative", "online"):
            self.rollout_mode.labels(mode=name).set(1.0 if name == mode else 0.0)
        self.baseline_agreement.set(agreement)
        self.conservative_slack.set(slack)

    def on_rollout_switch(self, mode: str) -> None:
        self.rollout_switches.labels(mode=mode).inc()
