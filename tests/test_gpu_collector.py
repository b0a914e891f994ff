"""The GPU adapter (gputop.collect.gpu) over the fake NVML library, through the real pynvml wrappers."""

from __future__ import annotations

import collections
import ctypes.util
import subprocess
import threading
import time

import pynvml
import pytest

from gputop.clock import clock_of
from gputop.collect.gpu import (
    GpuCollector,
    NoDriverError,
    _normalise_bus_id,
    format_cpu_list,
    use_nvml_library,
)
from gputop.model import THROTTLE_REASONS
from gputop.sim import fake_nvml
from gputop.sim.fake_nvml import FakeNvmlLibrary, ManualClock
from gputop.sim.profiles import H100_SXM, RTX_4090
from gputop.sim.spec import parse_spec
from tests.harness.nvml import ScriptedLoad
from tests.harness.processes import wait_until

GIB = 1024**3


class Wrapped:
    """A library in front of the fake: counts calls per symbol and can replace symbols."""

    def __init__(self, lib, **overrides):
        self.lib = lib
        self.overrides = overrides
        self.counts: collections.Counter = collections.Counter()

    def __getattr__(self, name):
        fn = self.overrides.get(name) or getattr(self.lib, name)

        def counted(*args):
            self.counts[name] += 1
            return fn(*args)

        return counted


@pytest.fixture
def collector():
    """make(spec, load=..., clock=..., wrap=...) -> (GpuCollector, fake); closed at teardown.  The fake and the
    collector run on the one clock (a ManualClock unless given), as a simulated machine's do."""
    made = []

    def make(spec="h100-sxm-8", load=None, clock=None, pcie_latency_s=0.0, wrap=None, fake_options=None, **kwargs):
        clock = clock or ManualClock()
        kwargs.setdefault("clock", clock_of(clock))
        fake = FakeNvmlLibrary(
            parse_spec(spec),
            load or ScriptedLoad(util=80.0),
            clock=clock,
            pcie_latency_s=pcie_latency_s,
            **(fake_options or {}),
        )
        lib = wrap(fake) if wrap else fake
        gpu = GpuCollector(library=lib, **kwargs)
        made.append(gpu)
        return gpu, lib

    yield make
    for gpu in made:
        gpu.close()
    use_nvml_library(None)


def test_field_values_are_unpacked_where_pynvml_lays_them_out():
    """The counters are read from the field-values array with one `struct` unpack: its format must put each field
    where pynvml's (nvml.h's) struct has it, and a narrower member of the value union must come out as ctypes reads it."""
    from gputop.collect.gpu import _FIELD_VALUE, _counter_readings, _FieldValueView

    assert _FIELD_VALUE.size == ctypes.sizeof(pynvml.c_nvmlFieldValue_t)
    values = (_FieldValueView * 3)()
    values[0].timestamp, values[0].valueType, values[0].value.ullVal = 1_000, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 2**40 + 7
    values[1].timestamp, values[1].valueType, values[1].value.uiVal = 2_000, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 2**32 - 5
    values[2].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert _counter_readings(values) == [(2**40 + 7, 1_000, 64), (2**32 - 5, 2_000, 32), None]
    values[1].value.ullVal = (123 << 32) | 9  # bytes beyond a 32-bit member are not its value
    assert _counter_readings(values)[1] == (values[1].value.uiVal, 2_000, 32) == (9, 2_000, 32)


def test_h100_every_field(collector):
    clock = ManualClock()
    procs = {0: [(4242, 3 * GIB)]}
    gpu, _ = collector("h100-sxm-8", load=ScriptedLoad(util=80.0, memory=40 * GIB, processes=procs), clock=clock)
    assert gpu.gpu_count == 8
    assert gpu.gpu_names == ("NVIDIA H100 80GB HBM3",) * 8
    assert (gpu.driver_version, gpu.cuda_version, gpu.nvml_version) == ("560.35.03", "12.6", "12.560.35.03")
    clock.advance(1.0)
    samples = gpu.sample()
    assert [s.index for s in samples] == list(range(8))
    assert len({s.uuid for s in samples}) == 8
    for s in samples:
        assert s.unavailable == {}, s.unavailable
        assert not s.lost
        assert s.name == "NVIDIA H100 80GB HBM3"
        assert s.pci_bus_id.startswith("00000000:")
        assert s.utilization_gpu == 80.0 and s.utilization_memory == 36.0
        assert s.memory_used == 40 * GIB and s.memory_total == H100_SXM.memory_total
        assert 40 < s.temperature < 80
        assert 300 < s.power < s.power_limit == 700.0
        assert s.clock_sm == 1980 and s.clock_memory == 2619
        assert (s.pcie.gen_current, s.pcie.gen_max, s.pcie.width_current, s.pcie.width_max) == (5, 5, 16, 16)
        assert s.pcie.rx_bytes_per_s > s.pcie.tx_bytes_per_s > 0
        assert len(s.nvlink) == 18 and all(link.active for link in s.nvlink)
        assert {link.remote_kind for link in s.nvlink} == {"switch"}
        assert all(link.tx_bytes_per_s > 0 and link.rx_bytes_per_s > 0 for link in s.nvlink)
        assert s.throttle_reasons == ()
        assert (s.ecc.volatile_corrected, s.ecc.volatile_uncorrected) == (0, 0)
        assert (s.ecc.aggregate_corrected, s.ecc.aggregate_uncorrected) == (0, 0)
        assert s.remapped_rows.pending is False and s.remapped_rows.uncorrectable == 0
    assert [(p.pid, p.used_memory) for p in samples[0].processes] == [(4242, 3 * GIB)]
    assert samples[1].processes == ()


