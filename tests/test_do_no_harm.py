"""Issue 34's harms, each on a job built to reach it: a job that ends while it is traced or benchmarked exits as
it would have (status 0, nothing in its stderr), a stopped job is refused in one line, a second injection into a
process that has one running is refused in one line.

The jobs are tests/jobs/allocating_job.py (num_workers=0, 64 small tensors collated a batch: the main thread is
inside torch's C++ and the allocator nearly all the time), run with ``--seconds`` so they return from main while
gputop's window is still open, as a job that reaches its last step does.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.harness.injection import start_allocating_job
from tests.harness.processes import run_gputop, wait_until

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="the safe-point injector is x86-64 only")

JOB_SECONDS = 6.0  # the job's loop; gputop's window (8 s) outlasts it


def _ending_job(spawn, tmp_path, name: str):
    pid, _read = start_allocating_job(spawn, tmp_path, name, seconds=JOB_SECONDS)
    return next(p for p in spawn.procs if p.pid == pid)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("run", range(2))
def test_a_job_that_ends_while_traced_exits_as_it_would_have(spawn, tmp_path, run):
    job = _ending_job(spawn, tmp_path, f"traced{run}")
    ran = run_gputop(spawn, "trace", "--pid", str(job.pid), "--seconds", "8", "-o", str(tmp_path / "out"), timeout=120)
    assert job.wait(timeout=60) == 0, (job.returncode, (tmp_path / f"traced{run}.err").read_text()[-2000:])
    assert (tmp_path / f"traced{run}.err").read_text() == ""  # no line of ours, nor Kineto's, in its stderr
    # gputop says what happened in one line: the job exited during the window (the profiler was stopped first)
    assert ran.rc == 1 and "exit" in ran.err and len(ran.err.strip().splitlines()) == 1, ran.err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_job_that_ends_while_benchmarked_exits_as_it_would_have(spawn, tmp_path):
    job = _ending_job(spawn, tmp_path, "benched")
    ran = run_gputop(spawn, "bench", "--pid", str(job.pid), "--yes", "--seconds", "10", timeout=120)
    assert job.wait(timeout=60) == 0, (job.returncode, (tmp_path / "benched.err").read_text()[-2000:])
    assert (tmp_path / "benched.err").read_text() == ""
    assert "Traceback" not in ran.err, ran.err


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["bench", "trace"])
def test_a_stopped_job_is_refused_in_one_line_and_left_stopped(spawn, tmp_path, command):
    pid, read = start_allocating_job(spawn, tmp_path, f"stopped-{command}")
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T", timeout=10, what="the stop")
        extra = ["--yes", "--seconds", "8"] if command == "bench" else ["--seconds", "2", "-o", str(tmp_path / "out")]
        ran = run_gputop(spawn, command, "--pid", str(pid), *extra, timeout=60)
        line = f"gputop: PID {pid} is stopped (SIGSTOP); nothing was injected; `kill -CONT {pid}` resumes it"
        assert ran.rc != 0 and ran.err.strip() == line, ran.err
        assert not ran.out.strip()  # no advice from its frozen stack
        assert open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T"  # still as the user left it
    finally:
        os.kill(pid, signal.SIGCONT)
    before = read()
    wait_until(lambda: read() > before, timeout=20, what="the job to step again after SIGCONT")
