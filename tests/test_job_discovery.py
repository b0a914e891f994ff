"""Job discovery against real jobs: a PyTorch loop with DataLoader workers, a 2-rank torchrun (gloo,
loopback), a non-Python process and a process that exits while attached."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from gputop.analysis import stack_classes as sc
from gputop.collect import job_tree as jobmod
from gputop.collect import procfs, stack_schedule
from gputop.collect.job_tree import JobCollector, discover_jobs
from gputop.collect.placement import SET_DEVICE_FIX, find_misplacements
from gputop.collect.stacks import find_py_spy
from gputop.errors import GputopError
from gputop.model import (
    Frame,
    GpuProcess,
    GpuSample,
    JobTree,
    ProcessStacks,
    ProcInfo,
    Rank,
    ThreadStack,
    from_jsonable,
    to_jsonable,
)
from gputop.report.job_json import job_json
from tests.harness.processes import Spawner, wait_until
from tests.harness.train_jobs import ATTACH_LOOP, PIN_THREAD, start_attach_loop, torchrun_command, wait_ready

needs_py_spy = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
# a Python process that sits in a function of known name (sleeping, so it costs no CPU)
SPIN_UNTIL_KILLED = "import time\ndef spin_until_killed():\n    while True:\n        time.sleep(0.01)\nspin_until_killed()"
DEADLINE = 60  # for conditions that are normally true at once; generous because the test box is shared


def start_train_loop(spawn, tmp_path: Path, *args: str) -> tuple[int, int]:
    """A one-process loop: (its PID, its pin-memory-like thread's TID or 0)."""
    _, [(pid, pin_tid)] = start_attach_loop(spawn, tmp_path, *args)
    return pid, pin_tid


def gpu(index: int, *pids: int) -> GpuSample:
    return GpuSample(
        index=index,
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        name="Fake H100",
        pci_bus_id=f"00000000:{index + 0x10:02X}:00.0",
        processes=tuple(GpuProcess(pid=p, used_memory=1 << 30) for p in pids),
    )


@pytest.fixture
def collectors():
    """Register collectors here: they are closed when the test ends, passed or failed."""
    made: list[JobCollector] = []
    yield made.append
    for c in made:
        c.close()


# ----------------------------------------------------------------- one rank, DataLoader workers


@pytest.mark.slow
@needs_py_spy
def test_single_rank_with_workers_tree_and_stacks(spawn, tmp_path, collectors):
    pid, pin_tid = start_train_loop(spawn, tmp_path, "--workers", "2", "--persistent", "--length", "100000", *PIN_THREAD)
    collector = JobCollector(pid, stack_interval=0.3)
    collectors(collector)

    tree = wait_until(
        lambda: (t := collector.collect((), 0.0)) and len(t.ranks[0].workers) == 2 and t,
        timeout=DEADLINE,
        what="two workers",
    )
    assert tree.launcher is None and tree.root_pid == pid and not tree.exited
    [rank] = tree.ranks
    assert rank.proc.pid == pid
    assert rank.rank is None and rank.world_size is None  # plain `python train.py`: no RANK in its environment
    assert [w.name for w in rank.workers] == ["pt_data_worker", "pt_data_worker"]
    assert all(w.ppid == pid for w in rank.workers)  # fork: children of the rank
    assert rank.pin_memory_tids == (pin_tid,)
    for proc in (rank.proc, *rank.workers):
        assert proc.state in ("R", "S", "D")
        assert proc.rss and proc.rss > 1 << 20
        assert proc.core in range(psutil.cpu_count())
        assert proc.create_time == psutil.Process(proc.pid).create_time()
    assert set(tree.cores) <= {p.core for p in (rank.proc, *rank.workers)} and tree.cores

    # CPU % needs two readings; from the second collect on it is a number
    tree = collector.collect((), 0.0)
    assert all(p.cpu_percent is not None for p in (tree.ranks[0].proc, *tree.ranks[0].workers))

    # stacks: the main thread waits in __next__, the workers sit in the Dataset's __getitem__
    def waiting_and_working():
        t = collector.collect((), 0.0)
        r = t.ranks[0]
        main = sc.main_thread(t.stacks.get(pid))
        leaves = dict((text, n) for text, n, _ in sc.aggregate_worker_leaves(t.stacks, [w.pid for w in r.workers]))
        ok = (
            r.main_thread_state == sc.WAITING_FOR_DATA
            and "_BaseDataLoaderIter.__next__" in [f.name for f in main.frames]
            and leaves.get("Samples.__getitem__ (train_job.py)", 0) >= 1
        )
        return t if ok else None

    tree = wait_until(waiting_and_working, timeout=DEADLINE, what="main waiting for data and a worker in __getitem__")
    assert set(tree.stacks) == {pid, *(w.pid for w in tree.ranks[0].workers)}

    # the whole tree, stacks included, goes through JSON and back unchanged
    assert from_jsonable(JobTree, to_jsonable(tree)) == tree
    # `snapshot --json`'s job key, in the issue's shape
    as_json = json.loads(json.dumps(job_json(tree)))
    [rank_json] = as_json["ranks"]
    assert rank_json["pid"] == pid and rank_json["rank"] is None and rank_json["gpus"] == []
    assert rank_json["workers"] == [w.pid for w in tree.ranks[0].workers]
    assert rank_json["main_thread_state"] == sc.WAITING_FOR_DATA
    [main_json] = [t for t in as_json["stacks"][str(pid)]["threads"] if t["thread_name"] == "MainThread"]
    frame = main_json["frames"][0]
    assert set(frame) >= {"name", "filename", "line"}


@pytest.mark.slow
def test_workers_that_respawn_every_epoch_are_followed(spawn, tmp_path, collectors):
    # no persistent_workers and tiny epochs: the DataLoader starts new worker processes every epoch
    pid, _ = start_train_loop(spawn, tmp_path, "--workers", "2", "--length", "8", "--sample-ms", "5")
    collector = JobCollector(pid, stacks_enabled=False)
    collectors(collector)
    seen: list[frozenset[int]] = []

    def two_generations():
        workers = collector.collect((), 0.0).ranks[0].workers
        assert all(w.name == "pt_data_worker" for w in workers)
        pids = frozenset(w.pid for w in workers)
        if pids and (not seen or seen[-1] != pids):
            seen.append(pids)
        return len(seen) >= 2 and not (seen[0] & seen[-1])

    wait_until(two_generations, timeout=60, interval=0.02, what="a second generation of workers")


@pytest.mark.slow
def test_forkserver_workers_are_found_as_grandchildren(spawn, tmp_path, collectors):
    pid, _ = start_train_loop(
        spawn, tmp_path, "--workers", "2", "--persistent", "--length", "100000", "--start-method", "forkserver"
    )
    collector = JobCollector(pid, stacks_enabled=False)
    collectors(collector)
    tree = wait_until(lambda: (t := collector.collect()) and len(t.ranks[0].workers) == 2 and t, timeout=DEADLINE, what="workers")
    for worker in tree.ranks[0].workers:
        forkserver = psutil.Process(worker.ppid)
        assert worker.ppid != pid and forkserver.ppid() == pid
        assert "multiprocessing.forkserver" in " ".join(forkserver.cmdline())
    # attached through a worker, we find the same rank
    via_worker = JobCollector(tree.ranks[0].workers[0].pid, stacks_enabled=False)
    collectors(via_worker)
    assert [r.proc.pid for r in via_worker.collect().ranks] == [pid]


@pytest.mark.slow
def test_multiprocessing_spawn_parent_is_the_launcher(spawn, tmp_path, collectors):
    # torch.multiprocessing.start_processes with fork: the cheap variant of mp.spawn on a busy box
    # (spawn's children re-import torch); the spawn_main flavour is checked in the unit test below.
    parent, ranks = start_attach_loop(
        spawn,
        tmp_path,
        "--mp-spawn",
        "2",
        "--mp-start-method",
        "fork",
        "--workers",
        "1",
        "--persistent",
        "--length",
        "100000",
        ranks=2,
    )
    rank_pids = [pid for pid, _ in ranks]
    for attach in (parent.pid, rank_pids[1]):
        collector = JobCollector(attach, stacks_enabled=False)
        collectors(collector)
        tree = _with_workers(collector)
        assert tree.launcher.pid == parent.pid
        assert [r.proc.pid for r in tree.ranks] == rank_pids
        assert all(r.proc.ppid == parent.pid and r.workers[0].ppid == r.proc.pid for r in tree.ranks)


def _tracked(pid: int, cmdline: tuple[str, ...]) -> procfs.Tracked:
    return procfs.Tracked(proc=None, key=(pid, 0.0), start_ticks=0, cmdline=cmdline, env={})


@pytest.mark.slow
def test_multiprocessing_children_are_told_from_programs_a_shell_runs():
    parent = _tracked(10, ("python", "train.py"))
    spawned = _tracked(
        11,
        (
            "python",
            "-c",
            "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)",
            "--multiprocessing-fork",
        ),
    )
    forked = _tracked(12, ("python", "train.py"))
    assert jobmod.is_mp_child(parent, spawned) and jobmod.is_mp_child(parent, forked)
    shell = _tracked(20, ("bash", "run.sh"))
    assert not jobmod.is_mp_child(shell, _tracked(21, ("python", "train.py")))


# ----------------------------------------------------------------- torchrun, two ranks on CPU


@dataclasses.dataclass(frozen=True)
class TorchrunJob:
    shell: int  # `sh -c "torchrun ..."`, as a run.sh would start it
    launcher: int
    ranks: list[int]


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory):
    """`torchrun --nproc-per-node 2` of the training job (gloo on 127.0.0.1), one worker per rank, started
    from a shell that stays its parent."""
    tmp = tmp_path_factory.mktemp("torchrun")
    spawner = Spawner()
    ranks: list[psutil.Process] = []
    torchrun = " ".join(
        torchrun_command(2, *ATTACH_LOOP, "--workers", "1", "--persistent", "--length", "100000", "--ready", str(tmp / "ready"))
    )
    try:
        with open(tmp / "torchrun.log", "wb") as log:
            # `; exit $?` keeps sh from exec()ing torchrun: the shell stays between us and the launcher
            shell = spawner(["sh", "-c", f"{torchrun}; exit $?"], stdout=log, stderr=subprocess.STDOUT)
        ranks.extend(psutil.Process(pid) for pid in wait_ready(tmp / "ready", 2, shell, log=tmp / "torchrun.log"))
        [launcher] = psutil.Process(shell.pid).children()
        yield TorchrunJob(shell.pid, launcher.pid, [r.pid for r in ranks])
    finally:
        # torch elastic starts each rank in a session of its own, so killing the launcher's process
        # group misses the ranks and their workers: kill each rank's group (the rank leads it) ourselves.
        for rank in ranks:
            if rank.is_running() and os.getpgid(rank.pid) == rank.pid:
                os.killpg(rank.pid, signal.SIGKILL)
        spawner.reap_all()


