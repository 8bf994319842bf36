"""Second-order descendants of the Banditron: Newtron and SOBA.

Both learn a K×d matrix W and keep a second-order matrix A over its K·d entries.
Their update vectors are Kronecker products v ⊗ x (v ∈ R^K: which rows move),
so with the diagonal of A everything is a (K, d) array and one product per
batch; the full (K·d)×(K·d) inverse is kept while K·d ≤ ``full_max_dim`` and
updated by Sherman–Morrison/Woodbury: A⁻¹ ← A⁻¹ − A⁻¹Gᵀ(I + GA⁻¹Gᵀ)⁻¹GA⁻¹ for
the batch's rows G. Newtron takes the online Newton step incrementally,
W ← W − A⁻¹g (with the full A the same as the paper's follow-the-leader form
W = −A⁻¹b, and the one that stays stable with only the diagonal); SOBA keeps its
follow-the-leader form W = A⁻¹θ. A batch is decided
with the weights of its start and its updates are summed (A first, then W) —
Newtron's over the whole batch, SOBA's over blocks of a few rewarded events — so
a batch of one event is the per-event algorithm.

* :class:`Newtron` — Hazan & Kale (NIPS 2011): the online Newton step on the
  log-loss of p = softmax(α·Wx), played with P = (1 − γ)·p + γ/K.
* :class:`SOBA` — Beygelzimer, Orabona & Zhang (ICML 2017), the Second Order
  Banditron: ε-greedy around argmax Wx, updated only on positive feedback and
  only while a cumulative regularised margin stays non-negative.

Both are our reconstructions (docs/learners.md says what we could and could not
check against the papers' text).
"""

from __future__ import annotations

import numpy as np

from streamlearn.errors import ConfigError
from streamlearn.features import Batch, SparseBatch, add_outer, scores, take_rows
from streamlearn.learners.base import Learner, check_float, check_int, masked_argmax, mix_uniform
from streamlearn.learners.exploration import Exploration

__all__ = ["SOBA", "KroneckerCurvature", "Newtron"]


class KroneckerCurvature:
    """A = a₀·I + Σ wᵢ gᵢgᵢᵀ over the K·d entries of W, for rows gᵢ = vᵢ ⊗ xᵢ.

    ``inverse_`` is the full A⁻¹ (K·d × K·d) or, in diagonal mode, the (K, d) diagonal of A⁻¹.
    """

    def __init__(self, n_actions: int, n_features: int, initial: float, full_max_dim: int) -> None:
        self.shape = (n_actions, n_features)
        self.full = n_actions * n_features <= full_max_dim
        if self.full:
            self.inverse_ = np.eye(n_actions * n_features) / initial
        else:
            self.inverse_ = np.full(self.shape, 1.0 / initial)

    def _rows(self, V: np.ndarray, X: Batch) -> np.ndarray:
        dense = X.to_dense() if isinstance(X, SparseBatch) else X
        return np.asarray((V[:, :, None] * dense[:, None, :]).reshape(len(V), -1))

    def quad(self, V: np.ndarray, X: Batch) -> np.ndarray:
        """gᵢᵀA⁻¹gᵢ for each row (B,)."""
        if self.full:
            G = self._rows(V, X)
            return np.asarray(np.einsum("bi,bi->b", G @ self.inverse_, G))
        X2 = X.to_dense() ** 2 if isinstance(X, SparseBatch) else X * X
        return np.asarray(np.einsum("bk,bk->b", V * V, X2 @ self.inverse_.T))

    def add(self, V: np.ndarray, X: Batch, weights: np.ndarray) -> None:
        """A += Σ wᵢ gᵢgᵢᵀ (rows with weight 0 change nothing)."""
        keep = weights > 0
        if not keep.any():
            return
        V, w = V[keep], weights[keep]
        X = X.take(np.flatnonzero(keep)) if isinstance(X, SparseBatch) else X[keep]
        if self.full:
            G = self._rows(V, X) * np.sqrt(w)[:, None]
            projected = G @ self.inverse_
            inner = projected @ G.T + np.eye(len(G))
            self.inverse_ = self.inverse_ - projected.T @ np.linalg.solve(inner, projected)
            self.inverse_ = 0.5 * (self.inverse_ + self.inverse_.T)
            return
        diagonal = 1.0 / self.inverse_
        add_outer(diagonal, V * V * w[:, None], _square(X))
        self.inverse_ = 1.0 / diagonal

    def solve(self, M: np.ndarray) -> np.ndarray:
        """A⁻¹ applied to a (K, d) array."""
        if self.full:
            return np.asarray((self.inverse_ @ M.reshape(-1)).reshape(self.shape))
        return np.asarray(self.inverse_ * M)


