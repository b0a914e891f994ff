"""CPU priority for the tests run side by side (tests/harness/turns.py): the measured test first, the shared ones
in what it leaves.

An acceptance test's live jobs are judged by their shares of time and their verdicts; a test beside it that
wants the same cores slows them.  Excluding the others costs the run their time; here they run beside it with
less weight instead.  Two cgroups in the v1 cpu hierarchy, one run's each:

- the measured test's (cpu.shares `MEASURED_SHARES`): the pytest worker while it runs an acceptance test, and
  every process it starts meanwhile;
- the shared tests' (`SHARED_SHARES`): the workers while they run shared tests, and what those start.

The kernel shares a contended core between the two groups by their shares, however many processes or sessions
each holds: the measured test gets four fifths of the box when it wants all of it, the shared tests together the
other fifth (their waits have deadlines: a shared test that imports torch still does so in seconds), and each
gets every core the other leaves idle.  An ``alone`` test runs back in the worker's own cgroup with nothing
beside it, where the kernel shares the cores among sessions (autogroup) as on a user's box: the case study's and
the CPU-bound prediction's bound is that model.

Off unless GPUTOP_TEST_CPU_PRIORITY=1.  A shared test must meet its bounds with a fifth of the box, and with the
priority on each clean-clone run has found another that does not, each fixed at its cause (a rate bar slowed by the
starved box, a unit test near its budget, a torch import within 8 s, a utilization bar, a `serve` stopped by a
timer, the safe-point helper's start inside the call's deadline, a race in `serve`'s stop, the benchmark agent's
2 s wait for a late plan); on 2026-12-07 ci23 also failed an in-process flight-recorder read inside a 12 s report and
a job noticing its dead worker within 60 s: see docs/development.md.  Where it is on, the unit-only files run before the measured
chain starts (tests/harness/measured_chain.py), and a unit test of a mixed file runs in the measured group: a unit
test's budget is its own code's time, not the starved group's.
Where it is off, or the kernel offers no writable cgroup v1 cpu controller (not root, cgroup v2 only, a container without it)
`CpuPriority.for_run` returns None and the conftest keeps the exclusive turns: an acceptance test then takes two
slots (one shared test beside it, at the same priority) and the series that needs the box to itself runs alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from gputop.collect import cgroup

MEASURED_SHARES = 1024  # cpu.shares of the measured test's group (a session of the root group weighs the same)
SHARED_SHARES = 256  # the shared tests' group: a fifth of a contended box beside the measured test
GROUP_PREFIX = "gputop-tests-"
SWITCH = "GPUTOP_TEST_CPU_PRIORITY"  # =1 turns the priority on (see the module docstring)


def _own_cpu_directory(pid: int) -> Optional[Path]:
    """Where `pid`'s cgroup in the v1 cpu hierarchy lies here (gputop's own readers of mountinfo and
    /proc/PID/cgroup); None without a v1 cpu controller."""
    _, mounts = cgroup.read_mounts()
    _, paths = cgroup.read_cgroup_paths(pid)
    if "cpu" not in mounts or "cpu" not in paths:
        return None
    directory = cgroup.cgroup_directory(mounts["cpu"], paths["cpu"])
    return Path(directory) if directory else None


def _make_group(group: Path) -> None:
    group.mkdir(exist_ok=True)
    shares = MEASURED_SHARES if group.name.endswith("-measured") else SHARED_SHARES
    (group / "cpu.shares").write_text(str(shares))


class CpuPriority:
    """One run's two groups, and this process's way between them and back to where it was."""

    def __init__(self, home: Path, measured: Path, shared: Path) -> None:
        self.home = home  # where this process was: back here for an alone test
        self.measured = measured
        self.shared = shared
        # the group this process was last put in: the write is skipped when a test's group is the one before's
        # (most tests in a row); unknown at first (a worker may start inside a group of its parent's)
        self._current: Optional[Path] = None

    @classmethod
    def for_run(cls, run_id: str) -> Optional["CpuPriority"]:
        if os.environ.get(SWITCH) != "1":
            return None
        home = _own_cpu_directory(os.getpid())
        if home is None:
            return None
        if home.name.startswith(GROUP_PREFIX):  # a worker started while its parent sat in one of the groups
            home = home.parent
        if not os.access(home / "cgroup.procs", os.W_OK):
            return None
        groups = {name: home / f"{GROUP_PREFIX}{run_id}-{name}" for name in ("measured", "shared")}
        try:
            for group in groups.values():
                _make_group(group)
        except OSError:
            return None
        return cls(home, groups["measured"], groups["shared"])

    def _enter(self, group: Path) -> None:
        """This process, and every process it starts from now on, into `group` (what it started before stays)."""
        if group == self._current:  # (a group with this process in it cannot be removed)
            return
        try:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        except FileNotFoundError:
            if group == self.home:
                raise
            _make_group(group)  # a worker that ended first removed it while it was empty
            (group / "cgroup.procs").write_text(str(os.getpid()))
        self._current = group

    def lower(self) -> None:
        """Into the shared tests' group."""
        self._enter(self.shared)

    def measure(self) -> None:
        """Into the measured test's group."""
        self._enter(self.measured)

    def restore(self) -> None:
        """Back where this process was (an alone test: the kernel's sessions, nothing beside)."""
        self._enter(self.home)

    def remove(self) -> None:
        """The groups gone, once nothing is left in them (a process some test leaked keeps one; it is harmless).
        Each worker tries as it ends; one that ends while another still runs may remove a group the other has
        just left, which `_enter` makes again: the last worker out leaves none."""
        try:
            self.restore()
        except OSError:
            return
        for group in (self.measured, self.shared):
            try:
                group.rmdir()
            except OSError:
                pass


def in_group(pid: int, group: Path) -> bool:
    """Whether process `pid` sits in `group`."""
    return _own_cpu_directory(pid) == group
