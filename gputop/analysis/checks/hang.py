"""Hang / silent misfire: a job that makes no progress.

Stopped is not hung: a rank whose /proc state says stopped (T/t) gets the `stopped` finding and no verdict
from its frozen stack.  A hang's finding carries the collective it waits in, from the ranks' flight
recorders (`analysis.collectives`) or, without them, from how the ranks' stacks group."""

from __future__ import annotations

import dataclasses
import signal
from dataclasses import dataclass
from typing import Optional, Sequence

from gputop.analysis.checks.kernels import is_collective_spin, spin_evidence
from gputop.analysis.checks.sync import describe_sync
from gputop.analysis.collectives import ENABLE_HINT, CollectiveWait, align, stack_groups
from gputop.analysis.freeze import main_thread_moved, same_place
from gputop.analysis.numbers import confidence_from, mean
from gputop.analysis.observations import (
    WAIT_FRAMES,
    Context,
    GpuObs,
    Movement,
    RankObs,
    StackSample,
    WorkerObs,
    dataset_frames,
    frames_from,
    movement,
    outer_frames,
)
from gputop.analysis.stack_classes import COLLECTIVE, EXPLICIT_SYNC, IN_DATASET, WAITING_FOR_DATA, format_frame, is_library
from gputop.analysis.thresholds import (
    EVIDENCE_RANKS,
    HANG_MIN_SECONDS,
    HANG_STILL_MIN_SECONDS,
    HANG_UTILIZATION_MAX,
    LOW_UTILIZATION,
    RANK_WAIT_LONG_S,
    SPIN_POWER_MAX_SHARE,
    SPIN_UTILIZATION_MIN,
)
from gputop.model import LABEL_CODE, Finding, FlightRecord, Frame, GpuSample
from gputop.units import gib


def _trailing_idle_seconds(obs: GpuObs) -> float:
    """How long (seconds) the GPU has been at ~0% utilization at the end of the window."""
    start = None
    for t, u in zip(reversed(obs.timestamps), reversed(obs.util)):
        if u is None or u > HANG_UTILIZATION_MAX:
            break
        start = t
    return (obs.timestamps[-1] - start) if start is not None else 0.0


def _is_spin(s: GpuSample) -> bool:
    """~100% utilization at a small share of the power limit: a collective spinning, not a compute kernel."""
    by_sm = is_collective_spin(s)  # GPM (Hopper+): SM activity decides where it is known; power only elsewhere
    if by_sm is not None:
        return by_sm
    return (
        not s.lost
        and (s.utilization_gpu or 0.0) >= SPIN_UTILIZATION_MIN
        and s.power is not None
        and s.power_limit is not None
        and s.power_limit != 0
        and s.power <= SPIN_POWER_MAX_SHARE * s.power_limit
    )


def trailing_spin_seconds(obs: GpuObs) -> float:
    """How long the GPU has shown the spin pattern at the end of the window."""
    start = None
    for t, s in zip(reversed(obs.timestamps), reversed(obs.samples)):
        if not _is_spin(s):
            break
        start = t
    return (obs.timestamps[-1] - start) if start is not None else 0.0


def _spin_evidence(o: GpuObs, secs: float) -> str:
    s = o.samples[-1]
    by_sm = spin_evidence(o.index, s, secs)
    if by_sm is not None:
        return by_sm
    return (
        f"GPU {o.index}: {s.utilization_gpu:.0f}% utilization at {s.power:.0f} W of {s.power_limit:.0f} W for {secs:.0f} s:"
        " a collective kernel spinning on a missing peer, not compute"
    )


@dataclass
class FrozenRun:
    """The dumps at the end of the window that all show the same stack, and what the counters did meanwhile.

    A slow but live thread shows the same stack in every dump (a worker blocked 20 ms per sample in the
    same read), so the stack's span alone says little; what counts is the trailing part of it over which
    the counters stood still (`still_*`)."""

    seconds: float  # span of the identical stacks
    count: int
    first: StackSample
    last: StackSample
    still: Optional[bool]  # True: counters stood still over the last `still_seconds`; False: they moved
    # between the last two dumps (alive); None: the dumps carry no counters (older collector or recording)
    still_seconds: float = 0.0
    still_count: int = 0
    moved: Optional[Movement] = None  # the counters over the still part (or the last two dumps when alive)

    def long_enough(self) -> bool:
        """Frozen long enough to be a hang: HANG_MIN_SECONDS on stacks alone, less when the counters agree."""
        if self.still is None:
            return self.count >= 2 and self.seconds >= HANG_MIN_SECONDS
        return bool(self.still) and self.still_count >= 2 and self.still_seconds >= HANG_STILL_MIN_SECONDS

    @property
    def stuck_seconds(self) -> float:
        return self.still_seconds if self.still else self.seconds


def frozen_run(
    pid: int, samples: Sequence[StackSample], *, cpu_counts: bool = True, io_counts: bool = True
) -> Optional[FrozenRun]:
    """`cpu_counts` / `io_counts`: whether CPU time / I/O bytes are evidence of life (see Movement.alive)."""
    if not samples:
        return None
    last = samples[-1]
    run: list[StackSample] = []
    for s in reversed(samples):
        if not same_place(s, last):
            break
        run.append(s)
    run.reverse()
    out = FrozenRun(last.timestamp - run[0].timestamp, len(run), run[0], last, None)
    if last.progress is None or len(run) < 2:
        return out
    # the earliest dump from which on nothing moved (the one freeze detector, analysis/freeze.py, judges)
    for i, s in enumerate(run[:-1]):
        moved = movement(pid, s, last)
        if moved is not None and main_thread_moved(pid, s, last, cpu_counts=cpu_counts, io_counts=io_counts) is False:
            out.still, out.still_seconds, out.still_count, out.moved = True, moved.seconds, len(run) - i, moved
            return out
    out.still, out.moved = False, movement(pid, run[-2], last)
    return out


