"""Simulated machines: GPU profiles and the fault switches layered on them.

A spec string names a profile and optional faults, joined by ``+``::

    h100-sxm-8                       the default: 8x H100 SXM on NVSwitch, two NUMA nodes
    rtx-4090-2+thermal=1             two consumer cards, GPU 1 thermally throttling
    h100-sxm-8+gpu-lost=3@10+ecc=5   GPU 3 falls off the bus after 10 s; GPU 5 has ECC errors
    a100-sxm-4-mig                   4x A100, GPUs 0 and 1 split into MIG instances
    h100-sxm-8+mig=2:3g.40gb,4g.40gb GPU 2 in MIG mode, split in two instances

`gputop.sim.spec.parse_spec` turns the string into a `SimSpec`; the fake NVML library
(`gputop.sim.fake_nvml`) reads it.  Nothing here imports pynvml.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from gputop.sim import DEFAULT_PROFILE as DEFAULT_PROFILE  # there: the command line needs no more

MIB = 1024**2


@dataclass(frozen=True)
class MigProfile:
    """A GPU instance profile (`nvidia-smi mig -lgip`): its name, compute slices, SMs and memory."""

    name: str  # "3g.40gb": 3 of the 7 compute slices, 40 GB
    slices: int
    multiprocessors: int
    memory_mib: int


MIG_MAX_DEVICES = 7  # nvmlDeviceGetMaxMigDeviceCount on an A100/H100: one per compute slice


@dataclass(frozen=True)
class GpuModel:
    """What one kind of card reports. Values follow the real cards' NVML answers."""

    name: str
    memory_total: int  # bytes, as NVML reports it (a little under the marketing size)
    memory_reserved: int  # bytes the driver keeps (memory v2 `reserved`)
    memory_idle_used: int  # bytes used with no process (context, ECC tables)
    power_limit_w: float  # enforced limit
    power_idle_w: float
    temp_idle_c: float
    temp_load_c: float
    sm_clock_idle_mhz: int
    sm_clock_max_mhz: int
    mem_clock_mhz: int
    pcie_gen_max: int
    pcie_width_max: int
    pcie_rx_peak_kbps: int  # host -> GPU under full load (input batches), KB/s
    pcie_tx_peak_kbps: int  # GPU -> host
    nvlink_links: int  # 0: NVLink NOT_SUPPORTED
    nvlink_peak_kibps: int  # per link and direction under full load, KiB/s
    ecc: bool  # ECC counters supported
    row_remap: bool  # nvmlDeviceGetRemappedRows supported
    # the cumulative PCIe byte counters (field values 197/198, driver R555+) answered; False: NOT_SUPPORTED, so
    # gputop falls back to nvmlDeviceGetPcieThroughput.  NVML documents no architectures for them (see
    # gputop.collect.gpu._PCIE_TX_BYTES): the simulation gives them to Hopper and later, an assumption.
    pcie_byte_counters: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()  # the MIG instance profiles it offers; empty: no MIG (NOT_SUPPORTED)

    def mig_profile(self, name: str) -> Optional[MigProfile]:
        return next((p for p in self.mig_profiles if p.name == name), None)

    # NVML's GPU Performance Monitoring (nvmlGpmQueryDeviceSupport): Hopper and newer answer it, Ada and older do not
    gpm: bool = False
    compute_capability: Optional[tuple[int, int]] = None  # nvmlDeviceGetCudaComputeCapability; None: NOT_SUPPORTED
    # nvmlDeviceGetGpuFabricInfoV answered where the board has NVSwitches (`Profile.switch_bus_ids`): NVML
    # documents it for Hopper and newer; elsewhere (and on every PCIe or bridged card) NOT_SUPPORTED
    fabric_info: bool = False


@dataclass(frozen=True)
class SimNic:
    """A NIC of the simulated machine, as its sysfs shows it (`gputop.sim.fake_sysfs` writes it)."""

    name: str  # the RDMA device ("mlx5_0"), or the interface of a plain Ethernet NIC
    bus_id: str  # sysfs form, "0000:19:00.0"
    numa_node: int
    beside_gpu: Optional[int] = None  # the GPU whose PCIe switch it shares; None: on a root port of its own
    rdma: bool = True
    netdev: Optional[str] = None  # an RDMA device's network interface
    rate_gbps: float = 400.0  # what its port trains to: a ConnectX-7's NDR "400 Gb/sec (4X NDR)"


def bus_number(bus_id: str) -> int:
    """The bus of a PCI address in either form: "00000000:18:00.0" -> 0x18."""
    return int(bus_id.split(":")[-2], 16)


