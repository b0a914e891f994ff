"""Find a training job's processes from any of its PIDs (launcher, ranks, DataLoader workers), and keep them up to date.

From the PID the user gives (the torchrun launcher, one rank, a DataLoader worker or a plain
``python train.py``) we find the launcher, every rank and every rank's DataLoader workers, each
collect: workers without ``persistent_workers`` respawn every epoch, and with ``forkserver`` they
are grandchildren of the rank.  Everything here reads /proc (through psutil) and is cheap; py-spy
runs only in `JobCollector`'s background thread, and `collect()` hands over its latest result.

A process is identified by (pid, create_time) throughout, so a new process that inherits an old
PID is never taken for the job.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional

import psutil

from gputop.analysis.stack_classes import classify_main_thread, runs_worker_loop
from gputop.clock import REAL_CLOCK, Clock
from gputop.collect import debug_server
from gputop.collect import stacks as stacks_mod
from gputop.collect.cgroup import job_limits
from gputop.collect.flight_recorder import FlightRecorderReader
from gputop.collect.placement import find_misplacements, gpus_of_pids, mig_instances_of_rank, place_ranks
from gputop.collect.procfs import (
    ProcessTable,
    ProcKey,
    Tracked,
    int_or_none,
    process_alive,
    read_cmdline,
    read_ns_pids,
    read_stat,
)
from gputop.collect.stack_schedule import LIVE_READ_AFTER_S, NATIVE_AFTER_S, FreezeWatch, StackSchedule
from gputop.collect.state_sampler import StartupWatch, StateSampler
from gputop.errors import GputopError
from gputop.fleet.identity import node_place
from gputop.inject import fr_read
from gputop.model import GpuSample, JobTree, ProcessStacks, ProcInfo, Rank, StateSamples

WORKER_COMM = "pt_data_worker"  # torch sets it in the DataLoader worker loop
PIN_THREAD_COMM = "pt_data_pin"  # torch names the pin-memory thread so

# Launchers recognised by command line (argv[0] or the script an interpreter runs) or by comm; any other
# parent whose children carry a rank it does not is taken for a launcher too (custom launch scripts).
_LAUNCHER_MODULES = (
    "torch.distributed.run",
    "torch.distributed.launch",
    "deepspeed.launcher.launch",
    "deepspeed.launcher.runner",
)
_LAUNCHER_PROGRAMS = (
    "torchrun",
    "deepspeed",
    "accelerate",
    "srun",
    "slurmstepd",  # Slurm: the tasks of a step are children of slurmstepd on each node
    "mpirun",
    "mpiexec",
    "mpiexec.hydra",
    "orterun",
    "prterun",
    "orted",
    "prted",
    "hydra_pmi_proxy",
)
_LAUNCHER_COMMS = ("pt_elastic", "slurmstepd")  # torch.distributed.run renames its main thread so

# Where launchers put a process's place in the job, most specific first: torchrun/Accelerate/DeepSpeed/
# Lightning set RANK/LOCAL_RANK (Lightning only LOCAL_RANK and NODE_RANK), srun SLURM_*, Open MPI
# OMPI_COMM_WORLD_*, MPICH/Intel MPI (hydra) PMI_* and MPI_LOCALRANKID.  Read from /proc/PID/environ,
# the environment the process started with.
RANK_KEYS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LOCAL_RANK_KEYS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_KEYS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
# multiprocessing's own helper processes: part of a rank, never a rank or a worker themselves.
_HELPER_MARKERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker")


# ----------------------------------------------------------------- roles


def _cmdline_text(tracked: Tracked) -> str:
    return " ".join(tracked.cmdline)


def is_helper(tracked: Tracked) -> bool:
    """multiprocessing's forkserver / resource tracker: plumbing inside a rank."""
    text = _cmdline_text(tracked)
    return any(marker in text for marker in _HELPER_MARKERS)


def is_worker(tracked: Tracked) -> bool:
    return tracked.comm == WORKER_COMM


def rank_env_keys(tracked: Tracked) -> frozenset[str]:
    """The rank variables this process started with (see RANK_KEYS, LOCAL_RANK_KEYS)."""
    env = tracked.env or {}
    return frozenset(key for key in RANK_KEYS + LOCAL_RANK_KEYS if key in env)


def has_rank_env(tracked: Tracked) -> bool:
    return bool(rank_env_keys(tracked))


def _first_int(env: dict[str, str], keys: tuple[str, ...]) -> Optional[int]:
    for key in keys:
        value = int_or_none(env.get(key))
        if value is not None:
            return value
    return None


@dataclass(frozen=True)
class RankIdentity:
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None


def identity_from_env(env: Optional[dict[str, str]], ranks_here: int = 1) -> RankIdentity:
    """Rank, local rank and world size from a launcher's variables.  Lightning's children carry only
    LOCAL_RANK and NODE_RANK: their global rank is NODE_RANK x (ranks on this node) + LOCAL_RANK."""
    env = env or {}
    rank = _first_int(env, RANK_KEYS)
    local_rank = _first_int(env, LOCAL_RANK_KEYS)
    node_rank = int_or_none(env.get("NODE_RANK"))
    if rank is None and local_rank is not None and node_rank is not None:
        rank = node_rank * ranks_here + local_rank
    return RankIdentity(rank, local_rank, _first_int(env, WORLD_SIZE_KEYS))


