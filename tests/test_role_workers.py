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
