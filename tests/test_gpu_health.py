"""One health judgement (issue 22): every simulated fault through the card, the diagnosis, `gputop check`, the
report and the exporter, which must agree on the GPU and on its severity class.

The fault list is read from `gputop.sim.profiles.FAULTS`, so a new fault is covered here without a new line.
Each machine is the real pynvml wrappers over the fake library (`Pipeline(SimulatedMachine(...))`) on a manual clock.

The faults of `INFRA_FAULTS` live in what `gputop check` reads at the start and the end of its window (the
GPUs' error counters, the kernel's AER counters and log, the topology), not in the samples.  The pipeline's
counter watch (`Pipeline(..., watch=CounterCadence(...))`) reads the same on its cadence and puts the check's verdict on
the snapshots (`Snapshot.counter_health`), so the exporter, the card without a check run and the findings
without a check see them too.  A counter needs two readings to be seen climbing: the manual clock crosses
the cadence twice within the polls (the first reading at the first poll, then every CADENCE seconds).
The report's health table joins the samples' judgement (the health module's window) and the watch's lines.
"""

from __future__ import annotations

import re

import pytest

from gputop.analysis import gpu_health
from gputop.analysis.findings import findings as assemble_findings
from gputop.analysis.gpu_health import Severity
from gputop.analysis.machine_check import FAIL, WARN, CheckInput, CheckReport, build_report
from gputop.backend import SimulatedMachine
from gputop.exporter import Exporter
from gputop.history import History
from gputop.model import EccCounts, GpuSample, RemappedRows, Snapshot
from gputop.pipeline import CounterCadence, Pipeline
from gputop.report.jsonreport import report_data
from gputop.sim.fake_nvml import ManualClock
from gputop.sim.fake_sysfs import FakeHostTree
from gputop.sim.profiles import FAULTS
from gputop.tui.look import card_marks
from gputop.tui.widgets.gpu_grid import GpuGrid, health_problems

GPU = 3  # the GPU every fault is put on
XID_CODE = 48  # a double-bit ECC error: the hardware's, critical
POLLS = 5
POLL_S = 2.0
CADENCE = 4.0  # the counter watch's: readings at the 1st, 3rd and 5th poll
CLASS = {"critical": Severity.CRITICAL, "warning": Severity.WARN, FAIL: Severity.CRITICAL, WARN: Severity.WARN}
CARD_CLASS = {"FAULT": Severity.CRITICAL, "LOST": Severity.CRITICAL, "WARN": Severity.WARN}


def fault_spec(name: str) -> str:
    """`h100-sxm-8+FAULT` with the fault's argument form filled in: GPU 3, at 0 s, XID 48, optional parts left out."""
    form = re.sub(r"\[.*?\]", "", FAULTS[name][0])
    return "h100-sxm-8+" + form.replace("IDX", str(GPU)).replace("SECONDS", "0").replace("CODE", str(XID_CODE))


def observe(spec: str) -> tuple[History, CheckReport, dict[int, float]]:
    """POLLS snapshots of the simulated machine, `gputop check`'s report over them, and the exporter's
    gputop_gpu_health per GPU after a real update with each snapshot."""
    clock = ManualClock(1_700_000_000.0)
    with Pipeline(SimulatedMachine(spec, clock=clock), watch=CounterCadence(CADENCE)) as pipeline:
        pipeline.backend.library.pcie_latency_s = 0.0  # the fake's 20 ms PCIe sampling sleep is not under test
        tree = FakeHostTree(pipeline.backend.library.spec, pipeline.backend.library.elapsed)
        try:
            before = pipeline.gpu_details()
            bus = [d.pci_bus_id for d in before]
            host_before = tree.read(bus)
            exporter = Exporter(pipeline, diagnose=lambda history: [], log=lambda line: None)
            history = History(pipeline.machine, capacity=POLLS)
            for _ in range(POLLS):
                snap = pipeline.poll()
                history.append(snap)
                exporter.update(snap)
                clock.advance(POLL_S)
            snaps = tuple(history)
            seconds = snaps[-1].timestamp - snaps[0].timestamp
            inp = CheckInput(pipeline.machine, snaps, before, pipeline.gpu_details(), host_before, tree.read(bus), seconds)
        finally:
            tree.close()
    exported = {
        int(sample.labels["gpu"]): sample.value
        for family in exporter.collect()
        if family.name == "gputop_gpu_health"
        for sample in family.samples
    }
    return history, build_report(inp), exported


def card_classes(snap: Snapshot, marks: dict[int, tuple[str, bool]]) -> dict[int, Severity]:
    """What the real card widget draws on each GPU's head line (FAULT / LOST / WARN / a busy or idle word)."""
    grid = GpuGrid()
    grid.snapshots, grid.gpu_count, grid.check_marks = [snap], len(snap.gpus), marks
    text = "\n".join(strip.text for strip in grid.build(160, 60))
    return {int(i): CARD_CLASS.get(word, Severity.OK) for i, word in re.findall(r"GPU(\d+) (\w+)", text)}


