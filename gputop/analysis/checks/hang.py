"""Hang / silent misfire: a job that makes no progress."""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from gputop.analysis.numbers import confidence_from, gib, mean
from gputop.analysis.observations import (
    WAIT_FRAMES,
    Context,
    GpuObs,
    RankObs,
    StackSample,
    WorkerObs,
    dataset_frames,
    frames_from,
    outer_frames,
)
from gputop.analysis.stack_classes import COLLECTIVE, EXPLICIT_SYNC, IN_DATASET, WAITING_FOR_DATA
from gputop.analysis.thresholds import HANG_MIN_SECONDS, HANG_UTILIZATION_MAX, LOW_UTILIZATION
from gputop.model import LABEL_CODE, Finding, Frame


def _trailing_idle_seconds(obs: GpuObs) -> float:
    """How long (seconds) the GPU has been at ~0% utilization at the end of the window."""
    start = None
    for t, u in zip(reversed(obs.timestamps), reversed(obs.util)):
        if u is None or u > HANG_UTILIZATION_MAX:
            break
        start = t
    return (obs.timestamps[-1] - start) if start is not None else 0.0


def _trailing_constant(samples: Sequence[StackSample]) -> tuple[float, Optional[StackSample], int]:
    """(seconds, sample, count) the main/worker stack has stayed identical at the end of the window."""
    if not samples:
        return 0.0, None, 0
    last = samples[-1]
    first = last
    count = 0
    for s in reversed(samples):
        if s.signature != last.signature or s.state != last.state:
            break
        first = s
        count += 1
    return last.timestamp - first.timestamp, last, count


def _in_dataset_code(frames: Sequence[Frame]) -> bool:
    return any(f.name.split(".")[-1] in ("__getitem__", "__getitems__", "fetch") for f in frames)


def _stuck_worker(rank: RankObs) -> Optional[tuple[str, tuple[str, ...], WorkerObs]]:
    """A worker of this rank that is dead, or stuck in dataset code with an unchanging stack."""
    for w in rank.workers.values():
        if w.last is not None and (w.last.exited or w.last.state in ("Z", "X")):
            return (f"DataLoader worker PID {w.pid} of {rank.name} is dead (state {w.last.state}, exited={w.last.exited})", (), w)
    for w in rank.workers.values():
        secs, sample, count = _trailing_constant(w.samples)
        if sample is not None and count >= 2 and secs >= HANG_MIN_SECONDS and _in_dataset_code(sample.frames):
            cpu = mean(w.cpu[-5:])
            cpu_txt = f", CPU {cpu:.0f}%" if cpu is not None else ""
            return (
                f"DataLoader worker PID {w.pid} of {rank.name}: same stack in dataset code for {secs:.0f} s "
                f"({count} dumps{cpu_txt})",
                dataset_frames(sample.frames),
                w,
            )
    return None


def check_hang(ctx: Context) -> list[Finding]:
    """Memory held and utilization ~0 for a sustained window, or a main thread frozen in one frame."""
    findings: list[Finding] = []
    hung: list[tuple[str, RankObs, float]] = []  # per finding: the frozen main thread's state, its rank, seconds
    claimed_gpus: set[int] = set()
    for rank in sorted(ctx.ranks.values(), key=lambda r: (r.rank is None, r.rank, r.pid)):
        if rank.last is not None and rank.last.exited:
            continue
        secs, sample, count = _trailing_constant(rank.samples)
        gpu_idle = [ctx.gpus[g] for g in sorted(rank.gpus) if g in ctx.gpus]
        idle_secs = min((_trailing_idle_seconds(o) for o in gpu_idle), default=None)
        gpu_busy = idle_secs is not None and idle_secs < HANG_MIN_SECONDS and any(o.util_values for o in gpu_idle)
        if sample is None or gpu_busy:
            continue
        state = sample.state
        stuck = _stuck_worker(rank) if state == WAITING_FOR_DATA else None
        frozen = count >= 2 and secs >= HANG_MIN_SECONDS
        if state == WAITING_FOR_DATA and not (frozen and stuck):
            continue  # a starving rank also waits; it hangs only if a worker is dead or frozen in dataset code
        if state == IN_DATASET and not frozen:
            continue
        if state in (COLLECTIVE, EXPLICIT_SYNC) and not frozen:
            continue
        if state not in (WAITING_FOR_DATA, IN_DATASET, COLLECTIVE, EXPLICIT_SYNC):
            continue
        evidence = [f"{rank.label}: main thread {state} in {count} consecutive dumps over {secs:.0f} s, same frame"]
        cpu = mean(rank.cpu[-5:])
        if cpu is not None:
            evidence.append(f"{rank.name} CPU {cpu:.0f}%")
        for o in gpu_idle:
            if o.util_values:
                evidence.append(
                    f"GPU {o.index}: utilization ≤{HANG_UTILIZATION_MAX:.0f}% for {_trailing_idle_seconds(o):.0f} s, memory {gib(o.memory[-1])} held"
                )
        frames = frames_from(sample.frames, WAIT_FRAMES) if state == WAITING_FOR_DATA else outer_frames(sample.frames, 4)
        if state == WAITING_FOR_DATA and stuck:
            what, wframes, _w = stuck
            evidence.append(what)
            frames = wframes or frames
            where = "a DataLoader worker died" if not wframes else "a DataLoader worker is stuck in dataset code"
            fix = (
                "find why that sample never loads (see the stuck frame); bound the wait with a DataLoader timeout\n"
                "DataLoader(..., timeout=120)  # raise instead of waiting forever on one worker\n"
                "# inside __getitem__: put timeouts on network/file reads; log and skip bad samples"
            )
        elif state == IN_DATASET:
            where = "its own dataset code never returns (num_workers=0)"
            frames = dataset_frames(sample.frames)
            fix = (
                "find why __getitem__ never returns (see the stuck frame); add timeouts to its I/O\n"
                "# e.g. requests.get(url, timeout=30); open files from local disk, not a stalled mount"
            )
        elif state == COLLECTIVE:
            where = "it waits in a collective the other ranks never reached"
            fix = (
                "find the rank that did not reach the collective (a crashed or stuck rank, an uneven last batch)\n"
                "export NCCL_DEBUG=INFO TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # fail loudly instead of hanging\n"
                "dist.init_process_group(..., timeout=datetime.timedelta(minutes=5))\n"
                "DistributedSampler(..., drop_last=True)  # every rank runs the same number of steps"
            )
        else:
            where = "it waits in an explicit sync (torch.cuda.synchronize / .item())"
            fix = (
                "the host waits for GPU work that never finishes: check the last kernel/collective before it\n"
                "CUDA_LAUNCH_BLOCKING=1 python train.py  # pinpoints the kernel (debug runs only)"
            )
        held = [o for o in gpu_idle if o.holds_memory(o.memory[-1] if o.memory else None)]
        claimed_gpus.update(o.index for o in gpu_idle)
        findings.append(
            Finding(
                id="hang",
                title="Silent misfire: the job is stuck",
                severity="critical",
                confidence=confidence_from(count, 6, secs / (2 * HANG_MIN_SECONDS)),
                label=LABEL_CODE,
                summary=f"Hang: {rank.name} stuck for {secs:.0f} s: {where}"
                + (f"; GPU {held[0].index} holds memory at 0%" if held else ""),
                evidence=tuple(evidence),
                frames=frames,
                fix=fix,
                gpus=tuple(o.index for o in gpu_idle),
                pids=(rank.pid,),
            )
        )
        hung.append((state, rank, secs))
    findings = _merge_collective_waiters(ctx, findings, hung)
    claimed_gpus |= {g for f in findings for g in f.gpus}
    findings += _gpu_only_hangs(ctx, claimed_gpus)
    return findings


