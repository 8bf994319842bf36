"""The :class:`Dataset` record, data-directory resolution and checksummed file fetching.

Every built-in dataset is a set of :class:`RemoteFile` entries: a path relative
to the data directory, a public download address and the sha256 and size of
the *payload* (the decompressed bytes when the stored file ends in ``.gz``, so
a gzip re-wrapped by a mirror still verifies). Loaders call
:func:`read_payloads`, which finds the files (downloading them first when
``fetch`` is allowed), checks size and sha256 on every load, and returns the
payload bytes.

The data directory is chosen by :func:`resolve_data_dir` — the only place the
environment is read for data.

>>> d = Dataset("toy", np.zeros((2, 3)), np.array([0, 1]), 2, ["a", "b"], 3, "two rows", False)
>>> d.n_rows, d.test_start
(2, None)
"""

from __future__ import annotations

import difflib
import gzip
import hashlib
import os
import tarfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamlearn.errors import ConfigError, DataError
from streamlearn.features import SparseBatch

__all__ = [
    "Dataset",
    "DatasetFiles",
    "RemoteFile",
    "check_options",
    "encode_labels",
    "ensure_files",
    "option_bool",
    "option_int",
    "read_payload",
    "read_payloads",
    "resolve_data_dir",
    "unknown_dataset",
]

ENV_DATA_DIR = "STREAMLEARN_DATA_DIR"
# ../shared/datasets beside the repository root (the development and CI copy)
SHARED_DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"
_DOWNLOAD_TIMEOUT_S = 60.0
_CHUNK = 1 << 20


@dataclass(frozen=True, eq=False)
class Dataset:
    """A labelled dataset, rows in their canonical (file) order.

    Attributes
    ----------
    X : numpy.ndarray or SparseBatch
        ``(n, d)`` features: float64 (float32 for the synthetic streams, to halve
        their memory; learners cast per batch) or a CSR :class:`SparseBatch`.
    y : numpy.ndarray
        int64 labels in ``0 .. n_classes - 1``.
    class_names : list of str
        ``class_names[k]`` is the original name of class ``k``.
    standardise : bool
        Whether learners should standardise the features (dense data whose
        columns measure different quantities); False for binary, one-hot,
        pixel and hashed data.
    test_start : int or None
        Index of the first row of the conventional test split, when there is one.
    """

    name: str
    X: np.ndarray | SparseBatch
    y: np.ndarray
    n_classes: int
    class_names: list[str]
    n_features: int
    description: str
    standardise: bool
    test_start: int | None = None

    def __post_init__(self) -> None:
        n = self.X.shape[0]
        if self.y.shape != (n,) or self.y.dtype != np.int64:
            raise DataError(f"Dataset {self.name!r}: expected int64 labels of shape ({n},). "
                            f"Got {self.y.dtype} of shape {self.y.shape}.")
        if self.X.shape[1] != self.n_features or len(self.class_names) != self.n_classes:
            raise DataError(f"Dataset {self.name!r}: inconsistent n_features/class_names.")
        if n and (self.y.min() < 0 or self.y.max() >= self.n_classes):
            raise DataError(f"Dataset {self.name!r}: labels outside 0..{self.n_classes - 1}.")
        if self.test_start is not None and not 0 < self.test_start < n:
            raise DataError(f"Dataset {self.name!r}: test_start {self.test_start} not in (0, {n}).")

    @property
    def n_rows(self) -> int:
        return int(self.X.shape[0])


@dataclass(frozen=True)
class RemoteFile:
    """One file of a built-in dataset.

    ``path`` is relative to the data directory; when it ends in ``.gz`` the file
    is stored gzip-compressed and ``sha256``/``size`` describe the decompressed
    payload. ``member`` is set when ``url`` is a tar archive holding the payload
    (matched by base name).
    """

    path: str
    url: str
    sha256: str
    size: int
    member: str | None = None


@dataclass(frozen=True)
class DatasetFiles:
    """The files one built-in dataset needs."""

    name: str
    files: tuple[RemoteFile, ...]

    @property
    def download_size(self) -> int:
        return sum(f.size for f in self.files)


