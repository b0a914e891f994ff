"""One job across nodes, as every node's `gputop serve` exported it to Prometheus, and a verdict across them.

`fleet_view(query, job)` asks Prometheus for the job's series (the `job` label is the id every node
derives alike: `gputop.fleet.identity`), joins them by node (the `Hostname` label) and global rank, and
`judge()` says which node holds the job back: a hung rank, the straggler (the rank that waits for its
data while the others wait for it), or a node whose GPU links or NICs are degraded."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

from gputop.errors import GputopError
from gputop.fleet.prometheus import Query, Series

MACHINE_JOB = "machine"  # serve's findings with no job on the GPUs (gputop.exporter.MACHINE_JOB)
# A rank waits for data this much more of the time than the median of the job's others: the straggler.
STRAGGLER_MIN_SHARE = 0.3
STRAGGLER_MIN_GAP = 0.25
# A rank whose main thread last moved this long before the job's newest progress: held up (or hung).
STALLED_AFTER_S = 30.0


@dataclass(frozen=True, slots=True)
class FleetRank:
    node: str  # the Hostname label of the serve that sees it
    rank: int
    local_rank: Optional[int] = None
    node_rank: Optional[int] = None
    pid: Optional[int] = None
    gpus: tuple[int, ...] = ()
    state: Optional[str] = None  # gputop_rank_state's state now (None: no stacks read)
    data_wait_ratio: Optional[float] = None
    data_wait_low: Optional[float] = None
    data_wait_high: Optional[float] = None
    last_progress: Optional[float] = None  # Unix time


@dataclass(frozen=True, slots=True)
class NodeFinding:
    node: str
    kind: str  # a finding id (gputop_finding's kind), a GPU or NIC health rule ("nic_down", "nic_rate", ...)
    severity: str
    label: str  # "infrastructure" or "code"
    gpu: Optional[int] = None
    device: str = ""  # a NIC's device, where the series names one
    port: Optional[int] = None  # the NIC's port

    @property
    def part(self) -> str:
        """The part it is about: 'GPU 2', 'NIC mlx5_3 port 1', 'NIC eth0', or '' (the machine, the job)."""
        if self.gpu is not None:
            return f"GPU {self.gpu}"
        if self.device:
            return f"NIC {self.device}" + (f" port {self.port}" if self.port is not None else "")
        return ""


@dataclass(frozen=True, slots=True)
class FleetNode:
    hostname: str
    node_rank: Optional[int] = None
    gpus: tuple[int, ...] = ()
    utilization: dict[int, float] = field(default_factory=dict)
    gpu_health: dict[int, int] = field(default_factory=dict)  # 0 ok, 1 warning, 2 critical
    verdict: Optional[str] = None  # that node's own verdict for the job


@dataclass(frozen=True, slots=True)
class FleetVerdict:
    kind: str  # "hung", "straggler", "infrastructure", "healthy", "unknown"
    summary: str
    node: Optional[str] = None
    rank: Optional[int] = None


@dataclass(frozen=True, slots=True)
class FleetView:
    job: str
    at: float  # the evaluation time of the answers
    nnodes: Optional[int]
    world_size: Optional[int]
    nodes: tuple[FleetNode, ...]
    ranks: tuple[FleetRank, ...]
    findings: tuple[NodeFinding, ...]
    other_jobs: tuple[str, ...] = ()
    job_sizes: tuple[tuple[str, int], ...] = ()  # every job Prometheus knows and its ranks, the most first


# ----------------------------------------------------------------- reading


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text not in (None, "") else None
    except ValueError:
        return None


def _quoted(value: str) -> str:
    """A PromQL string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sel(job: str, **more: str) -> str:
    """`{job="…", …}`: the job's series (and more exact matchers)."""
    return "{" + ",".join(f"{k}={_quoted(v)}" for k, v in {"job": job, **more}.items()) + "}"


def job_sizes(query: Query) -> dict[str, int]:
    """Every job's number of ranks (distinct node and rank: a rank on two GPUs has two series), one query."""
    ranks: dict[str, set[tuple[str, str]]] = {}
    for s in query("gputop_rank_info"):
        job = s.labels.get("job", "")
        if job and job != MACHINE_JOB:
            ranks.setdefault(job, set()).add((s.labels.get("Hostname", "?"), s.labels.get("rank", "")))
    return {job: len(keys) for job, keys in ranks.items()}


def pick_job(query: Query, job: Optional[str], where: str, sizes: dict[str, int]) -> tuple[str, list[Series], tuple[str, ...]]:
    """The job asked for (or the one with the most ranks: `sizes`, from `job_sizes`), its gputop_job_info
    series and the other jobs."""
    infos = query("gputop_job_info")
    jobs = sorted({s.labels.get("job", "") for s in infos} - {"", MACHINE_JOB})
    if not infos and not query("gputop_build_info"):
        raise GputopError(f"Prometheus at {where} holds no gputop series: add each node's `gputop serve` to its scrape_configs")
    if job is None:
        if not jobs:
            raise GputopError(f"Prometheus at {where} has gputop data but no job: no `gputop serve` sees a training job now")
        job = max(jobs, key=lambda j: (sizes.get(j, 0), j))
    elif job not in jobs:
        known = ", ".join(jobs) if jobs else "none"
        raise GputopError(f"no job {job!r} in Prometheus at {where} (jobs there: {known}); give one with --job")
    return job, [s for s in infos if s.labels.get("job") == job], tuple(j for j in jobs if j != job)


