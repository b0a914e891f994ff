"""The machine a pipeline reads: the real one, or a simulated one (`--simulate PROFILE[+FAULT...]`).

A backend hands the pipeline what differs between the two, and nothing else:
- the NVML library to install below pynvml (None: the driver pynvml loads; else the fake C interface);
- the host collector (CPU, memory) and how its cores are laid out against the GPUs' NUMA nodes;
- the NICs: their topology beside the GPUs, and the source their ports are read from each poll;
- the kernel's side (AER counters, the kernel log's XIDs) that `gputop check` and the counter watch read;
- the clock (gputop/clock.py) the snapshots, every reader and (simulated) the GPUs run on.

The pipeline is the same code over either (pipeline.py has no `if simulated`); the simulator is imported
only by `SimulatedMachine`, so a real run never loads it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Optional, Protocol

from gputop.clock import Clock, clock_of
from gputop.collect.host import HostCollector, numa_layout_from_affinity
from gputop.collect.sysfs import HostReader, NicReader, NicSource
from gputop.model import HostSample, Topology

if TYPE_CHECKING:
    from gputop.collect.counters import HostSource
    from gputop.sim.fake_nvml import FakeNvmlLibrary
    from gputop.sim.load import LoadModel
    from gputop.sim.profiles import SimSpec


class HostSampler(Protocol):
    """The host's side of a poll (`collect.host.HostCollector`, or a test's fixed numbers)."""

    hostname: str
    cpu_model: str
    cpu_count: int

    def sample(self) -> HostSample: ...

    def close(self) -> None: ...


class MachineBackend(Protocol):
    """What a `Pipeline` reads the machine through (`RealMachine`, `SimulatedMachine`)."""

    @property
    def simulated(self) -> Optional[str]: ...  # the simulation's spec text; None on the real machine

    @property
    def clock(self) -> Clock: ...  # stamps the snapshots and times the readers (gputop/clock.py)

    @property
    def host(self) -> HostSampler: ...

    @property
    def nvml_library(self) -> object: ...  # installed below pynvml; None: the real driver

    def fit_host(self, topology: Topology) -> None:
        """Lay the host's cores out against the GPUs' topology, once NVML has been read."""

    def nic_topology(self, topology: Topology, bus_ids: tuple[Optional[str], ...]) -> Topology:
        """`topology` with the NICs beside the GPUs of `bus_ids`."""

    def nic_source(self) -> NicSource:
        """The NIC ports, read each poll."""

    def host_source(self, root: Optional[str] = None) -> HostSource:
        """The kernel's side: AER counters and the kernel log's XIDs (under `root`'s /sys and log if given)."""


def real_host_source(root: Optional[str], clock: Clock) -> HostSource:
    from gputop.collect.counters import HostSource  # the check's rules: only where the counters are read

    return HostSource(HostReader(root or "/", clock=clock.wall).read)


class RealMachine:
    """This machine: the NVML driver pynvml loads, psutil, /sys and the kernel log."""

    simulated: Optional[str] = None
    nvml_library: object = None

    def __init__(self, *, clock: Callable[[], float] = time.time, host: Optional[HostSampler] = None) -> None:
        self.clock = clock_of(clock)
        self.host: HostSampler = host if host is not None else HostCollector(self.clock.elapsed)

    def fit_host(self, topology: Topology) -> None:
        pass  # the host's own layout, read from /sys

    def nic_topology(self, topology: Topology, bus_ids: tuple[Optional[str], ...]) -> Topology:
        return HostReader("/", use_dmesg=False).nic_topology(topology, bus_ids)

    def nic_source(self) -> NicSource:
        return NicReader("/", clock=self.clock.wall)

    def host_source(self, root: Optional[str] = None) -> HostSource:
        return real_host_source(root, self.clock)


class SimulatedMachine:
    """A simulated machine from a spec `PROFILE[+FAULT...]` (UsageError if bad, before anything starts): the
    fake NVML library under the real pynvml wrappers, the fake /sys the real readers parse, and this host's
    CPU and memory.

    `load`: what the GPUs run (default a synthetic load).  `clock` is the time now: with a custom clock (a test's
    `ManualClock`) the simulated GPUs, the snapshots' stamps and every reader's cadence run on it alone
    (gputop/clock.py), so a test that controls the clock gets deterministic readings and builds minutes of
    history in milliseconds; by default the GPUs run on time.monotonic (the clock `LoadModel`s use) and the
    stamps on time.time.  `host` replaces the psutil collector."""

    def __init__(
        self,
        spec: str,
        *,
        load: Optional[LoadModel] = None,
        clock: Callable[[], float] = time.time,
        host: Optional[HostSampler] = None,
    ) -> None:
        from gputop.sim.fake_nvml import FakeNvmlLibrary
        from gputop.sim.spec import parse_spec
        from gputop.sim.synthetic import SyntheticLoad

        self.spec: SimSpec = parse_spec(spec)  # a bad spec fails before anything is started
        profile = self.spec.profile
        self.clock = clock_of(clock)
        gpu_load = load if load is not None else SyntheticLoad(profile.gpu_count, profile.gpu.memory_total)
        self.library: FakeNvmlLibrary = FakeNvmlLibrary(self.spec, gpu_load, clock=self.clock.elapsed)
        self.host: HostSampler = host if host is not None else HostCollector(self.clock.elapsed)

    @property
    def simulated(self) -> Optional[str]:
        return self.spec.text

    @property
    def nvml_library(self) -> object:
        return self.library

    def fit_host(self, topology: Topology) -> None:
        # the simulated GPUs' NUMA nodes are mapped onto this host's cores (see Profile.cpu_affinity); show the
        # cores with the same layout so "rank on the GPU's NUMA node" stays consistent
        if isinstance(self.host, HostCollector):
            self.host.core_numa = numa_layout_from_affinity(self.host.cpu_count, topology.cpu_affinity, topology.numa_node)

    def nic_topology(self, topology: Topology, bus_ids: tuple[Optional[str], ...]) -> Topology:
        from gputop.sim.fake_sysfs import nic_topology

        return nic_topology(self.spec.profile, topology, bus_ids)

    def nic_source(self) -> NicSource:
        from gputop.sim.fake_sysfs import FakeNicTree

        return FakeNicTree(self.spec, self.library.elapsed, clock=self.clock.wall)

    def host_source(self, root: Optional[str] = None) -> HostSource:
        if root is not None:
            return real_host_source(root, self.clock)
        from gputop.collect.counters import HostSource
        from gputop.sim.fake_sysfs import FakeHostTree

        tree = FakeHostTree(self.spec, self.library.elapsed, clock=self.clock.wall)
        return HostSource(tree.read, tree.close)


def machine_backend(
    simulate: Optional[str], *, clock: Callable[[], float] = time.time, host: Optional[HostSampler] = None
) -> MachineBackend:
    """The machine a command's `--simulate` names: the simulated one, or (None) this one."""
    if simulate is None:
        return RealMachine(clock=clock, host=host)
    return SimulatedMachine(simulate, clock=clock, host=host)
