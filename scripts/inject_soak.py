"""Run `gputop bench --yes` and `gputop trace` many times against issue 26's torch job, which lives in the
allocator (tests/jobs/harm_job.py: num_workers=0, 64 small tensors collated a batch), and count what
a user would see go wrong: a dead job, a frozen job (its step counter stops), a gputop that hangs.
Issue 26's bar is 0 of each in 50 runs of each command.

    python scripts/inject_soak.py                  # 50 + 50 runs (about 15 minutes on 2 cores)
    python scripts/inject_soak.py --runs 5         # a quick look
    python scripts/inject_soak.py --job train0     # the suite's train_job with num_workers=0 instead

A refusal is no harm, but it is no pass either: the soak counts what really ran (a bench whose agent answered,
a trace with a rank's trace), and fails unless at least --min-ran of each command's runs really ran
(default: half, the issue's bar), as well as on any dead, frozen or hung outcome.

One job serves every run: a second benchmark into the same process is where pyinjector killed it.  A job
that dies is counted and replaced, so the remaining runs still mean something.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gputop.collect.procfs import process_alive
from tests.harness import train_jobs
from tests.harness.injection import ALLOCATING, MOVE_TIMEOUT_S, size_counter, start_allocating_job
from tests.harness.processes import Spawner, wait_until

HANG_S = 90.0  # gputop bench --seconds 8 or trace --seconds 1 that has not ended by then is hung


def start_job(spawn: Spawner, work: Path, n: int, kind: str):
    if kind == "allocating":
        return start_allocating_job(spawn, work, f"job{n}")
    prefix = work / f"job{n}.steps"
    _proc, records = train_jobs.start(spawn, work, f"job{n}", *ALLOCATING, "--step-log", str(prefix))
    ((pid, record),) = records.items()
    return pid, size_counter(Path(f"{prefix}.{record['rank']}"))


def one_run(argv: list[str]) -> tuple[str, float, str]:
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "hung", HANG_S, ""
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        return "error", elapsed, (proc.stderr.strip().splitlines() or ["?"])[-1]
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        return "error", elapsed, "no JSON"
    notes = " ".join(answer.get("notes") or ())
    if "active tier not run" in notes:
        return "refused", elapsed, notes[notes.index("active tier not run") :][:160]
    if "ranks" in answer and not answer["ranks"]:
        return "refused", elapsed, "no rank traced"
    return "ran", elapsed, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs of each command")
    parser.add_argument("--bench-seconds", type=float, default=8.0)
    parser.add_argument("--min-ran", type=float, default=0.5, help="the share of each command's runs that must really run")
    parser.add_argument(
        "--job",
        choices=["allocating", "train0"],
        default="allocating",
        help="allocating: issue 26's job; train0: tests/jobs/train_job.py with num_workers=0, batch 64",
    )
    args = parser.parse_args()
    spawn = Spawner()
    work = Path(tempfile.mkdtemp(prefix="gputop-soak-"))
    tallies = {"bench": Counter(), "trace": Counter()}
    times: dict[str, list[float]] = {"bench": [], "trace": []}
    reasons: Counter = Counter()
    jobs = 0
    try:
        pid, progress = start_job(spawn, work, jobs, args.job)
        for i in range(args.runs):
            for command in ("bench", "trace"):
                argv = (
                    [
                        sys.executable,
                        "-m",
                        "gputop",
                        "bench",
                        "--pid",
                        str(pid),
                        "--yes",
                        "--json",
                        "--seconds",
                        f"{args.bench_seconds:g}",
                    ]
                    if command == "bench"
                    else [
                        sys.executable,
                        "-m",
                        "gputop",
                        "trace",
                        "--pid",
                        str(pid),
                        "--seconds",
                        "1",
                        "--json",
                        "-o",
                        str(work / f"trace{i}"),
                    ]
                )
                outcome, elapsed, why = one_run(argv)
                tallies[command][outcome] += 1
                times[command].append(elapsed)
                if why:
                    reasons[f"{command}: {why}"] += 1
                before = progress()
                try:
                    wait_until(
                        lambda: progress() > before or not process_alive(pid),
                        timeout=MOVE_TIMEOUT_S,
                        what="the job to take a step",
                    )
                    harmed = None if process_alive(pid) else "dead"
                except AssertionError:
                    harmed = "frozen"
                if harmed:
                    tallies[command][harmed] += 1
                    jobs += 1
                    pid, progress = start_job(spawn, work, jobs, args.job)
            print(f"round {i + 1}/{args.runs}: bench {dict(tallies['bench'])}, trace {dict(tallies['trace'])}", flush=True)
    finally:
        spawn.reap_all()
    print()
    for command in ("bench", "trace"):
        t = times[command]
        print(
            f"gputop {command}: {args.runs} runs, {dict(tallies[command])}; median {statistics.median(t):.1f}s, max {max(t):.1f}s"
        )
    for why, n in reasons.most_common(5):
        print(f"  {n}x {why}")
    harmed = sum(tallies[c][k] for c in tallies for k in ("dead", "frozen", "hung"))
    print(f"dead + frozen + hung: {harmed}")
    short = [c for c in tallies if tallies[c]["ran"] < args.min_ran * args.runs]
    for command in short:
        print(f"gputop {command}: only {tallies[command]['ran']} of {args.runs} runs really ran (bar: {args.min_ran:.0%})")
    return 1 if harmed or short else 0


if __name__ == "__main__":
    sys.exit(main())