def fleet_view(query: Query, job: Optional[str] = None, where: str = "Prometheus") -> FleetView:
    sizes = job_sizes(query)
    job, infos, others = pick_job(query, job, where, sizes)
    sel = _sel(job)
    info_rows = query(f"gputop_rank_info{sel}")
    if not info_rows:
        raise GputopError(f"job {job!r} has no rank series in Prometheus at {where}: gputop serve sees none of its ranks yet")
    at = max(s.at for s in info_rows)
    by_key = _per_rank(query, sel)
    states = {
        (s.labels.get("Hostname", "?"), s.labels.get("rank", "")): s.labels.get("state")
        for s in query(f"gputop_rank_state{sel} == 1")
    }
    ranks: dict[tuple[str, int], FleetRank] = {}
    for row in info_rows:
        node, rank = row.labels.get("Hostname", "?"), _int(row.labels.get("rank"))
        if rank is None:
            continue
        gpu = _int(row.labels.get("gpu"))
        known = ranks.get((node, rank))
        gpus = (known.gpus if known else ()) + ((gpu,) if gpu is not None else ())
        values = by_key.get((node, str(rank)), {})
        ranks[(node, rank)] = FleetRank(
            node=node,
            rank=rank,
            local_rank=_int(row.labels.get("local_rank")),
            node_rank=_int(row.labels.get("node")),
            pid=_int(row.labels.get("pid")),
            gpus=tuple(sorted(set(gpus))),
            state=states.get((node, str(rank))),
            data_wait_ratio=values.get("ratio"),
            data_wait_low=values.get("low"),
            data_wait_high=values.get("high"),
            last_progress=values.get("progress"),
        )
    hosts = sorted({r.node for r in ranks.values()} | {s.labels.get("Hostname", "?") for s in infos})
    node_rank_of = {s.labels.get("Hostname", "?"): _int(s.labels.get("node_rank")) for s in infos}
    nodes = tuple(_node(query, host, node_rank_of.get(host), job) for host in hosts)
    nodes = tuple(sorted(nodes, key=lambda n: (n.node_rank if n.node_rank is not None else 1 << 30, n.hostname)))
    return FleetView(
        job=job,
        at=at,
        nnodes=max((n for n in (_int(s.labels.get("nnodes")) for s in infos) if n is not None), default=None),
        world_size=max((n for n in (_int(s.labels.get("world_size")) for s in infos) if n is not None), default=None),
        nodes=nodes,
        ranks=tuple(sorted(ranks.values(), key=lambda r: (r.rank, r.node))),
        findings=_findings(query, hosts, job),
        other_jobs=others,
        job_sizes=tuple(sorted(((j, sizes.get(j, 0)) for j in (job, *others)), key=lambda item: (-item[1], item[0]))),
    )


def _per_rank(query: Query, sel: str) -> dict[tuple[str, str], dict[str, float]]:
    out: dict[tuple[str, str], dict[str, float]] = {}
    for key, metric in (
        ("ratio", "gputop_rank_data_wait_ratio"),
        ("low", "gputop_rank_data_wait_ratio_lower"),
        ("high", "gputop_rank_data_wait_ratio_upper"),
        ("progress", "gputop_rank_last_progress_timestamp_seconds"),
    ):
        for s in query(f"{metric}{sel}"):
            out.setdefault((s.labels.get("Hostname", "?"), s.labels.get("rank", "")), {})[key] = s.value
    return out


def _node(query: Query, host: str, node_rank: Optional[int], job: str) -> FleetNode:
    hsel = "{Hostname=" + _quoted(host) + "}"
    health = {g: int(s.value) for s in query(f"gputop_gpu_health{hsel}") if (g := _int(s.labels.get("gpu"))) is not None}
    util: dict[int, float] = {}
    for metric in ("gputop_gpu_utilization_percent", "DCGM_FI_DEV_GPU_UTIL"):  # dcgm-exporter's wins where present
        util.update({g: s.value for s in query(f"{metric}{hsel}") if (g := _int(s.labels.get("gpu"))) is not None})
    verdicts = [s.labels.get("verdict") for s in query(f"gputop_verdict{_sel(job, Hostname=host)} == 1")]
    return FleetNode(host, node_rank, tuple(sorted(set(health) | set(util))), util, health, verdicts[0] if verdicts else None)