def resolve_data_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: ``explicit`` (``--data-dir``), else ``$STREAMLEARN_DATA_DIR``,
    else ``../shared/datasets`` beside the repository when it exists, else the user
    cache (``$XDG_CACHE_HOME/streamlearn`` or ``~/.cache/streamlearn``).
    """
    if explicit is not None and str(explicit) != "":
        return Path(explicit).expanduser()
    from_env = os.environ.get(ENV_DATA_DIR, "")
    if from_env:
        return Path(from_env).expanduser()
    if SHARED_DATA_DIR.is_dir():
        return SHARED_DATA_DIR
    cache_home = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache_home).expanduser() if cache_home else Path.home() / ".cache"
    return base / "streamlearn"


def _candidates(data_dir: Path, remote: RemoteFile) -> list[Path]:
    """Where a file may be: as stored, or (de)compressed by the user."""
    main = data_dir / remote.path
    alt = main.with_suffix("") if main.suffix == ".gz" else main.with_name(main.name + ".gz")
    return [main, alt]


def _locate(data_dir: Path, remote: RemoteFile) -> Path | None:
    return next((p for p in _candidates(data_dir, remote) if p.is_file()), None)


def _mb(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.1f} MB"


def _missing_error(spec: DatasetFiles, data_dir: Path, missing: Sequence[RemoteFile]) -> DataError:
    where = str(data_dir) + ("" if data_dir.is_dir() else " (not a directory)" if data_dir.exists()
                             else " (the directory does not exist)")
    listed = ", ".join(f.path for f in missing[:3]) + (" ..." if len(missing) > 3 else "")
    return DataError(
        f"Dataset {spec.name!r} not found in {where}: expected {listed}. Fix: pass --data-dir DIR "
        f"(or set {ENV_DATA_DIR}) to a folder holding it, or add --fetch to download "
        f"{len(spec.files)} file(s), {_mb(spec.download_size)}, from {missing[0].url}."
    )


def _verify(payload: bytes, remote: RemoteFile, source: str) -> None:
    digest = hashlib.sha256(payload).hexdigest()
    if len(payload) != remote.size or digest != remote.sha256:
        raise DataError(
            f"Checksum mismatch for {remote.path} ({source}): expected sha256 {remote.sha256} "
            f"({remote.size} bytes), got {digest} ({len(payload)} bytes). The file is corrupt or "
            f"another version; delete it and fetch it again (--fetch)."
        )


def _gunzip(raw: bytes, source: str) -> bytes:
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{source} is not a valid gzip file ({exc}).") from exc


def read_payload(path: Path, remote: RemoteFile) -> bytes:
    """Read ``path`` (decompressing a ``.gz``) and verify it against ``remote``."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    payload = _gunzip(raw, str(path)) if path.suffix == ".gz" else raw
    _verify(payload, remote, str(path))
    return payload


def _download(url: str, dest: Path) -> None:
    """Stream ``url`` into ``dest`` (any urllib scheme, e.g. https:// or file://)."""
    try:
        with urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response, \
                dest.open("wb") as out:
            while chunk := response.read(_CHUNK):
                out.write(chunk)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        dest.unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise DataError(f"Could not download {url}: {reason}.") from exc


def _extract_members(archive: Path, members: set[str], url: str) -> dict[str, bytes]:
    """The named members (matched by base name) of a tar archive, in one pass."""
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            for info in tar:
                name = Path(info.name).name
                if info.isfile() and name in members and name not in found:
                    handle = tar.extractfile(info)
                    if handle is not None:
                        found[name] = handle.read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise DataError(f"The archive downloaded from {url} is unreadable ({exc}).") from exc
    absent = sorted(members - set(found))
    if absent:
        raise DataError(f"The archive downloaded from {url} has no member {absent[0]!r}.")
    return found


def _write_atomically(dest: Path, data: bytes) -> None:
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    tmp.write_bytes(data)
    os.replace(tmp, dest)


def _fetch(spec: DatasetFiles, data_dir: Path, missing: Sequence[RemoteFile]) -> None:
    by_url: dict[str, list[RemoteFile]] = {}
    for remote in missing:
        by_url.setdefault(remote.url, []).append(remote)
    for url, group in by_url.items():
        dest_dir = (data_dir / group[0].path).parent
        try:
            dest_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataError(f"Cannot create {dest_dir} to fetch dataset {spec.name!r} "
                            f"({exc.strerror or exc}); pass a writable --data-dir.") from exc
        tmp = dest_dir / f".download.{os.getpid()}.part"
        _download(url, tmp)
        try:
            wanted = {remote.member for remote in group if remote.member is not None}
            extracted = _extract_members(tmp, wanted, url) if wanted else {}
            for remote in group:
                dest = data_dir / remote.path
                if remote.member is None:
                    raw = tmp.read_bytes()
                    payload = _gunzip(raw, url) if dest.suffix == ".gz" else raw
                    _verify(payload, remote, f"downloaded from {url}")
                    _write_atomically(dest, raw)
                    continue
                payload = extracted[remote.member]
                _verify(payload, remote, f"member {remote.member} of {url}")
                stored = gzip.compress(payload, compresslevel=6, mtime=0) \
                    if dest.suffix == ".gz" else payload
                _write_atomically(dest, stored)
        finally:
            tmp.unlink(missing_ok=True)