def _counters_text(run: FrozenRun) -> str:
    return f"; counters still: {run.moved.describe()}" if run.still and run.moved is not None else ""


def _native_text(run: FrozenRun, native: Sequence[str] = ()) -> Optional[str]:
    """The C/C++ frames under the frozen Python ones: the collector's one native dump of the freeze, or a
    native dump among the run's own."""
    native = tuple(native) or next((s.native for s in (run.last, run.first) if s.native), ())
    if not native:
        return None
    return "native stack (py-spy --native): " + " ← ".join(native[:4])


def _in_dataset_code(frames: Sequence[Frame]) -> bool:
    return any(f.name.split(".")[-1] in ("__getitem__", "__getitems__", "fetch") for f in frames)


@dataclass
class StuckWorker:
    worker: WorkerObs
    what: str  # one evidence line
    frames: tuple[str, ...]  # the stuck frame(s), innermost last; () for a dead worker
    run: Optional[FrozenRun] = None


def stuck_worker(rank: RankObs) -> Optional[StuckWorker]:
    """A worker of this rank that is dead, or frozen in dataset code with nothing moving.

    Equal stacks alone are not enough when counters are there: a worker sleeping 20 ms per sample in
    `__getitem__` shows the same stack in every dump, and its context switches climb all the while."""
    for w in rank.workers.values():
        if w.last is not None and (w.last.exited or w.last.state in ("Z", "X")):
            return StuckWorker(
                w, f"DataLoader worker PID {w.pid} of {rank.name} is dead (state {w.last.state}, exited={w.last.exited})", ()
            )
    for w in rank.workers.values():
        run = frozen_run(w.pid, w.samples)
        if run is None or not _in_dataset_code(run.last.frames) or not run.long_enough():
            continue
        cpu = mean(w.cpu[-5:])
        cpu_txt = f", CPU {cpu:.0f}%" if cpu is not None else ""
        total = run.last.progress.cpu_seconds if run.last.progress is not None else None
        total_txt = f", {total:.2f} s of CPU in its life" if total is not None else ""
        return StuckWorker(
            w,
            f"DataLoader worker PID {w.pid} of {rank.name}: same stack in dataset code for {run.seconds:.0f} s "
            f"({run.count} dumps{cpu_txt}{total_txt}){_counters_text(run)}",
            dataset_frames(run.last.frames),
            run,
        )
    return None


@dataclass(frozen=True)
class RankHang:
    """What was decided about one frozen rank (no wording): how long, on which GPUs, and what it waits on."""

    rank: RankObs
    run: FrozenRun  # the main thread's frozen dumps
    state: Optional[str]  # the main thread's state in them
    gpus: tuple[GpuObs, ...]  # the rank's GPUs with utilization data
    stuck_seconds: float
    gpu_idle: bool  # its GPUs sit at ~0% as long as the host is frozen
    gpu_spin: bool  # its GPUs spin in a collective (~100%, low power) as long
    worker: Optional[StuckWorker]  # a dead or frozen DataLoader worker it waits for
    synced: Optional[str]  # the sync it is parked at ("`loss.item()` at train.py:57 …"), when one is named

    @property
    def waiter(self) -> bool:
        """It waits for another rank: frozen in a collective, or parked at a sync while its GPU spins."""
        return self.state == COLLECTIVE or (self.gpu_spin and self.state not in (WAITING_FOR_DATA, IN_DATASET))


@dataclass(frozen=True)
class _Hung:
    decided: RankHang
    finding: Finding  # its wording


RECORDER_FIX = (
    "export TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1  # flight recorder: each rank's last collectives\n"
)
# with the recorder already on (gputop read it): only the dump when the watchdog fires is left to ask for
RECORDER_ON_FIX = "export TORCH_NCCL_DUMP_ON_TIMEOUT=1  # the flight recorder is on: each rank dumps it when the timeout fires\n"
NCCL_FIX = (
    "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # the watchdog aborts the job with an error instead of hanging\n"
    + RECORDER_FIX
    + "export NCCL_DEBUG=INFO  # NCCL logs which peer it waits for\n"
    "dist.init_process_group(..., timeout=datetime.timedelta(minutes=5))  # default 10 min"
)
WORKER_TIMEOUT_FIX = "DataLoader(..., timeout=120)  # raise instead of waiting forever on one worker"


def check_hang(ctx: Context) -> list[Finding]:
    """No progress, whatever the utilization: a stack frozen across dumps while the counters stand still,
    a dead or frozen DataLoader worker, GPUs holding memory at 0% or spinning in a collective."""
    hung: list[_Hung] = []
    stopped: list[RankObs] = []
    for rank in sorted(ctx.ranks.values(), key=lambda r: (r.rank is None, r.rank, r.pid)):
        if rank.last is not None and rank.last.exited:
            continue
        if stopped_seconds(ctx, rank) is not None:
            stopped.append(rank)  # frozen because the process is: its stack says nothing about its code
            continue
        decided = _rank_hang(ctx, rank)
        if decided is not None:
            hung.append(_Hung(decided, rank_hang_finding(decided)))
    findings = _merge_waiters(ctx, hung, stopped)
    findings = [with_collective(ctx, f) if f.id in _COLLECTIVE_FINDINGS else f for f in findings]
    claimed_gpus = {g for f in findings for g in f.gpus}
    findings += _gpu_only_hangs(ctx, claimed_gpus)
    return findings


_COLLECTIVE_FINDINGS = ("hang", "stopped", "rank_wait")
STOPPED_MIN_SNAPSHOTS = 2


def stopped_seconds(ctx: Context, rank: RankObs) -> Optional[float]:
    """How long its /proc state has said stopped (T/t) to the window's end; None: it runs (or one snapshot
    alone said so: py-spy's dumps stop a process for milliseconds)."""
    if rank.stopped_since is None or rank.stopped_count < STOPPED_MIN_SNAPSHOTS:
        return None
    return ctx.snaps[-1].timestamp - rank.stopped_since


