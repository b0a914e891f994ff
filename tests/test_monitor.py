"""The monitor without its screen (gputop/monitor.py, issue 39): the diagnosis' schedule on a manual clock, the
findings it shows from `findings()`, the background actions' results joining them, and the collector's hand-over
to the view.  No Textual here: the view is a recorder, and the schedule's tests run no thread (the recorder
keeps the diagnosis it is asked to run in the background, and the test runs it when it chooses)."""

from __future__ import annotations

import threading
from typing import Callable, Optional

from gputop.analysis.diagnosis import verdict_line
from gputop.analysis.findings import findings
from gputop.backend import SimulatedMachine
from gputop.history import History
from gputop.model import LABEL_CODE, Finding, MachineInfo, Snapshot
from gputop.monitor import DIAGNOSE_EVERY, DIAGNOSE_EVERY_WITHOUT_JOB, Monitor, Verdict
from gputop.pipeline import Pipeline
from gputop.sim.fake_nvml import ManualClock
from gputop.tracing import TraceResult
from tests.harness.histories import ScriptedSource, fixed_diagnose, make_machine, make_snapshots
from tests.harness.processes import wait_until

TRACE_FINDING = Finding(
    id="trace_communication",
    title="Communication-bound (> 30% of the step)",
    severity="warning",
    confidence=0.8,
    label=LABEL_CODE,
    summary="Communication takes 41% of rank 0's time (the rule: > 30%)",
)


class RecordingView:
    """A `MonitorView` that keeps what it is handed; a diagnosis asked for in the background waits in `jobs`."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[Snapshot], bool, Optional[MachineInfo]]] = []
        self.errors: list[str] = []
        self.verdicts: list[Verdict] = []
        self.jobs: list[Callable[[], None]] = []

    def snapshots_ready(self, snapshots: list[Snapshot], reset: bool, machine: Optional[MachineInfo]) -> None:
        self.batches.append((snapshots, reset, machine))

    def poll_failed(self, error: str) -> None:
        self.errors.append(error)

    def could_not_start(self, error: Exception) -> None:
        raise AssertionError(f"not a starting pipeline: {error}")

    def diagnosed(self, verdict: Verdict) -> None:
        self.verdicts.append(verdict)

    def run_in_background(self, job: Callable[[], None]) -> None:
        self.jobs.append(job)

    def run_jobs(self, monitor: Monitor) -> list[Verdict]:
        """Run the diagnoses asked for, and hand their verdicts back as the view's thread would."""
        jobs, self.jobs = self.jobs, []
        for job in jobs:
            job()
        verdicts, self.verdicts = self.verdicts, []
        for verdict in verdicts:
            monitor.took_verdict(verdict)
        return verdicts


