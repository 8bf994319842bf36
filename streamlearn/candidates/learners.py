"""Learners over candidate sets: one shared model scores φ(context, candidate).

Every learner here decides a batch of requests with different candidate counts by
segment operations on the (N,) candidate scores — per-request argmax, inverse gap
weighting, ε-mixing and inverse-CDF sampling, with one keyed uniform per request
(:mod:`streamlearn.learners.randomness`) — and learns from the chosen rows' φ,
reward and logged propensity. What the fixed-action learners become here:

* **ε-greedy** (:class:`CandidateEpsilonGreedy`): the greedy candidate by the
  shared regression oracle gets 1 − ε, every candidate of the request ε/n.
* **SquareCB** (:class:`CandidateSquareCB`): inverse gap weighting over the
  request's candidates, p_c = 1/(n + λ_t (μ̂_best − μ̂_c)), λ_t = greediness·√(n·t)
  (Foster & Rakhlin's schedule with n the request's candidate count, t the
  number of requests seen); the best gets the rest.
* **Banditron** (:class:`CandidateBanditron`): the multiclass weight matrix W
  becomes one shared vector w over φ (the fixed-action case is φ(x, a) = x ⊗ e_a,
  where w·φ = W_a·x); ĉ = argmax w·φ(x, c) over the request's candidates, play
  c̃ ~ (1 − γ)·1[c = ĉ] + γ/n, and on feedback
  w += φ(x, c̃)·r/P(c̃) − φ(x, ĉ) — the Banditron update, whose expectation is
  the Perceptron's with the "label" being a rewarded candidate. n varies per
  request, so the uniform share is γ/n of that request.
* **LinUCB** (:class:`CandidateLinUCB`): a shared ridge posterior (A = λI + Σ φφᵀ,
  b = Σ rφ); the candidate with the largest θ·φ + α·√(φᵀA⁻¹φ) is exploited, and
  a floor ε spread over the request keeps every logged propensity positive
  (so the log is usable for off-policy evaluation and retraining).

The oracle (:class:`~streamlearn.learners.oracle.RegressionOracle` with one
output) is the same normalised, importance-invariant AdaGrad regression the
fixed-action learners use, with its intercept the best constant when nothing
else is learnable.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streamlearn.candidates.joint import joint_dim, joint_features
from streamlearn.candidates.sets import CandidateSets, segment_argmax, segment_sample
from streamlearn.candidates.slates import SlateMixture, mix_slot, slot_exploration
from streamlearn.errors import StateError
from streamlearn.learners import randomness
from streamlearn.learners.base import check_float
from streamlearn.learners.linear_posterior import woodbury_update
from streamlearn.learners.oracle import RegressionOracle

MIXTURE_SEED = 0x4D495853  # keeps the draw of who places a slot apart from the slot's own

__all__ = ["CANDIDATE_LEARNERS", "CandidateBanditron", "CandidateEpsilonGreedy", "CandidateLearner",
           "CandidateLinUCB", "CandidateSquareCB", "Decision", "SlateDecision"]


class Decision:
    """One decided batch: ``chosen`` (B,) global candidate rows, ``exploit`` (B,) the
    most probable candidate of each request, ``probs`` (N,) each candidate's
    probability, ``phi`` (N, D) the joint features."""

    __slots__ = ("chosen", "exploit", "phi", "probs")

    def __init__(self, chosen: np.ndarray, probs: np.ndarray, phi: np.ndarray,
                 exploit: np.ndarray) -> None:
        self.chosen, self.probs, self.phi, self.exploit = chosen, probs, phi, exploit

    @property
    def propensities(self) -> np.ndarray:
        return np.asarray(self.probs[self.chosen])


class SlateDecision:
    """A decided batch of slates: ``chosen`` (B, k) global rows (−1 past a request's slots),
    ``slot_probs`` (B, k) their conditional propensities, ``probs`` (N,), ``phi`` (N, D),
    ``exploit`` (B,) the most probable candidate of each request, ``gamma`` (B,) the
    learner's exploration at each request (:func:`slot_exploration` of its first-slot
    distribution) and ``served_by`` (B, k) who placed each slot (0: the learner, else the
    version of the ranker that did)."""

    __slots__ = ("chosen", "exploit", "gamma", "phi", "probs", "served_by", "slot_probs")

    def __init__(self, chosen: np.ndarray, slot_probs: np.ndarray, probs: np.ndarray,
                 phi: np.ndarray, exploit: np.ndarray, gamma: np.ndarray,
                 served_by: np.ndarray) -> None:
        self.chosen, self.slot_probs, self.probs = chosen, slot_probs, probs
        self.phi, self.exploit, self.gamma, self.served_by = phi, exploit, gamma, served_by


class CandidateLearner:
    """Shared machinery: joint features, keyed sampling, the round counter, state files."""

    drift_detections_ = 0  # the daemon's drift metric; candidate learners detect none
    n_skipped_updates_ = 0

    def __init__(self, d_x: int, d_c: int, seed: int = 0) -> None:
        self.d_x, self.d_c, self.seed = int(d_x), int(d_c), int(seed)
        self.dim = joint_dim(self.d_x, self.d_c)
        self.n_requests_ = 0

    @property
    def exploration(self) -> str:
        """A description of the exploration (the daemon's info metric)."""
        return ", ".join(f"{k}={v:g}" for k, v in self.hyperparameters().items())

    def hyperparameters(self) -> dict[str, float]:
        """The constructor keywords besides d_x, d_c and seed."""
        raise NotImplementedError

    def arrays(self) -> dict[str, np.ndarray]:
        """The learned state as arrays (names without the ``learner.`` prefix)."""
        raise NotImplementedError

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays + JSON metadata for a checkpoint (no pickle); :meth:`from_state` reverses it."""
        meta = {"class": type(self).__name__, "d_x": self.d_x, "d_c": self.d_c,
                "seed": self.seed, "n_requests": self.n_requests_,
                "hyperparameters": self.hyperparameters()}
        return {f"learner.{k}": np.array(v) for k, v in self.arrays().items()}, meta

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> CandidateLearner:
        """The learner of :meth:`state`; a StateError if it is not this class or does not fit."""
        if meta.get("class") != cls.__name__:
            raise StateError(f"Expected a {cls.__name__} state. Got {meta.get('class')!r}.")
        learner = cls(int(meta["d_x"]), int(meta["d_c"]), seed=int(meta["seed"]),
                      **meta["hyperparameters"])
        learner.n_requests_ = int(meta["n_requests"])
        loaded = {k[len("learner."):]: v for k, v in arrays.items() if k.startswith("learner.")}
        expected = learner.arrays()
        if {k: np.shape(v) for k, v in loaded.items()} != {k: np.shape(v)
                                                            for k, v in expected.items()}:
            raise StateError(f"The {cls.__name__} arrays do not fit d_x = {learner.d_x}, "
                             f"d_c = {learner.d_c}.")
        learner.load_arrays({k: np.array(v, dtype=np.float64) for k, v in loaded.items()})
        return learner

    def scores(self, phi: np.ndarray) -> np.ndarray:
        """(N,) the model's estimate of each candidate's reward."""
        raise NotImplementedError

    def ranking_scores(self, phi: np.ndarray) -> np.ndarray:
        """(N,) what the exploration distribution is built from; by default :meth:`scores`.

        A candidate's ranking score depends on its φ alone, never on the other candidates
        of its request, so slot 2 of a slate reuses slot 1's scores of the remaining ones."""
        return self.scores(phi)

    def distribution_of(self, sets: CandidateSets, ranked: np.ndarray) -> np.ndarray:
        """(N,) sampling probabilities from the ranking scores, summing to 1 within each request."""
        raise NotImplementedError

    def distribution(self, sets: CandidateSets, phi: np.ndarray) -> np.ndarray:
        """(N,) sampling probabilities, summing to 1 within each request."""
        return self.distribution_of(sets, self.ranking_scores(phi))

    def decide(self, sets: CandidateSets, keys: object = None) -> Decision:
        """Choose one candidate per request; keys (default: round numbers) seed the draws."""
        phi = joint_features(sets)
        probs = self.distribution(sets, phi)
        B = len(sets)
        rounds = np.arange(self.n_requests_, self.n_requests_ + B)
        uniforms = randomness.uniforms(self.seed, rounds if keys is None else keys)
        self.n_requests_ += B
        return Decision(segment_sample(probs, sets.offsets, uniforms), probs, phi,
                        segment_argmax(probs, sets.offsets))

    def decide_slate(self, sets: CandidateSets, slots: np.ndarray, keys: object = None,
                     mixture: SlateMixture | None = None) -> SlateDecision:
        """Fill ``slots[r]`` slots of each request, slot by slot (VW's CCB semantics): slot s
        is sampled from the learner's exploration distribution over the candidates not yet
        placed — recomputed, so slot 2 explores around the best remaining candidate — and
        its propensity is that distribution's probability of the placed candidate. Slot s
        of a request draws the keyed uniform of (key, s).

        With a ``mixture`` the rankers place their shares of the slots (:func:`mix_slot`,
        each deployed with the request's γ), who places a slot is a second keyed uniform,
        and every propensity is the mixture's."""
        phi = joint_features(sets)
        ranked = self.ranking_scores(phi)
        probs = self.distribution_of(sets, ranked)
        B = len(sets)
        slots = np.minimum(np.asarray(slots, dtype=np.int64), sets.sizes)
        rounds = np.arange(self.n_requests_, self.n_requests_ + B)
        key_list = None if keys is None else list(keys)  # type: ignore[call-overload]
        k = int(np.max(slots)) if B else 0
        chosen = np.full((B, k), -1, dtype=np.int64)
        slot_probs = np.zeros((B, k))
        served_by = np.zeros((B, k), dtype=np.int64)
        exploit = segment_argmax(probs, sets.offsets)
        gamma = slot_exploration(probs[exploit], np.ones(B, dtype=bool), sets.sizes)
        versions = np.array(mixture.versions if mixture else (), dtype=np.int64)
        free = np.ones(len(sets.items), dtype=bool)
        for s in range(k):  # a loop over slot positions, each vectorised over the requests
            active = np.flatnonzero(slots > s)
            keep = free & np.repeat(slots > s, sets.sizes)
            rows = np.flatnonzero(keep)
            sizes = np.bincount(sets.request_of[rows], minlength=B)[active]
            offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            remaining = CandidateSets(sets.context[active], sets.items[rows], offsets)
            p = probs[rows] if s == 0 else self.distribution_of(remaining, ranked[rows])
            active_keys = rounds[active] if key_list is None else \
                [key_list[i] for i in active.tolist()]
            u = randomness.uniforms(self.seed + 7919 * s, active_keys)
            mixed = p
            if mixture is not None:
                who_uniforms = randomness.uniforms(self.seed + MIXTURE_SEED + 7919 * s,
                                                   active_keys)
                p, mixed, who = mix_slot(
                    p, offsets, np.zeros(len(rows), dtype=bool),
                    [scores[rows] for scores in mixture.scores],
                    np.tile(np.asarray(mixture.shares, dtype=np.float64), (len(active), 1)),
                    gamma[active], who_uniforms)
                served_by[active, s] = np.where(who >= 0, versions[np.maximum(who, 0)], 0)
            local = segment_sample(p, offsets, u)
            chosen[active, s] = rows[local]
            slot_probs[active, s] = mixed[local]
            free[rows[local]] = False
        self.n_requests_ += B
        return SlateDecision(chosen, slot_probs, probs, phi, exploit, gamma, served_by)

    def update(self, phi: np.ndarray, rewards: np.ndarray, propensities: np.ndarray,
               exploit_phi: np.ndarray | None = None) -> None:
        """Learn from the chosen rows' φ (B, D), rewards (B,) and logged propensities (B,);
        ``exploit_phi`` (B, D): φ of each request's exploit candidate (the Banditron's
        update needs it; the others ignore it)."""
        raise NotImplementedError


def _mix_around_best(sets: CandidateSets, ranked: np.ndarray, epsilon: float) -> np.ndarray:
    """1 − ε on each request's best-ranked candidate, ε spread over all of its candidates."""
    probs = np.repeat(epsilon / sets.sizes, sets.sizes)
    probs[segment_argmax(ranked, sets.offsets)] += 1.0 - epsilon
    return probs


class _OracleLearner(CandidateLearner):
    def __init__(self, d_x: int, d_c: int, lr: float, seed: int, owner: str) -> None:
        super().__init__(d_x, d_c, seed)
        self.oracle = RegressionOracle(1, self.dim, "squared", lr, owner=owner)

    def scores(self, phi: np.ndarray) -> np.ndarray:
        return np.asarray(self.oracle.predict(phi)[:, 0])

    def arrays(self) -> dict[str, np.ndarray]:
        return self.oracle.arrays()

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.oracle.load_arrays(arrays)

    def update(self, phi: np.ndarray, rewards: np.ndarray, propensities: np.ndarray,
               exploit_phi: np.ndarray | None = None) -> None:
        B = len(rewards)
        before = {k: v.copy() for k, v in self.oracle.arrays().items()}
        self.oracle.update(phi, np.zeros((B, 1), dtype=np.int64),
                           np.asarray(rewards, dtype=np.float64).reshape(B, 1), np.ones((B, 1)))
        if not all(np.isfinite(v).all() for v in self.oracle.arrays().values()):
            self.oracle.load_arrays(before)  # a non-finite step is skipped, never applied
            self.n_skipped_updates_ += B


class CandidateEpsilonGreedy(_OracleLearner):
    """ε-greedy over a request's candidates on the shared regression oracle."""

    def __init__(self, d_x: int, d_c: int, epsilon: float = 0.05, lr: float = 0.5,
                 seed: int = 0) -> None:
        super().__init__(d_x, d_c, lr, seed, "CandidateEpsilonGreedy")
        self.lr = lr
        self.epsilon = check_float("CandidateEpsilonGreedy", "epsilon", epsilon, 0.0, 1.0,
                                   low_open=False)

    def hyperparameters(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "lr": self.lr}

    def distribution_of(self, sets: CandidateSets, ranked: np.ndarray) -> np.ndarray:
        return _mix_around_best(sets, ranked, self.epsilon)


class CandidateSquareCB(_OracleLearner):
    """SquareCB (inverse gap weighting) over a request's candidates."""

    def __init__(self, d_x: int, d_c: int, greediness: float = 1.0, lr: float = 0.5,
                 seed: int = 0) -> None:
        super().__init__(d_x, d_c, lr, seed, "CandidateSquareCB")
        self.lr = lr
        self.greediness = check_float("CandidateSquareCB", "greediness", greediness, 0.0, 1e6)

    def hyperparameters(self) -> dict[str, float]:
        return {"greediness": self.greediness, "lr": self.lr}

    def ranking_scores(self, phi: np.ndarray) -> np.ndarray:
        return np.asarray(np.clip(self.scores(phi), 0.0, 1.0))

    def distribution_of(self, sets: CandidateSets, ranked: np.ndarray) -> np.ndarray:
        mu = ranked
        best = segment_argmax(mu, sets.offsets)
        sizes = np.repeat(sets.sizes, sets.sizes).astype(np.float64)
        rounds = self.n_requests_ + 1 + sets.request_of
        lam = self.greediness * np.sqrt(sizes * rounds)
        gap = np.repeat(mu[best], sets.sizes) - mu
        probs = 1.0 / (sizes + lam * gap)
        probs[best] = 0.0
        totals = np.add.reduceat(probs, sets.offsets[:-1])
        probs[best] = 1.0 - totals
        return np.asarray(probs)


class CandidateBanditron(CandidateLearner):
    """The Banditron over candidate sets with one shared weight vector (module docstring)."""

    def __init__(self, d_x: int, d_c: int, gamma: float = 0.05, seed: int = 0) -> None:
        super().__init__(d_x, d_c, seed)
        self.gamma = check_float("CandidateBanditron", "gamma", gamma, 0.0, 0.5)
        self.weights_ = np.zeros(self.dim)

    def hyperparameters(self) -> dict[str, float]:
        return {"gamma": self.gamma}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"weights": self.weights_}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.weights_ = arrays["weights"]

    def scores(self, phi: np.ndarray) -> np.ndarray:
        return np.asarray(phi @ self.weights_)

    def distribution_of(self, sets: CandidateSets, ranked: np.ndarray) -> np.ndarray:
        return _mix_around_best(sets, ranked, self.gamma)

    def update(self, phi: np.ndarray, rewards: np.ndarray, propensities: np.ndarray,
               exploit_phi: np.ndarray | None = None) -> None:
        if exploit_phi is None:
            raise ValueError("CandidateBanditron.update needs the exploit candidates' φ.")
        gain = np.asarray(rewards, dtype=np.float64) / np.asarray(propensities, dtype=np.float64)
        step = gain @ phi - exploit_phi.sum(axis=0)
        if np.isfinite(step).all():  # a non-finite step is skipped, never applied
            self.weights_ = self.weights_ + step
        else:
            self.n_skipped_updates_ += len(phi)