def rail_nics(bus_ids: tuple[str, ...], numa_nodes: tuple[int, ...]) -> tuple[SimNic, ...]:
    """One ConnectX per GPU behind the GPU's own PCIe switch, the next bus after it (a DGX/HGX H100's compute
    "rails": `nvidia-smi topo -m` reads PIX between GPU i and NIC i), named as mlx5_core names them."""
    return tuple(
        SimNic(
            name=f"mlx5_{i}",
            bus_id=f"0000:{bus_number(bus) + 1:02x}:00.0",
            numa_node=numa_nodes[i],
            beside_gpu=i,
            netdev=f"ibp{bus_number(bus) + 1}s0",
        )
        for i, bus in enumerate(bus_ids)
    )


_H100_BUS_IDS = tuple(f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"))
_H100_NUMA = (0, 0, 0, 0, 1, 1, 1, 1)


# What a bug report's captures (`capture:DIR`, parsed by gputop.sim.capture) say beyond a profile: the shape
# the profile holds them in.


@dataclass(frozen=True)
class RemappedRows:
    """`nvidia-smi -q`'s Remapped Rows block: what nvmlDeviceGetRemappedRows answers on that card."""

    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True)
class CapturedGpu:
    """What one GPU's captures say beyond its `GpuModel`. None: not captured (NVML refuses the call)."""

    cpu_affinity: Optional[tuple[int, ...]] = None  # (): NVML's empty mask (topo -m prints N/A)
    numa_affinity: Optional[tuple[int, ...]] = None  # nvmlDeviceGetMemoryAffinity's nodes
    numa_id: Optional[int] = None  # nvmlDeviceGetNumaNodeId (topo -m's "GPU NUMA ID")
    # per link: the GPU at its far end, or None where the link ends at an NVSwitch
    nvlink_remote: tuple[Optional[int], ...] = ()
    nvlink_active: tuple[bool, ...] = ()
    refused: frozenset[str] = frozenset()  # NVML symbols that answer NOT_SUPPORTED (the capture's N/A)
    ecc_volatile: Optional[tuple[int, int]] = None  # (corrected, uncorrected) since the driver loaded
    ecc_aggregate: Optional[tuple[int, int]] = None  # (corrected, uncorrected) over the card's life
    remapped_rows: Optional[RemappedRows] = None  # as captured; None: not captured (the fake's own zeros)
    # MIG mode on: (GPU instance id, profile) of each MIG device in index order; None: MIG off (or not captured)
    mig_instances: Optional[tuple[tuple[int, MigProfile], ...]] = None


