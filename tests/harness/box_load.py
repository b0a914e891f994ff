"""What else the box was doing over a window, for the failure message of a deadline or a statistical bar.

A test that waits for a verdict, or compares a figure with a bar, on a shared 2-core box can fail because the box
was busy, not because gputop was wrong.  Such a test does not retry; it says how busy the box was over the window
it judged (`BoxLoad().since()`), so the failure explains itself: the CPUs' idle share from /proc/stat and the
load average against the CPU count.
"""

from __future__ import annotations

import os
import time


def _cpu_jiffies() -> tuple[int, int]:
    """(idle, total) jiffies of all CPUs since boot: /proc/stat's first line (idle includes iowait)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0, 0
    return fields[3] + fields[4], sum(fields)


class BoxLoad:
    """Started at construction; `since()` describes the box from then to now."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._idle, self._total = _cpu_jiffies()

    def idle_share(self) -> float | None:
        idle, total = _cpu_jiffies()
        return (idle - self._idle) / (total - self._total) if total > self._total else None

    def since(self) -> str:
        idle = self.idle_share()
        cpus = os.cpu_count() or 1
        load1 = os.getloadavg()[0]
        idle_text = f"{idle:.0%} idle" if idle is not None else "idle share unknown"
        return (
            f"the box over those {time.monotonic() - self.started:.0f} s: {cpus} CPUs {idle_text}, "
            f"1-min load average {load1:.1f} ({load1 / cpus:.1f} a CPU)"
        )