def test_topology_matrix_affinity_and_numa(collector):
    gpu, _ = collector("h100-sxm-8")
    topo = gpu.topology
    assert len(topo.matrix) == 8
    for a in range(8):
        for b in range(8):
            assert topo.matrix[a][b] == ("X" if a == b else "NV18")
    assert topo.numa_node == (0, 0, 0, 0, 1, 1, 1, 1)
    assert topo.cpu_affinity[0] == topo.cpu_affinity[3] and all(topo.cpu_affinity)


def test_topology_without_nvlink_uses_the_pcie_ancestor(collector):
    gpu, _ = collector("rtx-4090-2")
    assert gpu.topology.matrix == (("X", "PHB"), ("PHB", "X"))
    assert gpu.topology.numa_node == (0, 0)


def test_nvlink_down_narrows_the_topology_and_links(collector):
    clock = ManualClock()
    gpu, _ = collector("h100-sxm-8+nvlink-down=4", clock=clock)
    topo = gpu.topology.matrix
    assert topo[4][0] == topo[0][4] == "NV14"
    assert topo[1][2] == "NV18"
    clock.advance(1.0)
    links = gpu.sample()[4].nvlink
    down = [link for link in links if not link.active]
    assert len(down) == 4
    assert all(link.tx_bytes_per_s is None for link in down)
    assert all(link.tx_bytes_per_s > 0 for link in links if link.active)


def test_the_samples_a_history_keeps_share_the_link_wiring_and_unchanged_rates(collector):
    # the TUI keeps 600 samples: the wiring of a GPU's links is one object for all of them, and a sample
    # whose rates did not move (idle or inactive links) is the previous one
    clock, load = ManualClock(), ScriptedLoad(util=50.0)
    gpu, _ = collector("h100-sxm-8+nvlink-down=4", load=load, clock=clock)
    clock.advance(1.0)
    gpu.sample()
    clock.advance(1.0)
    first = gpu.sample()[4].nvlink
    clock.advance(1.0)
    same_load = gpu.sample()[4].nvlink  # the same traffic as a second ago: every link reads the same
    assert sum(1 for link in same_load if not link.active) == 4
    assert same_load is first
    load.util = 90.0
    clock.advance(1.0)
    busier = gpu.sample()[4].nvlink
    assert busier is not same_load and busier.wiring is same_load.wiring
    for now, then in zip(busier, same_load):
        if now.active:  # its rate moved
            assert now.tx_bytes_per_s > then.tx_bytes_per_s
        else:
            assert now == then and now.tx_bytes_per_s is None


def test_a_reading_that_repeats_is_the_previous_samples_object(collector):
    # the TUI keeps 600 samples: limits, clocks, the PCIe link and the refusals repeat; each is one object then
    clock, load = ManualClock(), ScriptedLoad(util=50.0)
    gpu, _ = collector("rtx-4090-2", load=load, clock=clock)  # no NVLink, no ECC: `unavailable` says so
    clock.advance(1.0)
    before = gpu.sample()[0]
    load.util = 90.0
    clock.advance(1.0)
    after = gpu.sample()[0]
    assert after.power_limit == before.power_limit and after.power_limit is before.power_limit
    assert after.memory_total is before.memory_total and after.pcie.gen_max == before.pcie.gen_max
    assert after.unavailable == {
        "ecc": "NotSupported",
        "nvlink": "NotSupported",
        "remapped_rows": "NotSupported",
        "gpm": "NotSupported",
        "fabric": "NotSupported",  # no NVSwitch fabric on a consumer card
    }
    assert after.unavailable is before.unavailable
    # what moved is read anew
    assert after.utilization_gpu == 90.0 and before.utilization_gpu == 50.0
    assert after.power > before.power and after.pcie != before.pcie


def test_nvlink_rate_is_delta_over_time(collector):
    clock = ManualClock()
    gpu, _ = collector("h100-sxm-8", load=ScriptedLoad(util=100.0), clock=clock)
    clock.advance(2.0)
    link5 = gpu.sample()[0].nvlink[5]
    expected_tx = H100_SXM.nvlink_peak_kibps * 1.0 * (1.0 + 0.01 * 5) * 1024
    assert link5.tx_bytes_per_s == pytest.approx(expected_tx, rel=1e-3)
    # no time passed: no rate (rather than a division by zero or a fake 0)
    assert gpu.sample()[0].nvlink[5].tx_bytes_per_s is None


def test_consumer_card_reports_not_available_not_zero(collector):
    clock = ManualClock()
    gpu, _ = collector("rtx-4090-2", clock=clock)
    clock.advance(1.0)
    samples = gpu.sample()
    assert len(samples) == 2  # the profile's two cards, each checked below
    for s in samples:
        assert s.ecc is None and s.unavailable["ecc"] == "NotSupported"
        assert s.nvlink is None and s.unavailable["nvlink"] == "NotSupported"
        assert s.remapped_rows is None and s.unavailable["remapped_rows"] == "NotSupported"
        assert s.utilization_gpu == 80.0 and s.power > 0 and s.pcie.gen_max == 4
        assert s.gpm is None and s.unavailable["gpm"] == "NotSupported"  # Ada: no GPM, absent rather than 0
        assert s.fabric is None and s.unavailable["fabric"] == "NotSupported"  # no NVSwitch fabric: not a fault
        assert set(s.unavailable) == {"ecc", "nvlink", "remapped_rows", "gpm", "fabric"}


