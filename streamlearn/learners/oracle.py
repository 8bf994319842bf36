"""A vectorised online regression oracle: per-output linear models with VW-style updates.

:class:`RegressionOracle` holds ``n_outputs`` linear regressors over the same
``d`` features (one per action, or one per action and bag copy), each with its
own intercept. It learns with the update Vowpal Wabbit uses by default
(``gd`` with ``--adaptive --normalized --invariant``; VW source
``vowpalwabbit/core/src/reductions/gd.cc`` and ``loss_functions.cc``):

* **adaptive** (AdaGrad, Duchi, Hazan & Singer 2011): every weight has its own
  step size 1/√Gₒⱼ, where Gₒⱼ sums the importance-weighted squared gradients
  h·g²·xⱼ² the weight has seen (the current event included);
* **normalised** (Ross, Mineiro & Langford 2013): feature j is measured in
  units of Nⱼ = max |xⱼ| seen so far, so the updates do not depend on the
  scale of a feature; when a larger |xⱼ| appears the weights of column j are
  multiplied by N_old/N_new. A global multiplier M = √(Σh / Σh·‖x‖²_N) with
  ‖x‖²_N = Σⱼ xⱼ²/Nⱼ² makes the step independent of the number of active
  features;
* **importance invariant** (Karampatziakis & Langford 2011): an event of
  importance h moves the prediction as h events of importance 1 would — for
  the squared loss the prediction after the update is
  y − (y − p)·exp(−2·η·h·s) where s = M·Σⱼ xⱼ²·rₒⱼ (plus the intercept's
  term) is the event's sensitivity, so it never overshoots the target.

The intercept of each output is a feature fixed at 1 with its own AdaGrad
accumulator (VW's constant feature), so with no signal in x every output
converges to the best constant. Two losses: ``"squared"`` (targets in [0, 1];
as in VW the prediction is clipped to that label range before the loss) and
``"logistic"`` (targets in [0, 1] read as the probability of the label +1; VW's
Lambert-W invariant update). :meth:`RegressionOracle.expected`
maps raw scores to reward estimates (identity for squared, the sigmoid for
logistic).

Batch semantics: every event of a batch is predicted with the weights of the
batch's start; the batch's squared gradients, normaliser and multiplier are
accumulated first, then each output takes one step for all its updates in the
batch. For the squared loss that step is the exact gradient flow of the
output's batch loss in the step-size metric (:func:`_flow_steps`), the
batch generalisation of VW's invariant update: the events' interactions are
solved jointly, so several events of one output cannot overshoot together and
events pulling against each other do not shrink each other's steps. For the
logistic loss each update is taken against a one-sided bound on its output's
joint sensitivity (:func:`_joint_sensitivity`). A batch of one event is exactly
VW's per-event rule (tests/unit/test_oracle.py compares it with a naive
per-event implementation and with VW). Each event may update several distinct
outputs at once (bagging updates the same action in every bag copy).

Numerics: exponents are clipped and divisions guarded, so finite inputs never
give NaN or inf; a weight whose feature has never been seen has step size 0.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(2000, 3))
>>> y = np.clip(0.5 + 0.3 * X[:, 0] - 0.2 * X[:, 2], 0, 1)
>>> oracle = RegressionOracle(1, 3)
>>> for lo in range(0, 2000, 10):
...     rows = slice(lo, lo + 10)
...     oracle.update(X[rows], np.zeros((10, 1), int), y[rows, None], np.ones((10, 1)))
>>> mse = float(np.mean((oracle.predict(X)[:, 0] - y) ** 2))
>>> round(mse / float(np.var(y)), 2)  # share of the variance left unexplained
0.08
"""

from __future__ import annotations

import math

import numpy as np

from streamlearn.errors import ConfigError
from streamlearn.features import (
    Batch,
    SparseBatch,
    held_columns_and_local,
    row_starts,
    scores,
    take_rows,
)

