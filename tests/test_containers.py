"""Ranks in a PID namespace (a container): NVML reports host PIDs, which mean nothing inside it.

`unshare --pid --fork --mount-proc` gives the job and a gputop beside it their own PID namespace
(tests/jobs/in_pid_namespace.py); the fake NVML lists the ranks by their host PIDs, as a real driver
does.  Inside, every rank is matched to its GPU from CUDA_VISIBLE_DEVICES + LOCAL_RANK ("inferred");
from the host, a GPU list naming the ranks by their in-container PIDs is matched through NSpid."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gputop.collect.job_tree import JobCollector
from gputop.collect.placement import visible_device
from gputop.collect.procfs import read_ns_pids
from gputop.model import GpuProcess, GpuSample
from tests.harness.processes import children, wait_until

REPO = Path(__file__).resolve().parent.parent
INNER = REPO / "tests" / "jobs" / "in_pid_namespace.py"
RANK_GPUS = (2, 5)


def _host_pids(unshare_pid: int) -> dict[int, int]:
    """In-namespace PID -> host PID for the processes of the namespace `unshare` made (its forked child is
    that namespace's PID 1)."""

    def ns_of(pid: int) -> str:
        return os.readlink(f"/proc/{pid}/ns/pid")

    [init] = children(unshare_pid)
    namespace = ns_of(init)
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if ns_of(int(name)) == namespace:
                    found[read_ns_pids(int(name))[-1]] = int(name)
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.parametrize("devices_by", ["uuid", "index"])
def test_every_rank_in_a_pid_namespace_maps_to_its_gpu(spawn, tmp_path, devices_by):
    unshare = shutil.which("unshare") or pytest.skip("unshare (util-linux) is not installed")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = spawn(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, str(INNER), str(tmp_path), devices_by],
        env=env,
        stderr=subprocess.PIPE,
    )

    def inner_ready():
        if proc.poll() is not None:
            stderr = proc.stderr.read().decode(errors="replace")
            if "Operation not permitted" in stderr:
                pytest.skip(f"no PID namespaces here: {stderr.strip()}")
            raise AssertionError(f"the namespaced job exited: {stderr}")
        return json.loads((tmp_path / "inner.json").read_text())

    inner = wait_until(inner_ready, timeout=120, what="the ranks inside the namespace")
    host = _host_pids(proc.pid)
    assert all(host[pid] != pid for pid in inner["ranks"])  # really two different PIDs for each rank
    (tmp_path / "host.json").write_text(json.dumps({str(pid): host[pid] for pid in inner["ranks"]}))
    result = wait_until(lambda: json.loads((tmp_path / "result.json").read_text()), timeout=120, what="gputop's view inside")
    try:
        # inside: NVML's host PIDs are nobody here; each rank's GPU comes from its environment
        for job in [result["attached"], *result["discovered"]]:
            assert [(r["pid"], r["rank"], tuple(r["gpus"]), r["gpu_mapping"]) for r in job["ranks"]] == [
                (pid, i, (gpu,), "inferred") for i, (pid, gpu) in enumerate(zip(inner["ranks"], RANK_GPUS))
            ]
        assert len(result["discovered"]) == 1

        # from the host, with a GPU list that names the ranks by their PIDs inside the namespace
        gpus = tuple(
            GpuSample(
                index=i,
                uuid=f"GPU-{i}",
                name="Fake",
                pci_bus_id=f"0:{i}",
                processes=tuple(GpuProcess(pid) for pid, gpu in zip(inner["ranks"], RANK_GPUS) if gpu == i),
            )
            for i in range(8)
        )
        collector = JobCollector(host[inner["ranks"][0]], stacks_enabled=False)
        try:
            tree = collector.collect(gpus)
        finally:
            collector.close()
        assert [(r.proc.pid, r.gpus, r.gpu_mapping) for r in tree.ranks] == [
            (host[pid], (gpu,), "nspid") for pid, gpu in zip(inner["ranks"], RANK_GPUS)
        ]
    finally:
        (tmp_path / "done.json").write_text("{}")
    proc.wait(timeout=60)


@pytest.mark.parametrize(
    ("env", "local_rank", "want"),
    [
        ({"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, 1, "GPU-b"),
        ({"CUDA_VISIBLE_DEVICES": "3"}, 1, "3"),  # one device per rank: that one, whatever the local rank
        ({}, 2, "2"),  # nothing hidden: cuda:LOCAL_RANK
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, 4, None),  # a local rank beyond the list: no guess
        ({}, None, None),
    ],
)
def test_visible_device_by_convention(env, local_rank, want):
    assert visible_device(env, local_rank) == want


def test_the_job_panel_marks_an_inferred_gpu():
    from gputop.model import JobTree, ProcInfo, Rank
    from gputop.tui.widgets.job_panel import job_rows

    ranks = (
        Rank(proc=ProcInfo(pid=10, ppid=1, name="python"), rank=0, gpus=(2,), gpu_mapping="inferred"),
        Rank(proc=ProcInfo(pid=11, ppid=1, name="python"), rank=1, gpus=(5,), gpu_mapping="nvml"),
    )
    rows = [r for r in job_rows(JobTree(root_pid=10, ranks=ranks)) if r.kind == "rank"]
    assert [r.gpus for r in rows] == ["GPU2?", "GPU5"]
