"""What an XID means and whose problem it is.

XIDs are the driver's error reports (the `NVRM: Xid` lines in `dmesg`).  Some come from the hardware
or its firmware and go in a ticket; others are how a bad kernel in the job shows up (an illegal
address is XID 13/31/43) and belong to the code.  The table follows NVIDIA's XID catalogue
(docs.nvidia.com/deploy/xid-errors) for the codes seen on data-centre GPUs; an XID not in it is
treated as the hardware's until someone shows otherwise, since the ticket then carries the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from gputop.model import LABEL_CODE, LABEL_INFRA, GpuSample, XidEvent


@dataclass(frozen=True)
class XidMeaning:
    code: int
    meaning: str
    label: str  # LABEL_CODE or LABEL_INFRA
    severity: str  # "critical" or "warning"
    action: str


def _infra(code: int, meaning: str, severity: str, action: str) -> XidMeaning:
    return XidMeaning(code, meaning, LABEL_INFRA, severity, action)


def _code(code: int, meaning: str, action: str) -> XidMeaning:
    return XidMeaning(code, meaning, LABEL_CODE, "warning", action)


_RESET = "drain the node and reset the GPU (nvidia-smi -r -i GPU_INDEX); file a ticket if it comes back"
_TICKET = "file a ticket with the XID lines from `dmesg`; the GPU needs a reset or an RMA"
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
        ),
        _infra(48, "double-bit ECC error (uncorrectable memory error)", "critical", _RESET),
        _infra(61, "internal micro-controller breakpoint/warning", "warning", _TICKET),
        _infra(62, "internal micro-controller halt", "critical", _TICKET),
        _infra(
            63,
            "ECC page retirement or row remapping recorded",
            "warning",
            "a reset applies the remap; watch for XID 64 or growing counts",
        ),
        _infra(64, "ECC page retirement or row remapping failed", "critical", _TICKET),
        _infra(74, "NVLink error", "critical", "file a ticket: NVLink failed on this GPU; collectives will slow or hang"),
        _infra(79, "GPU has fallen off the bus", "critical", _TICKET),
        _infra(92, "high single-bit ECC error rate", "warning", _TICKET),
        _infra(94, "contained ECC error (the affected process was stopped)", "critical", _RESET),
        _infra(95, "uncontained ECC error (every process on the GPU was stopped)", "critical", _RESET),
        _infra(119, "GSP firmware RPC timeout", "critical", _TICKET),
        _infra(120, "GSP firmware error", "critical", _TICKET),
        _infra(121, "C2C (chip-to-chip) link error", "critical", _TICKET),
        _infra(140, "unrecovered ECC error", "critical", _RESET),
    )
}


def meaning_of(code: int) -> XidMeaning:
    """The catalogue's entry, or a hardware-side default for a code it does not list."""
    known = CATALOGUE.get(code)
    if known is not None:
        return known
    return _infra(
        code, "not in gputop's table", "warning", "look it up in NVIDIA's XID catalogue and file a ticket with the `dmesg` lines"
    )


def distinct_xids(samples: Iterable[GpuSample]) -> list[XidEvent]:
    """Each XID the samples carry, once (every sample repeats the ones seen so far), oldest first."""
    return sorted({event for sample in samples for event in sample.xids or ()}, key=lambda e: (e.timestamp, e.code))
