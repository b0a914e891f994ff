"""GPM live: a real PyTorch job (the demo's, torch on the CPU) drives the simulated H100s, its kernels declaring
what they keep busy from the dtype they really computed in, and gputop's real pipeline reads it back through
NVML's GPM calls (the fake below the real pynvml wrappers).  Slow: real ranks, DataLoader workers and py-spy."""

from __future__ import annotations

import pytest

from gputop.analysis.checks import hang
from gputop.analysis.diagnosis import verdict_line
from gputop.pipeline import Pipeline
from gputop.sim.demo_launcher import DemoJob
from tests.harness.attach import Observer
from tests.harness.processes import wait_until

STARTUP_S = 240.0
RANKS = 2  # GPUs 0 and 1 work; the other six idle (and get no kernel verdict: an idle GPU's kernels are no problem)
JUDGED_S = 60.0


@pytest.fixture
def attached():
    """attached(scenario, **DemoJob kwargs) -> an Observer on a job that has started training; all stopped at teardown."""
    started: list[tuple[DemoJob, Observer]] = []

    def start(scenario: str, **kwargs) -> Observer:
        job = DemoJob(scenario, gpus=RANKS, **kwargs)
        job.start()
        observer = None
        try:
            job.wait_until_training(timeout=STARTUP_S)
            pipeline = Pipeline(simulate="h100-sxm-8", pid=job.launcher_pid, load_model=job.load_model())
            observer = Observer(job.launcher_pid, pipeline=pipeline)
        finally:
            started.append((job, observer))
        return observer

    yield start
    for job, observer in started:
        if observer is not None:
            observer.close()
        job.stop()


def _working(obs: Observer, gpu: int, samples: int = 5) -> list:
    """The GPU's last `samples` GPM readings if they are all of a busy GPU (else [])."""
    recent = [g for s in list(obs.history)[-samples:] for g in s.gpus if g.index == gpu]
    if len(recent) < samples or any(g.gpm is None or (g.utilization_gpu or 0) < 50 for g in recent):
        return []
    return recent


@pytest.mark.slow
def test_a_fp32_job_gets_the_amp_finding_live(attached):
    obs = attached("tuned")
    amp = wait_until(
        lambda: next((f for f in obs.step() if f.id == "no_tensor_cores"), None),
        timeout=JUDGED_S,
        interval=1.0,
        what="the tuned fp32 job's AMP finding",
    )
    assert set(amp.gpus) == {0, 1} and "bf16 autocast" in amp.summary
    for gpu in (0, 1):
        assert all(g.gpm.tensor_active == 0.0 and g.gpm.fp32_active > 20.0 for g in _working(obs, gpu))


@pytest.mark.slow
def test_the_same_job_under_bf16_autocast_does_not(attached):
    obs = attached("tuned-amp")
    # judged once both GPUs have been busy on the tensor cores for the samples a verdict needs
    wait_until(
        lambda: obs.step() and all(_working(obs, gpu) and _working(obs, gpu)[-1].gpm.tensor_active > 30.0 for gpu in (0, 1)),
        timeout=JUDGED_S,
        interval=1.0,
        what="the bf16 job's GPUs busy on the tensor cores",
    )
    for _ in range(3):
        assert "no_tensor_cores" not in [f.id for f in obs.step()]


@pytest.mark.slow
def test_nccl_hang_demo_is_found_from_sm_activity_alone(attached, monkeypatch):
    monkeypatch.setattr(hang, "SPIN_POWER_MAX_SHARE", 0.0)  # the power heuristic off: no power passes it
    obs = attached("nccl-hang", collective_timeout_s=600.0)
    found = wait_until(
        lambda: next((f for f in obs.step() if f.id == "hang" and "spin" in f.summary), None),
        timeout=120.0,
        interval=1.0,
        what="the nccl-hang verdict from SM activity",
        state=lambda: verdict_line(obs.findings),
    )
    assert any("of its SMs active" in line and "spinning" in line for line in found.evidence), found.evidence
