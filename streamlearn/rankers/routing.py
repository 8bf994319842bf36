"""Classifiers for the routing problem (docs/algorithms.md §6): rank documents by relevance to a topic.

* :class:`Rocchio` — ``w = β·mean(relevant) − γ·mean(non-relevant)``, score ``⟨w, x⟩``.
* :class:`LDA` — Fisher's linear discriminant with the pooled within-class
  covariance shrunk towards ``(tr Σ / d)·I``: ``w = Σ_α⁻¹ (μ₁ − μ₀)``.
* :class:`LogisticRegression` — L2-penalised (intercept free) logistic regression
  fitted by Newton–Raphson / IRLS with step halving; the objective
  ``Σ_i s_i ℓ_i + (ridge/2)‖β‖²`` is scikit-learn's with ``C = 1/ridge``.
* :class:`Network` — ``hidden = 0``: a linear network (one logistic unit);
  ``hidden > 0``: one tanh hidden layer. Full-batch gradient descent with momentum
  on the weighted cross-entropy; early stopping on a stratified held-out third.
* :class:`LocalRegion` — "local region" screening: train the wrapped classifier
  on the ``n_top`` training documents with the highest Rocchio score; rank
  documents inside the region (Rocchio score ≥ the n_top-th training score)
  above those outside, each part ordered by its own scorer.

All are :class:`~streamlearn.rankers.base.Ranker` s on binary labels (``y > 0``).
Rocchio, LDA and logistic regression treat integer sample weights as row
multiplicities exactly; the networks merge identical rows before their seeded held-out
split, so they do too.
"""

from __future__ import annotations

import math

import numpy as np

from streamlearn.errors import ConfigError, DataError
from streamlearn.rankers.base import FitData, Ranker, check_float, check_int, merge_duplicate_rows

__all__ = ["LDA", "LocalRegion", "LogisticRegression", "Network", "Rocchio"]


def _class_weights(data: FitData) -> tuple[np.ndarray, np.ndarray, float, float]:
    positive = data.y > 0
    w_pos = np.where(positive, data.w, 0.0)
    w_neg = np.where(positive, 0.0, data.w)
    total_pos, total_neg = float(w_pos.sum()), float(w_neg.sum())
    if total_pos <= 0 or total_neg <= 0:
        raise DataError("Routing classifiers need relevant and non-relevant training rows. "
                        f"Got weight {total_pos} relevant and {total_neg} non-relevant.")
    return w_pos, w_neg, total_pos, total_neg


class Rocchio(Ranker):
    """Rocchio centroid: ``w = β·centroid(relevant) − γ·centroid(non-relevant)``.

    Parameters
    ----------
    beta, gamma : float
        Weights of the relevant and non-relevant centroids (``gamma=0``: the
        relevant centroid alone). Defaults follow the common 16:4 ratio.

    Examples
    --------
    >>> X = np.array([[1.0, 0.0], [0.8, 0.2], [0.0, 1.0]])
    >>> Rocchio(beta=1.0, gamma=0.5).fit(X, [1, 1, 0]).weights_.tolist()
    [0.9, -0.4]
    """

    binary_labels = True

    def __init__(self, beta: float = 1.0, gamma: float = 0.25) -> None:
        self.beta = beta
        self.gamma = gamma

    def _fit(self, data: FitData) -> None:
        beta = check_float("Rocchio", "beta", self.beta, 0.0, math.inf)
        gamma = check_float("Rocchio", "gamma", self.gamma, 0.0, math.inf, low_open=False)
        w_pos, w_neg, total_pos, total_neg = _class_weights(data)
        self.weights_ = beta * (w_pos @ data.X) / total_pos - gamma * (w_neg @ data.X) / total_neg

    def _score(self, X: np.ndarray) -> np.ndarray:
        result: np.ndarray = X @ self.weights_
        return result


