"""Overhead on the job: steps/s of the demo's real PyTorch job with `gputop record --pid` attached vs. alone.

    python benchmarks/bench_overhead.py [--scenario starved] [--gpus 8] [--rounds 6] [--window 12] [--quick] [--json]

One job runs for the whole measurement (`gputop.sim.demo_launcher.DemoJob`: N gloo ranks, each with a
real DataLoader decoding JPEGs with Pillow; only the GPU time is simulated).  Windows alternate in ABBA
order on that same running job: A = the job alone, B = `gputop record --pid LAUNCHER -o FILE` attached
at its default settings (1 s refresh, stacks on: py-spy of every rank and worker every 2 s).  The
recorder is started before a B window and the window opens once it has written two snapshots (its
start-up is not the steady state the bar is about); it is stopped with SIGINT (its Ctrl-C path) after
the window and reaped before the next A window.  The job's steps come from its shared step counters.
Figure: median steps/s attached / median steps/s alone.  Goal >= 0.99.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import ProcessMeter, emit_figure, interleave, kill_group, machine_line, print_table, wait_for

from gputop.recording import read_recording
from gputop.sim.demo_launcher import DemoJob, StepCounters

GOAL = 0.99
COMMAND = "python benchmarks/bench_overhead.py"


def snapshots_in(path: str) -> int:
    try:
        return len(read_recording(path)[1])
    except Exception:  # not created yet, or only the header so far
        return 0


def read_step_times(path: str) -> list[tuple[int, float]]:
    """(steps, monotonic time of the last step) per rank, from the demo job's StepCounters file.

    StepCounters.read() gives the counts only; its layout (header, then <qd per rank) is read here.
    """
    with open(path, "rb") as f:
        data = f.read()
    _, slots = StepCounters._HEADER.unpack_from(data, 0)
    return [StepCounters._SLOT.unpack_from(data, StepCounters._HEADER.size + r * StepCounters._SLOT.size) for r in range(slots)]


class Windows:
    """Measures steps/s of one running DemoJob over a window, with or without gputop attached."""

    def __init__(self, job: DemoJob, window_s: float, tmp: str, interval: float) -> None:
        self.job = job
        self.window_s = window_s
        self.tmp = tmp
        self.interval = interval
        self.recorder_cpu: list[float] = []  # % of one core, gputop + its py-spy children, per B window
        self.recorder_rss: list[int] = []
        self.snapshots: list[int] = []
        self._n = 0
        self.counters_path = os.path.join(job.directory, "steps")

    def _measure(self) -> float:
        """Sum over ranks of steps/s between each rank's last step before and after the window.

        Timing from step to step (the counters keep each rank's last-step time) instead of counting
        steps in a wall-clock window: at ~1-2 steps/s per rank a 10 s window would quantize by ~10%.
        """
        if self.job.failure():
            raise SystemExit(f"bench_overhead: {self.job.failure()}")
        before = read_step_times(self.counters_path)
        time.sleep(self.window_s)  # the measurement window itself (not synchronisation)
        after = read_step_times(self.counters_path)
        rate = 0.0
        for (n0, t0), (n1, t1) in zip(before, after):
            if n1 <= n0 or t1 <= t0:
                raise SystemExit(f"bench_overhead: a rank took no step in {self.window_s:g} s (stalled job?)")
            rate += (n1 - n0) / (t1 - t0)
        return rate

    def alone(self) -> float:
        return self._measure()

    def attached(self) -> float:
        self._n += 1
        out = os.path.join(self.tmp, f"attach-{self._n}.gputop")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gputop",
                "record",
                "--pid",
                str(self.job.launcher_pid),
                "-o",
                out,
                "--interval",
                str(self.interval),
            ],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_for(lambda: proc.poll() is not None or snapshots_in(out) >= 2, 60, "gputop record's 2nd snapshot")
            if proc.poll() is not None:
                raise SystemExit(f"bench_overhead: gputop record exited: {proc.stderr.read().decode().strip()}")
            meter = ProcessMeter(proc.pid)
            before = meter.read()
            value = self._measure()
            after = meter.read()
            self.recorder_cpu.append(ProcessMeter.cpu_percent(before, after))
            self.recorder_rss.append(after.rss)
            proc.send_signal(signal.SIGINT)  # gputop's Ctrl-C: stop and close the file
            _, err = proc.communicate(timeout=30)
            if proc.returncode != 0:
                raise SystemExit(f"bench_overhead: gputop record failed ({proc.returncode}): {err.decode().strip()}")
            self.snapshots.append(snapshots_in(out))
            os.unlink(out)
            return value
        finally:
            if proc.poll() is None:
                kill_group(proc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="starved", help="demo scenario the job runs (default starved)")
    ap.add_argument("--gpus", type=int, default=8, help="ranks / simulated GPUs (default 8)")
    ap.add_argument("--rounds", type=int, default=6, help="A/B pairs, even keeps ABBA balanced (default 6)")
    ap.add_argument("--window", type=float, default=12.0, help="seconds per window (default 12)")
    ap.add_argument("--interval", type=float, default=1.0, help="gputop's refresh (default 1, its default)")
    ap.add_argument("--quick", action="store_true", help="<= ~1 min: 2 ranks, 2 pairs of 6 s windows")
    ap.add_argument("--json", action="store_true", help="also print the raw windows as JSON")
    args = ap.parse_args()
    if args.quick:
        args.gpus, args.rounds, args.window = min(args.gpus, 2), 2, 6.0

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gputop-bench-overhead-") as tmp, DemoJob(args.scenario, gpus=args.gpus) as job:
        job.start()
        job.wait_until_training()
        windows = Windows(job, args.window, tmp, args.interval)
        windows._measure()  # settle: every rank past its first steps, page cache warm (not counted)

        def show(side: str, pair: int, value: float) -> None:
            label = "alone" if side == "A" else "gputop record --pid attached"
            print(f"  pair {pair + 1}: {label:<30} {value:7.2f} steps/s", file=sys.stderr, flush=True)

        result = interleave(windows.alone, windows.attached, args.rounds, on_window=show)
        config = job.config.describe()

    ratio = result.ratio
    print(f"Overhead on the job: demo scenario {args.scenario!r}, {args.gpus} ranks ({config})")
    print(
        f"{args.rounds} A/B pairs of {args.window:g} s windows, ABBA order, one running job; {machine_line()}; "
        f"took {time.monotonic() - started:.0f} s"
    )
    print_table(
        ["steps/s of the whole job", "median", "min", "max"],
        [
            ["alone (A)", result.median_a, min(result.a), max(result.a)],
            ["gputop record --pid (B)", result.median_b, min(result.b), max(result.b)],
        ],
        spec=".2f",
    )
    pairs = ", ".join(f"{r:.3f}" for r in result.pair_ratios)
    print(f"ratio B/A (median/median): {ratio:.3f}   per pair: {pairs}   goal >= {GOAL}: {'met' if ratio >= GOAL else 'NOT met'}")
    if windows.recorder_cpu:
        cpu = sorted(windows.recorder_cpu)[len(windows.recorder_cpu) // 2]
        rss = max(windows.recorder_rss) / 2**20
        print(
            f"gputop record itself (with its py-spy children): median {cpu:.1f}% of one core, RSS <= {rss:.0f} MiB; "
            f"snapshots per attached window: {windows.snapshots}"
        )
    quick = " --quick" if args.quick else ""
    emit_figure("Overhead on the job (steps/s attached / alone)", f">= {GOAL}", f"{ratio:.3f}", COMMAND + quick, ratio >= GOAL)
    if args.json:
        print(
            json.dumps(
                {
                    "alone": result.a,
                    "attached": result.b,
                    "order": result.order,
                    "ratio": ratio,
                    "recorder_cpu_percent": windows.recorder_cpu,
                    "goal": GOAL,
                }
            )
        )
    return 0 if ratio >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
