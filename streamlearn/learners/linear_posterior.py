"""LinUCB and linear Thompson sampling over per-action ridge regressions.

Each action a keeps the ridge statistics of the events where it was played,
A_a = λ·I + Σ x xᵀ and b_a = Σ r·x, over x augmented with a constant 1 (the
intercept), and the posterior mean θ_a = A_a⁻¹ b_a. ``A⁻¹`` is kept directly
and updated by Sherman–Morrison (Woodbury for the events of one action in a
batch, vectorised over actions by padding each action's events to the batch's
largest group):

    A⁻¹ ← A⁻¹ − A⁻¹Xᵀ (I + X A⁻¹ Xᵀ)⁻¹ X A⁻¹.

A batch of one event is exactly the per-event Sherman–Morrison update. When
d + 1 exceeds ``full_max_features`` only the diagonal of A is kept (a diagonal
ridge: θ_aj = b_aj / A_ajj, width² = Σ_j x_j²/A_ajj).

* :class:`LinUCB` (Li, Chu, Langford & Schapire, WWW 2010): scores
  θ_a·x + α·√(xᵀA_a⁻¹x) and plays their argmax, mixed with the exploration
  strategy's γ.
* :class:`LinTS` (Agrawal & Goyal, ICML 2013): samples θ̃_a ~ N(θ_a, v²A_a⁻¹)
  and plays the argmax. Its action probabilities have no closed form, so they are
  estimated with ``n_samples`` posterior draws per event that reuse one fixed
  table of standard normals (drawn once from the seed): the distribution is then a
  deterministic function of (state, x), its logged propensities are exact for the
  policy that is actually played, and the action is sampled from it with the keyed
  uniform like every learner. The exploit action is that distribution's mode.
"""

from __future__ import annotations

import numpy as np

from streamlearn.features import (
    Batch,
    SparseBatch,
    add_outer,
    held_columns,
    held_columns_and_local,
    row_starts,
    scores,
)
from streamlearn.learners.base import Learner, check_float, check_int, mix_uniform
from streamlearn.learners.exploration import Exploration, default_exploration
from streamlearn.learners.oracle import RegressionOracle
from streamlearn.learners.oracle_base import new_change

__all__ = ["LinTS", "LinUCB", "RidgePosterior", "woodbury_update"]

_PIVOT_DIGITS = 1e-10  # a Cholesky pivot² below this share of its diagonal entry is rounding


def _augment(X: Batch) -> np.ndarray:
    """Dense x with the constant 1 appended (the intercept)."""
    dense = X.to_dense() if isinstance(X, SparseBatch) else X
    Z = np.empty((dense.shape[0], dense.shape[1] + 1))
    Z[:, :-1] = dense
    Z[:, -1] = 1.0
    return Z


