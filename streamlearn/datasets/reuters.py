"""Reuters-21578 (Distribution 1.0): SGML parser, tokenizer, ModApte split, ``reuters4``.

The 22 files ``reut2-000.sgm`` … ``reut2-021.sgm`` (stored gzip-compressed,
checksums of the plain SGML) are parsed with regular expressions — the files
are SGML, not XML: latin-1, ``&#N;`` control entities and ``&lt;`` inside text.

``reuters4`` is the text-routing stream: the documents whose TOPICS field holds
exactly one of ``earn, acq, crude, trade`` (other, finer topics may also be
present — as in the RCV1 "Reuters4" task, where a document carries exactly one
of the four top categories), in NEWID order. Features: title + body tokens
(:func:`tokenize`), term counts weighted ``log(1 + tf)``, hashed with
:func:`streamlearn.features.hash_names` (signed buckets) and L2-normalised per
row. :func:`bag_of_words` builds the same features for any token lists, so a
serving path reproduces them exactly.

Licence: copyright Reuters Ltd.; free distribution for research purposes only;
acknowledge as "Reuters-21578, Distribution 1.0".
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamlearn.datasets.base import (
    Dataset,
    DatasetFiles,
    RemoteFile,
    check_options,
    option_int,
    read_payloads,
    resolve_data_dir,
)
from streamlearn.errors import ConfigError, DataError
from streamlearn.features import SparseBatch, hash_names

__all__ = [
    "REUTERS",
    "REUTERS4_TOPICS",
    "STOPWORDS",
    "ReutersDoc",
    "bag_of_words",
    "load_reuters",
    "load_reuters4",
    "modapte_split",
    "parse_sgml",
    "reuters4_documents",
    "tokenize",
]

REUTERS_URL = "https://kdd.ics.uci.edu/databases/reuters21578/reuters21578.tar.gz"
_CHECKSUMS = (  # (file number, sha256 of the plain .sgm, size) from PROVENANCE.txt
    ("000", "0ec53cda8f6d605a3ba710df14be7f00fc02f0c222a14748101df22326afe0f6", 1324350),
    ("001", "1528e7e82d110d88d0234eb9619eadb7f9fd805711971df05975b92277dfdf4d", 1254440),
    ("002", "99f18068d0518952987dedd78c622e5c2a584e357d264d3754696c815f3e6628", 1217495),
    ("003", "78a3a8d7e04bc9d42c4614d5d5c60a4293dbe3f708df6fb5a71d9ef31f4b3fa3", 1298721),
    ("004", "726342c19a65873330b412378cd6a3f0d512035f5223146ddd60930c62eb6ff0", 1321623),
    ("005", "d09de619b6dd2d047d5124681f6df90550abaf592020d1c1ce338ae9b91522e7", 1388644),
    ("006", "b5535c0d66b01f4976f84621a4a795afbc00d2c4bd0a1b7ae426df6630fb361d", 1254765),
    ("007", "aa706007ec84a03537a3921ca976d60e11b3f99e4b9e9b2d5c81dd384d2c2062", 1256772),
    ("008", "a3994583694a00b7c744097c1d7eabfcf90f2e6650cc21663e46828035a336cb", 1410117),
    ("009", "29995f606dd1a9bdf907eacc9d879846c716860d9d9141676979474aaea39c7d", 1338903),
    ("010", "996df6008089bd09fa5b28a4d2eb0ee5f7b9d4601cde566fed3926ac82960fa3", 1371071),
    ("011", "d3a2782015247d9c2bffb8926267827fdd449c70d619435ef01a25a1c56a53ca", 1304117),
    ("012", "da31035d483851f2aebce5b66d779e5e2c0ac9dcfe098596c6d544e81c5604ab", 1323584),
    ("013", "8f7700bc0455fac3fcc12377ced4807b7df8aba1f21ecad059b9cc2b1cf0b8be", 1129687),
    ("014", "ef936bd3e0f36cf722afa9a6957563549775af32e9e28b4f539c8737ceda83ab", 1128671),
    ("015", "6d3bcec73eff871b8a5403588af814c4e50a0de6bc25707480522ab836f74026", 1258665),
    ("016", "be2f03a185fff70131f3b4fdbd6229b7ee2be077eba9691eaa597c8cfbda8812", 1316417),
    ("017", "f370e610b4b1342e41a98e0c426a08541044bd1d7e539674f32372a6060b73b5", 1546911),
    ("018", "a5f971bf25448e915781962309e669359a35fbcaf3017a806eca0590897f209a", 1258819),
    ("019", "d3b07097fba2633d130b4914aceba671645985248943ce9e39c289315339dffb", 1261780),
    ("020", "f6ad1b724125c202566c63b35ea0b5ee23881f8b7ed47a32829d5af05d8e860d", 1049566),
    ("021", "3f5196d32869723c9042aa5756805b4e90360f1f45ea17f4594fa0e2b3630b18", 621648),
)
REUTERS = DatasetFiles("reuters21578", tuple(
    RemoteFile(f"reuters21578/reut2-{num}.sgm.gz", REUTERS_URL, sha, size,
               member=f"reut2-{num}.sgm")
    for num, sha, size in _CHECKSUMS
))
REUTERS4_TOPICS = ("earn", "acq", "crude", "trade")

# English function words plus "reuter", the sign-off closing nearly every body.
_STOPWORD_TEXT = """
a about above after again against all also am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further had
has have having he her here hers him his how if in into is it its itself just me more most my no
nor not now of off on once only or other our ours out over own same she should so some such than
that the their theirs them then there these they this those through to too under until up very
was we were what when where which while who whom why will with would you your yours
reuter reuters
"""
STOPWORDS = frozenset(_STOPWORD_TEXT.split())

_DOC = re.compile(r"<REUTERS\b([^>]*)>(.*?)</REUTERS>", re.S)
_ATTR = re.compile(r'([A-Z]+)="([^"]*)"')
_TOPICS = re.compile(r"<TOPICS>(.*?)</TOPICS>", re.S)
_D = re.compile(r"<D>(.*?)</D>", re.S)
_TITLE = re.compile(r"<TITLE>(.*?)</TITLE>", re.S)
_BODY = re.compile(r"<BODY>(.*?)</BODY>", re.S)
_TEXT = re.compile(r"<TEXT\b[^>]*>(.*?)</TEXT>", re.S)
_TAG = re.compile(r"<[^>]*>")
_ENTITY = re.compile(r"&#(\d+);|&(lt|gt|amp|quot|apos);")
_NAMED = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_WORD = re.compile(r"[a-z]+")


@dataclass(frozen=True)
class ReutersDoc:
    """One ``<REUTERS>`` document (text fields unescaped, control characters removed)."""

    newid: int
    topics: tuple[str, ...]
    lewissplit: str
    cgisplit: str
    has_topics: str  # the TOPICS attribute: YES, NO or BYPASS
    title: str
    body: str


def _unescape(text: str) -> str:
    def entity(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            code = int(match.group(1))
            return chr(code) if code >= 32 and code != 127 else " "
        return _NAMED[match.group(2)]

    return _CONTROL.sub(" ", _ENTITY.sub(entity, text)).strip()


def parse_sgml(text: str, source: str = "<sgml>") -> list[ReutersDoc]:
    """Parse the ``<REUTERS>`` documents of one SGML file.

    >>> sgml = ('<REUTERS TOPICS="YES" LEWISSPLIT="TRAIN" CGISPLIT="TRAINING-SET" NEWID="7">'
    ...         '<TOPICS><D>earn</D></TOPICS><TEXT>&#2;<TITLE>A &lt;B> C</TITLE>'
    ...         '<BODY>Net up.&#3;</BODY></TEXT></REUTERS>')
    >>> doc, = parse_sgml(sgml)
    >>> doc.newid, doc.topics, doc.title, doc.body
    (7, ('earn',), 'A <B> C', 'Net up.')
    """
    docs = []
    for match in _DOC.finditer(text):
        attrs = dict(_ATTR.findall(match.group(1)))
        inner = match.group(2)
        try:
            newid = int(attrs["NEWID"])
            fields = (attrs["LEWISSPLIT"], attrs["CGISPLIT"], attrs["TOPICS"])
        except (KeyError, ValueError) as exc:
            raise DataError(f"{source}: a <REUTERS> tag lacks a valid {exc} attribute "
                            f"({match.group(1).strip()!r}).") from exc
        topics_block = _TOPICS.search(inner)
        topics = tuple(_D.findall(topics_block.group(1))) if topics_block else ()
        title = _TITLE.search(inner)
        body = _BODY.search(inner)
        if body is None and title is None:  # TYPE="UNPROC": untagged text
            text_block = _TEXT.search(inner)
            body_text = _TAG.sub(" ", text_block.group(1)) if text_block else ""
        else:
            body_text = body.group(1) if body else ""
        docs.append(ReutersDoc(newid, topics, *fields,
                               title=_unescape(title.group(1)) if title else "",
                               body=_unescape(body_text)))
    return docs


def load_reuters(data_dir: str | os.PathLike[str] | None = None, *,
                 fetch: bool = False) -> list[ReutersDoc]:
    """All 21,578 documents, in NEWID order (files verified by sha256).

    ``data_dir`` is resolved by :func:`~streamlearn.datasets.base.resolve_data_dir`.
    """
    docs: list[ReutersDoc] = []
    for path, payload in read_payloads(REUTERS, resolve_data_dir(data_dir), fetch).items():
        docs.extend(parse_sgml(payload.decode("latin-1"), path))
    docs.sort(key=lambda d: d.newid)
    if len(docs) != 21578:
        raise DataError(f"Expected 21578 Reuters-21578 documents. Got {len(docs)}.")
    return docs


def modapte_split(docs: Sequence[ReutersDoc]) -> tuple[list[ReutersDoc], list[ReutersDoc]]:
    """The ModApte (train, test) documents: LEWISSPLIT TRAIN / TEST with TOPICS="YES"."""
    used = [d for d in docs if d.has_topics == "YES"]
    return ([d for d in used if d.lewissplit == "TRAIN"],
            [d for d in used if d.lewissplit == "TEST"])


def tokenize(text: str) -> list[str]:
    """Lowercase alphabetic tokens of at least 2 letters, minus :data:`STOPWORDS`.

    >>> tokenize("Shell Oil's net rose 3.5 pct, the company SAID.")
    ['shell', 'oil', 'net', 'rose', 'pct', 'company', 'said']
    """
    return [w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS]


def bag_of_words(token_lists: Sequence[Sequence[str]], n_features: int = 2**14) -> SparseBatch:
    """Hashed ``log(1 + tf)`` bag of words, one L2-normalised CSR row per token list.

    Each distinct token is hashed once with :func:`hash_names` (bucket and sign);
    entries that collide in a row are summed before normalising.

    >>> X = bag_of_words([["oil", "oil", "price"], []], n_features=64)
    >>> X.shape, np.round(np.sqrt(np.bincount(X.row_ids(), X.values**2, minlength=2)), 6).tolist()
    ((2, 64), [1.0, 0.0])
    """
    vocab: dict[str, int] = {}
    term_ids = np.array([vocab.setdefault(t, len(vocab)) for doc in token_lists for t in doc],
                        dtype=np.int64)
    lengths = np.fromiter((len(doc) for doc in token_lists), dtype=np.int64,
                          count=len(token_lists))
    doc_ids = np.repeat(np.arange(len(token_lists), dtype=np.int64), lengths)
    hashed = hash_names([list(vocab)], n_features)  # one row: bucket and sign per term
    # term frequencies per (doc, term), then weight and move into signed buckets
    pairs, tf = np.unique(doc_ids * max(len(vocab), 1) + term_ids, return_counts=True)
    pair_doc, pair_term = np.divmod(pairs, max(len(vocab), 1))
    weights = hashed.values[pair_term] * np.log1p(tf)
    cells, inverse = np.unique(pair_doc * n_features + hashed.indices[pair_term],
                               return_inverse=True)
    values = np.bincount(inverse.reshape(-1), weights=weights, minlength=len(cells))
    keep = values != 0.0  # colliding terms of opposite signs may cancel
    cell_doc, cell_col = np.divmod(cells[keep], n_features)
    values = values[keep]
    norms = np.sqrt(np.bincount(cell_doc, weights=values**2, minlength=len(token_lists)))
    values = values / norms[cell_doc]
    indptr = np.zeros(len(token_lists) + 1, dtype=np.int64)
    np.cumsum(np.bincount(cell_doc, minlength=len(token_lists)), out=indptr[1:])
    return SparseBatch(indptr, cell_col.astype(np.int64), values, int(n_features))


def reuters4_documents(docs: Sequence[ReutersDoc]) -> tuple[list[ReutersDoc], np.ndarray]:
    """The documents with exactly one of :data:`REUTERS4_TOPICS`, and that topic's index."""
    chosen, labels = [], []
    for doc in docs:
        present = [k for k, topic in enumerate(REUTERS4_TOPICS) if topic in doc.topics]
        if len(present) == 1:
            chosen.append(doc)
            labels.append(present[0])
    return chosen, np.array(labels, dtype=np.int64)


