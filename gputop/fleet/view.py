"""One job across nodes, as every node's `gputop serve` exported it to Prometheus, and a verdict across them.

`fleet_view(query, job)` asks Prometheus for the job's series, one query per metric family whatever the
number of nodes (the `job` label is the id every node derives alike: `gputop.fleet.identity`), joins them
by node (the `Hostname` label) and global rank; `outliers()` lists every rank and node that holds the job
back or hides part of it, each with its node and rank: hung ranks, stragglers (a rank that waits for its
data while the others wait for it), nodes that stopped reporting, nodes whose GPUs, links or NICs are
degraded; `judge()` is the worst of them, the verdict."""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional, Sequence

from gputop.errors import GputopError
from gputop.fleet.prometheus import Query, Series

MACHINE_JOB = "machine"  # serve's findings with no job on the GPUs (gputop.exporter.MACHINE_JOB)
# A rank waits for data this much more of the time than the median of the job's others: the straggler.
STRAGGLER_MIN_SHARE = 0.3
STRAGGLER_MIN_GAP = 0.25
# A rank whose main thread last moved this long before the job's newest progress: held up (or hung).
STALLED_AFTER_S = 30.0
# How far back a node of the job that no longer answers is still looked for: Prometheus drops a series from
# instant queries 5 minutes after its last sample (at once when the scrape fails), a range query still has it.
STOPPED_LOOKBACK = "30m"
STOPPED_STEP = "30s"  # ... looked for at these steps: its last sample's time, within a step and a scrape
PARALLEL_QUERIES = 8  # a refresh's queries in flight at once


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
    reporting: bool = True  # False: its serve was scraped within STOPPED_LOOKBACK but is not now
    last_seen: Optional[float] = None  # (not reporting) its last sample's time, Unix seconds


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


# every job's number of ranks (distinct node and rank: a rank on two GPUs has two series), counted by Prometheus
JOB_SIZES = "count by (job) (count by (job, Hostname, rank) (gputop_rank_info))"


def job_sizes(answer: list[Series]) -> dict[str, int]:
    """Every job's number of ranks, from JOB_SIZES's answer (a series a job, whatever the fleet)."""
    return {job: int(s.value) for s in answer if (job := s.labels.get("job", "")) and job != MACHINE_JOB}


def pick_job(
    query: Query, job: Optional[str], where: str, sizes: dict[str, int], infos: list[Series]
) -> tuple[str, list[Series], tuple[str, ...]]:
    """The job asked for (or the one with the most ranks: `sizes`, from `job_sizes`), its gputop_job_info
    series (of `infos`, every job's) and the other jobs."""
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


def _host(s: Series) -> str:
    return s.labels.get("Hostname", "?")


def short_hostname(host: str) -> str:
    """A hostname as the scheduler and the Hostname label may both write it: `gpu-1.cluster` -> `gpu-1`."""
    return host.split(".", 1)[0].lower()


def _ranks(answers: dict[str, list[Series]], info_rows: list[Series]) -> dict[tuple[str, int], FleetRank]:
    """(node, rank) -> the rank, from its info series (one per GPU it uses) and its per-rank answers."""
    by_key = _per_rank(answers)
    states = {(_host(s), s.labels.get("rank", "")): s.labels.get("state") for s in answers["state"]}
    ranks: dict[tuple[str, int], FleetRank] = {}
    for row in info_rows:
        node, rank = _host(row), _int(row.labels.get("rank"))
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
    return ranks