__all__ = ["LOSSES", "RegressionOracle", "invariant_step", "lambert_wexpmx"]

LOSSES = ("squared", "logistic")
_EXP_CLIP = 50.0  # exp(±50) is far inside float64; larger margins change nothing measurable
_EIGH_SAFE = 1e100  # blocks with larger entries (or NaN) are rescaled before the eigendecomposition
_NULL_EIGENVALUE = 1e-13  # relative to a block's largest eigenvalue: below it, eigh's rounding noise
_SMALL_STEP = 1e-6  # below this η·h·s, VW uses the first-order Taylor step (no cancellation)


def lambert_wexpmx(x: np.ndarray) -> np.ndarray:
    """W(exp(x)) − x for the Lambert W function (VW's approximation, absolute error < 9e-5).

    >>> float(np.round(lambert_wexpmx(np.array([0.0]))[0], 3))  # W(1) = 0.567...
    0.567
    """
    x = np.asarray(x, dtype=np.float64)
    big = x >= 1.0
    w = np.where(big, 0.86 * x + 0.01, np.exp(np.minimum(0.8 * x - 0.65, _EXP_CLIP)))
    r = np.where(big, x - np.log(np.maximum(w, 1e-300)) - w, 0.2 * x + 0.65 - w)
    t = 1.0 + w
    u = 2.0 * t * (t + 2.0 * r / 3.0)
    return np.asarray(w * (1.0 + r / t * (u - r) / (u - 2.0 * r)) - x)


def invariant_step(loss: str, pred: np.ndarray, target: np.ndarray, scale: np.ndarray,
                   sensitivity: np.ndarray) -> np.ndarray:
    """The importance-invariant step u (VW's ``get_update``): the weights move by u·(rate·x).

    ``scale`` is η·h, ``sensitivity`` s = M·Σ xⱼ²·rⱼ; the prediction moves by u·s.
    """
    small = scale * sensitivity < _SMALL_STEP
    safe_s = np.where(small, 1.0, sensitivity)
    if loss == "squared":
        taylor = 2.0 * (target - pred) * scale
        exact = (target - pred) * -np.expm1(-2.0 * scale * safe_s) / safe_s
        return np.asarray(np.where(small, taylor, exact))
    # logistic: target t ∈ [0, 1] mixes the updates for the labels +1 and −1
    step = np.zeros_like(pred)
    for label, weight in ((1.0, target), (-1.0, 1.0 - target)):
        margin = np.clip(label * pred, -_EXP_CLIP, _EXP_CLIP)
        d = np.exp(margin)
        taylor = label * scale / (1.0 + d)
        x = scale * safe_s + margin + d
        exact = -(label * lambert_wexpmx(x) + margin * label) / safe_s
        step += weight * np.where(small, taylor, exact)
    return step


def _loss_gradient(loss: str, pred: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dℓ/dp, whether the loss is positive); VW's squared loss is (p − y)² clipped to [0, 1]."""
    if loss == "squared":
        return 2.0 * (pred - target), pred != target
    prob = 0.5 * (1.0 + np.tanh(0.5 * np.clip(pred, -2 * _EXP_CLIP, 2 * _EXP_CLIP)))  # σ(p)
    return prob - target, np.ones(pred.shape, dtype=bool)


def _square(X: Batch) -> Batch:
    if isinstance(X, SparseBatch):
        return SparseBatch(X.indptr, X.indices, X.values * X.values, X.n_features)
    return X * X


def _per_output_sum(values: np.ndarray, out: np.ndarray, X: Batch, n_outputs: int,
                    n_features: int) -> np.ndarray:
    """Σ_e values[e]·x_e added up per output ``out[e]``: ``coef.T @ X`` as a dense (M, d)
    array, coef (E, M) holding values[e] at (e, out[e]), for dense or sparse X."""
    if not isinstance(X, SparseBatch):
        coef = np.zeros((len(out), n_outputs))
        coef.reshape(-1)[row_starts(len(out), n_outputs) + out] = values
        return np.asarray(coef.T @ X)
    rows = X.row_ids()  # one bincount over (output, column) bins, in entry order
    return np.bincount(out[rows] * n_features + X.indices, weights=values[rows] * X.values,
                       minlength=n_outputs * n_features).reshape(n_outputs, n_features)