@dataclass(frozen=True)
class CapturedBoard:
    """The machine-wide part of a capture: every GPU pair's `nvidia-smi topo -m` cell, each GPU's extras."""

    source: str  # the folder
    gpus: tuple[CapturedGpu, ...]
    levels: Optional[tuple[tuple[str, ...], ...]] = None  # [a][b]: "X", "NV4", "PIX".."SYS", "N/A"
    missing_symbols: tuple[str, ...] = ()


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    gpu: GpuModel
    bus_ids: tuple[str, ...]  # one per GPU, NVML's 8-hex-digit-domain form
    numa_nodes: tuple[int, ...]  # NUMA node of each GPU
    switch_bus_ids: tuple[str, ...] = ()  # NVSwitches: link L of every GPU ends at switch L % len
    same_node_ancestor: str = "NODE"  # PCIe common ancestor of two GPUs on one NUMA node
    nics: tuple[SimNic, ...] = ()
    driver_version: str = "560.35.03"  # R560: has the PCIe byte counters (R555+) the H100 profile serves
    cuda_version: int = 12060  # 1000*major + 10*minor
    nvml_version: str = "12.560.35.03"
    gpu_models: tuple[GpuModel, ...] = ()  # per GPU where they differ (a capture); empty: all are `gpu`
    capture: Optional[CapturedBoard] = None  # a bug report's captures (`capture:DIR`, gputop.sim.capture)
    # (GPU, the MIG instance profiles it is split into): MIG mode on; GPUs not listed run whole (MIG off)
    mig: tuple[tuple[int, tuple[str, ...]], ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.bus_ids)

    def model(self, gpu: int) -> GpuModel:
        return self.gpu_models[gpu] if self.gpu_models else self.gpu

    def mig_instances(self, gpu: int) -> Optional[tuple[MigProfile, ...]]:
        """The MIG instances GPU `gpu` is split into, in MIG device index order; None: MIG mode is off."""
        names = dict(self.mig).get(gpu)
        if names is None:
            return None
        model = self.model(gpu)
        return tuple(p for p in map(model.mig_profile, names) if p is not None)

    def cpu_affinity(self, gpu: int, host_cpus: int) -> tuple[int, ...]:
        """The host CPUs local to a GPU: the real host's cores split evenly across the profile's NUMA nodes.

        Mapping onto the real host keeps "is this rank on the GPU's NUMA node?" meaningful while the
        simulated GPUs are driven by real processes (the demo).
        """
        nodes = max(self.numa_nodes) + 1
        node = self.numa_nodes[gpu]
        per_node = max(1, host_cpus // nodes)
        first = min(node * per_node, host_cpus - 1)
        last = host_cpus if node == nodes - 1 else min(host_cpus, first + per_node)
        return tuple(range(first, max(first + 1, last)))


# Memory as the driver sizes the instances (a little under the profile's name), SMs per `nvidia-smi mig -lgip`
_A100_80GB_MIG = (
    MigProfile("1g.10gb", 1, 14, 9728),
    MigProfile("2g.20gb", 2, 28, 19968),
    MigProfile("3g.40gb", 3, 42, 40192),
    MigProfile("4g.40gb", 4, 56, 40192),
    MigProfile("7g.80gb", 7, 98, 80000),
)
_H100_80GB_MIG = (
    MigProfile("1g.10gb", 1, 16, 9984),
    MigProfile("2g.20gb", 2, 32, 20096),
    MigProfile("3g.40gb", 3, 60, 40320),
    MigProfile("4g.40gb", 4, 64, 40320),
    MigProfile("7g.80gb", 7, 132, 80896),
)

H100_SXM = GpuModel(
    name="NVIDIA H100 80GB HBM3",
    memory_total=81559 * MIB,
    memory_reserved=530 * MIB,
    memory_idle_used=4 * MIB,
    power_limit_w=700.0,
    power_idle_w=71.0,
    temp_idle_c=31.0,
    temp_load_c=63.0,
    sm_clock_idle_mhz=345,
    sm_clock_max_mhz=1980,
    mem_clock_mhz=2619,
    pcie_gen_max=5,
    pcie_width_max=16,
    pcie_rx_peak_kbps=3_200_000,
    pcie_tx_peak_kbps=420_000,
    nvlink_links=18,
    nvlink_peak_kibps=9_500_000,
    ecc=True,
    row_remap=True,
    pcie_byte_counters=True,  # Hopper
    mig_profiles=_H100_80GB_MIG,
    gpm=True,  # Hopper
    compute_capability=(9, 0),
    fabric_info=True,  # Hopper on an HGX board: the Fabric Manager trains its NVSwitch fabric
)

A100_SXM = GpuModel(
    name="NVIDIA A100-SXM4-80GB",
    memory_total=81920 * MIB,
    memory_reserved=1160 * MIB,
    memory_idle_used=4 * MIB,
    power_limit_w=400.0,
    power_idle_w=62.0,
    temp_idle_c=30.0,
    temp_load_c=61.0,
    sm_clock_idle_mhz=210,
    sm_clock_max_mhz=1410,
    mem_clock_mhz=1593,
    pcie_gen_max=4,
    pcie_width_max=16,
    pcie_rx_peak_kbps=2_400_000,
    pcie_tx_peak_kbps=320_000,
    nvlink_links=12,
    nvlink_peak_kibps=11_000_000,
    ecc=True,
    row_remap=True,
    mig_profiles=_A100_80GB_MIG,
)

_A100_BUS_IDS = tuple(f"00000000:{b}:00.0" for b in ("07", "0F", "47", "4E"))

RTX_4090 = GpuModel(
    name="NVIDIA GeForce RTX 4090",
    memory_total=24564 * MIB,
    memory_reserved=330 * MIB,
    memory_idle_used=250 * MIB,
    power_limit_w=450.0,
    power_idle_w=22.0,
    temp_idle_c=34.0,
    temp_load_c=68.0,
    sm_clock_idle_mhz=210,
    sm_clock_max_mhz=2745,
    mem_clock_mhz=10501,
    pcie_gen_max=4,
    pcie_width_max=16,
    pcie_rx_peak_kbps=2_400_000,
    pcie_tx_peak_kbps=300_000,
    nvlink_links=0,
    nvlink_peak_kibps=0,
    ecc=False,
    row_remap=False,
    pcie_byte_counters=False,  # Ada: no report either way; refused here so that the fallback runs in --simulate
    gpm=False,  # Ada: nvmlGpmQueryDeviceSupport says isSupportedDevice 0
    compute_capability=(8, 9),
)

PROFILES: dict[str, Profile] = {
    "h100-sxm-8": Profile(
        name="h100-sxm-8",
        description="8x H100 SXM 80GB, NVSwitch (NV18 between every pair), two NUMA nodes with 4 GPUs each, a ConnectX rail NIC on each GPU's PCIe switch",
        gpu=H100_SXM,
        # a DGX H100's GPU bus ids; the first four hang off socket 0, each GPU behind its own PCIe switch
        bus_ids=_H100_BUS_IDS,
        numa_nodes=_H100_NUMA,
        switch_bus_ids=tuple(f"00000000:{b}:00.0" for b in ("05", "06", "07", "08")),
        same_node_ancestor="NODE",
        nics=rail_nics(_H100_BUS_IDS, _H100_NUMA),
    ),
    "rtx-4090-2": Profile(
        name="rtx-4090-2",
        description="2x GeForce RTX 4090 on one host bridge: ECC, NVLink, row remapping and the PCIe byte counters are NOT_SUPPORTED",
        gpu=RTX_4090,
        bus_ids=("00000000:01:00.0", "00000000:21:00.0"),
        numa_nodes=(0, 0),
        same_node_ancestor="PHB",
        # the board's own 2.5 GbE port on a root port of the same host bridge: no RDMA, so not in topo -m
        nics=(SimNic(name="enp5s0", bus_id="0000:05:00.0", numa_node=0, rdma=False, rate_gbps=2.5),),
    ),
    "a100-sxm-4-mig": Profile(
        name="a100-sxm-4-mig",
        description="4x A100 SXM4 80GB, NVSwitch, one NUMA node; MIG on GPU 0 (3g.40gb, 2g.20gb, 2x 1g.10gb) and GPU 1 (4g.40gb, 3g.40gb), GPUs 2-3 whole",
        gpu=A100_SXM,
        bus_ids=_A100_BUS_IDS,
        numa_nodes=(0, 0, 0, 0),
        switch_bus_ids=tuple(f"00000000:{b}:00.0" for b in ("C1", "C2", "C3", "C4", "C5", "C6")),
        mig=((0, ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")), (1, ("4g.40gb", "3g.40gb"))),
    ),
}

# Symbols an old driver (before R510/R535) does not export. The adapter falls back to the v1 call
# where one exists (memory, temperature, CUDA version, process list, throttle reasons).
OLD_DRIVER_MISSING_SYMBOLS = (
    "nvmlDeviceGetGpuFabricInfoV",  # (the deprecated nvmlDeviceGetGpuFabricInfo, without the health mask, stays)
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetTemperatureV",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetSupportedClocksEventReasons",
)

# name -> (argument form, help). Kept in one table so the parser and --help-faults agree.
FAULTS: dict[str, tuple[str, str]] = {
    "gpu-lost": ("gpu-lost=IDX@SECONDS", "GPU IDX falls off the bus SECONDS after start (every call: GPU_IS_LOST)"),
    "old-driver": ("old-driver", "an old driver without the _v2/V symbols (the adapter falls back to v1 calls)"),
    "pcie-degraded": ("pcie-degraded=IDX", "GPU IDX's link trains to Gen3 x8 under load (max Gen5 x16)"),
    "thermal": ("thermal=IDX", "GPU IDX runs hot (~90 C) with HW/SW thermal slowdown and reduced SM clocks"),
    "ecc": ("ecc=IDX", "GPU IDX reports uncorrectable volatile ECC errors and a pending row remap"),
    "nvlink-down": ("nvlink-down=IDX", "4 of GPU IDX's NVLinks are inactive (NV14 to its peers)"),
    "power": ("power=IDX", "GPU IDX is capped at 55% of its power limit (SW power cap, lower clocks)"),
    "xid": ("xid=IDX:CODE[@SECONDS]", "the driver reports XID CODE on GPU IDX (SECONDS after start, default 0)"),
    "fabric-not-started": (
        "fabric-not-started=IDX",
        "GPU IDX's NVSwitch fabric is not trained (state Not Started: nvidia-fabricmanager down; NVSwitch profiles)",
    ),
    "fabric-degraded": (
        "fabric-degraded=IDX",
        "GPU IDX's fabric trained with degraded bandwidth (health mask: DEGRADED_BW; NVSwitch profiles)",
    ),
}
# Not a fault: how a GPU is set up.  Parsed beside the faults, listed apart from them.
MIG_SWITCH = ("mig=IDX:PROFILE,...", "GPU IDX in MIG mode, split into instances of those profiles (e.g. mig=0:3g.40gb,4g.40gb)")

# The faults `gputop check` looks for (each makes it exit 3 with one failing line); see `_parse_infra_fault`.
INFRA_FAULTS: dict[str, tuple[str, str]] = {
    "pcie-replay": ("pcie-replay=IDX", "GPU IDX's PCIe replay counter climbs (~40 a second): a marginal link"),
    "aer": ("aer=IDX", "GPU IDX's PCI device logs AER correctable errors (sysfs aer_dev_correctable, climbing)"),
    "nvlink-crc": ("nvlink-crc=IDX[:LINK]", "NVLink LINK (default 0) of GPU IDX counts CRC errors (climbing)"),
    "retired-page": ("retired-page=IDX", "GPU IDX retired a page for a double-bit ECC error; it waits for a reset"),
    "topology": ("topology=IDX", "GPU IDX's NVLinks miss the NVSwitches: it reads PHB where its peers read NV18"),
    "kernel-xid": ("kernel-xid=IDX:CODE", "the kernel log holds `NVRM: Xid` CODE for GPU IDX (NVML's events do not)"),
}
FAULTS.update(INFRA_FAULTS)
# The NIC faults `gputop check` looks for, in the simulated /sys (gputop.sim.fake_sysfs): a table of their own,
# as they name a NIC (DEV: an RDMA device such as mlx5_3, or a plain interface such as enp5s0), not a GPU.
NIC_FAULTS: dict[str, tuple[str, str]] = {
    "nic-down": ("nic-down=DEV", "NIC DEV's port is down (state DOWN, phys_state Polling) after carrying traffic"),
    "nic-rate": ("nic-rate=DEV:GBPS", "NIC DEV's port trained to GBPS Gb/s (e.g. nic-rate=mlx5_3:200, half of NDR)"),
    "nic-errors": ("nic-errors=DEV", "NIC DEV's port counts symbol errors and link error recoveries (climbing)"),
}


def faults_help() -> str:
    """The text of `gputop snapshot --help-faults`."""
    lines = [
        "Simulated machine: --simulate PROFILE[+FAULT...]",
        "",
        "Profiles:",
    ]
    for name, profile in PROFILES.items():
        default = " (default)" if name == DEFAULT_PROFILE else ""
        lines.append(f"  {name:<22} {profile.description}{default}")
    lines.append(f"  {'capture:DIR':<22} a machine's own nvidia-smi output (topo.txt, smi_q.txt|.xml, nvlink.txt in DIR)")
    lines += ["", "MIG (an A100 or H100 GPU in MIG mode):", f"  {MIG_SWITCH[0]:<24} {MIG_SWITCH[1]}"]
    lines += ["", "Faults (IDX is a GPU index, several may be combined):"]
    for form, text in FAULTS.values():
        lines.append(f"  {form:<24} {text}")
    lines += ["", "NIC faults (DEV is a NIC's name in /sys: the profile's mlx5_0..mlx5_7, or enp5s0):"]
    for form, text in NIC_FAULTS.values():
        lines.append(f"  {form:<24} {text}")
    lines += ["", "Example: gputop snapshot --simulate h100-sxm-8+thermal=2+gpu-lost=3@10"]
    return "\n".join(lines)


@dataclass(frozen=True)
class InfraFaults:
    """The INFRA_FAULTS switches (see there)."""

    pcie_replay: frozenset[int] = frozenset()
    aer: frozenset[int] = frozenset()
    nvlink_crc: frozenset[tuple[int, int]] = frozenset()  # (gpu, link)
    retired_page: frozenset[int] = frozenset()
    topology: frozenset[int] = frozenset()
    kernel_xids: tuple[tuple[int, int], ...] = ()  # (gpu, XID code)
    # the NIC_FAULTS
    nic_down: frozenset[str] = frozenset()  # NIC names
    nic_rate: tuple[tuple[str, float], ...] = ()  # (NIC name, Gb/s)
    nic_errors: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Faults:
    lost_after: dict[int, float] = field(default_factory=dict)  # gpu -> seconds after start
    old_driver: bool = False
    pcie_degraded: frozenset[int] = frozenset()
    thermal: frozenset[int] = frozenset()
    ecc: frozenset[int] = frozenset()
    nvlink_down: frozenset[int] = frozenset()
    power_cap: frozenset[int] = frozenset()
    xids: tuple[tuple[int, int, float], ...] = ()  # (gpu, XID code, seconds after start)
    fabric_not_started: frozenset[int] = frozenset()
    fabric_degraded: frozenset[int] = frozenset()
    infra: InfraFaults = field(default_factory=InfraFaults)


@dataclass(frozen=True)
class SimSpec:
    text: str  # the normalised spec, e.g. "h100-sxm-8+thermal=2"
    profile: Profile
    faults: Faults
    host_cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
