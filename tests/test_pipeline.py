"""Pipeline: collectors -> Snapshot, simulated and real (no driver here), as the contract in INTERFACES.md says."""

from __future__ import annotations

import collections
import ctypes.util

import pynvml
import pytest

from gputop.backend import RealMachine, SimulatedMachine
from gputop.cli import build_parser
from gputop.collect import gpu as gpu_collector
from gputop.errors import GputopError, UsageError
from gputop.model import HostSample, JobTree, Snapshot
from gputop.pipeline import (
    TUI_WATCH_FIRST_AFTER_S,
    WATCH_COUNTERS_S,
    CounterCadence,
    Following,
    Pipeline,
    case_study_pipeline,
    check_pipeline,
    following_pipeline,
    pipeline_from_args,
    tui_pipeline,
)
from gputop.sim import fake_nvml
from gputop.sim.fake_nvml import FakeNvmlLibrary, ManualClock
from gputop.sim.scenarios import DEMO_PROFILE
from tests.harness.memory import heap_growth_per_block
from tests.harness.nvml import ScriptedLoad
from tests.harness.processes import wait_until

no_driver_here = pytest.mark.skipif(bool(ctypes.util.find_library("nvidia-ml")), reason="libnvidia-ml is present on this machine")


class FixedHost:
    """Deterministic host numbers for tests that compare whole snapshots."""

    hostname, cpu_model, cpu_count = "testbox", "Test CPU", 4

    def sample(self):
        return HostSample(cpu_percent=(10.0, 20.0, 30.0, 40.0), memory_total=100, memory_used=50)

    def close(self):
        pass


class RecordingJobCollector:
    def __init__(self):
        self.calls = []
        self.closed = False

    def collect(self, gpus, now):
        self.calls.append((gpus, now))
        return JobTree(root_pid=1234)

    def close(self):
        self.closed = True


@pytest.fixture
def pipelines():
    made = []

    def make(*args, **kwargs):
        p = Pipeline(*args, **kwargs)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def test_simulated_pipeline_is_labelled(pipelines):
    p = pipelines(SimulatedMachine("h100-sxm-8+thermal=2"))
    assert p.simulated is True
    m = p.machine
    assert m.simulated == "h100-sxm-8+thermal=2"
    assert (m.gpu_count, m.gpu_error) == (8, None)
    assert m.gpu_names == ("NVIDIA H100 80GB HBM3",) * 8
    assert m.driver_version == "560.35.03" and m.cuda_version == "12.6"
    assert m.topology.matrix[0][1] == "NV18"
    assert m.cpu_count >= 1 and m.hostname
    snap = p.poll()
    assert isinstance(snap, Snapshot) and snap.simulated is True
    assert len(snap.gpus) == 8 and snap.job is None
    assert len(snap.host.cpu_percent) == m.cpu_count
    assert "hw_thermal" in snap.gpus[2].throttle_reasons


def test_simulated_numa_layout_is_shown_on_the_host_cores(pipelines):
    p = pipelines(SimulatedMachine("h100-sxm-8"))
    snap = p.poll()
    topo = p.machine.topology
    for gpu in range(8):
        first_cpu = int(topo.cpu_affinity[gpu].split(",")[0].split("-")[0])
        assert snap.host.core_numa[first_cpu] == topo.numa_node[gpu]


def test_bad_spec_is_a_usage_error_and_starts_nothing():
    with pytest.raises(UsageError, match="unknown profile 'h200'.*h100-sxm-8, rtx-4090-2"):
        Pipeline(SimulatedMachine("h200"))
    with pytest.raises(UsageError, match="gpu-lost needs IDX@SECONDS"):
        Pipeline(SimulatedMachine("h100-sxm-8+gpu-lost=3"))
    with pytest.raises(UsageError, match="unknown fault 'meltdown'"):
        Pipeline(SimulatedMachine("rtx-4090-2+meltdown"))
    with pytest.raises(UsageError, match="rtx-4090-2 has no NVLink"):
        Pipeline(SimulatedMachine("rtx-4090-2+nvlink-down=0"))
    assert pynvml.nvmlLib is None


