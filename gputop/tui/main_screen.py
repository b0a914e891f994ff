"""The main screen: the layout (header, verdict, GPU grid, CPU heatmap, job tree and stacks, key bar) and how
one window of snapshots is drawn on it.

It holds no data of its own: the app hands it the snapshots to draw (`show`) and the terminal's size
(`fit`); it says what the user picked in the job tree by the messages it posts (`AttachWanted`,
`StacksShown`).  Collection, history, diagnosis and the keys' actions live in the app and its helper
(`actions.BackgroundActions`).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, TypeVar

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget

from gputop.model import MachineInfo, Snapshot
from gputop.tui.widgets.cpu_heatmap import CpuHeatmap
from gputop.tui.widgets.gpu_grid import GpuGrid
from gputop.tui.widgets.job_panel import JobPanel, JobRow, gpu_process_rows, job_rows, ranks_text
from gputop.tui.widgets.stacks import StacksPanel
from gputop.tui.widgets.status import HeaderLine, KeyBar, VerdictLine

W = TypeVar("W", bound=Widget)

COMPACT_BELOW = (100, 30)  # below either: one line per GPU, stacks on demand
# The job tree and the stacks are what no other monitor shows: the GPU cards give way to one line per GPU
# when they would leave these panels less than this share of the screen (8 cards at 100x30 leave 2 rows).
PANELS_SHARE = 1 / 3
CHROME_ROWS = 3  # header, verdict, key bar
RANKS_SHOWN = 5  # fewer ranks than this on screen: each rank's workers fold into its row


class MainScreen(Screen[None]):
    """The monitor's one screen; dialogs and the too-small screen go on top of it."""

    class AttachWanted(Message):
        """The user chose a process (or a discovered job) in the job tree: follow it."""

        def __init__(self, pid: int) -> None:
            super().__init__()
            self.pid = pid

    class StacksShown(Message):
        """Whether the stacks panel is on screen (py-spy dumps are wanted only then)."""

        def __init__(self, shown: bool) -> None:
            super().__init__()
            self.shown = shown

    def __init__(
        self,
        machine: MachineInfo,
        key_hints: list[tuple[str, str]],
        on_ready: Callable[[], None],
        on_drawn: Optional[Callable[[], None]] = None,
    ) -> None:
        """`on_ready`: called once the widgets are mounted (the app draws its first snapshot then); `on_drawn`:
        once the first frame has gone to the terminal."""
        super().__init__()
        self.machine = machine
        self._on_ready = on_ready
        self._on_drawn = on_drawn
        self.key_hints = key_hints
        self.compact = False  # the small-terminal layout: one line per GPU, stacks on demand
        self.compact_stacks = False  # in the compact layout: the stacks shown instead of the job tree
        self.snapshots: Sequence[Snapshot] = ()  # what the last `show` drew
        self._widgets: dict[type, Widget] = {}
        self._ready = False  # composed and mounted (a resize can come before)

    def compose(self) -> ComposeResult:
        yield HeaderLine(self.machine, id="header")
        yield VerdictLine(id="verdict")
        yield GpuGrid(id="gpus")
        yield CpuHeatmap(id="cpu")
        with Horizontal(id="bottom"):
            yield JobPanel(id="jobs")
            yield StacksPanel(id="stacks")
        yield KeyBar(self.key_hints, id="keys")

    # ------------------------------------------------------------------ the widgets
    def _widget(self, widget_type: type[W]) -> W:
        """Looked up once per type (each frame asks ~5 times, and a DOM query walks the screen): the widgets
        are composed once and never replaced."""
        found = self._widgets.get(widget_type)
        if found is None:
            found = self._widgets[widget_type] = self.query_one(widget_type)
        assert isinstance(found, widget_type)
        return found

    @property
    def header(self) -> HeaderLine:
        return self._widget(HeaderLine)

    @property
    def verdict(self) -> VerdictLine:
        return self._widget(VerdictLine)

    @property
    def grid(self) -> GpuGrid:
        return self._widget(GpuGrid)

    @property
    def heatmap(self) -> CpuHeatmap:
        return self._widget(CpuHeatmap)

    @property
    def jobs(self) -> JobPanel:
        return self._widget(JobPanel)

    @property
    def stacks(self) -> StacksPanel:
        return self._widget(StacksPanel)

    def set_machine(self, machine: MachineInfo, reading_gpus: bool = False) -> None:
        """The machine the snapshots come from (it changes once, when a starting pipeline has read the GPUs)."""
        self.machine = machine
        self.header.set_machine(machine, reading_gpus)

    # ------------------------------------------------------------------ layout
    def on_mount(self) -> None:
        self._ready = True
        self._on_ready()

    def on_screen_resume(self) -> None:
        # Textual's own handler, which runs after this one, lays the screen out and writes its first frame
        drawn, self._on_drawn = self._on_drawn, None
        if drawn is not None:
            self.call_next(drawn)

    def fit(self, width: int, height: int) -> None:
        """Choose the layout for a terminal of `width` x `height` (big enough: the app checks)."""
        if not self._ready:
            return  # on_mount fits it
        compact = width < COMPACT_BELOW[0] or height < COMPACT_BELOW[1]
        self._choose_grid(width, height, compact)
        if compact != self.compact:
            self.compact = compact
            self.compact_stacks = False
            self._update_panel_visibility()

    def _choose_grid(self, width: int, height: int, compact: bool) -> None:
        """Cards, or one line per GPU: by the layout, and by the room the cards leave (the CPU heatmap's
        height is known only from the first sample on, so this is asked again on every frame)."""
        grid = self.grid
        compact_grid = compact or not self._cards_leave_room(width, height)
        if compact_grid != grid.compact:
            grid.set_compact(compact_grid)

    def _cards_leave_room(self, width: int, height: int) -> bool:
        """Whether the GPU cards leave the job tree and the stacks their share of the screen."""
        cards = self.grid.cards_height(width, self.machine.gpu_count)
        cpu = self.heatmap.wanted_height(width)
        return height - CHROME_ROWS - cards - cpu >= height * PANELS_SHARE

    def _update_panel_visibility(self) -> None:
        jobs, stacks = self.jobs, self.stacks
        stacks.set_class(self.compact, "full-width")
        if self.compact:
            jobs.display = not self.compact_stacks
            stacks.display = self.compact_stacks
            if self.compact_stacks:
                stacks.focus()
            else:
                jobs.focus()
        else:
            jobs.display = stacks.display = True
        self.post_message(self.StacksShown(bool(stacks.display)))

    def close_stacks(self) -> None:
        """Esc in the compact layout: back from the stacks to the job tree."""
        if self.compact and self.compact_stacks:
            self.compact_stacks = False
            self._update_panel_visibility()

    # ------------------------------------------------------------------ drawing
    def show(
        self,
        snapshots: Sequence[Snapshot],
        interval: float,
        gpu_users: dict[int, str],
        *,
        reading_gpus: bool = False,
    ) -> None:
        """Draw the latest of `snapshots` (the GPU sparklines span them all); `reading_gpus`: NVML has not
        answered yet (the cards say so, the rest is drawn)."""
        if not snapshots:
            return
        self.snapshots = snapshots
        snapshot = snapshots[-1]
        job = snapshot.job
        self.grid.update_data(
            snapshots,
            interval,
            gpu_users,
            self.machine.gpu_error,
            self.machine.topology.gpus_without_near_cpus(),
            reading=reading_gpus,
        )
        self.heatmap.update_data(snapshot.host, frozenset(job.cores) if job is not None else frozenset())
        self._choose_grid(self.size.width, self.size.height, self.compact)
        panel = self.jobs
        title, hint, rows, warnings = self._job_rows(snapshot)
        panel.update_data(title, hint, rows, warnings)
        self.stacks.update_data(job, panel.selected, snapshot.timestamp)

    def _job_rows(self, snapshot: Snapshot) -> tuple[str, str, list[JobRow], Sequence[str]]:
        job = snapshot.job
        if job is not None:
            name = job.launcher.name if job.launcher is not None else "job"
            workers = sum(len(r.workers) for r in job.ranks)
            title = f"JOB {name} {job.root_pid} · {ranks_text(job)} · {workers} workers"
            if job.exited:
                title += " · EXITED"
            hint = "Enter: stacks" if self.compact else ""
            rows = job_rows(job)
            room = self.jobs.size.height - 2 - len(job.warnings)  # below its title and column heads
            shown = sum(1 for row in rows[:room] if row.kind == "rank")
            if room > 0 and shown < min(len(job.ranks), RANKS_SHOWN):
                rows = job_rows(job, fold_workers=True)
                hint = (hint + " · " if hint else "") + "workers folded"
            return title, hint, rows, job.warnings
        if snapshot.jobs:
            rows = [row for tree in snapshot.jobs for row in job_rows(tree, job_root=tree.root_pid)]
            return f"GPU JOBS ({len(snapshot.jobs)})", "Enter attaches", rows, ()
        return "GPU PROCESSES", "Enter attaches", gpu_process_rows(snapshot), ()

    @property
    def selected(self) -> Optional[JobRow]:
        """The job tree's row under the cursor."""
        return self.jobs.selected

    # ------------------------------------------------------------------ the job tree's events
    def on_job_panel_selected(self, message: JobPanel.Selected) -> None:
        snapshot = self.snapshots[-1] if self.snapshots else None
        self.stacks.update_data(snapshot.job if snapshot else None, message.row, snapshot.timestamp if snapshot else 0.0)

    def on_job_panel_chosen(self, message: JobPanel.Chosen) -> None:
        snapshot = self.snapshots[-1] if self.snapshots else None
        if snapshot is not None and snapshot.job is not None:
            if self.compact:
                self.compact_stacks = True
                self._update_panel_visibility()
            return
        self.post_message(self.AttachWanted(message.row.job_root or message.row.pid))
