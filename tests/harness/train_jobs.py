"""Helpers for the loader-benchmark tests: start `train_job.py`, read its step log, compute the truth."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tests.harness.processes import wait_until

REPO = str(Path(__file__).resolve().parents[2])
JOB = str(Path(REPO) / "tests" / "bench_jobs" / "train_job.py")
DIAGNOSIS_JOB = str(Path(REPO) / "tests" / "diagnosis_job.py")


@dataclass(frozen=True)
class Step:
    step: int
    loss_hex: str
    wait_s: float
    t: float  # time.perf_counter() in the job == time.monotonic() here (both CLOCK_MONOTONIC)


@dataclass
class Job:
    proc: object
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def steps(self) -> list[Step]:
        out = []
        for line in self.log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:  # a line being written has fewer fields
                out.append(Step(int(parts[0]), parts[1], float(parts[2]), float(parts[3])))
        return out

    def wait_steps(self, n: int, timeout: float = 60.0) -> list[Step]:
        return wait_until(lambda: (s := self.steps()) and len(s) >= n and s, timeout=timeout,
                          what=f"job {self.pid} to finish {n} steps")


def start_job(spawn, tmp_path: Path, name: str, *args: str, warm_steps: int = 8) -> Job:
    """Start the job (python directly, not a shim, so its PID is the interpreter) and wait until warm.

    The first optimizer steps import lazily; `warm_steps` keeps them out of any measurement.
    """
    log = tmp_path / f"{name}.log"
    proc = spawn([sys.executable, JOB, "--losses", str(log), *args], cwd=REPO,
                 stdout=open(tmp_path / f"{name}.out", "w"), stderr=open(tmp_path / f"{name}.err", "w"))
    job = Job(proc, log)
    wait_until(log.exists, timeout=60, what="the job's step log")
    job.wait_steps(warm_steps)
    return job


def truth(steps: list[Step], t0: float, t1: float) -> Optional[dict]:
    """The job's own view of [t0, t1]: batches/s and the fraction of time inside next()."""
    inside = [s for s in steps if t0 <= s.t <= t1]
    if len(inside) < 3:
        return None
    span = inside[-1].t - inside[0].t
    waits = sum(s.wait_s for s in inside[1:])  # the waits that happened inside the span
    return {"batches_per_s": (len(inside) - 1) / span, "wait_fraction": waits / span,
            "wait_per_batch_s": waits / (len(inside) - 1)}


def start_diagnosis_job(spawn, tmp_path: Path, mode: str):
    """Start tests/diagnosis_job.py in `mode` (starved, compute, hung worker, ...) and wait for its first batch."""
    ready = tmp_path / f"{mode}.ready"
    proc = spawn([sys.executable, DIAGNOSIS_JOB, "--mode", mode, "--ready", str(ready)])
    wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=60, what=f"{mode} job's first batch")
    assert proc.poll() is None, f"{mode} job exited with {proc.returncode}"
    return proc
