"""The fake NVML library, driven through the REAL pynvml wrappers (nothing in pynvml is mocked)."""

from __future__ import annotations

import ctypes
import inspect

import pynvml
import pytest

from gputop.collect.gpu import use_nvml_library
from gputop.sim.fake_nvml import FakeNvmlLibrary, ManualClock
from gputop.sim.profiles import OLD_DRIVER_MISSING_SYMBOLS
from gputop.sim.spec import parse_spec
from tests.harness.nvml import ScriptedLoad


@pytest.fixture
def nvml():
    """Install a fake below pynvml and nvmlInit it; always shut down and uninstall."""
    installed = []

    def start(spec="h100-sxm-8", load=None, clock=None, **kwargs):
        lib = FakeNvmlLibrary(parse_spec(spec), load or ScriptedLoad(), clock=clock or ManualClock(), **kwargs)
        use_nvml_library(lib)
        pynvml.nvmlInit()
        installed.append(lib)
        return lib

    yield start
    if installed:
        pynvml.nvmlShutdown()
    use_nvml_library(None)


# ------------------------------------------------------------------ canary


def test_canary_private_pynvml_names_we_rely_on():
    """use_nvml_library and the fake lean on pynvml internals; a pynvml upgrade that moves them must fail here."""
    assert hasattr(pynvml, "nvmlLib")
    assert isinstance(pynvml._nvmlGetFunctionPointer_cache, dict)
    assert hasattr(pynvml.libLoadLock, "acquire")
    assert isinstance(pynvml._nvmlLib_refcount, int)
    src = inspect.getsource(pynvml._nvmlGetFunctionPointer)
    assert "getattr(nvmlLib, name)" in src  # symbols are looked up by attribute on the library object
    assert "if (nvmlLib == None)" in inspect.getsource(pynvml._LoadNvmlLibrary)  # a set nvmlLib is not replaced
    # the structs the fake fills in
    assert [f[0] for f in pynvml.c_nvmlMemory_v2_t._fields_] == ["version", "total", "reserved", "free", "used"]
    assert pynvml.nvmlMemory_v2 == 0x02000028
    assert pynvml.nvmlTemperature_v1 == 0x100000C
    assert [f[0] for f in pynvml.c_nvmlProcessInfo_v3_t._fields_][:2] == ["pid", "usedGpuMemory"]
    assert [f[0] for f in pynvml.c_nvmlFieldValue_t._fields_] == [
        "fieldId",
        "scopeId",
        "timestamp",
        "latencyUsec",
        "valueType",
        "nvmlReturn",
        "value",
    ]
    assert pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX == 138
    assert pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX == 139
    # the versioned symbols the wrappers ask for (the fake serves these names)
    assert '"nvmlDeviceGetCount_v2"' in inspect.getsource(pynvml.nvmlDeviceGetCount)
    assert '"nvmlDeviceGetPciInfo_v3"' in inspect.getsource(pynvml.nvmlDeviceGetPciInfo_v3)
    assert '"nvmlDeviceGetNvLinkRemotePciInfo_v2"' in inspect.getsource(pynvml.nvmlDeviceGetNvLinkRemotePciInfo)


def _layout(struct: type) -> list[tuple[str, int, int]]:
    """(field, offset, size) of a ctypes struct, nested arrays' elements included."""
    return [(name, getattr(struct, name).offset, getattr(struct, name).size) for name, *_ in struct._fields_]


def test_the_fakes_plain_structs_lay_out_memory_as_pynvmls():
    """The fake reads and writes the caller's buffers through its own plain structs (no pynvml import there):
    each must put every field where pynvml's struct (nvml.h's) does."""
    from gputop.sim import fake_nvml

    pairs = [
        (fake_nvml._FieldValue, pynvml.c_nvmlFieldValue_t),
        (fake_nvml._GpmMetric, pynvml.c_nvmlGpmMetric_t),
        (fake_nvml._GpmMetricsGet, pynvml.c_nvmlGpmMetricsGet_t),
    ]
    for ours, theirs in pairs:
        assert _layout(ours) == _layout(theirs), ours.__name__
        assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), ours.__name__
    assert fake_nvml.GPM_METRIC_MAX == pynvml.NVML_GPM_METRIC_MAX