def _assert_torchrun_tree(tree: JobTree, launcher_pid: int, rank_pids: list[int]) -> None:
    assert tree.launcher is not None and tree.launcher.pid == launcher_pid
    assert sorted(r.proc.pid for r in tree.ranks) == sorted(rank_pids)
    assert [(r.rank, r.local_rank, r.world_size) for r in tree.ranks] == [(0, 0, 2), (1, 1, 2)]
    for rank in tree.ranks:
        assert rank.proc.ppid == launcher_pid
        assert [w.name for w in rank.workers] == ["pt_data_worker"]


def _with_workers(collector: JobCollector) -> JobTree:
    return wait_until(
        lambda: (t := collector.collect()) and all(len(r.workers) == 1 for r in t.ranks) and t,
        timeout=DEADLINE,
        what="one worker per rank",
    )


@pytest.mark.slow
@needs_py_spy
def test_torchrun_attach_via_launcher(torchrun_job, collectors):
    launcher_pid, rank_pids = torchrun_job.launcher, torchrun_job.ranks
    collector = JobCollector(launcher_pid, stacks_enabled=False)
    collectors(collector)
    tree = _with_workers(collector)
    _assert_torchrun_tree(tree, launcher_pid, rank_pids)
    assert tree.root_pid == launcher_pid

    collector.refresh_stacks()
    tree = collector.collect()
    assert set(tree.stacks) == {launcher_pid, *rank_pids, *(w.pid for r in tree.ranks for w in r.workers)}
    assert all(s.error is None for s in tree.stacks.values())
    launcher_frames = [f.name for f in sc.main_thread(tree.stacks[launcher_pid]).frames]
    assert any("ElasticAgent" in name for name in launcher_frames)
    assert all(r.main_thread_state in sc.MAIN_THREAD_STATES for r in tree.ranks)


