"""A partition's state on a compacted changelog topic: restorable from the cluster alone.

A :class:`Changelog` mirrors one partition's checkpoints and decision journal onto one
partition of a compacted topic (a :class:`~streamlearn.transport.keyed_log.KeyedLog`),
so that a replica with an empty disk restores what the previous owner had. The
local checkpoint directory stays, as a cache: a replica whose own last snapshot is
still the newest one in the changelog restores from disk.

**Records** (keys are ASCII; compaction keeps the newest value per key):

* ``c/<digest>`` — a **chunk**: a piece of one snapshot array's bytes, keyed by its
  BLAKE2b-128 digest. Arrays are cut where their content says (a rolling sum over 48
  bytes, :func:`content_cuts`), not at fixed offsets, so a row inserted or removed
  moves only the cuts next to it: a checkpoint writes only the chunks it does not
  share with the previous one. That is what makes the changelog incremental: the
  ~10 MB of recently closed ids of a busy partition are one append-only array whose
  old chunks are unchanged from one checkpoint to the next, and the pending joins'
  arrays change where decisions were added or closed.
* ``m`` — the **manifest** of a checkpoint: its sequence number, a random ``state``
  id, and for every array its dtype, shape and chunk digests (the snapshot's JSON is
  one of the arrays). It is written after all its chunks, in the same partition, so
  a manifest in the log has every chunk it names before it.
* ``j/<seq>/<writer>-<n>`` — **journal** records, on the log's journal lane (its own Kafka
  partition, so that their acknowledgement never waits behind chunks): the decision
  journal's lines (the same JSON lines as ``journal-<seq>.jsonl``), each batch
  written and acknowledged *before* its decisions are published. A restore from checkpoint ``s`` reuses the
  journaled decisions of ``seq >= s``, so a new owner re-emits what the previous one
  published, byte for byte.

After a manifest is committed, the chunks no later manifest names and the journal
records of older checkpoints get tombstones: compaction then keeps about one
checkpoint's worth of chunks plus the journal since it.

**Fencing.** The log is opened (fencing the previous writer) before it is read;
a fenced writer's next journal write fails, so a replica that lost its partition
cannot journal — and therefore cannot publish — another decision for it
(:class:`~streamlearn.transport.keyed_log.Fenced`).

>>> import numpy as np
>>> from streamlearn.transport.keyed_log import MemoryKeyedLogs
>>> logs = MemoryKeyedLogs()
>>> first = Changelog(logs.open("state", 0))
>>> first.restore().manifest is None  # an empty changelog
True
>>> first.publish(1, {"w": np.arange(6.0)}, {"seq": 1, "offsets": []})
>>> found = Changelog(logs.open("state", 0)).restore()
>>> found.seq, found.arrays["w"].tolist(), found.meta["seq"]
(1, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 1)
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from streamlearn.errors import StateError, TransportError
from streamlearn.transport.keyed_log import Fenced, KeyedLog

__all__ = ["Changelog", "ChangelogState", "content_cuts"]

log = logging.getLogger("streamlearn.changelog")

WINDOW = 48  # bytes in the rolling sum that places the cuts
CUT_MASK = (1 << 16) - 1  # a cut where the sum's low 16 bits are 0: chunks of ~64 KiB
MIN_CHUNK = 16 * 1024
MAX_CHUNK = 256 * 1024
_SCAN_BLOCK = 8 * 2**20  # bytes hashed per numpy pass (bounds the temporaries)
MANIFEST_KEY = b"m"
#: A journal record's largest size: well under the topic's 2 MB message limit (a batch of
#: 500 decisions over 2,000 actions is ~5.6 MB of lines; one record refused as too large
#: stopped the loop, found by an outside test)
JOURNAL_RECORD_BYTES = 512 * 1024
META_ARRAY = "__meta__"  # the snapshot's JSON, stored as one more array
#: The journal's transaction is committed at least this often (between checkpoints too): an
#: open transaction is aborted when its writer dies (the next writer's open) or outlives the
#: broker's transaction timeout (600 s: a checkpoint interval longer than that fenced the
#: writer, an outside test), and Kafka's cleaner removes an aborted transaction's records
JOURNAL_COMMIT_S = 30.0


def _gear_table() -> np.ndarray:
    """256 fixed pseudo-random 32-bit values; none makes a run of one repeated byte a cut
    everywhere (``WINDOW * g & CUT_MASK != 0``: a zero-filled array is cut at MAX_CHUNK)."""
    rng = np.random.default_rng(0x5EED)
    table = rng.integers(1, 2**32, 256, dtype=np.uint64)
    for b in range(256):
        while (int(table[b]) * WINDOW) & CUT_MASK == 0:
            table[b] = rng.integers(1, 2**32, dtype=np.uint64)
    return table.astype(np.uint32)


_GEAR = _gear_table()


def content_cuts(data: np.ndarray) -> np.ndarray:
    """Where to cut ``data`` (a 1-d uint8 array) into chunks: the chunks' end offsets.

    A position is a cut candidate when the wrapping sum of the gear values of the WINDOW
    bytes ending there has its low 16 bits at 0; a candidate less than MIN_CHUNK after the
    previous candidate is dropped (so chunks are >= MIN_CHUNK, but the last), and a chunk
    longer than MAX_CHUNK is cut every MAX_CHUNK. The cuts depend on the bytes around them
    only, so equal content is cut equally wherever it sits.

    >>> data = np.random.default_rng(1).integers(0, 256, 1_000_000, dtype=np.uint8)
    >>> cuts = content_cuts(data)
    >>> int(cuts[-1]) == len(data), bool((np.diff(np.r_[0, cuts])[:-1] >= MIN_CHUNK).all())
    (True, True)
    >>> shifted = content_cuts(np.r_[np.zeros(1000, np.uint8), data])
    >>> len(set((cuts + 1000).tolist()) & set(shifted.tolist())) >= len(cuts) - 2
    True
    """
    n = len(data)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    found = []
    for begin in range(0, n, _SCAN_BLOCK):
        lo = max(begin - WINDOW, 0)
        block = data[lo:min(begin + _SCAN_BLOCK, n)]
        sums = np.cumsum(_GEAR[block], dtype=np.uint32)  # wraps mod 2**32: still a rolling sum
        window = sums[WINDOW:] - sums[:-WINDOW] if len(sums) > WINDOW else sums[:0]
        ends = np.flatnonzero((window & CUT_MASK) == 0) + lo + WINDOW + 1  # cut after the window
        found.append(ends[ends > begin])
    candidates = np.concatenate(found)
    if len(candidates):
        gaps = np.diff(np.r_[0, candidates])
        candidates = candidates[gaps >= MIN_CHUNK]
    ends = np.r_[candidates[candidates < n], n].astype(np.int64)
    starts = np.r_[0, ends[:-1]]
    long = np.flatnonzero(ends - starts > MAX_CHUNK)
    if len(long):  # split what no content cut broke up
        extra = [np.arange(starts[i] + MAX_CHUNK, ends[i], MAX_CHUNK) for i in long.tolist()]
        ends = np.sort(np.r_[ends, np.concatenate(extra)])
    return ends


def _digest(piece: memoryview | bytes) -> str:
    return hashlib.blake2b(piece, digest_size=16).hexdigest()


def _chunk_key(digest: str) -> bytes:
    return b"c/" + digest.encode("ascii")


def _as_bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


@dataclass
class ChangelogState:
    """What :meth:`Changelog.restore` found: the newest complete checkpoint (``manifest``
    None: none), and the journal lines of that checkpoint on, by sequence number."""

    manifest: dict[str, Any] | None = None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    journal: dict[int, list[bytes]] = field(default_factory=dict)
    records: int = 0  # records read
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def seq(self) -> int:
        return int(self.manifest["seq"]) if self.manifest is not None else 0

    @property
    def state_id(self) -> str | None:
        return None if self.manifest is None else str(self.manifest["state"])


@dataclass
class _Scan:
    """What a read of the log found."""

    manifests: list[dict[str, Any]]  # in log order
    chunks: dict[bytes, bytes]  # by key (empty when the chunks were not fetched)
    journal: dict[int, list[tuple[bytes, bytes]]]  # (key, lines) by checkpoint
    records: int
    bytes_read: int
    seconds: float


def _chunk_keys(manifest: dict[str, Any] | None) -> set[bytes]:
    """The keys of every chunk ``manifest`` names."""
    if manifest is None:
        return set()
    return {_chunk_key(d) for spec in manifest["arrays"].values() for d in spec["chunks"]}


class Changelog:
    """One partition's checkpoints and journal on a :class:`KeyedLog` (module docstring).

    The journal is written from the serving thread, checkpoints may be published from a
    writer thread: the log serialises them (a commit waits for every record sent).
    """

    def __init__(self, keyed_log: KeyedLog) -> None:
        self.log = keyed_log
        self.stored: set[bytes] = set()  # chunk keys in the log: the last manifest's + unsure
        self.journal_keys: dict[int, list[bytes]] = {}  # journal records written, by seq
        self._journal_count = 0
        # in every journal key: the next owner appends to the same checkpoint's journal, and
        # must never replace a record of this one (compaction keeps one value per key)
        self._writer = uuid.uuid4().hex[:12]
        self._garbage: set[bytes] = set()  # chunk keys a restore found that nothing needs
        self._old_journal: set[bytes] = set()  # journal keys a restore found that nothing needs
        self.chunks_written = 0
        self.bytes_written = 0
        # an offset of the state lane at or before every record written there from now on (a
        # restore's tail scan of the local copy's checkpoint starts there)
        self.resume_offset = 0
        self._lock = threading.Lock()  # journal_keys: the serving thread and the writer's
        self._committed_at = time.monotonic()  # the last commit of the log's transaction
        self._publishing = False  # a checkpoint is being written (its commit comes soon)
        self.where = "its partition"  # named in log lines (the checkpointer names its directory)

    # ------------------------------------------------------------------ writing
    def journal(self, seq: int, lines: bytes) -> None:
        """Write one batch of journal lines for checkpoint ``seq`` and wait for the broker to
        have it (before the decisions are published); Fenced when another writer owns it. A
        batch larger than JOURNAL_RECORD_BYTES goes in several records, cut between lines."""
        for part in _record_parts(lines, JOURNAL_RECORD_BYTES):
            self._journal_count += 1
            key = f"j/{seq}/{self._writer}-{self._journal_count}".encode("ascii")
            self.log.send_and_wait(key, part, journal=True)
            with self._lock:
                self.journal_keys.setdefault(seq, []).append(key)
        # not while a checkpoint is written: its commit would wait for the chunks in flight
        if time.monotonic() - self._committed_at >= JOURNAL_COMMIT_S and not self._publishing:
            self.log.commit()
            self._committed_at = time.monotonic()

    def journal_again(self, batches: dict[int, bytes]) -> None:
        """Journal lines a restore reuses from a local disk (by checkpoint), written as this
        writer's and committed at once (:meth:`_recommit` does the same for what the
        changelog itself held)."""
        for seq, lines in sorted(batches.items()):
            self.journal(seq, lines)
        self.log.commit()
        self._committed_at = time.monotonic()
        log.info("changelog: %d journal lines of the local disk committed again (for %s)",
                 sum(lines.count(b"\n") for lines in batches.values()), self.where)

    def publish(self, seq: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        """Write checkpoint ``seq``: the chunks the log does not hold, the manifest, commit;
        then tombstones for what the committed manifest made obsolete. ``meta`` gets the
        manifest's ``state`` id (written with the local snapshot, it says whether the local
        copy is the changelog's newest)."""
        self._publishing = True
        try:
            self._publish(seq, arrays, meta)
        finally:
            self._publishing = False

    def _publish(self, seq: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        state = str(meta.get("changelog_state") or uuid.uuid4().hex)
        meta_bytes = np.frombuffer(orjson.dumps(meta, option=orjson.OPT_SERIALIZE_NUMPY),
                                   dtype=np.uint8)
        described: dict[str, Any] = {}
        needed: set[bytes] = set()
        new_bytes = 0
        for name, array in [*arrays.items(), (META_ARRAY, meta_bytes)]:
            data = _as_bytes(np.asarray(array))
            view = memoryview(data)  # type: ignore[arg-type]
            digests = []
            start = 0
            for end in content_cuts(data).tolist():
                piece = view[start:end]
                digest = _digest(piece)
                digests.append(digest)
                key = _chunk_key(digest)
                if key not in self.stored and key not in needed:
                    self.log.send(key, bytes(piece))
                    self.chunks_written += 1
                    new_bytes += end - start
                needed.add(key)
                start = end
            described[name] = {"dtype": np.asarray(array).dtype.str,
                               "shape": list(np.asarray(array).shape), "chunks": digests}
        manifest = {"seq": seq, "state": state, "arrays": described, "written_at": time.time()}
        at = self.log.send_and_wait(MANIFEST_KEY, orjson.dumps(manifest))
        self.log.commit()
        self._committed_at = time.monotonic()
        self.resume_offset = at + 1  # the next checkpoint's records all come after
        self.bytes_written += new_bytes
        obsolete = (self.stored | self._garbage) - needed
        with self._lock:
            old_journal = {k for s, keys in self.journal_keys.items() if s < seq for k in keys}
            self.journal_keys = {s: keys for s, keys in self.journal_keys.items() if s >= seq}
        for key in sorted(obsolete):  # in the next transaction: this manifest is committed
            self.log.send(key, None)
        for key in sorted(old_journal | self._old_journal):
            self.log.send(key, None, journal=True)
        self._old_journal = set()
        self.stored, self._garbage = needed, set()
        log.debug("changelog checkpoint %d: %d new chunks (%d bytes), %d tombstones", seq,
                  self.chunks_written, new_bytes, len(obsolete))

    # ------------------------------------------------------------------ reading
    def restore(self, local_state: str | None = None, local_from: int = 0) -> ChangelogState:
        """The newest complete checkpoint in the log and the journal from it on.

        With ``local_state`` (the ``state`` of the local newest snapshot, written from offset
        ``local_from`` on) only the tail from ``local_from`` is read first: if its newest
        manifest is that state, the local snapshot is current and no chunk is fetched
        (``manifest`` set, ``arrays`` empty). Otherwise the whole partition is read.
        """
        began = time.perf_counter()
        journal, journal_records, journal_bytes = self._read_journal()
        self._recommit(journal)  # first: until then, the dead writer's journal is aborted
        if local_state is not None:
            tail = self._scan(local_from, fetch_chunks=False, journal=journal)
            if tail.manifests and tail.manifests[-1]["state"] == local_state:
                newest = tail.manifests[-1]
                self._adopt(newest, set(), journal)
                return ChangelogState(newest, journal=_journal_from(journal, int(newest["seq"])),
                                      records=tail.records + journal_records,
                                      bytes_read=tail.bytes_read + journal_bytes,
                                      seconds=time.perf_counter() - began)
        scan = self._scan(0, fetch_chunks=True, journal=journal)
        state = ChangelogState(records=scan.records + journal_records,
                               bytes_read=scan.bytes_read + journal_bytes)
        for manifest in reversed(scan.manifests):  # the newest one whose chunks are all there
            try:
                arrays = {name: _assemble(name, spec, scan.chunks)
                          for name, spec in manifest["arrays"].items()}
            except StateError as exc:
                log.warning("changelog checkpoint %s is incomplete, trying an older one: %s",
                            manifest.get("seq"), exc)
                continue
            meta_array = arrays.pop(META_ARRAY)
            state.manifest, state.arrays = manifest, arrays
            state.meta = orjson.loads(meta_array.tobytes())
            break
        self._adopt(state.manifest, set(scan.chunks), journal)
        state.journal = _journal_from(journal, state.seq)
        state.seconds = time.perf_counter() - began
        return state

    def _adopt(self, manifest: dict[str, Any] | None, chunks_seen: set[bytes],
               journal: dict[int, list[tuple[bytes, bytes]]]) -> None:
        """Take over the log as a restore found it: the chunks ``manifest`` names are stored;
        the other ``chunks_seen`` and the journal records of older checkpoints are garbage,
        tombstoned after this writer's first checkpoint."""
        seq = int(manifest["seq"]) if manifest is not None else 0
        self.stored = _chunk_keys(manifest)
        self._garbage = chunks_seen - self.stored
        self._old_journal = {k for s, keys in journal.items() if s < seq for k, _ in keys}
        self.journal_keys = {s: [k for k, _ in keys] for s, keys in journal.items() if s >= seq}

    def _recommit(self, journal: dict[int, list[tuple[bytes, bytes]]]) -> None:
        """Write every journal record a restore found once more, in a transaction of this
        writer, and commit it — before anything else is read. The previous writer's last
        records are in its open transaction, which this writer's open aborted; Kafka's log
        cleaner removes an aborted transaction's records once it compacts their segment, so
        a later owner would have restored without them and decided those events again,
        differently (an outside test: 1,437 ids decided twice after a kill -9 and a move;
        with the commit after the state lane's read, a writer killed while reading lost
        them the same way). The copies keep their keys: compaction keeps one of each; the
        records of checkpoints older than the one restored are tombstoned at this writer's
        first checkpoint, as before."""
        if not self.log.writes:  # a reader (inspection) writes nothing
            return
        records = [(key, value) for s in sorted(journal) for key, value in journal[s]]
        if not records:
            return
        for key, value in records:
            self.log.send(key, value, journal=True)
        self.log.commit()
        self._committed_at = time.monotonic()
        log.info("changelog: %d journal records of the previous writer committed again (for %s)",
                 len(records), self.where)

    def _read_journal(self) -> tuple[dict[int, list[tuple[bytes, bytes]]], int, int]:
        """The journal lane, committed or not (a batch is journaled before its decisions are
        published; what a dead writer journaled is in its aborted transaction): its records
        by checkpoint, the records read and their bytes."""
        journal: dict[bytes, bytes] = {}
        records = read = 0
        for _offset, key, value in self.log.records(journal=True):  # small: read it all
            records += 1
            read += len(value or b"")
            if value is None:
                journal.pop(key, None)
            elif key.startswith(b"j/"):
                journal[key] = value
        by_seq: dict[int, list[tuple[bytes, bytes]]] = {}
        for key, value in journal.items():
            parts = key.split(b"/")
            if len(parts) == 3 and parts[1].isdigit():
                by_seq.setdefault(int(parts[1]), []).append((key, value))
        return by_seq, records, read

    def _scan(self, start: int, fetch_chunks: bool,
              journal: dict[int, list[tuple[bytes, bytes]]]) -> _Scan:
        """The state lane from ``start`` (``journal``: the journal lane, read before); a
        tombstone removes its key."""
        began = time.perf_counter()
        manifests: list[dict[str, Any]] = []
        chunks: dict[bytes, bytes] = {}
        records = read = 0
        # the state lane committed: a checkpoint whose commit never came (its writer killed
        # between the manifest and the commit) is aborted, and the cleaner removes its chunks
        for offset, key, value in self.log.records(start, committed=True):
            self.resume_offset = max(self.resume_offset, offset + 1)
            records += 1
            read += len(value or b"")
            if key == MANIFEST_KEY:
                if value is not None:
                    try:
                        manifest = orjson.loads(value)
                    except orjson.JSONDecodeError:
                        manifest = None
                    if not _manifest_ok(manifest):
                        log.warning("changelog: the record at offset %d is not a manifest (expected "
                                    "JSON with an int seq, a string state and the arrays, "
                                    "%s among them; got %r): skipped", offset, META_ARRAY,
                                    value[:80])
                        continue
                    manifests.append(manifest)
            elif key.startswith(b"c/"):
                if value is None:
                    chunks.pop(key, None)
                elif fetch_chunks:
                    chunks[key] = value
        return _Scan(manifests, chunks, journal, records, read, time.perf_counter() - began)

    def close(self) -> None:
        self.log.close()


def _record_parts(lines: bytes, limit: int) -> list[bytes]:
    """``lines`` (newline-terminated) in pieces of at most ``limit`` bytes, cut after a newline
    (a single longer line is a piece of its own).

    >>> _record_parts(b"aa\\nbb\\ncc\\n", 6)
    [b'aa\\nbb\\n', b'cc\\n']
    """
    parts, start = [], 0
    while len(lines) - start > limit:
        cut = lines.rfind(b"\n", start, start + limit) + 1
        if cut <= start:  # one line longer than the limit
            cut = lines.find(b"\n", start + limit) + 1 or len(lines)
        parts.append(lines[start:cut])
        start = cut
    if start < len(lines) or not parts:
        parts.append(lines[start:])
    return parts


def _manifest_ok(manifest: Any) -> bool:
    return (isinstance(manifest, dict) and isinstance(manifest.get("seq"), int)
            and isinstance(manifest.get("state"), str) and isinstance(manifest.get("arrays"), dict)
            and META_ARRAY in manifest["arrays"])


def _journal_from(journal: dict[int, list[tuple[bytes, bytes]]], seq: int) -> dict[int, list[bytes]]:
    return {s: [value for _, value in records] for s, records in sorted(journal.items())
            if s >= seq}


def _assemble(name: str, spec: Any, chunks: dict[bytes, bytes]) -> np.ndarray:
    """One array from its chunks, each checked against its digest (StateError if one is
    missing, damaged, or the bytes do not make the shape)."""
    try:
        dtype, shape = np.dtype(spec["dtype"]), tuple(int(n) for n in spec["shape"])
        digests: Iterable[str] = spec["chunks"]
    except (KeyError, TypeError, ValueError) as exc:
        raise StateError(f"array {name!r}: its manifest entry is malformed ({exc})") from exc
    if dtype.hasobject:
        raise StateError(f"array {name!r}: object arrays are never stored")
    buffer = bytearray()
    for digest in digests:
        piece = chunks.get(_chunk_key(str(digest)))
        if piece is None:
            raise StateError(f"array {name!r}: chunk {digest} is not in the changelog")
        if _digest(piece) != digest:
            raise StateError(f"array {name!r}: chunk {digest} does not match its digest")
        buffer += piece
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(buffer) != expected:
        raise StateError(f"array {name!r}: {len(buffer)} bytes for shape {shape} of {dtype} "
                         f"({expected} expected)")
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)


def write_or_warn(changelog: Changelog, seq: int, arrays: dict[str, np.ndarray],
                  meta: dict[str, Any]) -> bool:
    """Publish a checkpoint; a transport failure (the broker away) is logged and the snapshot
    stays local only (the next checkpoint publishes again). Fenced propagates."""
    try:
        changelog.publish(seq, arrays, meta)
        return True
    except Fenced:
        raise
    except TransportError as exc:
        log.warning("checkpoint %d not written to the changelog (kept locally; the next one "
                    "is): %s", seq, exc)
        return False
