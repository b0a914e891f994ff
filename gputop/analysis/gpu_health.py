"""One judgement of a GPU's health, for every place that shows it; and of the NIC ports' (the last section).

The card (`tui/widgets/gpu_grid.py`), the diagnosis (`analysis/checks/infra.py`), `gputop check`
(`analysis/machine_check.py`), the report's health table and infra section and `gputop serve`'s
`gputop_gpu_health` gauge all call the rules here; each place only words and lays out what they return.

A rule looks at one sample (`judge_sample`; the power limit also at the other GPUs of the same snapshot)
and returns `Problem`s: a `Severity`, a short word for the card and one line of evidence.  Over a window
(`judge_window`) a GPU's state rules (lost, ECC, remapping, XIDs, NVLink, power limit, fabric) are read from
its latest sample, and the rules that flicker from sample to sample (clock slowdowns, the PCIe link) count
when they hold in a share of the samples that could tell.  Every consumer judges a window: `gputop check` and
a report theirs, the card, the exporter and the live diagnosis the last HEALTH_WINDOW_S (`judge_recent`);
one sample is a window of one.

One severity vocabulary, mapped once onto each consumer's words (`FINDING_SEVERITY`; `gputop check` turns
CRITICAL into FAIL and WARN into WARN; the card into FAULT and WARN; the exporter's gauge into 2 and 1):

- CRITICAL: the GPU loses or may corrupt work, or its hardware protects itself, or a part must be reseated or
  replaced: lost, uncorrectable ECC errors since the last reset, a failed row remap, a critical XID, a hardware
  slowdown or thermal brake, a PCIe link trained below its maximum (narrower at any load, or slower while
  busy: a seating, riser or signal-integrity fault, a ticket), an NVSwitch fabric not trained.
- WARN: it runs, below what it should or with a fault that was repaired: NVLink links down, a fabric still
  training or whose health mask reports degraded bandwidth or a recovery, a power limit below its peers', a
  software thermal slowdown, a row remap waiting for a reset, uncorrectable errors only in the lifetime count
  or in rows already remapped, an XID that is the job's or a warning.
- Corrected ECC errors are not a problem by themselves: the hardware corrected them (NVIDIA reports a high
  rate as XID 92, which the XID rule catches).

The board decides what is normal: NVLinks a card reports inactive where its model's links are bridges
between pairs of PCIe cards (`Peers.bridged`) are a card without a bridge, not links down; `nvlink_class`
says which GPUs `gputop check` compares topology rows between (the same model and NVLink class).

The PCIe link (decided here for every consumer): an idle GPU drops the link *generation* to save power
(FACTS.md; `nvidia-smi -q` documents the current generation as lowered while idle), so a lower generation
counts only at or above PCIE_LOAD_UTILIZATION.  The *width* is trained once and does not step down for
power saving on these boards, so missing lanes count idle or busy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Iterable, Mapping, Optional, Sequence

from gputop.analysis.thresholds import DIAGNOSIS_WINDOW_S, PCIE_LOAD_UTILIZATION, POWER_LIMIT_LOWERED, THROTTLE_MIN_FRACTION
from gputop.analysis.xids import meaning_of
from gputop.model import LABEL_INFRA, FabricInfo, GpuSample, NicPortSample, NvLinkWiring, Snapshot


class Severity(IntEnum):
    OK = 0
    WARN = 1
    CRITICAL = 2


# The diagnosis' Finding.severity words.
FINDING_SEVERITY = {Severity.OK: "info", Severity.WARN: "warning", Severity.CRITICAL: "critical"}

# Bytes a second one PCIe lane carries each way, per generation, after line coding (PCI-SIG: 2.5/5 GT/s with
# 8b/10b for Gen1/2, 8/16/32 GT/s with 128b/130b for Gen3-5, Gen6's 64 GT/s PAM4 with FLIT overhead).
PCIE_LANE_BYTES_PER_S = {1: 250e6, 2: 500e6, 3: 985e6, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}

# The rules' names (Problem.rule): what `gputop check`'s lines and the diagnosis' findings select on.
LOST = "lost"
ECC = "ecc"
REMAP = "remap"
XID = "xid"
SLOWDOWN = "slowdown"
POWER_LIMIT = "power_limit"
PCIE = "pcie"
NVLINK = "nvlink"
FABRIC = "fabric"
FLICKERING = (SLOWDOWN, PCIE)  # judged over a window by their share of the samples

# Clock-event reasons (normalised: lower case, no separators) that mean the machine slows the GPU, with
# their severity: the hardware's own slowdowns and brakes protect the board (NVML's clocks-event reasons,
# FACTS.md); the driver's thermal slowdown comes first and warns.  Idle, app clocks, sync boost and the
# power cap are not faults (reaching the cap at full load is normal; a lowered limit is POWER_LIMIT).
_SLOWDOWNS = (
    ("hwthermal", "HW thermal slowdown", Severity.CRITICAL),
    ("hwpowerbrake", "HW power brake", Severity.CRITICAL),
    ("hwslowdown", "HW slowdown", Severity.CRITICAL),
    ("swthermal", "SW thermal slowdown", Severity.WARN),
)
# A slowdown counts over a window when it holds in this share of the samples (thresholds.py).
SLOWDOWN_MIN_SHARE = THROTTLE_MIN_FRACTION
# A degraded link counts over a window when it shows in at least half of the samples that could tell: one
# sample caught while the link steps up from the idle generation is not a degraded link.
PCIE_MIN_SHARE = 0.5


@dataclass(frozen=True)
class Problem:
    rule: str  # one of the rule names above
    severity: Severity
    word: str  # the card's short word ("ECC 2 uncorr")
    evidence: str  # one line with the numbers, naming the GPU


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's problems (in one sample, or over a window), worst first."""

    index: int
    problems: tuple[Problem, ...] = ()

    @property
    def severity(self) -> Severity:
        return max((p.severity for p in self.problems), default=Severity.OK)

    def of(self, *rules: str) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.rule in rules)


