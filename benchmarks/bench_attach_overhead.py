"""Does attaching gputop slow the job?  Steps/s of a real PyTorch loop with and without `gputop record --pid`.

    python benchmarks/bench_attach_overhead.py [--rounds 4] [--window 10] [--workers 4] [--json]

Starts tests/jobs/train_job.py (DataLoader workers decoding for --getitem-ms, a simulated GPU step of
--step-ms), then alternates windows without gputop and with `gputop record --pid JOB` (1 s refresh,
stacks on: py-spy of every job PID every 2 s, the defaults) in the same run, so both see the same load.
The bar: steps/s attached >= 0.99 x detached (ratio of medians).  Kills everything it started.
"""

from __future__ import annotations

import argparse
import json
import os
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

from tests.harness.train_jobs import attach_loop_command, ready_records  # noqa: E402

BAR = 0.99
WARMUP_S = 1.5  # gputop's own start (imports, first /proc scan) is not the steady state we measure


def read_steps(path: Path) -> int:
    text = path.read_text().strip()
    return int(text) if text else 0


def steps_per_s(progress: Path, seconds: float) -> float:
    t0, s0 = time.monotonic(), read_steps(progress)
    time.sleep(seconds)  # the measurement window itself
    t1, s1 = time.monotonic(), read_steps(progress)
    return (s1 - s0) / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="pairs of windows (detached, attached)")
    ap.add_argument("--window", type=float, default=10.0, help="seconds per window")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--getitem-ms", type=float, default=10.0)
    ap.add_argument("--step-ms", type=float, default=30.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="gputop-bench-attach-") as tmp:
        tmp_path = Path(tmp)
        progress = tmp_path / "steps"
        job = subprocess.Popen(
            attach_loop_command(
                "--workers",
                str(args.workers),
                "--persistent",
                "--length",
                "100000000",
                "--sample-ms",
                str(args.getitem_ms),
                "--step-ms",
                str(args.step_ms),
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
        gputop = None
        detached, attached = [], []
        try:
            wait_for(lambda: ready_records(tmp_path / "ready"), 180, "the job's first step")
            steps_per_s(progress, 2.0)  # let the workers' prefetch settle
            for _ in range(args.rounds):
                detached.append(steps_per_s(progress, args.window))
                gputop = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "gputop",
                        "record",
                        "--pid",
                        str(job.pid),
                        "--interval",
                        "1",
                        "--seconds",
                        str(args.window + WARMUP_S + 1.0),
                        "-o",
                        str(tmp_path / "rec.gputop"),
                    ],
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                time.sleep(WARMUP_S)  # skip gputop's start-up, not a synchronisation
                attached.append(steps_per_s(progress, args.window))
                _, err = gputop.communicate(timeout=60)
                if gputop.returncode != 0:
                    raise SystemExit(f"bench_attach_overhead: gputop record failed: {err.decode().strip()}")
                gputop = None
        finally:
            for proc in (gputop, job):
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)

    off, on = statistics.median(detached), statistics.median(attached)
    ratio = on / off if off else float("nan")
    print(
        f"steps/s of tests/jobs/train_job.py ({args.workers} workers), {args.rounds} x {args.window:g} s "
        f"windows each, interleaved, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    print(f"{'':<26}{'median':>9}{'min':>9}{'max':>9}")
    for name, values in (("without gputop", detached), ("gputop record --pid", attached)):
        print(f"{name:<26}{statistics.median(values):>9.2f}{min(values):>9.2f}{max(values):>9.2f}")
    print(f"ratio attached/detached: {ratio:.3f}   bar >= {BAR}: {'met' if ratio >= BAR else 'NOT met'}")
    if args.json:
        print(json.dumps({"detached": detached, "attached": attached, "ratio": ratio, "bar": BAR}))
    return 0 if ratio >= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
