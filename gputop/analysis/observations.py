"""What the window says, built once from History: per-rank and per-GPU series, and the Context every check reads."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence, Union

from gputop.analysis.numbers import Share, mean, share_of
from gputop.analysis.stack_classes import (
    INPUT_WAIT_STATES,
    classify_main_thread,
    dataset_frame,
    format_frame,
    is_waiting_for_data_frame,
    main_thread,
    own_frames,
)
from gputop.analysis.thresholds import (
    HELD_MEMORY_BYTES,
    LIVE_CPU_SHARE,
    LIVE_SWITCHES_PER_S,
    MIN_SAMPLED_SECONDS,
    MIN_STACK_SAMPLES,
    USER_HZ,
)
from gputop.history import History
from gputop.model import (
    Frame,
    GpuSample,
    JobTree,
    ProcessProgress,
    ProcessStacks,
    ProcInfo,
    Snapshot,
    StateSamples,
    ThreadStack,
)

# frames of a main thread starting an epoch's workers (no persistent_workers)
EPOCH_START_FRAME_NAMES = ("DataLoader.__iter__", "_MultiProcessingDataLoaderIter.__init__", "_get_iterator")


def frames_signature(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """Frames compare by name, file and line: two dumps with equal signatures stand at the same place."""
    return tuple(frames)


def has_frame(frames: Sequence[Frame], names: Sequence[str]) -> bool:
    return any(f.name in names or f.name.endswith(tuple("." + n for n in names)) for f in frames)


def frames_from(frames: Sequence[Frame], names: Union[Sequence[str], Callable[[Frame], bool]], outer: int = 2) -> tuple[str, ...]:
    """The innermost frame named in `names` (or matching it, a predicate) plus `outer` callers, innermost
    last; the innermost few if none.

    A waiting main thread's innermost frames are queue/selector plumbing: the informative part is
    `_BaseDataLoaderIter.__next__` and the training-loop line that called it.
    """
    matches = names if callable(names) else (lambda f: f.name in names)
    frames = list(frames)
    for i, f in enumerate(frames):
        if matches(f):
            return tuple(format_frame(x) for x in reversed(frames[i : i + 1 + outer]))
    return outer_frames(frames, outer + 1)


# by file + function: py-spy prints `__next__` for a 3.10 target, `_BaseDataLoaderIter.__next__` from 3.11
WAIT_FRAMES = is_waiting_for_data_frame


def outer_frames(frames: Sequence[Frame], limit: int = 4) -> tuple[str, ...]:
    """The innermost `limit` frames as text, innermost LAST (traceback order)."""
    return tuple(format_frame(f) for f in reversed(list(frames)[:limit]))


def dataset_frames(frames: Sequence[Frame], limit: int = 4) -> tuple[str, ...]:
    """The frames from the dataset entry point inwards (innermost last); the innermost few when none."""
    frames = list(frames)
    entry = dataset_frame(frames)  # what the DataLoader's fetcher called, whatever the class is called
    if entry is not None:
        i = frames.index(entry)
        return tuple(format_frame(x) for x in reversed(frames[max(0, i + 1 - limit) : i + 1]))
    return outer_frames(frames, limit)


# ----------------------------------------------------------------- per-rank observations


@dataclass
class StackSample:
    timestamp: float
    state: Optional[str]
    signature: tuple[Frame, ...] = ()  # frames_signature of its frames
    frames: tuple[Frame, ...] = ()  # Python frames only, innermost first (a native dump's C frames: `native`)
    active: bool = True
    progress: Optional[ProcessProgress] = None  # the process's counters read right after this dump
    native: tuple[str, ...] = ()  # C/C++ frame names of a `py-spy dump --native`, innermost first


def is_python_frame(frame: Frame) -> bool:
    """py-spy's Python frames name a .py file (or `<frozen …>` / `<string>`); native ones a library or C file."""
    return frame.filename.endswith(".py") or frame.filename.startswith("<")