def _stopped_by(rank: RankObs) -> str:
    tracer = rank.last.tracer if rank.last is not None else None
    if tracer is not None:
        return f"by its tracer, {tracer}"
    return "by a signal (SIGSTOP, Ctrl-Z, or a scheduler's suspend such as Slurm's)"


def stopped_finding(ctx: Context, stopped: Sequence[RankObs], waiting: Optional["Waiters"]) -> Finding:
    """Stopped, not hung: no verdict from its stack (frozen because the process is); how to resume it."""
    first = stopped[0]
    secs = max(stopped_seconds(ctx, r) or 0.0 for r in stopped)
    names = ", ".join(r.name for r in stopped[:8]) + (" …" if len(stopped) > 8 else "")
    evidence = [
        f"{r.label}: /proc state {r.last.state if r.last is not None else 'T'} (stopped) {_stopped_by(r)} "
        f"for {stopped_seconds(ctx, r) or 0:.0f} s"
        for r in stopped
    ]
    evidence.append("its stack and counters stand still because the process does: no verdict is drawn from them")
    pids = tuple(r.pid for r in stopped)
    gpus = tuple(g for r in stopped for g in sorted(r.gpus))
    summary = f"Stopped, not hung: {names} stopped {_stopped_by(first)} for {secs:.0f} s"
    if waiting is not None and waiting.hung:
        summary += f"; {len(waiting.hung)} other rank(s) wait for it in a collective"
        evidence.append(f"{len(waiting.hung)} other rank(s) frozen waiting for it: {waiting.names}")
        pids += waiting.pids
        gpus += waiting.gpus
    tracer = first.last.tracer if first.last is not None else None
    if tracer is not None:
        fix = f"detach the debugger that holds it ({tracer}): `detach` in gdb, or end it"
    else:
        pid_list = " ".join(str(r.pid) for r in stopped)
        fix = f"resume it: kill -CONT {pid_list}   # or `fg` in its shell; `scontrol resume JOBID` for a Slurm suspend"
    return Finding(
        id="stopped",
        title="Stopped, not hung",
        severity="warning",
        confidence=0.95,
        label=LABEL_CODE,
        summary=summary,
        evidence=tuple(evidence),
        fix=fix,
        gpus=gpus,
        pids=pids,
    )


def _own_frame(rank: RankObs) -> Optional[str]:
    """The innermost frame of the job's own code in its latest dump (a library frame when it shows none)."""
    if not rank.samples or not rank.samples[-1].frames:
        return None
    frames = rank.samples[-1].frames
    return format_frame(next((f for f in frames if not is_library(f)), frames[0]))


def _where_now(ctx: Context, rank_number: int) -> tuple[Optional[str], str]:
    """(its frame, one line) for a rank the others wait for: its own code's innermost frame, or what holds it."""
    rank = next((r for r in ctx.ranks.values() if r.rank == rank_number), None)
    if rank is None:
        return None, f"rank {rank_number}: not on this machine (see its node's gputop)"
    if rank.last is not None and rank.last.exited:
        status = f", {describe_exit_status(rank.last.exit_status)}" if rank.last.exit_status is not None else ""
        return None, f"{rank.label} exited{status}"
    if stopped_seconds(ctx, rank) is not None:
        return _own_frame(rank), f"{rank.label} is stopped {_stopped_by(rank)}"
    stuck = stuck_worker(rank) if rank.samples and rank.samples[-1].state == WAITING_FOR_DATA else None
    if stuck is not None and stuck.frames:
        return stuck.frames[-1], f"{rank.label} waits for data: {stuck.what}; stuck at {stuck.frames[-1]}"
    frame = _own_frame(rank)
    state = rank.samples[-1].state if rank.samples else None
    return frame, f"{rank.label} is now at {frame or 'an unread stack'}" + (f" ({state})" if state else "")


def with_collective(ctx: Context, finding: Finding) -> Finding:
    """The hang finding with the collective evidence: from the ranks' flight recorders when the job has them
    (the op, its sequence id, who entered, who never did and where that rank is now, how long until the
    timeout), else from the stacks (the many at one frame against the few elsewhere) and how to turn it on."""
    job = ctx.snaps[-1].job
    records = job.flight_records if job is not None else ()
    waits = align(records)
    wait = next((w for w in waits if w.broken), None)
    if wait is not None:
        return _from_recorder(ctx, finding, wait, _channels(records))
    return _from_stacks(ctx, finding, records)


def _channels(records: Sequence[FlightRecord]) -> list[str]:
    """How the readable records were read (a dump file, the ranks' debug servers, an in-process read)."""
    return sorted({r.channel for r in records if r.error is None and r.channel})


def _from_recorder(ctx: Context, finding: Finding, wait: CollectiveWait, channels: list[str]) -> Finding:
    """The hang finding with the aligned recorders' collective: who waits in it, who does not and where."""
    now = ctx.snaps[-1].timestamp
    figures = {"source": "flight recorder", "read_through": channels, **wait.figures(now)}
    where: dict[str, Optional[str]] = {}
    through = f" (read from: {', '.join(channels)})" if channels else ""
    lines = [f"flight recorder: {wait.line()}{through}"]
    for r in list(wait.missing) + sorted(wait.mismatched) + sorted(wait.other_sizes):
        frame, line = _where_now(ctx, r)
        where[str(r)] = frame
        lines.append(line)
    figures["where"] = where
    waited = wait.waited(now)
    if wait.timeout_ms and waited is not None:
        left = wait.timeout_ms / 1000.0 - waited
        lines.append(
            f"waited {waited:.0f} s of its {wait.timeout_ms / 1000:.0f} s timeout (timeout_ms): "
            + (f"about {left:.0f} s until the timeout ends the job" if left > 0 else "past the timeout")
        )
    missing = wait.missing or tuple(sorted(wait.mismatched)) or tuple(sorted(wait.other_sizes))
    culprit = ", ".join(f"rank {r}" + (f" (at {where[str(r)]})" if where.get(str(r)) else "") for r in missing)
    how = (
        "never entered it" if wait.missing else "entered another collective" if wait.mismatched else "entered it with other sizes"
    )
    head = f"{wait.op} #{wait.seq}: {_rank_list(wait.entered)} wait in it, {culprit} {how}"
    if finding.id == "rank_wait" and waited is not None and waited >= RANK_WAIT_LONG_S and wait.missing:
        # the recorder dates the wait from before the window: a long one is a warning however short the window
        finding = dataclasses.replace(finding, severity="warning", fix=_rank_wait_fix(_rank_list(wait.missing), True))
    return dataclasses.replace(
        finding,
        summary=f"{finding.summary} — {head}",
        evidence=tuple(lines) + finding.evidence,
        figures={**finding.figures, "collective": figures},
        fix=finding.fix.replace(RECORDER_FIX, RECORDER_ON_FIX),  # it is on: gputop just read it
    )


