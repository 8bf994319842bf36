"""The long-running service: the serving loop (:mod:`.daemon`), metrics, HTTP endpoint."""

from __future__ import annotations

__all__ = ["Daemon", "DaemonSettings"]


def __getattr__(name: str) -> object:
    # lazy, so importing streamlearn.service.metrics does not pull in the whole loop
    if name in __all__:
        from streamlearn.service import daemon

        return getattr(daemon, name)
    raise AttributeError(name)