def native_frames(stacks: Optional[ProcessStacks]) -> tuple[str, ...]:
    """The C/C++ frame names of a native dump's main thread, innermost first (() for none or a failed one)."""
    if stacks is None or stacks.error or not stacks.threads:
        return ()
    main = main_thread(stacks)
    # unresolved frames (a bare address) name nothing
    return tuple(f.name for f in (main.frames if main else ()) if not is_python_frame(f) and not f.name.startswith("0x"))


def stack_sample(
    stacks: ProcessStacks, thread: Optional[ThreadStack], state: Optional[str], frames: Sequence[Frame]
) -> StackSample:
    """One dump of one thread.  A native dump's C frames are kept apart, so it compares equal to the plain
    dumps around it when the Python stack has not moved."""
    native: tuple[str, ...] = ()
    if stacks.native:
        native = tuple(f.name for f in frames if not is_python_frame(f) and not f.name.startswith("0x"))
        frames = tuple(f for f in frames if is_python_frame(f))
    return StackSample(
        stacks.timestamp,
        state,
        frames_signature(frames),
        tuple(frames),
        thread.active if thread else True,
        stacks.progress,
        native,
    )


@dataclass
class WorkerObs:
    pid: int
    samples: list[StackSample] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    states: list[str] = field(default_factory=list)  # its /proc state a snapshot (R: running, or waiting for a core)
    last: Optional[ProcInfo] = None
    last_stacks: Optional[ProcessStacks] = None
    native: tuple[str, ...] = ()  # C/C++ frames of its latest `py-spy dump --native` (a freeze), innermost first


@dataclass
class StateCounts:
    """What a rank's main thread did over the share window, start-up left out: the counts every share
    is taken from.  From the dense samples when there are any (ordered: `runs`), else from the dumps."""

    counts: Counter[str] = field(default_factory=Counter)
    n: int = 0
    seconds: float = 0.0  # the span the counted samples cover
    source: str = "stack dumps"
    startup_left_out: int = 0  # samples before the training loop's first step
    runs: list[list[tuple[str, int]]] = field(default_factory=list)  # the kept runs of each dense stretch, in order
    stretches: list[StateSamples] = field(default_factory=list)  # ... and those stretches (runs end where they do)
    dense: bool = False

    @property
    def unit(self) -> str:
        return "samples" if self.dense else "stack dumps"

    @property
    def enough(self) -> bool:
        """Enough to judge a share: 5 dumps (~10 s), or dense samples over at least MIN_SAMPLED_SECONDS."""
        if self.dense:
            return self.n >= MIN_STACK_SAMPLES and self.seconds >= MIN_SAMPLED_SECONDS
        return self.n >= MIN_STACK_SAMPLES

    def switches(self, states: Sequence[str]) -> Optional[int]:
        """Changes between in-`states` and out-of-`states` from one sample to the next (None: dumps)."""
        if not self.dense:
            return None
        wanted = set(states)
        total = 0
        for runs in self.runs:
            previous = None
            for state, _ in runs:
                inside = state in wanted
                if previous is not None and inside != previous:
                    total += 1
                previous = inside
        return total

    def share(self, *states: str) -> Share:
        return share_of(sum(self.counts[s] for s in states), self.n, self.switches(states), self.source)

    def add(self, other: "StateCounts") -> "StateCounts":
        """These counts and `other`'s pooled (several ranks)."""
        return StateCounts(
            self.counts + other.counts,
            self.n + other.n,
            max(self.seconds, other.seconds),
            self.source if self.source == other.source or not other.n else (other.source if not self.n else "mixed"),
            self.startup_left_out + other.startup_left_out,
            self.runs + other.runs,
            self.stretches + other.stretches,
            self.dense or other.dense,
        )


