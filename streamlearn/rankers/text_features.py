"""Text features for the routing classifiers: vocabulary, tf-idf, χ² term selection, LSI.

Everything is plain numpy. Document-term matrices are **dense float32**, rows =
documents, columns = terms; this is affordable because the vocabulary is pruned
(by document frequency) to a few thousand terms before the matrix is built:
Reuters-21578 ModApte with 3,000 terms takes 9,603 × 3,000 × 4 B ≈ 115 MB for the
training documents and ≈ 40 MB for the test documents. Build the vocabulary with
``max_terms`` accordingly; there is no sparse path (no scipy dependency).

LSI is the truncated SVD of the (tf-idf weighted) document-term matrix
``A ≈ U_k Σ_k V_kᵀ``; a document row ``a`` is represented by ``a V_k`` (so the
training documents get ``U_k Σ_k``, and new documents are "folded in" by the same
projection). Small matrices use the exact SVD; large ones a seeded randomized
range finder (Halko, Martinsson & Tropp 2011) with power iterations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from streamlearn.errors import ConfigError, DataError
from streamlearn.learners.base import check_int

__all__ = [
    "LSI",
    "Vocabulary",
    "build_vocabulary",
    "chi2_scores",
    "document_term_matrix",
    "select_chi2",
    "tfidf",
]


class Vocabulary:
    """An immutable term → column mapping plus the training document frequencies.

    Parameters
    ----------
    terms : sequence of str
        The terms, in column order.
    document_frequency : numpy.ndarray
        Number of training documents containing each term.
    n_documents : int
        Number of training documents the frequencies were counted on.
    """

    def __init__(self, terms: Sequence[str], document_frequency: np.ndarray,
                 n_documents: int) -> None:
        self.terms: tuple[str, ...] = tuple(terms)
        self.index: dict[str, int] = {t: i for i, t in enumerate(self.terms)}
        self.document_frequency = np.asarray(document_frequency, dtype=np.float64)
        self.n_documents = int(n_documents)
        if self.document_frequency.shape != (len(self.terms),):
            raise DataError(
                f"document_frequency must have one entry per term ({len(self.terms)}); "
                f"got shape {self.document_frequency.shape}."
            )

    def __len__(self) -> int:
        return len(self.terms)

    def idf(self) -> np.ndarray:
        """Inverse document frequency ``log(N / df)`` of each term (df ≥ 1 by construction)."""
        return np.log(self.n_documents / np.maximum(self.document_frequency, 1.0))


def build_vocabulary(documents: Iterable[Sequence[str]], min_df: int = 3,
                     max_terms: int = 3000) -> Vocabulary:
    """Vocabulary of the ``max_terms`` terms with the highest document frequency ≥ ``min_df``.

    Ties in document frequency are broken alphabetically so the result does not
    depend on document order.

    Examples
    --------
    >>> v = build_vocabulary([["a", "b", "a"], ["b", "c"], ["b"]], min_df=2, max_terms=10)
    >>> v.terms, v.document_frequency.tolist()
    (('b',), [3.0])
    """
    min_df = check_int("build_vocabulary", "min_df", min_df)
    max_terms = check_int("build_vocabulary", "max_terms", max_terms)
    df: Counter[str] = Counter()
    n_docs = 0
    for tokens in documents:
        df.update(set(tokens))
        n_docs += 1
    kept = sorted((t for t, c in df.items() if c >= min_df), key=lambda t: (-df[t], t))
    kept = kept[:max_terms]
    return Vocabulary(kept, np.array([df[t] for t in kept], dtype=np.float64), n_docs)


def document_term_matrix(documents: Sequence[Sequence[str]], vocabulary: Vocabulary) -> np.ndarray:
    """Dense float32 raw term counts, shape ``(n_documents, len(vocabulary))``.

    Tokens outside the vocabulary are ignored.
    """
    index = vocabulary.index
    rows: list[int] = []
    cols: list[int] = []
    for r, tokens in enumerate(documents):
        c = [index[t] for t in tokens if t in index]
        rows.extend([r] * len(c))
        cols.extend(c)
    counts = np.zeros((len(documents), len(vocabulary)), dtype=np.float32)
    np.add.at(counts, (np.asarray(rows, dtype=np.intp), np.asarray(cols, dtype=np.intp)), 1.0)
    return counts


def tfidf(counts: np.ndarray, idf: np.ndarray) -> np.ndarray:
    """Log-tf × idf weights with L2-normalised rows (``(1 + ln tf)·idf`` where tf > 0).

    Empty rows stay zero. Returns float32.
    """
    counts = np.asarray(counts, dtype=np.float32)
    if counts.ndim != 2 or counts.shape[1] != idf.shape[0]:
        raise DataError(
            f"counts must be 2-D with {idf.shape[0]} columns (one per idf entry); "
            f"got shape {counts.shape}."
        )
    weights = np.zeros_like(counts)
    nz = counts > 0
    weights[nz] = 1.0 + np.log(counts[nz])
    weights *= idf.astype(np.float32)[None, :]
    norms = np.linalg.norm(weights, axis=1, keepdims=True)
    np.divide(weights, norms, out=weights, where=norms > 0)
    return weights


def chi2_scores(present: np.ndarray, y: np.ndarray) -> np.ndarray:
    """χ² statistic of each term's 2×2 (term present × relevant) contingency table.

    ``χ² = N (AD − BC)² / ((A+B)(C+D)(A+C)(B+D))`` with A = relevant documents
    containing the term, B = non-relevant containing it, C = relevant without it,
    D = non-relevant without it. A term whose table has an empty margin scores 0.

    Parameters
    ----------
    present : numpy.ndarray
        ``(n_documents, n_terms)``; an entry > 0 means the term occurs in the document.
    y : numpy.ndarray
        Binary relevance (0/1) per document.
    """
    present = np.asarray(present) > 0
    y = np.asarray(y).astype(bool)
    if y.shape != (present.shape[0],):
        raise DataError(f"y must have one label per document ({present.shape[0]}); "
                        f"got shape {y.shape}.")
    n = float(present.shape[0])
    df = present.sum(axis=0, dtype=np.float64)
    a = present[y].sum(axis=0, dtype=np.float64)
    b = df - a
    n_rel = float(y.sum())
    c = n_rel - a
    d = (n - n_rel) - b
    denominator = (a + b) * (c + d) * (a + c) * (b + d)
    numerator = n * (a * d - b * c) ** 2
    return np.asarray(np.divide(numerator, denominator, out=np.zeros_like(numerator),
                                where=denominator > 0))


def select_chi2(present: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the ``k`` terms with the largest χ² (ties → lower index), sorted."""
    k = check_int("select_chi2", "k", k)
    scores = chi2_scores(present, y)
    order = np.argsort(-scores, kind="stable")[: min(k, scores.shape[0])]
    return np.sort(order)


