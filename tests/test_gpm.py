"""GPM (GPU Performance Monitoring) in the GPU adapter, over the fake NVML through the real pynvml wrappers: what the
SMs, tensor cores and memory did between two samples, absent (never zero) where the GPU or the driver has no GPM."""

from __future__ import annotations

import pytest

from gputop.collect.gpu import GpuCollector, use_nvml_library
from gputop.sim import fake_nvml, gpu_physics
from gputop.sim.fake_nvml import FakeNvmlLibrary, ManualClock
from gputop.sim.spec import parse_spec
from tests.harness.nvml import ScriptedLoad

GPM_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "dram_bandwidth", "fp32_active", "fp16_active")


class MixLoad(ScriptedLoad):
    """A load whose kernels declare their mix: per GPU, the share of time each GPM metric is active."""

    def __init__(self, mixes):
        super().__init__(util=90.0)
        self.mixes = mixes

    def activity_seconds(self, gpu, now):
        return tuple(share * now for share in self.mixes[gpu % len(self.mixes)])


class Wrapped:
    """The fake behind a front that counts calls, replaces some symbols and hides those starting with `hide`."""

    def __init__(self, lib, hide=None, **overrides):
        self.lib, self.hide, self.overrides, self.counts = lib, hide, overrides, {}

    def __getattr__(self, name):
        if self.hide and name.startswith(self.hide):
            raise AttributeError(name)  # pynvml: FunctionNotFound, as a driver without the symbol
        fn = self.overrides.get(name) or getattr(self.lib, name)

        def counted(*args):
            self.counts[name] = self.counts.get(name, 0) + 1
            return fn(*args)

        return counted


@pytest.fixture
def collector():
    made = []

    def make(spec="h100-sxm-8", load=None, wrap=None):
        clock = ManualClock()
        fake = FakeNvmlLibrary(parse_spec(spec), load or ScriptedLoad(util=80.0), clock=clock, pcie_latency_s=0.0)
        lib = wrap(fake) if wrap else fake
        gpu = GpuCollector(library=lib)
        made.append(gpu)
        return gpu, fake, lib, clock

    yield make
    for gpu in made:
        gpu.close()
    use_nvml_library(None)


def test_gpm_is_each_gpus_kernel_mix_over_the_refresh_interval(collector):
    mixes = [(0.5, 0.25, 0.0, 0.8, 0.4, 0.0), (0.9, 0.45, 0.6, 0.2, 0.05, 0.02)]
    gpu, _fake, _lib, clock = collector(load=MixLoad(mixes))
    clock.advance(2.0)
    samples = gpu.sample()
    assert len(samples) == 8
    for s in samples:
        expected = mixes[s.index % 2]
        assert s.gpm is not None and s.compute_capability == (9, 0)
        got = [getattr(s.gpm, name) for name in GPM_FIELDS]
        assert got == pytest.approx([100.0 * share for share in expected])
        assert not any(key.startswith("gpm") for key in s.unavailable)


def test_the_interval_is_the_one_since_the_previous_refresh(collector):
    class Switching(ScriptedLoad):
        """SM busy half the time until t=1010, then all the time."""

        def activity_seconds(self, gpu, now):
            share = 0.5 * min(now, 1010.0) + 1.0 * max(0.0, now - 1010.0)
            return (share,) * 6

    gpu, _fake, _lib, clock = collector(load=Switching(util=90.0))
    clock.advance(5.0)  # 1005
    assert gpu.sample()[0].gpm.sm_active == pytest.approx(50.0)
    clock.advance(10.0)  # 1015: half the interval at each share
    assert gpu.sample()[0].gpm.sm_active == pytest.approx(75.0)
    clock.advance(5.0)  # 1020: only the new share, not the average since start
    assert gpu.sample()[0].gpm.sm_active == pytest.approx(100.0)


def test_a_load_without_a_declared_mix_gets_the_default_share_of_its_busy_time(collector):
    gpu, _fake, _lib, clock = collector(load=ScriptedLoad(util=80.0))
    clock.advance(1.0)
    gpm = gpu.sample()[0].gpm
    expected = [80.0 * share for share in gpu_physics.DEFAULT_ACTIVITY]
    assert [getattr(gpm, name) for name in GPM_FIELDS] == pytest.approx(expected)


def test_ada_refuses_gpm_so_the_fields_are_absent_not_zero(collector):
    gpu, fake, lib, clock = collector(spec="rtx-4090-2", wrap=Wrapped)
    clock.advance(1.0)
    for s in gpu.sample():
        assert s.gpm is None and s.unavailable["gpm"] == "NotSupported"
        assert s.compute_capability == (8, 9)
    assert "nvmlGpmSampleAlloc" not in lib.counts and not fake.gpm_buffers  # nothing allocated for nothing


def test_a_driver_without_the_gpm_calls_has_no_gpm(collector):
    gpu, fake, _lib, clock = collector(wrap=lambda lib: Wrapped(lib, hide="nvmlGpm"))
    clock.advance(1.0)
    for s in gpu.sample():
        assert s.gpm is None and s.unavailable["gpm"] == "FunctionNotFound"
    assert not fake.gpm_buffers


def test_mig_mode_has_no_whole_gpu_gpm(collector):
    def mig_enabled(handle, current, pending):
        current._obj.value = pending._obj.value = 1
        return fake_nvml.SUCCESS

    gpu, fake, _lib, clock = collector(wrap=lambda lib: Wrapped(lib, nvmlDeviceGetMigMode=mig_enabled))
    clock.advance(1.0)
    s = gpu.sample()[0]
    assert s.gpm is None and s.unavailable["gpm"].startswith("MIG mode")
    assert not fake.gpm_buffers


