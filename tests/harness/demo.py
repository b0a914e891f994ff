"""The demo job in tests: start `DemoJob`s with a pipeline on each, stop them all, and find their ranks."""

from __future__ import annotations

import io
import os

import psutil

from gputop.analysis.stack_classes import classify_main_thread
from gputop.backend import SimulatedMachine
from gputop.collect.stacks import dump_stacks
from gputop.commands.demo import observe
from gputop.pipeline import Following, Pipeline
from gputop.sim.demo_launcher import DemoJob
from gputop.sim.scenarios import DEMO_PROFILE


class DemoJobs:
    """Every job started here is stopped by `stop_all()` (a fixture's teardown), whatever the test did."""

    def __init__(self) -> None:
        self.started: list[tuple[DemoJob, Pipeline]] = []

    def start(self, scenario: str, **kwargs) -> tuple[DemoJob, Pipeline]:
        job = DemoJob(scenario, **kwargs)
        launcher = job.start()
        pipeline = Pipeline(SimulatedMachine(DEMO_PROFILE, load=job.load_model()), follow=Following(pid=launcher))
        self.started.append((job, pipeline))
        return job, pipeline

    def stop_all(self) -> None:
        for job, pipeline in self.started:
            pipeline.close()
            job.stop()


def rank_pids(job: DemoJob) -> list[int]:
    """Rank processes in rank order (the launcher's children; each carries RANK in its environment)."""
    ranks = {}
    for child in psutil.Process(job.launcher_pid).children():
        rank = child.environ().get("RANK")
        if rank is not None:
            ranks[int(rank)] = child.pid
    return [ranks[r] for r in sorted(ranks)]


def descendants(pid: int) -> list[int]:
    try:
        return [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def worker_pids(rank_pid: int) -> set[int]:
    return {c.pid for c in psutil.Process(rank_pid).children() if c.name() == "pt_data_worker"}


def main_thread_frames(pid: int) -> tuple[str, list[str]]:
    stacks = dump_stacks([pid])[pid]
    main = next((t for t in stacks.threads if t.thread_name == "MainThread"), None)
    return classify_main_thread(stacks), [f.name for f in main.frames] if main else []


def stop_and_check_nothing_left(job: DemoJob, pipeline: Pipeline) -> None:
    """Stop the job; every process it had (launcher, ranks, workers) is gone, and so is its directory."""
    pids = descendants(job.launcher_pid)
    assert len(pids) > job.config.ranks  # launcher + ranks (+ workers): we are checking real processes
    pipeline.close()
    job.stop()
    assert [p for p in pids if alive(p)] == []
    assert not os.path.exists(job.directory)
    job.stop()  # a second stop is harmless


def observe_quietly(job: DemoJob, pipeline: Pipeline, seconds: float, interval: float = 0.5):
    out = io.StringIO()
    summary = observe(job, pipeline, interval=interval, seconds=seconds, out=out)
    assert summary.samples, out.getvalue()
    return summary


def dips(values: list[float], high: float = 70.0, low: float = 35.0) -> int:
    """Falls from >= high to <= low: one per tooth of a saw-tooth."""
    count, state = 0, None
    for v in values:
        if v >= high:
            state = "high"
        elif v <= low and state == "high":
            count, state = count + 1, "low"
    return count
