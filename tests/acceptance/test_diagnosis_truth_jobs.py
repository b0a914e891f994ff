"""Real jobs, real py-spy, real /proc, through `gputop report --format json` (issue 11's Done-when bars):
slow but steady loaders are never called hung, and a worker that hung before gputop attached is found
in a 12 s report, with no high-severity starvation finding beside it."""

from __future__ import annotations

import json
import time

import pytest

from tests.harness.processes import run_gputop
from tests.harness.train_jobs import start_diagnosis_job

# Issue 11's 10 reports in a row per slow loader run beside issue 21's series, in tests/test_numbers_hold_still.py
REPORT_SECONDS = 12


def _report_args(pid: int) -> tuple[str, ...]:
    return ("report", "--pid", str(pid), "--seconds", str(REPORT_SECONDS), "--format", "json")


def _json(ran) -> dict:
    assert ran.rc == 0, ran.err
    return json.loads(ran.out)


def _report(spawn, pid: int) -> dict:
    return _json(run_gputop(spawn, *_report_args(pid), timeout=120))


@pytest.mark.slow
@pytest.mark.load_tolerant  # a hang: more load can only keep the worker stuck
def test_worker_hung_before_attaching_shows_in_a_12_s_report(spawn, tmp_path):
    proc = start_diagnosis_job(spawn, tmp_path, "hang")
    time.sleep(8)  # the case: the report starts 8 s after the worker hung (a scenario delay, not a sync)
    data = _report(spawn, proc.pid)
    hang = next((f for f in data["findings"] if f["id"] == "hang"), None)
    assert hang is not None, data["verdict"]
    assert any(f.startswith("Samples.__getitem__ (train_job.py:") for f in hang["frames"]), hang["frames"]
    assert not [f for f in data["findings"] if f["id"] == "starvation" and f["severity"] in ("critical", "warning")], data[
        "verdict"
    ]
    assert not any("raise num_workers" in f["fix"] for f in data["findings"]), data["verdict"]


@pytest.mark.slow
def test_passive_bench_advises_more_workers_for_one_io_bound_worker(spawn, tmp_path):
    from tests.harness.train_jobs import start_job as start_train_job

    # one worker sleeps 140 ms per batch (I/O-like) against a 20 ms step: the rank waits ~85% of the time
    job = start_train_job(spawn, tmp_path, "io1", "--workers", "1", "--batch-ms", "140", "--step-ms", "20")
    ran = run_gputop(spawn, "bench", "--pid", str(job.pid), "--json", "--seconds", "6", timeout=120)
    assert ran.rc == 0, ran.err
    result = json.loads(ran.out)
    assert result["mode"] == "passive"
    assert result["passive"]["wait_fraction"] > 0.7, result["passive"]
    advice = result["advice"]
    assert result["recommendation"]["num_workers"] >= 4, advice
    assert result["recommendation"]["num_workers"] <= advice["worker_cap"], advice
    assert "I/O-bound" in "\n".join(advice["lines"]), advice["lines"]
