"""The pipeline's counter watch: `gputop check`'s evidence, read on a slow cadence.

`HostSource` is the kernel's side of the machine (sysfs AER counters, the kernel log's XIDs; the simulated
machine's tree under `--simulate`), read by `gputop check` at the start and the end of its window and here.
`CounterWatch` reads the GPUs' details (`Pipeline.gpu_details()`: PCIe replays, NVLink error counters,
retired pages) and the host's side every `cadence` seconds, never on every poll, and judges the window
between two readings with the check's own lines (`analysis/counter_health.py`).  Its first reading is
judged alone: what a single reading shows (a kernel-log XID, a pending retirement, an odd topology row)
counts at once; a counter needs the second reading, one cadence later, to be seen climbing.

Cost (benchmarks/bench_counters.py): one reading is the NVML detail calls per GPU and link, the AER files
of each GPU and one read of the kernel log (/dev/kmsg), done on the poll that falls due.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional

from gputop.model import CounterHealth, GpuDetails, HostReadings, MachineInfo, Snapshot

if TYPE_CHECKING:
    from gputop.analysis.counter_health import CounterReading


class HostSource:
    """The kernel's side of the machine: the real /sys and kernel log, or the simulated machine's tree; the
    pipeline hands in which (`Pipeline.host_source`)."""

    def __init__(self, read: Callable[[list[str]], HostReadings], close: Callable[[], None] = lambda: None) -> None:
        self._read = read
        self._close = close

    def read(self, bus_ids: list[str]) -> HostReadings:
        return self._read(bus_ids)

    def close(self) -> None:
        self._close()


class CounterWatch:
    """Reads the counters when `due` and judges the window since the previous reading (`judge`)."""

    def __init__(
        self,
        read_details: Callable[[], tuple[GpuDetails, ...]],
        host: HostSource,
        machine: MachineInfo,
        cadence: float,
        first_after: float = 0.0,
    ) -> None:
        """`first_after`: seconds from the first poll to the first reading (the TUI's first frames come first)."""
        if cadence <= 0:
            raise ValueError("the counter watch's cadence must be positive (seconds)")
        self.cadence = cadence
        self._first_after = first_after
        self._first_at: Optional[float] = None
        self._read_details = read_details
        self._host = host
        self._machine = machine
        self._bus_ids: Optional[list[str]] = None
        self._previous: Optional[CounterReading] = None
        self.latest: Optional[CounterHealth] = None
        self.read_seconds = 0.0  # how long the last reading took (wall clock)

    def due(self, now: float) -> bool:
        if self._previous is None:
            if self._first_at is None:
                self._first_at = now + self._first_after
            return now >= self._first_at
        return now - self._previous.timestamp >= self.cadence

    def read(self, now: float) -> CounterReading:
        # the check's code loads with the first reading, not with the monitor (the TUI's start stays light)
        from gputop.analysis.counter_health import CounterReading

        started = time.perf_counter()
        details = self._read_details()
        if self._bus_ids is None:
            self._bus_ids = [d.pci_bus_id for d in details if d.pci_bus_id]
        reading = CounterReading(now, details, self._host.read(self._bus_ids))
        self.read_seconds = time.perf_counter() - started
        return reading

    def judge(self, snapshot: Snapshot) -> CounterHealth:
        """Read now (at the snapshot's time) and judge the window since the previous reading."""
        from gputop.analysis.counter_health import judge_counters

        reading = self.read(snapshot.timestamp)
        before = self._previous if self._previous is not None else reading
        self.latest = judge_counters(self._machine, before, reading, snapshot)
        self._previous = reading
        return self.latest

    def close(self) -> None:
        self._host.close()
