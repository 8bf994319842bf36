"""Roger and n'Roger: ROC-based evolutionary learning of ranking functions (docs/algorithms.md §6).

Roger evolves a ranking hypothesis with a (μ+λ) evolution strategy whose fitness is
the (weighted) training AUC:

* linear ``h_w(x) = ⟨w, x⟩`` or weighted-L1-to-centre ``h_{w,c}(x) = Σ_i w_i |x_i − c_i|``;
* λ offspring per generation, each from two parents chosen uniformly at random,
  uniform crossover of the genes and their step sizes (one shared mask);
* self-adaptive mutation ``σ′_i = σ_i exp(τ′N + τN_i)``, ``x′_i = x_i + σ′_i N′_i`` with
  ``τ′ = 1/√(2n)`` and ``τ = 1/√(2√n)`` (n = number of genes);
* deterministic selection of the best μ of parents + offspring (ties → parents first).

Features are scaled once to ``[0, 1]`` by the training minimum and range, so the
evolved weights are comparable across features (:meth:`Roger.feature_weights`);
centres are reported in the original units. n'Roger runs T independent Rogers,
maps each run's scores to the run's (weighted) training mid-rank fraction and
ranks by the median over runs.

Sample weights act as multiplicities: identical ``(x, y)`` rows are merged with
summed weights before the search, and the AUC is computed in exact arithmetic for
integer weights, so a fit with integer weights equals the fit on repeated rows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streamlearn.errors import ConfigError, DataError
from streamlearn.rankers.base import (
    FitData,
    Ranker,
    check_choice,
    check_float,
    check_int,
    merge_duplicate_rows,
)
from streamlearn.rankers.metrics import auc

__all__ = [
    "NRoger",
    "Roger",
    "learning_rates",
    "mutate_step_sizes",
    "select_best",
]

HYPOTHESES = ("linear", "l1")
_CHUNK_ELEMENTS = 1 << 22  # bound on the (n, individuals, d) temporary of the L1 hypothesis


def learning_rates(n_genes: int) -> tuple[float, float]:
    """The self-adaptation rates ``(τ′, τ) = (1/√(2n), 1/√(2√n))``."""
    return 1.0 / math.sqrt(2.0 * n_genes), 1.0 / math.sqrt(2.0 * math.sqrt(n_genes))


def mutate_step_sizes(sigma: np.ndarray, global_normal: np.ndarray, gene_normals: np.ndarray,
                      sigma_min: float = 0.0) -> np.ndarray:
    """``σ′ = max(σ exp(τ′N + τN_i), σ_min)``; one N per individual (row), N_i per gene."""
    tau_global, tau_gene = learning_rates(sigma.shape[-1])
    mutated = sigma * np.exp(tau_global * global_normal.reshape(-1, 1) + tau_gene * gene_normals)
    return np.asarray(np.maximum(mutated, sigma_min))


def select_best(fitness: np.ndarray, mu: int) -> np.ndarray:
    """Indices of the ``mu`` largest fitness values, best first; ties keep the earlier index."""
    return np.argsort(-np.asarray(fitness), kind="stable")[:mu]


def _compress(x: np.ndarray, y: np.ndarray,
              weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge identical ``(x, y)`` rows (``y`` as a positive flag), summing their weights."""
    unique_x, unique_y, merged = merge_duplicate_rows(x, y, weight)
    return unique_x, unique_y > 0.5, merged


def _check_fitted(ranker: Ranker) -> None:
    if not hasattr(ranker, "n_features_in_"):
        raise ConfigError(f"This {type(ranker).__name__} is not fitted yet; call fit first.")