class CandidateLinUCB(CandidateLearner):
    """A shared ridge posterior; the exploit candidate maximises θ·φ + α·√(φᵀA⁻¹φ)."""

    def __init__(self, d_x: int, d_c: int, alpha: float = 0.5, ridge: float = 1.0,
                 epsilon: float = 0.01, seed: int = 0) -> None:
        super().__init__(d_x, d_c, seed)
        self.alpha = check_float("CandidateLinUCB", "alpha", alpha, 0.0, 100.0, low_open=False)
        self.ridge = check_float("CandidateLinUCB", "ridge", ridge, 0.0, math.inf)
        self.epsilon = check_float("CandidateLinUCB", "epsilon", epsilon, 0.0, 1.0, low_open=False)
        self.A_inv_ = np.eye(self.dim) / self.ridge
        self.b_ = np.zeros(self.dim)

    def hyperparameters(self) -> dict[str, float]:
        return {"alpha": self.alpha, "ridge": self.ridge, "epsilon": self.epsilon}

    def arrays(self) -> dict[str, np.ndarray]:
        return {"A_inv": self.A_inv_, "b": self.b_}

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        self.A_inv_, self.b_ = arrays["A_inv"], arrays["b"]

    def scores(self, phi: np.ndarray) -> np.ndarray:
        return np.asarray(phi @ (self.A_inv_ @ self.b_))

    def ranking_scores(self, phi: np.ndarray) -> np.ndarray:
        """The upper confidence bound θ·φ + α·√(φᵀA⁻¹φ)."""
        width = np.sqrt(np.maximum(((phi @ self.A_inv_) * phi).sum(axis=1), 0.0))
        return np.asarray(self.scores(phi) + self.alpha * width)

    def distribution_of(self, sets: CandidateSets, ranked: np.ndarray) -> np.ndarray:
        return _mix_around_best(sets, ranked, self.epsilon)

    def update(self, phi: np.ndarray, rewards: np.ndarray, propensities: np.ndarray,
               exploit_phi: np.ndarray | None = None) -> None:
        # one Woodbury step for the whole batch: (A + ΦᵀΦ)⁻¹ = A⁻¹ − A⁻¹Φᵀ(I + ΦA⁻¹Φᵀ)⁻¹ΦA⁻¹
        # (row by row when that system is singular in floating point)
        A_inv = woodbury_update(self.A_inv_[None], np.asarray(phi, dtype=np.float64)[None])[0]
        b = self.b_ + phi.T @ np.asarray(rewards, dtype=np.float64)
        if np.isfinite(A_inv).all() and np.isfinite(b).all():  # a non-finite step is skipped
            self.A_inv_, self.b_ = A_inv, b
        else:
            self.n_skipped_updates_ += len(phi)


#: The candidate-set learners by the name ``--learner`` / ``candidates.learner`` take.
CANDIDATE_LEARNERS: dict[str, type[CandidateLearner]] = {
    "linucb": CandidateLinUCB, "epsilon-greedy": CandidateEpsilonGreedy,
    "squarecb": CandidateSquareCB, "banditron": CandidateBanditron,
}
