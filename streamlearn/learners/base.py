"""The one learner interface (docs/learners.md) and the shared template methods.

A learner holds K linear scorers over d features. ``decide`` scores a whole
micro-batch with one product, asks its :class:`~streamlearn.learners.exploration.Exploration`
for each event's γ (fixed *before* sampling), and samples actions with
randomness that is a pure function of ``(seed, event key)``. ``update`` applies a
whole batch of bandit feedback with one product.

Invariants every learner keeps:

* ``probs`` returned by ``decide`` is the full sampling distribution: finite,
  rows sum to 1, zero outside the mask — *whatever the weights* (scores that
  overflow to ±inf or NaN are ranked, never propagated; a row that still comes
  out broken falls back to uniform over its allowed actions). Its row maximum
  is at the exploit action ``argmax(W x)`` (ties → lowest index). ``update`` therefore recovers the
  exploit action of decision time as ``argmax(probs)`` even when the weights
  moved while the feedback was delayed.
* A batch is decided with the weights as they were at the start of the batch
  and its updates are summed, so batch size 1 is exactly the per-event
  algorithm (docs/algorithms.md, docs/learners.md).
* ``decide`` never changes learned weights; it only advances the round counter
  the exploration schedules use.
* Learned state stays finite: an update that would make it NaN or infinite is
  rolled back; its rows are retried one by one and only the offending ones are
  skipped (counted in ``n_skipped_updates_``).
"""

from __future__ import annotations

import abc
import copy
import inspect
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

import numpy as np

from streamlearn.errors import ConfigError, StateError
from streamlearn.features import (
    Batch,
    SparseBatch,
    as_batch,
    batch_size,
    row_starts,
    scores,
    take_rows,
)
from streamlearn.learners import randomness
from streamlearn.learners.exploration import GAMMA_MAX, Adaptive, Exploration

_T = TypeVar("_T")

__all__ = ["Learner", "check_float", "check_int", "exploit_actions", "masked_argmax", "mix_uniform"]


