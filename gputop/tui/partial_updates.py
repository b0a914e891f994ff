"""Make Textual write only the changed cells of a partial update, not the line up to them.

Textual 8.2's `ChopsUpdate.render_segments` crops each changed span *from the left edge of
the widget* to the span's end, so a one-digit change at column 100 of a full-width widget
rewrites 100 cells, and a line with four changes rewrites its start four times.  For a
monitor that updates numbers all over a wide screen every second over SSH, that is most
of what it sends (measured: 2.6 KB/s -> see benchmarks/bench_tui.py for the figure after).

`install()` replaces that method with one that crops each span to [x1, x2).  It checks the
replacement against Textual's own output on a probe first (the same cells must reach the
terminal), and leaves Textual alone if its internals are not what this was written for.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.color import ColorSystem
from rich.console import Console
from rich.segment import Segment
from textual.strip import Strip

if TYPE_CHECKING:
    from textual._compositor import ChopsUpdate

_installed = False


def _render_segments(self: ChopsUpdate, console: Console) -> str:
    # Renders each span's cells straight from the chop's segments: no cropped Strip objects
    # (each Strip allocates seven caches) and no rich Control objects for the cursor moves; the
    # output is byte-for-byte what cropping the strips and rendering them would give.  A line
    # often has several spans in one chop (a full-width widget): the chop's segment offsets are
    # measured once and each span starts at its first segment (bisect), not at the line's start.
    sequences: list[str] = []
    append = sequences.append
    render_style = Strip.render_style
    color_system = console._color_system or ColorSystem.TRUECOLOR
    chops = self.chops
    chop_ends = self.chop_ends
    last_y = self.spans[-1][0]
    # id(strip) -> (strip, segments, offsets from the strip's own start): relative, because one Strip object
    # can sit at several x in a frame (Strip.blank is cached: two widgets' equal blank lines are one object)
    measured: dict[int, tuple[Strip, list[Segment], list[int]]] = {}
    for y, x1, x2 in self.spans:
        line = chops[y]
        ends = chop_ends[y]
        for end, (x, strip) in zip(ends, line.items()):
            if strip is None or x >= x2 or end <= x1:
                continue
            start, stop = max(x, x1), min(end, x2)
            append(f"\x1b[{y + 1};{start + 1}H")
            strip_end = x + strip.cell_length
            whole_tail = stop >= strip_end  # like Strip.crop: to the end means every remaining segment
            stop = min(stop, strip_end)
            entry = measured.get(id(strip))
            if entry is None or entry[0] is not strip:
                segments = list(strip)
                offsets = [0]  # offsets[i]: where segment i starts in the strip; offsets[i + 1]: where it ends
                for text, _style, _control in segments:
                    offsets.append(offsets[-1] + cell_len(text))
                entry = measured[id(strip)] = (strip, segments, offsets)
            _strip, segments, offsets = entry
            first = bisect_right(offsets, start - x, 1) - 1  # the first segment that ends after `start`
            for i in range(first, len(segments)):
                segment = segments[i]
                pos, seg_end = x + offsets[i], x + offsets[i + 1]
                text, style, _ = segment
                if pos < start or seg_end > stop:
                    if pos < start:
                        segment = segment.split_cells(start - pos)[1]
                        pos = start
                    if seg_end > stop:
                        segment = segment.split_cells(stop - pos)[0]
                    text, style = segment.text, segment.style
                append(text if style is None else render_style(style, text, color_system))
                if seg_end >= stop and not whole_tail:
                    break
        if y != last_y:
            append("\n")
    return "".join(sequences)


def _screen_after(updates: str, width: int) -> str:
    """Apply a one-line update string (cursor moves + plain text) to a blank line; return the line."""
    import re

    cells = [" "] * width
    for match in re.finditer(r"\x1b\[(\d+);(\d+)H([^\x1b\n]*)", updates):
        col = int(match.group(2)) - 1
        for ch in match.group(3):
            cells[col] = ch
            col += 1
    return "".join(cells)


def _probe_ok(chops_update_cls: type[ChopsUpdate]) -> bool:
    """The fixed method puts the same characters in the changed cells as Textual's own."""
    strip = Strip([Segment("aaaaa"), Segment("bbbbb"), Segment("ccccc"), Segment("ddddd")])
    spans = [(0, 11, 13), (0, 16, 18)]
    console = Console(color_system=None, width=40)
    try:
        theirs = chops_update_cls([{0: strip}], spans, [[20]]).render_segments(console)
        ours = _render_segments(chops_update_cls([{0: strip}], spans, [[20]]), console)
    except Exception:
        return False
    screen_theirs, screen_ours = _screen_after(theirs, 20), _screen_after(ours, 20)
    changed = [x for _, x1, x2 in spans for x in range(x1, x2)]
    return all(screen_theirs[x] == screen_ours[x] for x in changed) and len(ours) < len(theirs)


def install() -> bool:
    """Patch once; True when the fixed method is in use."""
    global _installed
    if _installed:
        return True
    try:
        from textual._compositor import ChopsUpdate
    except ImportError:  # pragma: no cover - Textual moved it
        return False
    if not hasattr(ChopsUpdate, "render_segments") or not _probe_ok(ChopsUpdate):
        return False
    ChopsUpdate.render_segments = _render_segments  # type: ignore[method-assign]  # the patch this module is
    _installed = True
    return True
