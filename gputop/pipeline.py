"""The pipeline: collectors in, one `Snapshot` out per `poll()`; the live `Source` (see source.py).

Every sink (TUI, report, recorder, `gputop snapshot`) gets its data here, real
or simulated, so what the screen shows is what the report says.

    pipeline = Pipeline(simulate="h100-sxm-8+thermal=2")   # or Pipeline() on a real machine
    pipeline.machine      # MachineInfo, read once
    pipeline.poll()       # Snapshot; blocking (NVML, psutil, /proc): call it from a worker thread
    pipeline.attach(pid)  # follow a job (Attachable); until then poll() groups GPU processes into jobs
    pipeline.close()
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from gputop.collect.gpu import GpuCollector, GpuUnavailableError
from gputop.collect.host import HostCollector, numa_layout_from_affinity
from gputop.collect.sysfs import HostReader
from gputop.model import GpuDetails, JobTree, MachineInfo, Snapshot, Topology


class Pipeline:
    def __init__(
        self,
        simulate: Optional[str] = None,
        pid: Optional[int] = None,
        *,
        load_model: Any = None,
        job_collector: Any = None,
        stack_interval: float = 2.0,
        clock: Callable[[], float] = time.time,
        host_collector: Any = None,
    ) -> None:
        """`simulate`: a spec `PROFILE[+FAULT...]` (UsageError if bad) or None for the real driver.

        `clock` stamps the snapshots.  With a custom clock the simulated GPUs run on it too
        (otherwise they run on time.monotonic, the clock `LoadModel`s use), so a test that
        controls the clock gets deterministic GPU readings.  `host_collector` replaces the
        psutil collector (tests that need deterministic host numbers).
        """
        self._clock = clock
        self._stack_interval = stack_interval
        self.simulated = simulate is not None
        self.job_collector = job_collector
        self._stacks_wanted = True
        self._sampling_focused = False
        self.gpu: Optional[GpuCollector] = None
        self.fake_library = None
        self._closed = False
        spec = None
        library = None
        if self.simulated:
            # imported here: a real run never loads the simulator
            from gputop.sim.fake_nvml import FakeNvmlLibrary
            from gputop.sim.profiles import parse_spec
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

        if pid is not None and self.job_collector is None:
            try:
                self.attach(pid)
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

    def focus_sampling(self, focused: bool) -> None:
        """Sample the attached job's ranks densely (a report, the findings screen) or at the screen's rate."""
        self._sampling_focused = focused
        collector = self.job_collector
        if collector is not None and hasattr(collector, "focus_sampling"):
            collector.focus_sampling(focused)

    def flush_samples(self) -> None:
        """End the running dense stretches now, so the next poll carries them (a report's last seconds)."""
        collector = self.job_collector
        if collector is not None and hasattr(collector, "flush_samples"):
            collector.flush_samples()

    def poll(self) -> Snapshot:
        """One sample of everything. Per-field and per-GPU failures arrive as None / lost, never as exceptions."""
        gpus = self.gpu.sample() if self.gpu is not None else ()
        host = self.host.sample()
        now = self._clock()
        job_collector = self.job_collector  # read once: attach() may swap it from another thread
        job = job_collector.collect(gpus, now) if job_collector is not None else None
        jobs: tuple[JobTree, ...] = ()
        if job_collector is None and any(g.processes for g in gpus):
            from gputop.collect.job_tree import discover_jobs  # /proc only: no py-spy, no stacks

            jobs = tuple(discover_jobs(gpus))
        return Snapshot(timestamp=now, host=host, gpus=gpus, job=job, simulated=self.simulated, jobs=jobs)

    def gpu_details(self) -> tuple[GpuDetails, ...]:
        """Each GPU's identity, modes and error counters (`gputop check`'s start and end); () without a driver."""
        return self.gpu.details() if self.gpu is not None else ()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for part in (self.job_collector, self.gpu, self.host):
            if part is not None:
                part.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pipeline_from_args(args: Any) -> Pipeline:
    """Build the pipeline a subcommand asked for (uses args.simulate, args.pid, args.stack_interval if present)."""
    return Pipeline(
        simulate=getattr(args, "simulate", None),
        pid=getattr(args, "pid", None),
        stack_interval=getattr(args, "stack_interval", 2.0),
    )
