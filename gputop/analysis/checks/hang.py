"""Hang / silent misfire: a job that makes no progress."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence

from gputop.analysis.checks.kernels import is_collective_spin, spin_evidence
from gputop.analysis.checks.sync import describe_sync
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
from gputop.analysis.stack_classes import COLLECTIVE, EXPLICIT_SYNC, IN_DATASET, WAITING_FOR_DATA
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
from gputop.model import LABEL_CODE, Finding, Frame, GpuSample
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
        and bool(s.power_limit)
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
        if s.signature != last.signature or s.state != last.state:
            break
        run.append(s)
    run.reverse()
    out = FrozenRun(last.timestamp - run[0].timestamp, len(run), run[0], last, None)
    if last.progress is None or len(run) < 2:
        return out
    # the earliest dump from which on nothing moved
    for i, s in enumerate(run[:-1]):
        moved = movement(pid, s, last)
        if moved is not None and not moved.alive(cpu_counts=cpu_counts, io_counts=io_counts):
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


@dataclass
class _Hung:
    finding: Finding
    rank: RankObs
    seconds: float
    waiter: bool  # waits for another rank: frozen in a collective, or parked at a sync while its GPU spins
    state: str


NCCL_FIX = (
    "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # the watchdog aborts the job with an error instead of hanging\n"
    "export TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1  # flight recorder: each rank's last collectives\n"
    "export NCCL_DEBUG=INFO  # NCCL logs which peer it waits for\n"
    "dist.init_process_group(..., timeout=datetime.timedelta(minutes=5))  # default 10 min"
)
WORKER_TIMEOUT_FIX = "DataLoader(..., timeout=120)  # raise instead of waiting forever on one worker"


def check_hang(ctx: Context) -> list[Finding]:
    """No progress, whatever the utilization: a stack frozen across dumps while the counters stand still,
    a dead or frozen DataLoader worker, GPUs holding memory at 0% or spinning in a collective."""
    hung: list[_Hung] = []
    for rank in sorted(ctx.ranks.values(), key=lambda r: (r.rank is None, r.rank, r.pid)):
        if rank.last is not None and rank.last.exited:
            continue
        h = _rank_hang(ctx, rank)
        if h is not None:
            hung.append(h)
    findings = _merge_waiters(ctx, hung)
    claimed_gpus = {g for f in findings for g in f.gpus}
    findings += _gpu_only_hangs(ctx, claimed_gpus)
    return findings


def _rank_hang(ctx: Context, rank: RankObs) -> Optional[_Hung]:
    run = frozen_run(rank.pid, rank.samples)
    if run is None:
        return None
    sample = run.last
    state = sample.state
    gpus = [ctx.gpus[g] for g in sorted(rank.gpus) if g in ctx.gpus and ctx.gpus[g].util_values]
    idle_secs = min((_trailing_idle_seconds(o) for o in gpus), default=None)
    spin_secs = min((trailing_spin_seconds(o) for o in gpus), default=None)
    at_sync = state in (COLLECTIVE, EXPLICIT_SYNC)
    stuck = None
    if state == WAITING_FOR_DATA:
        stuck = stuck_worker(rank)
        if stuck is None:
            return None  # a starving rank also waits; it hangs only if a worker is dead or frozen in dataset code
        # the worker's evidence carries the hang; the main thread needs only to have waited as long
        need = min(HANG_MIN_SECONDS, stuck.run.stuck_seconds if stuck.run is not None else HANG_STILL_MIN_SECONDS)
        if run.count < 2 or run.seconds < need:
            return None
        stuck_secs = run.seconds
    elif state == IN_DATASET:
        if not run.long_enough():
            return None
        stuck_secs = run.stuck_seconds
    else:
        # a host parked at a sync: CUDA spin-waits, so its CPU is no evidence of life (nor is other threads'
        # I/O); a GPU that spins (a collective waiting for a peer) outweighs the thread's wake-ups.
        spinning = spin_secs is not None and spin_secs >= HANG_STILL_MIN_SECONDS
        run = frozen_run(rank.pid, rank.samples, cpu_counts=False, io_counts=False) or run
        if spinning:
            if run.count < 2 or run.seconds < HANG_STILL_MIN_SECONDS:
                return None
            stuck_secs = run.seconds
        else:
            if not at_sync or not run.long_enough():
                return None
            stuck_secs = run.stuck_seconds
    need = HANG_STILL_MIN_SECONDS if run.still is not None else HANG_MIN_SECONDS
    gpu_idle = idle_secs is not None and idle_secs >= min(need, stuck_secs)
    gpu_spin = spin_secs is not None and spin_secs >= min(need, stuck_secs)
    if gpus and not (gpu_idle or gpu_spin):
        return None  # the GPU computes: the job moves on the device while the host waits
    evidence = [
        f"{rank.label}: main thread {state} in {run.count} consecutive dumps over {run.seconds:.0f} s, same frame{_counters_text(run)}"
    ]
    cpu = mean(rank.cpu[-5:])
    if cpu is not None:
        evidence.append(f"{rank.name} CPU {cpu:.0f}%" + (" (CUDA spin-waits at a sync)" if gpu_spin and cpu >= 50 else ""))
    native = _native_text(run, rank.native)
    if native:
        evidence.append(native)
    synced = describe_sync(rank) if state == EXPLICIT_SYNC else None
    if synced is not None:
        evidence.append(f"its host is parked at a sync: {synced[1]}")
    for o in gpus:
        if gpu_spin:
            evidence.append(_spin_evidence(o, trailing_spin_seconds(o)))
        else:
            evidence.append(
                f"GPU {o.index}: utilization ≤{HANG_UTILIZATION_MAX:.0f}% for {_trailing_idle_seconds(o):.0f} s, memory {gib(o.memory[-1])} held"
            )
    frames = frames_from(sample.frames, WAIT_FRAMES) if state == WAITING_FOR_DATA else outer_frames(sample.frames, 4)
    if stuck is not None:
        evidence.append(stuck.what)
        if stuck.run is not None:
            wnative = _native_text(stuck.run, stuck.worker.native)
            if wnative:
                evidence.append(f"worker {wnative}")
        frames = stuck.frames or frames
        where = "a DataLoader worker died" if not stuck.frames else "a DataLoader worker is stuck in dataset code"
        fix = (
            "find why that sample never loads (see the stuck frame); bound the wait with a DataLoader timeout\n"
            f"{WORKER_TIMEOUT_FIX}\n"
            "# inside __getitem__: put timeouts on network/file reads; log and skip bad samples"
        )
    elif state == IN_DATASET:
        where = "its own dataset code never returns (num_workers=0)"
        frames = dataset_frames(sample.frames)
        fix = (
            "find why __getitem__ never returns (see the stuck frame); add timeouts to its I/O\n"
            "# e.g. requests.get(url, timeout=30); open files from local disk, not a stalled mount"
        )
    elif state == COLLECTIVE or gpu_spin:
        where = (
            "it waits in a collective the other ranks never reached"
            if state == COLLECTIVE
            else ("its host is parked at a sync while its GPU spins in a collective (a peer never joined)")
        )
        fix = (
            "find the rank that did not reach the collective (a crashed or stuck rank, an uneven last batch)\n"
            + NCCL_FIX
            + ("\nDistributedSampler(..., drop_last=True)  # every rank runs the same number of steps")
        )
    else:
        where = (
            "it waits in an explicit sync (torch.cuda.synchronize / .item())"
            if synced is None
            else (f"it waits at a sync for GPU work that never finishes ({synced[1]})")
        )
        fix = (
            "the host waits for GPU work that never finishes: check the last kernel/collective before it\n"
            "CUDA_LAUNCH_BLOCKING=1 python train.py  # pinpoints the kernel (debug runs only)"
        )
    held = [o for o in gpus if gpu_idle and o.holds_memory(o.memory[-1] if o.memory else None)]
    finding = Finding(
        id="hang",
        title="Silent misfire: the job is stuck",
        severity="critical",
        confidence=confidence_from(run.count, 6, stuck_secs / (2 * HANG_MIN_SECONDS) if run.still is None else 1.0),
        label=LABEL_CODE,
        summary=f"Hang: {rank.name} stuck for {stuck_secs:.0f} s: {where}"
        + (f"; GPU {held[0].index} holds memory at 0%" if held else ""),
        evidence=tuple(evidence),
        frames=frames,
        fix=fix,
        gpus=tuple(o.index for o in gpus),
        pids=(rank.pid,),
    )
    return _Hung(
        finding,
        rank,
        stuck_secs,
        waiter=state == COLLECTIVE or (gpu_spin and state not in (WAITING_FOR_DATA, IN_DATASET)),
        state=state,
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


def makes_progress(rank: RankObs) -> bool:
    """Its main thread moved between its last two dumps: another stack, or counters that moved."""
    if len(rank.samples) < 2:
        return False
    run = frozen_run(rank.pid, rank.samples)
    return run is not None and (run.count < 2 or run.still is False)


def _odd_one_out(ctx: Context, waiting: Sequence[_Hung]) -> Optional[tuple[RankObs, str, tuple[str, ...]]]:
    """The live rank whose stack differs from the waiters': the one they wait for (its name, what it does)."""
    waiting_pids = {h.rank.pid for h in waiting}
    for rank in sorted(ctx.ranks.values(), key=lambda r: (r.rank is None, r.rank, r.pid)):
        if rank.pid in waiting_pids or (rank.last is not None and rank.last.exited) or not rank.samples:
            continue
        sample = rank.samples[-1]
        if sample.state in (COLLECTIVE,):
            continue
        stuck = stuck_worker(rank) if sample.state == WAITING_FOR_DATA else None
        if stuck is not None:
            return rank, f"{rank.label} is not in the collective: it waits for data; {stuck.what}", stuck.frames
        suspect = _suspect_worker(rank) if sample.state == WAITING_FOR_DATA else None
        if suspect is not None:
            w, run = suspect
            return (
                rank,
                f"{rank.label} is not in the collective: it waits for data, and its DataLoader worker PID {w.pid} has sat "
                f"in dataset code for {run.seconds:.0f} s ({run.count} dump(s){', counters still' if run.still else ''})",
                dataset_frames(run.last.frames),
            )
        frames = frames_from(sample.frames, WAIT_FRAMES) if sample.state == WAITING_FOR_DATA else outer_frames(sample.frames, 4)
        return rank, f"{rank.label} is not in the collective: its main thread is {sample.state}", frames
    return None