def worst(problems: Iterable[Problem]) -> Severity:
    return max((p.severity for p in problems), default=Severity.OK)


def reason_key(name: str) -> str:
    """A clock-event reason as one spelling: NVML's constant names and pynvml's words differ."""
    return name.replace("_", "").replace(" ", "").replace("-", "").lower()


# ---------------------------------------------------------------- the per-sample rules


def pcie_degraded(gpu: GpuSample) -> Optional[bool]:
    """True/False when this sample can tell whether the link runs below its maximum; None when it cannot (the
    width is fine and the GPU idles, so a lower generation is power saving; or NVML did not say)."""
    link = gpu.pcie
    if link.width_current is None or link.width_max is None:
        return None
    if link.width_current < link.width_max:
        return True
    if link.gen_current is None or link.gen_max is None:
        return None
    if (gpu.utilization_gpu or 0.0) < PCIE_LOAD_UTILIZATION:
        return None
    return link.gen_current < link.gen_max


def _pcie(gpu: GpuSample) -> list[Problem]:
    if not pcie_degraded(gpu):
        return []
    p = gpu.pcie
    load = f" at {gpu.utilization_gpu:.0f}% utilization" if gpu.utilization_gpu is not None else ""
    text = f"GPU {gpu.index}: PCIe Gen{p.gen_current} x{p.width_current} of Gen{p.gen_max} x{p.width_max}{load}"
    return [Problem(PCIE, Severity.CRITICAL, "PCIe down", text)]