def dense_counts(
    stretches: Sequence[StateSamples], since: Optional[float], loop_started: Optional[float], starting_up: bool
) -> StateCounts:
    """Counts of the dense samples taken at or after `since`, start-up (before `loop_started`, or all of
    them while `starting_up`) left out."""
    rates = sorted({round(s.rate) for s in stretches if s.runs})
    out = StateCounts(dense=True, source="py-spy record at " + "/".join(str(r) for r in rates) + " Hz")
    first_t = last_t = None
    for stretch in stretches:
        total = sum(n for _, n in stretch.runs)
        if not total:
            continue
        period = 1.0 / stretch.rate
        t0 = stretch.end - total * period  # sample k was taken at t0 + k * period

        def first_at(t: Optional[float]) -> int:
            return 0 if t is None else min(total, max(0, math.ceil((t - t0) / period - 1e-9)))

        in_window = first_at(since)
        in_loop = total if starting_up else first_at(loop_started)
        keep_from = max(in_window, in_loop)
        out.startup_left_out += max(0, in_loop - in_window)
        kept: list[tuple[str, int]] = []
        index = 0
        for state, n in stretch.runs:
            skip = min(n, max(0, keep_from - index))
            if n > skip:
                kept.append((state, n - skip))
                out.counts[state] += n - skip
            index += n
        if kept:
            out.runs.append(kept)
            out.stretches.append(stretch)
            out.n += total - keep_from
            first_t = t0 + keep_from * period if first_t is None else min(first_t, t0 + keep_from * period)
            last_t = stretch.end if last_t is None else max(last_t, stretch.end)
    if first_t is not None and last_t is not None:
        out.seconds = last_t - first_t
    return out