def check_int(owner: str, name: str, value: object, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(
            f"The '{name}' parameter of {owner} must be an int >= {low}. Got {value!r} instead."
        )
    return int(value)


def check_float(
    owner: str, name: str, value: object, low: float, high: float,
    low_open: bool = True, high_open: bool = False,
) -> float:
    ok = isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
    if ok:
        v = float(value)  # type: ignore[arg-type]
        ok = bool(np.isfinite(v)) and (v > low if low_open else v >= low) and (
            v < high if high_open else v <= high)
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise ConfigError(
            f"The '{name}' parameter of {owner} must be a float in {lo}{low}, {high}{hi}. "
            f"Got {value!r} instead."
        )
    return float(value)  # type: ignore[arg-type]


_HUGE = np.finfo(np.float64).max


def rankable(score_matrix: np.ndarray) -> np.ndarray:
    """Scores with NaN → the lowest and ±inf → ±the largest finite float (order kept otherwise)."""
    if np.isfinite(score_matrix).all():
        return score_matrix
    return np.asarray(np.nan_to_num(score_matrix, nan=-_HUGE, posinf=_HUGE, neginf=-_HUGE))


def masked_argmax(score_matrix: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Row argmax over allowed actions; ties go to the lowest index; never a masked action.

    Non-finite scores are ranked (see :func:`rankable`), so an allowed action
    always beats a masked one, even when every allowed score is -inf or NaN.
    """
    return _argmax_ranked(rankable(score_matrix), mask)


def _argmax_ranked(ranked: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is None:
        return np.asarray(ranked.argmax(axis=1))
    return np.asarray(np.where(mask, ranked, -np.inf).argmax(axis=1))


def safe_distribution(probs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """``probs`` where each row is finite, non-negative, zero outside the mask and sums to 1;
    any other row is replaced by the uniform distribution over its allowed actions."""
    deviation = np.abs(probs.sum(axis=1) - 1.0).max() if len(probs) else 0.0
    if deviation <= 1e-9 and probs.min(initial=0.0) >= 0 and (  # NaN fails both comparisons
            mask is None or not (probs * ~mask).any()):
        return probs  # the fast path: every row is a distribution
    with np.errstate(invalid="ignore"):
        good = np.isfinite(probs).all(axis=1) & (probs >= 0).all(axis=1)
        good &= np.abs(probs.sum(axis=1) - 1.0) <= 1e-9
        if mask is not None:
            good &= ~(probs * ~mask).any(axis=1)
    allowed = np.ones_like(probs, dtype=bool) if mask is None else mask
    uniform = allowed / allowed.sum(axis=1, keepdims=True)
    return np.where(good[:, None], probs, uniform)


def mix_uniform(dist: np.ndarray, gammas: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """(1 − γ)·dist + γ·uniform over the allowed actions, rows renormalised to sum to 1.

    Mixing with a uniform distribution keeps the order of the allowed entries (and
    so the row's first maximum); the renormalisation makes a row with one allowed
    action exactly 1.
    """
    K = dist.shape[1]
    uniform = np.full(dist.shape, 1.0 / K) if mask is None else mask / mask.sum(axis=1, keepdims=True)
    mixed = (1.0 - gammas)[:, None] * dist + gammas[:, None] * uniform
    return np.asarray(mixed / mixed.sum(axis=1, keepdims=True))


def exploit_actions(probs: np.ndarray) -> np.ndarray:
    """The exploit action of decision time, recovered from the logged distribution."""
    return np.asarray(np.asarray(probs).argmax(axis=1))


def _check_mask(mask: object, B: int, K: int) -> np.ndarray | None:
    if mask is None:
        return None
    m = np.asarray(mask, dtype=bool)
    if m.shape != (B, K):
        raise ConfigError(f"Expected an action mask of shape ({B}, {K}). Got {m.shape} instead.")
    if not m.any(axis=1).all():
        raise ConfigError("Every event's action mask must allow at least one action.")
    return m


class Learner(abc.ABC):
    """Base class of every contextual-bandit learner.

    Subclasses implement ``_weights`` (the (K, d) scoring matrix), ``_update``
    (apply a validated batch) and ``_arrays``/``_load_arrays`` (learned state);
    everything else — validation, exploration, sampling, state files — is here.
    """

    #: Learners that need labels (full information) set this; replay feeds them the true label.
    full_information: ClassVar[bool] = False

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        seed: int = 0,
    ) -> None:
        name = type(self).__name__
        self.n_actions = check_int(name, "n_actions", n_actions, low=2)
        self.n_features = check_int(name, "n_features", n_features)
        self.exploration = exploration if exploration is not None else self._default_exploration()
        if not isinstance(self.exploration, Exploration):
            raise ConfigError(
                f"The 'exploration' parameter of {name} must be an Exploration instance. "
                f"Got {exploration!r} instead."
            )
        self.seed = check_int(name, "seed", seed, low=0)
        # values computed for the objects of the current decide call (see _once_per_call)
        self._call_memo: dict[tuple[object, ...], Any] | None = None
        self.n_decided_ = 0  # rounds decided so far (the t of the exploration schedules)
        self.n_updated_ = 0  # feedback events applied so far
        self.n_skipped_updates_ = 0  # feedback events not applied: they made the state non-finite

    @classmethod
    def _default_exploration(cls) -> Exploration:
        """The exploration a learner gets when none is given.

        Here the drift-aware adaptive rule at its untuned defaults (for the Banditron family it
        is within 0.02 of the best fixed γ of a grid on every stream, docs/results.md §2);
        learners with a rule of their own override this (docs/learners.md lists them).
        """
        return Adaptive()

    # ------------------------------------------------------------------ params
    def get_params(self) -> dict[str, Any]:
        sig = inspect.signature(type(self).__init__)
        return {p: getattr(self, p) for p in sig.parameters if p != "self"}

    def clone(self) -> Learner:
        """A fresh, unfitted learner with the same hyperparameters."""
        params = self.get_params()
        params["exploration"] = self.exploration.clone()
        return type(self)(**params)

    # ---------------------------------------------------------------- decide
    def decide(
        self, X: object, mask: object = None, keys: object = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Choose one action per event.

        Returns ``(actions, probs)``: ``actions`` int64 of shape (B,), ``probs`` the
        full sampling distribution of shape (B, K). ``keys`` (ints or strings, one per
        event) seed the exploration randomness; without keys the round numbers are used.
        """
        self._call_memo = {}
        try:
            return self._decide(X, mask, keys)
        finally:
            self._call_memo = None

    def _once_per_call(self, name: str, objects: tuple[object, ...],
                       compute: Callable[[], _T]) -> _T:
        """``compute()``, computed once per ``decide`` call for the same ``objects`` (by
        identity: a batch is not changed during the call, though a caller may refill the
        same array between calls); outside ``decide`` computed every time."""
        memo = self._call_memo
        if memo is None:
            return compute()
        key = (name, *(id(o) for o in objects))
        if key not in memo:  # the objects are kept with the value: no id is reused in the call
            memo[key] = (objects, compute())
        return cast(_T, memo[key][1])

    def _decide(self, X: object, mask: object, keys: object) -> tuple[np.ndarray, np.ndarray]:
        batch = as_batch(X, self.n_features)
        _refuse_non_finite(batch)  # as update does: NaN scores would rank lowest
        B = batch_size(batch)
        m = _check_mask(mask, B, self.n_actions)
        with np.errstate(over="ignore", invalid="ignore"):
            score_matrix = rankable(self.decision_scores(batch))
        exploit = self._exploit(batch, score_matrix, m)
        rounds = np.arange(self.n_decided_ + 1, self.n_decided_ + 1 + B)
        gammas = self.exploration.gammas(score_matrix, exploit, rounds, m, self.n_actions)
        # γ ≤ ½; a NaN γ gives NaN rows, which safe_distribution replaces by uniform ones
        gammas = np.minimum(gammas, GAMMA_MAX)
        probs = self._probabilities(batch, score_matrix, exploit, gammas, m)
        # The default ε-greedy rows are distributions by construction when every γ is in
        # [0, ½] (NaN fails the test); any other rule is checked row by row.
        cls = type(self)
        if not (cls._probabilities is Learner._probabilities
                and cls._distribution is Learner._distribution and B and gammas.min() >= 0.0):
            probs = safe_distribution(probs, m)
        uniforms = randomness.uniforms(self.seed, rounds if keys is None else _checked_keys(keys, B))
        actions = randomness.sample(probs, uniforms)
        self.n_decided_ += B
        return actions, probs

    def count_decided(self, n: int) -> None:
        """Count ``n`` rounds decided elsewhere (decisions re-emitted from a journal after a
        restart), so the exploration schedules see the same round numbers as before it."""
        self.n_decided_ += int(n)

    def decision_scores(self, X: Batch) -> np.ndarray:
        """``X @ W.T`` for the current weights (shape (B, K))."""
        return scores(self._weights(), X)

    def predict(self, X: object, mask: object = None) -> np.ndarray:
        """The exploit action (no exploration)."""
        batch = as_batch(X, self.n_features)
        _refuse_non_finite(batch)
        m = _check_mask(mask, batch_size(batch), self.n_actions)
        return self._exploit(batch, self.decision_scores(batch), m)

    def _exploit(self, X: Batch, score_matrix: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """The exploit action of each event: the masked argmax of the scores (ties → lowest index).

        Learners whose policy is not the argmax of one score matrix (a vote over bag
        copies, a Thompson-sampling mode) override this and ``_probabilities`` together,
        keeping ``argmax(probs) == exploit`` row by row. The scores are already
        :func:`rankable` (finite).
        """
        return _argmax_ranked(score_matrix, mask)

    def _probabilities(
        self, X: Batch, score_matrix: np.ndarray, exploit: np.ndarray, gammas: np.ndarray,
        mask: np.ndarray | None,
    ) -> np.ndarray:
        """The full sampling distribution (B, K); by default ε-greedy around ``exploit`` with ε = γ.

        Overrides must return rows that sum to 1, are zero outside the mask, and have
        their maximum at ``exploit`` (first maximum, as ``np.argmax`` reads it).
        """
        return self._distribution(exploit, gammas, mask)

    def _distribution(
        self, exploit: np.ndarray, gammas: np.ndarray, mask: np.ndarray | None
    ) -> np.ndarray:
        """P(r) = (1-γ)·1[r=ŷ] + γ/|allowed| over the allowed actions."""
        B, K = len(exploit), self.n_actions
        if mask is None:
            probs = np.empty((B, K))
            probs[:] = (gammas / K)[:, None]
        else:
            probs = mask * (gammas / mask.sum(axis=1))[:, None]
        probs.reshape(-1)[row_starts(B, K) + exploit] += 1.0 - gammas
        return probs

    # ---------------------------------------------------------------- update
    def update(self, X: object, actions: object, rewards: object, probs: object,
               exploit: object | None = None) -> None:
        """Learn from bandit feedback.

        ``actions`` are the chosen actions, ``rewards`` in [0, 1], ``probs`` the full
        (B, K) distributions logged at decision time (the chosen propensity is
        ``probs[i, actions[i]]``). ``exploit`` is the learner's own best action of
        decision time; by default ``argmax(probs)``, which it is whenever the learner
        alone decided. When another policy shared the decision (a baseline, a ranker in
        rollout), the logged distribution is the mixture and its maximum may be the
        other policy's: pass the learner's own choice, or the learners that correct
        their own prediction (the Banditron family) learn the other policy's mistakes.
        Inputs are never mutated.
        """
        batch = as_batch(X, self.n_features)
        B = batch_size(batch)
        a = np.asarray(actions).reshape(-1)
        if a.dtype.kind not in "iu" and a.size:  # 1.7, "2", True or 10**20 are not actions
            raise ConfigError(f"Actions must be integers in [0, {self.n_actions}). Got "
                              f"{a.dtype} values such as {_plain(a.flat[0])!r:.40}.")
        a = a.astype(np.int64, copy=False)
        r = np.asarray(rewards).reshape(-1)
        if r.dtype.kind not in "fiub" and r.size:
            raise ConfigError(f"Rewards must be numbers in [0, 1]. Got {r.dtype} values such "
                              f"as {_plain(r.flat[0])!r:.40}.")
        r = r.astype(np.float64, copy=False)
        p = np.asarray(probs, dtype=np.float64)
        if a.shape != (B,) or r.shape != (B,) or p.shape != (B, self.n_actions):
            raise ConfigError(
                f"update expects actions ({B},), rewards ({B},), probs ({B}, {self.n_actions}). "
                f"Got {a.shape}, {r.shape}, {p.shape} instead."
            )
        if B == 0:
            return
        if a.min() < 0 or a.max() >= self.n_actions:
            raise ConfigError(f"Actions must be in [0, {self.n_actions}). Got {a.min()}..{a.max()}.")
        if not (r.min() >= 0.0 and r.max() <= 1.0):  # NaN fails both, ±inf one of them
            raise ConfigError("Rewards must be finite and in [0, 1].")
        # the whole logged row: the adaptive γ reads its maximum (a NaN there made its running
        # sums NaN, then every decision uniform and the state unloadable)
        if not (p.min() >= 0.0 and p.max() <= 1.0) or (
                not self.full_information and np.abs(p.sum(axis=1) - 1.0).max() > 1e-6):
            off = ~((p >= 0.0) & (p <= 1.0)).all(axis=1)
            if not self.full_information:
                off |= np.abs(p.sum(axis=1) - 1.0) > 1e-6
            bad = int(np.flatnonzero(off)[0])
            raise ConfigError(f"The logged probabilities must be distributions: finite, in "
                              f"[0, 1], each row summing to 1 (as decide returned them). Got "
                              f"row {bad}: {p[bad].tolist()!r:.120}.")
        chosen_p = p.take(row_starts(B, self.n_actions) + a)
        if not full_or_positive(chosen_p, self.full_information):
            raise ConfigError("The logged probability of every chosen action must be > 0.")
        _refuse_non_finite(batch)
        ex = exploit_actions(p) if exploit is None else np.asarray(exploit).reshape(-1)
        if ex.shape != (B,) or ex.dtype.kind not in "iu" or ex.min() < 0 \
                or ex.max() >= self.n_actions:
            raise ConfigError(f"update expects exploit as ({B},) actions in [0, {self.n_actions}). "
                              f"Got {ex.shape} {ex.dtype}.")
        self.learn_checked(batch, a, r, p, ex.astype(np.int64, copy=False))

    def learn_checked(self, X: Batch, actions: np.ndarray, rewards: np.ndarray,
                      probs: np.ndarray, exploit: np.ndarray,
                      decided_exploit: np.ndarray | None = None) -> None:
        """:meth:`update` on inputs already in the form it checks them into: a float64 batch
        of finite features, int64 actions and exploit actions in [0, K), float64 rewards in
        [0, 1], (B, K) logged distributions giving each chosen action a positive probability
        (a full-information learner: any). The engine learns its closed decisions this way:
        what it hands over was made by ``decide`` and joined from checked feedback, so
        checking it again cost a dozen reductions a batch (~25 µs, 7 % of a LinUCB batch of
        64). The guard against a non-finite state stays.

        ``decided_exploit``: the learner's best action as it decided, also on rows it had no
        chance to serve (``exploit`` is then the logged action it learns from: the engine's
        ``own_choices``); the exploration's drift detector watches the rows where that
        action was played (default: ``exploit``)."""
        # the adaptive γ reads the logged distribution's maximum: its estimate of the
        # learner's own error from the rows a mixture logged would weigh each by 1/share,
        # and at the small shares of a conservative rollout that noise made the learner's
        # share collapse from 1 to 0 (simulators/conservative_floor.py, poor baseline); its
        # drift detector watches the rows the learner's own best action was played on
        self.exploration.observe(actions, rewards, probs,
                                 exploit if decided_exploit is None else decided_exploit)
        applied = self._guarded_update(X, actions, rewards, probs, exploit)
        self.n_updated_ += applied
        self.n_skipped_updates_ += len(actions) - applied

    def _guarded_update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray,
                        probs: np.ndarray, exploit: np.ndarray) -> int:
        """Apply the batch unless it makes the state non-finite (or the numerics fail, e.g. a
        singular matrix); return the rows applied.

        Cold path on failure: restore, find the rows that fail on their own, apply the others
        together; if together they still fail (the numerics of a joint step), apply them one
        at a time in order, skipping only a row that fails where it comes.
        """
        saved = self._snapshot_for(X)
        if self._applied(X, actions, rewards, probs, exploit):
            return len(actions)
        self._restore(saved)
        good = np.ones(len(actions), dtype=bool)
        for i in range(len(actions)):
            one = np.array([i])
            good[i] = self._applied(take_rows(X, one), actions[one], rewards[one], probs[one],
                                    exploit[one])
            self._restore(saved)
        rows = np.flatnonzero(good)
        if not len(rows) or self._applied(take_rows(X, rows), actions[rows], rewards[rows],
                                          probs[rows], exploit[rows]):
            return len(rows)
        self._restore(saved)
        applied = 0
        for i in rows.tolist():
            one = np.array([i])
            row = take_rows(X, one)
            before = self._snapshot_for(row)
            if self._applied(row, actions[one], rewards[one], probs[one], exploit[one]):
                applied += 1
            else:
                self._restore(before)
        return applied

    def _applied(self, X: Batch, actions: np.ndarray, rewards: np.ndarray,
                 probs: np.ndarray, exploit: np.ndarray) -> bool:
        """Run ``_update``; whether it left the state finite (False also when it failed)."""
        try:
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                self._update(X, actions, rewards, probs, exploit)
        except (np.linalg.LinAlgError, FloatingPointError, ZeroDivisionError, OverflowError):
            return False
        return self._state_finite_after(X)

    def _snapshot_for(self, X: Batch) -> dict[str, np.ndarray]:
        """What the guard saves before an update on ``X``: by default :meth:`_snapshot`.
        A learner whose update on X changes only part of its arrays (the feature columns of
        a sparse batch) may save only that part; :meth:`_restore` then writes it back and
        :meth:`_state_finite_after` checks only it (the rest was finite and is unchanged)."""
        return self._snapshot()

    def _state_finite_after(self, X: Batch) -> bool:
        """Whether the state is finite after an update on ``X`` (the part
        :meth:`_snapshot_for` saved for it; by default everything, :meth:`_state_finite`)."""
        return self._state_finite()

    def _snapshot(self) -> dict[str, np.ndarray]:
        """A copy of the learned arrays, taken before every update (override if cheaper exists)."""
        return {k: np.array(v, copy=True) for k, v in self._arrays().items()}

    def _restore(self, saved: dict[str, np.ndarray]) -> None:
        self._load_arrays({k: np.array(v, copy=True) for k, v in saved.items()})

    def _state_finite(self) -> bool:
        """Whether every learned array and the scoring matrix are finite."""
        arrays = list(self._arrays().values())
        weights = self._weights()
        if not any(a is weights for a in arrays):
            arrays.append(weights)
        return all(bool(np.isfinite(a).all()) for a in arrays)

    @abc.abstractmethod
    def _weights(self) -> np.ndarray:
        """The (K, d) scoring matrix (for the potential family: the link of the dual)."""

    @abc.abstractmethod
    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        """Apply one validated batch of feedback."""

    @property
    def drift_detections_(self) -> int:
        """Changes detected so far by the exploration strategy's drift detector (0 without one)."""
        return int(self.exploration.drift_detections_)

    # ----------------------------------------------------------------- state
    @abc.abstractmethod
    def _arrays(self) -> dict[str, np.ndarray]:
        """The learned arrays (copied by ``state``)."""

    @abc.abstractmethod
    def _load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Install learned arrays (already shape-checked against ``_arrays``)."""

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Learned state as plain arrays plus JSON-serialisable metadata."""
        arrays = {f"learner.{k}": np.array(v, copy=True) for k, v in self._arrays().items()}
        arrays.update({f"exploration.{k}": np.array(v, copy=True)
                       for k, v in self.exploration.arrays().items()})
        params = self.get_params()
        params["exploration"] = self.exploration.spec()
        meta = {
            "class": type(self).__name__,
            "params": params,
            "counters": {"n_decided": self.n_decided_, "n_updated": self.n_updated_,
                         "n_skipped_updates": self.n_skipped_updates_},
            "exploration_state": self.exploration.scalars(),
        }
        return arrays, meta

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> Learner:
        """Rebuild a learner from ``state()`` output; raise ``StateError`` if they do not fit."""
        from streamlearn.learners.exploration import exploration_from_spec

        if meta.get("class") != cls.__name__:
            raise StateError(f"State holds a {meta.get('class')!r}, not a {cls.__name__}.")
        try:
            params = dict(meta["params"])
            params["exploration"] = exploration_from_spec(params["exploration"])
            learner = cls(**params)
            counters = meta["counters"]
            learner.n_decided_ = int(counters["n_decided"])
            learner.n_updated_ = int(counters["n_updated"])
            learner.n_skipped_updates_ = int(counters.get("n_skipped_updates", 0))
            learner.exploration.load(
                {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("exploration.")},
                meta["exploration_state"],
            )
        except (KeyError, TypeError, ConfigError, ValueError) as exc:
            raise StateError(f"State metadata for {cls.__name__} is invalid: {exc}") from exc
        expected = learner._arrays()
        got = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("learner.")}
        if set(got) != set(expected):
            raise StateError(
                f"State arrays for {cls.__name__} must be {sorted(expected)}. Got {sorted(got)}."
            )
        for key, ref in expected.items():
            if got[key].shape != ref.shape or got[key].dtype != ref.dtype:
                raise StateError(
                    f"State array {key!r} must have shape {ref.shape} and dtype {ref.dtype}. "
                    f"Got {got[key].shape} {got[key].dtype}."
                )
            if got[key].dtype.kind == "f" and not np.isfinite(got[key]).all():
                raise StateError(f"State array {key!r} holds NaN or inf.")
        learner._load_arrays({k: np.array(v, copy=True) for k, v in got.items()})
        return learner

    def __deepcopy__(self, memo: dict[int, Any]) -> Learner:
        arrays, meta = self.state()
        return type(self).from_state(copy.deepcopy(arrays, memo), copy.deepcopy(meta, memo))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"


class LinearLearner(Learner):
    """A learner whose whole learned state is the (K, d) matrix ``weights_`` it scores with."""

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, seed)
        self.weights_ = np.zeros((self.n_actions, self.n_features))

    def _weights(self) -> np.ndarray:
        return self.weights_

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"weights": self.weights_}

    def _load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.weights_ = arrays["weights"]

    # the whole state is one matrix: snapshot and check it without the generic dicts
    def _snapshot(self) -> dict[str, np.ndarray]:
        return {"weights": self.weights_.copy()}

    def _state_finite(self) -> bool:
        return bool(np.isfinite(self.weights_).all())