def fleet_view(
    query: Query, job: Optional[str] = None, where: str = "Prometheus", expected_hosts: Sequence[str] = ()
) -> FleetView:
    """The job's view from a fixed number of queries, one per metric family whatever the number of nodes
    (each answer holds every node's series; they are joined here by Hostname and rank).  `expected_hosts`
    (the scheduler's nodes of the job): those with no series of the job at all are nodes not reporting too."""
    sizes_answer, all_infos = ask_together(query, [JOB_SIZES, "gputop_job_info"])
    sizes = job_sizes(sizes_answer)
    job, infos, others = pick_job(query, job, where, sizes, all_infos)
    exprs = job_queries(job)
    answers = dict(zip(exprs, ask_together(query, list(exprs.values()))))
    info_rows = answers["rank_info"]
    if not info_rows:
        raise GputopError(f"job {job!r} has no rank series in Prometheus at {where}: gputop serve sees none of its ranks yet")
    at = max(s.at for s in info_rows)
    ranks = _ranks(answers, info_rows)
    hosts = sorted({r.node for r in ranks.values()} | {_host(s) for s in infos})
    node_rank_of = {_host(s): _int(s.labels.get("node_rank")) for s in infos}
    nodes = _nodes(answers, hosts, node_rank_of)
    # nodes of the job seen in the last STOPPED_LOOKBACK but not now: their serve stopped being scraped
    seen = {_host(s): s for s in answers["seen"]}
    current = set(hosts)
    nodes += tuple(
        FleetNode(host, _int(s.labels.get("node_rank")), reporting=False, last_seen=s.value)
        for host, s in sorted(seen.items())
        if host not in current
    )
    reported = {short_hostname(n.hostname) for n in nodes}
    nodes += tuple(FleetNode(host, reporting=False) for host in expected_hosts if short_hostname(host) not in reported)
    nodes = tuple(sorted(nodes, key=lambda n: (n.node_rank if n.node_rank is not None else 1 << 30, n.hostname)))
    return FleetView(
        job=job,
        at=at,
        nnodes=max((n for n in (_int(s.labels.get("nnodes")) for s in infos) if n is not None), default=None),
        world_size=max((n for n in (_int(s.labels.get("world_size")) for s in infos) if n is not None), default=None),
        nodes=nodes,
        ranks=tuple(sorted(ranks.values(), key=lambda r: (r.rank, r.node))),
        findings=_findings(answers, hosts),
        other_jobs=others,
        job_sizes=tuple(sorted(((j, sizes.get(j, 0)) for j in (job, *others)), key=lambda item: (-item[1], item[0]))),
    )


def job_queries(job: str) -> dict[str, str]:
    """Every query a view of `job` asks beyond the first two, by what it is for: one per metric family, each
    answered for all the job's nodes at once.  The machine-wide families are kept to the job's nodes by
    Prometheus (`and on (Hostname)` the job's gputop_job_info), so a Prometheus that scrapes a whole cluster
    answers with the job's nodes only."""
    sel = _sel(job)
    on_job_nodes = f" and on (Hostname) gputop_job_info{sel}"
    return {
        "rank_info": f"gputop_rank_info{sel}",
        "ratio": f"gputop_rank_data_wait_ratio{sel}",
        "low": f"gputop_rank_data_wait_ratio_lower{sel}",
        "high": f"gputop_rank_data_wait_ratio_upper{sel}",
        "progress": f"gputop_rank_last_progress_timestamp_seconds{sel}",
        "state": f"gputop_rank_state{sel} == 1",
        "health": "gputop_gpu_health" + on_job_nodes,
        "util": "gputop_gpu_utilization_percent" + on_job_nodes,
        "dcgm_util": "DCGM_FI_DEV_GPU_UTIL" + on_job_nodes,
        "verdict": f"gputop_verdict{sel} == 1",
        # the job's nodes seen in the last STOPPED_LOOKBACK but not now, each with its last sample's time (a
        # subquery's steps: a vector a node, not a range's every sample, ~1 MB at 256 nodes scraped every 15 s)
        "seen": f"max_over_time(timestamp(gputop_job_info{sel})[{STOPPED_LOOKBACK}:{STOPPED_STEP}])"
        f" unless on (Hostname) gputop_job_info{sel}",
        "gpu_problem": "gputop_gpu_health_problem == 1" + on_job_nodes,
        "pcie": "gputop_gpu_pcie_link_degraded == 1" + on_job_nodes,
        "nic_health": "gputop_nic_health" + on_job_nodes,
        "nic_problem": "gputop_nic_health_problem == 1" + on_job_nodes,
        "nic_down": "gputop_nic_up == 0" + on_job_nodes,
        "finding": f"gputop_finding{sel} == 1",
        "machine_finding": f"gputop_finding{_sel(MACHINE_JOB)} == 1" + on_job_nodes,
    }


