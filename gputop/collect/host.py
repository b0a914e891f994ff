"""Host collector (psutil): per-core CPU %, iowait/steal, memory, swap, load average, NUMA layout, and where the
kernel shares the cores among sessions first (autogroup), the cores each session used.

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
import time
from collections.abc import Iterator
from typing import Callable, Optional, Protocol

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


AUTOGROUP_SWITCH = "/proc/sys/kernel/sched_autogroup_enabled"
SESSION_MIN_CORES = 0.02  # a session that used less is left out of a sample (idle shells, daemons)
# Every process's stat is read once a reading: ~40 µs a process, so a big box's thousands (kernel threads
# included) cost a tenth of a core at one reading a second.  Autogroup's shares move over seconds; the
# sessions' cores are read at most this often and the last reading is repeated between.
SESSION_EVERY_S = 5.0


def autogroup_enabled(path: str = AUTOGROUP_SWITCH) -> bool:
    """Whether the scheduler shares the cores among sessions before their processes (CONFIG_SCHED_AUTOGROUP, on):
    a job's added workers then share its session's part, however many they are."""
    try:
        with open(path) as fh:
            return fh.read().strip() == "1"
    except OSError:
        return False


class SessionCpu:
    """The cores each session used between two readings, from every process's /proc/PID/stat (its session and
    utime + stime): one small read a process, ~3.5 ms of CPU a reading with ~90 processes on the 2-core box.  A process born and gone
    between two readings is not counted (the host's busy time less the sessions' holds it)."""

    def __init__(self, proc: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self._proc = proc
        self._clock = clock
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._at = clock()
        self._last = self._read()
        self._kept: Optional[tuple[tuple[int, ...], tuple[float, ...]]] = None

    def _read(self) -> dict[int, tuple[int, int]]:
        """pid -> (session, CPU ticks)."""
        out: dict[int, tuple[int, int]] = {}
        for name in os.listdir(self._proc):
            if not name.isdigit():
                continue
            try:
                with open(f"{self._proc}/{name}/stat", "rb") as fh:
                    fields = fh.read().rpartition(b")")[2].split()
                out[int(name)] = (int(fields[3]), int(fields[11]) + int(fields[12]))
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile, or not a process's stat
        return out

    def sample(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """(sessions, the cores each used since the last reading), sessions that used SESSION_MIN_CORES or more;
        within SESSION_EVERY_S of the last reading, that reading's again."""
        at = self._clock()
        if self._kept is not None and 0 <= at - self._at < SESSION_EVERY_S:
            return self._kept
        now = self._read()
        seconds = at - self._at
        ticks: dict[int, int] = {}
        for pid, (session, spent) in now.items():
            before = self._last.get(pid)
            if before is not None and before[0] == session and spent >= before[1]:  # (else new, or a reused PID)
                ticks[session] = ticks.get(session, 0) + spent - before[1]
        self._at, self._last = at, now
        if seconds <= 0:
            return (), ()
        cores = sorted((s, t / self._ticks / seconds) for s, t in ticks.items())
        kept = [(s, c) for s, c in cores if c >= SESSION_MIN_CORES]
        self._kept = tuple(s for s, _ in kept), tuple(round(c, 3) for _, c in kept)
        return self._kept


# Swap is read every SWAP_EVERY_S, not every poll: psutil.swap_memory() parses /proc/vmstat as well as
# /proc/meminfo (~0.35 ms here, a sixth of the collector's poll), and the swap bar is a figure to glance at.
SWAP_EVERY_S = 5.0


class HostCollector:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.hostname = socket.gethostname()
        self.cpu_model = read_cpu_model()
        self.cpu_count = psutil.cpu_count(logical=True) or os.cpu_count() or 1
        self.core_numa = read_core_numa(self.cpu_count)
        self._clock = clock
        self._swap: Optional[tuple[float, int, int]] = None  # (read at, total, used)
        # first readings: the first sample's percentages cover the time since construction
        self._last_per_cpu = psutil.cpu_times(percpu=True)
        self._sessions = SessionCpu() if autogroup_enabled() else None

    def _swap_now(self) -> tuple[int, int]:
        now = self._clock()
        if self._swap is None or not 0 <= now - self._swap[0] < SWAP_EVERY_S:
            swap = psutil.swap_memory()
            self._swap = (now, int(swap.total), int(swap.used))
        return self._swap[1], self._swap[2]

    def sample(self) -> HostSample:
        per_cpu = psutil.cpu_times(percpu=True)
        percents = []
        # The machine's iowait and steal over the cores' own deltas, summed: /proc/stat's first line is the
        # same sum (and the times of cores now offline, which do not move), and reading the file a second time
        # for it (psutil.cpu_times()) cost as much as the first read.
        whole = iowait_time = steal_time = 0.0
        for now, before in zip(per_cpu, self._last_per_cpu):
            busy_now, total_now = _busy_and_total(now)
            busy_before, total_before = _busy_and_total(before)
            percents.append(_percent(busy_now - busy_before, total_now - total_before))
            whole += total_now - total_before
            iowait_time += getattr(now, "iowait", 0.0) - getattr(before, "iowait", 0.0)
            steal_time += getattr(now, "steal", 0.0) - getattr(before, "steal", 0.0)
        # a CPU brought online since the last sample has no "before": report 0 for it this once
        percents.extend(0.0 for _ in range(len(per_cpu) - len(percents)))
        iowait = _percent(iowait_time, whole) if hasattr(per_cpu[0], "iowait") else None
        steal = _percent(steal_time, whole) if hasattr(per_cpu[0], "steal") else None
        self._last_per_cpu = per_cpu

        memory = psutil.virtual_memory()
        swap_total, swap_used = self._swap_now()
        try:
            load = os.getloadavg()
        except OSError:
            load = (0.0, 0.0, 0.0)
        core_numa = self.core_numa if len(self.core_numa) == len(percents) else read_core_numa(len(percents))
        sessions, session_cores = self._sessions.sample() if self._sessions is not None else ((), ())
        return HostSample(
            cpu_percent=tuple(percents),
            core_numa=core_numa,
            iowait_percent=iowait,
            steal_percent=steal,
            memory_total=int(memory.total),
            memory_used=int(memory.used),
            memory_available=int(memory.available),
            swap_total=swap_total,
            swap_used=swap_used,
            load_average=load,
            sessions=sessions,
            session_cores=session_cores,
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
