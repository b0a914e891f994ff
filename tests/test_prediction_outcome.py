"""Issue 37's check, live: a 12 s report's advice and prediction for a starved job, against the steps/s the job
achieves once restarted with the advice (tests/harness/fix_outcome.py).  Two jobs of known cost: an I/O-bound
loader, whose fix the step bounds, and a CPU-bound one, which the box's cores bound.

About 40 s a job (start, 12 s report, restart, 12 s count).  The advice, its bound and that the restarted job is
measured are asserted; achieved ÷ predicted is printed, not asserted: on the shared 2-core box it read 0.71-1.19
(I/O-bound) and 0.64-1.26 (CPU-bound, whose prediction holds only while the other sessions keep what they used),
so ±20% is a figure for `python benchmarks/bench_prediction.py` (docs/predictions.md), not a bar CI can hold."""

from __future__ import annotations

import os
import signal

import pytest

from tests.harness.fix_outcome import measure


@pytest.mark.slow
@pytest.mark.parametrize(
    "job",
    [
        # a live job whose loader sleeps.  Alone too: the prediction's cores bound reads the box, and beside shared
        # tests at a lower CPU priority (tests/harness/cpu_priority.py) the job gets more than the sessions model gives
        # it (a CI run: limited by the cores, 32.7 predicted, 42.4 achieved)
        pytest.param("io", marks=[pytest.mark.acceptance, pytest.mark.alone]),
        pytest.param("cpu", marks=pytest.mark.alone),  # the cores it gets are the CPU-bound job's bound
    ],
)
def test_the_job_restarted_with_the_advice_achieves_what_the_report_predicted(job, spawn, tmp_path):
    def stop(proc):  # the job and its workers (its process group); the fixture reaps whatever is left at teardown
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    outcome = measure(job, 12.0, tmp_path, spawn, stop)
    print("\n" + outcome.row())
    (tmp_path / "outcome.txt").write_text(outcome.row() + "\n")  # kept with the run's basetemp, for a look afterwards
    assert outcome.achieved is not None and outcome.after, outcome.row()
    if job == "io":
        assert outcome.predicted["limited_by"] in ("the step's compute", "the workers"), outcome.row()
    else:
        assert outcome.predicted["limited_by"] == "the cores", outcome.row()
        assert outcome.advice is not None and outcome.advice <= 2, outcome.row()  # two cores: at most 2 computing workers
    assert outcome.ratio is not None and outcome.predicted.get("after_low") is not None, outcome.row()
