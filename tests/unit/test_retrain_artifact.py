"""Joint features, per-action scores, the ranker registry and immutable checksummed artifacts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamlearn.errors import ConfigError, StateError
from streamlearn.rankers.base import FitData, Ranker
from streamlearn.rankers.joint import action_scores, greedy, joint_features, rankings
from streamlearn.retrain.artifact import (
    RANKERS,
    find_artifact,
    list_artifacts,
    load_artifact,
    make_ranker,
    save_artifact,
)


def small_world(n: int = 600, d: int = 4, K: int = 3, seed: int = 0
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    a = rng.integers(0, K, n)
    theta = rng.normal(size=(K, d))
    y = (np.einsum("nd,nd->n", X, theta[a]) + 0.3 * rng.normal(size=n) > 0).astype(float)
    w = rng.uniform(1.0, 5.0, n)
    return X, a, y, w


def naive_scores(ranker: Ranker, X: np.ndarray, K: int) -> np.ndarray:
    """Reference: one joint row at a time."""
    d = X.shape[1]
    out = np.empty((len(X), K))
    for i in range(len(X)):
        for a in range(K):
            z = np.zeros(d * K)
            z[a * d:(a + 1) * d] = X[i]
            out[i, a] = ranker.score(z[None, :])[0]
    return out


def test_joint_features_put_x_in_the_block_of_its_action() -> None:
    X = np.arange(6.0).reshape(3, 2)
    Z = joint_features(X, np.array([2, 0, 1]), 3)
    assert Z.shape == (3, 6)
    np.testing.assert_array_equal(Z[0], [0, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(Z[1], [2, 3, 0, 0, 0, 0])
    np.testing.assert_array_equal(Z[2], [0, 0, 4, 5, 0, 0])
    with pytest.raises(Exception, match=r"actions in \[0, 3\)"):
        joint_features(X, np.array([0, 3, 1]), 3)


@pytest.mark.parametrize("name", ["logistic", "rocchio", "lda", "rankboost", "network"])
@pytest.mark.parametrize("d,K,B", [(4, 3, 7), (120, 10, 100)], ids=["one-call", "per-action"])
def test_action_scores_equal_the_naive_per_pair_reference(name: str, d: int, K: int,
                                                          B: int) -> None:
    """Structured fast paths (linear, thresholds) and the generic paths score like φ."""
    X, a, y, w = small_world(n=300, d=d, K=K)
    X[:, 0] = -np.abs(X[:, 0])  # thresholds below 0 too: they fire for the other actions
    ranker = make_ranker(name).fit(joint_features(X, a, K), y, sample_weight=w)
    np.testing.assert_allclose(action_scores(ranker, X[:B], K), naive_scores(ranker, X[:B], K),
                               rtol=1e-12, atol=1e-12)


def test_rankings_and_greedy_respect_the_mask() -> None:
    rng = np.random.default_rng(1)
    S = rng.normal(size=(50, 6))
    S[:, 2] = S[:, 3]  # ties: the lower action first
    mask = rng.random((50, 6)) < 0.6
    mask[:, 0] = True
    R = rankings(S, mask)
    for i in range(50):  # naive reference
        allowed = [int(j) for j in np.flatnonzero(mask[i])]
        expected = sorted(allowed, key=lambda j: (-S[i, j], j))
        assert R[i].tolist() == expected + [-1] * (6 - len(expected))
    np.testing.assert_array_equal(greedy(S, mask), R[:, 0])
    mask[3] = False
    with pytest.raises(Exception, match="row 3"):
        greedy(S, mask)


@pytest.mark.parametrize("name", sorted(RANKERS))
def test_save_load_round_trip_gives_identical_scores(name: str, tmp_path: Path) -> None:
    X, a, y, w = small_world()
    K, d = 3, X.shape[1]
    ranker = make_ranker(name).fit(joint_features(X, a, K), y, sample_weight=w)
    path = save_artifact(tmp_path, name, 7, ranker, K, d, {"note": "test"})
    assert path.name == f"{name}-v00000007"
    art = load_artifact(path)
    assert (art.name, art.version, art.n_actions, art.n_features) == (name, 7, K, d)
    assert art.meta == {"note": "test"} and type(art.ranker) is type(ranker)
    assert art.ranker.get_params() == ranker.get_params()
    np.testing.assert_array_equal(action_scores(art.ranker, X, K), action_scores(ranker, X, K))


def test_a_corrupted_artifact_is_refused(tmp_path: Path) -> None:
    X, a, y, w = small_world()
    ranker = make_ranker("rankboost").fit(joint_features(X, a, 3), y, sample_weight=w)
    path = save_artifact(tmp_path, "rankboost", 1, ranker, 3, X.shape[1])
    blob = bytearray((path / "arrays.npz").read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    (path / "arrays.npz").write_bytes(bytes(blob))
    with pytest.raises(StateError, match="corrupt or truncated"):
        load_artifact(path)


def test_artifacts_are_immutable_and_the_newest_is_found(tmp_path: Path) -> None:
    X, a, y, _ = small_world()
    ranker = make_ranker("rocchio").fit(joint_features(X, a, 3), y)
    for version in (2, 10, 1):
        save_artifact(tmp_path, "rocchio", version, ranker, 3, X.shape[1])
    with pytest.raises(StateError, match="immutable"):
        save_artifact(tmp_path, "rocchio", 10, ranker, 3, X.shape[1])
    assert [p.name for p in list_artifacts(tmp_path, "rocchio")] == [
        "rocchio-v00000001", "rocchio-v00000002", "rocchio-v00000010"]
    assert find_artifact(tmp_path, "rocchio").name == "rocchio-v00000010"
    with pytest.raises(ConfigError, match="Expected an artifact lda"):
        find_artifact(tmp_path, "lda")
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary left


@pytest.mark.parametrize("spec", ["adarank", "ndcg_boost", "streamlearn.rankers.adarank:AdaRank",
                                  "streamlearn.rankers.ndcg_boost:NDCGBoost"])
def test_rankers_that_need_queries_are_refused_with_the_reason(spec: str) -> None:
    with pytest.raises(ConfigError, match="needs qid"):
        make_ranker(spec)


@pytest.mark.parametrize("spec,match", [("nosuch", "package.module:ClassName"),
                                        ("streamlearn.nosuch:X", "importable"),
                                        ("streamlearn.errors:ConfigError", "subclass")])
def test_bad_ranker_specs_are_refused(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_ranker(spec)


class _Opaque(Ranker):
    def __init__(self) -> None:
        pass

    def _fit(self, data: FitData) -> None:
        self.lookup_ = {1: object()}

    def _score(self, X: np.ndarray) -> np.ndarray:
        return np.zeros(len(X))


def test_a_user_ranker_with_unrepresentable_state_is_refused(tmp_path: Path) -> None:
    ranker = make_ranker(f"{__name__}:_Opaque").fit(np.ones((2, 2)), [0, 1])
    with pytest.raises(ConfigError, match="'lookup_'"):
        save_artifact(tmp_path, "opaque", 1, ranker, 1, 2)
    assert list(tmp_path.iterdir()) == []


class _NoConstructor(Ranker):
    """A user ranker with no hyperparameters and no constructor of its own."""

    def _fit(self, data: FitData) -> None:
        self.w_ = data.X[data.y > 0].mean(axis=0)

    def _score(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(X @ self.w_)


def test_a_user_ranker_without_a_constructor_saves_and_loads(tmp_path: Path) -> None:
    """Its parameters were read from object's (*args, **kwargs): saving it failed ("has no
    attribute 'args'") and failed every retrain it was in (an outside-style check)."""
    X = np.random.default_rng(0).normal(size=(40, 3))
    ranker = make_ranker(f"{__name__}:_NoConstructor").fit(X, (X[:, 0] > 0).astype(float))
    assert ranker.get_params() == {}
    path = save_artifact(tmp_path, "noconstructor", 1, ranker, 1, 3)
    np.testing.assert_array_equal(load_artifact(path).ranker.score(X), ranker.score(X))


def test_an_allowed_action_scored_minus_infinity_still_ranks_before_disallowed_ones() -> None:
    """rankings/greedy share the daemon's order (engine.best_first): a disallowed action never
    appears, even when an allowed one scores −inf (argsort over −inf ties used to let it in)."""
    S = np.array([[-np.inf, 0.5, -np.inf], [-np.inf, -np.inf, 0.0]])
    mask = np.array([[False, True, True], [False, True, False]])
    assert rankings(S, mask).tolist() == [[1, 2, -1], [1, -1, -1]]
    assert greedy(S, mask).tolist() == [1, 1]
