"""GPU collector: NVML through nvidia-ml-py.  The ONLY module in gputop that imports pynvml.

Every NVML refusal (NotSupported, NoPermission, FunctionNotFound, GpuIsLost, ...)
becomes ``None`` plus ``unavailable[field] = reason`` here, at the adapter;
nothing above this module ever sees an ``NVMLError``.  A GPU that falls off the
bus comes back as ``lost=True`` while the others keep updating.

Cost model (the TUI polls at 1 Hz and must stay cheap):
- What cannot change while we run (names, UUIDs, bus ids, max PCIe link, NVLink
  wiring, topology, affinity, which calls are unsupported) is read once.
- A refusal that is permanent (NotSupported, FunctionNotFound, NoPermission) is
  remembered per GPU and field, so an RTX card does not re-ask for ECC every second.
- What changes rarely and only by an event that persists (NVLink link up/down, ECC
  counters, remapped rows) is re-read every `SLOW_FIELDS_PERIOD_S` seconds, not every
  poll; every sample still carries the latest reading (see `_SlowFields`).
- Every cumulative counter of a GPU (each NVLink's TX/RX KiB, and the PCIe TX/RX bytes) is read in one
  ``nvmlDeviceGetFieldValues`` call a sample, and a rate is Δcount/Δtimestamp between two samples: the
  average over the whole interval.  The counters come back as an array of NVML structs; they are read
  through a plain ctypes view of the same memory (`_FieldValueView`), not attribute by attribute
  through pynvml's Python-level struct hooks.
- PCIe traffic comes from the byte counters (``NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES``, driver R555 and
  later; see `_PCIE_TX_BYTES`) wherever the GPU answers them: probed once per GPU at start, and a
  permanent refusal (NotSupported, ...) moves that GPU to ``nvmlDeviceGetPcieThroughput`` for good.
  That fallback samples the link for ~20 ms per direction and answers with that 20 ms glimpse, not the
  interval's average; 8 GPUs read one after another would take ~320 ms.
- Where every GPU answers the counters and none is stuck (the usual case), one task of the pool reads the
  GPUs in turn, each into a future of its own: eight threads woken for one GPU each cost ~8% more of the
  monitor's CPU.  A GPU that the task did not reach when the sample stops waiting (one before it is stuck)
  is then read on a thread of its own, and from the next sample on every GPU is, as below.
- Otherwise each GPU is read by its own task in a small persistent pool of daemon threads, one per GPU.  On
  the fallback path that keeps the 20 ms samplings of the GPUs overlapping (ctypes drops the GIL
  inside the driver), so a full sample costs about one GPU's time (~40 ms); we chose that over a
  background PCIe refresher, which would have to spin the same 320 ms of driver sampling continuously
  to stay fresh.  Where every GPU answers the counters nothing blocks for long, but the threads stay:
  a GPU whose calls hang (a dying board) must not stall the refresh.  After `sample_timeout_s` its
  previous reading is returned, marked stale, and no second task is queued behind the stuck one.
- Each task makes the fallback's two blocking calls first (if the GPU is on it), then takes a "turn"
  (a lock) for its other short calls, so the GPUs' Python work runs one after another instead of eight
  threads fighting over the GIL (with the real library every ctypes call releases the GIL, so
  contending threads hand it over at each call: that contention cost more CPU than the reads).  The turn
  is only waited for `TURN_WAIT_S`, and not at all while a GPU is stuck, so a GPU that
  hangs while holding it cannot stall the others.

- XIDs arrive as NVML events.  Each GPU has an event set of its own, and its reader drains it
  without waiting (timeout 0) once per sample, so XIDs cost one call per GPU per sample and a GPU
  hung in the driver delays nobody else's.

`GpuSample.unavailable` keys: a field name ("ecc", "nvlink", "temperature", ...) when
the whole field is None; "pcie.gen_current"-style dotted names for one part of it;
"nvlink.N" for link N's state; "xids.read" when draining the XID events failed this time (the
XIDs already seen are kept); "gpu" when the whole GPU is lost or failed; "stale"
when the values are the previous sample's because NVML did not answer in time.

The simulated machine plugs in below pynvml: `use_nvml_library(fake)` makes the
real pynvml wrappers (struct handling, two-call process lists, per-field errors,
error classes) run against `gputop.sim.fake_nvml.FakeNvmlLibrary`.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import math
import os
import queue
import struct
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

import pynvml

from gputop.analysis.gpu_health import PCIE_LANE_BYTES_PER_S
from gputop.clock import REAL_CLOCK, Clock
from gputop.errors import GputopError
from gputop.model import (
    THROTTLE_REASONS,
    EccCounts,
    FabricInfo,
    GpmMetrics,
    GpuDetails,
    GpuProcess,
    GpuSample,
    MigInstance,
    NvLinkErrors,
    NvLinks,
    PcieLink,
    RemappedRows,
    Topology,
    XidEvent,
    shared_wiring,
)

# Refusals that will not change while we run: stop asking.
PERMANENT_REASONS = frozenset({"NotSupported", "FunctionNotFound", "NoPermission"})
DEFAULT_SAMPLE_TIMEOUT_S = 0.8
# NVLink link state, ECC counters, remapped rows and the enforced power limit are re-read this often rather
# than every poll (18 links x 8 GPUs alone is 144 NVML calls a poll).  This is safe because each changes only
# through an event that then persists: a link that fails training stays down until the GPU is reset, ECC
# counters and row remaps only ever grow (volatile ones reset only with the driver), and a power limit stays
# as someone set it.  So a change shows at most this late and is never missed; the NVLink traffic counters
# are still read every poll.
SLOW_FIELDS_PERIOD_S = 5.0
# XIDs a sample carries per GPU (the newest; they are rare, and the first one usually tells the story).
XID_EVENTS_KEPT = 16
XID_EVENTS_PER_SAMPLE = 64  # taken from the driver's queue per sample at most; the rest wait for the next
# How long a GPU's reader waits for its turn before reading anyway (the holder may be hung in the driver).
TURN_WAIT_S = 0.1

# nvidia-smi topo -m labels for nvmlDeviceGetTopologyCommonAncestor
_TOPOLOGY_LABELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "PIX",  # two GPUs on one board
    pynvml.NVML_TOPOLOGY_SINGLE: "PIX",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
    pynvml.NVML_TOPOLOGY_NODE: "NODE",
    pynvml.NVML_TOPOLOGY_SYSTEM: "SYS",
}
_REMOTE_KINDS = {
    pynvml.NVML_NVLINK_DEVICE_TYPE_GPU: "gpu",
    pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU: "ibmnpu",
    pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH: "switch",
}
# bit i of the clock-event mask <-> THROTTLE_REASONS[i]
_REASON_BITS = tuple((1 << i, name) for i, name in enumerate(THROTTLE_REASONS))
_NVLINK_TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
_NVLINK_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
# Cumulative PCIe bytes ("value can be wrapped", nvml.h), added to nvmlDeviceGetFieldValues in driver R555
# (NVML change log, "Changes between v550 and v555"). NVML's documents name no architectures for them. A
# third-party note measured them on a Blackwell GeForce (RTX 5090, driver 610: 0.2-0.4 ms a call); we found no
# report for Hopper, Ada or Ampere, and have run them on no real GPU. So they are probed per GPU at start and any
# refusal falls back to nvmlDeviceGetPcieThroughput (see the module docstring).
_PCIE_TX_BYTES = pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES
_PCIE_RX_BYTES = pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES
# An entry's valueType -> the width in bits of the nvmlValue_t member that holds a counter of that type.
# A counter narrower than 64 bits wraps; its delta is taken modulo its width, which is right as long as it wraps
# at most once between two samples (a 32-bit byte counter: under 4 GiB between samples). Other types are read
# as 64-bit, as NVLink's counters (unsigned long long) always were.
_COUNTER_BITS = {
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: 32,  # nvmlValue_t's uiVal
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: 16,  # usVal
}
# Bytes a second one PCIe lane carries each way, per generation (after line coding): with the link's width, the most
# a PCIe byte counter can count between two samples.  A narrower counter that could wrap more than once in that
# time cannot be read (a 32-bit one on a Gen4 x16 link wraps every 0.14 s): the GPU falls back (see _pcie_rates).
_PCIE_LANE_BYTES_PER_S = PCIE_LANE_BYTES_PER_S  # the one table (analysis/gpu_health.py)
# What an entry may answer for a field the GPU or the driver does not have; kept as a permanent refusal. A driver
# older than R555 does not know the PCIe byte fields: which of these it answers is not checked on a real one.
_PERMANENT_ENTRY_REASONS = PERMANENT_REASONS | {"InvalidArgument"}
_PCIE_RATE_KEYS = ("pcie.tx_bytes_per_s", "pcie.rx_bytes_per_s")


_RETIRED_SINGLE_BIT = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
_RETIRED_DOUBLE_BIT = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
# NvLinkErrors field -> NVML's DL error counter
_NVLINK_ERROR_COUNTERS = (
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
)
# GpuDetails.clock_event_ns key -> NVML performance policy whose violation time it is
_VIOLATION_POLICIES = (
    ("power", pynvml.NVML_PERF_POLICY_POWER),
    ("thermal", pynvml.NVML_PERF_POLICY_THERMAL),
    ("sync_boost", pynvml.NVML_PERF_POLICY_SYNC_BOOST),
    ("board_limit", pynvml.NVML_PERF_POLICY_BOARD_LIMIT),
    ("low_utilization", pynvml.NVML_PERF_POLICY_LOW_UTILIZATION),
    ("reliability", pynvml.NVML_PERF_POLICY_RELIABILITY),
    ("applications_clocks", pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS),
    ("base_clocks", pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS),
)


# GPM (GPU Performance Monitoring, Hopper and newer): GpmMetrics field -> NVML metric id, read between the GPM sample
# of the previous refresh and this one's, so each value is the average over the whole interval.
_GPM_METRICS = (
    ("sm_active", pynvml.NVML_GPM_METRIC_SM_UTIL),
    ("sm_occupancy", pynvml.NVML_GPM_METRIC_SM_OCCUPANCY),
    ("tensor_active", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
    ("dram_bandwidth", pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL),
    ("fp32_active", pynvml.NVML_GPM_METRIC_FP32_UTIL),
    ("fp16_active", pynvml.NVML_GPM_METRIC_FP16_UTIL),
)


class GpuUnavailableError(GputopError):
    """NVML could not be started; the rest of gputop still works without GPUs."""


class NoDriverError(GpuUnavailableError):
    """No NVIDIA driver on this machine (libnvidia-ml cannot load, or the kernel module is absent)."""


# The fake library gputop itself last put below pynvml (None: none).  Only that one is ever taken out
# again: a library someone else set up (a shim, another tool's test double, a site hook) is used as it is.
_installed_by_gputop: Any = None


def use_nvml_library(lib: Any) -> None:
    """Make pynvml call `lib` instead of libnvidia-ml.so (None: load the real one on the next nvmlInit).

    Leans on pynvml's private `nvmlLib` and function-pointer cache (pinned by a canary test).
    """
    global _installed_by_gputop
    with pynvml.libLoadLock:
        _installed_by_gputop = lib
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def reason_of(exc: Exception) -> str:
    """NVMLError_NotSupported -> "NotSupported"; the short reason stored in `unavailable`."""
    name = type(exc).__name__
    if name.startswith("NVMLError_"):
        return name[len("NVMLError_") :]
    if isinstance(exc, pynvml.NVMLError):
        return f"NVMLError {getattr(exc, 'value', '?')}"
    return name


def format_cpu_list(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8, 10, 11] -> "0-3,8,10-11" (the kernel's cpulist format)."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive ids
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{first}-{last}" if last != first else f"{first}" for first, last in runs)


# The kernel's possible-CPU list ("0-255"): the CPU ids this machine can ever have, online or not.  The
# affinity mask is sized from it: os.cpu_count() counts the CPUs online (or PYTHON_CPU_COUNT), and the
# highest id is at or above that where CPUs are offline or SMT is off (POWER), so CPUs would fall off the mask.
POSSIBLE_CPUS_FILE = "/sys/devices/system/cpu/possible"


def possible_cpus(path: Optional[str] = None) -> int:
    """How many CPU ids the affinity mask must hold: the highest possible CPU id + 1 (os.cpu_count() where the
    kernel's list cannot be read)."""
    try:
        with open(path or POSSIBLE_CPUS_FILE) as f:
            text = f.read().strip()
        return max(int(part.rpartition("-")[2]) for part in text.split(",")) + 1
    except (OSError, ValueError):
        return os.cpu_count() or 1


def _bits(words: Any) -> list[int]:
    return [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]


class _FieldValueView(ctypes.Structure):
    """pynvml's `c_nvmlFieldValue_t` layout (copied from it, so identical by construction) as a plain ctypes
    struct: reading 36 entries a GPU through pynvml's per-attribute `__getattribute__` hook cost more than
    every other NVML call of the sample together.  The hook only decodes bytes, and these fields hold none."""

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


class _GpmMetricView(ctypes.Structure):
    """pynvml's `c_nvmlGpmMetric_t` layout as a plain ctypes struct, for the reason `_FieldValueView` is: the six
    metrics' results were 18 of pynvml's attribute hooks a GPU a sample."""

    _fields_ = pynvml.c_nvmlGpmMetric_t._fields_


def _field_values_view(values: Any) -> Any:
    """The array pynvml.nvmlDeviceGetFieldValues returned, seen through `_FieldValueView` (same memory)."""
    return (_FieldValueView * len(values)).from_buffer(values)


# pynvml.nvmlDeviceGetFieldValues builds a new array every call and sets each entry's ids through pynvml's
# per-attribute `__setattr__` hook: for 8 GPUs of 18 links (36 entries each) that was ~0.1 ms a GPU a
# second, more than the C call.  The ids never change, so each GPU keeps one array with them set (NVML
# fills the rest in place on every call) and calls the same function pointer pynvml's wrapper calls.
_FILL_IN_PLACE = hasattr(pynvml, "_nvmlGetFunctionPointer") and hasattr(pynvml, "_nvmlCheckReturn")


def _field_values(handle: Any, ids: list[tuple[int, int]], kept: Any) -> Any:
    """nvmlDeviceGetFieldValues(handle, ids) as a `_FieldValueView` array: `kept` (the array of an earlier
    call with the same ids) refilled, or a new one (pynvml's own wrapper where its internals differ)."""
    if not _FILL_IN_PLACE:
        return _field_values_view(pynvml.nvmlDeviceGetFieldValues(handle, ids))
    values = kept
    if values is None or len(values) != len(ids):
        values = (_FieldValueView * len(ids))()
        for entry, (field_id, scope_id) in zip(values, ids):
            entry.fieldId, entry.scopeId = field_id, scope_id
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    pynvml._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(ids)), ctypes.byref(values)))
    return values


