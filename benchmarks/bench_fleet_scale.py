"""The cross-node view at 1, 16, 64 and 256 nodes × 8 GPUs: its time against a real Prometheus, as a ratio to one node.

    python benchmarks/bench_fleet_scale.py [--rounds 9] [--nodes 1,16,64,256]

Each fleet is tests/harness/fleet_scale.py's: pages a real `gputop serve` exports (a healthy node, a straggler's,
a hung rank's, a NIC down, a node that stopped being scraped) replicated per node with its own labels, backfilled
with `promtool tsdb create-blocks-from openmetrics` into its own TSDB, one real Prometheus on loopback per fleet,
all running at once.  A round reads the cross-node report (`gputop report --prometheus URL --format json`'s
view, verdict and JSON, in this process) from every fleet in turn, the order reversed every other round (ABBA), so
a change in the shared machine's load lands on every size alike; the figure is each size's median over one
node's.  It also counts the queries per report (they must not grow with the nodes) and times the whole command,
`python -m gputop report --prometheus URL --format json`, interpreter start included, at the biggest fleet.
Beside each wall time, the CPU it took (this process's; Prometheus's own a report), which a loaded shared box
changes less.
Needs Debian's prometheus package (prometheus and promtool).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import emit_figure, kill_group, machine_line, print_table, wait_for

from gputop.commands.fleet_report import build
from gputop.fleet.prometheus import PrometheusApi, Series
from tests.harness import fleet_scale as fs
from tests.harness.processes import free_port

GOAL_S = 2.0  # issue 40: the cross-node verdict in at most 2 s at 256 nodes × 8 GPUs


class CountingApi(PrometheusApi):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.asked = 0

    def query(self, expr: str) -> list[Series]:
        self.asked += 1
        return super().query(expr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="reads of every fleet (default 9)")
    parser.add_argument("--nodes", default="1,16,64,256", help="fleet sizes, the first the baseline (default 1,16,64,256)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="gputop-bench-fleet-"))
    servers: dict[int, subprocess.Popen] = {}
    urls: dict[int, str] = {}
    try:
        for nodes in sizes:
            started = time.perf_counter()
            tsdb, written = fs.build_fleet_tsdb(fs.Fleet.of(nodes), work / str(nodes))
            port = free_port()
            servers[nodes] = subprocess.Popen(
                fs.prometheus_argv(tsdb, work / str(nodes) / "prometheus.yml", port),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            urls[nodes] = f"http://127.0.0.1:{port}"
            print(f"{nodes} nodes: {written} samples backfilled in {time.perf_counter() - started:.1f} s", flush=True)
        for nodes, url in urls.items():
            wait_for(lambda u=url: _answers(u), 120, f"Prometheus over the {nodes}-node fleet")
        times: dict[int, list[float]] = {n: [] for n in sizes}
        cpu: dict[int, list[float]] = {n: [] for n in sizes}  # this process's CPU a report
        prom_cpu: dict[int, list[float]] = {n: [] for n in sizes}  # Prometheus's CPU a report
        asked: dict[int, int] = {}
        ranks: dict[int, int] = {}
        meters = {n: psutil.Process(servers[n].pid) for n in sizes}
        for round_no in range(args.rounds + 1):  # round 0 warms Prometheus's caches and this process's imports
            for nodes in sizes if round_no % 2 else list(reversed(sizes)):
                api = CountingApi(urls[nodes])
                prom_before = sum(meters[nodes].cpu_times()[:2])
                started, cpu_started = time.perf_counter(), time.process_time()
                data = json.loads(build(api, api.url, None, "json"))
                if round_no:
                    times[nodes].append(time.perf_counter() - started)
                    cpu[nodes].append(time.process_time() - cpu_started)
                    prom_cpu[nodes].append(sum(meters[nodes].cpu_times()[:2]) - prom_before)
                asked[nodes], ranks[nodes] = api.asked, len(data["ranks"])
        biggest = sizes[-1]
        command = [sys.executable, "-m", "gputop", "report", "--prometheus", urls[biggest], "--format", "json", "-o", "/dev/null"]
        whole, whole_cpu = [], []
        for _ in range(3):
            started, children = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            whole.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            whole_cpu.append(after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime)
    finally:
        for proc in servers.values():
            kill_group(proc)
    base = statistics.median(times[sizes[0]])
    rows = [
        [
            n,
            ranks[n],
            asked[n],
            statistics.median(times[n]),
            min(times[n]),
            max(times[n]),
            statistics.median(times[n]) / base,
            statistics.median(cpu[n]),
            statistics.median(prom_cpu[n]),
        ]
        for n in sizes
    ]
    print(machine_line())
    headers = ["nodes", "ranks", "queries", "median s", "min s", "max s", f"× {sizes[0]} node", "CPU s", "Prometheus CPU s"]
    print_table(headers, rows)
    print(
        f"whole command at {biggest} nodes (interpreter start included), 3 runs: "
        + ", ".join(f"{t:.2f} s (CPU {c:.2f} s)" for t, c in zip(whole, whole_cpu))
    )
    median_big = statistics.median(times[biggest])
    emit_figure(
        f"cross-node report at {biggest} nodes × 8 GPUs from a real Prometheus",
        f"≤ {GOAL_S:g} s",
        f"{median_big:.2f} s in-process (median of {args.rounds}, range {min(times[biggest]):.2f}–{max(times[biggest]):.2f}); "
        f"{statistics.median(whole):.2f} s the whole command (CPU {statistics.median(whole_cpu):.2f} s; Prometheus's "
        f"{statistics.median(prom_cpu[biggest]):.2f} s a report); {median_big / base:.1f}× one node's; {asked[biggest]} queries "
        f"(as at {sizes[0]} node{'s' if sizes[0] > 1 else ''}: {asked[sizes[0]]})",
        "python benchmarks/bench_fleet_scale.py",
        met=statistics.median(whole) <= GOAL_S,
    )
    return 0


def _answers(url: str) -> bool:
    try:
        return bool(PrometheusApi(url, timeout=2.0).query("gputop_job_info"))
    except Exception:
        return False


if __name__ == "__main__":
    sys.exit(main())