@pytest.mark.slow
def test_torchrun_attach_via_a_rank_and_via_a_worker(torchrun_job, collectors):
    launcher_pid, rank_pids = torchrun_job.launcher, torchrun_job.ranks
    rank1 = max(rank_pids)
    via_rank = JobCollector(rank1, stacks_enabled=False)
    collectors(via_rank)
    tree = _with_workers(via_rank)
    assert tree.root_pid == rank1
    _assert_torchrun_tree(tree, launcher_pid, rank_pids)

    worker = tree.ranks[0].workers[0].pid
    via_worker = JobCollector(worker, stacks_enabled=False)
    collectors(via_worker)
    _assert_torchrun_tree(_with_workers(via_worker), launcher_pid, rank_pids)


@pytest.mark.slow
def test_attach_via_the_shell_that_started_torchrun(torchrun_job, collectors):
    collector = JobCollector(torchrun_job.shell, stacks_enabled=False)
    collectors(collector)
    tree = _with_workers(collector)
    assert tree.root_pid == torchrun_job.shell
    _assert_torchrun_tree(tree, torchrun_job.launcher, torchrun_job.ranks)


@pytest.mark.slow
def test_discover_jobs_groups_gpu_processes_by_launcher(torchrun_job, spawn):
    launcher_pid, rank_pids = torchrun_job.launcher, torchrun_job.ranks
    lone = spawn.python("import time\nwhile True: time.sleep(1)")
    r0, r1 = sorted(rank_pids, key=lambda p: int(procfs.read_environ(p)["RANK"]))
    gpus = (gpu(0, r0), gpu(1, r1), gpu(2, lone.pid), gpu(3))
    jobs = discover_jobs(gpus)
    assert [(j.launcher.pid if j.launcher else None, [r.proc.pid for r in j.ranks]) for j in jobs] == [
        (launcher_pid, [r0, r1]),
        (None, [lone.pid]),
    ]
    torchrun, single = jobs
    assert [r.gpus for r in torchrun.ranks] == [(0,), (1,)]
    assert single.ranks[0].gpus == (2,) and single.root_pid == lone.pid
    assert torchrun.warnings == () and single.warnings == ()

    # the classic bug: every rank on cuda:0 while the other GPUs idle
    jobs = discover_jobs((gpu(0, r0, r1), gpu(1), gpu(2), gpu(3)))
    assert [(m.kind, m.pids) for m in jobs[0].misplacements] == [("all_on_one_gpu", (r0, r1))]
    assert jobs[0].warnings == (
        "all 2 ranks run on GPU 0 while 3 other GPUs sit idle: call torch.cuda.set_device(local_rank) "
        "(or use f'cuda:{local_rank}') before any CUDA work",
    )
    # second call: CPU % known now that psutil has two readings
    assert all(r.proc.cpu_percent is not None for r in jobs[0].ranks)