def _ecc(gpu: GpuSample) -> list[Problem]:
    ecc = gpu.ecc
    if ecc is None:
        return []
    if ecc.volatile_uncorrected:
        text = f"GPU {gpu.index}: {ecc.volatile_uncorrected} uncorrectable ECC error(s) since the last reset"
        text += f" ({ecc.aggregate_uncorrected} lifetime)" if ecc.aggregate_uncorrected is not None else ""
        return [Problem(ECC, Severity.CRITICAL, f"ECC {ecc.volatile_uncorrected} uncorr", text)]
    if ecc.aggregate_uncorrected:
        text = (
            f"GPU {gpu.index}: {ecc.aggregate_uncorrected} uncorrectable ECC error(s) in its lifetime, none since the last reset"
        )
        return [Problem(ECC, Severity.WARN, f"ECC {ecc.aggregate_uncorrected} past", text)]
    return []


def _remap(gpu: GpuSample) -> list[Problem]:
    rows = gpu.remapped_rows
    if rows is None:
        return []
    counts = f"{rows.uncorrectable} uncorrectable + {rows.correctable} correctable rows"
    if rows.failed:
        return [
            Problem(REMAP, Severity.CRITICAL, "remap FAILED", f"GPU {gpu.index}: row remap FAILED (no spare rows: RMA), {counts}")
        ]
    if rows.pending:
        return [
            Problem(
                REMAP, Severity.WARN, "remap pending", f"GPU {gpu.index}: row remap pending (a GPU reset applies it), {counts}"
            )
        ]
    if rows.uncorrectable:
        return [Problem(REMAP, Severity.WARN, f"remap {rows.uncorrectable}", f"GPU {gpu.index}: {counts} remapped (done)")]
    return []


def xid_severity(code: int) -> Severity:
    """The XID catalogue (xids.py, after NVIDIA's XID list) says whose and how bad: the hardware's critical
    XIDs are CRITICAL; the job's, and the hardware's warnings, WARN."""
    meaning = meaning_of(code)
    return Severity.CRITICAL if meaning.label == LABEL_INFRA and meaning.severity == "critical" else Severity.WARN


def _xids(gpu: GpuSample) -> list[Problem]:
    codes = dict.fromkeys(event.code for event in reversed(gpu.xids or ()))  # newest first, once each
    return [
        Problem(XID, xid_severity(code), f"XID {code}", f"GPU {gpu.index}: XID {code}: {meaning_of(code).meaning}")
        for code in codes
    ]


def slowdowns(gpu: GpuSample) -> list[tuple[str, Severity]]:
    """The machine's slowdowns among this sample's clock-event reasons: (what, severity)."""
    keys = [reason_key(r) for r in gpu.throttle_reasons or ()]
    return [(what, severity) for fragment, what, severity in _SLOWDOWNS if any(fragment in key for key in keys)]


def _slowdown(gpu: GpuSample) -> list[Problem]:
    found = slowdowns(gpu)
    if not found:
        return []
    temp = f"; {gpu.temperature:.0f} °C" if gpu.temperature is not None else ""
    clock = f", SM clock {gpu.clock_sm} MHz" if gpu.clock_sm else ""
    text = f"GPU {gpu.index}: {', '.join(what for what, _ in found)}{temp}{clock}"
    return [Problem(SLOWDOWN, max(s for _, s in found), "throttled", text)]


def _wiring(gpu: GpuSample) -> tuple[NvLinkWiring, ...]:
    """The GPU's links as they are wired (up or down, and to what): all the NVLink rules read.  Not
    `gpu.nvlink`, whose items are built on each read: the rules run over every sample of a window."""
    return gpu.nvlink.wiring if gpu.nvlink is not None else ()


def _nvlink(gpu: GpuSample, peers: Peers) -> list[Problem]:
    """Links down on a GPU that has some up, or whose peers of its model have some up.  Every link down is the
    board's normal state where no GPU of its model has one up (PCIe-only boards), and on a card of a bridged
    model (`Peers.bridged`): an NVLink bridge joins two cards, and a card without one reports its links
    inactive."""
    links = _wiring(gpu)
    down = [link.link for link in links if not link.active]
    if not down or nvlink_unused(gpu, peers):
        return []
    text = f"GPU {gpu.index}: {len(down)} of {len(links)} NVLink links inactive (links {', '.join(map(str, down[:12]))})"
    return [Problem(NVLINK, Severity.WARN, f"NVLink {len(down)} down", text)]


