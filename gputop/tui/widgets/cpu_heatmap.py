"""CPU core heatmap: one cell per core, grouped by NUMA node, with memory, swap and iowait beside it.

One widget renders every core (not a widget per core).  A cell's height (▁..█)
tells the load without colour; colour repeats it; cores that run the attached
job's ranks or DataLoader workers are underlined.  Memory, swap, iowait and load
share the section's title bar, so 128 cores take three rows at 120 columns.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Optional

from rich.style import Style
from textual.strip import Strip

from gputop import units
from gputop.model import HostSample
from gputop.tui import look
from gputop.tui.canvas import LineBuilder, LineCanvas

BARS_FROM = 100  # narrower terminals get numbers without the small memory/swap bars
MINI_BAR = 10


class CpuHeatmap(LineCanvas):
    DEFAULT_CSS = """
    CpuHeatmap { height: auto; }
    """

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.host: Optional[HostSample] = None
        self.job_cores: frozenset[int] = frozenset()
        self._marked_styles: dict[Style, Style] = {}
        self._groups_key: object = None
        self._groups: "Optional[OrderedDict[int, list[int]]]" = None

    def update_data(self, host: Optional[HostSample], job_cores: frozenset[int]) -> None:
        old = self.host
        if old is None or host is None or len(host.cpu_percent) != len(old.cpu_percent):
            self.refresh(layout=True)
        self.host = host
        self.job_cores = job_cores
        self.redraw()

    # ------------------------------------------------------------------ geometry
    def _numa_groups(self) -> "OrderedDict[int, list[int]]":
        host = self.host
        key = None if host is None else (len(host.cpu_percent), host.core_numa)
        if key == self._groups_key and self._groups is not None:
            return self._groups  # the layout only changes when cores come or go
        groups: "OrderedDict[int, list[int]]" = OrderedDict()
        self._groups_key, self._groups = key, groups
        if host is None:
            return groups
        numa = host.core_numa if len(host.core_numa) == len(host.cpu_percent) else (0,) * len(host.cpu_percent)
        for core, node in sorted(enumerate(numa), key=lambda item: (item[1], item[0])):
            groups.setdefault(node, []).append(core)
        return groups

    def _layout(self, width: int) -> tuple[int, int, bool]:
        """(cells per row, rows per node, nodes side by side)."""
        groups = self._numa_groups()
        if not groups:
            return 1, 0, True
        largest = max(len(cores) for cores in groups.values())
        side_room = (width - 2 * (len(groups) - 1)) // len(groups) - 3
        if side_room >= 8:
            per_row = min(largest, side_room)
            rows = math.ceil(largest / per_row)
            per_row = math.ceil(largest / rows)  # even rows: 64 cores in 2 rows of 32, not 56 + 8
            return per_row, rows, True
        per_row = max(1, min(largest, width - 3))
        return per_row, math.ceil(largest / per_row), False

    def wanted_height(self, width: int) -> int:
        if self.host is None:
            return 1
        per_row, rows, side = self._layout(width)
        if side:
            return 1 + rows
        return 1 + sum(math.ceil(len(c) / per_row) for c in self._numa_groups().values())

    # ------------------------------------------------------------------ drawing
    def _cell(self, line: LineBuilder, percent: float, marked: bool) -> None:
        style = look.load_style(percent)
        if marked:
            marked_style = self._marked_styles.get(style)
            if marked_style is None:
                marked_style = self._marked_styles[style] = style + look.JOB_CORE
            style = marked_style
        line.add(look.level_char(percent) if percent > 0 else "_", style)

    def build(self, width: int, height: int) -> list[Strip]:
        host = self.host
        if host is None:
            return [LineBuilder().add(" CPU: waiting for the first sample…", look.DIM).section(width)]
        groups = self._numa_groups()
        per_row, rows, side = self._layout(width)
        title = self._title(host, width)
        lines = [title.section(width)]
        percents = host.cpu_percent
        job = self.job_cores
        label = len(groups) > 1
        if side:
            for r in range(rows):
                line = LineBuilder()
                for n, (node, cores) in enumerate(groups.items()):
                    if n:
                        line.add("  ")
                    line.add(f"N{node} " if r == 0 and label else "   ", look.LABEL)
                    chunk = cores[r * per_row : (r + 1) * per_row]
                    for core in chunk:
                        self._cell(line, percents[core], core in job)
                    line.pad(line.length + per_row - len(chunk))
                lines.append(line.strip(width))
        else:
            for node, cores in groups.items():
                for r in range(math.ceil(len(cores) / per_row)):
                    line = LineBuilder().add(f"N{node} " if r == 0 and label else "   ", look.LABEL)
                    for core in cores[r * per_row : (r + 1) * per_row]:
                        self._cell(line, percents[core], core in job)
                    lines.append(line.strip(width))
        return lines

    def _title(self, host: HostSample, width: int) -> LineBuilder:
        avg = sum(host.cpu_percent) / len(host.cpu_percent) if host.cpu_percent else 0.0
        line = LineBuilder()
        line.add(f" CPU {len(host.cpu_percent)} cores", look.BOLD).add(f" avg {avg:.0f}%", look.load_style(avg))
        bars = width >= BARS_FROM
        for label, used, total in (("MEM", host.memory_used, host.memory_total), ("SWP", host.swap_used, host.swap_total)):
            line.add(f"  {label} ", look.LABEL)
            if not total:
                line.add("none", look.DIM)
                continue
            fraction = used / total
            style = look.BAD if fraction >= 0.9 else look.WARN if label == "SWP" and fraction > 0.2 else look.ACCENT
            if bars:
                filled, empty = look.bar(fraction, MINI_BAR)
                line.add(filled, style).add(empty, look.BAR_EMPTY).add(" ")
            line.add(units.gib_pair(used, total), style if style is not look.ACCENT else look.PLAIN)
        iow = host.iowait_percent
        line.add("  IOW ", look.LABEL)
        line.add("n/a" if iow is None else f"{iow:.1f}%", look.DIM if iow is None else look.WARN if iow >= 10 else look.PLAIN)
        line.add("  load ", look.LABEL).add(f"{host.load_average[0]:.1f}")
        if host.steal_percent and host.steal_percent >= 1:
            line.add("  steal ", look.LABEL).add(
                f"{host.steal_percent:.0f}%", look.WARN if host.steal_percent >= 5 else look.PLAIN
            )
        if self.job_cores and line.length + 18 <= width:
            line.right("▁ underlined = job", width - 1, look.LABEL)
        return line
