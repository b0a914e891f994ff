"""`gputop check`: pure checks of one machine, each one line: what it looked at, the value, the expectation, a status.

The inputs are what the collectors read over a short window (`CheckInput`): the snapshots, the GPU
details (identity, modes, error counters) at the start and at the end, and the kernel's side (sysfs, the
kernel log) at the start and at the end.  Counters are judged by what they did *while we watched*: a
count since boot says little, a count that climbs in 10 s is a live fault.

Whatever a GPU's samples show (lost, the PCIe link, NVLink, ECC, row remapping, XIDs, slowdowns, the power
limit) is judged by `analysis/gpu_health.py` over the window, as the card, the diagnosis, the report and the
exporter judge it: CRITICAL is fail, WARN is warn.  Expectations come from the machine itself: the link's own maximum, the other GPUs' NVLink count and
topology row, the NUMA nodes the GPUs hang off, the modes the other GPUs run in, the board's default
clocks.  Statuses: pass, warn (a configuration or a degraded part to look at: exit 4), fail (an
infrastructure fault: exit 3), skip (could not be checked here; the line says why; never changes the exit code).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Callable, Iterable, Optional, Sequence

from gputop.analysis.dcgm_diag import DcgmRun, dcgm_results
from gputop.analysis.gpu_health import (
    ECC,
    FABRIC,
    FABRIC_STATES,
    NIC_DOWN,
    NIC_ERRORS,
    NIC_RATE,
    NVLINK,
    PCIE,
    PCIE_LANE_BYTES_PER_S,
    POWER_LIMIT,
    REMAP,
    SLOWDOWN,
    SLOWDOWN_MIN_SHARE,
    GpuHealth,
    NicJudgement,
    Severity,
    judge_nics,
    judge_window,
    nvlink_class,
    nvlink_unused,
    pcie_degraded,
    peers_of,
    worst,
    xid_severity,
)
from gputop.analysis.xids import meaning_of, xid_bus_id
from gputop.model import (
    AllReduceResult,
    CheckResult,
    GpuDetails,
    GpuSample,
    HostReadings,
    MachineInfo,
    Snapshot,
)
from gputop.units import utc_time

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
STATUSES = (FAIL, WARN, PASS, SKIP)
EXIT_HEALTHY = 0
EXIT_INFRA = 3
EXIT_CONFIG = 4
LABEL_CONFIG = "configuration (the machine's settings)"

# --load: measured all-reduce busbw against what the links carry.  nccl-tests on an 8x H100 NVSwitch
# node reach ~370 GB/s (~0.8 of 18 x 25 GB/s) without NVLS; a short run with one buffer size gets less,
# so below 0.6 of the links' rate is worth a look and below 0.4 is a fault.
BUSBW_WARN_SHARE = 0.6
BUSBW_FAIL_SHARE = 0.4
# GB/s one NVLink carries each way, by GPU generation (NVIDIA's NVLink specs: NVLink 2-4 25 GB/s, 5: 50 GB/s)
NVLINK_GBPS = (("B200", 50.0), ("B100", 50.0), ("GB200", 50.0))
NVLINK_GBPS_DEFAULT = 25.0
# The health module's severities as statuses (analysis/gpu_health.py: one judgement for every consumer).
STATUS_OF = {Severity.CRITICAL: FAIL, Severity.WARN: WARN, Severity.OK: PASS}

NEXT_COMMANDS = (
    ("sudo nvidia-bug-report.sh", "the full driver log bundle NVIDIA support asks for (needs root)"),
    ("dcgmi diag -r 2", "DCGM's medium diagnostic (~2 minutes, GPUs idle); `gputop check --dcgm 2` folds it into these lines"),
    ("nvidia-smi -q", "every counter NVML has, per GPU"),
)
CAPTURE_BEFORE_RESET = (
    "Capture this before any reset or reboot: a GPU reset clears the volatile ECC counters, "
    "and a reboot clears the kernel log that holds the XIDs."
)


@dataclass(frozen=True)
class LoadOutcome:
    """What `--load` did: the all-reduce result, or why it did not run."""

    skipped: Optional[str] = None
    allreduce: Optional[AllReduceResult] = None
    allreduce_skipped: Optional[str] = None


@dataclass(frozen=True)
class CheckInput:
    machine: MachineInfo
    snapshots: tuple[Snapshot, ...]
    before: tuple[GpuDetails, ...]  # details at the start of the window
    after: tuple[GpuDetails, ...]  # and at its end
    host_before: HostReadings
    host_after: HostReadings
    seconds: float  # how long the window was
    load: Optional[LoadOutcome] = None  # None: --load not asked for
    dcgm: Optional[DcgmRun] = None  # None: --dcgm not asked for

    @property
    def gpus(self) -> tuple[GpuSample, ...]:
        return self.snapshots[-1].gpus if self.snapshots else ()

    @cached_property
    def health(self) -> dict[int, GpuHealth]:
        """The health module's judgement of each GPU over the window's snapshots."""
        return judge_window(self.snapshots)

    @cached_property
    def nic_health(self) -> Optional[NicJudgement]:
        """The health module's judgement of the NIC ports over the window (None: not read)."""
        return judge_nics(self.snapshots)

    def pairs(self) -> list[tuple[GpuDetails, GpuDetails]]:
        """(start, end) details per GPU that answered both times."""
        start = {d.index: d for d in self.before if not d.lost}
        return [(start[d.index], d) for d in self.after if not d.lost and d.index in start]


# ------------------------------------------------------------------ formatting helpers


def gpu_list(indices: Iterable[int]) -> str:
    items = sorted(set(indices))
    return ("GPU " if len(items) == 1 else "GPUs ") + ", ".join(map(str, items))


def _window(inp: CheckInput) -> str:
    return f"{inp.seconds:.0f} s" if inp.seconds >= 9.5 else f"{inp.seconds:.1f} s"


def _unsupported(items: Sequence[GpuDetails | GpuSample], key: str) -> str:
    """Why NVML gave none of `key` on these GPUs (their `unavailable` reasons, joined)."""
    reasons = sorted({d.unavailable.get(key, "not available") for d in items})
    return "/".join(reasons)


