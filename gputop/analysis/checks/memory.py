"""GPU memory pressure (OOM / fragmentation)."""

from __future__ import annotations

from gputop.analysis.observations import Context, GpuObs
from gputop.analysis.thresholds import MEMORY_NEARLY_FULL
from gputop.model import LABEL_CODE, Finding
from gputop.units import gib


def check_memory_pressure(ctx: Context) -> list[Finding]:
    full: list[tuple[GpuObs, float]] = []
    for o in ctx.gpus.values():
        if not o.memory_total:
            continue
        fracs = [m / o.memory_total for m in o.memory if m is not None]
        if len(fracs) >= 2 and sum(f >= MEMORY_NEARLY_FULL for f in fracs) >= len(fracs) / 2:
            full.append((o, max(fracs)))
    if not full:
        return []
    return [
        Finding(
            id="memory_pressure",
            title="GPU memory nearly full (OOM / fragmentation risk)",
            severity="warning",
            confidence=0.7,
            label=LABEL_CODE,
            summary=f"GPU memory nearly full: {', '.join(f'GPU {o.index} {100 * f:.0f}%' for o, f in full[:4])}",
            evidence=tuple(
                f"GPU {o.index}: up to {gib(max(m for m in o.memory if m is not None))} of {gib(o.memory_total)}"
                for o, _f in full
            ),
            fix=(
                "reduce fragmentation, or fix input shapes\n"
                "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True   # or max_split_size_mb:128\n"
                "torch.backends.cudnn.benchmark = False  # with dynamic shapes; pad/bucket inputs to fixed sizes"
            ),
            gpus=tuple(o.index for o, _f in full),
        )
    ]