def ask_together(query: Query, exprs: list[str]) -> list[list[Series]]:
    """Every query at once, on threads: Prometheus evaluates them side by side, so a refresh waits for the
    slowest answer rather than the sum of them (the first failure is raised, as one line)."""
    with ThreadPoolExecutor(max_workers=min(PARALLEL_QUERIES, len(exprs)), thread_name_prefix="gputop-prom") as pool:
        return list(pool.map(query, exprs))


def _per_rank(answers: dict[str, list[Series]]) -> dict[tuple[str, str], dict[str, float]]:
    out: dict[tuple[str, str], dict[str, float]] = {}
    for key in ("ratio", "low", "high", "progress"):
        for s in answers[key]:
            out.setdefault((_host(s), s.labels.get("rank", "")), {})[key] = s.value
    return out


def _per_gpu(series: list[Series], wanted: set[str]) -> dict[str, dict[int, float]]:
    """Hostname -> GPU index -> value, for the wanted hosts."""
    out: dict[str, dict[int, float]] = {}
    for s in series:
        host, gpu = _host(s), _int(s.labels.get("gpu"))
        if host in wanted and gpu is not None:
            out.setdefault(host, {})[gpu] = s.value
    return out


def _nodes(answers: dict[str, list[Series]], hosts: list[str], node_rank_of: dict[str, Optional[int]]) -> tuple[FleetNode, ...]:
    """Every node's GPUs, their utilization and health and its own verdict: one query per metric for all
    nodes (a per-node `{Hostname=…}` query would be 4 round trips a node, ~1,000 a refresh at 256)."""
    wanted = set(hosts)
    health = _per_gpu(answers["health"], wanted)
    util = _per_gpu(answers["util"], wanted)
    for host, values in _per_gpu(answers["dcgm_util"], wanted).items():  # dcgm-exporter's wins where present
        util.setdefault(host, {}).update(values)
    verdicts: dict[str, str] = {}
    for s in answers["verdict"]:
        verdicts.setdefault(_host(s), s.labels.get("verdict", ""))
    nodes = []
    for host in hosts:
        h = {g: int(v) for g, v in health.get(host, {}).items()}
        u = util.get(host, {})
        nodes.append(FleetNode(host, node_rank_of.get(host), tuple(sorted(set(h) | set(u))), u, h, verdicts.get(host)))
    return tuple(nodes)


def _findings(answers: dict[str, list[Series]], hosts: list[str]) -> tuple[NodeFinding, ...]:
    """Each node's infra findings (GPU health rules, degraded links, NICs down) and the job's findings there."""
    found: list[NodeFinding] = []
    wanted = set(hosts)
    for s in answers["gpu_problem"]:
        host = _host(s)
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
    pcie_named = {(f.node, f.gpu) for f in found if f.kind == "pcie"}
    for s in answers["pcie"]:
        host, gpu = _host(s), _int(s.labels.get("gpu"))
        if host in wanted and (host, gpu) not in pcie_named:
            found.append(NodeFinding(host, "pcie", "warning", "infrastructure", gpu))
    # NIC health as each serve's `gputop check` rules judge it (down, below its peers' rate, errors climbing)
    judged_nics = {_nic_key(s) for s in answers["nic_health"]}
    for s in answers["nic_problem"]:
        host, device, port = _nic_key(s)
        if host in wanted:
            rule, severity = s.labels.get("rule", "?"), s.labels.get("severity", "warning")
            found.append(NodeFinding(host, rule, severity, "infrastructure", device=device, port=_int(port)))
    for s in answers["nic_down"]:  # a serve older than the NIC judgement exports the port's state only
        host, device, port = _nic_key(s)
        if host in wanted and (host, device, port) not in judged_nics:
            found.append(NodeFinding(host, "nic_down", "critical", "infrastructure", device=device, port=_int(port)))
    for s in answers["finding"] + answers["machine_finding"]:
        host = _host(s)
        if host in wanted and s.labels.get("kind") != "healthy":
            found.append(
                NodeFinding(host, s.labels.get("kind", "?"), s.labels.get("severity", "info"), s.labels.get("label", ""))
            )
    return tuple(found)


def _nic_key(s: Series) -> tuple[str, str, str]:
    return s.labels.get("Hostname", "?"), s.labels.get("device", ""), s.labels.get("port", "")