# ----------------------------------------------------------------- misplacement (pure)


def _rank(pid: int, rank: int, gpus: tuple[int, ...]) -> Rank:
    return Rank(proc=ProcInfo(pid=pid, ppid=1, name="python"), rank=rank, local_rank=rank, world_size=4, gpus=gpus)


def test_misplacement_shared_gpu_and_stray_context():
    gpus = tuple(gpu(i) for i in range(4))
    ranks = (_rank(10, 0, (0,)), _rank(11, 1, (1,)), _rank(12, 2, (1,)), _rank(13, 3, (0, 3)))
    found = find_misplacements(ranks, gpus)
    assert [(m.kind, m.pids, m.gpus) for m in found] == [
        ("shared_gpu", (10, 13), (0,)),
        ("shared_gpu", (11, 12), (1,)),
        ("several_gpus", (13,), (0, 3)),
    ]
    assert tuple(m.message for m in found) == (
        "GPU 0 is shared by 2 ranks (rank 0 (PID 10), rank 3 (PID 13)): " + SET_DEVICE_FIX,
        "GPU 1 is shared by 2 ranks (rank 1 (PID 11), rank 2 (PID 12)): " + SET_DEVICE_FIX,
        "rank 3 (PID 13) holds memory on GPUs 0, 3: a stray CUDA context (usually cuda:0 touched before "
        "set_device); " + SET_DEVICE_FIX,
    )
    everyone = find_misplacements((_rank(10, 0, (0,)), _rank(11, 1, (0,))), gpus)
    assert [(m.kind, m.pids, m.gpus) for m in everyone] == [("all_on_one_gpu", (10, 11), (0,))]
    assert find_misplacements((_rank(10, 0, (0,)), _rank(11, 1, (1,))), gpus) == ()
    assert find_misplacements((_rank(10, 0, ()),), gpus) == ()  # no GPU processes known: nothing to say


