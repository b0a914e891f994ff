"""DataLoader workers found by their role, not only by torch's `pt_data_worker` name: torchdata's
StatefulDataLoader workers keep the rank's name, and are recognised by their stacks (the worker loop)."""

from __future__ import annotations

import psutil
import pytest

from gputop.collect.job_tree import JobCollector
from gputop.collect.stacks import find_py_spy
from tests.harness import train_jobs
from tests.harness.processes import wait_until


@pytest.mark.slow
@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
def test_stateful_dataloader_workers_are_found_by_their_stacks_from_rank_and_worker(spawn, tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    # torchdata's StatefulDataLoader, 2 persistent workers; ready once it has taken steps
    job, _ = train_jobs.start(
        spawn,
        tmp_path,
        "stateful",
        "--loader",
        "stateful",
        "--workers",
        "2",
        "--persistent",
        "--batch-size",
        "2",
        "--sample-ms",
        "10",
        "--step-ms",
        "10",
        "--ready-after",
        "3",
    )
    workers = sorted(c.pid for c in psutil.Process(job.pid).children())
    assert len(workers) == 2
    assert all(psutil.Process(w).name() != "pt_data_worker" for w in workers)  # the point: no name to go by

    made = []
    try:
        from_rank = JobCollector(job.pid, stack_interval=0.3)
        made.append(from_rank)
        tree = wait_until(
            lambda: (t := from_rank.collect()).ranks[0].workers and len(t.ranks[0].workers) == 2 and t,
            timeout=60,
            what="both workers found by role",
        )
        assert [w.pid for w in tree.ranks[0].workers] == workers and tree.ranks[0].proc.pid == job.pid

        from_worker = JobCollector(workers[1], stack_interval=0.3)
        made.append(from_worker)
        first = from_worker.collect()  # its own role is looked at when attaching: the job is its rank's at once
        assert [r.proc.pid for r in first.ranks] == [job.pid] and workers[1] in [w.pid for w in first.ranks[0].workers]
        wait_until(
            lambda: [w.pid for w in from_worker.collect().ranks[0].workers] == workers, timeout=60, what="the sibling worker too"
        )
    finally:
        for collector in made:
            collector.close()


@pytest.mark.parametrize("torn", [0, 1, 2])
def test_attached_to_a_worker_its_role_survives_a_torn_first_dump(spawn, torn):
    # a real forked pair (the child keeps its parent's command line, as a forked DataLoader worker does); the
    # dumps stand in for py-spy: the first `torn` ones lose the worker loop's frame (a `--nonblocking` read of a
    # stack while it changed), then the worker loop.  Attached to the child, the job is its parent's at once.
    import subprocess
    import sys

    from gputop.model import Frame
    from tests.harness.histories import stacks_of, worker_busy_frames

    code = "import os, sys, time\nif os.fork() == 0:\n    print(os.getpid(), flush=True)\ntime.sleep(120)\n"
    parent = spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
    child = int(parent.stdout.readline())  # the fixture reaps the parent; the child is ended below, by its PID
    dumps: list[int] = []

    def dump(pids):
        dumps.append(len(pids))
        frames = worker_busy_frames() if len(dumps) > torn else [Frame("decode", "/job/dataset.py", 20)]
        return {pid: stacks_of(pid, frames, 0.0) for pid in pids}

    try:
        job = JobCollector(child, stacks_wanted=False, dump=dump, native_dump=None, recorder_read=None)
        try:
            tree = job.collect()
            assert [r.proc.pid for r in tree.ranks] == [parent.pid] and [w.pid for w in tree.ranks[0].workers] == [child]
            assert len(dumps) == torn + 1, dumps  # no dump after the one that showed the loop
        finally:
            job.close()
    finally:
        psutil.Process(child).kill()