# nvmlFieldValue_t as `struct` reads it: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, and the
# nvmlValue_t union's 8 bytes (tests/test_gpu_collector.py checks it against pynvml's layout).  One C-level unpack of
# a GPU's 36 entries costs less than the ~150 ctypes attribute reads it replaces.
_FIELD_VALUE = struct.Struct("@IIqqIIQ")
_LITTLE_ENDIAN = sys.byteorder == "little"


def _counter_readings(values: Any) -> list[Optional[tuple[int, int, int]]]:
    """A field-values array of cumulative counters -> per entry (value, timestamp µs, width in bits), None where
    NVML refused the entry."""
    success = pynvml.NVML_SUCCESS
    out: list[Optional[tuple[int, int, int]]] = []
    for _field, _scope, timestamp, _latency, value_type, returned, raw in _FIELD_VALUE.iter_unpack(values):
        if returned != success:
            out.append(None)
            continue
        bits = _COUNTER_BITS.get(value_type, 64)
        if bits < 64:  # a narrower member of the union: its bytes are the union's first
            raw = raw & ((1 << bits) - 1) if _LITTLE_ENDIAN else raw >> (64 - bits)
        out.append((raw, timestamp, bits))
    return out


def _entry_refusal(entry: Any) -> Optional[str]:
    """A field-values entry's refusal as `unavailable` stores it (None: the entry was answered)."""
    if entry.nvmlReturn == pynvml.NVML_SUCCESS:
        return None
    return reason_of(pynvml.NVMLError(entry.nvmlReturn))


def _counter_rate(
    previous: Optional[tuple[int, int, int]], current: Optional[tuple[int, int, int]], unit: float
) -> Optional[float]:
    """Two readings of one cumulative counter (see `_counter_readings`) -> units per second, or None when either is
    missing, no time passed, or a 64-bit counter went back (it was reset: such a counter does not wrap)."""
    if previous is None or current is None:
        return None
    dt_us = current[1] - previous[1]
    delta = current[0] - previous[0]
    if delta < 0:
        bits = current[2]
        if bits >= 64:
            return None
        delta += 1 << bits  # a narrower counter wrapped (once: see _COUNTER_BITS)
    if dt_us <= 0:
        return None
    return delta * unit / (dt_us / 1e6)


