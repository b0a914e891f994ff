"""Small numeric helpers the checks share (formatting is gputop/units.py)."""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

from gputop.analysis.thresholds import WILSON_Z


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """Linear-interpolated percentile (q in 0..100) of the non-None values; None if there are none."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def mean(values: Iterable[Optional[float]]) -> Optional[float]:
    data = [v for v in values if v is not None]
    return sum(data) / len(data) if data else None


def wilson_lower(hits: int, n: int, z: float = WILSON_Z) -> float:
    """Lower end of the Wilson score interval for a proportion of `hits` in `n` samples."""
    if n <= 0:
        return 0.0
    p = hits / n
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / denom)



def confidence_from(n_samples: int, full_at: int, margin: float = 1.0) -> float:
    """More samples and a wider margin over the threshold -> more confidence (0.3..0.95)."""
    base = min(1.0, n_samples / float(full_at))
    return round(max(0.3, min(0.95, 0.3 + 0.65 * base * max(0.0, min(1.0, margin)))), 2)
