"""Numbers as people read them: bytes, rates, percents and durations, for every sink.

The screen, `gputop snapshot`, the report and the findings' wording all format here, so "1.5 GiB"
or "340 MB/s" reads the same wherever it appears. Each function takes `missing`, what to show for a
value NVML could not give (the screen and the snapshot say "n/a", a report's table leaves the cell
to its own placeholder with None).
"""

from __future__ import annotations

import datetime
from typing import Optional

GIB = 1 << 30
MIB = 1 << 20
NA = "n/a"


def short_bytes(value: Optional[float], suffix: str = "", missing: str = NA) -> str:
    """Binary units, 4 cells or so, like nvidia-smi's MiB: 1536 -> '1.5K', 62 GiB -> '62G'."""
    if value is None:
        return missing
    value = float(value)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            if unit == "B":
                return f"{value:.0f}{unit}{suffix}"
            return (f"{value:.1f}" if value < 100 else f"{value:.0f}") + unit + suffix
        value /= 1024
    return missing  # pragma: no cover


def short_rate(bytes_per_s: Optional[float], missing: str = NA) -> str:
    """Bytes per second on a card: '1.2G', '340M', '0'."""
    if bytes_per_s is None:
        return missing
    if bytes_per_s < 1:
        return "0"
    return short_bytes(bytes_per_s)


def gib(value: Optional[float], missing: Optional[str] = NA, digits: int = 1) -> Optional[str]:
    """'61.5 GiB'."""
    return missing if value is None else f"{value / GIB:.{digits}f} GiB"


def gib_pair(used: Optional[float], total: Optional[float], missing: str = NA) -> str:
    """Used/total on a card: '62/80G', or one decimal on a small card: '1.5/8.0G'."""
    if used is None or total is None:
        return missing
    total_g, used_g = total / GIB, used / GIB
    if total_g >= 10:
        return f"{used_g:.0f}/{total_g:.0f}G"
    return f"{used_g:.1f}/{total_g:.1f}G"


def rate(bytes_per_s: Optional[float], missing: Optional[str] = NA, sep: str = " ") -> Optional[str]:
    """Decimal units, as link speeds are quoted: '1.2 GB/s', '340.0 MB/s', '12 B/s'."""
    if bytes_per_s is None:
        return missing
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.1f}{sep}{unit}"
    return f"{bytes_per_s:.0f}{sep}B/s"


def percent(value: Optional[float], missing: Optional[str] = NA, width: int = 0) -> Optional[str]:
    """A percentage given in percent: '97%'; `width` right-aligns the number ('  5%')."""
    return missing if value is None else f"{value:{width}.0f}%"


def percent_cell(value: Optional[float], width: int = 3) -> str:
    """A percentage in a fixed-width cell: 'n/a ' is as wide as ' 97%'."""
    return NA.rjust(width) + " " if value is None else f"{value:{width}.0f}%"


def fraction(value: Optional[float], missing: Optional[str] = NA) -> Optional[str]:
    """A fraction of 1 as a percentage: 0.62 -> '62%'."""
    return missing if value is None else f"{100.0 * value:.0f}%"


def mmss(seconds: float) -> str:
    """A replay position: '01:05'."""
    seconds = max(0, int(seconds))
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


def na(value: object, template: str = "{}", missing: str = NA) -> str:
    """`template` filled with `value`, or `missing`."""
    return missing if value is None else template.format(value)


def utc_time(timestamp: Optional[float], missing: str = "time unknown") -> str:
    """A time.time() value as "2026-12-01 00:44:03 UTC" (tickets are read in other time zones)."""
    if timestamp is None:
        return missing
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
