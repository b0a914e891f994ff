"""The machine: lost GPUs, PCIe, throttling, ECC, NVLink, XIDs."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Optional, Sequence

from gputop.analysis.observations import Context
from gputop.analysis.thresholds import PCIE_LOAD_UTILIZATION, POWER_LIMIT_LOWERED, THROTTLE_MIN_FRACTION
from gputop.analysis.xids import XidMeaning, distinct_xids, meaning_of
from gputop.model import LABEL_CODE, LABEL_INFRA, Finding


def _norm(reason: str) -> str:
    return reason.replace("_", "").replace(" ", "").replace("-", "").lower()


# reason name fragments -> (what, severity). GpuIdle / AppClocks / SyncBoost / display are not problems.
_THROTTLE_KINDS = (
    ("hwthermal", "HW thermal slowdown", "critical"),
    ("hwpowerbrake", "HW power brake", "critical"),
    ("hwslowdown", "HW slowdown", "critical"),
    ("swthermal", "SW thermal slowdown", "warning"),
    ("thermal", "thermal slowdown", "warning"),
    ("powerbrake", "power brake", "critical"),
    ("slowdown", "HW slowdown", "critical"),
    ("swpowercap", "power cap", "info"),  # reaching the cap at full load is normal; a lowered limit is not
    ("powercap", "power cap", "info"),
)


def _throttle_kind(reason: str) -> Optional[tuple[str, str]]:
    key = _norm(reason)
    for fragment, what, severity in _THROTTLE_KINDS:
        if fragment in key:
            return what, severity
    return None


def check_infrastructure(ctx: Context) -> list[Finding]:
    return check_lost_gpu(ctx) + check_pcie(ctx) + check_throttle(ctx) + check_ecc(ctx) + check_nvlink(ctx) + check_xids(ctx)


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
    evidence = [
        f"GPU {o.index} ({o.samples[-1].pci_bus_id}): "
        + (
            f"lost at +{o.lost_at - ctx.snaps[0].timestamp:.0f} s (fell off the bus)"
            if o.lost_at is not None
            else f"missing since +{o.missing_after - ctx.snaps[0].timestamp:.0f} s"
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


def check_pcie(ctx: Context) -> list[Finding]:
    out_ev: list[str] = []
    gpus: list[int] = []
    for o in ctx.gpus.values():
        loaded = [s for s in o.samples if not s.lost and (s.utilization_gpu or 0) >= PCIE_LOAD_UTILIZATION]
        any_s = [s for s in o.samples if not s.lost]
        width_down = [
            s for s in any_s if None not in (s.pcie.width_current, s.pcie.width_max) and s.pcie.width_current < s.pcie.width_max
        ]
        gen_down = [s for s in loaded if None not in (s.pcie.gen_current, s.pcie.gen_max) and s.pcie.gen_current < s.pcie.gen_max]
        # width does not drop for power saving; generation does when idle, so it counts only under load
        bad = (
            width_down
            if len(width_down) >= max(1, len(any_s) // 2)
            else (gen_down if len(gen_down) >= max(1, len(loaded) // 2) else [])
        )
        if bad:
            s = bad[-1]
            p = s.pcie
            out_ev.append(
                f"GPU {o.index} ({s.pci_bus_id}): PCIe Gen{p.gen_current} x{p.width_current} of Gen{p.gen_max} x{p.width_max}"
                + (f" at {s.utilization_gpu:.0f}% utilization" if s.utilization_gpu is not None else "")
                + f" in {len(bad)} samples"
            )
            gpus.append(o.index)
    if not out_ev:
        return []
    return [
        _infra(
            "pcie_downgrade",
            "PCIe link below its maximum under load",
            "warning",
            f"PCIe link degraded on {', '.join(f'GPU {g}' for g in gpus)}",
            out_ev,
            "file a ticket: reseat the card/riser or check BIOS PCIe settings\n"
            "nvidia-smi -q -d PCI -i GPU_INDEX   # compare 'Link Width/Generation' Current vs Max under load",
            gpus,
            0.85,
        )
    ]


def check_throttle(ctx: Context) -> list[Finding]:
    """Thermal / HW-slowdown / power-brake throttling (the machine), and a power cap below the peers' limit."""
    hits: dict[int, Counter] = {}
    totals: dict[int, int] = {}
    severity_of: dict[str, str] = {}
    for o in ctx.gpus.values():
        samples = [s for s in o.samples if not s.lost and s.throttle_reasons is not None]
        totals[o.index] = len(samples)
        counts: Counter = Counter()
        for s in samples:
            for what, sev in {k for k in (_throttle_kind(r) for r in s.throttle_reasons or ()) if k}:
                counts[what] += 1
                severity_of[what] = sev
        hits[o.index] = Counter(
            {w: n for w, n in counts.items() if totals[o.index] and n / totals[o.index] >= THROTTLE_MIN_FRACTION}
        )
    findings: list[Finding] = []
    serious = {g: {w: n for w, n in c.items() if severity_of[w] != "info"} for g, c in hits.items()}
    serious = {g: c for g, c in serious.items() if c}
    if serious:
        kinds = sorted({w for c in serious.values() for w in c})
        sev = "critical" if any(severity_of[w] == "critical" for w in kinds) else "warning"
        evidence = []
        for g, c in sorted(serious.items()):
            o = ctx.gpus[g]
            temp = max((s.temperature for s in o.samples if not s.lost and s.temperature is not None), default=None)
            clocks = [s.clock_sm for s in o.samples if not s.lost and s.clock_sm]
            peers = [
                s.clock_sm for p in ctx.gpus.values() if p.index not in serious for s in p.samples if not s.lost and s.clock_sm
            ]
            line = f"GPU {g}: " + ", ".join(f"{w} in {n}/{totals[g]} samples" for w, n in sorted(c.items()))
            if temp is not None:
                line += f"; max {temp:.0f} °C"
            if clocks:
                line += f"; SM clock median {statistics.median(clocks):.0f} MHz" + (
                    f" (others {statistics.median(peers):.0f} MHz)" if peers else ""
                )
            evidence.append(line)
        gpus_txt = ", ".join(f"GPU {g}" for g in sorted(serious))
        if any("thermal" in w for w in kinds):
            summary = f"Thermal throttling on {gpus_txt}"
            fix = "file a ticket: check cooling (fans, airflow, inlet temperature)\nnvidia-smi -q -d TEMPERATURE,PERFORMANCE -i GPU_INDEX"
        else:
            summary = f"{kinds[0][0].upper() + kinds[0][1:]} on {gpus_txt}"
            fix = "file a ticket: power delivery or the board asserts a slowdown\nnvidia-smi -q -d PERFORMANCE -i GPU_INDEX   # 'Clocks Event Reasons'"
        findings.append(
            _infra("throttle", f"Clock throttling: {', '.join(kinds)}", sev, summary, evidence, fix, sorted(serious), 0.85)
        )
    capped = sorted(g for g, c in hits.items() if "power cap" in c)
    if capped:
        limits = {
            g: statistics.median([s.power_limit for s in ctx.gpus[g].samples if not s.lost and s.power_limit] or [0])
            for g in ctx.gpus
        }
        top_limit = max(limits.values()) if limits else 0
        lowered = [g for g in capped if top_limit and limits[g] < POWER_LIMIT_LOWERED * top_limit]
        evidence = [
            f"GPU {g}: power cap active in {hits[g]['power cap']}/{totals[g]} samples, enforced limit {limits[g]:.0f} W"
            for g in capped
        ]
        if lowered:
            evidence.append(f"the other GPUs' limit is {top_limit:.0f} W")
            findings.append(
                _infra(
                    "power_cap",
                    "Power limit lowered",
                    "warning",
                    f"Power-capped below its peers: {', '.join(f'GPU {g} at {limits[g]:.0f} W' for g in lowered)} (others {top_limit:.0f} W)",
                    evidence,
                    "file a ticket: restore the power limit (admin)\nnvidia-smi -q -d POWER -i GPU_INDEX   # 'Requested/Enforced/Default Power Limit'",
                    lowered,
                    0.8,
                )
            )
        else:
            findings.append(
                _infra(
                    "power_cap",
                    "At the power cap",
                    "info",
                    f"{', '.join(f'GPU {g}' for g in capped)} at the power cap (normal at full load)",
                    evidence,
                    "nothing to do unless clocks stay low; check the enforced limit\nnvidia-smi -q -d POWER,PERFORMANCE -i GPU_INDEX",
                    capped,
                    0.7,
                )
            )
    return findings


