"""What a simulated GPU reads, as a function of its model, the faults and the load (the fake NVML library serves
these numbers through the C interface, gputop/sim/fake_nvml.py).

Power and temperature follow the load (utilization by default; a load model may say how hard its busy time
works the GPU, `power_load`), clocks follow utilization and the power and thermal limits; PCIe and NVLink
traffic scale with the load and the trained link; the NVLink and PCIe byte counters and the GPM activity
counters are cumulative: the rates integrated over time (`count`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from gputop.sim.load import LoadModel
from gputop.sim.profiles import Faults, GpuModel

# nvmlClocksEventReasons bits the simulation sets
REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40

IDLE_UTILIZATION = 5.0  # below this a GPU is "idle": the link drops to Gen1, GpuIdle is set
NVLINK_DOWN_LINKS = 4  # the links `nvlink-down=IDX` takes down

# What a busy second of a load model that declares no kernel mix (the synthetic `--simulate` load) does, per GPM
# metric the fake serves (fake_nvml.GPM_METRICS' order): a healthy bf16 training step, most SMs busy, tensor
# cores at about half, memory at a third.
DEFAULT_ACTIVITY = (0.85, 0.40, 0.45, 0.35, 0.10, 0.05)


@dataclass
class GpuState:
    """One simulated GPU's readings at `time` (recomputed per quantum)."""

    time: float = -math.inf
    utilization: float = 0.0
    memory_utilization: float = 0.0
    memory_used: int = 0
    temperature: int = 0
    power_mw: int = 0
    power_limit_mw: int = 0
    sm_clock: int = 0
    mem_clock: int = 0
    pcie_gen: int = 0
    pcie_width: int = 0
    pcie_tx_kbps: int = 0
    pcie_rx_kbps: int = 0
    reasons: int = 0
    processes: list[tuple[int, Optional[int]]] = field(default_factory=list)  # (pid, used bytes or None)
    nvlink_tx_kib: list[float] = field(default_factory=list)  # cumulative per link
    nvlink_rx_kib: list[float] = field(default_factory=list)
    pcie_tx_bytes: float = 0.0  # cumulative: the PCIe TX/RX rates integrated over time
    pcie_rx_bytes: float = 0.0
    nvlink_tx_kibps: list[float] = field(default_factory=list)  # the rates the NVLink counters count at, per link
    nvlink_rx_kibps: list[float] = field(default_factory=list)
    counted_to: float = -math.inf  # the time the cumulative counters were last counted to (see `count`)
    gpm_rates: list[float] = field(default_factory=lambda: [0.0] * len(DEFAULT_ACTIVITY))  # activity share per metric
    gpm_seconds: list[float] = field(default_factory=lambda: [0.0] * len(DEFAULT_ACTIVITY))  # cumulative activity-s

    @classmethod
    def with_links(cls, links: int) -> GpuState:
        return cls(
            nvlink_tx_kib=[0.0] * links,
            nvlink_rx_kib=[0.0] * links,
            nvlink_tx_kibps=[0.0] * links,
            nvlink_rx_kibps=[0.0] * links,
        )


@dataclass(frozen=True)
class Thermals:
    """Power, temperature, SM clock and the clock-event reasons a load gives."""

    power_w: float
    limit_w: float
    temperature: float
    sm_clock: int
    reasons: int


def thermals(model: GpuModel, gpu: int, faults: Faults, util: float, load: float) -> Thermals:
    """Power follows the load up to the limit (a power cap lowers it); past the limit the clocks drop; a thermal
    fault runs the GPU hot with its clocks held back."""
    idle = util < IDLE_UTILIZATION
    spread = ((gpu * 37) % 7 - 3) / 3.0  # -1..1: small fixed per-GPU differences, as real boards have
    limit_w = model.power_limit_w * (0.55 if gpu in faults.power_cap else 1.0)
    demand_w = model.power_idle_w + (model.power_limit_w * 0.93 - model.power_idle_w) * load + 4.0 * spread
    power_w = min(demand_w, limit_w)
    sm_clock = model.sm_clock_idle_mhz if idle else model.sm_clock_max_mhz
    reasons = REASON_GPU_IDLE if idle else 0
    temperature = model.temp_idle_c + (model.temp_load_c - model.temp_idle_c) * load + 2.0 * spread
    if demand_w > limit_w:
        reasons |= REASON_SW_POWER_CAP
        sm_clock = int(model.sm_clock_max_mhz * (0.55 + 0.45 * limit_w / demand_w))
    if gpu in faults.thermal:
        temperature = 88.0 + 4.0 * load
        reasons |= REASON_HW_SLOWDOWN | REASON_HW_THERMAL | REASON_SW_THERMAL
        sm_clock = int(model.sm_clock_max_mhz * (0.45 if not idle else 0.3))
        power_w = min(power_w, model.power_idle_w + (limit_w - model.power_idle_w) * 0.6 * load)
    return Thermals(power_w, limit_w, temperature, sm_clock, reasons)


