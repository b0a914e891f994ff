"""The pipeline: collectors in, one `Snapshot` out per `poll()`; the live `Source` (see source.py).

Every sink (TUI, report, recorder, `gputop snapshot`) gets its data here, real
or simulated, so what the screen shows is what the report says.

    pipeline = Pipeline(simulate="h100-sxm-8+thermal=2")   # or Pipeline() on a real machine
    pipeline.machine      # MachineInfo, read once
    pipeline.poll()       # Snapshot; blocking (NVML, psutil, /proc): call it from a worker thread
    pipeline.attach(pid)  # follow a job (Attachable); until then poll() groups GPU processes into jobs
    pipeline.close()

    Pipeline(pids=[a, b])       # follow several jobs with their stacks (`serve`, `record`)
    Pipeline(follow_all=True)   # follow every job on the GPUs with its stacks, as they come and go
    Pipeline(watch_counters=60.0)  # read `gputop check`'s counters every 60 s onto Snapshot.counter_health

What a snapshot carries of the jobs, whichever way they are followed:
- `Snapshot.job`: the one job followed with its stacks (attached, or the only one followed);
- `Snapshot.jobs`: the jobs followed with their stacks when there are several; with none followed, the
  machine's GPU processes grouped into jobs (no stacks), what the TUI offers to attach to.
`source.jobs_of(snapshot)` reads them back as one sequence: the jobs `serve` exports, `record` keeps and
`report --from` diagnoses, so the three see the same trees.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from gputop.collect.gpu import GpuCollector, GpuUnavailableError
from gputop.collect.host import HostCollector, numa_layout_from_affinity
from gputop.collect.sysfs import HostReader, NicReader, NicSource
from gputop.errors import GputopError
from gputop.model import GpuDetails, GpuSample, JobTree, MachineInfo, Snapshot, Topology

if TYPE_CHECKING:
    from gputop.collect.counters import CounterWatch, HostSource
    from gputop.collect.job_tree import JobCollector

# The counter watch of `serve`, `record`, the TUI and the demo (collect/counters.py): one reading of the GPUs'
# error counters, the AER files and the kernel log a minute costs a few ms (benchmarks/bench_counters.py); a
# counter that climbs is seen within two minutes.
WATCH_COUNTERS_S = 60.0
# The TUI's first reading waits this long: its first frames (and the check's code, loaded by the first verdict
# on a reading) come first.
TUI_WATCH_FIRST_AFTER_S = 10.0


class FollowedJobs:
    """Several jobs followed at once, each by its own `JobCollector` (stacks, dense state samples).

    The jobs behind `pids` (GputopError at once for a PID that is not there), or with `discover` every
    job on the GPUs, grouped as the machine view groups them, followed while it holds a GPU.  A job of
    `pids` that exits stays, marked exited with its last stacks, as an attached job does (a recording
    ends on it); a discovered one is handed over once so marked, and then no longer followed."""

    def __init__(
        self, pids: Sequence[int] = (), *, discover: bool = False, stack_interval: float = 2.0, stacks_wanted: bool = True
    ) -> None:
        self.discover = discover
        self.stack_interval = stack_interval
        self._stacks_wanted = stacks_wanted
        self._focused = False
        # the PID given (or the discovered job's anchor: its launcher or lone rank) -> its collector
        self._collectors: dict[int, JobCollector] = {}
        try:
            for pid in dict.fromkeys(pids):
                self._collectors[pid] = self._follow(pid)
        except BaseException:
            self.close()
            raise

    def _follow(self, pid: int) -> JobCollector:
        from gputop.collect.job_tree import JobCollector  # /proc and py-spy: only where jobs are followed

        collector = JobCollector(pid, stack_interval=self.stack_interval, stacks_wanted=self._stacks_wanted)
        collector.focus_sampling(self._focused)
        return collector

    @property
    def followed(self) -> list[int]:
        """The PIDs (or anchors) followed now."""
        return list(self._collectors)

    def collect(self, gpus: tuple[GpuSample, ...], now: float) -> list[JobTree]:
        if self.discover:
            self._discover(gpus)
        trees = []
        for pid, collector in list(self._collectors.items()):
            tree = collector.collect(gpus, now)
            trees.append(tree)
            if tree.exited and self.discover:  # gone (or its PID names another process): the exit is told once
                self._collectors.pop(pid).close()
        return trees

    def _discover(self, gpus: tuple[GpuSample, ...]) -> None:
        from gputop.collect.job_tree import discover_jobs

        anchors = [tree.anchor for tree in discover_jobs(gpus)] if any(g.processes for g in gpus) else []
        for pid in set(self._collectors) - set(anchors):
            self._collectors.pop(pid).close()
        for pid in anchors:
            if pid not in self._collectors:
                try:
                    self._collectors[pid] = self._follow(pid)
                except GputopError:  # it exited between the scan and the attach
                    continue
        # discovery's order (by first GPU), so the jobs come in the same order every poll
        self._collectors = {pid: self._collectors[pid] for pid in anchors if pid in self._collectors}

    def want_stacks(self, wanted: bool) -> None:
        self._stacks_wanted = wanted
        for collector in self._collectors.values():
            collector.stacks_wanted = wanted

    def focus_sampling(self, focused: bool) -> None:
        self._focused = focused
        for collector in self._collectors.values():
            collector.focus_sampling(focused)

    def flush_samples(self) -> None:
        for collector in self._collectors.values():
            collector.flush_samples()

    def close(self) -> None:
        for collector in self._collectors.values():
            collector.close()
        self._collectors.clear()


class Pipeline:
    def __init__(
        self,
        simulate: Optional[str] = None,
        pid: Optional[int] = None,
        *,
        pids: Sequence[int] = (),
        follow_all: bool = False,
        load_model: Any = None,
        job_collector: Any = None,
        stack_interval: float = 2.0,
        clock: Callable[[], float] = time.time,
        host_collector: Any = None,
        watch_counters: Optional[float] = None,
        watch_first_after: float = 0.0,
    ) -> None:
        """`simulate`: a spec `PROFILE[+FAULT...]` (UsageError if bad) or None for the real driver.

        `clock` stamps the snapshots.  With a custom clock the simulated GPUs run on it too
        (otherwise they run on time.monotonic, the clock `LoadModel`s use), so a test that
        controls the clock gets deterministic GPU readings.  `host_collector` replaces the
        psutil collector (tests that need deterministic host numbers).

        `pid`: attach to that job (the TUI's one job, `attach()` swaps it).  `pids`: follow those jobs,
        each with its stacks; `follow_all`: follow every job on the GPUs so (`serve`, `record`).

        `watch_counters`: every that many seconds (on the pipeline's clock), read what `gputop check`
        reads at the ends of its window (the GPUs' error counters, AER, the kernel log's XIDs) and put the
        check's verdict on that window on the snapshots (`Snapshot.counter_health`; collect/counters.py);
        the first reading `watch_first_after` seconds after the first poll (the TUI draws its first frames first).
        """
        if pid is not None and (pids or follow_all):
            raise ValueError("pass pid (one attached job) or pids / follow_all (followed jobs), not both")
        self._clock = clock
        self._stack_interval = stack_interval
        self.simulated = simulate is not None
        self.job_collector = job_collector
        self._stacks_wanted = True
        self._sampling_focused = False
        self.followed: Optional[FollowedJobs] = None
        self.gpu: Optional[GpuCollector] = None
        self.fake_library = None
        self.counters: Optional[CounterWatch] = None
        self.nics: Optional[NicSource] = None  # the NIC ports each poll (collect/sysfs.NicReader)
        self._closed = False
        spec = None
        library = None
        if self.simulated:
            # imported here: a real run never loads the simulator
            from gputop.sim.fake_nvml import FakeNvmlLibrary
            from gputop.sim.spec import parse_spec
            from gputop.sim.synthetic import SyntheticLoad

            spec = parse_spec(simulate)  # a bad spec fails before anything is started
            profile = spec.profile
            load = load_model or SyntheticLoad(profile.gpu_count, profile.gpu.memory_total)
            sim_clock = time.monotonic if clock is time.time else clock
            library = self.fake_library = FakeNvmlLibrary(spec, load, clock=sim_clock)

        self.host = host_collector if host_collector is not None else HostCollector()
        gpu_error = None
        try:
            self.gpu = GpuCollector(library=library)
        except GpuUnavailableError as exc:
            gpu_error = str(exc)

        topology = self.gpu.topology if self.gpu else None
        if self.simulated and topology is not None and isinstance(self.host, HostCollector):
            # the simulated GPUs' NUMA nodes are mapped onto this host's cores (see Profile.cpu_affinity);
            # show the cores with the same layout so "rank on the GPU's NUMA node" stays consistent
            self.host.core_numa = numa_layout_from_affinity(self.host.cpu_count, topology.cpu_affinity, topology.numa_node)
        # the NICs, from /sys: the real one, or the simulated machine's, read by the same reader
        topology, bus_ids = topology or Topology(), self.gpu.bus_ids if self.gpu else ()
        if spec is not None:
            from gputop.sim.fake_sysfs import nic_topology

            topology = nic_topology(spec.profile, topology, bus_ids)
        else:
            topology = HostReader("/", use_dmesg=False).nic_topology(topology, bus_ids)
        if spec is not None and self.fake_library is not None:
            from gputop.sim.fake_sysfs import FakeNicTree

            self.nics = FakeNicTree(spec, self.fake_library.elapsed, clock=clock)
        elif spec is None:
            self.nics = NicReader("/", clock=clock)
        machine_kwargs: dict[str, Any] = {"topology": topology}
        self.machine = MachineInfo(
            hostname=getattr(self.host, "hostname", ""),
            cpu_model=getattr(self.host, "cpu_model", ""),
            cpu_count=getattr(self.host, "cpu_count", 0),
            driver_version=self.gpu.driver_version if self.gpu else None,
            cuda_version=self.gpu.cuda_version if self.gpu else None,
            nvml_version=self.gpu.nvml_version if self.gpu else None,
            gpu_error=gpu_error,
            gpu_count=self.gpu.gpu_count if self.gpu else 0,
            gpu_names=self.gpu.gpu_names if self.gpu else (),
            simulated=spec.text if spec is not None else None,
            **machine_kwargs,
        )

        try:
            if pid is not None and self.job_collector is None:
                self.attach(pid)
            elif pids or follow_all:
                self.followed = FollowedJobs(pids, discover=follow_all, stack_interval=stack_interval)
            if watch_counters is not None and self.gpu is not None:
                from gputop.collect.counters import CounterWatch  # the check's rules: only where watched

                self.counters = CounterWatch(
                    self.gpu_details, self.host_source(), self.machine, watch_counters, first_after=watch_first_after
                )
        except BaseException:
            self.close()
            raise

    def attach(self, pid: int) -> None:
        """Follow the job behind `pid` from the next poll on (also Enter on a process in the TUI).

        Raises GputopError when there is no such process; the previous job, if any, stays attached then.
        """
        from gputop.collect.job_tree import JobCollector  # the attach side; only needed with a PID

        new = JobCollector(pid, stack_interval=self._stack_interval, stacks_wanted=self._stacks_wanted)
        new.focus_sampling(self._sampling_focused)
        old, self.job_collector = self.job_collector, new  # one assignment: poll() sees old or new
        if old is not None:
            old.close()

    def want_stacks(self, wanted: bool) -> None:
        """Dump the attached job's stacks only while they are shown or kept (also for a job attached later)."""
        self._stacks_wanted = wanted
        collector = self.job_collector
        if collector is not None:
            collector.stacks_wanted = wanted
        if self.followed is not None:
            self.followed.want_stacks(wanted)

    def focus_sampling(self, focused: bool) -> None:
        """Sample the attached job's ranks densely (a report, the findings screen) or at the screen's rate."""
        self._sampling_focused = focused
        collector = self.job_collector
        if collector is not None and hasattr(collector, "focus_sampling"):
            collector.focus_sampling(focused)
        if self.followed is not None:
            self.followed.focus_sampling(focused)

    def flush_samples(self) -> None:
        """End the running dense stretches now, so the next poll carries them (a report's last seconds)."""
        collector = self.job_collector
        if collector is not None and hasattr(collector, "flush_samples"):
            collector.flush_samples()
        if self.followed is not None:
            self.followed.flush_samples()

    def poll(self) -> Snapshot:
        """One sample of everything. Per-field and per-GPU failures arrive as None / lost, never as exceptions."""
        gpus = self.gpu.sample() if self.gpu is not None else ()
        host = self.host.sample()
        now = self._clock()
        job_collector = self.job_collector  # read once: attach() may swap it from another thread
        job = job_collector.collect(gpus, now) if job_collector is not None else None
        jobs: tuple[JobTree, ...] = ()
        if job_collector is None and self.followed is not None:
            followed = self.followed.collect(gpus, now)
            # one job goes where an attached job goes (the TUI, a replay and the recording's stack sharing
            # read it there); several go to `jobs`
            job, jobs = (followed[0], ()) if len(followed) == 1 else (None, tuple(followed))
        elif job_collector is None and any(g.processes for g in gpus):
            from gputop.collect.job_tree import discover_jobs  # /proc only: no py-spy, no stacks

            jobs = tuple(discover_jobs(gpus))
        nics = self.nics.read() if self.nics is not None else None
        counters = self.counters
        latest = counters.latest if counters is not None else None
        snap = Snapshot(
            timestamp=now, host=host, gpus=gpus, job=job, simulated=self.simulated, jobs=jobs, counter_health=latest, nics=nics
        )
        if counters is not None and counters.due(now):  # the slow cadence: most polls carry the last window's verdict
            snap = replace(snap, counter_health=counters.judge(snap))
        return snap

    def watch_nic_errors(self) -> None:
        """Read the NICs' error counters every poll rather than every few seconds: a check's short window
        must see them twice to see them climb."""
        if self.nics is not None:
            self.nics.errors_every_s = 0.0

    def host_source(self, root: Optional[str] = None) -> HostSource:
        """The kernel's side of this machine (AER counters, the kernel log's XIDs): the simulated machine's tree
        under `--simulate`, else /sys and the kernel log under `root` (default /)."""
        from gputop.collect.counters import HostSource

        if self.fake_library is not None and root is None:
            from gputop.sim.fake_sysfs import FakeHostTree

            tree = FakeHostTree(self.fake_library.spec, self.fake_library.elapsed)
            return HostSource(tree.read, tree.close)
        return HostSource(HostReader(root or "/").read)

    def gpu_details(self) -> tuple[GpuDetails, ...]:
        """Each GPU's identity, modes and error counters (`gputop check`'s start and end); () without a driver."""
        return self.gpu.details() if self.gpu is not None else ()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for part in (self.job_collector, self.followed, self.counters, self.gpu, self.host, self.nics):
            if part is not None:
                part.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pipeline_from_args(args: argparse.Namespace) -> Pipeline:
    """Build the pipeline a subcommand asked for (uses args.simulate, args.pid, args.stack_interval if present)."""
    return Pipeline(
        simulate=getattr(args, "simulate", None),
        pid=getattr(args, "pid", None),
        stack_interval=getattr(args, "stack_interval", 2.0),
    )


def following_pipeline(args: argparse.Namespace) -> Pipeline:
    """The pipeline of `serve` and `record`, built from the same options so that a recording holds what
    `serve` exports: the jobs of `args.pid` (a list), or every job on the GPUs, each with its stacks."""
    pids = list(getattr(args, "pid", None) or ())
    cadence = getattr(args, "watch_counters", None)
    cadence = WATCH_COUNTERS_S if cadence is None else cadence
    return Pipeline(
        simulate=getattr(args, "simulate", None),
        pids=pids,
        follow_all=not pids,
        stack_interval=getattr(args, "stack_interval", 2.0),
        watch_counters=cadence if cadence else None,  # 0: not watched
    )