def script_and_args(argv: tuple[str, ...]) -> tuple[str, ...]:
    """What a Python command line runs, with the interpreter and its own flags left out and the script
    by its base name: `python -u train.py --lr 1` and `/venv/bin/python3 /abs/train.py --lr 1` agree."""
    args = list(argv[1:])
    while args and args[0].startswith("-") and args[0] not in ("-m", "-c"):
        flag = args.pop(0)
        if flag in ("-X", "-W") and args:  # flags that take a separate value
            args.pop(0)
    if not args:
        return ()
    if args[0] in ("-m", "-c"):
        return tuple(args)
    return (os.path.basename(args[0]), *args[1:])


def is_mp_child(parent: Tracked, child: Tracked) -> bool:
    """Started by Python multiprocessing: a spawn/forkserver child runs `spawn_main`; a forked one keeps
    its parent's command line (a shell running `python train.py` is neither)."""
    return "spawn_main" in _cmdline_text(child) or (bool(child.cmdline) and child.cmdline == parent.cmdline)


def program_names(argv: tuple[str, ...]) -> tuple[str, ...]:
    """The base names a command line may go by: its program, and the script an interpreter runs
    (`python /path/to/torchrun ...`, a console script run through its interpreter)."""
    return tuple(os.path.basename(arg) for arg in argv[:2])


def is_named_launcher(tracked: Tracked) -> bool:
    """torchrun, accelerate, deepspeed, srun/slurmstepd, mpirun/mpiexec and their daemons, by name."""
    if tracked.comm in _LAUNCHER_COMMS:
        return True
    argv = tracked.cmdline
    if any(name in _LAUNCHER_PROGRAMS for name in program_names(argv)):
        return True
    return any(arg == "-m" and argv[i + 1] in _LAUNCHER_MODULES for i, arg in enumerate(argv[:-1]))


# ----------------------------------------------------------------- tree building


@dataclass
class _Structure:
    launcher: Optional[Tracked]
    ranks: list[Tracked]
    identities: dict[ProcKey, RankIdentity]