def test_load_model_drives_the_gpus(pipelines):
    load = ScriptedLoad(util={i: 10.0 * i for i in range(8)}, memory=5 * 1024**3, processes={6: [(31337, 1024**3)]})
    snap = pipelines(SimulatedMachine("h100-sxm-8", load=load)).poll()
    assert [g.utilization_gpu for g in snap.gpus] == [10.0 * i for i in range(8)]
    assert snap.gpus[6].processes[0].pid == 31337
    assert all(g.memory_used == 5 * 1024**3 for g in snap.gpus)


def test_custom_clock_makes_snapshots_deterministic(pipelines):
    def run():
        clock = ManualClock(2000.0)
        p = pipelines(SimulatedMachine("h100-sxm-8+ecc=3", clock=clock, host=FixedHost()))
        out = []
        for _ in range(3):
            clock.advance(1.0)
            out.append(p.poll())
        p.close()
        return out

    first, second = run(), run()
    assert first == second
    assert [s.timestamp for s in first] == [2001.0, 2002.0, 2003.0]
    assert first[0].gpus != first[2].gpus  # the synthetic load moves with the clock


class _CountingNvml(FakeNvmlLibrary):
    """The simulated NVML, counting the calls made to each of its symbols."""

    calls: collections.Counter = collections.Counter()

    def _bind_symbols(self):
        def counted(name, fn):
            def call(*args):
                _CountingNvml.calls[name] += 1
                return fn(*args)

            return call

        return {name: counted(name, fn) for name, fn in super()._bind_symbols().items()}


def test_a_steady_poll_of_eight_gpus_makes_few_nvml_calls_and_none_that_blocks(pipelines, monkeypatch):
    """What keeps a 1 Hz poll cheap, counted (its time is benchmarks/bench_poll.py's): no GetPcieThroughput (it
    samples the link for ~20 ms per call; the H100's byte counters make it unneeded), and each GPU's steady
    reading is a handful of calls, the same every second; the ~90 calls a GPU's start and first poll make
    (names, wiring, the slow fields, re-read every few seconds) are not repeated."""
    monkeypatch.setattr(fake_nvml, "FakeNvmlLibrary", _CountingNvml)
    monkeypatch.setattr(_CountingNvml, "calls", collections.Counter())
    # the slow fields' re-read (every 5 s of the clock) would land on the fifth poll: counted apart
    # (test_gpu_collector.py, tests/test_one_clock.py)
    monkeypatch.setattr(gpu_collector, "SLOW_FIELDS_PERIOD_S", 1e9)
    clock = ManualClock(1000.0)
    p = pipelines(SimulatedMachine("h100-sxm-8", clock=clock))
    p.poll()
    per_poll = []
    for _ in range(7):
        clock.advance(1.0)
        _CountingNvml.calls.clear()
        p.poll()
        per_poll.append(dict(_CountingNvml.calls))
    assert all("nvmlDeviceGetPcieThroughput" not in calls for calls in per_poll), per_poll
    assert all(calls == per_poll[0] for calls in per_poll), per_poll  # every poll the same work
    assert all(n % 8 == 0 for n in per_poll[0].values()), per_poll[0]  # per GPU, every GPU alike
    assert sum(per_poll[0].values()) <= 16 * 8, per_poll[0]  # 14 a GPU today


@pytest.mark.slow
def test_memory_stays_flat_over_many_polls(pipelines):
    p = pipelines(SimulatedMachine("h100-sxm-8+nvlink-down=1+ecc=2"))
    p.backend.library.pcie_latency_s = 0.0

    def settle():
        # a read that overran the sample timeout under load still holds its allocations: let it finish
        wait_until(lambda: all(g.future is None or g.future.done() for g in p.gpu._gpus), what="GPU reads to finish")

    # A leak grows the heap in every block of polls. The noise does not: NVLink counters are ints that
    # get bigger, a cache dict resizes once, and the CI box under load shifts what is in flight.  So the
    # smallest block's growth is the per-poll leak times 100: a leak of ~300 bytes a poll fails (tried),
    # far less than keeping one GPU's sample would cost.
    block_growths = heap_growth_per_block(p.poll, warmup=20, settle=settle)
    assert min(block_growths) < 16 * 1024, f"grew in every block of 100 polls: {block_growths} bytes"


