"""The machine: lost GPUs, PCIe, throttling, power limits, ECC, NVLink, XIDs.

Whether a GPU has a problem, and how bad, is `analysis/gpu_health.py`'s judgement over the window; these
functions only gather it into findings and word them.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Iterable, Mapping, Sequence

from gputop.analysis.gpu_health import (
    ECC,
    FABRIC,
    FINDING_SEVERITY,
    NIC_DOWN,
    NIC_ERRORS,
    NIC_RATE,
    NVLINK,
    PCIE,
    POWER_LIMIT,
    REMAP,
    SLOWDOWN,
    GpuHealth,
    Problem,
    judge_nics,
    judge_window,
    reason_key,
    slowdowns,
    worst,
    xid_severity,
)
from gputop.analysis.observations import Context
from gputop.analysis.thresholds import THROTTLE_MIN_FRACTION
from gputop.analysis.xids import XidMeaning, distinct_xids, meaning_of
from gputop.model import LABEL_CODE, LABEL_INFRA, Finding, GpuSample


def check_infrastructure(ctx: Context) -> list[Finding]:
    health = judge_window(ctx.snaps)  # the one health judgement (analysis/gpu_health.py), over the window
    return (
        check_lost_gpu(ctx)
        + check_pcie(health)
        + check_throttle(ctx, health)
        + check_power_limit(ctx, health)
        + check_ecc(health)
        + check_nvlink(health)
        + check_fabric(health)
        + check_xids(ctx)
        + check_nics(ctx)
    )


def _flagged(health: Mapping[int, GpuHealth], *rules: str) -> dict[int, tuple[Problem, ...]]:
    """GPU index -> its problems under `rules`, for the GPUs that have any."""
    return {i: found for i, h in sorted(health.items()) if (found := h.of(*rules))}


def _gpus_text(gpus: Iterable[int]) -> str:
    return ", ".join(f"GPU {g}" for g in gpus)


def _infra(
    id: str, title: str, severity: str, summary: str, evidence: Sequence[str], fix: str, gpus: Sequence[int], confidence: float
) -> Finding:
    return Finding(
        id=id,
        title=title,
        severity=severity,
        confidence=confidence,
        label=LABEL_INFRA,
        summary=summary,
        evidence=tuple(evidence),
        fix=fix,
        gpus=tuple(gpus),
    )


def check_lost_gpu(ctx: Context) -> list[Finding]:
    lost = [o for o in ctx.gpus.values() if o.lost_at is not None or o.missing_after is not None]
    expected = ctx.history.machine.gpu_count
    seen = len(ctx.gpus)
    start = ctx.snaps[0].timestamp
    evidence = [
        f"GPU {o.index} ({o.samples[-1].pci_bus_id}): "
        + (
            f"lost at +{o.lost_at - start:.0f} s (fell off the bus)"
            if o.lost_at is not None
            else f"missing since +{(o.missing_after or start) - start:.0f} s"
        )
        for o in lost
    ]
    if expected and seen < expected and not ctx.history.machine.gpu_error:
        evidence.append(f"the driver shows {seen} of the machine's {expected} GPUs")
    if not evidence:
        return []
    gpus = [o.index for o in lost]
    what = ", ".join(f"GPU {g}" for g in gpus) or f"{expected - seen} GPU(s)"
    return [
        _infra(
            "gpu_lost",
            "Lost GPU",
            "critical",
            f"{what} lost (fell off the bus)",
            evidence,
            "file a hardware ticket with the XID from the kernel log; drain the node\n"
            "dmesg -T | grep -i -E 'xid|NVRM'   # Xid 79 = fallen off the bus\n"
            "nvidia-smi -q -i GPU_INDEX",
            gpus,
            0.95,
        )
    ]


def check_pcie(health: Mapping[int, GpuHealth]) -> list[Finding]:
    flagged = _flagged(health, PCIE)
    if not flagged:
        return []
    problems = [p for found in flagged.values() for p in found]
    return [
        _infra(
            "pcie_downgrade",
            "PCIe link below its maximum under load",
            FINDING_SEVERITY[worst(problems)],
            f"PCIe link degraded on {_gpus_text(flagged)}",
            [p.evidence for p in problems],
            "file a ticket: reseat the card/riser or check BIOS PCIe settings\n"
            "nvidia-smi -q -d PCI -i GPU_INDEX   # compare 'Link Width/Generation' Current vs Max under load",
            list(flagged),
            0.85,
        )
    ]


def _live(ctx: Context, index: int) -> list[GpuSample]:
    return [s for s in ctx.gpus[index].samples if not s.lost] if index in ctx.gpus else []


def _slowdown_line(ctx: Context, index: int, others: Sequence[int]) -> str:
    """One GPU's slowdowns in words: each kind's sample count, the hottest reading, the SM clock against the others'."""
    samples = [s for s in _live(ctx, index) if s.throttle_reasons is not None]
    kinds = Counter(what for s in samples for what, _ in slowdowns(s))
    line = f"GPU {index}: " + ", ".join(f"{w} in {n}/{len(samples)} samples" for w, n in sorted(kinds.items()))
    temp = max((s.temperature for s in samples if s.temperature is not None), default=None)
    if temp is not None:
        line += f"; max {temp:.0f} °C"
    clocks = [s.clock_sm for s in samples if s.clock_sm]
    peers = [s.clock_sm for g in others for s in _live(ctx, g) if s.clock_sm]
    if clocks:
        line += f"; SM clock median {statistics.median(clocks):.0f} MHz"
        line += f" (others {statistics.median(peers):.0f} MHz)" if peers else ""
    return line