def test_fake_serves_every_symbol_the_adapter_calls():
    """Every C symbol behind a pynvml wrapper that gputop.collect.gpu calls must be served by the fake."""
    import re

    import gputop.collect.gpu as adapter

    names = set(re.findall(r"pynvml\.(nvml\w+)", inspect.getsource(adapter)))
    wrappers = {name for name in names if inspect.isfunction(getattr(pynvml, name))}
    assert len(wrappers) > 25
    symbols = set()
    for name in wrappers:
        body = inspect.getsource(getattr(pynvml, name))
        symbols.update(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', body))
        # thin aliases (nvmlDeviceGetPciInfo -> _v3) name the wrapper they call instead
        for callee in re.findall(r"return (nvml\w+)\(", body):
            symbols.update(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', inspect.getsource(getattr(pynvml, callee))))
    lib = FakeNvmlLibrary(parse_spec("h100-sxm-8"), ScriptedLoad(), clock=ManualClock())
    missing = symbols - set(lib.symbol_names())
    assert not missing


# ------------------------------------------------------------------ the real wrappers over the fake


def test_identity_and_static_readings(nvml):
    nvml("h100-sxm-8")
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlSystemGetDriverVersion() == "560.35.03"
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12060
    names, uuids, buses = set(), set(), set()
    for i in range(8):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        names.add(pynvml.nvmlDeviceGetName(h))
        uuids.add(pynvml.nvmlDeviceGetUUID(h))
        buses.add(pynvml.nvmlDeviceGetPciInfo(h).busId)
    assert names == {"NVIDIA H100 80GB HBM3"}
    assert len(uuids) == 8 and all(u.startswith("GPU-") for u in uuids)
    assert len(buses) == 8
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(8)


def test_readings_follow_the_load_model(nvml):
    clock = ManualClock()
    load = ScriptedLoad(util={i: 0.0 for i in range(8)})
    nvml("h100-sxm-8", load=load, clock=clock)
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    idle_power = pynvml.nvmlDeviceGetPowerUsage(h)
    idle_temp = pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 0
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == 1  # idle links drop their speed
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonGpuIdle
    load.util[2] = 100.0
    clock.advance(1.0)
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 100
    assert pynvml.nvmlDeviceGetPowerUsage(h) > idle_power + 400_000  # mW
    assert pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) > idle_temp + 20
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == 5
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) > 1_000_000  # KB/s
    # another GPU stayed idle
    assert pynvml.nvmlDeviceGetUtilizationRates(pynvml.nvmlDeviceGetHandleByIndex(3)).gpu == 0


def test_memory_v2_and_v1(nvml):
    nvml("h100-sxm-8", load=ScriptedLoad(memory=10 * 1024**3))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert v2.used == 10 * 1024**3
    assert v2.total == v1.total == 81559 * 1024**2
    assert v1.used == v2.used + v2.reserved  # v1 counts reserved memory as used
    assert v2.free == v2.total - v2.reserved - v2.used


def test_memory_v2_checks_the_struct_version(nvml):
    nvml("h100-sxm-8")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(h, version=0x01000028)


def test_process_list_two_call_protocol(nvml):
    procs = {1: [(4242, 3 * 1024**3), (4343, None)], 2: [(p, 1024) for p in range(100, 140)]}
    nvml("h100-sxm-8", load=ScriptedLoad(processes=procs))
    assert pynvml.nvmlDeviceGetComputeRunningProcesses_v3(pynvml.nvmlDeviceGetHandleByIndex(0)) == []
    got = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert [(p.pid, p.usedGpuMemory) for p in got] == [(4242, 3 * 1024**3), (4343, None)]
    many = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(pynvml.nvmlDeviceGetHandleByIndex(2))
    assert [p.pid for p in many] == list(range(100, 140))


def test_nvlink_counters_are_cumulative_and_follow_load(nvml):
    clock = ManualClock()
    load = ScriptedLoad(util=0.0)
    nvml("h100-sxm-8", load=load, clock=clock)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    ids = [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0), (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 17)]

    def read():
        values = pynvml.nvmlDeviceGetFieldValues(h, ids)
        assert all(v.nvmlReturn == pynvml.NVML_SUCCESS for v in values)
        return [(v.value.ullVal, v.timestamp) for v in values]

    first = read()
    clock.advance(1.0)
    idle = read()
    load.util = 100.0
    clock.advance(1.0)
    busy = read()
    idle_rate = idle[0][0] - first[0][0]
    busy_rate = busy[0][0] - idle[0][0]
    assert idle[0][1] - first[0][1] == 1_000_000  # timestamps in µs follow the clock
    assert 0 < idle_rate < busy_rate
    assert busy[1][0] > idle[1][0] > first[1][0]
    # beyond the 18 links the entry carries its own error, the call succeeds
    values = pynvml.nvmlDeviceGetFieldValues(h, [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 18)])
    assert values[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_nvlink_wiring_ends_at_switches(nvml):
    nvml("h100-sxm-8")
    h = pynvml.nvmlDeviceGetHandleByIndex(5)
    assert all(pynvml.nvmlDeviceGetNvLinkState(h, link) == 1 for link in range(18))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkState(h, 18)
    assert pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    assert pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, 0).busId == "00000000:05:00.0"


def test_consumer_card_refuses_health_fields(nvml):
    nvml("rtx-4090-2")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for call in (
        lambda: pynvml.nvmlDeviceGetNvLinkState(h, 0),
        lambda: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        lambda: pynvml.nvmlDeviceGetRemappedRows(h),
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call()
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA GeForce RTX 4090"


def test_old_driver_lacks_new_symbols(nvml):
    nvml("h100-sxm-8+old-driver+thermal=0")
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlSystemGetCudaDriverVersion_v2()
    # the v1 calls still answer
    assert pynvml.nvmlDeviceGetMemoryInfo(h).total > 0
    assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) > 0
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12060
    # the v1 throttle call still carries the reasons: GPU 0 slows down on heat, GPU 1 runs free
    hot = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
    assert hot & pynvml.nvmlClocksThrottleReasonHwThermalSlowdown and hot & pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(pynvml.nvmlDeviceGetHandleByIndex(1)) == 0


