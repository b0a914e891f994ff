"""Plain-data snapshots: the one contract between collectors, analysis and sinks.

Everything here is a frozen dataclass of numbers, strings, tuples and nested
dataclasses, so a snapshot serialises to JSON and comes back equal
(`to_jsonable` / `from_jsonable`).  A value NVML or /proc refused is ``None``
("not available"); the reason, where known, sits in the owner's
``unavailable`` mapping.  Nothing in this module touches the outside world.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

# --------------------------------------------------------------------- GPUs


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:18:00.0" -> sysfs's "0000:18:00.0" (the form /sys/bus/pci/devices names a GPU by)."""
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return nvml_bus_id.strip().lower()


@dataclass(frozen=True, slots=True)
class PcieLink:
    gen_current: Optional[int] = None
    gen_max: Optional[int] = None
    width_current: Optional[int] = None
    width_max: Optional[int] = None
    tx_bytes_per_s: Optional[float] = None
    rx_bytes_per_s: Optional[float] = None

    @property
    def downgraded(self) -> bool:
        """Link trained below what the card and slot support (only meaningful under load)."""
        gen, gen_max, width, width_max = self.gen_current, self.gen_max, self.width_current, self.width_max
        if gen is None or gen_max is None or width is None or width_max is None:
            return False
        return gen < gen_max or width < width_max


@dataclass(frozen=True, slots=True)
class NvLinkLink:
    """One NVLink at one instant, as readers see it (`GpuSample.nvlink` builds these on demand)."""

    link: int
    active: bool
    remote_bus_id: Optional[str] = None
    remote_kind: Optional[str] = None  # "gpu" | "switch" | "ibmnpu" | None
    tx_bytes_per_s: Optional[float] = None
    rx_bytes_per_s: Optional[float] = None


@dataclass(frozen=True, slots=True)
class NvLinkWiring:
    """What one NVLink is, as opposed to what it carries: the same sample after sample."""

    link: int
    active: bool
    remote_bus_id: Optional[str] = None
    remote_kind: Optional[str] = None  # "gpu" | "switch" | "ibmnpu" | None


_NOT_MEASURED = math.nan  # a rate NVML gave none for (None to readers); no measured rate is NaN
_RATE_OFFSET = {"tx_bytes_per_s": 0, "rx_bytes_per_s": 1}  # NvLinks.rates: TX then RX of each link


@functools.lru_cache(maxsize=256)
def shared_wiring(links: tuple[tuple[int, bool, Optional[str], Optional[str]], ...]) -> tuple[NvLinkWiring, ...]:
    """One GPU's wiring from (link, active, remote_bus_id, remote_kind) per link: equal wirings come back as the
    same object, so snapshots decoded from JSON or built from `NvLinkLink`s share it as the collector's do."""
    return tuple(NvLinkWiring(*link) for link in links)