# ---------------------------------------------------------------- the NVSwitch fabric (Fabric Manager)
#
# nvmlDeviceGetGpuFabricInfoV (nvml.h, NVML API reference "nvmlGpuFabricInfo_v2_t"): the state of the GPU's
# training into the NVSwitch fabric, the training's status once completed, and (v2+) a health mask of 2-bit
# fields, each 0 not supported, 1 TRUE, 2 FALSE.  A GPU whose fabric is not trained cannot run NCCL over NVLink:
# a dead nvidia-fabricmanager leaves the node's GPUs unusable for multi-GPU jobs.

FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}
FABRIC_COMPLETED = 3
# (bit shift, what a TRUE means, severity): route unhealthy loses traffic; the others run, slower or recovered
_FABRIC_HEALTH = (
    (0, "degraded bandwidth", Severity.WARN),
    (2, "route recovery in progress", Severity.WARN),
    (4, "route unhealthy", Severity.CRITICAL),
    (6, "access timeout recovery in progress", Severity.WARN),
)


def fabric_health(info: FabricInfo) -> list[tuple[str, Severity]]:
    """The health mask's TRUE fields: (what, severity); none for a v1 reading (no mask)."""
    mask = info.health_mask
    if mask is None:
        return []
    return [(what, severity) for shift, what, severity in _FABRIC_HEALTH if (mask >> shift) & 0x3 == 1]


def _fabric(gpu: GpuSample) -> list[Problem]:
    info = gpu.fabric
    if info is None:  # NOT_SUPPORTED: no NVSwitch fabric on this board, not a fault
        return []
    state = FABRIC_STATES.get(info.state, f"state {info.state}")
    where = f"GPU {gpu.index}: NVSwitch fabric {state}"
    if info.state != FABRIC_COMPLETED:
        if info.state == 2:  # the Fabric Manager is training it now (at boot, or after a GPU reset)
            return [Problem(FABRIC, Severity.WARN, "fabric training", f"{where}: NCCL over NVLink waits for it")]
        text = f"{where}: not trained, NCCL cannot use NVLink (is nvidia-fabricmanager running? systemctl status nvidia-fabricmanager)"
        return [Problem(FABRIC, Severity.CRITICAL, "fabric down", text)]
    if info.status:
        text = f"{where} with error {info.status} (NVML return code): the training failed; see the Fabric Manager's log"
        return [Problem(FABRIC, Severity.CRITICAL, "fabric failed", text)]
    found = fabric_health(info)
    if not found:
        return []
    mask = f"health mask 0x{info.health_mask:x}" if info.health_mask is not None else ""
    text = f"{where}, {', '.join(what for what, _ in found)} ({mask}, clique {info.clique_id})"
    return [Problem(FABRIC, max(s for _, s in found), "fabric degr", text)]


@dataclass(frozen=True)
class Peers:
    """What a GPU is judged against: the other GPUs of its model in the same snapshot."""

    power_limit: Mapping[str, float] = field(default_factory=dict)  # model -> the highest enforced limit
    nvlink_up: frozenset[str] = frozenset()  # the models with NVLink links up on some GPU
    # the models whose links, where up, join each GPU to one other GPU and to no switch: NVLink bridges
    # between pairs of PCIe cards (2x RTX 3090, RTX A6000 pairs), not an SXM board's mesh or NVSwitch
    bridged: frozenset[str] = frozenset()


NO_PEERS = Peers()