def _merge_waiters(ctx: Context, hung: list[_Hung]) -> list[Finding]:
    """One hang, one finding: ranks waiting in a collective (or parked at a sync while their GPU spins) wait
    for the rank whose stack differs.

    With a culprit (a rank stuck on data, in dataset code or in a sync) the waiters become its evidence.
    Without one, the live rank whose stack differs is named; failing that, a rank that exited; failing
    that, one finding says no rank shows why (the article's "NCCL timeout / incomplete group").
    """
    waiting = [h for h in hung if h.waiter]
    culprits = [h for h in hung if not h.waiter]
    if not waiting:
        return [h.finding for h in hung]
    names = ", ".join(h.rank.name for h in waiting[:8]) + (" …" if len(waiting) > 8 else "")
    gpus = tuple(g for h in waiting for g in h.finding.gpus)
    pids = tuple(p for h in waiting for p in h.finding.pids)
    spinning = [line for h in waiting for line in h.finding.evidence if "spinning" in line]
    how = "wait for it in a collective" + (" (their GPUs spin at ~100%, low power)" if spinning else "")
    parked = next((line for h in waiting for line in h.finding.evidence if line.startswith("its host is parked at a sync")), None)
    if parked:
        spinning.insert(0, "the waiting ranks' hosts are" + parked.removeprefix("its host is"))
    if culprits:
        first = culprits[0].finding
        fix = first.fix if NCCL_FIX in first.fix else first.fix + "\n" + NCCL_FIX
        merged = dataclasses.replace(
            first,
            summary=first.summary + f"; {len(waiting)} other rank(s) {how}",
            evidence=first.evidence
            + (f"{len(waiting)} other rank(s) frozen waiting for it: {names}",)
            + tuple(spinning[:EVIDENCE_RANKS]),
            fix=fix,
            gpus=first.gpus + gpus,
            pids=first.pids + pids,
        )
        return [merged] + [h.finding for h in culprits[1:]]
    first = waiting[0].finding
    longest = max(h.seconds for h in waiting)
    evidence = first.evidence + (f"{len(waiting)} rank(s) frozen waiting in the same collective: {names}",)
    summary = f"Hang: {len(waiting)} rank(s) stuck in a collective for {longest:.0f} s"
    frames = first.frames
    odd = _odd_one_out(ctx, waiting)
    exited = [r for r in ctx.ranks.values() if r.last is not None and r.last.exited]
    fix = first.fix
    if odd is not None and makes_progress(odd[0]) and "waits for data" not in odd[1]:
        # One rank works (an evaluation, a checkpoint, logging) while the others wait for it in a barrier or
        # collective: a wait, not a hang, as long as that rank moves.
        rank, what, odd_frames = odd
        long_wait = longest >= RANK_WAIT_LONG_S
        return [
            Finding(
                id="rank_wait",
                title="Ranks wait for one busy rank",
                severity="warning" if long_wait else "info",
                confidence=0.6,
                label=LABEL_CODE,
                summary=f"{len(waiting)} rank(s) wait {longest:.0f} s in a collective while {rank.name} works ({rank.samples[-1].state})",
                evidence=(what, f"{rank.label} makes progress (its stack or counters moved between its last dumps)")
                + first.evidence[:1],
                frames=odd_frames,
                fix=(
                    (
                        f"if {rank.name} is not in a long evaluation or checkpoint, it skipped a collective the others wait in\n"
                        + NCCL_FIX
                    )
                    if long_wait
                    else (
                        "nothing is stuck: rank-0-only work (evaluation, checkpointing) holds the others for its duration\n"
                        "# to use that time: evaluate on every rank with a DistributedSampler, or save checkpoints asynchronously"
                    )
                ),
                gpus=gpus,
                pids=(rank.pid,) + pids,
            )
        ]
    if odd is not None:
        rank, what, odd_frames = odd
        evidence += (what,)
        summary = f"Hang: {len(waiting)} rank(s) stuck for {longest:.0f} s waiting for {rank.name}"
        if "dataset code" in what:
            summary += ", which waits for a DataLoader worker stuck in dataset code"
        summary += " (their GPUs spin in a collective at ~100%, low power)" if spinning else " in a collective"
        frames = odd_frames or frames
        gpus += tuple(g for g in sorted(rank.gpus) if g not in gpus)
        pids = (rank.pid,) + pids
        if "waits for data" in what:
            fix = fix + "\n" + WORKER_TIMEOUT_FIX
    elif exited:
        evidence += tuple(f"{r.label} exited: the others wait for it" for r in exited)
        summary += f"; {exited[0].name} exited"
        gpus += tuple(g for r in exited for g in sorted(r.gpus) if g not in gpus)
    else:
        summary += "; no rank shows why (a rank outside this view, or a mismatched collective)"
    return [dataclasses.replace(first, summary=summary, evidence=evidence, frames=frames, fix=fix, gpus=gpus, pids=pids)]


