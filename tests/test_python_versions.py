"""gputop (on this interpreter) attached to real PyTorch jobs running on other Python versions.

py-spy prints a 3.10 target's frames without class names, and gives its threads no native id; the
verdicts and the frames they name must not change.  Each version needs its own torch: these tests run
where pyenv has it (PYENV_ROOT, default ~/.pyenv) and are skipped elsewhere.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gputop.analysis.diagnosis import verdict_line
from tests.harness.attach import STACK_INTERVAL_S, VERDICT_DEADLINE_S
from tests.harness.processes import wait_until
from tests.harness.train_jobs import start_diagnosis_job

pytestmark = pytest.mark.slow

PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def interpreter_with_torch(minor: str) -> str:
    for candidate in sorted(PYENV_VERSIONS.glob(f"{minor}.*/bin/python")):
        if subprocess.run([str(candidate), "-c", "import torch"], capture_output=True).returncode == 0:
            return str(candidate)
    pytest.skip(f"no Python {minor} with torch under {PYENV_VERSIONS}")


def start(spawn, tmp_path, python: str, mode: str) -> int:
    return start_diagnosis_job(spawn, tmp_path, mode, python=python, timeout=120).pid


@pytest.mark.parametrize("minor", ["3.10", "3.12", "3.13"])
def test_starved_job_reads_input_bound_and_names_the_loop_line(spawn, observe, tmp_path, minor):
    pid = start(spawn, tmp_path, interpreter_with_torch(minor), "starved")
    obs = observe(pid)
    wait_until(
        lambda: obs.step()[0].id == "starvation",
        timeout=VERDICT_DEADLINE_S,
        interval=STACK_INTERVAL_S,
        what="an input-bound verdict",
        state=lambda: verdict_line(obs.findings),
    )
    top = obs.findings[0]
    assert "Input-bound (highly)" in top.summary, top.summary
    # the DataLoader's __next__ and the training loop's line, not the selector plumbing above them
    assert any("__next__ (torch/utils/data/dataloader.py:" in f for f in top.frames), top.frames
    assert any("(train_job.py:" in f for f in top.frames), top.frames


def test_hung_worker_on_310_is_a_hang_naming_its_frame(spawn, observe, tmp_path):
    pid = start(spawn, tmp_path, interpreter_with_torch("3.10"), "hang")
    obs = observe(pid)
    wait_until(
        lambda: obs.step()[0].id == "hang",
        timeout=VERDICT_DEADLINE_S,
        interval=STACK_INTERVAL_S,
        what="a hang verdict",
        state=lambda: verdict_line(obs.findings),
    )
    assert any(f.startswith("__getitem__ (train_job.py:") for f in obs.findings[0].frames), obs.findings[0].frames
