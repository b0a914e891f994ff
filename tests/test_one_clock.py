"""One clock (issue 38): a simulated machine's `ManualClock` drives the fake NVML, every reader's cadence and
every stamp a history records (the GPUs' samples and XIDs, the host's swap reading, the NIC ports, the counter
watch, the job's stacks and its ranks' start-up), so ten minutes of history are built as fast as the polls
compute, and every stamp and cadence below is counted on that clock, never timed.

The job is this test's own process, followed as a lone rank on GPU 0 (no child to start: the unit lane), with
its stacks handed in (py-spy would take real time) and stamped on the same clock."""

from __future__ import annotations

import collections
import os
import threading
import time

import psutil
import pynvml
import pytest

from gputop.analysis.findings import findings
from gputop.analysis.stack_classes import IDLE_OTHER
from gputop.backend import RealMachine, SimulatedMachine
from gputop.clock import REAL_CLOCK, Clock, clock_of
from gputop.collect import host as host_collector
from gputop.collect.job_tree import JobCollector
from gputop.collect.state_sampler import BACKGROUND, EAGER_S, FOCUSED, STARTUP_GIVE_UP_S, StateSampler
from gputop.history import History
from gputop.pipeline import CounterCadence, Following, Pipeline
from gputop.sim.fake_nvml import ManualClock
from tests.harness.histories import STATE_FRAMES, stacks_of
from tests.harness.nvml import ScriptedLoad

T0 = 1_700_000_000.0
POLL_S = 3.0  # ten minutes at a 3 s poll (`--interval 3`): 200 polls, each reader's cadence a few polls long
POLLS = 200
SPEC = "rtx-4090-2+xid=1:79@5+kernel-xid=0:48"
SWAP_EVERY_S = host_collector.SWAP_EVERY_S
SLOW_FIELDS_PERIOD_S = 5.0  # collect/gpu.py's SLOW_FIELDS_PERIOD_S
WATCH_S = 60.0


def _every(period: float) -> int:
    """How many of the polls (at 0, POLL_S, ...) fall due on a cadence of `period` seconds that starts at the first."""
    due, count = 0.0, 0
    for i in range(POLLS):
        if i * POLL_S >= due:
            count, due = count + 1, i * POLL_S + period
    return count


