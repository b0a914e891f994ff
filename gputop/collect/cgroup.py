"""The CPU and memory a process may use, from its cgroup: what a container or a Slurm job really gets.

cgroup v2: ``cpu.max`` ("quota period" or "max period") and ``memory.max`` on the process's cgroup and
every ancestor (the smallest wins), ``cpuset.cpus.effective`` on its own cgroup (already narrowed by
the ancestors).  cgroup v1 fallbacks: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``,
``cpuset.effective_cpus`` and ``memory.limit_in_bytes``.

The process's cgroup path comes from ``/proc/PID/cgroup``; the kernel writes it relative to *our*
cgroup namespace, and ``/proc/self/mountinfo`` says where (and from which root) each hierarchy is
mounted here, so the two joined give the directory to read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Optional

# v1 reports "no limit" as a huge page-aligned number (2^63 rounded down to the page size)
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Mount:
    root: str  # the cgroup path mounted (the mountinfo "root" field), "/" for a whole hierarchy
    point: str  # where it is mounted here
    controllers: frozenset[str]  # v1: the controllers of this hierarchy; v2: empty


@dataclass(frozen=True)
class Limits:
    cpu: Optional[float] = None  # cores (quota / period, or the cpuset's size, whichever is smaller)
    memory: Optional[int] = None  # bytes


def read_mounts(mountinfo: str = "/proc/self/mountinfo") -> tuple[Optional[Mount], dict[str, Mount]]:
    """(the cgroup2 mount, {v1 controller: its mount}) as seen from this process."""
    v2: Optional[Mount] = None
    v1: dict[str, Mount] = {}
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, after = left.split(), right.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if after[0] == "cgroup2" and v2 is None:
            v2 = Mount(root, point, frozenset())
        elif after[0] == "cgroup":
            controllers = frozenset(opt for opt in after[2].split(",") if opt in ("cpu", "cpuacct", "cpuset", "memory"))
            for controller in controllers:
                v1.setdefault(controller, Mount(root, point, controllers))
    return v2, v1


def _unescape(path: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def read_cgroup_paths(pid: int, proc: str = "/proc") -> tuple[Optional[str], dict[str, str]]:
    """(the v2 path, {v1 controller: path}) of `pid` from /proc/PID/cgroup."""
    v2: Optional[str] = None
    v1: dict[str, str] = {}
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None, {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        else:
            for controller in controllers.split(","):
                v1[controller] = path
    return v2, v1


def cgroup_directory(mount: Mount, path: str) -> Optional[str]:
    """Where the cgroup `path` lies under `mount`; None if the mount does not reach it (another container's)."""
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    relative = path[len(root) :].lstrip("/")
    return os.path.join(mount.point, relative) if relative else mount.point


def _ancestors(directory: str, top: str) -> list[str]:
    """`directory` and each parent up to and including `top` (the mount point)."""
    chain = [directory]
    while directory != top and directory.startswith(top):
        directory = os.path.dirname(directory)
        chain.append(directory)
    return chain


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def count_cpus(cpuset: Optional[str]) -> Optional[int]:
    """ "0-3,8,10-11" -> 7; None for an empty or unreadable list."""
    if not cpuset:
        return None
    total = 0
    try:
        for part in cpuset.split(","):
            low, _, high = part.partition("-")
            total += int(high or low) - int(low) + 1
    except ValueError:
        return None
    return total or None


def _smallest(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _v2_quota(text: Optional[str]) -> Optional[float]:
    parts = (text or "").split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        return int(parts[0]) / int(parts[1])
    except (ValueError, ZeroDivisionError):
        return None


def _v2_memory(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text and text != "max" else None
    except ValueError:
        return None


def _v1_quota(directory: str) -> Optional[float]:
    try:
        quota = int(_read(os.path.join(directory, "cpu.cfs_quota_us")) or "-1")
        period = int(_read(os.path.join(directory, "cpu.cfs_period_us")) or "0")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_memory(directory: str) -> Optional[int]:
    try:
        limit = int(_read(os.path.join(directory, "memory.limit_in_bytes")) or "-1")
    except ValueError:
        return None
    return limit if 0 < limit < _V1_UNLIMITED else None


def read_limits(pid: int, *, proc: str = "/proc", mountinfo: str = "/proc/self/mountinfo") -> Limits:
    """The CPU and memory limits of `pid`'s cgroup (v2 first, then v1), or Limits() where none is set."""
    return limits_of(*read_cgroup_paths(pid, proc), mounts=read_mounts(mountinfo))


def limits_of(v2_path: Optional[str], v1_paths: dict[str, str], *, mounts: tuple[Optional[Mount], dict[str, Mount]]) -> Limits:
    """The limits of the cgroup at these paths (as /proc/PID/cgroup gives them), under these mounts."""
    v2_mount, v1_mounts = mounts
    cpu_quotas: list[Optional[float]] = []
    cpuset_sizes: list[Optional[float]] = []
    memories: list[Optional[float]] = []
    if v2_mount is not None and v2_path is not None:
        directory = cgroup_directory(v2_mount, v2_path)
        if directory is not None:
            chain = _ancestors(directory, v2_mount.point)
            cpu_quotas += [_v2_quota(_read(os.path.join(d, "cpu.max"))) for d in chain]
            memories += [_v2_memory(_read(os.path.join(d, "memory.max"))) for d in chain]
            cpuset_sizes.append(count_cpus(_read(os.path.join(directory, "cpuset.cpus.effective"))))
    for controller, reader in (("cpu", _v1_quota), ("memory", _v1_memory)):
        mount, path = v1_mounts.get(controller), v1_paths.get(controller)
        directory = cgroup_directory(mount, path) if mount and path is not None else None
        if directory is not None and mount is not None:
            values = [reader(d) for d in _ancestors(directory, mount.point)]
            (cpu_quotas if controller == "cpu" else memories).extend(values)
    mount, path = v1_mounts.get("cpuset"), v1_paths.get("cpuset")
    directory = cgroup_directory(mount, path) if mount and path is not None else None
    if directory is not None:
        cpuset_sizes.append(count_cpus(_read(os.path.join(directory, "cpuset.effective_cpus"))))
    memory = _smallest(memories)
    cpu = _smallest(cpu_quotas + cpuset_sizes)
    return Limits(cpu=float(cpu) if cpu is not None else None, memory=int(memory) if memory is not None else None)


def job_limits(pids: Iterable[int], *, host_cpus: Optional[int] = None, host_memory: Optional[int] = None) -> Limits:
    """The cores and memory a job's ranks may use together.  Ranks in one cgroup share its limit; ranks
    in cgroups of their own (a Slurm task each) add theirs up.  None where any rank is unlimited, or
    where the limit is no smaller than the host's (`host_cpus`, `host_memory`)."""
    by_cgroup: dict[tuple[Optional[str], tuple[tuple[str, str], ...]], Limits] = {}
    mounts: Optional[tuple[Optional[Mount], dict[str, Mount]]] = None
    for pid in pids:
        v2_path, v1_paths = read_cgroup_paths(pid)
        if v2_path is None and not v1_paths:
            continue
        key = (v2_path, tuple(sorted(v1_paths.items())))
        if key not in by_cgroup:
            mounts = mounts or read_mounts()
            by_cgroup[key] = limits_of(v2_path, v1_paths, mounts=mounts)
    if not by_cgroup:
        return Limits()
    limits = list(by_cgroup.values())
    cpus = [lim.cpu for lim in limits if lim.cpu is not None]
    memories = [lim.memory for lim in limits if lim.memory is not None]
    cpu = sum(cpus) if len(cpus) == len(limits) else None  # None where any rank is unlimited
    memory = sum(memories) if len(memories) == len(limits) else None
    host_cpus = host_cpus if host_cpus is not None else os.cpu_count()
    if cpu is not None and host_cpus and cpu >= host_cpus:
        cpu = None
    if memory is not None and host_memory and memory >= host_memory:
        memory = None
    return Limits(cpu=cpu, memory=memory)
