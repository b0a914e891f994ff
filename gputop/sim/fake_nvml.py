"""A fake NVML C library, installed *below* pynvml so the real adapter code runs against it.

pynvml looks every C symbol up with ``getattr(nvmlLib, name)`` and calls it with
ctypes arguments.  `FakeNvmlLibrary` answers those lookups with plain functions
(pynvml sets ``restype`` on them, which a bound method would refuse), reads the
arguments the way the C library would, writes outputs through
``byref(x)._obj``, and returns NVML return codes as ints.  A symbol the fake does
not serve raises AttributeError, which pynvml turns into FunctionNotFound, exactly
as a real old driver would.

This module never imports pynvml: the numbers below are the C library's ABI
(nvml.h), which is what a fake C library has to speak.

What the simulated GPUs report follows a `SimSpec` (profile + faults) and a
`LoadModel` (utilization, memory, processes, and optionally how hard the busy time
works the GPU): power and temperature follow that load (utilization by default), clocks
follow utilization; PCIe and NVLink traffic scale with it; the NVLink counters and the
PCIe byte counters (Hopper profiles only, see `GpuModel.pcie_byte_counters`) are cumulative
and only ever grow (a 32-bit PCIe counter wraps).  Every reading is a function of ``clock()``, so a
controlled clock gives deterministic readings.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, cast

from gputop.sim.load import LoadModel
from gputop.sim.profiles import MIB, MIG_MAX_DEVICES, OLD_DRIVER_MISSING_SYMBOLS, MigProfile, SimSpec

if TYPE_CHECKING:
    from ctypes import _CData, _SimpleCData
    from typing import Protocol, TypeAlias

    # The C functions' arguments as pynvml passes them.  Their ctypes classes differ per symbol and per pynvml
    # version (c_uint, c_ulonglong, a Structure, an array), and the fake reads and writes them by field name, as
    # the C library reads memory: their roles have names here, their fields are not typed.
    CScalar: TypeAlias = "int | _SimpleCData[Any]"  # a number passed by value: c_uint(3) or a plain int
    Handle: TypeAlias = "_CData | int"  # a device or event-set handle: pynvml's pointer, a c_void_p or an int
    CharBuffer: TypeAlias = "ctypes.Array[ctypes.c_char]"  # create_string_buffer(size)

    class Ref(Protocol):
        """`ctypes.byref(x)`, an output argument: `_obj` is the caller's ctypes object."""

        _obj: Any


# a C function the fake library serves: returns an nvmlReturn_t (nvmlErrorString: the message's bytes)
CFunction = Callable[..., object]
DeviceFunction = Callable[..., int]  # one whose first argument is the GPU's index (see `device`)
_F = TypeVar("_F", bound=Callable[..., object])

# ---------------------------------------------------------------- nvml.h constants
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_TIMEOUT = 10
ERROR_GPU_IS_LOST = 15
ERROR_ARGUMENT_VERSION_MISMATCH = 25

# nvmlGpuFabricInfo: states, and the health mask's 2-bit fields (each 1 TRUE, 2 FALSE): degraded bandwidth
# (bits 0-1), route recovery (2-3), route unhealthy (4-5), access timeout recovery (6-7)
FABRIC_UUID_LEN = 16
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_COMPLETED = 3
FABRIC_HEALTHY = 2 | 2 << 2 | 2 << 4 | 2 << 6
FABRIC_HEALTH_DEGRADED_BW = 1 | 2 << 2 | 2 << 4 | 2 << 6

_ERROR_STRINGS = {
    SUCCESS: b"Success",
    ERROR_UNINITIALIZED: b"Uninitialized",
    ERROR_INVALID_ARGUMENT: b"Invalid Argument",
    ERROR_NOT_SUPPORTED: b"Not Supported",
    ERROR_NOT_FOUND: b"Not Found",
    ERROR_INSUFFICIENT_SIZE: b"Insufficient Size",
    ERROR_TIMEOUT: b"Timeout",
    ERROR_GPU_IS_LOST: b"GPU is lost",
    ERROR_ARGUMENT_VERSION_MISMATCH: b"Argument version mismatch",
}

MEMORY_V2_VERSION = 0x02000028
TEMPERATURE_V1_VERSION = 0x100000C
TEMPERATURE_GPU = 0
CLOCK_SM = 1
CLOCK_MEM = 2
PCIE_UTIL_TX_BYTES = 0
PCIE_UTIL_RX_BYTES = 1
MEMORY_ERROR_UNCORRECTED = 1
VOLATILE_ECC = 0
TOPOLOGY_SYSTEM = 50
TOPOLOGY_LEVELS = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
NVLINK_DEVICE_TYPE_GPU = 0x00
NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVLINK_ERROR_DL_CRC_FLIT = 2
PAGE_RETIREMENT_DOUBLE_BIT = 1
PERF_POLICY_POWER = 0
PERF_POLICY_THERMAL = 1
NVLINK_MAX_LINKS = 36
FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
FI_DEV_PCIE_COUNT_TX_BYTES = 197
FI_DEV_PCIE_COUNT_RX_BYTES = 198
VALUE_TYPE_UNSIGNED_INT = 1
VALUE_TYPE_UNSIGNED_LONG_LONG = 3
VALUE_NOT_AVAILABLE_ULL = 2**64 - 1
EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
EVENT_TYPES_SUPPORTED = 0x1F  # ECC single/double bit, P-state, XID, clock

REASON_GPU_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
SUPPORTED_REASONS = 0x1FF

# Real GetPcieThroughput samples the link for about 20 ms before answering; the fake does too by
# default so that the adapter's concurrency is exercised, not assumed.
PCIE_THROUGHPUT_LATENCY_S = 0.02

# Readings are recomputed at most this often (NVML itself refreshes on a ~1/6 s period); one
# adapter sample makes ~20 calls per GPU and they should agree with each other.
STATE_QUANTUM_S = 0.05

# MIG device handles: an address per (GPU, MIG device index), far above the GPUs' own (1..n)
MIG_HANDLE_BASE = 0x10000
MIG_HANDLE_STRIDE = 0x10
MIG_INSTANCE_IDLE_USED = 19 * MIB  # an empty instance's used memory (an A100's `nvidia-smi -q`: 19 MiB each)
# the first GPU instance id NVML gives an instance of so many compute slices (A100/H100 placements), then counts up
_MIG_FIRST_GI_ID = {7: 0, 4: 1, 3: 1, 2: 3, 1: 7}

IDLE_UTILIZATION = 5.0  # below this a GPU is "idle": the link drops to Gen1, GpuIdle is set

# ---- GPM (GPU Performance Monitoring, nvml.h `nvmlGpm*`)
GPM_SUPPORT_VERSION = 1
GPM_METRICS_GET_VERSION = 1
GPM_METRIC_MAX = 477  # the size of nvmlGpmMetricsGet_t's metrics array (NVML_GPM_METRIC_MAX)
# the metrics the simulated GPUs count, in `gputop.sim.busy_board.ACTIVITY_FIELDS` order: NVML id, names, unit
GPM_METRICS = (
    (2, b"sm_util", b"SM utilization", b"%"),  # NVML_GPM_METRIC_SM_UTIL
    (3, b"sm_occupancy", b"SM occupancy", b"%"),  # NVML_GPM_METRIC_SM_OCCUPANCY
    (5, b"any_tensor_util", b"Any tensor activity", b"%"),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    (10, b"dram_bw_util", b"DRAM bandwidth utilization", b"%"),  # NVML_GPM_METRIC_DRAM_BW_UTIL
    (12, b"fp32_util", b"FP32 activity", b"%"),  # NVML_GPM_METRIC_FP32_UTIL
    (13, b"fp16_util", b"FP16 activity", b"%"),  # NVML_GPM_METRIC_FP16_UTIL
)
_GPM_INDEX = {metric[0]: i for i, metric in enumerate(GPM_METRICS)}
# What a busy second of a load model that declares no kernel mix (the synthetic `--simulate` load) does, per metric
# above: a healthy bf16 training step, most SMs busy, tensor cores at about half, memory at a third.
DEFAULT_ACTIVITY = (0.85, 0.40, 0.45, 0.35, 0.10, 0.05)
NVLINK_DOWN_LINKS = 4


