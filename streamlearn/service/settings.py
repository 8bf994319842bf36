"""The serving loop's settings, the dead-letter format, and the BLAS thread limit.

The settings are grouped in the sections of the configuration (``[learner]``, ``[join]``,
``[checkpoint]``, ``[metrics]``, ``[limits]``, ``[experience]``, ``[retrain]``,
``[rollout]``, ``[candidates]``): the classes here are the ones
:class:`streamlearn.config.Config` reads from the file, the environment and the flags,
and :class:`DaemonSettings` holds them as they are, so a setting has one name from the
command line to the component that uses it (``settings.join.window_seconds`` is
``--join-window-seconds``). Each field's ``spec`` carries its help and its bounds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamlearn.config_fields import decimal_float, parse_weights, spec
from streamlearn.errors import ConfigError
from streamlearn.events import DecodeLimits
from streamlearn.join.aggregate import POLICIES, weights_problem
from streamlearn.join.pending import JoinSettings
from streamlearn.service.adoption import AdoptionSettings, parse_baseline
from streamlearn.service.rollout import RolloutSettings

log = logging.getLogger("streamlearn.retrain")

__all__ = ["DAEMON_GC_THRESHOLDS", "CandidatesConfig", "CheckpointConfig", "DaemonSettings",
           "ExperienceConfig", "JoinConfig", "LearnerConfig", "LimitsConfig", "MetricsConfig",
           "RetrainConfig", "RolloutConfig", "blas_threads", "without_hugepage_advice"]

#: CPython's cyclic collector thresholds for a ``streamlearn serve`` process (the default is 700, 10, 10).
#: The loop allocates about ten short-lived containers per event (parsed JSON, rows, decision
#: records, the Kafka client's futures) that form no cycles: at 700 the young generation was
#: scanned every ~70 events, and the older ones — holding every unacknowledged send's future —
#: every few thousand: 9 % of the daemon's time under a backlog (docs/performance.md). Cycles
#: are still collected, after 10,000 allocations instead of 700.
DAEMON_GC_THRESHOLDS = (10_000, 10, 10)


def without_hugepage_advice() -> bool:
    """Stop NumPy advising the kernel to back each new array of 4 MB or more with transparent
    huge pages (``madvise(MADV_HUGEPAGE)``), unless ``NUMPY_MADVISE_HUGEPAGE`` is set (then it
    decides); whether the advice was turned off.

    Where the kernel's THP ``defrag`` setting is ``madvise`` (a common default), a first
    touch of advised memory may compact memory to find a free 2 MB page: on the development
    machine a fresh 32 MB array took 294 ms to fill with the advice and 22 ms without, and
    the loop meets such first touches whenever its join store or a buffer reaches new
    memory (micro-batches of 16 messages: 13 % faster without, docs/performance.md). The
    daemon's arrays are a few MB, read in small slices: huge pages buy it little.
    """
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return False
    try:  # the setter behind NUMPY_MADVISE_HUGEPAGE (read only when numpy is imported)
        setter = importlib.import_module("numpy._core.multiarray")._set_madvise_hugepage
    except (ImportError, AttributeError):
        return False  # another NumPy: its default stays
    setter(False)
    return True


def parse_stages(text: str) -> tuple[float, ...]:
    """``retrain.rollout_stages`` as shares: increasing, each in (0, 1); ValueError else."""
    stages = tuple(decimal_float(v) for v in text.split(","))
    if not stages or any(not 0 < v < 1 for v in stages) or list(stages) != sorted(set(stages)):
        raise ValueError("not increasing shares in (0, 1)")
    return stages


def stages_problem(text: str) -> str:
    """Why ``text`` is no ``retrain.rollout_stages`` ('' when it is one)."""
    try:
        parse_stages(text)
    except ValueError:
        return "expected increasing shares in (0, 1), comma-separated, e.g. '0.02,0.1,0.3,0.6'"
    return ""


def names_problem(text: str) -> str:
    """Why ``text`` is no comma-separated list of names ('' when it is one)."""
    if any(not part.strip() for part in text.split(",")):
        return "a name is empty (two commas, or one at either end)"
    return ""


@dataclass(frozen=True)
class LearnerConfig:
    """The online learner and its hyperparameters (unset ones: the learner's default)."""

    # perceptron is left out: it is a full-information comparator for replays, not a bandit
    name: str = spec("linucb", "bandit learner (docs/learners.md; linucb: the best error at "
                     "its defaults on most streams, docs/bench.md)", choices=(
        "banditron", "pnorm", "eg", "epsilon-greedy", "squarecb", "bag", "linucb", "lints",
        "newtron", "soba"))
    n_actions: int = spec(9, "number of actions K", ge=2)
    n_features: int = spec(400, "feature dimension d (hashing buckets for named features)", ge=1)
    q: float | None = spec(None, "pnorm: the dual norm q (unset: max(2, 2 ln(K d)))", gt=0)
    eta: float | None = spec(None, "pnorm / eg: learning rate (unset: the learner's default)",
                             gt=0)
    lr: float | None = spec(None, "epsilon-greedy: learning rate of its regressors (its ε is "
                            "exploration.gamma)", gt=0)
    seed: int = spec(0, "seed of the exploration randomness (with the event key)", ge=0)

    def hyperparameters(self) -> dict[str, float]:
        """The hyperparameters that were set (passed as keywords to the learner)."""
        values = {"q": self.q, "eta": self.eta, "lr": self.lr}
        return {k: v for k, v in values.items() if v is not None}


@dataclass(frozen=True)
class JoinConfig:
    """Joining delayed feedback to decisions (docs/daemon.md §3)."""

    window_seconds: float = spec(600.0, "how long a decision waits for feedback", gt=0)
    backward_window_seconds: float = spec(
        10.0, "how long feedback arriving before its decision is held", ge=0)
    expiry_policy: str = spec("default_reward", "what an expired decision becomes",
                              choices=("default_reward", "drop"))
    default_reward: float = spec(0.0, "reward given to expired decisions", ge=0, le=1)
    duplicate_policy: str = spec("earliest", "several feedback events for one id: the first "
                                 "closes the decision (earliest), or the decision closes at the "
                                 "window's end with the last / max / sum / average / min / "
                                 "median of the values in the window, capped at 1 "
                                 "(docs/daemon.md)", choices=POLICIES)
    reward_weights: str | None = spec(None, "feedback type -> weight its rewards are multiplied "
                                      "by before aggregation, e.g. click=1,conversion=10 (a "
                                      "type not listed, or none: 1)", kind="weights",
                                      check=weights_problem)
    max_pending: int = spec(200_000, "bound on pending decisions (oldest shed beyond it)", ge=1)
    max_early: int = spec(100_000, "bound on early feedback held for the backward window (each "
                          "held event counts, also a second one for the same id)", ge=0)
    max_clock_skew_seconds: float = spec(
        5.0, "event times further than this ahead of the wall clock (an instance's: or half "
        "the backward window) are not believed: they move no join clock and count at their "
        "partition's clock (one wild timestamp cannot expire pending decisions, or make a "
        "restart drop re-read feedback as unknown)", ge=0)

    def join_settings(self) -> JoinSettings:
        """The join's own settings (:class:`~streamlearn.join.pending.JoinSettings`)."""
        try:
            weights = parse_weights(self.reward_weights)
        except ValueError as exc:
            raise ConfigError(f"join.reward_weights must be 'type=weight,...' with weights >= 0, "
                              f"e.g. 'click=1,conversion=10'. Got {self.reward_weights!r} "
                              f"({exc}).") from None
        return JoinSettings(self.window_seconds, self.backward_window_seconds,
                            self.duplicate_policy, self.expiry_policy, self.default_reward,
                            self.max_pending, self.max_early, self.max_clock_skew_seconds, weights)


@dataclass(frozen=True)
class CheckpointConfig:
    """Snapshots of learner + pending joins + offsets (docs/daemon.md §4)."""

    dir: Path | None = spec(None, "checkpoint directory; unset = no checkpoints (state is lost "  # noqa: RUF009
                            "on exit)", kind="dir")
    every_events: int = spec(10_000, "checkpoint after this many input messages (instances + "
                             "feedback), or as many as the last snapshot held pending "
                             "decisions if more (a snapshot holds their rows)", ge=1)
    every_seconds: float = spec(60.0, "checkpoint at least this often", gt=0)
    keep: int = spec(2, "snapshots kept", ge=1)
    fsync_journal: bool = spec(False, "fsync the decision journal after every batch (survives "
                               "power loss, costs latency)")
    changelog: bool = spec(False, "mirror the checkpoints and the decision journal to the "
                           "compacted topic topics.changelog, fenced per partition: a replica "
                           "with an empty checkpoint.dir restores from Kafka, and the directory "
                           "is a cache (docs/operations.md)")


@dataclass(frozen=True)
class MetricsConfig:
    """The HTTP endpoint (/metrics, /healthz, /readyz) and metric windows."""

    host: str = spec("127.0.0.1", "bind address (0.0.0.0 to expose)")
    port: int = spec(9464, "port; 0 = a free port (printed on start); -1 = no HTTP server",
                     ge=-1, le=65535)
    window: int = spec(1000, "events in the sliding error-rate window", ge=1, le=10_000_000)
    max_lag: int = spec(10_000, "readiness bound: /readyz fails while consumer lag exceeds it",
                        ge=0)


@dataclass(frozen=True)
class LimitsConfig:
    """Input limits and polling."""

    max_message_bytes: int = spec(1_048_576, "larger messages are rejected", ge=16)
    max_id_length: int = spec(256, "longer event ids are rejected", ge=1)
    poll_max_records: int = spec(500, "messages per poll (micro-batch bound)", ge=1)
    poll_timeout_seconds: float = spec(0.1, "poll timeout", gt=0)
    poll_order_wait_seconds: float = spec(
        0.5, "input is processed in timestamp order across partitions; a partition with unread "
        "records but none fetched yet holds the others back at most this long", ge=0)
    max_abs_feature: float = spec(
        1e12, "instances with a feature value beyond +/- this are rejected (value_out_of_range)",
        gt=0)
    max_row_squared_norm: float = spec(
        1e26, "instances whose squared L2 norm of x exceeds this are rejected (value_out_of_range)",
        gt=0)
    dead_letter_max_bytes: int = spec(65_536, "a dead letter keeps at most this many bytes of "
                                      "the rejected message (and says it was truncated)", ge=0)

    def decode_limits(self) -> DecodeLimits:
        """What decoding checks (:class:`~streamlearn.events.DecodeLimits`)."""
        return DecodeLimits(self.max_message_bytes, self.max_id_length,
                            max_abs_feature=self.max_abs_feature,
                            max_row_squared_norm=self.max_row_squared_norm)


@dataclass(frozen=True)
class ExperienceConfig:
    """The experience log of learned decisions (on while retraining is on, or with a dir)."""

    dir: Path | None = spec(None, "log directory (default: <checkpoint.dir>/experience, or a "  # noqa: RUF009
                            "temporary one without checkpoints)", kind="dir")
    segment_rows: int = spec(50_000, "a segment closes at this many rows", ge=1)
    segment_seconds: float = spec(60.0, "... or when its oldest row is this old", gt=0)
    retention_bytes: int = spec(2 << 30, "oldest segments are deleted beyond this size", ge=1)
    retention_seconds: float = spec(7 * 86_400.0, "... or beyond this age", gt=0)


@dataclass(frozen=True)
class RetrainConfig:
    """Periodic IPS-weighted retraining of batch rankers (docs/daemon.md §8); off by default."""

    rankers: str | None = spec(None, "comma-separated rankers to retrain (rankboost, logistic, "
                               "rocchio, lda, roger, nroger, network, in candidate mode also "
                               "adarank and ndcg_boost, or package.module:Class); "
                               "every_events or every_seconds alone trains rankboost and "
                               "logistic (rocchio instead of logistic when d·K > 1000; in "
                               "candidate mode rankboost, adarank and ndcg_boost)",
                               check=names_problem)
    every_events: int | None = spec(None, "retrain after this many learned decisions", ge=1)
    every_seconds: float | None = spec(None, "retrain at least this often", gt=0)
    window_rows: int = spec(20_000, "train on the newest rows of the log, at most this many "
                            "(and at most 8M / (d·K): the joint feature matrix stays < 64 MB)",
                            ge=10)
    holdout_fraction: float = spec(0.2, "share of the window held out (the newest rows, in "
                                   "time; in candidate mode, requests by id hash, the only "
                                   "ones the request log keeps) for off-policy evaluation",
                                   gt=0, le=0.9)
    clip: float = spec(20.0, "inverse-propensity weights of the training rows are clipped at "
                       "this value (the off-policy estimates are not clipped)", gt=1)
    worker: str = spec("process", "where training runs: a separate process (keeps decision "
                       "latency flat, docs/performance.md) or a thread", choices=("process",
                                                                                 "thread"))
    worker_nice: int = spec(5, "the worker process's nice value: a lower priority than the "
                            "loop, yet a share of a busy CPU, so retrains finish", ge=0, le=19)
    timeout_seconds: float = spec(600.0, "a retrain running longer is a failure (the worker is "
                                  "replaced)", gt=0)
    policy: str = spec("learner", "the exploitation policy: the online learner, or the promoted "
                       "ranker (exploring around its top action as configured, rolled out share "
                       "by share; in candidate mode slot by slot, docs/daemon.md)",
                       choices=("learner", "ranker"))
    level: float = spec(0.95, "confidence of the promotion gate, the guardrail and the reported "
                        "bounds (1 - level: their miss probability)", gt=0.5, le=0.999)
    rollout_stages: str = spec("0.02,0.1,0.3,0.6", "shares a promoted ranker serves in turn before "
                               "it serves all but the holdback (comma-separated, increasing)",
                               check=stages_problem)
    rollout_stage_events: int = spec(500, "learned events a promoted ranker serves at one share "
                                     "before it may take the next", ge=1)
    holdback: float = spec(0.05, "share of the events the learner keeps while a ranker serves "
                           "(the guardrail compares them)", ge=0, le=0.5)


@dataclass(frozen=True)
class RolloutConfig:
    """Next to an existing system: who serves, the caller's baseline or the learner
    (docs/operations.md, "Adopting streamlearn next to an existing system")."""

    mode: str = spec("online", "apprentice: publish the baseline (the learner watches and "
                     "learns); conservative: the learner takes the share that keeps the live "
                     "reward >= (1 - alpha) x the baseline's; online: the learner decides",
                     choices=("apprentice", "conservative", "online"))
    baseline: str | None = spec(None, "the baseline of events that carry none: constant:A "
                                "(an action; 'constant' in any case, blanks around a part "
                                "ignored)", kind="constant-action")
    explore_budget: float = spec(0.0, "apprentice: the share of events the learner serves "
                                 "(0: none; > 0 measures it and makes off-policy estimates "
                                 "of it possible)", ge=0, le=1)
    alpha: float = spec(0.05, "conservative: the floor is (1 - alpha) x what the baseline "
                        "would have earned", gt=0, le=0.5)
    auto: bool = spec(False, "move apprentice -> conservative -> online when the bounds say "
                      "so (SIGUSR2 steps back)")


@dataclass(frozen=True)
class CandidatesConfig:
    """Candidate mode: each request carries its own candidates and slots (docs/kafka.md)."""

    enabled: bool = spec(False, "requests carry candidate sets (on by itself with an embedded "
                         "candidate-set dataset)")
    learner: str = spec("linucb", "candidate-set learner (docs/learners.md)",
                        choices=("linucb", "epsilon-greedy", "squarecb", "banditron"))
    shared_features: int = spec(0, "dimension of the shared context x (0: none)", ge=0)
    candidate_features: int = spec(45, "dimension of each candidate's features (hashing "
                                   "buckets for named features)", ge=1)
    max_candidates: int = spec(1000, "requests with more candidates are rejected", ge=1,
                               le=100_000)
    max_slots: int = spec(10, "requests asking for more slots are rejected", ge=1, le=1000)


@dataclass(frozen=True)
class DaemonSettings:
    """What the loop needs: the configuration's sections as they are, and four settings of
    the process (not configurable: the defaults are what a daemon wants; tests and benches
    set them)."""

    learner: LearnerConfig = field(default_factory=LearnerConfig)
    join: JoinConfig = field(default_factory=JoinConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    experience: ExperienceConfig = field(default_factory=ExperienceConfig)
    retrain: RetrainConfig = field(default_factory=RetrainConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    candidates: CandidatesConfig = field(default_factory=CandidatesConfig)
    model_name: str = ""
    flush_timeout_seconds: float = 10.0
    retry_seconds: float = 1.0
    blas_threads: int = 1  # BLAS threads while serving; 0 leaves the library default

    def as_json(self) -> dict[str, Any]:
        """Every setting as JSON values, by section (paths as strings): what a checkpoint
        records of the settings it was written with."""
        return {f.name: _json_values(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @property
    def retrain_enabled(self) -> bool:
        r = self.retrain
        return bool(r.rankers) or r.every_events is not None or r.every_seconds is not None

    def retrain_ranker_names(self) -> tuple[str, ...]:
        """The configured rankers; by default RankBoost and logistic regression, or Rocchio
        instead of the latter when the joint features are too wide for its Newton steps
        (d·K > 1,000: a (d·K)² Hessian per step); in candidate mode RankBoost, AdaRank
        and NDCG_Boost."""
        names = tuple(n.strip() for n in (self.retrain.rankers or "").split(",") if n.strip())
        if names:
            return names
        if self.candidates.enabled:  # requests are queries: the listwise rankers apply
            return ("rankboost", "adarank", "ndcg_boost")
        wide = self.joint_width() > 1000
        return ("rankboost", "rocchio") if wide else ("rankboost", "logistic")

    def retrain_window(self) -> int:
        """Rows per retrain: ``retrain.window_rows``, capped so that the joint feature
        matrix (rows × d·K) stays below 8 M elements (64 MB in the worker)."""
        return max(10, min(self.retrain.window_rows, 8_000_000 // self.joint_width()))

    def joint_width(self) -> int:
        """Features of one ranker row: the joint (context, action) features d·K, or in
        candidate mode the context and the candidate's and the exploit candidate's features
        (d_x + 2·d_c)."""
        if self.candidates.enabled:
            return max(1, self.candidates.shared_features + 2 * self.candidates.candidate_features)
        return max(1, self.learner.n_features * self.learner.n_actions)

    def rollout_settings(self) -> RolloutSettings:
        """How a promoted ranker takes traffic (``retrain.rollout_*``, ``retrain.holdback``)."""
        r = self.retrain
        try:
            settings = RolloutSettings(parse_stages(r.rollout_stages), r.rollout_stage_events,
                                       r.holdback, alpha=1.0 - r.level,
                                       unit="slots" if self.candidates.enabled else "events")
        except ValueError as exc:
            raise ConfigError(f"retrain.rollout_stages must be increasing shares in (0, 1), "
                              f"e.g. '0.02,0.1,0.3,0.6'. Got {r.rollout_stages!r} "
                              f"({exc}).") from None
        most = 1.0 - settings.holdback
        if settings.stages[-1] > most + 1e-9:  # said, not silently clamped (an outside test)
            log.warning("retrain.rollout_stages %s: a share above 1 - retrain.holdback = %g is "
                        "served as %g (the learner keeps its holdback), and the rollout "
                        "completes there", r.rollout_stages, most, most)
        return settings

    def adoption_settings(self) -> AdoptionSettings:
        """Who serves next to an existing system (``rollout.*``)."""
        rollout = self.rollout
        if self.candidates.enabled and rollout.mode != "online":
            raise ConfigError(f"rollout.mode must be 'online' in candidate mode (a baseline "
                              f"candidate is validated and recorded, not served). Got "
                              f"{rollout.mode!r}.")
        if self.candidates.enabled and rollout.baseline:
            raise ConfigError(f"rollout.baseline must be unset in candidate mode (a request "
                              f"names its own baseline candidate; a constant action means "
                              f"nothing there). Got {rollout.baseline!r}.")
        return AdoptionSettings(rollout.mode,
                                parse_baseline(rollout.baseline, self.learner.n_actions),
                                rollout.explore_budget, rollout.alpha, rollout.auto,
                                1.0 - self.retrain.level)


def _json_values(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json_values(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return str(value) if isinstance(value, Path) else value


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