class LDA(Ranker):
    """Linear discriminant with a shrunk pooled covariance.

    ``Σ = Σ_k Σ_{i∈k} s_i (x_i − μ_k)(x_i − μ_k)ᵀ / (W − 2)``, ``Σ_α = (1 − α)Σ + α (tr Σ / d) I``,
    ``w = Σ_α⁻¹ (μ₁ − μ₀)`` (weighted means).

    Parameters
    ----------
    shrinkage : float
        α in [0, 1]; 0 is plain LDA (singular with more features than documents).
    """

    binary_labels = True

    def __init__(self, shrinkage: float = 0.1) -> None:
        self.shrinkage = shrinkage

    def _fit(self, data: FitData) -> None:
        alpha = check_float("LDA", "shrinkage", self.shrinkage, 0.0, 1.0, low_open=False)
        w_pos, w_neg, total_pos, total_neg = _class_weights(data)
        X = data.X
        mean_pos = (w_pos @ X) / total_pos
        mean_neg = (w_neg @ X) / total_neg
        centred = X - np.where((data.y > 0)[:, None], mean_pos, mean_neg)
        dof = max(total_pos + total_neg - 2.0, 1.0)
        cov = (centred * data.w[:, None]).T @ centred / dof
        d = X.shape[1]
        shrunk = (1.0 - alpha) * cov + alpha * (np.trace(cov) / d) * np.eye(d)
        try:
            self.weights_ = np.linalg.solve(shrunk, mean_pos - mean_neg)
        except np.linalg.LinAlgError as exc:
            raise DataError(f"LDA: pooled covariance is singular with shrinkage={alpha}; "
                            "use shrinkage > 0.") from exc

    def _score(self, X: np.ndarray) -> np.ndarray:
        result: np.ndarray = X @ self.weights_
        return result


def _log_loss(margin: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-row ``−log p(y | margin)`` for y ∈ {0, 1}, computed stably."""
    return np.asarray(np.logaddexp(0.0, margin) - y * margin)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * (1.0 + np.tanh(0.5 * z))
    return out


class LogisticRegression(Ranker):
    """L2-penalised logistic regression by Newton–Raphson (IRLS).

    Minimises ``Σ_i s_i ℓ(y_i, ⟨β, x_i⟩ + b) + (ridge/2)‖β‖²``; the intercept b is
    not penalised. Each step solves ``(Xᵀ S X + ridge·I′) Δ = −g``; a step that does
    not decrease the objective is halved.

    Parameters
    ----------
    ridge : float
        L2 penalty (> 0 keeps separable data bounded); scikit-learn's ``C = 1/ridge``.
    max_iter : int
        Maximum Newton steps.
    tol : float
        Stop when the largest coordinate of a step is below ``tol``.
    """

    binary_labels = True

    def __init__(self, ridge: float = 1.0, max_iter: int = 100, tol: float = 1e-10) -> None:
        self.ridge = ridge
        self.max_iter = max_iter
        self.tol = tol

    def _objective(self, theta: np.ndarray, Xa: np.ndarray, y: np.ndarray,
                   w: np.ndarray, ridge: float) -> float:
        return float(w @ _log_loss(Xa @ theta, y) + 0.5 * ridge * theta[:-1] @ theta[:-1])

    def _fit(self, data: FitData) -> None:
        ridge = check_float("LogisticRegression", "ridge", self.ridge, 0.0, math.inf,
                            low_open=False)
        max_iter = check_int("LogisticRegression", "max_iter", self.max_iter)
        tol = check_float("LogisticRegression", "tol", self.tol, 0.0, math.inf)
        _class_weights(data)
        y = (data.y > 0).astype(np.float64)
        Xa = np.hstack([data.X, np.ones((data.X.shape[0], 1))])
        penalty = np.full(Xa.shape[1], ridge)
        penalty[-1] = 0.0
        theta = np.zeros(Xa.shape[1])
        objective = self._objective(theta, Xa, y, data.w, ridge)
        self.n_iter_ = 0
        for it in range(1, max_iter + 1):
            p = _sigmoid(Xa @ theta)
            gradient = Xa.T @ (data.w * (p - y)) + penalty * theta
            hessian = (Xa * (data.w * p * (1.0 - p))[:, None]).T @ Xa + np.diag(penalty)
            hessian[np.diag_indices_from(hessian)] += 1e-12  # guards an all-zero column
            step = np.linalg.solve(hessian, -gradient)
            size = 1.0
            while True:
                candidate = theta + size * step
                value = self._objective(candidate, Xa, y, data.w, ridge)
                if value <= objective or size < 1e-10:
                    break
                size *= 0.5
            theta, objective = candidate, value
            self.n_iter_ = it
            if np.max(np.abs(size * step)) < tol:
                break
        self.coef_, self.intercept_ = theta[:-1], float(theta[-1])

    def _score(self, X: np.ndarray) -> np.ndarray:
        result: np.ndarray = X @ self.coef_ + self.intercept_
        return result


def stratified_holdout(y: np.ndarray, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask of a held-out set: ``round(fraction·n_c)`` random rows of each class c."""
    held = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):
        rows = np.flatnonzero(y == label)
        take = round(fraction * len(rows))
        if 0 < take < len(rows):
            held[rng.choice(rows, size=take, replace=False)] = True
    return held


