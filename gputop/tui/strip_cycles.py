"""Keep Textual's strips free of reference cycles, so that refcounting frees each frame's lines.

Textual 8.2's `Strip.divide` caches its result in the strip itself, and when the one cut is the strip's
end the result is `[self]`; `Strip.crop_extend(0, len)` caches `self` the same way.  The compositor
divides every line it paints at the widgets' edges (`Compositor._render_chops`), so each changed line of a
full-width widget became a cycle (the strip, its seven caches, its segments) that only the cyclic garbage
collector could free.  Measured in the TUI (8 simulated GPUs, 120x40): ~3,300 cyclic objects every 13 s,
half of what triggered the youngest generation's collections, and a middle-generation collection of 62,000
objects (90 ms) every two minutes; perf put the collector at ~7% of the monitor's CPU.

`install()` makes those two trivial answers uncached: they cost nothing to compute again.  It checks that
Textual still answers them with the strip itself first, and leaves Textual alone if not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip

_installed = False


def _probe_ok() -> bool:
    """Textual answers the two trivial cases with the strip itself (what the patch returns without caching)."""
    try:
        strip = Strip([Segment("ab"), Segment("cd")])
        whole = strip.divide([4])
        return len(whole) == 1 and whole[0] is strip and strip.crop_extend(0, 4, None) is strip
    except Exception:
        return False


def install() -> bool:
    """Patch once; True when strips no longer cache themselves."""
    global _installed
    if _installed:
        return True
    if not _probe_ok():
        return False
    divide, crop_extend = Strip.divide, Strip.crop_extend

    def divide_without_cycle(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
        cuts = [cut for cut in cuts if cut <= self.cell_length]  # as Textual filters them
        if cuts == [self.cell_length]:
            return [self]  # the whole strip: not kept in its own cache
        return divide(self, cuts)

    def crop_extend_without_cycle(self: Strip, start: int, end: int, style: Optional[Style]) -> Strip:
        if start == 0 and end == self.cell_length:
            return self
        return crop_extend(self, start, end, style)

    Strip.divide = divide_without_cycle  # type: ignore[method-assign]  # the patch this module is
    Strip.crop_extend = crop_extend_without_cycle  # type: ignore[method-assign]
    _installed = True
    return True
