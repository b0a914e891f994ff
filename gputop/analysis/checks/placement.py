"""Rank misplacement: ranks sharing a GPU, stray CUDA contexts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from gputop.analysis.numbers import mean
from gputop.analysis.observations import Context, GpuObs, RankObs
from gputop.analysis.thresholds import MISPLACED_IDLE_UTILIZATION
from gputop.model import LABEL_CODE, Finding, Misplacement

_SET_DEVICE_FIX = "torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before any CUDA call\ntorch.cuda.set_device(int(os.environ['LOCAL_RANK']))"


@dataclass(frozen=True)
class CrowdedRanks:
    """Every rank on the same card(s): "8 GPUs, 7 idle"."""

    ranks: tuple[RankObs, ...]  # the live ranks that hold GPU memory
    used: tuple[int, ...]  # the GPUs they hold memory on
    idle: tuple[int, ...]  # the machine's other GPUs
    idle_util: Optional[float]  # their mean utilization
    used_util: Optional[float]  # the first used GPU's mean utilization
    n_gpus: int
    warnings: tuple[str, ...]  # the collector's placement lines


@dataclass(frozen=True)
class StrayContexts:
    """Every rank on one GPU also holds memory on a second one: a stray CUDA context (cuda:0)."""

    gpu: int
    count: int  # ranks holding memory on it
    ranks: tuple[RankObs, ...]
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class CollectorPlacement:
    """The collector's own placement decision (JobTree.misplacements), or, from an older recording, its
    one-line warnings."""

    placed: tuple[Misplacement, ...]
    warnings: tuple[str, ...]


def check_misplacement(ctx: Context) -> list[Finding]:
    decided = misplacement(ctx)
    if decided is None:
        return []
    if isinstance(decided, CrowdedRanks):
        return [crowded_ranks_finding(decided)]
    if isinstance(decided, StrayContexts):
        return [stray_contexts_finding(decided)]
    if isinstance(decided, CollectorPlacement):
        return [collector_placement_finding(decided)]
    return [idle_beside_busy_finding(decided)]


def _shared_gpus(
    ctx: Context, with_gpu: Sequence[RankObs], n_gpus: int, warnings: tuple[str, ...]
) -> Union[CrowdedRanks, StrayContexts, None]:
    own: Counter[int] = Counter(g for r in with_gpu for g in r.gpus)
    used = sorted(own)
    share = {g: c for g, c in own.items() if c >= 2}
    if len(used) == 1 or (share and len(share) == len(used)):
        idle = tuple(i for i in sorted(ctx.gpus) if i not in used)
        g = used[0]
        return CrowdedRanks(
            tuple(with_gpu),
            tuple(used),
            idle,
            mean(ctx.gpus[i].mean_util for i in idle) if idle else None,
            ctx.gpus[g].mean_util if g in ctx.gpus else None,
            n_gpus,
            warnings,
        )
    if len(share) == 1 and all(len(r.gpus) >= 2 for r in with_gpu if list(share)[0] in r.gpus):
        g = list(share)[0]
        return StrayContexts(g, share[g], tuple(with_gpu), warnings)
    return None


def misplacement(ctx: Context) -> Union[CrowdedRanks, StrayContexts, IdleBesideBusy, CollectorPlacement, None]:
    """The decision: are the ranks placed wrong on the GPUs, and how?"""
    job = ctx.job
    # The collector decides placement once (JobTree.misplacements); a recording from before that carries
    # only its one-line warnings, read as they are.
    placed = tuple(job.misplacements) if job is not None else ()
    warnings = tuple(m.message for m in placed) if placed else (tuple(job.warnings) if job is not None else ())
    ranks = [r for r in ctx.ranks.values() if r.last is None or not r.last.exited]
    with_gpu = [r for r in ranks if r.gpus]
    n_gpus = len(ctx.gpus) or ctx.history.machine.gpu_count
    if len(with_gpu) >= 2:
        shared = _shared_gpus(ctx, with_gpu, n_gpus, warnings)
        if shared is not None:
            return shared
    if not ranks and n_gpus >= 2 and ctx.have_gpu_data:
        idle = _idle_beside_busy(ctx, n_gpus)
        if idle is not None:
            return idle
    if placed or any("GPU" in w for w in warnings):
        return CollectorPlacement(placed, warnings)
    return None


def crowded_ranks_finding(d: CrowdedRanks) -> Finding:
    evidence = [f"{len(d.ranks)} ranks hold memory on GPU {', '.join(map(str, d.used))}"]
    if d.idle:
        evidence.append(
            f"{len(d.idle)} of {d.n_gpus} GPUs unused"
            + (f" (mean utilization {d.idle_util:.0f}%)" if d.idle_util is not None else "")
        )
    if d.used_util is not None:
        evidence.append(f"GPU {d.used[0]}: mean utilization {d.used_util:.0f}%")
    evidence += [f"collector: {w}" for w in d.warnings]
    return Finding(
        id="misplacement",
        title="Rank misplacement: all ranks on one GPU",
        severity="critical",
        confidence=0.9,
        label=LABEL_CODE,
        summary=f"{len(d.ranks)} ranks share GPU {d.used[0]}; {len(d.idle)} of {d.n_gpus} GPUs idle",
        evidence=tuple(evidence),
        fix=(
            "bind each rank to its own GPU before any CUDA call\n"
            "local_rank = int(os.environ['LOCAL_RANK'])\n"
            "torch.cuda.set_device(local_rank)\n"
            "model = DDP(model.to(local_rank), device_ids=[local_rank])\n"
            "# and launch one process per GPU: torchrun --nproc_per_node=NUM_GPUS train.py"
        ),
        gpus=d.used,
        pids=tuple(r.pid for r in d.ranks),
    )


def stray_contexts_finding(d: StrayContexts) -> Finding:
    return Finding(
        id="misplacement",
        title="Stray CUDA contexts: every rank also holds memory on one GPU",
        severity="warning",
        confidence=0.8,
        label=LABEL_CODE,
        summary=f"{d.count} ranks also hold memory on GPU {d.gpu} (stray CUDA context)",
        evidence=tuple(
            [f"{r.name}: GPUs {', '.join(map(str, sorted(r.gpus)))}" for r in d.ranks[:8]]
            + [f"collector: {w}" for w in d.warnings]
        ),
        fix=(
            "call torch.cuda.set_device(local_rank) first, and map checkpoints off cuda:0\n"
            "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
            "state = torch.load(path, map_location='cpu')"
        ),
        gpus=(d.gpu,),
        pids=tuple(r.pid for r in d.ranks if d.gpu in r.gpus),
    )


def collector_placement_finding(d: CollectorPlacement) -> Finding:
    if not d.placed:
        return Finding(
            id="misplacement",
            title="Rank placement warning",
            severity="warning",
            confidence=0.6,
            label=LABEL_CODE,
            summary=d.warnings[0],
            evidence=tuple(f"collector: {w}" for w in d.warnings),
            fix=_SET_DEVICE_FIX,
        )
    m = d.placed[0]
    return Finding(
        id="misplacement",
        title="Rank placement: a GPU shared, or a rank on several GPUs",
        severity="warning",
        confidence=0.7,
        label=LABEL_CODE,
        summary=m.message[:1].upper() + m.message[1:],
        evidence=tuple(f"collector: {x.message}" for x in d.placed),
        fix=_SET_DEVICE_FIX,
        gpus=tuple(sorted({g for x in d.placed for g in x.gpus})),
        pids=tuple(dict.fromkeys(p for x in d.placed for p in x.pids)),
    )


@dataclass(frozen=True)
class IdleBesideBusy:
    """No job attached: most GPUs idle next to busy ones ("8 GPUs, 7 idle" seen from the machine)."""

    busy: tuple[GpuObs, ...]
    idle: tuple[GpuObs, ...]
    n_gpus: int

    @property
    def pids(self) -> list[int]:
        return sorted({p for o in self.busy for p in o.process_pids})

    @property
    def crowded(self) -> Optional[GpuObs]:
        """The first busy GPU with several processes on it: every rank on one GPU."""
        return next((o for o in self.busy if len(o.process_pids) >= 2), None)


def _idle_beside_busy(ctx: Context, n_gpus: int) -> Optional[IdleBesideBusy]:
    """Most GPUs idle next to busy ones, seen without the job's ranks.

    The machine view cannot see the ranks, so its finding names the processes on the busy GPU(s) and the two
    usual causes, and sends the user to `--pid`.  A mean over the busy GPU alone would call this healthy.
    """
    busy = [
        o for o in ctx.gpus.values() if o.lost_at is None and o.process_pids and (o.mean_util or 0) >= MISPLACED_IDLE_UTILIZATION
    ]
    idle = [
        o
        for o in ctx.gpus.values()
        if o.lost_at is None and not o.process_pids and (o.mean_util or 0) < MISPLACED_IDLE_UTILIZATION
    ]
    if not busy or 2 * len(idle) < n_gpus:
        return None
    return IdleBesideBusy(tuple(busy), tuple(idle), n_gpus)


def idle_beside_busy_finding(d: IdleBesideBusy) -> Finding:
    pids = d.pids
    crowded = d.crowded
    where = "; ".join(f"GPU {o.index}: PID {', '.join(map(str, sorted(o.process_pids)))}" for o in d.busy[:4])
    if crowded is not None:
        cause = f"{len(crowded.process_pids)} processes share GPU {crowded.index}: every rank on one GPU (no torch.cuda.set_device(local_rank))"
    elif len(pids) == 1:
        cause = "one process: DDP was not launched (python train.py instead of torchrun --nproc_per_node=N), or every rank sits on one GPU"
    else:
        cause = "a job of fewer processes than GPUs: DDP not launched on all GPUs, or ranks crowded on a few GPUs"
    evidence = [
        f"GPU {o.index}: mean utilization {o.mean_util:.0f}%, PID(s) {', '.join(map(str, sorted(o.process_pids)))}"
        for o in d.busy[:4]
    ]
    evidence.append(f"idle GPUs (no process, < {MISPLACED_IDLE_UTILIZATION:.0f}%): {', '.join(str(o.index) for o in d.idle)}")
    evidence.append(f"likely cause: {cause}")
    first = pids[0]
    return Finding(
        id="idle_gpus" if crowded is None else "misplacement",
        title="Most GPUs idle while a job uses few" if crowded is None else "Rank misplacement: several processes share one GPU",
        severity="critical" if crowded is not None else "warning",
        confidence=0.7,
        label=LABEL_CODE,
        summary=f"{len(d.idle)} of {d.n_gpus} GPUs idle while a job uses {len(d.busy)} ({where})",
        evidence=tuple(evidence),
        fix=(
            f"attach with `--pid {first}` to see why: gputop --pid {first}\n"
            "# one process per GPU: torchrun --nproc_per_node=NUM_GPUS train.py\n"
            "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))  # before any CUDA call, in every rank"
        ),
        gpus=tuple(o.index for o in d.busy),
        pids=tuple(pids),
    )