# A GPU's NVLink class (`nvlink_class`): what its topology row is compared within
NVLINK_BOARD = ""  # an SXM board's links (NVSwitch or a direct mesh), or no NVLink on its model
NVLINK_BRIDGED = "bridged"  # a PCIe card joined to one other by an NVLink bridge
NVLINK_UNBRIDGED = "no bridge"  # a card of a bridged model without a bridge: its links inactive, as they should be


def _bridge_partner(gpu: GpuSample) -> Optional[str]:
    """The one GPU this GPU's active links all lead to (its bridge partner); None if they lead to a switch,
    to several GPUs, or NVML did not say where."""
    active = [link for link in _wiring(gpu) if link.active]
    ends = {link.remote_bus_id for link in active}
    if not active or len(ends) != 1 or any(link.remote_kind not in ("gpu", None) for link in active):
        return None
    return next(iter(ends))


def _bridged_models(gpus: Sequence[GpuSample]) -> frozenset[str]:
    partners: dict[str, list[Optional[str]]] = {}
    for g in gpus:
        if not g.lost and any(link.active for link in _wiring(g)):
            partners.setdefault(g.name, []).append(_bridge_partner(g))
    return frozenset(name for name, ends in partners.items() if all(ends))


def nvlink_unused(gpu: GpuSample, peers: Peers) -> bool:
    """Every link of this GPU inactive, as its board has them: no GPU of its model has one up (a PCIe-only
    board), or a card of a bridged model without a bridge."""
    links = _wiring(gpu)
    inactive = bool(links) and not any(link.active for link in links)
    return inactive and (gpu.name not in peers.nvlink_up or gpu.name in peers.bridged)


def nvlink_class(gpu: GpuSample, peers: Peers) -> str:
    """NVLINK_BRIDGED / NVLINK_UNBRIDGED for a card of a bridged model, NVLINK_BOARD for the others."""
    if gpu.name not in peers.bridged:
        return NVLINK_BOARD
    return NVLINK_BRIDGED if any(link.active for link in _wiring(gpu)) else NVLINK_UNBRIDGED


def peers_of(gpus: Sequence[GpuSample]) -> Peers:
    """The live GPUs of one snapshot, by model."""
    limits: dict[str, float] = {}
    for g in gpus:
        if not g.lost and g.power_limit:
            limits[g.name] = max(limits.get(g.name, 0.0), g.power_limit)
    nvlink_up = frozenset(g.name for g in gpus if not g.lost and any(link.active for link in _wiring(g)))
    return Peers(limits, nvlink_up, _bridged_models(gpus))


def _power_limit(gpu: GpuSample, peers: Peers) -> list[Problem]:
    top = peers.power_limit.get(gpu.name)
    if not gpu.power_limit or not top or gpu.power_limit >= POWER_LIMIT_LOWERED * top:
        return []
    text = f"GPU {gpu.index}: enforced power limit {gpu.power_limit:.0f} W where its peers' is {top:.0f} W"
    return [Problem(POWER_LIMIT, Severity.WARN, "power limit", text)]


def judge_sample(gpu: GpuSample, peers: Peers = NO_PEERS) -> GpuHealth:
    """Every rule on one sample; `peers`: `peers_of` the sample's snapshot (without them a lowered power
    limit, or a GPU with every NVLink down, cannot be told)."""
    if gpu.lost:
        return GpuHealth(
            gpu.index, (Problem(LOST, Severity.CRITICAL, "LOST", f"GPU {gpu.index} ({gpu.pci_bus_id}): lost (fell off the bus)"),)
        )
    found = _ecc(gpu) + _remap(gpu) + _xids(gpu) + _slowdown(gpu) + _power_limit(gpu, peers) + _pcie(gpu) + _nvlink(gpu, peers)
    found += _fabric(gpu)
    return GpuHealth(gpu.index, tuple(sorted(found, key=lambda p: -p.severity)))


def judge_snapshot(gpus: Sequence[GpuSample]) -> dict[int, GpuHealth]:
    """Every GPU of one snapshot (what the card and the exporter show)."""
    peers = peers_of(gpus)
    return {g.index: judge_sample(g, peers) for g in gpus}