class Roger(Ranker):
    """ROC-based evolutionary ranker: (μ+λ)-ES maximising the training AUC.

    Parameters
    ----------
    hypothesis : {"linear", "l1"}
        ``⟨w, x⟩`` or ``Σ_i w_i |x_i − c_i|`` (on features scaled to [0, 1]).
    mu : int
        Number of parents kept each generation.
    offspring : int
        λ, offspring created each generation.
    generations : int
        Number of generations.
    sigma0 : float
        Initial mutation step size of every gene.
    sigma_min : float
        Lower bound on step sizes.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Examples
    --------
    >>> rng = np.random.default_rng(1)
    >>> X = rng.normal(size=(200, 3)); y = (X[:, 0] - X[:, 2] > 0).astype(int)
    >>> model = Roger(generations=30, seed=0).fit(X, y)
    >>> round(auc(y, model.score(X)), 2)
    1.0
    """

    def __init__(self, hypothesis: str = "linear", mu: int = 10, offspring: int = 40,
                 generations: int = 60, sigma0: float = 0.3, sigma_min: float = 1e-6,
                 seed: int = 0) -> None:
        self.hypothesis = hypothesis
        self.mu = mu
        self.offspring = offspring
        self.generations = generations
        self.sigma0 = sigma0
        self.sigma_min = sigma_min
        self.seed = seed

    binary_labels = True

    def _check_params(self) -> None:
        check_choice("Roger", "hypothesis", self.hypothesis, HYPOTHESES)
        check_int("Roger", "mu", self.mu)
        check_int("Roger", "offspring", self.offspring)
        check_int("Roger", "generations", self.generations, low=0)
        check_float("Roger", "sigma0", self.sigma0, 0.0, math.inf)
        check_float("Roger", "sigma_min", self.sigma_min, 0.0, math.inf, low_open=False)

    # -- fitting -------------------------------------------------------------------------
    def _fit(self, data: FitData) -> None:
        self._check_params()
        if data.groups.n_queries > 1:
            raise ConfigError("Roger ranks one bipartite set and needs qid=None or a single "
                              f"query. Got {data.groups.n_queries} queries.")
        X, weight = data.X, data.w
        if not np.any(weight > 0):
            raise DataError("Roger needs at least one row with positive sample weight.")
        support = X[weight > 0]  # zero-weight rows must not move the scaling either
        self.offset_ = support.min(axis=0)
        span = support.max(axis=0) - self.offset_
        self.scale_ = np.where(span > 0, span, 1.0)
        # Features constant on the training rows carry no signal: they keep weight 0
        # (and centre = their value) instead of a random, meaningless gene.
        active = span > 0
        if not active.any():
            raise DataError("Roger needs at least one feature that varies across the "
                            "training rows. Got only constant features.")
        xs, positive, merged = _compress((X[:, active] - self.offset_[active])
                                         / self.scale_[active], data.y > 0, weight)
        genes, fitness, history = self._evolve(xs, positive, merged)
        self.fitness_ = float(fitness)
        self.history_ = history
        n_active = int(active.sum())
        self.weights_ = np.zeros(X.shape[1])
        self.weights_[active] = genes[:n_active]
        if self.hypothesis == "l1":
            self.centres_scaled_: np.ndarray | None = np.zeros(X.shape[1])
            self.centres_scaled_[active] = genes[n_active:]
        else:
            self.centres_scaled_ = None
        train_scores = self._hypothesis(xs, genes[None, :])[:, 0]
        order = np.argsort(train_scores, kind="stable")
        self.train_scores_ = train_scores[order]
        self.train_weights_ = merged[order]

    def _hypothesis(self, xs: np.ndarray, population: np.ndarray) -> np.ndarray:
        """Scores ``(n, P)`` of every individual (row of ``population``) on scaled rows ``xs``."""
        d = xs.shape[1]
        if self.hypothesis == "linear":
            result: np.ndarray = xs @ population.T
            return result
        weights, centres = population[:, :d], population[:, d:]
        out = np.empty((xs.shape[0], population.shape[0]))
        step = max(1, _CHUNK_ELEMENTS // max(1, xs.shape[0] * d))
        for lo in range(0, population.shape[0], step):
            diff = np.abs(xs[:, None, :] - centres[None, lo:lo + step, :])
            out[:, lo:lo + step] = np.einsum("npd,pd->np", diff, weights[lo:lo + step])
        return out

    def _fitness(self, xs: np.ndarray, population: np.ndarray, positive: np.ndarray,
                 weight: np.ndarray) -> np.ndarray:
        """Training AUC of every individual: one (n, P) score matrix, one sort per column."""
        return np.atleast_1d(np.asarray(auc(positive, self._hypothesis(xs, population).T, weight)))

    def _evolve(self, xs: np.ndarray, positive: np.ndarray,
                weight: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        d = xs.shape[1]
        n_genes = d if self.hypothesis == "linear" else 2 * d
        genes = rng.standard_normal((self.mu, n_genes))
        if self.hypothesis == "l1":
            genes[:, d:] = rng.random((self.mu, d))
        sigma = np.full((self.mu, n_genes), float(self.sigma0))
        fitness = self._fitness(xs, genes, positive, weight)
        history = [float(fitness.max())]
        for _ in range(self.generations):
            mothers = rng.integers(0, self.mu, size=self.offspring)
            fathers = rng.integers(0, self.mu, size=self.offspring)
            from_mother = rng.random((self.offspring, n_genes)) < 0.5
            child = np.where(from_mother, genes[mothers], genes[fathers])
            child_sigma = np.where(from_mother, sigma[mothers], sigma[fathers])
            child_sigma = mutate_step_sizes(
                child_sigma, rng.standard_normal(self.offspring),
                rng.standard_normal((self.offspring, n_genes)), self.sigma_min)
            child = child + child_sigma * rng.standard_normal((self.offspring, n_genes))
            child_fitness = self._fitness(xs, child, positive, weight)
            pool_fitness = np.concatenate([fitness, child_fitness])
            keep = select_best(pool_fitness, self.mu)
            genes = np.concatenate([genes, child])[keep]
            sigma = np.concatenate([sigma, child_sigma])[keep]
            fitness = pool_fitness[keep]
            history.append(float(fitness[0]))
        return genes[0], float(fitness[0]), np.asarray(history)

    # -- using the model -----------------------------------------------------------------
    def _score(self, X: np.ndarray) -> np.ndarray:
        xs = (X - self.offset_) / self.scale_
        genes = self.weights_ if self.centres_scaled_ is None else np.concatenate(
            [self.weights_, self.centres_scaled_])
        return self._hypothesis(xs, genes[None, :])[:, 0]

    def rank_normalise(self, scores: np.ndarray) -> np.ndarray:
        """Map scores to the weighted training mid-rank fraction ``(W(<s) + ½W(=s)) / W``."""
        cum = np.concatenate([[0.0], np.cumsum(self.train_weights_)])
        below = cum[np.searchsorted(self.train_scores_, scores, side="left")]
        upto = cum[np.searchsorted(self.train_scores_, scores, side="right")]
        result: np.ndarray = (below + 0.5 * (upto - below)) / cum[-1]
        return result

    def feature_weights(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-feature weights (on [0, 1]-scaled features, unit L1 norm) and centres.

        Centres are in the original feature units (``None`` for the linear
        hypothesis), in a canonical form: on the training range ``[min, max]`` a
        centre below the range acts like ``min`` and one above it like ``max`` with
        the weight's sign flipped (``w|x − c| = −w|x − min| + const`` for ``c ≥ max``),
        so such centres are reported as ``min`` with the matching weight sign. Every
        run then describes a monotone feature effect the same way, which makes the
        n'Roger medians meaningful; the ranking of training rows is unchanged.
        """
        _check_fitted(self)
        weights = self.weights_.copy()
        centres = None
        if self.centres_scaled_ is not None:
            above = self.centres_scaled_ >= 1.0
            weights[above] = -weights[above]
            centres = np.where(above, 0.0, np.clip(self.centres_scaled_, 0.0, 1.0))
            centres = self.offset_ + centres * self.scale_
        norm = np.abs(weights).sum()
        return (weights / norm if norm > 0 else weights), centres


class NRoger(Ranker):
    """n'Roger: the median of T independent Roger runs' rank-normalised scores.

    Parameters
    ----------
    n_runs : int
        T, the number of independent runs (seeds drawn from ``SeedSequence(seed)``).
    hypothesis, mu, offspring, generations, sigma0, sigma_min, seed
        As for :class:`Roger`.
    """

    def __init__(self, n_runs: int = 11, hypothesis: str = "linear", mu: int = 10,
                 offspring: int = 40, generations: int = 60, sigma0: float = 0.3,
                 sigma_min: float = 1e-6, seed: int = 0) -> None:
        self.n_runs = n_runs
        self.hypothesis = hypothesis
        self.mu = mu
        self.offspring = offspring
        self.generations = generations
        self.sigma0 = sigma0
        self.sigma_min = sigma_min
        self.seed = seed

    def run_seeds(self) -> list[int]:
        """The seed of each independent run."""
        n_runs = check_int("NRoger", "n_runs", self.n_runs)
        return [int(s) for s in np.random.SeedSequence(self.seed).generate_state(n_runs)]

    binary_labels = True

    def _fit(self, data: FitData) -> None:
        params: dict[str, Any] = {k: getattr(self, k) for k in (
            "hypothesis", "mu", "offspring", "generations", "sigma0", "sigma_min")}
        runs = [Roger(seed=s, **params) for s in self.run_seeds()]
        for run in runs:
            run.n_features_in_ = data.X.shape[1]
            run._fit(data)
        self.runs_ = runs

    def _score(self, X: np.ndarray) -> np.ndarray:
        normalised = np.stack([run.rank_normalise(run._score(X)) for run in self.runs_])
        result: np.ndarray = np.median(normalised, axis=0)
        return result

    def feature_weights(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-feature medians over runs of :meth:`Roger.feature_weights`."""
        _check_fitted(self)
        pairs = [run.feature_weights() for run in self.runs_]
        weights = np.median(np.stack([w for w, _ in pairs]), axis=0)
        if pairs[0][1] is None:
            return weights, None
        return weights, np.median(np.stack([c for _, c in pairs if c is not None]), axis=0)