def check_throttle(ctx: Context, health: Mapping[int, GpuHealth]) -> list[Finding]:
    """Thermal / HW-slowdown / power-brake throttling: the machine slows the GPU."""
    flagged = _flagged(health, SLOWDOWN)
    if not flagged:
        return []
    others = [g for g in ctx.gpus if g not in flagged]
    kinds = sorted({what for g in flagged for s in _live(ctx, g) for what, _ in slowdowns(s)})
    gpus_txt = _gpus_text(flagged)
    if any("thermal" in w for w in kinds):
        summary = f"Thermal throttling on {gpus_txt}"
        fix = "file a ticket: check cooling (fans, airflow, inlet temperature)\nnvidia-smi -q -d TEMPERATURE,PERFORMANCE -i GPU_INDEX"
    else:
        summary = f"{kinds[0]} on {gpus_txt}" if kinds else f"Clock slowdown on {gpus_txt}"
        fix = "file a ticket: power delivery or the board asserts a slowdown\nnvidia-smi -q -d PERFORMANCE -i GPU_INDEX   # 'Clocks Event Reasons'"
    severity = FINDING_SEVERITY[worst(p for found in flagged.values() for p in found)]
    evidence = [_slowdown_line(ctx, g, others) for g in flagged]
    return [_infra("throttle", f"Clock throttling: {', '.join(kinds)}", severity, summary, evidence, fix, list(flagged), 0.85)]


def _power_capped(ctx: Context) -> dict[int, tuple[int, int]]:
    """GPU -> (samples at the power cap, samples with reasons), for GPUs at the cap in THROTTLE_MIN_FRACTION of them."""
    out = {}
    for g in ctx.gpus:
        samples = [s for s in _live(ctx, g) if s.throttle_reasons is not None]
        n = sum(1 for s in samples if any(reason_key(r) == "swpowercap" for r in s.throttle_reasons or ()))
        if samples and n and n / len(samples) >= THROTTLE_MIN_FRACTION:
            out[g] = (n, len(samples))
    return out


def check_power_limit(ctx: Context, health: Mapping[int, GpuHealth]) -> list[Finding]:
    """A power limit below the peers' (the health module's rule), else GPUs at the cap at full load (only info)."""
    lowered = _flagged(health, POWER_LIMIT)
    capped = _power_capped(ctx)
    limit = {g: statistics.median([s.power_limit for s in _live(ctx, g) if s.power_limit] or [0.0]) for g in ctx.gpus}
    if lowered:
        top = max(limit.values(), default=0.0)
        evidence = [p.evidence for found in lowered.values() for p in found]
        evidence += [f"GPU {g}: power cap active in {n}/{total} samples" for g, (n, total) in capped.items() if g in lowered]
        return [
            _infra(
                "power_cap",
                "Power limit lowered",
                FINDING_SEVERITY[worst(p for found in lowered.values() for p in found)],
                f"Power-capped below its peers: {', '.join(f'GPU {g} at {limit.get(g, 0.0):.0f} W' for g in lowered)} (others {top:.0f} W)",
                evidence,
                "file a ticket: restore the power limit (admin)\nnvidia-smi -q -d POWER -i GPU_INDEX   # 'Requested/Enforced/Default Power Limit'",
                list(lowered),
                0.8,
            )
        ]
    if not capped:
        return []
    return [
        _infra(
            "power_cap",
            "At the power cap",
            "info",
            f"{_gpus_text(capped)} at the power cap (normal at full load)",
            [
                f"GPU {g}: power cap active in {n}/{total} samples, enforced limit {limit[g]:.0f} W"
                for g, (n, total) in capped.items()
            ],
            "nothing to do unless clocks stay low; check the enforced limit\nnvidia-smi -q -d POWER,PERFORMANCE -i GPU_INDEX",
            list(capped),
            0.7,
        )
    ]


def _one_finding(
    health: Mapping[int, GpuHealth], rules: tuple[str, ...], id: str, title: str, summary: str, fix: str
) -> list[Finding]:
    """One finding over every GPU the rules flag: the worst severity, each problem's evidence."""
    flagged = _flagged(health, *rules)
    if not flagged:
        return []
    problems = sorted((p for found in flagged.values() for p in found), key=lambda p: -p.severity)
    severity = FINDING_SEVERITY[worst(problems)]
    return [
        _infra(id, title, severity, f"{summary} {_gpus_text(flagged)}", [p.evidence for p in problems], fix, list(flagged), 0.9)
    ]