def _findings(query: Query, hosts: list[str], job: str) -> tuple[NodeFinding, ...]:
    """Each node's infra findings (GPU health rules, degraded links, NICs down) and the job's findings there."""
    found: list[NodeFinding] = []
    wanted = set(hosts)
    for s in query("gputop_gpu_health_problem == 1"):
        host = s.labels.get("Hostname", "?")
        if host in wanted:
            found.append(
                NodeFinding(
                    host,
                    s.labels.get("rule", "?"),
                    s.labels.get("severity", "warning"),
                    "infrastructure",
                    _int(s.labels.get("gpu")),
                )
            )
    for s in query("gputop_gpu_pcie_link_degraded == 1"):
        host = s.labels.get("Hostname", "?")
        if host in wanted and not any(f.node == host and f.gpu == _int(s.labels.get("gpu")) and f.kind == "pcie" for f in found):
            found.append(NodeFinding(host, "pcie", "warning", "infrastructure", _int(s.labels.get("gpu"))))
    # NIC health as each serve's `gputop check` rules judge it (down, below its peers' rate, errors climbing)
    judged_nics = {_nic_key(s) for s in query("gputop_nic_health")}
    for s in query("gputop_nic_health_problem == 1"):
        host, device, port = _nic_key(s)
        if host in wanted:
            rule, severity = s.labels.get("rule", "?"), s.labels.get("severity", "warning")
            found.append(NodeFinding(host, rule, severity, "infrastructure", device=device, port=_int(port)))
    for s in query("gputop_nic_up == 0"):  # a serve older than the NIC judgement exports the port's state only
        host, device, port = _nic_key(s)
        if host in wanted and (host, device, port) not in judged_nics:
            found.append(NodeFinding(host, "nic_down", "critical", "infrastructure", device=device, port=_int(port)))
    for s in query(f"gputop_finding{_sel(job)} == 1") + query(f"gputop_finding{_sel(MACHINE_JOB)} == 1"):
        host = s.labels.get("Hostname", "?")
        if host in wanted and s.labels.get("kind") != "healthy":
            found.append(
                NodeFinding(host, s.labels.get("kind", "?"), s.labels.get("severity", "info"), s.labels.get("label", ""))
            )
    return tuple(found)


def _nic_key(s: Series) -> tuple[str, str, str]:
    return s.labels.get("Hostname", "?"), s.labels.get("device", ""), s.labels.get("port", "")


# ----------------------------------------------------------------- the verdict across nodes


def judge(view: FleetView) -> FleetVerdict:
    """Which node holds the job back: a rank that stopped outside a collective (the others wait for it in
    theirs), else the straggler, else ranks that all hang, else a degraded node, else healthy."""
    stalled = [r for r in view.ranks if r.last_progress is not None and view.at - r.last_progress > STALLED_AFTER_S]
    culprits = [r for r in stalled if r.state != "collective"]
    if stalled and culprits and len(culprits) < len(view.ranks):
        r = culprits[0]
        return FleetVerdict(
            "hung",
            f"rank {r.rank} on {_node_name(view, r)} stopped making progress {view.at - (r.last_progress or view.at):.0f} s ago "
            f"({r.state or 'state unknown'}); the other ranks wait for it",
            r.node,
            r.rank,
        )
    straggler = _straggler(view)
    if straggler is not None:
        r, others = straggler
        return FleetVerdict(
            "straggler",
            f"rank {r.rank} on {_node_name(view, r)} is the straggler: it waits for its data {r.data_wait_ratio or 0.0:.0%} "
            f"of the time, the job's other ranks {others:.0%} (median), and they wait for it in their collectives",
            r.node,
            r.rank,
        )
    hung = [r for r in view.ranks if r.state == "hung"] or stalled
    if hung:
        r = hung[0]
        nodes = sorted({h.node for h in hung})
        return FleetVerdict(
            "hung",
            f"{len(hung)} ranks on {', '.join(nodes)} stopped making progress, rank {r.rank} on {r.node} among them",
            r.node,
            r.rank,
        )
    infra = [f for f in view.findings if f.label == "infrastructure" and f.severity in ("critical", "warning")]
    if infra:
        f = infra[0]
        where = f.part or "the machine"
        return FleetVerdict(
            "infrastructure", f"{f.node} has a degraded part: {f.kind} on {where} (file a ticket for that node)", f.node
        )
    if not any(r.state for r in view.ranks):
        return FleetVerdict("unknown", "no rank's stacks have been read yet: no verdict")
    return FleetVerdict("healthy", f"no node holds the job back: {len(view.ranks)} ranks on {len(view.nodes)} nodes")


def _node_name(view: FleetView, rank: FleetRank) -> str:
    """'gpu-a17 (node 1 of 2)': the host, and its place in the job where the ranks' environment said it."""
    place = next((n.node_rank for n in view.nodes if n.hostname == rank.node), None)
    if place is None:
        return rank.node
    return f"{rank.node} (node {place}" + (f" of {view.nnodes})" if view.nnodes else ")")


def _straggler(view: FleetView) -> Optional[tuple[FleetRank, float]]:
    measured = [r for r in view.ranks if r.data_wait_ratio is not None]
    if len(measured) < 2:
        return None
    top = max(measured, key=lambda r: r.data_wait_ratio or 0.0)
    others = statistics.median(r.data_wait_ratio or 0.0 for r in measured if r is not top)
    share = top.data_wait_ratio or 0.0
    if share >= STRAGGLER_MIN_SHARE and share - others >= STRAGGLER_MIN_GAP:
        return top, others
    return None