@dataclass
class RankObs:
    """Everything the window says about one rank process."""

    pid: int
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    # the job beyond this machine (Rank's world_size, job_id, node_rank, nnodes): its ranks elsewhere
    world_size: Optional[int] = None
    job_id: Optional[str] = None
    node_rank: Optional[int] = None
    nnodes: Optional[int] = None
    gpus: set[int] = field(default_factory=set)
    mig_instances: set[tuple[int, int]] = field(default_factory=set)  # (GPU, GPU instance id): ranks on MIG instances
    samples: list[StackSample] = field(default_factory=list)  # one per distinct main-thread dump
    cpu: list[float] = field(default_factory=list)
    worker_sets: list[tuple[float, frozenset[int]]] = field(default_factory=list)
    workers: dict[int, WorkerObs] = field(default_factory=dict)
    last: Optional[ProcInfo] = None
    stacks_error: Optional[str] = None
    native: tuple[str, ...] = ()  # C/C++ frames of its latest `py-spy dump --native` (a freeze), innermost first
    stretches: list[StateSamples] = field(default_factory=list)  # its dense samples, in time order
    sampling_errors: list[str] = field(default_factory=list)
    starting_up: bool = False  # no training step seen yet: everything so far is start-up
    loop_started: Optional[float] = None  # the first step's time (None: unknown, or not yet)
    share_since: Optional[float] = None  # shares count samples from here on (None: the whole window)
    # since when its /proc state has said stopped (T/t) in every snapshot to the last (None: it runs), and
    # how many snapshots said so: a `py-spy dump` stops it for milliseconds, so one snapshot proves nothing
    stopped_since: Optional[float] = None
    stopped_count: int = 0
    _counts: Optional[StateCounts] = None

    @property
    def counts(self) -> StateCounts:
        """The share counts: dense samples if this window has any, else the dumps; start-up left out."""
        if self._counts is None:
            if self.stretches:
                self._counts = dense_counts(self.stretches, self.share_since, self.loop_started, self.starting_up)
            else:
                self._counts = self._dump_counts()
        return self._counts

    def _dump_counts(self) -> StateCounts:
        out = StateCounts()
        kept = []
        for s in self.samples:
            if not s.state or (self.share_since is not None and s.timestamp < self.share_since):
                continue
            if self.starting_up or (self.loop_started is not None and s.timestamp < self.loop_started):
                out.startup_left_out += 1
                continue
            kept.append(s)
            out.counts[s.state] += 1
        out.n = len(kept)
        out.seconds = kept[-1].timestamp - kept[0].timestamp if kept else 0.0
        return out

    @property
    def measured(self) -> bool:
        """Enough samples (start-up left out) to judge its shares."""
        return self.counts.enough

    def share(self, *states: str) -> Share:
        return self.counts.share(*states)

    @property
    def name(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"PID {self.pid}"

    @property
    def label(self) -> str:
        """ "rank 3 (PID 1003)", or "PID 1003" for a process without a RANK."""
        return f"rank {self.rank} (PID {self.pid})" if self.rank is not None else f"PID {self.pid}"

    @property
    def states(self) -> Counter[str]:
        """Samples per main-thread state over the share window (start-up left out)."""
        return self.counts.counts

    def fraction(self, *states: str) -> float:
        counts = self.counts
        return sum(counts.counts[s] for s in states) / counts.n if counts.n else 0.0

    @property
    def input_fraction(self) -> float:
        """Share of samples in the input pipeline: waiting for workers (or for rank 0's batch, under Accelerate's
        dispatcher), or running dataset code itself."""
        return self.fraction(*INPUT_WAIT_STATES)

    @property
    def input_share(self) -> Share:
        return self.share(*INPUT_WAIT_STATES)

    @property
    def n(self) -> int:
        """Samples its shares are counted from."""
        return self.counts.n


def pooled_counts(ranks: Sequence[RankObs]) -> StateCounts:
    """The ranks' share counts pooled: the job's figure (ranks of one job do alike)."""
    total = StateCounts(source="")
    for r in ranks:
        total = total.add(r.counts)
    return total


STOPPED_STATES = ("T", "t")  # /proc state letters: stopped by a signal, stopped by a tracer


def _stopped_by_py_spy(proc: ProcInfo) -> bool:
    """py-spy (gputop's own stack dumps) holds it for a dump's few milliseconds: not a stop to report."""
    return proc.tracer is not None and proc.tracer.endswith("(py-spy)")


def _state_of(rank_state: Optional[str], stacks: Optional[ProcessStacks]) -> Optional[str]:
    """The collector's classification of this dump; classify it here when a recording lacks it."""
    return rank_state or (classify_main_thread(stacks) if stacks is not None else None)


def collect_rank_observations(snaps: Sequence[Snapshot], share_since: Optional[float] = None) -> dict[int, RankObs]:
    """Per rank pid: its main-thread state per DISTINCT stack dump (a dump refreshed every 2 s appears in
    several 1 s snapshots; it is counted once), its dense samples, its CPU, its workers over time and their
    stacks.  Its shares count the samples from `share_since` on (None: all)."""
    ranks: dict[int, RankObs] = {}
    for snap in snaps:
        job = snap.job
        if job is None:
            continue
        for stretch in job.state_samples:
            obs = ranks.get(stretch.pid)
            if obs is None:
                obs = ranks[stretch.pid] = RankObs(pid=stretch.pid, share_since=share_since)
            if stretch.error is not None:
                obs.sampling_errors.append(stretch.error)
            elif stretch.runs:
                obs.stretches.append(stretch)
        for r in job.ranks:
            pid = r.proc.pid
            obs = ranks.get(pid)
            if obs is None:
                obs = ranks[pid] = RankObs(pid=pid, share_since=share_since)
            obs.starting_up, obs.loop_started = r.starting_up, r.loop_started  # the latest word on start-up
            obs.rank = r.rank if r.rank is not None else obs.rank
            obs.local_rank = r.local_rank if r.local_rank is not None else obs.local_rank
            obs.world_size, obs.job_id, obs.node_rank, obs.nnodes = r.world_size, r.job_id, r.node_rank, r.nnodes
            obs.gpus.update(r.gpus)
            obs.mig_instances.update(r.mig_instances)
            obs.last = r.proc
            if r.proc.state in STOPPED_STATES and not _stopped_by_py_spy(r.proc):
                obs.stopped_since = obs.stopped_since if obs.stopped_since is not None else snap.timestamp
                obs.stopped_count += 1
            else:
                obs.stopped_since, obs.stopped_count = None, 0
            if r.proc.cpu_percent is not None and not r.proc.exited:
                obs.cpu.append(r.proc.cpu_percent)
            obs.worker_sets.append((snap.timestamp, frozenset(w.pid for w in r.workers)))
            obs.native = native_frames(job.native_stacks.get(pid))  # the latest: dropped when the freeze ends
            stacks = job.stacks.get(pid)
            if stacks is not None and stacks.error:
                obs.stacks_error = stacks.error
            if stacks is not None and not stacks.error and stacks.threads:
                if not obs.samples or stacks.timestamp > obs.samples[-1].timestamp:
                    main = main_thread(stacks)
                    obs.samples.append(
                        stack_sample(stacks, main, _state_of(r.main_thread_state, stacks), main.frames if main else ())
                    )
            elif stacks is None and r.main_thread_state:
                # a state without a dump (collector that classifies in place): one sample per snapshot
                obs.samples.append(StackSample(snap.timestamp, r.main_thread_state))
            for w in r.workers:
                _observe_worker(obs, w, job)
    _start_loops_together(list(ranks.values()))
    return ranks


def job_loop_start(ranks: dict[int, RankObs]) -> Optional[float]:
    """When the job's training loop began (its last rank's first step), None before any rank's did."""
    starts = [r.loop_started for r in ranks.values() if r.loop_started is not None]
    return max(starts) if starts else None


def _start_loops_together(ranks: Sequence[RankObs]) -> None:
    """A job's loop begins when its last rank's does: until then the ranks already stepping wait in their
    first collective for the ones still starting (10-30 s on a busy box), and those waits are start-up skew,
    not the job's steady state (a starved job's first pooled share read 22% where every rank was ~66%).
    So each rank's samples count from the latest loop start among its job's ranks."""
    latest: dict[Optional[str], float] = {}
    for r in ranks:
        if r.loop_started is not None:
            latest[r.job_id] = max(r.loop_started, latest.get(r.job_id, r.loop_started))
    for r in ranks:
        if r.loop_started is not None:
            r.loop_started = latest[r.job_id]


def _observe_worker(obs: RankObs, w: ProcInfo, job: JobTree) -> None:
    """A DataLoader worker of the rank in one snapshot: its CPU, its native frames and its distinct dumps."""
    wobs = obs.workers.get(w.pid)
    if wobs is None:
        wobs = obs.workers[w.pid] = WorkerObs(w.pid)
    wobs.last = w
    wobs.native = native_frames(job.native_stacks.get(w.pid))
    if w.cpu_percent is not None and not w.exited:
        wobs.cpu.append(w.cpu_percent)
        wobs.states.append(w.state)
    ws = job.stacks.get(w.pid)
    if ws is not None and not ws.error and ws.threads:
        if not wobs.samples or ws.timestamp > wobs.samples[-1].timestamp:
            wm = main_thread(ws)
            wobs.last_stacks = ws
            wobs.samples.append(stack_sample(ws, wm, None, own_frames(wm) if wm else ()))


# ----------------------------------------------------------------- per-GPU series


@dataclass
class GpuObs:
    index: int
    name: str = ""
    util: list[Optional[float]] = field(default_factory=list)
    memory: list[Optional[int]] = field(default_factory=list)
    memory_total: Optional[int] = None
    timestamps: list[float] = field(default_factory=list)
    samples: list[GpuSample] = field(default_factory=list)
    lost_at: Optional[float] = None
    missing_after: Optional[float] = None
    process_pids: set[int] = field(default_factory=set)  # every PID NVML listed on the GPU in the window

    @property
    def util_values(self) -> list[float]:
        return [u for u in self.util if u is not None]

    @property
    def mean_util(self) -> Optional[float]:
        return mean(self.util)

    def holds_memory(self, used: Optional[int]) -> bool:
        if used is None:
            return False
        return used >= HELD_MEMORY_BYTES


def collect_gpu_observations(snaps: Sequence[Snapshot], util_from: Optional[float] = None) -> dict[int, GpuObs]:
    """Per GPU: its samples over the snapshots.  Its utilization counts from `util_from` on (the job's loop; None:
    all): before it, a job's GPUs idle through its start-up (imports, the rendezvous), which is no verdict's
    evidence (the demo's first minute read "a sync in the loop, GPUs at 34%" where the loop ran them at 65%).
    The samples themselves (XIDs, power, a lost GPU) are all kept."""
    gpus: dict[int, GpuObs] = {}
    for snap in snaps:
        present = set()
        for g in snap.gpus:
            obs = gpus.get(g.index)
            if obs is None:
                obs = gpus[g.index] = GpuObs(g.index, g.name)
            present.add(g.index)
            obs.timestamps.append(snap.timestamp)
            obs.samples.append(g)
            obs.process_pids.update(p.pid for p in g.processes or ())
            if g.lost:
                if obs.lost_at is None:
                    obs.lost_at = snap.timestamp
                obs.util.append(None)
                obs.memory.append(None)
                continue
            obs.util.append(g.utilization_gpu if util_from is None or snap.timestamp >= util_from else None)
            obs.memory.append(g.memory_used)
            if g.memory_total:
                obs.memory_total = g.memory_total
        for index, obs in gpus.items():
            if index not in present and obs.missing_after is None:
                obs.missing_after = snap.timestamp
    return gpus


# ----------------------------------------------------------------- the context all checks share


@dataclass
class Context:
    history: History
    snaps: list[Snapshot]
    ranks: dict[int, RankObs]
    gpus: dict[int, GpuObs]
    bench: Optional[dict[str, Any]]
    duration: float
    interval: float
    share_window: Optional[float] = None  # the shares cover the last this many seconds (None: the whole window)
    advised_before: Optional[int] = None  # workers advised for this job by an earlier look (`advice_memory`)
    _focus: Optional[list[GpuObs]] = field(default=None, init=False, repr=False, compare=False)

    def share_span(self, counts: "StateCounts") -> str:
        """Where a share comes from, in words: "2,400 samples (py-spy record at 500 Hz) over the last 60 s"."""
        span = (
            f"the last {self.share_window:.0f} s" if self.share_window else f"{max(counts.seconds, self.duration):.0f} s observed"
        )
        source = f" ({counts.source})" if counts.dense else ""
        return f"{counts.n:,} {counts.unit}{source} over {span}"

    @property
    def job_gpus(self) -> list[int]:
        used = sorted({g for r in self.ranks.values() for g in r.gpus})
        return [g for g in used if g in self.gpus]

    @property
    def have_gpu_data(self) -> bool:
        return any(o.util_values for o in self.gpus.values())

    def focus_utilization(self) -> Optional[float]:
        """The focus GPUs' mean utilization over the window; None without GPU data."""
        return mean(o.mean_util for o in self.focus_gpus()) if self.have_gpu_data else None

    def focus_gpus(self) -> list[GpuObs]:
        """GPUs the diagnosis is about: the job's, else those holding memory or processes, else all."""
        if self._focus is None:  # asked by several checks of one diagnosis, over observations that do not change
            if self.job_gpus:
                self._focus = [self.gpus[i] for i in self.job_gpus]
            else:
                used = [o for o in self.gpus.values() if o.process_pids or any(o.holds_memory(m) for m in o.memory)]
                self._focus = used or list(self.gpus.values())
        return list(self._focus)

    def cores(self) -> int:
        latest = self.snaps[-1].host.cpu_percent if self.snaps else ()
        return len(latest) or self.history.machine.cpu_count or 1

    @property
    def job(self) -> Optional[JobTree]:
        """The latest job tree in the window (None when no job is attached)."""
        return next((s.job for s in reversed(self.snaps) if s.job is not None), None)

    def job_cores(self) -> float:
        """Cores the job may use: its cgroup's cpu.max / cpuset as the collector read it, else the host's."""
        job = self.job
        if job is not None and job.cpu_limit:
            return min(float(job.cpu_limit), float(self.cores()))
        return float(self.cores())

    def memory_free(self) -> Optional[int]:
        """Bytes the job may still take: the host's available memory, less when its cgroup limit is nearer."""
        free: Optional[int] = (self.snaps[-1].host.memory_available or None) if self.snaps else None
        job = self.job
        if job is not None and job.memory_limit:
            used = sum(p.rss or 0 for r in job.ranks for p in (r.proc, *r.workers))
            left = max(0, job.memory_limit - used)
            free = left if free is None else min(free, left)
        return free


class BenchResultLike(Protocol):
    """A loader benchmark's result (`gputop.bench.BenchResult`): its JSON is what the checks read."""

    def to_dict(self) -> dict[str, Any]: ...


# what the diagnosis takes as a benchmark: the result, its JSON (a report read back), or none
BenchInput = Union[BenchResultLike, dict[str, Any], None]


def bench_dict(bench: BenchInput) -> Optional[dict[str, Any]]:
    if bench is None:
        return None
    if isinstance(bench, dict):
        return bench
    to_dict = getattr(bench, "to_dict", None)  # anything else (a stale object) is no benchmark
    data = to_dict() if callable(to_dict) else None
    return data if isinstance(data, dict) else None


def bench_wait_fraction(bench: Optional[dict[str, Any]]) -> tuple[Optional[float], str]:
    """The benchmark's measured data-wait fraction (active consumption first: it times every batch)."""
    if not bench:
        return None, ""
    for key, what in (
        ("consumption", "timed __next__ (active benchmark)"),
        ("passive", "py-spy record at 100 Hz (passive benchmark)"),
    ):
        part = bench.get(key) or {}
        value = part.get("wait_fraction") if isinstance(part, dict) else None
        if isinstance(value, (int, float)):
            return float(value), what
    return None, ""


def bench_recommendation(bench: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    if not bench:
        return None
    rec = bench.get("recommendation")
    return rec if isinstance(rec, dict) and rec else None


# ----------------------------------------------------------------- progress between dumps


@dataclass(frozen=True)
class Movement:
    """What a process's counters did between two of its dumps (ProcessProgress read beside each)."""

    seconds: float
    switches: Optional[int]  # voluntary context switches of its main thread (tid == pid); None: not read
    thread_cpu_s: Optional[float]  # CPU time of that thread
    cpu_s: float  # CPU time of the whole process
    io_chars: Optional[int]  # bytes read + written (rchar + wchar, pipes included); None: unreadable

    def alive(self, *, cpu_counts: bool = True, io_counts: bool = True) -> bool:
        """Evidence of life: the thread woke (LIVE_SWITCHES_PER_S), used CPU (LIVE_CPU_SHARE) or moved bytes.

        `cpu_counts=False` for a host parked at a CUDA sync: CUDA spin-waits by default, so CPU burns there
        while nothing progresses.  `io_counts=False` where other threads' I/O would speak for this one."""
        secs = max(self.seconds, 1e-6)
        if self.switches is not None and self.switches / secs >= LIVE_SWITCHES_PER_S:
            return True
        cpu = self.thread_cpu_s if self.thread_cpu_s is not None else self.cpu_s
        if cpu_counts and cpu / secs >= LIVE_CPU_SHARE:
            return True
        return bool(io_counts and self.io_chars)

    def describe(self) -> str:
        parts = []
        if self.switches is not None:
            parts.append(f"{self.switches} voluntary context switch{'es' if self.switches != 1 else ''}")
        cpu = self.thread_cpu_s if self.thread_cpu_s is not None else self.cpu_s
        parts.append(f"CPU +{cpu:.2f} s")
        if self.io_chars is not None:
            parts.append(f"I/O +{self.io_chars} B")
        return f"{', '.join(parts)} in {self.seconds:.0f} s"


def movement(pid: int, first: StackSample, last: StackSample) -> Optional[Movement]:
    """The counters' change from `first` to `last` (None unless both dumps carry them)."""
    a, b = first.progress, last.progress
    if a is None or b is None or last.timestamp <= first.timestamp:
        return None
    ta = next((t for t in a.threads if t.tid == pid), None)
    tb = next((t for t in b.threads if t.tid == pid), None)
    io = None
    if (
        a.io_read_chars is not None
        and a.io_write_chars is not None
        and b.io_read_chars is not None
        and b.io_write_chars is not None
    ):
        io = max(0, (b.io_read_chars - a.io_read_chars) + (b.io_write_chars - a.io_write_chars))
    return Movement(
        seconds=last.timestamp - first.timestamp,
        switches=max(0, tb.voluntary_switches - ta.voluntary_switches) if ta and tb else None,
        thread_cpu_s=max(0, tb.cpu_ticks - ta.cpu_ticks) / USER_HZ if ta and tb else None,
        cpu_s=max(0.0, b.cpu_seconds - a.cpu_seconds),
        io_chars=io,
    )
