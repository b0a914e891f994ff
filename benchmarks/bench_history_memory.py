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

Measured on h100-sxm-8 (8 GPUs x 18 NVLinks), a 2-core host, Python 3.11.7, capacity 600, 2026-12-01:

    layout                                               bytes/snapshot   600 snapshots   NVLink part
    before: 144 NvLinkLink objects a snapshot                   25,968        14.8 MiB        19,920
    NvLinks: rates in one array('d') a GPU, wiring shared        9,327         5.3 MiB         3,332
    and every reading equal to the previous sample's shared      7,699         4.4 MiB         3,332

Before, NVLink was 19,920 of the 25,968 bytes: an 80-byte object and two boxed floats a link and sample (the
rates move every sample under load, so sharing a link's unchanged reading never happened).  Now it is one
array of 2 x 18 doubles and a 48-byte object a GPU; the rest of each GPU sample (its object, the boxed
readings that move, the PcieLink and its rates) is the larger part, ~3.5 KB a snapshot.  The host sample
grows with the core count (a boxed float a core: ~2 KB a snapshot on a 64-core box).

The TUI itself (headless, 160x48, polled 50 times a second, RSS after 30 polls -> history full -> after 1,
2 and 3 turn-overs, same box and run conditions): before 46.1 -> 63.3 -> 71.1, 72.1, 73.3 MiB (+27.2);
after 45.4 -> 50.1 -> 54.2, 54.5, 55.0 MiB (+9.6).  Beyond the history's own bytes the allocator's
arenas settle in the first turn-over (snapshots freed among longer-lived objects); fewer small objects a
snapshot is what shrinks that part too.

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

from gputop.backend import SimulatedMachine  # noqa: E402
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
    with Pipeline(SimulatedMachine(args.simulate, clock=clock)) as pipeline:
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