def test_old_driver_symbol_list_names_real_pynvml_symbols():
    lib = FakeNvmlLibrary(parse_spec("h100-sxm-8"), ScriptedLoad(), clock=ManualClock())
    src = inspect.getsource(pynvml)
    for symbol in OLD_DRIVER_MISSING_SYMBOLS:
        assert f'"{symbol}"' in src, symbol
        assert symbol in lib.symbol_names()


def test_gpu_lost_after_the_given_time(nvml):
    clock = ManualClock()
    nvml("h100-sxm-8+gpu-lost=3@10", clock=clock)
    lost, fine = pynvml.nvmlDeviceGetHandleByIndex(3), pynvml.nvmlDeviceGetHandleByIndex(4)
    assert pynvml.nvmlDeviceGetUtilizationRates(lost).gpu == 50  # ScriptedLoad's: it still answers
    clock.advance(9.9)
    assert pynvml.nvmlDeviceGetPowerUsage(lost) > 0
    clock.advance(0.2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetUtilizationRates(lost)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetName(lost)
    assert pynvml.nvmlDeviceGetUtilizationRates(fine).gpu == 50  # the others go on answering


@pytest.mark.parametrize(
    "fault, check",
    [
        (
            "thermal=1",
            lambda h: (
                pynvml.nvmlDeviceGetTemperatureV(h, 0) >= 88
                and pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonHwThermalSlowdown
                and pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) < 1200
            ),
        ),
        (
            "pcie-degraded=1",
            lambda h: (
                (
                    pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                    pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
                    pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                    pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
                )
                == (3, 8, 5, 16)
            ),
        ),
        (
            "ecc=1",
            lambda h: (
                pynvml.nvmlDeviceGetTotalEccErrors(h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC) > 0
                and pynvml.nvmlDeviceGetRemappedRows(h)[2] == 1
            ),
        ),
        ("nvlink-down=1", lambda h: [pynvml.nvmlDeviceGetNvLinkState(h, i) for i in range(18)].count(0) == 4),
        (
            "power=1",
            lambda h: (
                pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 385_000
                and pynvml.nvmlDeviceGetPowerUsage(h) <= 385_000
                and pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonSwPowerCap
            ),
        ),
    ],
)
def test_faults_hit_only_their_gpu(nvml, fault, check):
    nvml(f"h100-sxm-8+{fault}", load=ScriptedLoad(util=95.0))
    assert check(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert not check(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_fixed_clock_gives_identical_readings():
    def readings():
        clock = ManualClock(5000.0)
        from gputop.sim.synthetic import SyntheticLoad

        lib = FakeNvmlLibrary(parse_spec("h100-sxm-8"), SyntheticLoad(8, 80 * 1024**3), clock=clock, pcie_latency_s=0)
        use_nvml_library(lib)
        pynvml.nvmlInit()
        try:
            out = []
            for step in range(3):
                clock.advance(0.7)
                for i in range(8):
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    out.append(
                        (
                            pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                            pynvml.nvmlDeviceGetPowerUsage(h),
                            pynvml.nvmlDeviceGetFieldValues(h, [(138, 0)])[0].value.ullVal,
                        )
                    )
            return out
        finally:
            pynvml.nvmlShutdown()
            use_nvml_library(None)

    first, second = readings(), readings()
    assert first == second
    assert len({u for u, _, _ in first}) > 3  # and it is not a constant


def test_handles_are_pointers_the_fake_can_resolve(nvml):
    nvml("rtx-4090-2")
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert isinstance(h, pynvml.c_nvmlDevice_t)
    assert ctypes.cast(h, ctypes.c_void_p).value == 2
    bogus = ctypes.cast(ctypes.c_void_p(99), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(bogus)


def test_xid_reaches_every_event_set_registered_for_its_gpu_once(nvml):
    clock = ManualClock()
    nvml("h100-sxm-8+xid=2:74@5", clock=clock)
    gpu2 = pynvml.nvmlDeviceGetHandleByIndex(2)
    first, second, other = pynvml.nvmlEventSetCreate(), pynvml.nvmlEventSetCreate(), pynvml.nvmlEventSetCreate()
    for events in (first, second):
        pynvml.nvmlDeviceRegisterEvents(gpu2, pynvml.nvmlEventTypeXidCriticalError, events)
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(3), pynvml.nvmlEventTypeXidCriticalError, other)
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(first, 0)  # not due yet
    clock.advance(5.0)
    pynvml.nvmlEventSetFree(other)
    fresh = pynvml.nvmlEventSetCreate()  # a new set gets a new handle, never a freed one's
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlEventSetWait_v2(other, 0)
    for events in (first, second):
        data = pynvml.nvmlEventSetWait_v2(events, 0)
        assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 74)
        assert ctypes.cast(data.device, ctypes.c_void_p).value == ctypes.cast(gpu2, ctypes.c_void_p).value
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(events, 0)  # delivered once
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(fresh, 0)  # registered for nothing
