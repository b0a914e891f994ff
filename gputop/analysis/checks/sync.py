"""Host-device syncs in the training loop: `.item()`, `.cpu()`, `.tolist()`, printing a tensor,
`torch.cuda.synchronize()` every step make the host wait for the GPU, and the GPU then wait for the host's
next launches: they take turns, and both sit half idle."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Collection, Optional

from gputop.analysis.numbers import mean, mean_share
from gputop.analysis.observations import Context, GpuObs, RankObs, StackSample, outer_frames, pooled_counts
from gputop.analysis.prediction import Forecast, predict_no_sync, step_rate
from gputop.analysis.stack_classes import EXPLICIT_SYNC, SyncPoint, format_frame, read_source_line, short_path, sync_point
from gputop.analysis.thresholds import BUSY_UTILIZATION, EVIDENCE_RANKS, SYNC_BOUND_FRACTION
from gputop.model import LABEL_CODE, Finding

# the expression that syncs, as written on the line: `loss.item()`, `out.cpu()`, `acc.tolist()`
_SYNC_EXPRESSION = re.compile(r"[\w\].\[]*\.(?:item|cpu|tolist|numpy)\(\s*\)|[\w.]*synchronize\(\s*\)")


def sync_line(pid: int, sample: StackSample) -> Optional[tuple[SyncPoint, str]]:
    """(the sync point, "`loss.item()` at train.py:57 is a host-device sync") for a dump parked at a sync."""
    point = sync_point(sample.frames, lambda f: read_source_line(f.filename, f.line, pid))
    if point is None:
        return None
    source = read_source_line(point.frame.filename, point.frame.line, pid)
    match = _SYNC_EXPRESSION.search(source or "")
    what = match.group(0) if match else (source or point.call)
    return point, f"`{what}` at {short_path(point.frame.filename)}:{point.frame.line} is a host-device sync"


def describe_sync(rank: RankObs) -> Optional[tuple[SyncPoint, str]]:
    """The sync its latest dumps at a sync point name (the newest one that names a line)."""
    for sample in reversed(rank.samples):
        if sample.state == EXPLICIT_SYNC and sample.frames:
            found = sync_line(rank.pid, sample)
            if found is not None:
                return found
    return None


@dataclass(frozen=True)
class SyncBound:
    """What `check_sync_bound` decided: ranks parked at a host-device sync while their GPUs are not busy."""

    synced: tuple[RankObs, ...]  # the ranks at a sync in at least SYNC_BOUND_FRACTION of their samples
    worst: RankObs
    gpus: tuple[GpuObs, ...]  # their GPUs with utilization data
    gpu_mean: Optional[float]
    site: Optional[tuple[SyncPoint, str]]  # the sync the worst rank's dumps name, with its line in words
    frames: tuple[str, ...]
    prediction: Optional[Forecast] = None  # what removing the sync buys


def check_sync_bound(ctx: Context, *, exclude: Collection[int] = frozenset()) -> list[Finding]:
    """Ranks caught at a host-device sync in a large share of their dumps while the GPUs are not busy."""
    decided = sync_bound(ctx, exclude=exclude)
    return [sync_bound_finding(decided)] if decided is not None else []


def sync_bound(ctx: Context, *, exclude: Collection[int] = frozenset()) -> Optional[SyncBound]:
    ranks = [r for r in ctx.ranks.values() if r.pid not in exclude and r.measured]
    synced = [r for r in ranks if r.fraction(EXPLICIT_SYNC) >= SYNC_BOUND_FRACTION]
    if not synced:
        return None
    gpus = [ctx.gpus[g] for g in sorted({g for r in synced for g in r.gpus}) if g in ctx.gpus and ctx.gpus[g].util_values]
    gpu_mean = mean(o.mean_util for o in gpus) if gpus else None
    if gpu_mean is not None and gpu_mean >= BUSY_UTILIZATION:
        return None  # the GPUs stay busy: the host waits on work queued ahead, which costs nothing
    worst = max(synced, key=lambda r: r.fraction(EXPLICIT_SYNC))
    found = describe_sync(worst)
    if found is not None:
        frames: tuple[str, ...] = (format_frame(found[0].frame),)
    else:
        sample = next((s for s in reversed(worst.samples) if s.state == EXPLICIT_SYNC and s.frames), None)
        frames = outer_frames(sample.frames, 3) if sample is not None else ()
    idle = mean_share([1.0 - u / 100.0 for o in gpus for u in o.util_values], "NVML utilization, 1 a second")
    forecast = predict_no_sync(pooled_counts(synced).share(EXPLICIT_SYNC), idle).with_rate(step_rate(ctx))
    return SyncBound(tuple(synced), worst, tuple(gpus), gpu_mean, found, frames, forecast)


def sync_bound_finding(d: SyncBound) -> Finding:
    evidence = [
        f"{r.label}: at a host-device sync in {r.share(EXPLICIT_SYNC).text()} of {r.n:,} {r.counts.unit}"
        for r in d.synced[:EVIDENCE_RANKS]
    ]
    if len(d.synced) > EVIDENCE_RANKS:
        evidence.append(f"… {len(d.synced) - EVIDENCE_RANKS} more rank(s)")
    if d.gpu_mean is not None:
        evidence.append(f"GPU utilization of those ranks' GPUs: mean {d.gpu_mean:.0f}% (host and GPU take turns)")
    if d.site is not None:
        evidence.insert(0, d.site[1])
        where = d.site[1]
    else:
        where = "the main thread waits at a host-device sync (.item(), .cpu(), synchronize())"
    gpu_txt = f"; GPUs at {d.gpu_mean:.0f}%" if d.gpu_mean is not None else ""
    return Finding(
        id="sync_bound",
        title="Your code: a sync in the loop",
        severity="warning",
        confidence=round(min(0.9, 0.4 + d.worst.fraction(EXPLICIT_SYNC)), 2),
        label=LABEL_CODE,
        summary=f"Your code: a sync in the loop: {where}{gpu_txt}",
        evidence=tuple(evidence),
        frames=d.frames,
        fix=(
            "keep values on the GPU and read them every N steps, not every step\n"
            "running_loss += loss.detach()           # no sync: stays on the GPU\n"
            "if step % 100 == 0: print(running_loss.item() / 100); running_loss.zero_()"
        ),
        gpus=tuple(o.index for o in d.gpus),
        pids=tuple(r.pid for r in d.synced),
        figures={"prediction": d.prediction.figures()} if d.prediction is not None else {},
    )