@pytest.fixture
def counted(monkeypatch):
    """Calls to the host's swap reading and to one NVML call read only with the GPUs' slow fields."""
    calls: collections.Counter = collections.Counter()

    def counting(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(host_collector.psutil, "swap_memory", counting("swap", psutil.swap_memory))
    limit = pynvml.nvmlDeviceGetEnforcedPowerLimit
    monkeypatch.setattr(pynvml, "nvmlDeviceGetEnforcedPowerLimit", counting("power_limit", limit))
    return calls


def _ten_minutes(counted):
    clock = ManualClock(T0)
    me = os.getpid()
    machine = SimulatedMachine(SPEC, load=ScriptedLoad(util=90.0, processes={0: [(me, 1 << 30)]}), clock=clock)

    def dump(pids):  # what py-spy would have dumped, stamped as the collector's own dumps are
        return {pid: stacks_of(pid, STATE_FRAMES[IDLE_OTHER], clock()) for pid in pids}

    job = JobCollector(me, stacks_enabled=False, dump=dump, native_dump=None, recorder_read=None, clock=machine.clock)
    with Pipeline(machine, follow=Following(attached=job), watch=CounterCadence(WATCH_S)) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0  # the fake's PCIe sampling sleep is real time
        counted.clear()  # the start's own reads are not the cadence's
        history = History(pipeline.machine, capacity=POLLS)
        snaps = []
        for _ in range(POLLS):
            job.refresh_stacks()  # the stack thread's round, on the test's turn
            snap = pipeline.poll()
            history.append(snap)
            snaps.append(snap)
            clock.advance(POLL_S)
    return snaps, history


def test_ten_minutes_of_history_run_on_the_manual_clock(counted):
    snaps, history = _ten_minutes(counted)
    me = os.getpid()
    assert [s.timestamp for s in snaps] == [T0 + i * POLL_S for i in range(POLLS)]
    assert history.latest is not None and history.latest.timestamp - T0 == (POLLS - 1) * POLL_S  # ten minutes

    # the readers' cadences ran on the clock: a real one would have seen a few ms pass in all
    assert counted["swap"] == _every(SWAP_EVERY_S) == 100  # every other poll
    assert counted["power_limit"] == 2 * _every(SLOW_FIELDS_PERIOD_S) == 200  # two GPUs
    readings = [s for s in snaps if s.counter_health is not None and s.counter_health.timestamp == s.timestamp]
    assert [s.timestamp - T0 for s in readings] == [i * WATCH_S for i in range(10)]

    # the XID NVML queued 5 s in is stamped when the poll took it (the poll at 6 s), on the clock
    with_xid = next(s for s in snaps if s.gpus[1].xids)
    assert with_xid.timestamp == T0 + 6.0 and [(x.code, x.timestamp) for x in with_xid.gpus[1].xids] == [(79, T0 + 6.0)]
    # the kernel log's XID: the fake kernel booted, logged it and was read on the clock too
    health = readings[0].counter_health
    assert health is not None and health.seconds == 0.0 and readings[1].counter_health.seconds == WATCH_S
    (kernel_xid,) = [c for c in health.checks if c.id == "xid"]
    assert "GPU 0  XID 48" in kernel_xid.evidence[0] and _utc(T0, "%Y-%m-%d %H:%M:%S UTC") in kernel_xid.evidence[0]

    # the job: each poll's stacks were dumped at that poll's time; start-up given up after 60 s of the clock
    for snap in snaps:
        assert snap.job is not None and snap.job.stacks[me].timestamp == snap.timestamp
    rank_states = [(s.timestamp - T0, s.job.ranks[0].starting_up, s.job.ranks[0].loop_started) for s in snaps]
    assert rank_states[0] == (0.0, True, None)
    first_running = next(state for state in rank_states if not state[1])
    assert first_running == (STARTUP_GIVE_UP_S, False, T0 + STARTUP_GIVE_UP_S)
    assert all(not starting for _, starting, _ in rank_states[int(STARTUP_GIVE_UP_S / POLL_S) :])
    assert snaps[-1].job.ranks[0].gpus == (0,)

    # and the diagnosis over the ten minutes names the fault the clock put 5 s in
    found = findings(history, window=None)
    xid = next(f for f in found if f.id == "xid")
    assert xid.gpus == (1,) and xid.summary.startswith("XID 79 on GPU 1")
    assert f"GPU 1: XID 79 at {_utc(T0 + 6.0, '%H:%M:%S UTC')}" in xid.evidence[0]


def _utc(timestamp: float, form: str) -> str:
    return time.strftime(form, time.gmtime(timestamp))


def test_the_backends_clock_is_the_real_pair_or_one_manual_clock():
    assert clock_of(REAL_CLOCK.wall) is REAL_CLOCK  # the real machine: time.time stamps, time.monotonic times
    assert RealMachine().clock is REAL_CLOCK and REAL_CLOCK == Clock(time.time, time.monotonic)
    manual = ManualClock(5.0)
    assert clock_of(manual) == Clock(wall=manual, elapsed=manual)
    machine = SimulatedMachine("rtx-4090-2", clock=manual)
    assert machine.clock == Clock(manual, manual) and machine.library.clock is manual
    with Pipeline(machine) as pipeline:
        manual.advance(42.0)
        assert [d.timestamp for d in pipeline.gpu_details()] == [47.0, 47.0]  # `gputop check`'s readings
        source = pipeline.host_source()
        try:
            assert source.read([]).timestamp == 47.0  # the AER and kernel-log side
        finally:
            source.close()


def test_a_ranks_eager_sampling_ends_after_a_minute_of_the_clock_and_its_failed_stretch_is_stamped_on_it(tmp_path):
    """The state sampler's notion of time is the clock's: the eager (FOCUSED) minute of a rank still starting,
    and the stamps of a stretch (here one that failed: py-spy cannot be run), while py-spy's own run is real."""
    clock = ManualClock(T0)
    sampler = StateSampler(str(tmp_path / "no-py-spy"), clock=clock_of(clock))
    delivered = threading.Event()
    deliver = sampler.deliver
    sampler.deliver = lambda stretch: (deliver(stretch), delivered.set())
    try:
        me = os.getpid()
        sampler.follow([me], starting=frozenset({me}))
        recorder = sampler._recorders[me]
        assert sampler.budget_for(recorder) is FOCUSED
        assert delivered.wait(30.0), "the failed stretch was not handed over"
        (stretch,) = sampler.take()
        assert (stretch.start, stretch.end) == (T0, T0) and "cannot run py-spy" in (stretch.error or "")
        clock.advance(EAGER_S - 1.0)
        assert sampler.budget_for(recorder) is FOCUSED
        clock.advance(1.0)
        assert sampler.budget_for(recorder) is BACKGROUND
    finally:
        sampler.close()
