"""One job across nodes: the job identity every node's exporter derives alike, and `gputop report
--prometheus`'s cross-node view and verdict.

The quick tests feed two real Exporters ("node0", "node1") with built histories of one 8-rank job, parse
what each would serve, and answer the report's instant queries from the union, as a Prometheus scraping
both would (`PromLike`, a tiny evaluator of just the selectors the report asks).  The slow test runs
the real thing: two torchrun agents, two `gputop serve`, a real Prometheus."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gputop.analysis.stack_classes import COLLECTIVE, FORWARD_BACKWARD, WAITING_FOR_DATA
from gputop.cli import main
from gputop.commands.fleet_report import build
from gputop.errors import GputopError
from gputop.exporter import Exporter
from gputop.fleet.identity import cross_node_job_id, node_place
from gputop.fleet.prometheus import PrometheusApi, Series
from gputop.fleet.view import fleet_view, judge
from gputop.history import History
from gputop.model import CollectiveEntry, FlightRecord, Snapshot
from tests.harness import fleet_scale, train_jobs
from tests.harness import histories as hb
from tests.harness.processes import free_port, wait_until

RUN_ID = "llama-run-42"
RANKS_PER_NODE = 4


# ----------------------------------------------------------------- the identity


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "7", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, "abc"),
        ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}, "slurm-7.0"),
        ({"SLURM_JOB_ID": "7"}, "slurm-7"),
        ({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, "10.0.0.1:29500"),
        ({"MASTER_ADDR": "10.0.0.1"}, None),  # no port: nothing every node shares for sure
        ({}, None),
    ],
)
def test_the_job_id_is_what_every_node_derives_alike(env, expected):
    assert cross_node_job_id(env) == expected


def test_the_node_place_from_torchrun_slurm_and_the_world_over_the_local_world():
    torchrun = node_place({"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "r"})
    assert (torchrun.job_id, torchrun.node_rank, torchrun.nnodes) == ("r", 1, 2)
    slurm = node_place({"SLURM_NODEID": "3", "SLURM_NNODES": "4", "SLURM_JOB_ID": "9"})
    assert (slurm.node_rank, slurm.nnodes) == (3, 4)
    assert node_place({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}).nnodes == 2
    assert node_place({"WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"}).nnodes is None


# ----------------------------------------------------------------- two nodes' exporters, one Prometheus-like view


class NodeSource:
    """A pipeline stand-in: a built history's snapshots, the job's ranks placed on `node` of two."""

    def __init__(
        self, history: History, node: int, nic_spec: Optional[str] = None, records: Optional[Callable[[int], FlightRecord]] = None
    ) -> None:
        self.machine = history.machine
        self.snaps = [self._placed(s, node) for s in history]
        if nic_spec is not None:
            self.snaps = self._with_nics(self.snaps, nic_spec)
        if records is not None:  # each rank's flight recorder, by its global rank
            self.snaps = [self._with_records(s, records) for s in self.snaps]
        self.i = 0

    @staticmethod
    def _with_records(snap, records: Callable[[int], FlightRecord]):
        if snap.job is None:
            return snap
        recs = tuple(replace(records(r.rank), pid=r.proc.pid, rank=r.rank) for r in snap.job.ranks)
        return replace(snap, job=replace(snap.job, flight_records=recs))

    @staticmethod
    def _with_nics(snaps: list[Snapshot], spec: str) -> list[Snapshot]:
        return fleet_scale.with_nics(snaps, spec)

    @staticmethod
    def _placed(snap, node: int):
        if snap.job is None:
            return snap
        ranks = tuple(
            replace(
                r,
                rank=node * RANKS_PER_NODE + r.rank,
                local_rank=r.rank,
                world_size=2 * RANKS_PER_NODE,
                job_id=RUN_ID,
                node_rank=node,
                nnodes=2,
            )
            for r in snap.job.ranks
        )
        return replace(snap, job=replace(snap.job, ranks=ranks))

    def poll(self):
        snap = self.snaps[self.i]
        self.i += 1
        return snap

    def close(self) -> None:
        pass


def node_exporter(
    node: int,
    states: dict[int, Callable[[float], str]],
    seconds: float = 60.0,
    cpu: Callable[[float], float] = lambda t: 30.0,
    nic_spec: Optional[str] = None,
    records: Optional[Callable[[int], FlightRecord]] = None,
    **scenario,
) -> Exporter:
    """Node `node`'s serve after `seconds` of the job: local rank i runs `states[i]` (default: computing
    and meeting the others in a collective); with `nic_spec`, the NICs of that simulated machine."""
    default = hb.cycle([FORWARD_BACKWARD, COLLECTIVE])
    specs = [hb.RankSpec(pid=1000 + i, rank=i, gpus=(i,), state=states.get(i, default), cpu=cpu) for i in range(RANKS_PER_NODE)]
    source = NodeSource(hb.build(hb.Scenario(seconds=seconds, ranks=specs, **scenario)), node, nic_spec, records)
    exporter = Exporter(source, interval=1.0, hostname=f"node{node}", log=lambda line: None)
    for _ in source.snaps:
        exporter.cycle()
    return exporter


def exposition(exporter: Exporter) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return generate_latest(registry).decode()


_SELECTOR = re.compile(r"^(\w+)(?:\{(.*)\})?(?:\[(\w+)\])?(?:\s*==\s*(\d+))?$")
_LAST_SEEN = re.compile(r"^max_over_time\(timestamp\((.+)\)\[(\w+):\w+\]\)$")
_COUNT_BY_JOB = re.compile(r"^count by \(job\) \(count by \(job, Hostname, rank\) \((\w+)\)\)$")
_MATCHER = re.compile(r'(\w+)(=~|=)"((?:[^"\\]|\\.)*)"')


class PromLike:
    """Instant queries over the samples of several exporters, as Prometheus with honor_labels answers
    them: a metric, label matchers (= and =~), `A and/unless on (Hostname) B`, the job sizes' nested count, the
    last-seen subquery, an optional range (`[30m]`: the `earlier` samples too, each
    series' last) and an optional `== N` filter; nothing more.  `samples` are more samples now, beside the
    pages'; `earlier` samples (name, labels, value, time) only a range query sees.  `asked` keeps every query."""

    def __init__(
        self,
        texts: list[str],
        at: float,
        *,
        samples: Sequence[tuple[str, dict[str, str], float]] = (),
        earlier: Sequence[tuple[str, dict[str, str], float, float]] = (),
    ) -> None:
        self.samples = [(name, labels, value, at) for name, labels, value in (*_samples(texts), *samples)]
        self.earlier = list(earlier)
        self.at = at
        self.asked: list[str] = []

    def __call__(self, expr: str) -> list[Series]:
        self.asked.append(expr)
        return self._answer(expr)

    def _answer(self, expr: str) -> list[Series]:
        for op, keep in ((" and on (Hostname) ", True), (" unless on (Hostname) ", False)):
            if op in expr:  # the left side's series on (or not on) the right side's nodes
                left, right = expr.split(op)
                hosts = {s.labels.get("Hostname") for s in self._answer(right)}
                return [s for s in self._answer(left) if (s.labels.get("Hostname") in hosts) == keep]
        last = _LAST_SEEN.match(expr)
        if last:  # max_over_time(timestamp(SELECTOR)[W:STEP]): each series' last sample time, now or earlier
            return [Series(s.labels, s.at, self.at) for s in self._answer(f"{last.group(1)}[{last.group(2)}]")]
        counted = _COUNT_BY_JOB.match(expr)
        if counted:  # count by (job) (count by (job, Hostname, rank) (METRIC)): distinct ranks per job
            per_job: dict[str, set[tuple[str, str]]] = {}
            for s in self._answer(counted.group(1)):
                per_job.setdefault(s.labels.get("job", ""), set()).add((s.labels.get("Hostname", ""), s.labels.get("rank", "")))
            return [Series({"job": job}, float(len(keys)), self.at) for job, keys in per_job.items()]
        match = _SELECTOR.match(expr.strip())
        assert match, f"the report asked what this stand-in cannot answer: {expr}"
        name, matchers, window, equals = match.groups()
        wanted = _MATCHER.findall(matchers or "")
        last: dict[tuple, Series] = {}
        for sample_name, labels, value, t in (self.earlier if window else []) + self.samples:
            if sample_name != name or (equals is not None and value != float(equals)):
                continue
            if all(
                re.fullmatch(pattern, labels.get(key, "")) if op == "=~" else labels.get(key, "") == pattern
                for key, op, pattern in wanted
            ):
                last[tuple(sorted(labels.items()))] = Series(labels, value, t)
        return list(last.values())


def _samples(texts: list[str]) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), s.value) for text in texts for f in text_string_to_metric_families(text) for s in f.samples]