def test_job_collector_gets_the_gpus_and_the_time(pipelines):
    job = RecordingJobCollector()
    clock = ManualClock(50.0)
    p = pipelines(SimulatedMachine("rtx-4090-2", clock=clock), follow=Following(pid=1234, attached=job))
    snap = p.poll()
    assert snap.job == JobTree(root_pid=1234)
    gpus, now = job.calls[0]
    assert gpus == snap.gpus and now == 50.0 == snap.timestamp
    p.close()
    assert job.closed


@no_driver_here
def test_no_driver_leaves_everything_else_working(pipelines):
    p = pipelines(RealMachine())
    assert p.simulated is False
    assert p.machine.gpu_error == "no NVIDIA driver found (libnvidia-ml.so.1 is not loadable)"
    assert p.machine.gpu_count == 0 and p.machine.simulated is None
    snap = p.poll()
    assert snap.gpus == () and snap.simulated is False
    assert len(snap.host.cpu_percent) == p.machine.cpu_count


@no_driver_here
def test_a_simulation_does_not_leak_into_a_later_real_pipeline(pipelines):
    sim = pipelines(SimulatedMachine("h100-sxm-8"))
    assert len(sim.poll().gpus) == 8
    real = pipelines(RealMachine())  # the simulated one is still open
    assert real.machine.gpu_error is not None and real.poll().gpus == ()
    assert len(sim.poll().gpus) == 8  # and the simulation still works


def test_two_simulated_machines_in_one_process_take_turns(pipelines):
    big = pipelines(SimulatedMachine("h100-sxm-8+thermal=1"))
    small = pipelines(SimulatedMachine("rtx-4090-2"))
    for _ in range(2):
        assert [g.name for g in big.poll().gpus] == ["NVIDIA H100 80GB HBM3"] * 8
        small_gpus = small.poll().gpus
        assert [g.name for g in small_gpus] == ["NVIDIA GeForce RTX 4090"] * 2
        assert small_gpus[0].ecc is None
    small.close()
    assert "hw_thermal" in big.poll().gpus[1].throttle_reasons


def test_close_is_idempotent_and_uninstalls_the_fake():
    with Pipeline(SimulatedMachine("rtx-4090-2")) as p:
        assert pynvml.nvmlLib is p.backend.library
    p.close()
    assert pynvml.nvmlLib is None


def test_pipeline_from_args():
    args = build_parser().parse_args(["snapshot", "--simulate", "rtx-4090-2+thermal=1"])
    p = pipeline_from_args(args)
    try:
        assert p.machine.simulated == "rtx-4090-2+thermal=1"
        assert p.machine.gpu_count == 2
    finally:
        p.close()
    # a namespace without the optional attributes still works (replay/report build their own)
    p = pipeline_from_args(type("Args", (), {"simulate": "h100-sxm-8"})())
    p.close()
    assert p.machine.gpu_count == 8


class _WatchedBackend:
    """A simulated machine whose every hand-over to the pipeline is noted: the pipeline reads the machine only
    through its backend's methods."""

    def __init__(self, inner):
        self.inner = inner
        self.asked = []
        self.simulated, self.clock, self.host, self.nvml_library = inner.simulated, inner.clock, inner.host, inner.nvml_library

    def fit_host(self, topology):
        self.asked.append("fit_host")
        self.inner.fit_host(topology)

    def nic_topology(self, topology, bus_ids):
        self.asked.append("nic_topology")
        return self.inner.nic_topology(topology, bus_ids)

    def nic_source(self):
        self.asked.append("nic_source")
        return self.inner.nic_source()

    def host_source(self, root=None):
        self.asked.append(f"host_source {root}")
        return self.inner.host_source(root)


def test_the_pipeline_reads_the_machine_through_its_backend(pipelines):
    clock = ManualClock(500.0)
    backend = _WatchedBackend(SimulatedMachine("h100-sxm-8", clock=clock))
    p = pipelines(backend, watch=CounterCadence(60.0))
    assert backend.asked == ["fit_host", "nic_topology", "nic_source", "host_source None"]
    assert pynvml.nvmlLib is backend.nvml_library
    assert p.machine.simulated == "h100-sxm-8" and p.machine.gpu_count == 8
    assert p.poll().timestamp == 500.0  # the backend's clock stamps the snapshots
    p.host_source("/tmp/elsewhere")
    assert backend.asked[-1] == "host_source /tmp/elsewhere"