class JobScanner:
    """Builds JobTrees from /proc; keeps its ProcessTable so CPU % deltas work between scans."""

    def __init__(self, table: Optional[ProcessTable] = None) -> None:
        self.table = table or ProcessTable()
        self.role_workers: set[ProcKey] = set()  # processes whose stacks showed the DataLoader worker loop

    # ---- structure

    def _children(self, tracked: Tracked) -> list[Tracked]:
        """Live children that may be ranks or launchers (not DataLoader workers, not multiprocessing helpers)."""
        kids = []
        for pid in self.table.children(tracked.key[0]):
            child = self.table.get(pid)
            if child is not None and not is_helper(child) and not self.is_worker(child):
                kids.append(child)
        return kids

    def _is_launcher(self, tracked: Tracked, gpu_pids: frozenset[int] = frozenset()) -> bool:
        """torchrun & co by name; any parent of processes carrying a rank variable that it does not carry
        itself; and a `torch.multiprocessing.spawn` parent: its spawned/forked children hold GPUs or run
        DataLoaders."""
        if is_named_launcher(tracked):
            return True
        if tracked.key[0] in gpu_pids:
            return False  # itself a rank
        own_keys = rank_env_keys(tracked)
        for child in self._children(tracked):
            if rank_env_keys(child) - own_keys:
                return True
            if not own_keys and is_mp_child(tracked, child) and (child.key[0] in gpu_pids or self.workers_of(child)):
                return True
        return False

    def _self_launched(self, tracked: Optional[Tracked]) -> list[Tracked]:
        """Lightning's subprocess launcher: rank 0 is the user's own process, and it starts ranks 1.. as
        children running the same command with LOCAL_RANK set.  Those children, or [] if `tracked` is
        not such a rank 0."""
        if tracked is None or is_named_launcher(tracked) or has_rank_env(tracked):
            return []
        program = script_and_args(tracked.cmdline)
        if not program:
            return []
        return [
            child
            for child in self._children(tracked)
            if "LOCAL_RANK" in rank_env_keys(child) and script_and_args(child.cmdline) == program
        ]

    def _parent(self, tracked: Tracked) -> Optional[Tracked]:
        """The parent, if it may be part of the job.  PID 1 is the machine's init on a host, but in a
        container it is often the launcher itself (torchrun or a Python script as the entrypoint)."""
        if tracked.ppid < 1:
            return None
        parent = self.table.get(tracked.ppid)
        if parent is None or tracked.ppid > 1:
            return parent
        python = os.path.basename(parent.cmdline[0]).startswith("python") if parent.cmdline else False
        return parent if python or is_named_launcher(parent) else None

    def owning_rank(self, tracked: Tracked) -> Tracked:
        """Climb from a DataLoader worker or multiprocessing helper to the rank process it serves."""
        current = tracked
        for _ in range(8):  # worker -> forkserver -> rank is the deepest; bound the walk anyway
            if not (self.is_worker(current) or is_helper(current)):
                return current
            parent = self.table.get(current.ppid)
            if parent is None or parent.key[0] <= 1:
                return current
            current = parent
        return current

    def structure(self, root: Tracked, gpu_pids: frozenset[int] = frozenset()) -> _Structure:
        """Launcher and ranks of the job `root` belongs to (root may be any of its processes)."""
        start = self.owning_rank(root)
        parent = self._parent(start)
        for rank_zero in (start, parent):
            others = self._self_launched(rank_zero)
            if others and rank_zero is not None:  # others are found only below a rank zero
                return self._self_launched_structure(rank_zero, others)
        if self._is_launcher(start, gpu_pids):
            return self._launcher_structure(start, gpu_pids)
        if parent is not None and self._is_launcher(parent, gpu_pids):
            return self._launcher_structure(parent, gpu_pids)
        if start.key[0] not in gpu_pids and not self.workers_of(start):
            # `bash run.sh` that runs torchrun: the job is the launcher below the PID we were given
            for child in self._children(start):
                if self._is_launcher(child, gpu_pids):
                    return self._launcher_structure(child, gpu_pids)
        return _Structure(None, [start], {start.key: identity_from_env(start.env)})

    def _self_launched_structure(self, rank_zero: Tracked, others: list[Tracked]) -> _Structure:
        """Rank 0 started with no rank variables; it is local rank 0 of the node its children name."""
        ranks_here = len(others) + 1
        identities = {child.key: identity_from_env(child.env, ranks_here) for child in others}
        child_env = others[0].env or {}
        zero_env: dict[str, str] = {"LOCAL_RANK": "0", **{k: child_env[k] for k in ("NODE_RANK", "WORLD_SIZE") if k in child_env}}
        identities[rank_zero.key] = identity_from_env(zero_env, ranks_here)
        ranks = sorted([rank_zero, *others], key=lambda t: _identity_sort_key(identities[t.key], t))
        return _Structure(None, ranks, identities)

    def _srun_step(self, srun: Tracked) -> list[Tracked]:
        """The `srun` client does not parent its tasks: slurmd's slurmstepd does, named `slurmstepd:
        [JOB.STEP]`.  For an srun inside an allocation (SLURM_JOB_ID set), that job's newest step on this
        node; [] otherwise.  One pass over /proc's command lines, only when attached through srun."""
        argv = srun.cmdline
        job_id = (srun.env or {}).get("SLURM_JOB_ID")
        if not job_id or "srun" not in program_names(argv):
            return []
        steps = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != srun.key[0]:
                text = " ".join(read_cmdline(int(name)))
                if "slurmstepd" in text and f"[{job_id}." in text and ".batch]" not in text and ".extern]" not in text:
                    step = self.table.get(int(name))
                    if step is not None and self._children(step):
                        steps.append(step)
        return [max(steps, key=lambda t: t.start_ticks)] if steps else []

    def _launcher_structure(self, launcher: Tracked, gpu_pids: frozenset[int]) -> _Structure:
        """The ranks below `launcher`, through launchers it starts in turn (deepspeed's runner starts
        deepspeed.launcher.launch, mpiexec starts hydra_pmi_proxy): the launcher reported is the one
        right above the ranks."""
        for _ in range(4):
            kids = self._children(launcher) or self._srun_step(launcher)
            # torchrun started by srun is a task itself (SLURM_PROCID) and a launcher: look below it too
            inner = [k for k in kids if is_named_launcher(k) or (not has_rank_env(k) and self._is_launcher(k, gpu_pids))]
            if len(inner) == 1 and len(kids) == 1:
                launcher = inner[0]
                continue
            break
        ranks = self._children(launcher)
        identities = {t.key: identity_from_env(t.env, len(ranks)) for t in ranks}
        if len(ranks) > 1 and all(i == RankIdentity() for i in identities.values()):
            # torch.multiprocessing.spawn passes the rank as an argument, not in the environment; it starts
            # rank 0, 1, ... in order, so the start order numbers them.
            by_start = sorted(ranks, key=lambda t: (t.start_ticks, t.key))
            identities = {t.key: RankIdentity(i, i, len(ranks)) for i, t in enumerate(by_start)}
        ranks.sort(key=lambda t: _identity_sort_key(identities[t.key], t))
        return _Structure(launcher, ranks, identities)

    def is_worker(self, tracked: Tracked) -> bool:
        """A DataLoader worker: by the name torch gives it, or by its role (its stack ran the worker loop:
        torchdata's StatefulDataLoader workers keep the rank's name)."""
        return is_worker(tracked) or tracked.key in self.role_workers

    def workers_of(self, rank: Tracked) -> list[Tracked]:
        """DataLoader workers anywhere below the rank (children with fork/spawn, grandchildren with forkserver)."""
        return self._below(rank)[0]

    def _below(self, rank: Tracked) -> tuple[list[Tracked], list[Tracked]]:
        workers, candidates = [], []
        own_keys = rank_env_keys(rank)
        pending = [(rank, pid) for pid in self.table.children(rank.key[0])]
        seen = {rank.key[0]}
        while pending:
            parent, pid = pending.pop()
            if pid in seen:
                continue
            seen.add(pid)
            child = self.table.get(pid)
            if child is None:
                continue
            if self.is_worker(child):
                workers.append(child)
            elif is_helper(child):
                # through the forkserver, not into other programs
                pending.extend((child, grandchild) for grandchild in self.table.children(pid))
            elif is_mp_child(parent, child) and not rank_env_keys(child) - own_keys:
                candidates.append(child)  # not a rank it started (those carry a rank variable it lacks)
        return sorted(workers, key=lambda t: t.key), sorted(candidates, key=lambda t: t.key)

    # ---- one tree

    def build(self, root_pid: int, structure: _Structure, gpus: tuple[GpuSample, ...]) -> JobTree:
        """A JobTree with fresh process figures (no stacks)."""
        launcher_info = self.table.info(structure.launcher) if structure.launcher else None
        identities = {t.key: structure.identities.get(t.key) or identity_from_env(t.env) for t in structure.ranks}
        placement = place_ranks(((t, identities[t.key].local_rank) for t in structure.ranks), gpus)
        ranks = []
        for rank in structure.ranks:
            env = rank.env or {}
            identity = identities[rank.key]
            on_gpus, mapping = placement[rank.key]
            place = node_place(env)
            workers = tuple(self.table.info(w) for w in self.workers_of(rank))
            ranks.append(
                Rank(
                    proc=self.table.info(rank),
                    rank=identity.rank,
                    local_rank=identity.local_rank,
                    world_size=identity.world_size,
                    cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
                    gpus=on_gpus,
                    gpu_mapping=mapping,
                    mig_instances=mig_instances_of_rank(rank.key[0], env, identity.local_rank, mapping, gpus),
                    workers=workers,
                    pin_memory_tids=self.table.threads_named(rank.key[0], PIN_THREAD_COMM),
                    job_id=place.job_id,
                    node_rank=place.node_rank,
                    nnodes=place.nnodes,
                )
            )
        ranks_t = tuple(ranks)
        misplacements = find_misplacements(ranks_t, gpus)
        limits = job_limits((r.key[0] for r in structure.ranks), host_memory=_host_memory())
        return JobTree(
            root_pid=root_pid,
            launcher=launcher_info,
            ranks=ranks_t,
            warnings=tuple(m.message for m in misplacements),
            cores=job_cores(launcher_info, ranks_t),
            misplacements=misplacements,
            cpu_limit=limits.cpu,
            memory_limit=limits.memory,
        )


