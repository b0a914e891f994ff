"""Rank misplacement: ranks sharing a GPU, stray CUDA contexts."""

from __future__ import annotations

from collections import Counter

from gputop.analysis.numbers import mean
from gputop.analysis.observations import Context
from gputop.analysis.thresholds import MISPLACED_BUSY_UTILIZATION, MISPLACED_IDLE_UTILIZATION
from gputop.model import LABEL_CODE, Finding


def check_misplacement(ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    warnings: list[str] = []
    for snap in reversed(ctx.snaps):
        if snap.job is not None:
            warnings = list(snap.job.warnings)
            break
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
                evidence.append(f"{len(idle)} of {n_gpus} GPUs unused" + (f" (mean utilization {idle_util:.0f}%)" if idle_util is not None else ""))
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
                    evidence=tuple([f"{r.name}: GPUs {', '.join(map(str, sorted(r.gpus)))}" for r in with_gpu[:8]] + [f"collector: {w}" for w in warnings]),
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
        # no job attached: several processes on one busy GPU while the others hold nothing
        busy = [o for o in ctx.gpus.values() if (o.mean_util or 0) >= MISPLACED_BUSY_UTILIZATION and len(o.process_pids) >= 2]
        idle = [
            o
            for o in ctx.gpus.values()
            if (o.mean_util or 0) < MISPLACED_IDLE_UTILIZATION and not o.process_pids and o.lost_at is None
        ]
        if len(busy) == 1 and len(idle) >= 2:
            o = busy[0]
            findings.append(
                Finding(
                    id="misplacement",
                    title="Rank misplacement: several processes share one GPU",
                    severity="critical",
                    confidence=0.7,
                    label=LABEL_CODE,
                    summary=f"{len(o.process_pids)} processes share GPU {o.index}; {len(idle)} of {n_gpus} GPUs idle",
                    evidence=(
                        f"GPU {o.index}: mean utilization {o.mean_util:.0f}%, PIDs {', '.join(map(str, sorted(o.process_pids)))}",
                        f"idle GPUs with no process: {', '.join(str(i.index) for i in idle)}",
                    ),
                    fix=(
                        "bind each rank to its own GPU before any CUDA call\n"
                        "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
                        "# launch one process per GPU: torchrun --nproc_per_node=NUM_GPUS train.py"
                    ),
                    gpus=(o.index,),
                    pids=tuple(sorted(o.process_pids)),
                )
            )
    if not findings and warnings and any("GPU" in w for w in warnings):
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
    return findings