def _counter_check(
    inp: CheckInput, check_id: str, title: str, read: Callable[[GpuDetails], Optional[int]], key: str, expected: str, what: str
) -> CheckResult:
    """A counter per GPU that must not climb while we watch (its total since the driver loaded is shown)."""
    pairs = [(a, b, read(a), read(b)) for a, b in inp.pairs()]
    known = [(a, b, x, y) for a, b, x, y in pairs if x is not None and y is not None]
    if not known:
        return CheckResult(check_id, title, SKIP, f"not available ({_unsupported(inp.after, key)})", expected)
    rising = [(b.index, y - x, y) for _, b, x, y in known if y > x]
    if rising:
        value = "; ".join(f"GPU {i}: +{d} {what} in {_window(inp)} (now {total})" for i, d, total in rising)
        return CheckResult(check_id, title, FAIL, value, expected, gpus=tuple(i for i, _, _ in rising))
    standing = [(b.index, y) for _, b, _, y in known if y]
    value = f"none on {len(known)} GPUs in {_window(inp)}"
    if standing:
        value += "; since the driver loaded: " + ", ".join(f"GPU {i}: {n}" for i, n in standing)
    return CheckResult(check_id, title, PASS, value, expected)


def _health_check(inp: CheckInput, rules: tuple[str, ...], check_id: str, title: str, expected: str, passed: str) -> CheckResult:
    """A line from the health module's judgement: its worst severity as the status, its evidence as the value."""
    flagged = {i: found for i, h in sorted(inp.health.items()) if (found := h.of(*rules))}
    if not flagged:
        return CheckResult(check_id, title, PASS, passed, expected)
    problems = [p for found in flagged.values() for p in found]
    value = "; ".join(p.evidence for p in problems)
    return CheckResult(check_id, title, STATUS_OF[worst(problems)], value, expected, gpus=tuple(flagged))


# ------------------------------------------------------------------ the checks


def check_driver(inp: CheckInput) -> CheckResult:
    m = inp.machine
    title = "NVIDIA driver"
    expected = "the kernel module and the NVML library at one version"
    if m.gpu_error:
        return CheckResult("driver", title, SKIP, f"{m.gpu_error}: the GPU checks are skipped", "a driver on a GPU machine")
    module = inp.host_after.driver_module
    value = f"{m.driver_version or 'unknown'} (CUDA {m.cuda_version or 'unknown'}, NVML {m.nvml_version or 'unknown'})"
    if module is None:
        return CheckResult("driver", title, PASS, value + "; kernel module version not readable", expected)
    if m.driver_version and module != m.driver_version:
        return CheckResult(
            "driver",
            title,
            FAIL,
            f"kernel module {module} but library {m.driver_version}: the driver was upgraded without a reboot",
            expected,
            gpus=tuple(g.index for g in inp.gpus),
        )
    return CheckResult("driver", title, PASS, value + f"; kernel module {module}", expected)


def check_gpus_answer(inp: CheckInput) -> Optional[CheckResult]:
    if inp.machine.gpu_error:
        return None
    lost = sorted({g.index for s in inp.snapshots for g in s.gpus if g.lost} | {d.index for d in inp.after if d.lost})
    total = inp.machine.gpu_count
    expected = "every GPU NVML lists answers"
    if lost:
        return CheckResult(
            "gpus",
            "GPUs answering",
            FAIL,
            f"{gpu_list(lost)} lost (GpuIsLost), {total - len(lost)} of {total} answer",
            expected,
            gpus=tuple(lost),
        )
    return CheckResult(
        "gpus", "GPUs answering", PASS, f"{total} of {total} ({', '.join(sorted(set(inp.machine.gpu_names)))})", expected
    )


def check_models(inp: CheckInput) -> Optional[CheckResult]:
    """One model and one VBIOS across the GPUs: a board left on old firmware behaves differently."""
    if len(inp.after) < 2:
        return None
    expected = "the same VBIOS on every GPU of a model"
    by_model: dict[str, Counter[str]] = {}
    for d in inp.after:
        if d.vbios:
            by_model.setdefault(d.name, Counter())[d.vbios] += 1
    if not by_model:
        return CheckResult("vbios", "VBIOS", SKIP, f"not available ({_unsupported(inp.after, 'vbios')})", expected)
    odd = []  # (GPU, its VBIOS, what the others of its model run)
    for name, versions in by_model.items():
        if len(versions) > 1:
            common = versions.most_common(1)[0][0]
            odd += [(d.index, d.vbios, common) for d in inp.after if d.name == name and d.vbios and d.vbios != common]
    if odd:
        value = "; ".join(f"GPU {i}: {mine} where the others run {common}" for i, mine, common in odd)
        return CheckResult("vbios", "VBIOS", WARN, value, expected, gpus=tuple(i for i, _, _ in odd))
    return CheckResult(
        "vbios", "VBIOS", PASS, "; ".join(f"{', '.join(v)} on {sum(v.values())} × {n}" for n, v in by_model.items()), expected
    )


def check_pcie_link(inp: CheckInput) -> Optional[CheckResult]:
    if not inp.gpus:
        return None
    title = "PCIe link"
    expected = "each GPU at its own maximum width, and at its maximum gen while busy"
    told = {g.index for s in inp.snapshots for g in s.gpus if not g.lost and pcie_degraded(g) is not None}
    idle = sorted({g.index for g in inp.gpus if not g.lost} - told)
    if not told:
        value = f"every GPU idle at its full width in {_window(inp)}: idle links lower their gen to save power"
        return CheckResult("pcie.link", title, SKIP, value + " (run with --load, or while a job runs)", expected)
    note = f" ({gpu_list(idle)} idle at full width: gen not judged, idle links downtrain)" if idle else ""
    links = Counter(f"Gen{g.pcie.gen_current} x{g.pcie.width_current}" for g in inp.gpus if g.index in told)
    passed = ", ".join(f"{n} GPUs at {k}" for k, n in links.items())
    result = _health_check(inp, (PCIE,), "pcie.link", title, expected, passed)
    return replace(result, value=result.value + note)


def check_pcie_replay(inp: CheckInput) -> Optional[CheckResult]:
    if not inp.after:
        return None
    return _counter_check(
        inp,
        "pcie.replay",
        "PCIe replay counter",
        lambda d: d.pcie_replays,
        "pcie_replays",
        "no replays while we watch, each is a packet sent again",
        "replays",
    )


