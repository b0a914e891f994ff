"""The demo job in tests: start `DemoJob`s with a pipeline on each, stop them all, and find their ranks."""

from __future__ import annotations

import psutil

from gputop.commands.demo import DEMO_PROFILE
from gputop.pipeline import Pipeline
from gputop.sim.demo_launcher import DemoJob


class DemoJobs:
    """Every job started here is stopped by `stop_all()` (a fixture's teardown), whatever the test did."""

    def __init__(self) -> None:
        self.started: list[tuple[DemoJob, Pipeline]] = []

    def start(self, scenario: str, **kwargs) -> tuple[DemoJob, Pipeline]:
        job = DemoJob(scenario, **kwargs)
        launcher = job.start()
        pipeline = Pipeline(simulate=DEMO_PROFILE, pid=launcher, load_model=job.load_model())
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