# ---------------------------------------------------------------- over a window


def _flickering(judged: Sequence[tuple[GpuSample, GpuHealth]], rule: str) -> list[Problem]:
    """`rule` over the samples that could tell: a problem when it held in its share of them, at the worst
    severity that held in that share."""
    if rule == PCIE:
        could_tell = [h for g, h in judged if pcie_degraded(g) is not None]
        share = PCIE_MIN_SHARE
    else:
        could_tell = [h for g, h in judged if g.throttle_reasons is not None]
        share = SLOWDOWN_MIN_SHARE
    hits = [p for h in could_tell for p in h.problems if p.rule == rule]  # h.of(rule), without a tuple per sample
    needed = max(1.0, share * len(could_tell))
    if len(hits) < needed:
        return []
    severity = max(
        s for s in (Severity.WARN, Severity.CRITICAL) if s == Severity.WARN or sum(p.severity >= s for p in hits) >= needed
    )
    last = hits[-1]
    return [Problem(rule, severity, last.word, f"{last.evidence}; in {len(hits)} of {len(could_tell)} samples")]


def judge_gpu_window(index: int, judged: Sequence[tuple[GpuSample, GpuHealth]]) -> GpuHealth:
    """One GPU over a window: (sample, judge_sample of it) oldest first."""
    if not judged:
        return GpuHealth(index)
    alive = [(g, h) for g, h in judged if not g.lost]
    lost = [h for g, h in judged if g.lost]
    found: list[Problem] = list(lost[-1].problems) if lost else []
    if alive:
        latest = alive[-1][1]
        found += [p for p in latest.problems if p.rule not in FLICKERING]
        for rule in FLICKERING:
            found += _flickering(alive, rule)
    return GpuHealth(index, tuple(sorted(found, key=lambda p: -p.severity)))


# A snapshot's GPUs, each with judge_sample of it: a pure function of the (frozen) snapshot.
JudgedSnapshot = tuple[tuple[GpuSample, GpuHealth], ...]


class _LastWindows:
    """The judged snapshots of the last two `judge_window` calls, by identity.  The TUI judges a sliding
    window every few seconds (the diagnosis) that differs from the last by a few new snapshots: those are
    judged, the rest are reused.  Two calls' worth, so that another caller between two diagnoses (the
    counter watch judges its own snapshots every minute) does not make the next one judge its whole window
    again.  Only those are kept (references to snapshots their callers held), so memory stays what two
    windows' judgements take; threads judging at once only judge more."""

    def __init__(self) -> None:
        self.judged: tuple[dict[int, tuple[Snapshot, JudgedSnapshot]], ...] = ()


_LAST_WINDOWS = _LastWindows()


def judged_snapshots_kept() -> int:
    """How many judged snapshots the last two windows keep (their bound: two windows' worth)."""
    return sum(len(window) for window in _LAST_WINDOWS.judged)


def forget_judged_windows() -> None:
    """Drop the kept judgements (the next window is judged whole): a heap measurement's settle, since what they
    hold follows the windows' content (how many problems each GPU had), not the number of calls."""
    _LAST_WINDOWS.judged = ()


def _judged(snap: Snapshot, previous: Sequence[Mapping[int, tuple[Snapshot, JudgedSnapshot]]]) -> JudgedSnapshot:
    for window in previous:
        kept = window.get(id(snap))
        if kept is not None and kept[0] is snap:
            return kept[1]
    peers = peers_of(snap.gpus)
    return tuple((g, judge_sample(g, peers)) for g in snap.gpus)