def load_reuters4(data_dir: Path, *, fetch: bool = False, **options: object) -> Dataset:
    """``reuters4``: hashed bag-of-words documents of topics earn / acq / crude / trade.

    Options: ``n_features`` (hash buckets, default ``2**14``); ``subset``
    ``"all"`` (default: every document, NEWID order) or ``"modapte"`` (the
    ModApte train documents then its test documents, ``test_start`` at the first
    test document).
    """
    check_options("reuters4", options, ["n_features", "subset"])
    n_features = option_int("reuters4", "n_features", options.get("n_features", 2**14))
    subset = str(options.get("subset", "all"))
    docs = load_reuters(data_dir, fetch=fetch)
    test_start = None
    if subset == "modapte":
        train, test = modapte_split(docs)
        train4, _ = reuters4_documents(train)
        docs, test_start = train + test, len(train4)
        where = "ModApte split: {train:,} train then {test:,} test, NEWID order within each"
    elif subset == "all":
        where = "all splits, NEWID order"
    else:
        raise ConfigError(f"The 'subset' option of dataset 'reuters4' must be 'all' or "
                          f"'modapte'. Got {subset!r} instead.")
    docs, y = reuters4_documents(docs)
    if test_start is not None:
        where = where.format(train=test_start, test=len(y) - test_start)
    X = bag_of_words([tokenize(f"{d.title}\n{d.body}") for d in docs], n_features)
    counts = ", ".join(f"{t} {n:,}" for t, n in
                       zip(REUTERS4_TOPICS, np.bincount(y, minlength=4), strict=True))
    return Dataset(
        name="reuters4", X=X, y=y, n_classes=4, class_names=list(REUTERS4_TOPICS),
        n_features=n_features,
        description=f"Reuters-21578: the {len(y):,} documents ({where}) whose TOPICS hold "
                    f"exactly one of earn/acq/crude/trade; title+body tokens, log(1+tf) hashed "
                    f"into {n_features} signed buckets, rows L2-normalised (not standardised); "
                    f"classes {counts}.",
        standardise=False, test_start=test_start,
    )