def _shared_with(previous: Optional[GpuSample], fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` of a new sample, each value equal to the previous sample's replaced by that sample's object.

    The TUI keeps 600 samples of every GPU, and most readings repeat from one to the next (the limits, the clocks,
    the PCIe link, an idle GPU's NVLinks, the refusals): shared, each costs one object, not one a sample, and the
    allocator has fewer small objects to scatter.  Samples are never changed once made (`unavailable` included)."""
    if previous is None:
        return fields
    for name, value in fields.items():
        before = getattr(previous, name)
        if value is not before and value is not None and type(value) is type(before) and value == before:
            fields[name] = before
    return fields


def _mig_profile_name(device_name: str) -> str:
    """A MIG device's profile from its NVML name: "NVIDIA A100-SXM4-80GB MIG 3g.40gb" -> "3g.40gb"."""
    _, marker, profile = device_name.rpartition(" MIG ")
    return profile.strip() if marker else device_name


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional_text(value: Any) -> Optional[str]:
    return None if value is None else _text(value).strip()


def _normalise_bus_id(bus_id: str) -> str:
    """ "00000000:18:00.0" and "0000:18:00.0" (legacy form) name the same device."""
    domain, _, rest = _text(bus_id).strip().lower().rpartition(":")
    head, _, bus = domain.rpartition(":")
    try:
        return f"{int(head or '0', 16):08x}:{bus}:{rest}"
    except ValueError:
        return _text(bus_id).lower()


class _DaemonPool:
    """A fixed set of daemon threads running submitted calls (a minimal ThreadPoolExecutor).

    concurrent.futures' workers are joined at interpreter exit, so one NVML call stuck in a dying
    driver would stop gputop from quitting; daemon threads are simply abandoned.
    """

    def __init__(self, workers: int, name: str) -> None:
        self._queue: queue.SimpleQueue[Optional[tuple[concurrent.futures.Future[Any], Callable[..., Any], tuple[Any, ...]]]] = (
            queue.SimpleQueue()
        )
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._queue.put((future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to the caller through the future
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Ask every worker to stop after its current call; never waits."""
        for _ in self._threads:
            self._queue.put(None)


class _Lost(Exception):
    """Raised inside a GPU read when NVML says the GPU is lost: abandon this GPU's sample."""


class _Gpm:
    """One GPU's GPM reads: two sample buffers allocated once and reused (the previous refresh's and this one's,
    swapped after each read) and one metrics request whose ids are set once; `free` gives the buffers back.

    Cost: one nvmlGpmSampleGet and one nvmlGpmMetricsGet a GPU a refresh (benchmarks/bench_gpm.py)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.buffers = [pynvml.nvmlGpmSampleAlloc()]
        try:
            self.buffers.append(pynvml.nvmlGpmSampleAlloc())
        except pynvml.NVMLError:
            self.free()
            raise
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        for i, (_name, metric_id) in enumerate(_GPM_METRICS):
            request.metrics[i].metricId = metric_id
        self.request = request
        self.metrics = (_GpmMetricView * len(_GPM_METRICS)).from_buffer(request.metrics)  # the results, same memory
        self.primed = False  # the previous buffer holds a sample

    def prime(self) -> None:
        """Take the first sample (at start), so that the first refresh already has an interval."""
        pynvml.nvmlGpmSampleGet(self.handle, self.buffers[0])
        self.primed = True

    def read(self, r: "_Reading") -> Optional[GpmMetrics]:
        """Sample now and the metrics since the previous sample (None before there are two); NVML errors propagate."""
        previous, current = self.buffers
        pynvml.nvmlGpmSampleGet(self.handle, current)
        self.buffers = [current, previous]  # this sample is the next interval's start, whatever happens below
        if not self.primed:
            self.primed = True
            return None
        request = self.request
        request.sample1, request.sample2 = previous, current
        pynvml.nvmlGpmMetricsGet(request)
        values: dict[str, Optional[float]] = {}
        for (name, _metric_id), metric in zip(_GPM_METRICS, self.metrics):
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:
                values[name] = float(metric.value)
            else:
                values[name] = None
                r.unavailable[f"gpm.{name}"] = reason_of(pynvml.NVMLError(metric.nvmlReturn))
        return GpmMetrics(**values)

    def free(self) -> None:
        for buffer in self.buffers:
            try:
                pynvml.nvmlGpmSampleFree(buffer)
            except pynvml.NVMLError:
                pass
        self.buffers = []


@dataclass
class _NvLink:
    link: int
    remote_bus_id: Optional[str] = None
    remote_kind: Optional[str] = None
    # previous cumulative reading per direction: (KiB, timestamp µs, width), see _counter_readings
    last_tx: Optional[tuple[int, int, int]] = None
    last_rx: Optional[tuple[int, int, int]] = None


@dataclass
class _SlowFields:
    """Readings re-read every SLOW_FIELDS_PERIOD_S (see there), with the refusals seen when they were read."""

    due: float = -math.inf  # when the next read is due, on the collector's elapsed clock
    link_states: dict[int, Any] = field(default_factory=dict)  # link -> nvmlDeviceGetNvLinkState (None: refused)
    link_unavailable: dict[str, str] = field(default_factory=dict)  # "nvlink.N" -> reason
    ecc: Optional[EccCounts] = None
    remapped_rows: Optional[RemappedRows] = None
    health_unavailable: dict[str, str] = field(default_factory=dict)  # "ecc"/"ecc.*"/"remapped_rows" -> reason
    readings: dict[str, tuple[Any, Optional[str]]] = field(default_factory=dict)  # key -> (value, refusal): get_slow


@dataclass(frozen=True)
class _MigStatic:
    """A MIG device's readings that last as long as the instance (kept by its UUID)."""

    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    slices: Optional[int]
    multiprocessors: Optional[int]


@dataclass
class _Gpu:
    """What we keep per GPU between samples."""

    index: int
    handle: Any
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    gen_max: Optional[int] = None
    width_max: Optional[int] = None
    static_unavailable: dict[str, str] = field(default_factory=dict)
    nvlinks: Optional[list[_NvLink]] = None  # None: NVLink not available (reason in static_unavailable)
    # the (field, scope) pairs of the one field-values call a sample: each link's NVLink TX/RX, then, while
    # `pcie_counters`, the PCIe TX/RX bytes (None: not built yet)
    counter_ids: Optional[list[tuple[int, int]]] = None
    counter_values: Any = None  # the array NVML fills with their values (see _field_values)
    # PCIe traffic from the byte counters (True until the GPU refuses them), else from GetPcieThroughput
    pcie_counters: bool = True
    last_pcie: tuple[Any, Any] = (None, None)  # the previous PCIe TX/RX counter readings (see _counter_readings)
    supported_reasons: Optional[int] = None
    refused: dict[str, str] = field(default_factory=dict)  # field -> permanent reason
    chosen: dict[str, Callable[..., Any]] = field(default_factory=dict)  # field -> the call that works (after fallback)
    last: Optional[GpuSample] = None
    future: Optional[concurrent.futures.Future[GpuSample]] = None
    slow: _SlowFields = field(default_factory=_SlowFields)
    # MIG: None until asked; False once NVML refused MIG mode for good (a card without MIG, an old driver)
    mig_supported: Optional[bool] = None
    mig_devices: int = 0  # MIG mode on: how many MIG device indices to ask for (0: MIG off), read with the slow fields
    mig_static: dict[str, _MigStatic] = field(default_factory=dict)  # MIG device UUID -> what does not change
    xid_events: Any = None  # this GPU's own NVML event set (None: XIDs unavailable, reason in static_unavailable)
    xids: deque[XidEvent] = field(default_factory=lambda: deque(maxlen=XID_EVENTS_KEPT))
    gpm: Optional[_Gpm] = None  # None: no GPM here (reason in static_unavailable["gpm"]) or refused for good
    compute_capability: Optional[tuple[int, int]] = None


def _fabric_v(handle: Any) -> Optional[FabricInfo]:
    """nvmlDeviceGetGpuFabricInfoV with the newest struct this pynvml knows (v3: health mask and summary; v2: the
    mask); a driver that refuses the version gets the older one.  None: state NOT_SUPPORTED (no fabric)."""
    structs = [getattr(pynvml, name, None) for name in ("c_nvmlGpuFabricInfo_v3_t", "c_nvmlGpuFabricInfo_v2_t")]
    for make in [s for s in structs if s is not None]:
        info = make()
        try:
            pynvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except pynvml.NVMLError_ArgumentVersionMismatch:
            continue
        return _fabric_of(info, int(info.healthMask))
    raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)


def _fabric_v1(handle: Any) -> Optional[FabricInfo]:
    """The deprecated nvmlDeviceGetGpuFabricInfo (drivers before the V call): no health mask."""
    info = pynvml.c_nvmlGpuFabricInfo_t()
    pynvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    return _fabric_of(info, None)


def _fabric_of(info: Any, mask: Optional[int]) -> Optional[FabricInfo]:
    if int(info.state) == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
        return None
    uuid = bytes(info.clusterUuid)
    return FabricInfo(
        state=int(info.state),
        status=int(info.status),
        clique_id=int(info.cliqueId),
        cluster_uuid=uuid.hex() if any(uuid) else None,
        health_mask=mask,
    )


class _Reading:
    """One GPU's reads for one sample: collects the reasons for what NVML refused."""

    def __init__(self, gpu: _Gpu) -> None:
        self.gpu = gpu
        self.unavailable: dict[str, str] = dict(gpu.static_unavailable)

    def get(self, key: str, fn: Callable[..., Any], *args: Any, fallback: Optional[Callable[..., Any]] = None) -> Any:
        """fn(handle, *args), or None with unavailable[key] set; FunctionNotFound tries `fallback` once."""
        gpu = self.gpu
        refused = gpu.refused.get(key)
        if refused is not None:
            self.unavailable[key] = refused
            return None
        call = gpu.chosen.get(key, fn)
        try:
            return call(gpu.handle, *args)
        except pynvml.NVMLError_GpuIsLost:
            raise _Lost() from None
        except pynvml.NVMLError_FunctionNotFound:
            if fallback is not None and call is not fallback:
                gpu.chosen[key] = fallback
                return self.get(key, fallback, *args)
            return self._refuse(key, "FunctionNotFound")
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
            return self._refuse(key, reason_of(exc))

    def get_slow(
        self, key: str, refresh: bool, fn: Callable[..., Any], *args: Any, fallback: Optional[Callable[..., Any]] = None
    ) -> Any:
        """`get` when `refresh` (every SLOW_FIELDS_PERIOD_S); between, the last reading, or its refusal."""
        slow = self.gpu.slow
        if refresh or key not in slow.readings:
            value = self.get(key, fn, *args, fallback=fallback)
            slow.readings[key] = (value, self.unavailable.get(key))
            return value
        value, reason = slow.readings[key]
        if reason is not None:
            self.unavailable[key] = reason
        return value

    def _refuse(self, key: str, reason: str) -> None:
        if reason in PERMANENT_REASONS:
            self.gpu.refused[key] = reason
        self.unavailable[key] = reason
        return None


def _temperature_v(handle: Any) -> Any:
    return pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU)


def _temperature_v1(handle: Any) -> Any:
    return pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)


def _memory_v2(handle: Any) -> Any:
    return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)


def _memory_v1(handle: Any) -> Any:
    # v1's `used` includes the driver's reserved memory: a little high, but still the right order
    return pynvml.nvmlDeviceGetMemoryInfo(handle)


# pynvml keeps one library per process. Collectors over different libraries (two simulated machines in
# one test process, or a simulation next to the real driver) take turns: each holds this lock and puts
# its own library back in place while it talks to NVML.
_LIBRARY_LOCK = threading.RLock()


class GpuCollector:
    """Reads every GPU NVML shows."""

    def __init__(
        self, *, library: Any = None, sample_timeout_s: float = DEFAULT_SAMPLE_TIMEOUT_S, clock: Clock = REAL_CLOCK
    ) -> None:
        """`library`: a fake NVML library to install below pynvml (simulation); None reads the real driver.
        `clock`: stamps the XIDs and the details, and times the slow fields' re-reads (the backend's)."""
        self.sample_timeout_s = sample_timeout_s
        self.clock = clock
        self._library = library
        with _LIBRARY_LOCK:
            if library is not None:
                use_nvml_library(library)
            elif pynvml.nvmlLib is not None and pynvml.nvmlLib is _installed_by_gputop:
                use_nvml_library(None)  # a simulation in this process left its fake behind: load the real library
            try:
                self._start()
            except GpuUnavailableError:
                if library is not None and pynvml.nvmlLib is library:
                    use_nvml_library(None)  # do not leave a fake installed that nothing uses
                raise
            self._nvml_library = pynvml.nvmlLib  # the fake, or the CDLL pynvml loaded
        self._closed = False
        workers = max(1, len(self._gpus))  # one per GPU: a hung GPU holds only its own worker
        self._pool = _DaemonPool(workers, "gputop-nvml")
        self._lock = threading.Lock()
        self._turn = threading.Lock()  # see the module docstring: one GPU's short calls at a time

    def _start(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            raise NoDriverError("no NVIDIA driver found (libnvidia-ml.so.1 is not loadable)") from None
        except pynvml.NVMLError_DriverNotLoaded:
            raise NoDriverError("no NVIDIA driver found (the NVIDIA kernel driver is not loaded)") from None
        except pynvml.NVMLError as exc:
            raise GpuUnavailableError(f"NVML failed to start ({reason_of(exc)}: {exc})") from None
        try:
            self._read_static()
        except pynvml.NVMLError as exc:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
            raise GpuUnavailableError(f"NVML failed to list the GPUs ({reason_of(exc)}: {exc})") from None

    # ------------------------------------------------------------ static, once per run
    def _read_static(self) -> None:
        def optional(fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return fn(*args)
            except pynvml.NVMLError:
                return None

        self.driver_version = optional(lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
        self.nvml_version = optional(lambda: _text(pynvml.nvmlSystemGetNVMLVersion()))
        cuda = optional(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        if cuda is None:
            cuda = optional(pynvml.nvmlSystemGetCudaDriverVersion)
        self.cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None

        count = pynvml.nvmlDeviceGetCount()
        self._gpus: list[_Gpu] = []
        for index in range(count):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as exc:
                gpu = _Gpu(index=index, handle=None, name="unknown")
                gpu.static_unavailable["gpu"] = reason_of(exc)
                self._gpus.append(gpu)
                continue
            gpu = _Gpu(index=index, handle=handle)
            try:
                self._read_gpu_static(gpu)
            except _Lost:
                pass  # every sample will report it lost
            self._gpus.append(gpu)
        self.topology = self._read_topology()

    def _read_gpu_static(self, gpu: _Gpu) -> None:
        reading = _Reading(gpu)
        gpu.name = _text(reading.get("name", pynvml.nvmlDeviceGetName) or "unknown")
        gpu.uuid = _text(reading.get("uuid", pynvml.nvmlDeviceGetUUID) or "")
        pci = reading.get("pci_bus_id", pynvml.nvmlDeviceGetPciInfo)
        gpu.pci_bus_id = _text(pci.busId) if pci is not None else ""
        gpu.gen_max = reading.get("pcie.gen_max", pynvml.nvmlDeviceGetMaxPcieLinkGeneration)
        gpu.width_max = reading.get("pcie.width_max", pynvml.nvmlDeviceGetMaxPcieLinkWidth)
        gpu.supported_reasons = reading.get(
            "supported_throttle_reasons",
            pynvml.nvmlDeviceGetSupportedClocksEventReasons,
            fallback=pynvml.nvmlDeviceGetSupportedClocksThrottleReasons,
        )
        # NVLink wiring: which links exist (a link that answers its state, active or not) and where they go
        links: list[_NvLink] = []
        reason = None
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                pynvml.nvmlDeviceGetNvLinkState(gpu.handle, link)
            except pynvml.NVMLError_GpuIsLost:
                raise _Lost() from None
            except pynvml.NVMLError as exc:
                reason = reason_of(exc)
                break
            links.append(self._read_link_wiring(gpu, link))
        if links:
            gpu.nvlinks = links
        else:
            gpu.static_unavailable["nvlink"] = reason or "NotSupported"
        # probe the PCIe byte counters (a refusal falls back for good) and prime every counter so that the first
        # sample has rates
        readings, refusal = self._read_counters(gpu)
        self._pcie_rates(gpu, readings, refusal)
        for nvlink, (tx, rx) in zip(gpu.nvlinks or (), self._nvlink_readings(gpu, readings)):
            nvlink.last_tx, nvlink.last_rx = tx, rx
        self._watch_xids(gpu)
        self._start_gpm(gpu, reading)
        # keep only the static refusals that describe fields (name/uuid problems are rare and cosmetic)
        gpu.static_unavailable.update(
            {k: v for k, v in reading.unavailable.items() if k.startswith("pcie.") or k == "pci_bus_id"}
        )

    @staticmethod
    def _watch_xids(gpu: _Gpu) -> None:
        """Give the GPU an event set of its own for critical XIDs.  One set per GPU, not one for all:
        each GPU's reader drains its own set, so a GPU hung in the driver holds up nobody else's XIDs."""
        try:
            events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            gpu.static_unavailable["xids"] = reason_of(exc)
            return
        try:
            pynvml.nvmlDeviceRegisterEvents(gpu.handle, pynvml.nvmlEventTypeXidCriticalError, events)
        except pynvml.NVMLError as exc:
            gpu.static_unavailable["xids"] = reason_of(exc)
            try:
                pynvml.nvmlEventSetFree(events)
            except pynvml.NVMLError:
                pass
            return
        gpu.xid_events = events

    @staticmethod
    def _start_gpm(gpu: _Gpu, reading: _Reading) -> None:
        """GPM where the GPU has it: not before Hopper (nvmlGpmQueryDeviceSupport), not on a driver without the
        calls, and not in MIG mode (there GPM is per GPU instance, which gputop does not read)."""
        capability = reading.get("compute_capability", pynvml.nvmlDeviceGetCudaComputeCapability)
        gpu.compute_capability = (int(capability[0]), int(capability[1])) if capability is not None else None
        support = reading.get("gpm", pynvml.nvmlGpmQueryDeviceSupport)
        if support is None:
            gpu.static_unavailable["gpm"] = reading.unavailable.pop("gpm")
            return
        if not support.isSupportedDevice:
            gpu.static_unavailable["gpm"] = "NotSupported"  # before Hopper
            return
        mig = reading.get("mig_mode", pynvml.nvmlDeviceGetMigMode)
        reading.unavailable.pop("mig_mode", None)  # a GPU without MIG (most) refuses the question
        if mig is not None and mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
            gpu.static_unavailable["gpm"] = "MIG mode (GPM is per GPU instance there)"
            return
        try:
            gpm = _Gpm(gpu.handle)
        except pynvml.NVMLError as exc:
            gpu.static_unavailable["gpm"] = reason_of(exc)
            return
        try:
            gpm.prime()
        except pynvml.NVMLError_GpuIsLost:
            gpm.free()
            raise _Lost() from None
        except pynvml.NVMLError as exc:
            if reason_of(exc) in PERMANENT_REASONS:
                gpm.free()
                gpu.static_unavailable["gpm"] = reason_of(exc)
                return
        gpu.gpm = gpm

    @staticmethod
    def _read_gpm(gpu: _Gpu, r: _Reading) -> Optional[GpmMetrics]:
        """The GPM metrics over the interval since the previous refresh (see `_Gpm`); None where there are none."""
        gpm = gpu.gpm
        if gpm is None:
            return None
        try:
            return gpm.read(r)
        except pynvml.NVMLError_GpuIsLost:
            raise _Lost() from None
        except pynvml.NVMLError as exc:
            reason = reason_of(exc)
            if reason in PERMANENT_REASONS:  # stop asking, and give the buffers back
                gpu.gpm = None
                gpm.free()
                gpu.static_unavailable["gpm"] = reason
            r.unavailable["gpm"] = reason
            return None

    @staticmethod
    def _read_xids(gpu: _Gpu, r: _Reading, now: Callable[[], float]) -> Optional[tuple[XidEvent, ...]]:
        """Take what the driver queued since the last sample (never waits) and return the newest kept, each
        stamped `now()` as it is taken (NVML gives no time)."""
        if gpu.xid_events is None:
            return None
        for _ in range(XID_EVENTS_PER_SAMPLE):  # an XID storm must not keep one sample reading forever
            try:
                event = pynvml.nvmlEventSetWait_v2(gpu.xid_events, 0)
            except pynvml.NVMLError_Timeout:
                break  # the queue is empty
            except pynvml.NVMLError_GpuIsLost:
                raise _Lost() from None
            except pynvml.NVMLError as exc:
                r.unavailable["xids.read"] = reason_of(exc)  # keep what we have; ask again next sample
                break
            if event.eventType & pynvml.nvmlEventTypeXidCriticalError:
                gpu.xids.append(XidEvent(timestamp=now(), code=int(event.eventData)))
        return tuple(gpu.xids)

    @staticmethod
    def _read_link_wiring(gpu: _Gpu, link: int) -> _NvLink:
        entry = _NvLink(link=link)
        try:
            entry.remote_bus_id = _normalise_bus_id(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(gpu.handle, link).busId)
        except pynvml.NVMLError:
            pass  # an inactive link may not know its peer; we retry while it is active
        try:
            entry.remote_kind = _REMOTE_KINDS.get(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(gpu.handle, link))
        except pynvml.NVMLError:
            pass
        return entry

    def _read_topology(self) -> Topology:
        n = len(self._gpus)
        bus = [_normalise_bus_id(g.pci_bus_id) if g.pci_bus_id else None for g in self._gpus]
        active: list[list[_NvLink]] = []
        for gpu in self._gpus:
            links = []
            for link in gpu.nvlinks or ():
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(gpu.handle, link.link) == pynvml.NVML_FEATURE_ENABLED:
                        links.append(link)
                except pynvml.NVMLError:
                    pass
            active.append(links)
        switch_links = [sum(1 for link in links if link.remote_kind == "switch") for links in active]

        def nvlinks_between(a: int, b: int) -> int:
            # `nvidia-smi topo -m`: direct links a->b, and on NVSwitch systems (every link ends at a switch)
            # the narrower of the two GPUs' switch link counts
            direct = sum(1 for link in active[a] if link.remote_bus_id is not None and link.remote_bus_id == bus[b])
            via_switch = min(switch_links[a], switch_links[b]) if switch_links[a] and switch_links[b] else 0
            return direct + via_switch

        matrix = []
        for a in range(n):
            row = []
            for b in range(n):
                if a == b:
                    row.append("X")
                    continue
                count = nvlinks_between(a, b)
                if count:
                    row.append(f"NV{count}")
                    continue
                try:
                    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(self._gpus[a].handle, self._gpus[b].handle)
                    row.append(_TOPOLOGY_LABELS.get(level, "SYS"))
                except pynvml.NVMLError:
                    row.append("N/A")
            matrix.append(tuple(row))

        words = max(1, math.ceil(possible_cpus() / 64))
        affinity: list[Optional[str]] = []
        numa: list[Optional[int]] = []
        for gpu in self._gpus:
            try:
                cpus = _bits(pynvml.nvmlDeviceGetCpuAffinity(gpu.handle, words))
                # an empty mask is an answer (model.NO_NEAR_CPUS, ""): none of the CPUs this process may use are near the
                # GPU (a Slurm cgroup on the other socket); None is NVML refusing
                affinity.append(format_cpu_list(cpus))
            except (pynvml.NVMLError, TypeError):
                affinity.append(None)
            numa.append(self._numa_node(gpu))
        return Topology(matrix=tuple(matrix), cpu_affinity=tuple(affinity), numa_node=tuple(numa))

    @staticmethod
    def _numa_node(gpu: _Gpu) -> Optional[int]:
        try:
            nodes = _bits(pynvml.nvmlDeviceGetMemoryAffinity(gpu.handle, 1, pynvml.NVML_AFFINITY_SCOPE_NODE))
            if nodes:
                return nodes[0]
        except (pynvml.NVMLError, TypeError):
            pass
        try:
            node = pynvml.nvmlDeviceGetNumaNodeId(gpu.handle)
            return node if node >= 0 else None
        except (pynvml.NVMLError, TypeError):
            return None

    # ------------------------------------------------------------ properties for MachineInfo
    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    @property
    def gpu_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self._gpus)

    @property
    def bus_ids(self) -> tuple[Optional[str], ...]:
        """Each GPU's PCI bus id as NVML gives it (None where it gave none)."""
        return tuple(g.pci_bus_id or None for g in self._gpus)

    # ------------------------------------------------------------ per sample
    def sample(self) -> tuple[GpuSample, ...]:
        """Read every GPU concurrently; never raises for a per-field or per-GPU failure."""
        with _LIBRARY_LOCK, self._lock:
            if self._closed:
                raise GputopError("GPU collector used after close()")
            if pynvml.nvmlLib is not self._nvml_library:
                use_nvml_library(self._nvml_library)
            # while a GPU is stuck in the driver it may hold the turn: then nobody waits for it
            take_turns = all(gpu.future is None or gpu.future.done() for gpu in self._gpus)
            due = [gpu for gpu in self._gpus if gpu.future is None or gpu.future.done()]
            if take_turns and all(gpu.pcie_counters for gpu in due):
                # Nothing blocks for long and nobody is stuck: one task reads the GPUs in turn.  Eight threads
                # woken for one GPU each cost ~8% more of the whole monitor's CPU (side by side in ptys).
                turns: list[tuple[_Gpu, concurrent.futures.Future[GpuSample]]] = [
                    (gpu, concurrent.futures.Future()) for gpu in due
                ]
                for gpu, future in turns:
                    gpu.future = future
                self._pool.submit(self._read_in_turn, turns)
            else:
                for gpu in due:
                    gpu.future = self._pool.submit(self._read_gpu, gpu, take_turns)
            futures = [g.future for g in self._gpus if g.future is not None]  # every GPU's: submitted above
            concurrent.futures.wait(futures, timeout=self.sample_timeout_s)
            # GPUs the turn-taking task did not reach (one before them is stuck): each on a thread of its own,
            # so that a GPU hung in the driver still delays nobody else's reading past this sample
            late = [gpu for gpu, future in zip(self._gpus, futures) if future.cancel()]
            resubmitted = [self._pool.submit(self._read_gpu, gpu, False) for gpu in late]
            for gpu, future in zip(late, resubmitted):
                gpu.future = future
            if resubmitted:
                futures = [g.future for g in self._gpus if g.future is not None]
                concurrent.futures.wait(resubmitted, timeout=self.sample_timeout_s)
            samples = []
            for gpu, future in zip(self._gpus, futures):
                if future.done() and future.exception() is not None:
                    # not an NVML refusal (those are handled field by field): keep the other GPUs coming
                    exc = future.exception()
                    sample = self._identity(gpu, unavailable={"gpu": f"{type(exc).__name__}: {exc}"})
                elif future.done():
                    sample = future.result()
                    gpu.last = sample
                else:
                    sample = self._stale(gpu)
                samples.append(sample)
            return tuple(samples)

    def _read_in_turn(self, turns: list[tuple[_Gpu, concurrent.futures.Future[GpuSample]]]) -> None:
        """Read each GPU in order, each into its own future; one cancelled by the sample that gave up waiting (a
        GPU before it got stuck) is skipped."""
        for gpu, future in turns:
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._read_gpu(gpu))
            except BaseException as exc:  # handed to the sample through the future
                future.set_exception(exc)

    def _stale(self, gpu: _Gpu) -> GpuSample:
        note = f"NVML did not answer within {self.sample_timeout_s:g} s; showing the previous reading"
        base = gpu.last or self._identity(gpu)
        return replace(base, unavailable={**base.unavailable, "stale": note})

    @staticmethod
    def _identity(gpu: _Gpu, **fields: Any) -> GpuSample:
        return GpuSample(index=gpu.index, uuid=gpu.uuid, name=gpu.name, pci_bus_id=gpu.pci_bus_id, **fields)

    def _lost_sample(self, gpu: _Gpu) -> GpuSample:
        return self._identity(gpu, lost=True, unavailable={"gpu": "GpuIsLost"})

    def _read_gpu(self, gpu: _Gpu, take_turns: bool = False) -> GpuSample:
        if gpu.handle is None:  # NVML would not even give us a handle (lost at start, no permission, ...)
            reason = gpu.static_unavailable["gpu"]
            return self._identity(gpu, lost=reason == "GpuIsLost", unavailable={"gpu": reason})
        try:
            throughput = None
            if not gpu.pcie_counters:
                # the fallback's blocking calls first, concurrently with the other GPUs' (see the module docstring)
                reading = _Reading(gpu)
                reading.unavailable.clear()
                tx = reading.get("pcie.tx_bytes_per_s", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_TX_BYTES)
                rx = reading.get("pcie.rx_bytes_per_s", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_RX_BYTES)
                throughput = (self._kb_to_bytes(tx), self._kb_to_bytes(rx), reading.unavailable)
            has_turn = take_turns and self._turn.acquire(timeout=TURN_WAIT_S)
            try:
                return self._read_fields(gpu, _Reading(gpu), throughput)
            finally:
                if has_turn:
                    self._turn.release()
        except _Lost:
            return self._lost_sample(gpu)

    def _read_fields(
        self, gpu: _Gpu, r: _Reading, throughput: Optional[tuple[Optional[float], Optional[float], dict[str, str]]]
    ) -> GpuSample:
        """Every reading; PCIe traffic from the counters, or from `throughput` (the fallback's TX and RX bytes/s and
        refusals) when the GPU refused them."""
        now = self.clock.elapsed()
        refresh_slow = now >= gpu.slow.due
        util = r.get("utilization", pynvml.nvmlDeviceGetUtilizationRates)
        if util is None:
            r.unavailable["utilization_gpu"] = r.unavailable["utilization_memory"] = r.unavailable.pop("utilization")
        memory = r.get("memory", _memory_v2, fallback=_memory_v1)
        if memory is None:
            r.unavailable["memory_used"] = r.unavailable["memory_total"] = r.unavailable.pop("memory")
        temperature = r.get("temperature", _temperature_v, fallback=_temperature_v1)
        power = r.get("power", pynvml.nvmlDeviceGetPowerUsage)
        # the enforced limit moves only when someone sets it (nvidia-smi -pl, a BMC's cap): one call in 13 a
        # GPU a poll saved, and a new limit shows within SLOW_FIELDS_PERIOD_S
        power_limit = r.get_slow("power_limit", refresh_slow, pynvml.nvmlDeviceGetEnforcedPowerLimit)
        clock_sm = r.get("clock_sm", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_SM)
        clock_memory = r.get("clock_memory", pynvml.nvmlDeviceGetClockInfo, pynvml.NVML_CLOCK_MEM)
        readings, refusal = self._read_counters(gpu)
        if throughput is None:
            throughput = self._pcie_rates(gpu, readings, refusal)
        pcie = self._read_pcie(gpu, r, throughput)
        throttle = self._read_throttle(gpu, r)
        fields = dict(
            utilization_gpu=float(util.gpu) if util is not None else None,
            utilization_memory=float(util.memory) if util is not None else None,
            memory_used=int(memory.used) if memory is not None else None,
            memory_total=int(memory.total) if memory is not None else None,
            temperature=float(temperature) if temperature is not None else None,
            power=power / 1000.0 if power is not None else None,
            power_limit=power_limit / 1000.0 if power_limit is not None else None,
            clock_sm=clock_sm,
            clock_memory=clock_memory,
            pcie=pcie,
            nvlink=self._read_nvlink(gpu, r, refresh_slow, readings),
            throttle_reasons=throttle,
            **self._read_health(gpu, r, refresh_slow),
            processes=self._read_processes(r),
            xids=self._read_xids(gpu, r, self.clock.wall),
            gpm=self._read_gpm(gpu, r),
            compute_capability=gpu.compute_capability,
            unavailable=r.unavailable,
            mig=self._read_mig(gpu, refresh_slow),
            # the Fabric Manager's training changes only when it (re)starts: read with the slow fields
            fabric=r.get_slow("fabric", refresh_slow, _fabric_v, fallback=_fabric_v1),
        )
        if fields["mig"]:  # a process NVML lists on an instance only is on this GPU too
            fields["processes"] = self._with_mig_processes(fields["processes"], fields["mig"])
        sample = self._identity(gpu, **_shared_with(gpu.last, fields))
        if refresh_slow:  # only once everything read without the GPU being lost
            gpu.slow.due = now + SLOW_FIELDS_PERIOD_S
        return sample

    @staticmethod
    def _read_pcie(gpu: _Gpu, r: _Reading, throughput: tuple[Optional[float], Optional[float], dict[str, str]]) -> PcieLink:
        """The link's generation and width now, and the traffic (`throughput`: TX, RX bytes/s and refusals)."""
        tx, rx, throughput_unavailable = throughput
        pcie = PcieLink(
            gen_current=r.get("pcie.gen_current", pynvml.nvmlDeviceGetCurrPcieLinkGeneration),
            gen_max=gpu.gen_max,
            width_current=r.get("pcie.width_current", pynvml.nvmlDeviceGetCurrPcieLinkWidth),
            width_max=gpu.width_max,
            tx_bytes_per_s=tx,
            rx_bytes_per_s=rx,
        )
        r.unavailable.update(throughput_unavailable)  # where they were listed when read in this order
        return pcie

    @staticmethod
    def _read_throttle(gpu: _Gpu, r: _Reading) -> Optional[tuple[str, ...]]:
        """The clocks' event (throttle) reasons in force, of those the GPU supports."""
        mask = r.get(
            "throttle_reasons",
            pynvml.nvmlDeviceGetCurrentClocksEventReasons,
            fallback=pynvml.nvmlDeviceGetCurrentClocksThrottleReasons,
        )
        if mask is None:
            return None
        if gpu.supported_reasons is not None:
            mask &= gpu.supported_reasons
        return tuple(name for bit, name in _REASON_BITS if mask & bit)

    @staticmethod
    def _kb_to_bytes(kb: Optional[int]) -> Optional[float]:
        return float(kb) * 1024.0 if kb is not None else None  # NVML reports KB/s (1 KB = 1024 bytes)

    def _read_health(self, gpu: _Gpu, r: _Reading, refresh: bool) -> dict[str, Any]:
        """ECC counters and remapped rows: read when `refresh`, else the latest reading (see SLOW_FIELDS_PERIOD_S)."""
        slow = gpu.slow
        if refresh:
            before = set(r.unavailable)
            slow.ecc = self._read_ecc(r)
            slow.remapped_rows = self._read_remapped(r)
            slow.health_unavailable = {k: v for k, v in r.unavailable.items() if k not in before}
        else:
            r.unavailable.update(slow.health_unavailable)
        return {"ecc": slow.ecc, "remapped_rows": slow.remapped_rows}

    def _read_ecc(self, r: _Reading) -> Optional[EccCounts]:
        counts = {}
        for key, error_type, counter in (
            ("volatile_corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
            ("volatile_uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
            ("aggregate_corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
            ("aggregate_uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
        ):
            counts[key] = r.get(f"ecc.{key}", pynvml.nvmlDeviceGetTotalEccErrors, error_type, counter)
        if all(v is None for v in counts.values()):
            reasons = {r.unavailable.pop(f"ecc.{key}") for key in counts}
            r.unavailable["ecc"] = reasons.pop() if len(reasons) == 1 else "/".join(sorted(reasons))
            return None
        return EccCounts(**counts)

    @staticmethod
    def _read_remapped(r: _Reading) -> Optional[RemappedRows]:
        rows = r.get("remapped_rows", pynvml.nvmlDeviceGetRemappedRows)
        if rows is None:
            return None
        correctable, uncorrectable, pending, failed = rows
        return RemappedRows(
            correctable=int(correctable), uncorrectable=int(uncorrectable), pending=bool(pending), failed=bool(failed)
        )

    @staticmethod
    def _read_processes(r: _Reading) -> Optional[tuple[GpuProcess, ...]]:
        procs = r.get(
            "processes",
            pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
            fallback=pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
        )
        if procs is None:
            return None
        return tuple(GpuProcess(pid=int(p.pid), used_memory=p.usedGpuMemory) for p in procs)

    # ------------------------------------------------------------ MIG
    @staticmethod
    def _read_mig(gpu: _Gpu, refresh: bool) -> Optional[tuple[MigInstance, ...]]:
        """The GPU's MIG instances while MIG mode is on (None: off or not supported). NVML does not measure
        utilization on a MIG-enabled GPU nor on its instances: memory and processes are what there is.  The
        mode changes only with a GPU reset: it is read with the slow fields (`refresh`), the instances, which
        come and go, every sample."""
        if gpu.mig_supported is False:
            return None
        if refresh or gpu.mig_supported is None:
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(gpu.handle)
                gpu.mig_supported = True
                on = current == pynvml.NVML_DEVICE_MIG_ENABLE
                gpu.mig_devices = pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu.handle) if on else 0
            except pynvml.NVMLError_GpuIsLost:
                raise _Lost() from None
            except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
                if reason_of(exc) in PERMANENT_REASONS:
                    gpu.mig_supported = False
                gpu.mig_devices = 0
        if not gpu.mig_devices:
            return None
        instances = []
        for index in range(gpu.mig_devices):
            try:
                handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, index)
            except pynvml.NVMLError_GpuIsLost:
                raise _Lost() from None
            except pynvml.NVMLError:
                continue  # NotFound: no instance holds this index
            instance = GpuCollector._read_mig_device(gpu, handle)
            if instance is not None:
                instances.append(instance)
        gpu.mig_static = {m.uuid: gpu.mig_static[m.uuid] for m in instances}  # destroyed instances' go
        return tuple(instances)

    @staticmethod
    def _read_mig_device(gpu: _Gpu, handle: Any) -> Optional[MigInstance]:
        """One MIG device: its ids and profile (once per UUID), its memory and processes (every sample)."""

        def optional(fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return fn(handle, *args)
            except pynvml.NVMLError_GpuIsLost:
                raise _Lost() from None
            except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError):
                return None

        uuid = optional(pynvml.nvmlDeviceGetUUID)
        if uuid is None:
            return None  # destroyed between the two calls
        uuid = _text(uuid)
        static = gpu.mig_static.get(uuid)
        if static is None:
            gi, ci = optional(pynvml.nvmlDeviceGetGpuInstanceId), optional(pynvml.nvmlDeviceGetComputeInstanceId)
            if gi is None or ci is None:
                return None
            name = _text(optional(pynvml.nvmlDeviceGetName) or "")
            attributes = optional(pynvml.nvmlDeviceGetAttributes_v2)
            static = gpu.mig_static[uuid] = _MigStatic(
                gpu_instance_id=int(gi),
                compute_instance_id=int(ci),
                profile=_mig_profile_name(name),
                slices=int(attributes.gpuInstanceSliceCount) if attributes is not None else None,
                multiprocessors=int(attributes.multiprocessorCount) if attributes is not None else None,
            )
        memory = optional(_memory_v2)
        if memory is None:
            memory = optional(_memory_v1)
        procs = optional(pynvml.nvmlDeviceGetComputeRunningProcesses_v3)
        if procs is None:
            procs = optional(pynvml.nvmlDeviceGetComputeRunningProcesses_v2)
        return MigInstance(
            gpu_instance_id=static.gpu_instance_id,
            compute_instance_id=static.compute_instance_id,
            uuid=uuid,
            profile=static.profile,
            slices=static.slices,
            multiprocessors=static.multiprocessors,
            memory_used=int(memory.used) if memory is not None else None,
            memory_total=int(memory.total) if memory is not None else None,
            processes=tuple(GpuProcess(pid=int(p.pid), used_memory=p.usedGpuMemory) for p in procs)
            if procs is not None
            else None,
        )

    @staticmethod
    def _with_mig_processes(
        processes: Optional[tuple[GpuProcess, ...]], instances: tuple[MigInstance, ...]
    ) -> Optional[tuple[GpuProcess, ...]]:
        """The GPU's process list with every instance's process it lacks (without privileges NVML may list
        a MIG-enabled GPU's processes only on their instances)."""
        listed = {p.pid for p in processes or ()}
        extra = tuple(p for m in instances for p in m.processes or () if p.pid not in listed)
        if not extra:
            return processes
        return (*(processes or ()), *extra)

    # ------------------------------------------------------------ cumulative counters: NVLink and PCIe traffic
    def _read_counters(self, gpu: _Gpu) -> tuple[Optional[list[Any]], Optional[str]]:
        """One field-values call for every cumulative counter read each sample (see `_Gpu.counter_ids`): their
        readings in that order (see `_counter_readings`; None where NVML refused the entry) and None, or None and
        the reason when NVML refused the whole call.  No call when there is nothing to read."""
        ids = gpu.counter_ids
        if ids is None:
            ids = [(fid, link.link) for link in gpu.nvlinks or () for fid in (_NVLINK_TX, _NVLINK_RX)]
            if gpu.pcie_counters:
                ids += [(_PCIE_TX_BYTES, 0), (_PCIE_RX_BYTES, 0)]
            gpu.counter_ids, gpu.counter_values = ids, None
        if not ids:
            return [], None
        try:
            values = gpu.counter_values = _field_values(gpu.handle, ids, gpu.counter_values)
        except pynvml.NVMLError_GpuIsLost:
            raise _Lost() from None
        except pynvml.NVMLError as exc:
            return None, reason_of(exc)
        return _counter_readings(values), None

    @staticmethod
    def _nvlink_readings(gpu: _Gpu, readings: Optional[list[Any]]) -> list[tuple[Any, Any]]:
        """Per link of `gpu.nvlinks`, in order, its (TX, RX) readings out of `_read_counters`' (None: not read)."""
        links = gpu.nvlinks or ()
        if readings is None:
            return [(None, None)] * len(links)
        return [(readings[2 * i], readings[2 * i + 1]) for i in range(len(links))]

    def _pcie_rates(
        self, gpu: _Gpu, readings: Optional[list[Any]], refusal: Optional[str]
    ) -> tuple[Optional[float], Optional[float], dict[str, str]]:
        """PCIe TX and RX bytes/s from the byte counters in `_read_counters`' readings (the last two), derived as
        NVLink's are, and the reasons for what is missing.  A permanent refusal, of the call or of either entry, or a
        counter too narrow for the time between samples, moves this GPU to GetPcieThroughput for good (from its next
        sample)."""
        previous = gpu.last_pcie
        if readings is None:
            current = (None, None)
            reasons = dict.fromkeys(_PCIE_RATE_KEYS, refusal or "FieldValues refused")
        else:
            current = (readings[-2], readings[-1])
            entries = gpu.counter_values[-2:]
            refusals = zip(_PCIE_RATE_KEYS, map(_entry_refusal, entries))
            reasons = {key: refusal for key, refusal in refusals if refusal is not None}
        rates = [_counter_rate(before, now, 1.0) for before, now in zip(previous, current)]
        too_narrow = False
        for i, (key, before, now) in enumerate(zip(_PCIE_RATE_KEYS, previous, current)):
            if before is not None and now is not None and now[2] < 64:
                most = (now[1] - before[1]) / 1e6 * self._pcie_link_bytes_per_s(gpu)
                if most >= 1 << now[2]:  # it may have wrapped more than once: no reader can tell
                    rates[i], too_narrow = None, True
                    reasons[key] = f"{now[2]}-bit counter: may wrap more than once between samples"
        if too_narrow or any(reason in _PERMANENT_ENTRY_REASONS for reason in reasons.values()):
            gpu.pcie_counters = False
            gpu.counter_ids = None  # the next call asks for the NVLink counters alone
        # a refused reading keeps the last one as the base: the next rate spans both intervals
        gpu.last_pcie = tuple(now if now is not None else before for before, now in zip(previous, current))
        return rates[0], rates[1], reasons

    @staticmethod
    def _pcie_link_bytes_per_s(gpu: _Gpu) -> float:
        """The most the GPU's link carries each way at its maximum (the fastest known where NVML did not say)."""
        lane = _PCIE_LANE_BYTES_PER_S.get(gpu.gen_max or 0, max(_PCIE_LANE_BYTES_PER_S.values()))
        return lane * (gpu.width_max or 16)

    def _read_nvlink(self, gpu: _Gpu, r: _Reading, refresh_states: bool, readings: Optional[list[Any]]) -> Optional[NvLinks]:
        """Every link's state and TX/RX rates; `readings` is this sample's `_read_counters` (None: refused)."""
        if gpu.nvlinks is None:
            return None
        slow = gpu.slow
        if refresh_states:  # link up/down: see SLOW_FIELDS_PERIOD_S
            before = set(r.unavailable)
            states = {}
            for link in gpu.nvlinks:
                state = r.get(f"nvlink.{link.link}", pynvml.nvmlDeviceGetNvLinkState, link.link)
                states[link.link] = state
                if state and link.remote_bus_id is None:  # came up since start: learn where it goes
                    wiring = self._read_link_wiring(gpu, link.link)
                    link.remote_bus_id, link.remote_kind = wiring.remote_bus_id, wiring.remote_kind
            slow.link_states = states
            slow.link_unavailable = {k: v for k, v in r.unavailable.items() if k not in before}
        else:
            states = slow.link_states
            r.unavailable.update(slow.link_unavailable)
        if readings is None:
            r.unavailable["nvlink.throughput"] = "FieldValues refused"
        rate = _counter_rate
        link_wiring = []
        rates: list[Optional[float]] = []
        for link, (tx, rx) in zip(gpu.nvlinks, self._nvlink_readings(gpu, readings)):
            prev_tx, prev_rx = link.last_tx, link.last_rx
            if readings is not None:  # a refused call keeps the last readings: the next rate spans both intervals
                link.last_tx, link.last_rx = tx, rx
            active = bool(states[link.link])
            link_wiring.append((link.link, active, link.remote_bus_id, link.remote_kind))
            if active:
                rates += (rate(prev_tx, tx, 1024.0), rate(prev_rx, rx, 1024.0))  # the counters count KiB
            else:
                rates += (None, None)
        # the wiring (which rarely changes) is one object shared by every sample while it is the same; a sample
        # whose rates did not move either (idle or inactive links) is shared whole (see _shared_with)
        return NvLinks(shared_wiring(tuple(link_wiring)), rates)

    # ------------------------------------------------------------ details for `gputop check` and the report
    def details(self) -> tuple[GpuDetails, ...]:
        """Identity, modes and error counters of every GPU (see `GpuDetails`), read now, one GPU after another.

        Not part of `sample()`: a check or a report asks for it at the start and at the end of its window.
        Refusals become None plus `unavailable[field]`, as everywhere in this adapter."""
        with _LIBRARY_LOCK, self._lock:
            if self._closed:
                raise GputopError("GPU collector used after close()")
            if pynvml.nvmlLib is not self._nvml_library:
                use_nvml_library(self._nvml_library)
            return tuple(self._read_details(gpu) for gpu in self._gpus)

    def _read_details(self, gpu: _Gpu) -> GpuDetails:
        identity = functools.partial(
            GpuDetails, index=gpu.index, uuid=gpu.uuid, name=gpu.name, pci_bus_id=gpu.pci_bus_id, timestamp=self.clock.wall()
        )
        if gpu.handle is None:
            reason = gpu.static_unavailable["gpu"]
            return identity(lost=reason == "GpuIsLost", unavailable={"gpu": reason})
        r = _Reading(gpu)
        r.unavailable.clear()  # only what these reads refused
        try:
            ecc_mode = r.get("ecc_mode", pynvml.nvmlDeviceGetEccMode)
            persistence = r.get("persistence_mode", pynvml.nvmlDeviceGetPersistenceMode)
            single = r.get("retired_pages", pynvml.nvmlDeviceGetRetiredPages, _RETIRED_SINGLE_BIT)
            double = r.get("retired_pages", pynvml.nvmlDeviceGetRetiredPages, _RETIRED_DOUBLE_BIT)
            pending = r.get("retired_pages_pending", pynvml.nvmlDeviceGetRetiredPagesPendingStatus)
            return identity(
                serial=_optional_text(r.get("serial", pynvml.nvmlDeviceGetSerial)),
                vbios=_optional_text(r.get("vbios", pynvml.nvmlDeviceGetVbiosVersion)),
                board_part_number=_optional_text(r.get("board_part_number", pynvml.nvmlDeviceGetBoardPartNumber)),
                persistence_mode=None if persistence is None else persistence == pynvml.NVML_FEATURE_ENABLED,
                ecc_mode=None if ecc_mode is None else ecc_mode[0] == pynvml.NVML_FEATURE_ENABLED,
                ecc_mode_pending=None if ecc_mode is None else ecc_mode[1] == pynvml.NVML_FEATURE_ENABLED,
                app_clock_sm=r.get("app_clock_sm", pynvml.nvmlDeviceGetApplicationsClock, pynvml.NVML_CLOCK_SM),
                app_clock_sm_default=r.get(
                    "app_clock_sm_default", pynvml.nvmlDeviceGetDefaultApplicationsClock, pynvml.NVML_CLOCK_SM
                ),
                app_clock_memory=r.get("app_clock_memory", pynvml.nvmlDeviceGetApplicationsClock, pynvml.NVML_CLOCK_MEM),
                app_clock_memory_default=r.get(
                    "app_clock_memory_default", pynvml.nvmlDeviceGetDefaultApplicationsClock, pynvml.NVML_CLOCK_MEM
                ),
                pcie_replays=r.get("pcie_replays", pynvml.nvmlDeviceGetPcieReplayCounter),
                nvlink_errors=self._read_nvlink_errors(gpu, r),
                retired_pages_single_bit=None if single is None else len(single),
                retired_pages_double_bit=None if double is None else len(double),
                retired_pages_pending=None if pending is None else bool(pending),
                clock_event_ns=self._read_clock_events(r),
                unavailable=r.unavailable,
            )
        except _Lost:
            return identity(lost=True, unavailable={"gpu": "GpuIsLost"})

    @staticmethod
    def _read_nvlink_errors(gpu: _Gpu, r: _Reading) -> Optional[tuple[NvLinkErrors, ...]]:
        if gpu.nvlinks is None:
            r.unavailable["nvlink_errors"] = gpu.static_unavailable.get("nvlink", "NotSupported")
            return None
        out = []
        for link in gpu.nvlinks:
            counts = {
                name: r.get(f"nvlink_errors.{name}", pynvml.nvmlDeviceGetNvLinkErrorCounter, link.link, counter)
                for name, counter in _NVLINK_ERROR_COUNTERS
            }
            out.append(NvLinkErrors(link=link.link, **counts))
        return tuple(out)

    @staticmethod
    def _read_clock_events(r: _Reading) -> dict[str, int]:
        """Cumulative ns the clocks were held back, per reason NVML tracks (reasons it refuses are left out)."""
        out = {}
        for name, policy in _VIOLATION_POLICIES:
            status = r.get(f"clock_event_ns.{name}", pynvml.nvmlDeviceGetViolationStatus, policy)
            if status is not None:
                out[name] = int(status.violationTime)
        return out

    # ------------------------------------------------------------ the PCIe sources side by side (scripts/gpu_check.sh)
    def compare_pcie_sources(self, seconds: float = 5.0, glimpses: int = 10) -> list[dict[str, Any]]:
        """Per GPU: whether it answers the PCIe byte counters (and as which valueType), their TX/RX bytes/s over
        `seconds`, and the mean of `glimpses` GetPcieThroughput readings (20 ms each) taken evenly in the same
        window, so that a real machine shows how far the two sources agree.  Blocks for about `seconds`."""
        ids = [(_PCIE_TX_BYTES, 0), (_PCIE_RX_BYTES, 0)]

        def counters(gpu: _Gpu) -> list[Any]:
            try:
                values = _field_values(gpu.handle, ids, None)
            except pynvml.NVMLError as exc:
                return [reason_of(exc)] * 2 + [None]
            readings = _counter_readings(values)
            return [_entry_refusal(v) or reading for v, reading in zip(values, readings)] + [int(values[0].valueType)]

        with _LIBRARY_LOCK, self._lock:
            if pynvml.nvmlLib is not self._nvml_library:
                use_nvml_library(self._nvml_library)
            gpus = [gpu for gpu in self._gpus if gpu.handle is not None]
            first = {gpu.index: counters(gpu) for gpu in gpus}
            sums = {gpu.index: [0.0, 0.0, 0] for gpu in gpus}  # TX bytes/s, RX bytes/s, glimpses
            for _ in range(glimpses):
                time.sleep(seconds / glimpses)
                for gpu in gpus:
                    try:
                        tx = pynvml.nvmlDeviceGetPcieThroughput(gpu.handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
                        rx = pynvml.nvmlDeviceGetPcieThroughput(gpu.handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
                    except pynvml.NVMLError:
                        continue
                    total = sums[gpu.index]
                    total[0] += self._kb_to_bytes(tx) or 0.0  # a reading was taken: tx and rx are numbers
                    total[1] += self._kb_to_bytes(rx) or 0.0
                    total[2] += 1
            last = {gpu.index: counters(gpu) for gpu in gpus}
        out = []
        for gpu in gpus:
            before, after, (tx_sum, rx_sum, n) = first[gpu.index], last[gpu.index], sums[gpu.index]
            refused = next((x for x in before[:2] + after[:2] if isinstance(x, str)), None)
            out.append(
                {
                    "index": gpu.index,
                    "name": gpu.name,
                    "counters": refused or "supported",
                    "value_type": before[2] if refused is None else None,
                    "counter_tx_bytes_per_s": None if refused else _counter_rate(before[0], after[0], 1.0),
                    "counter_rx_bytes_per_s": None if refused else _counter_rate(before[1], after[1], 1.0),
                    "throughput_tx_bytes_per_s": tx_sum / n if n else None,
                    "throughput_rx_bytes_per_s": rx_sum / n if n else None,
                    "throughput_glimpses": n,
                }
            )
        return out

    # ------------------------------------------------------------ life
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # a stuck NVML call cannot be interrupted; do not wait for it
        self._pool.shutdown()
        with _LIBRARY_LOCK:
            if pynvml.nvmlLib is self._nvml_library:
                for gpu in self._gpus:
                    if gpu.xid_events is not None and (gpu.future is None or gpu.future.done()):
                        try:
                            pynvml.nvmlEventSetFree(gpu.xid_events)
                        except pynvml.NVMLError:
                            pass
                    if gpu.gpm is not None and (gpu.future is None or gpu.future.done()):
                        gpu.gpm.free()
                try:
                    pynvml.nvmlShutdown()
                except pynvml.NVMLError:
                    pass
                if self._library is not None:
                    use_nvml_library(None)
