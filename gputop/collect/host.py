"""Host collector (psutil): per-core CPU %, iowait/steal, memory, swap, load average, NUMA layout.

CPU percentages are deltas between this sample's `psutil.cpu_times` and the
previous one (non-blocking).  The collector keeps its own previous reading
rather than using `psutil.cpu_percent(interval=None)`, whose "previous" is a
module global that any other caller in the process would silently reset.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import socket
from collections.abc import Iterator
from typing import Optional, Protocol

import psutil

from gputop.model import HostSample

NODE_CPULIST_GLOB = "/sys/devices/system/node/node*/cpulist"


def parse_cpu_list(text: str) -> list[int]:
    """The kernel's cpulist format: "0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def read_core_numa(cpu_count: int, pattern: str = NODE_CPULIST_GLOB) -> tuple[int, ...]:
    """NUMA node of each logical core from sysfs (0 where sysfs says nothing)."""
    nodes = [0] * cpu_count
    for path in glob.glob(pattern):
        match = re.search(r"node(\d+)", path)
        if not match:
            continue
        try:
            with open(path) as fh:
                cpus = parse_cpu_list(fh.read())
        except (OSError, ValueError):
            continue
        for cpu in cpus:
            if 0 <= cpu < cpu_count:
                nodes[cpu] = int(match.group(1))
    return tuple(nodes)


def read_cpu_model(path: str = "/proc/cpuinfo") -> str:
    try:
        with open(path) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class CpuTimes(Protocol):
    """psutil's `scputimes`: a named tuple of seconds, whose other fields (iowait, guest...) depend on the platform."""

    idle: float

    def __iter__(self) -> Iterator[float]: ...


def _busy_and_total(times: CpuTimes) -> tuple[float, float]:
    """psutil's own accounting: guest time is already inside user/nice, and iowait counts as idle."""
    total = sum(times)
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


def _percent(part: float, whole: float) -> float:
    return max(0.0, min(100.0, 100.0 * part / whole)) if whole > 0 else 0.0


class HostCollector:
    def __init__(self) -> None:
        self.hostname = socket.gethostname()
        self.cpu_model = read_cpu_model()
        self.cpu_count = psutil.cpu_count(logical=True) or os.cpu_count() or 1
        self.core_numa = read_core_numa(self.cpu_count)
        # first readings: the first sample's percentages cover the time since construction
        self._last_per_cpu = psutil.cpu_times(percpu=True)
        self._last_total = psutil.cpu_times()

    def sample(self) -> HostSample:
        per_cpu = psutil.cpu_times(percpu=True)
        total = psutil.cpu_times()
        percents = []
        for now, before in zip(per_cpu, self._last_per_cpu):
            busy_now, total_now = _busy_and_total(now)
            busy_before, total_before = _busy_and_total(before)
            percents.append(_percent(busy_now - busy_before, total_now - total_before))
        # a CPU brought online since the last sample has no "before": report 0 for it this once
        percents.extend(0.0 for _ in range(len(per_cpu) - len(percents)))
        iowait = steal = None
        _, whole_now = _busy_and_total(total)
        _, whole_before = _busy_and_total(self._last_total)
        elapsed = whole_now - whole_before
        if hasattr(total, "iowait"):
            iowait = _percent(total.iowait - self._last_total.iowait, elapsed)
        if hasattr(total, "steal"):
            steal = _percent(total.steal - self._last_total.steal, elapsed)
        self._last_per_cpu, self._last_total = per_cpu, total

        memory = psutil.virtual_memory()
        swap = psutil.swap_memory()
        try:
            load = os.getloadavg()
        except OSError:
            load = (0.0, 0.0, 0.0)
        core_numa = self.core_numa if len(self.core_numa) == len(percents) else read_core_numa(len(percents))
        return HostSample(
            cpu_percent=tuple(percents),
            core_numa=core_numa,
            iowait_percent=iowait,
            steal_percent=steal,
            memory_total=int(memory.total),
            memory_used=int(memory.used),
            memory_available=int(memory.available),
            swap_total=int(swap.total),
            swap_used=int(swap.used),
            load_average=load,
        )

    def close(self) -> None:
        pass


def numa_layout_from_affinity(
    cpu_count: int, affinity: tuple[Optional[str], ...], numa_node: tuple[Optional[int], ...]
) -> tuple[int, ...]:
    """Core -> NUMA node as the GPUs' affinity describes it (used for the simulated machine)."""
    nodes = [0] * cpu_count
    for cpus, node in zip(affinity, numa_node):
        if cpus is None or node is None:
            continue
        for cpu in parse_cpu_list(cpus):
            if 0 <= cpu < cpu_count:
                nodes[cpu] = node
    return tuple(nodes)