class ManualClock:
    """A clock that only moves when told to: pass it as `clock` for deterministic simulated readings."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


def _int(arg: CScalar) -> int:
    """A ctypes scalar (c_uint(3)) or a plain int -> int."""
    return int(getattr(arg, "value", arg))


class _Value(ctypes.Union):
    """nvml.h `nvmlValue_t`."""

    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class _FieldValue(ctypes.Structure):
    """nvml.h `nvmlFieldValue_t`, as the C library sees the caller's buffer.

    The fake reads and writes the caller's array through this plain layout, as the C library does,
    rather than through pynvml's Python-level struct class (whose per-attribute hooks made the
    NVLink counters the costliest call of a simulated sample).
    """

    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),  # enum nvmlValueType_t
        ("nvmlReturn", ctypes.c_uint),  # enum nvmlReturn_t
        ("value", _Value),
    ]


class _GpmMetricInfo(ctypes.Structure):
    _fields_ = [("shortName", ctypes.c_char_p), ("longName", ctypes.c_char_p), ("unit", ctypes.c_char_p)]


class _GpmMetric(ctypes.Structure):
    """nvml.h `nvmlGpmMetric_t`."""

    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),  # enum nvmlReturn_t
        ("value", ctypes.c_double),
        ("metricInfo", _GpmMetricInfo),
    ]


class _GpmMetricsGet(ctypes.Structure):
    """nvml.h `nvmlGpmMetricsGet_t`, read and written as plain memory for the reason `_FieldValue` is (the
    request's six metrics went through ~34 of pynvml's attribute hooks a GPU a sample)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.c_void_p),  # nvmlGpmSample_t: an opaque handle
        ("sample2", ctypes.c_void_p),
        ("metrics", _GpmMetric * GPM_METRIC_MAX),
    ]


def _address(handle: Handle) -> Optional[int]:
    """A device handle (pynvml's pointer, a c_void_p, or an int) -> the address it holds."""
    if isinstance(handle, int):
        return ctypes.c_void_p(handle).value  # (from_buffer refuses an int)
    try:
        return ctypes.c_void_p.from_buffer(handle).value  # a pointer-sized ctypes object: read its bytes
    except TypeError:
        return ctypes.cast(handle, ctypes.c_void_p).value


@dataclass(frozen=True)
class _MigDevice:
    """One MIG device of the simulation: GPU, MIG device index, its profile, its GPU instance id."""

    gpu: int
    index: int
    profile: MigProfile
    gpu_instance_id: int


def _write(buf: CharBuffer, text: str, size: CScalar) -> int:
    """A C string into the caller's buffer of `size` bytes (NUL included)."""
    data = text.encode()
    if len(data) + 1 > _int(size):
        return ERROR_INSUFFICIENT_SIZE
    buf.value = data
    return SUCCESS


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # gpu -> event type mask
    delivered: set[int] = field(default_factory=set)  # indices into Faults.xids already handed out


@dataclass
class _GpuState:
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
    counted_to: float = -math.inf  # the time the cumulative counters were last counted to (see `_count`)
    gpm_rates: list[float] = field(default_factory=lambda: [0.0] * len(GPM_METRICS))  # activity share per GPM metric
    gpm_seconds: list[float] = field(default_factory=lambda: [0.0] * len(GPM_METRICS))  # cumulative activity-seconds