class RidgePosterior:
    """Per-action ridge statistics, vectorised over actions: the full A⁻¹, or a diagonal approximation.

    Full mode (d + 1 ≤ ``full_max_features``): θ_a = A_a⁻¹b_a and widths √(zᵀA_a⁻¹z) from
    the exact A_a⁻¹ (Sherman–Morrison/Woodbury). Diagonal mode: the widths use only the
    diagonal of A_a, √(Σ_j z_j²/A_ajj), and — because b_aj/A_ajj is a poor estimate of θ
    when features are correlated — the means come from the regression oracle
    (:class:`~streamlearn.learners.oracle.RegressionOracle`, VW's adaptive update).
    """

    def __init__(self, n_actions: int, n_features: int, ridge: float, full_max_features: int) -> None:
        self.n_actions = n_actions
        self.dim = n_features + 1  # the intercept is the last coordinate
        self.full = self.dim <= full_max_features
        self.xty_ = np.zeros((n_actions, self.dim))  # b = Σ r·z
        self.mean_ = np.zeros((n_actions, self.dim))  # θ = A⁻¹ b (full mode)
        if self.full:
            self.cov_ = np.tile(np.eye(self.dim) / ridge, (n_actions, 1, 1))  # A⁻¹ per action
        else:
            self.cov_ = np.full((n_actions, self.dim), 1.0 / ridge)  # diagonal of A⁻¹
        # diagonal mode's means, starting in the middle of the reward range (as ε-greedy and
        # bagging: docs/learners.md, "Initial prediction"); unused in full mode
        self.oracle_ = RegressionOracle(n_actions, n_features if not self.full else 1, initial=0.5)

    def predict(self, X: Batch) -> tuple[np.ndarray, np.ndarray]:
        """Posterior means and widths √(zᵀA_a⁻¹z), each (B, K)."""
        if not self.full:
            quad = scores(self.cov_[:, :-1], _square(X)) + self.cov_[:, -1]
            return self.oracle_.predict(X), np.sqrt(np.maximum(quad, 0.0))
        Z = _augment(X)
        means = Z @ self.mean_.T
        K, D = self.n_actions, self.dim
        projected = (Z @ self.cov_.transpose(1, 0, 2).reshape(D, K * D)).reshape(-1, K, D)
        quad = np.einsum("bkd,bd->bk", projected, Z)
        return means, np.sqrt(np.maximum(quad, 0.0))

    def update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray) -> None:
        """Add the events (x_i, r_i) to the statistics of their actions."""
        B = len(actions)
        if B == 0:
            return
        onehot = np.zeros((B, self.n_actions))
        onehot[np.arange(B), actions] = 1.0
        if not self.full:
            if isinstance(X, SparseBatch):
                self._add_sparse_diagonal(X, actions)
            else:
                precision = 1.0 / self.cov_
                add_outer(precision[:, :-1], onehot, _square(X))
                precision[:, -1] += onehot.sum(axis=0)
                self.cov_ = 1.0 / precision
            self.oracle_.update(X, actions[:, None], rewards[:, None], np.ones((B, 1)))
            return
        # Full mode never writes A⁻¹, b or θ in place: every update binds new arrays, so the
        # learner's guard can keep the previous ones by reference (_RidgeLearner._snapshot).
        Z = _augment(X)
        self.xty_ = self.xty_ + (onehot * rewards[:, None]).T @ Z
        self.cov_ = woodbury_update(self.cov_, _grouped_rows(Z, onehot, actions))
        self.mean_ = np.matmul(self.cov_, self.xty_[:, :, None])[:, :, 0]

    def _add_sparse_diagonal(self, X: SparseBatch, actions: np.ndarray) -> None:
        """Diagonal mode, a sparse batch: A_ajj += Σ x_j² over the events of action a, in
        place and only in the columns the batch holds (and the intercept's): O(nnz + K), not
        O(K·d). A column the batch lacks keeps its A⁻¹ entry exactly (the dense route's
        1/(1/c) may move it by a rounding)."""
        columns, local = held_columns_and_local(X)
        K, width = self.n_actions, len(columns)
        added = np.bincount(actions[X.row_ids()] * width + local, weights=X.values * X.values,
                            minlength=K * width).reshape(K, width)
        self.cov_[:, columns] = 1.0 / (1.0 / self.cov_.take(columns, axis=1) + added)
        self.cov_[:, -1] = 1.0 / (1.0 / self.cov_[:, -1] + np.bincount(actions, minlength=K))

    def columns_changed_by(self, X: Batch) -> np.ndarray | None:
        """The feature columns an update on ``X`` changes, when not all: diagonal mode and a
        sparse batch (the posterior's and the oracle's columns of the batch's features)."""
        if self.full or not isinstance(X, SparseBatch):
            return None
        return held_columns(X)

    def forget(self, memory: float, ridge: float) -> None:
        """Keep a fraction ``memory`` of the evidence: A ← λI + memory·(A − λI), b ← memory·b."""
        self.xty_ = np.asarray(self.xty_ * memory, dtype=np.float64)
        if not self.full:
            self.cov_ = 1.0 / (ridge + memory * (1.0 / self.cov_ - ridge))
            self.oracle_.forget(memory)
            return
        eye = np.eye(self.dim)
        precision = np.linalg.inv(self.cov_)
        self.cov_ = np.asarray(np.linalg.inv(ridge * eye + memory * (precision - ridge * eye)),
                               dtype=np.float64)
        self.cov_ = 0.5 * (self.cov_ + self.cov_.transpose(0, 2, 1))
        self.mean_ = np.matmul(self.cov_, self.xty_[:, :, None])[:, :, 0]

    def arrays(self) -> dict[str, np.ndarray]:
        return {"cov": self.cov_, "xty": self.xty_, "mean": self.mean_,
                **self.oracle_.arrays(prefix="oracle.")}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.cov_, self.xty_, self.mean_ = arrays["cov"], arrays["xty"], arrays["mean"]
        self.oracle_.load_arrays(arrays, prefix="oracle.")