# ----------------------------------------------------------------- faults


@pytest.mark.slow
@needs_py_spy
def test_non_python_process_has_stacks_na_and_everything_else(spawn, collectors):
    sleeper = spawn(["sleep", "600"])
    wait_until(lambda: Path(f"/proc/{sleeper.pid}/exe").resolve().name == "sleep", what="sleep to exec")
    collector = JobCollector(sleeper.pid, stacks_enabled=False)
    collectors(collector)
    collector.refresh_stacks()
    tree = collector.collect((gpu(0, sleeper.pid),), 0.0)
    [rank] = tree.ranks
    assert rank.proc.name == "sleep" and rank.proc.state == "S" and rank.proc.rss
    assert rank.gpus == (0,)
    assert rank.main_thread_state is None
    assert tree.stacks[sleeper.pid].error.startswith("not a Python process")
    assert tree.stacks_error == tree.stacks[sleeper.pid].error


@pytest.mark.slow
@needs_py_spy
def test_process_exiting_while_attached_keeps_last_stacks(spawn, collectors):
    proc = spawn.python(SPIN_UNTIL_KILLED)
    collector = JobCollector(proc.pid, stack_interval=0.2)
    collectors(collector)

    def has_stack():
        s = collector.collect().stacks.get(proc.pid)
        return s is not None and s.error is None and "spin_until_killed" in [f.name for f in sc.main_thread(s).frames]

    wait_until(has_stack, timeout=DEADLINE, what="a stack of the spinning process")
    proc.kill()
    proc.wait(timeout=10)
    tree = wait_until(lambda: (t := collector.collect()).exited and t, timeout=DEADLINE, what="the tree to say exited")
    assert tree.ranks[0].proc.exited and tree.ranks[0].proc.state == "X"
    assert tree.ranks[0].proc.cpu_percent is None
    kept = tree.stacks[proc.pid]
    assert kept.error is None and sc.main_thread(kept).frames[0].name == "spin_until_killed"
    assert collector.collect() == tree and collector.exited


