"""How the report writes times, ratios and rates."""
from __future__ import annotations

from typing import Optional


# --------------------------------------------------------------------------- formatting
def ms(seconds: Optional[float]) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:.1f}"


def ratio(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}×"


def mbps(rate: Optional[float]) -> str:
    return "–" if rate is None else f"{rate / 1e6:.0f} MB/s"