def _grouped_rows(Z: np.ndarray, onehot: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Each action's rows of Z in batch order, padded with zero rows: (K, largest count, D)."""
    rank = np.cumsum(onehot, axis=0).take(row_starts(len(actions), onehot.shape[1]) + actions)
    groups = np.zeros((onehot.shape[1], int(rank.max()), Z.shape[1]))
    groups[actions, rank.astype(np.intp) - 1] = Z
    return groups


def woodbury_update(cov: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """(A + XᵀX)⁻¹ from A⁻¹ for each of a stack of K matrices: ``cov`` (K, D, D) symmetric,
    ``groups`` (K, n, D) the rows to add (zero rows add nothing).

    One Woodbury step, A⁻¹ − A⁻¹Xᵀ(I + XA⁻¹Xᵀ)⁻¹XA⁻¹, with the correction formed as a Gram
    matrix GᵀG (G = L⁻¹·XA⁻¹, L the Cholesky factor of the small n×n system), which numpy
    computes exactly symmetric (one triangle, mirrored), so the result stays exactly
    symmetric without a symmetrising pass. With more rows than dimensions (n > D) the same
    matrix comes from the D×D system instead, C(I + CᵀXᵀXC)⁻¹Cᵀ with A⁻¹ = CCᵀ, also as
    a Gram matrix. When either system is singular in floating point (two equal rows of
    norm² ≳ 10¹⁶: 1 + s rounds to s, and a Cholesky pivot is lost in its rounding) or the
    result is not finite, the rows are added one at a time by Sherman–Morrison instead,
    A⁻¹ ← A⁻¹ − (A⁻¹z)(A⁻¹z)ᵀ/(1 + zᵀA⁻¹z) — the same matrix in exact arithmetic, and
    feedback the model would otherwise have skipped.
    """
    n, D = groups.shape[1], cov.shape[1]
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            if n <= D:  # the usual few rows per action: the n×n system
                projected = groups @ cov  # X A⁻¹, (K, n, D); A⁻¹ is symmetric
                inner = projected @ groups.transpose(0, 2, 1)
                inner += np.eye(n)
                # (I + XA⁻¹Xᵀ)⁻¹ = L⁻ᵀL⁻¹, L its Cholesky factor: inverting L, whose condition
                # number is the root of the system's, keeps the result as accurate as a solve
                factor = np.linalg.cholesky(inner)
                gain = np.linalg.inv(factor) @ projected
                updated: np.ndarray = gain.transpose(0, 2, 1) @ gain
                np.subtract(cov, updated, out=updated)
            else:  # more rows than dimensions (a candidate batch's hundreds of slots): the
                # same matrix through the D×D system, (A + XᵀX)⁻¹ = C(I + CᵀXᵀXC)⁻¹Cᵀ with
                # A⁻¹ = CCᵀ, in O(nD² + D³) instead of O(n³)
                root = np.linalg.cholesky(cov)
                projected = groups @ root  # X C, (K, n, D)
                inner = projected.transpose(0, 2, 1) @ projected
                inner += np.eye(D)
                factor = np.linalg.cholesky(inner)
                gain = root @ np.linalg.inv(factor).transpose(0, 2, 1)  # C L⁻ᵀ
                updated = gain @ gain.transpose(0, 2, 1)
        # the system is I plus a positive semi-definite matrix, so every exact pivot Lᵢᵢ² is
        # ≥ 1; a computed one carries a rounding error of ~n·ε·(the system's diagonal), and
        # one within 10⁵ of that error (or below ½) is rounding (1 + s rounded to s)
        pivots = np.diagonal(factor, axis1=1, axis2=2) ** 2
        floor = np.maximum(0.5, _PIVOT_DIGITS * np.diagonal(inner, axis1=1, axis2=2))
        ok = bool((pivots >= floor).all()) and bool(np.isfinite(updated).all())
    except np.linalg.LinAlgError:
        ok = False
    if ok:
        return updated
    updated = cov  # cold path: one row at a time
    for r in range(groups.shape[1]):
        z = groups[:, r, :]
        Az = np.einsum("kij,kj->ki", updated, z)
        denom = 1.0 + np.einsum("ki,ki->k", z, Az)
        updated = updated - Az[:, :, None] * Az[:, None, :] / denom[:, None, None]
    return np.asarray(0.5 * (updated + updated.transpose(0, 2, 1)))  # exactly symmetric


def _square(X: Batch) -> Batch:
    if isinstance(X, SparseBatch):
        return SparseBatch(X.indptr, X.indices, X.values ** 2, X.n_features)
    return X * X


class _RidgeLearner(Learner):
    @classmethod
    def _default_exploration(cls) -> Exploration:
        return default_exploration()

    def __init__(self, n_actions: int, n_features: int, exploration: Exploration | None,
                 ridge: float, full_max_features: int, seed: int, drift_memory: float) -> None:
        super().__init__(n_actions, n_features, exploration, seed)
        name = type(self).__name__
        self.ridge = check_float(name, "ridge", ridge, 0.0, 1e6)
        self.full_max_features = check_int(name, "full_max_features", full_max_features, low=1)
        self.posterior_ = RidgePosterior(self.n_actions, self.n_features, self.ridge,
                                         self.full_max_features)
        self.drift_memory = check_float(name, "drift_memory", drift_memory, 0.0, 1.0, low_open=False)
        self.drift_seen_ = np.zeros(1)
        self._guarded_columns: np.ndarray | None = None  # set by _snapshot_for, per update

    def _predict(self, X: Batch) -> tuple[np.ndarray, np.ndarray]:
        """The posterior's means and widths for the batch (once per decide: LinTS asks three
        times, for its scores, its mode and its distribution)."""
        return self._once_per_call("predict", (X,), lambda: self.posterior_.predict(X))

    def _weights(self) -> np.ndarray:
        if not self.posterior_.full:
            return self.posterior_.oracle_.weights_
        return self.posterior_.mean_[:, :-1]

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        if new_change(self):
            self.posterior_.forget(self.drift_memory, self.ridge)
        self.posterior_.update(X, actions, rewards)

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**self.posterior_.arrays(), "drift_seen": self.drift_seen_}

    def _load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.posterior_.load_arrays(arrays)
        self.drift_seen_ = arrays["drift_seen"]

    # Diagonal mode, a sparse batch (reuters4: d = 16,384, a batch holds a few thousand
    # columns): an update changes A⁻¹ and the oracle only in the batch's columns, plus the
    # intercepts and the oracle's small totals, unless a detected change makes it forget
    # (every column). The guard then saves and checks those columns alone, in O(nnz + K)
    # rather than O(K·d) per batch: the whole state copied and checked was 2.5 ms a batch
    # at d = 2¹⁴ and grows with d (VW's default of 2¹⁸ hashed features: 16× that).
    def _snapshot_for(self, X: Batch) -> dict[str, np.ndarray]:
        forgets = self.drift_memory < 1.0 and self.drift_detections_ > self.drift_seen_[0]
        self._guarded_columns = None if forgets else self.posterior_.columns_changed_by(X)
        columns = self._guarded_columns
        if columns is None:
            return self._snapshot()
        p, o = self.posterior_, self.posterior_.oracle_
        return {"columns": columns, "cov": p.cov_.take(columns, axis=1),
                "cov_intercept": p.cov_[:, -1].copy(), "weights": o.weights_.take(columns, axis=1),
                "sq_grad": o.sq_grad_.take(columns, axis=1), "scale": o.scale_[columns],
                "intercept": o.intercept_.copy(), "intercept_sq_grad": o.intercept_sq_grad_.copy(),
                "norm_totals": o.norm_totals_.copy(), "drift_seen": self.drift_seen_.copy()}

    def _state_finite_after(self, X: Batch) -> bool:
        columns = self._guarded_columns
        if columns is None:
            return self._state_finite()
        p, o = self.posterior_, self.posterior_.oracle_
        # A⁻¹'s diagonal stays in (0, 1/λ]: a 0 is an A that overflowed (an entry of 1e200
        # squared), finite but no longer a posterior — the row is skipped like a NaN one
        cov = p.cov_.take(columns, axis=1)
        return bool((cov > 0.0).all() and (p.cov_[:, -1] > 0.0).all()) and all(
            bool(np.isfinite(a).all()) for a in (
                cov, p.cov_[:, -1], o.weights_.take(columns, axis=1),
                o.sq_grad_.take(columns, axis=1), o.scale_[columns], o.intercept_,
                o.intercept_sq_grad_, o.norm_totals_))

    # In full mode an update changes only A⁻¹, b, θ and drift_seen (the oracle is unused):
    # the guard around every update snapshots and checks those alone.
    def _snapshot(self) -> dict[str, np.ndarray]:
        if not self.posterior_.full:
            return super()._snapshot()
        p = self.posterior_  # by reference: full mode binds new arrays, never writes in place
        return {"cov": p.cov_, "xty": p.xty_, "mean": p.mean_, "drift_seen": self.drift_seen_}

    def _restore(self, saved: dict[str, np.ndarray]) -> None:
        if "columns" in saved:  # the columns _snapshot_for saved, written back in place
            p, o, columns = self.posterior_, self.posterior_.oracle_, saved["columns"]
            p.cov_[:, columns], p.cov_[:, -1] = saved["cov"], saved["cov_intercept"]
            o.weights_[:, columns], o.sq_grad_[:, columns] = saved["weights"], saved["sq_grad"]
            o.scale_[columns] = saved["scale"]
            o.intercept_[:], o.intercept_sq_grad_[:] = saved["intercept"], saved["intercept_sq_grad"]
            o.norm_totals_[:] = saved["norm_totals"]
            self.drift_seen_ = saved["drift_seen"].copy()
            return
        if not self.posterior_.full:
            super()._restore(saved)
            return
        p = self.posterior_
        p.cov_, p.xty_, p.mean_ = saved["cov"].copy(), saved["xty"].copy(), saved["mean"].copy()
        self.drift_seen_ = saved["drift_seen"].copy()

    def _state_finite(self) -> bool:
        if not self.posterior_.full:  # A⁻¹'s diagonal positive too (see _state_finite_after)
            return super()._state_finite() and bool((self.posterior_.cov_ > 0.0).all())
        p = self.posterior_
        return all(bool(np.isfinite(a).all()) for a in (p.cov_, p.xty_, p.mean_))


class LinUCB(_RidgeLearner):
    """LinUCB with per-action ridge regression: play argmax θ_a·x + α·√(xᵀA_a⁻¹x).

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        γ of the uniform mixture on top of the UCB action (default: the drift-aware
        ``default_exploration()``).
    alpha
        Width of the confidence bonus.
    ridge
        λ, the prior precision (A starts at λ·I).
    full_max_features
        Keep the full A⁻¹ while d + 1 ≤ this, its diagonal beyond.
    seed
        Seeds the exploration randomness together with each event's key.
    drift_memory
        Share of the evidence (A − λI, b) kept when the exploration detects a change
        (0: the regression restarts from its prior).

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> X, y = synthetic_stream(20_000, noise=0.05, seed=1)
    >>> round(replay(LinUCB(9, 400), X, y, batch_size=16).error_rate, 2)
    0.06
    """

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        alpha: float = 0.2,
        ridge: float = 1.0,
        full_max_features: int = 128,
        seed: int = 0,
        drift_memory: float = 0.0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, ridge, full_max_features, seed,
                         drift_memory)
        self.alpha = check_float("LinUCB", "alpha", alpha, 0.0, 1e3, low_open=False)

    def decision_scores(self, X: Batch) -> np.ndarray:
        """Upper confidence bounds θ_a·x + α·width (B, K)."""
        means, widths = self._predict(X)
        return means + self.alpha * widths


