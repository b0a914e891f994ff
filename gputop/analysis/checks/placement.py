"""Rank misplacement: ranks sharing a GPU, stray CUDA contexts."""

from __future__ import annotations

from collections import Counter

from gputop.analysis.checks.near_cpus import check_near_cpus
from gputop.analysis.numbers import mean
from gputop.analysis.observations import Context
from gputop.analysis.thresholds import MISPLACED_IDLE_UTILIZATION
from gputop.model import LABEL_CODE, Finding


def check_misplacement(ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    job = ctx.job
    # The collector decides placement once (JobTree.misplacements); a recording from before that carries
    # only its one-line warnings, read as they are.
    placed = list(job.misplacements) if job is not None else []
    warnings = [m.message for m in placed] if placed else (list(job.warnings) if job is not None else [])
    ranks = [r for r in ctx.ranks.values() if r.last is None or not r.last.exited]
    with_gpu = [r for r in ranks if r.gpus]
    n_gpus = len(ctx.gpus) or ctx.history.machine.gpu_count
    if len(with_gpu) >= 2:
        own = Counter()
        for r in with_gpu:
            for g in r.gpus:
                own[g] += 1
        used = sorted(own)
        share = {g: c for g, c in own.items() if c >= 2}
        if len(used) == 1 or (share and len(share) == len(used)):
            # every rank on the same card(s): "8 GPUs, 7 idle"
            g = used[0]
            idle = [i for i in sorted(ctx.gpus) if i not in used]
            evidence = [f"{len(with_gpu)} ranks hold memory on GPU {', '.join(map(str, used))}"]
            if idle:
                idle_util = mean(ctx.gpus[i].mean_util for i in idle)
                evidence.append(
                    f"{len(idle)} of {n_gpus} GPUs unused"
                    + (f" (mean utilization {idle_util:.0f}%)" if idle_util is not None else "")
                )
            if g in ctx.gpus and ctx.gpus[g].mean_util is not None:
                evidence.append(f"GPU {g}: mean utilization {ctx.gpus[g].mean_util:.0f}%")
            evidence += [f"collector: {w}" for w in warnings]
            findings.append(
                Finding(
                    id="misplacement",
                    title="Rank misplacement: all ranks on one GPU",
                    severity="critical",
                    confidence=0.9,
                    label=LABEL_CODE,
                    summary=f"{len(with_gpu)} ranks share GPU {g}; {len(idle)} of {n_gpus} GPUs idle",
                    evidence=tuple(evidence),
                    fix=(
                        "bind each rank to its own GPU before any CUDA call\n"
                        "local_rank = int(os.environ['LOCAL_RANK'])\n"
                        "torch.cuda.set_device(local_rank)\n"
                        "model = DDP(model.to(local_rank), device_ids=[local_rank])\n"
                        "# and launch one process per GPU: torchrun --nproc_per_node=NUM_GPUS train.py"
                    ),
                    gpus=tuple(used),
                    pids=tuple(r.pid for r in with_gpu),
                )
            )
        elif len(share) == 1 and all(len(r.gpus) >= 2 for r in with_gpu if list(share)[0] in r.gpus):
            g = list(share)[0]
            findings.append(
                Finding(
                    id="misplacement",
                    title="Stray CUDA contexts: every rank also holds memory on one GPU",
                    severity="warning",
                    confidence=0.8,
                    label=LABEL_CODE,
                    summary=f"{share[g]} ranks also hold memory on GPU {g} (stray CUDA context)",
                    evidence=tuple(
                        [f"{r.name}: GPUs {', '.join(map(str, sorted(r.gpus)))}" for r in with_gpu[:8]]
                        + [f"collector: {w}" for w in warnings]
                    ),
                    fix=(
                        "call torch.cuda.set_device(local_rank) first, and map checkpoints off cuda:0\n"
                        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
                        "state = torch.load(path, map_location='cpu')"
                    ),
                    gpus=(g,),
                    pids=tuple(r.pid for r in with_gpu if g in r.gpus),
                )
            )
    if not findings and not ranks and n_gpus >= 2 and ctx.have_gpu_data:
        findings += _idle_beside_busy(ctx, n_gpus)
    if not findings and placed:
        m = placed[0]
        findings.append(
            Finding(
                id="misplacement",
                title="Rank placement: a GPU shared, or a rank on several GPUs",
                severity="warning",
                confidence=0.7,
                label=LABEL_CODE,
                summary=m.message[:1].upper() + m.message[1:],
                evidence=tuple(f"collector: {x.message}" for x in placed),
                fix="torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before any CUDA call\ntorch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
                gpus=tuple(sorted({g for x in placed for g in x.gpus})),
                pids=tuple(dict.fromkeys(p for x in placed for p in x.pids)),
            )
        )
    elif not findings and warnings and any("GPU" in w for w in warnings):
        findings.append(
            Finding(
                id="misplacement",
                title="Rank placement warning",
                severity="warning",
                confidence=0.6,
                label=LABEL_CODE,
                summary=warnings[0],
                evidence=tuple(f"collector: {w}" for w in warnings),
                fix="torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) before any CUDA call\ntorch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
            )
        )
    return findings + check_near_cpus(ctx)  # the CPUs' side of the placement


def _idle_beside_busy(ctx: Context, n_gpus: int) -> list[Finding]:
    """No job attached: most GPUs idle next to busy ones ("8 GPUs, 7 idle" seen from the machine).

    The machine view cannot see the ranks, so it names the processes on the busy GPU(s) and the two usual
    causes, and sends the user to `--pid`.  A mean over the busy GPU alone would call this healthy.
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
        return []
    pids = sorted({p for o in busy for p in o.process_pids})
    crowded = [o for o in busy if len(o.process_pids) >= 2]
    where = "; ".join(f"GPU {o.index}: PID {', '.join(map(str, sorted(o.process_pids)))}" for o in busy[:4])
    if crowded:
        cause = f"{len(crowded[0].process_pids)} processes share GPU {crowded[0].index}: every rank on one GPU (no torch.cuda.set_device(local_rank))"
    elif len(pids) == 1:
        cause = "one process: DDP was not launched (python train.py instead of torchrun --nproc_per_node=N), or every rank sits on one GPU"
    else:
        cause = "a job of fewer processes than GPUs: DDP not launched on all GPUs, or ranks crowded on a few GPUs"
    evidence = [
        f"GPU {o.index}: mean utilization {o.mean_util:.0f}%, PID(s) {', '.join(map(str, sorted(o.process_pids)))}"
        for o in busy[:4]
    ]
    evidence.append(f"idle GPUs (no process, < {MISPLACED_IDLE_UTILIZATION:.0f}%): {', '.join(str(o.index) for o in idle)}")
    evidence.append(f"likely cause: {cause}")
    first = pids[0]
    return [
        Finding(
            id="idle_gpus" if not crowded else "misplacement",
            title="Most GPUs idle while a job uses few" if not crowded else "Rank misplacement: several processes share one GPU",
            severity="critical" if crowded else "warning",
            confidence=0.7,
            label=LABEL_CODE,
            summary=f"{len(idle)} of {n_gpus} GPUs idle while a job uses {len(busy)} ({where})",
            evidence=tuple(evidence),
            fix=(
                f"attach with `--pid {first}` to see why: gputop --pid {first}\n"
                "# one process per GPU: torchrun --nproc_per_node=NUM_GPUS train.py\n"
                "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))  # before any CUDA call, in every rank"
            ),
            gpus=tuple(o.index for o in busy),
            pids=tuple(pids),
        )
    ]