@pytest.mark.slow
@needs_py_spy
def test_dump_racing_the_exit_does_not_replace_good_stacks(spawn, collectors):
    proc = spawn.python(SPIN_UNTIL_KILLED)
    collector = JobCollector(proc.pid, stacks_enabled=False)
    collectors(collector)
    wait_until(
        lambda: collector.refresh_stacks() or collector.collect().stacks[proc.pid].error is None,
        timeout=DEADLINE,
        what="a good first dump",
    )
    good = collector.collect().stacks[proc.pid]
    proc.kill()
    proc.wait(timeout=10)
    collector.refresh_stacks()  # py-spy now fails: the process is gone
    tree = collector.collect()
    assert tree.exited and tree.stacks[proc.pid] == good


@pytest.mark.slow
def test_stat_parsing_survives_odd_process_names(spawn, tmp_path):
    ready = tmp_path / "renamed"
    odd = "a) b (c) é"  # comm may hold spaces and parentheses; stat's fields follow the LAST ')'
    code = (
        f"import time\nopen('/proc/self/comm', 'w').write({odd!r})\nopen({str(ready)!r}, 'w').write('ok')\n"
        "while True: time.sleep(1)"
    )
    proc = spawn.python(code)
    wait_until(ready.exists, timeout=DEADLINE, what="the process to rename itself")
    stat = procfs.read_stat(proc.pid)
    assert stat.comm == odd.encode()[:15].decode("utf-8", "replace")  # the kernel keeps 15 bytes
    assert stat.ppid == os.getpid() and stat.state in ("R", "S")
    assert stat.start_ticks > 0


@pytest.mark.slow
def test_nonexistent_pid_is_one_line_error():
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    with pytest.raises(GputopError) as info:
        JobCollector(pid)
    assert str(info.value) == f"no process with PID {pid} (it may have exited; check with `ps -p {pid}`)"
    with pytest.raises(GputopError, match="not a process id"):
        JobCollector(0)


@pytest.mark.slow
def test_pid_reuse_is_not_taken_for_the_job(spawn, collectors):
    proc = spawn.python("import time\nwhile True: time.sleep(1)")
    collector = JobCollector(proc.pid, stacks_enabled=False)
    collectors(collector)
    live_start = psutil.Process(proc.pid).create_time()
    assert collector.root_key == (proc.pid, live_start)
    # Pretend we attached to an older process that had this PID: the live one must not pass for it.
    collector._root_key = (proc.pid, live_start - 60.0)
    tree = collector.collect()
    assert tree.exited and tree.ranks[0].proc.exited

    table = procfs.ProcessTable()
    tracked = table.get(proc.pid)
    # an older process remembered under the same PID: started 60 s (6000 ticks at 100 Hz) earlier
    older = dataclasses.replace(
        tracked, key=(proc.pid, live_start - 60.0), start_ticks=tracked.start_ticks - 6000, cmdline=("old",)
    )
    table._by_pid[proc.pid] = older
    table.begin_scan()
    fresh = table.get(proc.pid)
    assert fresh.key == (proc.pid, live_start) and fresh.cmdline != ("old",)
    assert not table.is_current(older) and table.is_current(fresh)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    table.begin_scan()
    assert table.get(proc.pid) is None


# ----------------------------------------------------------------- the background stack thread


class CountingDump:
    """Stands in for py-spy to count refreshes (the scheduling is under test here, not py-spy)."""

    def __init__(self) -> None:
        self.calls = 0
        self.done = threading.Event()

    def __call__(self, pids):
        self.calls += 1
        self.done.set()
        return {pid: ProcessStacks(pid=pid, timestamp=0.0, error="counted") for pid in pids}


