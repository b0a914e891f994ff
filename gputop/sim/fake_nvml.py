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
works the GPU), computed in gputop/sim/gpu_physics.py: power and temperature follow that load
(utilization by default), clocks follow utilization; PCIe and NVLink traffic scale with it; the NVLink
counters and the PCIe byte counters (Hopper profiles only, see `GpuModel.pcie_byte_counters`) are
cumulative and only ever grow (a 32-bit PCIe counter wraps).  Every reading is a function of ``clock()``,
so a controlled clock gives deterministic readings.

Each C function is a small module-level function, registered under its NVML name(s) (see "the symbol
registry" below) and bound to one library when it is built; this module's symbol functions only translate
between the C interface and the library's state.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from gputop.sim.gpu_physics import NVLINK_DOWN_LINKS, GpuState, advance, count
from gputop.sim.load import LoadModel
from gputop.sim.profiles import MIB, MIG_MAX_DEVICES, OLD_DRIVER_MISSING_SYMBOLS, CapturedBoard, MigProfile, SimSpec

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


class ManualClock:
    """A clock that only moves when told to: pass it as `clock` for deterministic simulated readings.  Given to
    `SimulatedMachine(clock=...)` it is the one clock of the whole machine: the fake NVML, every reader's cadence
    and every stamp a history records run on it (gputop/clock.py)."""

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


# ---------------------------------------------------------------- the symbol registry
# Every C function the fake serves is a small module-level function registered here under its NVML name(s), and
# bound to one library when it is built (`FakeNvmlLibrary._bind`): a device symbol takes (lib, gpu, *args), the
# handle resolved and a lost GPU answered for it; a library symbol takes (lib, *args) as pynvml passes them.
DeviceSymbol = Callable[..., int]  # (lib, gpu index, *the C arguments after the handle) -> nvmlReturn_t
LibrarySymbol = Callable[..., object]  # (lib, *the C arguments) -> nvmlReturn_t (nvmlErrorString: bytes)
_DEVICE_SYMBOLS: dict[str, DeviceSymbol] = {}
_LIBRARY_SYMBOLS: dict[str, LibrarySymbol] = {}
_MIG_SYMBOLS: dict[str, LibrarySymbol] = {}  # NVML's MIG calls (library symbols: a handle may be a MIG device's)
_CAPTURE_SYMBOLS: dict[str, LibrarySymbol] = {}  # what a bug report's capture serves in place of the profile's
_S = TypeVar("_S", bound=Callable[..., object])


def _registrar(table: dict[str, Any], *names: str) -> Callable[[_S], _S]:
    def register(fn: _S) -> _S:
        for name in names or (fn.__name__,):
            table[name] = fn
        return fn

    return register


def _device(fn: _S) -> _S:
    return _registrar(_DEVICE_SYMBOLS)(fn)


def _device_as(*names: str) -> Callable[[_S], _S]:
    """One implementation under several names (an old and a new one, _v2 and _v3)."""
    return _registrar(_DEVICE_SYMBOLS, *names)


def _library(fn: _S) -> _S:
    return _registrar(_LIBRARY_SYMBOLS)(fn)


def _library_as(*names: str) -> Callable[[_S], _S]:
    return _registrar(_LIBRARY_SYMBOLS, *names)


def _mig(fn: _S) -> _S:
    return _registrar(_MIG_SYMBOLS)(fn)


def _captured(name: str) -> Callable[[_S], _S]:
    return _registrar(_CAPTURE_SYMBOLS, name)


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
        self.gpm_numbers = itertools.count(0x6F0001)
        self._states = [GpuState.with_links(self.profile.gpu.nvlink_links) for _ in range(self.profile.gpu_count)]
        # the field-values call's answers that the profile fixes: per GPU and link, and for the PCIe byte counters
        self.link_returns = [
            tuple(_nvlink_check(self, gpu, link) for link in range(NVLINK_MAX_LINKS)) for gpu in range(self.profile.gpu_count)
        ]
        self.pcie_counters = self.profile.gpu.pcie_byte_counters and not self.faults.old_driver  # (they came with R555)
        self.pcie_modulus = 1 << pcie_counter_bits
        self.pcie_value_type = VALUE_TYPE_UNSIGNED_INT if pcie_counter_bits <= 32 else VALUE_TYPE_UNSIGNED_LONG_LONG
        self.mig_layouts = [self.mig_devices(gpu) for gpu in range(self.profile.gpu_count)]
        self._symbols = self._bind_symbols()

    def _bind_symbols(self) -> dict[str, CFunction]:
        """The registered symbols bound to this library: the base set (less what an old driver lacks), the MIG
        layer (a card without MIG answers NOT_SUPPORTED, as a real one), and a capture's answers over them."""
        symbols = {name: self._bind_device(fn, name) for name, fn in _DEVICE_SYMBOLS.items()}
        symbols.update((name, self._bind(fn, name)) for name, fn in _LIBRARY_SYMBOLS.items())
        if self.faults.old_driver:
            for name in OLD_DRIVER_MISSING_SYMBOLS:
                symbols.pop(name, None)
        symbols.update((name, self._bind(fn, name)) for name, fn in _MIG_SYMBOLS.items())
        if any(layout is not None for layout in self.mig_layouts):  # else the wrapper would always answer as the GPU
            for name, (on_mig, on_mig_gpu) in _MIG_ANSWERS.items():
                if name in symbols:  # (an old driver lacks the _v2/_v3 ones)
                    symbols[name] = _with_mig(self, name, symbols[name], on_mig, on_mig_gpu)
        capture = self.profile.capture
        if capture is not None:
            captured = {name: self._bind(fn, name) for name, fn in _CAPTURE_SYMBOLS.items()}
            # the capture's N/A: those GPUs' calls answer NOT_SUPPORTED
            for name in sorted(set().union(*(gpu.refused for gpu in capture.gpus))):
                if name in symbols:
                    refused = frozenset(i for i, g in enumerate(capture.gpus) if name in g.refused)
                    captured[name] = _refusing(symbols[name], refused, self.gpu_of)
            symbols.update(captured)
            for name in capture.missing_symbols:
                symbols.pop(name, None)
        return symbols

    def _bind_device(self, fn: DeviceSymbol, name: str) -> CFunction:
        """`fn` as the C function: the handle resolved to the GPU's index, GPU_IS_LOST for a lost GPU (a distinct
        function object per symbol: pynvml sets restype on what it gets)."""
        lib, count = self, self.profile.gpu_count

        def call(handle: Handle, *args: object) -> int:
            address = _address(handle)
            if not address or not 1 <= address <= count:
                return ERROR_INVALID_ARGUMENT
            if lib.is_lost(address - 1):
                return ERROR_GPU_IS_LOST
            return fn(lib, address - 1, *args)

        call.__name__ = name
        return call

    def _bind(self, fn: LibrarySymbol, name: str) -> CFunction:
        lib = self

        def call(*args: object) -> object:
            return fn(lib, *args)

        call.__name__ = name
        return call

    # pynvml asks for symbols by attribute; a missing one must be AttributeError (-> FunctionNotFound)
    def __getattr__(self, name: str) -> CFunction:
        symbols: dict[str, CFunction] = self.__dict__.get("_symbols", {})
        if name in symbols:
            return symbols[name]
        raise AttributeError(f"fake NVML library has no symbol {name}")

    def symbol_names(self) -> list[str]:
        return sorted(self._symbols)

    def gpu_of(self, handle: Handle) -> Optional[int]:
        """A GPU's handle -> its index; None for anything else (a MIG device's handle, a bad one)."""
        address = _address(handle)
        return address - 1 if address and 1 <= address <= self.profile.gpu_count else None

    # ------------------------------------------------------------ simulation (gputop/sim/gpu_physics.py)
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

    def state(self, gpu: int) -> GpuState:
        """The GPU's readings now; recomputed once per quantum, counters integrated over time."""
        now = self.clock()
        st = self._states[gpu]
        if 0 <= now - st.time < STATE_QUANTUM_S:
            return st
        with self._lock:
            if 0 <= now - st.time < STATE_QUANTUM_S:
                return st
            advance(st, self.profile.model(gpu), gpu, self.faults, self.load, now, functools.partial(self.link_active, gpu))
        return st

    def counters(self, gpu: int) -> tuple[GpuState, float]:
        """The GPU's state with its cumulative counters counted up to now, and now."""
        st = self.state(gpu)
        now = self.clock()
        with self._lock:
            count(st, now)
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

    # ------------------------------------------------------------ MIG
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


# ---------------------------------------------------------------- the C functions
# ---- system
@_library
def nvmlInitWithFlags(lib: FakeNvmlLibrary, flags: CScalar) -> int:
    return SUCCESS


@_library
def nvmlInit_v2(lib: FakeNvmlLibrary) -> int:
    return SUCCESS


@_library
def nvmlShutdown(lib: FakeNvmlLibrary) -> int:
    return SUCCESS


@_library
def nvmlErrorString(lib: FakeNvmlLibrary, result: CScalar) -> bytes:
    return _ERROR_STRINGS.get(_int(result), b"Unknown Error")


@_library
def nvmlSystemGetDriverVersion(lib: FakeNvmlLibrary, buf: CharBuffer, size: CScalar) -> int:
    return _write(buf, lib.profile.driver_version, size)


@_library
def nvmlSystemGetNVMLVersion(lib: FakeNvmlLibrary, buf: CharBuffer, size: CScalar) -> int:
    return _write(buf, lib.profile.nvml_version, size)


@_library_as("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
def nvmlSystemGetCudaDriverVersion(lib: FakeNvmlLibrary, out: Ref) -> int:
    out._obj.value = lib.profile.cuda_version
    return SUCCESS


@_library
def nvmlDeviceGetCount_v2(lib: FakeNvmlLibrary, out: Ref) -> int:
    out._obj.value = lib.profile.gpu_count
    return SUCCESS


@_library
def nvmlDeviceGetHandleByIndex_v2(lib: FakeNvmlLibrary, index: CScalar, out: Ref) -> int:
    index = _int(index)
    if not 0 <= index < lib.profile.gpu_count:
        return ERROR_INVALID_ARGUMENT
    ctypes.c_void_p.from_buffer(out._obj).value = index + 1
    return SUCCESS


# ---- identity
@_device
def nvmlDeviceGetName(lib: FakeNvmlLibrary, gpu: int, buf: CharBuffer, size: CScalar) -> int:
    return _write(buf, lib.profile.model(gpu).name, size)


@_device
def nvmlDeviceGetUUID(lib: FakeNvmlLibrary, gpu: int, buf: CharBuffer, size: CScalar) -> int:
    # stable, lib.profile-specific, looks like a real one
    tag = sum(ord(c) for c in lib.profile.name) & 0xFFFF
    return _write(buf, f"GPU-{tag:04x}5e1d-{gpu:04x}-4c0d-9a1e-{gpu * 7919 + tag:012x}", size)


def _fill_pci(lib: FakeNvmlLibrary, info: Any, bus_id: str) -> None:  # info: a c_nvmlPciInfo_t
    domain, bus, rest = bus_id.split(":")
    dev = rest.split(".")[0]
    info.busId = bus_id.encode()
    info.busIdLegacy = f"{int(domain, 16):04x}:{bus}:{rest}".encode()
    info.domain = int(domain, 16)
    info.bus = int(bus, 16)
    info.device = int(dev, 16)
    info.pciDeviceId = 0x233010DE if lib.profile.gpu.nvlink_links else 0x268410DE
    info.pciSubSystemId = 0x16C110DE


@_device
def nvmlDeviceGetPciInfo_v3(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    _fill_pci(lib, out._obj, lib.profile.bus_ids[gpu])
    return SUCCESS


# ---- readings
@_device
def nvmlDeviceGetUtilizationRates(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    st = lib.state(gpu)
    out._obj.gpu = int(round(st.utilization))
    out._obj.memory = int(round(st.memory_utilization))
    return SUCCESS


@_device
def nvmlDeviceGetMemoryInfo(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    # v1: `used` includes the reserved memory
    st, card = lib.state(gpu), lib.profile.model(gpu)
    mem = out._obj
    mem.total = card.memory_total
    mem.used = st.memory_used + card.memory_reserved
    mem.free = card.memory_total - mem.used
    return SUCCESS


@_device
def nvmlDeviceGetMemoryInfo_v2(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    mem = out._obj
    if mem.version != MEMORY_V2_VERSION:
        return ERROR_ARGUMENT_VERSION_MISMATCH
    st, card = lib.state(gpu), lib.profile.model(gpu)
    mem.total = card.memory_total
    mem.reserved = card.memory_reserved
    mem.used = st.memory_used
    mem.free = card.memory_total - card.memory_reserved - st.memory_used
    return SUCCESS


@_device
def nvmlDeviceGetTemperature(lib: FakeNvmlLibrary, gpu: int, sensor: CScalar, out: Ref) -> int:
    if _int(sensor) != TEMPERATURE_GPU:
        return ERROR_NOT_SUPPORTED
    out._obj.value = lib.state(gpu).temperature
    return SUCCESS


@_device
def nvmlDeviceGetTemperatureV(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    temp = out._obj
    if temp.version != TEMPERATURE_V1_VERSION:
        return ERROR_ARGUMENT_VERSION_MISMATCH
    if temp.sensorType != TEMPERATURE_GPU:
        return ERROR_NOT_SUPPORTED
    temp.temperature = lib.state(gpu).temperature
    return SUCCESS


@_device
def nvmlDeviceGetPowerUsage(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = lib.state(gpu).power_mw
    return SUCCESS


@_device
def nvmlDeviceGetEnforcedPowerLimit(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = lib.state(gpu).power_limit_mw
    return SUCCESS


@_device
def nvmlDeviceGetClockInfo(lib: FakeNvmlLibrary, gpu: int, clock_type: CScalar, out: Ref) -> int:
    kind = _int(clock_type)
    st = lib.state(gpu)
    if kind == CLOCK_SM:
        out._obj.value = st.sm_clock
    elif kind == CLOCK_MEM:
        out._obj.value = st.mem_clock
    else:
        return ERROR_NOT_SUPPORTED
    return SUCCESS


@_device
def nvmlDeviceGetCurrPcieLinkGeneration(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = lib.state(gpu).pcie_gen
    return SUCCESS


@_device
def nvmlDeviceGetCurrPcieLinkWidth(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = lib.state(gpu).pcie_width
    return SUCCESS


@_device
def nvmlDeviceGetMaxPcieLinkGeneration(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = lib.profile.model(gpu).pcie_gen_max
    return SUCCESS


@_device
def nvmlDeviceGetMaxPcieLinkWidth(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = lib.profile.model(gpu).pcie_width_max
    return SUCCESS


@_device
def nvmlDeviceGetPcieThroughput(lib: FakeNvmlLibrary, gpu: int, counter: CScalar, out: Ref) -> int:
    kind = _int(counter)
    if kind not in (PCIE_UTIL_TX_BYTES, PCIE_UTIL_RX_BYTES):
        return ERROR_INVALID_ARGUMENT
    if lib.pcie_latency_s > 0:
        time.sleep(lib.pcie_latency_s)  # the real call samples the link for ~20 ms
    st = lib.state(gpu)
    out._obj.value = st.pcie_tx_kbps if kind == PCIE_UTIL_TX_BYTES else st.pcie_rx_kbps
    return SUCCESS


@_device_as("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
def reasons_now(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = lib.state(gpu).reasons
    return SUCCESS


@_device_as("nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons")
def reasons_supported(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = SUPPORTED_REASONS
    return SUCCESS


# ---- NVLink
def _nvlink_check(lib: FakeNvmlLibrary, gpu: int, link: int) -> int:
    links = lib.profile.model(gpu).nvlink_links
    if not links:
        return ERROR_NOT_SUPPORTED
    if not 0 <= link < NVLINK_MAX_LINKS:
        return ERROR_INVALID_ARGUMENT
    if link >= links:
        return ERROR_NOT_SUPPORTED
    return SUCCESS


@_device
def nvmlDeviceGetNvLinkState(lib: FakeNvmlLibrary, gpu: int, link: CScalar, out: Ref) -> int:
    link = _int(link)
    ret = _nvlink_check(lib, gpu, link)
    if ret == SUCCESS:
        out._obj.value = 1 if lib.link_active(gpu, link) else 0
    return ret


@_device
def nvmlDeviceGetNvLinkRemotePciInfo_v2(lib: FakeNvmlLibrary, gpu: int, link: CScalar, out: Ref) -> int:
    if gpu in lib.faults.infra.topology:
        return ERROR_NOT_SUPPORTED  # topology=IDX: its links end nowhere NVML can name
    link = _int(link)
    ret = _nvlink_check(lib, gpu, link)
    if ret == SUCCESS:
        switches = lib.profile.switch_bus_ids
        _fill_pci(lib, out._obj, switches[link % len(switches)])
    return ret


@_device
def nvmlDeviceGetNvLinkRemoteDeviceType(lib: FakeNvmlLibrary, gpu: int, link: CScalar, out: Ref) -> int:
    link = _int(link)
    ret = _nvlink_check(lib, gpu, link)
    if ret == SUCCESS:
        # topology=IDX: the GPU's links come up but end nowhere NVML can name (a GPU left out of the fabric)
        out._obj.value = NVLINK_DEVICE_TYPE_GPU if gpu in lib.faults.infra.topology else NVLINK_DEVICE_TYPE_SWITCH
    return ret


@_device
def nvmlDeviceGetFieldValues(lib: FakeNvmlLibrary, gpu: int, count: CScalar, out: Ref) -> int:
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
            if not lib.pcie_counters:
                entry.nvmlReturn = ERROR_NOT_SUPPORTED
                continue
            total = st.pcie_tx_bytes if field_id == FI_DEV_PCIE_COUNT_TX_BYTES else st.pcie_rx_bytes
            entry.nvmlReturn = SUCCESS
            entry.valueType = lib.pcie_value_type
            entry.value.ullVal = int(total) % lib.pcie_modulus  # (an unsigned int is its low 4 bytes)
            continue
        else:
            entry.nvmlReturn = ERROR_NOT_SUPPORTED
            continue
        link = entry.scopeId
        ret = lib.link_returns[gpu][link] if link < NVLINK_MAX_LINKS else _nvlink_check(lib, gpu, link)
        entry.nvmlReturn = ret
        if ret != SUCCESS:
            continue
        entry.valueType = VALUE_TYPE_UNSIGNED_LONG_LONG
        entry.value.ullVal = int(counters[link])
    return SUCCESS


# ---- health
@_device
def nvmlDeviceGetTotalEccErrors(lib: FakeNvmlLibrary, gpu: int, error_type: CScalar, counter: CScalar, out: Ref) -> int:
    if not lib.profile.model(gpu).ecc:
        return ERROR_NOT_SUPPORTED
    count = lib.ecc_count(gpu, _int(error_type), _int(counter))
    if count is None:
        return ERROR_NOT_SUPPORTED
    out._obj.value = count
    return SUCCESS


@_device
def nvmlDeviceGetRemappedRows(lib: FakeNvmlLibrary, gpu: int, corr: Ref, unc: Ref, pending: Ref, failure: Ref) -> int:
    if not lib.profile.model(gpu).row_remap:
        return ERROR_NOT_SUPPORTED
    captured = lib.profile.capture.gpus[gpu].remapped_rows if lib.profile.capture is not None else None
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
def _fabric(lib: FakeNvmlLibrary, gpu: int, out: Ref, versioned: bool) -> int:
    if not (lib.profile.switch_bus_ids and lib.profile.model(gpu).fabric_info):
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


@_device
def nvmlDeviceGetGpuFabricInfoV(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    return _fabric(lib, gpu, out, versioned=True)


@_device
def nvmlDeviceGetGpuFabricInfo(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    return _fabric(lib, gpu, out, versioned=False)


# ---- events: the XID fault queues its XID once in every event set registered for that GPU
@_library
def nvmlEventSetCreate(lib: FakeNvmlLibrary, out: Ref) -> int:
    with lib._lock:
        number = next(lib._event_set_numbers)  # never reused, as a freed set's handle must stay dead
        lib._event_sets[number] = _EventSet()
    ctypes.c_void_p.from_buffer(out._obj).value = number
    return SUCCESS


def _event_set(lib: FakeNvmlLibrary, handle: Handle) -> Optional[_EventSet]:
    return lib._event_sets.get(_address(handle) or 0)


@_device
def nvmlDeviceGetSupportedEventTypes(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = EVENT_TYPES_SUPPORTED
    return SUCCESS


@_device
def nvmlDeviceRegisterEvents(lib: FakeNvmlLibrary, gpu: int, types: CScalar, handle: Handle) -> int:
    events = _event_set(lib, handle)
    if events is None:
        return ERROR_INVALID_ARGUMENT
    events.registered[gpu] = events.registered.get(gpu, 0) | _int(types)
    return SUCCESS


@_library
def nvmlEventSetWait_v2(lib: FakeNvmlLibrary, handle: Handle, data: Ref, timeout_ms: CScalar) -> int:
    events = _event_set(lib, handle)
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


@_library
def nvmlEventSetFree(lib: FakeNvmlLibrary, handle: Handle) -> int:
    with lib._lock:
        return SUCCESS if lib._event_sets.pop(_address(handle) or 0, None) is not None else ERROR_INVALID_ARGUMENT


# ---- processes (the two-call protocol: ask for the count, then fill a buffer)
@_device_as("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2")
def running_processes(lib: FakeNvmlLibrary, gpu: int, count: Ref, buffer: Optional[ctypes.Array[Any]]) -> int:
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
@_library
def nvmlDeviceGetTopologyCommonAncestor(lib: FakeNvmlLibrary, handle1: Handle, handle2: Handle, out: Ref) -> int:
    a, b = lib.gpu_of(handle1), lib.gpu_of(handle2)
    if a is None or b is None:
        return ERROR_INVALID_ARGUMENT
    if lib.is_lost(a) or lib.is_lost(b):
        return ERROR_GPU_IS_LOST
    if a == b:
        out._obj.value = 0  # INTERNAL
    elif a in lib.faults.infra.topology or b in lib.faults.infra.topology:
        out._obj.value = TOPOLOGY_LEVELS["PHB"]  # topology=IDX: it meets its peers only through the host bridge
    elif lib.profile.numa_nodes[a] == lib.profile.numa_nodes[b]:
        out._obj.value = TOPOLOGY_LEVELS[lib.profile.same_node_ancestor]
    else:
        out._obj.value = TOPOLOGY_SYSTEM
    return SUCCESS


@_device
def nvmlDeviceGetCpuAffinity(lib: FakeNvmlLibrary, gpu: int, words: CScalar, out: Ref) -> int:
    words = _int(words)
    mask = out._obj
    for cpu in lib.profile.cpu_affinity(gpu, lib.spec.host_cpus):
        if cpu // 64 < words:
            mask[cpu // 64] |= 1 << (cpu % 64)
    return SUCCESS


@_device
def nvmlDeviceGetMemoryAffinity(lib: FakeNvmlLibrary, gpu: int, words: CScalar, out: Ref, scope: CScalar) -> int:
    node = lib.profile.numa_nodes[gpu]
    if node // 64 < _int(words):
        out._obj[node // 64] |= 1 << (node % 64)
    return SUCCESS


@_device
def nvmlDeviceGetNumaNodeId(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = lib.profile.numa_nodes[gpu]
    return SUCCESS


# ---- GPM (issue 24): GPU Performance Monitoring as NVML serves it: an opaque sample buffer per
# `nvmlGpmSampleAlloc`, filled by `nvmlGpmSampleGet` with the GPU's counters at that moment, and `nvmlGpmMetricsGet`
# turning two samples of one GPU into percentages over the time between them.  A GPU whose model has no GPM (Ada
# and older) says isSupportedDevice 0 and refuses samples with NOT_SUPPORTED, as the real driver does; each
# requested metric the fake does not count gets its own NOT_SUPPORTED in the metrics array.
@_device
def nvmlGpmQueryDeviceSupport(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    support = out._obj
    if support.version != GPM_SUPPORT_VERSION:
        return ERROR_ARGUMENT_VERSION_MISMATCH
    support.isSupportedDevice = 1 if lib.profile.model(gpu).gpm else 0
    return SUCCESS


@_library
def nvmlGpmSampleAlloc(lib: FakeNvmlLibrary, out: Ref) -> int:
    number = next(lib.gpm_numbers)
    lib.gpm_buffers[number] = None
    ctypes.c_void_p.from_buffer(out._obj).value = number
    return SUCCESS


@_library
def nvmlGpmSampleFree(lib: FakeNvmlLibrary, sample: Handle) -> int:
    return SUCCESS if lib.gpm_buffers.pop(_address(sample) or 0, False) is not False else ERROR_INVALID_ARGUMENT


@_device
def nvmlGpmSampleGet(lib: FakeNvmlLibrary, gpu: int, sample: Handle) -> int:
    number = _address(sample) or 0
    if number not in lib.gpm_buffers:
        return ERROR_INVALID_ARGUMENT
    if not lib.profile.model(gpu).gpm:
        return ERROR_NOT_SUPPORTED
    now, counters = lib.gpm_counters(gpu)
    lib.gpm_buffers[number] = (gpu, now, counters)
    return SUCCESS


@_library
def nvmlGpmMetricsGet(lib: FakeNvmlLibrary, out: Ref) -> int:
    request = _GpmMetricsGet.from_address(ctypes.addressof(out._obj))
    if request.version != GPM_METRICS_GET_VERSION:
        return ERROR_ARGUMENT_VERSION_MISMATCH
    first, second = lib.gpm_buffers.get(_address(request.sample1) or 0), lib.gpm_buffers.get(_address(request.sample2) or 0)
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


@_device
def nvmlDeviceGetCudaComputeCapability(lib: FakeNvmlLibrary, gpu: int, major: Ref, minor: Ref) -> int:
    capability = lib.profile.model(gpu).compute_capability
    if capability is None:
        return ERROR_NOT_SUPPORTED
    major._obj.value, minor._obj.value = capability
    return SUCCESS


# ---- what `gputop check` reads (issue 16): identity, modes and error counters, and the INFRA_FAULTS
# (`profiles.InfraFaults`) that change them.  A data-centre card (one with ECC) answers everything; a GeForce card
# refuses serial, part number, ECC mode and applications clocks, as the real ones do.  The faulty counters climb
# with time.
def _climbing(lib: FakeNvmlLibrary, base: float, per_s: float) -> int:
    return int(base + per_s * max(0.0, lib.elapsed()))


@_device
def nvmlDeviceGetSerial(lib: FakeNvmlLibrary, gpu: int, buf: CharBuffer, size: CScalar) -> int:
    if not lib.profile.gpu.ecc:
        return ERROR_NOT_SUPPORTED
    return _write(buf, f"165492200{gpu:04d}", size)


@_device
def nvmlDeviceGetVbiosVersion(lib: FakeNvmlLibrary, gpu: int, buf: CharBuffer, size: CScalar) -> int:
    return _write(buf, "96.00.99.00.01" if lib.profile.gpu.ecc else "95.02.18.80.5F", size)


@_device
def nvmlDeviceGetBoardPartNumber(lib: FakeNvmlLibrary, gpu: int, buf: CharBuffer, size: CScalar) -> int:
    if not lib.profile.gpu.ecc:
        return ERROR_NOT_SUPPORTED
    return _write(buf, "692-2G520-0200-000", size)


@_device
def nvmlDeviceGetPersistenceMode(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = 1
    return SUCCESS


@_device
def nvmlDeviceGetEccMode(lib: FakeNvmlLibrary, gpu: int, current: Ref, pending: Ref) -> int:
    if not lib.profile.gpu.ecc:
        return ERROR_NOT_SUPPORTED
    current._obj.value = pending._obj.value = 1
    return SUCCESS


@_device_as("nvmlDeviceGetApplicationsClock", "nvmlDeviceGetDefaultApplicationsClock")
def applications_clock(lib: FakeNvmlLibrary, gpu: int, clock_type: CScalar, out: Ref) -> int:
    if not lib.profile.gpu.ecc:
        return ERROR_NOT_SUPPORTED
    kind = _int(clock_type)
    if kind not in (CLOCK_SM, CLOCK_MEM):
        return ERROR_NOT_SUPPORTED
    out._obj.value = lib.profile.gpu.sm_clock_max_mhz if kind == CLOCK_SM else lib.profile.gpu.mem_clock_mhz
    return SUCCESS


@_device
def nvmlDeviceGetPcieReplayCounter(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    out._obj.value = _climbing(lib, 3, 40) if gpu in lib.faults.infra.pcie_replay else 0
    return SUCCESS


@_device
def nvmlDeviceGetNvLinkErrorCounter(lib: FakeNvmlLibrary, gpu: int, link: CScalar, counter: CScalar, out: Ref) -> int:
    link = _int(link)
    ret = _nvlink_check(lib, gpu, link)
    if ret == SUCCESS:
        faulty = (gpu, link) in lib.faults.infra.nvlink_crc and _int(counter) == NVLINK_ERROR_DL_CRC_FLIT
        out._obj.value = _climbing(lib, 12, 25) if faulty else 0
    return ret


@_device
def nvmlDeviceGetRetiredPages(
    lib: FakeNvmlLibrary, gpu: int, cause: CScalar, count: Ref, addresses: Optional[ctypes.Array[ctypes.c_ulonglong]]
) -> int:
    if not lib.profile.gpu.ecc:
        return ERROR_NOT_SUPPORTED
    pages = [0x3F2A1000] if gpu in lib.faults.infra.retired_page and _int(cause) == PAGE_RETIREMENT_DOUBLE_BIT else []
    capacity = count._obj.value
    count._obj.value = len(pages)
    if not pages:
        return SUCCESS
    if addresses is None or capacity < len(pages):
        return ERROR_INSUFFICIENT_SIZE
    for i, address in enumerate(pages):
        addresses[i] = address
    return SUCCESS


@_device
def nvmlDeviceGetRetiredPagesPendingStatus(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    if not lib.profile.gpu.ecc:
        return ERROR_NOT_SUPPORTED
    out._obj.value = 1 if gpu in lib.faults.infra.retired_page else 0
    return SUCCESS


@_device
def nvmlDeviceGetViolationStatus(lib: FakeNvmlLibrary, gpu: int, policy: CScalar, out: Ref) -> int:
    policy = _int(policy)
    share = 0.0  # of the time since start that the clocks were held back for this reason
    if policy == PERF_POLICY_THERMAL and gpu in lib.faults.thermal:
        share = 0.6
    elif policy == PERF_POLICY_POWER and gpu in lib.faults.power_cap:
        share = 0.8
    out._obj.referenceTime = int(lib.clock() * 1e9)
    out._obj.violationTime = int(share * max(0.0, lib.elapsed()) * 1e9)
    return SUCCESS


# ---------------------------------------------------------------- MIG (profiles' `mig`, the `mig=` switch)
# NVML's MIG calls, and the calls that answer differently under MIG: on a MIG device handle name, UUID, memory and
# processes are the instance's; on a MIG-enabled GPU memory is its instances' and processes carry their instance
# ids; utilization is NOT_SUPPORTED on both (nvmlDeviceGetUtilizationRates: "On MIG-enabled GPUs, querying device
# utilization rates is not currently supported").
def _mig_device(lib: FakeNvmlLibrary, handle: Handle) -> Optional[_MigDevice]:
    offset = (_address(handle) or 0) - MIG_HANDLE_BASE
    gpu, index = divmod(offset, MIG_HANDLE_STRIDE)
    devices = lib.mig_layouts[gpu] if offset >= 0 and gpu < lib.profile.gpu_count else None
    return devices[index] if devices is not None and index < len(devices) else None


def _set_handle(out: Ref, address: int) -> int:
    ctypes.c_void_p.from_buffer(out._obj).value = address
    return SUCCESS


@_mig
def nvmlDeviceGetMigMode(lib: FakeNvmlLibrary, handle: Handle, current: Ref, pending: Ref) -> int:
    gpu = lib.gpu_of(handle)
    if gpu is None:
        return ERROR_NOT_SUPPORTED if _mig_device(lib, handle) else ERROR_INVALID_ARGUMENT
    if lib.is_lost(gpu):
        return ERROR_GPU_IS_LOST
    if not lib.profile.model(gpu).mig_profiles and lib.mig_layouts[gpu] is None:  # (a capture's MIG GPU has no table)
        return ERROR_NOT_SUPPORTED
    current._obj.value = pending._obj.value = 1 if lib.mig_layouts[gpu] is not None else 0
    return SUCCESS


@_mig
def nvmlDeviceGetMaxMigDeviceCount(lib: FakeNvmlLibrary, handle: Handle, out: Ref) -> int:
    gpu = lib.gpu_of(handle)
    if gpu is None:
        return ERROR_NOT_SUPPORTED if _mig_device(lib, handle) else ERROR_INVALID_ARGUMENT
    out._obj.value = MIG_MAX_DEVICES if lib.mig_layouts[gpu] is not None else 0
    return SUCCESS


@_mig
def nvmlDeviceGetMigDeviceHandleByIndex(lib: FakeNvmlLibrary, handle: Handle, index: CScalar, out: Ref) -> int:
    gpu, number = lib.gpu_of(handle), _int(index)
    if gpu is None or not 0 <= number < MIG_MAX_DEVICES:
        return ERROR_INVALID_ARGUMENT
    devices = lib.mig_layouts[gpu]
    if devices is None:
        return ERROR_NOT_SUPPORTED
    if number >= len(devices):
        return ERROR_NOT_FOUND  # an index no instance holds
    return _set_handle(out, MIG_HANDLE_BASE + gpu * MIG_HANDLE_STRIDE + number)


@_mig
def nvmlDeviceIsMigDeviceHandle(lib: FakeNvmlLibrary, handle: Handle, out: Ref) -> int:
    is_mig = _mig_device(lib, handle) is not None
    if not is_mig and lib.gpu_of(handle) is None:
        return ERROR_INVALID_ARGUMENT
    out._obj.value = 1 if is_mig else 0
    return SUCCESS


@_mig
def nvmlDeviceGetGpuInstanceId(lib: FakeNvmlLibrary, handle: Handle, out: Ref) -> int:
    device = _mig_device(lib, handle)
    if device is None:
        return ERROR_NOT_SUPPORTED if lib.gpu_of(handle) is not None else ERROR_INVALID_ARGUMENT
    out._obj.value = device.gpu_instance_id
    return SUCCESS


@_mig
def nvmlDeviceGetComputeInstanceId(lib: FakeNvmlLibrary, handle: Handle, out: Ref) -> int:
    device = _mig_device(lib, handle)
    if device is None:
        return ERROR_NOT_SUPPORTED if lib.gpu_of(handle) is not None else ERROR_INVALID_ARGUMENT
    out._obj.value = 0  # one compute instance each
    return SUCCESS


@_mig
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(lib: FakeNvmlLibrary, handle: Handle, out: Ref) -> int:
    device = _mig_device(lib, handle)
    return _set_handle(out, device.gpu + 1) if device is not None else ERROR_INVALID_ARGUMENT


@_mig
def nvmlDeviceGetAttributes_v2(lib: FakeNvmlLibrary, handle: Handle, out: Ref) -> int:
    device = _mig_device(lib, handle)
    if device is None:
        # the whole GPU's attributes: not simulated
        return ERROR_INVALID_ARGUMENT if lib.gpu_of(handle) is None else ERROR_NOT_SUPPORTED
    attrs, mig = out._obj, device.profile
    attrs.multiprocessorCount, attrs.memorySizeMB = mig.multiprocessors, mig.memory_mib
    attrs.gpuInstanceSliceCount = attrs.computeInstanceSliceCount = mig.slices
    return SUCCESS


def _with_mig(
    lib: FakeNvmlLibrary,
    name: str,
    whole: CFunction,
    on_mig: Callable[..., int],
    on_mig_gpu: Optional[Callable[..., int]],
) -> CFunction:
    """`whole`, answering `on_mig(lib, device, *args)` for a MIG device handle and `on_mig_gpu(lib, gpu, *args)`
    (if given) for a MIG-enabled GPU."""

    def call(handle: Handle, *args: Any) -> Any:
        device = _mig_device(lib, handle)
        if device is not None:
            return on_mig(lib, device, *args)
        gpu = lib.gpu_of(handle)
        if on_mig_gpu is not None and gpu is not None and lib.mig_layouts[gpu] is not None and not lib.is_lost(gpu):
            return on_mig_gpu(lib, gpu, *args)
        return whole(handle, *args)

    call.__name__ = f"{name}_mig"
    return call


def _mig_not_supported(lib: FakeNvmlLibrary, *args: object) -> int:
    return ERROR_NOT_SUPPORTED


def _mig_name(lib: FakeNvmlLibrary, device: _MigDevice, buf: CharBuffer, size: CScalar) -> int:
    return _write(buf, f"{lib.profile.model(device.gpu).name} MIG {device.profile.name}", size)


def _mig_uuid(lib: FakeNvmlLibrary, device: _MigDevice, buf: CharBuffer, size: CScalar) -> int:
    tag = sum(ord(c) for c in lib.profile.name) & 0xFFFF
    gpu, i = device.gpu, device.index
    return _write(buf, f"MIG-{tag:04x}{gpu:02x}{i:02x}-{gpu:04x}-5a1e-8c{i:02x}-{gpu * 7919 + i * 104729 + tag:012x}", size)


def _fill_memory(mem: Any, total: int, used: int, reserved: int, v2: bool) -> int:
    if v2:
        if mem.version != MEMORY_V2_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        mem.reserved = reserved
        mem.used, mem.free = used, total - reserved - used
    else:
        mem.used, mem.free = used + reserved, total - reserved - used
    mem.total = total
    return SUCCESS


def _instance_memory(lib: FakeNvmlLibrary, device: _MigDevice, out: Ref, v2: bool = False) -> int:
    return _fill_memory(out._obj, device.profile.memory_mib * MIB, lib.mig_memory_used(device), 0, v2)


def _instances_memory(lib: FakeNvmlLibrary, gpu: int, out: Ref, v2: bool = False) -> int:
    """The whole card: its instances' memory together."""
    card = lib.profile.model(gpu)
    used = sum(lib.mig_memory_used(d) for d in lib.mig_layouts[gpu] or ())
    return _fill_memory(out._obj, card.memory_total, used, card.memory_reserved, v2)


def _instance_memory_v2(lib: FakeNvmlLibrary, device: _MigDevice, out: Ref) -> int:
    return _instance_memory(lib, device, out, v2=True)


def _instances_memory_v2(lib: FakeNvmlLibrary, gpu: int, out: Ref) -> int:
    return _instances_memory(lib, gpu, out, v2=True)


def _fill_mig_processes(procs: list[tuple[int, Optional[int], _MigDevice]], count: Ref, buffer: Any) -> int:
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


def _instance_processes(lib: FakeNvmlLibrary, device: _MigDevice, count: Ref, buffer: Any) -> int:
    return _fill_mig_processes([(pid, used, device) for pid, used in lib.mig_processes(device)], count, buffer)


def _instances_processes(lib: FakeNvmlLibrary, gpu: int, count: Ref, buffer: Any) -> int:
    """Every instance's, with its ids."""
    procs = [(pid, used, d) for d in lib.mig_layouts[gpu] or () for pid, used in lib.mig_processes(d)]
    return _fill_mig_processes(procs, count, buffer)


# symbol -> (its answer for a MIG device, its answer for a MIG-enabled GPU; None: the GPU's own)
_MIG_ANSWERS: dict[str, tuple[Callable[..., int], Optional[Callable[..., int]]]] = {
    "nvmlDeviceGetName": (_mig_name, None),
    "nvmlDeviceGetUUID": (_mig_uuid, None),
    "nvmlDeviceGetUtilizationRates": (_mig_not_supported, _mig_not_supported),
    "nvmlDeviceGetMemoryInfo": (_instance_memory, _instances_memory),
    "nvmlDeviceGetMemoryInfo_v2": (_instance_memory_v2, _instances_memory_v2),
    "nvmlDeviceGetComputeRunningProcesses_v2": (_instance_processes, _instances_processes),
    "nvmlDeviceGetComputeRunningProcesses_v3": (_instance_processes, _instances_processes),
}


# ---------------------------------------------------------------- a bug report's captures (gputop.sim.capture)
# What `Profile.capture` says in place of the profile's made-up layout: every GPU pair's level, each link's far end,
# the affinity lists and NUMA ids as captured, and NOT_SUPPORTED wherever the capture reads N/A (or holds nothing:
# a capture without `nvidia-smi topo -m` does not know the topology).  Served only for a profile with a capture.
def _board(lib: FakeNvmlLibrary) -> CapturedBoard:
    board = lib.profile.capture
    assert board is not None  # (these symbols are bound only for a profile with a capture)
    return board


def _fill_captured_pci(info: Any, bus_id: str) -> None:
    domain, bus, rest = bus_id.split(":")
    info.busId = bus_id.encode()
    info.busIdLegacy = f"{int(domain, 16):04x}:{bus}:{rest}".encode()
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)


def _set_bits(mask: Any, ids: tuple[int, ...], words: CScalar) -> None:
    for i in ids:
        if i // 64 < _int(words):
            mask[i // 64] |= 1 << (i % 64)


@_captured("nvmlDeviceGetTopologyCommonAncestor")
def _captured_common_ancestor(lib: FakeNvmlLibrary, handle1: Handle, handle2: Handle, out: Any) -> int:
    a, b = lib.gpu_of(handle1), lib.gpu_of(handle2)
    if a is None or b is None:
        return ERROR_INVALID_ARGUMENT
    if a == b:
        out._obj.value = 0
        return SUCCESS
    levels = _board(lib).levels
    cell = levels[a][b] if levels else "N/A"
    if cell.startswith("NV"):  # topo -m shows the links, not the PCIe path under them: the NUMA split
        cell = "NODE" if lib.profile.numa_nodes[a] == lib.profile.numa_nodes[b] else "SYS"
    if cell not in TOPOLOGY_LEVELS:
        return ERROR_NOT_SUPPORTED
    out._obj.value = TOPOLOGY_LEVELS[cell]
    return SUCCESS


@_captured("nvmlDeviceGetCpuAffinity")
def _captured_cpu_affinity(lib: FakeNvmlLibrary, handle: Handle, words: CScalar, out: Any) -> int:
    gpu = lib.gpu_of(handle)
    cpus = _board(lib).gpus[gpu].cpu_affinity if gpu is not None else None
    if cpus is None:
        return ERROR_NOT_SUPPORTED if gpu is not None else ERROR_INVALID_ARGUMENT
    _set_bits(out._obj, cpus, words)
    return SUCCESS


@_captured("nvmlDeviceGetMemoryAffinity")
def _captured_memory_affinity(lib: FakeNvmlLibrary, handle: Handle, words: CScalar, out: Any, scope: CScalar) -> int:
    gpu = lib.gpu_of(handle)
    nodes = _board(lib).gpus[gpu].numa_affinity if gpu is not None else None
    if nodes is None:
        return ERROR_NOT_SUPPORTED if gpu is not None else ERROR_INVALID_ARGUMENT
    _set_bits(out._obj, nodes, words)
    return SUCCESS


@_captured("nvmlDeviceGetNumaNodeId")
def _captured_numa_node(lib: FakeNvmlLibrary, handle: Handle, out: Any) -> int:
    gpu = lib.gpu_of(handle)
    node = _board(lib).gpus[gpu].numa_id if gpu is not None else None
    if node is None:
        return ERROR_NOT_SUPPORTED if gpu is not None else ERROR_INVALID_ARGUMENT
    out._obj.value = node
    return SUCCESS


def _remote(lib: FakeNvmlLibrary, handle: Handle, link: CScalar) -> tuple[int, Optional[int]]:
    """(NVML return, the GPU at the far end or None for an NVSwitch)."""
    gpu, number = lib.gpu_of(handle), _int(link)
    if gpu is None:
        return ERROR_INVALID_ARGUMENT, None
    links = _board(lib).gpus[gpu].nvlink_remote
    return (SUCCESS, links[number]) if 0 <= number < len(links) else (ERROR_NOT_SUPPORTED, None)


@_captured("nvmlDeviceGetNvLinkRemotePciInfo_v2")
def _captured_remote_pci(lib: FakeNvmlLibrary, handle: Handle, link: CScalar, out: Any) -> int:
    profile = lib.profile
    ret, peer = _remote(lib, handle, link)
    if ret == SUCCESS and peer is None and not profile.switch_bus_ids:
        return ERROR_NOT_SUPPORTED  # a link nvlink -s lists and topo -m places nowhere
    if ret == SUCCESS:
        switch = profile.switch_bus_ids[_int(link) % len(profile.switch_bus_ids)] if peer is None else ""
        _fill_captured_pci(out._obj, profile.bus_ids[peer] if peer is not None else switch)
    return ret


@_captured("nvmlDeviceGetNvLinkRemoteDeviceType")
def _captured_remote_type(lib: FakeNvmlLibrary, handle: Handle, link: CScalar, out: Any) -> int:
    ret, peer = _remote(lib, handle, link)
    if ret == SUCCESS and peer is None and not lib.profile.switch_bus_ids:
        return ERROR_NOT_SUPPORTED
    if ret == SUCCESS:
        out._obj.value = NVLINK_DEVICE_TYPE_GPU if peer is not None else NVLINK_DEVICE_TYPE_SWITCH
    return ret


def _refusing(fn: CFunction, gpus: frozenset[int], index: Callable[[Handle], Optional[int]]) -> CFunction:
    """`fn`, answering NOT_SUPPORTED for `gpus` (a distinct function object: pynvml sets restype on it)."""

    def call(handle: Handle, *args: object) -> Any:
        return ERROR_NOT_SUPPORTED if index(handle) in gpus else fn(handle, *args)

    call.__name__ = f"{getattr(fn, '__name__', 'nvml')}_refusing"
    return call