class NvLinks(Sequence[NvLinkLink]):
    """One GPU's NVLinks at one instant: a sequence of `NvLinkLink`, stored compactly.

    The history keeps 600 samples of every GPU; as 18 `NvLinkLink` objects a GPU with two boxed rates
    each, the links were 18 KB of a 24.6 KB snapshot of 8 H100s.  Here the wiring (a tuple of
    `NvLinkWiring`) is shared by reference with the samples before it while it does not change, and the
    rates are one array of doubles, TX then RX of each link in wiring order (NaN: not measured).  Reading
    an item builds its `NvLinkLink`; nothing but the wiring and the array is kept.  Immutable."""

    __slots__ = ("wiring", "rates")
    wiring: tuple[NvLinkWiring, ...]
    rates: array[float]

    def __init__(self, wiring: tuple[NvLinkWiring, ...], rates: Iterable[Optional[float]]) -> None:
        """`rates`: TX and RX bytes/s of each link of `wiring`, in order (None: not measured)."""
        # from a list, not a generator: the array is then allocated at its size, not grown with room to spare;
        # + 0.0 turns -0.0 into 0.0, so equal rates are equal bytes (__eq__, __hash__)
        values = array("d", [_NOT_MEASURED if rate is None else rate + 0.0 for rate in rates])
        if len(values) != 2 * len(wiring):
            raise ValueError(f"NvLinks: {len(wiring)} links need {2 * len(wiring)} rates, got {len(values)}")
        object.__setattr__(self, "wiring", wiring)
        object.__setattr__(self, "rates", values)

    @classmethod
    def of(cls, links: Iterable[NvLinkLink]) -> NvLinks:
        """The compact form of `NvLinkLink`s (samples built by hand, older code)."""
        links = tuple(links)
        wiring = shared_wiring(tuple((k.link, k.active, k.remote_bus_id, k.remote_kind) for k in links))
        return cls(wiring, (rate for k in links for rate in (k.tx_bytes_per_s, k.rx_bytes_per_s)))

    @classmethod
    def from_jsonable(cls, data: Optional[list[dict[str, Any]]]) -> Optional[NvLinks]:
        """Inverse of `to_jsonable`: a list of link objects, as `gputop snapshot --json` and recordings hold them."""
        if data is None:
            return None
        wiring = shared_wiring(
            tuple((int(k["link"]), bool(k["active"]), k.get("remote_bus_id"), k.get("remote_kind")) for k in data)
        )
        return cls(wiring, (k.get(key) for k in data for key in ("tx_bytes_per_s", "rx_bytes_per_s")))

    def to_jsonable(self) -> list[dict[str, Any]]:
        """What `to_jsonable` writes for it: one object per link, the fields of `NvLinkLink` (made without them)."""
        return [
            {
                "link": w.link,
                "active": w.active,
                "remote_bus_id": w.remote_bus_id,
                "remote_kind": w.remote_kind,
                "tx_bytes_per_s": self._rate(2 * i),
                "rx_bytes_per_s": self._rate(2 * i + 1),
            }
            for i, w in enumerate(self.wiring)
        ]

    def active_count(self) -> int:
        """How many links are up (read from the wiring: no `NvLinkLink` built, as the card's every frame needs)."""
        return sum(1 for w in self.wiring if w.active)

    def total(self, attr: str) -> Optional[float]:
        """`attr` ("tx_bytes_per_s" or "rx_bytes_per_s") summed over the links that measured it, in link order
        (None: none did); from the array, no `NvLinkLink` built."""
        values = [value for value in self.rates[_RATE_OFFSET[attr] :: 2] if value == value]  # NaN: not measured
        return sum(values) if values else None

    def _rate(self, i: int) -> Optional[float]:
        value = self.rates[i]
        return None if value != value else value  # NaN: not measured

    def _link(self, i: int) -> NvLinkLink:
        w = self.wiring[i]
        return NvLinkLink(w.link, w.active, w.remote_bus_id, w.remote_kind, self._rate(2 * i), self._rate(2 * i + 1))

    def __len__(self) -> int:
        return len(self.wiring)

    @typing.overload
    def __getitem__(self, index: int) -> NvLinkLink: ...

    @typing.overload
    def __getitem__(self, index: slice) -> tuple[NvLinkLink, ...]: ...

    def __getitem__(self, index: int | slice) -> NvLinkLink | tuple[NvLinkLink, ...]:
        if isinstance(index, slice):
            return tuple(self._link(i) for i in range(len(self.wiring))[index])
        return self._link(range(len(self.wiring))[index])  # negative indices; IndexError past the end

    def __iter__(self) -> Iterator[NvLinkLink]:
        return (self._link(i) for i in range(len(self.wiring)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NvLinks):
            return self.wiring == other.wiring and self.rates.tobytes() == other.rates.tobytes()
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.wiring, self.rates.tobytes()))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"NvLinks is immutable (tried to set {name})")

    def __reduce__(self) -> tuple[type[NvLinks], tuple[tuple[NvLinkWiring, ...], list[Optional[float]]]]:
        return NvLinks, (self.wiring, [self._rate(i) for i in range(len(self.rates))])

    def __repr__(self) -> str:
        return f"NvLinks({list(self)!r})"


@dataclass(frozen=True, slots=True)
class EccCounts:
    volatile_corrected: Optional[int] = None
    volatile_uncorrected: Optional[int] = None
    aggregate_corrected: Optional[int] = None
    aggregate_uncorrected: Optional[int] = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """An XID the driver reported for a GPU (NVML's critical-XID event), as gputop received it."""

    timestamp: float  # when gputop took it from the driver's queue (NVML gives no time)
    code: int


@dataclass(frozen=True, slots=True)
class RemappedRows:
    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failed: bool = False


@dataclass(frozen=True, slots=True)
class FabricInfo:
    """A GPU's place in an NVSwitch fabric (nvmlDeviceGetGpuFabricInfoV, Hopper and later on HGX/DGX boards):
    what the Fabric Manager trained.  The numbers are NVML's (nvml.h `NVML_GPU_FABRIC_*`); the health module
    (analysis/gpu_health.py) words and judges them.  A GPU that answers NOT_SUPPORTED has no fabric (a PCIe
    card, an NVLink bridge, a pre-Hopper board): `GpuSample.fabric` None, not a fault."""

    state: int  # 1 not started, 2 in progress, 3 completed (0: not supported, not stored)
    status: Optional[int] = None  # nvmlReturn_t of the training, meaningful once completed (0: success)
    clique_id: Optional[int] = None  # the GPUs of one clique reach each other over the fabric
    cluster_uuid: Optional[str] = None
    health_mask: Optional[int] = None  # v2+: 2-bit fields (degraded bandwidth, route recovery, ...); None: v1


