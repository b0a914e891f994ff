"""Rank discovery from any PID of a job, ranks numbered, for each launcher people use.

Real launchers: torchrun, `accelerate launch`, torch.multiprocessing.spawn, Open MPI's mpirun (when
installed) and Lightning's subprocess launcher (test_lightning.py).  Stand-ins with the same process
shape and variables (tests/jobs/launchers/): Slurm's slurmstepd, MPICH's mpiexec.hydra/hydra_pmi_proxy
and the deepspeed runner/launch pair (no Slurm cluster, MPICH or CPU DeepSpeed on the test machine).
Each rank is tests/jobs/rank_stub.py: no torch, one child named like a DataLoader worker."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from gputop.collect import procfs
from gputop.collect.job_tree import JobCollector, identity_from_env, script_and_args
from tests.harness import train_jobs
from tests.harness.processes import free_port, wait_until

JOBS = Path(__file__).parent / "jobs"
STUB = JOBS / "rank_stub.py"
LAUNCHERS = JOBS / "launchers"
START_TIMEOUT = 120  # several interpreters starting on two shared cores


def start(spawn, tmp_path: Path, argv: list[str], count: int, **env: str) -> list[dict]:
    """Run a launcher; wait for its `count` stub ranks; their records ({pid, worker, env}) by PID."""
    ready = tmp_path / "ready"
    ready.mkdir()
    full_env = dict(os.environ, GPUTOP_TEST_READY=str(ready), **env)
    launcher = spawn(argv, env=full_env)

    def records():
        assert launcher.poll() is None, f"the launcher exited with {launcher.returncode}"
        found = [json.loads(p.read_text()) for p in ready.iterdir() if not p.name.endswith(".tmp")]
        return found if len(found) >= count else None

    found = wait_until(records, timeout=START_TIMEOUT, what=f"{count} ranks to start")
    return sorted(found, key=lambda r: r["pid"])


def tree_from(pid: int):
    collector = JobCollector(pid, stacks_enabled=False)
    try:
        return collector.collect()
    finally:
        collector.close()


def check_every_pid_finds_the_whole_job(
    records: list[dict], expected_ranks: dict[int, int], launcher_name: str | None, world_size: int
) -> None:
    """From the launcher, each rank and each worker: the same launcher, every rank in rank order with
    its number and world size, each with its worker."""
    trees = [tree_from(r["pid"]) for r in records] + [tree_from(r["worker"]) for r in records]
    launcher_pid = trees[0].launcher.pid if trees[0].launcher else None
    if launcher_pid is not None:
        trees.append(tree_from(launcher_pid))
    for tree in trees:
        assert (tree.launcher.pid if tree.launcher else None) == launcher_pid, tree.root_pid
        if launcher_name is not None:
            assert launcher_name in " ".join(tree.launcher.cmdline), tree.launcher.cmdline
        got = [(r.proc.pid, r.rank, r.world_size, tuple(w.pid for w in r.workers)) for r in tree.ranks]
        want = sorted(
            ((rec["pid"], expected_ranks[rec["pid"]], world_size, (rec["worker"],)) for rec in records),
            key=lambda item: item[1],
        )
        assert got == want, f"from PID {tree.root_pid}"


def _by_variable(records: list[dict], key: str) -> dict[int, int]:
    return {r["pid"]: int(r["env"][key]) for r in records}


@pytest.mark.slow
def test_torchrun(spawn, tmp_path):
    records = start(
        spawn,
        tmp_path,
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            str(STUB),
        ],
        2,
    )
    check_every_pid_finds_the_whole_job(records, _by_variable(records, "RANK"), "torch.distributed.run", 2)


@pytest.mark.slow
def test_accelerate_launch(spawn, tmp_path):
    pytest.importorskip("accelerate")
    accelerate = shutil.which("accelerate") or pytest.skip("the accelerate command is not installed")
    records = start(
        spawn,
        tmp_path,
        [
            sys.executable,
            accelerate,
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(free_port()),
            str(STUB),
        ],
        2,
    )
    check_every_pid_finds_the_whole_job(records, _by_variable(records, "RANK"), "accelerate", 2)


MP_SPAWN = f"""
import os, runpy, sys, torch.multiprocessing as mp
def rank(index):
    runpy.run_path({str(STUB)!r}, run_name="__main__")
