"""Does a fix buy what gputop says?  A 12 s report's prediction against what the job achieves once restarted
with the advice.

For each job (`tests/jobs/train_job.py`, a starved loader of known cost): start it, run `gputop report --pid PID
--seconds 12 --format json` while counting its steps (its own `--progress` file), read the starvation finding's
advice (`figures.workers.num_workers`) and prediction (`figures.prediction`), stop it, start it again with
`--workers N` (the advice), let it warm up, and count its steps for as long again.  One row per job:

    job        now(job)  now(gputop)  advice  predicted (range)        limited by       achieved  ach/pred  in range

The jobs: an I/O-bound loader (samples spent asleep: more workers help until the step's compute bounds the job)
and a CPU-bound one (samples spent spinning on the CPU: two cores bound it).  The box is shared, so each row is
one measurement as it fell; run it again for another.

Usage: python benchmarks/bench_prediction.py [--seconds 12] [--only io|cpu]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import kill_group, machine_line, wait_for  # noqa: E402
from tests.harness.train_jobs import command  # noqa: E402

JOBS = {  # name -> train_job options (the batch's cost and the step's)
    "io": ("--spend", "sleep", "--batch-ms", "80", "--step-ms", "20", "--workers", "1"),
    "cpu": ("--spend", "cpu", "--batch-ms", "60", "--step-ms", "20", "--workers", "1"),
}
WARM_S = 4.0  # after a restart: the workers' start and the first batches


def _steps(progress: Path) -> Optional[int]:
    try:
        return int(progress.read_text().strip() or 0)
    except (OSError, ValueError):
        return None


def _start(options: tuple[str, ...], progress: Path) -> subprocess.Popen:
    return subprocess.Popen(command(*options, "--progress", str(progress)), start_new_session=True)


def _rate_over(progress: Path, seconds: float) -> float:
    """The job's steps/s over the next `seconds`, by its own counter."""
    t0, s0 = time.monotonic(), _steps(progress) or 0
    time.sleep(seconds)
    return ((_steps(progress) or 0) - s0) / (time.monotonic() - t0)


def _report(pid: int, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "gputop", "report", "--pid", str(pid), "--seconds", str(seconds), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        cwd=REPO,
    )
    if out.returncode != 0:
        raise SystemExit(f"gputop report failed: {out.stderr[-500:]}")
    return json.loads(out.stdout)


def measure(name: str, seconds: float, tmp: Path) -> dict[str, Any]:
    options = JOBS[name]
    progress = tmp / f"{name}.progress"
    job = _start(options, progress)
    try:
        wait_for(lambda: (_steps(progress) or 0) >= 5, 120, f"{name}: first steps")
        time.sleep(WARM_S)
        t0, s0 = time.monotonic(), _steps(progress) or 0
        report = _report(job.pid, seconds)
        now = ((_steps(progress) or 0) - s0) / (time.monotonic() - t0)
    finally:
        kill_group(job)
    starved = next((f for f in report["findings"] if f["id"] == "starvation"), None)
    if starved is None:
        return {"job": name, "now": now, "note": "no starvation finding: " + report.get("verdict", "")}
    advice = int(starved["figures"]["workers"]["num_workers"])
    predicted = starved["figures"].get("prediction") or {}
    fixed = tuple(o for o in options if o not in ("--workers", "1")) + ("--workers", str(advice))
    progress2 = tmp / f"{name}.fixed.progress"
    job = _start(fixed, progress2)
    try:
        wait_for(lambda: (_steps(progress2) or 0) >= 5, 120, f"{name}: first steps after the fix")
        time.sleep(WARM_S)
        achieved = _rate_over(progress2, seconds)
    finally:
        kill_group(job)
    return {"job": name, "now": now, "advice": advice, "predicted": predicted, "achieved": achieved}


def row(result: dict[str, Any]) -> str:
    p = result.get("predicted") or {}
    if "achieved" not in result or p.get("speedup") is None:
        return f"{result['job']:<5} now {result['now']:.1f}  {result.get('note') or p.get('text')}"
    after, low, high = p.get("steps_per_s_after"), p.get("after_low"), p.get("after_high")
    if after is None:  # gputop counted no steps: its factor over the job's own rate
        after, low = p["speedup"] * result["now"], p["speedup_low"] * result["now"]
        high = None if p.get("speedup_high") is None else p["speedup_high"] * result["now"]
        p = {**p, "steps_per_s_now": float("nan")}
    ratio = result["achieved"] / after
    inside = low <= result["achieved"] <= (high if high is not None else float("inf"))
    return (
        f"{result['job']:<5} now(job) {result['now']:6.1f}  now(gputop) {p['steps_per_s_now']:6.1f}  "
        f"advice {result['advice']:>2}  predicted {after:6.1f} ({low:.1f}–{'' if high is None else f'{high:.1f}'})  "
        f"limited by {p['limited_by']:<20}  achieved {result['achieved']:6.1f}  ach/pred {ratio:.2f}  in range {inside}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--only", choices=sorted(JOBS))
    args = parser.parse_args()
    print(machine_line())
    with tempfile.TemporaryDirectory() as tmp:
        for name in [args.only] if args.only else list(JOBS):
            result = measure(name, args.seconds, Path(tmp))
            print(row(result), flush=True)
            print("  " + json.dumps(result.get("predicted", {}).get("text")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