@functools.lru_cache(maxsize=1)
def _host_memory() -> int:
    return int(psutil.virtual_memory().total)


def _identity_sort_key(identity: RankIdentity, tracked: Tracked) -> tuple[bool, int, ProcKey]:
    number = identity.rank if identity.rank is not None else identity.local_rank
    return (number is None, number if number is not None else 0, tracked.key)


def tree_pids(tree: JobTree) -> list[int]:
    """Every process of the job: launcher, ranks, workers."""
    pids = [tree.launcher.pid] if tree.launcher else []
    for rank in tree.ranks:
        pids.append(rank.proc.pid)
        pids.extend(w.pid for w in rank.workers)
    return pids


def job_cores(launcher: Optional[ProcInfo], ranks: Iterable[Rank]) -> tuple[int, ...]:
    """Cores the job's live processes last ran on."""
    cores = set()
    procs = [launcher] if launcher else []
    for rank in ranks:
        procs.append(rank.proc)
        procs.extend(rank.workers)
    for proc in procs:
        if proc.core is not None and not proc.exited:
            cores.add(proc.core)
    return tuple(sorted(cores))


# ----------------------------------------------------------------- the collector


def _no_process_error(pid: int) -> GputopError:
    return GputopError(f"no process with PID {pid} (it may have exited; check with `ps -p {pid}`)")


def _state_sampler(given: Optional[StateSampler], py_spy_stacks: bool, wanted: bool, clock: Clock) -> Optional[StateSampler]:
    """The sampler given, else py-spy's where stacks come from py-spy (without py-spy the dumps say why)."""
    sampler = given
    if given is None and py_spy_stacks:
        py_spy = stacks_mod.find_py_spy()
        sampler = StateSampler(py_spy, clock) if py_spy else None
    if sampler is not None:
        sampler.set_wanted(wanted)
    return sampler