def check_ecc(ctx: Context) -> list[Finding]:
    crit: list[str] = []
    warn: list[str] = []
    gpus: set[int] = set()
    for o in ctx.gpus.values():
        samples = [s for s in o.samples if not s.lost]
        eccs = [s.ecc for s in samples if s.ecc is not None]
        if eccs:
            last, first = eccs[-1], eccs[0]
            unc = max(last.volatile_uncorrected or 0, last.aggregate_uncorrected or 0)
            if unc:
                crit.append(
                    f"GPU {o.index}: {unc} uncorrectable ECC error(s) (volatile {last.volatile_uncorrected}, aggregate {last.aggregate_uncorrected})"
                )
                gpus.add(o.index)
            grown = (last.volatile_corrected or 0) - (first.volatile_corrected or 0)
            if grown > 0:
                warn.append(
                    f"GPU {o.index}: corrected ECC errors rose by {grown} during the window (now {last.volatile_corrected})"
                )
                gpus.add(o.index)
        rows = [s.remapped_rows for s in samples if s.remapped_rows is not None]
        if rows:
            r = rows[-1]
            if r.failed or r.uncorrectable:
                crit.append(f"GPU {o.index}: remapped rows uncorrectable {r.uncorrectable}, remap failed={r.failed}")
                gpus.add(o.index)
            elif r.pending:
                warn.append(f"GPU {o.index}: row remapping pending (a reset is needed)")
                gpus.add(o.index)
    if not crit and not warn:
        return []
    sev = "critical" if crit else "warning"
    return [
        _infra(
            "ecc",
            "GPU memory errors (ECC / row remapping)",
            sev,
            f"Memory errors on {', '.join(f'GPU {g}' for g in sorted(gpus))}",
            crit + warn,
            "file a ticket: drain the GPU; pending remaps need a GPU reset, failed remaps an RMA\n"
            "nvidia-smi -q -d ECC,ROW_REMAPPER -i GPU_INDEX",
            sorted(gpus),
            0.9,
        )
    ]


def check_nvlink(ctx: Context) -> list[Finding]:
    latest: dict[int, tuple] = {}
    for o in ctx.gpus.values():
        for s in reversed(o.samples):
            if not s.lost and s.nvlink is not None:
                latest[o.index] = s.nvlink
                break
    machine_has_nvlink = any(any(link.active for link in links) for links in latest.values())
    evidence = []
    gpus = []
    for g, links in sorted(latest.items()):
        down = [link.link for link in links if not link.active]
        if down and (machine_has_nvlink or any(link.active for link in links)):
            evidence.append(
                f"GPU {g}: {len(down)} of {len(links)} NVLink links inactive (links {', '.join(map(str, down[:12]))})"
            )
            gpus.append(g)
    if not evidence:
        return []
    return [
        _infra(
            "nvlink_down",
            "Inactive NVLink links",
            "warning",
            f"NVLink links down on {', '.join(f'GPU {g}' for g in gpus)}",
            evidence,
            "file a ticket: collectives fall back to slower paths\nnvidia-smi nvlink --status -i GPU_INDEX",
            gpus,
            0.85,
        )
    ]


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
        severity = "critical" if any(m.severity == "critical" for _key, m in events) else "warning"
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