class LinTS(_RidgeLearner):
    """Linear Thompson sampling: P(a) = P(a = argmax of θ̃·x), θ̃_a ~ N(θ_a, v²A_a⁻¹).

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        γ of the uniform mixture on top of the Thompson distribution (default: the
        drift-aware ``default_exploration()``).
    scale
        v, the posterior scale.
    n_samples
        Posterior draws per event used to compute the distribution.
    ridge, full_max_features
        As in :class:`LinUCB`.
    seed
        Seeds the fixed table of normal draws and the exploration randomness.
    drift_memory
        As in :class:`LinUCB`.

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> X, y = synthetic_stream(20_000, noise=0.05, seed=1)
    >>> round(replay(LinTS(9, 400), X, y, batch_size=16).error_rate, 2)
    0.07
    """

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        scale: float = 0.1,
        n_samples: int = 64,
        ridge: float = 1.0,
        full_max_features: int = 128,
        seed: int = 0,
        drift_memory: float = 0.0,
    ) -> None:
        super().__init__(n_actions, n_features, exploration, ridge, full_max_features, seed,
                         drift_memory)
        self.scale = check_float("LinTS", "scale", scale, 0.0, 1e3)
        self.n_samples = check_int("LinTS", "n_samples", n_samples, low=1)
        self._normals = np.random.default_rng([self.seed, 0x7415]).standard_normal(
            (self.n_samples, self.n_actions))

    def decision_scores(self, X: Batch) -> np.ndarray:
        """Posterior means θ_a·x (B, K)."""
        return self._predict(X)[0]

    def thompson_probabilities(self, X: Batch, mask: np.ndarray | None = None) -> np.ndarray:
        """Share of the fixed posterior draws in which each allowed action is best (B, K)."""
        return self._once_per_call("thompson", (X, mask),
                                   lambda: self._thompson_probabilities(X, mask))

    def _thompson_probabilities(self, X: Batch, mask: np.ndarray | None) -> np.ndarray:
        means, widths = self._predict(X)
        with np.errstate(over="ignore", invalid="ignore"):  # extreme rows: argmax takes a NaN
            draws = means[:, None, :] + self.scale * widths[:, None, :] * self._normals[None, :, :]
        if mask is not None:
            draws = np.where(mask[:, None, :], draws, -np.inf)
        best = np.argmax(draws, axis=2)  # (B, S)
        B, K = means.shape
        counts = np.bincount((np.arange(B)[:, None] * K + best).ravel(), minlength=B * K)
        return counts.reshape(B, K) / self.n_samples

    def _exploit(self, X: Batch, score_matrix: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return np.asarray(np.argmax(self.thompson_probabilities(X, mask), axis=1))

    def _probabilities(
        self, X: Batch, score_matrix: np.ndarray, exploit: np.ndarray, gammas: np.ndarray,
        mask: np.ndarray | None,
    ) -> np.ndarray:
        return mix_uniform(self.thompson_probabilities(X, mask), gammas, mask)
