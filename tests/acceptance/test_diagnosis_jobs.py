"""Diagnosis of real, running PyTorch jobs: real DataLoader workers, real py-spy stacks, real /proc.

No GPU and no simulation: these are the stack/CPU findings working with no GPU data at all
(this machine has no NVIDIA driver).  Each job must get its verdict within 30 s.
"""

from __future__ import annotations

import pytest

from gputop.analysis.diagnosis import severe, verdict_line
from tests.harness.attach import HEALTHY_DUMPS, VERDICT_DEADLINE_S, dumps_of
from tests.harness.processes import wait_until
from tests.harness.train_jobs import start_diagnosis_job


@pytest.mark.slow
def test_no_gpu_here(observe, spawn, tmp_path):
    # the premise of this module: no driver, so everything below rests on stacks and CPU only
    proc = start_diagnosis_job(spawn, tmp_path, "compute")
    obs = observe(proc.pid)
    if obs.pipeline.machine.gpu_error is None:
        pytest.skip("this machine has a GPU driver; the no-GPU premise does not hold")
    assert obs.step() and not obs.history.latest.gpus


@pytest.mark.slow
@pytest.mark.parametrize("mode,words", [("starved", "waits for data"), ("starved0", "in dataset code")])
def test_starved_job_is_input_bound(observe, spawn, tmp_path, mode, words):
    proc = start_diagnosis_job(spawn, tmp_path, mode)
    obs = observe(proc.pid)
    wait_until(
        lambda: obs.step()[0].id == "starvation" and obs.findings[0].severity == "critical",
        timeout=VERDICT_DEADLINE_S,
        interval=0.3,
        what=f"starvation verdict ({mode})",
        state=lambda: verdict_line(obs.findings),
    )
    top = obs.findings[0]
    assert "Input-bound (highly)" in top.summary and words in top.summary, top.summary
    assert "num_workers" in top.fix
    assert any("Samples.__getitem__" in f or "__next__" in f for f in top.frames), top.frames
    assert [f.id for f in severe(obs.findings)] == ["starvation"], verdict_line(obs.findings)


@pytest.mark.slow
def test_hung_worker_is_a_hang_with_its_frame(observe, spawn, tmp_path):
    proc = start_diagnosis_job(spawn, tmp_path, "hang")
    obs = observe(proc.pid)
    wait_until(
        lambda: obs.step()[0].id == "hang",
        timeout=VERDICT_DEADLINE_S,
        interval=0.3,
        what="hang verdict",
        state=lambda: verdict_line(obs.findings),
    )
    top = obs.findings[0]
    assert top.severity == "critical" and "a DataLoader worker is stuck in dataset code" in top.summary
    assert any(f.startswith("Samples.__getitem__ (train_job.py:") for f in top.frames), top.frames
    assert top.pids == (proc.pid,)
    assert [f.id for f in severe(obs.findings)] == ["hang"]


@pytest.mark.slow
def test_compute_bound_job_is_healthy_not_input_bound(observe, spawn, tmp_path):
    proc = start_diagnosis_job(spawn, tmp_path, "compute")
    obs = observe(proc.pid)
    # enough distinct dumps for the input fraction to count (MIN_STACK_SAMPLES and then some), and the verdict past
    # "collecting" (it waits for 4 s of the loop's dense samples, which a loaded box may take longer to gather)
    wait_until(
        lambda: obs.step() and dumps_of(obs.history, proc.pid) >= HEALTHY_DUMPS and obs.findings[0].id != "collecting",
        timeout=VERDICT_DEADLINE_S,
        interval=0.3,
        what="12 stack dumps and a verdict",
        state=lambda: verdict_line(obs.findings),
    )
    top = obs.findings[0]
    assert top.id == "healthy", verdict_line(obs.findings)
    assert "not input-bound" in top.summary
    assert not [f for f in obs.findings if f.severity in ("critical", "warning")], verdict_line(obs.findings)
