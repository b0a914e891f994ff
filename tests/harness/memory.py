"""Memory tests: heap growth measured in blocks, so a leak shows and one-off noise does not."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Callable, Optional


def heap_growth_per_block(
    step: Callable[[], object],
    *,
    warmup: int,
    blocks: int = 3,
    per_block: int = 100,
    settle: Optional[Callable[[], object]] = None,
) -> list[int]:
    """Call `step` `warmup` times, then `blocks` blocks of `per_block` times; the traced heap's growth in
    bytes over each block.  A leak grows the heap in every block; noise (a dict resizing once, what is in
    flight at the moment of the snapshot) does not, so memory tests assert on the smallest block.
    `settle` runs before each snapshot (e.g. wait for reads in flight)."""

    def snapshot() -> tracemalloc.Snapshot:
        if settle is not None:
            settle()
        gc.collect()
        return tracemalloc.take_snapshot()

    tracemalloc.start()  # before the warm-up, so replaced objects count as freed, not as growth
    try:
        for _ in range(warmup):
            step()
        snapshots = [snapshot()]
        for _ in range(blocks):
            for _ in range(per_block):
                step()
            snapshots.append(snapshot())
    finally:
        tracemalloc.stop()
    return [
        sum(stat.size_diff for stat in after.compare_to(before, "filename")) for before, after in zip(snapshots, snapshots[1:])
    ]
