"""Loader advice: how many workers, and the arithmetic behind the number."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from gputop.analysis.loader_math import MARGIN as LOADER_MARGIN
from gputop.analysis.loader_math import workers_needed
from gputop.analysis.numbers import percentile
from gputop.analysis.observations import Context, RankObs
from gputop.analysis.thresholds import IO_BOUND_CPU_PERCENT, IO_MEMORY_SHARE, MAX_IO_WORKERS
from gputop.units import fraction as pct
from gputop.units import gib

STACKS_HINT = "attach with `gputop --pid PID` (or `gputop report --pid PID`) to see the stacks"


@dataclass(frozen=True)
class WorkerAdvice:
    """Workers per rank, never above the cap, and the arithmetic behind both."""

    workers: int  # what to set: min(needed, cap)
    needed: int  # what the arithmetic asks for (shown only when it fits the cap)
    cap: int
    bound: str  # "cpu": the workers compute; "io": they sleep in __getitem__ (storage, network)
    arithmetic: str  # comment lines for the fix

    @property
    def capped(self) -> bool:
        return self.needed > self.cap


def producer_bound(ranks: Sequence[RankObs]) -> tuple[str, str]:
    """("cpu" | "io", why): do the batch producers compute, or sleep inside the dataset (I/O)?

    A producer in `__getitem__` that uses a core is CPU-bound; one that sits there at little CPU waits on
    storage or the network.  The producers are the workers, or the rank itself at num_workers=0."""
    worker_cpu = [c for r in ranks for w in r.workers.values() if w.pid in (r.worker_sets[-1][1] if r.worker_sets else ()) for c in w.cpu[-10:]]
    if worker_cpu:
        cpu = percentile(worker_cpu, 50) or 0.0
        who = "the workers"
    else:
        cpu = percentile([c for r in ranks for c in r.cpu[-10:]], 50) or 0.0
        who = "the rank (num_workers=0)"
    if cpu >= IO_BOUND_CPU_PERCENT:
        return "cpu", f"{who} use {cpu:.0f}% of a core: CPU-bound"
    return "io", f"{who} use {cpu:.0f}% of a core while in the dataset: waiting on I/O"


def worker_cap(ctx: Context, ranks: Sequence[RankObs], bound: str) -> tuple[int, str]:
    """The most workers per rank that cannot hurt, and why.

    CPU-bound workers share the cores the job may use (its cgroup's cpu.max / cpuset, else the host's)
    among the ranks.  I/O-bound ones may outnumber the cores; they are bounded by memory (each forked
    worker's RSS, against half the memory the job may still take) and by MAX_IO_WORKERS."""
    n_ranks = max(1, len(ctx.ranks))
    cores = ctx.job_cores()
    where = "the job's cgroup" if ctx.job is not None and ctx.job.cpu_limit else "the host"
    if bound == "cpu":
        cap = max(1, int(cores // n_ranks))
        return cap, f"CPU-bound workers: {cores:g} cores ({where}) ÷ {n_ranks} rank(s) → at most {cap} per rank"
    cap = MAX_IO_WORKERS
    why = f"I/O-bound workers may outnumber the cores; at most {MAX_IO_WORKERS} per rank"
    rss = percentile([w.last.rss for r in ranks for w in r.workers.values() if w.last is not None and w.last.rss], 50)
    if rss is None:
        rss = percentile([r.last.rss for r in ranks if r.last is not None and r.last.rss], 50)  # a fork starts as big
    free = ctx.memory_free()
    if rss and free is not None:
        by_memory = max(1, int(free * IO_MEMORY_SHARE / rss / n_ranks))
        if by_memory < cap:
            cap = by_memory
            why = (
                f"I/O-bound workers: {IO_MEMORY_SHARE:.0%} of {gib(free)} free ÷ {gib(rss)} per worker ÷ {n_ranks} rank(s)"
                f" → at most {cap} per rank"
            )
    return cap, why


def suggested_workers(
    ctx: Context, ranks: Sequence[RankObs], input_fraction: float, gpu_mean: Optional[float]
) -> WorkerAdvice:
    """Workers per rank from the loader arithmetic, capped, and that arithmetic as comment lines.

    With a share `f` of the wall time spent on input, one step's GPU work takes (1 - f) of a cycle.
    With num_workers=0 the rank prepares a batch itself in f of it; with n workers that keep the rank
    waiting, each worker needs n cycles per batch.  Workers needed ≈ prep time ÷ step time × margin
    (`loader_math.workers_needed`, the same rule `gputop bench` applies to measured times).
    """
    current = max((len(r.worker_sets[-1][1]) if r.worker_sets else 0) for r in ranks) if ranks else 0
    source = f"the {pct(input_fraction)} input share of the stack dumps"
    if gpu_mean is not None and 1.0 - gpu_mean / 100.0 > input_fraction:
        # The GPUs' idle share bounds the input share from above and is measured every second, where the
        # 2 s dumps undercount a rank that is rarely caught mid-read: size for what the GPUs lose.
        input_fraction = 1.0 - gpu_mean / 100.0
        source = f"the GPUs' {pct(input_fraction)} idle share"
    step = max(1.0 - input_fraction, 0.05)  # a job that only ever waits still steps now and then
    prep = input_fraction if current == 0 else float(current)
    needed = max(current + 1, workers_needed(prep, step))
    bound, bound_why = producer_bound(ranks)
    cap, cap_why = worker_cap(ctx, ranks, bound)
    workers = max(1, min(needed, cap))
    result = f"{needed}" if needed <= cap else f"more than the cap, so {workers}"
    arithmetic = (
        f"# workers needed ≈ prep ÷ step × {LOADER_MARGIN:g} = {prep:.2f} ÷ {step:.2f} × {LOADER_MARGIN:g}"
        f" → {result} (prep and step as shares of a {'step' if current == 0 else 'batch'} cycle, from {source})\n"
        f"# cap: {cap_why} ({bound_why}); `gputop bench` measures prep, step and CPU per worker"
    )
    return WorkerAdvice(workers, needed, cap, bound, arithmetic)


def loader_code(kwargs: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"DataLoader(dataset, batch_size=..., {args})"