@pytest.mark.slow
def test_stacks_follow_the_switch_and_stop_on_close(spawn, collectors):
    proc = spawn.python("import time\nwhile True: time.sleep(1)")
    dump = CountingDump()
    collector = JobCollector(proc.pid, stack_interval=0.01, stacks_wanted=False, dump=dump)
    collectors(collector)
    threading.Event().wait(0.3)  # an observation window of 30 intervals, not a synchronisation
    assert dump.calls == 0  # the panel is closed: py-spy never runs

    collector.stack_interval = 3600.0
    collector.stacks_wanted = True  # the panel opens: refresh at once, not at the next tick
    assert dump.done.wait(5.0) and dump.calls >= 1
    # the dump has run; its result lands in the collector a moment later
    stacks = wait_until(lambda: collector.collect().stacks.get(proc.pid), timeout=DEADLINE, what="the counted stacks")
    assert stacks.error == "counted"

    thread = collector._thread
    collector.close()
    wait_until(lambda: not thread.is_alive(), timeout=DEADLINE, what="the stack thread to end")


@pytest.mark.slow
def test_no_stack_thread_when_stacks_are_disabled(spawn, collectors):
    proc = spawn.python("import time\nwhile True: time.sleep(1)")
    dump = CountingDump()
    collector = JobCollector(proc.pid, stacks_enabled=False, dump=dump)
    collectors(collector)
    assert collector._thread is None
    assert collector.wait_for_stacks(0.01) is False
    assert dump.calls == 0 and collector.collect().stacks == {}


# ----------------------------------------------------------------- which stacks each round reads


def _proc(pid: int, cpu_ticks: int = 0) -> procfs.Tracked:
    return procfs.Tracked(proc=None, key=(pid, 0.0), start_ticks=0, cmdline=(), env={}, cpu_ticks=cpu_ticks)


def _stacks_of(pids, frame: str = "f") -> dict[int, ProcessStacks]:
    thread = ThreadStack(
        thread_id=1,
        thread_name="MainThread",
        os_thread_id=1,
        active=True,
        owns_gil=False,
        frames=(Frame(name=frame, filename="x.py", line=1),),
    )
    return {pid: ProcessStacks(pid=pid, timestamp=0.0, threads=(thread,)) for pid in pids}


def test_schedule_dumps_ranks_every_round_and_workers_in_turns():
    schedule = stack_schedule.StackSchedule()
    ranks = [_proc(1), _proc(2)]
    workers = [_proc(100 + i) for i in range(6)]
    counts = {t.key[0]: 0 for t in ranks + workers}
    for round_ in range(13):
        for t in workers:
            t.cpu_ticks += 50  # busy workers
        chosen = schedule.plan(ranks, workers)
        assert chosen[:2] == ranks
        if round_ == 0:
            assert chosen == ranks + workers  # the first round shows everything
        else:
            assert len(chosen) == 2 + 2  # a third of the six workers
        for t in chosen:
            counts[t.key[0]] += 1
        schedule.done(chosen, _stacks_of([t.key[0] for t in chosen], frame=f"f{round_}"))
    assert counts[1] == counts[2] == 13
    assert all(counts[t.key[0]] == 5 for t in workers), counts  # round 0, then every third round: evenly


def test_schedule_serves_new_workers_first_and_lets_still_ones_wait():
    schedule = stack_schedule.StackSchedule()
    rank = [_proc(1)]
    still, busy = _proc(100), _proc(101)
    schedule.done(schedule.plan(rank, [still, busy]), _stacks_of([1, 100, 101]))  # round 0: all
    schedule.done(schedule.plan(rank, [still, busy]), _stacks_of([1]))
    # a new worker (an epoch started) goes first
    new = _proc(102)
    busy.cpu_ticks += 100
    chosen = schedule.plan(rank, [still, busy, new])
    assert chosen == rank + [new]
    schedule.done(chosen, _stacks_of([1, 102]))
    dumped_still = []
    for round_ in range(3, 20):
        busy.cpu_ticks += 100
        new.cpu_ticks += 100
        chosen = schedule.plan(rank, [still, busy, new])
        dumped_still += [round_] if still in chosen else []
        # `still` used no CPU: from its second identical dump on it waits IDLE_EVERY_ROUNDS rounds
        schedule.done(chosen, _stacks_of([t.key[0] for t in chosen]))
    gaps = [b - a for a, b in zip(dumped_still, dumped_still[1:])]
    assert gaps and all(g >= stack_schedule.IDLE_EVERY_ROUNDS for g in gaps[1:]), dumped_still
    assert all(g <= stack_schedule.IDLE_EVERY_ROUNDS + 1 for g in gaps), dumped_still  # ... but it is not forgotten
    # a full round (the panel reopened) dumps everyone again
    assert schedule.plan(rank, [still, busy, new], full=True) == rank + [still, busy, new]


