"""Loader advice: how many workers, and the arithmetic behind the number."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from gputop.analysis.loader_math import MARGIN as LOADER_MARGIN
from gputop.analysis.loader_math import workers_needed
from gputop.analysis.numbers import pct
from gputop.analysis.observations import Context, RankObs

STACKS_HINT = "attach with `gputop --pid PID` (or `gputop report --pid PID`) to see the stacks"


def suggested_workers(
    ctx: Context, ranks: Sequence[RankObs], input_fraction: float, gpu_mean: Optional[float]
) -> tuple[int, str]:
    """Workers per rank from the loader arithmetic, and that arithmetic as one line.

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
    arithmetic = (
        f"# workers needed ≈ prep ÷ step × {LOADER_MARGIN:g} = {prep:.2f} ÷ {step:.2f} × {LOADER_MARGIN:g}"
        f" → {needed} (prep and step as shares of a {'step' if current == 0 else 'batch'} cycle,"
        f" from {source})\n"
        f"# cap: if the workers are CPU-bound, {max(1, len(ctx.ranks))} rank(s) × num_workers must fit the"
        f" {ctx.cores()} cores; `gputop bench` measures prep, step and CPU per worker"
    )
    return needed, arithmetic


def loader_code(kwargs: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return f"DataLoader(dataset, batch_size=..., {args})"