def ensure_files(spec: DatasetFiles, data_dir: Path, fetch: bool) -> list[Path]:
    """The local path of each file of ``spec`` (in order), downloading missing ones if allowed.

    Raises
    ------
    DataError
        A file is missing and ``fetch`` is False (the message names the dataset,
        the directory and the fixes), or a download fails or does not verify.
    """
    missing = [f for f in spec.files if _locate(data_dir, f) is None]
    if missing:
        if not fetch:
            raise _missing_error(spec, data_dir, missing)
        _fetch(spec, data_dir, missing)
    found = [_locate(data_dir, f) for f in spec.files]
    return [p for p in found if p is not None]


def read_payloads(spec: DatasetFiles, data_dir: Path, fetch: bool) -> dict[str, bytes]:
    """Verified payload bytes of every file of ``spec``, keyed by ``RemoteFile.path``."""
    paths = ensure_files(spec, data_dir, fetch)
    return {f.path: read_payload(p, f) for f, p in zip(spec.files, paths, strict=True)}


def encode_labels(raw: np.ndarray, what: str) -> tuple[np.ndarray, list[str]]:
    """Map labels of any type to ``0..K-1`` in sorted order (numeric order when all are numbers).

    >>> y, names = encode_labels(np.array(["10", "9", "9", "2.0"]), "toy")
    >>> y.tolist(), names
    ([2, 1, 1, 0], ['2', '9', '10'])
    >>> y, names = encode_labels(np.array(["b", "10", "a"]), "toy")
    >>> y.tolist(), names
    ([2, 0, 1], ['10', 'a', 'b'])
    """
    strings = np.asarray(raw).astype(str)
    try:
        numbers = strings.astype(np.float64)
    except ValueError:
        numbers = None
    if numbers is not None and np.isfinite(numbers).all():
        values, y = np.unique(numbers, return_inverse=True)
        names = [str(int(v)) if float(v).is_integer() else repr(float(v)) for v in values]
    else:
        uniq, y = np.unique(strings, return_inverse=True)
        values, names = uniq, [str(u) for u in uniq]
    if len(values) < 2:
        got = f"{len(values)} ({names[0]!r})" if names else "0"
        raise DataError(f"Expected at least 2 classes in {what}. Got {got}.")
    return y.astype(np.int64).reshape(-1), names


def option_int(dataset: str, name: str, value: object, low: int = 1) -> int:
    """An integer option (ints or decimal strings, e.g. from the command line)."""
    try:
        number = int(value) if isinstance(value, (str, int, np.integer)) else None
    except ValueError:
        number = None
    if isinstance(value, bool) or number is None or number < low:
        raise ConfigError(f"The {name!r} option of dataset {dataset!r} must be an int >= {low}. "
                          f"Got {value!r} instead.")
    return number


def option_bool(dataset: str, name: str, value: object) -> bool:
    """A boolean option (bools or true/false/1/0/yes/no strings)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in {"true", "1", "yes"}:
        return True
    if text in {"false", "0", "no"}:
        return False
    raise ConfigError(f"The {name!r} option of dataset {dataset!r} must be true or false. "
                      f"Got {value!r} instead.")


_FILE_SUFFIXES = {"libsvm:": (".svm", ".libsvm", ".svmlight"),
                  "csv:": (".csv", ".tsv", ".txt", ".data")}


def unknown_dataset(name: str, known: Sequence[str]) -> ConfigError:
    """The error for a dataset ``name`` that is none of ``known`` nor ``csv:`` / ``libsvm:``:
    it lists them and suggests the closest name, or the prefix for what looks like a file.

    >>> str(unknown_dataset("lettre", ["letter", "mnist"])).split("Got ")[1]
    "'lettre' instead (did you mean 'letter'?)."
    >>> str(unknown_dataset("runs/my.csv.gz", ["letter"])).split("instead")[1]
    ": a file is given as csv:PATH (did you mean 'csv:runs/my.csv.gz'?)."
    """
    base = name.lower()
    for compressed in (".gz", ".bz2", ".xz"):
        base = base.removesuffix(compressed)
    prefix = next((p for p, suffixes in _FILE_SUFFIXES.items() if base.endswith(suffixes)), None)
    if prefix is None and _is_file(name):
        prefix = "csv:"
    if prefix is not None:
        hint = f": a file is given as {prefix}PATH (did you mean {prefix + name!r}?)"
    else:
        longer = [k for k in known if k.startswith(name.lower())] if name else []
        close = longer or difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"Expected a dataset in {sorted(known)} or csv:PATH / libsvm:PATH. "
                       f"Got {name!r} instead{hint}.")


def _is_file(name: str) -> bool:
    try:
        return Path(name).expanduser().is_file()
    except (OSError, ValueError):  # a name the file system cannot take
        return False


def check_options(dataset: str, options: Mapping[str, object], allowed: Sequence[str]) -> None:
    """Reject options a loader does not know."""
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ConfigError(f"Expected options of dataset {dataset!r} in {sorted(allowed)}. "
                          f"Got {unknown} instead.")
