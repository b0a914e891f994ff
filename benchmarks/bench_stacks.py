"""Stack refresh cost: one rank with 16 DataLoader workers, py-spy per PID in parallel vs. one after another.

    python benchmarks/bench_stacks.py [--workers 16] [--rounds 7] [--json]

Starts tests/jobs/train_loop.py (a real PyTorch loop, workers sleeping in Dataset.__getitem__),
waits until all workers run, then times `dump_stacks` over the 17 PIDs, alternating the parallel
refresh gputop uses (one py-spy per CPU at a time) with a sequential baseline in the same run, so
both see the same machine load.  Each dump is ~14 ms of CPU, so on a small machine the wall time is
bounded below by 17 x that / CPUs; the script prints that floor next to the result.
It also times gputop's own background round, `JobCollector.refresh_stacks()`: every rank each round, the
workers in turns (a third a round, so none is more than three refreshes old), with the /proc scan
included; and `JobCollector.collect()` (the 1 Hz /proc part).  Goal: parallel median <= 150 ms.
The job is killed (its whole process group) on exit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import wait_for  # noqa: E402  (benchmarks/common.py)

from gputop.collect.job_tree import JobCollector  # noqa: E402
from gputop.collect.procfs import read_progress  # noqa: E402
from gputop.collect.stacks import dump_stacks, find_py_spy  # noqa: E402
from tests.harness.train_jobs import attach_loop_command, ready_records  # noqa: E402

GOAL_MS = 150.0


def timed_ms(fn) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return (time.perf_counter() - start) * 1000.0, result


def children_cpu_ms() -> float:
    """CPU time (user + system) used so far by our finished children: the py-spy processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7, help="timed refreshes per mode (median reported)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = ap.parse_args()
    if find_py_spy() is None:
        print("bench_stacks: py-spy not found; `pip install py-spy`", file=sys.stderr)
        return 1

    with tempfile.TemporaryDirectory(prefix="gputop-bench-stacks-") as tmp:
        ready = Path(tmp) / "ready"
        job = subprocess.Popen(
            attach_loop_command("--workers", str(args.workers), "--persistent", "--length", "1000000",
                                "--sample-ms", "200", "--ready", str(ready)),
            start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: ready_records(ready), 180, "the job's first step")
            collector = JobCollector(job.pid, stacks_enabled=False)
            tree = wait_for(
                lambda: (t := collector.collect()) and len(t.ranks[0].workers) == args.workers and t,
                120, f"{args.workers} workers",
            )
            pids = [job.pid] + [w.pid for w in tree.ranks[0].workers]
            dump_stacks(pids)  # warm the page cache for py-spy and the target binaries

            parallel, sequential, rounds, errors, cpu_sequential = [], [], [], 0, 0.0
            collector.refresh_stacks(full=True)  # gputop's first round after attaching dumps everyone
            for _ in range(args.rounds):  # interleaved: every mode sees the same load
                rounds.append(timed_ms(collector.refresh_stacks)[0])
                ms, res = timed_ms(lambda: dump_stacks(pids))
                parallel.append(ms)
                errors += sum(1 for s in res.values() if s.error)
                cpu_before = children_cpu_ms()
                ms, res = timed_ms(lambda: dump_stacks(pids, parallel=False))
                sequential.append(ms)
                cpu_sequential += children_cpu_ms() - cpu_before
                errors += sum(1 for s in res.values() if s.error)
            cpu_per_dump = cpu_sequential / (args.rounds * len(pids))
            load = os.getloadavg()[0]
            collect_ms = [timed_ms(collector.collect)[0] for _ in range(50)]
            # the progress counters read beside each dump (CPU time, /proc/PID/io, each thread's switches)
            progress_ms = [timed_ms(lambda: [read_progress(pid) for pid in pids])[0] for _ in range(20)]
            collector.close()
        finally:
            try:
                os.killpg(job.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            job.wait(timeout=30)

    par, seq, rnd = statistics.median(parallel), statistics.median(sequential), statistics.median(rounds)
    rows = [
        ("parallel (gputop)", par, min(parallel), max(parallel)),  # at most one py-spy per CPU at a time
        ("sequential baseline", seq, min(sequential), max(sequential)),
        ("gputop's round", rnd, min(rounds), max(rounds)),  # the rank + a third of the workers, /proc scan included
    ]
    print(f"py-spy dump of {len(pids)} PIDs (1 rank + {args.workers} workers), {args.rounds} rounds each, "
          f"{os.cpu_count()} CPUs")
    print(f"{'mode':<22}{'median ms':>11}{'min ms':>9}{'max ms':>9}")
    for name, med, lo, hi in rows:
        print(f"{name:<22}{med:>11.1f}{lo:>9.1f}{hi:>9.1f}")
    print(f"speed-up parallel vs sequential: {seq / par:.2f}x   goal <= {GOAL_MS:.0f} ms: "
          f"{'met' if par <= GOAL_MS else 'NOT met'}   failed dumps: {errors}")
    floor = cpu_per_dump * len(pids) / (os.cpu_count() or 1)
    print(f"py-spy CPU per dump: {cpu_per_dump:.1f} ms -> CPU-bound floor for {len(pids)} PIDs on "
          f"{os.cpu_count()} idle CPUs: {floor:.0f} ms (1-min load average during the run: {load:.2f})")
    print(f"gputop's background round: every rank + the workers' turn ({-(-args.workers // 3)} of {args.workers}), "
          f"so each worker's stack is at most 3 refreshes old")
    print(f"JobCollector.collect() (/proc, 1 Hz part): median {statistics.median(collect_ms):.2f} ms")
    progress = statistics.median(progress_ms)
    print(f"progress counters beside the dumps, all {len(pids)} PIDs: median {progress:.1f} ms in gputop "
          f"(vs {cpu_per_dump * len(pids):.0f} ms of py-spy CPU for the dumps: {progress / (cpu_per_dump * len(pids)):.0%})")
    if args.json:
        print(json.dumps({
            "pids": len(pids), "rounds": args.rounds, "cpus": os.cpu_count(),
            "parallel_ms": parallel, "sequential_ms": sequential,
            "parallel_median_ms": par, "sequential_median_ms": seq, "ratio": seq / par,
            "round_ms": rounds, "round_median_ms": rnd,
            "failed_dumps": errors, "cpu_ms_per_dump": cpu_per_dump, "load_average": load,
            "collect_median_ms": statistics.median(collect_ms), "goal_ms": GOAL_MS,
            "progress_median_ms": progress,
        }))
    return 0 if par <= GOAL_MS else 1


if __name__ == "__main__":
    sys.exit(main())