def _from_stacks(ctx: Context, finding: Finding, records: Sequence[FlightRecord]) -> Finding:
    """Without a readable recorder: the many ranks at one frame against the few elsewhere, and how to turn it on."""
    errors = [r.error for r in records if r.error is not None]
    live = [r for r in ctx.ranks.values() if r.rank is not None and r.samples and r.samples[-1].frames]
    live = [r for r in live if not (r.last is not None and r.last.exited)]
    many, others = stack_groups({r.rank: format_frame(r.samples[-1].frames[0]) for r in live if r.rank is not None})
    lines = []
    figures = dict(finding.figures)
    if many is not None and others:
        lines.append(
            f"stacks: {_rank_list(many.ranks)} at {many.frame}; "
            + "; ".join(f"{_rank_list(g.ranks)} elsewhere, at {_frame_of(ctx, g.ranks[0]) or g.frame}" for g in others)
        )
        in_collective = all(r.samples[-1].state == COLLECTIVE for r in live if r.rank in many.ranks)
        if in_collective:  # what the stacks alone say of the collective: no sequence id, sizes nor timeout
            outliers = sorted(r for g in others for r in g.ranks)
            figures["collective"] = {
                "source": "stacks",
                "op": many.frame.split(" (")[0],
                "seq": None,
                "process_group": None,
                "entered": list(many.ranks),
                "missing": outliers,
                "mismatched": {},
                "where": {str(r): _frame_of(ctx, r) for r in outliers},
            }
    if errors:
        lines.append(f"flight recorder on, not read: {errors[0]}")
    else:
        lines.append(
            "no flight recorder: " + ENABLE_HINT.split("  # ")[0] + " names the collective and the missing rank next time"
        )
    fix = finding.fix if ENABLE_HINT in finding.fix or errors else finding.fix + "\n" + ENABLE_HINT
    return dataclasses.replace(finding, evidence=finding.evidence + tuple(lines), fix=fix, figures=figures)


def _frame_of(ctx: Context, rank_number: int) -> Optional[str]:
    rank = next((r for r in ctx.ranks.values() if r.rank == rank_number), None)
    return _own_frame(rank) if rank is not None else None


def _rank_list(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks)) if ranks else "no rank"


def describe_exit_status(status: int) -> str:
    """waitpid(2)'s status in words: "exit status 3", "killed by signal 9 (SIGKILL)"."""
    if status & 0x7F:
        number = status & 0x7F
        try:
            name = f" ({signal.Signals(number).name})"
        except ValueError:
            name = ""
        return f"killed by signal {number}{name}"
    return f"exit status {(status >> 8) & 0xFF}"


def _stuck_span(
    rank: RankObs, run: FrozenRun, spin_secs: Optional[float]
) -> Optional[tuple[FrozenRun, float, Optional[StuckWorker]]]:
    """(the run judged, seconds stuck, the stuck worker) when the main thread's frozen run is a hang by its
    state alone; None when it is not (yet)."""
    state = run.last.state
    if state == WAITING_FOR_DATA:
        stuck = stuck_worker(rank)
        if stuck is None:
            return None  # a starving rank also waits; it hangs only if a worker is dead or frozen in dataset code
        # the worker's evidence carries the hang; the main thread needs only to have waited as long
        need = min(HANG_MIN_SECONDS, stuck.run.stuck_seconds if stuck.run is not None else HANG_STILL_MIN_SECONDS)
        return (run, run.seconds, stuck) if run.count >= 2 and run.seconds >= need else None
    if state == IN_DATASET:
        return (run, run.stuck_seconds, None) if run.long_enough() else None
    # a host parked at a sync: CUDA spin-waits, so its CPU is no evidence of life (nor is other threads'
    # I/O); a GPU that spins (a collective waiting for a peer) outweighs the thread's wake-ups.
    spinning = spin_secs is not None and spin_secs >= HANG_STILL_MIN_SECONDS
    run = frozen_run(rank.pid, rank.samples, cpu_counts=False, io_counts=False) or run
    if spinning:
        return (run, run.seconds, None) if run.count >= 2 and run.seconds >= HANG_STILL_MIN_SECONDS else None
    if state not in (COLLECTIVE, EXPLICIT_SYNC) or not run.long_enough():
        return None
    return run, run.stuck_seconds, None


def _rank_hang(ctx: Context, rank: RankObs) -> Optional[RankHang]:
    """The decision: is this rank hung (its main thread frozen, its GPUs idle or spinning as long)?"""
    first = frozen_run(rank.pid, rank.samples)
    if first is None:
        return None
    gpus = tuple(ctx.gpus[g] for g in sorted(rank.gpus) if g in ctx.gpus and ctx.gpus[g].util_values)
    idle_secs = min((_trailing_idle_seconds(o) for o in gpus), default=None)
    spin_secs = min((trailing_spin_seconds(o) for o in gpus), default=None)
    span = _stuck_span(rank, first, spin_secs)
    if span is None:
        return None
    run, stuck_secs, stuck = span
    need = HANG_STILL_MIN_SECONDS if run.still is not None else HANG_MIN_SECONDS
    gpu_idle = idle_secs is not None and idle_secs >= min(need, stuck_secs)
    gpu_spin = spin_secs is not None and spin_secs >= min(need, stuck_secs)
    if gpus and not (gpu_idle or gpu_spin):
        return None  # the GPU computes: the job moves on the device while the host waits
    state = first.last.state
    synced = describe_sync(rank) if state == EXPLICIT_SYNC else None
    return RankHang(rank, run, state, gpus, stuck_secs, gpu_idle, gpu_spin, stuck, synced[1] if synced is not None else None)