def _square(X: Batch) -> Batch:
    if isinstance(X, SparseBatch):
        return SparseBatch(X.indptr, X.indices, X.values ** 2, X.n_features)
    return X * X


class _SecondOrderLearner(Learner):
    def __init__(self, n_actions: int, n_features: int, exploration: Exploration | None,
                 initial: float, full_max_dim: int, seed: int) -> None:
        super().__init__(n_actions, n_features, exploration, seed)  # default: Adaptive()
        name = type(self).__name__
        self.full_max_dim = check_int(name, "full_max_dim", full_max_dim, low=0)
        self.curvature_ = KroneckerCurvature(self.n_actions, self.n_features, initial, self.full_max_dim)
        self.weights_ = np.zeros((self.n_actions, self.n_features))

    def _weights(self) -> np.ndarray:
        return self.weights_

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"inverse": self.curvature_.inverse_, "weights": self.weights_}

    def _load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.curvature_.inverse_ = arrays["inverse"]
        self.weights_ = arrays["weights"]


class Newtron(_SecondOrderLearner):
    """Newtron: online Newton steps on the bandit log-loss (Hazan & Kale 2011; reconstruction).

    Decide: ŷ = argmax Wx and, with ``play="softmax"`` (the paper's policy),
    P = (1 − γ)·p + γ/A where p = softmax(α·Wx) over the allowed actions; with
    ``play="greedy"`` (our default) P = (1 − γ)·1[ŷ] + γ/A, the distribution every
    ε-greedy learner plays. The gradient estimate below is unbiased under either P
    (it only needs P(a) > 0). With c = 1/K·𝟙 (the centring that keeps the rows of W summing
    to zero) and r the reward of the played ỹ, the gradient estimate g is

    * r = 1: g = (1 − p_ỹ)/P_ỹ · (c − e_ỹ) ⊗ x, κ = P_ỹ;
    * r = 0: g = p_ỹ/P_ỹ · (e_ỹ − c) ⊗ x, κ = 1

    (a reward in (0, 1) mixes the two with weights r and 1 − r); its expectation over
    ỹ ~ P is the log-loss gradient (p − e_y) ⊗ x. The online Newton step
    A += κβ·g gᵀ, W ← W − A⁻¹g (the paper's follow-the-leader form
    b += (1 − κβ·⟨g, W⟩)·g, W = −A⁻¹b, in incremental form), with A₀ = I/D. The
    softmax of update time is used for p (the same as decision time unless
    feedback was delayed across updates).

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        Source of γ (default ``Adaptive()``, drift-aware).
    alpha
        α, the softmax scale of the log-loss.
    beta
        β, the curvature of the Newton step.
    radius
        D: A starts at I/D.
    full_max_dim
        Keep the full A⁻¹ while K·d ≤ this, its diagonal beyond.
    seed
        Seeds the exploration randomness together with each event's key.
    play
        ``"greedy"`` or ``"softmax"`` (see above). Playing the softmax keeps sampling
        from the learned label distribution: on a stream without signal its error is
        1 − Σ p_a² instead of 1 − max p_a.

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> X, y = synthetic_stream(20_000, noise=0.05, seed=1)
    >>> round(replay(Newtron(9, 400), X, y, batch_size=16).error_rate, 2)
    0.17
    """

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        alpha: float = 1.0,
        beta: float = 0.1,
        radius: float = 1.0,
        full_max_dim: int = 512,
        seed: int = 0,
        play: str = "greedy",
    ) -> None:
        if play not in ("greedy", "softmax"):
            raise ConfigError(f"The 'play' parameter of Newtron must be 'greedy' or 'softmax'. "
                              f"Got {play!r} instead.")
        self.play = play
        self.radius = check_float("Newtron", "radius", radius, 0.0, 1e6)
        super().__init__(n_actions, n_features, exploration, 1.0 / self.radius, full_max_dim, seed)
        self.alpha = check_float("Newtron", "alpha", alpha, 0.0, 1e4)
        self.beta = check_float("Newtron", "beta", beta, 0.0, 1e4)

    @staticmethod
    def _snap(score_matrix: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """Scores within 1e-9 (relative) of the best allowed one are set equal to it.

        Newtron moves every action it did not play by the same amount, so exact ties
        between actions are common; snapping makes their order independent of
        rounding (ties → lowest index, as everywhere).
        """
        allowed = np.isfinite(score_matrix) if mask is None else mask
        best = np.where(allowed, score_matrix, -np.inf).max(axis=1, keepdims=True)
        with np.errstate(over="ignore"):  # best ≈ -1e308: the tolerance overflows to -inf
            near = allowed & (score_matrix >= best - 1e-9 * (1.0 + np.abs(best)))
        return np.where(near, best, score_matrix)

    def _exploit(self, X: Batch, score_matrix: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        return masked_argmax(self._snap(score_matrix, mask), mask)

    def softmax(self, score_matrix: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        """p = softmax(α·s) over the allowed actions (0 elsewhere), computed without overflow."""
        z = self.alpha * self._snap(score_matrix, mask)
        if mask is not None:
            z = np.where(mask, z, -np.inf)
        e = np.exp(z - z.max(axis=1, keepdims=True))  # ≤ 1, and exp(−inf) = 0 outside the mask
        return np.asarray(e / e.sum(axis=1, keepdims=True))

    def _probabilities(
        self, X: Batch, score_matrix: np.ndarray, exploit: np.ndarray, gammas: np.ndarray,
        mask: np.ndarray | None,
    ) -> np.ndarray:
        if self.play == "greedy":
            return self._distribution(exploit, gammas, mask)
        return mix_uniform(self.softmax(score_matrix, mask), gammas, mask)

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        B, K = len(actions), self.n_actions
        rows = np.arange(B)
        s = scores(self.weights_, X)
        p = self.softmax(s, None)[rows, actions]
        P = probs[rows, actions]
        onehot = np.zeros((B, K))
        onehot[rows, actions] = 1.0
        centred = onehot - 1.0 / K  # e_ỹ − c
        # V: the K-vector of each gradient g = v ⊗ x, mixing the r = 1 and r = 0 estimates
        coef = self.alpha * (-rewards * (1.0 - p) + (1.0 - rewards) * p) / P
        V = coef[:, None] * centred
        kappa = rewards * P + (1.0 - rewards)
        self.curvature_.add(V, X, kappa * self.beta)
        gradient = np.zeros((K, self.n_features))
        add_outer(gradient, V, X)
        self.weights_ = self.weights_ - self.curvature_.solve(gradient)


class SOBA(_SecondOrderLearner):
    """SOBA, the Second Order Banditron (Beygelzimer, Orabona & Zhang 2017; reconstruction).

    Decide ε-greedy around ŷ = argmax Wx with the strategy's γ. On feedback with
    r > 0 for the played ỹ: ȳ = the best-scoring allowed action other than ỹ,
    g = (r/P_ỹ)·(e_ȳ − e_ỹ) ⊗ x, z = √P_ỹ·g and the regularised negative margin
    m = (⟨W, z⟩² + 2⟨W, g⟩)/(1 + zᵀA⁻¹z). The update is made (n = 1) only when the
    cumulative margin stays non-negative, M + m ≥ 0 (then M += m):
    A += n·z zᵀ, θ −= n·g, W = A⁻¹θ, with A₀ = a·I (with only the diagonal of A
    this is the diagonal version the authors' experiments use). Events with
    r = 0 never update.
    A batch's updates are applied in event order, in blocks of ``update_block``
    events: within a block the margins and runner-ups use the weights the previous
    block left, and the acceptance test runs in event order. SOBA moves only on
    rewarded events and each accepted one changes the runner-up of the next, so
    one step for a whole batch of 64 cost it 0.027 error on MNIST (mean of 5 seeds;
    blocks of 4: within 0.01 of the per-event algorithm, docs/learners.md).

    Parameters
    ----------
    n_actions, n_features
        K and d.
    exploration
        Source of γ (default ``Adaptive()``, drift-aware).
    a
        Initial regularisation: A₀ = a·I.
    full_max_dim
        Keep the full A⁻¹ while K·d ≤ this, its diagonal beyond (default 0: always
        the diagonal, which was both faster and more accurate in our runs).
    update_block
        Events per update block (1: the per-event algorithm).
    seed
        Seeds the exploration randomness together with each event's key.

    Examples
    --------
    >>> from streamlearn.datasets.synthetic import synthetic_stream
    >>> from streamlearn.replay import replay
    >>> X, y = synthetic_stream(20_000, noise=0.05, seed=1)
    >>> round(replay(SOBA(9, 400), X, y, batch_size=16).error_rate, 2)
    0.12
    """

    def __init__(
        self,
        n_actions: int,
        n_features: int,
        exploration: Exploration | None = None,
        a: float = 1.0,
        full_max_dim: int = 0,
        seed: int = 0,
        update_block: int = 4,
    ) -> None:
        self.a = check_float("SOBA", "a", a, 0.0, 1e6)
        self.update_block = check_int("SOBA", "update_block", update_block)
        super().__init__(n_actions, n_features, exploration, self.a, full_max_dim, seed)
        self.margin_ = np.zeros(1)  # the cumulative margin M ≥ 0
        self.theta_ = np.zeros((self.n_actions, self.n_features))  # θ = −Σ accepted g

    def _update(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray,
                exploit: np.ndarray) -> None:
        # only rewarded events can move SOBA: the blocks are cut from those, so a batch
        # of mostly wrong guesses costs few steps
        rewarded = np.flatnonzero(rewards > 0.0)
        for lo in range(0, len(rewarded), self.update_block):
            rows = rewarded[lo:lo + self.update_block]
            self._update_block(take_rows(X, rows), actions[rows], rewards[rows], probs[rows])

    def _update_block(self, X: Batch, actions: np.ndarray, rewards: np.ndarray, probs: np.ndarray) -> None:
        B, K = len(actions), self.n_actions
        rows = np.arange(B)
        s = scores(self.weights_, X)
        allowed = np.asarray(probs > 0.0)
        allowed[rows, actions] = False  # ȳ is the best allowed action other than ỹ
        has_other = np.asarray(allowed.any(axis=1))
        runner_up = masked_argmax(s, allowed | ~has_other[:, None])
        P = probs[rows, actions]
        V = np.zeros((B, K))
        V[rows, runner_up] += rewards / P
        V[rows, actions] -= rewards / P
        V[~has_other] = 0.0  # every event of a block was rewarded (see _update)
        vs = np.einsum("bk,bk->b", V, s)  # ⟨W, g⟩
        margins = (P * vs * vs + 2.0 * vs) / (1.0 + P * self.curvature_.quad(V, X))
        accept = self._accept(margins, np.any(V != 0.0, axis=1))
        self.curvature_.add(V, X, P * accept)  # z zᵀ = P·g gᵀ
        add_outer(self.theta_, -V * accept[:, None], X)
        self.weights_ = self.curvature_.solve(self.theta_)

    def _accept(self, margins: np.ndarray, candidate: np.ndarray) -> np.ndarray:
        """n_i in event order: accept while M + m_i ≥ 0 (M only grows by accepted margins).

        Loops once per rejected event, not per event: between rejections the running
        margin is a prefix sum.
        """
        m = np.where(candidate, margins, 0.0)
        accept = candidate.copy()
        start, total = 0, float(self.margin_[0])
        while start < len(m):
            running = total + np.cumsum(np.where(accept[start:], m[start:], 0.0))
            bad = np.flatnonzero(accept[start:] & (running < 0.0))
            if not len(bad):
                total = float(running[-1]) if len(running) else total
                break
            first = start + int(bad[0])
            accept[first] = False
            total = float(total + np.where(accept[start:first], m[start:first], 0.0).sum())
            start = first + 1
        self.margin_ = np.array([total])
        return accept.astype(np.float64)

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**super()._arrays(), "margin": self.margin_, "theta": self.theta_}

    def _load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        super()._load_arrays(arrays)
        self.margin_ = arrays["margin"]
        self.theta_ = arrays["theta"]
