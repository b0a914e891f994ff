"""Load models: where a simulated GPU's utilization, memory and processes come from.

The fake NVML asks a load model; the default is a synthetic pattern, and
`gputop demo` plugs in `BusyBoardLoad`, driven by the real demo job.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Optional, Protocol

from gputop.sim.busy_board import BusyBoard

# NVML averages utilization over a sample period of 1/6 s to 1 s; we use 1 s.
UTILIZATION_WINDOW_S = 1.0


class LoadModel(Protocol):
    def utilization(self, gpu: int, now: float) -> float:
        """Percent 0..100 over the last sample period. `now` is time.monotonic()."""

    def memory_used(self, gpu: int, now: float) -> Optional[int]:
        """Bytes held by processes on `gpu`; None leaves the profile's idle baseline."""

    def processes(self, gpu: int) -> list[tuple[int, int]]:
        """(pid, used bytes) of the compute processes on `gpu`."""


class BusyBoardLoad:
    """Utilization = share of the last second a rank marked the GPU busy (clipped to 100%)."""

    def __init__(self, board: BusyBoard, window_s: float = UTILIZATION_WINDOW_S) -> None:
        self.board = board
        self.window_s = window_s
        # per GPU: recent (time, cumulative busy seconds) readings
        self._readings: dict[int, deque[tuple[float, float]]] = {}

    def utilization(self, gpu: int, now: Optional[float] = None) -> float:
        now = time.monotonic() if now is None else now
        busy = self.board.busy_seconds(gpu, now)
        readings = self._readings.setdefault(gpu, deque(maxlen=64))
        readings.append((now, busy))
        # compare against the oldest reading still inside the window (or just outside it)
        base_t, base_busy = readings[0]
        for t, b in readings:
            if now - t >= self.window_s:
                base_t, base_busy = t, b
            else:
                break
        while len(readings) > 1 and now - readings[1][0] >= self.window_s:
            readings.popleft()
        span = now - base_t
        if span <= 0:
            return 0.0
        return max(0.0, min(100.0, 100.0 * (busy - base_busy) / span))

    def memory_used(self, gpu: int, now: Optional[float] = None) -> Optional[int]:
        procs = self.board.processes(gpu)
        return sum(mem for _pid, mem in procs) if procs else None

    def processes(self, gpu: int) -> list[tuple[int, int]]:
        return self.board.processes(gpu)
