"""What an XID means and whose problem it is.

XIDs are the driver's error reports (the `NVRM: Xid` lines in `dmesg`).  Some come from the hardware
or its firmware and go in a ticket; others are how a bad kernel in the job shows up (an illegal
address is XID 13/31/43) and belong to the code.  The table follows NVIDIA's XID catalogue
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Analyzing Xid Errors with the Xid
Catalog", Ampere and newer) for the codes seen on data-centre GPUs: each entry carries the catalogue's
"Resolution Bucket (Immediate Action)" word (`bucket`: RESTART_APP, RESET_GPU, RESTART_BM for a reboot of the
node, CONTACT_SUPPORT for an RMA case, CHECK_MECHANICALS for seating/cabling/PCIe, IGNORE) and what to do in
words (`action`).  (Only the catalogue's first rows could be re-read when the buckets were added, XID 13's
RESTART_APP among them; the other codes' buckets are as the catalogue was known then and should be checked
against its spreadsheet row by row.)  An XID not in it is treated as the hardware's until someone shows otherwise, since the
ticket then carries the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from gputop.model import LABEL_CODE, LABEL_INFRA, GpuSample, XidEvent, sysfs_bus_id


def xid_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:5D:00.0" -> "0000:5d:00", the form `NVRM: Xid (PCI:...)` lines use."""
    return sysfs_bus_id(nvml_bus_id).rsplit(".", 1)[0]


@dataclass(frozen=True)
class XidMeaning:
    code: int
    meaning: str
    label: str  # LABEL_CODE or LABEL_INFRA
    severity: str  # "critical" or "warning"
    action: str  # what to do, in words (the check line, the report's infra section, the exporter's info metric)
    bucket: str = "CONTACT_SUPPORT"  # NVIDIA's catalogue: Resolution Bucket (Immediate Action)

    @property
    def advice(self) -> str:
        """ "RESET_GPU: drain the node and reset the GPU ...": the catalogue's word, then ours."""
        return f"{self.bucket}: {self.action}"


def _infra(code: int, meaning: str, severity: str, action: str, bucket: str) -> XidMeaning:
    return XidMeaning(code, meaning, LABEL_INFRA, severity, action, bucket)


def _code(code: int, meaning: str, action: str) -> XidMeaning:
    return XidMeaning(code, meaning, LABEL_CODE, "warning", action, "RESTART_APP")


_RESET = "drain the node and reset the GPU (nvidia-smi -r -i GPU_INDEX); file a ticket if it comes back"
_RMA = "drain the node and open an RMA case with the XID lines from `dmesg` and nvidia-bug-report.sh"
_BUS = (
    "drain the node and reboot it (a reset cannot reach a GPU off the bus); check the PCIe link, riser and "
    "power cabling, and RMA if it comes back"
)
_KERNEL = (
    "a kernel in the job read or wrote outside its memory: rerun with CUDA_LAUNCH_BLOCKING=1 "
    "or under compute-sanitizer to find it"
)

CATALOGUE: dict[int, XidMeaning] = {
    m.code: m
    for m in (
        _code(13, "graphics engine exception (often an out-of-range access in a kernel)", _KERNEL),
        _code(31, "GPU memory page fault (an illegal address, most often a bug in a kernel)", _KERNEL),
        _code(43, "GPU stopped processing (the job's context was killed after a fault)", _KERNEL),
        XidMeaning(
            45,
            "preemptive cleanup after an earlier error or a killed process",
            LABEL_CODE,
            "warning",
            "look at the XID before it; on its own it follows a killed or crashed process",
            "IGNORE",
        ),
        _infra(48, "double-bit ECC error (uncorrectable memory error)", "critical", _RESET, "RESET_GPU"),
        _infra(61, "internal micro-controller breakpoint/warning", "warning", _RESET, "RESET_GPU"),
        _infra(62, "internal micro-controller halt", "critical", _RESET, "RESET_GPU"),
        _infra(
            63,
            "ECC page retirement or row remapping recorded",
            "warning",
            "a reset applies the remap; watch for XID 64 or growing counts",
            "RESET_GPU",
        ),
        _infra(64, "ECC page retirement or row remapping failed", "critical", _RMA, "CONTACT_SUPPORT"),
        _infra(
            74,
            "NVLink error",
            "critical",
            "reset the GPU; if it comes back, file a ticket: check the NVLink cabling/baseboard (collectives slow or hang)",
            "RESET_GPU",
        ),
        _infra(79, "GPU has fallen off the bus", "critical", _BUS, "RESTART_BM"),
        _infra(92, "high single-bit ECC error rate", "warning", "watch the ECC counters; RMA if the rate keeps up", "IGNORE"),
        _infra(
            94,
            "contained ECC error (the affected process was stopped)",
            "critical",
            "restart the application; the GPU keeps serving others, reset it when drained",
            "RESTART_APP",
        ),
        _infra(95, "uncontained ECC error (every process on the GPU was stopped)", "critical", _RESET, "RESET_GPU"),
        _infra(119, "GSP firmware RPC timeout", "critical", _RESET, "RESET_GPU"),
        _infra(120, "GSP firmware error", "critical", _RESET, "RESET_GPU"),
        _infra(121, "C2C (chip-to-chip) link error", "critical", _RESET, "RESET_GPU"),
        _infra(140, "unrecovered ECC error", "critical", _RESET, "RESET_GPU"),
    )
}


def meaning_of(code: int) -> XidMeaning:
    """The catalogue's entry, or a hardware-side default for a code it does not list."""
    known = CATALOGUE.get(code)
    if known is not None:
        return known
    return _infra(
        code,
        "not in gputop's table",
        "warning",
        "look it up in NVIDIA's XID catalogue and file a ticket with the `dmesg` lines",
        "CONTACT_SUPPORT",
    )


def distinct_xids(samples: Iterable[GpuSample]) -> list[XidEvent]:
    """Each XID the samples carry, once (every sample repeats the ones seen so far), oldest first."""
    return sorted({event for sample in samples for event in sample.xids or ()}, key=lambda e: (e.timestamp, e.code))