class LSI:
    """Latent semantic indexing: truncated SVD of a document-term matrix.

    Parameters
    ----------
    n_components : int
        Number of singular triplets kept (the LSI dimension ``k``).
    exact_limit : int
        Use the exact ``numpy.linalg.svd`` when ``min(shape) <= exact_limit``,
        otherwise the randomized method.
    n_oversamples, n_power_iterations : int
        Randomized SVD parameters (extra random directions; subspace iterations).
    seed : int
        Seed of the random test matrix.

    Attributes
    ----------
    components_ : numpy.ndarray
        ``V_k``, shape ``(n_terms, k)``, orthonormal columns.
    singular_values_ : numpy.ndarray
        ``Σ_k`` in decreasing order.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> a = rng.normal(size=(30, 3)) @ rng.normal(size=(3, 20))
    >>> lsi = LSI(n_components=3).fit(a)
    >>> bool(np.allclose(lsi.reconstruct(lsi.transform(a)), a))
    True
    """

    def __init__(self, n_components: int = 100, exact_limit: int = 600,
                 n_oversamples: int = 20, n_power_iterations: int = 4, seed: int = 0) -> None:
        self.n_components = check_int("LSI", "n_components", n_components)
        self.exact_limit = check_int("LSI", "exact_limit", exact_limit, low=0)
        self.n_oversamples = check_int("LSI", "n_oversamples", n_oversamples, low=0)
        self.n_power_iterations = check_int("LSI", "n_power_iterations", n_power_iterations,
                                            low=0)
        self.seed = int(seed)

    def fit(self, a: np.ndarray) -> LSI:
        """Compute ``V_k`` and ``Σ_k`` of the document-term matrix ``a``."""
        a = np.asarray(a)
        if a.ndim != 2:
            raise DataError(f"LSI expects a 2-D document-term matrix; got shape {a.shape}.")
        k = self.n_components
        if k > min(a.shape):
            raise ConfigError(f"The 'n_components' parameter of LSI must be <= min(shape) = "
                              f"{min(a.shape)}. Got {k} instead.")
        if min(a.shape) <= self.exact_limit:
            _, s, vt = np.linalg.svd(a.astype(np.float64), full_matrices=False)
        else:
            s, vt = self._randomized(a)
        self.singular_values_ = s[:k].astype(np.float64)
        self.components_ = vt[:k].T.astype(a.dtype if a.dtype == np.float32 else np.float64)
        return self

    def _randomized(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Range finder on the column space of A (documents), QR-orthonormalised between
        # power iterations for stability; then the small SVD of B = Qᵀ A.
        rng = np.random.default_rng(self.seed)
        width = min(self.n_components + self.n_oversamples, min(a.shape))
        q = a @ rng.standard_normal((a.shape[1], width)).astype(a.dtype)
        q, _ = np.linalg.qr(q)
        for _ in range(self.n_power_iterations):
            z, _ = np.linalg.qr(a.T @ q)
            q, _ = np.linalg.qr(a @ z)
        b = (q.T @ a).astype(np.float64)
        _, s, vt = np.linalg.svd(b, full_matrices=False)
        return s, vt

    def transform(self, a: np.ndarray) -> np.ndarray:
        """LSI coordinates ``a V_k`` of document rows ``a`` (training rows → ``U_k Σ_k``)."""
        a = np.asarray(a)
        if a.ndim != 2 or a.shape[1] != self.components_.shape[0]:
            raise DataError(f"LSI.transform expects {self.components_.shape[0]} columns; "
                            f"got shape {a.shape}.")
        return np.asarray(a @ self.components_)

    def reconstruct(self, coordinates: np.ndarray) -> np.ndarray:
        """Back-projection ``coordinates V_kᵀ`` into term space."""
        return np.asarray(np.asarray(coordinates) @ self.components_.T)
