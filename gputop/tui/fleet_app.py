"""`gputop fleet`: one job across nodes, live, from what every node's `gputop serve` exported to Prometheus.

The local monitor's screen is one machine's (GPU indices clash across nodes, a CPU heatmap means nothing
for a fleet), so this is a screen of its own in the same look: a header, the verdict across nodes and
the other outliers under it (each with its node and rank), a status line for Prometheus, then the nodes
outliers first (from 64 nodes their rows and a heat strip of every node × GPU), the ranks outliers first,
`/`'s filter, and each node's findings; the key bar at the bottom.  What it shows is `gputop.fleet.view`'s (the same view and verdict as
`gputop report --prometheus`), read on a thread of its own (`gputop.fleet.live.FleetPoller`).
"""

from __future__ import annotations

import io
import os
import re
import sys
import textwrap
import time
from pathlib import Path
from statistics import fmean
from typing import Callable, Optional, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.strip import Strip
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from gputop.errors import GputopError
from gputop.fleet.live import FleetPoller, FleetRound
from gputop.fleet.prometheus import Query
from gputop.fleet.view import (
    STALLED_AFTER_S,
    STRAGGLER_MIN_SHARE,
    FleetNode,
    FleetRank,
    FleetVerdict,
    FleetView,
    grouped_findings,
    nodes_outliers_first,
    outliers,
    rank_ranges,
    ranks_outliers_first,
)
from gputop.tui import look, strip_cycles
from gputop.tui.canvas import LineBuilder, LineCanvas
from gputop.tui.look import key_display
from gputop.tui.modal import _Modal
from gputop.tui.screens import HelpScreen
from gputop.tui.widgets.status import KeyBar

strip_cycles.install()  # a view left open for hours: its lines freed by refcounting (see strip_cycles.py)


# verdict kind -> (symbol, style): the symbol says it without colour too
VERDICT_LOOK = {
    "hung": ("✖", look.BAD_BOLD),
    "straggler": ("▲", look.WARN_BOLD),
    "infrastructure": ("✖", look.BAD_BOLD),
    "healthy": ("●", look.GOOD_BOLD),
    "unknown": ("…", look.DIM),
    "stopped_reporting": ("?", look.WARN_BOLD),
}
STATE_STYLE = {
    "compute": look.GOOD,
    "optimizer": look.GOOD,
    "collective": look.ACCENT,
    "sync": look.ACCENT,
    "data_wait": look.WARN_BOLD,
    "in_dataset": look.WARN_BOLD,
    "idle": look.DIM,
    "hung": look.BAD_BOLD,
}
WAIT_BAR_CELLS = 8
VERDICT_LINES = 2  # the verdict wraps to this many lines at most
OUTLIER_LINES = 5  # the outliers beyond the verdict, a line each, at most (then "+N more")
HEAT_FROM_NODES = 64  # from this many nodes, a heat strip of nodes × GPUs instead of a row per node
HEAT_ROWS_FIRST = 8  # ... under the rows of at most this many outlier nodes
RANK_ROWS = 12  # the ranks shown unfiltered: the outliers', then the most stalled or waiting
FILTERED_ROWS = 256  # the most rows a filter shows
FINDING_GROUPED_FROM = 4  # the same finding on this many nodes is one line


# ------------------------------------------------------------------ what the screen says (pure)
def time_of_day(at: float) -> str:
    """Prometheus's evaluation time, in UTC as Prometheus's own UI shows it."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


def counted(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def gpu_cells(node: FleetNode) -> Text:
    """One cell per GPU: its utilization level (▁..█, '·' unknown), or ✖/▲ where its health is critical/warning."""
    text = Text()
    for gpu in node.gpus:
        health = node.gpu_health.get(gpu, 0)
        if health >= 2:
            text.append("✖", style=look.BAD_BOLD)
        elif health == 1:
            text.append("▲", style=look.WARN_BOLD)
        else:
            percent = node.utilization.get(gpu)
            text.append(look.level_char(percent), style=look.SPARK if percent is not None else look.DIM)
    return text or Text("-", style=look.DIM)


def utilization_style(percent: Optional[float]) -> Style:
    """As the monitor's GPU states: busy (at least BUSY_AT), low, idle (below IDLE_BELOW), unknown."""
    if percent is None or percent < look.IDLE_BELOW:
        return look.DIM
    return look.GOOD_BOLD if percent >= look.BUSY_AT else look.ACCENT_BOLD