def test_permanent_refusals_are_not_asked_again(collector):
    clock = ManualClock()
    gpu, lib = collector("rtx-4090-2", clock=clock, wrap=Wrapped)
    gpu.sample()
    before = collections.Counter(lib.counts)
    clock.advance(1.0)
    gpu.sample()
    per_sample = lib.counts - before
    assert per_sample["nvmlDeviceGetTotalEccErrors"] == 0
    assert per_sample["nvmlDeviceGetRemappedRows"] == 0
    assert per_sample["nvmlDeviceGetUtilizationRates"] == 2


def test_static_information_is_read_once(collector):
    clock = ManualClock()
    gpu, lib = collector("h100-sxm-8", clock=clock, wrap=Wrapped)
    before = collections.Counter(lib.counts)
    clock.advance(1.0)
    gpu.sample()
    per_sample = lib.counts - before
    for static in (
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo_v3",
        "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetTopologyCommonAncestor",
        "nvmlDeviceGetCpuAffinity",
        "nvmlDeviceGetSupportedClocksEventReasons",
        "nvmlSystemGetDriverVersion",
    ):
        assert per_sample[static] == 0, static
    assert per_sample["nvmlDeviceGetFieldValues"] == 8  # one call per GPU for all NVLink and PCIe counters
    assert per_sample["nvmlDeviceGetPcieThroughput"] == 0  # Hopper answers the PCIe byte counters


def test_no_permission_becomes_a_reason(collector):
    def refuse(*args):
        return pynvml.NVML_ERROR_NO_PERMISSION

    gpu, lib = collector("h100-sxm-8", wrap=lambda fake: Wrapped(fake, nvmlDeviceGetComputeRunningProcesses_v3=refuse))
    s = gpu.sample()[0]
    assert s.processes is None and s.unavailable == {"processes": "NoPermission"}
    assert s.utilization_gpu == 80.0
    gpu.sample()
    assert lib.counts["nvmlDeviceGetComputeRunningProcesses_v3"] == 8  # asked once per GPU, then remembered


def test_transient_error_is_asked_again(collector):
    def unknown(*args):
        return pynvml.NVML_ERROR_UNKNOWN

    gpu, lib = collector("h100-sxm-8", wrap=lambda fake: Wrapped(fake, nvmlDeviceGetPowerUsage=unknown))
    assert gpu.sample()[3].unavailable == {"power": "Unknown"}
    gpu.sample()
    assert lib.counts["nvmlDeviceGetPowerUsage"] == 16


def test_the_power_limit_is_read_with_the_slow_fields_and_its_refusal_carried_between(collector):
    """The enforced power limit moves only when someone sets it: read every SLOW_FIELDS_PERIOD_S, and between two
    reads every sample carries the last value, or the last refusal's reason."""
    from gputop.collect import gpu as gpu_module

    clock = ManualClock(1000.0)
    answers = [pynvml.NVML_ERROR_UNKNOWN] * 8  # the first read of each GPU fails, for a while

    def flaky_limit(handle, out):
        return answers.pop() if answers else fake.nvmlDeviceGetEnforcedPowerLimit(handle, out)

    fake = None

    def wrap(lib):
        nonlocal fake
        fake = lib
        return Wrapped(lib, nvmlDeviceGetEnforcedPowerLimit=flaky_limit)

    gpu, lib = collector("h100-sxm-8", wrap=wrap, clock=clock)
    first = gpu.sample()
    clock.advance(1.0)
    second = gpu.sample()
    assert lib.counts["nvmlDeviceGetEnforcedPowerLimit"] == 8  # once per GPU in the period
    assert all(s.power_limit is None and s.unavailable["power_limit"] == "Unknown" for s in first + second)
    clock.advance(gpu_module.SLOW_FIELDS_PERIOD_S)
    third = gpu.sample()
    clock.advance(1.0)
    fourth = gpu.sample()
    assert lib.counts["nvmlDeviceGetEnforcedPowerLimit"] == 16
    assert all(s.power_limit == 700.0 and "power_limit" not in s.unavailable for s in third + fourth)


def test_lost_gpu_is_marked_and_the_others_keep_updating(collector):
    clock = ManualClock()
    load = ScriptedLoad(util={i: 50.0 for i in range(8)})
    gpu, _ = collector("h100-sxm-8+gpu-lost=3@10", load=load, clock=clock)
    clock.advance(5.0)
    before = gpu.sample()
    assert not any(s.lost for s in before)
    clock.advance(6.0)
    for i in range(8):
        load.util[i] = 90.0
    after = gpu.sample()
    lost = after[3]
    assert lost.lost and lost.unavailable == {"gpu": "GpuIsLost"}
    assert lost.utilization_gpu is None and lost.memory_used is None
    assert (lost.uuid, lost.name, lost.pci_bus_id) == (before[3].uuid, before[3].name, before[3].pci_bus_id)
    assert [s.utilization_gpu for i, s in enumerate(after) if i != 3] == [90.0] * 7
    assert gpu.sample()[3].lost  # and it stays lost