def _merge_collective_waiters(ctx: Context, findings: list[Finding], hung: list[tuple[str, RankObs, float]]) -> list[Finding]:
    """One hang, one finding: ranks frozen in a collective wait for the rank that is stuck elsewhere.

    With a culprit (a rank stuck on data, in dataset code or in a sync) the waiters become its evidence.
    Without one, every rank waits in the collective: one finding, naming a rank that exited if there is
    one (the article's "NCCL timeout / incomplete group").
    """
    waiting = [(f, rank, secs) for f, (state, rank, secs) in zip(findings, hung) if state == COLLECTIVE]
    culprits = [f for f, (state, _r, _s) in zip(findings, hung) if state != COLLECTIVE]
    if not waiting:
        return findings
    names = ", ".join(rank.name for _f, rank, _s in waiting[:8]) + (" …" if len(waiting) > 8 else "")
    gpus = tuple(g for f, _r, _s in waiting for g in f.gpus)
    pids = tuple(p for f, _r, _s in waiting for p in f.pids)
    if culprits:
        first = culprits[0]
        merged = dataclasses.replace(
            first,
            summary=first.summary + f"; {len(waiting)} other rank(s) wait for it in a collective",
            evidence=first.evidence + (f"{len(waiting)} other rank(s) frozen in a collective, waiting for it: {names}",),
            gpus=first.gpus + gpus,
            pids=first.pids + pids,
        )
        return [merged] + culprits[1:]
    first = waiting[0][0]
    longest = max(secs for _f, _r, secs in waiting)
    exited = [r for r in ctx.ranks.values() if r.last is not None and r.last.exited]
    evidence = first.evidence + (f"{len(waiting)} rank(s) frozen in the same collective: {names}",)
    summary = f"Hang: {len(waiting)} rank(s) stuck in a collective for {longest:.0f} s"
    if exited:
        evidence += tuple(f"{r.label} exited: the others wait for it" for r in exited)
        summary += f"; {exited[0].name} exited"
        gpus += tuple(g for r in exited for g in sorted(r.gpus) if g not in gpus)
    else:
        summary += "; no rank shows why (a rank outside this view, or a mismatched collective)"
    return [dataclasses.replace(first, summary=summary, evidence=evidence, gpus=gpus, pids=pids)]


def _gpu_only_hangs(ctx: Context, claimed: set[int]) -> list[Finding]:
    """GPU evidence alone: memory held at ~0% for a sustained window (the third idle profile)."""
    out: list[Finding] = []
    candidates = ctx.focus_gpus() if ctx.ranks else list(ctx.gpus.values())
    stuck: list[tuple[GpuObs, float, bool]] = []
    for o in candidates:
        if o.index in claimed or not o.util_values or o.lost_at is not None:
            continue
        idle = _trailing_idle_seconds(o)
        if idle < HANG_MIN_SECONDS or not o.holds_memory(o.memory[-1] if o.memory else None):
            continue
        was_busy = any(u is not None and u > LOW_UTILIZATION for u in o.util[: max(1, len(o.util) - int(idle / max(ctx.interval, 1e-3)))])
        stuck.append((o, idle, was_busy))
    if not stuck:
        return []
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
