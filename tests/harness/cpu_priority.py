"""A lower CPU priority for the shared tests while the suite runs side by side (tests/harness/turns.py).

An acceptance test's live jobs are judged by their shares of time and their verdicts; a test beside it that
wants the same cores slows them.  Excluding the others costs the run their time; here they run beside it with
less weight instead: every process a shared test starts (and the pytest worker while it runs one) sits in one
cgroup whose cpu.shares is `SHARED_TESTS_SHARES`.  The kernel gives each session (autogroup) of the root group
1024, so while the acceptance test's job wants every core the shared tests together get a fifth of the box beside
one of its busy sessions (a ninth beside two), and every core it leaves idle.  They still move (their waits have deadlines; an idle-class
group would stop them outright while a job computes).

Where the kernel offers no writable cgroup v1 cpu controller (not root, cgroup v2 only, a container without it)
`CpuPriority.for_run` returns None and the conftest keeps the exclusive turns: an acceptance test then takes two
slots (one shared test beside it, at the same priority) and the series that needs the box to itself runs alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from gputop.collect import cgroup

SHARED_TESTS_SHARES = 256  # cpu.shares of the shared tests' group; a session (autogroup) of the root group: 1024
GROUP_PREFIX = "gputop-tests-"


def _own_cpu_directory(pid: int) -> Optional[Path]:
    """Where `pid`'s cgroup in the v1 cpu hierarchy lies here (gputop's own readers of mountinfo and
    /proc/PID/cgroup); None without a v1 cpu controller."""
    _, mounts = cgroup.read_mounts()
    _, paths = cgroup.read_cgroup_paths(pid)
    if "cpu" not in mounts or "cpu" not in paths:
        return None
    directory = cgroup.cgroup_directory(mounts["cpu"], paths["cpu"])
    return Path(directory) if directory else None


class CpuPriority:
    """One run's group for the shared tests, and this process's way in and out of it."""

    def __init__(self, home: Path, shared: Path) -> None:
        self.home = home  # where this process was: back here for a measured test
        self.shared = shared

    @classmethod
    def for_run(cls, run_id: str) -> Optional["CpuPriority"]:
        home = _own_cpu_directory(os.getpid())
        if home is None:
            return None
        if home.name.startswith(GROUP_PREFIX):  # a worker started while its parent sat in the group
            home = home.parent
        shared = home / f"{GROUP_PREFIX}{run_id}"
        if not os.access(home / "cgroup.procs", os.W_OK):
            return None
        try:
            shared.mkdir(exist_ok=True)
            (shared / "cpu.shares").write_text(str(SHARED_TESTS_SHARES))
        except OSError:
            return None
        return cls(home, shared)

    def lower(self) -> None:
        """This process, and every process it starts from now on, into the shared tests' group."""
        (self.shared / "cgroup.procs").write_text(str(os.getpid()))

    def restore(self) -> None:
        """This process back where it was; what it started while lowered stays there."""
        (self.home / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        """The group gone, once nothing is left in it (a process some test leaked keeps it; it is harmless)."""
        try:
            self.restore()
            self.shared.rmdir()
        except OSError:
            pass


def in_group(pid: int, group: Path) -> bool:
    """Whether process `pid` sits in `group`."""
    return _own_cpu_directory(pid) == group
