"""Learner states as models-topic messages: arrays + JSON (no pickle), chunked under a limit.

A state is encoded as ``STATE_MAGIC | 4-byte layout length | layout JSON | raw
arrays``: the layout JSON holds the metadata and, per array, its name, dtype,
shape and byte offset; the arrays follow, each aligned to 8 bytes. Decoding is
one ``np.frombuffer`` per array (an ``.npz`` — a zip archive — cost 0.4–0.5 ms
per state to read, in every replica, several times a second; this format
≈ 0.03 ms). Object arrays are refused (no pickle), and an ``.npz`` blob (the
format before) still decodes. A state travels as ``n`` chunk messages,
each ``MAGIC | 4-byte header length | header JSON | payload slice``; the header
names the sender, the state (``kind``, ``partition``, ``seq`` / ``version``)
and the chunk (``i`` of ``n``), plus the payload's sha256. :class:`Assembler`
rebuilds a state when all its chunks have arrived (a newer ``seq`` of the same
key drops an incomplete older one).

>>> blob = encode_state({"w": np.arange(3.0)}, {"class": "X"})
>>> messages = chunk({"kind": "global", "version": 2, "included": []}, blob, max_bytes=40)
>>> assembler = Assembler()
>>> done = [assembler.add(m) for m in messages][-1]
>>> done[0]["version"], done[1]["w"].tolist(), done[2]
(2, [0.0, 1.0, 2.0], {'class': 'X'})
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
from typing import Any

import numpy as np
import orjson

from streamlearn.errors import StateError

__all__ = ["MAGIC", "Assembler", "chunk", "decode_state", "encode_state"]

MAGIC = b"SLM1"
STATE_MAGIC = b"SLS1"
META = "__meta__"
_ALIGN = 8
_PLAIN_DTYPE = re.compile(r"[<>|=][biufcUS]\d+")  # dtype.str of numbers, booleans and text


def encode_state(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    """``arrays`` (numeric, bool or fixed-width text; no objects) and ``meta`` as one blob."""
    layout, pieces, offset = [], [], 0
    for name, value in arrays.items():
        array = np.asarray(value, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
        if not _PLAIN_DTYPE.fullmatch(array.dtype.str):
            raise StateError(f"Cannot encode the array {name!r} of dtype {array.dtype} (plain "
                             "numbers, booleans and fixed-width text only: no objects, no "
                             "pickle in states).")
        layout.append([name, array.dtype.str, list(array.shape), offset])
        pad = -array.nbytes % _ALIGN
        pieces += [array.tobytes(), b"\0" * pad]
        offset += array.nbytes + pad
    head = orjson.dumps({"meta": meta, "arrays": layout})
    head += b" " * (-(len(STATE_MAGIC) + 4 + len(head)) % _ALIGN)  # arrays start aligned
    return b"".join([STATE_MAGIC, struct.pack(">I", len(head)), head, *pieces])


def decode_state(blob: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The (arrays, meta) of :func:`encode_state` (writable copies); StateError if damaged."""
    if blob[:2] == b"PK":  # an .npz state, as published before this format
        return _decode_npz(blob)
    try:
        if blob[:4] != STATE_MAGIC:
            raise ValueError("no state magic")
        (size,) = struct.unpack(">I", blob[4:8])
        head = orjson.loads(blob[8:8 + size])
        data = memoryview(blob)[8 + size:]
        arrays = {}
        for name, dtype_str, shape, offset in head["arrays"]:
            # only what encode_state writes: numpy parses other dtype strings with ast
            if not (isinstance(dtype_str, str) and _PLAIN_DTYPE.fullmatch(dtype_str)):
                raise ValueError(f"array {name!r} has the dtype {dtype_str!r}")
            dtype = np.dtype(dtype_str)
            if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)
                    and type(offset) is int and offset >= 0):
                raise ValueError(f"array {name!r} has the shape {shape!r} at {offset!r}")
            count = int(np.prod(shape, dtype=np.int64))
            if offset + count * dtype.itemsize > len(data):
                raise ValueError(f"array {name!r} runs past the end of the state")
            arrays[str(name)] = np.frombuffer(data, dtype=dtype, count=count,
                                              offset=offset).reshape(tuple(shape)).copy()
        return arrays, dict(head["meta"])
    except (ValueError, TypeError, KeyError, struct.error, orjson.JSONDecodeError) as exc:
        raise StateError(f"A models-topic state does not decode: {exc}") from exc


