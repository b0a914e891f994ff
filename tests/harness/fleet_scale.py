"""A synthetic fleet of N nodes × 8 GPUs, built from what `gputop serve` really exports, for a real Prometheus.

Five pages come from real `Exporter`s fed 60 s of built history of one node of an 8-rank-per-node job
(`gputop.exporter`, as `gputop serve` serves them): a healthy node, the straggler's node (local rank 3 waits
for its data 75% of the time), the hung node (local rank 5 stopped in its forward pass at t=20 s, its 7
peers wait for it in a collective since), the node whose NIC mlx5_2 is down (its simulated /sys, read by
the real NIC reader), and a healthy node that stops being scraped.  Each node of the fleet is one of those
pages with its own labels: `Hostname` nodeNNN, the global `rank` (node × 8 + local rank), `node`,
`node_rank`, `nnodes`, `world_size`, one `job` label.

`write_openmetrics` writes the fleet's samples as OpenMetrics with timestamps ending now, the node that
stopped reporting with its last samples 8 minutes earlier (out of Prometheus's 5-minute lookback), the
moving ranks' progress a few minutes ahead (Prometheus is read at the wall clock, after the backfill);
`backfilled_prometheus` loads them with `promtool tsdb create-blocks-from openmetrics` into a TSDB and
starts a real Prometheus on loopback over it (`benchmarks/bench_fleet_scale.py`, tests/test_fleet_scale.py).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gputop.analysis.stack_classes import COLLECTIVE, FORWARD_BACKWARD, WAITING_FOR_DATA
from gputop.exporter import Exporter
from gputop.fleet.view import STALLED_AFTER_S
from gputop.history import History
from gputop.model import Snapshot
from gputop.sim.fake_nvml import ManualClock
from gputop.sim.fake_sysfs import FakeNicTree
from gputop.sim.spec import parse_spec
from tests.harness import histories as hb

JOB = "llama-256"
RANKS_PER_NODE = 8
PAGE_AT = hb.T0 + 60.0  # the time of the pages' histories' last snapshot
STRAGGLER_LOCAL_RANK = 3
HUNG_LOCAL_RANK = 5
NIC_DOWN = "mlx5_2"
STOPPED_BEFORE_S = 480.0  # the stopped node's last samples: 8 minutes before the others'
# A backfilled fleet's moving ranks progress this far ahead of their samples' time: the time it may take to
# backfill, start Prometheus and read it (under Prometheus's 5-minute lookback, after which the data is gone).
BACKFILL_AHEAD_S = 240.0


def exposition(exporter: Exporter) -> str:
    """What `exporter` serves on /metrics, as Prometheus's text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    return generate_latest(registry).decode()


class PlacedSource:
    """A pipeline stand-in: a built history's snapshots, the job's ranks placed on node `node` of `nnodes`
    with `per_node` ranks each, under the cross-node job id `job`; with `nic_spec`, each snapshot carries the
    NIC ports the real NicReader reads, at its time, from that simulated machine's /sys (its faults included)."""

    def __init__(self, history: History, node: int, nnodes: int, per_node: int, job: str, nic_spec: Optional[str] = None) -> None:
        self.machine = history.machine
        self.snaps = [self._placed(s, node, nnodes, per_node, job) for s in history]
        if nic_spec is not None:
            self.snaps = self._with_nics(self.snaps, nic_spec)
        self.i = 0

    @staticmethod
    def _with_nics(snaps: list[Snapshot], spec: str) -> list[Snapshot]:
        return with_nics(snaps, spec)

    @staticmethod
    def _placed(snap: Snapshot, node: int, nnodes: int, per_node: int, job: str) -> Snapshot:
        if snap.job is None:
            return snap
        ranks = tuple(
            replace(
                r,
                rank=node * per_node + (r.rank or 0),
                local_rank=r.rank,
                world_size=nnodes * per_node,
                job_id=job,
                node_rank=node,
                nnodes=nnodes,
            )
            for r in snap.job.ranks
        )
        return replace(snap, job=replace(snap.job, ranks=ranks))

    def poll(self) -> Snapshot:
        snap = self.snaps[self.i]
        self.i += 1
        return snap

    def close(self) -> None:
        pass


# ----------------------------------------------------------------- the five pages

ROLES = ("healthy", "straggler", "hung", "nic_down", "stopped")
_STEADY = hb.cycle([FORWARD_BACKWARD, COLLECTIVE])
_SLOW_LOADER = hb.cycle([WAITING_FOR_DATA, WAITING_FOR_DATA, WAITING_FOR_DATA, FORWARD_BACKWARD])