def check_pcie_aer(inp: CheckInput) -> Optional[CheckResult]:
    if not inp.gpus:
        return None
    title = "PCIe AER errors (sysfs)"
    expected = "no fatal or non-fatal errors, no correctable ones while we watch"
    failing, notes = [], []
    seen = 0
    for g in inp.gpus:
        a, b = inp.host_before.aer.get(g.pci_bus_id), inp.host_after.aer.get(g.pci_bus_id)
        if b is None:
            continue
        seen += 1
        uncorrected = (b.fatal or 0) + (b.nonfatal or 0)
        grown = (b.correctable or 0) - (a.correctable or 0 if a is not None else 0)
        named = ", ".join(f"{k} {v}" for k, v in b.nonzero.items())
        if uncorrected:
            failing.append((g.index, f"GPU {g.index}: {b.fatal or 0} fatal, {b.nonfatal or 0} non-fatal ({named})"))
        elif grown > 0:
            failing.append((g.index, f"GPU {g.index}: +{grown} correctable in {_window(inp)} (now {b.correctable}: {named})"))
        elif b.correctable:
            notes.append(f"GPU {g.index}: {b.correctable} correctable since boot")
    if not seen:
        return CheckResult(
            "pcie.aer",
            title,
            SKIP,
            "no aer_dev_* files under the GPUs' PCI devices (a kernel without AER reporting, or a port without AER)",
            expected,
        )
    if failing:
        return CheckResult("pcie.aer", title, FAIL, "; ".join(t for _, t in failing), expected, gpus=tuple(i for i, _ in failing))
    return CheckResult(
        "pcie.aer", title, PASS, f"none on {seen} GPUs in {_window(inp)}" + ("; " + ", ".join(notes) if notes else ""), expected
    )


def check_nvlink_state(inp: CheckInput) -> Optional[CheckResult]:
    gpus = [g for g in inp.gpus if not g.lost]
    if not gpus:
        return None
    title = "NVLink links up"
    with_links = [g for g in gpus if g.nvlink]
    if not with_links:
        reason = sorted({g.unavailable.get("nvlink", "not available") for g in gpus})
        return CheckResult("nvlink.state", title, SKIP, f"no NVLink on these GPUs ({'/'.join(reason)})", "every link up")
    total = Counter(len(g.nvlink or ()) for g in with_links).most_common(1)[0][0]
    peers = peers_of(inp.gpus)
    unused = [g for g in with_links if nvlink_unused(g, peers)]
    expected = f"all {total} links up on every GPU" + (" with an NVLink bridge or board" if unused else "")
    used = len(with_links) - len(unused)
    passed = f"{total} of {total} up on {used} GPUs" if used else f"none up on {len(unused)} GPUs: no NVLink bridge or board"
    if used and unused:
        links = Counter(len(g.nvlink or ()) for g in unused)
        passed += f"; {gpu_list(g.index for g in unused)}: no NVLink bridge ({'/'.join(map(str, links))} links inactive)"
    return _health_check(inp, (NVLINK,), "nvlink.state", title, expected, passed)


def check_fabric(inp: CheckInput) -> Optional[CheckResult]:
    """The NVSwitch fabric as the Fabric Manager trained it (the health module's FABRIC rule): where no GPU
    reports one (NOT_SUPPORTED: PCIe cards, bridges, pre-Hopper boards), one SKIP line saying so."""
    gpus = [g for g in inp.gpus if not g.lost]
    if not gpus:
        return None
    title = "NVSwitch fabric (Fabric Manager)"
    expected = "every GPU's fabric Completed with success, no degraded bandwidth or unhealthy route in its health mask"
    with_fabric = [g for g in gpus if g.fabric is not None]
    if not with_fabric:
        why = _unsupported(gpus, "fabric")
        return CheckResult("fabric", title, SKIP, f"no NVSwitch fabric on these GPUs ({why})", expected)
    states = Counter(FABRIC_STATES.get(g.fabric.state, str(g.fabric.state)) for g in with_fabric if g.fabric is not None)
    cliques = sorted({g.fabric.clique_id for g in with_fabric if g.fabric is not None and g.fabric.clique_id is not None})
    passed = ", ".join(f"{state} on {n} GPUs" for state, n in states.items()) + (
        f" (clique {', '.join(map(str, cliques))})" if cliques else ""
    )
    return _health_check(inp, (FABRIC,), "fabric", title, expected, passed)


def check_nvlink_errors(inp: CheckInput) -> Optional[CheckResult]:
    pairs = [(a, b) for a, b in inp.pairs() if a.nvlink_errors is not None and b.nvlink_errors is not None]
    title = "NVLink error counters"
    expected = "no CRC, replay or recovery errors while we watch"
    if not pairs:
        if not any(g.nvlink for g in inp.gpus):
            return None  # no NVLink at all (or no GPU): the link-state line already says so
        return CheckResult("nvlink.errors", title, SKIP, f"not available ({_unsupported(inp.after, 'nvlink_errors')})", expected)
    failing, standing = [], []
    for a, b in pairs:
        start = {e.link: e for e in a.nvlink_errors or ()}
        for e in b.nvlink_errors or ():
            s = start.get(e.link)
            for name, label in (
                ("crc_flit", "CRC (flit)"),
                ("crc_data", "CRC (data)"),
                ("replay", "replay"),
                ("recovery", "recovery"),
            ):
                now, then = getattr(e, name), getattr(s, name) if s is not None else None
                if now is None:
                    continue
                if then is not None and now > then:
                    failing.append((b.index, f"GPU {b.index} link {e.link}: {label} +{now - then} in {_window(inp)} (now {now})"))
                elif now:
                    standing.append(f"GPU {b.index} link {e.link}: {label} {now}")
    if failing:
        return CheckResult(
            "nvlink.errors", title, FAIL, "; ".join(t for _, t in failing), expected, gpus=tuple(sorted({i for i, _ in failing}))
        )
    value = f"none on {len(pairs)} GPUs in {_window(inp)}"
    if standing:
        value += "; since the driver loaded: " + ", ".join(standing[:6]) + (" …" if len(standing) > 6 else "")
    return CheckResult("nvlink.errors", title, PASS, value, expected)


def _describe_row(signature: tuple[tuple[str, int], ...]) -> str:
    return ", ".join(f"{label}×{n}" for label, n in signature)


Signature = tuple[tuple[str, int], ...]  # a row's cells, counted: (("NV18", 7),) or (("NODE", 2), ("PHB", 1))


