"""Loader advice: how many workers, and the arithmetic behind the number."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from gputop.analysis.loader_math import MARGIN as LOADER_MARGIN
from gputop.analysis.loader_math import workers_needed
from gputop.analysis.numbers import Share, percentile
from gputop.analysis.observations import Context, RankObs
from gputop.analysis.thresholds import (
    CPU_BOUND_RUNNABLE_SHARE,
    IO_BOUND_CPU_PERCENT,
    IO_MEMORY_SHARE,
    MAX_IO_WORKERS,
    MIN_STEP_SHARE,
)
from gputop.units import gib

ESTIMATE_SOURCE = "estimate from the shares"  # `figures["workers"]["source"]` of the advice made here
STACKS_HINT = "attach with `gputop --pid PID` (or `gputop report --pid PID`) to see the stacks"


@dataclass(frozen=True)
class WorkerAdvice:
    """Workers per rank with the range the data allow, never above the cap, and the arithmetic behind it."""

    workers: int  # what to set: the estimate (the lower bound when one-sided), capped
    needed: int  # the estimate: the share's point, or the count advised before while the interval holds it or misses by one
    low: int  # ... from the share's interval: its lower end
    high: Optional[int]  # ... its upper end; None: unbounded (the step was hardly ever caught)
    cap: int
    bound: str  # "cpu": the workers compute; "io": they sleep in __getitem__ (storage, network)
    arithmetic: str  # comment lines for the fix
    point: Optional[int] = None  # the share's point alone, when `needed` is the count advised before instead

    @property
    def capped(self) -> bool:
        return self.low > self.cap if self.one_sided else self.needed > self.cap

    @property
    def one_sided(self) -> bool:
        return self.high is None

    def range_text(self) -> str:
        """ "≈ 12 (9–16)", "≈ 12" (the interval gives one count) or "at least 9" (one-sided)."""
        if self.one_sided:
            return f"at least {self.low}"
        if self.low == self.high:
            return f"≈ {self.needed}"
        return f"≈ {self.needed} ({self.low}–{self.high})"

    def action(self) -> str:
        """The fix's first line: "raise num_workers ≈ 12 (9–16)", "raise num_workers to at least 9 (…)", or the cap."""
        if self.capped:
            return f"raise num_workers to {self.workers}, the cap (the arithmetic asks {self.range_text()})"
        if self.one_sided:
            return f"raise num_workers to at least {self.low} (the step was hardly ever caught; `b` measures it)"
        return f"raise num_workers {self.range_text()}"

    def figures(self) -> dict[str, Any]:
        return {
            "num_workers": self.workers,
            "estimate": None if self.one_sided else self.needed,
            "low": self.low,
            "high": self.high,
            "one_sided": self.one_sided,
            "cap": self.cap,
            "capped": self.capped,
            "bound": self.bound,
            "source": ESTIMATE_SOURCE,
            "point_estimate": self.needed if self.point is None else self.point,
            "advised_before": self.point is not None,
        }


def workers_now(ranks: Sequence[RankObs]) -> int:
    """The ranks' DataLoader workers now (the most any rank has)."""
    return max((len(r.worker_sets[-1][1]) if r.worker_sets else 0) for r in ranks) if ranks else 0


def producer_bound(ranks: Sequence[RankObs]) -> tuple[str, str]:
    """("cpu" | "io", why): do the batch producers compute, or sleep inside the dataset (I/O)?

    A producer in `__getitem__` that uses a core is CPU-bound; one that sits there at little CPU waits on
    storage or the network, unless it is runnable most of the time (a busy box gives a computing worker a
    fraction of a core: it waits for the rest runnable, not asleep).  The producers are the workers, or the
    rank itself at num_workers=0."""
    current = [w for r in ranks for w in r.workers.values() if w.pid in (r.worker_sets[-1][1] if r.worker_sets else ())]
    worker_cpu = [c for w in current for c in w.cpu[-10:]]
    # a py-spy dump stops a process for a moment (t): neither running nor asleep
    states = [s for w in current for s in w.states[-10:] if s not in ("t", "T")]
    runnable = sum(1 for s in states if s == "R") / len(states) if states else 0.0
    if worker_cpu:
        cpu = percentile(worker_cpu, 50) or 0.0
        who = "the workers"
    else:
        cpu = percentile([c for r in ranks for c in r.cpu[-10:]], 50) or 0.0
        who = "the rank (num_workers=0)"
    if cpu >= IO_BOUND_CPU_PERCENT:
        return "cpu", f"{who} use {cpu:.0f}% of a core: CPU-bound"
    if worker_cpu and runnable >= CPU_BOUND_RUNNABLE_SHARE:
        return "cpu", f"{who} use {cpu:.0f}% of a core, runnable {runnable:.0%} of the time (waiting for a core): CPU-bound"
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