def node_health(node: FleetNode) -> Text:
    unwell = [(g, h) for g, h in sorted(node.gpu_health.items()) if h]
    if not unwell:
        return Text("ok", style=look.GOOD) if node.gpu_health else Text("-", style=look.DIM)
    text = Text()
    for i, (gpu, health) in enumerate(unwell):
        word, style = ("critical", look.BAD_BOLD) if health >= 2 else ("warning", look.WARN_BOLD)
        text.append(("" if i == 0 else " ") + f"GPU{gpu}:").append(word, style=style)
    return text


def nodes_table(view: FleetView, nodes: Optional[Sequence[FleetNode]] = None) -> Table:
    """A row per node (`nodes`, in their order; default every node of the view, outliers first)."""
    table = Table(box=None, padding=(0, 1, 0, 0), expand=False, header_style="bold", show_edge=False)
    for column in ("node", "place", "GPUs", "util", "health", "ranks", "its own verdict"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    ranks_of: dict[str, list[int]] = {}
    for r in view.ranks:
        ranks_of.setdefault(r.node, []).append(r.rank)
    for node in nodes_outliers_first(view, outliers(view)) if nodes is None else nodes:
        place = "-" if node.node_rank is None else f"{node.node_rank}" + (f"/{view.nnodes}" if view.nnodes else "")
        if not node.reporting:
            ago = "" if node.last_seen is None else f" {max(0.0, view.at - node.last_seen):.0f} s ago"
            table.add_row(
                Text(node.hostname, style=look.BOLD),
                place,
                Text("?", style=look.WARN_BOLD),
                "",
                "",
                "",
                Text(f"not reporting: last scraped{ago}", style=look.WARN_BOLD),
            )
            continue
        utils = list(node.utilization.values())
        mean = fmean(utils) if utils else None
        place = "-" if node.node_rank is None else f"{node.node_rank}" + (f"/{view.nnodes}" if view.nnodes else "")
        table.add_row(
            Text(node.hostname, style=look.BOLD),
            place,
            gpu_cells(node),
            Text("n/a" if mean is None else f"{mean:.0f}%", style=utilization_style(mean)),
            node_health(node),
            rank_ranges(ranks_of.get(node.hostname, [])),
            Text(node.verdict or "-", style=look.DIM if not node.verdict or node.verdict == "healthy" else look.WARN),
        )
    return table


def _wait_cell(rank: FleetRank) -> Text:
    ratio = rank.data_wait_ratio
    filled, empty = look.bar(ratio, WAIT_BAR_CELLS)
    style = look.WARN_BOLD if ratio is not None and ratio >= STRAGGLER_MIN_SHARE else look.ACCENT
    text = Text(filled, style=style).append(empty, style=look.BAR_EMPTY)
    return text.append(" " + ("  n/a" if ratio is None else f"{ratio:4.0%}"), style=style if ratio is not None else look.DIM)


def _progress_cell(view: FleetView, rank: FleetRank) -> Text:
    if rank.last_progress is None:
        return Text("-", style=look.DIM)
    age = max(0.0, view.at - rank.last_progress)
    return Text(f"{age:.0f} s ago", style=look.BAD_BOLD if age > STALLED_AFTER_S else look.PLAIN)


def ranks_table(view: FleetView, verdict: FleetVerdict, ranks: Optional[Sequence[FleetRank]] = None) -> Table:
    """The ranks (default every rank, outliers first) with their node; each rank an outlier names carries
    its symbol (▲ straggler, ✖ hung)."""
    table = Table(box=None, padding=(0, 1, 0, 0), expand=False, header_style="bold", show_edge=False)
    table.add_column("rank", no_wrap=True, justify="right")
    for column in ("node", "local", "GPU", "state", "data wait", "progress"):
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    found = outliers(view)
    named = {(v.node, v.rank): v.kind for v in reversed(found) if v.rank is not None}
    if verdict.rank is not None:
        named.setdefault((verdict.node, verdict.rank), verdict.kind)
    for rank in ranks_outliers_first(view, found) if ranks is None else ranks:
        kind = named.get((rank.node, rank.rank))
        symbol, culprit_style = VERDICT_LOOK.get(kind or "", ("", look.PLAIN))
        table.add_row(
            Text(f"{symbol} {rank.rank}", style=culprit_style) if kind else Text(str(rank.rank), style=look.BOLD),
            Text(rank.node, style=culprit_style if kind else look.PLAIN),
            "-" if rank.local_rank is None else str(rank.local_rank),
            ",".join(str(g) for g in rank.gpus) or "-",
            Text(rank.state or "-", style=STATE_STYLE.get(rank.state or "", look.DIM)),
            _wait_cell(rank),
            _progress_cell(view, rank),
        )
    return table


def findings_text(view: FleetView) -> Text:
    """Each node's findings (GPU health rules, degraded links, NICs, the job's findings there), a line each."""
    if not view.findings:
        return Text("none: no node reports a GPU, link or NIC problem, nor a finding of its own", style=look.DIM)
    text = Text()
    lines = []
    for finding, nodes in grouped_findings(view.findings):
        if len(nodes) >= FINDING_GROUPED_FROM:
            lines.append((finding, f"{len(nodes)} nodes ({', '.join(nodes[:3])} …)"))
        else:
            lines += [(finding, node) for node in nodes]
    for i, (finding, who) in enumerate(lines):
        where = f" {finding.part}" if finding.part else ""
        symbol, style = {"critical": ("✖", look.BAD_BOLD), "warning": ("▲", look.WARN_BOLD)}.get(
            finding.severity, ("●", look.ACCENT)
        )
        text.append(("\n" if i else "") + f"{symbol} ", style=style)
        text.append(who, style=look.BOLD).append(f"{where}: ")
        text.append(finding.kind, style=style).append(f" ({finding.severity}, {finding.label or 'finding'})", style=look.DIM)
    return text


def jobs_text(view: FleetView, auto: bool) -> Text:
    """The jobs Prometheus knows, with their ranks; which one is followed and why."""
    text = Text("Jobs in Prometheus: ", style=look.LABEL)
    for i, (job, ranks) in enumerate(view.job_sizes or ((view.job, len(view.ranks)),)):
        followed = job == view.job
        text.append(("" if i == 0 else " · ") + job, style=look.BOLD if followed else look.PLAIN)
        text.append(f" ({counted(ranks, 'rank')}" + (", followed" if followed else "") + ")", style=look.DIM)
    if auto and len(view.job_sizes) > 1:
        text.append(" · followed: the most ranks", style=look.DIM)
    if len(view.job_sizes) > 1:
        text.append(" · j picks another", style=look.DIM)
    return text


class HeatStrip:
    """Every node as a block of one cell per GPU, as many blocks a line as the width holds, in the job's node
    order, each line led by its first node's name.  A cell: ▁..█ its utilization (_ idle); ▲ its rank waits for its
    data (straggler share); ✖ its rank is named hung or its GPU's health is critical (▲ warning); the cells
    of a rank that stopped making progress in red; a node with a critical finding (a NIC down) in red; ?
    a node that stopped reporting."""

    def __init__(self, view: FleetView) -> None:
        self.view = view
        self.gpus = max((len(n.gpus) for n in view.nodes), default=1) or 1
        self.by_gpu: dict[tuple[str, int], FleetRank] = {(r.node, g): r for r in view.ranks for g in r.gpus}
        self.hung = {(v.node, v.rank) for v in outliers(view) if v.kind == "hung"}
        self.critical = {f.node for f in view.findings if f.severity == "critical"}
        self.label = max((len(n.hostname) for n in view.nodes), default=4)

    def block(self, node: FleetNode) -> Text:
        if not node.reporting:
            return Text("?" * self.gpus, style=look.WARN_BOLD)
        text = Text()
        node_style = look.BAD if node.hostname in self.critical else None
        for gpu in node.gpus or range(self.gpus):
            rank = self.by_gpu.get((node.hostname, gpu))
            health = node.gpu_health.get(gpu, 0)
            percent = node.utilization.get(gpu)
            if health >= 2 or (rank is not None and (rank.node, rank.rank) in self.hung):
                text.append("✖", style=look.BAD_BOLD)
            elif rank is not None and (rank.data_wait_ratio or 0.0) >= STRAGGLER_MIN_SHARE:
                text.append("▲", style=look.WARN_BOLD)
            elif health == 1:
                text.append("▲", style=look.WARN)
            else:
                stalled = (
                    rank is not None and rank.last_progress is not None and self.view.at - rank.last_progress > STALLED_AFTER_S
                )
                style = look.BAD if stalled else node_style or utilization_style(percent)
                char = look.level_char(percent)
                text.append("_" if char == " " else char, style=style)  # an idle GPU still shows its cell
        return text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        per_line = max(1, (options.max_width - self.label - 1) // (self.gpus + 1))
        nodes = self.view.nodes
        for start in range(0, len(nodes), per_line):
            line = Text(f"{nodes[start].hostname:>{self.label}} ", style=look.LABEL)
            for i, node in enumerate(nodes[start : start + per_line]):
                line.append(" " if i else "").append_text(self.block(node))
            yield line
        yield Text(
            f"{counted(len(nodes), 'node')}, {per_line} a line in the job's order, a cell per GPU: ▁..█ utilization (_ idle) · "
            "▲ waits for data · ✖ hung or critical · red: stalled, or a node with a critical finding · ? not reporting",
            style=look.DIM,
        )


def matches(text: str, view: FleetView) -> tuple[list[FleetNode], list[FleetRank]]:
    """The nodes and ranks a `/` filter picks: a number is a rank; other words match a node's name, a rank's
    state, an outlier's kind (`hung`, `straggler`, `stopped`, `infrastructure`) or a finding's (`nic`);
    several words (space-separated) are alternatives."""
    words = text.lower().split()
    found = outliers(view)
    picked_nodes: set[str] = set()
    picked_ranks: set[tuple[str, int]] = set()
    for word in words:
        if word.isdigit():
            picked_ranks |= {(r.node, r.rank) for r in view.ranks if r.rank == int(word)}
            continue
        picked_nodes |= {n.hostname for n in view.nodes if word in n.hostname.lower()}
        picked_ranks |= {(r.node, r.rank) for r in view.ranks if r.state and word in r.state.lower()}
        for v in found:
            if word in v.kind and v.node is not None:
                if v.rank is None:
                    picked_nodes.add(v.node)
                else:
                    picked_ranks.add((v.node, v.rank))
        picked_nodes |= {f.node for f in view.findings if word in f.kind.lower()}
    ranks = [r for r in ranks_outliers_first(view, found) if (r.node, r.rank) in picked_ranks or r.node in picked_nodes]
    node_names = picked_nodes | {r.node for r in ranks}
    nodes = [n for n in nodes_outliers_first(view, found) if n.hostname in node_names]
    return nodes, ranks


def section(title: str) -> Text:
    return Text(f" {title} ", style=look.BOLD + look.SECTION)


# ------------------------------------------------------------------ the one-line widgets
class FleetHeader(LineCanvas):
    DEFAULT_CSS = "FleetHeader { height: 1; background: $panel; }"

    def __init__(self, url: str, interval: float, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.url = url
        self.interval = interval
        self.view: Optional[FleetView] = None
        self.stale = False  # the last round failed: what is shown is older

    def show(self, view: FleetView, stale: bool) -> None:
        self.view, self.stale = view, stale
        self.redraw()

    def wanted_height(self, width: int) -> int:
        return 1

    def build(self, width: int, height: int) -> list[Strip]:
        line = LineBuilder().add(" gputop fleet ", look.ACCENT_BOLD)
        view = self.view
        if view is not None:
            line.add(" job ", look.LABEL).add(view.job, look.BOLD)
            reporting = sum(1 for n in view.nodes if n.reporting)  # the nodes that stopped reporting are not counted
            nodes = counted(reporting, "node") + (f" of {view.nnodes}" if view.nnodes and view.nnodes != reporting else "")
            ranks = counted(len(view.ranks), "rank") + (
                f" of {view.world_size}" if view.world_size and view.world_size != len(view.ranks) else ""
            )
            line.add(f"  {nodes} · {ranks}").add("  ⟳ ", look.LABEL).add(f"{self.interval:g}s")
        tail = " STALE " if self.stale else ""
        line.add("  ", look.PLAIN).add(look.ellipsize(self.url, max(0, width - line.length - len(tail) - 2)), look.DIM)
        if tail:
            line.pad(width - len(tail)).add(tail, look.WARN_BOLD)
        return [line.strip(width)]


class FleetVerdictLine(LineCanvas):
    """The verdict across nodes, in one line (as the monitor's verdict line)."""

    DEFAULT_CSS = "FleetVerdictLine { height: auto; background: $boost; }"

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.verdict: Optional[FleetVerdict] = None

    def show(self, verdict: FleetVerdict) -> None:
        self.verdict = verdict
        self.redraw()

    def _wrapped(self, width: int) -> list[str]:
        """The verdict in at most VERDICT_LINES lines (it names the rank and node first; the rest may be cut)."""
        text = f"Verdict: {self.verdict.summary}" if self.verdict else "Verdict: reading Prometheus…"
        return textwrap.wrap(text, max(8, width - 3), max_lines=VERDICT_LINES, placeholder=" …") or [""]

    def wanted_height(self, width: int) -> int:
        return len(self._wrapped(width))

    def build(self, width: int, height: int) -> list[Strip]:
        symbol, style = VERDICT_LOOK.get(self.verdict.kind, ("…", look.DIM)) if self.verdict else ("…", look.DIM)
        lines = []
        for i, text in enumerate(self._wrapped(width)):
            line = LineBuilder().add(f" {symbol} " if i == 0 else "   ", style).add(text, style)
            lines.append(line.strip(width))
        return lines


class FleetOutliers(LineCanvas):
    """The outliers beyond the verdict, a line each (hung ranks, stragglers, nodes that stopped reporting,
    degraded nodes, each with its node and rank), so all of them show on the first screen."""

    DEFAULT_CSS = "FleetOutliers { height: auto; background: $boost; }"

    def __init__(self, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.found: tuple[FleetVerdict, ...] = ()

    def show(self, found: tuple[FleetVerdict, ...]) -> None:
        self.found = found
        self.redraw()

    def wanted_height(self, width: int) -> int:
        return min(len(self.found), OUTLIER_LINES + 1)

    def build(self, width: int, height: int) -> list[Strip]:
        lines = []
        shown = self.found if len(self.found) <= OUTLIER_LINES + 1 else self.found[:OUTLIER_LINES]
        for verdict in shown:
            symbol, style = VERDICT_LOOK.get(verdict.kind, ("●", look.ACCENT))
            line = LineBuilder().add(f" {symbol} ", style).add(look.ellipsize(verdict.summary, max(1, width - 4)), style)
            lines.append(line.strip(width))
        if len(shown) < len(self.found):
            more = f"   +{len(self.found) - len(shown)} more outliers: / filters (hung, straggler, stopped, a node, a rank)"
            lines.append(LineBuilder().add(look.ellipsize(more, width), look.DIM).strip(width))
        return lines


class FleetStatusLine(LineCanvas):
    """Where the view comes from and how fresh it is; or, while Prometheus fails, why, and that it retries."""

    DEFAULT_CSS = "FleetStatusLine { height: 1; }"

    def __init__(self, url: str, interval: float, *, id: Optional[str] = None) -> None:
        super().__init__(id=id)
        self.url = url
        self.interval = interval
        self.at: Optional[float] = None
        self.error: Optional[str] = None

    def show(self, at: Optional[float], error: Optional[str]) -> None:
        self.at, self.error = at, error
        self.redraw()

    def wanted_height(self, width: int) -> int:
        return 1

    def build(self, width: int, height: int) -> list[Strip]:
        shown = f"showing {time_of_day(self.at)}" if self.at is not None else "nothing shown yet"
        if self.error is None:
            text = f" ● Prometheus {self.url} · as of {shown.removeprefix('showing ')} · every {self.interval:g} s"
            return [LineBuilder().add(look.ellipsize(text, width), look.DIM).strip(width)]
        tail = f" · {shown} · retrying every {self.interval:g} s"
        line = LineBuilder().add(" ✖ ", look.BAD_BOLD)
        line.add(look.ellipsize(self.error, max(1, width - 3 - len(tail))), look.BAD_BOLD).add(tail, look.DIM)
        return [line.strip(width)]


# ------------------------------------------------------------------ the job picker (j)
class JobsScreen(_Modal):
    """The jobs Prometheus knows, the most ranks first; Enter follows the highlighted one."""

    BINDINGS = [Binding("escape,q,j", "app.pop_screen", "Close", id="jobs.close")]

    def __init__(self, sizes: Sequence[tuple[str, int]], followed: str, choose: Callable[[str], None]) -> None:
        super().__init__()
        self.sizes = sizes
        self.followed = followed
        self.choose = choose

    def compose(self) -> ComposeResult:
        options = [
            Option(f"{job}  ({counted(ranks, 'rank')})" + ("  · followed" if job == self.followed else ""), id=job)
            for job, ranks in self.sizes
        ]
        with VerticalScroll(classes="dialog", id="jobs"):
            yield Static(Text("Jobs in Prometheus: Enter follows one, Esc closes", style="bold"))
            yield OptionList(*options, id="job-list")

    def on_mount(self) -> None:
        self.query_one(OptionList).focus()

    def on_option_list_option_selected(self, message: OptionList.OptionSelected) -> None:
        job = message.option.id
        self.app.pop_screen()
        if job is not None:
            self.choose(job)


# ------------------------------------------------------------------ the app
class FleetRefreshed(Message):
    def __init__(self, result: FleetRound) -> None:
        super().__init__()
        self.result = result


HELP_FOOTER = Text(
    "GPUs: one cell per GPU, ▁..█ its utilization (dcgm-exporter's DCGM_FI_DEV_GPU_UTIL, else gputop serve "
    "--dcgm-fields; · not exported), ▲ warning / ✖ critical health. From 64 nodes a heat strip: a block of cells a node, "
    "▲ a rank waiting for its data, ✖ hung or critical, red stalled or a node with a critical finding, ? not reporting. "
    "Each rank an outlier names carries its symbol (▲ straggler, ✖ hung). / filters by node, rank number, state or outlier "
    "kind (straggler, stopped, nic); Esc clears. The verdict and `r`'s report are `gputop report --prometheus`'s.",
    style="dim",
)


class FleetApp(App[None]):
    """The live cross-node view over `query` (Prometheus's instant queries at `url`), starting from `first`."""

    TITLE = "gputop fleet"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #fleet-body { height: 1fr; padding: 0 1; }
    #fleet-body > Static { margin-bottom: 1; }
    #fleet-body > .section { margin-bottom: 0; }
    #filter { display: none; height: 1; border: none; padding: 0 1; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit", priority=True, id="fleet.quit"),
        Binding("ctrl+c", "quit", "Quit", priority=True, show=False, id="fleet.quit.ctrl_c"),
        Binding("question_mark,h,f1", "help", "Help", id="fleet.help"),
        Binding("r", "report", "Report", id="fleet.report"),
        Binding("j", "jobs", "Pick a job", id="fleet.jobs"),
        Binding("R", "refresh", "Read now", id="fleet.refresh"),
        Binding("slash", "filter", "Filter", id="fleet.filter"),
        Binding("escape", "clear_filter", "Clear the filter", show=False, id="fleet.filter.clear"),
    ]

    def __init__(
        self,
        query: Query,
        url: str,
        first: FleetRound,
        *,
        auto_picked: bool = False,
        interval: float = 5.0,
        report_dir: Optional[str] = None,
        expected_hosts: Sequence[str] = (),
    ) -> None:
        super().__init__()
        if first.view is None or first.verdict is None:
            raise GputopError(first.error or "no view of the job to start from")
        self.url = url
        self.view: FleetView = first.view
        self.verdict: FleetVerdict = first.verdict
        self.auto_picked = auto_picked
        self.interval = interval
        self.report_dir = report_dir
        self.error: Optional[str] = None  # the last round's failure, while it lasts
        self.rounds = 0  # refreshes received (tests wait on it)
        self._body: dict[str, RenderableType] = {}  # what the body's Statics show, by id
        self.filter_text = ""  # `/`: the nodes, ranks or states shown (empty: the outliers first, summarised)
        self.poller = FleetPoller(query, url, self.view.job, interval, self._deliver, expected_hosts)

    def compose(self) -> ComposeResult:
        yield FleetHeader(self.url, self.interval, id="header")
        yield FleetVerdictLine(id="verdict")
        yield FleetOutliers(id="outliers")
        yield FleetStatusLine(self.url, self.interval, id="status")
        yield Input(
            placeholder="filter: a node, a rank, a state (hung, data_wait, straggler, stopped, nic); Enter keeps it, Esc clears",
            id="filter",
        )
        with VerticalScroll(id="fleet-body"):
            yield Static(section("NODES × GPUs"), classes="section")
            yield Static(id="nodes")
            yield Static(id="heat")
            yield Static(section("RANKS"), classes="section")
            yield Static(id="ranks")
            yield Static(section("FINDINGS BY NODE"), classes="section")
            yield Static(id="findings")
            yield Static(id="jobs-known")
        keys = [(key_display(b.key.split(",")[0]), b.description) for b in self.BINDINGS if isinstance(b, Binding) and b.show]
        yield KeyBar(keys, id="keys")

    def on_mount(self) -> None:
        self._draw()
        self.query_one("#fleet-body").focus()
        self.poller.start()

    def on_unmount(self) -> None:
        self.poller.stop()

    # ------------------------------------------------------------------ refreshes (from the poller's thread)
    def _deliver(self, result: FleetRound) -> None:
        self.post_message(FleetRefreshed(result))  # thread-safe: handled on the app's loop

    def on_fleet_refreshed(self, message: FleetRefreshed) -> None:
        result = message.result
        self.rounds += 1
        if result.view is not None and result.verdict is not None:
            if result.view.job != self.poller.job:
                return  # a round for the job followed before `j` switched
            self.view, self.verdict, self.error = result.view, result.verdict, None
        else:
            self.error = result.error
        self._draw()

    def _draw(self) -> None:
        view, verdict = self.view, self.verdict
        found = outliers(view)
        self.query_one(FleetHeader).show(view, stale=self.error is not None)
        self.query_one(FleetVerdictLine).show(verdict)
        self.query_one(FleetOutliers).show(tuple(v for v in found if v != verdict))
        self.query_one(FleetStatusLine).show(view.at, self.error)
        heat: Optional[RenderableType] = None
        if self.filter_text:
            nodes, ranks = matches(self.filter_text, view)
            said = f"filter {self.filter_text!r}: {counted(len(nodes), 'node')}, {counted(len(ranks), 'rank')} · Esc clears"
            nodes_shown: RenderableType = (
                nodes_table(view, nodes[:FILTERED_ROWS]) if nodes else Text("no node matches", style=look.DIM)
            )
            ranks_shown: RenderableType = Group(
                Text(said, style=look.ACCENT),
                ranks_table(view, verdict, ranks[:FILTERED_ROWS]) if ranks else Text("no rank matches", style=look.DIM),
            )
        else:
            ordered = nodes_outliers_first(view, found)
            if len(view.nodes) >= HEAT_FROM_NODES:
                named = {v.node for v in found}
                first = [n for n in ordered if n.hostname in named][:HEAT_ROWS_FIRST]
                nodes_shown = nodes_table(view, first) if first else Text("no node stands out", style=look.DIM)
                heat = HeatStrip(view)
            else:
                nodes_shown = nodes_table(view, ordered)
            ranks = ranks_outliers_first(view, found)
            table = ranks_table(view, verdict, ranks[:RANK_ROWS])
            if len(ranks) > RANK_ROWS:
                more = f"{len(ranks) - RANK_ROWS} more ranks: / filters by node, rank or state (`gputop report --prometheus --format json` has all)"
                ranks_shown = Group(table, Text(more, style=look.DIM))
            else:
                ranks_shown = table
        self._body = {"nodes": nodes_shown}
        if heat is not None:
            self._body["heat"] = heat
        self._body.update(
            {"ranks": ranks_shown, "findings": findings_text(view), "jobs-known": jobs_text(view, self.auto_picked)}
        )
        heat_widget = self.query_one("#heat", Static)
        heat_widget.display = heat is not None
        heat_widget.update(heat if heat is not None else "")
        for name, renderable in self._body.items():
            if name != "heat":
                self.query_one(f"#{name}", Static).update(renderable)

    def screen_text(self) -> str:
        """The plain text of the header, verdict and status lines and of the body's tables (for tests)."""
        widgets = (FleetHeader, FleetVerdictLine, FleetOutliers, FleetStatusLine)
        lines = [line for w in widgets for line in self.query_one(w).lines_text]
        console = Console(width=200, file=io.StringIO(), record=True, color_system=None)
        console.print(Group(*self._body.values()))
        return "\n".join(lines) + "\n" + console.export_text()

    # ------------------------------------------------------------------ keys
    async def action_quit(self) -> None:
        if isinstance(self.focused, Input):  # q typed into the filter (q is a priority key elsewhere)
            self.focused.insert_text_at_cursor("q")
            return
        self.poller.stop()  # never waits for a query in flight: the thread is a daemon
        self.exit()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen([("gputop fleet", self.BINDINGS)], footer=HELP_FOOTER))

    def action_filter(self) -> None:
        """Key /: the filter line; what is typed picks the nodes and ranks shown, as it is typed."""
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if box.display:
            box.value = ""
            box.display = False
            self.query_one("#fleet-body").focus()

    def on_input_changed(self, message: Input.Changed) -> None:
        self.filter_text = message.value.strip()
        self._draw()

    def on_input_submitted(self, message: Input.Submitted) -> None:
        self.query_one("#fleet-body").focus()

    def action_refresh(self) -> None:
        self.poller.refresh_now()

    def action_jobs(self) -> None:
        if not isinstance(self.screen, JobsScreen):
            self.push_screen(
                JobsScreen(self.view.job_sizes or ((self.view.job, len(self.view.ranks)),), self.view.job, self.follow)
            )

    def follow(self, job: str) -> None:
        if job != self.view.job:
            self.auto_picked = False
            self.notify(f"following job {job}", timeout=3)
            self.poller.follow(job)

    def action_report(self) -> None:
        """Key r: `gputop report --prometheus`'s markdown of the view on screen, into a file; says where."""
        from gputop.report.fleet import report_markdown
        from gputop.report.writer import write_report

        job = re.sub(r"[^A-Za-z0-9._-]+", "_", self.view.job)
        path = Path(self.report_dir or os.getcwd()) / f"gputop-fleet-report-{job}-{time.strftime('%Y%m%d-%H%M%S')}.md"
        try:
            write_report(str(path), report_markdown(self.view, self.verdict, self.url))
        except GputopError as exc:
            self.notify(str(exc), title="report not written", severity="error", timeout=8)
            return
        self.notify(f"wrote {path}", title="report", timeout=8)


def run_fleet_app(
    query: Query, url: str, first: FleetRound, *, auto_picked: bool, interval: float, expected_hosts: Sequence[str] = ()
) -> int:
    """Run the fleet screen until the user quits."""
    from gputop.tui.glyph_fallback import fit_glyphs_to

    fit_glyphs_to(sys.__stderr__)  # Textual draws on stderr
    app = FleetApp(query, url, first, auto_picked=auto_picked, interval=interval, expected_hosts=expected_hosts)
    try:
        app.run()
    finally:
        app.poller.stop()
    return int(app.return_code or 0)