def _signature(cells: Iterable[str]) -> Signature:
    return tuple(sorted(Counter(cells).items()))


def _topology_groups(inp: CheckInput, present: Sequence[int]) -> list[list[int]]:
    """The GPUs whose rows are compared with each other: one model and one NVLink class (the health module's
    `nvlink_class`: a card without its bridge is not compared with the bridged pairs)."""
    peers = peers_of(inp.gpus)
    sample = {g.index: g for g in inp.gpus}
    groups: dict[tuple[str, str], list[int]] = {}
    for i in present:
        g = sample.get(i)
        groups.setdefault((g.name, nvlink_class(g, peers)) if g is not None else ("", ""), []).append(i)
    return list(groups.values())


def _same_node(numa: Sequence[Optional[int]], i: int, j: int) -> bool:
    a, b = (numa[k] if k < len(numa) else None for k in (i, j))
    return a is None or b is None or a == b


def _odd_rows(matrix: Sequence[Sequence[str]], rows: dict[int, Signature], group: Sequence[int]) -> list[tuple[int, str, bool]]:
    """(GPU, line, is a fault) for each row unlike the most common one: a fault where the others read NVLink
    to each other (a GPU left out of the fabric); with no two rows alike, every GPU a layout to look at.  The
    line shows the GPU's cells to the rest of its `group`."""

    def shown(i: int) -> str:
        return _describe_row(_signature(matrix[i][j] for j in group if j != i))

    common, count = Counter(rows.values()).most_common(1)[0]
    odd = [i for i, sig in rows.items() if sig != common]
    if not odd:
        return []
    if count == 1 and len(rows) > 2:
        return [(i, f"GPU {i}: no two GPUs of its kind see their peers alike ({shown(i)})", False) for i in rows]
    others = [i for i in rows if i not in odd]
    usual = Counter(matrix[i][j] for i in others for j in others if i != j).most_common(1)
    seen = usual[0][0] if usual else "?"
    return [(i, f"GPU {i} reads {shown(i)} where the other GPUs read {seen} to each other", seen.startswith("NV")) for i in odd]


def _compare_group(
    inp: CheckInput, group: Sequence[int], judged_by_nvlink: set[int]
) -> tuple[list[tuple[int, str, bool]], list[int]]:
    """One group's odd rows, and its GPUs alone on their NUMA node.  Rows are compared twice: the NVLink cells
    to every peer of the group, then the PCIe cells to the peers on the GPU's own NUMA node (across nodes every
    path is SYS: the sockets' layout, and a node that holds one GPU is a fact of the board, not a finding)."""
    matrix, numa = inp.machine.topology.matrix, inp.machine.topology.numa_node
    compared = [i for i in group if i not in judged_by_nvlink]
    fabric = {i: _signature(matrix[i][j] if matrix[i][j].startswith("NV") else "PCIe" for j in group if j != i) for i in compared}
    odd = _odd_rows(matrix, fabric, group) if len(fabric) > 1 else []
    rest = [i for i in compared if i not in {o[0] for o in odd}]  # (a GPU out of the fabric is said once)
    near = {i: [j for j in rest if j != i and _same_node(numa, i, j)] for i in rest}
    alone = [i for i in rest if not near[i]]
    pcie = {i: _signature(matrix[i][j] for j in near[i] if not matrix[i][j].startswith("NV")) for i in rest if near[i]}
    odd += _odd_rows(matrix, pcie, group) if len(pcie) > 1 else []
    # a group where every GPU sits on a node of its own says nothing about the layout: only a lone one among pairs
    return odd, alone if len(alone) < len(rest) else []


def check_topology(inp: CheckInput) -> Optional[CheckResult]:
    """Each GPU's `topo -m` row against its peers' (the GPUs of its model and NVLink class): one GPU reading PHB
    where the others read NV18 is a finding; one alone on its NUMA node is the board's layout.

    Lost GPUs are left out (the GPUs line already fails them; NVML cannot say how they connect)."""
    lost = {g.index for g in inp.gpus if g.lost}
    matrix = inp.machine.topology.matrix
    present = [i for i in range(len(matrix)) if i not in lost]
    if len(present) < 2:
        return None
    title, expected = "Topology (topo -m rows)", "every GPU's row like its peers'"
    refused = sum(matrix[i][j] == "N/A" for i in present for j in present if i < j)
    if refused:
        pairs = len(present) * (len(present) - 1) // 2
        where = "between the GPUs" if refused == pairs else f"for {refused} of {pairs} GPU pairs"
        value = f"NVML refused the topology call (topo -m reads N/A {where}): not compared"
        return CheckResult("topology", title, SKIP, value, expected)
    # a row narrowed by the GPU's own NVLinks down is the "NVLink links up" line's (the health module's NVLink
    # rule): judged there once, at its severity
    judged_by_nvlink = {i for i in present if i in inp.health and inp.health[i].of(NVLINK)}
    odd: list[tuple[int, str, bool]] = []
    notes: list[str] = []
    groups = _topology_groups(inp, present)
    for group in groups:
        found, alone = _compare_group(inp, group, judged_by_nvlink)
        odd += found
        notes += [f"GPU {i} alone on NUMA node {inp.machine.topology.numa_node[i]} (the board's layout)" for i in alone]
    if odd:
        status = FAIL if any(fault for _, _, fault in odd) else WARN
        return CheckResult("topology", title, status, "; ".join(t for _, t, _ in odd), expected, gpus=tuple(i for i, _, _ in odd))
    return CheckResult("topology", title, PASS, _alike(matrix, groups, present) + "".join(f"; {n}" for n in notes), expected)


def _alike(matrix: Sequence[Sequence[str]], groups: Sequence[Sequence[int]], present: Sequence[int]) -> str:
    """The passing line: each group's rows (the count alone when one group holds every GPU), and the GPUs
    without peers."""
    parts = []
    for group in groups:
        rows: dict[Signature, list[int]] = {}
        for i in group:
            rows.setdefault(_signature(matrix[i][j] for j in present if j != i), []).append(i)
        if len(group) == 1:
            parts.append(f"GPU {group[0]}: {_describe_row(next(iter(rows)))} (no other GPU of its model and NVLink class)")
        elif len(rows) == 1:
            who = f"{len(group)} GPUs" if len(groups) == 1 else gpu_list(group)
            parts.append(f"{who} alike: {_describe_row(next(iter(rows)))}")
        else:  # rows that differ only across NUMA nodes
            parts += [f"{gpu_list(members)}: {_describe_row(sig)}" for sig, members in rows.items()]
    return "; ".join(parts)


