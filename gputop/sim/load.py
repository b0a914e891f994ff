"""Load models: where a simulated GPU's utilization, memory and processes come from.

The fake NVML asks a load model; the default is a synthetic pattern, and
`gputop demo` plugs in `BusyBoardLoad`, driven by the real demo job.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Optional, Protocol

from gputop.sim.busy_board import BusyBoard
from gputop.sim.kernels import IDLE

# NVML averages utilization over a sample period of 1/6 s to 1 s; we use 1 s.
UTILIZATION_WINDOW_S = 1.0


# What a collective spinning on a missing peer draws, as a share of a compute kernel's power above idle:
# NCCL hangs are reported at ~100% utilization and a small fraction of the board's power (NVIDIA/nccl
# issues 968, 257, 238), ~140 W on a 700 W H100 here.
SPIN_POWER_SHARE = 0.12


class LoadModel(Protocol):
    def utilization(self, gpu: int, now: float) -> float:
        """Percent 0..100 over the last sample period. `now` is time.monotonic()."""

    def memory_used(self, gpu: int, now: float) -> Optional[int]:
        """Bytes held by processes on `gpu`; None leaves the profile's idle baseline."""

    def processes(self, gpu: int) -> list[tuple[int, int]]:
        """(pid, used bytes) of the compute processes on `gpu`."""

    # Optional: `power_load(gpu, now) -> float`, 0..1, how hard the busy time works the GPU (power and
    # heat); a load model without it draws power in proportion to utilization.
    # Optional: `activity_seconds(gpu, now) -> tuple[float, ...]`, the GPM counters (the kernels' `KernelMix`
    # integrated over time); without it the fake NVML counts `gpu_physics.DEFAULT_ACTIVITY` of the busy time.


class JobLoad(LoadModel, Protocol):
    """A load model that a running job drives, with every optional part (`BusyBoardLoad`)."""

    def power_load(self, gpu: int, now: float) -> float: ...

    def activity_seconds(self, gpu: int, now: float) -> tuple[float, ...]: ...


class BusyBoardLoad:
    """Utilization = share of the last second the GPU ran a kernel (clipped to 100%); power follows the
    compute kernels at full weight and the collectives spinning on their peers at SPIN_POWER_SHARE."""

    def __init__(self, board: BusyBoard, window_s: float = UTILIZATION_WINDOW_S) -> None:
        self.board = board
        self.window_s = window_s
        # per GPU: recent (time, cumulative busy seconds, cumulative spin seconds) readings
        self._readings: dict[int, deque[tuple[float, float, float]]] = {}
        self._last: dict[int, tuple[float, float, float]] = {}  # per GPU: (now, busy share, spin share)

    def _shares(self, gpu: int, now: Optional[float]) -> tuple[float, float]:
        """(busy, spin) shares of the last window; asked twice per reading (utilization, power): computed once."""
        now = time.monotonic() if now is None else now
        last = self._last.get(gpu)
        if last is not None and last[0] == now:
            return last[1], last[2]
        busy, spin = self.board.busy_seconds(gpu, now)
        readings = self._readings.setdefault(gpu, deque(maxlen=64))
        readings.append((now, busy, spin))
        # compare against the oldest reading still inside the window (or just outside it)
        base_t, base_busy, base_spin = readings[0]
        for t, b, sp in readings:
            if now - t >= self.window_s:
                base_t, base_busy, base_spin = t, b, sp
            else:
                break
        while len(readings) > 1 and now - readings[1][0] >= self.window_s:
            readings.popleft()
        span = now - base_t
        shares = (0.0, 0.0)
        if span > 0:
            busy_share = max(0.0, min(1.0, (busy - base_busy) / span))
            shares = (busy_share, max(0.0, min(busy_share, (spin - base_spin) / span)))
        self._last[gpu] = (now, *shares)
        return shares

    def utilization(self, gpu: int, now: Optional[float] = None) -> float:
        return 100.0 * self._shares(gpu, now)[0]

    def power_load(self, gpu: int, now: Optional[float] = None) -> float:
        busy, spin = self._shares(gpu, now)
        return (busy - spin) + SPIN_POWER_SHARE * spin

    def activity_seconds(self, gpu: int, now: Optional[float] = None) -> tuple[float, ...]:
        """The GPM counters: the running kernels' mixes integrated over their time (`BusyBoard.activity_seconds`)."""
        return self.board.activity_seconds(gpu, time.monotonic() if now is None else now)

    def memory_used(self, gpu: int, now: Optional[float] = None) -> Optional[int]:
        procs = self.board.processes(gpu)
        return sum(mem for _pid, mem in procs) if procs else None

    def processes(self, gpu: int) -> list[tuple[int, int]]:
        return self.board.processes(gpu)


class FollowingLoad:
    """The load of whichever demo job runs now, on one simulated machine that outlives its jobs (the case study's
    stages, one after another): idle between jobs.  The GPM counters carry on across a switch, so they only
    climb, as a real GPU's do (a new job's board counts from zero)."""

    def __init__(self) -> None:
        self._current: Optional[JobLoad] = None
        self._carried: dict[int, tuple[float, ...]] = {}  # per GPU: the counters the previous jobs left
        self._last: dict[int, tuple[float, ...]] = {}  # per GPU: the counters last answered

    def follow(self, load: Optional[JobLoad]) -> None:
        """Drive the GPUs from `load` from now on (None: idle)."""
        self._carried = dict(self._last)
        self._current = load

    def utilization(self, gpu: int, now: float) -> float:
        current = self._current
        return current.utilization(gpu, now) if current is not None else 0.0

    def power_load(self, gpu: int, now: float) -> float:
        current = self._current
        return current.power_load(gpu, now) if current is not None else 0.0

    def activity_seconds(self, gpu: int, now: float) -> tuple[float, ...]:
        current, carried = self._current, self._carried.get(gpu, ())
        if current is None:
            return self._last.get(gpu, (0.0,) * len(IDLE))
        counted = current.activity_seconds(gpu, now)
        if carried:
            counted = tuple(a + b for a, b in zip(counted, carried))
        self._last[gpu] = counted
        return counted

    def memory_used(self, gpu: int, now: float) -> Optional[int]:
        current = self._current
        return current.memory_used(gpu, now) if current is not None else None

    def processes(self, gpu: int) -> list[tuple[int, int]]:
        current = self._current
        return current.processes(gpu) if current is not None else []