def _gpu_only_hangs(ctx: Context, claimed: set[int]) -> list[Finding]:
    """GPU evidence alone: memory held at ~0% for a sustained window (the third idle profile), or - with no
    job attached to ask - GPUs spinning at ~100% and low power (collectives waiting for a missing peer)."""
    out: list[Finding] = []
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
        idle = _trailing_idle_seconds(o)
        if idle < HANG_MIN_SECONDS or not o.holds_memory(o.memory[-1] if o.memory else None):
            continue
        was_busy = any(
            u is not None and u > LOW_UTILIZATION for u in o.util[: max(1, len(o.util) - int(idle / max(ctx.interval, 1e-3)))]
        )
        stuck.append((o, idle, was_busy))
    if spinning:
        gpus_txt = ", ".join(f"GPU {o.index}" for o, _s in spinning[:8])
        pids = tuple(sorted({p for o, _s in spinning for p in o.process_pids}))
        out.append(
            Finding(
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
        )
    if not stuck:
        return out
    # a job whose ranks are all attached and none frozen is not hung on the GPU side alone - unless it stopped
    any_stopped = any(w for _o, _i, w in stuck)
    severity = "critical" if any_stopped or ctx.ranks else "warning"
    gpus_txt = ", ".join(f"GPU {o.index}" for o, _i, _w in stuck[:8])
    evidence = tuple(
        f"GPU {o.index}: utilization ≤{HANG_UTILIZATION_MAX:.0f}% for {idle:.0f} s"
        + (" after being busy" if was_busy else "")
        + f", memory {gib(o.memory[-1])} held by PID(s) {', '.join(str(p) for p in sorted(o.process_pids)) or 'n/a'}"
        for o, idle, was_busy in stuck
    )
    out.append(
        Finding(
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
    )
    return out