def check_nic_numa(inp: CheckInput) -> CheckResult:
    title = "GPU/NIC NUMA affinity"
    expected = "a NIC on every NUMA node that holds GPUs, so RDMA traffic stays on its socket"
    nics = inp.machine.topology.nics  # read once with the topology (collect/sysfs.py), as the T dialog shows them
    if nics is None:
        why = "; ".join(inp.machine.topology.nics_unreadable) or "not read"
        return CheckResult("numa.nic", title, SKIP, f"NICs not readable ({why})", expected)
    placed = [n for n in nics if n.numa_node is not None]
    gpu_nodes = {node for node in inp.machine.topology.numa_node if node is not None}
    if not placed:
        names = ", ".join(n.name for n in nics) or "none"
        return CheckResult(
            "numa.nic", title, SKIP, f"no NIC reports a NUMA node (NICs: {names}; a virtual NIC or a one-node machine)", expected
        )
    nic_nodes = {n.numa_node for n in placed if n.numa_node is not None}
    if not gpu_nodes:
        return CheckResult(
            "numa.nic",
            title,
            SKIP,
            f"NICs on node(s) {', '.join(map(str, sorted(nic_nodes)))}; the GPUs' NUMA nodes are unknown",
            expected,
        )
    missing = sorted(gpu_nodes - nic_nodes)
    by_node = ", ".join(f"node {k}: {', '.join(n.name for n in placed if n.numa_node == k)}" for k in sorted(nic_nodes))
    if missing:
        affected = tuple(i for i, node in enumerate(inp.machine.topology.numa_node) if node in missing)
        return CheckResult(
            "numa.nic",
            title,
            WARN,
            f"no NIC on node {', '.join(map(str, missing))} where {gpu_list(affected)} sit (NICs: {by_node})",
            expected,
            gpus=affected,
        )
    return CheckResult(
        "numa.nic", title, PASS, f"GPUs on node(s) {', '.join(map(str, sorted(gpu_nodes)))}; NICs {by_node}", expected
    )


# ------------------------------------------------------------------ NIC ports (judged in analysis/gpu_health.py)

_NIC_CHECKS = {
    NIC_DOWN: ("nic.state", "NIC ports up", "every port in use ACTIVE (RDMA) / up (Ethernet)"),
    NIC_RATE: ("nic.rate", "NIC port rates", "each port at its peers' rate and its own highest"),
    NIC_ERRORS: ("nic.errors", "NIC error counters", "no error counter climbing while we watch"),
}


def _nic_check(inp: CheckInput, rule: str) -> Optional[CheckResult]:
    """One line per NIC rule; a machine without NIC ports (or without /sys) gets one SKIP line, on the first."""
    check_id, title, expected = _NIC_CHECKS[rule]
    judged = inp.nic_health
    if judged is None or not judged.ports:
        if rule != NIC_DOWN:
            return None
        why = (
            "not read (no NIC readings in the snapshots)"
            if judged is None
            else "none found (no PCI NIC in /sys/class/infiniband or /sys/class/net)"
        )
        return CheckResult("nic", "NIC ports", SKIP, why, "RDMA / Ethernet ports to check")
    failing = [p for h in judged.ports for p in h.of(rule)]
    if failing:
        status = STATUS_OF[worst(failing)]
        return CheckResult(check_id, title, status, "; ".join(p.evidence for p in failing), expected)
    if rule == NIC_ERRORS and judged.errors_watched_s <= 0:
        return CheckResult(check_id, title, SKIP, "read once only (a window too short to see them climb)", expected)
    up = [p for p in judged.latest if p.up]
    rates = sorted({p.rate_gbps for p in up if p.rate_gbps is not None}, reverse=True)
    if rule == NIC_RATE and not rates:
        why = "no port up reports its rate (a virtual NIC reports none)" if up else "no port up"
        return CheckResult(check_id, title, SKIP, why, expected)
    value = {
        NIC_DOWN: f"{len(up)} of {_ports(len(judged.latest))} up"
        + (f" ({', '.join(_down_unused(judged))} unused)" if len(up) < len(judged.latest) else ""),
        NIC_RATE: f"{_ports(len(up))} at " + ", ".join(f"{r:g}" for r in rates) + " Gb/s",
        NIC_ERRORS: f"none climbing on {_ports(len(judged.latest))} in {judged.errors_watched_s:.0f} s",
    }[rule]
    return CheckResult(check_id, title, PASS, value, expected)


def _ports(count: int) -> str:
    return f"{count} port" + ("" if count == 1 else "s")


def _down_unused(judged: NicJudgement) -> list[str]:
    return [h.name for h, p in zip(judged.ports, judged.latest) if not p.up]


def check_nic_state(inp: CheckInput) -> Optional[CheckResult]:
    return _nic_check(inp, NIC_DOWN)


def check_nic_rate(inp: CheckInput) -> Optional[CheckResult]:
    return _nic_check(inp, NIC_RATE)


def check_nic_errors(inp: CheckInput) -> Optional[CheckResult]:
    return _nic_check(inp, NIC_ERRORS)


def _fault_check(
    check_id: str,
    title: str,
    expected: str,
    items: Sequence[GpuDetails],
    key: str,
    readable: Callable[[GpuDetails], bool],
    faulty: Callable[[GpuDetails], object],
    describe: Callable[[GpuDetails], str],
    passed: Callable[[Sequence[GpuDetails]], str],
) -> Optional[CheckResult]:
    """A memory-fault reading per GPU: not available where no GPU that answers gives `key`, FAIL naming each
    faulty GPU with `describe(gpu)`, else PASS saying `passed(the readable GPUs)`."""
    items = [g for g in items if not g.lost]
    if not items:
        return None
    known = [g for g in items if readable(g)]
    if not known:
        return CheckResult(check_id, title, SKIP, f"not available ({_unsupported(items, key)})", expected)
    bad = [g for g in known if faulty(g)]
    if bad:
        return CheckResult(check_id, title, FAIL, "; ".join(describe(g) for g in bad), expected, gpus=tuple(g.index for g in bad))
    return CheckResult(check_id, title, PASS, passed(known), expected)