def test_old_driver_falls_back_to_v1_calls(collector):
    clock = ManualClock()
    procs = {2: [(777, GIB)]}
    gpu, lib = collector(
        "h100-sxm-8+old-driver+thermal=1",
        load=ScriptedLoad(memory=10 * GIB, processes=procs),
        clock=clock,
        wrap=Wrapped,
    )
    assert gpu.cuda_version == "12.6"  # from nvmlSystemGetCudaDriverVersion
    clock.advance(1.0)
    samples = gpu.sample()
    assert len(samples) == 8
    for s in samples:
        assert s.unavailable == {}
        assert s.memory_used == 10 * GIB + H100_SXM.memory_reserved  # v1 counts reserved memory as used
        assert s.temperature is not None
    assert "hw_thermal" in samples[1].throttle_reasons
    assert [p.pid for p in samples[2].processes] == [777]
    assert lib.counts["nvmlDeviceGetTemperature"] >= 8
    assert lib.counts["nvmlDeviceGetCurrentClocksThrottleReasons"] >= 8
    assert lib.counts["nvmlDeviceGetComputeRunningProcesses_v2"] >= 8


@pytest.mark.parametrize(
    "fault, check",
    [
        (
            "thermal=2",
            lambda s: (
                s.temperature >= 88
                and {"hw_thermal", "sw_thermal", "hw_slowdown"} <= set(s.throttle_reasons)
                and s.clock_sm < 1200
            ),
        ),
        (
            "pcie-degraded=2",
            lambda s: (
                (s.pcie.gen_current, s.pcie.width_current, s.pcie.gen_max, s.pcie.width_max) == (3, 8, 5, 16)
                and s.pcie.downgraded
            ),
        ),
        ("ecc=2", lambda s: s.ecc.volatile_uncorrected > 0 and s.remapped_rows.pending),
        ("power=2", lambda s: s.power_limit == 385.0 and "sw_power_cap" in s.throttle_reasons and s.power <= 385.0),
    ],
)
def test_faults_behave_as_named(collector, fault, check):
    clock = ManualClock()
    gpu, _ = collector(f"h100-sxm-8+{fault}", load=ScriptedLoad(util=95.0), clock=clock)
    clock.advance(1.0)
    samples = gpu.sample()
    assert len(samples) == 8  # so "no other GPU" below means seven
    assert check(samples[2])
    assert not any(check(s) for i, s in enumerate(samples) if i != 2)


def test_idle_gpus_drop_the_link_but_a_degraded_one_is_told_apart_by_load(collector):
    clock = ManualClock()
    load = ScriptedLoad(util={i: 0.0 for i in range(8)})
    gpu, _ = collector("h100-sxm-8+pcie-degraded=2", load=load, clock=clock)
    idle = gpu.sample()
    assert all(s.pcie.gen_current == 1 and s.throttle_reasons == ("gpu_idle",) for s in idle)
    load.util[2] = 90.0
    clock.advance(1.0)
    assert gpu.sample()[2].pcie.gen_current == 3


def test_sample_reads_gpus_concurrently(collector):
    """Each real PCIe throughput call blocks ~20 ms: 8 GPUs x 2 in series would be 320 ms a sample.  (An old
    driver has no PCIe byte counters, so every GPU is on GetPcieThroughput.)  The second sample's calls are
    held at a barrier that opens only once all eight GPUs are inside one: read one after another, it breaks."""
    all_inside = threading.Barrier(8, timeout=10)
    held = threading.Event()
    broken = []

    def wrap(fake):
        real = fake.nvmlDeviceGetPcieThroughput

        def meet_the_other_gpus(*args):
            if held.is_set():
                try:
                    all_inside.wait()
                except threading.BrokenBarrierError:
                    broken.append(args[0])
            return real(*args)

        return Wrapped(fake, nvmlDeviceGetPcieThroughput=meet_the_other_gpus)

    gpu, lib = collector("h100-sxm-8+old-driver", clock=time.monotonic, wrap=wrap, sample_timeout_s=30)
    gpu.sample()
    assert lib.counts["nvmlDeviceGetPcieThroughput"] == 16
    held.set()
    samples = gpu.sample()
    assert not broken and not all_inside.broken, "the GPUs' PCIe calls did not overlap"
    assert lib.counts["nvmlDeviceGetPcieThroughput"] == 32  # TX and RX of each GPU, each round met by all eight
    assert all("stale" not in s.unavailable and s.pcie.tx_bytes_per_s is not None for s in samples)


def test_a_hung_gpu_does_not_stall_the_sample(collector):
    release = threading.Event()
    entered = collections.Counter()

    def wrap(fake):
        real = fake.nvmlDeviceGetUtilizationRates

        def hang_on_gpu5(handle, out):
            if ctypes.cast(handle, ctypes.c_void_p).value == 6:
                entered["gpu5"] += 1
                release.wait(30)
                entered["gpu5 returned"] += 1
            return real(handle, out)

        return Wrapped(fake, nvmlDeviceGetUtilizationRates=hang_on_gpu5)

    gpu, _ = collector("h100-sxm-8", wrap=wrap, sample_timeout_s=0.3)
    try:
        first = gpu.sample()
        assert entered["gpu5 returned"] == 0  # the sample came back while GPU 5's call was still held
        assert "stale" in first[5].unavailable
        assert all("stale" not in s.unavailable for i, s in enumerate(first) if i != 5)
        second = gpu.sample()
        assert "stale" in second[5].unavailable
        assert entered["gpu5"] == 1  # no second read queued behind the stuck one
    finally:
        release.set()
    recovered = wait_until(lambda: (s := gpu.sample()[5]) and "stale" not in s.unavailable and s, what="GPU 5 answers")
    assert recovered.utilization_gpu == 80.0


