"""The live Textual monitor: GPU grid, CPU heatmap, job tree with stacks, verdict line.

Collection runs the one poll loop (`source.PollLoop`) on a long-lived daemon thread,
which posts each snapshot to the app as a message: polls never overlap,
a slow NVML or py-spy call never blocks keys or drawing, and quitting never
waits for a hung driver call.  Drawing is done by line widgets that repaint only
the cells that changed (see `canvas.py`), which keeps the bytes sent over SSH
and the CPU used per refresh small.
"""

from __future__ import annotations

import gc
import os
import select
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message

from gputop import units
from gputop.errors import GputopError
from gputop.history import History
from gputop.model import Finding, Snapshot
from gputop.source import Attachable, Batch, Focusable, PollLoop, Seekable, Source
from gputop.tui import partial_updates
from gputop.tui.look import key_display
from gputop.tui.widgets.cpu_heatmap import CpuHeatmap
from gputop.tui.widgets.gpu_grid import GpuGrid
from gputop.tui.widgets.job_panel import JobPanel, JobRow, gpu_process_rows, job_rows
from gputop.tui.widgets.stacks import StacksPanel
from gputop.tui.widgets.status import HeaderLine, KeyBar, VerdictLine, verdict_severity

W = TypeVar("W")

partial_updates.install()  # write only the changed cells (see partial_updates.py)

MIN_SIZE = (60, 16)  # below this: the "terminal too small" screen
COMPACT_BELOW = (100, 30)  # below either: one line per GPU, stacks on demand
# The job tree and the stacks are what no other monitor shows: the GPU cards give way to one line per GPU
# when they would leave these panels less than this share of the screen (8 cards at 100x30 leave 2 rows).
PANELS_SHARE = 1 / 3
CHROME_ROWS = 3  # header, verdict, key bar
RANKS_SHOWN = 5  # fewer ranks than this on screen: each rank's workers fold into its row
INTERVAL_STEPS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
DIAGNOSE_EVERY = 3.0  # seconds between verdict updates
VERDICT_WAITS_FOR_FRAME = 0.25  # seconds past the next snapshot's due time before a verdict is drawn alone
SEEK_STEP = 10.0  # replay seek, seconds
COLLECTOR_STOP_TIMEOUT = 3.0
HANGUP_CHECK_EVERY = 1.0  # seconds between checks that the terminal is still there


@dataclass(frozen=True)
class Verdict:
    findings: Optional[list[Finding]]
    line: str


class SnapshotReady(Message):
    def __init__(self, snapshots: list[Snapshot], reset: bool = False) -> None:
        super().__init__()
        self.snapshots = snapshots
        self.reset = reset  # start the history over (a replay was sought)


class PollFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class Diagnosed(Message):
    def __init__(self, verdict: Verdict) -> None:
        super().__init__()
        self.verdict = verdict


# The machine check (key c) and the trace (key t) load their code on first use: a monitor that is never
# asked for them does not pay their import time and memory at start (the first frame, the RSS bar).
def _run_machine_check(*args: Any, **kwargs: Any) -> Any:
    from gputop.tui.check_screen import run_machine_check

    return run_machine_check(*args, **kwargs)


def _run_trace(*args: Any, **kwargs: Any) -> Any:
    from gputop.tracing import run_trace

    return run_trace(*args, **kwargs)


def _default_diagnose(history: History, bench: Any) -> tuple[list[Finding], str]:
    from gputop.analysis.diagnosis import diagnose, verdict_line

    found = diagnose(history, bench)
    return found, verdict_line(found, count_more=False)  # the verdict line adds "+N more (f)" itself


def _assembled(diagnosed: tuple[list[Finding], str], trace: Any, check: Any) -> tuple[list[Finding], str]:
    """The diagnosis joined by the trace's and the machine check's findings: `findings()`'s assembly, so the
    screen, the `r` report and `gputop report` say the same."""
    found, line = diagnosed
    if (trace is None or not getattr(trace, "findings", None)) and check is None:
        return list(found), line
    from gputop.analysis.diagnosis import verdict_line, with_extra_findings

    found = with_extra_findings(found, trace, check)
    return found, verdict_line(found, count_more=False)


class GputopApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "gputop"
    check_seconds: Optional[float] = None  # the machine check's window (key c); None: check_screen.CHECK_SECONDS
    # seconds from the first snapshot to the first verdict: after the first frame is on screen, not inside it
    first_verdict_delay = 0.5
    machine_check = staticmethod(_run_machine_check)  # tests put a scripted check here
    trace_runner = staticmethod(_run_trace)  # key t; tests put a scripted trace here
    ENABLE_COMMAND_PALETTE = False

    BINDINGS = [
        Binding("q", "quit", "Quit", priority=True, id="quit"),
        Binding("ctrl+c", "quit", "Quit", priority=True, show=False, id="quit.ctrl_c"),
        Binding("question_mark,h,f1", "help", "Help", id="help"),
        Binding("p", "pause", "Pause", id="pause"),
        Binding("plus,equals_sign", "interval(-1)", "Faster refresh", show=False, id="interval.faster"),
        Binding("minus,underscore", "interval(1)", "Slower refresh", show=False, id="interval.slower"),
        Binding("T", "topology", "Topology", id="topology"),
        Binding("f", "findings", "Findings", id="findings"),
        Binding("b", "bench", "Bench loader", id="bench"),
        Binding("r", "report", "Report", id="report"),
        Binding("c", "check", "Machine check", id="check"),
        Binding("t", "trace", "Trace every rank", show=False, id="trace"),
        Binding("s", "screenshot", "Screenshot", id="screenshot"),
        Binding("tab", "app.focus_next", "Next panel", show=False, id="focus.next"),
        Binding("shift+tab", "app.focus_previous", "Previous panel", show=False, id="focus.previous"),
        Binding("escape", "close_stacks", "Back to the job list", show=False, id="stacks.close"),
        # replay only (hidden and disabled without `controls`, see check_action)
        Binding("space", "pause", "Pause replay", id="replay.pause"),
        Binding("left", "seek(-1)", "Seek back 10 s", id="replay.back"),
        Binding("right", "seek(1)", "Seek forward 10 s", id="replay.forward"),
        Binding("less_than_sign", "speed(0.5)", "Slower replay", id="replay.slower"),
        Binding("greater_than_sign", "speed(2.0)", "Faster replay", id="replay.faster"),
    ]
    REPLAY_ACTIONS = ("seek", "speed")

    def __init__(
        self,
        source: Source,
        *,
        interval: float = 1.0,
        subtitle: Optional[str] = None,
        controls: Any = None,
        diagnose: Optional[Callable[[History, Any], tuple[list[Finding], str]]] = None,
        screenshot_dir: Optional[str] = None,
        report_dir: Optional[str] = None,
        history_capacity: Optional[int] = None,
        poll_loop: Optional[PollLoop] = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.machine = source.machine
        self.interval = interval
        self.sub_title = subtitle or ""
        # replay controls: the source's own when it is a recording (tests may hand in others)
        self.controls = controls if controls is not None else (source if isinstance(source, Seekable) else None)
        self.replay_speed = float(getattr(controls, "speed", 1.0) or 1.0)
        self._diagnose = diagnose or _default_diagnose
        self.screenshot_dir = screenshot_dir
        self.report_dir = report_dir
        self.history = History(self.machine, capacity=history_capacity or 600)
        self.paused = False
        self.verdict: Optional[Verdict] = None
        self._verdict_drawn = True  # whether self.verdict is on the verdict line yet
        self.last_bench: Any = None
        self.last_check: Any = None  # the latest machine check (key c): its report and the cards' marks
        self.last_trace: Any = None  # the latest trace (key t): its findings join the diagnosis'
        self.snapshots_seen = 0
        self.diagnoses_done = 0
        self.poll_error: Optional[str] = None
        self._compact = False
        self._compact_stacks = False
        self._diagnosing = False
        # `poll_loop`: one made (and perhaps prefetched) before the app, on this source and interval
        self._poll_loop = poll_loop if poll_loop is not None else PollLoop(source, interval)
        self._poll_loop.on_error = self._poll_failed
        self._collector: Optional[threading.Thread] = None
        self.collector_stopped = threading.Event()
        self._mounted = threading.Event()
        self._first_verdict_asked = False
        self._too_small: Any = None  # screens.TooSmallScreen while shown
        self._bench_screen: Any = None  # screens.BenchScreen while the dialog is open
        self._main_widgets: dict[type, tuple[Any, Any]] = {}  # widget type -> (main screen, widget); see _main

    def get_driver_class(self) -> type:
        from gputop.tui.input_thread import quiet_driver

        return quiet_driver(super().get_driver_class())  # Textual's, with an input thread that sleeps

    def check_action(self, action: str, parameters: tuple[object, ...]) -> Optional[bool]:
        if action in self.REPLAY_ACTIONS and self.controls is None:
            return False
        return True

    def key_hints(self) -> list[tuple[str, str]]:
        return [(key_display(b.key.split(",")[0]), b.description) for b in self.global_bindings() if b.show]

    def global_bindings(self) -> list[Binding]:
        """The app's bindings as the help screen lists them (replay keys only when replaying)."""
        replay_ids = {"replay.pause", "replay.back", "replay.forward", "replay.slower", "replay.faster"}
        return [b for b in self.BINDINGS if self.controls is not None or b.id not in replay_ids]

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield HeaderLine(self.machine, id="header")
        yield VerdictLine(id="verdict")
        yield GpuGrid(id="gpus")
        yield CpuHeatmap(id="cpu")
        with Horizontal(id="bottom"):
            yield JobPanel(id="jobs")
            yield StacksPanel(id="stacks")
        yield KeyBar(self.key_hints(), id="keys")

    def on_mount(self) -> None:
        self._apply_size(self.size.width, self.size.height)
        self._header().set_state(interval=self.interval, paused=self.paused, replay=self._replay_tag())
        self._header().subtitle = self.sub_title
        self._main(JobPanel).focus()
        first = self._poll_loop.take_prefetched()  # taken while Textual loaded (commands/tui.py)
        if first is not None:
            self._receive(first.snapshots, first.reset)  # so the very first frame shows GPU readings
        self.start_collecting()
        self._mounted.set()
        self.call_after_refresh(self._started)
        self.set_interval(DIAGNOSE_EVERY, self._diagnose_soon)
        stdin = _stdin_fd()
        if not self.is_headless and stdin is not None and os.isatty(stdin):
            self.set_interval(HANGUP_CHECK_EVERY, self._exit_if_terminal_gone)

    @staticmethod
    def _started() -> None:
        """After the first frame: the cyclic GC back on (commands/tui.py turns it off for start-up).

        Not gc.freeze() as well: measured, it kept start-up's garbage for good (RSS +0.5 MiB at 35 s, +0.2
        after a gc.collect() first) and saved no CPU one could see at one poll a second."""
        gc.enable()

    def start_collecting(self) -> None:
        """Start the collector thread (idempotent). Without a prefetching loop `run_app` calls it before the UI
        starts, so the first poll runs while Textual sets up the screen; snapshots are posted only once the
        app is mounted."""
        if self._collector is None:
            self._collector = threading.Thread(target=self._collect, name="gputop-collect", daemon=True)
            self._collector.start()

    def on_unmount(self) -> None:
        self._stop_collector()
        self._mounted.clear()

    def on_resize(self, event) -> None:
        self._apply_size(event.size.width, event.size.height)

    def on_job_panel_resized(self, _message: JobPanel.Resized) -> None:
        self._render_all()  # the job rows depend on the panel's height (workers fold when ranks would not fit)

    def _apply_size(self, width: int, height: int) -> None:
        too_small = width < MIN_SIZE[0] or height < MIN_SIZE[1]
        if too_small:
            from gputop.tui.screens import TooSmallScreen

            if self._too_small is None:
                self._too_small = TooSmallScreen(MIN_SIZE)
                self.push_screen(self._too_small)
            elif self._too_small.is_mounted:
                self._too_small.show(width, height)
            return
        if self._too_small is not None:
            screen, self._too_small = self._too_small, None
            if screen in self.screen_stack:
                if self.screen is screen:
                    self.pop_screen()
                else:
                    self.screen_stack  # pragma: no cover - another screen on top; leave it
            self.call_after_refresh(self._render_all)
        compact = width < COMPACT_BELOW[0] or height < COMPACT_BELOW[1]
        self._choose_grid(width, height, compact)
        if compact != self._compact:
            self._compact = compact
            self._compact_stacks = False
            self._update_panel_visibility()

    def _choose_grid(self, width: int, height: int, compact: bool) -> None:
        """Cards, or one line per GPU: by the layout, and by the room the cards leave (the CPU heatmap's
        height is known only from the first sample on, so this is asked again on every frame)."""
        grid = self._main(GpuGrid)
        compact_grid = compact or not self._cards_leave_room(width, height)
        if compact_grid != grid.compact:
            grid.set_compact(compact_grid)

    def _cards_leave_room(self, width: int, height: int) -> bool:
        """Whether the GPU cards leave the job tree and the stacks their share of the screen."""
        cards = self._main(GpuGrid).cards_height(width, self.machine.gpu_count)
        cpu = self._main(CpuHeatmap).wanted_height(width)
        return height - CHROME_ROWS - cards - cpu >= height * PANELS_SHARE

    def _update_panel_visibility(self) -> None:
        jobs, stacks = self._main(JobPanel), self._main(StacksPanel)
        stacks.set_class(self._compact, "full-width")
        if self._compact:
            jobs.display = not self._compact_stacks
            stacks.display = self._compact_stacks
            if self._compact_stacks:
                stacks.focus()
            else:
                jobs.focus()
        else:
            jobs.display = stacks.display = True
        self._set_stacks_wanted()

    def _set_stacks_wanted(self) -> None:
        if isinstance(self.source, Attachable):
            self.source.want_stacks(bool(self._main(StacksPanel).display))

    def _main(self, widget_type: type[W]) -> W:
        """A widget of the main screen, even while a dialog or the too-small screen is on top.

        Looked up once per type (each frame asks ~5 times, and a DOM query walks the screen): the main
        screen's widgets are composed once and never replaced."""
        screen = self.screen_stack[0]
        found = self._main_widgets.get(widget_type)
        if found is None or found[0] is not screen:
            found = self._main_widgets[widget_type] = (screen, screen.query_one(widget_type))
        return found[1]

    def _header(self) -> HeaderLine:
        return self._main(HeaderLine)

    # ------------------------------------------------------------------ collection (off the event loop)
    def _collect(self) -> None:
        try:
            self._poll_loop.run(self._post_batch)
        finally:
            self.collector_stopped.set()

    def _post_batch(self, batch: Batch) -> None:
        # snapshots go to the app only once it is mounted (the first poll runs while Textual starts)
        while not self._mounted.wait(0.05):
            if self._poll_loop.stopped:
                return
        if not self._poll_loop.stopped:
            self.post_message(SnapshotReady(batch.snapshots, batch.reset))

    def _poll_failed(self, exc: Exception) -> None:
        # a collector bug must not kill the monitor: say it, and poll again on the next tick
        self.post_message(PollFailed(str(exc) if isinstance(exc, GputopError) else f"{type(exc).__name__}: {exc}"))

    def _stop_collector(self) -> None:
        self._poll_loop.stop()

    def wait_for_collector(self, timeout: float = COLLECTOR_STOP_TIMEOUT) -> bool:
        """Whether no poll is running any more (waiting up to `timeout`): the collector has stopped, or it
        never started (the app ended before it mounted) and the prefetched poll, if any, has returned."""
        if self._collector is None:
            self._poll_loop.stop()
            return self._poll_loop.prefetch_finished(timeout)
        return self.collector_stopped.wait(timeout)

    # ------------------------------------------------------------------ snapshot -> screen
    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        self._receive(message.snapshots, message.reset)

    def _receive(self, snapshots: list[Snapshot], reset: bool) -> None:
        if reset:
            self.history = History(self.machine, capacity=self.history.capacity)
        for snapshot in snapshots:
            latest = self.history.latest
            if latest is not None and snapshot.timestamp <= latest.timestamp:
                continue  # the same sample again (a paused replay, a stalled source): keep time moving forward
            self.history.append(snapshot)
        self.snapshots_seen += len(snapshots)
        if self.poll_error:
            self.poll_error = None
        if not self._first_verdict_asked and len(self.history):
            self._first_verdict_asked = True
            # first verdict soon, but after the first frame is on screen
            self.set_timer(self.first_verdict_delay, lambda: self._diagnose_soon(force=True))
        self._render_all()

    def on_poll_failed(self, message: PollFailed) -> None:
        if self._poll_loop.stopped:
            return  # the source was closed under a poll on the way out
        if message.error != self.poll_error:
            self.poll_error = message.error
            self.notify(message.error, title="collection failed", severity="error", timeout=6)

    def _main_visible(self) -> bool:
        return self.screen is self.screen_stack[0] if self.screen_stack else False

    def _render_all(self) -> None:
        # Skip UI work while paused or while another screen covers the main one.
        if self.paused or not self._main_visible():
            return
        snapshot = self.history.latest
        if snapshot is None:
            return
        self._draw_verdict()  # one that came since the last frame (see on_diagnosed)
        snapshots = self.history.window(self._spark_window())
        job = snapshot.job
        self._main(GpuGrid).update_data(
            snapshots, self.interval, gpu_users(snapshot), self.machine.gpu_error, self.machine.topology.gpus_without_near_cpus()
        )
        self._main(CpuHeatmap).update_data(
            snapshot.host, frozenset(job.cores) if job is not None else frozenset()
        )  # the collector's
        self._choose_grid(self.size.width, self.size.height, self._compact)
        panel = self._main(JobPanel)
        title, hint, rows, warnings = self._job_rows(snapshot)
        panel.update_data(title, hint, rows, warnings)
        self._main(StacksPanel).update_data(job, panel.selected, snapshot.timestamp)
        if self.controls is not None:
            self._header().set_state(interval=self.interval, paused=self.paused, replay=self._replay_tag())

    def _spark_window(self) -> float:
        # The widest sparkline spans at most ~ width seconds-per-cell x cells; 10 minutes is a safe bound.
        return max(180.0, self.interval * 200)

    def _job_rows(self, snapshot: Snapshot) -> tuple[str, str, list[JobRow], Sequence[str]]:
        job = snapshot.job
        if job is not None:
            name = job.launcher.name if job.launcher is not None else "job"
            workers = sum(len(r.workers) for r in job.ranks)
            title = f"JOB {name} {job.root_pid} · {len(job.ranks)} ranks · {workers} workers"
            if job.exited:
                title += " · EXITED"
            hint = "Enter: stacks" if self._compact else ""
            rows = job_rows(job)
            room = self._main(JobPanel).size.height - 2 - len(job.warnings)  # below its title and column heads
            shown = sum(1 for row in rows[:room] if row.kind == "rank")
            if room > 0 and shown < min(len(job.ranks), RANKS_SHOWN):
                rows = job_rows(job, fold_workers=True)
                hint = (hint + " · " if hint else "") + "workers folded"
            return title, hint, rows, job.warnings
        if snapshot.jobs:
            rows = [row for tree in snapshot.jobs for row in job_rows(tree, job_root=tree.root_pid)]
            return f"GPU JOBS ({len(snapshot.jobs)})", "Enter attaches", rows, ()
        return "GPU PROCESSES", "Enter attaches", gpu_process_rows(snapshot), ()

    def on_job_panel_selected(self, message: JobPanel.Selected) -> None:
        snapshot = self.history.latest
        self._main(StacksPanel).update_data(
            snapshot.job if snapshot else None, message.row, snapshot.timestamp if snapshot else 0.0
        )

    def on_job_panel_chosen(self, message: JobPanel.Chosen) -> None:
        snapshot = self.history.latest
        if snapshot is not None and snapshot.job is not None:
            if self._compact:
                self._compact_stacks = True
                self._update_panel_visibility()
            return
        target = message.row.job_root or message.row.pid
        self._attach_job(target)

    def action_close_stacks(self) -> None:
        if self._compact and self._compact_stacks:
            self._compact_stacks = False
            self._update_panel_visibility()

    @work(thread=True, group="attach", exclusive=True)
    def _attach_job(self, pid: int) -> None:
        if not isinstance(self.source, Attachable):
            self.call_from_thread(self.notify, f"this view cannot attach; run gputop --pid {pid}", severity="warning", timeout=6)
            return
        try:
            self.source.attach(pid)
        except GputopError as exc:
            self.call_from_thread(self.notify, str(exc), title="attach failed", severity="error", timeout=8)
            return
        self.call_from_thread(self.notify, f"attached to PID {pid}", timeout=3)
        self.call_from_thread(self._set_stacks_wanted)

    # ------------------------------------------------------------------ diagnosis (thread, every few seconds)
    def _diagnose_soon(self, force: bool = False) -> None:
        if self._diagnosing or not len(self.history) or (self.paused and not force):
            return
        self._diagnosing = True
        self._run_diagnosis(self._history_copy(), self.last_bench)

    def _history_copy(self) -> History:
        """A History of its own for a worker thread: the app keeps appending to the live one."""
        copy = History(self.history.machine, capacity=self.history.capacity)
        for snapshot in self.history:  # references only: snapshots are frozen
            copy.append(snapshot)
        return copy

    @work(thread=True, group="diagnose")
    def _run_diagnosis(self, history: History, bench: Any) -> None:
        try:
            findings, line = _assembled(self._diagnose(history, bench), self.last_trace, self.last_check)
            verdict = Verdict(list(findings), line)
        except ImportError:
            verdict = Verdict(None, "Verdict: diagnosis is not available in this build")
        except Exception as exc:  # a diagnosis bug must not take the monitor down
            verdict = Verdict(None, f"Verdict: diagnosis failed ({type(exc).__name__}: {exc})")
        self.post_message(Diagnosed(verdict))

    def on_diagnosed(self, message: Diagnosed) -> None:
        self._diagnosing = False
        if self._poll_loop.stopped or not self.screen_stack:
            return  # shutting down
        self.verdict = message.verdict
        self._verdict_drawn = False
        screens = sys.modules.get("gputop.tui.screens")  # loaded once a dialog was opened; not before (start-up)
        if screens is not None and isinstance(self.screen, screens.FindingsScreen) and message.verdict.findings is not None:
            self.screen.show(message.verdict.findings, message.verdict.line)  # it follows the diagnosis while open
        if not self.paused and self.interval < DIAGNOSE_EVERY and self._main_visible():
            # Drawn with the next snapshot's frame (`_render_all`): a frame of its own would cost Textual a
            # pass over the whole screen every DIAGNOSE_EVERY seconds.  The timer draws it if none comes.
            self.set_timer(self.interval + VERDICT_WAITS_FOR_FRAME, self._draw_verdict)
        else:
            self._draw_verdict()

    def _draw_verdict(self) -> None:
        if self._verdict_drawn or self.verdict is None or self._poll_loop.stopped or not self.screen_stack:
            return
        self._verdict_drawn = True
        self.diagnoses_done += 1  # (counted once on screen: tests and screenshots wait for it)
        findings = self.verdict.findings or []
        extra = max(0, len([f for f in findings if f.id != "healthy"]) - 1)
        self._main(VerdictLine).set_verdict(self.verdict.line, verdict_severity(findings), extra)

    def _exit_if_terminal_gone(self) -> None:
        # With SIGHUP ignored (`nohup`, some multiplexers and job wrappers) nothing stops us when the ssh
        # session or the window goes away, and Textual's input thread then spins on end-of-file at ~80% of
        # a core, for good, on a machine people pay for by the hour.  So notice the hang-up ourselves.
        if terminal_hung_up():
            self._stop_collector()
            self.exit(1, message="gputop: the terminal went away (hang-up); exiting")

    # ------------------------------------------------------------------ actions
    async def action_quit(self) -> None:
        self._stop_collector()
        self.exit(0)

    def action_help(self) -> None:
        from gputop.tui.screens import BenchScreen, HelpScreen

        if isinstance(self.screen, HelpScreen):
            return
        sections = [
            ("Global", self.global_bindings()),
            ("Job panel", JobPanel.BINDINGS),
            ("Stacks panel", StacksPanel.BINDINGS),
            ("Benchmark dialog", BenchScreen.BINDINGS),
        ]
        self.push_screen(HelpScreen(sections))

    def action_pause(self) -> None:
        self.paused = not self.paused
        if self.controls is not None:
            (self.controls.pause if self.paused else self.controls.resume)()
        self._header().set_state(interval=self.interval, paused=self.paused, replay=self._replay_tag())
        if not self.paused:
            self._render_all()

    def action_interval(self, direction: int) -> None:
        steps = INTERVAL_STEPS
        current = min(range(len(steps)), key=lambda i: abs(steps[i] - self.interval))
        new = steps[max(0, min(len(steps) - 1, current + direction))]
        if new != self.interval:
            self.interval = self._poll_loop.interval = new
            self._poll_loop.wake()  # start the new cadence now
            self._header().set_state(interval=self.interval, paused=self.paused, replay=self._replay_tag())
            self.notify(f"refresh every {new:g} s", timeout=2)

    def action_topology(self) -> None:
        from gputop.tui.screens import TopologyScreen

        if not isinstance(self.screen, TopologyScreen):
            self.push_screen(TopologyScreen(self.machine, self.history.latest))

    def action_findings(self) -> None:
        from gputop.tui.screens import FindingsScreen

        if not isinstance(self.screen, FindingsScreen):
            verdict = self.verdict
            self._focus_sampling(True)  # the shares the screen shows are read closely: sample densely meanwhile
            self.push_screen(
                FindingsScreen(verdict.findings if verdict else None, verdict.line if verdict else ""),
                callback=lambda _result: self._focus_sampling(False),
            )

    def _focus_sampling(self, focused: bool) -> None:
        if isinstance(self.source, Focusable):
            self.source.focus_sampling(focused)

    def action_screenshot(self) -> None:
        directory = self.screenshot_dir or os.getcwd()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        filename = f"gputop-{self.machine.hostname}-{stamp}.svg"
        try:
            path = self.save_screenshot(filename=filename, path=directory)
        except OSError as exc:
            self.notify(f"could not save the screenshot in {directory}: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"saved {path}", title="screenshot", timeout=5)

    # --- replay
    def _replay_tag(self) -> Optional[str]:
        controls = self.controls
        if controls is None:
            return None
        position = getattr(controls, "position", None)
        duration = getattr(controls, "duration", None)
        tag = "REPLAY"
        if position is not None and duration is not None:
            tag += f" {units.mmss(position)}/{units.mmss(duration)}"
        if self.replay_speed != 1.0:
            tag += f" ×{self.replay_speed:g}"
        return tag

    def action_seek(self, direction: int) -> None:
        if self.controls is None:
            return
        position = getattr(self.controls, "position", 0.0) or 0.0
        self.controls.seek(max(0.0, position + direction * SEEK_STEP))
        if not isinstance(self.source, Seekable):
            self.history = History(self.machine, capacity=self.history.capacity)  # keep the series in time order
        self._poll_loop.wake()

    def action_speed(self, factor: float) -> None:
        if self.controls is None:
            return
        self.replay_speed = max(0.125, min(64.0, self.replay_speed * factor))
        self.controls.set_speed(self.replay_speed)
        self._header().set_state(interval=self.interval, paused=self.paused, replay=self._replay_tag())

    # --- benchmark (issue 6)
    def _bench_target(self) -> Optional[tuple[int, str]]:
        snapshot = self.history.latest
        row = self._main(JobPanel).selected
        job = snapshot.job if snapshot else None
        if row is not None and row.kind == "rank":
            return row.pid, row.label.lstrip("├└│ ")
        if job is not None and job.ranks:
            rank = min(job.ranks, key=lambda r: r.rank if r.rank is not None else 1 << 30)
            name = f"rank {rank.rank}" if rank.rank is not None else "main process"
            return rank.proc.pid, f"{name} {rank.proc.pid}"
        if row is not None:
            return row.pid, row.label
        return None

    def action_bench(self) -> None:
        target = self._bench_target()
        if target is None:
            self.notify("attach to a training job first (gputop --pid PID, or Enter on a process)", severity="warning")
            return
        pid, label = target
        from gputop.tui.screens import BenchScreen

        self._bench_screen = BenchScreen(pid, label, self._start_bench)
        self.push_screen(self._bench_screen)

    def _start_bench(self, pid: int, allow_inject: bool) -> None:
        self._run_bench(pid, allow_inject)

    @work(thread=True, group="bench", exclusive=True)
    def _run_bench(self, pid: int, allow_inject: bool) -> None:
        screen = self._bench_screen

        def progress(fraction: float, message: str) -> None:
            if screen is not None:
                self.call_from_thread(screen.show_progress, fraction, message)

        try:
            from gputop.bench import run_benchmark

            result = run_benchmark(pid, seconds=15.0, allow_inject=allow_inject, progress=progress)
        except ImportError:
            self.call_from_thread(self._bench_done, None, "the loader benchmark is not available in this build")
        except GputopError as exc:
            self.call_from_thread(self._bench_done, None, str(exc))
        except Exception as exc:
            self.call_from_thread(self._bench_done, None, f"benchmark failed: {type(exc).__name__}: {exc}")
        else:
            self.call_from_thread(self._bench_done, result, None)

    def _bench_done(self, result: Any, error: Optional[str]) -> None:
        screen = self._bench_screen
        if result is not None:
            self.last_bench = result
            self._diagnose_soon(force=True)
        lines = list(result.summary_lines()) if result is not None else []
        if screen is not None and screen.is_mounted:
            screen.show_result(lines, error)
        elif error:
            self.notify(error, title="benchmark", severity="error", timeout=8)
        else:
            self.notify(lines[0] if lines else "benchmark done", title="benchmark", timeout=8)

    # --- trace (issue 13): `gputop trace` of the attached job, after asking (gputop/tui/trace_screen.py)
    def action_trace(self) -> None:
        from gputop.tui.trace_screen import start_trace

        start_trace(self)

    # --- machine check (issue 16): `gputop check` over the live source, in a worker
    def action_check(self) -> None:
        from gputop.tui.check_screen import CHECK_SECONDS, CheckScreen

        if isinstance(self.screen, CheckScreen):
            return
        if self.check_seconds is None:
            self.check_seconds = CHECK_SECONDS
        self._check_screen = CheckScreen(self.check_seconds)
        self.push_screen(self._check_screen)
        latest = self.history.latest
        # the window: the latest snapshot and every one the collector takes while the check runs
        self._run_check(latest.timestamp if latest is not None else float("-inf"))

    def _snapshots_since(self, timestamp: float) -> list[Snapshot]:
        return [s for s in self.history if s.timestamp >= timestamp]

    @work(thread=True, group="check", exclusive=True)
    def _run_check(self, start: float) -> None:
        def window() -> list[Snapshot]:
            return self.call_from_thread(self._snapshots_since, start)

        try:
            report = self.machine_check(self.source, window, self._poll_loop.stop_event, self.check_seconds)
        except GputopError as exc:
            self.call_from_thread(self._check_done, None, str(exc))
        except Exception as exc:  # a check bug must not take the monitor down
            self.call_from_thread(self._check_done, None, f"the machine check failed: {type(exc).__name__}: {exc}")
        else:
            self.call_from_thread(self._check_done, report, None)

    def _check_done(self, report: Any, error: Optional[str]) -> None:
        from gputop.tui.check_screen import card_marks

        screen = getattr(self, "_check_screen", None)
        if report is not None:
            self.last_check = report
            grid = self._main(GpuGrid)
            grid.check_marks = card_marks(report)
            grid.redraw()
        if screen is not None and not screen.closed:  # (it may not be mounted yet: it shows what it got on mount)
            screen.show_report(report) if report is not None else screen.show_error(error or "")
        elif error:
            self.notify(error, title="machine check", severity="error", timeout=8)
        else:
            self.notify(report.summary, title="machine check", timeout=8)

    # --- report (issue 7)
    def action_report(self) -> None:
        if not len(self.history):
            self.notify("nothing observed yet", severity="warning")
            return
        copy = self._history_copy()
        self.notify("writing the report…", timeout=2)
        self._write_report(copy, self.last_bench)

    @work(thread=True, group="report", exclusive=True)
    def _write_report(self, history: History, bench: Any) -> None:
        try:
            from gputop.report.markdown import render_markdown
            from gputop.report.writer import write_report

            # the findings the screen shows (same window, trace and check), so the ticket agrees with it
            findings, _ = _assembled(self._diagnose(history, bench), self.last_trace, self.last_check)
            text = render_markdown(
                history, findings, bench=bench, command="gputop (TUI, key r)", infra=self.last_check, trace=self.last_trace
            )
            directory = Path(self.report_dir or os.getcwd())
            path = directory / f"gputop-report-{self.machine.hostname}-{time.strftime('%Y%m%d-%H%M%S')}.md"
            write_report(path, text)
        except ImportError:
            self.call_from_thread(self.notify, "reports are not available in this build", severity="error")
        except (GputopError, OSError) as exc:
            self.call_from_thread(self.notify, str(exc), title="report not written", severity="error", timeout=8)
        else:
            self.call_from_thread(self.notify, f"wrote {path}", title="report", timeout=8)


# ------------------------------------------------------------------ helpers (pure)
def gpu_users(snapshot: Snapshot) -> dict[int, str]:
    """GPU index -> who uses it: 'r0 1234' from the job's ranks, else 'pid 1234' (+N more) from NVML."""
    users: dict[int, str] = {}
    job = snapshot.job
    if job is not None:
        for rank in job.ranks:
            for gpu in rank.gpus:
                label = f"r{rank.rank} {rank.proc.pid}" if rank.rank is not None else f"pid {rank.proc.pid}"
                users[gpu] = label if gpu not in users else users[gpu].split(" ")[0] + "+…"
    for gpu in snapshot.gpus:
        if gpu.index in users or not gpu.processes:
            continue
        pids = [p.pid for p in gpu.processes]
        users[gpu.index] = f"pid {pids[0]}" + (f" +{len(pids) - 1}" if len(pids) > 1 else "")
    return users


def _stdin_fd() -> Optional[int]:
    try:
        return sys.__stdin__.fileno()
    except (AttributeError, ValueError, OSError):  # no stdin at all
        return None


def terminal_hung_up() -> bool:
    """True once the terminal on stdin has hung up; never reads from it.  (A hung-up terminal is no
    longer a tty to isatty(), so ask this only of one that was.)"""
    fd = _stdin_fd()
    if fd is None:
        return False
    poller = select.poll()
    poller.register(fd, 0)  # no events asked for: poll still reports POLLHUP/POLLERR/POLLNVAL
    return any(events & (select.POLLHUP | select.POLLNVAL) for _fd, events in poller.poll(0))


# ------------------------------------------------------------------ entry points
def run_app(
    source: Any,
    *,
    interval: float = 1.0,
    subtitle: Optional[str] = None,
    controls: Any = None,
    poll_loop: Optional[PollLoop] = None,
) -> int:
    """Run the TUI on `source` (.machine, .poll(), .close()) until the user quits; closes the source.

    `poll_loop`: the loop over `source`, when the caller made it early to prefetch the first poll."""
    from gputop.tui.glyph_fallback import fit_glyphs_to

    fit_glyphs_to(sys.__stderr__)  # Textual draws on stderr
    app = GputopApp(source, interval=interval, subtitle=subtitle, controls=controls, poll_loop=poll_loop)
    if poll_loop is None:
        app.start_collecting()  # the first poll runs while Textual sets up (a given loop has prefetched it)
    try:
        app.run()
    finally:
        # Close the source only once the collector has left poll(): closing NVML under a running call can crash.
        if app.collector_stopped.is_set() or app.wait_for_collector():
            source.close()
    return int(app.return_code or 0)
