"""CPU-bound input: pinned loader processes on saturated cores, more workers than cores."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

from gputop.analysis.advice import producer_bound, worker_cap
from gputop.analysis.checks.kernels import busy, mean_sm_active
from gputop.analysis.numbers import confidence_from, mean
from gputop.analysis.observations import Context, RankObs, WorkerObs
from gputop.analysis.stack_classes import IN_DATASET
from gputop.analysis.thresholds import CORES_SATURATED_PERCENT, PROCESS_PINNED_PERCENT
from gputop.model import LABEL_CODE, Finding


@dataclass
class CpuFacts:
    """What the CPU numbers say about the input pipeline's producers."""

    cores: float  # the job may use (its cgroup's cpu.max / cpuset, else the host's)
    host_cpu: Optional[float]  # median of the all-core mean, percent
    samples: int
    n_workers: int
    pinned_workers: list[WorkerObs]
    pinned_ranks: list[RankObs]  # num_workers=0 ranks decoding on their main thread at ~100%

    @property
    def saturated(self) -> bool:
        return (
            self.host_cpu is not None
            and self.host_cpu >= CORES_SATURATED_PERCENT
            and bool(self.pinned_workers or self.pinned_ranks)
        )

    @property
    def oversubscribed(self) -> bool:
        return self.n_workers > self.cores

    @property
    def cores_busy(self) -> bool:
        """Every core busy with the loader's producers: pinned at 100% (`saturated`), or more workers than cores,
        however small each one's share of a core looks (24 workers on 2 cores get 8% each).  More workers cannot
        help, and the workers compute."""
        busy_host = self.host_cpu is not None and self.host_cpu >= CORES_SATURATED_PERCENT
        return self.saturated or (busy_host and self.oversubscribed)


def cpu_facts(ctx: Context) -> CpuFacts:
    host_means = [statistics.fmean(s.host.cpu_percent) for s in ctx.snaps if s.host.cpu_percent]
    current: set[int] = set()
    for r in ctx.ranks.values():
        if r.worker_sets:
            current |= r.worker_sets[-1][1]
    pinned = [
        w
        for r in ctx.ranks.values()
        for p, w in r.workers.items()
        if p in current and w.cpu and statistics.median(w.cpu) >= PROCESS_PINNED_PERCENT
    ]
    pinned_ranks = [
        r
        for r in ctx.ranks.values()
        if r.cpu
        and statistics.median(r.cpu) >= PROCESS_PINNED_PERCENT
        and r.states[IN_DATASET] > 0
        and not (r.worker_sets and r.worker_sets[-1][1])
    ]
    return CpuFacts(
        cores=ctx.job_cores(),
        host_cpu=statistics.median(host_means) if host_means else None,
        samples=len(host_means),
        n_workers=len(current),
        pinned_workers=pinned,
        pinned_ranks=pinned_ranks,
    )


@dataclass(frozen=True)
class CpuBound:
    """What `check_cpu_bound` decided from the CPU facts, and the worker cap it advises."""

    facts: CpuFacts
    input_bound: bool  # the job waits for input: the CPU's limit costs GPU time now
    gpus_idle: Optional[float]  # the GPUs' mean utilization when they sit mostly idle while every core is busy
    bound: str  # "cpu": the workers compute; "io": they sleep in the dataset
    cap: int  # workers per rank to keep to
    cap_why: str
    duration_s: float


def check_cpu_bound(
    ctx: Context, facts: CpuFacts, *, input_bound: bool, hung_gpus: frozenset[int] = frozenset()
) -> list[Finding]:
    """Producers pinned with every core busy, or more workers than cores.

    It is a problem (warning) only while it costs GPU time: the job is input-bound, or the GPUs sit mostly idle
    while every core is busy (the ranks wait for a core).  A saturated CPU that keeps the GPUs fed costs
    nothing, and oversubscribed workers that mostly wait on storage are merely noted (info).
    """
    if not (facts.saturated or facts.oversubscribed):
        return []
    ranks = list(ctx.ranks.values())
    if ranks and all(r.starting_up for r in ranks):
        # imports, the model build and the workers' first prefetch take every core while the GPUs wait for the
        # first step: start-up's cost, not the loader's (the hiccup demo's 30 s start-up read "CPU oversubscribed")
        return []
    idle = _gpus_idle_on_busy_cores(ctx, facts, hung_gpus)
    bound = "cpu" if facts.cores_busy else producer_bound(ranks)[0]
    cap, cap_why = worker_cap(ctx, ranks, bound)
    return [cpu_bound_finding(CpuBound(facts, input_bound, idle, bound, cap, cap_why, ctx.duration))]


