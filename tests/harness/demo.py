"""The demo job in tests: start `DemoJob`s with a pipeline on each, stop them all, and find their ranks."""

from __future__ import annotations

import inspect

import psutil

from gputop.analysis.stack_classes import classify_main_thread, main_thread
from gputop.collect.stacks import dump_stacks

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


def item_line() -> int:
    """The line of `running_loss += loss.item()` in demo_job.py: where py-spy must show a parked host."""
    from gputop.sim import demo_job

    lines, first = inspect.getsourcelines(demo_job.train)
    return first + next(i for i, text in enumerate(lines) if "running_loss += loss.item()" in text)


def innermost(pid: int):
    """(state, innermost frame) of the rank's main thread, from a real py-spy dump."""
    stacks = dump_stacks([pid])[pid]
    thread = main_thread(stacks)
    return classify_main_thread(stacks), (thread.frames[0] if thread and thread.frames else None)