def test_the_gpus_are_read_in_turn_by_one_task_while_none_is_stuck_and_each_on_its_own_after(collector):
    """The usual sample wakes one reader thread, not one per GPU; when a GPU gets stuck in it, the GPUs after
    it are read on threads of their own within the same sample, and so are the others from then on."""
    readers: dict[int, set[str]] = collections.defaultdict(set)
    release = threading.Event()
    stuck = threading.Event()

    def wrap(fake):
        real = fake.nvmlDeviceGetUtilizationRates

        def note_the_thread(handle, out):
            gpu = ctypes.cast(handle, ctypes.c_void_p).value - 1
            readers[gpu].add(threading.current_thread().name)
            if gpu == 2 and stuck.is_set():
                release.wait(30)
            return real(handle, out)

        return Wrapped(fake, nvmlDeviceGetUtilizationRates=note_the_thread)

    gpu, _ = collector("h100-sxm-8", wrap=wrap, sample_timeout_s=0.3)
    try:
        for _ in range(3):
            readers.clear()
            gpu.sample()
            assert len(readers) == 8 and len(set().union(*readers.values())) == 1, readers  # one task for all
        stuck.set()
        first = gpu.sample()  # GPU 2 hangs in the turn-taking task: 3-7 are then read on threads of their own
        assert [i for i, s in enumerate(first) if "stale" in s.unavailable] == [2]
        second = gpu.sample()  # still stuck: the others are read, each by a task of its own
        assert [i for i, s in enumerate(second) if "stale" in s.unavailable] == [2]
    finally:
        release.set()


def test_no_driver_message():
    """Where libnvidia-ml cannot load (this box), nvmlInit fails and the adapter says so in one line."""
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("libnvidia-ml is present here")
    use_nvml_library(None)
    with pytest.raises(NoDriverError, match=r"^no NVIDIA driver found \(libnvidia-ml.so.1 is not loadable\)$"):
        GpuCollector()


def test_driver_not_loaded_message():
    class KernelModuleMissing:
        @staticmethod
        def nvmlInitWithFlags(flags):
            return pynvml.NVML_ERROR_DRIVER_NOT_LOADED

    with pytest.raises(NoDriverError, match=r"^no NVIDIA driver found \(the NVIDIA kernel driver is not loaded\)$"):
        GpuCollector(library=KernelModuleMissing())
    assert pynvml.nvmlLib is None  # a failed start does not leave the library installed


def test_close_uninstalls_the_fake(collector):
    gpu, fake = collector("rtx-4090-2")
    assert pynvml.nvmlLib is fake
    gpu.close()
    gpu.close()
    assert pynvml.nvmlLib is None


def test_throttle_reason_names_follow_nvml_bits():
    assert 1 << THROTTLE_REASONS.index("gpu_idle") == pynvml.nvmlClocksEventReasonGpuIdle
    assert 1 << THROTTLE_REASONS.index("sw_power_cap") == pynvml.nvmlClocksEventReasonSwPowerCap
    assert 1 << THROTTLE_REASONS.index("hw_slowdown") == pynvml.nvmlClocksEventReasonHwSlowdown
    assert 1 << THROTTLE_REASONS.index("sw_thermal") == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert 1 << THROTTLE_REASONS.index("hw_thermal") == pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert 1 << THROTTLE_REASONS.index("hw_power_brake") == pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    assert 1 << THROTTLE_REASONS.index("display_clocks") == pynvml.nvmlClocksEventReasonDisplayClockSetting


def test_helpers():
    assert format_cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert format_cpu_list([5]) == "5"
    assert format_cpu_list([]) == ""
    assert _normalise_bus_id("0000:18:00.0") == _normalise_bus_id("00000000:18:00.0") == "00000000:18:00.0"
    assert _normalise_bus_id("00000000:AB:00.0") == "00000000:ab:00.0"


def test_an_unexpected_error_on_one_gpu_spares_the_others(collector):
    def broken(*args):
        raise ValueError("driver returned garbage")

    def wrap(fake):
        real = fake.nvmlDeviceGetPowerUsage

        def power(handle, out):
            return broken() if ctypes.cast(handle, ctypes.c_void_p).value == 2 else real(handle, out)

        return Wrapped(fake, nvmlDeviceGetPowerUsage=power)

    gpu, _ = collector("h100-sxm-8", wrap=wrap)
    samples = gpu.sample()
    assert samples[1].unavailable == {"gpu": "ValueError: driver returned garbage"}
    assert samples[1].power is None and samples[1].uuid
    assert all(s.power > 0 for i, s in enumerate(samples) if i != 1)


