"""Each `gputop demo` scenario - a real PyTorch job on the simulated machine - gets the right verdict within
30 s of training, and nothing else scores as severe (critical)."""

from __future__ import annotations

import time

import pytest

from gputop.analysis.diagnosis import diagnose, severe, verdict_line
from gputop.history import History
from gputop.pipeline import Pipeline
from gputop.sim.demo_launcher import DemoJob
from tests.helpers import wait_until

VERDICT_DEADLINE_S = 30.0
RANKS = 4  # 4 ranks start faster on a small box than 8; the profiles are the same
STARTUP_S = 240.0


class DemoObserver:
    """The demo job on the simulated 8-GPU machine, polled once a second like the TUI does."""

    def __init__(self, job: DemoJob, pid: int) -> None:
        self.pipeline = Pipeline(simulate="h100-sxm-8", pid=pid, load_model=job.load_model())
        self.history = History(self.pipeline.machine)
        self.findings: list = []

    def step(self) -> list:
        self.history.append(self.pipeline.poll())
        self.findings = diagnose(self.history)
        return self.findings


@pytest.fixture
def demo():
    started: list[tuple[DemoJob, DemoObserver]] = []

    def start(scenario: str) -> DemoObserver:
        job = DemoJob(scenario, gpus=RANKS)
        pid = job.start()
        observer = None
        try:
            job.wait_until_training(timeout=STARTUP_S)
            observer = DemoObserver(job, pid)
        finally:
            started.append((job, observer))
        return observer

    yield start
    for job, observer in started:
        if observer is not None:
            observer.pipeline.close()
        job.stop()


def _top_is(obs: DemoObserver, finding_id: str, min_polls: int = 0) -> bool:
    findings = obs.step()
    return len(obs.history) >= min_polls and findings[0].id == finding_id


@pytest.mark.parametrize(
    "scenario,finding_id,words",
    [
        ("starved", "starvation", "Input-bound (highly)"),
        ("hiccup", "hiccup", "epoch-boundary worker restarts"),
        ("misfire", "hang", "a DataLoader worker is stuck in dataset code"),
        ("single-gpu", "misplacement", f"{RANKS} ranks share GPU 0; 7 of 8 GPUs idle"),
    ],
)
def test_demo_scenario_gets_its_verdict(demo, scenario, finding_id, words):
    obs = demo(scenario)
    started = time.monotonic()
    wait_until(lambda: _top_is(obs, finding_id), timeout=VERDICT_DEADLINE_S, interval=1.0, what=f"{scenario}: {finding_id} verdict")
    assert time.monotonic() - started <= VERDICT_DEADLINE_S + 5
    top = obs.findings[0]
    assert top.severity == "critical" and words in top.summary, verdict_line(obs.findings)
    assert [f.id for f in severe(obs.findings)] == [finding_id], [(f.id, f.summary) for f in severe(obs.findings)]


def test_demo_tuned_is_healthy_not_input_bound(demo):
    obs = demo("tuned")
    # healthy needs enough stack dumps to say "not input-bound" (collecting until then)
    wait_until(lambda: _top_is(obs, "healthy", min_polls=15), timeout=VERDICT_DEADLINE_S, interval=1.0, what="tuned: healthy verdict")
    assert "not input-bound" in obs.findings[0].summary, verdict_line(obs.findings)
    assert not [f for f in obs.findings if f.severity in ("critical", "warning")], verdict_line(obs.findings)