@pytest.mark.slow
@needs_py_spy
def test_collector_reads_every_rank_each_round_and_workers_in_turns(spawn, tmp_path, collectors):
    pid, _ = start_train_loop(spawn, tmp_path, "--workers", "2", "--persistent", "--length", "100000")
    dumped: list[list[int]] = []

    def counting_dump(pids):
        dumped.append(list(pids))
        return jobmod.stacks_mod.dump_stacks(pids)

    collector = JobCollector(pid, stacks_enabled=False, dump=counting_dump)
    collectors(collector)
    wait_until(lambda: len(collector.collect().ranks[0].workers) == 2, timeout=DEADLINE, what="2 workers")
    workers = [w.pid for w in collector.collect().ranks[0].workers]
    for _ in range(4):
        collector.refresh_stacks()
    assert dumped[0] == [pid] + workers  # the first round: everything
    # then the rank every round, and one of the two workers (a third, rounded up) with it
    assert all(round_[0] == pid for round_ in dumped) and all(len(r) <= 2 for r in dumped[1:]), dumped
    assert {p for r in dumped[1:] for p in r[1:]} == set(workers), dumped
    tree = collector.collect()
    assert all(tree.stacks[p].error is None and tree.stacks[p].threads for p in [pid] + workers)
    collector.refresh_stacks(full=True)
    assert dumped[-1] == [pid] + workers


# ----------------------------------------------------------------- command lines under an ASCII locale


@pytest.mark.slow
def test_cmdline_is_utf8_whatever_the_locale(spawn, tmp_path):
    """LANG=C without UTF-8 coercion: psutil would decode /proc/PID/cmdline as ASCII (lone surrogates)."""
    arg = str(tmp_path / "данные обучения" / "обучение.py")
    proc = spawn.python(["-c", "import time; time.sleep(60)", arg])
    wait_until(lambda: arg.encode() in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), what="the child to exec")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "PYTHONUTF8", "PYTHONIOENCODING"))}
    env.update(LANG="C", LC_ALL="C", PYTHONCOERCECLOCALE="0", PYTHONUTF8="0")
    code = f"from gputop.collect.procfs import ProcessTable; print(ascii(ProcessTable().get({proc.pid}).cmdline))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=Path(procfs.__file__).resolve().parent.parent.parent,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ascii((sys.executable, "-c", "import time; time.sleep(60)", arg))
    assert procfs.read_cmdline(proc.pid)[-1] == arg


def test_a_zombies_exit_status_and_a_tracer_are_read(spawn):
    import shutil

    from gputop.collect.procfs import read_exit_status, read_tracer
    from tests.harness.processes import wait_until

    pid = os.fork()
    if pid == 0:
        os._exit(3)
    try:
        wait_until(lambda: procfs.read_stat(pid).state == "Z", what="the child to be a zombie")
        assert read_exit_status(pid) == 3 << 8
    finally:
        os.waitpid(pid, 0)
    if shutil.which("gdb") is None:
        pytest.skip("no gdb here to trace a process")
    target = spawn(["sleep", "60"])
    assert read_tracer(target.pid) is None
    gdb = spawn(
        ["gdb", "-q", "-p", str(target.pid), "-batch", "-ex", "shell sleep 30"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    tracer = wait_until(lambda: read_tracer(target.pid), timeout=30, what="gdb to attach")
    assert tracer == f"PID {gdb.pid} (gdb)"
    gdb.send_signal(signal.SIGKILL)
