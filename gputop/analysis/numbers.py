"""Small numeric helpers the checks share (formatting is gputop/units.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from gputop.analysis.thresholds import INTERVAL_Z, WILSON_Z


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


def wilson_interval(p: float, n: float, z: float = INTERVAL_Z) -> tuple[float, float]:
    """The Wilson score interval of a proportion `p` seen in `n` (effective) samples."""
    if n <= 0:
        return 0.0, 1.0
    denom = 1 + z * z / n
    centre = p + z * z / (2 * n)
    margin = z * math.sqrt(max(0.0, p * (1 - p)) / n + z * z / (4 * n * n))
    return max(0.0, (centre - margin) / denom), min(1.0, (centre + margin) / denom)


def wilson_lower(hits: int, n: int, z: float = WILSON_Z) -> float:
    """Lower end of the Wilson score interval for a proportion of `hits` in `n` samples."""
    return wilson_interval(hits / n, n, z)[0] if n > 0 else 0.0


def effective_samples(hits: int, n: int, switches: Optional[int]) -> float:
    """How many independent samples `n` ordered ones are worth, for a share of `hits` of them.

    Samples taken faster than the job changes state repeat each other: 500 a second of a rank that waits
    80 ms at a time hold far fewer than 500 independent looks.  Modelled as a two-state Markov chain,
    consecutive samples differ with probability 2p(1-p)(1-rho), so the `switches` counted between in-set
    and out-of-set samples give the lag-1 autocorrelation rho, and n(1-rho)/(1+rho) samples carry the same
    information.  `switches=None` (dumps seconds apart, order unknown): independent, n."""
    if switches is None or n < 2 or hits in (0, n):
        return float(n)
    p = hits / n
    independent = 2 * p * (1 - p) * (n - 1)  # expected switches if the samples were independent
    rho = min(0.999, max(0.0, 1.0 - switches / independent))  # a regular alternation (rho < 0) is not credited
    return max(1.0, n * (1 - rho) / (1 + rho))


@dataclass(frozen=True)
class Share:
    """A share of samples with its interval: `hits` of `n`, worth `effective` independent ones.

    `low`..`high` is the Wilson score interval at INTERVAL_Z (95%) on the effective count.  Every figure
    derived from a share (workers needed, seconds per batch) is computed at both ends too."""

    point: float
    low: float
    high: float
    hits: int
    n: int
    effective: float
    source: str = ""  # what the samples are: "py-spy record at 25 Hz", "stack dumps", "timed batches"

    def text(self) -> str:
        """ "62% (58–66%)"; a timed share, which has no spread, as "62%"."""
        point, low, high = (_percent(v) for v in (self.point, self.low, self.high))
        if low == high == point:
            return point
        return f"{point} ({low.rstrip('%') if low[0].isdigit() else low}–{high})"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Share":
        return cls(
            float(data["share"]),
            float(data["low"]),
            float(data["high"]),
            int(data["samples"]),
            int(data["of"]),
            float(data.get("effective_samples") or data["of"]),
            str(data.get("source") or ""),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "share": round(self.point, 4),
            "low": round(self.low, 4),
            "high": round(self.high, 4),
            "samples": self.hits,
            "of": self.n,
            "effective_samples": round(self.effective, 1),
            "confidence": INTERVAL_CONFIDENCE,
            "source": self.source,
        }


INTERVAL_CONFIDENCE = 0.95  # of INTERVAL_Z


def _percent(value: float) -> str:
    # whole percents, as gputop.units.fraction writes them; "<1%" / ">99%" where rounding would say 0 or 100
    if 0 < value < 0.005:
        return "<1%"
    if 0.995 < value < 1:
        return ">99%"
    return f"{value:.0%}"


def share_of(hits: int, n: int, switches: Optional[int] = None, source: str = "") -> Share:
    """`hits` of `n` samples as a Share; `switches`: in/out changes between consecutive samples (ordered ones)."""
    effective = effective_samples(hits, n, switches)
    if not n:
        return Share(0.0, 0.0, 1.0, 0, 0, 0.0, source)
    low, high = wilson_interval(hits / n, effective)
    return Share(hits / n, low, high, hits, n, effective, source)


def mean_share(values: Sequence[float], source: str, z: float = INTERVAL_Z) -> Optional[Share]:
    """The mean of per-second readings in 0..1 (1 − GPU utilization) as a Share, its interval from their
    spread (normal approximation of the mean); None without readings."""
    data = [v for v in values if v is not None]
    if not data:
        return None
    m = sum(data) / len(data)
    sd = math.sqrt(sum((v - m) ** 2 for v in data) / (len(data) - 1)) if len(data) > 1 else 0.5
    half = z * sd / math.sqrt(len(data))
    return Share(m, max(0.0, m - half), min(1.0, m + half), round(m * len(data)), len(data), float(len(data)), source)


def measured_share(value: float, batches: int, source: str) -> Share:
    """A share timed rather than sampled (the active benchmark times every batch of its window): no
    sampling spread, so its interval is its point."""
    return Share(value, value, value, batches, batches, float(batches), source)


def confidence_from(n_samples: int, full_at: int, margin: float = 1.0) -> float:
    """More samples and a wider margin over the threshold -> more confidence (0.3..0.95)."""
    base = min(1.0, n_samples / float(full_at))
    return round(max(0.3, min(0.95, 0.3 + 0.65 * base * max(0.0, min(1.0, margin)))), 2)
