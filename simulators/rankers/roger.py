"""``streamlearn rank roger``: Roger / n'Roger against linear SVM and logistic regression.

A binary task is built from a UCI dataset: the ``--task`` classes (comma list of
class names) are positive, all others negative. Train/test split: the dataset's
conventional test split (letter: last 4,000 rows; pendigits, optdigits: the
``.tes`` files); nursery has none, so a seeded stratified two-thirds / one-third
split is drawn. Every method is fitted on the same training rows and ranks the
same test rows; the table shows test AUC (ties ½), training AUC and fit time.

scikit-learn's ``LinearSVC`` and ``LogisticRegression`` (the optional ``bench``
extra) see features standardised by the training mean and standard deviation;
Roger scales features to [0, 1] itself.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
import orjson

from streamlearn.errors import ConfigError
from streamlearn.rankers.metrics import auc
from streamlearn.rankers.roger import NRoger, Roger

__all__ = ["DEFAULT_TASKS", "METHODS", "add_arguments", "run"]

METHODS = ("roger-linear", "roger-l1", "nroger", "linearsvc", "logreg")
DEFAULT_TASKS = {"letter": "A", "nursery": "priority", "pendigits": "4", "optdigits": "3"}
LETTER_FEATURES = ("x-box", "y-box", "width", "high", "onpix", "x-bar", "y-bar", "x2bar",
                   "y2bar", "xybar", "x2ybr", "xy2br", "x-ege", "xegvy", "y-ege", "yegvx")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``streamlearn rank roger``."""
    parser.add_argument("--dataset", required=True, choices=sorted(DEFAULT_TASKS))
    parser.add_argument("--task", default=None,
                        help="positive class name(s), comma-separated; the rest are negative "
                             "(default: letter A, nursery priority, pendigits 4, optdigits 3)")
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="where the datasets live (default: $STREAMLEARN_DATA_DIR, "
                             "../shared/datasets, then the user cache)")
    parser.add_argument("--fetch", action="store_true",
                        help="download missing data (verified by sha256) into the data dir")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma list of {', '.join(METHODS)} (default all)")
    parser.add_argument("--generations", type=int, default=60, help="ES generations (default 60)")
    parser.add_argument("--mu", type=int, default=10, help="ES parents (default 10)")
    parser.add_argument("--offspring", type=int, default=40, help="ES offspring λ (default 40)")
    parser.add_argument("--runs", type=int, default=7, help="n'Roger runs T (default 7)")
    parser.add_argument("--nroger-hypothesis", default="l1", choices=["linear", "l1"],
                        help="hypothesis of the n'Roger runs (default l1)")
    parser.add_argument("--top", type=int, default=5, help="features shown per Roger model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def _feature_names(dataset: str, d: int) -> list[str]:
    if dataset == "letter" and d == len(LETTER_FEATURES):
        return list(LETTER_FEATURES)
    if dataset == "nursery":
        from streamlearn.datasets.uci import NURSERY_ATTRIBUTES

        names = [f"{a}={v}" for a, values in NURSERY_ATTRIBUTES.items() for v in values]
        if len(names) == d:
            return names
    if dataset == "pendigits" and d == 16:
        return [f"{axis}{k}" for k in range(1, 9) for axis in ("x", "y")]
    if dataset == "optdigits" and d == 64:
        return [f"r{r}c{c}" for r in range(8) for c in range(8)]
    return [f"x{j}" for j in range(d)]


def build_task(args: argparse.Namespace) -> dict[str, Any]:
    """Load the dataset and build the binary train/test task."""
    from streamlearn.datasets import load_dataset

    ds = load_dataset(args.dataset, args.data_dir, fetch=args.fetch)
    task = args.task or DEFAULT_TASKS[args.dataset]
    wanted = [t.strip() for t in task.split(",") if t.strip()]
    unknown = [t for t in wanted if t not in ds.class_names]
    if not wanted or unknown:
        raise ConfigError(f"--task expects class names of {args.dataset} from "
                          f"{ds.class_names}. Got {task!r} instead.")
    X = np.asarray(ds.X, dtype=np.float64)
    y = np.isin(ds.y, [ds.class_names.index(t) for t in wanted]).astype(np.int64)
    if ds.test_start is not None:
        test = np.arange(len(y)) >= ds.test_start
        split = "conventional"
    else:
        rng = np.random.default_rng(args.seed)
        test = np.zeros(len(y), dtype=bool)
        for label in np.unique(ds.y):  # stratified by the original class
            rows = np.flatnonzero(ds.y == label)
            test[rng.choice(rows, size=round(len(rows) / 3), replace=False)] = True
        split = f"stratified random 2/3 train / 1/3 test (seed {args.seed})"
    return {"name": f"{args.dataset} {'+'.join(wanted)}-vs-rest", "split": split,
            "X_train": X[~test], "y_train": y[~test], "X_test": X[test], "y_test": y[test],
            "features": _feature_names(args.dataset, X.shape[1])}


def _sklearn_model(method: str, seed: int) -> Any:
    try:
        from sklearn.linear_model import LogisticRegression
        from sklearn.svm import LinearSVC
    except ImportError as exc:
        raise ConfigError(f"--methods {method} needs scikit-learn: pip install "
                          "'streamlearn[bench]' (or drop linearsvc,logreg from --methods).") from exc
    if method == "linearsvc":
        return LinearSVC(C=1.0, max_iter=10000, random_state=seed)
    return LogisticRegression(C=1.0, max_iter=5000)


def _progress(message: str) -> None:
    print(f"[roger] {message}", file=sys.stderr, flush=True)


def evaluate_roger(args: argparse.Namespace) -> dict[str, Any]:
    """Fit every method on the task; returns the JSON-ready result."""
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if not methods or bad:
        raise ConfigError(f"--methods expects a comma-separated subset of {', '.join(METHODS)}. "
                          f"Got {args.methods!r} instead.")
    task = build_task(args)
    Xtr, ytr, Xte, yte = task["X_train"], task["y_train"], task["X_test"], task["y_test"]
    _progress(f"{task['name']}: train {len(ytr)} ({ytr.mean():.1%} positive), test {len(yte)} "
              f"({yte.mean():.1%} positive); split {task['split']}")
    es = {"mu": args.mu, "offspring": args.offspring, "generations": args.generations}
    mean, std = Xtr.mean(axis=0), Xtr.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    rows = []
    for method in methods:
        t0 = time.perf_counter()
        explained = None
        if method.startswith("roger") or method == "nroger":
            if method == "nroger":
                model: Any = NRoger(n_runs=args.runs, hypothesis=args.nroger_hypothesis,
                                    seed=args.seed, **es)
            else:
                model = Roger(hypothesis=method.split("-")[1], seed=args.seed, **es)
            model.fit(Xtr, ytr)
            seconds = time.perf_counter() - t0
            train_scores, test_scores = model.score(Xtr), model.score(Xte)
            weights, centres = model.feature_weights()
            order = np.argsort(-np.abs(weights), kind="stable")[: args.top]
            explained = [{"feature": task["features"][j], "weight": float(weights[j]),
                          "centre": None if centres is None else float(centres[j])}
                         for j in order]
        else:
            model = _sklearn_model(method, args.seed)
            model.fit((Xtr - mean) / std, ytr)
            seconds = time.perf_counter() - t0
            train_scores = model.decision_function((Xtr - mean) / std)
            test_scores = model.decision_function((Xte - mean) / std)
        row = {"method": method, "test_auc": float(auc(yte, test_scores)),
               "train_auc": float(auc(ytr, train_scores)), "seconds": round(seconds, 2),
               "top_features": explained}
        rows.append(row)
        _progress(f"{method:<13} test AUC {row['test_auc']:.4f}  train AUC "
                  f"{row['train_auc']:.4f}  {seconds:.1f} s")
    return {"task": task["name"], "split": task["split"], "n_train": len(ytr),
            "n_test": len(yte), "positive_rate_train": float(ytr.mean()),
            "es": es, "nroger_runs": args.runs, "nroger_hypothesis": args.nroger_hypothesis,
            "seed": args.seed, "results": rows}


def _print_table(result: dict[str, Any]) -> None:
    print(f"{result['task']}  (train {result['n_train']}, test {result['n_test']}; "
          f"{result['split']})")
    print(f"{'method':<14}{'test AUC':>10}{'train AUC':>11}{'fit s':>8}")
    for r in result["results"]:
        print(f"{r['method']:<14}{r['test_auc']:>10.4f}{r['train_auc']:>11.4f}{r['seconds']:>8.1f}")
    for r in result["results"]:
        if r["top_features"]:
            parts = [f"{f['feature']} {f['weight']:+.3f}"
                     + ("" if f["centre"] is None else f" @ {f['centre']:.3g}")
                     for f in r["top_features"]]
            print(f"top features {r['method']}: " + ", ".join(parts))


def run(args: argparse.Namespace) -> int:
    """Entry point of ``streamlearn rank roger``."""
    result = evaluate_roger(args)
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_table(result)
    return 0
