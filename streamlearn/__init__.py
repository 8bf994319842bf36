"""streamlearn: a streaming online-learning daemon (contextual bandits on Kafka)."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