def _rank_hang_evidence(h: RankHang) -> list[str]:
    rank, run = h.rank, h.run
    evidence = [
        f"{rank.label}: main thread {h.state} in {run.count} consecutive dumps over {run.seconds:.0f} s, same frame{_counters_text(run)}"
    ]
    cpu = mean(rank.cpu[-5:])
    if cpu is not None:
        evidence.append(f"{rank.name} CPU {cpu:.0f}%" + (" (CUDA spin-waits at a sync)" if h.gpu_spin and cpu >= 50 else ""))
    native = _native_text(run, rank.native)
    if native:
        evidence.append(native)
    if h.synced is not None:
        evidence.append(f"its host is parked at a sync: {h.synced}")
    for o in h.gpus:
        if h.gpu_spin:
            evidence.append(_spin_evidence(o, trailing_spin_seconds(o)))
        else:
            evidence.append(
                f"GPU {o.index}: utilization ≤{HANG_UTILIZATION_MAX:.0f}% for {_trailing_idle_seconds(o):.0f} s, memory {gib(o.memory[-1])} held"
            )
    if h.worker is not None:
        evidence.append(h.worker.what)
        if h.worker.run is not None:
            wnative = _native_text(h.worker.run, h.worker.worker.native)
            if wnative:
                evidence.append(f"worker {wnative}")
    return evidence


def _rank_hang_cause(h: RankHang, waited_frames: tuple[str, ...]) -> tuple[str, tuple[str, ...], str]:
    """(where it is stuck, the frames that show it, the fix) for a hung rank."""
    if h.worker is not None:
        where = "a DataLoader worker died" if not h.worker.frames else "a DataLoader worker is stuck in dataset code"
        fix = (
            "find why that sample never loads (see the stuck frame); bound the wait with a DataLoader timeout\n"
            f"{WORKER_TIMEOUT_FIX}\n"
            "# inside __getitem__: put timeouts on network/file reads; log and skip bad samples"
        )
        return where, h.worker.frames or waited_frames, fix
    if h.state == IN_DATASET:
        fix = (
            "find why __getitem__ never returns (see the stuck frame); add timeouts to its I/O\n"
            "# e.g. requests.get(url, timeout=30); open files from local disk, not a stalled mount"
        )
        return "its own dataset code never returns (num_workers=0)", dataset_frames(h.run.last.frames), fix
    if h.state == COLLECTIVE or h.gpu_spin:
        where = (
            "it waits in a collective the other ranks never reached"
            if h.state == COLLECTIVE
            else ("its host is parked at a sync while its GPU spins in a collective (a peer never joined)")
        )
        fix = (
            "find the rank that did not reach the collective (a crashed or stuck rank, an uneven last batch)\n"
            + NCCL_FIX
            + ("\nDistributedSampler(..., drop_last=True)  # every rank runs the same number of steps")
        )
        return where, waited_frames, fix
    where = (
        "it waits in an explicit sync (torch.cuda.synchronize / .item())"
        if h.synced is None
        else (f"it waits at a sync for GPU work that never finishes ({h.synced})")
    )
    fix = (
        "the host waits for GPU work that never finishes: check the last kernel/collective before it\n"
        "CUDA_LAUNCH_BLOCKING=1 python train.py  # pinpoints the kernel (debug runs only)"
    )
    return where, waited_frames, fix


def rank_hang_finding(h: RankHang) -> Finding:
    """The wording of one hung rank's finding."""
    run = h.run
    sample = run.last
    waited = frames_from(sample.frames, WAIT_FRAMES) if h.state == WAITING_FOR_DATA else outer_frames(sample.frames, 4)
    where, frames, fix = _rank_hang_cause(h, waited)
    held = [o for o in h.gpus if h.gpu_idle and o.holds_memory(o.memory[-1] if o.memory else None)]
    return Finding(
        id="hang",
        title="Silent misfire: the job is stuck",
        severity="critical",
        confidence=confidence_from(run.count, 6, h.stuck_seconds / (2 * HANG_MIN_SECONDS) if run.still is None else 1.0),
        label=LABEL_CODE,
        summary=f"Hang: {h.rank.name} stuck for {h.stuck_seconds:.0f} s: {where}"
        + (f"; GPU {held[0].index} holds memory at 0%" if held else ""),
        evidence=tuple(_rank_hang_evidence(h)),
        frames=frames,
        fix=fix,
        gpus=tuple(o.index for o in h.gpus),
        pids=(h.rank.pid,),
    )


def _suspect_worker(rank: RankObs) -> Optional[tuple[WorkerObs, FrozenRun]]:
    """A worker of this rank last seen in dataset code with nothing moving, not yet long enough to be
    called stuck (idle workers are dumped rarely): the likeliest root while others wait for the rank."""
    found = []
    for w in rank.workers.values():
        run = frozen_run(w.pid, w.samples)
        if run is not None and _in_dataset_code(run.last.frames) and run.still is not False:
            found.append((w, run))
    return max(found, key=lambda wr: wr[1].seconds) if found else None


def makes_progress(rank: RankObs, *, io_counts: bool = True) -> bool:
    """Its main thread moved between its last two dumps: another stack, or counters that moved.
    `io_counts=False`: the process's I/O is no evidence (another thread's, such as a recorder dumper's)."""
    if len(rank.samples) < 2:
        return False
    run = frozen_run(rank.pid, rank.samples, io_counts=io_counts)
    return run is not None and (run.count < 2 or run.still is False)


