"""The one clock a pipeline and its readers take the time from.

`wall` stamps what is recorded (a snapshot, a stack dump, a dense stretch, an XID, a counter reading: seconds
since the epoch); `elapsed` measures what has passed for the readers' own cadences (the GPUs' slow fields, the
host's swap, a rank's eager sampling).  On the real machine they are `time.time` and `time.monotonic`, as
they always were.  A simulated machine under a test's `ManualClock` (gputop.sim.fake_nvml) reads that one clock
for both, and so does its fake NVML: every reader moves only when the test advances it, and ten minutes of
history take as long to build as 600 polls take to compute.

What must take real time still does: a py-spy subprocess's deadline, its CPU cost per sample, a thread's wait
for the next stack round.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Clock:
    """Where the time comes from: `wall` for stamps, `elapsed` for intervals (see the module docstring)."""

    wall: Callable[[], float] = time.time
    elapsed: Callable[[], float] = time.monotonic


REAL_CLOCK = Clock()


def clock_of(now: Callable[[], float]) -> Clock:
    """The clock of a backend given `now`: `time.time` is the real machine's pair; any other (a test's
    ManualClock) is read for both stamps and intervals."""
    return REAL_CLOCK if now is time.time else Clock(wall=now, elapsed=now)
