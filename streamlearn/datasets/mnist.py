"""MNIST test set (10,000 × 784 pixels scaled to [0, 1]) and a validating IDX parser.

Checksums: the shared copy's ``.gz`` wrappers were re-created by their
uploader, and public mirrors each gzip differently, so the sha256 and size
below are of the *decompressed* IDX payloads. Those payloads match the
official files' md5 (t10k-images 2646ac647ad5339dbf082846283269ea,
t10k-labels 27ae3e4e09519cfbb04c329615203637). Downloads use the ossci-datasets
S3 mirror used by torchvision. Licence: commonly CC BY-SA 3.0 (LeCun & Cortes).

>>> header = bytes([0, 0, 8, 1]) + (3).to_bytes(4, "big")
>>> parse_idx(header + bytes([7, 8, 9])).tolist()
[7, 8, 9]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamlearn.datasets.base import Dataset, DatasetFiles, RemoteFile, read_payloads
from streamlearn.errors import DataError

__all__ = ["MNIST", "load_mnist", "parse_idx"]

MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist"
MNIST = DatasetFiles("mnist", (
    RemoteFile("mnist/t10k-images-idx3-ubyte.gz", f"{MNIST_URL}/t10k-images-idx3-ubyte.gz",
               "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7", 7840016),
    RemoteFile("mnist/t10k-labels-idx1-ubyte.gz", f"{MNIST_URL}/t10k-labels-idx1-ubyte.gz",
               "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2", 10008),
))

# IDX type byte -> big-endian element dtype
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(payload: bytes, source: str = "<idx>") -> np.ndarray:
    """Decode an (uncompressed) IDX file, checking its magic number and sizes.

    Raises
    ------
    DataError
        Bad magic number, unknown element type, or a header/data length that
        does not match the declared dimensions (e.g. a truncated file).
    """
    if len(payload) < 4 or payload[0] != 0 or payload[1] != 0:
        raise DataError(f"{source}: expected an IDX file (magic 0x0000TTNN). "
                        f"Got first bytes {payload[:4].hex() or 'none'}.")
    type_code, ndim = payload[2], payload[3]
    if type_code not in _IDX_TYPES or ndim == 0:
        raise DataError(f"{source}: unsupported IDX element type 0x{type_code:02x} "
                        f"or dimension count {ndim}.")
    header = 4 + 4 * ndim
    if len(payload) < header:
        raise DataError(f"{source}: truncated IDX header: expected {header} bytes, "
                        f"got {len(payload)}.")
    dims = tuple(int.from_bytes(payload[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(_IDX_TYPES[type_code])
    expected = int(np.prod(dims)) * dtype.itemsize
    got = len(payload) - header
    if got != expected:
        state = "truncated" if got < expected else "longer than declared"
        raise DataError(f"{source}: IDX data is {state}: dimensions {dims} need {expected} bytes "
                        f"after the header, got {got}.")
    return np.frombuffer(payload, dtype=dtype, offset=header).reshape(dims)


def load_mnist(data_dir: Path, *, fetch: bool = False) -> Dataset:
    """The MNIST test set: 10,000 images flattened to 784 pixels in [0, 1], 10 classes.

    Flagged ``standardise=True``: the linear bandit learners need centred
    features (z-scoring lowers their online error, docs/results.md); constant
    border pixels stay 0.
    """
    payloads = read_payloads(MNIST, data_dir, fetch)
    images_path, labels_path = (f.path for f in MNIST.files)
    images = parse_idx(payloads[images_path], images_path)
    labels = parse_idx(payloads[labels_path], labels_path)
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
        raise DataError(f"Expected 28x28 MNIST images with one label each. Got images "
                        f"{images.shape} and labels {labels.shape}.")
    if labels.max() > 9:
        raise DataError(f"{labels_path}: expected digit labels 0..9. Got {labels.max()}.")
    X = images.reshape(len(images), 784).astype(np.float64) / 255.0
    return Dataset(
        name="mnist", X=X, y=labels.astype(np.int64), n_classes=10,
        class_names=[str(d) for d in range(10)], n_features=784,
        description=f"MNIST test set (LeCun, Cortes, Burges): {len(X):,} images of 28x28 "
                    f"pixels flattened to 784 features scaled to [0, 1] (standardised), "
                    f"10 classes.",
        standardise=True,
    )