@dataclass(frozen=True)
class OddRank:
    """The live rank whose stack differs from the waiters': the one they wait for."""

    rank: RankObs
    what: str  # one evidence line: what it does instead
    frames: tuple[str, ...]
    waits_for_data: bool  # its main thread waits for a dead, frozen or suspect DataLoader worker
    in_dataset_code: bool  # the stuck part (its worker, or its own main thread) sits in dataset code


def _odd_one_out(ctx: Context, waiting: Sequence[_Hung]) -> Optional[OddRank]:
    """The live rank whose stack differs from the waiters': the one they wait for (its name, what it does)."""
    waiting_pids = {h.decided.rank.pid for h in waiting}
    for rank in sorted(ctx.ranks.values(), key=lambda r: (r.rank is None, r.rank, r.pid)):
        if rank.pid in waiting_pids or (rank.last is not None and rank.last.exited) or not rank.samples:
            continue
        sample = rank.samples[-1]
        if sample.state in (COLLECTIVE,):
            continue
        stuck = stuck_worker(rank) if sample.state == WAITING_FOR_DATA else None
        if stuck is not None:
            what = f"{rank.label} is not in the collective: it waits for data; {stuck.what}"
            return OddRank(rank, what, stuck.frames, True, bool(stuck.frames))
        suspect = _suspect_worker(rank) if sample.state == WAITING_FOR_DATA else None
        if suspect is not None:
            w, run = suspect
            what = (
                f"{rank.label} is not in the collective: it waits for data, and its DataLoader worker PID {w.pid} has sat "
                f"in dataset code for {run.seconds:.0f} s ({run.count} dump(s){', counters still' if run.still else ''})"
            )
            return OddRank(rank, what, dataset_frames(run.last.frames), True, True)
        frames = frames_from(sample.frames, WAIT_FRAMES) if sample.state == WAITING_FOR_DATA else outer_frames(sample.frames, 4)
        what = f"{rank.label} is not in the collective: its main thread is {sample.state}"
        return OddRank(rank, what, frames, False, sample.state == IN_DATASET)
    return None


@dataclass(frozen=True)
class Waiters:
    """Ranks frozen waiting for another rank (in a collective, or parked at a sync while their GPU spins)."""

    hung: tuple[_Hung, ...]

    @property
    def names(self) -> str:
        return ", ".join(h.decided.rank.name for h in self.hung[:8]) + (" …" if len(self.hung) > 8 else "")

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(g for h in self.hung for g in h.finding.gpus)

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p for h in self.hung for p in h.finding.pids)

    @property
    def longest(self) -> float:
        return max(h.decided.stuck_seconds for h in self.hung)

    def spin_lines(self) -> list[str]:
        """Their GPUs' spin evidence, led by where their hosts are parked (when at a named sync)."""
        lines = [_spin_evidence(o, trailing_spin_seconds(o)) for h in self.hung if h.decided.gpu_spin for o in h.decided.gpus]
        parked = next((h.decided.synced for h in self.hung if h.decided.synced is not None), None)
        if parked is not None:
            lines.insert(0, f"the waiting ranks' hosts are parked at a sync: {parked}")
        return lines

    @property
    def spinning(self) -> bool:
        return any(h.decided.gpu_spin and h.decided.gpus for h in self.hung)


def _merge_waiters(ctx: Context, hung: list[_Hung], stopped: Sequence[RankObs] = ()) -> list[Finding]:
    """One hang, one finding: ranks waiting in a collective (or parked at a sync while their GPU spins) wait
    for the rank whose stack differs.

    With a culprit (a rank stuck on data, in dataset code or in a sync) the waiters become its evidence.
    Without one, the live rank whose stack differs is named; failing that, a rank that exited; failing
    that, one finding says no rank shows why (the article's "NCCL timeout / incomplete group").
    """
    waiting = Waiters(tuple(h for h in hung if h.decided.waiter))
    culprits = [h for h in hung if not h.decided.waiter]
    if stopped:  # a stopped rank is whom the waiters wait for, and no hang of its own
        return [stopped_finding(ctx, stopped, waiting)] + [h.finding for h in culprits]
    if not waiting.hung:
        return [h.finding for h in hung]
    if culprits:
        return [_culprit_finding(culprits[0].finding, waiting)] + [h.finding for h in culprits[1:]]
    remote = remote_holdup(ctx, waiting)
    if remote is not None:  # every rank here waits for one elsewhere: no local hang to name
        return [remote_holdup_finding(remote)]
    odd = _odd_one_out(ctx, waiting.hung)
    # the odd rank's own thread must move: a helper thread's I/O (a dumper, a logger) does not make its loop go on
    if odd is not None and makes_progress(odd.rank, io_counts=False) and not odd.waits_for_data:
        # One rank works (an evaluation, a checkpoint, logging) while the others wait for it in a barrier or
        # collective: a wait, not a hang, as long as that rank moves.
        return [_rank_wait_finding(waiting, odd)]
    exited = [r for r in ctx.ranks.values() if r.last is not None and r.last.exited]
    return [_collective_hang_finding(waiting, odd, exited)]


def _culprit_finding(first: Finding, waiting: Waiters) -> Finding:
    """The culprit's finding with the ranks that wait for it as evidence."""
    spinning = waiting.spin_lines()
    how = "wait for it in a collective" + (" (their GPUs spin at ~100%, low power)" if waiting.spinning else "")
    fix = first.fix if NCCL_FIX in first.fix else first.fix + "\n" + NCCL_FIX
    n = len(waiting.hung)
    return dataclasses.replace(
        first,
        summary=first.summary + f"; {n} other rank(s) {how}",
        evidence=first.evidence
        + (f"{n} other rank(s) frozen waiting for it: {waiting.names}",)
        + tuple(spinning[:EVIDENCE_RANKS]),
        fix=fix,
        gpus=first.gpus + waiting.gpus,
        pids=first.pids + waiting.pids,
    )


