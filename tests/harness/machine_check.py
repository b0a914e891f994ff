"""`gputop check` over the simulated machine without waiting: what the check collects, and a scripted TUI check."""

from __future__ import annotations

from typing import Any, Callable

from gputop.analysis.machine_check import CheckInput, build_report
from gputop.backend import SimulatedMachine
from gputop.pipeline import Pipeline
from gputop.sim.fake_nvml import ManualClock
from gputop.sim.fake_sysfs import FakeHostTree


def simulated_check_input(spec: str = "h100-sxm-8", seconds: float = 5.0) -> CheckInput:
    """What `gputop check` collects on a simulated machine, on a clock the caller never waits for: GPU details
    and the fake kernel tree read, two polls `seconds` apart on a ManualClock, read again."""
    clock = ManualClock()
    pipeline = Pipeline(SimulatedMachine(spec, clock=clock))
    tree = FakeHostTree(pipeline.backend.library.spec, pipeline.backend.library.elapsed)
    try:
        before = pipeline.gpu_details()
        bus = [d.pci_bus_id for d in before]
        host_before = tree.read(bus)
        snaps = [pipeline.poll()]
        clock.advance(seconds)
        snaps.append(pipeline.poll())
        return CheckInput(pipeline.machine, tuple(snaps), before, pipeline.gpu_details(), host_before, tree.read(bus), seconds)
    finally:
        tree.close()
        pipeline.close()


def scripted_check(spec: str) -> Callable[..., Any]:
    """A TUI machine check (GputopApp.actions.machine_check) that answers at once with what `gputop check` found on the
    simulated machine `spec`."""
    report = build_report(simulated_check_input(spec))

    def machine_check(source, window, stop, seconds):
        return report

    return machine_check