def set_link_rates(
    st: GpuState, model: GpuModel, gpu: int, faults: Faults, util: float, load: float, link_active: Callable[[int], bool]
) -> None:
    """The PCIe link's trained speed and its traffic, and each NVLink's (0 on a link that is down)."""
    if util < IDLE_UTILIZATION:
        gen, width = 1, model.pcie_width_max  # idle links drop their speed to save power
    elif gpu in faults.pcie_degraded:
        gen, width = 3, 8
    else:
        gen, width = model.pcie_gen_max, model.pcie_width_max
    # traffic scales with load and with what the trained link can carry (Gen3 x8 is ~1/8 of Gen5 x16)
    link_share = min(1.0, (2 ** (gen - 1) * width) / (2 ** (model.pcie_gen_max - 1) * model.pcie_width_max))
    st.pcie_rx_kbps = int(model.pcie_rx_peak_kbps * load * min(1.0, link_share * 4))
    st.pcie_tx_kbps = int(model.pcie_tx_peak_kbps * load * min(1.0, link_share * 4))
    st.pcie_gen, st.pcie_width = gen, width
    nvlink_kibps = model.nvlink_peak_kibps * (0.15 + 0.85 * load)
    for link in range(model.nvlink_links):
        active = link_active(link)
        st.nvlink_tx_kibps[link] = nvlink_kibps * (1.0 + 0.01 * link) if active else 0.0
        st.nvlink_rx_kibps[link] = nvlink_kibps * (0.98 + 0.01 * link) if active else 0.0


def advance(
    st: GpuState, model: GpuModel, gpu: int, faults: Faults, load_model: LoadModel, now: float, link_active: Callable[[int], bool]
) -> None:
    """`st` recomputed at `now` from the load, its cumulative counters counted up to `now` at the new rates."""
    util = max(0.0, min(100.0, float(load_model.utilization(gpu, now))))
    power_load = getattr(load_model, "power_load", None)  # optional: a spinning collective is busy at low power
    load = util / 100.0 if power_load is None else max(0.0, min(1.0, float(power_load(gpu, now))))
    used = load_model.memory_used(gpu, now)
    used = model.memory_idle_used if used is None else int(used)
    used = max(0, min(used, model.memory_total - model.memory_reserved))
    heat = thermals(model, gpu, faults, util, load)
    set_link_rates(st, model, gpu, faults, util, load, link_active)
    st.gpm_rates = [share * util / 100.0 for share in DEFAULT_ACTIVITY]  # unless the load counts them (gpm_counters)
    count(st, now)  # the time since the counters' last reading, at the rates just set
    st.utilization = util
    st.memory_utilization = min(100.0, util * 0.45)
    st.memory_used = used
    st.temperature = int(round(heat.temperature))
    st.power_mw = int(heat.power_w * 1000)
    st.power_limit_mw = int(heat.limit_w * 1000)
    st.sm_clock = heat.sm_clock
    st.mem_clock = model.mem_clock_mhz
    st.reasons = heat.reasons
    st.processes = list(load_model.processes(gpu))
    st.time = now


def count(st: GpuState, now: float) -> None:
    """Integrate the cumulative counters from where they were last counted to `now`, at the state's rates
    (a board counts continuously: reading them between two state updates gives their value at that moment)."""
    dt = now - st.counted_to  # inf before the first count: nothing to integrate, only the start to set
    if dt <= 0:
        return
    if dt != math.inf:
        st.pcie_tx_bytes += st.pcie_tx_kbps * 1024.0 * dt  # GetPcieThroughput's KB/s (1 KB = 1024 bytes)
        st.pcie_rx_bytes += st.pcie_rx_kbps * 1024.0 * dt
        for link, (tx, rx) in enumerate(zip(st.nvlink_tx_kibps, st.nvlink_rx_kibps)):
            st.nvlink_tx_kib[link] += tx * dt
            st.nvlink_rx_kib[link] += rx * dt
        for metric, rate in enumerate(st.gpm_rates):
            st.gpm_seconds[metric] += rate * dt
    st.counted_to = now