def _rank_wait_finding(waiting: Waiters, odd: OddRank) -> Finding:
    """Ranks waiting for one rank that still moves: a wait, a warning only when it lasts."""
    rank = odd.rank
    first = waiting.hung[0].finding
    long_wait = waiting.longest >= RANK_WAIT_LONG_S
    return Finding(
        id="rank_wait",
        title="Ranks wait for one busy rank",
        severity="warning" if long_wait else "info",
        confidence=0.6,
        label=LABEL_CODE,
        summary=f"{len(waiting.hung)} rank(s) wait {waiting.longest:.0f} s in a collective while {rank.name} works ({rank.samples[-1].state})",
        evidence=(odd.what, f"{rank.label} makes progress (its stack or counters moved between its last dumps)")
        + first.evidence[:1],
        frames=odd.frames,
        fix=_rank_wait_fix(rank.name, long_wait),
        gpus=waiting.gpus,
        pids=(rank.pid,) + waiting.pids,
    )


def _rank_wait_fix(name: str, long_wait: bool) -> str:
    if long_wait:
        return f"if {name} is not in a long evaluation or checkpoint, it skipped a collective the others wait in\n" + NCCL_FIX
    return (
        f"nothing is stuck: work on {name} alone (evaluation, checkpointing) holds the others for its duration\n"
        "# to use that time: evaluate on every rank with a DistributedSampler, or save checkpoints asynchronously"
    )


def _collective_hang_finding(waiting: Waiters, odd: Optional[OddRank], exited: Sequence[RankObs]) -> Finding:
    """Ranks frozen in a collective with no culprit among them: the odd rank, an exited one, or neither."""
    first = waiting.hung[0].finding
    n = len(waiting.hung)
    evidence = first.evidence + (f"{n} rank(s) frozen waiting in the same collective: {waiting.names}",)
    summary = f"Hang: {n} rank(s) stuck in a collective for {waiting.longest:.0f} s"
    frames, fix, gpus, pids = first.frames, first.fix, waiting.gpus, waiting.pids
    if odd is not None:
        evidence += (odd.what,)
        summary = f"Hang: {n} rank(s) stuck for {waiting.longest:.0f} s waiting for {odd.rank.name}"
        if odd.in_dataset_code:
            summary += ", which waits for a DataLoader worker stuck in dataset code"
        summary += " (their GPUs spin in a collective at ~100%, low power)" if waiting.spinning else " in a collective"
        frames = odd.frames or frames
        gpus += tuple(g for g in sorted(odd.rank.gpus) if g not in gpus)
        pids = (odd.rank.pid,) + pids
        if odd.waits_for_data:
            fix = fix + "\n" + WORKER_TIMEOUT_FIX
    elif exited:
        evidence += tuple(f"{r.label} exited{_exit_text(r)}: the others wait for it" for r in exited)
        summary += f"; {exited[0].name} exited{_exit_text(exited[0])}"
        gpus += tuple(g for r in exited for g in sorted(r.gpus) if g not in gpus)
    else:
        summary += "; no rank shows why (a rank outside this view, or a mismatched collective)"
    return dataclasses.replace(first, summary=summary, evidence=evidence, frames=frames, fix=fix, gpus=gpus, pids=pids)


def _exit_text(rank: RankObs) -> str:
    status = rank.last.exit_status if rank.last is not None else None
    return f" ({describe_exit_status(status)})" if status is not None else ""


@dataclass(frozen=True)
class RemoteHoldup:
    """Every live rank here waits in a collective while the job has more ranks than this machine runs: the
    rank holding them back is on another node (decided here; worded in `remote_holdup_finding`)."""

    waiting: Waiters
    here: tuple[int, ...]  # the global ranks on this machine
    world_size: int
    node_rank: Optional[int]
    nnodes: Optional[int]
    job_id: Optional[str]  # the job's cross-node id (gputop.fleet.identity), when its environment names one


def remote_holdup(ctx: Context, waiting: Waiters) -> Optional[RemoteHoldup]:
    """Every rank here waits, none of them exited (that one would be whom they wait for), and the job's
    world is larger than the ranks this machine ever ran."""
    live = list(ctx.ranks.values())
    world = max((r.world_size for r in live if r.world_size), default=0)
    waiting_pids = {h.decided.rank.pid for h in waiting.hung}
    if not live or world <= len(live) or any(r.pid not in waiting_pids or (r.last is not None and r.last.exited) for r in live):
        return None
    first = live[0]
    return RemoteHoldup(
        waiting,
        tuple(sorted(r.rank for r in live if r.rank is not None)),
        world,
        first.node_rank,
        first.nnodes,
        next((r.job_id for r in live if r.job_id), None),
    )


def remote_holdup_finding(h: RemoteHoldup) -> Finding:
    """The wording: the ranks here wait for a rank on another node; which one, Prometheus says."""
    first = h.waiting.hung[0].finding
    ranks = f"ranks {h.here[0]}–{h.here[-1]}" if len(h.here) > 1 else (f"rank {h.here[0]}" if h.here else "the ranks")
    node = f", node {h.node_rank} of {h.nnodes}" if h.node_rank is not None and h.nnodes else ""
    command = f"gputop report --prometheus URL --job {h.job_id or 'ID'}"
    return Finding(
        id="remote_holdup",
        title="Waiting for a rank on another node",
        severity="warning",
        confidence=0.7,
        label=LABEL_CODE,
        summary=(
            f"All {len(h.waiting.hung)} rank(s) here ({ranks} of {h.world_size}{node}) wait {h.waiting.longest:.0f} s "
            f"in a collective for a rank on another node (this machine is not the one holding the job back); find that rank with `{command}`"
        ),
        evidence=(f"{len(h.waiting.hung)} rank(s) frozen in the same collective: {h.waiting.names}",)
        + first.evidence[:1]
        + (f"the job has {h.world_size} ranks; {len(h.here) or len(h.waiting.hung)} run on this machine",),
        frames=first.frames,
        fix=f"{command}  # names the straggling or hung rank and its node, from every node's gputop serve\n" + NCCL_FIX,
        gpus=h.waiting.gpus,
        pids=h.waiting.pids,
    )