if __name__ == "__main__":
    mp.spawn(rank, nprocs=3)
"""


@pytest.mark.slow
def test_torch_multiprocessing_spawn_numbers_ranks_in_start_order(spawn, tmp_path):
    script = tmp_path / "spawner.py"
    script.write_text(MP_SPAWN)
    records = start(spawn, tmp_path, [sys.executable, str(script)], 3)
    # mp.spawn passes the rank as an argument, not in the environment: it starts rank 0, 1, 2 in order
    by_start = sorted(records, key=lambda r: int(Path(f"/proc/{r['pid']}/stat").read_text().rsplit(")", 1)[1].split()[19]))
    check_every_pid_finds_the_whole_job(records, {r["pid"]: i for i, r in enumerate(by_start)}, "spawner.py", 3)


@pytest.mark.slow
def test_srun_tasks_from_any_task_from_slurmstepd_and_from_the_srun_client(spawn, tmp_path):
    step = "[424242.0]"
    records = start(spawn, tmp_path, [sys.executable, str(LAUNCHERS / "slurmstepd"), step, "2", sys.executable, str(STUB)], 2)
    check_every_pid_finds_the_whole_job(records, _by_variable(records, "SLURM_PROCID"), "slurmstepd", 2)
    # the srun client parents none of its tasks; inside an allocation it names the job
    srun = spawn([sys.executable, str(LAUNCHERS / "srun")], env=dict(os.environ, SLURM_JOB_ID="424242"))
    wait_until(lambda: "srun" in " ".join(procfs.read_cmdline(srun.pid)), what="the srun stand-in to start")
    tree = tree_from(srun.pid)
    assert step in " ".join(tree.launcher.cmdline)
    assert [r.proc.pid for r in tree.ranks] == [r["pid"] for r in sorted(records, key=lambda r: r["env"]["SLURM_PROCID"])]


@pytest.mark.slow
def test_torchrun_as_the_srun_task(spawn, tmp_path):
    """The multi-node pattern: srun starts one torchrun per node, torchrun the ranks."""
    records = start(
        spawn,
        tmp_path,
        [
            sys.executable,
            str(LAUNCHERS / "slurmstepd"),
            "[424243.0]",
            "1",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(free_port()),
            str(STUB),
        ],
        2,
    )
    check_every_pid_finds_the_whole_job(records, _by_variable(records, "RANK"), "torch.distributed.run", 2)
    stepd = procfs.read_stat(tree_from(records[0]["pid"]).launcher.pid).ppid
    assert [r.proc.pid for r in tree_from(stepd).ranks] == [r["pid"] for r in sorted(records, key=lambda r: r["env"]["RANK"])]


@pytest.mark.slow
def test_mpich_hydra_stand_in(spawn, tmp_path):
    """MPICH: mpiexec.hydra -> hydra_pmi_proxy -> ranks with PMI_RANK."""
    records = start(spawn, tmp_path, [sys.executable, str(LAUNCHERS / "mpiexec.hydra"), "2", sys.executable, str(STUB)], 2)
    check_every_pid_finds_the_whole_job(records, _by_variable(records, "PMI_RANK"), "hydra_pmi_proxy", 2)


@pytest.mark.slow
def test_open_mpi_mpirun(spawn, tmp_path):
    mpirun = shutil.which("mpirun") or pytest.skip("mpirun is not installed (apt-get install openmpi-bin)")
    records = start(
        spawn,
        tmp_path,
        [
            # ranks talk over loopback only (the stub sends nothing, but Open MPI's runtime wires up TCP)
            mpirun,
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            "lo",
            "--mca",
            "oob_tcp_if_include",
            "lo",
            sys.executable,
            str(STUB),
        ],
        2,
        OMPI_MCA_plm_rsh_agent="",
    )
    check_every_pid_finds_the_whole_job(records, _by_variable(records, "OMPI_COMM_WORLD_RANK"), None, 2)


@pytest.mark.slow
def test_deepspeed_runner_and_launch_stand_in(spawn, tmp_path):
    env = {"PYTHONPATH": os.pathsep.join([str(LAUNCHERS), os.environ.get("PYTHONPATH", "")])}
    records = start(spawn, tmp_path, [sys.executable, "-m", "deepspeed.launcher.runner", "2", str(STUB)], 2, **env)
    check_every_pid_finds_the_whole_job(records, _by_variable(records, "RANK"), "deepspeed.launcher.launch", 2)
    runner = tree_from(records[0]["pid"]).launcher.ppid
    from_runner = tree_from(runner)  # the outer launcher: the same ranks, below the inner one
    assert [r.proc.pid for r in from_runner.ranks] == [r["pid"] for r in sorted(records, key=lambda r: r["env"]["RANK"])]


# ----------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("env", "ranks_here", "want"),
    [
        ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "SLURM_PROCID": "0"}, 1, (3, 1, 8)),  # torchrun under srun
        ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"}, 1, (5, 1, 8)),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}, 1, (2, 0, 4)),
        ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}, 1, (1, 1, 2)),
        ({"LOCAL_RANK": "1", "NODE_RANK": "2", "WORLD_SIZE": "12"}, 4, (9, 1, 12)),  # Lightning: node 2 x 4 + 1
        ({}, 1, (None, None, None)),
    ],
)
def test_identity_from_each_launchers_variables(env, ranks_here, want):
    identity = identity_from_env(env, ranks_here)
    assert (identity.rank, identity.local_rank, identity.world_size) == want


def test_script_and_args_ignores_the_interpreter_and_its_flags():
    assert script_and_args(("python", "-u", "train.py", "--lr", "1")) == ("train.py", "--lr", "1")
    assert script_and_args(("/venv/bin/python3", "/abs/train.py", "--lr", "1")) == ("train.py", "--lr", "1")
    assert script_and_args(("python", "-X", "dev", "-m", "pkg.train")) == ("-m", "pkg.train")
    assert script_and_args(("python",)) == ()


# ----------------------------------------------------------------- Lightning (real)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_lightning_ddp_shows_every_rank_with_its_worker_from_any_rank(spawn, tmp_path, devices):
    pytest.importorskip("lightning")
    rank_zero, records = train_jobs.start(
        spawn, tmp_path, "lightning", *train_jobs.LIGHTNING_RANKS, "--devices", str(devices), ranks=devices, timeout=240
    )
    ranks = {pid: record["rank"] for pid, record in records.items()}
    assert ranks.get(rank_zero.pid) == 0  # the user's own process is rank 0
    # one device: a plain process, not a distributed job, so no rank number is claimed for it
    want = (
        sorted(((p, rank, rank) for p, rank in ranks.items()), key=lambda item: item[1])
        if devices > 1
        else [(rank_zero.pid, None, None)]
    )
    workers = [w.pid for r in tree_from(rank_zero.pid).ranks for w in r.workers]
    for pid in [*ranks, *workers]:
        tree = tree_from(pid)
        assert tree.launcher is None, tree.launcher
        assert [(r.proc.pid, r.rank, r.local_rank) for r in tree.ranks] == want, f"from PID {pid}"
        assert all(r.world_size == (devices if devices > 1 else None) for r in tree.ranks)
        for rank in tree.ranks:  # each rank's own persistent DataLoader worker, not the other rank
            assert len(rank.workers) == 1 and rank.workers[0].ppid == rank.proc.pid, rank
