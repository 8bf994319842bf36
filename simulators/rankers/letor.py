"""The LETOR 3.0 experiment: train on ``train``, select on ``vali``, report ``test``.

Protocol (LETOR 3.0 baseline page): QueryLevelNorm data; the validation set
only selects hyperparameters / numbers of rounds, by validation MAP (as most
LETOR baselines do); the test set is used for nothing but the final report.
Test metrics follow ``Eval-Score-3.0.pl`` (gain 2^rel − 1, its discount, ties by
file order, a query without relevant documents scores 0). Each algorithm's
test figures are averaged over the folds, as LETOR reports them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamlearn.commands.readable import spec_text
from streamlearn.datasets.letor import LetorData, default_letor_dir, load_fold
from streamlearn.errors import ConfigError, DataError
from streamlearn.plotting import pyplot
from streamlearn.rankers.adarank import AdaRank
from streamlearn.rankers.base import FitData, Ranker, check_float
from streamlearn.rankers.metrics import evaluate, mean_average_precision, ndcg_curve, query_groups
from streamlearn.rankers.ndcg_boost import NDCGBoost
from streamlearn.rankers.rankboost import RankBoost

__all__ = ["ALGORITHMS", "PUBLISHED", "FoldResult", "PointwiseLogistic", "add_arguments", "run",
           "run_fold"]

ALGORITHMS = ("rankboost", "adarank-map", "adarank-ndcg", "ndcgboost", "roger", "logreg")
PEERS = ("lightgbm",)
KS = (1, 3, 5, 10)
METRICS = ("NDCG@1", "NDCG@3", "NDCG@5", "NDCG@10", "MAP")

#: LETOR 3.0 OHSUMED baselines (test, mean of 5 folds) as given in the task brief; see
#: docs/rankers.md for what could and could not be verified.
PUBLISHED: dict[str, dict[str, float]] = {
    "rankboost": {"NDCG@1": 0.4632, "NDCG@3": 0.4555, "NDCG@5": 0.4494, "NDCG@10": 0.4302,
                  "MAP": 0.4411},
    "adarank-ndcg": {"NDCG@1": 0.5330, "NDCG@3": 0.4790, "NDCG@5": 0.4673, "NDCG@10": 0.4496,
                     "MAP": 0.4498},
    "adarank-map": {"NDCG@1": 0.5388, "NDCG@3": 0.4682, "NDCG@5": 0.4613, "NDCG@10": 0.4429,
                    "MAP": 0.4487},
}


@dataclass
class FoldResult:
    """One algorithm on one fold: test metrics, NDCG@1..10 curve, what vali selected."""

    fold: int
    test: dict[str, float]
    curve: list[float]
    selected: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


class PointwiseLogistic(Ranker):
    """Pointwise L2 logistic regression on ``y > 0`` by Newton steps (fallback logreg)."""

    binary_labels = True

    def __init__(self, ridge: float = 1.0, n_iter: int = 25) -> None:
        self.ridge = check_float("PointwiseLogistic", "ridge", ridge, 0.0, 1e12)
        self.n_iter = n_iter

    def _fit(self, data: FitData) -> None:
        Xa = np.hstack([data.X, np.ones((len(data.y), 1))])
        t, w = (data.y > 0).astype(float), data.w
        beta = np.zeros(Xa.shape[1])
        penalty = np.full(Xa.shape[1], self.ridge)
        penalty[-1] = 0.0
        for _ in range(self.n_iter):
            p = 1.0 / (1.0 + np.exp(-(Xa @ beta)))
            grad = Xa.T @ (w * (p - t)) + penalty * beta
            hess = (Xa * (w * p * (1 - p))[:, None]).T @ Xa + np.diag(penalty + 1e-9)
            step = np.linalg.solve(hess, grad)
            beta -= step
            if np.abs(step).max() < 1e-10:
                break
        self.coef_ = beta

    def _score(self, X: np.ndarray) -> np.ndarray:
        scores: np.ndarray = X @ self.coef_[:-1] + self.coef_[-1]
        return scores


def _report(name: str, fold: int, data: dict[str, LetorData], test_scores: np.ndarray,
            selected: dict[str, Any], started: float) -> FoldResult:
    te = data["test"]
    result = evaluate(te.y, test_scores, te.qid, KS, discount="letor")
    curve = ndcg_curve(te.y, test_scores, te.qid, 10, discount="letor").mean(axis=0)
    return FoldResult(fold, {m: result[m] for m in METRICS}, curve.tolist(), selected,
                      time.perf_counter() - started)


def _vali_map(data: dict[str, LetorData], scores: np.ndarray) -> float:
    return mean_average_precision(data["vali"].y, scores, data["vali"].qid)


def _staged(model: Any, data: dict[str, LetorData]) -> tuple[np.ndarray, dict[str, Any]]:
    """Fit a boosting ranker on train; choose its number of rounds by vali MAP."""
    tr = data["train"]
    model.fit(tr.X, tr.y, tr.qid)
    stages = model.staged_scores(data["vali"].X)
    if len(stages) == 0:
        return np.zeros(len(data["test"].y)), {"rounds": 0}
    maps = [_vali_map(data, s) for s in stages]
    best = int(np.argmax(maps))  # first maximum: the fewest rounds
    test = model.staged_scores(data["test"].X)[best]
    return test, {"rounds": best + 1, "trained_rounds": len(stages), "vali_MAP": maps[best]}


def _grid(make: Callable[[Any], Ranker], grid: Sequence[Any], data: dict[str, LetorData],
          qid: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """Fit one model per grid value on train; keep the best by vali MAP."""
    tr = data["train"]
    best: tuple[float, Any, Ranker] | None = None
    for value in grid:
        model = make(value).fit(tr.X, tr.y, tr.qid if qid else None)
        score = _vali_map(data, model.score(data["vali"].X))
        if best is None or score > best[0]:
            best = (score, value, model)
    assert best is not None
    return best[2].score(data["test"].X), {"param": best[1], "vali_MAP": best[0]}


def _logreg(value: float) -> Ranker:
    try:
        from streamlearn.rankers.routing import LogisticRegression
    except ImportError:
        return PointwiseLogistic(ridge=value)
    return LogisticRegression(ridge=value)


def _roger(hypothesis: str, seed: int) -> Ranker:
    from streamlearn.rankers.roger import Roger

    return Roger(hypothesis=hypothesis, seed=seed)


def _lightgbm(data: dict[str, LetorData], seed: int) -> tuple[np.ndarray, dict[str, Any]]:
    import lightgbm as lgb

    tr = data["train"]
    sizes = query_groups(tr.qid, len(tr.y)).sizes
    model = lgb.LGBMRanker(objective="lambdarank", n_estimators=300, learning_rate=0.05,
                           num_leaves=15, min_child_samples=20, random_state=seed, n_jobs=1,
                           deterministic=True, force_row_wise=True, verbose=-1)
    model.fit(tr.X, tr.y.astype(int), group=sizes)
    trees = list(range(10, 301, 10))
    maps = [_vali_map(data, np.asarray(model.predict(data["vali"].X, num_iteration=t)))
            for t in trees]
    best = int(np.argmax(maps))
    test = np.asarray(model.predict(data["test"].X, num_iteration=trees[best]))
    return test, {"trees": trees[best], "vali_MAP": maps[best]}


def available(name: str) -> bool:
    """Whether an algorithm or peer can run here (optional modules / extras)."""
    if name == "roger":
        return importlib.util.find_spec("streamlearn.rankers.roger") is not None
    if name == "lightgbm":
        return importlib.util.find_spec("lightgbm") is not None
    return name in ALGORITHMS


def run_fold(name: str, fold: int, data: dict[str, LetorData], rounds: int = 300,
             seed: int = 0) -> FoldResult:
    """Train ``name`` on one fold's train split, select on vali, report test."""
    started = time.perf_counter()
    if name == "rankboost":
        scores, sel = _staged(RankBoost(n_rounds=rounds), data)
    elif name in ("adarank-map", "adarank-ndcg"):
        scores, sel = _staged(AdaRank(n_rounds=rounds, measure=name.split("-")[1]), data)
    elif name == "ndcgboost":
        scores, sel = _staged(NDCGBoost(n_rounds=min(rounds, 150)), data)
    elif name == "logreg":
        scores, sel = _grid(_logreg, (0.01, 0.1, 1.0, 10.0, 100.0), data, qid=False)
    elif name == "roger":
        scores, sel = _grid(lambda h: _roger(h, seed), ("linear", "l1"), data, qid=False)
    elif name == "lightgbm":
        scores, sel = _lightgbm(data, seed)
    else:
        raise ConfigError(f"Unknown LETOR algorithm {name!r}; expected one of "
                          f"{', '.join(ALGORITHMS + PEERS)}.")
    return _report(name, fold, data, scores, sel, started)


