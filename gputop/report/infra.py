"""The report's "For the infra team" section as data: the ticket text an infra team asks for.

Identity (host, kernel, driver, CUDA; per GPU its serial, VBIOS, board part number, bus id, UUID), the
failing checks with their numbers, the XIDs with their times, the commands the team will ask for next, and
the advice to capture it all before any reset; and the NIC ports (state, rate, traffic, error counters) with
the health module's judgement of them.  A live report runs `gputop check`'s checks over its own
window (`check_window.Evidence`); a report from a recording has no NVML details or kernel readings, so
the section is built from what the snapshots carry and says what is missing.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from gputop.analysis.gpu_health import judge_nics
from gputop.analysis.machine_check import (
    CAPTURE_BEFORE_RESET,
    FAIL,
    NEXT_COMMANDS,
    WARN,
    CheckReport,
    report_jsonable,
)
from gputop.analysis.xids import distinct_xids, meaning_of
from gputop.history import History
from gputop.model import LABEL_INFRA, Finding, Snapshot
from gputop.units import utc_time


def nic_rows(snaps: Sequence[Snapshot]) -> Optional[list[dict[str, Any]]]:
    """Each NIC port as the window ends, with the health module's judgement over the window (None: the
    snapshots carry no NIC readings)."""
    judged = judge_nics(snaps)
    if judged is None:
        return None
    return [
        {
            "device": p.device,
            "port": p.port,
            "name": h.name,
            "link_layer": p.link_layer,
            "state": p.state,
            "up": p.up,
            "rate_gbps": p.rate_gbps,
            "rx_bytes_per_s": p.rx_bytes_per_s,
            "tx_bytes_per_s": p.tx_bytes_per_s,
            "errors": {k: v for k, v in p.errors.items() if v},  # the counters that are not 0, since the driver loaded
            "problems": [q.evidence for q in h.problems],
        }
        for h, p in zip(judged.ports, judged.latest)
    ]


def infra_data(history: History, findings: Sequence[Finding], check: Optional[CheckReport]) -> dict[str, Any]:
    """The "For the infra team" section: `gputop check`'s report when there is one, else what the snapshots and
    the findings say (a report from a recording)."""
    snaps = list(history)
    if check is not None:
        data = report_jsonable(check)
        data["source"] = "checks"
        data["failing"] = [c for c in data["checks"] if c["status"] in (FAIL, WARN)]
        data["missing"] = None
        data["nics"] = nic_rows(snaps)
        return data
    return _from_findings(history, snaps, findings)


def _gpu_identities(snaps: Sequence[Snapshot]) -> list[dict[str, Any]]:
    """The GPUs of the latest snapshot, as the check lists them (what a snapshot does not hold: None)."""
    latest = snaps[-1] if snaps else None
    return [
        {
            "index": g.index,
            "name": g.name,
            "uuid": g.uuid,
            "serial": None,
            "vbios": None,
            "board_part_number": None,
            "pci_bus_id": g.pci_bus_id,
            "lost": g.lost,
        }
        for g in (latest.gpus if latest else ())
    ]


def _xid_lines(snaps: Sequence[Snapshot]) -> list[str]:
    """Each distinct XID the snapshots saw, per GPU, as the check's kernel-log lines read."""
    xids = []
    for index in sorted({g.index for s in snaps for g in s.gpus}):
        for event in distinct_xids(g for s in snaps for g in s.gpus if g.index == index):
            meaning = meaning_of(event.code)
            xids.append(
                f"{utc_time(event.timestamp)}  GPU {index}  XID {event.code}: {meaning.meaning} [NVML event]"
                f" action {meaning.advice}"
            )
    return xids


def _failing_findings(findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """The infrastructure findings, as failing checks."""
    return [
        {
            "id": f.id,
            "title": f.title,
            "status": FAIL if f.severity == "critical" else WARN,
            "value": f.summary,
            "expected": "",
            "gpus": list(f.gpus),
            "evidence": list(f.evidence),
            "line": f.summary,
        }
        for f in findings
        if f.label == LABEL_INFRA
    ]


def _from_findings(history: History, snaps: Sequence[Snapshot], findings: Sequence[Finding]) -> dict[str, Any]:
    m = history.machine
    gpus = _gpu_identities(snaps)
    failing = _failing_findings(findings)
    xids = _xid_lines(snaps)
    return {
        "source": "findings",
        "machine": {
            "hostname": m.hostname,
            "kernel": None,
            "driver": m.driver_version,
            "driver_module": None,
            "cuda": m.cuda_version,
            "nvml": m.nvml_version,
            "simulated": m.simulated,
            "gpu_error": m.gpu_error,
        },
        "gpus": gpus,
        "failing": failing,
        "checks": [],
        "summary": None,
        "xids": xids,
        "nics": nic_rows(snaps),
        "next_commands": [{"command": c, "why": w} for c, w in NEXT_COMMANDS],
        "advice": CAPTURE_BEFORE_RESET,
        "missing": (
            "serials, VBIOS, error counters and the kernel log were not read for this report (it was built "
            "from a recording): run `gputop check` on the machine itself and attach its output"
        ),
    }