@dataclass(frozen=True, slots=True)
class GpuProcess:
    pid: int
    used_memory: Optional[int] = None  # bytes; None when the driver hides it


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device of a MIG-enabled GPU (a GPU instance's compute instance), as NVML's MIG handle answers.

    NVML gives no utilization for it (nor for its parent GPU): only memory and processes."""

    gpu_instance_id: int
    compute_instance_id: int
    uuid: str  # "MIG-...": what CUDA_VISIBLE_DEVICES names to put a process on this instance
    profile: str  # "3g.40gb": compute slices and memory, from the MIG device's name
    slices: Optional[int] = None  # the GPU instance's compute slices (of 7 on an A100/H100)
    multiprocessors: Optional[int] = None
    memory_used: Optional[int] = None  # bytes
    memory_total: Optional[int] = None
    processes: Optional[tuple[GpuProcess, ...]] = None


@dataclass(frozen=True, slots=True)
class GpmMetrics:
    """What the SMs, tensor cores and memory did over the last refresh interval: NVML's GPU Performance
    Monitoring (GPM, Hopper and newer), from two GPM samples, in percent 0..100.  A metric NVML refused on its
    own is None (`GpuSample.unavailable["gpm.<name>"]` says why); a GPU without GPM has no record at all."""

    sm_active: Optional[float] = None  # share of SMs busy (NVML_GPM_METRIC_SM_UTIL)
    sm_occupancy: Optional[float] = None  # resident warps against the most the SMs hold
    tensor_active: Optional[float] = None  # SM time in any tensor-core instruction (ANY_TENSOR_UTIL)
    dram_bandwidth: Optional[float] = None  # DRAM bandwidth used against the board's peak (DRAM_BW_UTIL)
    fp32_active: Optional[float] = None  # SM time in non-tensor FP32 math (the FP32 pipe)
    fp16_active: Optional[float] = None  # SM time in non-tensor FP16 math


# Names used in `GpuSample.throttle_reasons` (NVML clock-event reasons, in bit order 0x1..0x100).
# "gpu_idle" and "applications_clocks" are harmless; the thermal, hw_slowdown and power ones are the machine.
THROTTLE_REASONS = (
    "gpu_idle",
    "applications_clocks",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal",
    "hw_thermal",
    "hw_power_brake",
    "display_clocks",
)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant. Fields NVML refused are None; `unavailable` says why."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    lost: bool = False
    utilization_gpu: Optional[float] = None  # percent 0..100
    utilization_memory: Optional[float] = None
    memory_used: Optional[int] = None  # bytes
    memory_total: Optional[int] = None
    temperature: Optional[float] = None  # Celsius
    power: Optional[float] = None  # watts
    power_limit: Optional[float] = None  # watts (enforced)
    clock_sm: Optional[int] = None  # MHz
    clock_memory: Optional[int] = None  # MHz
    pcie: PcieLink = field(default_factory=PcieLink)
    # None: NVLink not available on this card.  A tuple of NvLinkLink given here is stored as NvLinks.
    nvlink: Optional[NvLinks] = None
    throttle_reasons: Optional[tuple[str, ...]] = None  # active clock-event reasons by name
    ecc: Optional[EccCounts] = None
    remapped_rows: Optional[RemappedRows] = None
    processes: Optional[tuple[GpuProcess, ...]] = None
    # XIDs seen since gputop started (the newest XID_EVENTS_KEPT); None: NVML cannot report them here
    xids: Optional[tuple[XidEvent, ...]] = None
    unavailable: dict[str, str] = field(default_factory=dict)  # field name -> reason
    # MIG mode on: the GPU's instances (utilization then reads None, never 0: NVML does not measure it).
    # None: MIG is off or not supported on this card.
    mig: Optional[tuple[MigInstance, ...]] = None
    # GPM over the last refresh interval; None: the GPU has no GPM (before Hopper, MIG) or NVML refused it
    gpm: Optional[GpmMetrics] = None
    compute_capability: Optional[tuple[int, int]] = None  # CUDA's (major, minor); None: NVML did not say
    # the NVSwitch fabric as the Fabric Manager trained it; None: no fabric (NOT_SUPPORTED) or not read
    fabric: Optional[FabricInfo] = None

    def __post_init__(self) -> None:
        if self.nvlink is not None and not isinstance(self.nvlink, NvLinks):
            object.__setattr__(self, "nvlink", NvLinks.of(self.nvlink))

    @property
    def memory_fraction(self) -> Optional[float]:
        if not self.memory_total or self.memory_used is None:
            return None
        return self.memory_used / self.memory_total


@dataclass(frozen=True, slots=True)
class NicInfo:
    """A network or InfiniBand device backed by a PCI function, and the NUMA node it hangs off."""

    name: str  # the RDMA device ("mlx5_0") where there is one, else the network interface ("eth0")
    numa_node: Optional[int]  # None: the kernel does not know (-1), e.g. a single-node machine
    pci_bus_id: Optional[str] = None  # sysfs form, "0000:19:00.0"
    rdma: bool = False  # an RDMA device (/sys/class/infiniband): what `nvidia-smi topo -m` lists as NICn
    netdev: Optional[str] = None  # the RDMA device's network interface, e.g. "ibp25s0"


NO_NEAR_CPUS = ""  # Topology.cpu_affinity of a GPU whose affinity mask NVML answered empty


@dataclass(frozen=True, slots=True)
class NicPortSample:
    """One NIC port as /sys shows it at one poll: an InfiniBand/RoCE port (/sys/class/infiniband/DEV/ports/N)
    or a plain Ethernet interface (/sys/class/net/DEV, port 1).  Counters are cumulative since the driver
    loaded; the rates are over the time since the previous poll (None on the first)."""

    device: str  # "mlx5_3", or the interface ("enp5s0") of a NIC without an RDMA device
    port: int
    rdma: bool  # under /sys/class/infiniband
    link_layer: str  # "InfiniBand" | "Ethernet"
    up: bool  # state ACTIVE (RDMA) / operstate up (Ethernet)
    state: str  # as the kernel words it: "ACTIVE", "DOWN", "INIT"; "up", "down", "lowerlayerdown"
    phys_state: Optional[str] = None  # "LinkUp", "Polling", "Disabled" (RDMA only)
    rate_gbps: Optional[float] = None  # the trained rate; None when the kernel does not know (a link down)
    rate_text: Optional[str] = None  # "400 Gb/sec (4X NDR)"
    netdev: Optional[str] = None  # the RDMA device's interface
    rx_bytes: Optional[int] = None
    tx_bytes: Optional[int] = None
    rx_bytes_per_s: Optional[float] = None
    tx_bytes_per_s: Optional[float] = None
    errors: dict[str, int] = field(default_factory=dict)  # the error counters by their sysfs name, cumulative
    errors_at: float = 0.0  # when the error counters were read, on the pipeline's clock (a slower cadence than traffic)


@dataclass(frozen=True, slots=True)
class Topology:
    """`nvidia-smi topo -m` between GPUs and NICs, plus each GPU's host affinity (read once per run)."""

    matrix: tuple[tuple[str, ...], ...] = ()  # matrix[i][j]: "X", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"
    # per GPU, e.g. "0-31,64-95"; NO_NEAR_CPUS: NVML's mask is empty; None: NVML refused (see near_cpus_text)
    cpu_affinity: tuple[Optional[str], ...] = ()
    numa_node: tuple[Optional[int], ...] = ()  # per GPU
    # Every NIC backed by a PCI function (sysfs); None: not read (no sysfs, or a recording older than NICs)
    nics: Optional[tuple[NicInfo, ...]] = None
    # nic_matrix[k]: NIC k's link to each GPU, then to each NIC, labelled as the GPU matrix ("PIX", "NODE", ...)
    nic_matrix: tuple[tuple[str, ...], ...] = ()
    nics_unreadable: tuple[str, ...] = ()  # why NICs could not be read, one line each

    def near_cpus_text(self, gpu: int) -> str:
        """GPU `gpu`'s CPU affinity in words: the list, "none of this job's CPUs are near GPU N" for an empty
        mask (NVML answers only the CPUs this process may use: a Slurm job's cgroup on the other socket), or
        "n/a" where NVML did not say."""
        cpus = self.cpu_affinity[gpu] if gpu < len(self.cpu_affinity) else None
        if cpus == NO_NEAR_CPUS:
            return f"none of this job's CPUs are near GPU {gpu}"
        return cpus or "n/a"

    def gpus_without_near_cpus(self) -> tuple[int, ...]:
        return tuple(i for i, cpus in enumerate(self.cpu_affinity) if cpus == NO_NEAR_CPUS)

    def matrix_nics(self) -> tuple[int, ...]:
        """Indices into `nics` of the NICs `nvidia-smi topo -m` shows: the RDMA devices, in order."""
        return tuple(k for k, nic in enumerate(self.nics or ()) if nic.rdma)

    def full_matrix(self, with_nics: bool = True) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
        """(names, rows): `nvidia-smi topo -m`'s square matrix, GPU0.. then NIC0.. (its NIC Legend numbering)."""
        gpus = len(self.matrix)
        shown = self.matrix_nics() if with_nics and len(self.nic_matrix) == len(self.nics or ()) else ()
        names = tuple(f"GPU{i}" for i in range(gpus)) + tuple(f"NIC{n}" for n in range(len(shown)))
        rows = [tuple(row) + tuple(self.nic_matrix[k][i] for k in shown) for i, row in enumerate(self.matrix)]
        rows += [tuple(self.nic_matrix[k][:gpus]) + tuple(self.nic_matrix[k][gpus + j] for j in shown) for k in shown]
        return names, tuple(rows)

    def nic_legend(self) -> tuple[str, ...]:
        """ "NIC0: mlx5_0", ... as `nvidia-smi topo -m` prints under "NIC Legend"."""
        return tuple(f"NIC{n}: {self.nics[k].name}" for n, k in enumerate(self.matrix_nics()))  # type: ignore[index]

    def nic_switch_gpus(self, nic: int) -> tuple[int, ...]:
        """The GPUs NIC `nic` shares a PCIe switch with (PIX or PXB between them)."""
        if nic >= len(self.nic_matrix):
            return ()
        return tuple(i for i, label in enumerate(self.nic_matrix[nic][: len(self.matrix)]) if label in ("PIX", "PXB"))


@dataclass(frozen=True, slots=True)
class MachineInfo:
    """What does not change while gputop runs: read once."""

    hostname: str
    cpu_model: str = ""
    cpu_count: int = 0
    driver_version: Optional[str] = None
    cuda_version: Optional[str] = None
    nvml_version: Optional[str] = None
    gpu_error: Optional[str] = None  # e.g. "no NVIDIA driver found (libnvidia-ml.so.1 not loadable)"
    gpu_count: int = 0
    gpu_names: tuple[str, ...] = ()
    topology: Topology = field(default_factory=Topology)
    simulated: Optional[str] = None  # simulated profile name, None on real hardware


@dataclass(frozen=True, slots=True)
class NvLinkErrors:
    """One NVLink's error counters (NVML's DL counters; they count since the driver loaded or were reset)."""

    link: int
    crc_flit: Optional[int] = None  # flow-control CRC errors
    crc_data: Optional[int] = None  # data CRC errors
    replay: Optional[int] = None  # packets re-sent after an error
    recovery: Optional[int] = None  # link retrains: each one stalls the link


@dataclass(frozen=True, slots=True)
class GpuDetails:
    """What an infra ticket asks about one GPU: identity, modes and error counters.

    Read on demand (`gputop check`, the report), not every poll: none of it changes in a second,
    and the per-link NVLink counters alone are ~70 NVML calls a GPU.  None: NVML refused
    (`unavailable` says why)."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    timestamp: float = 0.0  # when read, on the pipeline's clock (gputop/clock.py: time.time() on the real machine)
    lost: bool = False
    serial: Optional[str] = None
    vbios: Optional[str] = None
    board_part_number: Optional[str] = None
    persistence_mode: Optional[bool] = None
    ecc_mode: Optional[bool] = None  # current
    ecc_mode_pending: Optional[bool] = None  # what the next reset switches to
    app_clock_sm: Optional[int] = None  # MHz: the applications clock set now
    app_clock_sm_default: Optional[int] = None  # MHz: the board's default applications clock
    app_clock_memory: Optional[int] = None
    app_clock_memory_default: Optional[int] = None
    pcie_replays: Optional[int] = None  # PCIe replay counter (link-level retransmissions)
    nvlink_errors: Optional[tuple[NvLinkErrors, ...]] = None  # per link that exists
    retired_pages_single_bit: Optional[int] = None  # pages retired for repeated single-bit ECC errors
    retired_pages_double_bit: Optional[int] = None  # pages retired for a double-bit ECC error
    retired_pages_pending: Optional[bool] = None  # a retirement waits for the next reset
    # clock-event reason -> nanoseconds the clocks were held back for it, cumulative (nvmlDeviceGetViolationStatus)
    clock_event_ns: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AerCounts:
    """A PCI device's AER counters from sysfs (aer_dev_correctable/fatal/nonfatal), since boot."""

    correctable: Optional[int] = None  # TOTAL_ERR_COR
    nonfatal: Optional[int] = None  # TOTAL_ERR_NONFATAL
    fatal: Optional[int] = None  # TOTAL_ERR_FATAL
    nonzero: dict[str, int] = field(default_factory=dict)  # the named counters that are not 0 ("RxErr": 3, ...)


@dataclass(frozen=True, slots=True)
class KernelXid:
    """An `NVRM: Xid (PCI:...): CODE, ...` line from the kernel log."""

    code: int
    pci: str  # "0000:5d:00" as the driver prints it (no function number), lower case
    timestamp: Optional[float]  # time.time() scale; None when the log gave no time
    text: str  # the message after "NVRM: "


@dataclass(frozen=True, slots=True)
class HostReadings:
    """What `gputop check` reads from the kernel besides NVML: sysfs and the kernel log.

    A source that could not be read is None (or missing) and has one line in `unreadable`."""

    timestamp: float
    kernel: Optional[str] = None  # uname -r
    driver_module: Optional[str] = None  # /sys/module/nvidia/version: the loaded kernel module
    aer: dict[str, Optional[AerCounts]] = field(default_factory=dict)  # GPU bus id (NVML form) -> counters
    kernel_xids: Optional[tuple[KernelXid, ...]] = None  # None: the kernel log could not be read
    kernel_log_records: int = 0  # how many records were read from it
    unreadable: tuple[str, ...] = ()  # one line per source that could not be read, saying why


@dataclass(frozen=True, slots=True)
class AllReduceResult:
    """`gputop check --load`: a short all-reduce across every GPU, measured as nccl-tests measures it."""

    gpus: int
    bytes: int  # per GPU
    seconds: float  # per all-reduce, averaged over the timed iterations
    iterations: int

    @property
    def algbw(self) -> float:
        """bytes/s: the buffer size over the time, as nccl-tests' `algbw`."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def busbw(self) -> float:
        """bytes/s each GPU's links carried: algbw x 2(n-1)/n for an all-reduce (nccl-tests PERFORMANCE.md),
        comparable with the link speed whatever the GPU count."""
        n = self.gpus
        return self.algbw * 2 * (n - 1) / n if n > 1 else 0.0


# --------------------------------------------------------------------- host


@dataclass(frozen=True, slots=True)
class HostSample:
    cpu_percent: tuple[float, ...]  # one per logical core
    core_numa: tuple[int, ...] = ()  # NUMA node of each core (0 where unknown)
    iowait_percent: Optional[float] = None  # whole machine
    steal_percent: Optional[float] = None
    memory_total: int = 0
    memory_used: int = 0
    memory_available: int = 0
    swap_total: int = 0
    swap_used: int = 0
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # where the kernel shares the cores among sessions first (autogroup): the cores each session used since the last
    # sample (those that used at least SESSION_MIN_CORES), the two tuples side by side; () where it does not
    sessions: tuple[int, ...] = ()
    session_cores: tuple[float, ...] = ()


# --------------------------------------------------------------------- job


@dataclass(frozen=True, slots=True)
class ProcInfo:
    pid: int
    ppid: int
    name: str  # /proc/PID/comm
    cmdline: tuple[str, ...] = ()
    state: str = "?"  # R, S, D, Z, ...
    cpu_percent: Optional[float] = None
    rss: Optional[int] = None
    core: Optional[int] = None  # last core it ran on
    create_time: float = 0.0  # identifies the process together with pid (PID reuse)
    exited: bool = False
    # state T/t: what holds it stopped, "PID 123 (gdb)" for a tracer (/proc/PID/status TracerPid); None:
    # no tracer (a job-control stop: SIGSTOP, Ctrl-Z, a scheduler's suspend), or not stopped
    tracer: Optional[str] = None
    # a zombie's exit status as waitpid(2) words it (/proc/PID/stat field 52); None where not readable
    exit_status: Optional[int] = None
    session: Optional[int] = None  # its session id (with autogroup, the kernel's first level of CPU sharing)


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    filename: str
    line: int
    module: Optional[str] = None


@dataclass(frozen=True, slots=True)
class ThreadStack:
    thread_id: int
    thread_name: Optional[str]
    os_thread_id: Optional[int]
    active: bool
    owns_gil: bool
    frames: tuple[Frame, ...]  # innermost FIRST, as py-spy gives them


@dataclass(frozen=True, slots=True)
class ThreadProgress:
    """Counters that move while a thread makes progress and stand still while it is blocked.

    Equal py-spy stacks cannot tell a thread looping on a slow read from one parked forever on a lock;
    these counters can (a thread in `time.sleep(0.02)` gains ~50 voluntary switches a second, one in
    `Event().wait()` gains none).  Read from /proc/PID/task/TID/{status,stat} right after the dump.
    """

    tid: int
    voluntary_switches: int
    involuntary_switches: int
    cpu_ticks: int  # utime + stime of the thread, in clock ticks (USER_HZ, normally 100/s)


@dataclass(frozen=True, slots=True)
class ProcessProgress:
    """Whole-process progress counters read beside a stack dump (see ThreadProgress)."""

    cpu_seconds: float  # utime + stime of the whole process
    io_read_chars: Optional[int] = None  # /proc/PID/io rchar (None where unreadable)
    io_write_chars: Optional[int] = None  # /proc/PID/io wchar
    threads: tuple[ThreadProgress, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessStacks:
    pid: int
    timestamp: float
    threads: tuple[ThreadStack, ...] = ()
    error: Optional[str] = None  # one line, when stacks could not be read
    progress: Optional[ProcessProgress] = None  # counters read right after this dump
    native: bool = False  # taken with `py-spy dump --native` (a short pause): frames include C/C++ ones


@dataclass(frozen=True, slots=True)
class StateSamples:
    """A stretch of one rank's main thread sampled densely (`py-spy record`, gputop/collect/state_sampler.py):
    what it was doing at each sample, in time order.  The shares the verdicts rest on are counted from these.

    The samples are `rate` a second and end at `end`; sample i of N was taken at about
    ``end - (N - i) / rate``.  `runs` is run-length coded: (state, consecutive samples), states being
    gputop.analysis.stack_classes.MAIN_THREAD_STATES."""

    pid: int
    start: float
    end: float
    rate: float
    runs: tuple[tuple[str, int], ...] = ()
    errors: int = 0  # samples py-spy could not read (torn reads), left out
    error: Optional[str] = None  # why this stretch has no samples (one line)


@dataclass(frozen=True, slots=True)
class Rank:
    proc: ProcInfo
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    cuda_visible_devices: Optional[str] = None
    gpus: tuple[int, ...] = ()  # NVML indices where this process holds memory
    # how `gpus` was matched: "nvml" (NVML's PID is this process), "nspid" (NVML's PID is its PID in
    # another namespace, from /proc/PID/status NSpid), "inferred" (NVML's PIDs are not visible here, e.g.
    # in a container: from CUDA_VISIBLE_DEVICES + LOCAL_RANK); None: on no GPU
    gpu_mapping: Optional[str] = None
    # (GPU index, GPU instance id) of the MIG instances among `gpus` its processes run on; empty: whole GPUs
    mig_instances: tuple[tuple[int, int], ...] = ()
    workers: tuple[ProcInfo, ...] = ()
    pin_memory_tids: tuple[int, ...] = ()
    main_thread_state: Optional[str] = None  # see analysis.stack_classes
    # Start-up (imports, model build, worker start) is left out of the shares: `starting_up` while no
    # training step has been seen yet, and `loop_started` the time of the first one (None: not known,
    # as in recordings made before gputop told them apart: nothing is left out then).
    starting_up: bool = False
    loop_started: Optional[float] = None
    # The job beyond this machine, from the rank's environment (gputop.fleet.identity): the id every node
    # derives alike (None: none said), this node's place and the number of nodes.
    job_id: Optional[str] = None
    node_rank: Optional[int] = None
    nnodes: Optional[int] = None

    @property
    def devices(self) -> tuple[tuple[int, Optional[int]], ...]:
        """The devices it runs on, by GPU: (GPU, None) for a whole GPU, (GPU, GPU instance id) for a MIG instance
        (two ranks on two instances of one GPU share nothing)."""
        on_instances = {gpu for gpu, _ in self.mig_instances}
        whole: list[tuple[int, Optional[int]]] = [(g, None) for g in self.gpus if g not in on_instances]
        return tuple(sorted(whole + list(self.mig_instances), key=lambda d: (d[0], -1 if d[1] is None else d[1])))


def device_label(gpu: int, instance: Optional[int]) -> str:
    """'GPU0', or 'GPU0/GI1' for GPU instance 1 of GPU 0 (MIG): where a rank runs, as the job tree, the report's
    rank table and the exporter's rank labels name it."""
    return f"GPU{gpu}" if instance is None else f"GPU{gpu}/GI{instance}"


@dataclass(frozen=True, slots=True)
class CollectiveEntry:
    """One collective of a rank's flight recorder (torch's `TORCH_FR_BUFFER_SIZE`), as gputop keeps it."""

    seq: int  # collective_seq_id: counts from 1 within its process group
    op: str  # profiling_name, e.g. "nccl:all_reduce", "gloo:broadcast"
    process_group: str  # the group's name ("0" for the default group)
    group_desc: str  # its description ("default_pg", or the user's)
    sizes: tuple[tuple[int, ...], ...]  # input_sizes
    dtypes: tuple[str, ...]  # input_dtypes
    state: str  # "scheduled", "started", "completed"
    done: bool  # completed (or retired): no longer waited in
    created: float  # time_created_ns, in seconds since the epoch
    timeout_ms: Optional[int] = None
    frames: tuple[str, ...] = ()  # where the job called it, "name (file:line)", innermost first


@dataclass(frozen=True, slots=True)
class FlightRecord:
    """One rank's flight recorder as last read: from the dump its job writes, its debug server, or inside it."""

    pid: int
    rank: Optional[int]
    source: str  # the file read ("" when none could be)
    written: float = 0.0  # the dump's mtime
    # per process group, its last completed collective and every one after it (the pending ones)
    entries: tuple[CollectiveEntry, ...] = ()
    groups: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (group name, its global ranks) from pg_config
    error: Optional[str] = None  # why there is nothing to read (one line)
    channel: str = ""  # how it was read: CHANNEL_DUMP, CHANNEL_DEBUG_SERVER or CHANNEL_IN_PROCESS


CHANNEL_DUMP = "dump file"  # the file the job writes (gputop.collect.flight_recorder)
CHANNEL_DEBUG_SERVER = "debug server"  # the job's torch.distributed.debug server (gputop.collect.debug_server)
CHANNEL_IN_PROCESS = "in-process read"  # an injected agent's read (gputop.inject.fr_read)


@dataclass(frozen=True, slots=True)
class Misplacement:
    """One rank-to-GPU placement problem, decided once by the collector (analysis and TUI read it)."""

    kind: str  # "all_on_one_gpu", "shared_gpu", "several_gpus" (a stray context), ...
    pids: tuple[int, ...]  # the ranks involved
    gpus: tuple[int, ...]  # NVML indices involved
    message: str  # one line for people, ends with the fix


@dataclass(frozen=True, slots=True)
class JobTree:
    root_pid: int  # what the user asked for
    launcher: Optional[ProcInfo] = None
    ranks: tuple[Rank, ...] = ()
    exited: bool = False
    warnings: tuple[str, ...] = ()  # misplacement etc., one line each
    stacks: dict[int, ProcessStacks] = field(default_factory=dict)  # pid -> latest stacks
    stacks_error: Optional[str] = None  # why stacks are unavailable for the whole job
    cores: tuple[int, ...] = ()  # logical cores the job's processes last ran on (heatmap marks them)
    misplacements: tuple[Misplacement, ...] = ()  # structured form of the placement warnings
    cpu_limit: Optional[float] = None  # cores the job may use: its cgroup's cpu.max / cpuset (None: the host's)
    memory_limit: Optional[int] = None  # bytes: its cgroup's memory.max (None: no limit below the host's)
    # pid -> the one `py-spy dump --native` (native=True) taken when that process's main thread had been
    # frozen NATIVE_AFTER_S with its counters still; kept while the freeze lasts, dropped when it moves
    native_stacks: dict[int, ProcessStacks] = field(default_factory=dict)
    # the ranks' densely sampled stretches that ended since the previous snapshot (each in one snapshot only)
    state_samples: tuple[StateSamples, ...] = ()
    # the ranks' flight recorders, for the ranks whose environment turns the recorder on
    flight_records: tuple[FlightRecord, ...] = ()

    @property
    def anchor(self) -> int:
        """The PID that names a job: its launcher's, or the lone training process's."""
        return self.launcher.pid if self.launcher else self.root_pid


# --------------------------------------------------------------------- snapshot


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One line of `gputop check` (`analysis/machine_check.py`): what it looked at, the value, the expectation,
    a status.  The one check-result type: the check's lines, and the pipeline's counter window's that warn or
    fail as a snapshot carries them and a recording keeps them (`CounterHealth.checks`)."""

    id: str  # stable key, e.g. "pcie.replay"
    title: str  # what it looked at, e.g. "PCIe replay counter"
    status: str  # "pass" / "warn" / "fail" / "skip"
    value: str  # what was found, with numbers
    expected: str  # what the machine itself says it should be
    gpus: tuple[int, ...] = ()  # the GPUs the warning or failure is about
    evidence: tuple[str, ...] = ()  # more lines for the report and --json

    def line(self) -> str:
        """One line for a terminal or a log: STATUS  title: value (expected: ...)."""
        return f"{self.status.upper():<4}  {self.title}: {self.value}; expected {self.expected}"


@dataclass(frozen=True, slots=True)
class CounterHealth:
    """What the GPUs' error counters and the kernel's side (AER, kernel-log XIDs, topology) showed between
    two readings `seconds` apart, the later at `timestamp` (`Pipeline(watch=CounterCadence(...))`,
    `analysis/counter_health.py`): `gputop check`'s counter lines that warn or fail, none when all pass."""

    timestamp: float
    seconds: float
    checks: tuple[CheckResult, ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    timestamp: float
    host: HostSample
    gpus: tuple[GpuSample, ...] = ()
    job: Optional[JobTree] = None
    simulated: bool = False
    # With no job attached: the machine's GPU processes grouped into jobs (launcher -> ranks -> workers,
    # no stacks), so what the screen offers to attach to is in recordings and reports too.  With several
    # jobs followed (`serve`, `record`): their trees with their stacks.  Read both with `source.jobs_of`.
    jobs: tuple[JobTree, ...] = ()
    # The latest counter window's judgement, carried by every snapshot until the next one (None: not watched,
    # or an older recording).
    counter_health: Optional[CounterHealth] = None
    # the NIC ports (collect/sysfs.NicReader); None where none was read (no /sys, older recordings)
    nics: Optional[tuple[NicPortSample, ...]] = None


# --------------------------------------------------------------------- JSON


def to_jsonable(value: Any) -> Any:
    """Dataclasses -> dicts, tuples -> lists, dict keys -> str. Properties are not included."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, NvLinks):
        return value.to_jsonable()
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value


# JSON -> dataclasses.  A converter is built once per type from its annotations and then reused: reading
# the annotations again for every value (typing.get_origin/get_args per field) made a snapshot with the
# job's stacks cost tens of milliseconds, most of `replay`'s and `report --from`'s time.
Converter = Callable[[Any], Any]


def _keep(data: Any) -> Any:
    return data


def _to_float(data: Any) -> Any:
    return float(data) if isinstance(data, int) else data  # JSON writes 1.0 as 1


@functools.lru_cache(maxsize=None)
def _converter(tp: Any) -> Converter:
    """A function turning JSON data (or None) into a value of type `tp`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        return _converter(members[0]) if len(members) == 1 else _keep
    if tp is NvLinks:
        return NvLinks.from_jsonable
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_converter(tp)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            item = _converter(args[0])
            return lambda data: None if data is None else tuple(map(item, data))
        items = tuple(_converter(a) for a in args)
        return lambda data: None if data is None else tuple(c(v) for c, v in zip(items, data))
    if origin is dict:
        key_type, value_type = typing.get_args(tp)
        value = _converter(value_type)
        if key_type is int:
            return lambda data: None if data is None else {int(k): value(v) for k, v in data.items()}
        return lambda data: None if data is None else {k: value(v) for k, v in data.items()}
    if tp is float:
        return _to_float
    return _keep


def _dataclass_converter(cls: type) -> Converter:
    resolved: list[tuple[tuple[str, Converter], ...]] = []  # on first use, so a type may refer to itself

    def convert(data: Any) -> Any:
        if data is None:
            return None
        if not resolved:  # two threads may both get here: they append equal tuples, and [0] is used
            hints = typing.get_type_hints(cls)
            resolved.append(tuple((f.name, _converter(hints[f.name])) for f in dataclasses.fields(cls)))
        return cls(**{name: conv(data[name]) for name, conv in resolved[0] if name in data})

    return convert


def from_jsonable(cls: type, data: dict[str, Any]) -> Any:
    """Inverse of `to_jsonable` for the dataclasses above. Unknown keys are ignored (newer writers)."""
    return _converter(cls)(data)


# --------------------------------------------------------------------- diagnosis

SEVERITIES = ("critical", "warning", "info")
SEVERITY_ORDER = {name: i for i, name in enumerate(SEVERITIES)}  # critical < warning < info
LABEL_CODE = "your code"
LABEL_INFRA = "infrastructure (file a ticket)"


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosis finding: what, how sure, the proof, and the fix."""

    id: str  # stable key: "starvation", "hiccup", "hang", "misplacement", "straggler", "cpu_bound",
    # "pcie_downgrade", "throttle", "ecc", "nvlink_down", "gpu_lost", "healthy", ...
    title: str
    severity: str  # one of SEVERITIES
    confidence: float  # 0..1
    label: str  # LABEL_CODE or LABEL_INFRA ("" for healthy)
    summary: str  # the one-line verdict, e.g. "Input-bound: rank 0 waits for data 62% of the time"
    evidence: tuple[str, ...] = ()  # numbers that prove it, one per line
    frames: tuple[str, ...] = ()  # stack frames that prove it, "name (file:line)"
    fix: str = ""  # concrete code or settings
    gpus: tuple[int, ...] = ()
    pids: tuple[int, ...] = ()
    # the numbers behind the summary, for machines (report JSON): shares with their intervals, advice with its range
    figures: dict[str, Any] = field(default_factory=dict)
