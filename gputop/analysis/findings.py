"""Everything gputop concludes about a history, assembled in one place for every sink (the TUI's verdict, the
`r` report, `gputop report`, `gputop serve`, `gputop demo --no-tui`): the diagnosis, joined by the trace's
findings and the machine check's when they ran.  The diagnosis itself (`gputop.analysis.diagnosis`) knows
neither; the machine check's code is loaded only when a check ran or the counters were watched."""

from __future__ import annotations

from typing import TYPE_CHECKING, MutableMapping, Optional, Protocol, Sequence

from gputop.analysis.diagnosis import diagnose
from gputop.analysis.observations import BenchInput
from gputop.analysis.prediction import step_rate_of_trace, with_step_rate
from gputop.analysis.thresholds import DIAGNOSIS_WINDOW_S
from gputop.history import History
from gputop.model import LABEL_INFRA, SEVERITY_ORDER, Finding

if TYPE_CHECKING:
    from gputop.analysis.machine_check import CheckReport


class TraceResultLike(Protocol):
    """A trace's result (`gputop.tracing.TraceResult`): the findings its checks made."""

    @property
    def findings(self) -> Sequence[Finding]: ...


def findings(
    history: History,
    bench: BenchInput = None,
    trace: Optional[TraceResultLike] = None,
    check: Optional[CheckReport] = None,
    *,
    window: Optional[float] = DIAGNOSIS_WINDOW_S,
    memory: Optional[MutableMapping[str, int]] = None,
) -> list[Finding]:
    """Everything gputop concludes about `history`: the diagnosis (with the loader benchmark's result, when one
    ran), plus the trace's findings (`gputop.tracing.TraceResult`) and the machine check's
    (`gputop.analysis.machine_check.CheckReport`) when they ran.  Most severe first.  Without a machine
    check, the pipeline's counter watch stands for it when it ran (`Snapshot.counter_health`)."""
    latest = history.latest
    if check is None and latest is not None and latest.counter_health is not None:
        from gputop.analysis.counter_health import as_check_report  # the check's code: only when watched

        check = as_check_report(latest.counter_health)
    return with_extra_findings(diagnose(history, bench, window=window, memory=memory), trace, check)


def with_extra_findings(
    found: Sequence[Finding], trace: Optional[TraceResultLike] = None, check: Optional[CheckReport] = None
) -> list[Finding]:
    """The diagnosis' findings joined by the trace's and the machine check's, when they ran (see `findings`)."""
    found = list(found)
    if trace is not None:
        # the trace timed the steps: the predictions made as factors get their steps/s
        ranks = getattr(trace, "ranks", None)
        found = with_step_rate(found, step_rate_of_trace(ranks) if isinstance(ranks, (list, tuple)) else None)
    if trace is not None and trace.findings:
        found = with_trace_findings(found, trace.findings)
    if check is not None:
        found = with_machine_findings(found, check)
    return found


def with_trace_findings(findings: Sequence[Finding], trace_findings: Sequence[Finding]) -> list[Finding]:
    """The diagnosis' findings plus the trace's (`gputop report --trace`), ordered by severity; a trace
    finding means the job is not "healthy", so that one goes."""
    if not trace_findings:
        return list(findings)
    kept = [f for f in findings if f.id != "healthy"]
    return sorted([*kept, *trace_findings], key=lambda f: SEVERITY_ORDER.get(f.severity, 9))


# ------------------------------------------------------------------ into the report's findings

# check id -> the diagnosis finding ids that already say the same from the snapshots (no second finding then)
_SAID_BY_DIAGNOSIS = {
    "gpus": ("gpu_lost",),
    "pcie.link": ("pcie_downgrade",),
    "clocks.events": ("throttle",),
    "power.limit": ("power_cap",),
    "memory.ecc": ("ecc",),
    "memory.remap": ("ecc",),
    "nvlink.state": ("nvlink_down",),
    "fabric": ("fabric",),
    "xid": ("xid", "xid_code"),
    "nic.state": ("nic_down",),
    "nic.rate": ("nic_rate",),
    "nic.errors": ("nic_errors",),
}


def with_machine_findings(findings: Sequence[Finding], report: CheckReport) -> list[Finding]:
    """The diagnosis' findings plus one per failing or warning check that the diagnosis did not already make,
    so a report's verdict agrees with its "For the infra team" section."""
    from gputop.analysis.machine_check import FAIL, LABEL_CONFIG, WARN  # the check's code: only when one ran

    have = {f.id for f in findings}
    added = [
        Finding(
            id=f"check.{r.id}",
            title=r.title,
            severity="critical" if r.status == FAIL else "warning",
            confidence=0.9,
            label=LABEL_INFRA if r.status == FAIL else LABEL_CONFIG,
            summary=f"{r.title}: {r.value}",
            evidence=(f"expected {r.expected}", *r.evidence),
            fix='File a ticket with the "For the infra team" section of this report (see there for what to run next).'
            if r.status == FAIL
            else "Make the GPUs' settings match (see the value); `gputop check` exits 0 once they do.",
            gpus=r.gpus,
        )
        for r in report.results
        if r.status in (FAIL, WARN) and not have & set(_SAID_BY_DIAGNOSIS.get(r.id, ()))
    ]
    if not added:
        return list(findings)
    kept = [f for f in findings if f.id != "healthy"]
    return sorted(added + kept, key=lambda f: SEVERITY_ORDER.get(f.severity, 9))