class Network(Ranker):
    """Linear (``hidden=0``) or one-hidden-layer (tanh) network with a logistic output.

    Inputs are standardised with the training part's weighted mean and standard
    deviation. Full-batch gradient descent with momentum minimises the weighted
    mean cross-entropy on the training part; after each epoch the loss on the
    held-out part is measured, and training stops ``patience`` epochs after its
    last improvement; the parameters of the best held-out epoch are kept.

    Parameters
    ----------
    hidden : int
        Number of hidden units; 0 for the linear network.
    learning_rate, momentum : float
        Gradient-descent step and momentum.
    max_epochs, patience : int
        Epoch budget and early-stopping patience.
    holdout : float
        Fraction of rows (stratified by class) held out for early stopping.
    seed : int
        Seed of the split and the initial weights.

    Attributes
    ----------
    best_epoch_, stopped_epoch_ : int
        The epoch whose parameters are kept, and the epoch training stopped at.
    holdout_loss_ : numpy.ndarray
        Held-out loss after each epoch.
    """

    binary_labels = True

    def __init__(self, hidden: int = 0, learning_rate: float = 0.1, momentum: float = 0.9,
                 max_epochs: int = 1000, patience: int = 50, holdout: float = 1.0 / 3.0,
                 seed: int = 0) -> None:
        self.hidden = hidden
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.max_epochs = max_epochs
        self.patience = patience
        self.holdout = holdout
        self.seed = seed

    def _forward(self, params: list[np.ndarray], X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Output margins and the hidden activations (X itself for the linear network)."""
        if self.hidden == 0:
            return X @ params[0] + params[1], X
        hidden = np.tanh(X @ params[0] + params[1])
        return hidden @ params[2] + params[3], hidden

    def _gradients(self, params: list[np.ndarray], X: np.ndarray, y: np.ndarray,
                   w: np.ndarray) -> list[np.ndarray]:
        margin, hidden = self._forward(params, X)
        delta = w * (_sigmoid(margin) - y)  # d loss / d margin, w sums to 1
        if self.hidden == 0:
            return [X.T @ delta, np.array(delta.sum())]
        back = np.outer(delta, params[2]) * (1.0 - hidden ** 2)
        return [X.T @ back, back.sum(axis=0), hidden.T @ delta, np.array(delta.sum())]

    def _fit(self, data: FitData) -> None:
        hidden = check_int("Network", "hidden", self.hidden, low=0)
        lr = check_float("Network", "learning_rate", self.learning_rate, 0.0, math.inf)
        momentum = check_float("Network", "momentum", self.momentum, 0.0, 1.0, low_open=False,
                               high_open=True)
        max_epochs = check_int("Network", "max_epochs", self.max_epochs)
        patience = check_int("Network", "patience", self.patience)
        fraction = check_float("Network", "holdout", self.holdout, 0.0, 1.0, high_open=True)
        # merging identical rows first makes the held-out split, and so the whole fit, the
        # same for integer weights as for rows repeated that many times
        data = FitData(*merge_duplicate_rows(data.X, data.y, data.w), data.groups)
        _class_weights(data)
        rng = np.random.default_rng(self.seed)
        y = (data.y > 0).astype(np.float64)
        held = stratified_holdout(y, fraction, rng)
        if not (held.any() and (~held).any()):
            raise DataError(f"Network: the held-out split is empty; got {len(y)} rows.")
        w_fit = data.w[~held] / data.w[~held].sum()
        w_held = data.w[held] / max(data.w[held].sum(), 1e-300)
        self.mean_ = w_fit @ data.X[~held]
        std = np.sqrt(w_fit @ (data.X[~held] - self.mean_) ** 2)
        self.std_ = np.where(std > 0, std, 1.0)
        Z = (data.X - self.mean_) / self.std_
        Z_fit, y_fit, Z_held, y_held = Z[~held], y[~held], Z[held], y[held]
        d = Z.shape[1]
        if hidden == 0:
            params = [np.zeros(d), np.array(0.0)]
        else:
            params = [rng.normal(0.0, 1.0 / math.sqrt(d), (d, hidden)), np.zeros(hidden),
                      rng.normal(0.0, 1.0 / math.sqrt(hidden), hidden), np.array(0.0)]
        velocity = [np.zeros_like(p) for p in params]
        best = [p.copy() for p in params]
        best_loss, self.best_epoch_ = math.inf, 0
        losses = []
        epoch = 0
        for epoch in range(1, max_epochs + 1):
            grads = self._gradients(params, Z_fit, y_fit, w_fit)
            for p, v, g in zip(params, velocity, grads, strict=True):
                v *= momentum
                v -= lr * g
                p += v
            loss = float(w_held @ _log_loss(self._forward(params, Z_held)[0], y_held))
            losses.append(loss)
            if loss < best_loss - 1e-12:
                best_loss, self.best_epoch_ = loss, epoch
                best = [p.copy() for p in params]
            elif epoch - self.best_epoch_ >= patience:
                break
        self.stopped_epoch_ = epoch
        self.holdout_loss_ = np.asarray(losses)
        self.params_ = best

    def _score(self, X: np.ndarray) -> np.ndarray:
        return self._forward(self.params_, (X - self.mean_) / self.std_)[0]


class LocalRegion(Ranker):
    """Local-region screening around a classifier.

    Parameters
    ----------
    estimator : Ranker
        The classifier trained inside the region (cloned, unfitted).
    n_top : int
        Region size: training documents with the highest Rocchio score.
    beta, gamma : float
        Parameters of the screening :class:`Rocchio`.
    """

    binary_labels = True

    def __init__(self, estimator: Ranker, n_top: int = 2000, beta: float = 1.0,
                 gamma: float = 0.25) -> None:
        self.estimator = estimator
        self.n_top = n_top
        self.beta = beta
        self.gamma = gamma

    def _fit(self, data: FitData) -> None:
        n_top = check_int("LocalRegion", "n_top", self.n_top)
        if not isinstance(self.estimator, Ranker):
            raise ConfigError(f"The 'estimator' parameter of LocalRegion must be a Ranker. "
                              f"Got {type(self.estimator).__name__} instead.")
        self.screen_ = Rocchio(self.beta, self.gamma).fit(data.X, data.y, sample_weight=data.w)
        screen = self.screen_.score(data.X)
        top = np.argsort(-screen, kind="stable")[: min(n_top, len(screen))]
        self.threshold_ = float(screen[top[-1]])
        self.model_ = self.estimator.clone().fit(data.X[top], data.y[top],
                                                 sample_weight=data.w[top])

    def _score(self, X: np.ndarray) -> np.ndarray:
        # arctan maps each scorer monotonically into an interval of width 1, so the
        # region (centred at 2) always ranks above the rest (centred at 0).
        screen = self.screen_.score(X)
        inside = screen >= self.threshold_
        result: np.ndarray = np.where(inside, 2.0 + np.arctan(self.model_.score(X)) / np.pi,
                                      np.arctan(screen) / np.pi)
        return result
