"""The default load for `--simulate` without a job: a plausible data-parallel training pattern.

Every value is a pure function of (gpu, now), so a fixed clock gives fixed
numbers (snapshot tests) and nothing accumulates (memory stays flat).

Shape: all ranks step together (data parallel), so the GPUs share one step
rhythm: ~90% busy, with a short dip every few seconds (the optimizer step and
an all-reduce wait), a slow per-GPU wander, and a little per-GPU noise.
"""

from __future__ import annotations

import math
from typing import Optional


def _noise(gpu: int, tick: int) -> float:
    """Deterministic pseudo-random value in [-1, 1] for (gpu, tick); a cheap integer hash."""
    h = ((gpu + 1) * 0x9E3779B1 ^ (tick * 0x85EBCA77)) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h ^= h >> 12
    return (h & 0xFFFF) / 0x7FFF - 1.0


class SyntheticLoad:
    """A `LoadModel` with no processes behind it (there is no job to point at)."""

    STEP_PERIOD_S = 6.0  # one "dip" per period
    DIP_S = 0.8

    def __init__(self, gpu_count: int, memory_total: int) -> None:
        self.gpu_count = gpu_count
        self.memory_total = memory_total

    def utilization(self, gpu: int, now: float) -> float:
        base = 91.0 - 1.5 * (gpu % 4)  # ranks differ a little in model shard size
        wander = 3.0 * math.sin(2 * math.pi * now / 47.0 + gpu * 0.9)
        noise = 2.5 * _noise(gpu, int(now * 2))
        in_dip = (now % self.STEP_PERIOD_S) < self.DIP_S
        value = (38.0 + 10.0 * _noise(gpu, int(now))) if in_dip else base + wander + noise
        return max(0.0, min(100.0, value))

    def memory_used(self, gpu: int, now: float) -> Optional[int]:
        # about 78% of the card, a different shard size per rank, breathing slightly with the step
        fraction = 0.74 + 0.012 * (gpu % 5) + 0.01 * math.sin(2 * math.pi * now / self.STEP_PERIOD_S)
        return int(self.memory_total * fraction)

    def processes(self, gpu: int) -> list[tuple[int, int]]:
        # No real process stands behind the synthetic load; inventing PIDs would point the job view at
        # whatever unrelated process happens to own that number.
        return []
