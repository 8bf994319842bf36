"""``streamlearn rank routing``: routing classifiers on Reuters-21578 ModApte.

For each of the ``--topics`` most frequent topics of the ModApte training set,
every method is trained on the 9,603 training documents (relevant = the topic is
among the document's TOPICS) and ranks the 3,299 test documents; the scores are
non-interpolated average precision and precision@100 on the test ranking.

Features (title + body tokens, vocabulary = the ``--vocab`` most frequent terms
with document frequency ≥ 3 in the training set, ``(1 + ln tf)·idf`` weights,
L2-normalised documents):

* ``lsi``: the ``--dims`` leading LSI dimensions of the training tf-idf matrix
  (one SVD shared by all topics; test documents folded in);
* ``chi2``: the ``--terms`` terms with the largest χ² for the topic (per topic);
* ``full``: all vocabulary terms (meant for Rocchio; costly for the others).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from streamlearn.errors import ConfigError
from streamlearn.plotting import pyplot
from streamlearn.rankers.base import Ranker
from streamlearn.rankers.metrics import average_precision, precision_at_k
from streamlearn.rankers.routing import LDA, LocalRegion, LogisticRegression, Network, Rocchio
from streamlearn.rankers.text_features import (
    LSI,
    build_vocabulary,
    document_term_matrix,
    select_chi2,
    tfidf,
)

__all__ = ["METHODS", "add_arguments", "run"]

METHODS = ("rocchio", "lda", "logreg", "linear-net", "nnet")
FEATURES = ("lsi", "chi2", "full")


def _comma_list(value: str, allowed: tuple[str, ...], option: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    bad = [v for v in items if v not in allowed]
    if not items or bad:
        raise ConfigError(f"{option} expects a comma-separated subset of {', '.join(allowed)}. "
                          f"Got {value!r} instead.")
    return items


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``streamlearn rank routing``."""
    parser.add_argument("--dataset", default="reuters21578", choices=["reuters21578"])
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="where the datasets live (default: $STREAMLEARN_DATA_DIR, "
                             "../shared/datasets, then the user cache)")
    parser.add_argument("--fetch", action="store_true",
                        help="download missing data (verified by sha256) into the data dir")
    parser.add_argument("--topics", type=int, default=10,
                        help="number of most frequent ModApte training topics (default 10)")
    parser.add_argument("--features", default="lsi,chi2",
                        help=f"comma list of {', '.join(FEATURES)} (default lsi,chi2)")
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma list of {', '.join(METHODS)} (default all)")
    parser.add_argument("--dims", type=int, default=100, help="LSI dimensions (default 100)")
    parser.add_argument("--terms", type=int, default=500,
                        help="chi-square terms per topic (default 500)")
    parser.add_argument("--vocab", type=int, default=3000,
                        help="vocabulary size, most frequent terms (default 3000)")
    parser.add_argument("--hidden", type=int, default=6, help="hidden units of nnet (default 6)")
    parser.add_argument("--local", type=int, default=0, metavar="N",
                        help="local-region screening: train classifiers on the top N training "
                             "documents by Rocchio score (default 0 = off)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE.png",
                        help="grouped bar chart of mean AP (needs matplotlib)")


def _factories(args: argparse.Namespace) -> dict[str, Callable[[], Ranker]]:
    def wrap(make: Callable[[], Ranker]) -> Callable[[], Ranker]:
        if args.local <= 0:
            return make
        return lambda: LocalRegion(make(), n_top=args.local)

    return {
        "rocchio": lambda: Rocchio(),
        "lda": wrap(lambda: LDA(shrinkage=0.1)),
        "logreg": wrap(lambda: LogisticRegression(ridge=1.0)),
        "linear-net": wrap(lambda: Network(hidden=0, seed=args.seed)),
        "nnet": wrap(lambda: Network(hidden=args.hidden, seed=args.seed)),
    }


def _progress(message: str) -> None:
    print(f"[routing] {message}", file=sys.stderr, flush=True)


def _load(args: argparse.Namespace) -> tuple[list[list[str]], list[list[str]], list[set[str]],
                                              list[set[str]]]:
    from streamlearn.datasets.reuters import load_reuters, modapte_split, tokenize

    docs = load_reuters(args.data_dir, fetch=args.fetch)
    train, test = modapte_split(docs)
    tokens_train = [tokenize(d.title + " " + d.body) for d in train]
    tokens_test = [tokenize(d.title + " " + d.body) for d in test]
    return tokens_train, tokens_test, [set(d.topics) for d in train], [set(d.topics) for d in test]