def _stack_readers(
    dump: Optional[Callable[[list[int]], dict[int, ProcessStacks]]],
    native_dump: Optional[Callable[[int], ProcessStacks]],
    clock: Clock,
) -> tuple[Callable[[list[int]], dict[int, ProcessStacks]], Optional[Callable[[int], ProcessStacks]]]:
    """The dump and the native dump given, else py-spy's (a few dumps at a time: each is CPU work, and on a small
    machine the job needs the cores), stamped on the pipeline's clock (py-spy's, its stretches' and the
    start-up's stamps all come from `clock`: gputop/clock.py)."""
    if native_dump is stacks_mod.dump_native:
        native_dump = functools.partial(stacks_mod.dump_native, clock=clock.wall)
    default = functools.partial(stacks_mod.dump_stacks, max_parallel=stacks_mod.background_parallelism(), clock=clock.wall)
    return dump or default, native_dump


# Attached to a multiprocessing child: dumps of it (~12 ms each) before deciding it runs no worker loop.  One
# `--nonblocking` dump can fail or read a stack torn while it changed, and a worker taken for the job would show
# a job of one worker until the stack thread's first round (ci44, on a loaded box).
ROLE_DUMPS_AT_ATTACH = 3


class JobCollector:
    """Attached to one job.  `collect()` is cheap (/proc via psutil); py-spy runs in a background thread
    every `stack_interval` seconds while `stacks_wanted` is True, and `collect()` returns its latest result.
    """

    def __init__(
        self,
        pid: int,
        *,
        stack_interval: float = 2.0,
        stacks_enabled: bool = True,
        stacks_wanted: bool = True,
        dump: Optional[Callable[[list[int]], dict[int, ProcessStacks]]] = None,
        native_dump: Optional[Callable[[int], ProcessStacks]] = stacks_mod.dump_native,
        native_after: float = NATIVE_AFTER_S,
        sampler: Optional[StateSampler] = None,
        recorder_read: Optional[fr_read.Reader] = fr_read.read_live,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        """Attach to the job `pid` belongs to.  `stacks_enabled=False`: never run py-spy (no thread);
        `stacks_wanted`: the initial state of the switch; `dump`: the stack reader (default: py-spy, see
        `_stack_readers`);
        `native_dump`: what takes the one native dump of a process frozen for `native_after` seconds
        (None: never pause a process); `sampler`: what samples the ranks' main threads densely (default:
        py-spy record, when stacks come from py-spy; none when `dump` replaces py-spy); `recorder_read`: what
        reads the flight recorder of a rank that has it on but writes no dump, once a rank has stood still
        `LIVE_READ_AFTER_S`: through its debug server, else from inside it (None: never read live;
        $GPUTOP_NO_RECORDER_READ set: never inject); `clock`: the pipeline's."""
        if pid <= 0:
            raise GputopError(f"{pid} is not a process id (it must be positive)")
        self.pid = pid
        self.stack_interval = stack_interval
        self._scanner = JobScanner()
        root = self._scanner.table.get(pid)
        if root is None:
            raise _no_process_error(pid)
        self._root_key: ProcKey = root.key
        self._root_start_ticks = root.start_ticks
        self._dump, self._native_dump = _stack_readers(dump, native_dump, clock)
        self._schedule = StackSchedule()
        self._freezes = FreezeWatch(native_after)
        self._lock = threading.Lock()
        self._stacks: dict[int, ProcessStacks] = {}
        self._native: dict[int, ProcessStacks] = {}  # pid -> the native dump of its freeze, while it lasts
        self._stacks_error: Optional[str] = None
        self._last_tree: Optional[JobTree] = None
        self._exited = False
        self._stack_pids: list[int] = []
        self._gpu_pids: frozenset[int] = frozenset()  # PIDs on a GPU at the last collect
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._dumped = threading.Event()  # set after the first stack refresh finished
        self._stacks_wanted = stacks_wanted
        self._stacks_enabled = stacks_enabled
        self._startup = StartupWatch(clock.wall)
        self._recorders = FlightRecorderReader()
        self._live_recorders = fr_read.LiveRecorderReads(recorder_read) if recorder_read is not None else None
        self._sampler = _state_sampler(sampler, stacks_enabled and dump is None, stacks_wanted, clock)
        if stacks_enabled:
            self._learn_role_of_root(root)
        self.collect(())  # learn the job's PIDs before the first dump
        self._thread: Optional[threading.Thread] = None
        if stacks_enabled:
            self._thread = threading.Thread(target=self._stack_loop, name="gputop-stacks", daemon=True)
            self._thread.start()

    # ---- stacks switch

    @property
    def stacks_wanted(self) -> bool:
        return self._stacks_wanted

    @stacks_wanted.setter
    def stacks_wanted(self, value: bool) -> None:
        was = self._stacks_wanted
        self._stacks_wanted = bool(value)
        if self._sampler is not None:
            self._sampler.set_wanted(bool(value))
        if value and not was:
            self._wake.set()  # the panel just opened: refresh now, not at the next tick

    def focus_sampling(self, focused: bool) -> None:
        """Sample the ranks' main threads densely (a report, the findings screen) or at the screen's rate."""
        if self._sampler is not None:
            self._sampler.focus(focused)

    def flush_samples(self) -> None:
        """End the running dense stretches now and let the recorder reads in flight land (at most
        `fr_read.LAND_S`), so the next `collect()` carries them (a report's end)."""
        if self._sampler is not None:
            self._sampler.flush()
        if self._live_recorders is not None:
            self._live_recorders.wait_idle(fr_read.LAND_S)

    @property
    def root_key(self) -> ProcKey:
        """(pid, create_time) of the process we attached to."""
        return self._root_key

    @property
    def exited(self) -> bool:
        return self._exited

    # ---- collect

    def collect(self, gpus: tuple[GpuSample, ...] = (), now: Optional[float] = None) -> JobTree:
        """The job as it is now, with the latest stacks.  Never raises for the job's own troubles."""
        if self._exited:
            return self._exited_tree()
        self._scanner.table.begin_scan()
        root = self._scanner.table.get(self.pid)
        if root is None or root.key != self._root_key:  # gone, or the PID now names another process
            return self._exited_tree()
        gpus = tuple(gpus)
        self._gpu_pids = frozenset(gpus_of_pids(gpus))
        structure = self._scanner.structure(root, self._gpu_pids)
        tree = self._scanner.build(self.pid, structure, gpus)
        pids = tree_pids(tree)
        self._scanner.table.prune()
        with self._lock:
            self._stack_pids = pids
            stacks = {pid: self._stacks[pid] for pid in pids if pid in self._stacks}
            native = {pid: self._native[pid] for pid in pids if pid in self._native}
            stacks_error = self._stacks_error
        stretches = self._take_stretches([r.proc.pid for r in tree.ranks])
        self._recorders.forget_except({r.proc.pid for r in tree.ranks})
        live = self._live_recorders
        if live is not None:
            live.forget_except({r.proc.pid for r in tree.ranks})
        records = (
            self._recorders.read(r.proc.pid, r.rank, r.proc.create_time, live.get(r.proc.pid) if live else None)
            for r in tree.ranks
        )
        tree = replace(
            tree,
            ranks=tuple(self._with_states(r, stacks.get(r.proc.pid)) for r in tree.ranks),
            stacks=stacks,
            native_stacks=native,
            stacks_error=stacks_error,
            state_samples=stretches,
            flight_records=tuple(r for r in records if r is not None),
        )
        self._last_tree = tree
        return tree

    def _take_stretches(self, rank_pids: list[int]) -> tuple[StateSamples, ...]:
        """The ranks' dense stretches finished since the last collect (and the ranks to sample from now on)."""
        if self._sampler is None:
            return ()
        stretches = self._sampler.take()
        for stretch in stretches:
            self._startup.saw_stretch(stretch)
        self._startup.forget_except(set(rank_pids))
        self._sampler.follow(rank_pids, frozenset(p for p in rank_pids if self._startup.status(p)[0]))
        return stretches

    def _with_states(self, rank: Rank, stacks: Optional[ProcessStacks]) -> Rank:
        starting_up, loop_started = self._startup.status(rank.proc.pid)
        return replace(rank, main_thread_state=_state_of(stacks), starting_up=starting_up, loop_started=loop_started)

    def _exited_tree(self) -> JobTree:
        """The last tree, marked exited, with the last stacks kept."""
        self._exited = True
        self._dumped.set()  # nothing more will come: don't keep wait_for_stacks() waiting
        if self._sampler is not None:
            self._sampler.follow([])  # nothing left to sample
        last = self._last_tree or JobTree(root_pid=self.pid)
        if last.exited:
            return last
        table = self._scanner.table

        def gone(info: ProcInfo) -> ProcInfo:
            tracked = table.get(info.pid) if info.pid != self.pid else None  # the root is gone by now
            if tracked is not None and tracked.key == (info.pid, info.create_time):
                return table.info(tracked)  # still running (a launcher outliving the rank we attached to)
            return replace(info, exited=True, state="X", cpu_percent=None)

        with self._lock:
            stacks = dict(self._stacks)
            native = dict(self._native)
        pids = set(tree_pids(last))
        tree = replace(
            last,
            exited=True,
            launcher=gone(last.launcher) if last.launcher else None,
            ranks=tuple(
                replace(
                    r, proc=gone(r.proc), workers=tuple(replace(w, exited=True, state="X", cpu_percent=None) for w in r.workers)
                )
                for r in last.ranks
            ),
            stacks={pid: s for pid, s in stacks.items() if pid in pids},
            native_stacks={pid: s for pid, s in native.items() if pid in pids},
            cores=(),
        )
        self._last_tree = tree
        return tree

    # ---- background stacks

    def refresh_stacks(self, *, full: bool = False) -> None:
        """One stack round: every rank, and the workers and launcher whose turn it is (`full`: every
        process).  The background thread calls this; tests and reports may too."""
        if self._exited:
            return
        # Re-read the PIDs now rather than use the last collect's: workers without persistent_workers
        # are replaced every epoch, and a dump of last epoch's workers is wasted.
        found = self._current_processes()
        if found is None:  # the job is gone: nothing to dump, and the last stacks stay as they are
            self._dumped.set()
            return
        ranks, others = found
        chosen = self._schedule.plan(ranks, others, full=full)
        with self._lock:
            self._stack_pids = [t.key[0] for t in ranks + others]
        pids = [t.key[0] for t in chosen]
        fresh = self._with_server_stacks(ranks, self._dump(pids) if pids else {})
        job_gone = not self._root_alive()
        with self._lock:
            for pid, new in fresh.items():
                old = self._stacks.get(pid)
                if new.error and old is not None and old.error is None and (job_gone or not process_alive(pid)):
                    continue  # it (or the whole job) died while we dumped: keep what it last did
                self._stacks[pid] = new
            live = set(self._stack_pids) | set(fresh)
            for pid in [p for p in self._stacks if p not in live]:
                del self._stacks[pid]
            for pid in [p for p in self._native if p not in live]:
                del self._native[pid]
            if fresh and not job_gone:
                self._stacks_error = _whole_job_error(fresh)
        self._schedule.done(chosen, fresh)
        for tracked in ranks:
            dumped = fresh.get(tracked.key[0])
            if dumped is not None and dumped.error is None:
                self._startup.saw_dump(tracked.key[0], dumped.timestamp, _state_of(dumped))
        self._learn_roles(ranks + others, chosen, fresh)
        if not job_gone:
            self._watch_freezes(ranks + others, chosen, fresh)
            self._read_recorders_if_stuck(ranks, fresh)
        self._dumped.set()

    def _with_server_stacks(self, ranks: list[Tracked], fresh: dict[int, ProcessStacks]) -> dict[int, ProcessStacks]:
        """A rank py-spy could not read (ptrace refused, py-spy missing) that runs torch's debug server: its
        stacks from the server's ``dump_traceback`` instead (`debug_server.stacks` says why only then)."""
        failed = [t.key[0] for t in ranks if t.key[0] in fresh and fresh[t.key[0]].error is not None]
        for pid in failed:
            if not process_alive(pid):
                continue
            served = debug_server.stacks(pid)
            if served is not None and served.error is None:
                fresh[pid] = served
        return fresh

    def _learn_role_of_root(self, root: Tracked) -> None:
        """Attached to a multiprocessing child that torch did not name: if it is a DataLoader worker, the job
        is its rank's, so look at its stack once now rather than show a job of one worker until a round has."""
        parent = self._scanner.table.get(root.ppid) if root.ppid > 1 else None
        if parent is None or self._scanner.is_worker(root) or not is_mp_child(parent, root):
            return
        for _ in range(ROLE_DUMPS_AT_ATTACH):
            self._learn_roles([root], [root], self._dump([root.key[0]]))
            if root.key in self._scanner.role_workers:
                return

    def _learn_roles(self, live: list[Tracked], dumped: list[Tracked], fresh: dict[int, ProcessStacks]) -> None:
        """A process whose main thread runs the DataLoader worker loop is a worker, whatever its name."""
        role_workers = self._scanner.role_workers
        role_workers &= {t.key for t in live}
        for tracked in dumped:
            stacks = fresh.get(tracked.key[0])
            if stacks is not None and stacks.error is None and runs_worker_loop(stacks):
                role_workers.add(tracked.key)

    def _watch_freezes(self, live: list[Tracked], dumped: list[Tracked], fresh: dict[int, ProcessStacks]) -> None:
        """One native dump for each process whose main thread froze for `native_after` seconds; it stays in
        the tree until the process moves again."""
        self._freezes.forget_except({t.key for t in live})
        due = []
        for tracked in dumped:
            stacks = fresh.get(tracked.key[0])
            if stacks is None:
                continue
            if self._freezes.observe(tracked.key, stacks):
                due.append(tracked)
            elif not self._freezes.frozen(tracked.key):
                with self._lock:
                    self._native.pop(tracked.key[0], None)
        if self._native_dump is None:
            return
        for tracked in due:
            if self._closed.is_set() or not self._scanner.table.is_current(tracked):
                continue
            native = self._native_dump(tracked.key[0])
            self._freezes.taken(tracked.key, native)
            with self._lock:
                self._native[tracked.key[0]] = native

    def _read_recorders_if_stuck(self, ranks: list[Tracked], fresh: dict[int, ProcessStacks]) -> None:
        """Once a rank's main thread has stood still `LIVE_READ_AFTER_S` (a collective that does not finish, or
        the rank the others wait for), read in-process the recorder of every rank that has it on and writes no
        dump: the hang finding then names the collective.  A job that moves is never injected into."""
        live = self._live_recorders
        if live is None or self._closed.is_set() or not fresh:
            return
        at = max(s.timestamp for s in fresh.values())
        if not any(self._freezes.frozen_for(t.key, at) >= LIVE_READ_AFTER_S for t in ranks):
            return
        tree = self._last_tree
        numbers = {r.proc.pid: r.rank for r in tree.ranks} if tree is not None else {}
        wanted = [(t.key[0], numbers.get(t.key[0]), t.key[1]) for t in ranks]
        live.request([(pid, rank) for pid, rank, started in wanted if self._recorders.wants_live_read(pid, rank, started)])

    def wait_for_stacks(self, timeout: float = 5.0) -> bool:
        """Block until the background thread has finished a refresh (for one-shot `snapshot --json`)."""
        if not self._stacks_enabled:
            return False
        self.stacks_wanted = True
        return self._dumped.wait(timeout)

    def _current_processes(self) -> Optional[tuple[list[Tracked], list[Tracked]]]:
        """(ranks, launcher and workers) from /proc without refreshing any figures; None if the root is gone."""
        self._scanner.table.begin_scan()
        root = self._scanner.table.get(self.pid)
        if root is None or root.key != self._root_key:
            return None
        structure = self._scanner.structure(root, self._gpu_pids)
        others = [structure.launcher] if structure.launcher else []
        for rank in structure.ranks:
            workers, candidates = self._scanner._below(rank)
            others.extend(workers + candidates)  # a candidate's stack says whether it is a worker
        return list(structure.ranks), others

    def _root_alive(self) -> bool:
        """The process we attached to is still the same, live one (read straight from /proc/PID/stat)."""
        stat = read_stat(self.pid)
        return stat is not None and stat.start_ticks == self._root_start_ticks and process_alive(self.pid)

    def _stack_loop(self) -> None:
        resumed = True  # the first round, and the first after the stacks panel reopens, show every process
        while not self._closed.is_set():
            if self._stacks_wanted and not self._exited:
                started = time.monotonic()
                try:
                    self.refresh_stacks(full=resumed)
                    resumed = False
                except Exception as exc:  # never let the thread die; say why stacks stopped
                    with self._lock:
                        self._stacks_error = f"stack refresh failed: {type(exc).__name__}: {exc}"
                wait = max(0.0, self.stack_interval - (time.monotonic() - started))
            else:
                wait = None  # sleep until stacks are wanted again (or close)
                resumed = True
            self._wake.wait(wait)
            self._wake.clear()

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        if self._sampler is not None:
            self._sampler.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            # A dump in flight ends by itself within its timeout; don't hold up the caller's exit for it.
            self._thread.join(timeout=1.0)


def _state_of(stacks: Optional[ProcessStacks]) -> Optional[str]:
    if stacks is None or stacks.error is not None:
        return None
    return classify_main_thread(stacks)


def _whole_job_error(fresh: dict[int, ProcessStacks]) -> Optional[str]:
    """When every dump failed the same way (py-spy missing, permission), say it once for the job."""
    errors = {s.error for s in fresh.values()}
    if len(errors) == 1 and None not in errors:
        (error,) = errors
        return error
    return None


# ----------------------------------------------------------------- no --pid: all jobs on the GPUs

_DISCOVERY_SCANNER = JobScanner()
_DISCOVERY_LOCK = threading.Lock()


def discover_jobs(gpus: tuple[GpuSample, ...]) -> list[JobTree]:
    """The machine's GPU processes grouped into jobs (one per launcher, or per lone process), no stacks.

    Jobs come sorted by their first GPU.  CPU % fills in from the second call on (psutil needs two readings).
    """
    with _DISCOVERY_LOCK:
        scanner = _DISCOVERY_SCANNER
        scanner.table.begin_scan()
        jobs: dict[ProcKey, tuple[int, _Structure]] = {}
        gpu_pids = frozenset(gpus_of_pids(gpus))
        seeds = [pid for pid in gpu_pids if scanner.table.get(pid) is not None]
        if gpu_pids and not seeds:  # none of NVML's PIDs is ours: we run in a PID namespace (a container)
            seeds = _container_seeds(scanner, gpu_pids)
        for pid in sorted(set(seeds)):
            tracked = scanner.table.get(pid)
            if tracked is None:
                continue
            structure = scanner.structure(tracked, gpu_pids)
            anchor = structure.launcher or structure.ranks[0]
            jobs.setdefault(anchor.key, (anchor.key[0], structure))
        trees = [scanner.build(root_pid, structure, tuple(gpus)) for root_pid, structure in jobs.values()]
        trees = [t for t in trees if any(r.gpus for r in t.ranks)]
        scanner.table.prune()
    return sorted(trees, key=lambda t: (min((g for r in t.ranks for g in r.gpus), default=1 << 30), t.root_pid))


def _container_seeds(scanner: JobScanner, gpu_pids: frozenset[int]) -> list[int]:
    """Processes here that may stand behind NVML PIDs from another PID namespace: those whose NSpid line
    shows one of them, and those started with a rank variable or CUDA_VISIBLE_DEVICES (their GPU is then
    inferred, see placement).  One pass over /proc, only while none of NVML's PIDs is ours."""
    seeds = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if set(read_ns_pids(pid)[1:]) & gpu_pids:
            seeds.append(pid)
            continue
        tracked = scanner.table.get(pid)
        if (
            tracked is not None
            and not is_worker(tracked)
            and (has_rank_env(tracked) or "CUDA_VISIBLE_DEVICES" in (tracked.env or {}))
        ):
            seeds.append(pid)
    return seeds