def workers_for(share: float, current: int) -> Optional[int]:
    """Workers needed when the rank spends `share` of its time on input; None when the step share left is
    too small to divide by (under MIN_STEP_SHARE: the data bound the count from below only).

    With a share `f` of the wall time spent on input, one step's GPU work takes (1 - f) of a cycle.  With
    num_workers=0 the rank prepares a batch itself in f of it; with n workers that keep the rank waiting,
    each worker needs n cycles per batch.  Workers needed ≈ prep time ÷ step time × margin
    (`loader_math.workers_needed`, the same rule `gputop bench` applies to measured times)."""
    step = 1.0 - share
    if step < MIN_STEP_SHARE:
        return None
    prep = share if current == 0 else float(current)
    needed = max(current + 1, workers_needed(prep, step))
    return needed if needed <= MAX_IO_WORKERS * 4 else None


def suggested_workers(ctx: Context, ranks: Sequence[RankObs], input_share: Share, gpu_idle: Optional[Share]) -> WorkerAdvice:
    """Workers per rank from the loader arithmetic at the input share's point and at both ends of its
    interval, capped, and that arithmetic as comment lines."""
    current = workers_now(ranks)
    share = input_share
    unit = "stack dumps" if share.source == "stack dumps" else f"samples, {share.source}"
    source = f"the {share.text()} input share of {share.n:,} {unit}"
    if gpu_idle is not None and gpu_idle.low > share.high:
        # The GPUs' idle share bounds the input share from above and is read every second; where it is
        # surely higher, the samples undercount the input (a rank rarely caught mid-read): size for what
        # the GPUs lose.
        share = gpu_idle
        source = f"the GPUs' {share.text()} idle share"
    needed = workers_for(share.point, current)
    low = min(workers_for(share.low, current) or MAX_IO_WORKERS, MAX_IO_WORKERS)  # "at least 32": beyond any advice
    high = workers_for(share.high, current)
    if high is not None and high > MAX_IO_WORKERS:
        high = None  # beyond anything advised: say "at least"
    bound, bound_why = producer_bound(ranks)
    cap, cap_why = worker_cap(ctx, ranks, bound)
    point: Optional[int] = None
    own_range = ""  # this window's own range, when an earlier advice widened it
    one_off = False  # ... and that advice missed it by one count
    if high is None or needed is None:
        needed = needed or low
        chosen = low
    else:
        before = ctx.advised_before
        if before is not None and before != needed and low - 1 <= before <= high + 1 and before <= cap:
            # The count is a step function of a noisy share: near a step, two looks at one unchanged job would
            # say 3 and 4.  While this window's interval holds what was advised before, or misses it by one
            # count, that advice stands and the range takes it in.  The interval covers sampling, not the job's
            # drift between looks (a share that moved 0.60 -> 0.66 in two minutes on a busy box), and at 2 or 3
            # workers one count is x1.5; a move of more than one count is the data moving, and the advice follows.
            point, needed = needed, before
            own_range, one_off = f"{low}–{high}", not low <= before <= high
            low, high = min(low, before), max(high, before)
        chosen = needed
    workers = max(1, min(chosen, cap))
    advice = WorkerAdvice(workers, needed, low, high, cap, bound, "", point)
    result = advice.range_text().removeprefix("≈ ") + ("" if chosen <= cap else f", more than the cap, so {cap}")
    if point is not None:
        result += (
            f"; this window's point alone gives {point} ({own_range}), and {needed}, advised before for this job,"
            f" is {'one count from' if one_off else 'inside'} the interval"
        )
    prep = "f" if current == 0 else f"{current}"
    arithmetic = (
        f"# workers needed ≈ prep ÷ step × {LOADER_MARGIN:g} = {prep} ÷ (1 − f) × {LOADER_MARGIN:g} → {result}, "
        f"f = {source} (prep and step as shares of a {'step' if current == 0 else 'batch'} cycle)\n"
        f"# cap: {cap_why} ({bound_why}); `gputop bench` measures prep, step and CPU per worker"
    )
    return dataclasses.replace(advice, arithmetic=arithmetic)


def loader_code(kwargs: Mapping[str, object]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"DataLoader(dataset, batch_size=..., {args})"