# ----------------------------------------------------------------- the verdict across nodes


def _node_outliers(view: FleetView) -> list[FleetVerdict]:
    """The nodes that stopped reporting, then those with a degraded part (a critical one first)."""
    found: list[FleetVerdict] = []
    for node in view.nodes:
        if not node.reporting:
            if node.last_seen is None:
                said = f"Prometheus has no gputop series of it in the last {STOPPED_LOOKBACK}, though the job runs there"
            else:
                said = f"Prometheus last scraped its gputop serve {max(0.0, view.at - node.last_seen):.0f} s ago"
            found.append(
                FleetVerdict(
                    "stopped_reporting",
                    f"{node.hostname} stopped reporting: {said}; its ranks are not in this view",
                    node.hostname,
                )
            )
    infra: dict[str, list[NodeFinding]] = {}
    for f in view.findings:
        if f.label == "infrastructure" and f.severity in ("critical", "warning"):
            infra.setdefault(f.node, []).append(f)
    for node_name, parts in sorted(infra.items(), key=lambda item: (not any(f.severity == "critical" for f in item[1]), item[0])):
        f = min(parts, key=lambda f: f.severity != "critical")
        kinds = len({p.kind for p in parts})  # a NIC down is both its serve's NIC rule and its own finding
        more = f" and {_more_findings(kinds - 1)}" if kinds > 1 else ""
        found.append(
            FleetVerdict(
                "infrastructure",
                f"{node_name} has a degraded part: {f.kind} on {f.part or 'the machine'}{more} (file a ticket for that node)",
                node_name,
            )
        )
    return found


def outliers(view: FleetView) -> tuple[FleetVerdict, ...]:
    """Everything that holds the job back or hides part of it, the worst first: the ranks that stopped outside
    a collective while the others wait for them (`hung`), the stragglers, ranks that all hang, the nodes whose
    serve stopped being scraped (`stopped_reporting`), the nodes with a degraded part (`infrastructure`).
    `judge` is the first of them."""
    found: list[FleetVerdict] = []
    stalled = [r for r in view.ranks if r.last_progress is not None and view.at - r.last_progress > STALLED_AFTER_S]
    culprits = [r for r in stalled if r.state != "collective"]
    if culprits and len(culprits) < len(view.ranks):
        for r in culprits:
            found.append(
                FleetVerdict(
                    "hung",
                    f"rank {r.rank} on {_node_name(view, r)} stopped making progress {view.at - (r.last_progress or view.at):.0f} s ago "
                    f"({r.state or 'state unknown'}); the other ranks wait for it",
                    r.node,
                    r.rank,
                )
            )
    stragglers, others = _stragglers(view)
    for r in stragglers:
        found.append(
            FleetVerdict(
                "straggler",
                f"rank {r.rank} on {_node_name(view, r)} is the straggler: it waits for its data {r.data_wait_ratio or 0.0:.0%} "
                f"of the time, the job's other ranks {others:.0%} (median), and they wait for it in their collectives",
                r.node,
                r.rank,
            )
        )
    hung = [r for r in view.ranks if r.state == "hung"] or stalled
    if hung and not found:
        r = hung[0]
        nodes = sorted({h.node for h in hung})
        found.append(
            FleetVerdict(
                "hung",
                f"{len(hung)} ranks on {_listed(nodes)} stopped making progress, rank {r.rank} on {r.node} among them",
                r.node,
                r.rank,
            )
        )
    found += _node_outliers(view)
    return tuple(found)


def _more_findings(count: int) -> str:
    return f"{count} more finding" + ("" if count == 1 else "s")


def _listed(names: list[str], shown: int = 4) -> str:
    """'a, b, c' or 'a, b, c, d and 12 more'."""
    if len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown]) + f" and {len(names) - shown} more"


def judge(view: FleetView) -> FleetVerdict:
    """Which node holds the job back: a rank that stopped outside a collective (the others wait for it in
    theirs), else the straggler, else ranks that all hang, else a node that stopped reporting, else a
    degraded node, else healthy."""
    found = outliers(view)
    if found:
        return found[0]
    if not any(r.state for r in view.ranks):
        return FleetVerdict("unknown", "no rank's stacks have been read yet: no verdict")
    return FleetVerdict("healthy", f"no node holds the job back: {len(view.ranks)} ranks on {len(view.nodes)} nodes")