def test_two_buffers_a_gpu_reused_every_refresh_and_freed_on_close(collector):
    gpu, fake, lib, clock = collector(wrap=Wrapped)
    for _ in range(5):
        clock.advance(1.0)
        assert all(s.gpm is not None for s in gpu.sample())
    assert lib.counts["nvmlGpmSampleAlloc"] == 2 * 8
    assert lib.counts["nvmlGpmSampleGet"] == 6 * 8  # the first at start, then one a refresh
    assert lib.counts["nvmlGpmMetricsGet"] == 5 * 8
    assert len(fake.gpm_buffers) == 16
    gpu.close()
    assert lib.counts["nvmlGpmSampleFree"] == 16 and not fake.gpm_buffers


def test_a_metric_refused_alone_is_none_with_its_reason(collector):
    def without_tensor(request_ref):
        ret = fake.nvmlGpmMetricsGet(request_ref)
        request_ref._obj.metrics[2].nvmlReturn = fake_nvml.ERROR_NOT_SUPPORTED  # the third asked: tensor activity
        return ret

    fake = None

    def wrap(lib):
        nonlocal fake
        fake = lib
        return Wrapped(lib, nvmlGpmMetricsGet=without_tensor)

    gpu, _fake, _lib, clock = collector(wrap=wrap)
    clock.advance(1.0)
    s = gpu.sample()[0]
    assert s.gpm.tensor_active is None and s.unavailable["gpm.tensor_active"] == "NotSupported"
    assert s.gpm.sm_active is not None and s.gpm.dram_bandwidth is not None


def test_a_permanent_refusal_later_stops_gpm_and_frees_its_buffers(collector):
    refuse = {"now": False}

    def sample_get(handle, buffer):
        return fake_nvml.ERROR_NOT_SUPPORTED if refuse["now"] else fake.nvmlGpmSampleGet(handle, buffer)

    fake = None

    def wrap(lib):
        nonlocal fake
        fake = lib
        return Wrapped(lib, nvmlGpmSampleGet=sample_get)

    gpu, _fake, lib, clock = collector(wrap=wrap)
    clock.advance(1.0)
    assert gpu.sample()[0].gpm is not None
    refuse["now"] = True
    clock.advance(1.0)
    s = gpu.sample()[0]
    assert s.gpm is None and s.unavailable["gpm"] == "NotSupported"
    asked = lib.counts["nvmlGpmSampleGet"]
    assert not fake.gpm_buffers  # given back at once
    clock.advance(1.0)
    assert gpu.sample()[0].gpm is None and lib.counts["nvmlGpmSampleGet"] == asked  # not asked again


def test_the_fake_checks_the_request_as_nvml_does(collector):
    import pynvml

    gpu, fake, _lib, clock = collector()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice == 1
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(handle, first)
        clock.advance(1.0)
        pynvml.nvmlGpmSampleGet(handle, second)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = 2  # a version the library does not know
        request.numMetrics, request.sample1, request.sample2 = 1, first, second
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
            pynvml.nvmlGpmMetricsGet(request)
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.sample1, request.sample2 = second, first  # the second sample must come later
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlGpmMetricsGet(request)
        request.sample1, request.sample2 = first, second
        request.numMetrics = 2
        request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL  # not counted by the simulation
        pynvml.nvmlGpmMetricsGet(request)
        assert request.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS and request.metrics[0].metricInfo.shortName == b"sm_util"
        assert request.metrics[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    finally:
        pynvml.nvmlGpmSampleFree(first)
        pynvml.nvmlGpmSampleFree(second)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlGpmSampleFree(first)  # already freed


# ---------------------------------------------------------------- where it shows: the card and the one-line grid


def _grid(spec):
    from gputop.tui.widgets.gpu_grid import GpuGrid
    from tests.harness.histories import simulated_history

    history = simulated_history(spec, seconds=5)
    grid = GpuGrid()  # not mounted: set what update_data sets, then draw
    grid.snapshots, grid.gpu_count = list(history), len(history.latest.gpus)
    return grid, history.latest.gpus


def test_the_card_shows_the_gpm_line_beside_gpu_util_and_the_compact_grid_an_sm_column():
    grid, gpus = _grid("h100-sxm-8")
    line = next(strip.text for strip in grid.build(160, 40)[1:2])
    gpm = gpus[0].gpm
    expected = f"SM {gpm.sm_active:.0f}%  TC {gpm.tensor_active:.0f}%  DRAM {gpm.dram_bandwidth:.0f}%"
    assert f"{gpus[0].utilization_gpu:.0f}%  {expected}" in line, line
    compact = [strip.text for strip in grid._build_compact(gpus, 100)]
    assert " SM " in compact[0]
    assert f"{gpm.sm_active:.0f}%" in compact[1]
    assert " SM " not in grid._build_compact(gpus, 80)[0].text  # no room: left out


def test_a_gpu_without_gpm_has_no_gpm_line_and_no_sm_column():
    grid, gpus = _grid("rtx-4090-2")
    text = "\n".join(strip.text for strip in grid.build(160, 40))
    assert "SM " not in text and "TC " not in text and "DRAM " not in text
    assert " SM " not in grid._build_compact(gpus, 120)[0].text
