"""How the commands show values to people: a strategy as words, numbers rounded.

>>> spec_text({"name": "adaptive", "c": 0.35, "window": 0, "detect_drift": True})
'adaptive (c 0.35, window 0, detect_drift yes)'
>>> [value_text(v) for v in (20000, 8206.0, 0.41029, 102939.17, False, "linucb")]
['20,000', '8,206', '0.4103', '102,939', 'no', 'linucb']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["spec_text", "value_text"]


def spec_text(spec: Mapping[str, Any]) -> str:
    """``{"name": N, **params}`` as ``N (param value, ...)``, each float to 4 significant
    digits (0.006, 0.35, 100, 0.4721)."""
    params = ", ".join(f"{key} {_parameter_text(value)}" for key, value in spec.items()
                       if key != "name")
    name = str(spec.get("name", "?"))
    return f"{name} ({params})" if params else name


def value_text(value: Any, decimals: int = 4) -> str:
    """A number for people: integers (and integral floats from 1 on) with thousands
    separators, floats of 1,000 and more without decimals, others with ``decimals``;
    booleans as yes / no; a strategy spec as :func:`spec_text`."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if abs(value) >= 1000 or (value.is_integer() and abs(value) >= 1):
            return f"{value:,.0f}"
        return f"{value:.{decimals}f}"
    if isinstance(value, Mapping) and "name" in value:
        return spec_text(value)
    return str(value)


def _parameter_text(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return value_text(value)
