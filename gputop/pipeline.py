"""The pipeline: collectors in, one `Snapshot` out per `poll()`; the live `Source` (see source.py).

Every sink (TUI, report, recorder, `gputop snapshot`) gets its data here, real
or simulated, so what the screen shows is what the report says.

    pipeline = Pipeline(SimulatedMachine("h100-sxm-8+thermal=2"))   # or Pipeline(RealMachine())
    pipeline.machine      # MachineInfo, read once
    pipeline.poll()       # Snapshot; blocking (NVML, psutil, /proc): call it from a worker thread
    pipeline.attach(pid)  # follow a job (Attachable); until then poll() groups GPU processes into jobs
    pipeline.close()

    Pipeline(backend, follow=Following(pids=[a, b]))    # several jobs with their stacks (`serve`, `record`)
    Pipeline(backend, follow=Following(every_job=True))  # every job on the GPUs with its stacks, as they come and go
    Pipeline(backend, watch=CounterCadence(60.0))  # `gputop check`'s counters every 60 s onto Snapshot.counter_health

The backend (backend.py) is the machine, real or simulated; the commands build their pipelines with the
named factories at the end of this module.

What a snapshot carries of the jobs, whichever way they are followed:
- `Snapshot.job`: the one job followed with its stacks (attached, or the only one followed);
- `Snapshot.jobs`: the jobs followed with their stacks when there are several; with none followed, the
  machine's GPU processes grouped into jobs (no stacks), what the TUI offers to attach to.
`source.jobs_of(snapshot)` reads them back as one sequence: the jobs `serve` exports, `record` keeps and
`report --from` diagnoses, so the three see the same trees.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional, Sequence

from gputop.backend import HostSampler, MachineBackend, SimulatedMachine, machine_backend
from gputop.clock import REAL_CLOCK, Clock
from gputop.collect.gpu import GpuCollector, GpuUnavailableError
from gputop.collect.sysfs import NicSource
from gputop.errors import GputopError
from gputop.model import GpuDetails, GpuSample, JobTree, MachineInfo, Snapshot, Topology

if TYPE_CHECKING:
    from gputop.collect.counters import CounterWatch, HostSource
    from gputop.collect.job_tree import JobCollector
    from gputop.sim.load import LoadModel

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
        self,
        pids: Sequence[int] = (),
        *,
        discover: bool = False,
        stack_interval: float = 2.0,
        stacks_wanted: bool = True,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.discover = discover
        self.clock = clock
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

        collector = JobCollector(pid, stack_interval=self.stack_interval, stacks_wanted=self._stacks_wanted, clock=self.clock)
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


@dataclass(frozen=True)
class Following:
    """Which jobs a pipeline follows with their stacks: the one job of `pid` (the TUI's; `attach()` swaps it) or
    `attached`, one already started; else the jobs of `pids`, or with `every_job` every job on the GPUs
    (`serve`, `record`).  None of them: poll() groups the GPU processes into jobs, without stacks."""

    pid: Optional[int] = None
    pids: Sequence[int] = ()
    every_job: bool = False
    stack_interval: float = 2.0
    attached: Optional[JobCollector] = None

    def __post_init__(self) -> None:
        if (self.pid is not None or self.attached is not None) and (self.pids or self.every_job):
            raise ValueError("follow one attached job (pid) or several (pids / every_job), not both")


@dataclass(frozen=True)
class CounterCadence:
    """Every `every_s` seconds (on the pipeline's clock), read what `gputop check` reads at the ends of its window
    (the GPUs' error counters, AER, the kernel log's XIDs) and put the check's verdict on that window on the
    snapshots (`Snapshot.counter_health`; collect/counters.py); the first reading `first_after_s` seconds after
    the first poll (the TUI draws its first frames first)."""

    every_s: float
    first_after_s: float = 0.0


class Pipeline:
    """The live `Source`: a machine backend's readers, the jobs followed, the counter watch; one `Snapshot` a poll."""

    def __init__(
        self, backend: MachineBackend, *, follow: Following = Following(), watch: Optional[CounterCadence] = None
    ) -> None:
        """Read the machine through `backend` (backend.py: the real one or a simulated one), follow the jobs of
        `follow`, and watch the error counters at `watch`'s cadence (None: not watched)."""
        self.backend = backend
        self.simulated = backend.simulated is not None
        self.host = backend.host
        self._clock = backend.clock
        self._stack_interval = follow.stack_interval
        self._stacks_wanted = True
        self._sampling_focused = False
        self._closed = False
        self.job_collector: Optional[JobCollector] = follow.attached
        self.followed: Optional[FollowedJobs] = None
        self.counters: Optional[CounterWatch] = None
        self.gpu: Optional[GpuCollector] = None
        gpu_error = None
        try:
            self.gpu = GpuCollector(library=backend.nvml_library, clock=self._clock)
        except GpuUnavailableError as exc:
            gpu_error = str(exc)
        self.machine = self._read_machine(gpu_error)
        self.nics: Optional[NicSource] = backend.nic_source()  # the NIC ports each poll
        try:
            self._follow(follow)
            if watch is not None and self.gpu is not None:
                from gputop.collect.counters import CounterWatch  # the check's rules: only where watched

                self.counters = CounterWatch(
                    self.gpu_details, self.host_source(), self.machine, watch.every_s, first_after=watch.first_after_s
                )
        except BaseException:
            self.close()
            raise

    def _read_machine(self, gpu_error: Optional[str]) -> MachineInfo:
        """The machine's static side, read once: the host, the GPUs' driver and names, the topology with the NICs."""
        gpu, host = self.gpu, self.host
        if gpu is not None:
            self.backend.fit_host(gpu.topology)
        topology = self.backend.nic_topology(gpu.topology if gpu else Topology(), gpu.bus_ids if gpu else ())
        return MachineInfo(
            hostname=getattr(host, "hostname", ""),
            cpu_model=getattr(host, "cpu_model", ""),
            cpu_count=getattr(host, "cpu_count", 0),
            driver_version=gpu.driver_version if gpu else None,
            cuda_version=gpu.cuda_version if gpu else None,
            nvml_version=gpu.nvml_version if gpu else None,
            gpu_error=gpu_error,
            gpu_count=gpu.gpu_count if gpu else 0,
            gpu_names=gpu.gpu_names if gpu else (),
            simulated=self.backend.simulated,
            topology=topology,
        )

    def _follow(self, follow: Following) -> None:
        if follow.pid is not None and follow.attached is None:
            self.attach(follow.pid)
        elif follow.pids or follow.every_job:
            self.followed = FollowedJobs(
                follow.pids, discover=follow.every_job, stack_interval=follow.stack_interval, clock=self._clock
            )

    def attach(self, pid: int) -> None:
        """Follow the job behind `pid` from the next poll on (also Enter on a process in the TUI).

        Raises GputopError when there is no such process; the previous job, if any, stays attached then.
        """
        from gputop.collect.job_tree import JobCollector  # the attach side; only needed with a PID

        new = JobCollector(pid, stack_interval=self._stack_interval, stacks_wanted=self._stacks_wanted, clock=self._clock)
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
        now = self._clock.wall()
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
        return self.backend.host_source(root)

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
    """The pipeline of `snapshot` and `report`: the machine of args.simulate, the job of args.pid if given."""
    return Pipeline(
        machine_backend(getattr(args, "simulate", None)),
        follow=Following(pid=getattr(args, "pid", None), stack_interval=getattr(args, "stack_interval", 2.0)),
    )


def following_pipeline(args: argparse.Namespace) -> Pipeline:
    """The pipeline of `serve` and `record`, built from the same options so that a recording holds what
    `serve` exports: the jobs of `args.pid` (a list), or every job on the GPUs, each with its stacks."""
    pids = list(getattr(args, "pid", None) or ())
    cadence = getattr(args, "watch_counters", None)
    cadence = WATCH_COUNTERS_S if cadence is None else cadence
    return Pipeline(
        machine_backend(getattr(args, "simulate", None)),
        follow=Following(pids=pids, every_job=not pids, stack_interval=getattr(args, "stack_interval", 2.0)),
        watch=CounterCadence(cadence) if cadence else None,  # 0: not watched
    )


def check_pipeline(simulate: Optional[str]) -> Pipeline:
    """The pipeline of `gputop check`: the machine only, no job followed, the counters read by the check itself."""
    return Pipeline(machine_backend(simulate))


def tui_pipeline(simulate: Optional[str], host: HostSampler, attached: Optional[JobCollector], stack_interval: float) -> Pipeline:
    """The TUI's pipeline, from the host collector and the attached job `StartingPipeline` started first; the
    counters watched as `gputop check` and `gputop serve` read them, first once the first frames are drawn."""
    return Pipeline(
        machine_backend(simulate, host=host),
        follow=Following(attached=attached, stack_interval=stack_interval),
        watch=CounterCadence(WATCH_COUNTERS_S, first_after_s=TUI_WATCH_FIRST_AFTER_S),
    )


def demo_pipeline(launcher_pid: int, load: LoadModel, stack_interval: float = 2.0) -> Pipeline:
    """`gputop demo`'s pipeline: the demo's simulated machine running the demo job's `load`, the job of
    `launcher_pid` attached, the counters watched as in the TUI."""
    from gputop.sim.scenarios import DEMO_PROFILE

    return Pipeline(
        SimulatedMachine(DEMO_PROFILE, load=load),
        follow=Following(pid=launcher_pid, stack_interval=stack_interval),
        watch=CounterCadence(WATCH_COUNTERS_S, first_after_s=TUI_WATCH_FIRST_AFTER_S),
    )


def case_study_pipeline(load: LoadModel, stack_interval: float = 2.0) -> Pipeline:
    """The case study's pipeline: the demo's simulated machine under `load` (which follows each stage's job),
    no job attached (the stage attaches its own)."""
    from gputop.sim.scenarios import DEMO_PROFILE

    return Pipeline(SimulatedMachine(DEMO_PROFILE, load=load), follow=Following(stack_interval=stack_interval))