def _memory_check(inp: CheckInput, rule: str, key: str, check_id: str, title: str, expected: str) -> Optional[CheckResult]:
    live = [g for g in inp.gpus if not g.lost]
    if not live:
        return None
    known = [g for g in live if getattr(g, key) is not None]
    if not known:
        return CheckResult(check_id, title, SKIP, f"not available ({_unsupported(live, key)})", expected)
    return _health_check(inp, (rule,), check_id, title, expected, f"none on {len(known)} GPUs")


def check_ecc_errors(inp: CheckInput) -> Optional[CheckResult]:
    expected = "no uncorrectable errors (since the last reset: fail; only in the lifetime count: warn)"
    return _memory_check(inp, ECC, "ecc", "memory.ecc", "Uncorrectable ECC errors", expected)


def check_remap(inp: CheckInput) -> Optional[CheckResult]:
    expected = "no row remap failed (fail) or pending, no rows remapped for uncorrectable errors (warn)"
    return _memory_check(inp, REMAP, "remapped_rows", "memory.remap", "Row remapping", expected)


def check_power_limit(inp: CheckInput) -> Optional[CheckResult]:
    live = [g for g in inp.gpus if not g.lost and g.power_limit]
    if not live:
        return None
    expected = "each GPU's enforced power limit at its peers' (the same model in this machine)"
    limits = Counter(f"{g.power_limit:.0f} W" for g in live)
    passed = ", ".join(f"{k} on {n} GPUs" for k, n in limits.items())
    return _health_check(inp, (POWER_LIMIT,), "power.limit", "Power limit", expected, passed)


def _retired(d: GpuDetails) -> int:
    return (d.retired_pages_double_bit or 0) + (d.retired_pages_single_bit or 0)


def _none_pending(known: Sequence[GpuDetails]) -> str:
    retired = [d for d in known if _retired(d)]
    return f"none pending on {len(known)} GPUs" + (
        "; retired so far: " + ", ".join(f"GPU {d.index}: {_retired(d)}" for d in retired) if retired else ""
    )


def check_retired_pages(inp: CheckInput) -> Optional[CheckResult]:
    return _fault_check(
        "memory.retired_pages",
        "Retired pages",
        "no page retirement pending",
        inp.after,
        "retired_pages_pending",
        readable=lambda d: d.retired_pages_pending is not None,
        faulty=lambda d: d.retired_pages_pending,
        describe=lambda d: (
            f"GPU {d.index}: retirement pending, {d.retired_pages_double_bit or 0} page(s) for double-bit, "
            f"{d.retired_pages_single_bit or 0} for single-bit errors"
        ),
        passed=_none_pending,
    )


def xid_events(inp: CheckInput) -> list[tuple[Optional[int], int, Optional[float], str]]:
    """Every XID seen, as (GPU index or None, code, time, source): NVML's events in the window, then the kernel log's."""
    out: list[tuple[Optional[int], int, Optional[float], str]] = []
    seen = set()
    for snap in inp.snapshots:
        for g in snap.gpus:
            for e in g.xids or ():
                if (g.index, e.code, e.timestamp) not in seen:
                    seen.add((g.index, e.code, e.timestamp))
                    out.append((g.index, e.code, e.timestamp, "NVML event"))
    by_pci = {xid_bus_id(g.pci_bus_id): g.index for g in inp.gpus if g.pci_bus_id}
    for x in inp.host_after.kernel_xids or ():
        out.append((by_pci.get(x.pci), x.code, x.timestamp, f"kernel log, PCI {x.pci}"))
    return out


def check_xids(inp: CheckInput) -> CheckResult:
    title = "XIDs"
    readable = inp.host_after.kernel_xids is not None
    where = "NVML's events and the kernel log" if readable else "NVML's events (the kernel log was not readable)"
    expected = "no XIDs"
    events = xid_events(inp)
    if not events:
        value = f"none in {where}"
        if readable:
            value += f" ({inp.host_after.kernel_log_records} kernel log records)"
        return CheckResult("xid", title, PASS, value, expected)
    first: dict[tuple[Optional[int], int], tuple[Optional[float], str]] = {}
    counts: Counter[tuple[Optional[int], int]] = Counter()
    evidence, gpus = [], set()
    status = STATUS_OF[max(xid_severity(code) for _, code, _, _ in events)]  # the health module's XID rule
    for gpu, code, when, source in events:
        meaning = meaning_of(code)
        who = f"GPU {gpu}" if gpu is not None else "a GPU NVML does not list"
        first.setdefault((gpu, code), (when, source))
        counts[(gpu, code)] += 1
        evidence.append(f"{utc_time(when)}  {who}  XID {code}: {meaning.meaning} [{source}] action {meaning.advice}")
        if gpu is not None:
            gpus.add(gpu)
    parts = []
    for (gpu, code), (when, source) in first.items():
        who = f"GPU {gpu}" if gpu is not None else "a GPU NVML does not list"
        times = f" ×{counts[(gpu, code)]}, first" if counts[(gpu, code)] > 1 else ""
        meaning = meaning_of(code)
        parts.append(
            f"{who}: XID {code} ({meaning.meaning}){times} at {utc_time(when)} from the {source.split(',')[0]}"
            f" [action {meaning.advice}]"
        )
    value = "; ".join(parts)
    return CheckResult("xid", title, status, value, expected, gpus=tuple(sorted(gpus)), evidence=tuple(evidence))


def _same_mode(
    inp: CheckInput,
    check_id: str,
    title: str,
    read: Callable[[GpuDetails], Optional[bool]],
    key: str,
    extra: Callable[[GpuDetails], Optional[str]] = lambda d: None,
) -> Optional[CheckResult]:
    details = [d for d in inp.after if not d.lost]
    if not details:
        return None
    expected = "the same on every GPU"
    known = [d for d in details if read(d) is not None]
    if not known:
        return CheckResult(check_id, title, SKIP, f"not available ({_unsupported(details, key)})", expected)
    modes = Counter(read(d) for d in known)
    notes = [(d.index, extra(d)) for d in known if extra(d)]
    if len(modes) > 1:
        common = modes.most_common(1)[0][0]
        odd = [d for d in known if read(d) != common]
        value = (
            f"{gpu_list(d.index for d in odd)} {'enabled' if not common else 'disabled'} where "
            f"{len(known) - len(odd)} others are {'enabled' if common else 'disabled'}"
        )
        return CheckResult(check_id, title, WARN, value, expected, gpus=tuple(d.index for d in odd))
    if notes:
        return CheckResult(
            check_id,
            title,
            WARN,
            "; ".join(n for _, n in notes if n),
            expected + ", no change waiting for a reset",
            gpus=tuple(i for i, _ in notes),
        )
    state = "enabled" if next(iter(modes)) else "disabled"
    return CheckResult(check_id, title, PASS, f"{state} on all {len(known)} GPUs", expected)