def worst_per_gpu(items: list[tuple[tuple[int, ...], str]]) -> dict[int, Severity]:
    out: dict[int, Severity] = {}
    for gpus, word in items:
        for i in gpus:
            out[i] = max(out.get(i, Severity.OK), CLASS.get(word, Severity.OK))
    return out


def flagged(classes: dict[int, Severity]) -> dict[int, Severity]:
    return {i: c for i, c in classes.items() if c != Severity.OK}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_every_simulated_fault_gets_one_class_on_one_gpu_everywhere(fault):
    history, check, exported = observe(fault_spec(fault))
    snaps = list(history)
    # gputop check: the worst status of the lines that name each GPU
    by_check = flagged(worst_per_gpu([(r.gpus, r.status) for r in check.results]))
    # the diagnosis, as every sink assembles it (the machine check's findings joined, as in a live report)
    found = assemble_findings(history, check=check, window=None)
    by_diagnosis = flagged(worst_per_gpu([(f.gpus, f.severity) for f in found]))
    # the report (JSON): its "For the infra team" section, and its health table's state
    data = report_data(history, found, infra=check)
    by_report = flagged(worst_per_gpu([(tuple(c["gpus"]), c["status"]) for c in data["infra"]["failing"]]))
    by_report_health = flagged({h["index"]: CLASS.get(h["state"], Severity.OK) for h in data["health"]})
    # the findings without a machine check: the counter watch's window stands for it
    found_watched = assemble_findings(history, window=None)
    by_watch = flagged(worst_per_gpu([(f.gpus, f.severity) for f in found_watched]))
    # the card: as drawn from the snapshot (with the counter watch's marks), and once the machine check (key c) ran
    by_card = flagged(card_classes(snaps[-1], {}))
    by_card_checked = flagged(card_classes(snaps[-1], card_marks(check)))
    by_exporter = flagged({i: Severity(int(v)) for i, v in exported.items()})
    if fault == "old-driver":  # not a fault of a GPU: the adapter falls back, and nothing may be flagged
        expected: dict[int, Severity] = {}
    else:
        assert set(by_check) == {GPU}, (fault, check.summary, [r.line() for r in check.results if r.gpus])
        expected = by_check
    assert by_diagnosis == expected, (fault, [(f.id, f.severity, f.gpus) for f in found])
    assert by_report == expected, (fault, data["infra"]["failing"])
    assert by_card_checked == expected, fault
    assert by_watch == expected, (fault, [(f.id, f.severity, f.gpus) for f in found_watched])
    assert by_card == expected, fault
    assert by_exporter == expected, (fault, exported)
    assert by_report_health == expected, (fault, data["health"])


def test_the_fault_list_is_all_covered():
    """The parametrisation reads FAULTS itself: every form turns into a spec the parser accepts."""
    from gputop.sim.spec import parse_spec

    for name in FAULTS:
        assert parse_spec(fault_spec(name)).text.endswith(fault_spec(name).split("+", 1)[1])


# ---------------------------------------------------------------- the edges the issue found, decided once


def _sample(**changes: object) -> GpuSample:
    history, _, _ = observe("h100-sxm-8")
    gpu = list(history)[-1].gpus[GPU]
    from dataclasses import replace

    return replace(gpu, **changes)  # type: ignore[arg-type]  # the test's keyword changes to a real sample


def test_past_uncorrectable_errors_and_done_remaps_are_one_warning_class():
    gpu = _sample(ecc=EccCounts(0, 0, 5, 2), remapped_rows=RemappedRows(0, 2, False, False))
    health = gpu_health.judge_sample(gpu)
    assert {p.rule: p.severity for p in health.problems} == {"ecc": Severity.WARN, "remap": Severity.WARN}
    faults, warnings = health_problems(gpu)
    assert faults == [] and "ECC 2 past" in warnings and "remap 2" in warnings


def test_a_link_trained_down_fails_narrow_at_any_load_slower_only_while_busy():
    """A width below maximum is a seating / riser / slot fault (NVIDIA GPUs do not narrow a link to save power);
    a generation below maximum while busy is a signal-integrity fault: both are tickets (CRITICAL); an idle
    link at a lower generation is power saving (nothing)."""
    from dataclasses import replace

    gpu = _sample()
    idle_gen1 = replace(gpu, utilization_gpu=0.0, pcie=replace(gpu.pcie, gen_current=1))
    idle_narrow = replace(gpu, utilization_gpu=0.0, pcie=replace(gpu.pcie, width_current=8))
    busy_gen3 = replace(gpu, utilization_gpu=95.0, pcie=replace(gpu.pcie, gen_current=3))
    assert gpu_health.pcie_degraded(idle_gen1) is None and not gpu_health.judge_sample(idle_gen1).of("pcie")
    assert gpu_health.judge_sample(idle_narrow).of("pcie")[0].severity == Severity.CRITICAL
    assert gpu_health.judge_sample(busy_gen3).of("pcie")[0].severity == Severity.CRITICAL