def test_a_hung_nvml_call_does_not_keep_the_process_alive(spawn):
    """Readers are daemon threads: gputop can quit while a dying GPU blocks inside the driver."""
    code = (
        "import ctypes, threading\n"
        "from gputop.collect.gpu import GpuCollector\n"
        "from gputop.sim.fake_nvml import FakeNvmlLibrary\n"
        "from gputop.sim.spec import parse_spec\n"
        "from gputop.sim.synthetic import SyntheticLoad\n"
        "fake = FakeNvmlLibrary(parse_spec('rtx-4090-2'), SyntheticLoad(2, 2**34), pcie_latency_s=0)\n"
        "class Hanging:\n"
        "    def __getattr__(self, name):\n"
        "        fn = getattr(fake, name)\n"
        "        if name != 'nvmlDeviceGetUtilizationRates':\n"
        "            return fn\n"
        "        def hang(handle, out):\n"
        "            if ctypes.cast(handle, ctypes.c_void_p).value == 2:\n"
        "                threading.Event().wait()\n"
        "            return fn(handle, out)\n"
        "        return hang\n"
        "gpu = GpuCollector(library=Hanging(), sample_timeout_s=0.2)\n"
        "samples = gpu.sample()\n"
        "print('stale' in samples[1].unavailable, samples[0].utilization_gpu is not None, flush=True)\n"
    )
    proc = spawn.python(code, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, "True True\n", "")


def test_a_gpu_without_a_handle_is_reported_not_dropped(collector):
    """cgroups can hide one device: NVML refuses its handle, the others still work and keep their indices."""

    def wrap(fake):
        real = fake.nvmlDeviceGetHandleByIndex_v2

        def handle(index, out):
            return pynvml.NVML_ERROR_NO_PERMISSION if index.value == 1 else real(index, out)

        return Wrapped(fake, nvmlDeviceGetHandleByIndex_v2=handle)

    gpu, _ = collector("rtx-4090-2", wrap=wrap)
    visible, hidden = gpu.sample()
    assert hidden.index == 1 and not hidden.lost and hidden.unavailable == {"gpu": "NoPermission"}
    assert visible.index == 0 and visible.utilization_gpu == 80.0
    assert gpu.topology.matrix == (("X", "N/A"), ("N/A", "X"))


def test_xids_arrive_once_on_their_gpu_when_due(collector):
    clock = ManualClock()
    gpu, _ = collector("h100-sxm-8+xid=3:79+xid=1:31@10+xid=1:13@20", clock=clock)
    first = gpu.sample()
    assert [s.xids for s in first] == [()] * 3 + [first[3].xids] + [()] * 4
    assert [e.code for e in first[3].xids] == [79]
    clock.advance(15.0)
    second = gpu.sample()
    assert second[3].xids == first[3].xids  # kept, not delivered twice
    assert [e.code for e in second[1].xids] == [31]
    clock.advance(10.0)
    assert [e.code for e in gpu.sample()[1].xids] == [31, 13]  # oldest first
    assert all("xids" not in s.unavailable for s in second)


def test_xids_refused_become_a_reason(collector):
    def not_supported(*args):
        return pynvml.NVML_ERROR_NOT_SUPPORTED

    gpu, _ = collector("rtx-4090-2+xid=0:79", wrap=lambda fake: Wrapped(fake, nvmlDeviceRegisterEvents=not_supported))
    s = gpu.sample()[0]
    assert s.xids is None and s.unavailable["xids"] == "NotSupported"
    assert s.utilization_gpu == 80.0


def test_a_failing_event_read_keeps_the_xids_seen(collector):
    failing = {"on": False}

    def wait(*args):
        return pynvml.NVML_ERROR_UNKNOWN if failing["on"] else fake_wait(*args)

    gpu, lib = collector("h100-sxm-8+xid=0:48", wrap=lambda fake: Wrapped(fake, nvmlEventSetWait_v2=wait))
    fake_wait = lib.lib.nvmlEventSetWait_v2
    assert [e.code for e in gpu.sample()[0].xids] == [48]
    failing["on"] = True
    s = gpu.sample()[0]
    assert [e.code for e in s.xids] == [48] and s.unavailable["xids.read"] == "Unknown"


# ---------------------------------------------------------------- PCIe traffic: byte counters, or the fallback
PEAK_TX, PEAK_RX = H100_SXM.pcie_tx_peak_kbps * 1024, H100_SXM.pcie_rx_peak_kbps * 1024  # bytes/s at util 100


