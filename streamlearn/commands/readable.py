"""How the commands show values to people: a strategy as words, numbers rounded.

>>> spec_text({"name": "adaptive", "c": 0.35, "window": 0, "detect_drift": True})
'adaptive (c 0.35, window 0, detect_drift yes)'
>>> [value_text(v) for v in (20000, 8206.0, 0.41029, 102939.17, False, "linucb")]
['20,000', '8,206', '0.4103', '102,939', 'no', 'linucb']
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["spec_text", "value_text"]


def spec_text(spec: Mapping[str, Any]) -> str:
    """``{"name": N, **params}`` as ``N (param value, ...)``."""
    params = ", ".join(f"{key} {value_text(value, digits=6)}" for key, value in spec.items()
                       if key != "name")
    name = str(spec.get("name", "?"))
    return f"{name} ({params})" if params else name


def value_text(value: Any, digits: int = 4) -> str:
    """A number for people: integers (and integral floats from 1 on) with thousands
    separators, other floats with ``digits`` decimals (up to 6 significant digits for
    parameters, ``digits=6``), rates above 1,000 without decimals; booleans as yes / no."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return str(value)
        if digits == 6:
            return f"{value:.6g}"
        if abs(value) >= 1000 or (value.is_integer() and abs(value) >= 1):
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    if isinstance(value, Mapping) and "name" in value:
        return spec_text(value)
    return str(value)
