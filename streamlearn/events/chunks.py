"""Decoding a poll in chunks of about :data:`CHUNK_BYTES` of message values.

A decoder parses every message it is given before it builds the feature arrays, so
the parsed JSON of all of them is alive at once: a 1.6 KB instance of 400 floats
is ~13 KB of Python objects, a 42 KB candidate request ~150 KB. Over a poll of 500
messages (6.5 MB, 75 MB) that no longer stays in the caches, and parsing plus
conversion cost 12–14 µs per instance instead of 11, and 340 µs per candidate
request instead of 165 (docs/performance.md, "Decoding in chunks"). Chunks of
~256 KB of values stay cached; their batches are concatenated afterwards (a copy of
the arrays, a few µs per message at most).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TypeVar

import numpy as np

from streamlearn.events.raw import RawMessage, Rejection

__all__ = ["CHUNK_BYTES", "chunks", "decode_in_chunks"]

CHUNK_BYTES = 256 * 1024

_B = TypeVar("_B")


def chunks(messages: Sequence[RawMessage], limit: int) -> list[Sequence[RawMessage]]:
    """Consecutive runs of ``messages`` with about ``limit`` bytes of values each (a run
    closes after the message that reaches the limit; one message larger than the limit is
    a run of its own)."""
    if len(messages) <= 1:
        return [messages]
    sizes = [len(m.value or b"") for m in messages]
    if sum(sizes) < limit:  # the small batch of ordinary load: one run, no numpy calls
        return [messages]
    ends = np.cumsum(sizes)
    cuts = np.searchsorted(ends, np.arange(limit, int(ends[-1]) + 1, limit), side="left") + 1
    bounds = [0, *np.unique(np.minimum(cuts, len(messages))).tolist()]
    if bounds[-1] != len(messages):
        bounds.append(len(messages))
    return [messages[a:b] for a, b in pairwise(bounds)]


def decode_in_chunks(
    decode: Callable[[Sequence[RawMessage]], tuple[_B, list[Rejection]]],
    concatenate: Callable[[list[_B]], _B],
    messages: Sequence[RawMessage],
) -> tuple[_B, list[Rejection]]:
    """``decode`` applied chunk by chunk (:data:`CHUNK_BYTES`, read at each call): the chunks'
    batches concatenated in order, and their rejections (a chunk's own in the order ``decode``
    gives them, chunk after chunk)."""
    parts = [decode(chunk) for chunk in chunks(messages, CHUNK_BYTES)]
    if len(parts) == 1:
        return parts[0]
    return concatenate([batch for batch, _ in parts]), [r for _, bad in parts for r in bad]