def judge_window(snapshots: Sequence[Snapshot]) -> dict[int, GpuHealth]:
    """Every GPU seen in the snapshots (oldest first), judged over all of them."""
    previous = _LAST_WINDOWS.judged
    judged_now: dict[int, tuple[Snapshot, JudgedSnapshot]] = {}
    series: dict[int, list[tuple[GpuSample, GpuHealth]]] = {}
    for snap in snapshots:
        judged = judged_now[id(snap)] = (snap, _judged(snap, previous))
        for g, health in judged[1]:
            series.setdefault(g.index, []).append((g, health))
    _LAST_WINDOWS.judged = (judged_now, *previous[:1])
    return {index: judge_gpu_window(index, judged) for index, judged in sorted(series.items())}


# The window the live views judge a GPU over (the card, the exporter, the live diagnosis): the diagnosis' own,
# so the card, /metrics and the findings flag a GPU at one severity at one time.  `gputop check` and a report
# judge their whole window; one snapshot is a window of one.
HEALTH_WINDOW_S = DIAGNOSIS_WINDOW_S


def recent(snapshots: Sequence[Snapshot], seconds: float = HEALTH_WINDOW_S) -> Sequence[Snapshot]:
    """The snapshots (oldest first) within `seconds` of the newest."""
    if not snapshots:
        return snapshots
    since = snapshots[-1].timestamp - seconds
    start = len(snapshots)
    while start > 0 and snapshots[start - 1].timestamp >= since:
        start -= 1
    return snapshots[start:]


def judge_recent(snapshots: Sequence[Snapshot]) -> dict[int, GpuHealth]:
    """`judge_window` over the live views' window (`HEALTH_WINDOW_S`) ending at the newest snapshot."""
    return judge_window(recent(snapshots))


# ---------------------------------------------------------------- NIC ports
#
# The NICs multi-node training runs over, judged once here for `gputop check`, the diagnosis, the report and
# the exporter, from the snapshots' `nics` (collect/sysfs.NicReader).  A port's peers are the other ports of
# the same kind on the machine: RDMA ports of one driver and link layer (the eight mlx5 "rails" of a DGX);
# a plain Ethernet interface has no peers (a 1 GbE management port beside a 100 GbE one is no fault).
#
# - down (CRITICAL for an RDMA port, WARN for a plain Ethernet interface, which may be down on purpose): not
#   ACTIVE / not up, while a peer is up or the port has carried traffic since the driver loaded.  A port that
#   never carried a byte and whose peers are down too is not cabled: not a fault.
# - rate (CRITICAL): up, but trained below its peers' highest rate, or below its own highest in the window
#   (it retrained lower while we watched).  A half-rate rail holds every collective of the job back.
# - errors (CRITICAL): an error counter grew between the first and the last reading of the window; counts
#   since the driver loaded say little (a link flapped once last month).

NIC_DOWN = "nic_down"
NIC_RATE = "nic_rate"
NIC_ERRORS = "nic_errors"


@dataclass(frozen=True)
class NicHealth:
    """One NIC port's problems over a window, worst first."""

    device: str
    port: int
    rdma: bool
    problems: tuple[Problem, ...] = ()

    @property
    def name(self) -> str:
        return nic_port_name(self.device, self.port, self.rdma)

    @property
    def severity(self) -> Severity:
        return worst(self.problems)

    def of(self, *rules: str) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.rule in rules)


@dataclass(frozen=True)
class NicJudgement:
    """Every NIC port of a window, and what the window could tell."""

    ports: tuple[NicHealth, ...]
    latest: tuple[NicPortSample, ...]  # each port's last sample
    errors_watched_s: float  # the time between the first and the last error-counter reading (0: read once)


def nic_port_name(device: str, port: int, rdma: bool) -> str:
    """ "mlx5_3 port 1" (an RDMA device's port); an Ethernet interface is its name."""
    return f"{device} port {port}" if rdma else device


def _nic_group(port: NicPortSample) -> Optional[tuple[str, str]]:
    """The peers' group: (driver prefix, link layer) for RDMA ports; None for plain Ethernet (no peers)."""
    return (port.device.rstrip("0123456789"), port.link_layer) if port.rdma else None


