"""The serving loop's settings, the dead-letter format, and the BLAS thread limit.

Field names follow :class:`streamlearn.config.Config` flattened as
``<section>_<field>``, so ``Config.to_daemon_settings()`` maps them by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from streamlearn.config_fields import parse_weights
from streamlearn.errors import ConfigError
from streamlearn.events import DecodeLimits
from streamlearn.join.pending import JoinSettings
from streamlearn.service.adoption import AdoptionSettings, parse_baseline
from streamlearn.service.rollout import RolloutSettings

__all__ = ["DAEMON_GC_THRESHOLDS", "DaemonSettings", "blas_threads"]

#: CPython's cyclic collector thresholds for a ``streamlearn serve`` process (the default is 700, 10, 10).
#: The loop allocates about ten short-lived containers per event (parsed JSON, rows, decision
#: records, the Kafka client's futures) that form no cycles: at 700 the young generation was
#: scanned every ~70 events, and the older ones — holding every unacknowledged send's future —
#: every few thousand: 9 % of the daemon's time under a backlog (docs/performance.md). Cycles
#: are still collected, after 10,000 allocations instead of 700.
DAEMON_GC_THRESHOLDS = (10_000, 10, 10)


@dataclass(frozen=True)
class DaemonSettings:
    """What the loop needs (field names follow ``Config``: ``<section>_<field>``)."""

    learner_n_actions: int = 9
    learner_n_features: int = 400
    join_window_seconds: float = 600.0
    join_backward_window_seconds: float = 10.0
    join_expiry_policy: str = "default_reward"
    join_default_reward: float = 0.0
    join_duplicate_policy: str = "earliest"
    join_reward_weights: str | None = None  # "type=weight,..." (config_fields.parse_weights)
    join_max_pending: int = 200_000
    join_max_early: int = 100_000
    join_max_clock_skew_seconds: float = 60.0
    checkpoint_dir: str | None = None
    checkpoint_every_events: int = 10_000
    checkpoint_every_seconds: float = 60.0
    checkpoint_keep: int = 2
    checkpoint_fsync_journal: bool = False
    limits_max_message_bytes: int = 1 << 20
    limits_max_id_length: int = 256
    limits_poll_max_records: int = 500
    limits_poll_timeout_seconds: float = 0.1
    limits_poll_order_wait_seconds: float = 0.5
    limits_max_abs_feature: float = 1e12
    limits_max_row_squared_norm: float = 1e26
    limits_dead_letter_max_bytes: int = 65_536
    metrics_window: int = 1000
    model_name: str = ""
    flush_timeout_seconds: float = 10.0
    retry_seconds: float = 1.0
    blas_threads: int = 1  # BLAS threads while serving; 0 leaves the library default
    experience_dir: str | None = None
    experience_segment_rows: int = 50_000
    experience_segment_seconds: float = 60.0
    experience_retention_bytes: int = 2 << 30
    experience_retention_seconds: float = 7 * 86_400.0
    retrain_rankers: str | None = None
    retrain_every_events: int | None = None
    retrain_every_seconds: float | None = None
    retrain_window_rows: int = 20_000
    retrain_holdout_fraction: float = 0.2
    retrain_clip: float = 20.0
    retrain_worker: str = "process"
    retrain_worker_nice: int = 5
    retrain_timeout_seconds: float = 600.0
    retrain_policy: str = "learner"
    retrain_level: float = 0.95
    retrain_rollout_stages: str = "0.02,0.1,0.3,0.6"
    retrain_rollout_stage_events: int = 500
    retrain_holdback: float = 0.05
    rollout_mode: str = "online"
    rollout_baseline: str | None = None
    rollout_explore_budget: float = 0.0
    rollout_alpha: float = 0.05
    rollout_auto: bool = False
    candidates_enabled: bool = False
    candidates_learner: str = "linucb"
    candidates_shared_features: int = 0
    candidates_candidate_features: int = 45
    candidates_max_candidates: int = 1000
    candidates_max_slots: int = 10

    @property
    def retrain_enabled(self) -> bool:
        return (bool(self.retrain_rankers) or self.retrain_every_events is not None
                or self.retrain_every_seconds is not None)

    def retrain_ranker_names(self) -> tuple[str, ...]:
        """The configured rankers; by default RankBoost and logistic regression, or Rocchio
        instead of the latter when the joint features are too wide for its Newton steps
        (d·K > 1,000: a (d·K)² Hessian per step); in candidate mode RankBoost, AdaRank
        and NDCG_Boost."""
        names = tuple(n.strip() for n in (self.retrain_rankers or "").split(",") if n.strip())
        if names:
            return names
        if self.candidates_enabled:  # requests are queries: the listwise rankers apply
            return ("rankboost", "adarank", "ndcg_boost")
        wide = self.joint_width() > 1000
        return ("rankboost", "rocchio") if wide else ("rankboost", "logistic")

    def retrain_window(self) -> int:
        """Rows per retrain: ``retrain_window_rows``, capped so that the joint feature
        matrix (rows × d·K) stays below 20 M elements (160 MB in the worker)."""
        return max(10, min(self.retrain_window_rows, 8_000_000 // self.joint_width()))

    def joint_width(self) -> int:
        """Features of one ranker row: the joint (context, action) features d·K, or in
        candidate mode the context and the candidate's and the exploit candidate's features
        (d_x + 2·d_c)."""
        if self.candidates_enabled:
            return max(1, self.candidates_shared_features + 2 * self.candidates_candidate_features)
        return max(1, self.learner_n_features * self.learner_n_actions)

    def rollout_settings(self) -> RolloutSettings:
        """How a promoted ranker takes traffic (``retrain.rollout_*``, ``retrain.holdback``)."""
        try:
            stages = tuple(float(v) for v in self.retrain_rollout_stages.split(",") if v.strip())
            return RolloutSettings(stages, self.retrain_rollout_stage_events,
                                   self.retrain_holdback, alpha=1.0 - self.retrain_level)
        except ValueError as exc:
            raise ConfigError(f"retrain.rollout_stages must be increasing shares in (0, 1), "
                              f"e.g. '0.02,0.1,0.3,0.6'. Got {self.retrain_rollout_stages!r} "
                              f"({exc}).") from None

    def adoption_settings(self) -> AdoptionSettings:
        """Who serves next to an existing system (``rollout.*``)."""
        if self.candidates_enabled and self.rollout_mode != "online":
            raise ConfigError(f"rollout.mode must be 'online' in candidate mode (a baseline "
                              f"candidate is validated and recorded, not served). Got "
                              f"{self.rollout_mode!r}.")
        if self.candidates_enabled and self.rollout_baseline:
            raise ConfigError(f"rollout.baseline must be unset in candidate mode (a request "
                              f"names its own baseline candidate; a constant action means "
                              f"nothing there). Got {self.rollout_baseline!r}.")
        return AdoptionSettings(self.rollout_mode,
                                parse_baseline(self.rollout_baseline, self.learner_n_actions),
                                self.rollout_explore_budget, self.rollout_alpha, self.rollout_auto,
                                1.0 - self.retrain_level)

    def join_settings(self) -> JoinSettings:
        try:
            weights = parse_weights(self.join_reward_weights)
        except ValueError as exc:
            raise ConfigError(f"join.reward_weights must be 'type=weight,...' with weights >= 0, "
                              f"e.g. 'click=1,conversion=10'. Got {self.join_reward_weights!r} "
                              f"({exc}).") from None
        return JoinSettings(self.join_window_seconds, self.join_backward_window_seconds,
                            self.join_duplicate_policy, self.join_expiry_policy,
                            self.join_default_reward, self.join_max_pending, self.join_max_early,
                            self.join_max_clock_skew_seconds, weights)

    def limits(self) -> DecodeLimits:
        return DecodeLimits(self.limits_max_message_bytes, self.limits_max_id_length,
                            max_abs_feature=self.limits_max_abs_feature,
                            max_row_squared_norm=self.limits_max_row_squared_norm)


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Limit BLAS threads while serving (``n <= 0``: leave them).

    Micro-batch products are small; on a busy machine multi-threaded BLAS
    spins more than it computes (2.4x slower loop measured under load, docs/performance.md).
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # optional: without it the library default stays
        n = 0
    if n <= 0:
        yield
        return
    with threadpool_limits(limits=n, user_api="blas"):
        yield
