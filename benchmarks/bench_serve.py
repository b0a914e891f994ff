"""`gputop serve`: how long a Prometheus scrape takes, side by side with the collection cycle behind it.

    python benchmarks/bench_serve.py [--seconds 30] [--quick]

Runs the real exporter in this process, as `gputop serve --simulate h100-sxm-8 --pid P` does: the
simulated 8-GPU machine, a real training job attached (tests/jobs/train_job.py, 2 DataLoader workers,
py-spy stacks every 2 s), the collector thread cycling every second, and prometheus_client's HTTP
server on loopback.  Meanwhile it scrapes /metrics (OpenMetrics) ten times a second and records each
scrape's wall time, and the wall time of each collection cycle's two parts: the pipeline's poll (GPUs,
host, the job's /proc scan) and the exporter's update (diagnosis, metric families).  A scrape only formats the last
cycle's values, so it should cost a small fraction of a cycle, whatever NVML, /proc or py-spy cost.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import emit_figure, machine_line, print_table

from tests.harness.train_jobs import attach_loop_command, ready_records

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to scrape (default 30)")
    parser.add_argument("--quick", action="store_true", help="a 10 s pass")
    args = parser.parse_args()
    seconds = 10.0 if args.quick else args.seconds

    from gputop.backend import SimulatedMachine
    from gputop.commands.serve import start_exporting, stop_serving
    from gputop.exporter import Exporter
    from gputop.pipeline import Following, Pipeline
    from gputop.source import PollLoop

    ready = Path(tempfile.mkdtemp(prefix="gputop-bench-serve-")) / "ready"
    job = subprocess.Popen(
        attach_loop_command("--workers", "2", "--length", "100000", "--ready", str(ready)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    pipeline = exporter = server = loop = None
    try:
        deadline = time.monotonic() + 120
        while not ready_records(ready):
            if time.monotonic() > deadline or job.poll() is not None:
                print("the training job did not start", file=sys.stderr)
                return 1
            time.sleep(0.1)
        pipeline = Pipeline(
            SimulatedMachine("h100-sxm-8"), follow=Following(pids=[job.pid])
        )  # serve's pipeline with --pid (the job's /proc scan is in the poll)
        exporter = Exporter(pipeline, interval=1.0, log=print)
        server = start_exporting(exporter, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        cycles: list[float] = []
        polls: list[float] = []

        class TimedPipeline:  # the pipeline as the loop sees it, with each poll's wall time kept
            machine = pipeline.machine

            def poll(self):
                started = time.perf_counter()
                snap = pipeline.poll()
                polls.append(time.perf_counter() - started)
                return snap

            def close(self) -> None:
                pipeline.close()

        loop = PollLoop(TimedPipeline(), 1.0, on_error=exporter.failed)
        collector = threading.Thread(target=loop.run, args=(exporter.deliver,), daemon=True)
        collector.start()

        def scrape() -> bytes:
            request = urllib.request.Request(url, headers={"Accept": OPENMETRICS})
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.read()

        # wait until the job's ranks are in the metrics (the first stack dumps have come back)
        while b"gputop_rank_data_wait_ratio{" not in scrape():
            if time.monotonic() > deadline:
                print("no rank metrics after 120 s", file=sys.stderr)
                return 1
            time.sleep(0.2)
        scrapes: list[float] = []
        seen_cycle = exporter.cycles
        body = b""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            body = scrape()
            scrapes.append(time.perf_counter() - started)
            if exporter.cycles != seen_cycle and exporter.last_cycle_seconds is not None:
                seen_cycle = exporter.cycles
                cycles.append(exporter.last_cycle_seconds)
            time.sleep(0.1)
    finally:
        stop_serving(loop, server, pipeline)
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait(timeout=10)

    scrape_ms = statistics.median(scrapes) * 1000
    poll_ms = statistics.median(polls) * 1000
    update_ms = statistics.median(cycles) * 1000 if cycles else float("nan")
    cycle_ms = poll_ms + update_ms
    samples = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    print(machine_line())
    print_table(
        ["what", "n", "median ms", "p95 ms"],
        [
            [
                "scrape: HTTP GET /metrics (OpenMetrics)",
                len(scrapes),
                f"{scrape_ms:.2f}",
                f"{percentile(scrapes, 0.95) * 1000:.2f}",
            ],
            [
                "collection: pipeline poll (NVML, /proc, the job)",
                len(polls),
                f"{poll_ms:.1f}",
                f"{percentile(polls, 0.95) * 1000:.1f}",
            ],
            [
                "collection: update (diagnosis, families)",
                len(cycles),
                f"{update_ms:.1f}",
                f"{percentile(cycles, 0.95) * 1000:.1f}" if cycles else "-",
            ],
        ],
    )
    print(f"body: {len(body)} bytes, {samples} samples; a scrape costs {scrape_ms / cycle_ms:.3f} of a cycle (poll + update)")
    emit_figure(
        "`gputop serve`: one scrape of /metrics (8 simulated GPUs + a real 1-rank job attached), median wall time",
        "< 50 ms",
        f"**{scrape_ms:.1f} ms** (p95 {percentile(scrapes, 0.95) * 1000:.1f} ms, {len(scrapes)} scrapes); the collection "
        f"cycle behind it {cycle_ms:.0f} ms (poll {poll_ms:.0f} + update {update_ms:.0f}), so a scrape costs "
        f"{scrape_ms / cycle_ms:.2f} of one",
        "python benchmarks/bench_serve.py",
        met=scrape_ms < 50,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