def two_nodes(node1_states: dict[int, Callable[[float], str]], **node1_scenario) -> PromLike:
    node0 = node_exporter(0, {})
    node1 = node_exporter(1, node1_states, **node1_scenario)
    return PromLike([exposition(node0), exposition(node1)], at=hb.T0 + 60.0)


def test_both_nodes_export_one_job_label_and_the_global_ranks():
    prom = two_nodes({})
    infos = prom("gputop_job_info")
    assert {s.labels["job"] for s in infos} == {RUN_ID}
    assert {(s.labels["Hostname"], s.labels["node_rank"], s.labels["nnodes"]) for s in infos} == {
        ("node0", "0", "2"),
        ("node1", "1", "2"),
    }
    ranks = {(s.labels["Hostname"], s.labels["rank"], s.labels["local_rank"], s.labels["node"]) for s in prom("gputop_rank_info")}
    assert ranks == {(f"node{i // 4}", str(i), str(i % 4), str(i // 4)) for i in range(8)}


def test_the_report_names_the_straggling_rank_and_its_node():
    slow_loader = hb.cycle([WAITING_FOR_DATA, WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD])
    prom = two_nodes({1: slow_loader})  # global rank 5, on node1
    data = json.loads(build(prom, "http://prometheus.test", None, "json"))
    assert data["job"] == RUN_ID
    assert sorted((r["node"], r["rank"]) for r in data["ranks"]) == [(f"node{i // 4}", i) for i in range(8)]
    assert [n["node"] for n in data["nodes"]] == ["node0", "node1"]
    assert data["verdict"]["kind"] == "straggler"
    assert (data["verdict"]["node"], data["verdict"]["rank"]) == ("node1", 5)
    assert "rank 5 on node1 (node 1 of 2) is the straggler" in data["verdict"]["summary"]
    waits = {r["rank"]: r["data_wait_ratio"] for r in data["ranks"]}
    assert waits[5] == pytest.approx(0.75, abs=0.1) and max(w for r, w in waits.items() if r != 5) < 0.1
    text = build(prom, "http://prometheus.test", RUN_ID, "md")
    assert "| 5 | node1 | 1 |" in text and "**Verdict (straggler):** rank 5 on node1 (node 1 of 2)" in text


def test_a_rank_stopped_outside_a_collective_is_named_with_its_node_not_the_waiting_ones():
    """Global rank 6 (node1) stops in its forward pass at t=20; every other rank, on both nodes, waits for it
    in a collective: the report names rank 6 and node1, never the waiting node0."""
    still = hb.cycle([FORWARD_BACKWARD, COLLECTIVE])

    def waits_from_20(t: float) -> str:
        return still(t) if t < 20 else COLLECTIVE

    def frozen_from_20(t: float) -> float:
        return 30.0 if t < 20 else 0.0  # a frozen process burns no CPU

    def idle_from_20(gpu: int, t: float) -> float:
        return 95.0 if t < 20 else 0.0

    node0 = node_exporter(0, dict.fromkeys(range(4), waits_from_20), cpu=frozen_from_20, util=idle_from_20)
    node1_states = {0: waits_from_20, 1: waits_from_20, 2: lambda t: FORWARD_BACKWARD, 3: waits_from_20}
    node1 = node_exporter(1, node1_states, cpu=frozen_from_20, util=idle_from_20)
    prom = PromLike([exposition(node0), exposition(node1)], at=hb.T0 + 60.0)
    verdict = judge(fleet_view(prom))
    assert (verdict.kind, verdict.node, verdict.rank) == ("hung", "node1", 6), verdict
    assert "rank 6 on node1 (node 1 of 2) stopped making progress" in verdict.summary
    # node0's own diagnosis: its ranks wait for a rank on another node, not a hang there
    kinds = {(s.labels["Hostname"], s.labels["kind"]) for s in prom("gputop_finding == 1")}
    assert ("node0", "remote_holdup") in kinds and ("node0", "hang") not in kinds, kinds


def _all_reduce(seq: int, done: bool) -> CollectiveEntry:
    return CollectiveEntry(
        seq, "gloo:all_reduce", "0", "default_pg", ((1024,),), ("Float",), "completed" if done else "scheduled", done, hb.T0 + 20
    )


def test_the_rank_missing_from_the_collective_is_named_with_its_node_from_the_flight_recorders():
    """Global rank 6 (node1) stops in its own code at t=20 before all-reduce #4; the recorders of the seven
    others hold #4 pending: `report --prometheus` and `gputop fleet` (the same verdict) name the collective,
    rank 6 and node1, and no other rank."""
    still = hb.cycle([FORWARD_BACKWARD, COLLECTIVE])

    def waits_from_20(t: float) -> str:
        return still(t) if t < 20 else COLLECTIVE

    def record(rank: int) -> FlightRecord:
        entries = (_all_reduce(3, True),) + (() if rank == 6 else (_all_reduce(4, False),))
        return FlightRecord(0, rank, "an in-process read", entries=entries, groups=(("0", tuple(range(8))),))

    frozen = {"cpu": lambda t: 30.0 if t < 20 else 0.0, "util": lambda gpu, t: 95.0 if t < 20 else 0.0, "records": record}
    node0 = node_exporter(0, dict.fromkeys(range(4), waits_from_20), **frozen)
    node1 = node_exporter(1, {0: waits_from_20, 1: waits_from_20, 2: lambda t: FORWARD_BACKWARD, 3: waits_from_20}, **frozen)
    prom = PromLike([exposition(node0), exposition(node1)], at=hb.T0 + 60.0)
    verdict = judge(fleet_view(prom))
    assert (verdict.kind, verdict.node, verdict.rank) == ("hung", "node1", 6), verdict
    assert verdict.summary == (
        "gloo:all_reduce #4 (process group 0): 7 rank(s) wait in it; rank 6 on node1 (node 1 of 2) never entered it"
    )
    data = json.loads(build(prom, "http://prometheus.test", None, "json"))
    assert [(o["node"], o["rank"]) for o in data["outliers"]] == [("node1", 6)]  # not named twice, no waiting rank named
    assert "never entered it" in build(prom, "http://prometheus.test", RUN_ID, "md")


def test_ranks_a_collective_apart_in_a_moving_job_name_no_one():
    # a scrape caught rank 6 a step behind the others, but no rank has stopped: nobody is missing
    def record(rank: int) -> FlightRecord:
        entries = (_all_reduce(3, True),) + (() if rank == 6 else (_all_reduce(4, False),))
        return FlightRecord(0, rank, "an in-process read", entries=entries)

    prom = PromLike([exposition(node_exporter(n, {}, records=record)) for n in (0, 1)], at=hb.T0 + 60.0)
    assert judge(fleet_view(prom)).kind == "healthy"


def test_a_node_with_a_degraded_link_is_named_when_no_rank_holds_the_job_back():
    from gputop.model import PcieLink

    def degraded_gpu_2(gpu: int, t: float) -> dict:
        return {"pcie": PcieLink(3, 5, 16, 16)} if gpu == 2 else {}  # Gen3 of Gen5 under load

    node0 = node_exporter(0, {})
    node1 = node_exporter(1, {}, gpu_extra=degraded_gpu_2)
    view = fleet_view(PromLike([exposition(node0), exposition(node1)], at=hb.T0 + 60.0))
    assert {(f.node, f.gpu) for f in view.findings if f.label == "infrastructure"} >= {("node1", 2)}
    assert not [f for f in view.findings if f.node == "node0" and f.label == "infrastructure"]
    verdict = judge(view)
    assert (verdict.kind, verdict.node) == ("infrastructure", "node1"), verdict
    assert "GPU 2" in verdict.summary


def test_a_nic_trained_below_its_peers_is_named_with_its_node():
    """node0's mlx5_3 trained to 200 Gb/s where its peers run 400 (`gputop check`'s nic.rate), node1 healthy:
    the report names node0 and the port, and nothing on node1, in its findings and its verdict."""
    node0 = node_exporter(0, {}, nic_spec="h100-sxm-8+nic-rate=mlx5_3:200")
    node1 = node_exporter(1, {}, nic_spec="h100-sxm-8")
    texts = [exposition(node0), exposition(node1)]
    assert (
        "gputop_nic_health_problem" in texts[0] and 'gputop_nic_health{Hostname="node1",device="mlx5_0",port="1"} 0.0' in texts[1]
    )
    prom = PromLike(texts, at=hb.T0 + 60.0)
    data = json.loads(build(prom, "http://prometheus.test", None, "json"))
    nic_findings = [f for f in data["findings"] if f["device"]]
    assert [(f["node"], f["device"], f["port"], f["kind"], f["severity"]) for f in nic_findings] == [
        ("node0", "mlx5_3", 1, "nic_rate", "critical")
    ], data["findings"]
    assert data["verdict"]["kind"] == "infrastructure" and data["verdict"]["node"] == "node0", data["verdict"]
    assert "NIC mlx5_3 port 1" in data["verdict"]["summary"]
    text = build(prom, "http://prometheus.test", RUN_ID, "md")
    assert "- **node0** NIC mlx5_3 port 1: nic_rate (critical, infrastructure)" in text
    # `gputop fleet`'s findings panel: the same line, with the node and the port
    from gputop.tui.fleet_app import findings_text

    assert "node0 NIC mlx5_3 port 1: nic_rate (critical, infrastructure)" in findings_text(fleet_view(prom)).plain


def test_a_nic_down_from_a_serve_without_the_nic_judgement_is_still_named():
    """An older serve exports gputop_nic_up only: a port down there is still a finding of its node."""
    node0 = node_exporter(0, {})
    old_serve = '# TYPE gputop_nic_up gauge\ngputop_nic_up{device="mlx5_1",port="1",Hostname="node1"} 0.0\n'
    view = fleet_view(PromLike([exposition(node0), exposition(node_exporter(1, {})) + old_serve], at=hb.T0 + 60.0))
    assert [(f.node, f.kind, f.part) for f in view.findings if f.device] == [("node1", "nic_down", "NIC mlx5_1 port 1")]
    assert (judge(view).kind, judge(view).node) == ("infrastructure", "node1")


def test_one_line_errors_for_an_unknown_job_and_a_prometheus_without_gputop():
    prom = two_nodes({})
    with pytest.raises(GputopError, match=rf"no job 'other' in Prometheus at P \(jobs there: {RUN_ID}\)"):
        fleet_view(prom, "other", where="P")
    empty = PromLike([], at=hb.T0)
    with pytest.raises(GputopError, match="holds no gputop series: add each node's `gputop serve` to its scrape_configs"):
        fleet_view(empty, None, where="P")


def test_an_unreachable_prometheus_is_one_line(capsys):
    port = free_port()  # nothing listens there
    assert main(["report", "--prometheus", f"127.0.0.1:{port}", "--format", "json"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gputop: cannot reach Prometheus at http://127.0.0.1:{port}: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    with pytest.raises(GputopError, match="cannot reach Prometheus"):
        PrometheusApi(f"http://127.0.0.1:{port}").query("up")


def test_report_prometheus_refuses_a_live_target(capsys):
    assert main(["report", "--prometheus", "http://127.0.0.1:9", "--pid", "1"]) == 2
    assert "drop --pid" in capsys.readouterr().err


# ----------------------------------------------------------------- the real thing: two nodes on one machine

PROMETHEUS = shutil.which("prometheus")
SLOW_RANK = 3  # global rank 3 of 4: the second of node rank 1's two ranks
NODE0_MACHINE = "h100-sxm-8+nic-rate=mlx5_3:200"  # node 0's rail 3 trained to half rate: named with its node
RUN_ID_LIVE = "fleet-two-nodes"


def dashboard_queries() -> list[str]:
    dashboard = json.loads((Path(__file__).resolve().parent.parent / "contrib" / "grafana" / "gputop.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]


def torchrun_agent(rdzv_port: int, node_rank: int, ready: Path, *options: str, job: str = train_jobs.JOB) -> list[str]:
    """One "node" of a 2-node job: a torchrun agent with c10d rendezvous on loopback, two CPU gloo ranks."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--node-rank",
        str(node_rank),
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{rdzv_port}",
        "--rdzv-id",
        RUN_ID_LIVE,
        "--max-restarts",
        "0",
        job,
        *options,
        "--ready",
        str(ready),
    ]


def group_rank_of(rank_pid: int) -> int:
    """The node rank torchrun's rendezvous gave this rank's agent (c10d orders the nodes as they join)."""
    environ = Path(f"/proc/{rank_pid}/environ").read_bytes().split(b"\0")
    return int(dict(item.decode().split("=", 1) for item in environ if b"=" in item)["GROUP_RANK"])


def start_prometheus(spawn, tmp_path: Path, targets: list[str]) -> str:
    """A real Prometheus on loopback scraping `targets` every second (honor_labels: Hostname is gputop's)."""
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: gputop\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: [{', '.join(repr(t) for t in targets)}]\n"
    )
    spawn(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return f"http://127.0.0.1:{port}"


def serve_both_nodes(spawn, tmp_path: Path, agents: list, ready: Path, node0_machine: str = "h100-sxm-8") -> str:
    """Once the 4 ranks are ready: a `gputop serve` on each agent, named by the node rank the rendezvous gave
    it ("node0", "node1"), and a real Prometheus scraping both; its URL."""
    records = train_jobs.wait_ready(ready, 4, agents[0], log=tmp_path / "agent0.log")
    node_of_agent = {}
    for pid in records:
        node_of_agent[psutil.Process(pid).ppid()] = group_rank_of(pid)
    assert set(node_of_agent) == {a.pid for a in agents} and sorted(node_of_agent.values()) == [0, 1], node_of_agent
    targets = []
    for agent in agents:
        targets.append(f"127.0.0.1:{free_port()}")
        node = node_of_agent[agent.pid]
        argv = [sys.executable, "-m", "gputop", "serve", "--pid", str(agent.pid), "--simulate"]
        argv += [node0_machine if node == 0 else "h100-sxm-8", "--hostname", f"node{node}", "--listen", targets[-1]]
        argv += ["--interval", "1", "--stack-interval", "0.5"]
        spawn(argv, stdout=subprocess.DEVNULL, stderr=(tmp_path / f"serve{node}.log").open("wb"))
    return start_prometheus(spawn, tmp_path, targets)


NEEDS_PROMETHEUS = pytest.mark.skipif(
    PROMETHEUS is None, reason="the prometheus binary is not installed (.ci/run installs Debian's prometheus package)"
)


@pytest.mark.slow
@NEEDS_PROMETHEUS
def test_report_and_fleet_over_prometheus_name_the_rank_missing_from_the_collective_and_its_node(spawn, tmp_path, capsys):
    """A 2-node gloo job (2 ranks a node) with the flight recorder on and no dump: global rank 3 stops in its
    own code before all-reduce #4, ranks 0-2 wait in it.  Each node's serve reads its ranks' recorders from
    inside them and exports gputop_rank_collective_seq; `report --prometheus` names rank 3 and its node."""
    rdzv = free_port()
    ready = tmp_path / "job.ready"
    job = str(Path(__file__).parent / "jobs" / "collective_job.py")
    options = ("--case", "stuck", "--odd-rank", "3")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    env["TORCH_FR_BUFFER_SIZE"] = "100"
    agents = [
        spawn(torchrun_agent(rdzv, n, ready, *options, job=job), stdout=subprocess.DEVNULL,
              stderr=(tmp_path / f"agent{n}.log").open("wb"), env=env)
        for n in (0, 1)
    ]  # fmt: skip
    url = serve_both_nodes(spawn, tmp_path, agents, ready)
    out = tmp_path / "report.json"

    def named() -> Optional[dict]:
        if main(["report", "--prometheus", url, "--format", "json", "-o", str(out)]) != 0:
            capsys.readouterr()  # not yet: Prometheus not up, or no rank series scraped yet
            return None
        data = json.loads(out.read_text())
        return data if "never entered it" in data["verdict"]["summary"] else None

    data = wait_until(named, timeout=150, interval=2.0, what="the verdict naming the rank missing from the collective")
    node3 = next(r["node"] for r in data["ranks"] if r["rank"] == 3)
    assert (data["verdict"]["kind"], data["verdict"]["node"], data["verdict"]["rank"]) == ("hung", node3, 3), data["verdict"]
    assert data["verdict"]["summary"].startswith("gloo:all_reduce #4 (process group 0): 3 rank(s) wait in it; rank 3 on ")
    view = fleet_view(PrometheusApi(url))  # what `gputop fleet` shows: the same view and verdict
    assert judge(view).summary == data["verdict"]["summary"]


@pytest.mark.slow
@NEEDS_PROMETHEUS
def test_report_over_prometheus_names_the_straggler_of_a_two_node_job_and_its_node(spawn, tmp_path, capsys):
    rdzv = free_port()
    ready = tmp_path / "job.ready"
    # every rank: 1 DataLoader worker; only rank 3's samples cost anything (100 ms each, asleep, 4 a batch), so rank
    # 3 waits for its data while the three others wait for it in their all-reduce.  At 40 ms a sample, a CI run
    # with the box's other tests ahead of this one (tests/harness/cpu_priority.py) slowed every rank's own step
    # until rank 3 waited for its data only 39% of the time (the bar: over half)
    options = ("--workers", "1", "--persistent", "--sample-ms", "100", "--slow-rank", str(SLOW_RANK))
    agents = [
        spawn(torchrun_agent(rdzv, n, ready, *options), stdout=subprocess.DEVNULL, stderr=(tmp_path / f"agent{n}.log").open("wb"))
        for n in (0, 1)
    ]
    url = serve_both_nodes(spawn, tmp_path, agents, ready, node0_machine=NODE0_MACHINE)
    out = tmp_path / "report.json"

    def reported() -> Optional[dict]:
        if main(["report", "--prometheus", url, "--format", "json", "-o", str(out)]) != 0:
            capsys.readouterr()  # not yet: Prometheus not up, or no rank series scraped yet
            return None
        data = json.loads(out.read_text())
        waits_elsewhere = any(f["node"] == "node0" and f["kind"] == "remote_wait" for f in data["findings"])
        nic_named = any(f["device"] == "mlx5_3" for f in data["findings"])
        straggler = len(data["ranks"]) == 4 and data["verdict"]["kind"] == "straggler"
        return data if straggler and waits_elsewhere and nic_named else None

    data = wait_until(
        reported, timeout=90, interval=1.0, what="a straggler over all 4 ranks, node0 waiting for another node, its NIC named"
    )
    assert data["job"] == RUN_ID_LIVE
    assert sorted((r["node"], r["rank"]) for r in data["ranks"]) == [("node0", 0), ("node0", 1), ("node1", 2), ("node1", 3)]
    assert (data["verdict"]["node"], data["verdict"]["rank"]) == ("node1", SLOW_RANK), data["verdict"]
    assert {n["node"]: n["node_rank"] for n in data["nodes"]} == {"node0": 0, "node1": 1}
    slow = next(r for r in data["ranks"] if r["rank"] == SLOW_RANK)
    assert slow["data_wait_ratio"] > 0.5 and slow["state"] is not None
    # the dashboard: every query runs here, and the cross-node row sees both nodes and the straggler margin
    api = PrometheusApi(url)
    for expr in dashboard_queries():
        api.query(expr.replace("$Hostname", ".*").replace("$job", RUN_ID_LIVE))
    per_node = api.query(f'count by (Hostname, state) (gputop_rank_state{{job="{RUN_ID_LIVE}"}} == 1)')
    assert {s.labels["Hostname"] for s in per_node} == {"node0", "node1"}
    margin = api.query(
        f'max by (job) (gputop_rank_data_wait_ratio{{job=~"{RUN_ID_LIVE}"}}) - quantile by (job) (0.5, gputop_rank_data_wait_ratio{{job=~"{RUN_ID_LIVE}"}})'
    )
    assert margin and margin[0].value > 0.25
    # node0's own diagnosis: its ranks wait for a rank on another node, never a local hang
    assert not [f for f in data["findings"] if f["node"] == "node0" and f["kind"] == "hang"], data["findings"]
    assert any(f["node"] == "node0" and f["kind"] == "remote_wait" for f in data["findings"]), data["findings"]
    # node 0's NIC fault, named with its node (and only there), while the verdict still names node 1's straggler
    nics = [(f["node"], f["device"], f["port"], f["kind"]) for f in data["findings"] if f["device"]]
    assert nics == [("node0", "mlx5_3", 1, "nic_rate")], data["findings"]
    text = build(PrometheusApi(url), url, RUN_ID_LIVE, "md")
    assert "- **node0** NIC mlx5_3 port 1: nic_rate (critical, infrastructure)" in text


@pytest.mark.parametrize(("world_size", "expected"), [(8, "remote_holdup"), (4, "hang")])
def test_ranks_all_waiting_in_a_collective_wait_for_another_node_only_when_the_job_is_bigger(world_size, expected):
    from gputop.analysis.findings import findings

    def waits_from_20(t: float) -> str:
        return FORWARD_BACKWARD if t < 20 else COLLECTIVE

    scenario = hb.Scenario(
        seconds=60,
        util=lambda g, t: 95.0 if t < 20 else 0.0,
        ranks=[
            hb.RankSpec(pid=1000 + i, rank=i, gpus=(i,), state=waits_from_20, cpu=lambda t: 30.0 if t < 20 else 0.0)
            for i in range(4)
        ],
    )
    built = hb.build(scenario)
    history = History(built.machine, capacity=1000)
    for snap in built:
        ranks = tuple(
            replace(r, world_size=world_size, node_rank=0, nnodes=world_size // 4, job_id=RUN_ID) for r in snap.job.ranks
        )
        history.append(replace(snap, job=replace(snap.job, ranks=ranks)))
    found = findings(history)
    ids = [f.id for f in found]
    assert expected in ids and ({"hang", "remote_holdup"} - {expected}).isdisjoint(ids), ids
    if expected == "remote_holdup":
        summary = next(f.summary for f in found if f.id == expected)
        assert "ranks 0–3 of 8, node 0 of 2" in summary and "for a rank on another node" in summary
        assert f"gputop report --prometheus URL --job {RUN_ID}" in summary and "hang" not in summary.lower()


@pytest.mark.parametrize(("world_size", "waits_elsewhere"), [(8, True), (4, False)])
def test_ranks_mostly_in_collectives_while_moving_wait_for_another_node_when_the_job_is_bigger(world_size, waits_elsewhere):
    from gputop.analysis.findings import findings

    mostly_collective = hb.cycle([COLLECTIVE, COLLECTIVE, COLLECTIVE, COLLECTIVE, FORWARD_BACKWARD])
    built = hb.build(
        hb.Scenario(seconds=60, ranks=[hb.RankSpec(pid=1000 + i, rank=i, gpus=(i,), state=mostly_collective) for i in range(4)])
    )
    history = History(built.machine, capacity=1000)
    for snap in built:
        ranks = tuple(
            replace(r, world_size=world_size, node_rank=0, nnodes=world_size // 4, job_id=RUN_ID) for r in snap.job.ranks
        )
        history.append(replace(snap, job=replace(snap.job, ranks=ranks)))
    found = {f.id: f for f in findings(history)}
    assert ("remote_wait" in found) == waits_elsewhere, list(found)
    assert "hang" not in found and "remote_holdup" not in found
    if waits_elsewhere:
        assert "All 4 rank(s) here (ranks 0–3 of 8, node 0 of 2) wait in collectives" in found["remote_wait"].summary
        assert f"gputop report --prometheus URL --job {RUN_ID}" in found["remote_wait"].summary