def summarise(results: dict[str, list[FoldResult]]) -> dict[str, Any]:
    """JSON-ready per-algorithm means over folds, per-fold figures, published deltas."""
    out: dict[str, Any] = {}
    for name, folds in results.items():
        mean = {m: float(np.mean([f.test[m] for f in folds])) for m in METRICS}
        entry: dict[str, Any] = {
            "mean": mean,
            "curve": np.mean([f.curve for f in folds], axis=0).tolist(),
            "folds": [{"fold": f.fold, "test": f.test, "selected": f.selected,
                       "seconds": round(f.seconds, 3)} for f in folds],
        }
        if name in PUBLISHED:
            entry["published"] = PUBLISHED[name]
            entry["minus_published"] = {m: mean[m] - PUBLISHED[name][m] for m in METRICS}
        out[name] = entry
    return out


def progress(message: str) -> None:
    print(f"[letor] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``streamlearn rank letor``."""
    parser.add_argument("dir", nargs="?", default=None, metavar="DIR",
                        help="LETOR collection folder (default: <--data-dir>/letor3-ohsumed)")
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="where the datasets live (default: $STREAMLEARN_DATA_DIR, "
                             "../shared/datasets, then the user cache)")
    parser.add_argument("--fetch", action="store_true",
                        help="LETOR cannot be downloaded automatically: the error says where "
                             "to get it")
    parser.add_argument("--algo", default="rankboost,adarank,ndcgboost,roger,logreg",
                        help="comma list of rankboost, adarank (= adarank-map,adarank-ndcg), "
                             "adarank-map, adarank-ndcg, ndcgboost, roger, logreg")
    parser.add_argument("--folds", default="1-5", help="folds, e.g. 1-5 or 1,3 (default 1-5)")
    parser.add_argument("--peers", default=None,
                        help="comma list of peers (lightgbm) or 'none'; default lightgbm "
                             "when importable")
    parser.add_argument("--rounds", type=int, default=300,
                        help="boosting rounds trained before vali selection (default 300; "
                             "NDCG_Boost at most 150)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="mean test NDCG@k curves, k=1..10 (needs matplotlib)")


def parse_folds(text: str) -> list[int]:
    folds: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            folds.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ConfigError(f"--folds expects e.g. 1-5 or 1,3. Got {text!r} instead.") from None
    if not folds or min(folds) < 1 or max(folds) > 5:
        raise ConfigError(f"--folds must name folds in 1..5. Got {text!r} instead.")
    return sorted(set(folds))


def parse_algos(text: str) -> list[str]:
    names: list[str] = []
    for item in (v.strip() for v in text.split(",") if v.strip()):
        expanded = ["adarank-map", "adarank-ndcg"] if item == "adarank" else [item]
        for name in expanded:
            if name not in ALGORITHMS:
                raise ConfigError(f"--algo expects names from rankboost, adarank, adarank-map, "
                                  f"adarank-ndcg, ndcgboost, roger, logreg. Got {item!r}.")
            if name == "roger" and not available("roger"):
                raise ConfigError("--algo roger needs streamlearn.rankers.roger, not installed.")
            names.append(name)
    if not names:
        raise ConfigError("--algo must name at least one algorithm.")
    return list(dict.fromkeys(names))


def parse_peers(text: str | None) -> list[str]:
    if text is None:
        return [p for p in PEERS if available(p)]
    items = [v.strip() for v in text.split(",") if v.strip() and v.strip() != "none"]
    for item in items:
        if item not in PEERS:
            raise ConfigError(f"--peers expects lightgbm or none. Got {item!r} instead.")
        if not available(item):
            raise ConfigError(f"--peers {item} needs the optional extra: pip install "
                              f"'streamlearn[bench]'.")
    return items


def _print_table(summary: dict[str, Any]) -> None:
    print(f"{'algorithm':<14}" + "".join(f"{m:>9}" for m in METRICS))
    for name, entry in summary.items():
        print(f"{name:<14}" + "".join(f"{entry['mean'][m]:>9.4f}" for m in METRICS))
        if "published" in entry:
            print(f"{'  LETOR 3.0':<14}" + "".join(f"{entry['published'][m]:>9.4f}"
                                                   for m in METRICS))


def _plot(summary: dict[str, Any], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, entry in summary.items():
        ax.plot(range(1, 11), entry["curve"], marker="o", label=name)
    ax.set_xlabel("k")
    ax.set_ylabel("mean test NDCG@k (LETOR 3.0 OHSUMED)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """``streamlearn rank letor``: the whole 5-fold protocol; prints a table or JSON."""
    algos = parse_algos(args.algo) + parse_peers(args.peers)
    folds = parse_folds(args.folds)
    if args.rounds < 1:
        raise ConfigError(f"--rounds must be an int >= 1. Got {args.rounds} instead.")
    root = args.dir if args.dir is not None else default_letor_dir(args.data_dir, args.fetch)
    results: dict[str, list[FoldResult]] = {name: [] for name in algos}
    for fold in folds:
        data = load_fold(root, fold)
        if any(len(d.y) == 0 for d in data.values()):
            raise DataError(f"Fold{fold} has an empty split.")
        progress(f"fold {fold}: {len(data['train'].y)} train / {len(data['vali'].y)} vali / "
                 f"{len(data['test'].y)} test rows")
        for name in algos:
            res = run_fold(name, fold, data, rounds=args.rounds, seed=args.seed)
            results[name].append(res)
            progress(f"fold {fold} {name}: {res.seconds:.1f} s, selected "
                     f"{spec_text({'name': 'by validation MAP', **res.selected})}, "
                     f"test NDCG@10 {res.test['NDCG@10']:.4f} MAP {res.test['MAP']:.4f}")
    summary = summarise(results)
    if args.plot:
        _plot(summary, args.plot)
    if args.json:
        print(json.dumps({"dir": str(root), "folds": folds, "selection": "validation MAP",
                          "metrics": "Eval-Score-3.0 conventions", "results": summary}, indent=2))
    else:
        _print_table(summary)
    return 0
