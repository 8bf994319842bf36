"""The one way streamlearn gets matplotlib: the optional ``plot`` extra, headless backend."""

from __future__ import annotations

from types import ModuleType

from streamlearn.errors import ConfigError

__all__ = ["pyplot"]


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or a ConfigError naming the extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError("--plot needs matplotlib: pip install 'streamlearn[plot]'.") from exc
    return plt