def check_ecc(health: Mapping[int, GpuHealth]) -> list[Finding]:
    return _one_finding(
        health,
        (ECC, REMAP),
        "ecc",
        "GPU memory errors (ECC / row remapping)",
        "Memory errors on",
        "file a ticket: drain the GPU; pending remaps need a GPU reset, failed remaps an RMA\n"
        "nvidia-smi -q -d ECC,ROW_REMAPPER -i GPU_INDEX",
    )


def check_nvlink(health: Mapping[int, GpuHealth]) -> list[Finding]:
    return _one_finding(
        health,
        (NVLINK,),
        "nvlink_down",
        "Inactive NVLink links",
        "NVLink links down on",
        "file a ticket: collectives fall back to slower paths\nnvidia-smi nvlink --status -i GPU_INDEX",
    )


def check_fabric(health: Mapping[int, GpuHealth]) -> list[Finding]:
    return _one_finding(
        health,
        (FABRIC,),
        "fabric",
        "NVSwitch fabric not trained or degraded",
        "NVSwitch fabric problem on",
        "file a ticket: NCCL cannot use NVLink on a GPU whose fabric is not trained\n"
        "systemctl status nvidia-fabricmanager; journalctl -u nvidia-fabricmanager; nvidia-smi -q -i GPU_INDEX | grep -A6 Fabric",
    )


def check_xids(ctx: Context) -> list[Finding]:
    """XIDs the driver reported: the hardware's go in a ticket, the ones a bad kernel causes go to the code."""
    seen: dict[tuple[int, float, int], XidMeaning] = {}
    for o in ctx.gpus.values():
        for event in distinct_xids(o.samples):
            seen[(o.index, event.timestamp, event.code)] = meaning_of(event.code)
    findings = []
    for label in (LABEL_INFRA, LABEL_CODE):
        events = sorted((key, m) for key, m in seen.items() if m.label == label)
        if not events:
            continue
        gpus = sorted({gpu for (gpu, _t, _c), _m in events})
        codes = list(dict.fromkeys(code for (_g, _t, code), _m in events))
        first = events[0][1]
        summary = (
            f"XID {first.code} on GPU {gpus[0]}: {first.meaning}"
            if len(events) == 1
            else f"XIDs {', '.join(map(str, codes))} on {', '.join(f'GPU {g}' for g in gpus)}"
        )
        evidence = [
            f"GPU {gpu}: XID {code} at {time.strftime('%H:%M:%S UTC', time.gmtime(t))}: {m.meaning}"
            for (gpu, t, code), m in events
        ]
        evidence.append("the driver's own lines: dmesg -T | grep -i xid")
        fix = "\n".join(dict.fromkeys(m.action for _key, m in events))
        severity = FINDING_SEVERITY[max(xid_severity(m.code) for _key, m in events)]  # the health module's XID rule
        title = "GPU errors reported by the driver (XID)" if label == LABEL_INFRA else "GPU faults caused by the job (XID)"
        findings.append(
            Finding(
                id="xid" if label == LABEL_INFRA else "xid_code",
                title=title,
                severity=severity,
                confidence=0.95,
                label=label,
                summary=summary,
                evidence=tuple(evidence),
                fix=fix,
                gpus=tuple(gpus),
            )
        )
    return findings


# NIC rule -> (finding id, title, what it means for the job, the commands the infra team runs)
_NIC_FINDINGS = {
    NIC_DOWN: (
        "nic_down",
        "NIC port down",
        "a port the job's traffic runs over is down",
        "ibstat DEVICE; ip link; sudo mlxlink -d DEVICE",
    ),
    NIC_RATE: (
        "nic_rate",
        "NIC port below its rate",
        "a port trained below its peers' rate slows every collective that crosses it",
        "ibstat DEVICE   # Rate; reseat or replace the cable / transceiver\nsudo mlxlink -d DEVICE -m   # the cable's eye and errors",
    ),
    NIC_ERRORS: (
        "nic_errors",
        "NIC error counters climbing",
        "a port counting link errors retransmits and can drop out of the job",
        "perfquery -x   # or: ibqueryerrors; sudo mlxlink -d DEVICE -c   # the physical counters",
    ),
}


def check_nics(ctx: Context) -> list[Finding]:
    """One finding per NIC rule that some port breaks (the ports' judgement: analysis/gpu_health.py)."""
    judged = judge_nics(ctx.snaps)
    if judged is None:
        return []
    out = []
    for rule, (finding_id, title, meaning, commands) in _NIC_FINDINGS.items():
        flagged = [(h, h.of(rule)) for h in judged.ports if h.of(rule)]
        if not flagged:
            continue
        names = ", ".join(h.name for h, _ in flagged)
        problems = [p for _, found in flagged for p in found]
        fix = f"file a network ticket for {names}: {meaning}\n" + commands.replace("DEVICE", flagged[0][0].device)
        out.append(
            _infra(
                finding_id,
                title,
                FINDING_SEVERITY[worst(problems)],
                f"{title}: {names}",
                [p.evidence for p in problems],
                fix,
                (),
                0.9,
            )
        )
    return out