def _column_max_abs(X: Batch, n_features: int) -> np.ndarray:
    """max |x_ij| over the rows, per column (0 where nothing is stored)."""
    if isinstance(X, SparseBatch):
        out = np.zeros(n_features)
        np.maximum.at(out, X.indices, np.abs(X.values))
        return out
    return np.asarray(np.abs(X).max(axis=0))


def _output_blocks(out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The updates grouped by output: (index, valid), each (groups, largest group), padded."""
    order = np.argsort(out, kind="stable")
    sorted_out = out[order]
    first = np.empty(len(out), dtype=bool)
    first[0] = True
    np.not_equal(sorted_out[1:], sorted_out[:-1], out=first[1:])
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    pos = np.arange(len(out)) - starts[group]
    sizes = np.diff(starts, append=len(out))
    index = np.zeros((len(starts), int(sizes.max())), dtype=np.intp)
    index[group, pos] = order
    valid = np.arange(index.shape[1]) < sizes[:, None]
    return index, valid


def _block_gram(X: Batch, index: np.ndarray, out: np.ndarray, rate: np.ndarray,
                rate_b: np.ndarray) -> np.ndarray:
    """⟨x_e, x_f⟩_o within each output's block of updates (:func:`_output_blocks`): (G, m, m).

    Only the pairs of one output are formed (bagging's 5·K outputs would otherwise pay for
    every cross-output pair of its E = 5·B updates); padded entries hold junk the caller
    weights by 0.
    """
    dense = X.to_dense() if isinstance(X, SparseBatch) else X
    rows = dense[index]  # (G, m, d)
    group_output = out[index[:, 0]]
    return np.asarray(np.matmul(rows * rate[group_output][:, None, :], rows.transpose(0, 2, 1))
                      + rate_b[group_output][:, None, None])


def _flow_steps(block_gram: np.ndarray, index: np.ndarray, valid: np.ndarray, h: np.ndarray,
                residual: np.ndarray, rate: float) -> np.ndarray:
    """The squared loss's batch step: the exact gradient flow of each output's batch loss.

    For the updates E_o of output o (one block of :func:`_output_blocks`), with residuals
    r = p − y at the batch's start, K the block's Gram matrix ``block_gram`` (the
    step-size metric times the multiplier) and
    H = diag(h), the flow of ½·Σ h_e·(p_e − y_e)² in that metric for time η gives
    r(1) = exp(−2η·K·H)·r, reached by the step coefficients
    st = −2η·H^½·φ(S)·H^½·r with S = 2η·H^½·K·H^½ and φ(λ) = (1 − e^{−λ})/λ, so that
    Δp = K·st. One eigendecomposition per output (padded, batched) evaluates φ(S).
    A single event gets VW's invariant step exactly (S is the scalar 2η·h·s); n identical
    events move the output like one event of importance n; orthogonal events, and events
    of different outputs, move as if alone; the flow never overshoots a target jointly.
    ``rate`` is 2η. Returns st (E,), with Δp = K · st within each output.
    """
    root = np.sqrt(h)[index] * valid  # (G, m); padding has weight 0 and so gets no step
    with np.errstate(over="ignore", invalid="ignore"):
        sym = block_gram * (rate * root[:, :, None] * root[:, None, :])
        largest = float(np.abs(sym).max())
        if largest < _EIGH_SAFE and index.shape[1] == 1:  # every output updated once: VW's step
            lam, Q = sym[:, :, 0], np.ones_like(sym)
        elif largest < _EIGH_SAFE:
            lam, Q = np.linalg.eigh(sym)
        else:  # extreme but finite rows: each block is decomposed at its own scale
            sym = np.nan_to_num(sym, nan=0.0, posinf=np.finfo(float).max, neginf=-np.finfo(float).max)
            scale = np.abs(sym).max(axis=(1, 2))
            scale = np.where(scale > 0.0, scale, 1.0)
            lam, Q = np.linalg.eigh(sym / scale[:, None, None])
            lam = lam * scale[:, None]
    # eigenvalues within eigh's rounding of 0 are 0: S's exact null directions move no weight
    # and change no prediction, but a rounding-size λ there would scale a step by φ ≈ 1
    lam = np.where(lam > _NULL_EIGENVALUE * lam[:, -1:], lam, 0.0)
    small = lam < 1e-12
    phi = np.where(lam > 0.0, -np.expm1(-lam) / np.where(small, 1.0, lam), 0.0)
    phi = np.where(small & (lam > 0.0), 1.0 - 0.5 * lam, phi)
    r = root * residual[index]
    coef = np.matmul(Q, (phi * np.matmul(r[:, None, :], Q)[:, 0, :])[:, :, None])[:, :, 0]
    steps = np.empty(len(h))
    steps[index[valid]] = (-rate * root * coef)[valid]
    return steps


def _joint_sensitivity(block_gram: np.ndarray, index: np.ndarray, valid: np.ndarray,
                       direction: np.ndarray) -> np.ndarray:
    """The logistic loss's batch bound: each update's sensitivity, counting the batch's
    other updates of the same output that push the same way.

    Update f of output o moves o's prediction on update e by u_f·⟨x_f, x_e⟩_o (``block_gram``,
    per output as from :func:`_block_gram`); ``direction`` is the sign of each update's step
    (towards its target). Only the updates with direction_e·direction_f·⟨x_e, x_f⟩_o > 0 can
    make the summed steps overshoot e's target, so each step is taken against
    S_e = Σ_f max(0, direction_e·direction_f·⟨x_e, x_f⟩_o) over the batch's updates of o
    (a one-sided Gershgorin bound on the batch's joint sensitivity) instead of its own
    ⟨x_e, x_e⟩_o: n identical events move o exactly like one event of n times the
    importance, orthogonal events — and events pulling against each other — move it as
    if alone, and a batch of one event takes VW's own step. Returns S (E,).
    """
    sign = direction[index] * valid  # (G, m); padding pushes nowhere
    toward = block_gram * sign[:, :, None] * sign[:, None, :]
    sums = np.where(toward > 0.0, toward, 0.0).sum(axis=2)
    joint = np.empty(len(direction))
    joint[index[valid]] = sums[valid]
    return joint


class RegressionOracle:
    """Per-output online linear regression with adaptive, normalised, invariant updates.

    Parameters
    ----------
    n_outputs
        Number of regressors (e.g. K actions, or N·K for N bag copies).
    n_features
        Feature dimension d (the intercept is separate).
    loss
        ``"squared"`` or ``"logistic"``.
    learning_rate
        η, VW's ``-l`` (default 0.5, VW's default).
    owner
        Class name used in validation messages.

    The learned state is plain arrays (see :meth:`arrays`).
    """

    def __init__(self, n_outputs: int, n_features: int, loss: str = "squared",
                 learning_rate: float = 0.5, owner: str = "RegressionOracle",
                 initial: float = 0.0) -> None:
        if loss not in LOSSES:
            raise ConfigError(
                f"The 'loss' parameter of {owner} must be one of {list(LOSSES)}. Got {loss!r} instead.")
        ok = isinstance(learning_rate, (int, float, np.floating)) and not isinstance(learning_rate, bool)
        if not ok or not (math.isfinite(float(learning_rate)) and 0.0 < float(learning_rate) <= 10.0):
            raise ConfigError(f"The 'lr' parameter of {owner} must be a float in (0, 10.0]. "
                              f"Got {learning_rate!r} instead.")
        ok = isinstance(initial, (int, float, np.floating)) and not isinstance(initial, bool)
        if not ok or not 0.0 <= float(initial) <= 1.0:
            raise ConfigError(f"The 'initial' parameter of {owner} must be a float in [0, 1]. "
                              f"Got {initial!r} instead.")
        self.initial = float(initial)
        self.n_outputs = int(n_outputs)
        self.n_features = int(n_features)
        self.loss = loss
        self.learning_rate = float(learning_rate)
        self.weights_ = np.zeros((self.n_outputs, self.n_features))
        self.intercept_ = np.full(self.n_outputs, float(initial))
        self.sq_grad_ = np.zeros((self.n_outputs, self.n_features))  # AdaGrad G per weight
        self.intercept_sq_grad_ = np.zeros(self.n_outputs)
        self.scale_ = np.zeros(self.n_features)  # N_j = max |x_j| seen in an update
        # [Σ h, Σ h·‖x‖²_N] over every applied (event, output): the normalised multiplier's ratio
        self.norm_totals_ = np.zeros(2)

    # ------------------------------------------------------------------ predict
    def predict(self, X: Batch) -> np.ndarray:
        """Raw scores (B, n_outputs): ``X @ W.T + b`` (logits for the logistic loss)."""
        return np.asarray(scores(self.weights_, X) + self.intercept_)

    def expected(self, raw: np.ndarray) -> np.ndarray:
        """Reward estimates from raw scores: identity (squared) or the sigmoid (logistic)."""
        if self.loss == "squared":
            return raw
        return np.asarray(0.5 * (1.0 + np.tanh(0.5 * np.clip(raw, -2 * _EXP_CLIP, 2 * _EXP_CLIP))))

    # ------------------------------------------------------------------- update
    def update(self, X: Batch, outputs: np.ndarray, targets: np.ndarray, importance: np.ndarray) -> None:
        """Learn from a batch: event i moves outputs[i, j] towards targets[i, j] with weight importance[i, j].

        ``outputs``, ``targets`` and ``importance`` have shape (B, J); the J outputs of an
        event must be distinct. Entries with importance 0 are ignored.
        """
        B, J = outputs.shape
        if B == 0:
            return
        rows = np.arange(B) if J == 1 else np.repeat(np.arange(B), J)
        out = outputs.reshape(-1)
        h = importance.reshape(-1).astype(np.float64)
        y = targets.reshape(-1).astype(np.float64)
        pred = self.predict(X).take(rows * self.n_outputs + out)  # flat (row, output) entries
        if self.loss == "squared":  # VW predicts, and learns from, the score clipped to the label range
            pred = np.clip(pred, 0.0, 1.0)
        grad, positive = _loss_gradient(self.loss, pred, y)
        active = positive & (h > 0.0) & (grad != 0.0)
        if active.all():  # the usual case: every event updates its output, X is used as it is
            Xa = X if J == 1 else take_rows(X, rows)
        elif not active.any():
            return
        else:
            rows, out, h, y, pred, grad = (a[active] for a in (rows, out, h, y, pred, grad))
            Xa = take_rows(X, rows)  # one row per (event, output) update
        if isinstance(Xa, SparseBatch):
            # only the columns present in the batch change: solve the update on those columns
            cols, local = held_columns_and_local(Xa)
            Xc = SparseBatch(Xa.indptr, local, Xa.values, len(cols))
            W, G, N = (self.weights_.take(cols, axis=1), self.sq_grad_.take(cols, axis=1),
                       self.scale_[cols])
            W, G, N = self._apply(Xc, out, h, y, pred, grad, W, G, N)
            self.weights_[:, cols], self.sq_grad_[:, cols], self.scale_[cols] = W, G, N
        else:
            self.weights_, self.sq_grad_, self.scale_ = self._apply(
                Xa, out, h, y, pred, grad, self.weights_, self.sq_grad_, self.scale_)

    def _apply(self, X: Batch, out: np.ndarray, h: np.ndarray, y: np.ndarray, pred: np.ndarray,
               grad: np.ndarray, W: np.ndarray, G: np.ndarray, N: np.ndarray,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The update on the columns of X: row e of X is the features of update e (output out[e])."""
        d = X.shape[1]
        M = self.n_outputs
        # normaliser: a new largest |x_j| rescales column j (as if the new scale had been the old one)
        new_N = np.maximum(N, _column_max_abs(X, d))
        grown = (new_N > N) & (N > 0.0)
        if grown.any():
            W = W.copy()
            W[:, grown] *= N[grown] / new_N[grown]
        # AdaGrad accumulators, this batch's gradients included
        sq_grads = h * grad * grad
        X2 = _square(X)
        G = G + _per_output_sum(sq_grads, out, X2, M, d)
        self.intercept_sq_grad_ += np.bincount(out, weights=sq_grads, minlength=M)
        scale2 = new_N * new_N
        inv_scale2 = np.divide(1.0, scale2, out=np.zeros(d), where=scale2 > 0.0)
        norm_x = scores(inv_scale2[None, :], X2)[:, 0] + 1.0  # ‖x‖²_N plus the intercept's 1
        self.norm_totals_ += (h.sum(), float(np.dot(h, norm_x)))
        multiplier = math.sqrt(self.norm_totals_[0] / self.norm_totals_[1])
        denom = np.sqrt(G) * new_N
        rate = np.divide(1.0, denom, out=np.zeros_like(denom), where=denom > 0.0)
        isg = self.intercept_sq_grad_
        rate_b = np.divide(1.0, np.sqrt(isg), out=np.zeros_like(isg), where=isg > 0.0)
        index, valid = _output_blocks(out)
        blocks = multiplier * _block_gram(X, index, out, rate, rate_b)
        if self.loss == "squared":
            step = multiplier * _flow_steps(blocks, index, valid, h, pred - y, 2.0 * self.learning_rate)
        else:
            joint = _joint_sensitivity(blocks, index, valid, -np.sign(grad))
            step = multiplier * invariant_step(self.loss, pred, y, self.learning_rate * h, joint)
        W = W + rate * _per_output_sum(step, out, X, M, d)
        self.intercept_ += rate_b * np.bincount(out, weights=step, minlength=M)
        return W, G, new_N

    def forget(self, memory: float) -> None:
        """Scale the AdaGrad accumulators by ``memory`` ∈ [0, 1]: step sizes grow by 1/√memory.

        Used after a detected change, so the weights move away from the old concept quickly.
        """
        self.sq_grad_ = self.sq_grad_ * memory
        self.intercept_sq_grad_ = self.intercept_sq_grad_ * memory

    # -------------------------------------------------------------------- state
    def arrays(self, prefix: str = "") -> dict[str, np.ndarray]:
        return {f"{prefix}weights": self.weights_, f"{prefix}intercept": self.intercept_,
                f"{prefix}sq_grad": self.sq_grad_, f"{prefix}intercept_sq_grad": self.intercept_sq_grad_,
                f"{prefix}scale": self.scale_, f"{prefix}norm_totals": self.norm_totals_}

    def load_arrays(self, arrays: dict[str, np.ndarray], prefix: str = "") -> None:
        self.weights_ = arrays[f"{prefix}weights"]
        self.intercept_ = arrays[f"{prefix}intercept"]
        self.sq_grad_ = arrays[f"{prefix}sq_grad"]
        self.intercept_sq_grad_ = arrays[f"{prefix}intercept_sq_grad"]
        self.scale_ = arrays[f"{prefix}scale"]
        self.norm_totals_ = arrays[f"{prefix}norm_totals"]