def _from_20(before: Callable[[float], object], after: object) -> Callable[[float], object]:
    return lambda t: before(t) if t < 20 else after


def _busy_cpu(t: float) -> float:
    return 30.0


def _busy_gpu(gpu: int, t: float) -> Optional[float]:
    return 95.0


def _role_scenario(role: str) -> tuple[hb.Scenario, Optional[str]]:
    """The built history of one node in `role`, and its simulated machine's NIC spec."""
    states: dict[int, Callable[[float], str]] = {}
    cpu: Callable[[float], float] = _busy_cpu
    util: Callable[[int, float], Optional[float]] = _busy_gpu
    nic_spec = "h100-sxm-8"
    if role == "straggler":
        states[STRAGGLER_LOCAL_RANK] = _SLOW_LOADER
        util = lambda g, t: 30.0 if g == STRAGGLER_LOCAL_RANK else 95.0  # noqa: E731
    elif role == "hung":
        waits = _from_20(_STEADY, COLLECTIVE)
        states = {i: waits for i in range(RANKS_PER_NODE)}  # type: ignore[misc]
        states[HUNG_LOCAL_RANK] = lambda t: FORWARD_BACKWARD
        cpu = _from_20(lambda t: 30.0, 0.0)  # type: ignore[assignment]  # a frozen process burns no CPU
        util = lambda g, t: 95.0 if t < 20 else 0.0  # noqa: E731
    elif role == "nic_down":
        nic_spec = f"h100-sxm-8+nic-down={NIC_DOWN}"
    specs = [hb.RankSpec(pid=1000 + i, rank=i, gpus=(i,), state=states.get(i, _STEADY), cpu=cpu) for i in range(RANKS_PER_NODE)]
    return hb.Scenario(seconds=60.0, ranks=specs, util=util), nic_spec


@functools.lru_cache(maxsize=None)
def role_page(role: str) -> str:
    """The page a real `gputop serve --dcgm-fields` of a node in `role` serves after 60 s (node 0 of 1)."""
    scenario, nic_spec = _role_scenario(role)
    source = PlacedSource(hb.build(scenario), 0, 1, RANKS_PER_NODE, JOB, nic_spec)
    exporter = Exporter(source, interval=1.0, hostname="node", dcgm_fields=True, log=lambda line: None)
    for _ in source.snaps:
        exporter.cycle()
    return exposition(exporter)


@functools.lru_cache(maxsize=None)
def _role_samples(role: str) -> tuple[tuple[str, tuple[tuple[str, str], ...], float], ...]:
    return tuple(
        (s.name, tuple(s.labels.items()), s.value) for f in text_string_to_metric_families(role_page(role)) for s in f.samples
    )


# ----------------------------------------------------------------- the fleet


@dataclass(frozen=True)
class Fleet:
    """N nodes; which node plays which role (the rest are healthy)."""

    nodes: int
    straggler: int
    hung: int
    nic_down: int
    stopped: int

    @classmethod
    def of(cls, nodes: int) -> "Fleet":
        """The faults spread over the fleet (all on different nodes from 5 nodes up; fewer nodes keep the first)."""
        spots = [nodes * k // 5 + (nodes // 10) for k in range(1, 5)] if nodes >= 5 else []
        straggler, hung, nic_down, stopped = (spots + [-1, -1, -1, -1])[:4]
        return cls(nodes, straggler, hung, nic_down, stopped)

    def role(self, node: int) -> str:
        for role in ROLES[1:]:
            if getattr(self, role) == node:
                return role
        return "healthy"

    @staticmethod
    def hostname(node: int) -> str:
        return f"node{node:03d}"

    def rank(self, node: int, local_rank: int) -> int:
        return node * RANKS_PER_NODE + local_rank

    def samples(self, node: int, at: float, ahead_s: float = 0.0) -> Iterator[tuple[str, dict[str, str], float]]:
        """Node `node`'s page as Prometheus stores it at time `at`: its own labels, its ranks global, its
        timestamps (progress) moved from the page's time to `at`; a moving rank's progress `ahead_s` later
        (a backfilled fleet is read at the wall clock, a minute or so after its last sample: its moving
        ranks must not read as stalled then; a stalled rank keeps its age)."""
        per_node = {
            "Hostname": self.hostname(node),
            "node": str(node),
            "node_rank": str(node),
            "nnodes": str(self.nodes),
            "world_size": str(self.nodes * RANKS_PER_NODE),
        }
        for name, items, value in _role_samples(self.role(node)):
            labels = dict(items)
            for key in per_node.keys() & labels.keys():
                labels[key] = per_node[key]
            if labels.get("rank"):
                labels["rank"] = str(self.rank(node, int(labels["rank"])))
            if name == "gputop_rank_last_progress_timestamp_seconds":
                age = PAGE_AT - value
                value = at - age if age > STALLED_AFTER_S else at + ahead_s
            yield name, labels, value


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_escaped(v)}"' for k, v in sorted(labels.items()))


