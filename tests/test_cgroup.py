"""The job's cores and memory from its cgroup (v2 files laid out in a directory; v1 for real where we may)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from gputop.collect import cgroup
from gputop.collect.job_tree import JobCollector


def _layout(tmp_path: Path, files: dict[str, str], proc_cgroup: str, mount_root: str = "/") -> tuple[str, str]:
    """A cgroup2 hierarchy under tmp_path/cg, a /proc/4242/cgroup and a mountinfo naming it."""
    for rel, text in files.items():
        path = tmp_path / "cg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "proc" / "4242").mkdir(parents=True)
    (tmp_path / "proc" / "4242" / "cgroup").write_text(proc_cgroup)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 0:21 / / rw - ext4 /dev/root rw\n"
        f"31 23 0:28 {mount_root} {tmp_path / 'cg'} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    return str(tmp_path / "proc"), str(mountinfo)


def test_v2_smallest_quota_up_the_tree_and_the_leaf_cpuset(tmp_path):
    proc, mountinfo = _layout(
        tmp_path,
        {
            "cpu.max": "max 100000\n",
            "job/cpu.max": "600000 100000\n",  # 6 cores for the whole job slice ...
            "job/memory.max": "8589934592\n",
            "job/rank/cpu.max": "max 100000\n",
            "job/rank/memory.max": "max\n",
            "job/rank/cpuset.cpus.effective": "0-3,8\n",  # ... but only 5 CPUs in its set
        },
        "0::/job/rank\n",
    )
    assert cgroup.read_limits(4242, proc=proc, mountinfo=mountinfo) == cgroup.Limits(cpu=5.0, memory=8 << 30)


def test_v2_quota_below_the_cpuset_and_a_container_mount_root(tmp_path):
    # inside a container the hierarchy is mounted from the container's own cgroup, not from "/"
    proc, mountinfo = _layout(
        tmp_path,
        {
            "cpu.max": "250000 100000\n",
            "cpuset.cpus.effective": "0-15\n",
        },
        "0::/docker/abc\n",
        mount_root="/docker/abc",
    )
    assert cgroup.read_limits(4242, proc=proc, mountinfo=mountinfo) == cgroup.Limits(cpu=2.5, memory=None)


def test_v2_no_limits_and_a_cgroup_outside_our_view(tmp_path):
    proc, mountinfo = _layout(tmp_path, {"cpu.max": "max 100000\n", "memory.max": "max\n"}, "0::/\n")
    assert cgroup.read_limits(4242, proc=proc, mountinfo=mountinfo) == cgroup.Limits()
    (tmp_path / "proc" / "4242" / "cgroup").write_text("0::/elsewhere\n")
    other, _ = _layout(tmp_path / "x", {}, "0::/other/job\n", mount_root="/docker/abc")
    assert cgroup.read_limits(4242, proc=other, mountinfo=str(tmp_path / "x" / "mountinfo")) == cgroup.Limits()


def test_cpu_list_counting():
    assert cgroup.count_cpus("0-3,8,10-11") == 7
    assert cgroup.count_cpus("5") == 1
    assert cgroup.count_cpus("") is None and cgroup.count_cpus("garbage") is None


# ----------------------------------------------------------------- for real (cgroup v1, as on this machine kind)


def _v1_mount(controller: str) -> Path | None:
    _, v1 = cgroup.read_mounts()
    mount = v1.get(controller)
    return Path(mount.point) if mount is not None and mount.root == "/" else None


@pytest.fixture
def v1_cgroups():
    """A fresh v1 cpu and memory cgroup pair (skip where we may not make one); removed afterwards."""
    cpu_root, memory_root = _v1_mount("cpu"), _v1_mount("memory")
    if cpu_root is None or memory_root is None:
        pytest.skip("no cgroup v1 cpu and memory hierarchies mounted here")
    name = f"gputop-test-{uuid.uuid4().hex[:8]}"
    made = []
    try:
        for root in (cpu_root, memory_root):
            try:
                (root / name).mkdir()
            except OSError as exc:
                pytest.skip(f"cannot create a cgroup here ({exc.strerror})")
            made.append(root / name)
        yield made
    finally:
        for path in made:
            try:
                path.rmdir()
            except OSError:
                pass


@pytest.mark.slow
def test_a_job_in_a_limited_cgroup_reports_its_limits(spawn, v1_cgroups):
    cpu_dir, memory_dir = v1_cgroups
    (cpu_dir / "cpu.cfs_period_us").write_text("100000")
    (cpu_dir / "cpu.cfs_quota_us").write_text("50000")  # half a core
    (memory_dir / "memory.limit_in_bytes").write_text(str(512 << 20))
    job = spawn(["sleep", "600"])
    for directory in (cpu_dir, memory_dir):
        (directory / "cgroup.procs").write_text(str(job.pid))
    try:
        collector = JobCollector(job.pid, stacks_enabled=False)
        try:
            tree = collector.collect()
        finally:
            collector.close()
        assert tree.cpu_limit == 0.5 and tree.memory_limit == 512 << 20
        # and a process outside it is not limited below the host
        free = JobCollector(os.getpid(), stacks_enabled=False)
        try:
            assert free.collect().memory_limit is None
        finally:
            free.close()
    finally:
        job.kill()  # a cgroup can be removed only once empty
        job.wait(timeout=10)
