"""Issue 37's check, live: a 12 s report's advice and prediction for a starved job, against the steps/s the job
achieves once restarted with the advice (tests/harness/fix_outcome.py).  Two jobs of known cost: an I/O-bound
loader, whose fix the step bounds, and a CPU-bound one, which the box's cores bound.

About 40 s a job (start, 12 s report, restart, 12 s count).  The advice, its bound and that the restarted job is
measured are asserted; achieved ÷ predicted is printed, not asserted: on the shared 2-core box it read 0.71-1.19
(I/O-bound) and 0.64-1.26 (CPU-bound, whose prediction holds only while the other sessions keep what they used),
so ±20% is a figure for `python benchmarks/bench_prediction.py` (docs/predictions.md), not a bar CI can hold.

The two overlap where neither's assertion can tell (~60 s for both, not ~80): the I/O-bound job's report runs with
nothing beside it (its bound must not be the cores: a job spinning beside it could make them so), then its restart
and count run beside the CPU-bound job's start and report.  That report's assertions (limited by the cores, at most
2 workers) only hold more firmly with more load on the box; the I/O-bound job's count beside it is printed, not
asserted (its ratio there reads a box the CPU-bound job shares: the benchmark's figures run one job at a time)."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Union

import pytest

from tests.harness.fix_outcome import Outcome, measure
from tests.harness.processes import Spawner

SECONDS = 12.0  # the report's window and the count's
OVERLAP_WAIT_S = 300.0  # the I/O-bound job's start and report, with room for a loaded box


def _stop(proc) -> None:
    """The job and its workers (its process group); the module's spawner reaps whatever is left."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _outcome_or_error(call: Callable[[], Outcome]) -> Union[Outcome, Exception]:
    """One job's outcome, or why it has none: each test fails on its own job's error, as when they ran apart."""
    try:
        return call()
    except Exception as exc:
        return exc


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, Union[Outcome, Exception]]:
    """Both jobs' outcomes: the I/O-bound job's report alone, then the CPU-bound job beside the I/O-bound one's
    restart and count (the module docstring says why that overlap cannot change what is asserted)."""
    tmp = tmp_path_factory.mktemp("outcome")
    spawn = Spawner()
    try:
        io_reported = threading.Event()
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="outcome-io") as pool:
            io = pool.submit(measure, "io", SECONDS, tmp / "io", spawn, _stop, io_reported.set)
            io_reported.wait(OVERLAP_WAIT_S)
            cpu = _outcome_or_error(lambda: measure("cpu", SECONDS, tmp / "cpu", spawn, _stop))
            found = {"cpu": cpu, "io": _outcome_or_error(io.result)}
    finally:
        spawn.reap_all()
    rows = [o.row() if isinstance(o, Outcome) else f"{name:<4} {type(o).__name__}: {o}" for name, o in found.items()]
    for row in rows:
        print("\n" + row)
    (tmp / "outcome.txt").write_text("".join(row + "\n" for row in rows))  # kept with the basetemp
    return found


def _outcome(outcomes: dict[str, Union[Outcome, Exception]], name: str) -> Outcome:
    found = outcomes[name]
    if isinstance(found, Exception):
        raise found
    return found


def _measured(outcome: Outcome) -> None:
    assert outcome.achieved is not None and outcome.after, outcome.row()
    assert outcome.ratio is not None and outcome.predicted.get("after_low") is not None, outcome.row()


# Alone, both: the I/O-bound prediction's cores bound reads the box (beside shared tests at a lower CPU priority,
# tests/harness/cpu_priority.py, the job got more than the sessions model gives it: a CI run read "limited by the
# cores", 32.7 predicted, 42.4 achieved), and the CPU-bound job's bound is the cores it gets.  The I/O-bound test
# is in the acceptance lane (a live job judged by its verdict); the module's fixture serves both.
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(600)]


@pytest.mark.acceptance
def test_the_io_bound_job_restarted_with_the_advice_achieves_what_the_report_predicted(outcomes):
    outcome = _outcome(outcomes, "io")
    _measured(outcome)
    assert outcome.predicted["limited_by"] in ("the step's compute", "the workers"), outcome.row()


def test_the_cpu_bound_job_restarted_with_the_advice_achieves_what_the_report_predicted(outcomes):
    outcome = _outcome(outcomes, "cpu")
    _measured(outcome)
    assert outcome.predicted["limited_by"] == "the cores", outcome.row()
    assert outcome.advice is not None and outcome.advice <= 2, outcome.row()  # two cores: at most 2 computing workers
