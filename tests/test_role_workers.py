"""DataLoader workers found by their role, not only by torch's `pt_data_worker` name: torchdata's
StatefulDataLoader workers keep the rank's name, and are recognised by their stacks (the worker loop)."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from gputop.collect.job_tree import JobCollector
from gputop.collect.stacks import find_py_spy
from tests.harness.processes import wait_until

STATEFUL_JOB = """
import os, sys, time
import torch
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

class Slow(Dataset):
    def __len__(self):
        return 10 ** 6

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.zeros(4)

if __name__ == "__main__":
    loader = StatefulDataLoader(Slow(), batch_size=2, num_workers=2, persistent_workers=True)
    for step, batch in enumerate(loader):
        if step == 2:
            with open(sys.argv[1] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
def test_stateful_dataloader_workers_are_found_by_their_stacks_from_rank_and_worker(spawn, tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    script, ready = tmp_path / "job.py", tmp_path / "ready"
    script.write_text(STATEFUL_JOB)
    job = spawn([sys.executable, str(script), str(ready)])
    wait_until(lambda: ready.exists() or job.poll() is not None, timeout=120, what="the job to take steps")
    assert job.poll() is None, "the job exited"
    workers = sorted(c.pid for c in psutil.Process(job.pid).children())
    assert len(workers) == 2
    assert all(psutil.Process(w).name() != "pt_data_worker" for w in workers)  # the point: no name to go by

    made = []
    try:
        from_rank = JobCollector(job.pid, stack_interval=0.3)
        made.append(from_rank)
        tree = wait_until(lambda: (t := from_rank.collect()).ranks[0].workers and len(t.ranks[0].workers) == 2 and t,
                          timeout=60, what="both workers found by role")
        assert [w.pid for w in tree.ranks[0].workers] == workers and tree.ranks[0].proc.pid == job.pid

        from_worker = JobCollector(workers[1], stack_interval=0.3)
        made.append(from_worker)
        first = from_worker.collect()  # its own role is looked at when attaching: the job is its rank's at once
        assert [r.proc.pid for r in first.ranks] == [job.pid] and workers[1] in [w.pid for w in first.ranks[0].workers]
        wait_until(lambda: [w.pid for w in from_worker.collect().ranks[0].workers] == workers, timeout=60,
                   what="the sibling worker too")
    finally:
        for collector in made:
            collector.close()