class CountedEvent(threading.Event):
    """An Event that counts the waits on it (the collector's, for the view to be ready)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0

    def wait(self, timeout: Optional[float] = None) -> bool:
        self.waits += 1
        return super().wait(timeout)


def scripted_monitor(clock: ManualClock, *, with_job: bool) -> tuple[Monitor, RecordingView, list[Snapshot]]:
    snapshots = make_snapshots(40, gpus=2, cores=8, with_job=with_job)
    view = RecordingView()
    monitor = Monitor(ScriptedSource(make_machine(gpus=2, cores=8), snapshots), view, diagnose=fixed_diagnose, clock=clock)
    return monitor, view, snapshots


def test_the_first_verdict_is_due_once_there_is_a_snapshot_and_one_diagnosis_runs_at_a_time():
    clock = ManualClock()
    monitor, view, snapshots = scripted_monitor(clock, with_job=False)
    assert not monitor.diagnose_soon(force=True)  # nothing kept yet
    assert monitor.receive(snapshots[:1], reset=False)  # the first verdict is due now
    assert not monitor.receive(snapshots[1:2], reset=False)  # and only once
    assert monitor.diagnose_soon(force=True) and len(view.jobs) == 1
    assert not monitor.diagnose_soon(force=True)  # one is running: no second beside it
    (verdict,) = view.run_jobs(monitor)
    assert monitor.verdict is verdict and verdict.findings is not None
    assert [f.id for f in verdict.findings] == [f.id for f in fixed_diagnose(monitor.history, None)[0]]


def test_without_a_job_the_verdict_is_renewed_every_other_tick_and_not_while_paused():
    clock = ManualClock()
    monitor, view, snapshots = scripted_monitor(clock, with_job=False)
    monitor.receive(snapshots[:5], reset=False)
    started = []
    for _tick in range(6):  # the view calls diagnose_soon every DIAGNOSE_EVERY seconds
        started.append(monitor.diagnose_soon())
        view.run_jobs(monitor)
        clock.advance(DIAGNOSE_EVERY)
    assert DIAGNOSE_EVERY_WITHOUT_JOB == 2 * DIAGNOSE_EVERY
    assert started == [True, False, True, False, True, False]
    monitor.paused = True
    clock.advance(DIAGNOSE_EVERY_WITHOUT_JOB)
    assert not monitor.diagnose_soon()  # paused: the screen stands still, so does its verdict
    assert monitor.diagnose_soon(force=True)  # an action's result is diagnosed even while paused
    assert len(view.run_jobs(monitor)) == 1


def test_with_a_job_every_tick_renews_the_verdict_from_the_history_as_it_was_asked_for():
    clock = ManualClock()
    monitor, view, snapshots = scripted_monitor(clock, with_job=True)
    read: list[int] = []

    def counting(history: History, bench: object, trace: object, check: object) -> tuple[list[Finding], str]:
        read.append(len(history))
        return fixed_diagnose(history, bench, trace, check)

    monitor.diagnose = counting
    for tick in range(4):
        monitor.receive(snapshots[6 * tick : 6 * tick + 5], reset=False)
        assert monitor.diagnose_soon()
        monitor.receive(snapshots[6 * tick + 5 : 6 * tick + 6], reset=False)  # the live history grows meanwhile
        (verdict,) = view.run_jobs(monitor)
        assert verdict is monitor.verdict
        clock.advance(DIAGNOSE_EVERY)
    assert read == [5, 11, 17, 23] and len(monitor.history) == 24


def test_the_verdict_is_findings_on_the_simulated_machine_and_an_actions_result_joins_it_at_once():
    clock = ManualClock(1_700_000_000.0)
    view = RecordingView()
    with Pipeline(SimulatedMachine("h100-sxm-8+kernel-xid=5:48", clock=clock)) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0
        monitor = Monitor(pipeline, view, interval=1.0, clock=clock)
        for _ in range(5):
            monitor.receive([pipeline.poll()], reset=False)
            clock.advance(1.0)
    assert monitor.diagnose_soon(force=True)
    (verdict,) = view.run_jobs(monitor)
    expected = findings(monitor.history, None, None, None)
    assert verdict.findings is not None and [f.id for f in verdict.findings] == [f.id for f in expected]
    assert verdict.line == verdict_line(expected, count_more=False)
    assert "trace_communication" not in {f.id for f in verdict.findings}

    monitor.keep_trace(TraceResult(target="PID 1", findings=(TRACE_FINDING,)))  # key t's run came back
    (verdict,) = view.run_jobs(monitor)  # asked for at once, not at the next tick
    assert verdict.findings is not None and "trace_communication" in {f.id for f in verdict.findings}
    assert monitor.trace is not None and monitor.assess(monitor.history, None, monitor.trace, None)[0] == verdict.findings


def test_a_failing_diagnosis_is_a_verdict_line_and_none_is_kept_after_stop():
    clock = ManualClock()
    monitor, view, snapshots = scripted_monitor(clock, with_job=True)

    def broken(history: History, bench: object, trace: object, check: object) -> tuple[list[Finding], str]:
        raise ValueError("a bug")

    monitor.diagnose = broken
    monitor.receive(snapshots[:3], reset=False)
    monitor.diagnose_soon()
    (verdict,) = view.run_jobs(monitor)
    assert verdict == Verdict(None, "Verdict: diagnosis failed (ValueError: a bug)")
    monitor.diagnose = fixed_diagnose
    clock.advance(DIAGNOSE_EVERY)
    assert monitor.diagnose_soon()
    monitor.stop()  # quitting: a verdict that comes back now is not kept, and the next may start
    view.jobs.pop()()
    assert not monitor.took_verdict(view.verdicts.pop()) and monitor.verdict is verdict
    assert monitor.diagnose_soon(force=True)


def test_a_new_interval_keeps_the_history_and_a_reset_starts_it_over():
    clock = ManualClock()
    monitor, _view, snapshots = scripted_monitor(clock, with_job=False)
    monitor.receive(snapshots[:20], reset=False)
    monitor.receive(snapshots[10:15], reset=False)  # seen already (a stalled source): not kept twice
    assert len(monitor.history) == 20 and monitor.snapshots_seen == 25
    monitor.set_interval(0.5)
    assert monitor.interval == 0.5 and [s.timestamp for s in monitor.history] == [s.timestamp for s in snapshots[:20]]
    monitor.receive(snapshots[:3], reset=True)  # a replay sought back
    assert [s.timestamp for s in monitor.history] == [s.timestamp for s in snapshots[:3]]


def test_the_collector_holds_its_batch_until_the_view_is_ready_and_says_a_poll_failed():
    machine = make_machine(gpus=2, cores=8)
    snapshots = make_snapshots(3, gpus=2, cores=8)
    source = ScriptedSource(machine, snapshots)  # then its poll blocks until closed, and fails
    view = RecordingView()
    monitor = Monitor(source, view, interval=0.001, diagnose=fixed_diagnose)
    try:
        monitor.view_ready = waits = CountedEvent()
        monitor.start_collecting()
        wait_until(lambda: waits.waits >= 3, what="the collector waiting for the view")
        # the collector waits with its first batch: it polls no further, and nothing reached the view
        assert source.polls == 1 and view.batches == []
        monitor.view_ready.set()
        wait_until(lambda: len(view.batches) == 3, what="the three snapshots", state=lambda: view.batches)
        assert [batch[0] for batch in view.batches] == [[s] for s in snapshots]
        assert all(machine_changed is None for _, _, machine_changed in view.batches)  # the source kept its machine
    finally:
        source.close()  # its blocked poll fails: the failure goes to the view, and collection goes on
        wait_until(lambda: view.errors, what="the failed poll")
        monitor.stop()
        assert monitor.wait_for_collector(5)
    assert view.errors[0] == "source closed"