def _decode_npz(blob: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files if k != META}
            meta = orjson.loads(data[META].tobytes())
    except (ValueError, OSError, KeyError, orjson.JSONDecodeError) as exc:
        raise StateError(f"A models-topic state does not decode: {exc}") from exc
    return arrays, meta


def chunk(header: dict[str, Any], blob: bytes, max_bytes: int = 900_000) -> list[bytes]:
    """The messages of one state: ``header`` plus chunk numbering and the blob's sha256."""
    n = max(1, -(-len(blob) // max_bytes))
    digest = hashlib.sha256(blob).hexdigest()
    out = []
    for i in range(n):
        head = orjson.dumps({**header, "i": i, "n": n, "sha256": digest})
        out.append(MAGIC + struct.pack(">I", len(head)) + head
                   + blob[i * max_bytes:(i + 1) * max_bytes])
    return out


def parse(value: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, payload slice) of one chunk message; StateError if it is not one."""
    if len(value) < 8 or value[:4] != MAGIC:
        raise StateError("Expected a models-topic chunk (magic SLM1). Got something else.")
    (size,) = struct.unpack(">I", value[4:8])
    try:
        header = orjson.loads(value[8:8 + size])
    except orjson.JSONDecodeError as exc:
        raise StateError(f"A models-topic chunk header is not JSON: {exc}") from exc
    return header, value[8 + size:]


# the fields a chunk header must carry, by kind, with their types (anything else on the
# models topic is skipped as a StateError, never a crash of the replica reading it)
_COMMON = {"i": int, "n": int, "sha256": str}
_BY_KIND: dict[str, dict[str, type]] = {
    "global": {"version": int, "included": list},
    "replica": {"replica": str, "seq": int, "base_version": int, "examples": int},
}
_OPTIONAL: dict[str, type | tuple[type, ...]] = {"made_at": (int, float), "states_from": int}


def _check_header(header: Any) -> None:
    kind = header.get("kind") if isinstance(header, dict) else None
    if kind not in _BY_KIND:
        raise StateError(f"A models-topic chunk of an unknown kind: {kind!r}.")
    for name, kind_type in {**_COMMON, **_BY_KIND[kind]}.items():
        value = header.get(name)
        if not isinstance(value, kind_type) or isinstance(value, bool):
            raise StateError(f"A {kind} chunk header needs {name!r} ({kind_type.__name__}); "
                             f"got {value!r}.")
    for name, types in _OPTIONAL.items():
        value = header.get(name)
        if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
            raise StateError(f"A {kind} chunk header's {name!r} is {value!r}.")
    if not 0 <= header["i"] < header["n"]:
        raise StateError(f"A models-topic chunk numbered {header['i']} of {header['n']}.")
    if kind == "global" and not all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
            and isinstance(p[1], int) for p in header["included"]):
        raise StateError("A global model's 'included' must be [replica, seq] pairs.")


def _key(header: dict[str, Any]) -> tuple[Any, ...]:
    return (header.get("kind"), header.get("partition"), header.get("replica"))


class Assembler:
    """Collects chunks; :meth:`add` returns (header, arrays, meta) when a state is complete
    (:meth:`add_raw`: (header, checked blob), to decode later, or never)."""

    def __init__(self) -> None:
        self._parts: dict[tuple[Any, ...], tuple[Any, dict[int, bytes]]] = {}

    def add(self, value: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray],
                                         dict[str, Any]] | None:
        done = self.add_raw(value)
        if done is None:
            return None
        arrays, meta = decode_state(done[1])
        return done[0], arrays, meta

    def add_raw(self, value: bytes) -> tuple[dict[str, Any], bytes] | None:
        header, payload = parse(value)
        _check_header(header)
        key, ident = _key(header), (header.get("seq"), header.get("version"), header["sha256"])
        current = self._parts.get(key)
        if current is None or current[0] != ident:
            current = (ident, {})
            self._parts[key] = current
        current[1][int(header["i"])] = payload
        if len(current[1]) < int(header["n"]):
            return None
        del self._parts[key]
        blob = b"".join(current[1][i] for i in range(int(header["n"])))
        if hashlib.sha256(blob).hexdigest() != header["sha256"]:
            raise StateError("A models-topic state failed its sha256 check.")
        return header, blob