def _plain(value: object) -> object:
    """A numpy scalar as the Python value it holds (for messages)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _checked_keys(keys: object, B: int) -> np.ndarray:
    """``decide``'s keys: one per event (an empty batch may pass an empty list)."""
    n = len(keys) if isinstance(keys, (list, tuple, np.ndarray)) else -1
    if n != B:
        raise ConfigError(f"decide expects one key per event: {B} keys. Got "
                          f"{'a ' + type(keys).__name__ if n < 0 else n}.")
    if B == 0:
        return np.zeros(0, dtype=np.int64)
    try:  # hashed here once: hash_keys of the hashed keys is themselves
        return randomness.hash_keys(keys)
    except (TypeError, ValueError, AttributeError) as exc:
        odd = next((k for k in np.asarray(keys, dtype=object).reshape(-1)
                    if not isinstance(k, (int, np.integer, str, bytes))), None)
        raise ConfigError(f"Event keys must be integers or strings. Got "
                          f"{type(odd).__name__} {odd!r:.40}.") from exc


def _refuse_non_finite(X: Batch) -> None:
    if not all_finite(X):
        raise ConfigError("Features must be finite (no NaN or inf).")


def all_finite(X: Batch) -> bool:
    values = X.values if isinstance(X, SparseBatch) else X
    return bool(np.isfinite(values).all())


def full_or_positive(chosen_p: np.ndarray, full_information: bool) -> bool:
    """Full-information learners accept any logged probability; bandit learners need p > 0."""
    return full_information or not len(chosen_p) or bool(chosen_p.min() > 0.0)  # NaN fails
