"""A fix's prediction against what the job achieves (issue 37's held-out check), shared by the integration test
(tests/test_prediction_outcome.py) and the benchmark (benchmarks/bench_prediction.py).

For one starved `tests/jobs/train_job.py` job: start it, run `gputop report --pid PID --seconds S --format json`
while counting its steps (its own `--progress` file), read the starvation finding's advice
(`figures.workers.num_workers`) and prediction (`figures.prediction`), stop it, start it again with `--workers N`
(the advice), let it warm up, and count its steps for as long again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from tests.harness.box_load import BoxLoad
from tests.harness.processes import wait_until
from tests.harness.train_jobs import REPO, command

JOBS = {  # name -> train_job options (the batch's cost and the step's)
    # the loader sleeps (I/O): more workers help until the step's 20 ms bound the job
    "io": ("--spend", "sleep", "--batch-ms", "80", "--step-ms", "20", "--workers", "1"),
    # the loader spins on the CPU: the box's two cores bound it
    "cpu": ("--spend", "cpu", "--batch-ms", "60", "--step-ms", "20", "--workers", "1"),
}
WARM_S = 4.0  # after a (re)start: the workers' start and the first batches
FIRST_STEPS_S = 120.0  # importing torch on two shared cores can be slow

Start = Callable[[Sequence[str]], subprocess.Popen]  # starts argv in a session of its own
Stop = Callable[[subprocess.Popen], None]  # kills that process and its group, and reaps it


@dataclass
class Outcome:
    job: str
    now: float  # steps/s by the job's own counter over the report's window
    advice: Optional[int] = None
    predicted: dict[str, Any] = field(default_factory=dict)  # the starvation finding's figures["prediction"]
    achieved: Optional[float] = None  # steps/s by the job's counter, restarted with the advice
    note: str = ""  # why there is no advice or prediction
    box: str = ""  # the box's load over the check (BoxLoad)

    @property
    def after(self) -> Optional[float]:
        return self.predicted.get("steps_per_s_after")

    @property
    def ratio(self) -> Optional[float]:
        return None if self.achieved is None or not self.after else self.achieved / self.after

    @property
    def in_range(self) -> bool:
        low, high = self.predicted.get("after_low"), self.predicted.get("after_high")
        if self.achieved is None or low is None:
            return False
        return low <= self.achieved <= (high if high is not None else float("inf"))

    def row(self) -> str:
        p = self.predicted
        if self.achieved is None or self.after is None:
            return f"{self.job:<4} now {self.now:.1f}  {self.note or p.get('text')}  [{self.box}]"
        high = p.get("after_high")
        return (
            f"{self.job:<4} now(job) {self.now:5.1f}  now(gputop) {p.get('steps_per_s_now') or float('nan'):5.1f}  "
            f"advice {self.advice:>2}  predicted {self.after:5.1f} ({p['after_low']:.1f}–{'' if high is None else f'{high:.1f}'})"
            f"  limited by {p['limited_by']:<20}  achieved {self.achieved:5.1f}  ach/pred {self.ratio:.2f}  "
            f"in range {self.in_range}  [{self.box}]"
        )


def steps(progress: Path) -> Optional[int]:
    try:
        return int(progress.read_text().strip() or 0)
    except (OSError, ValueError):
        return None


def rate_over(progress: Path, seconds: float) -> float:
    """The job's steps/s over the next `seconds`, by its own counter (a measurement window, not a wait)."""
    t0, s0 = time.monotonic(), steps(progress) or 0
    time.sleep(seconds)
    return ((steps(progress) or 0) - s0) / (time.monotonic() - t0)


def report(pid: int, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "gputop", "report", "--pid", str(pid), "--seconds", str(seconds), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
        cwd=REPO,
    )
    if out.returncode != 0:
        raise RuntimeError(f"gputop report failed: {out.stderr[-500:]}")
    return json.loads(out.stdout)


def _running(start: Start, options: Sequence[str], progress: Path, what: str) -> subprocess.Popen:
    job = start(command(*options, "--progress", str(progress)))
    wait_until(lambda: (steps(progress) or 0) >= 5 or job.poll() is not None, FIRST_STEPS_S, interval=0.2, what=what)
    if job.poll() is not None:
        raise RuntimeError(f"{what}: the job exited with {job.returncode}")
    time.sleep(WARM_S)  # past the warm-up: a measurement window's start, not a wait for a condition
    return job


def with_workers(options: Sequence[str], workers: int) -> tuple[str, ...]:
    """The options with `--workers N` (the one given replaced)."""
    out = list(options)
    at = out.index("--workers")
    out[at + 1] = str(workers)
    return tuple(out)


def measure(
    name: str, seconds: float, tmp: Path, start: Start, stop: Stop, reported: Callable[[], None] = lambda: None
) -> Outcome:
    """Report on the job as it is, restart it with the advice, and count what it achieves.  `reported` is called
    once the report is read (or failed), before the restart: what comes after it only counts steps."""
    box = BoxLoad()
    tmp.mkdir(parents=True, exist_ok=True)
    options = JOBS[name]
    progress = tmp / f"{name}.progress"
    try:
        job = _running(start, options, progress, f"{name}: first steps")
        try:
            t0, s0 = time.monotonic(), steps(progress) or 0
            found = report(job.pid, seconds)
            now = ((steps(progress) or 0) - s0) / (time.monotonic() - t0)
        finally:
            stop(job)
    finally:
        reported()
    starved = next((f for f in found["findings"] if f["id"] == "starvation"), None)
    if starved is None:
        return Outcome(name, now, note="no starvation finding: " + found.get("verdict", ""), box=box.since())
    advice = int(starved["figures"]["workers"]["num_workers"])
    predicted = starved["figures"].get("prediction") or {}
    fixed = with_workers(options, advice)
    progress = tmp / f"{name}.fixed.progress"
    job = _running(start, fixed, progress, f"{name}: first steps after the fix")
    try:
        achieved = rate_over(progress, seconds)
    finally:
        stop(job)
    return Outcome(name, now, advice, predicted, achieved, box=box.since())
