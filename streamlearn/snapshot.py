"""Atomic, checksummed snapshots: named arrays (.npz, no pickle) + JSON metadata.

A snapshot is a directory holding ``arrays.npz`` and ``meta.json`` (and
nothing else). ``meta.json`` carries the format version, the package version,
the sha256 of ``arrays.npz``, the caller's metadata and ``meta_sha256``: the
sha256 of its own canonical content (every other key, sorted), so that one
flipped bit in an offset or a counter is caught too (snapshots written before
it existed have none and are read as they are). Writing goes to a sibling
temporary directory that is fsynced and then renamed over the target, so a
reader sees the old snapshot or the new one, never a mix; an existing target
is replaced only if it is a snapshot itself (or an empty directory), never a
file or a directory holding anything else. Reading verifies everything and
raises :class:`~streamlearn.errors.StateError` with a clear message on any
mismatch — never a crash deep inside numpy.

>>> import tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> write_snapshot(d + "/s", {"w": np.eye(2)}, {"kind": "demo"})
>>> arrays, meta = read_snapshot(d + "/s")
>>> arrays["w"].tolist(), meta["kind"]
([[1.0, 0.0], [0.0, 1.0]], 'demo')
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import uuid
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from streamlearn import __version__
from streamlearn.errors import StateError

__all__ = ["FORMAT_VERSION", "check_replaceable", "meta_checksum", "pack_strings", "read_snapshot",
           "replace_file",
           "unpack_strings", "write_snapshot"]

FORMAT_VERSION = 1
ARRAYS_FILE = "arrays.npz"
META_FILE = "meta.json"
META_SHA256 = "meta_sha256"
_RESERVED = ("format_version", "arrays_sha256", META_SHA256)  # written by us, never the caller's


def meta_checksum(meta: dict[str, Any]) -> str:
    """sha256 of ``meta``'s canonical JSON (sorted keys), without its own ``meta_sha256``.

    ``meta`` is JSON as parsed back (plain str/int/float/list/dict), so the same content always
    gives the same bytes: orjson writes the shortest float that parses back exactly.
    """
    body = {k: v for k, v in meta.items() if k != META_SHA256}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Raise ``StateError`` unless :func:`write_snapshot` may replace what is at ``path``.

    Nothing there, an empty directory, or a snapshot (a directory holding only
    ``meta.json`` and ``arrays.npz``, both regular files) may be replaced; a file, a
    symbolic link, a device or a directory holding anything else is never touched.
    """
    target = Path(path)
    try:
        if not os.path.lexists(target):
            return
        if target.is_symlink():
            problem = "it is a symbolic link"
        elif not target.is_dir():
            problem = "it is not a directory" + (" (a regular file)" if target.is_file() else "")
        else:
            entries = sorted(os.listdir(target))
            unexpected = [e for e in entries if e not in (META_FILE, ARRAYS_FILE)
                          or not (target / e).is_file() or (target / e).is_symlink()]
            problem = (f"it holds {_names(unexpected)}, which a snapshot does not"
                       if unexpected else "")
    except OSError as exc:
        problem = f"it cannot be examined ({exc.strerror or exc})"
    if problem:
        raise StateError(f"Refusing to replace {str(target)!r} by a snapshot: {problem}. "
                         f"Expected a new path, an empty directory or a snapshot written by "
                         f"streamlearn ({META_FILE} + {ARRAYS_FILE}).")


def _names(entries: list[str], limit: int = 3) -> str:
    shown = ", ".join(repr(e) for e in entries[:limit])
    return shown + (f" and {len(entries) - limit} more" if len(entries) > limit else "")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, payload: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())