def check_persistence(inp: CheckInput) -> Optional[CheckResult]:
    return _same_mode(inp, "persistence", "Persistence mode", lambda d: d.persistence_mode, "persistence_mode")


def check_ecc_mode(inp: CheckInput) -> Optional[CheckResult]:
    def pending_change(d: GpuDetails) -> Optional[str]:
        if d.ecc_mode is not None and d.ecc_mode_pending is not None and d.ecc_mode != d.ecc_mode_pending:
            return f"GPU {d.index}: ECC {'on' if d.ecc_mode else 'off'} now, {'on' if d.ecc_mode_pending else 'off'} after the next reset"
        return None

    return _same_mode(inp, "ecc.mode", "ECC mode", lambda d: d.ecc_mode, "ecc_mode", pending_change)


def check_app_clocks(inp: CheckInput) -> Optional[CheckResult]:
    details = [d for d in inp.after if not d.lost]
    if not details:
        return None
    title = "Applications clocks"
    expected = "the board's default applications clocks, since a lower setting holds the GPU back"
    known = [d for d in details if d.app_clock_sm is not None and d.app_clock_sm_default is not None]
    if not known:
        return CheckResult(
            "clocks.applications", title, SKIP, f"not available ({_unsupported(details, 'app_clock_sm')})", expected
        )
    low = [
        d
        for d in known
        if (d.app_clock_sm or 0) < (d.app_clock_sm_default or 0)
        or (
            d.app_clock_memory is not None
            and d.app_clock_memory_default is not None
            and d.app_clock_memory < d.app_clock_memory_default
        )
    ]
    if low:
        value = "; ".join(
            f"GPU {d.index}: SM {d.app_clock_sm} of {d.app_clock_sm_default} MHz, memory {d.app_clock_memory} of "
            f"{d.app_clock_memory_default} MHz (`nvidia-smi -rac` resets it)"
            for d in low
        )
        return CheckResult("clocks.applications", title, WARN, value, expected, gpus=tuple(d.index for d in low))
    sm = Counter(d.app_clock_sm for d in known)
    return CheckResult(
        "clocks.applications",
        title,
        PASS,
        ", ".join(f"SM {k} MHz on {n} GPUs" for k, n in sm.items()) + " (the default)",
        expected,
    )


def _held_seconds(inp: CheckInput) -> list[str]:
    """Evidence only (the verdict is the health module's SLOWDOWN rule, as on the card and the exporter):
    per GPU, the seconds NVML's violation counters say each clock-event policy held the clocks in the window."""
    notes = []
    for a, b in inp.pairs():
        held = {k: b.clock_event_ns[k] - a.clock_event_ns.get(k, 0) for k in b.clock_event_ns if k in a.clock_event_ns}
        shown = ", ".join(f"{k} {v / 1e9:.1f} s" for k, v in held.items() if v > 0)
        if shown:
            notes.append(f"GPU {b.index}: {shown} of {_window(inp)}")
    return notes


def check_clock_events(inp: CheckInput) -> Optional[CheckResult]:
    pairs = inp.pairs()
    if not pairs and not inp.gpus:
        return None
    title = "Clock-event reasons"
    expected = (
        f"no hardware slowdown or thermal brake (fail) or software thermal slowdown (warn) in "
        f"{SLOWDOWN_MIN_SHARE:.0%} of the samples"
    )
    held = _held_seconds(inp)
    passed = f"none in {len(inp.snapshots)} samples over {_window(inp)}"
    result = _health_check(inp, (SLOWDOWN,), "clocks.events", title, expected, passed)
    return replace(result, evidence=tuple(held)) if held else result


def check_sources(inp: CheckInput) -> Optional[CheckResult]:
    """One line for every source that could not be read (never fatal: the checks that need it say skip)."""
    lines = list(dict.fromkeys(inp.host_before.unreadable + inp.host_after.unreadable + inp.machine.topology.nics_unreadable))
    if not lines:
        return None
    return CheckResult("sources", "Unreadable sources", SKIP, "; ".join(lines), "every source readable", evidence=tuple(lines))


# ------------------------------------------------------------------ --load


def nvlink_gbps(gpu_name: str) -> float:
    for marker, rate in NVLINK_GBPS:
        if marker in gpu_name:
            return rate
    return NVLINK_GBPS_DEFAULT


def expected_busbw(machine: MachineInfo, gpus: Sequence[GpuSample]) -> Optional[tuple[float, str]]:
    """(bytes/s, how it was derived) an all-reduce's busbw can reach on this topology: the slowest GPU's links.

    NVLink between every pair: that GPU's NVLink count x the per-link rate.  Otherwise the slowest PCIe
    link at its maximum gen and width (traffic goes through the host)."""
    matrix = machine.topology.matrix
    if len(matrix) < 2:
        return None
    nv_counts: list[int] = []
    for i, row in enumerate(matrix):
        counts = [int(cell[2:]) for j, cell in enumerate(row) if j != i and cell.startswith("NV") and cell[2:].isdigit()]
        nv_counts.append(min(counts) if len(counts) == len(row) - 1 else 0)
    if all(nv_counts):
        rate = nvlink_gbps(machine.gpu_names[0] if machine.gpu_names else "")
        links = min(nv_counts)
        return links * rate * 1e9, f"NV{links} × {rate:.0f} GB/s per link"
    lanes = [(g.pcie.gen_max, g.pcie.width_max) for g in gpus if g.pcie.gen_max and g.pcie.width_max]
    if not lanes:
        return None
    gen, width = min(lanes, key=lambda gw: PCIE_LANE_BYTES_PER_S.get(gw[0], PCIE_LANE_BYTES_PER_S[1]) * gw[1])
    return PCIE_LANE_BYTES_PER_S.get(
        gen, PCIE_LANE_BYTES_PER_S[1]
    ) * width, f"PCIe Gen{gen} x{width} (no NVLink between every pair)"