def _node_name(view: FleetView, rank: FleetRank) -> str:
    """'gpu-a17 (node 1 of 2)': the host, and its place in the job where the ranks' environment said it."""
    place = next((n.node_rank for n in view.nodes if n.hostname == rank.node), None)
    if place is None:
        return rank.node
    return f"{rank.node} (node {place}" + (f" of {view.nnodes})" if view.nnodes else ")")


def _stragglers(view: FleetView) -> tuple[list[FleetRank], float]:
    """The ranks that wait for their data at least STRAGGLER_MIN_SHARE of the time and STRAGGLER_MIN_GAP more
    than the median of the job's others, the most waiting first; and the median of the ranks that do not."""
    measured = [r for r in view.ranks if r.data_wait_ratio is not None]
    if len(measured) < 2:
        return [], 0.0
    ordered = sorted(measured, key=lambda r: -(r.data_wait_ratio or 0.0))
    baseline = statistics.median(r.data_wait_ratio or 0.0 for r in ordered[1:])
    slow = [
        r
        for r in ordered
        if (r.data_wait_ratio or 0.0) >= STRAGGLER_MIN_SHARE and (r.data_wait_ratio or 0.0) - baseline >= STRAGGLER_MIN_GAP
    ]
    rest = [r.data_wait_ratio or 0.0 for r in ordered if r not in slow]
    return slow, statistics.median(rest) if rest else baseline


# ----------------------------------------------------------------- outliers first (the screen and the report)


def _worst_wait(view: FleetView) -> dict[str, float]:
    worst: dict[str, float] = {}
    for r in view.ranks:
        if r.data_wait_ratio is not None:
            worst[r.node] = max(worst.get(r.node, 0.0), r.data_wait_ratio)
    return worst


def nodes_outliers_first(view: FleetView, found: tuple[FleetVerdict, ...]) -> list[FleetNode]:
    """The nodes the outliers name (in their order), then those with an unhealthy GPU or a finding of their
    own, then the most waiting for their data; the job's node order among equals."""
    named: dict[str, int] = {}
    for i, verdict in enumerate(found):
        if verdict.node is not None:
            named.setdefault(verdict.node, i)
    flagged = {f.node for f in view.findings if f.severity in ("critical", "warning")}
    worst = _worst_wait(view)
    return sorted(
        view.nodes,
        key=lambda n: (
            named.get(n.hostname, len(found)),
            not (any(n.gpu_health.values()) or n.hostname in flagged),
            -worst.get(n.hostname, 0.0),
            n.node_rank if n.node_rank is not None else 1 << 30,
            n.hostname,
        ),
    )


def ranks_outliers_first(view: FleetView, found: tuple[FleetVerdict, ...]) -> list[FleetRank]:
    """The ranks the outliers name, then the stalled (oldest progress first), then the most waiting for data."""
    named = {(v.node, v.rank): i for i, v in reversed(list(enumerate(found))) if v.rank is not None}

    def age(r: FleetRank) -> float:
        return 0.0 if r.last_progress is None else view.at - r.last_progress

    return sorted(
        view.ranks,
        key=lambda r: (
            named.get((r.node, r.rank), len(found)),
            -(age(r) if age(r) > STALLED_AFTER_S else 0.0),
            -(r.data_wait_ratio or 0.0),
            r.rank,
        ),
    )


def grouped_findings(findings: tuple[NodeFinding, ...]) -> list[tuple[NodeFinding, list[str]]]:
    """The findings, one per part, kind, severity and label, with the nodes that report it (a finding every
    node's serve reports alike, such as `remote_wait`, is one entry, not 255)."""
    groups: dict[tuple[str, str, str, str], tuple[NodeFinding, list[str]]] = {}
    for f in findings:
        groups.setdefault((f.part, f.kind, f.severity, f.label), (f, []))[1].append(f.node)
    return list(groups.values())


def rank_ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 3, 6] -> '0–3,6'."""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ",".join(str(a) if a == b else f"{a}–{b}" for a, b in spans) or "-"