def replace_file(path: str | os.PathLike[str], payload: bytes) -> None:
    """Write ``payload`` as the file ``path`` atomically: a sibling temporary file, fsynced,
    renamed over it (a reader or a crash sees the old file or the new one, whole)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    _write_file(tmp, payload)
    os.replace(tmp, target)


def write_snapshot(path: str | os.PathLike[str], arrays: dict[str, np.ndarray],
                   meta: dict[str, Any]) -> None:
    """Write ``arrays`` + ``meta`` atomically to the directory ``path``.

    An existing ``path`` is replaced only if :func:`check_replaceable` allows it (a previous
    snapshot, an empty directory); anything else raises ``StateError`` and is left as it is.
    """
    target = Path(path)
    check_replaceable(target)
    objects = sorted(k for k, v in arrays.items() if np.asarray(v).dtype.hasobject)
    if objects:
        raise StateError(f"Snapshots hold plain numeric arrays only; {objects} are object arrays.")
    target.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.ascontiguousarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]
    payload = buffer.getvalue()
    full_meta = {
        "format_version": FORMAT_VERSION,
        "package_version": __version__,
        "arrays_sha256": hashlib.sha256(payload).hexdigest(),
        **{k: v for k, v in meta.items() if k not in _RESERVED},
    }
    # the checksum covers the content as a reader parses it back
    parsed = orjson.loads(orjson.dumps(full_meta, option=orjson.OPT_SERIALIZE_NUMPY))
    parsed[META_SHA256] = meta_checksum(parsed)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        _write_file(tmp / ARRAYS_FILE, payload)
        _write_file(tmp / META_FILE, orjson.dumps(parsed))
        _fsync_dir(tmp)
        old = None
        check_replaceable(target)  # again: it may have changed while we wrote
        if os.path.lexists(target):
            # rename the old one away first: a directory cannot be renamed over a non-empty one
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex}"
            os.rename(target, old)
        try:
            os.rename(tmp, target)
        except BaseException:
            if old is not None:  # put the previous snapshot back
                os.rename(old, target)
            raise
        _fsync_dir(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_snapshot(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read and verify a snapshot written by :func:`write_snapshot`."""
    target = Path(path)
    meta_path, arrays_path = target / META_FILE, target / ARRAYS_FILE
    if not meta_path.is_file() or not arrays_path.is_file():
        raise StateError(
            f"{target} is not a streamlearn snapshot: expected {META_FILE} and {ARRAYS_FILE} inside."
        )
    try:
        meta = orjson.loads(meta_path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise StateError(f"{meta_path} is corrupt (not valid JSON: {exc}).") from exc
    if not isinstance(meta, dict):
        raise StateError(f"{meta_path} is corrupt: expected a JSON object, got {type(meta).__name__}.")
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise StateError(
            f"{target} has snapshot format version {version!r}; this streamlearn reads version "
            f"{FORMAT_VERSION}."
        )
    recorded = meta.pop(META_SHA256, None)  # absent in snapshots written before it existed
    if recorded is not None and recorded != meta_checksum(meta):
        raise StateError(
            f"{meta_path} is corrupt: the sha256 of its content {meta_checksum(meta)[:12]}… does "
            f"not match the recorded {str(recorded)[:12]}…."
        )
    payload = arrays_path.read_bytes()
    digest = hashlib.sha256(payload).hexdigest()
    expected = meta.get("arrays_sha256")
    if expected is None:  # a meta.json edited or written by hand: no checksum to hold it to
        raise StateError(f"{meta_path} records no arrays_sha256: expected the sha256 of "
                         f"{arrays_path.name}, got none")
    if digest != expected:
        raise StateError(
            f"{arrays_path} is corrupt or truncated: sha256 {digest[:12]}… does not match the "
            f"recorded {str(expected)[:12]}…."
        )
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise StateError(f"{arrays_path} cannot be read as arrays: {exc}") from exc
    return arrays, meta


def pack_strings(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as arrays that round-trip byte for byte: (UTF-8 bytes, end offsets).

    numpy's ``U``/``S`` dtypes strip trailing NULs, so ids like ``"a\\x00"`` are
    stored as their concatenated UTF-8 bytes plus each string's end offset.

    >>> unpack_strings(*pack_strings(["a\\x00", "\\x00", "é😀", ""]))
    ['a\\x00', '\\x00', 'é😀', '']
    """
    encoded = [s.encode("utf-8") for s in strings]
    ends = np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))
    return np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), ends


def unpack_strings(data: np.ndarray, ends: np.ndarray) -> list[str]:
    """Inverse of :func:`pack_strings` (raises ``StateError`` on inconsistent arrays)."""
    raw = np.asarray(data, dtype=np.uint8).tobytes()
    ends = np.asarray(ends, dtype=np.int64)
    if ends.ndim != 1 or (len(ends) and (ends[-1] != len(raw) or (np.diff(ends) < 0).any()
                                         or ends[0] < 0)) or (not len(ends) and raw):
        raise StateError("Packed strings are inconsistent: offsets do not match the bytes.")
    starts = np.concatenate([[0], ends])[:-1].tolist()
    try:
        return [raw[a:b].decode("utf-8") for a, b in zip(starts, ends.tolist(), strict=True)]
    except UnicodeDecodeError as exc:
        raise StateError(f"Packed strings are not valid UTF-8: {exc}") from exc