def check_allreduce(inp: CheckInput) -> Optional[CheckResult]:
    if inp.load is None:
        return None
    title = "All-reduce bus bandwidth (--load)"
    expected = "busbw near what the topology's links carry"
    if inp.load.skipped:
        return CheckResult("load.allreduce", title, SKIP, f"--load skipped: {inp.load.skipped}", expected)
    result = inp.load.allreduce
    if result is None:
        return CheckResult(
            "load.allreduce", title, SKIP, f"all-reduce skipped: {inp.load.allreduce_skipped or 'not run'}", expected
        )
    target = expected_busbw(inp.machine, inp.gpus)
    measured = (
        f"busbw {result.busbw / 1e9:.1f} GB/s (algbw {result.algbw / 1e9:.1f} GB/s, {result.bytes / 2**20:.0f} MiB "
        f"× {result.iterations} on {result.gpus} GPUs)"
    )
    if target is None:
        return CheckResult("load.allreduce", title, PASS, measured + "; no topology to compare with", expected)
    rate, how = target
    share = result.busbw / rate
    expected = f"≥ {BUSBW_WARN_SHARE:.0%} of {rate / 1e9:.0f} GB/s ({how})"
    status = PASS if share >= BUSBW_WARN_SHARE else WARN if share >= BUSBW_FAIL_SHARE else FAIL
    gpus = tuple(g.index for g in inp.gpus) if status != PASS else ()
    return CheckResult("load.allreduce", title, status, f"{measured}: {share:.0%} of the links' rate", expected, gpus=gpus)


# ------------------------------------------------------------------ running them

CHECKS: tuple[Callable[[CheckInput], Optional[CheckResult]], ...] = (
    check_driver,
    check_gpus_answer,
    check_models,
    check_pcie_link,
    check_pcie_replay,
    check_pcie_aer,
    check_nvlink_state,
    check_nvlink_errors,
    check_fabric,
    check_topology,
    check_nic_numa,
    check_nic_state,
    check_nic_rate,
    check_nic_errors,
    check_ecc_errors,
    check_remap,
    check_retired_pages,
    check_xids,
    check_persistence,
    check_ecc_mode,
    check_app_clocks,
    check_power_limit,
    check_clock_events,
    check_allreduce,
    check_sources,
)


def run_checks(inp: CheckInput) -> list[CheckResult]:
    """Every check's line, then DCGM's diagnostics' lines (`--dcgm`: one per test, `analysis/dcgm_diag.py`)."""
    results = [result for check in CHECKS if (result := check(inp)) is not None]
    return results + (dcgm_results(inp.dcgm) if inp.dcgm is not None else [])


def exit_code(results: Sequence[CheckResult]) -> int:
    statuses = {r.status for r in results}
    if FAIL in statuses:
        return EXIT_INFRA
    if WARN in statuses:
        return EXIT_CONFIG
    return EXIT_HEALTHY


def summary_line(results: Sequence[CheckResult]) -> str:
    counts = Counter(r.status for r in results)
    verdict = {EXIT_INFRA: "infrastructure problem found", EXIT_CONFIG: "configuration to look at", EXIT_HEALTHY: "healthy"}
    parts = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
    return f"{verdict[exit_code(results)]} ({parts})"


def failing_gpus(results: Sequence[CheckResult]) -> dict[int, list[CheckResult]]:
    """GPU index -> the failing or warning checks that name it (the TUI marks those cards)."""
    out: dict[int, list[CheckResult]] = {}
    for r in results:
        if r.status in (FAIL, WARN):
            for i in r.gpus:
                out.setdefault(i, []).append(r)
    return out


def identity(inp: CheckInput) -> list[dict[str, object]]:
    """Per GPU: what the ticket identifies it by."""
    return [
        {
            "index": d.index,
            "name": d.name,
            "uuid": d.uuid,
            "serial": d.serial,
            "vbios": d.vbios,
            "board_part_number": d.board_part_number,
            "pci_bus_id": d.pci_bus_id,
            "lost": d.lost,
        }
        for d in inp.after
    ]


@dataclass(frozen=True)
class CheckReport:
    """Everything `gputop check` found, for the terminal, --json, the report's infra section and the TUI."""

    results: tuple[CheckResult, ...]
    seconds: float
    identity: tuple[dict[str, object], ...] = ()
    machine: dict[str, object] = field(default_factory=dict)  # hostname, kernel, driver, CUDA, NVML
    xids: tuple[str, ...] = ()  # one line per XID with its time

    @property
    def exit_code(self) -> int:
        return exit_code(self.results)

    @property
    def summary(self) -> str:
        return summary_line(self.results)


def build_report(inp: CheckInput) -> CheckReport:
    results = tuple(run_checks(inp))
    xid_lines = next((r.evidence for r in results if r.id == "xid"), ())
    m = inp.machine
    return CheckReport(
        results=results,
        seconds=inp.seconds,
        identity=tuple(identity(inp)),
        machine={
            "hostname": m.hostname,
            "kernel": inp.host_after.kernel,
            "driver": m.driver_version,
            "driver_module": inp.host_after.driver_module,
            "cuda": m.cuda_version,
            "nvml": m.nvml_version,
            "simulated": m.simulated,
            "gpu_error": m.gpu_error,
        },
        xids=tuple(xid_lines),
    )


def report_jsonable(report: CheckReport) -> dict[str, Any]:
    return {
        "status": {EXIT_INFRA: "fail", EXIT_CONFIG: "warn", EXIT_HEALTHY: "pass"}[report.exit_code],
        "exit_code": report.exit_code,
        "summary": report.summary,
        "seconds": report.seconds,
        "machine": dict(report.machine),
        "gpus": [dict(g) for g in report.identity],
        "checks": [
            {
                "id": r.id,
                "title": r.title,
                "status": r.status,
                "value": r.value,
                "expected": r.expected,
                "gpus": list(r.gpus),
                "evidence": list(r.evidence),
                "line": r.line(),
            }
            for r in report.results
        ],
        "xids": list(report.xids),
        "next_commands": [{"command": c, "why": w} for c, w in NEXT_COMMANDS],
        "advice": CAPTURE_BEFORE_RESET,
    }