class FakeNvmlLibrary:
    """Stands in for libnvidia-ml.so: `getattr(lib, "nvmlDeviceGetName")` gives the C function."""

    def __init__(
        self,
        spec: SimSpec,
        load: LoadModel,
        *,
        clock: Callable[[], float] = time.monotonic,
        pcie_latency_s: float = PCIE_THROUGHPUT_LATENCY_S,
        pcie_counter_bits: int = 64,
    ) -> None:
        """`pcie_counter_bits`: the width the PCIe byte counters are served at (64: unsigned long long; 32:
        unsigned int, which wraps every 4 GiB)."""
        self.spec = spec
        self.profile = spec.profile
        self.faults = spec.faults
        self.load = load
        self.clock = clock
        self.pcie_latency_s = pcie_latency_s
        self.pcie_counter_bits = pcie_counter_bits
        self.started_at = clock()
        self._lock = threading.Lock()
        self._event_sets: dict[int, _EventSet] = {}
        self._event_set_numbers = itertools.count(1)
        # GPM sample buffers allocated and not freed: buffer -> (gpu, time, counters) once a sample was taken into it
        self.gpm_buffers: dict[int, Optional[tuple[int, float, tuple[float, ...]]]] = {}
        n = self.profile.gpu_count
        links = self.profile.gpu.nvlink_links
        self._states = [
            _GpuState(
                nvlink_tx_kib=[0.0] * links,
                nvlink_rx_kib=[0.0] * links,
                nvlink_tx_kibps=[0.0] * links,
                nvlink_rx_kibps=[0.0] * links,
            )
            for _ in range(n)
        ]
        symbols = self._build_symbols()
        if self.faults.old_driver:
            for name in OLD_DRIVER_MISSING_SYMBOLS:
                symbols.pop(name, None)
        symbols.update(self._mig_symbols(symbols))  # (a card without MIG answers NOT_SUPPORTED, as a real one)
        if self.profile.capture is not None:
            symbols.update(self._capture_symbols(symbols))
            for name in self.profile.capture.missing_symbols:
                symbols.pop(name, None)
        self._symbols = symbols

    # pynvml asks for symbols by attribute; a missing one must be AttributeError (-> FunctionNotFound)
    def __getattr__(self, name: str) -> CFunction:
        symbols: dict[str, CFunction] = self.__dict__.get("_symbols", {})
        if name in symbols:
            return symbols[name]
        raise AttributeError(f"fake NVML library has no symbol {name}")

    def symbol_names(self) -> list[str]:
        return sorted(self._symbols)

    # ------------------------------------------------------------ simulation
    def elapsed(self) -> float:
        return self.clock() - self.started_at

    def is_lost(self, gpu: int) -> bool:
        if not self.faults.lost_after:  # asked on every call: skip the clock when no GPU is ever lost
            return False
        after = self.faults.lost_after.get(gpu)
        return after is not None and self.elapsed() >= after

    def link_active(self, gpu: int, link: int) -> bool:
        if self.profile.capture is not None:
            return self.profile.capture.gpus[gpu].nvlink_active[link]
        return not (gpu in self.faults.nvlink_down and link < NVLINK_DOWN_LINKS)

    def state(self, gpu: int) -> _GpuState:
        """The GPU's readings now; recomputed once per quantum, counters integrated over time."""
        now = self.clock()
        st = self._states[gpu]
        if 0 <= now - st.time < STATE_QUANTUM_S:
            return st
        with self._lock:
            if 0 <= now - st.time < STATE_QUANTUM_S:
                return st
            self._advance(gpu, st, now)
        return st

    def _advance(self, gpu: int, st: _GpuState, now: float) -> None:
        model = self.profile.model(gpu)
        faults = self.faults
        util = max(0.0, min(100.0, float(self.load.utilization(gpu, now))))
        idle = util < IDLE_UTILIZATION
        power_load = getattr(self.load, "power_load", None)  # optional: a spinning collective is busy at low power
        load = util / 100.0 if power_load is None else max(0.0, min(1.0, float(power_load(gpu, now))))
        # small fixed per-GPU differences, as real boards have
        spread = ((gpu * 37) % 7 - 3) / 3.0  # -1..1

        used = self.load.memory_used(gpu, now)
        used = model.memory_idle_used if used is None else int(used)
        used = max(0, min(used, model.memory_total - model.memory_reserved))

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

        if idle:
            gen, width = 1, model.pcie_width_max  # idle links drop their speed to save power
        elif gpu in faults.pcie_degraded:
            gen, width = 3, 8
        else:
            gen, width = model.pcie_gen_max, model.pcie_width_max
        # traffic scales with load and with what the trained link can carry (Gen3 x8 is ~1/8 of Gen5 x16)
        link_share = min(1.0, (2 ** (gen - 1) * width) / (2 ** (model.pcie_gen_max - 1) * model.pcie_width_max))
        rx_kbps = int(model.pcie_rx_peak_kbps * load * min(1.0, link_share * 4))
        tx_kbps = int(model.pcie_tx_peak_kbps * load * min(1.0, link_share * 4))

        nvlink_kibps = model.nvlink_peak_kibps * (0.15 + 0.85 * load)
        for link in range(model.nvlink_links):
            active = self.link_active(gpu, link)
            st.nvlink_tx_kibps[link] = nvlink_kibps * (1.0 + 0.01 * link) if active else 0.0
            st.nvlink_rx_kibps[link] = nvlink_kibps * (0.98 + 0.01 * link) if active else 0.0
        st.pcie_tx_kbps, st.pcie_rx_kbps = tx_kbps, rx_kbps
        st.gpm_rates = [share * util / 100.0 for share in DEFAULT_ACTIVITY]  # unless the load counts them (gpm_counters)
        self._count(st, now)  # the time since the counters' last reading, at the rates just set

        st.utilization = util
        st.memory_utilization = min(100.0, util * 0.45)
        st.memory_used = used
        st.temperature = int(round(temperature))
        st.power_mw = int(power_w * 1000)
        st.power_limit_mw = int(limit_w * 1000)
        st.sm_clock = sm_clock
        st.mem_clock = model.mem_clock_mhz
        st.pcie_gen, st.pcie_width = gen, width
        st.reasons = reasons
        st.processes = list(self.load.processes(gpu))
        st.time = now

    @staticmethod
    def _count(st: _GpuState, now: float) -> None:
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

    def counters(self, gpu: int) -> tuple[_GpuState, float]:
        """The GPU's state with its cumulative counters counted up to now, and now."""
        st = self.state(gpu)
        now = self.clock()
        with self._lock:
            self._count(st, now)
        return st, now

    def gpm_counters(self, gpu: int) -> tuple[float, tuple[float, ...]]:
        """(now, cumulative activity-seconds per GPM metric): counted by the load model where it declares its
        kernels' mix (`activity_seconds`, the demo's busy board), else `DEFAULT_ACTIVITY` of the busy time."""
        counted = getattr(self.load, "activity_seconds", None)
        if counted is not None:
            now = self.clock()
            return now, tuple(counted(gpu, now))
        st, now = self.counters(gpu)
        return now, tuple(st.gpm_seconds)

    def ecc_count(self, gpu: int, error_type: int, counter: int) -> Optional[int]:
        """The count NVML answers; None: it refuses (a capture that reads N/A there, e.g. volatile under MIG)."""
        if self.profile.capture is not None:  # what the capture counted: (corrected, uncorrected)
            captured = self.profile.capture.gpus[gpu]
            pair = captured.ecc_volatile if counter == VOLATILE_ECC else captured.ecc_aggregate
            return pair[1 if error_type == MEMORY_ERROR_UNCORRECTED else 0] if pair is not None else None
        if gpu not in self.faults.ecc:
            return 0
        if error_type == MEMORY_ERROR_UNCORRECTED:
            return 2
        return 14 if counter == VOLATILE_ECC else 37

    # ------------------------------------------------------------ the C functions
    def _build_symbols(self) -> dict[str, CFunction]:
        lib = self
        profile = self.profile
        model = profile.gpu
        n = profile.gpu_count

        def gpu_of(handle: Handle) -> Optional[int]:
            address = _address(handle)
            if not address or not 1 <= address <= n:
                return None
            return address - 1

        def device(fn: DeviceFunction) -> DeviceFunction:
            """Resolve the handle and answer GPU_IS_LOST for a lost GPU."""

            def call(handle: Handle, *args: object) -> int:
                gpu = gpu_of(handle)
                if gpu is None:
                    return ERROR_INVALID_ARGUMENT
                if lib.is_lost(gpu):
                    return ERROR_GPU_IS_LOST
                return fn(gpu, *args)

            call.__name__ = fn.__name__
            return call

        def write_str(buf: CharBuffer, text: str, size: CScalar) -> int:
            data = text.encode()
            if len(data) + 1 > _int(size):
                return ERROR_INSUFFICIENT_SIZE
            buf.value = data
            return SUCCESS

        # ---- system
        def nvmlInitWithFlags(flags: CScalar) -> int:
            return SUCCESS

        def nvmlInit_v2() -> int:
            return nvmlInitWithFlags(0)

        def nvmlShutdown() -> int:
            return SUCCESS

        def nvmlErrorString(result: CScalar) -> bytes:
            return _ERROR_STRINGS.get(_int(result), b"Unknown Error")

        def nvmlSystemGetDriverVersion(buf: CharBuffer, size: CScalar) -> int:
            return write_str(buf, profile.driver_version, size)

        def nvmlSystemGetNVMLVersion(buf: CharBuffer, size: CScalar) -> int:
            return write_str(buf, profile.nvml_version, size)

        def nvmlSystemGetCudaDriverVersion(out: Ref) -> int:
            out._obj.value = profile.cuda_version
            return SUCCESS

        def nvmlDeviceGetCount_v2(out: Ref) -> int:
            out._obj.value = n
            return SUCCESS

        def nvmlDeviceGetHandleByIndex_v2(index: CScalar, out: Ref) -> int:
            index = _int(index)
            if not 0 <= index < n:
                return ERROR_INVALID_ARGUMENT
            ctypes.c_void_p.from_buffer(out._obj).value = index + 1
            return SUCCESS

        # ---- identity
        @device
        def nvmlDeviceGetName(gpu: int, buf: CharBuffer, size: CScalar) -> int:
            return write_str(buf, profile.model(gpu).name, size)

        @device
        def nvmlDeviceGetUUID(gpu: int, buf: CharBuffer, size: CScalar) -> int:
            # stable, profile-specific, looks like a real one
            tag = sum(ord(c) for c in profile.name) & 0xFFFF
            return write_str(buf, f"GPU-{tag:04x}5e1d-{gpu:04x}-4c0d-9a1e-{gpu * 7919 + tag:012x}", size)

        def fill_pci(info: Any, bus_id: str) -> None:  # info: a c_nvmlPciInfo_t
            domain, bus, rest = bus_id.split(":")
            dev = rest.split(".")[0]
            info.busId = bus_id.encode()
            info.busIdLegacy = f"{int(domain, 16):04x}:{bus}:{rest}".encode()
            info.domain = int(domain, 16)
            info.bus = int(bus, 16)
            info.device = int(dev, 16)
            info.pciDeviceId = 0x233010DE if model.nvlink_links else 0x268410DE
            info.pciSubSystemId = 0x16C110DE

        @device
        def nvmlDeviceGetPciInfo_v3(gpu: int, out: Ref) -> int:
            fill_pci(out._obj, profile.bus_ids[gpu])
            return SUCCESS

        # ---- readings
        @device
        def nvmlDeviceGetUtilizationRates(gpu: int, out: Ref) -> int:
            st = lib.state(gpu)
            out._obj.gpu = int(round(st.utilization))
            out._obj.memory = int(round(st.memory_utilization))
            return SUCCESS

        @device
        def nvmlDeviceGetMemoryInfo(gpu: int, out: Ref) -> int:
            # v1: `used` includes the reserved memory
            st, card = lib.state(gpu), profile.model(gpu)
            mem = out._obj
            mem.total = card.memory_total
            mem.used = st.memory_used + card.memory_reserved
            mem.free = card.memory_total - mem.used
            return SUCCESS

        @device
        def nvmlDeviceGetMemoryInfo_v2(gpu: int, out: Ref) -> int:
            mem = out._obj
            if mem.version != MEMORY_V2_VERSION:
                return ERROR_ARGUMENT_VERSION_MISMATCH
            st, card = lib.state(gpu), profile.model(gpu)
            mem.total = card.memory_total
            mem.reserved = card.memory_reserved
            mem.used = st.memory_used
            mem.free = card.memory_total - card.memory_reserved - st.memory_used
            return SUCCESS

        @device
        def nvmlDeviceGetTemperature(gpu: int, sensor: CScalar, out: Ref) -> int:
            if _int(sensor) != TEMPERATURE_GPU:
                return ERROR_NOT_SUPPORTED
            out._obj.value = lib.state(gpu).temperature
            return SUCCESS

        @device
        def nvmlDeviceGetTemperatureV(gpu: int, out: Ref) -> int:
            temp = out._obj
            if temp.version != TEMPERATURE_V1_VERSION:
                return ERROR_ARGUMENT_VERSION_MISMATCH
            if temp.sensorType != TEMPERATURE_GPU:
                return ERROR_NOT_SUPPORTED
            temp.temperature = lib.state(gpu).temperature
            return SUCCESS

        @device
        def nvmlDeviceGetPowerUsage(gpu: int, out: Ref) -> int:
            out._obj.value = lib.state(gpu).power_mw
            return SUCCESS

        @device
        def nvmlDeviceGetEnforcedPowerLimit(gpu: int, out: Ref) -> int:
            out._obj.value = lib.state(gpu).power_limit_mw
            return SUCCESS

        @device
        def nvmlDeviceGetClockInfo(gpu: int, clock_type: CScalar, out: Ref) -> int:
            kind = _int(clock_type)
            st = lib.state(gpu)
            if kind == CLOCK_SM:
                out._obj.value = st.sm_clock
            elif kind == CLOCK_MEM:
                out._obj.value = st.mem_clock
            else:
                return ERROR_NOT_SUPPORTED
            return SUCCESS

        @device
        def nvmlDeviceGetCurrPcieLinkGeneration(gpu: int, out: Ref) -> int:
            out._obj.value = lib.state(gpu).pcie_gen
            return SUCCESS

        @device
        def nvmlDeviceGetCurrPcieLinkWidth(gpu: int, out: Ref) -> int:
            out._obj.value = lib.state(gpu).pcie_width
            return SUCCESS

        @device
        def nvmlDeviceGetMaxPcieLinkGeneration(gpu: int, out: Ref) -> int:
            out._obj.value = profile.model(gpu).pcie_gen_max
            return SUCCESS

        @device
        def nvmlDeviceGetMaxPcieLinkWidth(gpu: int, out: Ref) -> int:
            out._obj.value = profile.model(gpu).pcie_width_max
            return SUCCESS

        @device
        def nvmlDeviceGetPcieThroughput(gpu: int, counter: CScalar, out: Ref) -> int:
            kind = _int(counter)
            if kind not in (PCIE_UTIL_TX_BYTES, PCIE_UTIL_RX_BYTES):
                return ERROR_INVALID_ARGUMENT
            if lib.pcie_latency_s > 0:
                time.sleep(lib.pcie_latency_s)  # the real call samples the link for ~20 ms
            st = lib.state(gpu)
            out._obj.value = st.pcie_tx_kbps if kind == PCIE_UTIL_TX_BYTES else st.pcie_rx_kbps
            return SUCCESS

        def reasons_now(gpu: int, out: Ref) -> int:
            out._obj.value = lib.state(gpu).reasons
            return SUCCESS

        def reasons_supported(gpu: int, out: Ref) -> int:
            out._obj.value = SUPPORTED_REASONS
            return SUCCESS

        # ---- NVLink
        def nvlink_check(gpu: int, link: int) -> int:
            links = profile.model(gpu).nvlink_links
            if not links:
                return ERROR_NOT_SUPPORTED
            if not 0 <= link < NVLINK_MAX_LINKS:
                return ERROR_INVALID_ARGUMENT
            if link >= links:
                return ERROR_NOT_SUPPORTED
            return SUCCESS

        # nvlink_check's answer per GPU and link, for the field-values call's 36 entries a GPU (the profile is fixed)
        link_returns = [tuple(nvlink_check(gpu, link) for link in range(NVLINK_MAX_LINKS)) for gpu in range(n)]

        @device
        def nvmlDeviceGetNvLinkState(gpu: int, link: CScalar, out: Ref) -> int:
            link = _int(link)
            ret = nvlink_check(gpu, link)
            if ret == SUCCESS:
                out._obj.value = 1 if lib.link_active(gpu, link) else 0
            return ret

        @device
        def nvmlDeviceGetNvLinkRemotePciInfo_v2(gpu: int, link: CScalar, out: Ref) -> int:
            link = _int(link)
            ret = nvlink_check(gpu, link)
            if ret == SUCCESS:
                switches = profile.switch_bus_ids
                fill_pci(out._obj, switches[link % len(switches)])
            return ret

        @device
        def nvmlDeviceGetNvLinkRemoteDeviceType(gpu: int, link: CScalar, out: Ref) -> int:
            link = _int(link)
            ret = nvlink_check(gpu, link)
            if ret == SUCCESS:
                out._obj.value = NVLINK_DEVICE_TYPE_SWITCH
            return ret

        pcie_counters = model.pcie_byte_counters and not lib.faults.old_driver  # (the fields came with R555)
        pcie_modulus = 1 << lib.pcie_counter_bits
        pcie_value_type = VALUE_TYPE_UNSIGNED_INT if lib.pcie_counter_bits <= 32 else VALUE_TYPE_UNSIGNED_LONG_LONG

        @device
        def nvmlDeviceGetFieldValues(gpu: int, count: CScalar, out: Ref) -> int:
            count = _int(count)
            if count <= 0:
                return SUCCESS
            # the caller's array, read and written as plain nvmlFieldValue_t memory (see _FieldValue)
            values = (_FieldValue * count).from_address(ctypes.addressof(out._obj))
            st, now = lib.counters(gpu)
            stamp = int(now * 1_000_000)
            for entry in values:
                entry.timestamp = stamp
                entry.latencyUsec = 0
                field_id = entry.fieldId
                if field_id == FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
                    counters = st.nvlink_tx_kib
                elif field_id == FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
                    counters = st.nvlink_rx_kib
                elif field_id in (FI_DEV_PCIE_COUNT_TX_BYTES, FI_DEV_PCIE_COUNT_RX_BYTES):
                    if not pcie_counters:
                        entry.nvmlReturn = ERROR_NOT_SUPPORTED
                        continue
                    total = st.pcie_tx_bytes if field_id == FI_DEV_PCIE_COUNT_TX_BYTES else st.pcie_rx_bytes
                    entry.nvmlReturn = SUCCESS
                    entry.valueType = pcie_value_type
                    entry.value.ullVal = int(total) % pcie_modulus  # (an unsigned int is its low 4 bytes)
                    continue
                else:
                    entry.nvmlReturn = ERROR_NOT_SUPPORTED
                    continue
                link = entry.scopeId
                ret = link_returns[gpu][link] if link < NVLINK_MAX_LINKS else nvlink_check(gpu, link)
                entry.nvmlReturn = ret
                if ret != SUCCESS:
                    continue
                entry.valueType = VALUE_TYPE_UNSIGNED_LONG_LONG
                entry.value.ullVal = int(counters[link])
            return SUCCESS

        # ---- health
        @device
        def nvmlDeviceGetTotalEccErrors(gpu: int, error_type: CScalar, counter: CScalar, out: Ref) -> int:
            if not profile.model(gpu).ecc:
                return ERROR_NOT_SUPPORTED
            count = lib.ecc_count(gpu, _int(error_type), _int(counter))
            if count is None:
                return ERROR_NOT_SUPPORTED
            out._obj.value = count
            return SUCCESS

        @device
        def nvmlDeviceGetRemappedRows(gpu: int, corr: Ref, unc: Ref, pending: Ref, failure: Ref) -> int:
            if not profile.model(gpu).row_remap:
                return ERROR_NOT_SUPPORTED
            captured = profile.capture.gpus[gpu].remapped_rows if profile.capture is not None else None
            if captured is not None:  # what the capture's Remapped Rows block counted
                corr._obj.value, unc._obj.value = captured.correctable, captured.uncorrectable
                pending._obj.value, failure._obj.value = int(captured.pending), int(captured.failed)
                return SUCCESS
            bad = gpu in lib.faults.ecc
            corr._obj.value = 0
            unc._obj.value = 1 if bad else 0
            pending._obj.value = 1 if bad else 0
            failure._obj.value = 0
            return SUCCESS

        # ---- the NVSwitch fabric (nvml.h: nvmlGpuFabricInfo_v2/_v3 carry a version word first; v1 does not)
        def fabric(gpu: int, out: Ref, versioned: bool) -> int:
            if not (profile.switch_bus_ids and profile.model(gpu).fabric_info):
                return ERROR_NOT_SUPPORTED  # no NVSwitch fabric on this board
            info = out._obj
            if versioned and (info.version >> 24) not in (2, 3):
                return ERROR_ARGUMENT_VERSION_MISMATCH
            ctypes.memset(ctypes.byref(info.clusterUuid), 0xAB, FABRIC_UUID_LEN)  # one cluster: the board
            info.cliqueId = 1
            info.state = FABRIC_STATE_NOT_STARTED if gpu in lib.faults.fabric_not_started else FABRIC_STATE_COMPLETED
            info.status = SUCCESS
            if versioned:
                info.healthMask = FABRIC_HEALTH_DEGRADED_BW if gpu in lib.faults.fabric_degraded else FABRIC_HEALTHY
                if info.version >> 24 == 3:
                    info.healthSummary = 3 if gpu in lib.faults.fabric_degraded else 1  # LIMITED_CAPACITY / HEALTHY
            return SUCCESS

        @device
        def nvmlDeviceGetGpuFabricInfoV(gpu: int, out: Ref) -> int:
            return fabric(gpu, out, versioned=True)

        @device
        def nvmlDeviceGetGpuFabricInfo(gpu: int, out: Ref) -> int:
            return fabric(gpu, out, versioned=False)

        # ---- events: the XID fault queues its XID once in every event set registered for that GPU
        def nvmlEventSetCreate(out: Ref) -> int:
            with lib._lock:
                number = next(lib._event_set_numbers)  # never reused, as a freed set's handle must stay dead
                lib._event_sets[number] = _EventSet()
            ctypes.c_void_p.from_buffer(out._obj).value = number
            return SUCCESS

        def event_set(handle: Handle) -> Optional[_EventSet]:
            return lib._event_sets.get(_address(handle) or 0)

        @device
        def nvmlDeviceGetSupportedEventTypes(gpu: int, out: Ref) -> int:
            out._obj.value = EVENT_TYPES_SUPPORTED
            return SUCCESS

        @device
        def nvmlDeviceRegisterEvents(gpu: int, types: CScalar, handle: Handle) -> int:
            events = event_set(handle)
            if events is None:
                return ERROR_INVALID_ARGUMENT
            events.registered[gpu] = events.registered.get(gpu, 0) | _int(types)
            return SUCCESS

        def nvmlEventSetWait_v2(handle: Handle, data: Ref, timeout_ms: CScalar) -> int:
            events = event_set(handle)
            if events is None:
                return ERROR_INVALID_ARGUMENT
            elapsed = lib.elapsed()
            for number, (gpu, code, at) in enumerate(lib.faults.xids):
                due = elapsed >= at and events.registered.get(gpu, 0) & EVENT_TYPE_XID_CRITICAL_ERROR
                if due and number not in events.delivered:
                    events.delivered.add(number)
                    out = data._obj  # c_nvmlEventData_t: the device handle is its first field
                    ctypes.c_void_p.from_buffer(out).value = gpu + 1
                    out.eventType, out.eventData = EVENT_TYPE_XID_CRITICAL_ERROR, code
                    return SUCCESS
            return ERROR_TIMEOUT  # gputop only ever asks without waiting (timeout 0)

        def nvmlEventSetFree(handle: Handle) -> int:
            with lib._lock:
                return SUCCESS if lib._event_sets.pop(_address(handle) or 0, None) is not None else ERROR_INVALID_ARGUMENT

        # ---- processes (the two-call protocol: ask for the count, then fill a buffer)
        def running_processes(gpu: int, count: Ref, buffer: Optional[ctypes.Array[Any]]) -> int:
            procs = lib.state(gpu).processes
            capacity = count._obj.value
            count._obj.value = len(procs)
            if not procs:
                return SUCCESS
            if buffer is None or capacity < len(procs):
                return ERROR_INSUFFICIENT_SIZE
            for i, (pid, used) in enumerate(procs):
                buffer[i].pid = pid
                buffer[i].usedGpuMemory = VALUE_NOT_AVAILABLE_ULL if used is None or used < 0 else int(used)
                buffer[i].gpuInstanceId = 0xFFFFFFFF
                buffer[i].computeInstanceId = 0xFFFFFFFF
            return SUCCESS

        # ---- topology and affinity
        def nvmlDeviceGetTopologyCommonAncestor(handle1: Handle, handle2: Handle, out: Ref) -> int:
            a, b = gpu_of(handle1), gpu_of(handle2)
            if a is None or b is None:
                return ERROR_INVALID_ARGUMENT
            if lib.is_lost(a) or lib.is_lost(b):
                return ERROR_GPU_IS_LOST
            if a == b:
                out._obj.value = 0  # INTERNAL
            elif profile.numa_nodes[a] == profile.numa_nodes[b]:
                out._obj.value = TOPOLOGY_LEVELS[profile.same_node_ancestor]
            else:
                out._obj.value = TOPOLOGY_SYSTEM
            return SUCCESS

        @device
        def nvmlDeviceGetCpuAffinity(gpu: int, words: CScalar, out: Ref) -> int:
            words = _int(words)
            mask = out._obj
            for cpu in profile.cpu_affinity(gpu, lib.spec.host_cpus):
                if cpu // 64 < words:
                    mask[cpu // 64] |= 1 << (cpu % 64)
            return SUCCESS

        @device
        def nvmlDeviceGetMemoryAffinity(gpu: int, words: CScalar, out: Ref, scope: CScalar) -> int:
            node = profile.numa_nodes[gpu]
            if node // 64 < _int(words):
                out._obj[node // 64] |= 1 << (node % 64)
            return SUCCESS

        @device
        def nvmlDeviceGetNumaNodeId(gpu: int, out: Ref) -> int:
            out._obj.value = profile.numa_nodes[gpu]
            return SUCCESS

        scope = dict(locals())  # (a comprehension would see its own locals)
        symbols: dict[str, CFunction] = {name: fn for name, fn in scope.items() if name.startswith("nvml") and callable(fn)}
        # same implementation under the old and the new name
        symbols["nvmlDeviceGetCurrentClocksEventReasons"] = device(_named(reasons_now, "EventReasons"))
        symbols["nvmlDeviceGetCurrentClocksThrottleReasons"] = device(_named(reasons_now, "ThrottleReasons"))
        symbols["nvmlDeviceGetSupportedClocksEventReasons"] = device(_named(reasons_supported, "Supported"))
        symbols["nvmlDeviceGetSupportedClocksThrottleReasons"] = device(_named(reasons_supported, "SupportedT"))
        symbols["nvmlDeviceGetComputeRunningProcesses_v3"] = device(_named(running_processes, "v3"))
        symbols["nvmlDeviceGetComputeRunningProcesses_v2"] = device(_named(running_processes, "v2"))
        symbols["nvmlSystemGetCudaDriverVersion_v2"] = _copy(nvmlSystemGetCudaDriverVersion)
        symbols.update(lib._infra_symbols(symbols, device=device, write_str=write_str, nvlink_check=nvlink_check))
        symbols.update(lib._gpm_symbols(device=device))
        return symbols

    # ------------------------------------------------------------ GPM (issue 24)
    def _gpm_symbols(self, *, device: Callable[[DeviceFunction], DeviceFunction]) -> dict[str, CFunction]:
        """GPU Performance Monitoring as NVML serves it: an opaque sample buffer per `nvmlGpmSampleAlloc`, filled by
        `nvmlGpmSampleGet` with the GPU's counters at that moment, and `nvmlGpmMetricsGet` turning two samples of
        one GPU into percentages over the time between them.  A GPU whose model has no GPM (Ada and older) says
        isSupportedDevice 0 and refuses samples with NOT_SUPPORTED, as the real driver does; each requested metric
        the fake does not count gets its own NOT_SUPPORTED in the metrics array."""
        lib = self
        profile = self.profile
        samples = self.gpm_buffers
        numbers = itertools.count(0x6F0001)

        @device
        def nvmlGpmQueryDeviceSupport(gpu: int, out: Ref) -> int:
            support = out._obj
            if support.version != GPM_SUPPORT_VERSION:
                return ERROR_ARGUMENT_VERSION_MISMATCH
            support.isSupportedDevice = 1 if profile.model(gpu).gpm else 0
            return SUCCESS

        def nvmlGpmSampleAlloc(out: Ref) -> int:
            number = next(numbers)
            samples[number] = None
            ctypes.c_void_p.from_buffer(out._obj).value = number
            return SUCCESS

        def nvmlGpmSampleFree(sample: Handle) -> int:
            return SUCCESS if samples.pop(_address(sample) or 0, False) is not False else ERROR_INVALID_ARGUMENT

        @device
        def nvmlGpmSampleGet(gpu: int, sample: Handle) -> int:
            number = _address(sample) or 0
            if number not in samples:
                return ERROR_INVALID_ARGUMENT
            if not profile.model(gpu).gpm:
                return ERROR_NOT_SUPPORTED
            now, counters = lib.gpm_counters(gpu)
            samples[number] = (gpu, now, counters)
            return SUCCESS

        def nvmlGpmMetricsGet(out: Ref) -> int:
            request = _GpmMetricsGet.from_address(ctypes.addressof(out._obj))
            if request.version != GPM_METRICS_GET_VERSION:
                return ERROR_ARGUMENT_VERSION_MISMATCH
            first, second = samples.get(_address(request.sample1) or 0), samples.get(_address(request.sample2) or 0)
            count = int(request.numMetrics)
            if first is None or second is None or first[0] != second[0] or count > GPM_METRIC_MAX:
                return ERROR_INVALID_ARGUMENT
            span = second[1] - first[1]
            if span < 0:  # the second sample must be taken after the first
                return ERROR_INVALID_ARGUMENT
            # two samples at one instant (only a stopped test clock does that): the activity at that instant
            rates = lib.state(first[0]).gpm_rates if span == 0 else None
            for i in range(count):
                entry = request.metrics[i]
                index = _GPM_INDEX.get(int(entry.metricId))
                if index is None:
                    entry.nvmlReturn = ERROR_NOT_SUPPORTED
                    continue
                metric_id, short, long, unit = GPM_METRICS[index]
                share = rates[index] if rates is not None else (second[2][index] - first[2][index]) / span
                entry.value = 100.0 * max(0.0, min(1.0, share))
                entry.nvmlReturn = SUCCESS
                entry.metricInfo.shortName, entry.metricInfo.longName, entry.metricInfo.unit = short, long, unit
            return SUCCESS

        @device
        def nvmlDeviceGetCudaComputeCapability(gpu: int, major: Ref, minor: Ref) -> int:
            capability = profile.model(gpu).compute_capability
            if capability is None:
                return ERROR_NOT_SUPPORTED
            major._obj.value, minor._obj.value = capability
            return SUCCESS

        return {name: fn for name, fn in locals().items() if name.startswith("nvml") and callable(fn)}

    # ------------------------------------------------------------ what `gputop check` reads (issue 16)
    def _infra_symbols(
        self,
        symbols: dict[str, CFunction],
        *,
        device: Callable[[DeviceFunction], DeviceFunction],
        write_str: Callable[[CharBuffer, str, CScalar], int],
        nvlink_check: Callable[[int, int], int],
    ) -> dict[str, CFunction]:
        """Identity, modes and error counters, and the INFRA_FAULTS (`profiles.InfraFaults`) that change them.

        A data-centre card (one with ECC) answers everything; a GeForce card refuses serial, part number,
        ECC mode and applications clocks, as the real ones do.  The faulty counters climb with time."""
        lib = self
        model = self.profile.gpu
        infra = self.faults.infra
        datacentre = model.ecc

        def climbing(base: float, per_s: float) -> int:
            return int(base + per_s * max(0.0, lib.elapsed()))

        @device
        def nvmlDeviceGetSerial(gpu: int, buf: CharBuffer, size: CScalar) -> int:
            if not datacentre:
                return ERROR_NOT_SUPPORTED
            return write_str(buf, f"165492200{gpu:04d}", size)

        @device
        def nvmlDeviceGetVbiosVersion(gpu: int, buf: CharBuffer, size: CScalar) -> int:
            return write_str(buf, "96.00.99.00.01" if datacentre else "95.02.18.80.5F", size)

        @device
        def nvmlDeviceGetBoardPartNumber(gpu: int, buf: CharBuffer, size: CScalar) -> int:
            if not datacentre:
                return ERROR_NOT_SUPPORTED
            return write_str(buf, "692-2G520-0200-000", size)

        @device
        def nvmlDeviceGetPersistenceMode(gpu: int, out: Ref) -> int:
            out._obj.value = 1
            return SUCCESS

        @device
        def nvmlDeviceGetEccMode(gpu: int, current: Ref, pending: Ref) -> int:
            if not datacentre:
                return ERROR_NOT_SUPPORTED
            current._obj.value = pending._obj.value = 1
            return SUCCESS

        def applications_clock(gpu: int, clock_type: CScalar, out: Ref) -> int:
            if not datacentre:
                return ERROR_NOT_SUPPORTED
            kind = _int(clock_type)
            if kind not in (CLOCK_SM, CLOCK_MEM):
                return ERROR_NOT_SUPPORTED
            out._obj.value = model.sm_clock_max_mhz if kind == CLOCK_SM else model.mem_clock_mhz
            return SUCCESS

        @device
        def nvmlDeviceGetPcieReplayCounter(gpu: int, out: Ref) -> int:
            out._obj.value = climbing(3, 40) if gpu in infra.pcie_replay else 0
            return SUCCESS

        @device
        def nvmlDeviceGetNvLinkErrorCounter(gpu: int, link: CScalar, counter: CScalar, out: Ref) -> int:
            link = _int(link)
            ret = nvlink_check(gpu, link)
            if ret == SUCCESS:
                faulty = (gpu, link) in infra.nvlink_crc and _int(counter) == NVLINK_ERROR_DL_CRC_FLIT
                out._obj.value = climbing(12, 25) if faulty else 0
            return ret

        @device
        def nvmlDeviceGetRetiredPages(
            gpu: int, cause: CScalar, count: Ref, addresses: Optional[ctypes.Array[ctypes.c_ulonglong]]
        ) -> int:
            if not datacentre:
                return ERROR_NOT_SUPPORTED
            pages = [0x3F2A1000] if gpu in infra.retired_page and _int(cause) == PAGE_RETIREMENT_DOUBLE_BIT else []
            capacity = count._obj.value
            count._obj.value = len(pages)
            if not pages:
                return SUCCESS
            if addresses is None or capacity < len(pages):
                return ERROR_INSUFFICIENT_SIZE
            for i, address in enumerate(pages):
                addresses[i] = address
            return SUCCESS

        @device
        def nvmlDeviceGetRetiredPagesPendingStatus(gpu: int, out: Ref) -> int:
            if not datacentre:
                return ERROR_NOT_SUPPORTED
            out._obj.value = 1 if gpu in infra.retired_page else 0
            return SUCCESS

        @device
        def nvmlDeviceGetViolationStatus(gpu: int, policy: CScalar, out: Ref) -> int:
            policy = _int(policy)
            share = 0.0  # of the time since start that the clocks were held back for this reason
            if policy == PERF_POLICY_THERMAL and gpu in lib.faults.thermal:
                share = 0.6
            elif policy == PERF_POLICY_POWER and gpu in lib.faults.power_cap:
                share = 0.8
            out._obj.referenceTime = int(lib.clock() * 1e9)
            out._obj.violationTime = int(share * max(0.0, lib.elapsed()) * 1e9)
            return SUCCESS

        # topology=IDX: the GPU's links come up but end nowhere NVML can name, so it meets its peers only
        # through the host bridge (what a GPU left out of the NVSwitch fabric looks like)
        # (every nvmlDevice* symbol answers an nvmlReturn_t)
        remote_type = cast(DeviceFunction, symbols["nvmlDeviceGetNvLinkRemoteDeviceType"])
        remote_pci = cast(DeviceFunction, symbols["nvmlDeviceGetNvLinkRemotePciInfo_v2"])
        common_ancestor = cast(DeviceFunction, symbols["nvmlDeviceGetTopologyCommonAncestor"])

        def odd_gpu(handle: Handle) -> bool:
            return (_address(handle) or 0) - 1 in infra.topology

        @device
        def remote_type_odd(gpu: int, link: CScalar, out: Ref) -> int:
            ret = nvlink_check(gpu, _int(link))
            if ret == SUCCESS:
                out._obj.value = NVLINK_DEVICE_TYPE_GPU
            return ret

        @device
        def remote_pci_odd(gpu: int, link: CScalar, out: Ref) -> int:
            return ERROR_NOT_SUPPORTED

        def nvmlDeviceGetNvLinkRemoteDeviceType(handle: Handle, link: CScalar, out: Ref) -> int:
            return (remote_type_odd if odd_gpu(handle) else remote_type)(handle, link, out)

        def nvmlDeviceGetNvLinkRemotePciInfo_v2(handle: Handle, link: CScalar, out: Ref) -> int:
            return (remote_pci_odd if odd_gpu(handle) else remote_pci)(handle, link, out)

        def nvmlDeviceGetTopologyCommonAncestor(handle1: Handle, handle2: Handle, out: Ref) -> int:
            ret = common_ancestor(handle1, handle2, out)
            if ret == SUCCESS and (odd_gpu(handle1) or odd_gpu(handle2)) and _address(handle1) != _address(handle2):
                out._obj.value = TOPOLOGY_LEVELS["PHB"]
            return ret

        out: dict[str, CFunction] = {name: fn for name, fn in locals().items() if name.startswith("nvml") and callable(fn)}
        out["nvmlDeviceGetApplicationsClock"] = device(_named(applications_clock, "applications"))
        out["nvmlDeviceGetDefaultApplicationsClock"] = device(_named(applications_clock, "default"))
        return out

    # ------------------------------------------------------------ MIG (profiles' `mig`, the `mig=` switch)
    def mig_devices(self, gpu: int) -> Optional[list[_MigDevice]]:
        """GPU `gpu`'s MIG devices in index order; None: MIG mode is off there."""
        if self.profile.capture is not None:  # as captured: its GPU instance ids too
            captured = self.profile.capture.gpus[gpu].mig_instances
            return None if captured is None else [_MigDevice(gpu, i, p, gi) for i, (gi, p) in enumerate(captured)]
        layout = self.profile.mig_instances(gpu)
        if layout is None:
            return None
        taken: set[int] = set()
        devices = []
        for index, mig in enumerate(layout):
            gi = _MIG_FIRST_GI_ID.get(mig.slices, 0)
            while gi in taken:
                gi += 1
            taken.add(gi)
            devices.append(_MigDevice(gpu, index, mig, gi))
        return devices

    def mig_processes(self, device: _MigDevice) -> list[tuple[int, Optional[int]]]:
        """(pid, used bytes) on one MIG device: the load model's optional `mig_processes(gpu, index)`."""
        ask = getattr(self.load, "mig_processes", None)
        return list(ask(device.gpu, device.index)) if ask is not None else []

    def mig_memory_used(self, device: _MigDevice) -> int:
        """Its processes' memory, else the instance's share of what the load puts on the whole GPU."""
        total = device.profile.memory_mib * MIB
        procs = self.mig_processes(device)
        if procs:
            used = MIG_INSTANCE_IDLE_USED + sum(max(0, u or 0) for _, u in procs)
        else:
            model = self.profile.model(device.gpu)
            share = self.state(device.gpu).memory_used / max(1, model.memory_total - model.memory_reserved)
            used = max(MIG_INSTANCE_IDLE_USED, int(total * share))
        return min(used, total)

    def _mig_symbols(self, symbols: dict[str, CFunction]) -> dict[str, CFunction]:
        """NVML's MIG calls, and the calls that answer differently under MIG: on a MIG device handle name, UUID,
        memory and processes are the instance's; on a MIG-enabled GPU memory is its instances' and processes
        carry their instance ids; utilization is NOT_SUPPORTED on both (nvmlDeviceGetUtilizationRates: "On
        MIG-enabled GPUs, querying device utilization rates is not currently supported")."""
        lib = self
        profile = self.profile
        n = profile.gpu_count
        layouts = [self.mig_devices(gpu) for gpu in range(n)]

        def parent(handle: Handle) -> Optional[int]:
            address = _address(handle)
            return address - 1 if address and 1 <= address <= n else None

        def mig_device(handle: Handle) -> Optional[_MigDevice]:
            offset = (_address(handle) or 0) - MIG_HANDLE_BASE
            gpu, index = divmod(offset, MIG_HANDLE_STRIDE)
            devices = layouts[gpu] if offset >= 0 and gpu < n else None
            return devices[index] if devices is not None and index < len(devices) else None

        def set_handle(out: Ref, address: int) -> int:
            ctypes.c_void_p.from_buffer(out._obj).value = address
            return SUCCESS

        def nvmlDeviceGetMigMode(handle: Handle, current: Ref, pending: Ref) -> int:
            gpu = parent(handle)
            if gpu is None:
                return ERROR_NOT_SUPPORTED if mig_device(handle) else ERROR_INVALID_ARGUMENT
            if lib.is_lost(gpu):
                return ERROR_GPU_IS_LOST
            if not profile.model(gpu).mig_profiles and layouts[gpu] is None:  # (a capture's MIG GPU has no table)
                return ERROR_NOT_SUPPORTED
            current._obj.value = pending._obj.value = 1 if layouts[gpu] is not None else 0
            return SUCCESS

        def nvmlDeviceGetMaxMigDeviceCount(handle: Handle, out: Ref) -> int:
            gpu = parent(handle)
            if gpu is None:
                return ERROR_NOT_SUPPORTED if mig_device(handle) else ERROR_INVALID_ARGUMENT
            out._obj.value = MIG_MAX_DEVICES if layouts[gpu] is not None else 0
            return SUCCESS

        def nvmlDeviceGetMigDeviceHandleByIndex(handle: Handle, index: CScalar, out: Ref) -> int:
            gpu, number = parent(handle), _int(index)
            if gpu is None or not 0 <= number < MIG_MAX_DEVICES:
                return ERROR_INVALID_ARGUMENT
            devices = layouts[gpu]
            if devices is None:
                return ERROR_NOT_SUPPORTED
            if number >= len(devices):
                return ERROR_NOT_FOUND  # an index no instance holds
            return set_handle(out, MIG_HANDLE_BASE + gpu * MIG_HANDLE_STRIDE + number)

        def nvmlDeviceIsMigDeviceHandle(handle: Handle, out: Ref) -> int:
            is_mig = mig_device(handle) is not None
            if not is_mig and parent(handle) is None:
                return ERROR_INVALID_ARGUMENT
            out._obj.value = 1 if is_mig else 0
            return SUCCESS

        def instance_id(which: str) -> CFunction:
            def call(handle: Handle, out: Ref) -> int:
                device = mig_device(handle)
                if device is None:
                    return ERROR_NOT_SUPPORTED if parent(handle) is not None else ERROR_INVALID_ARGUMENT
                out._obj.value = device.gpu_instance_id if which == "gpu" else 0  # one compute instance each
                return SUCCESS

            call.__name__ = f"instance_id_{which}"
            return call

        def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle: Handle, out: Ref) -> int:
            device = mig_device(handle)
            return set_handle(out, device.gpu + 1) if device is not None else ERROR_INVALID_ARGUMENT

        def nvmlDeviceGetAttributes_v2(handle: Handle, out: Ref) -> int:
            device = mig_device(handle)
            gpu = parent(handle)
            if device is None and gpu is None:
                return ERROR_INVALID_ARGUMENT
            attrs = out._obj
            if device is not None:
                mig = device.profile
                attrs.multiprocessorCount, attrs.memorySizeMB = mig.multiprocessors, mig.memory_mib
                attrs.gpuInstanceSliceCount = attrs.computeInstanceSliceCount = mig.slices
            else:
                return ERROR_NOT_SUPPORTED  # (the whole GPU's attributes: not simulated)
            return SUCCESS

        def with_mig(name: str, on_mig: Callable[..., int], on_mig_gpu: Optional[Callable[..., int]] = None) -> CFunction:
            """`symbols[name]`, answering `on_mig` for a MIG device handle and `on_mig_gpu` (if given) for a
            MIG-enabled GPU."""
            whole = symbols[name]
            if all(layout is None for layout in layouts):
                return whole  # no MIG device on this machine: the wrapper would always answer as `whole` does

            def call(handle: Handle, *args: Any) -> Any:
                device = mig_device(handle)
                if device is not None:
                    return on_mig(device, *args)
                gpu = parent(handle)
                if on_mig_gpu is not None and gpu is not None and layouts[gpu] is not None and not lib.is_lost(gpu):
                    return on_mig_gpu(gpu, *args)
                return whole(handle, *args)

            call.__name__ = f"{name}_mig"
            return call

        def not_supported(*args: object) -> int:
            return ERROR_NOT_SUPPORTED

        def name(device: _MigDevice, buf: CharBuffer, size: CScalar) -> int:
            return _write(buf, f"{profile.model(device.gpu).name} MIG {device.profile.name}", size)

        def uuid(device: _MigDevice, buf: CharBuffer, size: CScalar) -> int:
            tag = sum(ord(c) for c in profile.name) & 0xFFFF
            gpu, i = device.gpu, device.index
            return _write(
                buf, f"MIG-{tag:04x}{gpu:02x}{i:02x}-{gpu:04x}-5a1e-8c{i:02x}-{gpu * 7919 + i * 104729 + tag:012x}", size
            )

        def fill_memory(mem: Any, total: int, used: int, reserved: int, v2: bool) -> int:
            if v2:
                if mem.version != MEMORY_V2_VERSION:
                    return ERROR_ARGUMENT_VERSION_MISMATCH
                mem.reserved = reserved
                mem.used, mem.free = used, total - reserved - used
            else:
                mem.used, mem.free = used + reserved, total - reserved - used
            mem.total = total
            return SUCCESS

        def memory(v2: bool) -> tuple[Callable[..., int], Callable[..., int]]:
            def on_mig(device: _MigDevice, out: Ref) -> int:
                return fill_memory(out._obj, device.profile.memory_mib * MIB, lib.mig_memory_used(device), 0, v2)

            def on_mig_gpu(gpu: int, out: Ref) -> int:  # the whole card: its instances' memory together
                card = profile.model(gpu)
                used = sum(lib.mig_memory_used(d) for d in layouts[gpu] or ())
                return fill_memory(out._obj, card.memory_total, used, card.memory_reserved, v2)

            return on_mig, on_mig_gpu

        def fill_processes(procs: list[tuple[int, Optional[int], _MigDevice]], count: Ref, buffer: Any) -> int:
            capacity = count._obj.value
            count._obj.value = len(procs)
            if not procs:
                return SUCCESS
            if buffer is None or capacity < len(procs):
                return ERROR_INSUFFICIENT_SIZE
            for i, (pid, used, device) in enumerate(procs):
                buffer[i].pid = pid
                buffer[i].usedGpuMemory = VALUE_NOT_AVAILABLE_ULL if used is None or used < 0 else int(used)
                buffer[i].gpuInstanceId = device.gpu_instance_id
                buffer[i].computeInstanceId = 0
            return SUCCESS

        def processes_on_mig(device: _MigDevice, count: Ref, buffer: Any) -> int:
            return fill_processes([(pid, used, device) for pid, used in lib.mig_processes(device)], count, buffer)

        def processes_on_mig_gpu(gpu: int, count: Ref, buffer: Any) -> int:  # every instance's, with its ids
            procs = [(pid, used, d) for d in layouts[gpu] or () for pid, used in lib.mig_processes(d)]
            return fill_processes(procs, count, buffer)

        out: dict[str, CFunction] = {name: fn for name, fn in locals().items() if name.startswith("nvml") and callable(fn)}
        out["nvmlDeviceGetGpuInstanceId"] = instance_id("gpu")
        out["nvmlDeviceGetComputeInstanceId"] = instance_id("compute")
        wrapped: dict[str, tuple[Callable[..., int], Optional[Callable[..., int]]]] = {
            "nvmlDeviceGetName": (name, None),
            "nvmlDeviceGetUUID": (uuid, None),
            "nvmlDeviceGetUtilizationRates": (not_supported, not_supported),
            "nvmlDeviceGetMemoryInfo": memory(False),
            "nvmlDeviceGetMemoryInfo_v2": memory(True),
            "nvmlDeviceGetComputeRunningProcesses_v2": (processes_on_mig, processes_on_mig_gpu),
            "nvmlDeviceGetComputeRunningProcesses_v3": (processes_on_mig, processes_on_mig_gpu),
        }
        for key, (on_mig, on_mig_gpu) in wrapped.items():
            if key in symbols:  # (an old driver lacks the _v2/_v3 ones)
                out[key] = with_mig(key, on_mig, on_mig_gpu)
        return out

    # ------------------------------------------------------------ a bug report's captures (gputop.sim.capture)
    def _capture_symbols(self, symbols: dict[str, CFunction]) -> dict[str, CFunction]:
        """What `Profile.capture` says in place of the profile's made-up layout: every GPU pair's level, each
        link's far end, the affinity lists and NUMA ids as captured, and NOT_SUPPORTED wherever the capture
        reads N/A (or holds nothing: a capture without `nvidia-smi topo -m` does not know the topology)."""
        profile = self.profile
        board = profile.capture
        assert board is not None
        n = profile.gpu_count

        def fill_pci(info: Any, bus_id: str) -> None:
            domain, bus, rest = bus_id.split(":")
            info.busId = bus_id.encode()
            info.busIdLegacy = f"{int(domain, 16):04x}:{bus}:{rest}".encode()
            info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)

        def index(handle: Handle) -> Optional[int]:
            address = _address(handle)
            return address - 1 if address and 1 <= address <= n else None

        def set_bits(mask: Any, ids: tuple[int, ...], words: CScalar) -> None:
            for i in ids:
                if i // 64 < _int(words):
                    mask[i // 64] |= 1 << (i % 64)

        def nvmlDeviceGetTopologyCommonAncestor(handle1: Handle, handle2: Handle, out: Any) -> int:
            a, b = index(handle1), index(handle2)
            if a is None or b is None:
                return ERROR_INVALID_ARGUMENT
            if a == b:
                out._obj.value = 0
                return SUCCESS
            cell = board.levels[a][b] if board.levels else "N/A"
            if cell.startswith("NV"):  # topo -m shows the links, not the PCIe path under them: the NUMA split
                cell = "NODE" if profile.numa_nodes[a] == profile.numa_nodes[b] else "SYS"
            if cell not in TOPOLOGY_LEVELS:
                return ERROR_NOT_SUPPORTED
            out._obj.value = TOPOLOGY_LEVELS[cell]
            return SUCCESS

        def nvmlDeviceGetCpuAffinity(handle: Handle, words: CScalar, out: Any) -> int:
            gpu = index(handle)
            cpus = board.gpus[gpu].cpu_affinity if gpu is not None else None
            if cpus is None:
                return ERROR_NOT_SUPPORTED if gpu is not None else ERROR_INVALID_ARGUMENT
            set_bits(out._obj, cpus, words)
            return SUCCESS

        def nvmlDeviceGetMemoryAffinity(handle: Handle, words: CScalar, out: Any, scope: CScalar) -> int:
            gpu = index(handle)
            nodes = board.gpus[gpu].numa_affinity if gpu is not None else None
            if nodes is None:
                return ERROR_NOT_SUPPORTED if gpu is not None else ERROR_INVALID_ARGUMENT
            set_bits(out._obj, nodes, words)
            return SUCCESS

        def nvmlDeviceGetNumaNodeId(handle: Handle, out: Any) -> int:
            gpu = index(handle)
            node = board.gpus[gpu].numa_id if gpu is not None else None
            if node is None:
                return ERROR_NOT_SUPPORTED if gpu is not None else ERROR_INVALID_ARGUMENT
            out._obj.value = node
            return SUCCESS

        def remote(handle: Handle, link: CScalar) -> tuple[int, Optional[int]]:
            """(NVML return, the GPU at the far end or None for an NVSwitch)."""
            gpu, number = index(handle), _int(link)
            if gpu is None:
                return ERROR_INVALID_ARGUMENT, None
            links = board.gpus[gpu].nvlink_remote
            return (SUCCESS, links[number]) if 0 <= number < len(links) else (ERROR_NOT_SUPPORTED, None)

        def nvmlDeviceGetNvLinkRemotePciInfo_v2(handle: Handle, link: CScalar, out: Any) -> int:
            ret, peer = remote(handle, link)
            if ret == SUCCESS and peer is None and not profile.switch_bus_ids:
                return ERROR_NOT_SUPPORTED  # a link nvlink -s lists and topo -m places nowhere
            if ret == SUCCESS:
                switch = profile.switch_bus_ids[_int(link) % len(profile.switch_bus_ids)] if peer is None else ""
                fill_pci(out._obj, profile.bus_ids[peer] if peer is not None else switch)
            return ret

        def nvmlDeviceGetNvLinkRemoteDeviceType(handle: Handle, link: CScalar, out: Any) -> int:
            ret, peer = remote(handle, link)
            if ret == SUCCESS and peer is None and not profile.switch_bus_ids:
                return ERROR_NOT_SUPPORTED
            if ret == SUCCESS:
                out._obj.value = NVLINK_DEVICE_TYPE_GPU if peer is not None else NVLINK_DEVICE_TYPE_SWITCH
            return ret

        out = {name: fn for name, fn in locals().items() if name.startswith("nvml") and callable(fn)}
        # the capture's N/A: those GPUs' calls answer NOT_SUPPORTED
        for name in sorted(set().union(*(gpu.refused for gpu in board.gpus))):
            if name in symbols:
                out[name] = _refusing(symbols[name], frozenset(i for i, g in enumerate(board.gpus) if name in g.refused), index)
        return out


def _refusing(fn: CFunction, gpus: frozenset[int], index: "Callable[[Handle], Optional[int]]") -> CFunction:
    """`fn`, answering NOT_SUPPORTED for `gpus` (a distinct function object: pynvml sets restype on it)."""

    def call(handle: "Handle", *args: object) -> Any:
        return ERROR_NOT_SUPPORTED if index(handle) in gpus else fn(handle, *args)

    call.__name__ = f"{getattr(fn, '__name__', 'nvml')}_refusing"
    return call


def _named(fn: _F, suffix: str) -> _F:
    """A distinct function object per symbol: pynvml sets attributes (restype) on what it gets."""

    def call(*args: object) -> object:
        return fn(*args)

    call.__name__ = f"{fn.__name__}_{suffix}"
    return cast(_F, call)  # (it takes and returns what `fn` does)


def _copy(fn: CFunction) -> CFunction:
    return _named(fn, "copy")
