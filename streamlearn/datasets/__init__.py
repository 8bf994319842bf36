"""Dataset loaders: built-in public datasets, synthetic streams and csv/libsvm files.

>>> ds = load_dataset("synsep", n_rows=200, seed=0)
>>> ds.X.shape, ds.n_classes
((200, 400), 9)
>>> load_dataset("foo")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
streamlearn.errors.ConfigError: Expected a dataset in [...] or csv:PATH / libsvm:PATH. Got 'foo' ...

Built-in data is read from :func:`resolve_data_dir` (``--data-dir``, else
``$STREAMLEARN_DATA_DIR``, else ``../shared/datasets`` beside the repository,
else the user cache) and verified by sha256 on every load; ``fetch=True``
downloads missing files into that directory first. See docs/datasets.md.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable

from streamlearn.datasets.base import (
    Dataset,
    DatasetFiles,
    RemoteFile,
    check_options,
    ensure_files,
    resolve_data_dir,
    unknown_dataset,
)
from streamlearn.datasets.files import load_csv, load_libsvm
from streamlearn.datasets.mnist import load_mnist
from streamlearn.datasets.reuters import ReutersDoc, load_reuters, load_reuters4, modapte_split
from streamlearn.datasets.synth import load_synnonsep, load_synsep
from streamlearn.datasets.uci import load_letter, load_nursery, load_optdigits, load_pendigits

__all__ = [
    "DATASETS",
    "Dataset",
    "DatasetFiles",
    "RemoteFile",
    "ReutersDoc",
    "ensure_files",
    "load_dataset",
    "load_reuters",
    "modapte_split",
    "resolve_data_dir",
]

Loader = Callable[..., Dataset]

DATASETS: dict[str, Loader] = {
    "letter": load_letter,
    "mnist": load_mnist,
    "nursery": load_nursery,
    "optdigits": load_optdigits,
    "pendigits": load_pendigits,
    "reuters4": load_reuters4,
    "synnonsep": load_synnonsep,
    "synsep": load_synsep,
}

_FILE_LOADERS: dict[str, Callable[..., Dataset]] = {"csv:": load_csv, "libsvm:": load_libsvm}


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, *,
                 fetch: bool = False, **options: object) -> Dataset:
    """Load a built-in dataset by name, or a file given as ``csv:PATH`` / ``libsvm:PATH``.

    Parameters
    ----------
    name : str
        A key of :data:`DATASETS`, or ``csv:PATH`` / ``libsvm:PATH``.
    data_dir : path, optional
        The ``--data-dir`` value; see :func:`resolve_data_dir`.
    fetch : bool
        Download missing built-in files (verified by sha256) into the data directory.
    **options
        Loader options (e.g. ``n_rows``/``seed`` for the synthetic streams,
        ``n_features``/``subset`` for reuters4, ``label_column`` for csv).

    Raises
    ------
    ConfigError
        Unknown dataset name or option.
    DataError
        Missing, corrupt or malformed data.
    """
    for prefix, file_loader in _FILE_LOADERS.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            return file_loader(name[len(prefix):], **options)
    loader = DATASETS.get(name)
    if loader is None:
        raise unknown_dataset(name, sorted(DATASETS))
    takes_options = any(p.kind is inspect.Parameter.VAR_KEYWORD
                        for p in inspect.signature(loader).parameters.values())
    if not takes_options:
        check_options(name, options, [])
    return loader(resolve_data_dir(data_dir), fetch=fetch, **options)