def test_following_one_job_and_several_at_once_is_refused():
    with pytest.raises(ValueError, match="not both"):
        Following(pid=1, pids=[2])
    with pytest.raises(ValueError, match="not both"):
        Following(attached=RecordingJobCollector(), every_job=True)


def test_the_named_factories_build_their_configurations(pipelines):
    checking = check_pipeline("rtx-4090-2")
    assert checking.counters is None and checking.followed is None and checking.job_collector is None
    checking.close()
    job = RecordingJobCollector()
    tui = tui_pipeline("h100-sxm-8", FixedHost(), job, 1.5)
    assert tui.job_collector is job and tui.host.hostname == "testbox"
    assert tui.counters is not None and tui.counters.cadence == WATCH_COUNTERS_S
    assert tui.counters._first_after == TUI_WATCH_FIRST_AFTER_S  # the first frames come first
    tui.close()
    assert job.closed
    load = ScriptedLoad()
    study = case_study_pipeline(load)
    assert study.machine.simulated == DEMO_PROFILE and study.backend.library.load is load
    assert study.job_collector is None and study.followed is None
    study.close()


def test_attach_follows_a_new_job_and_keeps_the_old_one_on_a_bad_pid(pipelines, spawn):
    p = pipelines(SimulatedMachine("rtx-4090-2"))
    assert p.poll().job is None
    child = spawn.python("import time\nwhile True: time.sleep(0.1)")
    p.attach(child.pid)
    assert p.poll().job.root_pid == child.pid
    with pytest.raises(GputopError, match="no process with PID"):
        p.attach(2**22 + 12345)  # above pid_max on default kernels: never a live process
    assert p.poll().job.root_pid == child.pid


def test_gpu_processes_are_grouped_into_jobs_in_the_snapshot_until_a_job_is_attached(pipelines, spawn):
    # a real process stands behind the fake GPU's process list, so /proc discovery finds it
    proc = spawn.python("import time; time.sleep(60)")
    load = ScriptedLoad(processes={2: [(proc.pid, 1 << 30)]})
    p = pipelines(SimulatedMachine("h100-sxm-8", load=load))
    snap = p.poll()
    assert snap.job is None
    assert [[r.proc.pid for r in tree.ranks] for tree in snap.jobs] == [[proc.pid]]
    assert snap.jobs[0].ranks[0].gpus == (2,)
    p.attach(proc.pid)
    attached = p.poll()
    assert attached.job is not None and attached.jobs == ()  # the attached job replaces the list


def test_followed_jobs_go_to_the_snapshot_one_in_job_several_in_jobs_and_an_exit_stays(pipelines, spawn):
    """serve's and record's pipeline with --pid (`following_pipeline`): one job where an attached job goes,
    several in `Snapshot.jobs`, in the order given; a job that exits stays, marked exited."""
    first = spawn.python("import time\nwhile True: time.sleep(0.1)")
    second = spawn.python("import time\nwhile True: time.sleep(0.1)")
    args = build_parser().parse_args(["record", "-o", "x", "--simulate", "rtx-4090-2", "--pid", str(second.pid)])
    one = following_pipeline(args)
    try:
        snap = one.poll()
        assert snap.jobs == () and snap.job is not None and snap.job.root_pid == second.pid
    finally:
        one.close()

    both = pipelines(SimulatedMachine("rtx-4090-2"), follow=Following(pids=[second.pid, first.pid]))
    snap = both.poll()
    assert snap.job is None and [t.root_pid for t in snap.jobs] == [second.pid, first.pid]
    first.kill()
    first.wait(timeout=10)
    for _ in range(2):  # the exit is kept, poll after poll, as the TUI keeps an attached job's
        assert [(t.root_pid, t.exited) for t in both.poll().jobs] == [(second.pid, False), (first.pid, True)]

    with pytest.raises(GputopError, match="no process with PID"):
        pipelines(
            SimulatedMachine("rtx-4090-2"), follow=Following(pids=[second.pid, 2**22 + 12345])
        )  # above pid_max: never a process
