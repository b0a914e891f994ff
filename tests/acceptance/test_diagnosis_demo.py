"""`gputop demo`'s attach path live: a real PyTorch job on the simulated machine gets the right verdict within
30 s of attaching, nothing else scores as severe (critical), and what the machine shows agrees: demo job ->
py-spy -> findings, end to end.

One scenario runs live here (starved: a class-scoped job, stopped when its class ends, so no other test shares
the cores with it; the verdict test comes first, attached right after the ranks start training).  Every
scenario's verdict, figures and words, and what its machine shows, are checked on recordings of the same job
in tests/test_demo_replays.py (issue 38: verdicts by replay).
"""

from __future__ import annotations

import time

import pytest

from gputop.analysis.diagnosis import severe, verdict_line
from gputop.analysis.stack_classes import IN_DATASET
from gputop.backend import SimulatedMachine
from gputop.pipeline import Following, Pipeline
from gputop.sim.demo_launcher import DemoJob
from tests.harness.attach import Observer
from tests.harness.box_load import BoxLoad
from tests.harness.demo import (
    main_thread_frames,
    observe_quietly,
    rank_pids,
    stop_and_check_nothing_left,
)
from tests.harness.processes import wait_until

VERDICT_DEADLINE_S = 30.0
RANKS = 4  # 4 ranks start faster on a small box than 8; the profiles are the same
STARTUP_S = 240.0


def _start_training(scenario: str) -> DemoJob:
    """A demo job whose every rank has taken a step; stopped here if it never gets there."""
    job = DemoJob(scenario, gpus=RANKS)
    job.start()
    try:
        job.wait_until_training(timeout=STARTUP_S)
    except BaseException:
        job.stop()
        raise
    return job


def _attach(job: DemoJob) -> Observer:
    """Polled once a second like the TUI does, on the simulated 8-GPU machine the demo drives."""
    pipeline = Pipeline(SimulatedMachine("h100-sxm-8", load=job.load_model()), follow=Following(pid=job.launcher_pid))
    return Observer(job.launcher_pid, pipeline=pipeline)


@pytest.fixture
def attach():
    """attach(job) -> a fresh Observer on a running job (its own pipeline and history); closed at teardown."""
    made: list[Observer] = []

    def make(job: DemoJob) -> Observer:
        made.append(_attach(job))
        return made[-1]

    yield make
    for observer in made:
        observer.close()


def _shared_job(scenario: str):
    """A class-scoped fixture (a class attribute): one `scenario` job for the tests of the class, stopped when
    the class ends."""

    @pytest.fixture(scope="class")
    def job(self):
        started = _start_training(scenario)
        yield started
        started.stop()

    return job


def _top_is(obs: Observer, finding_id: str, min_polls: int = 0) -> bool:
    findings = obs.step()
    return len(obs.history) >= min_polls and findings[0].id == finding_id


def _verdict_is(obs: Observer, finding_id: str, words: str, severities: tuple[str, ...]) -> bool:
    top = obs.step()[0]
    return top.id == finding_id and words in top.summary and top.severity in severities


def _assert_verdict(obs: Observer, scenario: str, finding_id: str, words: str, severities: tuple[str, ...]) -> None:
    """The whole verdict (finding, cause and stuck frame) within the deadline, not just its headline, and
    nothing else scored as severe."""
    box = BoxLoad()
    started = time.monotonic()
    wait_until(
        lambda: _verdict_is(obs, finding_id, words, severities),
        timeout=VERDICT_DEADLINE_S,
        interval=1.0,
        what=f"{scenario}: {finding_id} verdict naming {words!r}",
        state=lambda: verdict_line(obs.findings),
    )
    assert time.monotonic() - started <= VERDICT_DEADLINE_S + 5, box.since()
    others = [(f.id, f.summary) for f in severe(obs.findings) if f is not obs.findings[0]]
    assert not others, others  # nothing else scores as severe


@pytest.mark.slow
class TestStarved:
    job = _shared_job("starved")

    def test_verdict(self, job, attach):
        _assert_verdict(attach(job), "starved", "starvation", "Input-bound (highly)", ("critical",))

    def test_gpus_mostly_idle_while_ranks_decode(self, job, attach):
        pipeline = attach(job).pipeline
        summary = observe_quietly(job, pipeline, seconds=8)
        means = summary.mean_util()
        assert all(5 < means[g] < 50 for g in range(RANKS)), means
        assert all(means[g] == 0 for g in range(RANKS, 8)), means  # GPUs without a rank stay idle
        # num_workers=0: the rank's main thread runs the dataset itself (Pillow decoding, storage reads)
        rank0 = rank_pids(job)[0]
        state, frames = wait_until(
            lambda: (lambda r: r if r[0] == IN_DATASET else None)(main_thread_frames(rank0)),
            timeout=30,
            what="rank 0's main thread inside the dataset",
        )
        assert "JpegDataset.__getitem__" in frames
        stop_and_check_nothing_left(job, pipeline)
