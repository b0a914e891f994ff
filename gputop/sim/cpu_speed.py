"""How slow this machine's CPU is against the box the demo's costs were measured on.

The demo sizes its dataset (JPEG size, batch) so the job takes a set share of the cores.  The costs behind
that arithmetic are CPU milliseconds on one box; a shared VM can run the same work four times slower, and then
the "tuned" job no longer fits its cores and really is input-bound.  A short workload of the same kinds (Python
bytecode, as the loader's per-sample code; zlib, as the C of a decoder) timed here scales the costs to this box.
"""

from __future__ import annotations

import math
import statistics
import time
import zlib
from typing import Callable

# the workload's time on the reference box: the 2-core dev VM on which scenarios.py's costs were measured.  Its
# two cores ran the workload in 4.0 or 6.7 ms (a process kept its core's speed for seconds), so the reference is
# their geometric mean and both read as 1 on the ladder below.  benchmarks/bench_demo_costs.py checks the costs
# scaled by this box's reading against what the tuned job burns here.
REFERENCE_WORKLOAD_S = 0.0052
RUNS = 5
_PAYLOAD = bytes(range(256)) * 64  # 16 KiB that compress a little, as JPEG entropy data do not


def workload_s() -> float:
    """Seconds on the clock for a fixed mix of interpreted Python and C.  The clock, not the thread's CPU time:
    a VM's stolen time slows the loader as much as a slow core does, and only the clock sees it."""
    start = time.perf_counter()
    total = 0
    for i in range(100_000):
        total += i % 7
    for _ in range(10):
        zlib.compress(_PAYLOAD, 6)
    return time.perf_counter() - start


def measured_slowness(timed: Callable[[], float] = workload_s) -> float:
    """This machine's time for the workload against the reference box's (2.0: half as fast), unrounded: the
    median of a few runs, so one preemption does not make the box look slow.  `timed`: one run of the workload,
    its seconds (the test suite's budget counts only the time its thread ran)."""
    timed()  # the first run pays for cold caches
    return statistics.median(timed() for _ in range(RUNS)) / REFERENCE_WORKLOAD_S


def cpu_slowness() -> float:
    """The slowness on a ladder of powers of two (0.25 to 16): the demo's dataset (its JPEG size and batch) and
    so its losses follow from it, and `--seed` promises the same losses run after run on one box, where the
    readings move by 10-20% between runs; a factor of two is as fine as the sizing needs."""
    return float(2.0 ** min(4, max(-2, round(math.log2(measured_slowness())))))
