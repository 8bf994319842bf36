"""Event contracts (docs/daemon.md §2): decode raw Kafka values into typed batches or rejections.

Every raw value is either accepted into a batch or turned into a
:class:`Rejection` with a stable snake_case ``reason`` and a detail that says
what was wrong (which field or feature, expected vs got); decoding never
raises on bad input and never lets NaN/inf or absurd magnitudes through. The
per-message work is one ``orjson.loads`` and a few type checks; the numeric
arrays of a whole micro-batch are then built in one shot.

Modules: :mod:`~streamlearn.events.raw` (bytes → JSON object, id, timestamp,
limits), :mod:`~streamlearn.events.payload` (the ``x`` forms and their
checks), :mod:`~streamlearn.events.instances`, :mod:`~streamlearn.events.feedback`.

Reasons: ``invalid_utf8``, ``invalid_json``, ``not_object``, ``too_large``,
``nesting_too_deep``, ``missing_id``, ``id_too_long``, ``bad_id_type``,
``bad_timestamp``, ``bad_features``, ``wrong_dimension``, ``non_finite``,
``value_out_of_range``, ``bad_actions``, ``bad_label``, ``bad_reward``; the
join adds ``unknown_id`` and ``duplicate_id``.

>>> from collections import namedtuple
>>> Message = namedtuple("Message", "topic partition offset key value timestamp_ms")
>>> msgs = [Message("in", 0, 0, b"a", b'{"id": "a", "x": [1, 0, 2]}', 1000),
...         Message("in", 0, 1, b"b", b'{"id": "b", "x": [1, 0]}', 1000),
...         Message("in", 0, 2, b"c", b'{"id": "c", "x": [1, 1e308, 2]}', 1000)]
>>> batch, rejected = decode_instances(msgs, n_features=3, n_actions=2)
>>> batch.ids, batch.X.tolist(), [r.reason for r in rejected]
(['a'], [[1.0, 0.0, 2.0]], ['wrong_dimension', 'value_out_of_range'])
>>> rejected[1].detail
'x[1] = 1e+308 is beyond ±1e+12 (limits.max_abs_feature)'
"""

from __future__ import annotations

from streamlearn.events.feedback import FeedbackBatch, decode_feedback
from streamlearn.events.instances import InstanceBatch, decode_instances
from streamlearn.events.raw import DecodeLimits, RawMessage, Rejection

__all__ = ["REASONS", "DecodeLimits", "FeedbackBatch", "InstanceBatch", "RawMessage",
           "Rejection", "decode_feedback", "decode_instances"]

REASONS = (
    "invalid_utf8", "invalid_json", "not_object", "too_large", "nesting_too_deep",
    "missing_id", "id_too_long", "bad_id_type", "bad_timestamp", "bad_features",
    "wrong_dimension", "non_finite", "value_out_of_range", "bad_actions", "bad_label",
    "bad_baseline", "bad_reward", "bad_feedback_type", "unknown_id", "duplicate_id",
    # candidate-set requests (events/candidates.py)
    "bad_candidates", "too_many_candidates", "bad_candidate_id", "duplicate_candidate_id",
    "bad_slots",
)
