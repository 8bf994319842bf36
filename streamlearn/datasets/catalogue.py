"""Every name ``--dataset`` accepts, and the error for one it does not.

The built-in datasets (:data:`streamlearn.datasets.DATASETS`), the candidate-set
streams (:data:`streamlearn.datasets.candidates.CANDIDATE_STREAMS`) and files as
``csv:PATH`` / ``libsvm:PATH``: ``replay``, ``bench``, ``serve`` (embedded) and
``simulate`` take the same names. A mistaken name is answered with the closest
one, a file path with the prefix it needs
(:func:`~streamlearn.datasets.base.unknown_dataset`).

>>> "ohsumed-candidates" in dataset_names() and "letter" in dataset_names()
True
>>> check_dataset_name("lettre")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
streamlearn.errors.ConfigError: Expected a dataset in ... Got 'lettre' instead (did you mean 'letter'?).
"""

from __future__ import annotations

from streamlearn.datasets import DATASETS
from streamlearn.datasets.base import unknown_dataset
from streamlearn.datasets.candidates import CANDIDATE_STREAMS

__all__ = ["FILE_PREFIXES", "check_dataset_name", "dataset_names"]

FILE_PREFIXES = ("csv:", "libsvm:")


def dataset_names() -> list[str]:
    """The built-in datasets and the candidate-set streams, sorted."""
    return sorted([*DATASETS, *CANDIDATE_STREAMS])


def check_dataset_name(name: str, ignore_case: bool = False) -> None:
    """Raise a ConfigError (the closest name, or the file prefix) unless ``name`` is a
    dataset name (in any case with ``ignore_case``, as the embedded simulator reads it) or a
    ``csv:PATH`` / ``libsvm:PATH``."""
    if (name.lower() if ignore_case else name) in dataset_names() or any(
            name.startswith(p) and len(name) > len(p) for p in FILE_PREFIXES):
        return
    raise unknown_dataset(name, dataset_names())