def _nic_down(port: NicPortSample, peers_up: bool) -> list[Problem]:
    if port.up:
        return []
    used = bool(port.rx_bytes or port.tx_bytes)
    if not (peers_up or used):
        return []  # never cabled or unused, and no peer up either
    phys = f" ({port.phys_state})" if port.phys_state else ""
    why = "its peers are up" if peers_up else "it has carried traffic since the driver loaded"
    text = f"{nic_port_name(port.device, port.port, port.rdma)}: port {port.state}{phys} where {why}"
    # an RDMA port is the job's fabric; a plain interface may be down on purpose (a second port, set down)
    return [Problem(NIC_DOWN, Severity.CRITICAL if port.rdma else Severity.WARN, "down", text)]


def _nic_rate(port: NicPortSample, peers_best: Optional[float], own_best: Optional[float]) -> list[Problem]:
    rate = port.rate_gbps
    if not port.up or rate is None:
        return []
    name, shown = nic_port_name(port.device, port.port, port.rdma), port.rate_text or f"{rate:g} Gb/s"
    if peers_best is not None and rate < peers_best:
        return [
            Problem(NIC_RATE, Severity.CRITICAL, f"{rate:g} Gb/s", f"{name}: {shown} where its peers run at {peers_best:g} Gb/s")
        ]
    if own_best is not None and rate < own_best:
        text = f"{name}: {shown}, down from {own_best:g} Gb/s while we watched (it retrained)"
        return [Problem(NIC_RATE, Severity.CRITICAL, f"{rate:g} Gb/s", text)]
    return []


def _nic_errors(first: NicPortSample, last: NicPortSample) -> list[Problem]:
    if last.errors_at <= first.errors_at:
        return []
    grown = {k: v - first.errors.get(k, 0) for k, v in last.errors.items() if v > first.errors.get(k, 0)}
    if not grown:
        return []
    seconds = last.errors_at - first.errors_at
    named = ", ".join(f"{k} +{v} (now {last.errors[k]})" for k, v in sorted(grown.items(), key=lambda kv: -kv[1]))
    text = f"{nic_port_name(last.device, last.port, last.rdma)}: {named} in {seconds:.0f} s"
    return [Problem(NIC_ERRORS, Severity.CRITICAL, "errors", text)]


def judge_nics(snapshots: Sequence[Snapshot]) -> Optional[NicJudgement]:
    """Every NIC port seen in the snapshots (oldest first), judged over all of them; None where no snapshot
    carries NIC readings (no /sys, a recording from before gputop read them)."""
    series: dict[tuple[str, int], list[NicPortSample]] = {}
    read = False
    for snap in snapshots:
        if snap.nics is None:
            continue
        read = True
        for port in snap.nics:
            series.setdefault((port.device, port.port), []).append(port)
    if not read:
        return None
    latest = tuple(samples[-1] for samples in series.values())
    best: dict[tuple[str, str], float] = {}
    for port in latest:
        group = _nic_group(port)
        if group is not None and port.up and port.rate_gbps is not None:
            best[group] = max(best.get(group, 0.0), port.rate_gbps)
    ports = []
    for samples in series.values():
        first, last = samples[0], samples[-1]
        group = _nic_group(last)
        peers_up = group is not None and any(p is not last and p.up and _nic_group(p) == group for p in latest)
        own_best = max((s.rate_gbps for s in samples if s.up and s.rate_gbps is not None), default=None)
        found = (
            _nic_down(last, peers_up) + _nic_rate(last, best.get(group) if group else None, own_best) + _nic_errors(first, last)
        )
        ports.append(NicHealth(last.device, last.port, last.rdma, tuple(found)))
    watched = max((s[-1].errors_at - s[0].errors_at for s in series.values()), default=0.0)
    return NicJudgement(tuple(ports), latest, watched)
