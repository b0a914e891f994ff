"""The counters only `gputop check` used to read, judged between two of the pipeline's readings.

`gputop check` reads the GPUs' error counters (PCIe replays, NVLink CRC/replay/recovery, retired pages),
the topology and the kernel's side (sysfs AER counters, the kernel log's `NVRM: Xid` lines) at the start
and at the end of its window.  The pipeline's counter watch (`collect/counters.py`) reads the same every
`watch_counters` seconds, and the window between two readings is judged here by the check's own lines
(`COUNTER_CHECKS`, from `analysis/machine_check.py`: no second copy of a rule).  The result rides on every
snapshot (`Snapshot.counter_health`), so the exporter, the recording, the card and the findings see it.

The samples carry everything else a check judges (lost, ECC, remapping, PCIe link, NVLink state, slowdowns,
the power limit) and the health module judges that from them; only the lines below are the watch's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from gputop.analysis.gpu_health import GpuHealth, Severity
from gputop.analysis.machine_check import (
    FAIL,
    STATUS_OF,
    WARN,
    CheckInput,
    CheckReport,
    check_nvlink_errors,
    check_pcie_aer,
    check_pcie_replay,
    check_retired_pages,
    check_topology,
    check_xids,
)
from gputop.model import CheckResult, CounterHealth, GpuDetails, HostReadings, MachineInfo, Snapshot

# `gputop check`'s lines whose evidence is not in the samples: the counters, the kernel's side, the topology.
# (The XID line also reads NVML's events in the snapshot; its severity is the health module's XID rule, so
# it agrees with what the samples say.)
COUNTER_CHECKS: tuple[Callable[[CheckInput], Optional[CheckResult]], ...] = (
    check_pcie_replay,
    check_pcie_aer,
    check_nvlink_errors,
    check_topology,
    check_retired_pages,
    check_xids,
)
# A check's status as the health module's severity (the inverse of machine_check.STATUS_OF).
SEVERITY_OF_STATUS = {status: severity for severity, status in STATUS_OF.items() if status in (FAIL, WARN)}


@dataclass(frozen=True)
class CounterReading:
    """One reading of the counters: the GPUs' details and the kernel's side, at `timestamp`."""

    timestamp: float
    details: tuple[GpuDetails, ...]
    host: HostReadings


def judge_counters(machine: MachineInfo, before: CounterReading, after: CounterReading, snapshot: Snapshot) -> CounterHealth:
    """The counter lines of `gputop check` over the window from `before` to `after` (the same reading twice
    on the first one: what a single reading shows, nothing climbing yet); `snapshot`: the poll's, for the
    GPUs' bus IDs and NVML's XID events."""
    inp = CheckInput(
        machine=machine,
        snapshots=(snapshot,),
        before=before.details,
        after=after.details,
        host_before=before.host,
        host_after=after.host,
        seconds=max(0.0, after.timestamp - before.timestamp),
    )
    found = [result for check in COUNTER_CHECKS if (result := check(inp)) is not None and result.status in (FAIL, WARN)]
    return CounterHealth(timestamp=after.timestamp, seconds=inp.seconds, checks=tuple(found))


def as_check_report(health: CounterHealth) -> CheckReport:
    """The window's lines as a `CheckReport`, for what reads a machine check (the card's marks, the findings)."""
    return CheckReport(results=health.checks, seconds=health.seconds)


def counter_problems(health: Optional[CounterHealth]) -> dict[int, dict[str, Severity]]:
    """GPU index -> {check id: severity} of the lines that name it (the exporter's health gauges)."""
    out: dict[int, dict[str, Severity]] = {}
    for check in health.checks if health is not None else ():
        for index in check.gpus:
            severity = SEVERITY_OF_STATUS[check.status]
            rules = out.setdefault(index, {})
            rules[check.id] = max(rules.get(check.id, Severity.OK), severity)
    return out


def rule_severities(judged: Optional[GpuHealth], counted: dict[str, Severity]) -> dict[str, Severity]:
    """One GPU's rules at their worst severity: the health module's over a window (`judged`) joined with the
    counter watch's lines naming it (`counter_problems(...)[gpu]`): what /metrics and the report's health table
    both show, so they say the same."""
    rules = {p.rule: p.severity for p in reversed(judged.problems)} if judged is not None else {}  # worst last: it stays
    for rule, severity in counted.items():
        rules[rule] = max(rules.get(rule, Severity.OK), severity)
    return rules