def _refuse_pcie_counters(on_gpus, code=lambda: pynvml.NVML_ERROR_NOT_SUPPORTED):
    """A wrap for the collector fixture: nvmlDeviceGetFieldValues answers `code()` (None: the fake's answer) in the
    PCIe byte counters' entries for the GPUs (0-based) in `on_gpus`; every other entry as the fake does."""

    def wrap(fake):
        real = fake.nvmlDeviceGetFieldValues

        def field_values(handle, count, out):
            ret = real(handle, count, out)
            refusal = code()
            if ctypes.cast(handle, ctypes.c_void_p).value - 1 in on_gpus and refusal is not None:
                entries = (fake_nvml._FieldValue * int(count.value)).from_address(ctypes.addressof(out._obj))
                for entry in entries:
                    if entry.fieldId in (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
                        entry.nvmlReturn = refusal
            return ret

        return Wrapped(fake, nvmlDeviceGetFieldValues=field_values)

    return wrap


def test_pcie_rates_are_the_byte_counters_average_over_the_interval(collector):
    clock, load = ManualClock(), ScriptedLoad(util=100.0)
    gpu, lib = collector("h100-sxm-8", load=load, clock=clock, wrap=Wrapped)
    clock.advance(1.0)
    first = gpu.sample()
    assert [(s.pcie.tx_bytes_per_s, s.pcie.rx_bytes_per_s) for s in first] == [pytest.approx((PEAK_TX, PEAK_RX))] * 8
    # half a second at full load, then half a second at half load: the counters give the interval's average
    # (0.75 of the peak), where GetPcieThroughput would give its 20 ms glimpse at the end (0.5)
    clock.advance(0.5)
    for i in range(8):
        lib.lib.state(i)  # the board counts continuously; the fake integrates when it is read
    load.util = 50.0
    clock.advance(0.5)
    second = gpu.sample()
    assert [(s.pcie.tx_bytes_per_s, s.pcie.rx_bytes_per_s) for s in second] == [
        pytest.approx((0.75 * PEAK_TX, 0.75 * PEAK_RX))
    ] * 8
    assert all("pcie.tx_bytes_per_s" not in s.unavailable for s in first + second)
    assert lib.counts["nvmlDeviceGetPcieThroughput"] == 0


def test_the_first_sample_has_pcie_rates_as_nvlink_has_from_the_counters_primed_at_start(collector):
    clock = ManualClock()
    gpu, _ = collector("h100-sxm-8", load=ScriptedLoad(util=100.0), clock=clock)
    clock.advance(2.0)
    s = gpu.sample()[0]
    assert (s.pcie.tx_bytes_per_s, s.pcie.rx_bytes_per_s) == pytest.approx((PEAK_TX, PEAK_RX))
    assert s.nvlink[0].tx_bytes_per_s > 0
    # no time since the last reading: no rate, and no refusal either (as NVLink's)
    again = gpu.sample()[0]
    assert again.pcie.tx_bytes_per_s is None and again.pcie.rx_bytes_per_s is None
    assert again.nvlink[0].tx_bytes_per_s is None
    assert again.unavailable == {}
    # the counters count continuously, as a board's do: 10 ms later (less than the fake's state quantum) is enough
    # for a rate, so the TUI's first frame, polled right after start, shows traffic
    clock.advance(0.01)
    soon = gpu.sample()[0]
    assert (soon.pcie.tx_bytes_per_s, soon.pcie.rx_bytes_per_s) == pytest.approx((PEAK_TX, PEAK_RX), rel=1e-3)
    assert soon.nvlink[0].tx_bytes_per_s == pytest.approx(H100_SXM.nvlink_peak_kibps * 1024, rel=1e-3)


@pytest.mark.parametrize("spec", ["rtx-4090-2", "h100-sxm-8+old-driver"])
def test_a_gpu_without_the_byte_counters_falls_back_to_pcie_throughput(collector, spec):
    clock = ManualClock()
    gpu, lib = collector(spec, load=ScriptedLoad(util=100.0), clock=clock, wrap=Wrapped)
    model = lib.lib.profile.gpu
    clock.advance(1.0)
    before = collections.Counter(lib.counts)
    samples = gpu.sample()
    per_sample = lib.counts - before
    assert len(samples) == lib.lib.profile.gpu_count
    for s in samples:
        assert (s.pcie.tx_bytes_per_s, s.pcie.rx_bytes_per_s) == (
            model.pcie_tx_peak_kbps * 1024.0,
            model.pcie_rx_peak_kbps * 1024.0,
        )
        assert not any(key.startswith("pcie.") for key in s.unavailable)
    assert per_sample["nvmlDeviceGetPcieThroughput"] == 2 * len(samples)
    # the refusal is remembered: a card without NVLink makes no field-values call at all any more
    assert per_sample["nvmlDeviceGetFieldValues"] == (0 if model is RTX_4090 else len(samples))


def test_a_gpu_refusing_the_counters_does_not_move_the_others(collector):
    clock = ManualClock()
    gpu, lib = collector("h100-sxm-8", load=ScriptedLoad(util=100.0), clock=clock, wrap=_refuse_pcie_counters({3}))
    throughput_handles = collections.Counter()
    real_throughput = lib.lib.nvmlDeviceGetPcieThroughput

    def counted_throughput(handle, counter, out):
        throughput_handles[ctypes.cast(handle, ctypes.c_void_p).value - 1] += 1
        return real_throughput(handle, counter, out)

    lib.overrides["nvmlDeviceGetPcieThroughput"] = counted_throughput
    for _ in range(2):
        clock.advance(1.0)
        samples = gpu.sample()
        assert [(s.pcie.tx_bytes_per_s, s.pcie.rx_bytes_per_s) for s in samples] == [pytest.approx((PEAK_TX, PEAK_RX))] * 8
        assert all(s.unavailable == {} for s in samples)
        assert all(link.tx_bytes_per_s > 0 for link in samples[3].nvlink)  # its NVLink counters still count
    assert throughput_handles == {3: 4}  # GPU 3 alone, two directions a sample


def test_a_permanent_refusal_later_moves_the_gpu_for_good_and_a_passing_one_does_not(collector):
    clock = ManualClock()
    refusal = {"code": None}
    wrap = _refuse_pcie_counters({1}, code=lambda: refusal["code"])
    gpu, lib = collector("h100-sxm-8", load=ScriptedLoad(util=100.0), clock=clock, wrap=wrap)
    clock.advance(1.0)
    assert gpu.sample()[1].pcie.rx_bytes_per_s == pytest.approx(PEAK_RX)
    refusal["code"] = pynvml.NVML_ERROR_UNKNOWN  # a passing failure: no rate this time, the counters again after it
    clock.advance(1.0)
    s = gpu.sample()[1]
    assert s.pcie.rx_bytes_per_s is None and s.unavailable["pcie.rx_bytes_per_s"] == "Unknown"
    refusal["code"] = None
    clock.advance(1.0)
    s = gpu.sample()[1]
    assert s.pcie.rx_bytes_per_s == pytest.approx(PEAK_RX)  # over both seconds: the last good reading stayed
    assert lib.counts["nvmlDeviceGetPcieThroughput"] == 0
    # now NOT_SUPPORTED: that sample has no rate, and from the next one GPU 1 reads GetPcieThroughput for good
    refusal["code"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    clock.advance(1.0)
    s = gpu.sample()[1]
    assert s.pcie.rx_bytes_per_s is None and s.unavailable["pcie.rx_bytes_per_s"] == "NotSupported"
    refusal["code"] = None  # asked again, it would answer: it is not asked
    for _ in range(2):
        clock.advance(1.0)
        s = gpu.sample()[1]
        assert s.pcie.rx_bytes_per_s == PEAK_RX and "pcie.rx_bytes_per_s" not in s.unavailable
    assert lib.counts["nvmlDeviceGetPcieThroughput"] == 4


def test_a_32_bit_pcie_counter_wraps_and_the_rate_stays_right(collector):
    clock = ManualClock()
    gpu, lib = collector(
        "h100-sxm-8", load=ScriptedLoad(util=100.0), clock=clock, fake_options={"pcie_counter_bits": 32}, wrap=Wrapped
    )
    wraps = 0
    for _ in range(50):  # 3.3 GB/s into a counter of 4 GiB: it wraps every 1.3 s
        before = lib.lib.state(0).pcie_rx_bytes
        clock.advance(0.06)  # Gen5 x16 moves at most 3.8 GB in 60 ms: under 4 GiB, so one wrap at most
        s = gpu.sample()[0]
        wraps += int(lib.lib.state(0).pcie_rx_bytes) >> 32 != int(before) >> 32
        # (within 1e-4: the stamps are whole µs of 60 ms intervals; a missed wrap would be off by 4 GiB)
        assert (s.pcie.tx_bytes_per_s, s.pcie.rx_bytes_per_s) == pytest.approx((PEAK_TX, PEAK_RX), rel=1e-4)
    assert wraps >= 2  # so the rates above were taken across wraps
    assert lib.counts["nvmlDeviceGetPcieThroughput"] == 0


def test_a_32_bit_pcie_counter_too_narrow_for_the_interval_falls_back(collector):
    """A second at Gen5 x16 may carry 63 GB: a 32-bit counter could have wrapped 14 times, which no one can tell."""
    clock = ManualClock()
    gpu, lib = collector(
        "h100-sxm-8", load=ScriptedLoad(util=100.0), clock=clock, fake_options={"pcie_counter_bits": 32}, wrap=Wrapped
    )
    clock.advance(1.0)
    s = gpu.sample()[0]
    assert s.pcie.rx_bytes_per_s is None
    assert s.unavailable["pcie.rx_bytes_per_s"] == "32-bit counter: may wrap more than once between samples"
    clock.advance(1.0)
    s = gpu.sample()[0]
    assert (s.pcie.tx_bytes_per_s, s.pcie.rx_bytes_per_s) == (PEAK_TX, PEAK_RX) and s.unavailable == {}
    assert lib.counts["nvmlDeviceGetPcieThroughput"] == 16  # every GPU, from the second sample on


def test_a_64_bit_counter_that_goes_back_was_reset_and_gives_no_rate_for_that_interval(collector):
    clock = ManualClock()
    gpu, lib = collector("h100-sxm-8", load=ScriptedLoad(util=100.0), clock=clock)
    clock.advance(2.0)
    gpu.sample()
    lib.state(2).pcie_tx_bytes = 0.0  # the driver reloaded: the counter starts again
    clock.advance(1.0)
    s = gpu.sample()[2]
    assert s.pcie.tx_bytes_per_s is None and s.pcie.rx_bytes_per_s == pytest.approx(PEAK_RX)
    clock.advance(1.0)
    assert gpu.sample()[2].pcie.tx_bytes_per_s == pytest.approx(PEAK_TX)


def test_the_pcie_sources_side_by_side_say_which_gpus_have_the_counters(collector):
    """What scripts/gpu_check.sh prints on a real machine: each GPU's counters (or why not) against GetPcieThroughput."""
    hopper, _ = collector("h100-sxm-8", load=ScriptedLoad(util=100.0), clock=time.monotonic)
    rows = hopper.compare_pcie_sources(seconds=0.2, glimpses=2)
    assert [r["index"] for r in rows] == list(range(8))
    for r in rows:
        assert r["counters"] == "supported" and r["value_type"] == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        assert (r["counter_tx_bytes_per_s"], r["counter_rx_bytes_per_s"]) == pytest.approx(
            (PEAK_TX, PEAK_RX), rel=1e-4
        )  # µs stamps
        assert (r["throughput_tx_bytes_per_s"], r["throughput_rx_bytes_per_s"]) == (PEAK_TX, PEAK_RX)
        assert r["throughput_glimpses"] == 2
    ada, _ = collector("rtx-4090-2", load=ScriptedLoad(util=100.0), clock=time.monotonic)
    rows = ada.compare_pcie_sources(seconds=0.1, glimpses=1)
    assert [(r["counters"], r["counter_rx_bytes_per_s"], r["value_type"]) for r in rows] == [("NotSupported", None, None)] * 2
    assert [r["throughput_rx_bytes_per_s"] for r in rows] == [RTX_4090.pcie_rx_peak_kbps * 1024.0] * 2