@dataclass(frozen=True)
class GpuOnlyHangs:
    """GPU evidence alone (no frozen rank claims these GPUs)."""

    spinning: tuple[tuple[GpuObs, float], ...]  # (GPU, seconds spinning) with no job attached
    held: tuple[tuple[GpuObs, float, bool], ...]  # (GPU, seconds idle with memory held, busy before that)
    job_attached: bool


def _gpu_only_decision(ctx: Context, claimed: set[int]) -> GpuOnlyHangs:
    candidates = ctx.focus_gpus() if ctx.ranks else list(ctx.gpus.values())
    stuck: list[tuple[GpuObs, float, bool]] = []
    spinning: list[tuple[GpuObs, float]] = []
    for o in candidates:
        if o.index in claimed or not o.util_values or o.lost_at is not None:
            continue
        spin = trailing_spin_seconds(o)
        if not ctx.ranks and spin >= HANG_MIN_SECONDS:
            spinning.append((o, spin))
            continue
        # the diagnosis counts a GPU's utilization from the job's loop (`collect_gpu_observations`), so the
        # idle time of a start-up already done is not in it; one still under way is judged here
        idle = _trailing_idle_seconds(o)
        if idle < HANG_MIN_SECONDS or not o.holds_memory(o.memory[-1] if o.memory else None) or _starting_up(ctx, o):
            continue
        was_busy = any(
            u is not None and u > LOW_UTILIZATION for u in o.util[: max(1, len(o.util) - int(idle / max(ctx.interval, 1e-3)))]
        )
        stuck.append((o, idle, was_busy))
    return GpuOnlyHangs(tuple(spinning), tuple(stuck), bool(ctx.ranks))


def _starting_up(ctx: Context, o: GpuObs) -> bool:
    """The GPU's memory is held by ranks gputop follows, one of them still in its start-up.  A rank takes its
    memory at `model.to(device)`, then waits for its peers in the rendezvous or starts its workers: 20-60 s at 0%
    on a busy box, not a misfire (the demo's start-up read "Silent misfire: GPUs hold memory at 0%").  One stuck
    there is judged once the collector gives up waiting for its first step (STARTUP_GIVE_UP_S) and takes it as in
    its loop."""
    ranks = [ctx.ranks.get(p) for p in o.process_pids]
    return bool(ranks) and all(r is not None for r in ranks) and any(r.starting_up for r in ranks if r is not None)


def _gpu_only_hangs(ctx: Context, claimed: set[int]) -> list[Finding]:
    """GPU evidence alone: memory held at ~0% for a sustained window (the third idle profile), or - with no
    job attached to ask - GPUs spinning at ~100% and low power (collectives waiting for a missing peer)."""
    decided = _gpu_only_decision(ctx, claimed)
    out: list[Finding] = []
    if decided.spinning:
        out.append(_spinning_finding(decided.spinning))
    if decided.held:
        out.append(_held_memory_finding(decided.held, decided.job_attached))
    return out


def _spinning_finding(spinning: Sequence[tuple[GpuObs, float]]) -> Finding:
    gpus_txt = ", ".join(f"GPU {o.index}" for o, _s in spinning[:8])
    pids = tuple(sorted({p for o, _s in spinning for p in o.process_pids}))
    return Finding(
        id="hang",
        title="Silent misfire: GPUs spin in a collective",
        severity="warning",
        confidence=0.5,
        label=LABEL_CODE,
        summary=f"Likely NCCL hang: {gpus_txt} spin at ~100% utilization and low power for {max(s for _o, s in spinning):.0f} s",
        evidence=tuple(_spin_evidence(o, s) for o, s in spinning[:EVIDENCE_RANKS])
        + (f"processes on them: {', '.join(map(str, pids)) or 'n/a'}",),
        fix=(
            f"attach with `--pid {pids[0]}` to name the rank that never joined the collective\n"
            if pids
            else "attach with `--pid PID` to name the rank that never joined the collective\n"
        )
        + NCCL_FIX,
        gpus=tuple(o.index for o, _s in spinning),
        pids=pids,
    )


def _held_memory_finding(stuck: Sequence[tuple[GpuObs, float, bool]], job_attached: bool) -> Finding:
    # a job whose ranks are all attached and none frozen is not hung on the GPU side alone - unless it stopped
    any_stopped = any(w for _o, _i, w in stuck)
    severity = "critical" if any_stopped or job_attached else "warning"
    gpus_txt = ", ".join(f"GPU {o.index}" for o, _i, _w in stuck[:8])
    evidence = tuple(
        f"GPU {o.index}: utilization ≤{HANG_UTILIZATION_MAX:.0f}% for {idle:.0f} s"
        + (" after being busy" if was_busy else "")
        + f", memory {gib(o.memory[-1])} held by PID(s) {', '.join(str(p) for p in sorted(o.process_pids)) or 'n/a'}"
        for o, idle, was_busy in stuck
    )
    return Finding(
        id="hang",
        title="Silent misfire: memory held, nothing running",
        severity=severity,
        confidence=0.6 if any_stopped else 0.45,
        label=LABEL_CODE,
        summary=f"Silent misfire: {gpus_txt} {'holds' if len(stuck) == 1 else 'hold'} memory at 0% utilization for {max(i for _o, i, _w in stuck):.0f} s",
        evidence=evidence,
        fix=(
            "dump the stacks of the processes holding the memory to see where they wait\n"
            "py-spy dump --pid PID   # or: gputop --pid PID\n"
            "# a stuck DataLoader worker, a rank waiting in NCCL for a dead peer, or an OOM-retry loop"
        ),
        gpus=tuple(o.index for o, _i, _w in stuck),
        pids=tuple(sorted({p for o, _i, _w in stuck for p in o.process_pids})),
    )