def evaluate_routing(args: argparse.Namespace) -> dict[str, Any]:
    """Run the whole comparison; returns the JSON-ready result."""
    features = _comma_list(args.features, FEATURES, "--features")
    methods = _comma_list(args.methods, METHODS, "--methods")
    for name in ("topics", "dims", "terms", "vocab", "hidden"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be an int >= 1. Got {getattr(args, name)} instead.")
    started = time.perf_counter()
    tokens_train, tokens_test, topics_train, topics_test = _load(args)
    counts = Counter(t for topics in topics_train for t in topics)
    chosen = sorted(counts, key=lambda t: (-counts[t], t))[: args.topics]
    vocabulary = build_vocabulary(tokens_train, min_df=3, max_terms=args.vocab)
    idf = vocabulary.idf()
    counts_train = document_term_matrix(tokens_train, vocabulary)
    present_train = counts_train > 0
    A_train = tfidf(counts_train, idf)
    del counts_train
    A_test = tfidf(document_term_matrix(tokens_test, vocabulary), idf)
    _progress(f"ModApte: {len(tokens_train)} train / {len(tokens_test)} test documents, "
              f"{len(vocabulary)} terms; topics: {', '.join(chosen)} "
              f"({time.perf_counter() - started:.1f} s)")
    lsi_views: tuple[np.ndarray, np.ndarray] | None = None
    if "lsi" in features:
        t0 = time.perf_counter()
        lsi = LSI(n_components=args.dims, seed=args.seed).fit(A_train)
        lsi_views = (lsi.transform(A_train).astype(np.float64),
                     lsi.transform(A_test).astype(np.float64))
        _progress(f"LSI {args.dims} dims in {time.perf_counter() - t0:.1f} s")
    factories = _factories(args)
    rows: list[dict[str, Any]] = []
    for topic in chosen:
        y_train = np.array([topic in t for t in topics_train], dtype=np.float64)
        y_test = np.array([topic in t for t in topics_test], dtype=np.float64)
        for feature in features:
            if feature == "lsi" and lsi_views is not None:
                X_train, X_test = lsi_views
            elif feature == "chi2":
                columns = select_chi2(present_train, y_train, args.terms)
                X_train, X_test = A_train[:, columns], A_test[:, columns]
            else:
                X_train, X_test = A_train, A_test
            for method in methods:
                t0 = time.perf_counter()
                model = factories[method]().fit(X_train, y_train)
                scores = model.score(X_test)
                seconds = time.perf_counter() - t0
                row = {"topic": topic, "features": feature, "method": method,
                       "train_relevant": int(y_train.sum()), "test_relevant": int(y_test.sum()),
                       "ap": float(average_precision(y_test, scores)[0]),
                       "p100": float(precision_at_k(y_test, scores, k=100)),
                       "seconds": round(seconds, 3)}
                rows.append(row)
                _progress(f"{topic:<10} {feature:<5} {method:<10} AP={row['ap']:.4f} "
                          f"P@100={row['p100']:.2f} ({seconds:.1f} s)")
    summary = []
    for feature in features:
        for method in methods:
            sel = [r for r in rows if r["features"] == feature and r["method"] == method]
            summary.append({"features": feature, "method": method,
                            "mean_ap": float(np.mean([r["ap"] for r in sel])),
                            "mean_p100": float(np.mean([r["p100"] for r in sel])),
                            "seconds": round(sum(r["seconds"] for r in sel), 2)})
    return {"dataset": args.dataset, "split": "ModApte", "n_train": len(tokens_train),
            "n_test": len(tokens_test), "vocabulary": len(vocabulary), "topics": chosen,
            "lsi_dims": args.dims, "chi2_terms": args.terms, "local_region": args.local,
            "results": rows, "summary": summary,
            "seconds": round(time.perf_counter() - started, 1)}


def _print_tables(result: dict[str, Any]) -> None:
    rows, summary = result["results"], result["summary"]
    features = list(dict.fromkeys(r["features"] for r in summary))
    methods = list(dict.fromkeys(r["method"] for r in summary))
    for feature in features:
        print(f"\nAP per topic, features={feature}")
        print(f"{'topic':<12}{'rel(test)':>10}" + "".join(f"{m:>12}" for m in methods))
        for topic in result["topics"]:
            sel = {r["method"]: r for r in rows if r["topic"] == topic and r["features"] == feature}
            first = sel[methods[0]]
            print(f"{topic:<12}{first['test_relevant']:>10}"
                  + "".join(f"{sel[m]['ap']:>12.4f}" for m in methods))
    print(f"\n{'features':<9}{'method':<12}{'mean AP':>9}{'vs Rocchio':>12}{'mean P@100':>12}"
          f"{'time s':>9}")
    for s in summary:
        base = next((b for b in summary if b["features"] == s["features"]
                     and b["method"] == "rocchio"), None)
        rel = f"{100 * (s['mean_ap'] / base['mean_ap'] - 1):+.1f}%" if base else "-"
        print(f"{s['features']:<9}{s['method']:<12}{s['mean_ap']:>9.4f}{rel:>12}"
              f"{s['mean_p100']:>12.3f}{s['seconds']:>9.1f}")
    print(f"\ntotal {result['seconds']} s")


def _plot(result: dict[str, Any], path: str) -> None:
    plt = pyplot()
    summary = result["summary"]
    features = list(dict.fromkeys(r["features"] for r in summary))
    methods = list(dict.fromkeys(r["method"] for r in summary))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(features)
    for i, feature in enumerate(features):
        values = [next(s["mean_ap"] for s in summary
                       if s["features"] == feature and s["method"] == m) for m in methods]
        ax.bar(np.arange(len(methods)) + (i - (len(features) - 1) / 2) * width, values, width,
               label=feature)
    ax.set_xticks(np.arange(len(methods)), methods)
    ax.set_ylabel("mean non-interpolated AP")
    ax.set_title(f"Reuters-21578 ModApte routing, {len(result['topics'])} topics")
    ax.legend(title="features", loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``streamlearn rank routing``."""
    result = evaluate_routing(args)
    if args.json:
        sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_tables(result)
    if args.plot:
        _plot(result, args.plot)
        _progress(f"plot written to {args.plot}")
    return 0