def _gpus_idle_on_busy_cores(ctx: Context, facts: CpuFacts, hung_gpus: frozenset[int]) -> Optional[float]:
    """The GPUs' mean utilization when they sit mostly idle while every core is busy, else None.

    More workers than cores can take the CPU from the training processes themselves: each worker gets its
    share and the ranks' forward, backward and optimizer wait for a core.  The ranks then never wait for
    data (the queue is full), yet the GPUs lose time all the same (the case study's stage 2 on a slow box:
    24 workers on 2 cores, GPUs at 24%, data wait 5%).

    The GPUs of a hang are left out: a rank stuck in its code holds its GPU idle and the others spin in their
    collective (GPU-Util near 100%, the SMs idle), neither of which a free core would change (the 8-rank
    nccl-hang demo read "GPUs at 86% while every core is busy: the training processes wait for a core")."""
    if not (facts.cores_busy and ctx.ranks and ctx.have_gpu_data):
        return None
    gpus = [o for o in ctx.focus_gpus() if o.index not in hung_gpus]
    util = mean(o.mean_util for o in gpus) if gpus else None
    return util if util is not None and not busy(util, mean_sm_active(gpus)) else None


def _cpu_evidence(d: CpuBound) -> list[str]:
    facts = d.facts
    evidence: list[str] = []
    if facts.saturated:
        evidence.append(f"host CPU: median {facts.host_cpu:.0f}% over {facts.cores:g} cores for {d.duration_s:.0f} s")
        if facts.pinned_workers:
            evidence.append(
                f"{len(facts.pinned_workers)}/{facts.n_workers} DataLoader workers at ≥{PROCESS_PINNED_PERCENT:.0f}% of a core"
            )
        if facts.pinned_ranks:
            evidence.append(
                f"{len(facts.pinned_ranks)} rank(s) decode on their main thread at ≥{PROCESS_PINNED_PERCENT:.0f}% (num_workers=0)"
            )
    if facts.oversubscribed:
        evidence.append(
            f"{facts.n_workers} DataLoader workers on {facts.cores:g} cores ({facts.n_workers / facts.cores:.1f} per core)"
        )
    if not d.input_bound and d.gpus_idle is not None:
        evidence.append(f"the GPUs are at {d.gpus_idle:.0f}% while every core is busy: the training processes wait for a core")
    elif not d.input_bound:
        evidence.append("the GPUs are not waiting for input, so this costs nothing now")
    return evidence


def cpu_bound_finding(d: CpuBound) -> Finding:
    facts = d.facts
    if facts.saturated:
        summary = f"CPU-bound input: cores {facts.host_cpu:.0f}% busy, {len(facts.pinned_workers) or len(facts.pinned_ranks)} loader process(es) pinned at 100%"
    else:
        summary = f"CPU oversubscribed: {facts.n_workers} DataLoader workers on {facts.cores:g} cores"
    if d.bound == "cpu":
        first = f"make each sample cheaper, and keep num_workers ≤ {d.cap} per rank ({d.cap_why})"
    else:
        first = (
            f"the workers wait on I/O, so more of them than cores costs little; keep num_workers ≤ {d.cap} per rank ({d.cap_why})"
        )
    return Finding(
        id="cpu_bound",
        title="CPU-bound input: the cores cannot preprocess fast enough"
        if facts.saturated
        else "More DataLoader workers than cores",
        severity="warning" if d.input_bound or d.gpus_idle is not None else "info",
        confidence=confidence_from(facts.samples, 15, 1.0 if facts.saturated else 0.6),
        label=LABEL_CODE,
        summary=summary,
        evidence=tuple(_cpu_evidence(d)),
        fix=(
            f"{first}\n"
            f"DataLoader(..., num_workers={d.cap}, persistent_workers=True)\n"
            "# cache decoded/resized samples once; pack small files (WebDataset); decode on the GPU (NVIDIA DALI)"
        ),
        pids=tuple(w.pid for w in facts.pinned_workers) + tuple(r.pid for r in facts.pinned_ranks),
    )
