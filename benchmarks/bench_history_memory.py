"""What a full `History` holds: bytes per snapshot, and which parts of a snapshot they go to.

    python benchmarks/bench_history_memory.py [--simulate h100-sxm-8] [--capacity 600] [--json]

Fills a `History` of `--capacity` snapshots (the TUI keeps 600: 10 minutes at 1 s) from a simulated
`Pipeline`, polled on a fake clock that steps 1 s a poll, so 10 minutes of snapshots take seconds.  Then
turns the full buffer over twice (as many polls again, twice): what is held must stop growing.

Two ways of counting, both after the pipeline's first poll (its collectors' own state is not counted):

* tracemalloc: every byte allocated while filling and still held at the end (the honest total: it
  includes any cache that grows beside the history);
* by part: a walk over the held snapshots, each object counted once however many snapshots share it,
  charged to the first part that reaches it (NVLink, the rest of a GPU sample, the host sample, the
  job trees, the snapshot itself).

Measured on h100-sxm-8 (8 GPUs x 18 NVLinks), a 2-core host, Python 3.11, capacity 600:

    layout                                   bytes/snapshot   600 snapshots
    before (144 NvLinkLink objects)                  24,760        14.2 MiB
    after (rates in an array('d'), wiring shared)     7,950         4.5 MiB

Before, NVLink was 18,100 of the 24,760 bytes (a 112-byte object plus two boxed floats per link and
sample: rates change every sample under load, so the collector's "reuse an unchanged link" rule never
fired).  After, NVLink is 2 x 18 doubles a GPU (~1.3 KB a snapshot); the rest of each GpuSample (its
object, boxed floats and ints, an empty `unavailable` dict, PcieLink) is the largest part, ~5.6 KB.
The host sample grows with the core count (a boxed float per core: ~2 KB a snapshot on a 64-core box).

Exits 1 when what is held still grows in the second turn-over (more than 64 KiB; the first one lets the
collectors' own small dicts settle, a few tens of KiB).
"""

from __future__ import annotations

import argparse
import json
import sys
import tracemalloc
from array import array
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gputop.history import History  # noqa: E402
from gputop.pipeline import Pipeline  # noqa: E402
from gputop.sim.fake_nvml import ManualClock  # noqa: E402

LEVEL_OFF_SLACK = 64 * 1024  # bytes the full buffer may still gain over `capacity` more polls (allocator noise)


def _is_singleton(obj: Any) -> bool:
    return obj is None or isinstance(obj, bool) or (type(obj) is int and -5 <= obj <= 256)


def _children(obj: Any) -> list[Any]:
    if isinstance(obj, (str, bytes, float, int, array)):
        return []
    if isinstance(obj, (tuple, list, set, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        return [*obj.keys(), *obj.values()]
    slots = [name for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())]
    return [getattr(obj, name) for name in slots if hasattr(obj, name)]


def deep_size(obj: Any, seen: set[int]) -> int:
    """Bytes of `obj` and everything it reaches that is not in `seen` (which it adds to)."""
    total = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if _is_singleton(item) or id(item) in seen:
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        stack.extend(_children(item))
    return total


def by_part(history: History) -> dict[str, int]:
    """Bytes the held snapshots take, per part (each object counted once, for the first part reaching it)."""
    seen: set[int] = set()
    parts: dict[str, int] = defaultdict(int)
    for snap in history:
        for gpu in snap.gpus:
            # the NVLink part first: the stored form, whatever its attribute names
            for name in ("nvlink_wiring", "nvlink_rates", "nvlink"):
                if name in getattr(type(gpu), "__slots__", ()):
                    parts["gpu: NVLink"] += deep_size(getattr(gpu, name), seen)
            parts["gpu: the rest"] += deep_size(gpu, seen)
        parts["host"] += deep_size(snap.host, seen)
        parts["job trees"] += deep_size((snap.job, snap.jobs), seen)
        parts["snapshot shell"] += deep_size(snap, seen)
    return dict(parts)


def poll_into(pipeline: Pipeline, clock: ManualClock, history: History, count: int) -> None:
    for _ in range(count):
        clock.advance(1.0)  # time that moves only when told: 10 minutes of polls in seconds, the same every run
        history.append(pipeline.poll())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", default="h100-sxm-8", help="simulated machine (default h100-sxm-8)")
    parser.add_argument("--capacity", type=int, default=600, help="snapshots the history keeps (default 600)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)

    clock = ManualClock(1_000_000.0)
    with Pipeline(simulate=args.simulate, clock=clock) as pipeline:
        history = History(pipeline.machine, capacity=args.capacity)
        poll_into(pipeline, clock, history, 1)  # the collectors' first-poll state is not the history's
        tracemalloc.start()
        start = tracemalloc.take_snapshot()
        poll_into(pipeline, clock, history, args.capacity - 1)
        full = tracemalloc.take_snapshot()
        poll_into(pipeline, clock, history, args.capacity)  # one turn-over: collectors' dicts and caches settle
        turned = tracemalloc.take_snapshot()
        poll_into(pipeline, clock, history, args.capacity)  # another: what is held must not grow now
        later = tracemalloc.take_snapshot()
        tracemalloc.stop()

    filled = sum(s.size_diff for s in full.compare_to(start, "filename"))
    first_turn = sum(s.size_diff for s in turned.compare_to(full, "filename"))
    after_full = sum(s.size_diff for s in later.compare_to(turned, "filename"))
    parts = by_part(history)
    walked = sum(parts.values())
    top = later.compare_to(start, "lineno")[:8]
    figures = {
        "simulate": args.simulate,
        "capacity": args.capacity,
        "tracemalloc_bytes_per_snapshot": filled / (args.capacity - 1),
        "tracemalloc_total_bytes": filled,
        "growth_first_turnover_bytes": first_turn,
        "growth_second_turnover_bytes": after_full,
        "walked_bytes_per_snapshot": walked / len(history),
        "parts_bytes_per_snapshot": {k: v / len(history) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
    }
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        mib = 1024 * 1024
        print(f"{args.simulate}, a History of {args.capacity} snapshots")
        print(
            f"tracemalloc: {figures['tracemalloc_bytes_per_snapshot']:,.0f} bytes/snapshot, "
            f"{filled / mib:.1f} MiB to fill; then {first_turn / 1024:+,.0f} KiB and {after_full / 1024:+,.0f} KiB "
            f"over two turn-overs of {args.capacity} more polls"
        )
        print(f"walked: {figures['walked_bytes_per_snapshot']:,.0f} bytes/snapshot, by part:")
        for name, size in figures["parts_bytes_per_snapshot"].items():
            print(f"  {name:<16} {size:>9,.0f}  ({100 * size / figures['walked_bytes_per_snapshot']:.0f}%)")
        print("largest allocation sites still held (tracemalloc):")
        for stat in top:
            frame = stat.traceback[0]
            print(f"  {stat.size_diff / 1024:>9,.0f} KiB  {Path(frame.filename).name}:{frame.lineno}")
    return 0 if after_full <= LEVEL_OFF_SLACK else 1


if __name__ == "__main__":
    sys.exit(main())
