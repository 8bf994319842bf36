"""Helpers of the unit tests that drive a daemon over the in-memory transport."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import orjson

from streamlearn.service.settings import DaemonSettings


class Clock:
    """Event and wall time of a test, in the same base as the broker's message timestamps."""

    def __init__(self) -> None:
        self.t = time.time()

    def __call__(self) -> float:
        return self.t


def drain(daemon: Any) -> None:
    """Step until the daemon has consumed everything on its input topics."""
    end = daemon.transport.end_offsets()
    while any(daemon.offsets.snapshot().get(tp, 0) < off for tp, off in end.items()):
        daemon.step()


def decisions_by_id(broker: Any) -> dict[str, list[dict[str, Any]]]:
    """Every decision on the in-memory broker's decisions topic, by id (keys checked)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for m in broker.messages("decisions"):
        d = orjson.loads(m.value or b"")
        assert m.key == d["id"].encode()
        out.setdefault(d["id"], []).append(d)
    return out


def settings_of(**named: Any) -> DaemonSettings:
    """:class:`DaemonSettings` from settings named as their flags are, without the dashes
    (``join_window_seconds=5.0`` is ``settings.join.window_seconds``; ``model_name``,
    ``retry_seconds``, ``flush_timeout_seconds`` and ``blas_threads`` are the process's own)."""
    defaults = DaemonSettings()
    sections = {f.name for f in dataclasses.fields(DaemonSettings)
                if dataclasses.is_dataclass(getattr(defaults, f.name))}
    grouped: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in named.items():
        section, _, name = key.partition("_")
        if section in sections and name:
            grouped.setdefault(section, {})[name] = value
        else:
            top[key] = value
    return DaemonSettings(**top, **{section: dataclasses.replace(getattr(defaults, section),
                                                                  **values)
                                    for section, values in grouped.items()})
