"""What the dense state sampling costs: py-spy record on a rank at the screen's and the report's rates.

    python benchmarks/bench_state_sampler.py [--rounds 3] [--window 10] [--json]

Starts tests/jobs/train_job.py (num_workers=0, a sleeping dataset, a simulated GPU step: the rank's
main thread does everything, so every sample reads its stack), then measures, in windows interleaved
in one run so that all see the same load: no sampling, gputop's BACKGROUND rate (the screen: 10 Hz a
rank) and its FOCUSED rate (a report or the findings screen: up to 500 Hz for one rank, within 5% of the cores
or a tenth of one, as py-spy's measured cost allows).  For each: the job's
steps/s (ratio to no sampling) and py-spy's CPU (% of one core, from the reaped py-spy processes), with
the samples it delivered.  The stack dumps the monitor takes anyway (py-spy dump of the rank every 2 s)
are measured the same way, for scale.  Kills everything it started.
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
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit_figure, machine_line, wait_for  # noqa: E402  (benchmarks/common.py)

from gputop.collect.stacks import dump_stacks, find_py_spy  # noqa: E402
from gputop.collect.state_sampler import BACKGROUND, FOCUSED, StateSampler  # noqa: E402
from tests.harness.train_jobs import command, ready_records  # noqa: E402

COMMAND = "python benchmarks/bench_state_sampler.py"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def read_steps(path: Path) -> int:
    text = path.read_text().strip()
    return int(text) if text else 0


def window(progress: Path, pid: int, mode: str, seconds: float) -> dict:
    """One window of `seconds` in `mode` ("none", "background", "focused", "dumps"): steps/s, py-spy CPU %."""
    py_spy = find_py_spy()
    sampler = None
    stop = threading.Event()
    dumper = None
    if mode in ("background", "focused"):
        sampler = StateSampler(py_spy)
        sampler.focus(mode == "focused")
        sampler.follow([pid])
    elif mode == "dumps":

        def dump_every_2s() -> None:
            while not stop.wait(2.0):
                dump_stacks([pid], py_spy=py_spy)

        dumper = threading.Thread(target=dump_every_2s, daemon=True)
        dumper.start()
    cpu0, t0, s0 = children_cpu(), time.monotonic(), read_steps(progress)
    time.sleep(seconds)  # the measurement window itself
    t1, s1 = time.monotonic(), read_steps(progress)
    samples = 0
    if sampler is not None:
        sampler.flush()
        samples = sum(sum(n for _, n in s.runs) for s in sampler.take())
        sampler.close()
    if dumper is not None:
        stop.set()
        dumper.join()
    cpu1 = children_cpu()
    return {"steps_per_s": (s1 - s0) / (t1 - t0), "cpu_percent": 100.0 * (cpu1 - cpu0) / (t1 - t0), "samples": samples}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    modes = ["none", "dumps", "background", "focused"]
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="gputop-bench-sampler-") as tmp:
        tmp_path = Path(tmp)
        progress = tmp_path / "steps"
        job = subprocess.Popen(
            command(
                "--workers",
                "0",
                "--sample-ms",
                "5",
                "--batch-size",
                "4",
                "--step-ms",
                "10",
                "--length",
                "100000000",
                "--progress",
                str(progress),
                "--ready",
                str(tmp_path / "ready"),
            ),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda: ready_records(tmp_path / "ready"), 180, "the job's first step")
            for i in range(args.rounds):
                for mode in modes if i % 2 == 0 else reversed(modes):
                    results[mode].append(window(progress, job.pid, mode, args.window))
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(timeout=30)

    base = statistics.median(r["steps_per_s"] for r in results["none"])
    print(
        f"tests/jobs/train_job.py, num_workers=0, {args.rounds} x {args.window:g} s windows per mode, interleaved; {machine_line()}"
    )
    print(f"{'':<34}{'steps/s':>9}{'÷ none':>8}{'py-spy CPU %':>14}{'samples/s':>11}")
    rows = {}
    for mode, label in (
        ("none", "no sampling"),
        ("dumps", "py-spy dump every 2 s (as now)"),
        ("background", f"record, screen (≤{BACKGROUND.per_rank_hz} Hz)"),
        ("focused", f"record, report (≤{FOCUSED.per_rank_hz} Hz)"),
    ):
        steps = statistics.median(r["steps_per_s"] for r in results[mode])
        cpu = statistics.median(r["cpu_percent"] for r in results[mode])
        rate = statistics.median(r["samples"] / args.window for r in results[mode])
        rows[mode] = {
            "steps_per_s": steps,
            "ratio": steps / base if base else float("nan"),
            "cpu_percent": cpu,
            "samples_per_s": rate,
        }
        print(f"{label:<34}{steps:>9.2f}{rows[mode]['ratio']:>8.3f}{cpu:>14.2f}{rate:>11.0f}")
    emit_figure(
        "dense state sampling, one rank",
        "job steps/s ≥ 0.99 × unsampled at the screen's rate",
        f"screen {rows['background']['cpu_percent']:.2f}% of a core, ratio {rows['background']['ratio']:.3f}; "
        f"report {rows['focused']['cpu_percent']:.2f}%, ratio {rows['focused']['ratio']:.3f}",
        COMMAND,
        met=rows["background"]["ratio"] >= 0.99,
    )
    if args.json:
        print(json.dumps({"modes": rows, "windows": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