def write_openmetrics(path: Path, fleet: Fleet, end: float, step: float = 60.0, samples: int = 2) -> int:
    """The fleet as OpenMetrics with timestamps: every node at `samples` times `step` apart ending at `end`,
    the stopped node once, STOPPED_BEFORE_S before `end`.  Families contiguous as OpenMetrics wants them.
    Returns the number of samples written."""
    by_name: dict[str, list[str]] = {}
    times = [end - step * k for k in reversed(range(samples))]
    for node in range(fleet.nodes):
        node_times = [end - STOPPED_BEFORE_S] if node == fleet.stopped else times
        for at in node_times:
            stamp = f"{at:.3f}"
            for name, labels, value in fleet.samples(node, at, BACKFILL_AHEAD_S):
                by_name.setdefault(name, []).append(f"{name}{{{_labels_text(labels)}}} {value!r} {stamp}\n")
    written = 0
    with path.open("w", encoding="utf-8") as out:
        for name, lines in by_name.items():
            out.write(
                f"# TYPE {name} gauge\n"
            )  # every sample name its own gauge family: OpenMetrics' suffix rules stay out of the way
            out.writelines(lines)
            written += len(lines)
        out.write("# EOF\n")
    return written


def backfill(openmetrics: Path, tsdb: Path) -> None:
    """`promtool tsdb create-blocks-from openmetrics FILE DIR`: Prometheus's own backfill."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("promtool is not installed (Debian's prometheus package has it)")
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"promtool backfill failed: {done.stderr.strip()[-2000:]}")


def prometheus_argv(tsdb: Path, config: Path, port: int) -> list[str]:
    """A real Prometheus on loopback over `tsdb`, scraping nothing (the fleet is backfilled)."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise RuntimeError("prometheus is not installed (Debian's prometheus package)")
    config.write_text("global:\n  scrape_interval: 1m\nscrape_configs: []\n")
    return [
        prometheus,
        f"--config.file={config}",
        f"--storage.tsdb.path={tsdb}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1d",
    ]


def build_fleet_tsdb(fleet: Fleet, workdir: Path, end: Optional[float] = None) -> tuple[Path, int]:
    """Write the fleet's OpenMetrics and backfill it into workdir/tsdb; the TSDB's path and the samples."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "fleet.om"
    written = write_openmetrics(source, fleet, end if end is not None else float(int(time.time())))
    tsdb = workdir / "tsdb"
    backfill(source, tsdb)
    os.unlink(source)
    return tsdb, written


def expected(fleet: Fleet) -> dict[str, object]:
    """What the cross-node report must name for `fleet`."""
    return {
        "straggler": (fleet.hostname(fleet.straggler), fleet.rank(fleet.straggler, STRAGGLER_LOCAL_RANK)),
        "hung": (fleet.hostname(fleet.hung), fleet.rank(fleet.hung, HUNG_LOCAL_RANK)),
        "nic_down": (fleet.hostname(fleet.nic_down), NIC_DOWN),
        "stopped": fleet.hostname(fleet.stopped),
    }


def fleet_pages(fleet: Fleet, at: float = PAGE_AT, skip: Sequence[str] = ("stopped",)) -> list[tuple[str, dict[str, str], float]]:
    """Every node's samples at `at` (the roles in `skip` left out), for a Prometheus stand-in."""
    return [s for node in range(fleet.nodes) if fleet.role(node) not in skip for s in fleet.samples(node, at)]


def with_nics(snaps: list[Snapshot], spec: str) -> list[Snapshot]:
    """Each snapshot with the NIC ports the real NicReader reads, at its time, from the simulated machine
    `spec`'s /sys (its NIC faults included)."""
    clock = ManualClock(snaps[0].timestamp)
    tree = FakeNicTree(parse_spec(spec), lambda: clock() - snaps[0].timestamp, clock=clock)
    try:
        out = []
        for snap in snaps:
            clock.advance(snap.timestamp - clock())
            out.append(replace(snap, nics=tree.read()))
        return out
    finally:
        tree.close()
