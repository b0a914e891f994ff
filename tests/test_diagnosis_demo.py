"""Each `gputop demo` scenario - a real PyTorch job on the simulated machine - gets the right verdict within
30 s of attaching, and nothing else scores as severe (critical): demo job -> py-spy -> findings."""

from __future__ import annotations

import inspect
import time

import pytest

from gputop.analysis.diagnosis import severe, verdict_line
from gputop.model import LABEL_CODE
from gputop.pipeline import Pipeline
from gputop.sim.demo_launcher import DemoJob
from tests.harness.attach import Observer
from tests.harness.processes import wait_until

VERDICT_DEADLINE_S = 30.0
RANKS = 4  # 4 ranks start faster on a small box than 8; the profiles are the same
STARTUP_S = 240.0


@pytest.fixture
def demo():
    started: list[tuple[DemoJob, Observer]] = []

    def start(scenario: str) -> Observer:
        job = DemoJob(scenario, gpus=RANKS)
        pid = job.start()
        observer = None
        try:
            job.wait_until_training(timeout=STARTUP_S)
            # polled once a second like the TUI does, on the simulated 8-GPU machine the demo drives
            pipeline = Pipeline(simulate="h100-sxm-8", pid=pid, load_model=job.load_model())
            observer = Observer(pid, pipeline=pipeline)
        finally:
            started.append((job, observer))
        return observer

    yield start
    for job, observer in started:
        if observer is not None:
            observer.close()
        job.stop()


def _top_is(obs: Observer, finding_id: str, min_polls: int = 0) -> bool:
    findings = obs.step()
    return len(obs.history) >= min_polls and findings[0].id == finding_id


def _verdict_is(obs: Observer, finding_id: str, words: str, severities: tuple[str, ...]) -> bool:
    top = obs.step()[0]
    return top.id == finding_id and words in top.summary and top.severity in severities


@pytest.mark.slow
@pytest.mark.parametrize(
    "scenario,finding_id,words,severities",
    [
        ("starved", "starvation", "Input-bound (highly)", ("critical",)),
        # the demo's saw-tooth loses ~20% of the GPUs' time on a 2-core box: right at the line between a
        # warning and a critical finding, so either is a right verdict; what it is and why must be right
        ("hiccup", "hiccup", "epoch-boundary worker restarts", ("critical", "warning")),
        ("misfire", "hang", "a DataLoader worker is stuck in dataset code", ("critical",)),
        ("single-gpu", "misplacement", f"{RANKS} ranks share GPU 0; 7 of 8 GPUs idle", ("critical",)),
    ],
)
def test_demo_scenario_gets_its_verdict(demo, scenario, finding_id, words, severities):
    obs = demo(scenario)
    started = time.monotonic()
    # the whole verdict (finding, cause and stuck frame) within the deadline, not just its headline
    wait_until(
        lambda: _verdict_is(obs, finding_id, words, severities),
        timeout=VERDICT_DEADLINE_S,
        interval=1.0,
        what=f"{scenario}: {finding_id} verdict naming {words!r}",
    )
    assert time.monotonic() - started <= VERDICT_DEADLINE_S + 5
    others = [(f.id, f.summary) for f in severe(obs.findings) if f is not obs.findings[0]]
    assert not others, others  # nothing else scores as severe


@pytest.mark.slow
def test_demo_tuned_is_healthy_not_input_bound(demo):
    obs = demo("tuned")
    # healthy needs enough stack dumps to say "not input-bound" (collecting until then)
    wait_until(lambda: _top_is(obs, "healthy", min_polls=15), timeout=VERDICT_DEADLINE_S, interval=1.0, what="tuned: healthy verdict")
    assert "not input-bound" in obs.findings[0].summary, verdict_line(obs.findings)
    assert not [f for f in obs.findings if f.severity in ("critical", "warning")], verdict_line(obs.findings)


def _text(finding) -> str:
    return "\n".join((finding.summary, *finding.evidence, *finding.frames, finding.fix))


@pytest.mark.slow
def test_demo_nccl_hang_names_the_rank_and_its_stuck_worker(demo):
    """One rank's worker hangs; the others' GPUs spin in the all-reduce and their hosts park at loss.item():
    busy GPUs, yet a hang, blamed on the rank whose stack differs."""
    obs = demo("nccl-hang")
    culprit = RANKS // 2  # scenarios.resolve: hang_rank = ranks // 2

    def verdict():
        top = obs.step()[0]
        # the culprit rank, the frame its worker is stuck in, and the advice for both the worker and NCCL
        return (
            top.id == "hang"
            and top.severity == "critical"
            and f"rank {culprit}" in top.summary
            and "JpegDataset.__getitem__" in _text(top)
            and "timeout=" in top.fix
            and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in top.fix
        )

    wait_until(
        verdict,
        timeout=VERDICT_DEADLINE_S,
        interval=1.0,
        what=f"a hang verdict naming rank {culprit}, its stuck worker's frame, a DataLoader timeout and NCCL advice",
    )
    others = [(f.id, f.summary) for f in severe(obs.findings) if f is not obs.findings[0]]
    assert not others, others


@pytest.mark.slow
def test_demo_eval_on_rank0_is_healthy_not_a_straggler(demo):
    """Rank 0 evaluates every 40 steps while the others wait in a barrier: by design, not a problem."""
    obs = demo("eval-rank0")
    started = time.monotonic()
    wait_until(lambda: _top_is(obs, "healthy", min_polls=15), timeout=VERDICT_DEADLINE_S, interval=1.0, what="eval-rank0: healthy")
    # and it stays so over the following evaluations (one every ~10 s, ~2.7 s long)
    while time.monotonic() - started < VERDICT_DEADLINE_S:
        findings = obs.step()
        flagged = [(f.id, f.severity, f.summary) for f in findings if f.severity in ("critical", "warning") or f.id == "straggler"]
        assert not flagged, flagged
        time.sleep(1.0)  # noqa: the poll interval, like the TUI's


def _item_line() -> int:
    from gputop.sim import demo_job

    lines, first = inspect.getsourcelines(demo_job.train)
    return first + next(i for i, text in enumerate(lines) if "running_loss += loss.item()" in text)


@pytest.mark.slow
def test_demo_sync_bound_names_the_item_line(demo):
    """loss.item() every step: host and GPU take turns (GPUs ~55%).  The verdict is the user's code, a sync in
    the loop, naming the line."""
    obs = demo("sync-bound")
    where = f"demo_job.py:{_item_line()}"

    def verdict():
        top = obs.step()[0]
        return top.severity in ("critical", "warning") and where in _text(top) and "sync" in top.summary.lower()

    wait_until(verdict, timeout=VERDICT_DEADLINE_S, interval=1.0, what=f"a sync verdict naming {where}")
    top = obs.findings[0]
    assert top.label == LABEL_CODE, top
    assert "loss.item()" in _text(top), _text(top)
    assert top.id not in ("starvation", "hang", "straggler"), top
